//! The AMQP 1.0 server protocol engine, sans-IO.
//!
//! Bytes in, bytes and [`Event`]s out, commands back: no sockets, no tokio, no clock — this crate
//! depends on none of them, so the compiler keeps it that way. Read in the order a frame travels:
//! [`frame`] cuts frames, [`validate`] checks their structure, [`codec`] decodes performatives,
//! [`Connection`] runs the state machines (its session and link frames in `connection/`, over
//! the state of each session and link in `session.rs` and `link.rs`), [`Event`] is what the
//! application sees, `reassembly.rs` holds a message arriving in several frames, and `budget.rs`
//! counts what a connection makes its application hold.
//!
//! Public on purpose: [`frame`], [`validate`], [`codec`] and [`message`] (what tools and the
//! connector's envelope read messages with), `peer` (the client's side, for tests and load
//! tools, behind the `peer` feature), and the types re-exported here.

mod admission;
mod auth;
mod budget;
pub mod codec;
mod connection;
mod error;
mod event;
pub mod frame;
mod link;
pub mod message;
mod outcome;
#[cfg(any(test, feature = "peer"))]
pub mod peer;
mod quick_decode;
mod reassembly;
pub mod serial;
mod session;
pub mod validate;

pub use admission::{Admission, AdmitAll};
pub use auth::{
    sanitize_client_id, sanitize_id, AuthFailure, AuthPolicy, ClientCertificate, Credential,
    Identity, Mechanism, TokenVerifier, VerifiedToken, MAX_INITIAL_RESPONSE,
};
pub use budget::{BudgetExceeded, Charge, ConnectionBudget, ProcessBudget, Reserved};
pub use connection::{
    Connection, EngineConfig, ErrorCounts, Transport, HEADER_AMQP, HEADER_SASL, HEADER_TLS,
    MAX_UNWRITTEN, MIN_MAX_FRAME_SIZE, SERVER_CONTAINER_ID,
};
pub use error::{AmqpError, Condition, ALL_CONDITIONS};
pub use event::{CommandError, Delivery, Event, LinkId, SaslReport, SaslResult};
pub use link::{LinkAccept, LinkView, ServerRole, SessionRoom};
pub use outcome::DeliveryOutcome;
pub use session::SESSION_WINDOW;

/// The hash map of the message path: foldhash (seeded per process) instead of SipHash, which
/// took a fifth of the engine's time per TRANSFER. Every such map is per connection and bounded by
/// its negotiated limits (sessions, links, credit), so keys chosen to collide slow down only the
/// connection that chose them.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

#[cfg(test)]
mod tests;
