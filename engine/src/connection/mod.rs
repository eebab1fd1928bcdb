//! The per-connection state machine: protocol headers, SASL, OPEN/CLOSE, timers, and dispatch of
//! frames to the session and link logic ([`sessions`], [`links`]), which keep each session's and
//! link's state in `crate::session` and `crate::link`.
//!
//! Sans-IO: bytes come in through [`Connection::handle_input`], bytes go out through
//! [`Connection::poll_transmit`], the application reads [`Event`]s with [`Connection::poll_event`]
//! and answers with commands. Time is passed in; nothing here reads a clock or touches a socket.

mod links;
mod sessions;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use fe2o3_amqp_types::performatives::{Close, Open};
use fe2o3_amqp_types::primitives::{Array, Symbol};
use fe2o3_amqp_types::sasl::{SaslCode, SaslMechanisms, SaslOutcome};

use crate::admission::Admission;
use crate::auth::{
    sanitize_client_id, AuthAttempt, AuthFailure, AuthPolicy, ClientCertificate, Identity,
};
use crate::budget::{ConnectionBudget, ProcessBudget};
use crate::codec::{self, decode_performative, decode_sasl, Performative, SaslFrame};
use crate::error::{AmqpError, Condition};
use crate::event::{Event, SaslReport, SaslResult};
use crate::frame::{split_frame, write_frame, RawFrame, TYPE_AMQP, TYPE_SASL};
use crate::link::Link;
use crate::session::{PendingDisposition, Session};
use crate::LinkId;

/// Smallest max-frame-size AMQP allows (CONN-8).
pub const MIN_MAX_FRAME_SIZE: u32 = 512;
/// The container-id the server announces (CONN-7).
pub const SERVER_CONTAINER_ID: &str = "KubeMQ";
/// Output the transport has not taken yet beyond which transfers wait in their session, charged
/// to the budget, as if the client's window were shut: a client that does not read cannot make
/// the connector encode deliveries for it without bound.
pub const MAX_UNWRITTEN: usize = 4 * 1024 * 1024;
/// Largest SASL frame read; a bigger initial response than 16 KiB fails authentication (SASL-8)
/// as long as its frame fits here, and anything larger drops the connection.
pub const MAX_SASL_FRAME: u32 = 64 * 1024;

/// The connection capability of a server that routes a null-target sender's messages by their
/// `to` (AMQP 1.0's anonymous relay; Qpid JMS uses its anonymous producer only when offered).
pub const ANONYMOUS_RELAY: &str = "ANONYMOUS-RELAY";

/// Protocol header of the AMQP layer.
pub const HEADER_AMQP: [u8; 8] = *b"AMQP\x00\x01\x00\x00";
/// Protocol header of the SASL layer.
pub const HEADER_SASL: [u8; 8] = *b"AMQP\x03\x01\x00\x00";
/// Protocol header of the TLS layer (only on the TLS listener).
pub const HEADER_TLS: [u8; 8] = *b"AMQP\x02\x01\x00\x00";

/// Limits and policies of the engine, derived from the connector configuration.
#[derive(Clone)]
pub struct EngineConfig {
    /// Upper bound of the negotiated frame size (CFG-4).
    pub max_frame_size: u32,
    /// Reassembly cap and advertised link max-message-size (CFG-5).
    pub max_message_size: u64,
    /// Sessions per connection (CFG-6), 1..=65535.
    pub session_max: u32,
    /// Links per session (CFG-7).
    pub max_links_per_session: u32,
    /// Inbound idle limit (CFG-9); `None` disables it.
    pub idle_timeout: Option<Duration>,
    /// From accept until OPEN, including SASL; a peer that takes longer is dropped.
    pub handshake_timeout: Duration,
    /// How long to wait for the client's CLOSE after ours before dropping the socket.
    pub close_timeout: Duration,
    /// How clients authenticate.
    pub auth: AuthPolicy,
    /// Bytes one connection may make the connector hold (see [`crate::budget`]).
    pub connection_memory: u64,
    /// The budget all connections share beyond their guaranteed share.
    pub process_memory: Arc<ProcessBudget>,
    /// Bytes the application keeps for each live link (its own state and the backend's),
    /// reserved in `process_memory` from ATTACH to DETACH: past it, a link is refused.
    pub link_state_bytes: u64,
    /// The same for each live session, reserved from BEGIN to END: past it, a BEGIN is refused.
    pub session_state_bytes: u64,
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("max_frame_size", &self.max_frame_size)
            .field("max_message_size", &self.max_message_size)
            .field("session_max", &self.session_max)
            .field("max_links_per_session", &self.max_links_per_session)
            .field("idle_timeout", &self.idle_timeout)
            .field("auth", &self.auth)
            .field("connection_memory", &self.connection_memory)
            .finish_non_exhaustive()
    }
}

/// Error conditions written, by the scope of the frame that carried them (ERR-6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorCounts {
    /// On CLOSE.
    pub conn: u64,
    /// On END.
    pub session: u64,
    /// On DETACH, or as a `rejected` outcome.
    pub link: u64,
}

/// Which listener accepted the connection; `2 1 0 0` is only valid on TLS (CONN-1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Plain TCP.
    Plain,
    /// TLS terminated by the driver before any byte reaches the engine.
    Tls {
        /// The client's certificate, verified (mTLS), which makes EXTERNAL available (SASL-7).
        client_certificate: Option<ClientCertificate>,
    },
}

impl Transport {
    fn client_certificate(&self) -> Option<&ClientCertificate> {
        match self {
            Transport::Plain => None,
            Transport::Tls { client_certificate } => client_certificate.as_ref(),
        }
    }
}

/// Which protocol headers are acceptable next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeaderStage {
    /// First header of the connection.
    Initial,
    /// After the TLS header was echoed.
    AfterTls,
    /// After a successful SASL outcome: only the AMQP header.
    AfterSasl,
}

/// Where the connection is, with what only that stage has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for a protocol header.
    Header(HeaderStage),
    /// In the SASL exchange.
    Sasl,
    /// Waiting for the client's OPEN.
    Opening,
    /// OPEN exchanged.
    Open {
        /// The client's idle timeout, when it asked for one: an empty frame goes out before
        /// half of it passes (CONN-12).
        peer_idle: Option<Duration>,
    },
    /// Our CLOSE went out (the application heard `Closed`); the client's is awaited until
    /// `deadline`.
    CloseSent {
        /// When the connection is dropped without the client's CLOSE.
        deadline: Instant,
    },
    /// Over; the application heard `Closed`.
    Closed,
}

/// One AMQP connection, server side.
pub struct Connection {
    cfg: Arc<EngineConfig>,
    transport: Transport,
    admission: Box<dyn Admission>,
    state: State,
    out: BytesMut,
    /// Reused to size a delivery's first TRANSFER before it is written.
    scratch: BytesMut,
    events: VecDeque<Event>,
    now: Instant,
    /// The negotiated frame size, both directions (CONN-8); 512 until OPEN.
    max_frame: u32,
    channel_max: u16,
    identity: Option<Identity>,
    /// A SASL success whose ClientID is the container-id, reported once OPEN names it.
    sasl_report: Option<SaslReport>,
    pub(crate) sessions: crate::FastMap<u16, Session>,
    /// Channels whose BEGIN we refused, until the client's END (SESS-2).
    refused: crate::session::RefusedChannels,
    pub(crate) links: crate::FastMap<LinkId, Link>,
    next_link_id: LinkId,
    last_recv: Instant,
    last_sent: Instant,
    handshake_deadline: Instant,
    /// When the client's token expires; the connection is closed then (SASL-13).
    credential_deadline: Option<Instant>,
    pending_disposition: Option<PendingDisposition>,
    /// Error conditions written since last taken, by scope (ERR-6).
    errors_sent: ErrorCounts,
    /// Inbound messages dropped by the engine (oversize) since last taken (MET-8).
    dropped_in: u64,
    /// What this connection makes the connector hold.
    budget: ConnectionBudget,
    /// A receiver link's credit was not topped up because the budget was half used; credit is
    /// granted again once it falls below half.
    credit_withheld: bool,
    /// Output handed to the transport and not yet written by it ([`Connection::set_unwritten`]).
    unwritten: usize,
    /// The transport was full since senders last heard it had room: transfers may wait in
    /// their sessions and senders may have seen every window shut. Once it has taken half, the
    /// transfers go and senders hear so.
    held_for_transport: bool,
}

/// Whether transfers wait for the transport with `pending` bytes unwritten: from
/// [`MAX_UNWRITTEN`] up, and, once they waited, until it has taken half.
fn transport_full(pending: usize, held: bool) -> bool {
    pending >= MAX_UNWRITTEN || (held && pending >= MAX_UNWRITTEN / 2)
}

/// Longest OPEN `product` or `version` kept (CONN-14): enough for any real client's.
const MAX_OPEN_PROPERTY: usize = 128;

/// A string OPEN property, recorded for the connections endpoint (CONN-14): control characters
/// dropped, cut to [`MAX_OPEN_PROPERTY`] characters. Anything but a string is ignored.
fn open_property(open: &Open, key: &str) -> Option<String> {
    let value = open.properties.as_ref()?.get(&Symbol::from(key))?;
    match value {
        serde_amqp::Value::String(s) => Some(
            s.chars()
                .filter(|c| !c.is_control())
                .take(MAX_OPEN_PROPERTY)
                .collect(),
        ),
        _ => None,
    }
}

impl Connection {
    /// A new server connection waiting for the client's protocol header.
    ///
    /// `admission` is asked at the client's OPEN whether the connection may open (CONN-15).
    pub fn new(
        cfg: Arc<EngineConfig>,
        transport: Transport,
        admission: impl Admission + 'static,
        now: Instant,
    ) -> Self {
        let handshake_deadline = now + cfg.handshake_timeout;
        let budget = ConnectionBudget::new(cfg.connection_memory, cfg.process_memory.clone());
        Connection {
            cfg,
            transport,
            admission: Box::new(admission),
            state: State::Header(HeaderStage::Initial),
            out: BytesMut::with_capacity(1024),
            scratch: BytesMut::new(),
            events: VecDeque::new(),
            now,
            max_frame: MIN_MAX_FRAME_SIZE,
            channel_max: 0,
            unwritten: 0,
            held_for_transport: false,
            identity: None,
            sasl_report: None,
            sessions: Default::default(),
            refused: Default::default(),
            links: Default::default(),
            next_link_id: 1,
            last_recv: now,
            last_sent: now,
            handshake_deadline,
            credential_deadline: None,
            pending_disposition: None,
            errors_sent: ErrorCounts::default(),
            dropped_in: 0,
            budget,
            credit_withheld: false,
        }
    }

    /// Consumes every complete header and frame at the front of `buf`.
    pub fn handle_input(&mut self, now: Instant, buf: &mut BytesMut) {
        self.now = now;
        if !buf.is_empty() {
            self.last_recv = now;
        }
        loop {
            match self.state {
                State::Closed => {
                    buf.clear();
                    break;
                }
                State::Header(stage) => {
                    if buf.len() < 8 {
                        break;
                    }
                    let header = buf.split_to(8);
                    self.on_header(stage, &header);
                }
                _ => match split_frame(buf, self.inbound_limit()) {
                    Ok(None) => break,
                    Ok(Some(frame)) => self.on_frame(frame),
                    Err(e) => {
                        buf.clear();
                        self.protocol_failure(AmqpError::new(
                            Condition::DecodeError,
                            e.to_string(),
                        ));
                    }
                },
            }
        }
        if self.is_open() {
            self.replenish_windows();
            self.grant_withheld_credit();
        }
        self.flush_disposition();
    }

    /// This connection's memory budget, for buffers the application holds on its behalf.
    pub fn budget(&self) -> &ConnectionBudget {
        &self.budget
    }

    /// Appends everything the engine wants to send to `buf`, the transport's unwritten output
    /// (so its length is what [`Connection::set_unwritten`] would be told).
    pub fn poll_transmit(&mut self, buf: &mut BytesMut) {
        self.flush_disposition();
        self.unwritten = buf.len() + self.out.len();
        self.held_for_transport |= self.unwritten >= MAX_UNWRITTEN;
        if self.out.is_empty() {
            return;
        }
        self.last_sent = self.now;
        if buf.is_empty() {
            std::mem::swap(buf, &mut self.out);
        } else {
            buf.extend_from_slice(&self.out);
            self.out.clear();
        }
    }

    /// How much output the transport still holds unwritten: past [`MAX_UNWRITTEN`] transfers
    /// wait in their sessions; once it is below half, they go on and
    /// [`Event::WindowOpened`] tells senders they may send again.
    pub fn set_unwritten(&mut self, bytes: usize) {
        self.unwritten = bytes;
        self.held_for_transport |= self.transport_full();
        if self.held_for_transport && self.out.len() + bytes < MAX_UNWRITTEN / 2 {
            self.held_for_transport = false;
            let channels: Vec<u16> = self.sessions.keys().copied().collect();
            for ch in channels {
                self.flush_blocked(ch);
            }
            if !self.held_for_transport {
                self.events.push_back(Event::WindowOpened);
            }
        }
    }

    /// Whether the transport holds so much unwritten output that transfers wait.
    fn transport_full(&self) -> bool {
        transport_full(self.out.len() + self.unwritten, self.held_for_transport)
    }

    /// Whether output is waiting.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || self.pending_disposition_exists()
    }

    /// Whether events wait for [`Connection::poll_event`].
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Connection::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Header(_) | State::Sasl | State::Opening => Some(self.handshake_deadline),
            State::Open { peer_idle } => {
                let idle = self.cfg.idle_timeout.map(|d| self.last_recv + d);
                let beat = peer_idle.map(|d| self.last_sent + d / 2);
                [idle, beat, self.credential_deadline]
                    .into_iter()
                    .flatten()
                    .min()
            }
            State::CloseSent { deadline } => Some(deadline),
            State::Closed => None,
        }
    }

    /// Runs the timers due at `now`: handshake deadline, idle timeout, heartbeats, close wait.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        match self.state {
            State::Header(_) | State::Sasl | State::Opening => {
                if now >= self.handshake_deadline {
                    tracing::debug!("handshake not completed in time; dropping the connection");
                    self.finish(None);
                }
            }
            State::Open { peer_idle } => {
                if self.credential_deadline.is_some_and(|d| now >= d) {
                    // SASL-13.
                    self.close(
                        now,
                        Some(AmqpError::new(
                            Condition::UnauthorizedAccess,
                            "token expired",
                        )),
                    );
                    return;
                }
                if let Some(idle) = self.cfg.idle_timeout {
                    if now >= self.last_recv + idle {
                        // CONN-11.
                        self.close(
                            now,
                            Some(AmqpError::new(
                                Condition::ResourceLimitExceeded,
                                "idle timeout expired",
                            )),
                        );
                        return;
                    }
                }
                if let Some(peer) = peer_idle {
                    if now >= self.last_sent + peer / 2 {
                        // CONN-12: an empty frame keeps the client's idle timer from firing.
                        write_frame(&mut self.out, TYPE_AMQP, 0, |_| {});
                        self.last_sent = now;
                    }
                }
            }
            State::CloseSent { deadline } => {
                if now >= deadline {
                    self.finish(None);
                }
            }
            State::Closed => {}
        }
    }

    /// Whether the connection is over: once output is flushed, the socket can be closed.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Whether OPEN has been exchanged and no CLOSE yet.
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open { .. })
    }

    /// The connection's ClientID, once open.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// The negotiated max-frame-size.
    pub fn max_frame_size(&self) -> u32 {
        self.max_frame
    }

    /// Sends CLOSE (with `error`), ending every session and link, and waits a bounded time for
    /// the client's CLOSE. Before OPEN it simply drops the connection.
    pub fn close(&mut self, now: Instant, error: Option<AmqpError>) {
        self.now = now;
        match self.state {
            State::Open { .. } => {
                self.teardown(error.clone());
                self.write_close(error.clone());
                self.emit_closed(error);
                self.state = State::CloseSent {
                    deadline: now + self.cfg.close_timeout,
                };
            }
            State::Opening => self
                .refuse_open(error.unwrap_or_else(|| AmqpError::bare(Condition::ConnectionForced))),
            State::Header(_) | State::Sasl => self.finish(error),
            State::CloseSent { .. } | State::Closed => {}
        }
    }

    /// Graceful shutdown: CLOSE `amqp:connection:forced` (CONN-16).
    pub fn shutdown(&mut self, now: Instant) {
        self.close(now, Some(AmqpError::bare(Condition::ConnectionForced)));
    }

    /// The broker is gone: close with `amqp:connection:forced` (CONN-16), as for a shutdown.
    pub fn broker_lost(&mut self, now: Instant) {
        self.close(
            now,
            Some(AmqpError::new(
                Condition::ConnectionForced,
                "broker unavailable",
            )),
        );
    }

    /// The socket is gone: end everything without writing (Q-32 teardown still happens).
    pub fn transport_lost(&mut self) {
        if self.state != State::Closed {
            self.finish(None);
        }
    }

    fn inbound_limit(&self) -> u32 {
        match self.state {
            State::Sasl => MAX_SASL_FRAME,
            State::Opening => self.cfg.max_frame_size.max(MIN_MAX_FRAME_SIZE),
            _ => self.max_frame,
        }
    }

    fn on_header(&mut self, stage: HeaderStage, header: &[u8]) {
        let tls_ok =
            stage == HeaderStage::Initial && matches!(self.transport, Transport::Tls { .. });
        if header == HEADER_SASL && stage != HeaderStage::AfterSasl {
            self.out.extend_from_slice(&HEADER_SASL);
            let mechanisms: Vec<Symbol> = self
                .cfg
                .auth
                .mechanisms(self.transport.client_certificate())
                .into_iter()
                .map(|m| Symbol::from(m.name()))
                .collect();
            codec::write_sasl_mechanisms(
                &mut self.out,
                &SaslMechanisms {
                    sasl_server_mechanisms: Array::from(mechanisms),
                },
            );
            self.state = State::Sasl;
        } else if header == HEADER_AMQP
            && (stage == HeaderStage::AfterSasl || self.cfg.auth.allows_bare())
        {
            self.out.extend_from_slice(&HEADER_AMQP);
            self.state = State::Opening;
        } else if header == HEADER_TLS && tls_ok {
            self.out.extend_from_slice(&HEADER_TLS);
            self.state = State::Header(HeaderStage::AfterTls);
        } else {
            // CONN-2: answer with the header we prefer, then close. SASL is always offered, so the
            // SASL header is the one every client can continue with (OP-LINK-2, docs/decisions.md).
            tracing::debug!(header = ?header, "unsupported protocol header");
            let preferred = if stage == HeaderStage::AfterSasl {
                HEADER_AMQP
            } else {
                HEADER_SASL
            };
            self.out.extend_from_slice(&preferred);
            self.finish(None);
        }
    }

    fn on_frame(&mut self, frame: RawFrame) {
        match self.state {
            State::Sasl => self.on_sasl_frame(frame),
            State::Opening => self.on_opening_frame(frame),
            State::Open { .. } => self.on_open_frame(frame),
            State::CloseSent { .. } => {
                if frame.frame_type == TYPE_AMQP
                    && !frame.body.is_empty()
                    && matches!(decode_performative(&frame.body), Ok(Performative::Close(_)))
                {
                    self.finish(None);
                }
            }
            State::Header(_) | State::Closed => {}
        }
    }

    fn on_sasl_frame(&mut self, frame: RawFrame) {
        let attempt = if frame.frame_type != TYPE_SASL || frame.body.is_empty() {
            None
        } else {
            match decode_sasl(&frame.body) {
                Ok(SaslFrame::Init(init)) => {
                    let response = init
                        .initial_response
                        .as_ref()
                        .map(|b| b.as_slice())
                        .unwrap_or(&[]);
                    Some(self.cfg.auth.authenticate(
                        self.transport.client_certificate(),
                        init.mechanism.as_str(),
                        response,
                    ))
                }
                Ok(SaslFrame::Other(code)) => {
                    tracing::debug!(code, "unexpected SASL frame");
                    None
                }
                Err(e) => {
                    tracing::debug!(error = %e, "undecodable SASL frame");
                    None
                }
            }
        };
        let attempt = attempt.unwrap_or_else(|| AuthAttempt {
            mechanism: String::new(),
            username: None,
            result: Err(AuthFailure("expected a SASL-INIT frame".into())),
        });
        let AuthAttempt {
            mechanism,
            username,
            result,
        } = attempt;
        match result {
            Ok(identity) => {
                let report = SaslReport {
                    mechanism,
                    username,
                    outcome: SaslResult::Success {
                        client_id: identity.client_id.clone().unwrap_or_default(),
                    },
                };
                if identity.client_id.is_some() {
                    self.events.push_back(Event::Authenticated(report));
                } else {
                    // SASL-6 (2), (4): the container-id is the ClientID, known at OPEN.
                    self.sasl_report = Some(report);
                }
                // A lifetime too long to add is one that never ends.
                self.credential_deadline = identity.valid_for.and_then(|d| self.now.checked_add(d));
                self.identity = Some(identity);
                codec::write_sasl_outcome(
                    &mut self.out,
                    &SaslOutcome {
                        code: SaslCode::Ok,
                        additional_data: None,
                    },
                );
                self.state = State::Header(HeaderStage::AfterSasl);
            }
            Err(AuthFailure(reason)) => {
                // ERR-4 / SASL-11: only the outcome code goes on the wire; the reason is reported.
                self.events.push_back(Event::Authenticated(SaslReport {
                    mechanism,
                    username,
                    outcome: SaslResult::Failure { reason },
                }));
                codec::write_sasl_outcome(
                    &mut self.out,
                    &SaslOutcome {
                        code: SaslCode::Auth,
                        additional_data: None,
                    },
                );
                self.finish(None);
            }
        }
    }

    fn on_opening_frame(&mut self, frame: RawFrame) {
        if frame.frame_type != TYPE_AMQP {
            return self.refuse_open(AmqpError::new(
                Condition::DecodeError,
                "SASL frame after the AMQP header",
            ));
        }
        if frame.body.is_empty() {
            return;
        }
        let open = match decode_performative(&frame.body) {
            Ok(Performative::Open(open)) => open,
            Ok(Performative::Close(_)) => {
                // A client may give up before OPEN; answer in kind.
                return self.refuse_open(AmqpError::bare(Condition::NotAllowed));
            }
            Ok(_) => {
                return self.refuse_open(AmqpError::new(Condition::NotAllowed, "expected open"))
            }
            Err(e) => {
                return self.refuse_open(AmqpError::new(Condition::DecodeError, e.to_string()))
            }
        };
        self.on_open(*open);
    }

    fn on_open(&mut self, open: Open) {
        if open.container_id.is_empty() {
            // CONN-5.
            return self.refuse_open(AmqpError::new(
                Condition::InvalidField,
                "open.container-id is required",
            ));
        }
        if let Some(err) = self.admission.at_open() {
            // CONN-15.
            return self.refuse_open(err);
        }
        let client_max = open.max_frame_size.0;
        self.max_frame = client_max
            .min(self.cfg.max_frame_size)
            .max(MIN_MAX_FRAME_SIZE);
        let ours = u16::try_from(self.cfg.session_max.saturating_sub(1)).unwrap_or(u16::MAX);
        self.channel_max = open.channel_max.0.min(ours);
        let peer_idle = open
            .idle_time_out
            .filter(|ms| *ms > 0)
            .map(|ms| Duration::from_millis(u64::from(ms)));
        self.write_server_open();
        self.state = State::Open { peer_idle };
        let client_id = match self.identity.as_ref().and_then(|i| i.client_id.clone()) {
            Some(id) => id,
            None => sanitize_client_id(&open.container_id),
        };
        if let Some(mut report) = self.sasl_report.take() {
            report.outcome = SaslResult::Success {
                client_id: client_id.clone(),
            };
            self.events.push_back(Event::Authenticated(report));
        }
        tracing::debug!(client_id = %client_id, hostname = ?open.hostname, max_frame = self.max_frame, "connection open");
        let product = open_property(&open, "product");
        let version = open_property(&open, "version");
        self.events.push_back(Event::Opened {
            client_id,
            credential: self.identity.as_ref().and_then(|i| i.credential.clone()),
            container_id: open.container_id,
            hostname: open.hostname,
            product,
            version,
        });
    }

    fn write_server_open(&mut self) {
        // CONN-7: container-id, max-frame-size, channel-max, idle-time-out, and (ADDR-16) the
        // ANONYMOUS-RELAY capability: null-target senders route every message by its `to`.
        let idle = self.cfg.idle_timeout.map(|d| {
            let half = d.as_millis() / 2;
            u32::try_from(half).unwrap_or(u32::MAX)
        });
        let open = Open {
            container_id: SERVER_CONTAINER_ID.to_string(),
            hostname: None,
            max_frame_size: self.max_frame.into(),
            channel_max: self.channel_max.into(),
            idle_time_out: idle.filter(|ms| *ms > 0),
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: Some(Array(vec![Symbol::from(ANONYMOUS_RELAY)])),
            desired_capabilities: None,
            properties: None,
        };
        codec::write_amqp(&mut self.out, 0, &open, &[]);
    }

    /// OPEN then CLOSE with `err`, before the connection was open (CONN-5, CONN-15).
    fn refuse_open(&mut self, err: AmqpError) {
        tracing::debug!(error = %err, "refusing the connection at open");
        self.write_server_open();
        self.write_close(Some(err.clone()));
        self.events
            .push_back(Event::OpenRefused { error: err.clone() });
        self.emit_closed(Some(err));
        self.state = State::CloseSent {
            deadline: self.now + self.cfg.close_timeout,
        };
    }

    fn on_open_frame(&mut self, frame: RawFrame) {
        if frame.frame_type != TYPE_AMQP {
            return self.protocol_failure(AmqpError::new(
                Condition::DecodeError,
                "SASL frame after open",
            ));
        }
        if frame.body.is_empty() {
            return; // heartbeat
        }
        let perf = match decode_performative(&frame.body) {
            Ok(p) => p,
            Err(e) => {
                return self.protocol_failure(AmqpError::new(Condition::DecodeError, e.to_string()))
            }
        };
        let ch = frame.channel;
        match perf {
            Performative::Open(_) => {
                // CONN-13.
                self.protocol_failure(AmqpError::new(
                    Condition::NotAllowed,
                    "unexpected second open",
                ))
            }
            Performative::Close(close) => self.on_close(close),
            Performative::Begin(begin) => self.on_begin(ch, begin),
            Performative::End(end) => self.on_end(ch, end),
            Performative::Attach(a) => self.on_attach(ch, a),
            Performative::Detach(d) => self.on_detach(ch, d),
            Performative::Flow(f) => self.on_flow(ch, f),
            Performative::Transfer(t, payload) => self.on_transfer(ch, t, payload),
            Performative::Disposition(d) => self.on_disposition(ch, d),
        }
    }

    fn on_close(&mut self, close: Close) {
        // CONN-17: every session and link ends, then we answer CLOSE and drop the socket.
        let err = close.error.as_ref().map(wire_to_error);
        tracing::debug!(error = ?err, "client closed the connection");
        self.teardown(err.clone());
        self.write_close(None);
        self.finish(err);
    }

    /// A connection-level protocol error: CLOSE with it.
    fn protocol_failure(&mut self, err: AmqpError) {
        match self.state {
            State::Open { .. } => {
                tracing::info!(error = %err, "closing the connection on a protocol error");
                self.close(self.now, Some(err));
            }
            State::Opening => self.refuse_open(err),
            State::Header(_) | State::Sasl | State::CloseSent { .. } | State::Closed => {
                self.finish(Some(err))
            }
        }
    }

    fn write_close(&mut self, error: Option<AmqpError>) {
        self.flush_disposition();
        if error.is_some() {
            self.errors_sent.conn += 1;
        }
        let close = Close {
            error: error.map(|e| e.to_wire()),
        };
        codec::write_amqp(&mut self.out, 0, &close, &[]);
    }

    /// Ends all sessions and links with their teardown consequences.
    fn teardown(&mut self, error: Option<AmqpError>) {
        let channels: Vec<u16> = self.sessions.keys().copied().collect();
        for ch in channels {
            self.drop_session(ch, error.clone());
        }
    }

    /// Final state: everything torn down, `Closed` emitted once.
    fn finish(&mut self, error: Option<AmqpError>) {
        self.teardown(error.clone());
        self.emit_closed(error);
        self.state = State::Closed;
    }

    /// Tells the application the connection is over, once: a connection that sent its CLOSE, or
    /// is closed, has told it already.
    fn emit_closed(&mut self, error: Option<AmqpError>) {
        if let Some(report) = self.sasl_report.take() {
            // Authenticated, but gone before OPEN named the ClientID.
            self.events.push_back(Event::Authenticated(report));
        }
        if !matches!(self.state, State::CloseSent { .. } | State::Closed) {
            self.events.push_back(Event::Closed { error });
        }
    }

    /// Error conditions sent since the last call, by scope (ERR-6).
    pub fn take_error_counts(&mut self) -> ErrorCounts {
        std::mem::take(&mut self.errors_sent)
    }

    /// Inbound messages the engine dropped (over MaxMessageSize) since the last call (MET-8).
    pub fn take_dropped_in(&mut self) -> u64 {
        std::mem::take(&mut self.dropped_in)
    }

    /// Sessions that are live (BEGIN exchanged, not ending).
    pub fn session_count(&self) -> usize {
        self.sessions.values().filter(|s| !s.ending).count()
    }

    /// The channel-max we advertised.
    fn channel_max(&self) -> u16 {
        self.channel_max
    }
}

/// Our view of an error the client sent; conditions outside our 13 are kept as internal errors
/// with the original symbol in the description, since they are only ever logged.
fn wire_to_error(e: &fe2o3_amqp_types::definitions::Error) -> AmqpError {
    let sym = crate::error::wire_symbol(e);
    match Condition::from_symbol(&sym) {
        Some(c) => AmqpError {
            condition: c,
            description: e.description.clone(),
        },
        None => AmqpError::new(
            Condition::InternalError,
            format!("{sym}: {}", e.description.clone().unwrap_or_default()),
        ),
    }
}
