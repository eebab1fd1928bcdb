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
