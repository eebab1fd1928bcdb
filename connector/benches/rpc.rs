//! What the connector does to the messages of one request/reply round trip, without sockets: the
//! request read from its requester (ingress), delivered to a responder (restamped with its reply
//! token), the reply read from the responder (ingress, its outcome looked up) and delivered to
//! the requester (restamped with the requester's correlation). 1 KiB query and reply bodies, the
//! properties the load tool sends (reply-to and a ulong correlation-id). Prints allocations per
//! round trip (allocation-counter's counting allocator).
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![allow(missing_docs)] // criterion_group! makes a public function

use std::time::{Duration, Instant};

use bytes::Bytes;
use connector::bridge::envelope::{ingress, Stored};
use connector::bridge::rpc::requester::{reply, request, Asked};
use connector::bridge::rpc::responder::{delivered, Tokens};
use connector::engine::message::walk;
use connector::kubemq::{Request, Response};
use connector::pattern::Pattern;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use fe2o3_amqp_types::messaging::message::__private::Serializable;
use fe2o3_amqp_types::messaging::{Data, Message, MessageId, Properties};
use serde_bytes::ByteBuf;

fn encode(m: Message<Data>) -> Bytes {
    serde_amqp::to_vec(&Serializable(m)).unwrap().into()
}

/// The requester's message: what `amqp-bench --rpc` sends.
fn request_message() -> Bytes {
    encode(
        Message::builder()
            .properties(
                Properties::builder()
                    .reply_to("/dynamic/bench-requester-1")
                    .correlation_id(MessageId::Ulong(42))
                    .build(),
            )
            .data(ByteBuf::from(vec![0x5a; 1024]))
            .build(),
    )
}

/// Every round trip's RequestID, so that the reply can be made once.
const REQUEST_ID: &str = "0d6f1f9e-bench-request";

/// The responder's reply: to the request's token, correlated by its RequestID.
fn reply_message() -> Bytes {
    encode(
        Message::builder()
            .properties(
                Properties::builder()
                    .to(format!("/responses/{REQUEST_ID}"))
                    .correlation_id(MessageId::String(REQUEST_ID.into()))
                    .build(),
            )
            .data(ByteBuf::from(vec![0x5a; 1024]))
            .build(),
    )
}

/// What the requester's side keeps of a stored request, and the KubeMQ request it becomes (with
/// the fixed RequestID).
fn asked_and_request(stored: Stored) -> (Asked, Request) {
    let asked = Asked {
        call: 0,
        pattern: Pattern::Queries,
        reply_to: stored.reply_to.clone().unwrap(),
        correlation: stored.correlation.clone(),
    };
    let mut req = request(
        Pattern::Queries,
        "bench".into(),
        "requester",
        stored,
        Duration::from_secs(10),
    );
    req.request_id = REQUEST_ID.into();
    req.reply_channel = "_INBOX.bench".into();
    (asked, req)
}

/// One round trip; returns the bytes delivered to the requester.
fn round_trip(request_msg: &Bytes, reply_msg: &Bytes, tokens: &mut Tokens) -> Vec<u8> {
    let (asked, req) = asked_and_request(ingress(request_msg).unwrap());
    black_box(delivered(&req));
    let now = Instant::now();
    let request_id = req.request_id.clone();
    tokens.insert(req, (Pattern::Queries, None), now + Duration::from_secs(15));
    let reply_stored = ingress(reply_msg).unwrap();
    let response: Response = tokens
        .answer(&request_id, "responder", reply_stored, now)
        .unwrap()
        .response;
    reply(&asked, &Ok(response)).unwrap()
}

fn bench(c: &mut Criterion) {
    let request_msg = request_message();
    let reply_msg = reply_message();
    let mut tokens = Tokens::default();
    let out = round_trip(&request_msg, &reply_msg, &mut tokens);
    assert!(walk(&out).is_ok());
    assert!(tokens.is_empty());
    for _ in 0..100 {
        black_box(round_trip(&request_msg, &reply_msg, &mut tokens));
    }
    let info = allocation_counter::measure(|| {
        for _ in 0..10_000 {
            black_box(round_trip(&request_msg, &reply_msg, &mut tokens));
        }
    });
    println!(
        "allocations per round trip: {:.1}",
        info.count_total as f64 / 10_000.0
    );
    c.bench_function("rpc_round_trip_messages_1k", |b| {
        b.iter(|| black_box(round_trip(&request_msg, &reply_msg, &mut tokens)))
    });

    // The four conversions of a round trip on their own.
    let (asked, req) = asked_and_request(ingress(&request_msg).unwrap());
    let now = Instant::now();
    tokens.insert(
        req.clone(),
        (Pattern::Queries, None),
        now + Duration::from_secs(15),
    );
    let response = tokens
        .answer(REQUEST_ID, "responder", ingress(&reply_msg).unwrap(), now)
        .unwrap()
        .response;
    let mut g = c.benchmark_group("rpc_steps_1k");
    g.bench_function("request_in", |b| {
        b.iter(|| black_box(ingress(&request_msg).unwrap()))
    });
    g.bench_function("request_out", |b| b.iter(|| black_box(delivered(&req))));
    g.bench_function("reply_in", |b| {
        b.iter(|| black_box(ingress(&reply_msg).unwrap()))
    });
    let outcome = Ok(response);
    g.bench_function("reply_out", |b| {
        b.iter(|| black_box(reply(&asked, &outcome)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
