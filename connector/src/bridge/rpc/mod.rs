//! The commands and queries bridge (RPC-*): request/reply over AMQP links.
//!
//! A requester sends on `commands/<ch>` or `queries/<ch>` with `reply-to` set to a dynamic node
//! of its own connection; the request is settled `accepted` once routed and sent to KubeMQ, and
//! the response (or the failure) comes back later as a reply on that node ([`requester`]). A
//! responder consumes `commands/<ch>` or `queries/<ch>`: the link is a KubeMQ request
//! subscription, answered once the backend confirmed it; each request is delivered within credit
//! with a reply token, and a message sent to that token (`responses/<RequestID>`, through an
//! anonymous sender or a fixed target) becomes the KubeMQ response ([`responder`]). Every table
//! is bounded by `RpcMaxPending`: requests waiting for a response per connection, and tokens
//! waiting for an answer (the pump pauses at the bound). A request's bytes count against its
//! requester's memory budget until its response or timeout.

pub mod requester;
pub mod responder;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use fe2o3_amqp_types::definitions::SenderSettleMode;
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState};
use fe2o3_amqp_types::performatives::Attach;
use futures_util::future::Either;

use self::requester::Asked;
use self::responder::{Answer, NoRequest, Tokens};
use super::context::Ctx;
use super::dynamic::DynamicNodes;
use super::envelope::Stored;
use super::outbound::Outbound;
use super::outcome::{
    ingress_or_refuse, refused, rejected, settle_delivery, settling, subscribe_refusal,
    subscription_ended, Settling,
};
use crate::backend::{Backend, BackendError, RequestStream};
use crate::engine::{
    AmqpError, Charge, Condition, Connection, Delivery, FastMap, LinkAccept, LinkId,
};
use crate::kubemq::subscribe::SubscribeType;
use crate::kubemq::{Request, Response, Subscribe};
use crate::metrics::{Counted, Direction, Metrics};
use crate::pattern::{Pattern, Target};
use crate::spans::{self, Step};

/// Process-wide settings of the bridge.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Requests waiting for a response, and tokens waiting for an answer, per connection
    /// (`RpcMaxPending`, RPC-5, RPC-11).
    pub max_pending: usize,
    /// The timeout of a request without a ttl (`DefaultRpcTimeoutSeconds`, RPC-3).
    pub default_timeout: Duration,
}

/// A responder link's own state: its subscription and the requests taken from it.
pub(crate) struct Responder {
    pattern: Pattern,
    /// Its subscription, until it ends.
    stream: Option<RequestStream>,
    /// The client asked for pre-settled deliveries.
    presettled: bool,
    /// Taken from the subscription, not yet delivered (the link's credit shrank meanwhile, or
    /// the token table filled up).
    held: VecDeque<Request>,
    /// How many more requests may be taken from the subscription: what the link's credit and
    /// the token table's room allowed at the last [`RpcLinks::pump`], less what was taken since
    /// (so never more than `RpcMaxPending` held). A turn takes all of them at once.
    budget: usize,
}

/// A subscription the backend is opening, for a responder link not yet answered.
pub(crate) struct Opening {
    link: LinkId,
    pattern: Pattern,
    presettled: bool,
    channel: String,
    result: Result<RequestStream, BackendError>,
}

/// A request's outcome.
pub(crate) struct Answered {
    asked: Asked,
    result: Result<Response, BackendError>,
}

/// A backend call of this bridge that finished.
pub(crate) enum Finished {
    /// A responder's subscription opened, or was refused.
    Opened(Opening),
    /// A request was answered, failed or timed out.
    Answered(Box<Answered>),
    /// A response was sent, or refused: its delivery is settled.
    Responded(Settling),
}

/// A responder link the backend's answer lets the connection accept, with what it serves.
pub(crate) struct Responding {
    /// The link.
    pub link: LinkId,
    /// Commands or queries.
    pub pattern: Pattern,
    /// The channel.
    pub channel: String,
    /// The link's own state.
    pub responder: Responder,
}

/// Where a message of a link the client sends on goes.
pub(crate) enum Routed {
    /// A request to this node.
    Request(Target),
    /// The response to the request of this token.
    Response(String),
}

/// The connection's table of links, as the commands and queries bridge reads it.
pub(crate) trait ResponderTable {
    /// The responder link `link`, if it is one.
    fn responder(&mut self, link: LinkId) -> Option<&mut Responder>;
    /// Every responder link.
    fn responders(&mut self) -> impl Iterator<Item = (LinkId, &mut Responder)>;
}

/// What one connection's commands and queries links share: the requests waiting for their
/// response, the reply tokens waiting for an answer, and the numbering of deliveries.
pub struct RpcLinks {
    /// Responders that took requests this turn.
    fed: Vec<LinkId>,
    /// Requests waiting for their response.
    awaiting: usize,
    /// Each call's request bytes in the connection's budget, by [`Asked::call`]: kept here,
    /// not in the call, so that they are given back on the connection's task.
    call_charges: FastMap<u64, Charge>,
    next_call: u64,
    tokens: Tokens,
    /// Wakes the task when the next token expires (or earlier: it is not moved back).
    expiry: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The expiry timer fired: tokens are to be looked at.
    expiry_due: bool,
    /// The token table had been full and has room again: responders paused at the bound may
    /// go on (RPC-11).
    paused_may_go_on: bool,
    /// Subscriptions that failed this turn.
    failed: Vec<(LinkId, BackendError)>,
    /// Numbers the deliveries sent.
    outbound: Outbound,
    metrics: Arc<Metrics>,
    /// The bridge's settings.
    shared: Shared,
    /// What this connection adds to `Metrics::rpc_held`.
    counted_held: i64,
}

/// What a responder's attach asks for.
pub struct ResponderRequest<'a> {
    /// Commands or queries.
    pub pattern: Pattern,
    /// The channel.
    pub channel: &'a str,
    /// The client's ATTACH (its consumer group, GRP-1).
    pub attach: &'a Attach,
}

impl RpcLinks {
    /// No links yet.
    pub fn new(metrics: Arc<Metrics>, shared: Shared) -> Self {
        RpcLinks {
            fed: Vec::new(),
            awaiting: 0,
            call_charges: FastMap::default(),
            next_call: 0,
            tokens: Tokens::default(),
            expiry: None,
            expiry_due: false,
            paused_may_go_on: false,
            failed: Vec::new(),
            outbound: Outbound::default(),
            metrics,
            shared,
            counted_held: 0,
        }
    }

    /// Brings `Metrics::rpc_held` to `now` for this connection.
    fn held(&mut self, now: i64) {
        self.metrics
            .rpc_held
            .fetch_add(now - self.counted_held, Ordering::Relaxed);
        self.counted_held = now;
    }

    /// Counts what this connection holds now: requests waiting for their response and
    /// delivered requests waiting for an answer.
    fn count_held(&mut self) {
        self.held((self.awaiting + self.tokens.len()) as i64);
    }

    /// The connection ended (RPC-14, MET-11): the tokens go now, and the requests still in
    /// flight count until they end, if they `run` to their end ([`ran_out`] sees each).
    pub(crate) fn ended(&mut self, run: bool) {
        self.held(if run { self.awaiting as i64 } else { 0 });
    }

    /// A responder's subscription, to start; the link is answered when it is open (RPC-11).
    pub(crate) fn subscribe<B: Backend>(
        link: LinkId,
        req: ResponderRequest<'_>,
        ctx: &Ctx<B>,
    ) -> Result<impl Future<Output = Finished> + Send + 'static, AmqpError> {
        if super::events::options::has_filter(req.attach.source.as_deref()) {
            return Err(AmqpError::new(
                Condition::NotImplemented,
                "selector filter not supported on this address",
            ));
        }
        let group = super::events::options::group(req.attach.properties.as_ref())?;
        let subscribe_type = if req.pattern == Pattern::Commands {
            SubscribeType::Commands
        } else {
            SubscribeType::Queries
        };
        let request = Subscribe {
            subscribe_type_data: subscribe_type as i32,
            client_id: ctx.client_id.clone(),
            channel: req.channel.to_string(),
            group,
            ..Default::default()
        };
        let backend = ctx.backend.clone();
        let (pattern, channel) = (req.pattern, req.channel.to_string());
        let presettled = req.attach.snd_settle_mode == SenderSettleMode::Settled;
        Ok(async move {
            let result = backend.subscribe_requests(request).await;
            Finished::Opened(Opening {
                link,
                pattern,
                presettled,
                channel,
                result,
            })
        })
    }

    /// Handles a message on a requester's or a reply token's link: the backend call to start,
    /// if it goes on.
    pub(crate) fn produce<B: Backend>(
        &mut self,
        conn: &mut Connection,
        d: &Delivery,
        target: Routed,
        ctx: &Ctx<B>,
        dynamic: &mut DynamicNodes,
    ) -> Option<impl Future<Output = Finished> + Send + 'static> {
        // MET-4 (an anonymous link's messages are counted where they are routed).
        let counted = match &target {
            Routed::Request(t) => Counted::Pattern(t.pattern),
            Routed::Response(_) => Counted::Responses,
        };
        self.metrics.transfer(Direction::In, counted);
        let stored = ingress_or_refuse(conn, &self.metrics, d)?;
        match target {
            Routed::Request(target) => self
                .request(conn, d, stored, target, ctx, dynamic)
                .map(Either::Left),
            Routed::Response(id) => self.respond(conn, d, &id, stored, ctx).map(Either::Right),
        }
    }

    /// A request (RPC-2 … RPC-5): checked and settled `accepted`; the call that sends it, to
    /// start; its reply comes later.
    pub(crate) fn request<B: Backend>(
        &mut self,
        conn: &mut Connection,
        d: &Delivery,
        stored: Stored,
        target: Target,
        ctx: &Ctx<B>,
        dynamic: &mut DynamicNodes,
    ) -> Option<impl Future<Output = Finished> + Send + 'static> {
        let checked = self.check_request(&stored, dynamic).and_then(|reply_to| {
            // The request's bytes count against the connection's budget until its answer
            // or its timeout: wherever it waits (the backend, a responder that does not
            // read), what requesters make the connector hold stays within the budgets.
            let size = (stored.body.len() + stored.metadata.len()) as u64;
            match conn.budget().charge(size) {
                Ok(charge) => Ok((reply_to, charge)),
                Err(e) => {
                    dynamic.unreserve(&reply_to);
                    Err(e.to_error())
                }
            }
        });
        let (reply_to, charge) = match checked {
            Ok(r) => r,
            Err(e) => {
                settle_delivery(conn, &self.metrics, d, refused(&e));
                return None;
            }
        };
        // RPC-4: accepted once routed; the reply is independent of this outcome.
        let accepted = DeliveryState::Accepted(Accepted {});
        settle_delivery(conn, &self.metrics, d, accepted);
        // MET-6.
        self.metrics.rpc_request(target.pattern.name());
        let timeout = requester::timeout(stored.ttl, self.shared.default_timeout);
        let call = self.next_call;
        self.next_call += 1;
        self.call_charges.insert(call, charge);
        let asked = Asked {
            call,
            pattern: target.pattern,
            reply_to,
            correlation: stored.correlation.clone(),
        };
        self.metrics
            .channels
            .count(target.pattern, &target.channel, Direction::In);
        let traced = spans::traced(&stored.trace_tags, target.pattern, &target.channel);
        let request = requester::request(
            target.pattern,
            target.channel,
            &ctx.client_id,
            stored,
            timeout,
        );
        tracing::debug!(request_id = %request.request_id, pattern = %target.pattern, channel = %request.channel, ?timeout, "request sent");
        let backend = ctx.backend.clone();
        self.awaiting += 1;
        self.count_held();
        Some(async move {
            let from = traced.as_ref().map(|_| Instant::now());
            let result = backend.send_request(request).await;
            if let (Some(t), Some(from)) = (traced, from) {
                let error = result.as_ref().err().map(spans::failed);
                t.record(Step::Request, (from, Instant::now()), error.as_slice());
            }
            Finished::Answered(Box::new(Answered { asked, result }))
        })
    }

    /// RPC-2 and RPC-5; reserves the reply's room in its node.
    fn check_request(
        &self,
        stored: &Stored,
        dynamic: &mut DynamicNodes,
    ) -> Result<String, AmqpError> {
        let reply_to = stored
            .reply_to
            .as_deref()
            .filter(|r| !r.is_empty())
            .ok_or_else(|| AmqpError::new(Condition::NotAllowed, "request missing reply-to"))?;
        if !dynamic.owns(reply_to) {
            return Err(AmqpError::new(
                Condition::NotAllowed,
                "reply-to is not a node this connection owns",
            ));
        }
        if self.awaiting >= self.shared.max_pending {
            return Err(AmqpError::new(
                Condition::ResourceLimitExceeded,
                "rpc pending limit reached",
            ));
        }
        dynamic.reserve(reply_to)?;
        Ok(reply_to.to_string())
    }

    /// A reply to the request of token `request_id` (RPC-13, RPC-14): the call that sends it
    /// to KubeMQ, to start, which settles it `accepted` once KubeMQ took it; a token this
    /// connection does not hold is refused `amqp:not-found` (one that expired is also counted
    /// as late, MET-11).
    pub(crate) fn respond<B: Backend>(
        &mut self,
        conn: &mut Connection,
        d: &Delivery,
        request_id: &str,
        stored: Stored,
        ctx: &Ctx<B>,
    ) -> Option<impl Future<Output = Finished> + Send + 'static> {
        let answer = match self
            .tokens
            .answer(request_id, &ctx.client_id, stored, Instant::now())
        {
            Ok(a) => a,
            Err(why) => {
                if why == NoRequest::Expired {
                    self.metrics.rpc_late_responses.inc();
                }
                let state = rejected(
                    Condition::NotFound,
                    "no pending request for this reply token",
                );
                settle_delivery(conn, &self.metrics, d, state);
                return None;
            }
        };
        if self.tokens.len() + 1 == self.shared.max_pending {
            // The table was full: responders paused at the bound may go on.
            self.paused_may_go_on = true;
        }
        self.count_held();
        let backend = ctx.backend.clone();
        let Answer { response, traced } = answer;
        let sent = settling(d, async move {
            let from = traced.as_ref().map(|_| Instant::now());
            let sent = backend.send_response(response).await;
            if let (Some(t), Some(from)) = (traced, from) {
                let error = sent.as_ref().err().map(spans::failed);
                t.record(Step::Reply, (from, Instant::now()), error.as_slice());
            }
            sent
        });
        Some(async move { Finished::Responded(sent.await) })
    }

    /// New credit (or a drain) on a responder's link: delivers what it can.
    pub(crate) fn credit(
        &mut self,
        conn: &mut Connection,
        responder: (LinkId, &mut Responder),
        drain: bool,
    ) {
        let link = responder.0;
        self.pump(conn, responder);
        if drain {
            let _ = conn.drain_done(link);
        }
    }

    /// Delivers the requests `link` holds while it has credit, the token table room and the
    /// client takes what is sent, then sets how many more its subscription may give: as many as
    /// the link's credit and the table's room left take (none while requests are still held).
    pub(crate) fn pump(&mut self, conn: &mut Connection, (link, r): (LinkId, &mut Responder)) {
        let max_pending = self.shared.max_pending;
        // RPC-11: delivered within credit, paused while the token table is full, and while the
        // client does not take what was sent (its window shut, or its transport full).
        while conn.credit(link) > 0 && self.tokens.len() < max_pending && conn.has_room(link) {
            if !self.deliver(conn, (link, r)) {
                break;
            }
        }
        r.budget = if r.held.is_empty() && conn.has_room(link) {
            let room = max_pending.saturating_sub(self.tokens.len());
            (conn.credit(link) as usize).min(room)
        } else {
            0
        };
    }

    /// Delivers the first request `link` holds (RPC-12) and records its token; `false`, with
    /// the request still held, when there is none or the link cannot take it.
    fn deliver(&mut self, conn: &mut Connection, (link, r): (LinkId, &mut Responder)) -> bool {
        let Some(request) = r.held.front() else {
            return false;
        };
        let answerable = responder::answerable_for(request, self.shared.default_timeout);
        let traced = spans::traced(&request.tags, r.pattern, &request.channel);
        let from = traced.as_ref().map(|_| Instant::now());
        let message = responder::delivered(request);
        if self
            .outbound
            .send(conn, link, &message, r.presettled)
            .is_ok()
        {
            self.metrics
                .transfer(Direction::Out, Counted::Pattern(r.pattern));
            self.metrics
                .channels
                .count(r.pattern, &request.channel, Direction::Out);
            if let (Some(t), Some(from)) = (&traced, from) {
                t.record(Step::Deliver, (from, Instant::now()), &[]);
            }
            let expires = Instant::now() + answerable;
            if let Some(request) = r.held.pop_front() {
                // The reply's span joins the request's trace, read once here.
                self.tokens.insert(request, (r.pattern, traced), expires);
            }
            self.expire_by(expires);
            self.count_held();
            true
        } else {
            false
        }
    }

    /// Lets every responder go on as far as its credit and the token table allow.
    pub(crate) fn pump_all(&mut self, conn: &mut Connection, table: &mut impl ResponderTable) {
        for responder in table.responders() {
            self.pump(conn, responder);
        }
    }

    /// Makes sure the timer fires by `at` (a token expires then).
    fn expire_by(&mut self, at: Instant) {
        let deadline = tokio::time::Instant::from_std(at);
        match &mut self.expiry {
            Some(t) if t.deadline() <= deadline => {}
            _ => self.expiry = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    /// Collects what the subscriptions gave and whether a token expired; ready when there is
    /// work for [`RpcLinks::work`].
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        table: &mut impl ResponderTable,
    ) -> Poll<()> {
        self.take_requests(cx, table);
        if self
            .expiry
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
        {
            self.expiry = None;
            self.expiry_due = true;
        }
        if self.expiry_due || !self.fed.is_empty() || !self.failed.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Takes from each responder's subscription as many requests as its budget allows.
    fn take_requests(&mut self, cx: &mut Context<'_>, table: &mut impl ResponderTable) {
        for (link, r) in table.responders() {
            if r.budget == 0 {
                continue;
            }
            let Some(stream) = r.stream.as_mut() else {
                continue;
            };
            let took = r.held.len();
            while r.budget > 0 {
                match stream.as_mut().poll_next(cx) {
                    Poll::Ready(Some(Ok(request))) => {
                        r.budget -= 1;
                        r.held.push_back(request);
                    }
                    Poll::Ready(Some(Err(e))) => {
                        self.failed.push((link, e));
                        r.budget = 0;
                    }
                    Poll::Ready(None) => {
                        // A subscription that ended gives nothing more; it is not polled again.
                        r.stream = None;
                        r.budget = 0;
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            if r.held.len() > took {
                self.fed.push(link);
            }
        }
    }

    /// Applies a backend call that finished; a responder link it opened, for the connection to
    /// keep (and pump once kept).
    pub(crate) fn finished(
        &mut self,
        conn: &mut Connection,
        finished: Finished,
        dynamic: &mut DynamicNodes,
    ) -> Option<Responding> {
        match finished {
            Finished::Opened(o) => match o.result {
                Ok(stream) => {
                    // Gone if detached while the subscription opened.
                    conn.accept_link(o.link, LinkAccept { credit_window: 0 })
                        .ok()?;
                    return Some(Responding {
                        link: o.link,
                        pattern: o.pattern,
                        channel: o.channel,
                        responder: Responder {
                            pattern: o.pattern,
                            stream: Some(stream),
                            presettled: o.presettled,
                            held: VecDeque::new(),
                            budget: 0,
                        },
                    });
                }
                Err(e) => {
                    tracing::debug!(link = o.link, error = %e, "request subscription refused");
                    let _ = conn.refuse_link(o.link, subscribe_refusal(&e));
                }
            },
            Finished::Answered(a) => {
                self.awaiting = self.awaiting.saturating_sub(1);
                self.call_charges.remove(&a.asked.call);
                match requester::reply(&a.asked, &a.result) {
                    Some(reply) => {
                        if dynamic.put_reply(&a.asked.reply_to, reply.into()) {
                            self.metrics
                                .transfer(Direction::Out, Counted::Pattern(a.asked.pattern));
                            dynamic.pump(conn, &a.asked.reply_to);
                        } else {
                            // The requester's node is gone (RPC-14).
                            self.metrics.rpc_late_responses.inc();
                        }
                    }
                    None => dynamic.unreserve(&a.asked.reply_to),
                }
                self.count_held();
            }
            Finished::Responded(r) => r.settle(conn, &self.metrics),
        }
        None
    }

    /// Applies what [`RpcLinks::poll`] collected.
    pub(crate) fn work(&mut self, conn: &mut Connection, table: &mut impl ResponderTable) {
        let mut fed = std::mem::take(&mut self.fed);
        for link in fed.drain(..) {
            if let Some(r) = table.responder(link) {
                self.pump(conn, (link, r));
            }
        }
        self.fed = fed;
        for (link, e) in std::mem::take(&mut self.failed) {
            tracing::debug!(link, error = %e, "request subscription ended");
            let _ = conn.detach(link, Some(subscription_ended(&e)));
        }
        if std::mem::take(&mut self.expiry_due) {
            // Expired tokens make room: responders paused at the bound may go on.
            if let Some(next) = self.tokens.expire(Instant::now()) {
                self.expire_by(next);
            }
            self.paused_may_go_on = true;
        }
        self.after_turn(conn, table);
    }

    /// At the end of a turn: responders paused at a full token table go on if it has room
    /// again (RPC-11), and what this connection holds is counted.
    pub(crate) fn after_turn(&mut self, conn: &mut Connection, table: &mut impl ResponderTable) {
        if std::mem::take(&mut self.paused_may_go_on) {
            self.pump_all(conn, table);
        }
        self.count_held();
    }
}

/// What a request still in flight when its connection ended does when it ends: it no longer
/// counts as held, and a response that still came is late (RPC-14, MET-11).
pub(crate) fn ran_out(finished: Finished, metrics: &Metrics) {
    if let Finished::Answered(a) = finished {
        metrics.rpc_held.fetch_sub(1, Ordering::Relaxed);
        if a.result.is_ok() {
            metrics.rpc_late_responses.inc();
        }
    }
}
