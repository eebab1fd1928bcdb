//! Engine throughput without sockets: frames per second through one connection, in both
//! directions, with all output of a wakeup gathered into one buffer (one write per wakeup).
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![allow(missing_docs)] // criterion_group! makes a public function

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connector::config::Settings;
use connector::engine::peer;
use connector::engine::{AdmitAll, Connection, Event, LinkAccept, Transport, HEADER_AMQP};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState};
use fe2o3_amqp_types::performatives::{Begin, Flow};

const BATCH: u32 = 1000;

fn frame<T: serde::Serialize>(out: &mut Vec<u8>, perf: &T, payload: &[u8]) {
    out.extend(peer::frame(0, perf, payload));
}

/// An open connection with a producer link (handle 0) and a consumer link (handle 1, credit huge).
fn setup() -> (Connection, Instant, u64, u64) {
    let settings = Settings {
        max_unsettled_per_link: 1 << 20,
        ..Settings::default()
    };
    let now = Instant::now();
    let mut c = Connection::new(
        Arc::new(settings.engine_config_no_auth()),
        Transport::Plain,
        AdmitAll,
        now,
    );
    let mut input = HEADER_AMQP.to_vec();
    frame(&mut input, &peer::open("bench"), &[]);
    let begin = Begin {
        incoming_window: u32::MAX,
        outgoing_window: u32::MAX,
        ..peer::begin()
    };
    frame(&mut input, &begin, &[]);
    frame(
        &mut input,
        &peer::attach_sender("l0", 0, "queues/bench"),
        &[],
    );
    frame(
        &mut input,
        &peer::attach_receiver("l1", 1, "queues/bench"),
        &[],
    );
    let mut buf = BytesMut::from(&input[..]);
    c.handle_input(now, &mut buf);
    let mut ids = Vec::new();
    while let Some(e) = c.poll_event() {
        if let Event::AttachRequested { link, .. } = e {
            c.accept_link(
                link,
                LinkAccept {
                    credit_window: 1 << 20,
                },
            )
            .unwrap();
            ids.push(link);
        }
    }
    let flow = Flow {
        incoming_window: u32::MAX,
        ..peer::link_flow(1, 0, u32::MAX / 2, false)
    };
    let mut input = Vec::new();
    frame(&mut input, &flow, &[]);
    let mut buf = BytesMut::from(&input[..]);
    c.handle_input(now, &mut buf);
    while c.poll_event().is_some() {}
    let mut sink = BytesMut::new();
    c.poll_transmit(&mut sink);
    (c, now, ids[0], ids[1])
}

fn bench(c: &mut Criterion) {
    let body = vec![0x5a; 1024];
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(u64::from(BATCH)));
    g.measurement_time(Duration::from_secs(5));

    // Produce: BATCH unsettled 1 KiB transfers in one read; the application settles each; all
    // dispositions leave in one buffer.
    g.bench_function("produce_1k_frames_per_batch", |b| {
        let (mut conn, now, tx, _) = setup();
        let mut out = BytesMut::with_capacity(1 << 20);
        let mut input = BytesMut::with_capacity(BATCH as usize * 1100);
        // Built once: the engine does not require delivery-ids to advance between batches, and
        // the client's encoding cost is not the engine's.
        let mut raw = Vec::with_capacity(BATCH as usize * 1100);
        for id in 0..BATCH {
            let t = peer::transfer(0, Some(id), Some(&id.to_be_bytes()), false, false);
            frame(&mut raw, &t, &body);
        }
        b.iter(|| {
            input.extend_from_slice(&raw);
            conn.handle_input(now, &mut input);
            while let Some(e) = conn.poll_event() {
                if let Event::Delivery(d) = e {
                    conn.settle(tx, d.delivery_id, DeliveryState::Accepted(Accepted {}))
                        .unwrap();
                }
            }
            out.clear();
            conn.poll_transmit(&mut out);
            out.len()
        });
    });

    // Consume: BATCH 1 KiB sends on a link with credit; one buffer out.
    g.bench_function("consume_1k_frames_per_batch", |b| {
        let (mut conn, _, _, rx) = setup();
        let mut out = BytesMut::with_capacity(1 << 21);
        let mut token = 0u64;
        b.iter(|| {
            for _ in 0..BATCH {
                token += 1;
                conn.send(rx, &token.to_be_bytes(), &body, true, token)
                    .unwrap();
            }
            out.clear();
            conn.poll_transmit(&mut out);
            out.len()
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
