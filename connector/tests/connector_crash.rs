//! The connector process on its embedded store, killed with SIGKILL in the middle of a produce
//! run, 20 times at different moments: after a restart on the same data folder, every message
//! that had been answered `accepted` is consumed (Q-6: accepted means stored). And stopped with
//! SIGTERM while a consumer holds unsettled deliveries: the client gets CLOSE
//! `amqp:connection:forced`, the process exits within its grace, and the deliveries are back.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use common::free_port;
use connector::engine::codec::Performative;
use connector::engine::peer;
use connector::engine::DeliveryOutcome;
use fe2o3_amqp_types::messaging::Data;
use serde_bytes::ByteBuf;

fn start(dir: &std::path::Path, port: u16) -> std::process::Child {
    common::start_connector(dir, port, &[])
}

/// Stops `server` as Kubernetes does; returns when the signal was sent.
fn sigterm(server: &std::process::Child) -> Instant {
    let sent = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    sent
}

/// CONN-16 / Q-34: SIGTERM drains — CLOSE `amqp:connection:forced` to every client,
/// exit well within a pod's grace period — and unsettled deliveries are not lost.
#[test]
fn sigterm_closes_forced_and_returns_unsettled_deliveries() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let mut server = start(dir.path(), port);
    let mut tx = common::connect(port);
    tx.write(&peer::frame(
        0,
        &peer::attach_sender("tx", 0, "queues/drain"),
        &[],
    ));
    let mut accepted = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sent = false;
    while accepted < 3 {
        assert!(Instant::now() < deadline, "sends not accepted");
        for p in tx
            .performatives(Duration::from_millis(50))
            .expect("connected")
        {
            match p {
                Performative::Flow(f) if f.handle.is_some() && !sent => {
                    for n in 0..3u32 {
                        tx.write(&peer::frame(
                            0,
                            &peer::transfer(0, Some(n), Some(&n.to_be_bytes()), false, false),
                            &body(n),
                        ));
                    }
                    sent = true;
                }
                Performative::Disposition(d) if d.state == Some(DeliveryOutcome::Accepted) => {
                    accepted += d.last - d.first + 1;
                }
                _ => {}
            }
        }
    }
    let mut rx = common::connect(port);
    rx.write(&peer::frame(
        0,
        &peer::attach_receiver("rx", 0, "queues/drain"),
        &[],
    ));
    rx.write(&peer::frame(0, &peer::link_flow(0, 0, 3, false), &[]));
    let mut held = 0;
    while held < 3 {
        assert!(Instant::now() < deadline, "deliveries did not arrive");
        held += rx
            .performatives(Duration::from_millis(50))
            .expect("connected")
            .iter()
            .filter(|p| matches!(p, Performative::Transfer(..)))
            .count();
    }
    // Never settled. Now stop the process as Kubernetes does.
    let stopped_at = sigterm(&server);
    let mut closed = None;
    while closed.is_none() && stopped_at.elapsed() < Duration::from_secs(10) {
        match rx.performatives(Duration::from_millis(50)) {
            Some(got) => {
                closed = got.into_iter().find_map(|p| match p {
                    Performative::Close(c) => Some(c.error.as_ref().map(peer::error_symbol)),
                    _ => None,
                })
            }
            None => break,
        }
    }
    let closed = closed.expect("a CLOSE before the socket went away");
    assert_eq!(closed.as_deref(), Some("amqp:connection:forced"));
    loop {
        if let Ok(Some(s)) = server.try_wait() {
            assert!(s.success(), "clean exit: {s}");
            break;
        }
        assert!(
            stopped_at.elapsed() < Duration::from_secs(20),
            "still running 20 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let port = free_port();
    let mut server = start(dir.path(), port);
    let back = consume_all(port, "drain");
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(
        back.len(),
        3,
        "the unsettled deliveries are back on the queue"
    );
}

/// The Data section (as encoded) of a delivered message.
fn data_of(msg: &[u8]) -> Vec<u8> {
    let layout = connector::engine::message::walk(msg).expect("a valid message");
    msg[layout.body].to_vec()
}

fn body(n: u32) -> Vec<u8> {
    serde_amqp::to_vec(&Data(ByteBuf::from(format!("m-{n}").into_bytes()))).expect("encode")
}

/// Produces until the connection dies; returns the bodies that were answered `accepted`.
fn produce_until_killed(port: u16) -> HashSet<Vec<u8>> {
    let mut c = common::connect(port);
    c.write(&peer::frame(
        0,
        &peer::attach_sender("tx", 0, "queues/crash"),
        &[],
    ));
    let mut accepted = HashSet::new();
    let mut credit = 0u32;
    let mut next = 0u32;
    let mut bodies = std::collections::HashMap::new();
    loop {
        let Some(got) = c.performatives(Duration::from_millis(5)) else {
            return accepted;
        };
        for p in got {
            match p {
                Performative::Flow(f) if f.handle.is_some() => {
                    credit = f
                        .delivery_count
                        .unwrap_or(0)
                        .wrapping_add(f.link_credit.unwrap_or(0))
                        .wrapping_sub(next);
                }
                Performative::Disposition(d) if d.state == Some(DeliveryOutcome::Accepted) => {
                    for id in d.first..=d.last {
                        if let Some(b) = bodies.remove(&id) {
                            accepted.insert(b);
                        }
                    }
                }
                _ => {}
            }
        }
        // Keep up to 50 sends in flight.
        while credit > 0 && bodies.len() < 50 {
            let b = body(next);
            if !c.try_write(&peer::frame(
                0,
                &peer::transfer(0, Some(next), Some(&next.to_be_bytes()), false, false),
                &b,
            )) {
                return accepted;
            }
            bodies.insert(next, b);
            next += 1;
            credit -= 1;
        }
    }
}

/// Consumes everything on `queues/<queue>`; returns the bodies.
fn consume_all(port: u16, queue: &str) -> Vec<Vec<u8>> {
    // What comes back is a whole AMQP message (header, sections); compare its Data section.

    let mut c = common::connect(port);
    c.write(&peer::frame(
        0,
        &peer::attach_receiver("rx", 0, &format!("queues/{queue}")),
        &[],
    ));
    c.write(&peer::frame(
        0,
        &peer::link_flow(0, 0, 1_000_000, false),
        &[],
    ));
    let mut bodies = Vec::new();
    let mut quiet = 0;
    while quiet < 10 {
        let got = c
            .performatives(Duration::from_millis(100))
            .expect("connected");
        let mut any = false;
        for p in got {
            if let Performative::Transfer(t, payload) = p {
                bodies.push(data_of(&payload));
                any = true;
                let id = t.delivery_id.unwrap_or(0);
                let d = fe2o3_amqp_types::performatives::Disposition {
                    role: fe2o3_amqp_types::definitions::Role::Receiver,
                    first: id,
                    last: None,
                    settled: true,
                    state: Some(fe2o3_amqp_types::messaging::DeliveryState::Accepted(
                        fe2o3_amqp_types::messaging::Accepted {},
                    )),
                    batchable: false,
                };
                c.write(&peer::frame(0, &d, &[]));
            }
        }
        quiet = if any { 0 } else { quiet + 1 };
    }
    bodies
}

#[test]
fn sigkill_during_produce_keeps_every_accepted_message() {
    let mut total_accepted = 0;
    for round in 0..20u64 {
        let dir = tempfile::tempdir().expect("dir");
        let port = free_port();
        let mut server = start(dir.path(), port);
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50 + round * 37 % 400));
            let _ = server.kill(); // SIGKILL
            let _ = server.wait();
        });
        let accepted = produce_until_killed(port);
        killer.join().expect("killer");
        let port = free_port();
        let mut server = start(dir.path(), port);
        let consumed: HashSet<Vec<u8>> = consume_all(port, "crash").into_iter().collect();
        let _ = server.kill();
        let _ = server.wait();
        let missing = accepted.iter().filter(|b| !consumed.contains(*b)).count();
        assert_eq!(
            missing,
            0,
            "round {round}: {missing} of {} accepted messages lost",
            accepted.len()
        );
        total_accepted += accepted.len();
    }
    assert!(
        total_accepted > 0,
        "the kills all came before any send was accepted: nothing was tested"
    );
}

/// DUR-4 across a crash: a durable events-store subscriber gets three events and detaches,
/// four more are stored, the connector is SIGKILLed and restarted on the same data folder, and
/// the subscription resumes with exactly those four; the channel's sequences continue
/// (ES-2: never reused).
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton: tests/run.sh"
)]
fn dur_4_durable_subscription_survives_sigkill() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let channel = "es.crash";
    let python = |phase: &str| {
        common::run(
            Command::new("python3")
                .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/python"))
                .args([
                    "events.py",
                    "durable_phase",
                    &format!("amqp://127.0.0.1:{port}"),
                    phase,
                    channel,
                ]),
        )
    };
    let mut server = start(dir.path(), port);
    python("before");
    server.kill().expect("SIGKILL");
    server.wait().expect("exit");
    let mut server = start(dir.path(), port);
    python("after");
    server.kill().expect("SIGKILL");
    server.wait().expect("exit");
    let (streams, report) = connector::store::stream::Streams::open(
        &dir.path().join(connector::store::STREAM_DIR),
        connector::store::log::SEGMENT_BYTES,
        connector::store::stream::DEFAULT_RETENTION,
    )
    .expect("the events-store reopens");
    assert_eq!(report.events, 7);
    assert_eq!(
        streams.bounds(channel),
        (1, 7),
        "sequences 1 … 7, none reused"
    );
}

/// CONN-16: SIGTERM stops a connector that also serves its store as KubeMQ's gRPC API even while
/// a gRPC client keeps a subscription open (as the connector pods in front of it do): the
/// subscription ends and the process exits well within a pod's grace.
#[test]
fn sigterm_stops_the_kubemq_grpc_service_with_a_subscriber_attached() {
    use connector::kubemq::kubemq_client::KubemqClient;
    use connector::kubemq::subscribe::SubscribeType;
    use connector::kubemq::{Event, Subscribe};
    let dir = tempfile::tempdir().expect("dir");
    let (port, grpc) = (free_port(), free_port());
    let grpc_addr = format!("127.0.0.1:{grpc}");
    let mut server =
        common::start_connector(dir.path(), port, &["--serve-kubemq-grpc", &grpc_addr]);
    common::wait_listening(grpc);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let url = format!("http://{grpc_addr}");
    let (got_tx, mut got_rx) = tokio::sync::mpsc::unbounded_channel::<bool>();
    let subscriber = {
        let url = url.clone();
        rt.spawn(async move {
            let mut c = KubemqClient::connect(url).await.expect("gRPC connects");
            let mut stream = c
                .subscribe_to_events(Subscribe {
                    subscribe_type_data: SubscribeType::Events as i32,
                    client_id: "held-subscriber".into(),
                    channel: "held".into(),
                    ..Default::default()
                })
                .await
                .expect("subscribed")
                .into_inner();
            // `true` per event; the stream's end (or error) is the last word.
            while let Ok(Some(_)) = stream.message().await {
                let _ = got_tx.send(true);
            }
            let _ = got_tx.send(false);
        })
    };
    rt.block_on(async {
        let mut c = KubemqClient::connect(url).await.expect("gRPC connects");
        // Events until the subscriber has one: then its stream is surely open.
        loop {
            c.send_event(Event {
                channel: "held".into(),
                client_id: "sender".into(),
                body: b"x".to_vec().into(),
                store: false,
                ..Default::default()
            })
            .await
            .expect("event sent");
            if let Ok(Some(true)) =
                tokio::time::timeout(Duration::from_millis(200), got_rx.recv()).await
            {
                break;
            }
        }
    });
    let stopped_at = sigterm(&server);
    loop {
        if let Ok(Some(s)) = server.try_wait() {
            assert!(s.success(), "clean exit: {s}");
            break;
        }
        if stopped_at.elapsed() > Duration::from_secs(30) {
            let _ = server.kill();
            panic!("still running 30 s after SIGTERM with a gRPC subscriber attached");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), subscriber)
            .await
            .expect("the subscription ended with the process")
            .expect("the subscriber task");
    });
}
