//! The events and events-store bridge: AMQP links on `events/<channel>` and
//! `events-store/<channel>` ⇄ KubeMQ event sends and subscriptions (EV-*, ES-*, GRP-*, SEL-*,
//! SP-*, DUR-*).
//!
//! Produce: each complete message becomes one event send carrying the `amqp10` envelope; an
//! unsettled delivery is `accepted` once the backend took it (EV-3, ES-2). Consume: the link is a
//! subscription, answered (the reply ATTACH) once the backend confirmed it, so that nothing
//! published after the attach completes is missed (OP-EV-1). Every delivery is pre-settled
//! (EV-5, ES-4). An event that finds its link without credit is dropped and counted (EV-6); an
//! events-store message waits in the link's buffer of MaxUnsettledPerLink until credit comes,
//! and a buffer that overflows at zero credit ends the link (ES-5 … ES-7). Selectors are
//! evaluated here, per message, before delivery (SEL-2).

pub mod durable;
pub mod options;

use std::collections::VecDeque;
use std::future::Future;
use std::task::{Context, Poll};

use fe2o3_amqp_types::performatives::Attach;

use self::durable::Claim;
use self::options::StartPosition;
use super::context::Ctx;
use super::envelope::{DeliveryInfo, Egress, Stored};
use super::outbound::Outbound;
use super::outcome::{
    ingress_or_refuse, settling, subscribe_refusal, subscription_ended, Settling,
};
use super::selector::{EnvelopeOperands, Selector};
use crate::auth::Access;
use crate::backend::{Backend, BackendError, EventStream};
use crate::engine::{AmqpError, Condition, Connection, Delivery, LinkAccept, LinkId};
use crate::kubemq::subscribe::SubscribeType;
use crate::kubemq::{Event, EventReceive, Subscribe};
use crate::metrics::{Counted, Direction, Metrics};
use crate::pattern::{Pattern, Target};
use crate::spans::{self, Step};

/// First and last pause before a durable subscription asks again for a ClientID its previous
/// link still held (about 1.3 s in all).
const RESUME_FIRST_WAIT: std::time::Duration = std::time::Duration::from_millis(10);
const RESUME_LAST_WAIT: std::time::Duration = std::time::Duration::from_millis(640);

/// Whether the backend refused a subscription because its ClientID is subscribed already.
fn in_use<T>(r: &Result<T, BackendError>) -> bool {
    matches!(r, Err(BackendError::ClientIdInUse(_)))
}

/// Most arrivals handled per turn, so one busy subscription cannot hold the connection's task.
const ARRIVALS_PER_TURN: usize = 1024;

/// Process-wide part of the bridge.
#[derive(Debug)]
pub struct Shared {
    /// Durable identities attached in this process (DUR-6).
    pub durable: durable::Registry,
    /// Capacity of an events-store link's buffer: MaxUnsettledPerLink (ES-5).
    pub buffer: usize,
}

/// The identity a wildcard subscription reads as, each event checked against its own channel
/// (AUTHZ-7).
pub struct WildcardReader {
    /// The policy.
    pub access: Access,
    /// The connection's ClientID.
    pub client_id: String,
}

/// A consume link's own state.
pub(crate) struct Subscriber {
    pattern: Pattern,
    /// Its subscription, until it ends (none for a link that deleted a durable one, DUR-9).
    stream: Option<EventStream>,
    selector: Option<Selector>,
    /// Set for a wildcard subscription under a policy.
    reader: Option<WildcardReader>,
    /// Events-store messages waiting for credit, oldest first (ES-5, ES-6).
    buffer: VecDeque<EventReceive>,
    /// The durable identity this link holds while it lives, if durable (DUR-6).
    claim: Option<Claim>,
}

/// A subscription the backend is opening, for a link not yet answered.
pub(crate) struct Opening {
    link: LinkId,
    /// The channel subscribed to (wildcards allowed on events).
    channel: String,
    subscriber: Subscriber,
    result: Result<EventStream, BackendError>,
}

/// A cursor deletion the backend finished (DUR-9).
pub(crate) struct Forgotten {
    link: LinkId,
    result: Result<bool, BackendError>,
}

/// A backend call of this bridge that finished.
pub(crate) enum Finished {
    /// A subscription opened, or was refused.
    Opened(Box<Opening>),
    /// An event was sent, or refused: its delivery is settled.
    Sent(Settling),
    /// A durable subscription was deleted, or not.
    Forgotten(Forgotten),
}

/// A consume link the backend's answer lets the connection accept, with what it serves.
pub(crate) struct Subscribed {
    /// The link.
    pub link: LinkId,
    /// Its pattern.
    pub pattern: Pattern,
    /// The channel it reads (empty for a link that deleted a durable subscription).
    pub channel: String,
    /// Whether it is a durable subscription (DUR-1).
    pub durable: bool,
    /// The link's own state.
    pub subscriber: Subscriber,
}

/// The connection's table of links, as the events bridge reads it.
pub(crate) trait SubscriberTable {
    /// The consume link `link`, if it is one.
    fn subscriber(&mut self, link: LinkId) -> Option<&mut Subscriber>;
    /// Every consume link.
    fn subscribers(&mut self) -> impl Iterator<Item = (LinkId, &mut Subscriber)>;
}

/// What one connection's events links share: what their subscriptions delivered, not yet
/// applied, and the encoding and numbering of their deliveries.
#[derive(Default)]
pub struct EventLinks {
    arrived: Vec<(LinkId, Result<EventReceive, BackendError>)>,
    egress: Egress,
    /// Numbers the deliveries sent.
    outbound: Outbound,
}

/// What a consume attach asks for, read before anything is opened.
pub struct ConsumeRequest<'a> {
    /// The events or events-store pattern.
    pub pattern: Pattern,
    /// The channel (wildcards allowed for events).
    pub channel: &'a str,
    /// The client's ATTACH.
    pub attach: &'a Attach,
    /// For a wildcard subscription under a policy: who reads (AUTHZ-7).
    pub reader: Option<WildcardReader>,
}

/// The subscription of a consume link, to start; the link is answered when it is open.
pub(crate) fn subscribe<B: Backend>(
    link: LinkId,
    req: ConsumeRequest<'_>,
    ctx: &Ctx<B>,
    shared: &Shared,
) -> Result<impl Future<Output = Finished> + Send + 'static, AmqpError> {
    let attach = req.attach;
    let source = attach.source.as_deref();
    let props = attach.properties.as_ref();
    let group = options::group(props)?;
    let selector = options::selector(source)?;
    let store = req.pattern == Pattern::EventsStore;
    // SP-6, EV-11: the start position means something only on events-store.
    let start = if store {
        options::start(props)?
    } else {
        StartPosition::NEW_ONLY
    };
    let (client_id, claim) = if store && options::durable(source) {
        let identity = ctx
            .caller
            .durable_client_id(&durable::identity(&ctx.container_id, &attach.name));
        let claim = shared
            .durable
            .claim(&identity)
            .ok_or_else(|| AmqpError::new(Condition::NotAllowed, "durable subscription in use"))?;
        (identity, Some(claim))
    } else {
        // OP-EV-6: a non-durable events-store subscription must start where it asks, so it
        // never takes a ClientID whose cursor KubeMQ would resume.
        (ctx.caller.subscription_client_id(store), None)
    };
    let request = Subscribe {
        subscribe_type_data: if store {
            SubscribeType::EventsStore as i32
        } else {
            SubscribeType::Events as i32
        },
        client_id,
        channel: req.channel.to_string(),
        group,
        events_store_type_data: if store { start.kind as i32 } else { 0 },
        events_store_type_value: if store { start.value } else { 0 },
    };
    let subscriber = Subscriber {
        pattern: req.pattern,
        stream: None,
        selector,
        reader: req.reader,
        buffer: VecDeque::new(),
        claim,
    };
    let backend = ctx.backend.clone();
    let durable = subscriber.claim.is_some();
    let channel = request.channel.clone();
    Ok(async move {
        let mut result = backend.subscribe_events(request.clone()).await;
        // A durable subscription re-attached right after its last link ended: the backend
        // lets go of the ClientID once that subscription's reader has stopped and saved its
        // cursor, a moment later (KubeMQ likewise). This process holds the identity, so the
        // holder is that ending subscription: wait for it, briefly.
        let mut wait = RESUME_FIRST_WAIT;
        while durable && in_use(&result) && wait <= RESUME_LAST_WAIT {
            tokio::time::sleep(wait).await;
            wait *= 2;
            result = backend.subscribe_events(request.clone()).await;
        }
        Finished::Opened(Box::new(Opening {
            link,
            channel,
            subscriber,
            result,
        }))
    })
}

/// The deletion of the durable subscription a null-source receiver names (DUR-9), to start;
/// the link is answered once the backend has done it.
pub(crate) fn forget_durable<B: Backend>(
    link: LinkId,
    identity: String,
    ctx: &Ctx<B>,
    shared: &Shared,
) -> Result<impl Future<Output = Finished> + Send + 'static, AmqpError> {
    if shared.durable.in_use(&identity) {
        return Err(AmqpError::new(
            Condition::NotAllowed,
            "durable subscription in use",
        ));
    }
    let backend = ctx.backend.clone();
    Ok(async move {
        let result = backend.forget_cursor(&identity).await;
        Finished::Forgotten(Forgotten { link, result })
    })
}

/// The send of a complete message of a produce link to `target`, to start; none when the
/// message is refused.
pub(crate) fn produce<B: Backend>(
    conn: &mut Connection,
    d: &Delivery,
    target: &Target,
    ctx: &Ctx<B>,
) -> Option<impl Future<Output = Finished> + Send + 'static> {
    ctx.metrics
        .transfer(Direction::In, Counted::Pattern(target.pattern));
    let stored = ingress_or_refuse(conn, &ctx.metrics, d)?;
    Some(send(d, target.clone(), stored, ctx))
}

/// The send of the event of delivery `d`, from a produce link or routed here by an anonymous
/// link's `to` (ADDR-13, ADDR-18), to start; the delivery is settled with the send's outcome.
pub(crate) fn send<B: Backend>(
    d: &Delivery,
    target: Target,
    stored: Stored,
    ctx: &Ctx<B>,
) -> impl Future<Output = Finished> + Send + 'static {
    ctx.metrics
        .channels
        .count(target.pattern, &target.channel, Direction::In);
    let traced = spans::traced(&stored.trace_tags, target.pattern, &target.channel);
    let event = Event {
        event_id: String::new(),
        client_id: if ctx.client_id.is_empty() {
            "amqp10".to_string()
        } else {
            ctx.client_id.clone()
        },
        channel: target.channel,
        metadata: stored.metadata,
        body: stored.body,
        store: target.pattern == Pattern::EventsStore,
        tags: stored.trace_tags,
    };
    let backend = ctx.backend.clone();
    let sent = settling(d, async move {
        let from = traced.as_ref().map(|_| std::time::Instant::now());
        let sent = backend.send_event(event).await;
        if let (Some(t), Some(from)) = (traced, from) {
            let error = sent.as_ref().err().map(spans::failed);
            t.record(
                Step::Publish,
                (from, std::time::Instant::now()),
                error.as_slice(),
            );
        }
        sent
    });
    async move { Finished::Sent(sent.await) }
}

impl EventLinks {
    /// New credit (or a drain) on a consume link.
    pub(crate) fn credit(
        &mut self,
        conn: &mut Connection,
        (link, s): (LinkId, &mut Subscriber),
        drain: bool,
        shared: &Shared,
        metrics: &Metrics,
    ) {
        if drain {
            self.take_arrived(conn, (link, s), shared, metrics);
        }
        self.pump(conn, (link, s), metrics);
        if drain {
            // FLOW-5, EV-12, ES-9: what is here went out; nothing is waited for.
            let _ = conn.drain_done(link);
        }
    }

    /// Takes what `link`'s subscription already received, without waiting: a drain completes
    /// with the events the backend had handed over, even when the client's FLOW was read before
    /// the task looked at the subscription.
    fn take_arrived(
        &mut self,
        conn: &mut Connection,
        (link, s): (LinkId, &mut Subscriber),
        shared: &Shared,
        metrics: &Metrics,
    ) {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        for _ in 0..shared.buffer {
            let Some(stream) = s.stream.as_mut() else {
                return;
            };
            match stream.as_mut().poll_next(&mut cx) {
                Poll::Ready(Some(Ok(event))) => {
                    self.arrive(conn, (link, s), event, shared, metrics)
                }
                // An end or an error is left for the task's next look, which handles it.
                _ => return,
            }
        }
    }

    /// Collects what the subscriptions delivered, a round at a time over every link so that
    /// none waits behind a busy one; Ready when there is some to apply.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        table: &mut impl SubscriberTable,
    ) -> Poll<()> {
        let mut more = true;
        while more && self.arrived.len() < ARRIVALS_PER_TURN {
            more = false;
            for (link, s) in table.subscribers() {
                let Some(stream) = s.stream.as_mut() else {
                    continue;
                };
                match stream.as_mut().poll_next(cx) {
                    Poll::Ready(Some(item)) => {
                        self.arrived.push((link, item));
                        more = true;
                    }
                    // The subscription ended: it is not polled again; the link stays until
                    // the client detaches it.
                    Poll::Ready(None) => s.stream = None,
                    Poll::Pending => {}
                }
            }
        }
        if self.arrived.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// Applies a backend call that finished; a consume link it opened, for the connection to
    /// keep.
    pub(crate) fn finished(
        &mut self,
        conn: &mut Connection,
        finished: Finished,
        metrics: &Metrics,
    ) -> Option<Subscribed> {
        match finished {
            Finished::Sent(s) => {
                s.settle(conn, metrics);
                None
            }
            Finished::Opened(o) => match o.result {
                Ok(stream) => {
                    // Detached while the subscription opened: it ends here.
                    conn.accept_link(o.link, LinkAccept { credit_window: 0 })
                        .ok()?;
                    tracing::debug!(link = o.link, "subscription open");
                    let mut subscriber = o.subscriber;
                    subscriber.stream = Some(stream);
                    Some(Subscribed {
                        link: o.link,
                        pattern: subscriber.pattern,
                        channel: o.channel,
                        durable: subscriber.claim.is_some(),
                        subscriber,
                    })
                }
                Err(e) => {
                    tracing::debug!(link = o.link, error = %e, "subscription refused");
                    let _ = conn.refuse_link(o.link, subscribe_failure(&e));
                    None
                }
            },
            Finished::Forgotten(f) => match f.result {
                Ok(existed) => {
                    // DUR-9: done; the link stays until the client detaches it. The reply names
                    // a source when a subscription was removed (JMS reads "none" as "there was
                    // no such subscription"), OP-ES-6.
                    let source = existed.then(|| {
                        fe2o3_amqp_types::messaging::Source::builder()
                            .expiry_policy(fe2o3_amqp_types::messaging::TerminusExpiryPolicy::Never)
                            .build()
                    });
                    conn.accept_with_source(f.link, LinkAccept { credit_window: 0 }, source)
                        .ok()?;
                    // It names a durable subscription, on no channel.
                    Some(Subscribed {
                        link: f.link,
                        pattern: Pattern::EventsStore,
                        channel: String::new(),
                        durable: true,
                        subscriber: Subscriber {
                            pattern: Pattern::EventsStore,
                            stream: None,
                            selector: None,
                            reader: None,
                            buffer: VecDeque::new(),
                            claim: None,
                        },
                    })
                }
                Err(e) => {
                    let _ = conn.refuse_link(
                        f.link,
                        AmqpError::new(Condition::NotImplemented, e.to_string()),
                    );
                    None
                }
            },
        }
    }

    /// Applies what [`EventLinks::poll`] collected.
    pub(crate) fn work(
        &mut self,
        conn: &mut Connection,
        table: &mut impl SubscriberTable,
        shared: &Shared,
        metrics: &Metrics,
    ) {
        for (link, item) in std::mem::take(&mut self.arrived) {
            // Gone if the client detached meanwhile.
            let Some(s) = table.subscriber(link) else {
                continue;
            };
            match item {
                Ok(event) => self.arrive(conn, (link, s), event, shared, metrics),
                Err(e) => {
                    end(s);
                    let _ = conn.detach(link, Some(subscription_ended(&e)));
                }
            }
        }
    }

    /// One event from a link's subscription.
    fn arrive(
        &mut self,
        conn: &mut Connection,
        (link, s): (LinkId, &mut Subscriber),
        event: EventReceive,
        shared: &Shared,
        metrics: &Metrics,
    ) {
        tracing::trace!(
            link,
            sequence = event.sequence,
            credit = conn.credit(link),
            "event"
        );
        if let Some(r) = &s.reader {
            // AUTHZ-7: a channel the identity may not read is withheld, like a selector's.
            if !r.access.may_read(&r.client_id, s.pattern, &event.channel) {
                tracing::debug!(link, channel = %event.channel, "event withheld: not authorized for its channel");
                return;
            }
        }
        if let Some(selector) = &s.selector {
            // SEL-7, EV-10: withheld silently, not a drop.
            if !selector.matches(&EnvelopeOperands::new(&event.metadata)) {
                return;
            }
        }
        match s.pattern {
            Pattern::EventsStore => {
                if s.buffer.len() >= shared.buffer.max(1)
                    && (conn.credit(link) == 0 || !conn.has_room(link))
                {
                    // ES-7: the buffer and the newcomer are discarded and the link ends.
                    let dropped = s.buffer.len() as u64 + 1;
                    metrics.events_store_dropped_stalled.inc_by(dropped);
                    tracing::warn!(link, dropped, "events-store consumer stalled; detaching");
                    end(s);
                    let _ = conn.detach(
                        link,
                        Some(AmqpError::new(
                            Condition::ResourceLimitExceeded,
                            "credit stalled",
                        )),
                    );
                    return;
                }
                s.buffer.push_back(event);
                self.pump(conn, (link, s), metrics);
            }
            _ => {
                if conn.credit(link) == 0 || !conn.has_room(link) {
                    // EV-6, GRP-4: dropped and counted, never kept for later credit (nor for a
                    // client that does not take what was sent).
                    metrics.events_dropped_no_credit.inc();
                    return;
                }
                self.deliver(conn, link, Pattern::Events, &event, metrics);
            }
        }
    }

    /// Sends what an events-store link's buffer holds, within credit (ES-6), while the client
    /// takes what is sent.
    fn pump(
        &mut self,
        conn: &mut Connection,
        (link, s): (LinkId, &mut Subscriber),
        metrics: &Metrics,
    ) {
        while conn.credit(link) > 0 && conn.has_room(link) {
            let Some(event) = s.buffer.pop_front() else {
                return;
            };
            if !self.deliver(conn, link, Pattern::EventsStore, &event, metrics) {
                s.buffer.push_front(event);
                return;
            }
        }
    }

    /// One pre-settled delivery (EV-5, EV-7, ES-4); false if the engine took none.
    fn deliver(
        &mut self,
        conn: &mut Connection,
        link: LinkId,
        pattern: Pattern,
        event: &EventReceive,
        metrics: &Metrics,
    ) -> bool {
        let traced = spans::traced(&event.tags, pattern, &event.channel);
        let from = traced.as_ref().map(|_| std::time::Instant::now());
        let payload = self.egress.message(
            &event.metadata,
            &event.body,
            &event.tags,
            DeliveryInfo { receive_count: 1 },
        );
        if self.outbound.send(conn, link, &payload, true).is_ok() {
            metrics.transfer(Direction::Out, Counted::Pattern(pattern));
            metrics
                .channels
                .count(pattern, &event.channel, Direction::Out);
            if let (Some(t), Some(from)) = (traced, from) {
                t.record(Step::Deliver, (from, std::time::Instant::now()), &[]);
            }
            true
        } else {
            false
        }
    }

    /// Sends what every events-store link's buffer holds, as far as each can take (the client
    /// takes more again).
    pub(crate) fn pump_all(
        &mut self,
        conn: &mut Connection,
        table: &mut impl SubscriberTable,
        metrics: &Metrics,
    ) {
        for (link, s) in table.subscribers() {
            if !s.buffer.is_empty() {
                self.pump(conn, (link, s), metrics);
            }
        }
    }
}

/// A link that ends on the server's side: its subscription and what it buffered go.
fn end(s: &mut Subscriber) {
    s.stream = None;
    s.buffer.clear();
}

/// The refusal of a consume link whose subscription did not open.
fn subscribe_failure(e: &BackendError) -> AmqpError {
    match e {
        // A ClientID another node holds: the durable subscription is in use there (DUR-7).
        BackendError::ClientIdInUse(_) => {
            AmqpError::new(Condition::NotAllowed, "durable subscription in use")
        }
        e => subscribe_refusal(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::outcome::send_failure;
    use fe2o3_amqp_types::messaging::DeliveryState;

    /// DUR-7: a ClientID another node holds (KubeMQ's own uniqueness) is the same refusal as
    /// a second attach here; ERR-9: send failures map to their conditions.
    #[test]
    fn dur_7_broker_side_uniqueness() {
        let e = subscribe_failure(&BackendError::refusal(
            "stan: clientID already registered".into(),
        ));
        assert_eq!(e.condition, Condition::NotAllowed);
        assert_eq!(
            e.description.as_deref(),
            Some("durable subscription in use")
        );
        let condition = |e: BackendError| match send_failure(&e) {
            DeliveryState::Rejected(r) => r.error.map(|e| e.condition),
            _ => None,
        };
        let wire = |c: Condition| Some(AmqpError::bare(c).to_wire().condition);
        assert_eq!(
            condition(BackendError::refusal("Error 110: invalid message".into())),
            wire(Condition::InvalidField)
        );
        assert_eq!(
            condition(BackendError::Unavailable("down".into())),
            wire(Condition::NotAllowed)
        );
    }
}
