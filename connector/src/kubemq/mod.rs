//! KubeMQ's gRPC API: the types and the client and server stubs generated from
//! `proto/kubemq.proto` by tonic/prost at build time, the transport tuning both ends use
//! ([`transport`]), and the few shapes of KubeMQ's answers the connector builds itself. The
//! embedded store served as that API is [`crate::facade`].

pub mod transport;

#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod proto {
    tonic::include_proto!("kubemq");
}
pub use proto::*;

/// The version reported by Ping: inside the range KubeMQ's SDKs accept without warning.
pub const REPORTED_VERSION: &str = "v2.4.0";

/// A new message, transaction or request id, as KubeMQ makes them (a random UUID).
pub fn new_id() -> String {
    // Encoded into a buffer: `to_string` goes through the formatting machinery, per request.
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(&mut text)
        .to_owned()
}

/// One queue's entry in a QueuesInfo answer, from the store's counts.
pub fn queue_info(name: String, ready: u64, locked: u64, first: u64, last: u64) -> QueueInfo {
    QueueInfo {
        name,
        messages: (ready + locked) as i64,
        first_sequence: first as i64,
        last_sequence: last as i64,
        sent: last as i64,
        delivered: locked as i64,
        waiting: ready as i64,
        ..Default::default()
    }
}

/// A QueuesInfo answer with its totals.
pub fn queues_summary(queues: Vec<QueueInfo>) -> QueuesInfo {
    QueuesInfo {
        total_queue: queues.len() as i32,
        sent: queues.iter().map(|q| q.sent).sum(),
        delivered: queues.iter().map(|q| q.delivered).sum(),
        waiting: queues.iter().map(|q| q.waiting).sum(),
        queues,
    }
}
