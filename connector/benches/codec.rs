//! Codec benchmark: decode + encode of a TRANSFER carrying a 1 KiB Data message with properties
//! and 4 application properties, through our path and through plain fe2o3-amqp-types serde.
//! Also prints allocations per round trip for both (allocation-counter's counting allocator).
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![allow(missing_docs)] // criterion_group! makes a public function

use bytes::{Bytes, BytesMut};
use connector::engine::codec::{decode_performative, encode_transfer, Performative, TransferHead};
use connector::engine::frame::{split_frame, write_frame, TYPE_AMQP};
use connector::engine::message::walk;
use connector::engine::validate::value_len;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fe2o3_amqp_types::messaging::message::__private::{Deserializable, Serializable};
use fe2o3_amqp_types::messaging::{ApplicationProperties, Body, Data, Header, Message, Properties};
use fe2o3_amqp_types::performatives::Transfer;
use serde_amqp::Value;
use serde_bytes::ByteBuf;

fn message() -> Message<Data> {
    Message::builder()
        .header(Header {
            durable: true,
            ..Default::default()
        })
        .properties(
            Properties::builder()
                .message_id(String::from("order-00042"))
                .to("queues/orders")
                .subject("created")
                .reply_to("queues/replies")
                .correlation_id(42u64)
                .content_type("application/json")
                .creation_time(fe2o3_amqp_types::primitives::Timestamp::from_milliseconds(
                    1_700_000_000_000,
                ))
                .build(),
        )
        .application_properties(
            ApplicationProperties::builder()
                .insert("tenant", "acme")
                .insert("priority", 5i32)
                .insert("retry", false)
                .insert("region", "eu-west")
                .build(),
        )
        .data(ByteBuf::from(vec![0x5a; 1024]))
        .build()
}

fn transfer() -> Transfer {
    Transfer {
        handle: 1.into(),
        delivery_id: Some(7),
        delivery_tag: Some(ByteBuf::from(7u32.to_be_bytes().to_vec())),
        message_format: Some(0),
        settled: Some(false),
        more: false,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    }
}

/// The wire bytes of the frame a client sends.
fn frame_bytes() -> Vec<u8> {
    let mut out = BytesMut::new();
    let msg = serde_amqp::to_vec(&Serializable(message())).unwrap();
    write_frame(&mut out, TYPE_AMQP, 0, |b| {
        b.extend_from_slice(&serde_amqp::to_vec(&transfer()).unwrap());
        b.extend_from_slice(&msg);
    });
    out.to_vec()
}

/// Our path: split the frame, validate and decode the performative, walk the message sections
/// (Data stays a slice), then write the outgoing TRANSFER frame into a reused buffer.
fn ours(input: &[u8], inbuf: &mut BytesMut, out: &mut BytesMut) -> usize {
    inbuf.extend_from_slice(input);
    let frame = split_frame(inbuf, u32::MAX).unwrap().unwrap();
    let Ok(Performative::Transfer(t, payload)) = decode_performative(&frame.body) else {
        panic!()
    };
    let layout = walk(&payload).unwrap();
    out.clear();
    let tag = t.delivery_tag.as_ref().map(|b| b.as_slice());
    write_frame(out, TYPE_AMQP, 0, |b| {
        encode_transfer(
            b,
            &TransferHead {
                handle: t.handle.0,
                delivery_id: t.delivery_id,
                tag,
                message_format: Some(0),
                settled: Some(false),
                more: false,
            },
        );
        b.extend_from_slice(&payload);
    });
    layout.body.len() + out.len()
}

/// Plain fe2o3: decode the performative and the whole message with its serde types, then encode
/// both back.
fn plain(input: &[u8]) -> usize {
    let body = &input[8..];
    let n = value_len(body).unwrap();
    let t: Transfer = serde_amqp::from_slice(&body[..n]).unwrap();
    let msg: Deserializable<Message<Body<Value>>> = serde_amqp::from_slice(&body[n..]).unwrap();
    let mut out = serde_amqp::to_vec(&t).unwrap();
    out.extend(serde_amqp::to_vec(&Serializable(msg.0)).unwrap());
    out.len()
}

fn allocs_per_op(mut f: impl FnMut()) -> f64 {
    for _ in 0..100 {
        f();
    }
    let info = allocation_counter::measure(|| {
        for _ in 0..10_000 {
            f();
        }
    });
    info.count_total as f64 / 10_000.0
}

fn bench(c: &mut Criterion) {
    let input = frame_bytes();
    let mut inbuf = BytesMut::with_capacity(4096);
    let mut out = BytesMut::with_capacity(4096);
    // Both paths must see the same message.
    // Both paths reproduce the frame they read, byte for byte in length.
    assert_eq!(plain(&input), input.len() - 8);
    let _ = ours(&input, &mut inbuf, &mut out);
    assert_eq!(&out[..], &input[..]);
    let Ok(Performative::Transfer(_, p)) =
        decode_performative(&Bytes::copy_from_slice(&input[8..]))
    else {
        panic!()
    };
    assert!(p.len() > 1024);
    let a_ours = allocs_per_op(|| {
        black_box(ours(&input, &mut inbuf, &mut out));
    });
    let a_plain = allocs_per_op(|| {
        black_box(plain(&input));
    });
    println!(
        "frame {} bytes; allocations per decode+encode: ours {a_ours:.1}, plain fe2o3 {a_plain:.1}",
        input.len()
    );
    let mut g = c.benchmark_group("transfer_1k_roundtrip");
    g.bench_function("ours", |b| {
        b.iter(|| black_box(ours(black_box(&input), &mut inbuf, &mut out)))
    });
    g.bench_function("plain_fe2o3", |b| {
        b.iter(|| black_box(plain(black_box(&input))))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
