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

use self::requester::Asked;
use self::responder::{NoRequest, Tokens};
use super::context::Ctx;
use super::dynamic::DynamicNodes;
use super::envelope::Stored;
use super::in_flight::InFlight;
use super::links::{LinkEntry, Links, Serves};
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

/// Process-wide settings of the bridge.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Requests waiting for a response, and tokens waiting for an answer, per connection
    /// (`RpcMaxPending`, RPC-5, RPC-11).
    pub max_pending: usize,
    /// The timeout of a request without a ttl (`DefaultRpcTimeoutSeconds`, RPC-3).
    pub default_timeout: Duration,
    /// Credit window of requester and response links.
    pub credit_window: u32,
}

/// A responder's link and the requests taken for it.
struct Responder {
    pattern: Pattern,
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
struct Opening {
    link: LinkId,
    pattern: Pattern,
    presettled: bool,
    channel: String,
    result: Result<RequestStream, BackendError>,
}

/// A request's outcome.
struct Answered {
    asked: Asked,
    result: Result<Response, BackendError>,
}

/// One connection's commands and queries links.
pub struct RpcLinks {
    /// Requesters' links, by the node each message is a request to.
    requesters: FastMap<LinkId, Target>,
    /// Links whose every message is a response to one request (a fixed `responses/<id>`
    /// target), by link.
    response_links: FastMap<LinkId, String>,
    responders: FastMap<LinkId, Responder>,
    /// Each responder's subscription, polled while its budget lasts.
    streams: FastMap<LinkId, RequestStream>,
    /// Responders that took requests this turn.
    fed: Vec<LinkId>,
    /// Responder subscriptions the backend is opening.
    opening: InFlight<Opening>,
    /// Requests waiting for their response.
    calls: InFlight<Answered>,
    /// Each call's request bytes in the connection's budget, by [`Asked::call`]: kept here,
    /// not in the call, so that they are given back on the connection's task.
    call_charges: FastMap<u64, Charge>,
    next_call: u64,
    /// Responses being sent, each settling its delivery.
    responses: InFlight<Settling>,
    tokens: Tokens,
    /// Wakes the task when the next token expires (or earlier: it is not moved back).
    expiry: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The expiry timer fired: tokens are to be looked at.
    expiry_due: bool,
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

impl Drop for RpcLinks {
    fn drop(&mut self) {
        // The connection ended with requests in flight: they run to their end, and a response
        // that still comes has no requester left (RPC-14, MET-11). The tokens go now; the
        // requests still count until they end.
        let in_flight = self.calls.len() as i64;
        let metrics = self.metrics.clone();
        let running = self.calls.run_out(move |a: Answered| {
            metrics.rpc_held.fetch_sub(1, Ordering::Relaxed);
            if a.result.is_ok() {
                metrics.rpc_late_responses.inc();
            }
        });
        self.held(if running { in_flight } else { 0 });
        // What responders answered is still sent to KubeMQ.
        self.responses.run_out(|_| {});
    }
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
            requesters: FastMap::default(),
            response_links: FastMap::default(),
            responders: FastMap::default(),
            streams: FastMap::default(),
            fed: Vec::new(),
            opening: InFlight::default(),
            calls: InFlight::default(),
            call_charges: FastMap::default(),
            next_call: 0,
            responses: InFlight::default(),
            tokens: Tokens::default(),
            expiry: None,
            expiry_due: false,
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
        self.held((self.calls.len() + self.tokens.len()) as i64);
    }

    /// Accepts a requester's link to `target`; `false` when it is gone (detached while
    /// attaching).
    pub(crate) fn attach_requester(
        &mut self,
        conn: &mut Connection,
        link: LinkId,
        target: Target,
    ) -> bool {
        if !self.accept_sender(conn, link) {
            return false;
        }
        self.requesters.insert(link, target);
        true
    }

    /// Accepts a link whose target is the reply token `request_id` (ADDR-10): each of its
    /// messages answers that request. `false` when it is gone (detached while attaching).
    pub(crate) fn attach_response_link(
        &mut self,
        conn: &mut Connection,
        link: LinkId,
        request_id: String,
    ) -> bool {
        if !self.accept_sender(conn, link) {
            return false;
        }
        self.response_links.insert(link, request_id);
        true
    }

    /// Accepts a link the client sends on, with the produce credit window; `false` when it is
    /// gone (detached while attaching).
    fn accept_sender(&self, conn: &mut Connection, link: LinkId) -> bool {
        let accept = LinkAccept {
            credit_window: self.shared.credit_window,
        };
        conn.accept_link(link, accept).is_ok()
    }

    /// Starts a responder's subscription; the link is answered when it is open (RPC-11).
    pub(crate) fn attach_responder<B: Backend>(
        &mut self,
        link: LinkId,
        req: ResponderRequest<'_>,
        ctx: &Ctx<B>,
    ) -> Result<(), AmqpError> {
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
        self.opening.push(async move {
            let result = backend.subscribe_requests(request).await;
            Opening {
                link,
                pattern,
                presettled,
                channel,
                result,
            }
        });
        Ok(())
    }

    /// Handles a message on a requester's or a reply token's link.
    pub(crate) fn produce<B: Backend>(
        &mut self,
        conn: &mut Connection,
        d: &Delivery,
        ctx: &Ctx<B>,
        dynamic: &mut DynamicNodes,
    ) {
        let target = if let Some(t) = self.requesters.get(&d.link) {
            Routed::Request(t.clone())
        } else if let Some(id) = self.response_links.get(&d.link) {
            Routed::Response(id.clone())
        } else {
            return;
        };
        // MET-4 (an anonymous link's messages are counted where they are routed).
        let counted = match &target {
            Routed::Request(t) => Counted::Pattern(t.pattern),
            Routed::Response(_) => Counted::Responses,
        };
        self.metrics.transfer(Direction::In, counted);
        let Some(stored) = ingress_or_refuse(conn, &self.metrics, d) else {
            return;
        };
        match target {
            Routed::Request(target) => self.request(conn, d, stored, target, ctx, dynamic),
            Routed::Response(id) => self.respond(conn, d, &id, stored, ctx),
        }
    }

    /// A request (RPC-2 … RPC-5): checked, settled `accepted` and sent; its reply comes later.
    pub(crate) fn request<B: Backend>(
        &mut self,
        conn: &mut Connection,
        d: &Delivery,
        stored: Stored,
        target: Target,
        ctx: &Ctx<B>,
        dynamic: &mut DynamicNodes,
    ) {
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
                return;
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
        let request = requester::request(
            target.pattern,
            target.channel,
            &ctx.client_id,
            stored,
            timeout,
        );
        tracing::debug!(request_id = %request.request_id, pattern = %target.pattern, channel = %request.channel, ?timeout, "request sent");
        let backend = ctx.backend.clone();
        self.calls.push(async move {
            let result = backend.send_request(request).await;
            Answered { asked, result }
        });
        self.count_held();
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
        if self.calls.len() >= self.shared.max_pending {
            return Err(AmqpError::new(
                Condition::ResourceLimitExceeded,
                "rpc pending limit reached",
            ));
        }
        dynamic.reserve(reply_to)?;
        Ok(reply_to.to_string())
    }

    /// A reply to the request of token `request_id` (RPC-13, RPC-14): sent to KubeMQ, settled
    /// `accepted` once KubeMQ took it; a token this connection does not hold is refused
    /// `amqp:not-found` (one that expired is also counted as late, MET-11).
    pub(crate) fn respond<B: Backend>(
        &mut self,
        conn: &mut Connection,
        d: &Delivery,
        request_id: &str,
        stored: Stored,
        ctx: &Ctx<B>,
    ) {
        let response = match self
            .tokens
            .answer(request_id, &ctx.client_id, stored, Instant::now())
        {
            Ok(r) => r,
            Err(why) => {
                if why == NoRequest::Expired {
                    self.metrics.rpc_late_responses.inc();
                }
                let state = rejected(
                    Condition::NotFound,
                    "no pending request for this reply token",
                );
                settle_delivery(conn, &self.metrics, d, state);
                return;
            }
        };
        if self.tokens.len() + 1 == self.shared.max_pending {
            // The table was full: responders paused at the bound may go on (RPC-11).
            self.pump_all(conn);
        }
        self.count_held();
        let backend = ctx.backend.clone();
        self.responses.push(settling(
            d,
            async move { backend.send_response(response).await },
        ));
    }

    /// New credit (or a drain) on a responder's link: delivers what it can.
    pub(crate) fn credit(&mut self, conn: &mut Connection, link: LinkId, drain: bool) {
        self.pump(conn, link);
        if drain {
            let _ = conn.drain_done(link);
        }
    }

    /// Delivers the requests `link` holds while it has credit, the token table room and the
    /// client takes what is sent, then sets how many more its subscription may give: as many as
    /// the link's credit and the table's room left take (none while requests are still held).
    fn pump(&mut self, conn: &mut Connection, link: LinkId) {
        let max_pending = self.shared.max_pending;
        let Some(r) = self.responders.get_mut(&link) else {
            return;
        };
        let (pattern, presettled) = (r.pattern, r.presettled);
        let mut held = std::mem::take(&mut r.held);
        // RPC-11: delivered within credit, paused while the token table is full, and while the
        // client does not take what was sent (its window shut, or its transport full).
        while conn.credit(link) > 0 && self.tokens.len() < max_pending && conn.has_room(link) {
            if !self.deliver(conn, link, (pattern, presettled), &mut held) {
                break;
            }
        }
        let budget = if held.is_empty() && conn.has_room(link) {
            let room = max_pending.saturating_sub(self.tokens.len());
            (conn.credit(link) as usize).min(room)
        } else {
            0
        };
        if let Some(r) = self.responders.get_mut(&link) {
            r.held = held;
            r.budget = budget;
        }
    }

    /// Delivers the first of `held` on a responder's link (RPC-12) and records its token;
    /// `false`, with the request still held, when there is none or the link cannot take it.
    fn deliver(
        &mut self,
        conn: &mut Connection,
        link: LinkId,
        (pattern, presettled): (Pattern, bool),
        held: &mut VecDeque<Request>,
    ) -> bool {
        let Some(request) = held.front() else {
            return false;
        };
        let answerable = responder::answerable_for(request, self.shared.default_timeout);
        let message = responder::delivered(request);
        if self.outbound.send(conn, link, &message, presettled).is_ok() {
            self.metrics
                .transfer(Direction::Out, Counted::Pattern(pattern));
            let expires = Instant::now() + answerable;
            if let Some(request) = held.pop_front() {
                self.tokens.insert(request, pattern, expires);
            }
            self.expire_by(expires);
            self.count_held();
            true
        } else {
            false
        }
    }

    /// Lets every responder go on as far as its credit and the token table allow.
    pub fn pump_all(&mut self, conn: &mut Connection) {
        let links: Vec<LinkId> = self.responders.keys().copied().collect();
        for link in links {
            self.pump(conn, link);
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

    /// An accepted link of this bridge's ended.
    pub(crate) fn closed(&mut self, link: LinkId) {
        self.requesters.remove(&link);
        self.response_links.remove(&link);
        if self.responders.remove(&link).is_some() {
            self.streams.remove(&link);
        }
    }

    /// Collects what the backend finished; ready when there is work for [`RpcLinks::work`].
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let opened = self.opening.poll(cx);
        let answered = self.calls.poll(cx);
        let responded = self.responses.poll(cx);
        self.take_requests(cx);
        if self
            .expiry
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
        {
            self.expiry = None;
            self.expiry_due = true;
        }
        if self.expiry_due
            || opened
            || answered
            || responded
            || !self.fed.is_empty()
            || !self.failed.is_empty()
        {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Takes from each responder's subscription as many requests as its budget allows.
    fn take_requests(&mut self, cx: &mut Context<'_>) {
        let mut ended = Vec::new();
        for (link, r) in self.responders.iter_mut() {
            if r.budget == 0 {
                continue;
            }
            let Some(stream) = self.streams.get_mut(link) else {
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
                        self.failed.push((*link, e));
                        r.budget = 0;
                    }
                    Poll::Ready(None) => {
                        ended.push(*link);
                        r.budget = 0;
                    }
                    Poll::Pending => break,
                }
            }
            if r.held.len() > took {
                self.fed.push(*link);
            }
        }
        // A subscription that ended gives nothing more; it is not polled again.
        for link in ended {
            self.streams.remove(&link);
        }
    }

    /// Applies what [`RpcLinks::poll`] collected.
    pub(crate) fn work(
        &mut self,
        conn: &mut Connection,
        links: &mut Links,
        dynamic: &mut DynamicNodes,
    ) {
        for o in self.opening.take() {
            match o.result {
                Ok(stream) => {
                    if conn
                        .accept_link(o.link, LinkAccept { credit_window: 0 })
                        .is_err()
                    {
                        continue; // detached while the subscription opened
                    }
                    let serves = Serves::node(o.pattern, &o.channel);
                    links.insert(o.link, LinkEntry::Responder, serves);
                    self.responders.insert(
                        o.link,
                        Responder {
                            pattern: o.pattern,
                            presettled: o.presettled,
                            held: VecDeque::new(),
                            budget: 0,
                        },
                    );
                    self.streams.insert(o.link, stream);
                    self.pump(conn, o.link);
                }
                Err(e) => {
                    tracing::debug!(link = o.link, error = %e, "request subscription refused");
                    let _ = conn.refuse_link(o.link, subscribe_refusal(&e));
                }
            }
        }
        for a in self.calls.take() {
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
        }
        for r in self.responses.take() {
            r.settle(conn, &self.metrics);
        }
        let mut fed = std::mem::take(&mut self.fed);
        for link in fed.drain(..) {
            self.pump(conn, link);
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
            self.pump_all(conn);
        }
        self.count_held();
    }
}

/// Where a message of one of this bridge's links goes.
enum Routed {
    Request(Target),
    Response(String),
}
