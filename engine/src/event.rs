//! What the engine tells its application, and the identifiers the application answers with.

use bytes::Bytes;
use fe2o3_amqp_types::performatives::Attach;

use super::auth::Credential;
use super::error::AmqpError;
use super::outcome::DeliveryOutcome;

/// Identifies a link for the lifetime of its connection; never reused, unlike AMQP handles.
pub type LinkId = u64;

/// One SASL exchange, as audited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslReport {
    /// `plain`, `anonymous`, `external`, or the sanitized lower-case name of one not offered;
    /// empty when the client sent no SASL-INIT.
    pub mechanism: String,
    /// PLAIN's username (AUD-4).
    pub username: Option<String>,
    /// How it ended.
    pub outcome: SaslResult,
}

/// How a SASL exchange ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaslResult {
    /// Authenticated as this ClientID (empty if the connection ended before OPEN named it).
    Success {
        /// The connection's ClientID.
        client_id: String,
    },
    /// Refused; the reason is for the log only (ERR-4).
    Failure {
        /// Why.
        reason: String,
    },
}

/// Something the application must know or decide.
#[derive(Debug)]
pub enum Event {
    /// A SASL exchange ended (SASL-11): the application writes its audit event (AUD-1, AUD-2).
    /// A success whose ClientID is the container-id comes when OPEN names it.
    Authenticated(SaslReport),
    /// OPEN was accepted; the connection is open.
    Opened {
        /// Identity of the connection (SASL-6).
        client_id: String,
        /// The token to present to KubeMQ on this connection's calls (PLAIN with a JWT).
        credential: Option<Credential>,
        /// The client's container-id, as sent.
        container_id: String,
        /// The OPEN hostname, logged and otherwise ignored (GEN-6).
        hostname: Option<String>,
        /// The OPEN property `product`, if sent as a string (CONN-14).
        product: Option<String>,
        /// The OPEN property `version`, if sent as a string (CONN-14).
        version: Option<String>,
    },
    /// A client attached a link that passed the engine's checks (LINK-2 steps 1–3); the
    /// application must answer with `accept_link` or `refuse_link`.
    AttachRequested {
        /// The new link.
        link: LinkId,
        /// The client's ATTACH as received. `role` is the client's role: `Sender` means the client
        /// produces and the server receives.
        attach: Box<Attach>,
    },
    /// A server-sender link's credit changed (FLOW-3); with `drain`, the application sends what it
    /// has at once and then calls `drain_done` (FLOW-5).
    Credit {
        /// The link.
        link: LinkId,
        /// Deliveries the link may send now.
        credit: u32,
        /// Whether the client asked to drain.
        drain: bool,
    },
    /// The client's incoming window on a session, used up, opened again, or a transport that was
    /// full has taken half of what it held: server-sender links may take more than
    /// [`super::Connection::session_room`] and [`super::Connection::has_room`] said before.
    WindowOpened,
    /// A complete (reassembled) message arrived on a server-receiver link. The application must
    /// call `settle` exactly once for it, also when it arrived pre-settled.
    Delivery(Delivery),
    /// The client settled or gave a terminal state to one delivery the server sent.
    Settled {
        /// The link it was sent on.
        link: LinkId,
        /// The application's token for that delivery.
        token: u64,
        /// The state the client reported; `None` when it settled without one.
        state: Option<DeliveryOutcome>,
    },
    /// An accepted link ended, for whatever reason; emitted exactly once per accepted link.
    LinkClosed {
        /// The link.
        link: LinkId,
        /// Tokens of deliveries the server sent that the client never settled.
        unsettled: Vec<u64>,
        /// The error that ended it, if any (the client's or ours).
        error: Option<AmqpError>,
    },
    /// OPEN was refused by the admission (CONN-15): the refusal is in the output, and `Closed`
    /// follows. The driver may hold the output back, so that a client reconnecting at once
    /// does not spin.
    OpenRefused {
        /// The reason sent in CLOSE.
        error: AmqpError,
    },
    /// The connection ended; no further events follow.
    Closed {
        /// Our error or the client's, if any.
        error: Option<AmqpError>,
    },
}

/// A complete message received from the client.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The link it arrived on.
    pub link: LinkId,
    /// Session delivery-id, used to settle it.
    pub delivery_id: u32,
    /// The delivery tag.
    pub tag: Bytes,
    /// Whether the client sent it pre-settled (no disposition will be sent).
    pub settled: bool,
    /// The encoded message: all sections, bit-exact (XFER-1).
    pub payload: Bytes,
}

/// Why a command could not be carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// No such link, or it is no longer attached.
    #[error("link is not attached")]
    NoLink,
    /// The link has the other role.
    #[error("wrong link role for this command")]
    WrongRole,
    /// A server-sender link has no credit left.
    #[error("no link credit")]
    NoCredit,
    /// The delivery was already settled or never existed.
    #[error("unknown or already settled delivery")]
    NoDelivery,
    /// The connection is closing or closed.
    #[error("connection is closed")]
    Closed,
}
