//! One connection's handler: every link of every pattern is resolved here into a
//! [`LinkEntry`], and each engine event of a link goes, by one lookup and one `match`, to the
//! part that serves it — queues, events, commands and queries, or the connection's dynamic nodes.
//! What a message of an anonymous link becomes is decided here too, message by message
//! (ADDR-13 … ADDR-18).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use fe2o3_amqp_types::definitions::{Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState, TargetArchetype};
use fe2o3_amqp_types::performatives::Attach;
use fe2o3_amqp_types::primitives::{Array, Symbol};

use super::address::{capability_hint, resolve, resolve_subscription, AddressError, Resolved};
use super::caller::Caller;
use super::context::Ctx;
use super::dynamic::{DynamicNodes, DYNAMIC_PREFIX};
use super::events::{self, ConsumeRequest, EventLinks, Subscribed};
use super::in_flight::InFlight;
use super::links::{LinkEntry, Links, Serves};
use super::outbound::DeliveryToken;
use super::outcome::{ingress_or_refuse, refused, rejected, settle_delivery};
use super::queues::QueueLinks;
use super::rpc::{self, ResponderRequest, Responding, Routed, RpcLinks};
use super::Bridge;
use crate::auth::policy::Action;
use crate::backend::Backend;
use crate::detail::{LinkLabel, LinkLabels};
use crate::driver::{Arrival, Handler, HandlerFactory};
use crate::engine::{AmqpError, Condition, Connection, Delivery, Event, LinkAccept, LinkId};
use crate::metrics::{self, Counted, Direction};
use crate::pattern::{Pattern, Target};

impl<B: Backend> HandlerFactory for Arc<Bridge<B>> {
    type Handler = ConnectionHandler<B>;

    fn new_handler(&self, _arrival: &Arrival) -> ConnectionHandler<B> {
        let metrics = self.metrics.clone();
        ConnectionHandler {
            bridge: self.clone(),
            ctx: Ctx {
                backend: self.backend.clone(),
                credential: None,
                caller: Caller::Connector,
                connection: self.next_connection.fetch_add(1, Ordering::Relaxed),
                client_id: String::new(),
                container_id: String::new(),
                metrics: metrics.clone(),
            },
            links: Links::new(metrics.clone()),
            calls: InFlight::default(),
            ended: tokio::sync::watch::channel(()).0,
            queues: QueueLinks::default(),
            events: EventLinks::default(),
            rpc: RpcLinks::new(metrics, self.rpc.clone()),
            dynamic: DynamicNodes::new(self.queues.max_unsettled as usize),
            counted_open: false,
            counted_sessions: 0,
        }
    }
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

/// A backend call of the connection's that finished.
enum Completion {
    /// One of the events bridge's.
    Events(events::Finished),
    /// One of the commands and queries bridge's.
    Rpc(rpc::Finished),
    /// A subscription that was opening, or a durable one being deleted, when the connection
    /// ended: given up.
    Abandoned,
}

/// An events bridge call, as the connection follows it.
async fn events_call(call: impl Future<Output = events::Finished>) -> Completion {
    Completion::Events(call.await)
}

/// A commands and queries bridge call, as the connection follows it.
async fn rpc_call(call: impl Future<Output = rpc::Finished>) -> Completion {
    Completion::Rpc(call.await)
}

/// One connection's side of the bridge.
pub struct ConnectionHandler<B: Backend> {
    bridge: Arc<Bridge<B>>,
    ctx: Ctx<B>,
    /// Every accepted link, with its own state.
    links: Links,
    /// The backend calls in flight of every link, and those that finished since the last turn.
    calls: InFlight<Completion>,
    /// Dropped with the handler: the calls that answer an attach are given up then.
    ended: tokio::sync::watch::Sender<()>,
    queues: QueueLinks,
    events: EventLinks,
    rpc: RpcLinks,
    dynamic: DynamicNodes,
    /// Whether this connection is counted as open (MET-1), and its sessions as counted (MET-2).
    counted_open: bool,
    counted_sessions: i64,
}

impl<B: Backend> Drop for ConnectionHandler<B> {
    fn drop(&mut self) {
        // What the producers received is still stored, what publishers and responders sent is
        // still sent, and requests still in flight run to their end (RPC-14, MET-11): their
        // outcomes find no link.
        let producers: Vec<_> = self
            .links
            .drain()
            .filter_map(|entry| match entry {
                LinkEntry::QueueProducer { producer, .. }
                | LinkEntry::AnonymousProducer(producer) => Some(producer),
                _ => None,
            })
            .collect();
        self.queues.finish(&self.ctx.backend, producers.into_iter());
        let metrics = self.ctx.metrics.clone();
        let run = self.calls.run_out(move |done| {
            if let Completion::Rpc(finished) = done {
                rpc::ran_out(finished, &metrics);
            }
        });
        self.rpc.ended(run);
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

/// The terminus a link attaches to, as the bridge reads it: the target of a link the client
/// sends on, the source of one it receives on.
#[derive(Debug, Default)]
struct Terminus {
    /// The node's address, if it names one.
    address: Option<String>,
    /// Its capabilities (a pattern hint among them).
    capabilities: Vec<String>,
    /// Whether the client asks for a node to be made (ADDR-11).
    dynamic: bool,
}

impl Terminus {
    /// The terminus of `a` that the bridge serves.
    fn of(a: &Attach, client_sends: bool) -> Terminus {
        fn names(caps: &Option<Array<Symbol>>) -> Vec<String> {
            caps.iter()
                .flat_map(|c| c.0.iter().map(|s| s.as_str().to_string()))
                .collect()
        }
        if client_sends {
            a.target
                .as_deref()
                .map(|TargetArchetype::Target(t)| Terminus {
                    address: t.address.clone(),
                    capabilities: names(&t.capabilities),
                    dynamic: t.dynamic,
                })
                .unwrap_or_default()
        } else {
            a.source
                .as_deref()
                .map(|s| Terminus {
                    address: s.address.clone(),
                    capabilities: names(&s.capabilities),
                    dynamic: s.dynamic,
                })
                .unwrap_or_default()
        }
    }
}

impl<B: Backend> ConnectionHandler<B> {
    /// Decides a link the client attached: accepted at once, started (a subscription answered
    /// once the backend confirmed it), or refused.
    fn attach(&mut self, conn: &mut Connection, link: LinkId, a: &Attach) -> Result<(), AmqpError> {
        let client_sends = a.role == Role::Sender;
        let Terminus {
            address,
            capabilities: caps,
            dynamic,
        } = Terminus::of(a, client_sends);
        if !client_sends && a.source.is_none() {
            // DUR-9: a receiver with no source names a durable subscription to delete.
            let identity = self
                .ctx
                .caller
                .durable_client_id(&events::durable::identity(&self.ctx.container_id, &a.name));
            let call = events::forget_durable(link, identity, &self.ctx, &self.bridge.events)?;
            self.answer_attach(events_call(call));
            return Ok(());
        }
        let Some(address) = address.filter(|a| !a.is_empty()) else {
            return self.attach_unnamed(conn, link, a, client_sends, dynamic);
        };
        if address.starts_with(DYNAMIC_PREFIX) {
            // ADDR-12 / OP-ADDR-7: a node a sender of this connection minted takes one receiver
            // of this connection; nothing else reaches a dynamic node but a message's `to`.
            if !client_sends && self.dynamic.awaits_consumer(&address) {
                if conn
                    .accept_link(link, LinkAccept { credit_window: 0 })
                    .is_err()
                {
                    return Ok(()); // detached while attaching
                }
                let presettled = a.snd_settle_mode == SenderSettleMode::Settled;
                self.dynamic.consume(link, &address, presettled);
                let entry = LinkEntry::DynamicSource(address.clone());
                self.links.insert(link, entry, Serves::Dynamic(&address));
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
        let (pattern, channel) = match resolved {
            Resolved::Node { pattern, channel } => (pattern, channel),
            // ADDR-10, AUTHZ-5: a reply token, not subject to authorization; only for senders.
            Resolved::Response { request_id } if client_sends => {
                if self.accept_sender(conn, link) {
                    let serves = Serves::Response(&request_id);
                    let entry = LinkEntry::ReplySender(request_id.clone());
                    self.links.insert(link, entry, serves);
                }
                return Ok(());
            }
            Resolved::Response { .. } => return Err(AmqpError::bare(Condition::NotAllowed)),
        };
        // AUTHZ-2: after the address resolved, before the link is accepted.
        self.bridge.access.check(
            &self.ctx.client_id,
            pattern,
            &channel,
            Action::of_link(client_sends),
        )?;
        match (pattern, client_sends) {
            (Pattern::Queues, true) => {
                if self.accept_sender(conn, link) {
                    let producer = QueueLinks::producer(link, &self.bridge.queues);
                    let serves = Serves::queue(&channel);
                    let entry = LinkEntry::QueueProducer {
                        channel: channel.clone(),
                        producer,
                    };
                    self.links.insert(link, entry, serves);
                }
            }
            (Pattern::Queues, false) => {
                let terminus = (a.source.as_deref(), &a.snd_settle_mode);
                if let Some(consumer) = self.queues.accept_consumer(
                    conn,
                    link,
                    terminus,
                    channel.clone(),
                    &self.ctx,
                    &self.bridge.queues,
                )? {
                    let serves = Serves::queue(&channel);
                    let entry = LinkEntry::QueueConsumer(consumer);
                    self.links.insert(link, entry, serves);
                }
            }
            (Pattern::Events | Pattern::EventsStore, true) => {
                if events::options::has_filter(a.source.as_deref()) {
                    // SEL-3, OP-EV-4: a filter selects what a receiver gets; a sender has none.
                    return Err(AmqpError::new(
                        Condition::NotAllowed,
                        "selectors apply only to receiving links",
                    ));
                }
                let target = Target {
                    pattern,
                    channel: channel.clone(),
                };
                if self.accept_sender(conn, link) {
                    let serves = Serves::node(pattern, &channel);
                    self.links
                        .insert(link, LinkEntry::EventPublisher(target), serves);
                }
            }
            (Pattern::Events | Pattern::EventsStore, false) => {
                let access = &self.bridge.access;
                let reader = (channel.contains(['*', '>']) && access.is_enforced()).then(|| {
                    events::WildcardReader {
                        access: access.clone(),
                        client_id: self.ctx.client_id.clone(),
                    }
                });
                let request = ConsumeRequest {
                    pattern,
                    channel: &channel,
                    attach: a,
                    reader,
                };
                let call = events::subscribe(link, request, &self.ctx, &self.bridge.events)?;
                self.answer_attach(events_call(call));
            }
            (Pattern::Commands | Pattern::Queries, true) => {
                let target = Target {
                    pattern,
                    channel: channel.clone(),
                };
                if self.accept_sender(conn, link) {
                    let serves = Serves::node(pattern, &channel);
                    self.links
                        .insert(link, LinkEntry::Requester(target), serves);
                }
            }
            (Pattern::Commands | Pattern::Queries, false) => {
                let request = ResponderRequest {
                    pattern,
                    channel: &channel,
                    attach: a,
                };
                let call = RpcLinks::subscribe(link, request, &self.ctx)?;
                self.answer_attach(rpc_call(call));
            }
        }
        Ok(())
    }

    /// A link whose terminus names no address: an anonymous sender (ADDR-13), or one that
    /// mints a dynamic node (ADDR-11, OP-ADDR-7).
    fn attach_unnamed(
        &mut self,
        conn: &mut Connection,
        link: LinkId,
        a: &Attach,
        client_sends: bool,
        dynamic: bool,
    ) -> Result<(), AmqpError> {
        if !dynamic {
            if client_sends {
                // ADDR-13: every message names its node in `to`.
                if self.accept_sender(conn, link) {
                    let producer = QueueLinks::producer(link, &self.bridge.queues);
                    let entry = LinkEntry::AnonymousProducer(producer);
                    self.links.insert(link, entry, Serves::Anonymous);
                }
                return Ok(());
            }
            // OP-ADDR-9.
            return Err(AddressError::EmptyAddress.to_amqp());
        }
        // ADDR-11: a receiver mints a private node it consumes. OP-ADDR-7: a sender mints one
        // too (a JMS temporary queue): what it sends goes to the node, a receiver of this
        // connection consumes it by its address, and it ends with this link.
        let address = self.mint_address();
        let credit_window = if client_sends {
            self.bridge.produce_credit_window
        } else {
            0
        };
        if conn
            .accept_dynamic(link, LinkAccept { credit_window }, address.clone())
            .is_err()
        {
            return Ok(()); // detached while attaching
        }
        let (consumer, entry) = if client_sends {
            (None, LinkEntry::DynamicTarget(address.clone()))
        } else {
            let presettled = a.snd_settle_mode == SenderSettleMode::Settled;
            (Some(presettled), LinkEntry::DynamicSource(address.clone()))
        };
        self.links.insert(link, entry, Serves::Dynamic(&address));
        self.dynamic.add(link, address, consumer, conn.budget());
        Ok(())
    }

    /// Accepts a link the client sends on, with the produce credit window; `false` when it is
    /// gone (detached while attaching).
    fn accept_sender(&self, conn: &mut Connection, link: LinkId) -> bool {
        let accept = LinkAccept {
            credit_window: self.bridge.produce_credit_window,
        };
        conn.accept_link(link, accept).is_ok()
    }

    /// A new dynamic node address (ADDR-11, OP-ADDR-8): `_amqp10.tmp.<connection>.<uuid>`.
    fn mint_address(&self) -> String {
        format!(
            "{DYNAMIC_PREFIX}{}.{}",
            self.ctx.connection,
            crate::kubemq::new_id()
        )
    }

    /// Follows a call whose answer answers a link's ATTACH, until the connection ends: then it
    /// is given up.
    fn answer_attach(&mut self, call: impl Future<Output = Completion> + Send + 'static) {
        let mut ended = self.ended.subscribe();
        self.calls.push(async move {
            tokio::select! {
                done = call => done,
                _ = ended.changed() => Completion::Abandoned,
            }
        });
    }

    /// A complete message on a link the client sends on.
    fn produce(&mut self, conn: &mut Connection, d: Delivery) {
        let routed = match self.links.get_mut(d.link) {
            Some(LinkEntry::QueueProducer { channel, producer }) => {
                let producing = (channel.as_str(), producer);
                return QueueLinks::produce(conn, &d, producing, &self.ctx);
            }
            Some(LinkEntry::AnonymousProducer(_)) => return self.produce_anonymous(conn, d),
            Some(LinkEntry::EventPublisher(target)) => {
                if let Some(call) = events::produce(conn, &d, target, &self.ctx) {
                    self.calls.push(events_call(call));
                }
                return;
            }
            Some(LinkEntry::Requester(target)) => Routed::Request(target.clone()),
            Some(LinkEntry::ReplySender(request_id)) => Routed::Response(request_id.clone()),
            Some(LinkEntry::DynamicTarget(address)) => {
                // A sender that minted a node (OP-ADDR-7) sends into it.
                let address = address.clone();
                return self.push_to_node(conn, &d, &address);
            }
            Some(
                LinkEntry::QueueConsumer(_)
                | LinkEntry::EventSubscriber(_)
                | LinkEntry::Responder(_)
                | LinkEntry::DynamicSource(_),
            )
            | None => return,
        };
        let call = self
            .rpc
            .produce(conn, &d, routed, &self.ctx, &mut self.dynamic);
        if let Some(call) = call {
            self.calls.push(rpc_call(call));
        }
    }

    /// A message of an anonymous link, routed by its `to` (ADDR-13 … ADDR-18).
    fn produce_anonymous(&mut self, conn: &mut Connection, d: Delivery) {
        let stored = ingress_or_refuse(conn, &self.ctx.metrics, &d);
        // MET-4: every complete inbound message, under the pattern its `to` names (queues when
        // it names none).
        let counted = stored
            .as_ref()
            .map_or(Counted::Pattern(Pattern::Queues), |s| {
                pattern_of(s.to.as_deref())
            });
        self.ctx.metrics.transfer(Direction::In, counted);
        let Some(stored) = stored else {
            return;
        };
        if let Some(to) = stored
            .to
            .as_deref()
            .filter(|t| t.starts_with(DYNAMIC_PREFIX))
        {
            // ADDR-12: only this connection's own dynamic nodes are reachable.
            let to = to.to_string();
            self.push_to_node(conn, &d, &to);
            return;
        }
        match self.route(stored.to.as_deref()) {
            // ADDR-18: one anonymous link reaches every pattern, message by message.
            Ok(Route::Queue(channel)) => match self.links.get_mut(d.link) {
                Some(LinkEntry::AnonymousProducer(p)) => p.store(&d, channel, stored, &self.ctx),
                _ => {
                    let gone = rejected(Condition::InternalError, "the link's sends are gone");
                    settle_delivery(conn, &self.ctx.metrics, &d, gone);
                }
            },
            Ok(Route::Events(target)) => {
                let call = events::send(&d, target, stored, &self.ctx);
                self.calls.push(events_call(call));
            }
            Ok(Route::Request(target)) => {
                let call = self
                    .rpc
                    .request(conn, &d, stored, target, &self.ctx, &mut self.dynamic);
                if let Some(call) = call {
                    self.calls.push(rpc_call(call));
                }
            }
            Ok(Route::Response(request_id)) => {
                let call = self.rpc.respond(conn, &d, &request_id, stored, &self.ctx);
                if let Some(call) = call {
                    self.calls.push(rpc_call(call));
                }
            }
            Err(e) => {
                // ADDR-14: the message is refused, the link stays; ADDR-17: a pre-settled one
                // is dropped (settle sends nothing for it).
                tracing::debug!(error = %e, "unroutable message on an anonymous link");
                settle_delivery(conn, &self.ctx.metrics, &d, refused(&e));
            }
        }
    }

    /// Puts the message of delivery `d` into this connection's dynamic node at `address`
    /// (ADDR-12, OP-ADDR-7), or refuses it.
    fn push_to_node(&mut self, conn: &mut Connection, d: &Delivery, address: &str) {
        let state = match self.dynamic.push(address, d.payload.clone()) {
            Ok(()) => DeliveryState::Accepted(Accepted {}),
            Err(e) => refused(&e),
        };
        settle_delivery(conn, &self.ctx.metrics, d, state);
        self.dynamic.pump(conn, address);
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
            .check(&self.ctx.client_id, pattern, &channel, Action::Write)?;
        let target = Target { pattern, channel };
        Ok(match pattern {
            Pattern::Queues => Route::Queue(target.channel),
            Pattern::Events | Pattern::EventsStore => Route::Events(target),
            Pattern::Commands | Pattern::Queries => Route::Request(target),
        })
    }

    /// New credit, or a drain, on a link the server sends on.
    fn credit(&mut self, conn: &mut Connection, link: LinkId, drain: bool) {
        match self.links.get_mut(link) {
            Some(LinkEntry::QueueConsumer(c)) => {
                let (connection, shared) = (self.ctx.connection, &self.bridge.queues);
                self.queues
                    .credit(conn, (link, &*c), drain, connection, shared)
            }
            Some(LinkEntry::EventSubscriber(s)) => {
                let (shared, metrics) = (&self.bridge.events, &self.ctx.metrics);
                self.events.credit(conn, (link, s), drain, shared, metrics)
            }
            Some(LinkEntry::Responder(r)) => self.rpc.credit(conn, (link, r), drain),
            Some(LinkEntry::DynamicSource(address)) => {
                let address = address.clone();
                self.dynamic.pump(conn, &address);
                if drain {
                    let _ = conn.drain_done(link);
                }
            }
            _ => {
                if drain {
                    let _ = conn.drain_done(link);
                }
            }
        }
    }

    /// An accepted link ended: its state goes with its entry, and the part that served it lets
    /// go of what it shared.
    fn link_closed(&mut self, link: LinkId, unsettled: &[DeliveryToken]) {
        let Some(entry) = self.links.remove(link) else {
            return;
        };
        match entry {
            LinkEntry::QueueProducer { producer, .. } | LinkEntry::AnonymousProducer(producer) => {
                self.queues.producer_closed(producer)
            }
            LinkEntry::QueueConsumer(consumer) => {
                self.queues
                    .consumer_closed((link, consumer), unsettled, self.ctx.connection)
            }
            // A subscription ends with its entry (EV-4, DUR-8 keeps a durable cursor).
            LinkEntry::EventPublisher(_)
            | LinkEntry::EventSubscriber(_)
            | LinkEntry::Requester(_)
            | LinkEntry::Responder(_)
            | LinkEntry::ReplySender(_) => {}
            LinkEntry::DynamicTarget(address) | LinkEntry::DynamicSource(address) => {
                self.dynamic.closed(link, &address, unsettled)
            }
        }
    }

    /// Applies a backend call that finished; a link it answers is kept.
    fn finished(&mut self, conn: &mut Connection, done: Completion) {
        match done {
            Completion::Events(finished) => {
                let metrics = &self.ctx.metrics;
                let Some(s) = self.events.finished(conn, finished, metrics) else {
                    return;
                };
                let Subscribed {
                    link,
                    pattern,
                    channel,
                    durable,
                    subscriber,
                } = s;
                let serves = Serves::Node {
                    pattern,
                    channel: &channel,
                    durable,
                };
                let entry = LinkEntry::EventSubscriber(subscriber);
                self.links.insert(link, entry, serves);
            }
            Completion::Rpc(finished) => {
                let opened = self.rpc.finished(conn, finished, &mut self.dynamic);
                let Some(Responding {
                    link,
                    pattern,
                    channel,
                    responder,
                }) = opened
                else {
                    return;
                };
                let serves = Serves::node(pattern, &channel);
                self.links
                    .insert(link, LinkEntry::Responder(responder), serves);
                if let Some(LinkEntry::Responder(r)) = self.links.get_mut(link) {
                    self.rpc.pump(conn, (link, r));
                }
            }
            Completion::Abandoned => {}
        }
    }

    /// Brings the session gauge, error counters and engine drops up to date (MET-2, MET-7, MET-8).
    fn sync_metrics(&mut self, conn: &mut Connection) {
        let m = &self.ctx.metrics;
        let sessions = conn.session_count() as i64;
        m.sessions.inc_by(sessions - self.counted_sessions);
        self.counted_sessions = sessions;
        let e = conn.take_error_counts();
        m.errors(metrics::Scope::conn, e.conn);
        m.errors(metrics::Scope::session, e.session);
        m.errors(metrics::Scope::link, e.link);
        m.transfers_in_dropped.inc_by(conn.take_dropped_in());
    }
}

impl<B: Backend> LinkLabels for ConnectionHandler<B> {
    fn link_label(&self, link: LinkId) -> Option<LinkLabel> {
        self.links.link_label(link)
    }
}

impl<B: Backend> Handler for ConnectionHandler<B> {
    fn on_event(&mut self, conn: &mut Connection, event: Event) {
        match event {
            // The driver writes the audit event and paces refusals.
            Event::Authenticated(_) | Event::OpenRefused { .. } => {}
            Event::Opened {
                client_id,
                credential,
                container_id,
                ..
            } => {
                self.ctx.caller = Caller::of(self.bridge.authenticated, &client_id);
                self.ctx.client_id = client_id;
                self.ctx.container_id = container_id;
                if let Some(c) = credential {
                    if let Some(b) = self.bridge.backend.with_credential(&c) {
                        self.ctx.backend = Arc::new(b);
                        self.ctx.credential = Some(c);
                    }
                }
                self.counted_open = true;
                self.ctx.metrics.connections.inc();
            }
            Event::AttachRequested { link, attach } => {
                if let Err(e) = self.attach(conn, link, &attach) {
                    let _ = conn.refuse_link(link, e);
                }
            }
            Event::Delivery(d) => self.produce(conn, d),
            Event::Credit { link, drain, .. } => self.credit(conn, link, drain),
            Event::WindowOpened => {
                // Every link the server sends on may have been held back by its session's
                // window or a full transport.
                self.queues.window_opened(&self.links);
                self.events
                    .pump_all(conn, &mut self.links, &self.ctx.metrics);
                self.rpc.pump_all(conn, &mut self.links);
                self.dynamic.pump_all(conn);
            }
            Event::Settled { link, token, state } => {
                let token = DeliveryToken::reported(token);
                match self.links.get_mut(link) {
                    Some(LinkEntry::QueueConsumer(_)) => {
                        self.queues.settled(link, token, state, &self.ctx.metrics)
                    }
                    Some(LinkEntry::DynamicSource(_)) => {
                        self.dynamic.settled(conn, token, state.as_ref())
                    }
                    // OP-RPC-8: a request delivery's settlement changes nothing; its response or its
                    // timeout ends it. Events go pre-settled.
                    _ => {}
                }
            }
            Event::LinkClosed {
                link, unsettled, ..
            } => {
                let unsettled: Vec<DeliveryToken> =
                    unsettled.into_iter().map(DeliveryToken::reported).collect();
                self.link_closed(link, &unsettled)
            }
            Event::Closed { .. } => {
                if std::mem::take(&mut self.counted_open) {
                    self.ctx.metrics.connections.dec();
                }
            }
        }
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let links = &mut self.links;
        let queues = self.queues.poll(cx, &self.ctx.backend, links).is_ready();
        let events = self.events.poll(cx, links).is_ready();
        let rpc = self.rpc.poll(cx, links).is_ready();
        let calls = self.calls.poll(cx);
        if queues || events || rpc || calls {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    fn on_ready(&mut self, conn: &mut Connection) {
        for done in self.calls.take() {
            self.finished(conn, done);
        }
        let (shared, metrics) = (&self.bridge.events, &self.ctx.metrics);
        self.events.work(conn, &mut self.links, shared, metrics);
        self.rpc.work(conn, &mut self.links);
        self.queues.work(conn, metrics, &mut self.links);
    }

    fn after_turn(&mut self, conn: &mut Connection) {
        let (connection, shared) = (self.ctx.connection, &self.bridge.queues);
        self.queues
            .flush_turn(conn, connection, shared, &mut self.links);
        self.rpc.after_turn(conn, &mut self.links);
        self.sync_metrics(conn);
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::time::Instant;

    use bytes::BytesMut;
    use fe2o3_amqp_types::messaging::{Accepted, DeliveryState};
    use fe2o3_amqp_types::performatives::Disposition;

    use fe2o3_amqp_types::definitions::Role;
    use tokio::sync::mpsc;

    use super::*;
    use crate::backend::embedded::Embedded;
    use crate::bridge::queues::fetcher::{
        Command, ConsumerKey, Handout, LoopKey, Taken, ToConsumer,
    };
    use crate::config::Settings;
    use crate::engine::{peer, AdmitAll, Transport, HEADER_AMQP};
    use crate::kubemq::QueueMessage;
    use crate::metrics::Metrics;
    use crate::store::Store;

    /// A handler on a fresh connection whose consume links on channel `q` talk to `commands`
    /// instead of a Get loop (the registry already holds that channel's command sender).
    struct Rig {
        conn: Connection,
        handler: ConnectionHandler<Embedded>,
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
            let bridge = Bridge::new(
                Embedded::new(store),
                &settings,
                metrics.clone(),
                crate::auth::Access::open(),
            );
            let (tx, commands) = mpsc::unbounded_channel();
            bridge
                .queues
                .fetchers
                .lock()
                .insert(LoopKey::shared("q"), tx);
            let handler = bridge.new_handler(&Arrival {
                peer: ([127, 0, 0, 1], 5672).into(),
                tls: false,
                connected_at: std::time::SystemTime::now(),
            });
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
                taken: Taken::now(0),
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
            assert_eq!(
                r.handler.queues.awaiting_leave(),
                1,
                "held until the loop confirms"
            );
            // A hand-out that crossed the Leave goes back; then the loop confirms.
            let late = Handout {
                consumer,
                transaction: Arc::from("t"),
                sequence: 1,
                message: QueueMessage::default(),
                taken: Taken::now(0),
            };
            to.send(ToConsumer::Messages(vec![late])).unwrap();
            to.send(ToConsumer::Left(consumer)).unwrap();
            r.ready_turn().await;
            assert_eq!(r.kinds().0, "T", "the late hand-out was given back");
            assert_eq!(
                r.handler.queues.awaiting_leave(),
                0,
                "round {round}: nothing kept"
            );
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
        assert!(
            !r.handler.links.has_queue_links(),
            "no produce lane or consumer kept"
        );
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
            proptest::prop_assert!(r.handler.links.is_empty(), "links kept");
            proptest::prop_assert!(!r.handler.links.has_queue_links(), "queue links kept");
            let gauge = r.metrics.link(metrics::Role::sender).get()
                + r.metrics.link(metrics::Role::receiver).get();
            proptest::prop_assert_eq!(gauge, 0, "links still counted");
        }
    }
}
