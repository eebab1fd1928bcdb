//! The queues bridge: AMQP links on `queues/<channel>` ⇄ the KubeMQ backend (Q-*).
//!
//! Produce: each complete message becomes one backend send carrying the `amqp10` envelope; the
//! delivery is settled `accepted` only when the backend confirmed storage (Q-5, Q-6). Consume: a
//! link registers with its channel's shared [`fetcher`] and reports its demand; handed-out messages
//! are sent within credit, settlements go back as Ack/NAck (Q-11 … Q-30), and a link that ends
//! NAcks what it still holds, once (Q-32, Q-33).

pub mod fetcher;
mod get_gate;
mod refill_wait;
mod rehome;
mod sender;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use fe2o3_amqp_types::definitions::{Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{
    Accepted, DeliveryState, DistributionMode, Rejected, TargetArchetype,
};
use fe2o3_amqp_types::performatives::Attach;
use tokio::sync::mpsc;

use self::fetcher::{
    Command, ConsumerKey, DemandReport, FetchLimits, Handout, LoopKey, Outcome, Settlement,
    ToConsumer,
};
use self::sender::{Done, Lane, ToStore};
use super::address::{capability_hint, resolve, resolve_subscription, Resolved};
use super::caller::Caller;
use super::dynamic::{DynamicNodes, DYNAMIC_PREFIX};
use super::envelope::{DeliveryInfo, Egress};
use super::events::{ConsumeRequest, EventLinks};
use super::rpc::{Ctx as RpcCtx, ResponderRequest, RpcLinks};
use super::{ingress_or_refuse, label, rejected, settle_inbound, Serves};
use crate::auth::policy::Action;
use crate::auth::Access;
use crate::backend::Backend;
use crate::config::Settings;
use crate::driver::{Handler, HandlerFactory};
use crate::engine::{
    AmqpError, Condition, Connection, Credential, DeliveryOutcome, Event, FastMap, LinkAccept,
    LinkId,
};
use crate::kubemq::QueueMessage;
use crate::metrics::{self, Counted, Direction, Metrics};
use crate::pattern::{Pattern, Target};

/// A channel's Get loop ends after this long without consumers (and closes its session).
const FETCH_IDLE_EXIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Process-wide part of the bridge: the backend, the limits, and one fetcher per channel.
pub struct Queues<B: Backend> {
    backend: Arc<B>,
    credit_window: u32,
    max_unsettled: u32,
    limits: FetchLimits,
    default_pattern: Pattern,
    fetchers: fetcher::Registry,
    next_connection: AtomicU64,
    /// The backend lane of the next produce link.
    next_lane: AtomicU64,
    metrics: Arc<Metrics>,
    /// Who may read and write which channel (AUTHZ-1).
    access: Access,
    /// Whether clients authenticate, so that their KubeMQ calls are made as them (AUTHZ-9).
    authenticated: bool,
    /// The events and events-store bridge's process-wide part.
    events: super::events::Shared,
    /// The commands and queries bridge's settings.
    rpc: super::rpc::Shared,
}

impl<B: Backend> Queues<B> {
    /// The bridge over `backend` with the connector's settings, deciding links and messages
    /// with `access`.
    pub fn new(
        backend: B,
        settings: &Settings,
        metrics: Arc<Metrics>,
        access: Access,
    ) -> Arc<Self> {
        Arc::new(Queues {
            backend: Arc::new(backend),
            credit_window: settings.produce_credit_window(),
            max_unsettled: settings.max_unsettled_per_link.max(1),
            limits: FetchLimits {
                max_batch: 1000.max(settings.get_batch_size),
                idle_exit: FETCH_IDLE_EXIT,
            },
            default_pattern: Pattern::from_setting(&settings.default_pattern),
            fetchers: fetcher::Registry::default(),
            next_connection: AtomicU64::new(1),
            next_lane: AtomicU64::new(0),
            metrics,
            access,
            authenticated: settings.authentication,
            events: super::events::Shared {
                durable: Default::default(),
                buffer: settings.max_unsettled_per_link.max(1) as usize,
                credit_window: settings.produce_credit_window(),
            },
            rpc: super::rpc::Shared {
                max_pending: settings.rpc_max_pending.max(1) as usize,
                default_timeout: std::time::Duration::from_secs(u64::from(
                    settings.default_rpc_timeout_seconds.max(1),
                )),
                credit_window: settings.produce_credit_window(),
            },
        })
    }

    /// Joins a consumer to the Get loop of `loop_key`, starting one on `backend` if none runs.
    fn join(
        &self,
        backend: &Arc<B>,
        loop_key: LoopKey,
        key: ConsumerKey,
        to: mpsc::UnboundedSender<ToConsumer>,
    ) -> mpsc::UnboundedSender<Command> {
        fetcher::join(&self.fetchers, backend, loop_key, self.limits, key, to)
    }
}

impl<B: Backend> HandlerFactory for Arc<Queues<B>> {
    type Handler = QueuesHandler<B>;

    fn new_handler(&self, _peer: SocketAddr) -> QueuesHandler<B> {
        let (handout_tx, handout_rx) = mpsc::unbounded_channel();
        QueuesHandler {
            bridge: self.clone(),
            backend: self.backend.clone(),
            credential: None,
            caller: Caller::Connector,
            connection: self.next_connection.fetch_add(1, Ordering::Relaxed),
            client_id: String::new(),
            container_id: String::new(),
            events: Default::default(),
            rpc: RpcLinks::new(self.metrics.clone()),
            links: FastMap::default(),
            lanes: FastMap::default(),
            closing_lanes: Vec::new(),
            refill_timer: None,
            handout_tx,
            handout_rx,
            deliveries: FastMap::default(),
            next_token: 1,
            closed: HashMap::new(),
            ready_done: Vec::new(),
            ready_handouts: Vec::new(),
            settled: Vec::new(),
            demand_changed: Vec::new(),
            drained: Vec::new(),
            egress: Egress::default(),
            dynamic: DynamicNodes::new(self.max_unsettled as usize),
            counted_open: false,
            counted_sessions: 0,
        }
    }
}

/// The queue channel an address resolved to, or the refusal for what this bridge does not serve.
fn queue_channel(resolved: Resolved, server_receives: bool) -> Result<String, AmqpError> {
    match resolved {
        Resolved::Node {
            pattern: Pattern::Queues,
            channel,
        } => Ok(channel),
        Resolved::Node { pattern, .. } => Err(AmqpError::new(
            Condition::InternalError,
            format!("the {pattern} pattern is not served by the queues bridge"),
        )),
        // ADDR-10: reply tokens are only for senders.
        Resolved::Response { .. } if !server_receives => {
            Err(AmqpError::bare(Condition::NotAllowed))
        }
        Resolved::Response { .. } => Err(AmqpError::new(
            Condition::InternalError,
            "reply tokens are not served by the queues bridge",
        )),
    }
}

/// What the commands and queries bridge needs of a connection's handler for one message: its
/// fields, borrowed one by one (a method would borrow the whole handler).
macro_rules! rpc_ctx {
    ($h:ident) => {
        RpcCtx {
            backend: &$h.backend,
            client_id: &$h.client_id,
            dynamic: &mut $h.dynamic,
            shared: &$h.bridge.rpc,
        }
    };
}

/// Where one message of an anonymous link goes (ADDR-13, ADDR-18).
enum Route {
    /// A queue channel.
    Queue(String),
    /// An events or events-store channel.
    Events(Target),
    /// A request to a commands or queries channel.
    Request(Target),
    /// A reply to the request of this token.
    Response(String),
}

enum LinkKind {
    /// The client produces to this channel, or with `None` (an anonymous link, ADDR-13) to each
    /// message's `to`; its messages go through its lane (`sender::Lane`) in order.
    Produce { channel: Option<String> },
    /// The client consumes from this channel.
    Consume {
        fetcher: mpsc::UnboundedSender<Command>,
        presettled: bool,
        /// Hand-outs for this link taken from the channel so far (delivered or returned): with
        /// it the fetcher tells its hand-outs still on their way from credit already spent.
        taken: u64,
    },
}

/// A consume delivery sent unsettled: which message of which transaction it carries.
#[derive(Debug)]
struct Unsettled {
    transaction: Arc<str>,
    sequence: u64,
}

impl Unsettled {
    /// The settlement the fetcher gets when the client settles it with `outcome`.
    fn settled(self, outcome: Outcome) -> Settlement {
        Settlement {
            transaction: self.transaction,
            sequence: self.sequence,
            outcome,
        }
    }
}

/// One connection's side of the bridge.
pub struct QueuesHandler<B: Backend> {
    bridge: Arc<Queues<B>>,
    /// The backend this connection's calls go through: the shared one, or one presenting the
    /// client's token to KubeMQ (SASL-3).
    backend: Arc<B>,
    /// That token, when the backend presents it.
    credential: Option<Credential>,
    /// Who this connection's KubeMQ calls are made as (AUTHZ-9).
    caller: Caller,
    connection: u64,
    client_id: String,
    /// The OPEN container-id as sent: with a link's name, it names a durable subscription (DUR-2).
    container_id: String,
    /// The connection's events and events-store links.
    events: EventLinks,
    /// The connection's commands and queries links.
    rpc: RpcLinks,
    links: FastMap<LinkId, LinkKind>,
    /// Produce links' sends, driven by this connection's task.
    lanes: FastMap<LinkId, Lane>,
    /// Sends of produce links that ended, still being stored.
    closing_lanes: Vec<Lane>,
    /// Wakes the task when a lane's wait for a refill ends.
    refill_timer: Option<Pin<Box<tokio::time::Sleep>>>,
    handout_tx: mpsc::UnboundedSender<ToConsumer>,
    handout_rx: mpsc::UnboundedReceiver<ToConsumer>,
    /// Unsettled consume deliveries, by delivery token.
    deliveries: FastMap<u64, Unsettled>,
    next_token: u64,
    /// Fetchers of consume links that ended, for handouts still on their way to them; an entry
    /// goes when its fetcher confirms the link's Leave.
    closed: HashMap<LinkId, mpsc::UnboundedSender<Command>>,
    ready_done: Vec<Done>,
    ready_handouts: Vec<ToConsumer>,
    /// Settlements of this turn, by consume link: sent to the fetchers once per turn.
    settled: Vec<(LinkId, Settlement)>,
    /// Consume links whose demand changed this turn: reported once per turn.
    demand_changed: Vec<LinkId>,
    /// Consume links that asked for a drain this turn: the Drain carried their demand, and a
    /// later report could reach the fetcher after the drain ended and hand it credit the drain
    /// used up.
    drained: Vec<LinkId>,
    /// Encodes deliveries, reusing the last Metadata's reading.
    egress: Egress,
    /// This connection's dynamic nodes.
    dynamic: DynamicNodes,
    /// Whether this connection is counted as open (MET-1), and its sessions as counted (MET-2).
    counted_open: bool,
    counted_sessions: i64,
}

impl<B: Backend> Drop for QueuesHandler<B> {
    fn drop(&mut self) {
        // The connection ended: what its produce links received is still stored.
        let lanes: Vec<Lane> = self
            .lanes
            .drain()
            .map(|(_, l)| l)
            .chain(self.closing_lanes.drain(..))
            .collect();
        if tokio::runtime::Handle::try_current().is_ok() {
            sender::finish(self.backend.clone(), lanes);
        }
    }
}

/// What a message is counted under by the `to` it names (MET-4): responses for a reply token,
/// `queues` when it names none.
fn pattern_of(to: Option<&str>) -> Counted {
    match to.map(|t| resolve(t, None, Pattern::Queues)) {
        Some(Ok(Resolved::Node { pattern, .. })) => Counted::Pattern(pattern),
        Some(Ok(Resolved::Response { .. })) => Counted::Responses,
        _ => Counted::Pattern(Pattern::Queues),
    }
}

impl<B: Backend> QueuesHandler<B> {
    fn attach(&mut self, conn: &mut Connection, link: LinkId, a: &Attach) -> Result<(), AmqpError> {
        let client_sends = a.role == Role::Sender;
        let (address, caps): (Option<String>, Vec<String>) = if client_sends {
            match a.target.as_deref() {
                Some(TargetArchetype::Target(t)) => (
                    t.address.clone(),
                    t.capabilities
                        .iter()
                        .flat_map(|c| c.0.iter().map(|s| s.as_str().to_string()))
                        .collect(),
                ),
                None => (None, Vec::new()),
            }
        } else {
            match a.source.as_deref() {
                Some(s) => (
                    s.address.clone(),
                    s.capabilities
                        .iter()
                        .flat_map(|c| c.0.iter().map(|s| s.as_str().to_string()))
                        .collect(),
                ),
                None => (None, Vec::new()),
            }
        };
        let dynamic = if client_sends {
            matches!(a.target.as_deref(), Some(TargetArchetype::Target(t)) if t.dynamic)
        } else {
            a.source.as_deref().is_some_and(|s| s.dynamic)
        };
        if !client_sends && a.source.is_none() {
            // DUR-9: a receiver with no source names a durable subscription to delete.
            let identity = self
                .caller
                .durable_client_id(&super::events::durable::identity(
                    &self.container_id,
                    &a.name,
                ));
            return self
                .events
                .forget_durable(link, identity, &self.backend, &self.bridge.events);
        }
        let Some(address) = address.filter(|a| !a.is_empty()) else {
            if client_sends && !dynamic {
                // ADDR-13: an anonymous link; every message names its node in `to`.
                return self.accept_producer(conn, link, None);
            }
            if dynamic && !client_sends {
                // ADDR-11: mint a private node for this connection.
                let address = self.mint_address();
                if conn
                    .accept_dynamic(link, LinkAccept { credit_window: 0 }, address.clone())
                    .is_err()
                {
                    return Ok(()); // detached while attaching: see `accept_or_gone`
                }
                label(conn, link, Serves::Dynamic(&address));
                let presettled = a.snd_settle_mode == SenderSettleMode::Settled;
                self.dynamic
                    .add(link, address, Some(presettled), conn.budget());
                self.bridge.metrics.link(metrics::Role::sender).inc();
                return Ok(());
            }
            if dynamic {
                // OP-ADDR-7: a dynamic target mints a node too (a JMS temporary queue): what the
                // link sends goes to it, a receiver of this connection consumes it by its
                // address, and it ends with this link.
                let address = self.mint_address();
                if conn
                    .accept_dynamic(
                        link,
                        LinkAccept {
                            credit_window: self.bridge.credit_window,
                        },
                        address.clone(),
                    )
                    .is_err()
                {
                    return Ok(());
                }
                label(conn, link, Serves::Dynamic(&address));
                self.dynamic.add(link, address, None, conn.budget());
                self.bridge.metrics.link(metrics::Role::receiver).inc();
                return Ok(());
            }
            // OP-ADDR-9.
            return Err(super::address::AddressError::EmptyAddress.to_amqp());
        };
        if address.starts_with(DYNAMIC_PREFIX) {
            // ADDR-12 / OP-ADDR-7: a node a sender of this connection minted takes one receiver
            // of this connection; nothing else reaches a dynamic node but a message's `to`.
            if !client_sends && self.dynamic.awaits_consumer(&address) {
                if !accept_or_gone(conn, link, 0) {
                    return Ok(());
                }
                label(conn, link, Serves::Dynamic(&address));
                let presettled = a.snd_settle_mode == SenderSettleMode::Settled;
                self.dynamic.consume(link, &address, presettled);
                self.bridge.metrics.link(metrics::Role::sender).inc();
                self.dynamic.pump(conn, &address);
                return Ok(());
            }
            return Err(AmqpError::new(
                Condition::NotFound,
                "dynamic nodes are reachable only through a message's to",
            ));
        }
        let hint = capability_hint(caps.iter().map(String::as_str));
        let resolved = if client_sends {
            resolve(&address, hint, self.bridge.default_pattern)
        } else {
            resolve_subscription(&address, hint, self.bridge.default_pattern)
        }
        .map_err(|e| e.to_amqp())?;
        if let Resolved::Node {
            pattern: pattern @ (Pattern::Events | Pattern::EventsStore),
            channel,
        } = resolved
        {
            return self.attach_events(conn, link, a, pattern, channel);
        }
        if let Resolved::Node {
            pattern: pattern @ (Pattern::Commands | Pattern::Queries),
            channel,
        } = resolved
        {
            return self.attach_rpc(conn, link, a, pattern, channel);
        }
        if let (Resolved::Response { request_id }, true) = (&resolved, client_sends) {
            // ADDR-10, AUTHZ-5: a reply token, not subject to authorization.
            self.rpc
                .attach_response_link(conn, link, request_id.clone(), &self.bridge.rpc);
            return Ok(());
        }
        let channel = queue_channel(resolved, client_sends)?;
        // AUTHZ-2: after the address resolved, before the link is accepted.
        self.bridge.access.check(
            &self.client_id,
            Pattern::Queues,
            &channel,
            Action::of_link(client_sends),
        )?;
        if client_sends {
            return self.accept_producer(conn, link, Some(channel));
        }
        let source = a.source.as_deref();
        if source.and_then(|s| s.distribution_mode.as_ref()) == Some(&DistributionMode::Copy) {
            // Q-35.
            return Err(AmqpError::new(
                Condition::InvalidField,
                "distribution-mode copy is not supported on queues",
            ));
        }
        if super::events::options::has_filter(source) {
            // Q-36.
            return Err(AmqpError::new(
                Condition::NotImplemented,
                "selector filter not supported on this address",
            ));
        }
        if !accept_or_gone(conn, link, 0) {
            return Ok(());
        }
        label(conn, link, Serves::queue(&channel));
        let key: ConsumerKey = (self.connection, link);
        let loop_key = LoopKey {
            channel: channel.clone(),
            credential: self.credential.clone(),
            caller: self.caller.clone(),
        };
        let fetcher = self
            .bridge
            .join(&self.backend, loop_key, key, self.handout_tx.clone());
        self.bridge.metrics.link(metrics::Role::sender).inc();
        self.links.insert(
            link,
            LinkKind::Consume {
                fetcher,
                presettled: a.snd_settle_mode == SenderSettleMode::Settled,
                taken: 0,
            },
        );
        Ok(())
    }

    /// A new dynamic node address (ADDR-11, OP-ADDR-8): `_amqp10.tmp.<connection>.<uuid>`.
    fn mint_address(&self) -> String {
        format!(
            "{DYNAMIC_PREFIX}{}.{}",
            self.connection,
            crate::kubemq::new_id()
        )
    }

    /// Accepts a requester's link or starts a responder's, after the authorization check
    /// (AUTHZ-2).
    fn attach_rpc(
        &mut self,
        conn: &mut Connection,
        link: LinkId,
        a: &Attach,
        pattern: Pattern,
        channel: String,
    ) -> Result<(), AmqpError> {
        let client_sends = a.role == Role::Sender;
        self.bridge.access.check(
            &self.client_id,
            pattern,
            &channel,
            Action::of_link(client_sends),
        )?;
        if client_sends {
            self.rpc
                .attach_requester(conn, link, pattern, channel, &self.bridge.rpc);
            return Ok(());
        }
        self.rpc.attach_responder(
            link,
            ResponderRequest {
                pattern,
                channel: &channel,
                attach: a,
                client_id: &self.client_id,
            },
            &self.backend,
        )
    }

    /// Accepts or starts an events or events-store link, after the authorization check
    /// (AUTHZ-2).
    fn attach_events(
        &mut self,
        conn: &mut Connection,
        link: LinkId,
        a: &Attach,
        pattern: Pattern,
        channel: String,
    ) -> Result<(), AmqpError> {
        let client_sends = a.role == Role::Sender;
        self.bridge.access.check(
            &self.client_id,
            pattern,
            &channel,
            Action::of_link(client_sends),
        )?;
        if client_sends {
            if super::events::options::has_filter(a.source.as_deref()) {
                // SEL-3, OP-EV-4: a filter selects what a receiver gets; a sender has none.
                return Err(AmqpError::new(
                    Condition::NotAllowed,
                    "selectors apply only to receiving links",
                ));
            }
            self.events.attach_publisher(
                conn,
                link,
                pattern,
                channel,
                &self.bridge.events,
                &self.bridge.metrics,
            );
            return Ok(());
        }
        self.events.attach_subscriber(
            link,
            ConsumeRequest {
                pattern,
                channel: &channel,
                attach: a,
                container_id: &self.container_id,
                caller: &self.caller,
                reader: (channel.contains(['*', '>']) && self.bridge.access.is_enforced()).then(
                    || super::events::WildcardReader {
                        access: self.bridge.access.clone(),
                        client_id: self.client_id.clone(),
                    },
                ),
            },
            &self.backend,
            &self.bridge.events,
        )
    }

    /// Settles an inbound delivery ([`settle_inbound`]).
    fn settle_in(
        &self,
        conn: &mut Connection,
        link: LinkId,
        delivery_id: u32,
        presettled: bool,
        state: DeliveryState,
    ) {
        settle_inbound(
            conn,
            &self.bridge.metrics,
            link,
            delivery_id,
            presettled,
            state,
        );
    }

    /// Brings the session gauge, error counters and engine drops up to date (MET-2, MET-7, MET-8).
    fn sync_metrics(&mut self, conn: &mut Connection) {
        let m = &self.bridge.metrics;
        let sessions = conn.session_count() as i64;
        m.sessions.inc_by(sessions - self.counted_sessions);
        self.counted_sessions = sessions;
        let e = conn.take_error_counts();
        m.errors(metrics::Scope::conn, e.conn);
        m.errors(metrics::Scope::session, e.session);
        m.errors(metrics::Scope::link, e.link);
        m.transfers_in_dropped.inc_by(conn.take_dropped_in());
    }

    /// Accepts a produce link bound to `channel`, or anonymous with `None` (ADDR-13).
    fn accept_producer(
        &mut self,
        conn: &mut Connection,
        link: LinkId,
        channel: Option<String>,
    ) -> Result<(), AmqpError> {
        // Lanes in turn: links opened one after another use different streams of the backend
        // (a hash of the link's ids put two producers on one stream in about one run in four,
        // where each then waited for the other's batch).
        if !accept_or_gone(conn, link, self.bridge.credit_window) {
            return Ok(());
        }
        let serves = match &channel {
            Some(c) => Serves::queue(c),
            None => Serves::Anonymous,
        };
        label(conn, link, serves);
        let lane = self.bridge.next_lane.fetch_add(1, Ordering::Relaxed);
        self.lanes.insert(link, Lane::new(lane, link));
        self.links.insert(link, LinkKind::Produce { channel });
        self.bridge.metrics.link(metrics::Role::receiver).inc();
        Ok(())
    }

    /// Resolves the `to` of a message on an anonymous link (ADDR-13, ADDR-14): what does not
    /// resolve is a precondition failure of that message.
    fn route(&self, to: Option<&str>) -> Result<Route, AmqpError> {
        let to = to
            .filter(|t| !t.is_empty())
            .ok_or_else(|| AmqpError::new(Condition::PreconditionFailed, "message has no to"))?;
        let resolved = resolve(to, None, self.bridge.default_pattern)
            .map_err(|e| AmqpError::new(Condition::PreconditionFailed, e.description()))?;
        let (pattern, channel) = match resolved {
            // ADDR-15, AUTHZ-5: reply tokens are not authorized.
            Resolved::Response { request_id } => return Ok(Route::Response(request_id)),
            Resolved::Node { pattern, channel } => (pattern, channel),
        };
        // AUTHZ-4: each message of an anonymous link is checked for Write on its node.
        self.bridge
            .access
            .check(&self.client_id, pattern, &channel, Action::Write)?;
        let target = Target { pattern, channel };
        Ok(match pattern {
            Pattern::Queues => Route::Queue(target.channel),
            Pattern::Events | Pattern::EventsStore => Route::Events(target),
            Pattern::Commands | Pattern::Queries => Route::Request(target),
        })
    }

    /// Reports a consume link's demand: credit it can still use, within MaxUnsettledPerLink.
    fn report_demand(&self, conn: &Connection, link: LinkId) {
        if let Some(LinkKind::Consume { fetcher, taken, .. }) = self.links.get(&link) {
            let _ = fetcher.send(Command::Demand(DemandReport {
                consumer: (self.connection, link),
                credit: self.demand(conn, link),
                taken: *taken,
            }));
        }
    }

    /// Credit the link can use now, within MaxUnsettledPerLink (Q-12, FLOW-7) and within what
    /// its session's window takes (plus [`WINDOW_SLACK`] for a link whose deliveries are
    /// settled by the client): a client that grants credit but no session window gets no more
    /// messages taken off the queue than the wire can carry, and a pre-settled one none.
    fn demand(&self, conn: &Connection, link: LinkId) -> u32 {
        let room = (self.bridge.max_unsettled as usize).saturating_sub(conn.unsettled_count(link));
        let session = conn.session_room(link);
        let presettled = matches!(
            self.links.get(&link),
            Some(LinkKind::Consume {
                presettled: true,
                ..
            })
        );
        let slack = if presettled { 0 } else { WINDOW_SLACK };
        let wire = session
            .window
            .saturating_add(slack)
            .saturating_sub(session.waiting) as usize;
        (conn.credit(link) as usize).min(room).min(wire) as u32
    }
    fn produce(&mut self, conn: &mut Connection, d: crate::engine::Delivery) {
        if self.events.produce(
            conn,
            &d,
            &self.client_id,
            &self.backend,
            &self.bridge.metrics,
        ) {
            return;
        }
        if self.rpc.produce(conn, &d, rpc_ctx!(self)) {
            return;
        }
        if let Some(address) = self.dynamic.node_of(d.link).map(str::to_string) {
            // A sender that minted a node (OP-ADDR-7) sends into it.
            let state = match self.dynamic.push(&address, d.payload.clone()) {
                Ok(()) => DeliveryState::Accepted(Accepted {}),
                Err(e) => DeliveryState::Rejected(Rejected {
                    error: Some(e.to_wire()),
                }),
            };
            self.settle_in(conn, d.link, d.delivery_id, d.settled, state);
            self.dynamic.pump(conn, &address);
            return;
        }
        let Some(LinkKind::Produce { channel }) = self.links.get(&d.link) else {
            return;
        };
        let stored = ingress_or_refuse(conn, &self.bridge.metrics, &d);
        // MET-4: every complete inbound message, under the pattern it is for (an anonymous
        // link's under the pattern its `to` names; queues when it names none).
        let pattern = match (channel, &stored) {
            (None, Some(s)) => pattern_of(s.to.as_deref()),
            _ => Counted::Pattern(Pattern::Queues),
        };
        self.bridge.metrics.transfer(Direction::In, pattern);
        let Some(stored) = stored else {
            return;
        };
        if channel.is_none() {
            if let Some(to) = stored
                .to
                .as_deref()
                .filter(|t| t.starts_with(DYNAMIC_PREFIX))
            {
                // ADDR-12: only this connection's own dynamic nodes are reachable.
                let state = match self.dynamic.push(to, d.payload.clone()) {
                    Ok(()) => DeliveryState::Accepted(Accepted {}),
                    Err(e) => DeliveryState::Rejected(Rejected {
                        error: Some(e.to_wire()),
                    }),
                };
                self.settle_in(conn, d.link, d.delivery_id, d.settled, state);
                let to = to.to_string();
                self.dynamic.pump(conn, &to);
                return;
            }
        }
        let channel = match channel {
            Some(c) => c.clone(),
            None => match self.route(stored.to.as_deref()) {
                // ADDR-18: one anonymous link reaches every pattern, message by message.
                Ok(Route::Events(target)) => {
                    self.events
                        .send(&d, target, stored, &self.client_id, &self.backend);
                    return;
                }
                Ok(Route::Request(target)) => {
                    self.rpc.request(conn, &d, stored, target, rpc_ctx!(self));
                    return;
                }
                Ok(Route::Response(request_id)) => {
                    self.rpc
                        .respond(conn, &d, &request_id, stored, rpc_ctx!(self));
                    return;
                }
                Ok(Route::Queue(channel)) => channel,
                Err(e) => {
                    // ADDR-14: the message is refused, the link stays; ADDR-17: a pre-settled one
                    // is dropped (settle sends nothing for it).
                    tracing::debug!(error = %e, "unroutable message on an anonymous link");
                    self.settle_in(
                        conn,
                        d.link,
                        d.delivery_id,
                        d.settled,
                        DeliveryState::Rejected(Rejected {
                            error: Some(e.to_wire()),
                        }),
                    );
                    return;
                }
            },
        };
        let message = QueueMessage {
            client_id: self.client_id.clone(),
            channel,
            metadata: stored.metadata,
            body: stored.body,
            ..Default::default()
        };
        match self.lanes.get_mut(&d.link) {
            Some(lane) => lane.push(ToStore {
                delivery_id: d.delivery_id,
                presettled: d.settled,
                message,
            }),
            None => self.settle_in(
                conn,
                d.link,
                d.delivery_id,
                d.settled,
                rejected(Condition::InternalError, "the link's sends are gone"),
            ),
        }
    }

    /// Sends a handed-out message on its link within credit, or gives it back to the fetcher.
    fn consume(&mut self, conn: &mut Connection, h: Handout) {
        let link = h.consumer.1;
        let Some(LinkKind::Consume {
            fetcher,
            presettled,
            taken,
        }) = self.links.get_mut(&link)
        else {
            // The link ended while the message was on its way: the fetcher offers it again.
            if let Some(f) = self.closed.get(&link) {
                let _ = f.send(Command::Return(Box::new(h)));
            }
            return;
        };
        *taken += 1;
        let (fetcher, presettled) = (fetcher.clone(), *presettled);
        let receive_count = h.message.attributes.as_ref().map_or(1, |a| a.receive_count);
        let payload = self.egress.message(
            &h.message.metadata,
            &h.message.body,
            &h.message.tags,
            DeliveryInfo { receive_count },
        );
        let token = self.next_token;
        self.next_token += 1;
        let sent = conn.send(link, &token.to_be_bytes(), &payload, presettled, token);
        if sent.is_ok() {
            // MET-4.
            self.bridge
                .metrics
                .transfer(Direction::Out, Counted::Pattern(Pattern::Queues));
        }
        match sent {
            Ok(_) if presettled => {
                // Q-30: at-most-once, acked as it is sent.
                let message = Unsettled {
                    transaction: h.transaction,
                    sequence: h.sequence,
                };
                self.settled.push((link, message.settled(Outcome::Ack)));
            }
            Ok(_) => {
                self.deliveries.insert(
                    token,
                    Unsettled {
                        transaction: h.transaction,
                        sequence: h.sequence,
                    },
                );
            }
            // No credit (a drain or a lower FLOW won the race): never sent beyond credit, Q-16.
            Err(_) => {
                let _ = fetcher.send(Command::Return(Box::new(h)));
            }
        }
    }
}

impl<B: Backend> Handler for QueuesHandler<B> {
    fn on_event(&mut self, conn: &mut Connection, event: Event) {
        self.handle_event(conn, event);
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.poll_work(cx)
    }

    fn on_ready(&mut self, conn: &mut Connection) {
        self.do_work(conn);
    }

    fn after_turn(&mut self, conn: &mut Connection) {
        self.flush_turn(conn);
        self.sync_metrics(conn);
    }
}

/// Transfer frames a consume link of unsettled deliveries may have waiting for its session's
/// window (so at most this many messages are locked for it beyond what the window takes): enough
/// to have the next ones ready when the client's FLOW opens the window. A pre-settled link gets
/// none: a message taken for it is gone from the queue, and one that cannot be sent would be lost.
const WINDOW_SLACK: u32 = 4;

/// Accepts `link`; `false` when it is gone — the client detached it in the same write as its
/// ATTACH, and the engine dropped it — so the caller registers nothing for it (no consumer, lane
/// or gauge is left behind for a link that no longer exists).
fn accept_or_gone(conn: &mut Connection, link: LinkId, credit_window: u32) -> bool {
    conn.accept_link(link, LinkAccept { credit_window }).is_ok()
}

impl<B: Backend> QueuesHandler<B> {
    fn handle_event(&mut self, conn: &mut Connection, event: Event) {
        match event {
            // The driver writes the audit event and paces refusals.
            Event::Authenticated(_) | Event::OpenRefused { .. } => {}
            Event::Opened {
                client_id,
                credential,
                container_id,
                ..
            } => {
                self.caller = Caller::of(self.bridge.authenticated, &client_id);
                self.client_id = client_id;
                self.container_id = container_id;
                if let Some(c) = credential {
                    if let Some(b) = self.bridge.backend.with_credential(&c) {
                        self.backend = Arc::new(b);
                        self.credential = Some(c);
                    }
                }
                self.counted_open = true;
                self.bridge.metrics.connections.inc();
            }
            Event::AttachRequested { link, attach } => {
                if let Err(e) = self.attach(conn, link, &attach) {
                    let _ = conn.refuse_link(link, e);
                }
            }
            Event::Delivery(d) => self.produce(conn, d),
            Event::Credit { link, drain, .. } => {
                if self
                    .events
                    .credit(conn, link, drain, &self.bridge.events, &self.bridge.metrics)
                {
                    return;
                }
                if self.rpc.credit(conn, link, drain, &self.bridge.rpc) {
                    return;
                }
                if drain {
                    // FLOW-5: the fetcher hands over what is immediately available, then says
                    // DrainDone; it never waits for new messages.
                    match self.links.get(&link) {
                        Some(LinkKind::Consume { fetcher, taken, .. }) => {
                            let _ = fetcher.send(Command::Drain(DemandReport {
                                consumer: (self.connection, link),
                                credit: self.demand(conn, link),
                                taken: *taken,
                            }));
                            self.drained.push(link);
                        }
                        _ if self.dynamic.is_node_link(link) => {
                            self.dynamic.pump_link(conn, link);
                            let _ = conn.drain_done(link);
                        }
                        _ => {
                            let _ = conn.drain_done(link);
                        }
                    }
                } else if self.dynamic.is_node_link(link) {
                    self.dynamic.pump_link(conn, link);
                } else {
                    // A FLOW after a drain in the same turn is new credit: it is reported.
                    self.drained.retain(|l| *l != link);
                    self.demand_changed.push(link);
                }
            }
            Event::WindowOpened => {
                // Every consume link's demand may have been cut by its session's window or a
                // full transport, and the other senders may have stopped for it.
                for (link, kind) in &self.links {
                    if matches!(kind, LinkKind::Consume { .. }) {
                        self.demand_changed.push(*link);
                    }
                }
                self.events.pump_all(conn, &self.bridge.metrics);
                self.rpc.pump_all(conn, &self.bridge.rpc);
                self.dynamic.pump_all(conn);
            }
            Event::Settled { link, token, state } => {
                if DynamicNodes::owns_token(token) {
                    self.dynamic.settled(conn, token, state.as_ref());
                    return;
                }
                if super::rpc::owns_token(token) {
                    // OP-RPC-8: a request delivery's settlement changes nothing; its response
                    // or its timeout ends it.
                    return;
                }
                let Some(message) = self.deliveries.remove(&token) else {
                    return;
                };
                // MET-5.
                let counted = match &state {
                    Some(DeliveryOutcome::Accepted) => Some(metrics::Outcome::accepted),
                    Some(DeliveryOutcome::Rejected(_)) => Some(metrics::Outcome::rejected),
                    Some(DeliveryOutcome::Released) => Some(metrics::Outcome::released),
                    Some(DeliveryOutcome::Modified { .. }) => Some(metrics::Outcome::modified),
                    _ => None,
                };
                if let Some(o) = counted {
                    self.bridge.metrics.disposition(o);
                }
                let outcome = match state {
                    // Q-20, Q-21, Q-24.
                    Some(DeliveryOutcome::Accepted) | Some(DeliveryOutcome::Rejected(_)) | None => {
                        Outcome::Ack
                    }
                    // Q-22, Q-23, Q-25.
                    _ => Outcome::Nack,
                };
                if let Some(LinkKind::Consume { .. }) = self.links.get(&link) {
                    self.settled.push((link, message.settled(outcome)));
                }
                self.demand_changed.push(link);
            }
            Event::LinkClosed {
                link, unsettled, ..
            } => {
                if let Some(role) = self.events.closed(link) {
                    self.bridge.metrics.link(role).dec();
                    return;
                }
                if let Some(role) = self.rpc.closed(link) {
                    self.bridge.metrics.link(role).dec();
                    return;
                }
                if let Some(role) = self.dynamic.closed(link, &unsettled) {
                    self.bridge.metrics.link(role).dec();
                    return;
                }
                let kind = self.links.remove(&link);
                match &kind {
                    Some(LinkKind::Produce { .. }) => {
                        self.bridge.metrics.link(metrics::Role::receiver).dec();
                        // What the link sent is still stored; the outcomes find no link.
                        if let Some(mut lane) = self.lanes.remove(&link) {
                            lane.close();
                            if !lane.is_idle() {
                                self.closing_lanes.push(lane);
                            }
                        }
                    }
                    Some(_) => {
                        self.bridge.metrics.link(metrics::Role::sender).dec();
                    }
                    None => {}
                }
                if let Some(LinkKind::Consume { fetcher, .. }) = kind {
                    // This turn's settlements first; then Q-32, Q-33: every unsettled delivery
                    // NAcked, once (the engine reports each once).
                    let mut settled = self.take_settled(link);
                    for token in unsettled {
                        if let Some(message) = self.deliveries.remove(&token) {
                            settled.push(message.settled(Outcome::Nack));
                        }
                    }
                    if !settled.is_empty() {
                        let _ = fetcher.send(Command::Settle(settled));
                    }
                    let _ = fetcher.send(Command::Leave((self.connection, link)));
                    self.closed.insert(link, fetcher);
                }
            }
            Event::Closed { .. } => {
                if std::mem::take(&mut self.counted_open) {
                    self.bridge.metrics.connections.dec();
                }
            }
        }
    }

    fn poll_work(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.poll_lanes(cx);
        while let Poll::Ready(Some(h)) = self.handout_rx.poll_recv(cx) {
            self.ready_handouts.push(h);
        }
        let events = self.events.poll(cx).is_ready();
        let rpc = self.rpc.poll(cx).is_ready();
        if !events && !rpc && self.ready_done.is_empty() && self.ready_handouts.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    fn do_work(&mut self, conn: &mut Connection) {
        self.events
            .work(conn, &self.bridge.events, &self.bridge.metrics);
        self.rpc.work(conn, &mut self.dynamic, &self.bridge.rpc);
        for d in std::mem::take(&mut self.ready_done) {
            // Q-6: the outcome the backend reported; a link gone meanwhile needs nothing.
            self.settle_in(conn, d.link, d.delivery_id, d.presettled, d.state);
        }
        for item in std::mem::take(&mut self.ready_handouts) {
            match item {
                ToConsumer::Messages(handouts) => {
                    for h in handouts {
                        self.demand_changed.push(h.consumer.1);
                        self.consume(conn, h);
                    }
                }
                ToConsumer::DrainDone((_, link)) => {
                    let _ = conn.drain_done(link);
                }
                // Every hand-out for it has arrived: nothing more to give back.
                ToConsumer::Left((_, link)) => {
                    self.closed.remove(&link);
                }
                // Gone already if the client detached meanwhile.
                ToConsumer::Refused((_, link)) => {
                    let _ = conn.detach(link, Some(crate::auth::refused_by_kubemq()));
                }
            }
        }
    }

    /// Moves every produce lane on (finished batches' outcomes into `ready_done`, next batches
    /// started), and keeps the timer set for the earliest wait for a refill.
    fn poll_lanes(&mut self, cx: &mut Context<'_>) {
        let backend = &self.backend;
        loop {
            for lane in self.lanes.values_mut().chain(self.closing_lanes.iter_mut()) {
                lane.poll(cx, backend, &mut self.ready_done);
            }
            self.closing_lanes.retain(|l| !l.is_idle());
            let lanes = self.lanes.values().chain(self.closing_lanes.iter());
            let Some(at) = lanes.filter_map(Lane::wake_at).min() else {
                self.refill_timer = None;
                return;
            };
            let timer = self
                .refill_timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if timer.deadline() != at {
                timer.as_mut().reset(at);
            }
            if std::future::Future::poll(timer.as_mut(), cx).is_pending() {
                return;
            }
            // A wait ended: its lane starts its batch on the next round.
            self.refill_timer = None;
        }
    }

    /// Removes and returns this turn's settlements of `link`.
    fn take_settled(&mut self, link: LinkId) -> Vec<Settlement> {
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.settled)
            .into_iter()
            .partition(|(l, _)| *l == link);
        self.settled = rest;
        mine.into_iter().map(|(_, s)| s).collect()
    }

    /// Sends this turn's settlements to the fetchers, one command per link, then the demand of
    /// every link whose credit or settlements changed (per turn, not per message: a ranged
    /// disposition settles a whole window at once).
    fn flush_turn(&mut self, conn: &Connection) {
        if !self.settled.is_empty() {
            let mut by_link: FastMap<LinkId, Vec<Settlement>> = FastMap::default();
            for (link, s) in self.settled.drain(..) {
                by_link.entry(link).or_default().push(s);
            }
            for (link, settled) in by_link {
                if let Some(LinkKind::Consume { fetcher, .. }) = self.links.get(&link) {
                    let _ = fetcher.send(Command::Settle(settled));
                }
            }
        }
        if !self.demand_changed.is_empty() {
            let mut links = std::mem::take(&mut self.demand_changed);
            links.sort_unstable();
            links.dedup();
            for &link in &links {
                if !self.drained.contains(&link) {
                    self.report_demand(conn, link);
                }
            }
            links.clear();
            self.demand_changed = links;
        }
        self.drained.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::time::Instant;

    use bytes::BytesMut;
    use fe2o3_amqp_types::messaging::{Accepted, DeliveryState};
    use fe2o3_amqp_types::performatives::Disposition;

    use super::*;
    use crate::backend::embedded::Embedded;
    use crate::engine::{peer, AdmitAll, Transport, HEADER_AMQP};
    use crate::store::Store;

    /// A handler on a fresh connection whose consume links on channel `q` talk to `commands`
    /// instead of a Get loop (the registry already holds that channel's command sender).
    struct Rig {
        conn: Connection,
        handler: QueuesHandler<Embedded>,
        commands: mpsc::UnboundedReceiver<Command>,
        input: BytesMut,
        metrics: Arc<Metrics>,
        _dir: tempfile::TempDir,
    }

    impl Rig {
        fn new() -> Rig {
            let dir = tempfile::tempdir().expect("temp dir");
            let (store, _) = Store::open(dir.path()).expect("store opens");
            let settings = Settings::default();
            let metrics = Arc::new(Metrics::new());
            let bridge = Queues::new(
                Embedded::new(store),
                &settings,
                metrics.clone(),
                Access::open(),
            );
            let (tx, commands) = mpsc::unbounded_channel();
            bridge.fetchers.lock().insert(LoopKey::shared("q"), tx);
            let handler = bridge.new_handler(([127, 0, 0, 1], 5672).into());
            let cfg = Arc::new(settings.engine_config_no_auth());
            Rig {
                conn: Connection::new(cfg, Transport::Plain, AdmitAll, Instant::now()),
                handler,
                commands,
                input: BytesMut::new(),
                metrics,
                _dir: dir,
            }
        }

        /// One connection turn over `bytes`, as the driver runs it.
        fn turn(&mut self, bytes: &[u8]) {
            self.input.extend_from_slice(bytes);
            self.conn.handle_input(Instant::now(), &mut self.input);
            self.finish_turn();
        }

        /// One connection turn over what the Get loop handed over, as the driver runs it.
        async fn ready_turn(&mut self) {
            poll_fn(|cx| self.handler.poll_ready(cx)).await;
            self.handler.on_ready(&mut self.conn);
            self.finish_turn();
        }

        fn finish_turn(&mut self) {
            while let Some(ev) = self.conn.poll_event() {
                self.handler.on_event(&mut self.conn, ev);
            }
            self.handler.after_turn(&mut self.conn);
            self.conn.poll_transmit(&mut BytesMut::new());
        }

        /// The commands sent since the last call, by kind: J(oin), D(emand), R (drain), S(ettle),
        /// L(eave), T (return); the consumer's hand-out channel from a Join.
        #[allow(clippy::type_complexity)]
        fn kinds(
            &mut self,
        ) -> (
            String,
            Option<(ConsumerKey, mpsc::UnboundedSender<ToConsumer>)>,
        ) {
            let mut s = String::new();
            let mut to = None;
            while let Ok(c) = self.commands.try_recv() {
                s.push(match c {
                    Command::Join(key, tx) => {
                        to = Some((key, tx));
                        'J'
                    }
                    Command::Demand(..) => 'D',
                    Command::Drain(..) => 'R',
                    Command::Leave(..) => 'L',
                    Command::Settle(..) => 'S',
                    Command::Return(..) => 'T',
                });
            }
            (s, to)
        }
    }

    /// FLOW-5: a turn that sends the Get loop a Drain does not also report that link's demand,
    /// even when the same turn settled deliveries (which changes demand) — the report could reach
    /// the loop after the drain ended and hand back credit the drain used up — unless a FLOW with
    /// new credit followed the drain in that turn.
    #[tokio::test]
    async fn a_drain_turn_reports_demand_only_for_a_later_flow() {
        let mut r = Rig::new();
        let mut bytes = HEADER_AMQP.to_vec();
        bytes.extend(peer::frame(0, &peer::open("c"), &[]));
        bytes.extend(peer::frame(0, &peer::begin(), &[]));
        bytes.extend(peer::frame(
            0,
            &peer::attach_receiver("r", 0, "queues/q"),
            &[],
        ));
        r.turn(&bytes);
        let (kinds, to) = r.kinds();
        assert_eq!(kinds, "J", "the consume link joined channel q's loop");
        let (consumer, to) = to.expect("the Join carries the hand-out channel");

        r.turn(&peer::frame(0, &peer::link_flow(0, 0, 10, false), &[]));
        assert_eq!(r.kinds().0, "D", "new credit is reported");

        // Two messages go out on the link (delivery-ids 0 and 1).
        let handouts = (1..=2)
            .map(|sequence| Handout {
                consumer,
                transaction: Arc::from("t1"),
                sequence,
                message: QueueMessage {
                    body: bytes::Bytes::from_static(b"m"),
                    ..Default::default()
                },
            })
            .collect();
        to.send(ToConsumer::Messages(handouts))
            .expect("handler listens");
        r.ready_turn().await;
        assert_eq!(r.kinds().0, "D", "the hand-outs change demand");

        // The client accepts both and drains, in one write: one turn.
        let accepted = Some(DeliveryState::Accepted(Accepted {}));
        let settle = Disposition {
            role: Role::Receiver,
            first: 0,
            last: Some(1),
            settled: true,
            state: accepted,
            batchable: false,
        };
        let mut both = peer::frame(0, &settle, &[]);
        both.extend(peer::frame(0, &peer::link_flow(0, 2, 8, true), &[]));
        r.turn(&both);
        assert_eq!(
            r.kinds().0,
            "RS",
            "the settlements and the drain, and no demand report behind the drain"
        );

        // A drain, then new credit, in one turn: the new credit is reported.
        let mut both = peer::frame(0, &peer::link_flow(0, 2, 8, true), &[]);
        both.extend(peer::frame(0, &peer::link_flow(0, 2, 5, false), &[]));
        r.turn(&both);
        assert_eq!(r.kinds().0, "RD", "the FLOW after the drain is new credit");
    }

    /// A consume link that ended keeps its Get loop's sender only until the loop confirms the
    /// Leave: a hand-out still on its way before that goes back to the loop, and afterwards the
    /// connection holds nothing for the link (a connection whose consumers come and go does not
    /// grow).
    #[tokio::test]
    async fn an_ended_consumer_is_forgotten_once_its_loop_confirms() {
        use fe2o3_amqp_types::performatives::Detach;
        let mut r = Rig::new();
        let mut bytes = HEADER_AMQP.to_vec();
        bytes.extend(peer::frame(0, &peer::open("c"), &[]));
        bytes.extend(peer::frame(0, &peer::begin(), &[]));
        for round in 0..3u32 {
            bytes.extend(peer::frame(
                0,
                &peer::attach_receiver(&format!("r{round}"), 0, "queues/q"),
                &[],
            ));
            r.turn(&bytes);
            bytes.clear();
            let detach = Detach {
                handle: 0.into(),
                closed: true,
                error: None,
            };
            r.turn(&peer::frame(0, &detach, &[]));
            let (kinds, to) = r.kinds();
            assert!(kinds.starts_with('J') && kinds.ends_with('L'), "{kinds}");
            let (consumer, to) = to.expect("the Join carries the hand-out channel");
            assert_eq!(r.handler.closed.len(), 1, "held until the loop confirms");
            // A hand-out that crossed the Leave goes back; then the loop confirms.
            let late = Handout {
                consumer,
                transaction: Arc::from("t"),
                sequence: 1,
                message: QueueMessage::default(),
            };
            to.send(ToConsumer::Messages(vec![late])).unwrap();
            to.send(ToConsumer::Left(consumer)).unwrap();
            r.ready_turn().await;
            assert_eq!(r.kinds().0, "T", "the late hand-out was given back");
            assert!(r.handler.closed.is_empty(), "round {round}: nothing kept");
        }
    }

    /// A link the client detaches in the same write as its ATTACH is dropped by the engine before
    /// the bridge sees the attach: consumers, producers and dynamic receivers alike leave no
    /// Get-loop membership, lane or link entry behind.
    #[tokio::test]
    async fn a_link_detached_while_attaching_leaves_nothing() {
        use fe2o3_amqp_types::performatives::Detach;
        let mut r = Rig::new();
        let mut bytes = HEADER_AMQP.to_vec();
        bytes.extend(peer::frame(0, &peer::open("c"), &[]));
        bytes.extend(peer::frame(0, &peer::begin(), &[]));
        let mut dynamic = peer::attach_receiver("d", 0, "");
        if let Some(s) = dynamic.source.as_mut() {
            s.address = None;
            s.dynamic = true;
        }
        let attaches = [
            peer::attach_receiver("c", 0, "queues/q"),
            peer::attach_sender("p", 0, "queues/q"),
            dynamic,
        ];
        for attach in attaches {
            bytes.extend(peer::frame(0, &attach, &[]));
            let detach = Detach {
                handle: 0.into(),
                closed: true,
                error: None,
            };
            bytes.extend(peer::frame(0, &detach, &[]));
        }
        r.turn(&bytes);
        assert_eq!(r.kinds().0, "", "no consumer joined the Get loop");
        assert!(r.handler.links.is_empty(), "no link kept");
        assert!(r.handler.lanes.is_empty(), "no produce lane kept");
        assert!(r.handler.dynamic.is_empty(), "no dynamic mailbox kept");
    }

    /// What a client can do to a connection, one frame each.
    #[derive(Debug, Clone)]
    enum Step {
        Begin(u16),
        End(u16),
        /// Consumer, producer or dynamic receiver (`kind` 0, 1, 2) with one of three names.
        Attach {
            ch: u16,
            handle: u32,
            kind: u8,
            name: u8,
        },
        Detach {
            ch: u16,
            handle: u32,
        },
        Flow {
            ch: u16,
            handle: u32,
            credit: u32,
            drain: bool,
        },
        Transfer {
            ch: u16,
            handle: u32,
            id: u32,
            more: bool,
        },
        Close,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        // Mostly the session opened first, so that most steps reach the bridge.
        let ch = prop_oneof![4 => Just(0u16), 1 => Just(1u16)];
        let handle = 0u32..3;
        prop_oneof![
            1 => ch.clone().prop_map(Step::Begin),
            1 => ch.clone().prop_map(Step::End),
            5 => (ch.clone(), handle.clone(), 0u8..3, 0u8..3).prop_map(|(ch, handle, kind, name)| {
                Step::Attach { ch, handle, kind, name }
            }),
            3 => (ch.clone(), handle.clone()).prop_map(|(ch, handle)| Step::Detach { ch, handle }),
            3 => (ch.clone(), handle.clone(), 0u32..5, any::<bool>()).prop_map(
                |(ch, handle, credit, drain)| Step::Flow { ch, handle, credit, drain }
            ),
            2 => (ch, handle, 0u32..8, any::<bool>())
                .prop_map(|(ch, handle, id, more)| Step::Transfer { ch, handle, id, more }),
            1 => Just(Step::Close),
        ]
    }

    fn frame_of(step: &Step) -> Vec<u8> {
        use fe2o3_amqp_types::performatives::{Close, End};
        match *step {
            Step::Begin(ch) => peer::frame(ch, &peer::begin(), &[]),
            Step::End(ch) => peer::frame(ch, &End { error: None }, &[]),
            Step::Attach {
                ch,
                handle,
                kind,
                name,
            } => {
                let name = format!("l{name}");
                let a = match kind {
                    0 => peer::attach_receiver(&name, handle, "queues/q"),
                    1 => peer::attach_sender(&name, handle, "queues/q"),
                    _ => {
                        let mut a = peer::attach_receiver(&name, handle, "");
                        if let Some(s) = a.source.as_mut() {
                            s.address = None;
                            s.dynamic = true;
                        }
                        a
                    }
                };
                peer::frame(ch, &a, &[])
            }
            Step::Detach { ch, handle } => peer::frame(ch, &peer::detach(handle), &[]),
            Step::Flow {
                ch,
                handle,
                credit,
                drain,
            } => peer::frame(ch, &peer::link_flow(handle, 0, credit, drain), &[]),
            Step::Transfer {
                ch,
                handle,
                id,
                more,
            } => peer::frame(
                ch,
                &peer::transfer(handle, Some(id), Some(&id.to_be_bytes()), false, more),
                &[0x00, 0x53, 0x75, 0xa0, 0x01, b'm'],
            ),
            Step::Close => peer::frame(0, &Close { error: None }, &[]),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 256, ..Default::default() })]

        /// Whatever a client does — attach, detach, flow, transfer, begin, end, close, in any
        /// order, in one write or frame by frame, legal or not — once its connection ends the
        /// bridge holds nothing for it: every consumer that joined the Get loop left it, no link
        /// is counted in the links gauge, and the handler keeps no link.
        #[test]
        fn any_interleaving_leaves_no_bridge_state(
            links in proptest::collection::vec((0u32..8, 0u8..3), 0..6),
            steps in proptest::collection::vec(step(), 1..40),
            one_write in proptest::bool::ANY,
        ) {
            // A few links attached first (most often legal), then anything.
            let steps: Vec<Step> = links
                .into_iter()
                .enumerate()
                .map(|(n, (handle, kind))| Step::Attach { ch: 0, handle, kind, name: n as u8 })
                .chain(steps)
                .collect();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let _entered = rt.enter();
            let mut r = Rig::new();
            let mut bytes = HEADER_AMQP.to_vec();
            bytes.extend(peer::frame(0, &peer::open("c"), &[]));
            bytes.extend(peer::frame(0, &peer::begin(), &[]));
            r.turn(&bytes);
            if one_write {
                let all: Vec<u8> = steps.iter().flat_map(frame_of).collect();
                r.turn(&all);
            } else {
                for s in &steps {
                    r.turn(&frame_of(s));
                }
            }
            r.conn.transport_lost();
            r.finish_turn();
            let mut joined = 0;
            let mut left = 0;
            while let Ok(c) = r.commands.try_recv() {
                match c {
                    Command::Join(..) => joined += 1,
                    Command::Leave(..) => left += 1,
                    _ => {}
                }
            }
            proptest::prop_assert_eq!(joined, left, "every consumer that joined left");
            proptest::prop_assert!(r.handler.links.is_empty(), "links kept: {:?}", r.handler.links.len());
            let gauge = r.metrics.link(metrics::Role::sender).get()
                + r.metrics.link(metrics::Role::receiver).get();
            proptest::prop_assert_eq!(gauge, 0, "links still counted");
        }
    }
}
