//! The queues bridge: AMQP links on `queues/<channel>` ⇄ the KubeMQ backend (Q-*).
//!
//! Produce: each complete message becomes one backend send carrying the `amqp10` envelope; the
//! delivery is settled `accepted` only when the backend confirmed storage. Consume: a
//! link registers with its channel's shared [`fetcher`] and reports its demand; handed-out messages
//! are sent within credit, settlements go back as Ack/NAck (Q-11 … Q-30), and a link that ends
//! NAcks what it still holds, once.

pub mod fetcher;
mod get_loop;
mod refill_wait;
mod sender;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use fe2o3_amqp_types::definitions::SenderSettleMode;
use fe2o3_amqp_types::messaging::{DeliveryState, DistributionMode, Source};
use opentelemetry::KeyValue;
use tokio::sync::mpsc;

use self::fetcher::{
    Command, DemandReport, FetchLimits, Handout, LoopKey, Outcome, Settlement, ToConsumer,
};
use self::sender::{Done, Lane, ToStore};
use super::context::Ctx;
use super::envelope::{DeliveryInfo, Egress, Stored};
use super::outbound::{DeliveryToken, Outbound};
use super::outcome::{ingress_or_refuse, settle_inbound};
use crate::backend::Backend;
use crate::engine::{
    AmqpError, Condition, Connection, Delivery, DeliveryOutcome, FastMap, LinkAccept, LinkId,
};
use crate::kubemq::QueueMessage;
use crate::metrics::{self, Counted, Direction, Metrics};
use crate::pattern::Pattern;
use crate::spans::{self, Step, Traced};
use crate::stages::Stage;

/// The process-wide part of the queues bridge: its limits and one Get loop per channel.
pub struct Shared {
    /// Unsettled deliveries a consume link may hold (MaxUnsettledPerLink, Q-12).
    pub max_unsettled: u32,
    /// Batch limits of the Get loops.
    pub limits: FetchLimits,
    /// Every running Get loop.
    pub fetchers: fetcher::Registry,
    /// The backend lane of the next produce link.
    pub next_lane: AtomicU64,
}

/// A produce link's own state: its lane, through which its messages are stored in order
/// (`sender::Lane`).
pub(crate) struct Producer {
    lane: Lane,
}

impl Producer {
    /// Stores the message of delivery `d` in `channel`, after those the link sent before; the
    /// delivery is settled with the outcome the backend reports.
    pub(crate) fn store<B>(&mut self, d: &Delivery, channel: String, stored: Stored, ctx: &Ctx<B>) {
        ctx.metrics
            .channels
            .count(Pattern::Queues, &channel, Direction::In);
        let traced = spans::traced(&stored.trace_tags, Pattern::Queues, &channel);
        let message = QueueMessage {
            client_id: ctx.client_id.to_string(),
            channel,
            metadata: stored.metadata,
            body: stored.body,
            tags: stored.trace_tags,
            ..Default::default()
        };
        self.lane.push(ToStore {
            delivery_id: d.delivery_id,
            presettled: d.settled,
            received: tokio::time::Instant::now(),
            message,
            traced,
        });
    }
}

/// A consume link's own state.
pub(crate) struct QueueConsumer {
    fetcher: mpsc::UnboundedSender<Command>,
    presettled: bool,
    /// Hand-outs for this link taken from the channel so far (delivered or returned): with it
    /// the fetcher tells its hand-outs still on their way from credit already spent.
    taken: u64,
}

/// A consume delivery sent unsettled: which message of which transaction it carries, and when
/// it was sent.
#[derive(Debug)]
struct Unsettled {
    transaction: Arc<str>,
    sequence: u64,
    sent: std::time::Instant,
    /// Its trace, when its spans are recorded.
    traced: Option<Box<Traced>>,
}

impl Unsettled {
    /// The settlement the fetcher gets when the client settles it with `outcome` (its settle
    /// span recorded, when it is traced).
    fn settled(self, outcome: Outcome) -> Settlement {
        if let Some(t) = &self.traced {
            let said = match outcome {
                Outcome::Ack => "ack",
                Outcome::Nack => "nack",
                Outcome::Close => "close",
            };
            let settlement = KeyValue::new("messaging.kubemq.settlement", said);
            t.record(
                Step::Settle,
                (self.sent, std::time::Instant::now()),
                &[settlement],
            );
        }
        Settlement {
            transaction: self.transaction,
            sequence: self.sequence,
            outcome,
        }
    }
}

/// The connection's table of links, as the queues bridge reads it.
pub(crate) trait QueueTable {
    /// The consume link `link`, if it is one.
    fn consumer(&mut self, link: LinkId) -> Option<&mut QueueConsumer>;
    /// Every consume link.
    fn consumer_links(&self) -> impl Iterator<Item = LinkId>;
    /// Every produce link.
    fn producers(&mut self) -> impl Iterator<Item = &mut Producer>;
}

/// What one connection's queue links share: the produce lanes of links that ended, the Get
/// loops' hand-outs, the unsettled consume deliveries, and what a turn reports to the loops.
pub struct QueueLinks {
    /// Sends of produce links that ended, still being stored.
    closing_lanes: Vec<Lane>,
    /// Wakes the task when a lane's wait for a refill ends.
    refill_timer: Option<Pin<Box<tokio::time::Sleep>>>,
    handout_tx: mpsc::UnboundedSender<ToConsumer>,
    handout_rx: mpsc::UnboundedReceiver<ToConsumer>,
    /// Unsettled consume deliveries, by delivery token.
    deliveries: FastMap<DeliveryToken, Unsettled>,
    /// Numbers the consume deliveries.
    outbound: Outbound,
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
}

impl Default for QueueLinks {
    fn default() -> Self {
        let (handout_tx, handout_rx) = mpsc::unbounded_channel();
        QueueLinks {
            closing_lanes: Vec::new(),
            refill_timer: None,
            handout_tx,
            handout_rx,
            deliveries: FastMap::default(),
            outbound: Outbound::default(),
            closed: HashMap::new(),
            ready_done: Vec::new(),
            ready_handouts: Vec::new(),
            settled: Vec::new(),
            demand_changed: Vec::new(),
            drained: Vec::new(),
            egress: Egress::default(),
        }
    }
}

/// Transfer frames a consume link of unsettled deliveries may have waiting for its session's
/// window (so at most this many messages are locked for it beyond what the window takes): enough
/// to have the next ones ready when the client's FLOW opens the window. A pre-settled link gets
/// none: a message taken for it is gone from the queue, and one that cannot be sent would be lost.
const WINDOW_SLACK: u32 = 4;

impl QueueLinks {
    /// The state of the accepted produce link `link`: its own lane to the backend.
    pub(crate) fn producer(link: LinkId, shared: &Shared) -> Producer {
        // Lanes in turn: links opened one after another use different streams of the backend
        // (a hash of the link's ids put two producers on one stream in about one run in four,
        // where each then waited for the other's batch).
        let lane = shared.next_lane.fetch_add(1, Ordering::Relaxed);
        Producer {
            lane: Lane::new(lane, link),
        }
    }

    /// Accepts a consume link on `channel` and joins it to the channel's Get loop; `Ok(None)`
    /// when it is gone (detached while attaching).
    pub(crate) fn accept_consumer<B: Backend>(
        &mut self,
        conn: &mut Connection,
        link: LinkId,
        (source, snd_settle_mode): (Option<&Source>, &SenderSettleMode),
        channel: String,
        ctx: &Ctx<B>,
        shared: &Shared,
    ) -> Result<Option<QueueConsumer>, AmqpError> {
        if source.and_then(|s| s.distribution_mode.as_ref()) == Some(&DistributionMode::Copy) {
            //
            return Err(AmqpError::new(
                Condition::InvalidField,
                "distribution-mode copy is not supported on queues",
            ));
        }
        if super::events::options::has_filter(source) {
            //
            return Err(AmqpError::new(
                Condition::NotImplemented,
                "selector filter not supported on this address",
            ));
        }
        if conn
            .accept_link(link, LinkAccept { credit_window: 0 })
            .is_err()
        {
            return Ok(None);
        }
        let loop_key = LoopKey {
            channel,
            credential: ctx.credential.clone(),
            caller: ctx.caller.clone(),
        };
        let fetcher = fetcher::join(
            &shared.fetchers,
            &ctx.backend,
            loop_key,
            shared.limits,
            (ctx.connection, link),
            self.handout_tx.clone(),
        );
        Ok(Some(QueueConsumer {
            fetcher,
            presettled: *snd_settle_mode == SenderSettleMode::Settled,
            taken: 0,
        }))
    }

    /// A complete message on `producer`'s link, bound to `channel`.
    pub(crate) fn produce<B>(
        conn: &mut Connection,
        d: &Delivery,
        (channel, producer): (&str, &mut Producer),
        ctx: &Ctx<B>,
    ) {
        // MET-4.
        ctx.metrics
            .transfer(Direction::In, Counted::Pattern(Pattern::Queues));
        let Some(stored) = ingress_or_refuse(conn, &ctx.metrics, d) else {
            return;
        };
        producer.store(d, channel.to_string(), stored, ctx);
    }

    /// New credit, or a drain, on a consume link.
    pub(crate) fn credit(
        &mut self,
        conn: &Connection,
        (link, consumer): (LinkId, &QueueConsumer),
        drain: bool,
        connection: u64,
        shared: &Shared,
    ) {
        if !drain {
            // A FLOW after a drain in the same turn is new credit: it is reported.
            self.drained.retain(|l| *l != link);
            self.demand_changed.push(link);
            return;
        }
        // FLOW-5: the fetcher hands over what is immediately available, then says DrainDone;
        // it never waits for new messages.
        let _ = consumer.fetcher.send(Command::Drain(DemandReport {
            consumer: (connection, link),
            credit: demand(conn, (link, consumer), shared),
            taken: consumer.taken,
        }));
        self.drained.push(link);
    }

    /// Every consume link's demand may have been cut by its session's window or a full
    /// transport, and it has room again.
    pub(crate) fn window_opened(&mut self, table: &impl QueueTable) {
        self.demand_changed.extend(table.consumer_links());
    }

    /// The client settled the consume delivery of `token` on `link` (Q-20 … Q-25, MET-5).
    pub(crate) fn settled(
        &mut self,
        link: LinkId,
        token: DeliveryToken,
        state: Option<DeliveryOutcome>,
        metrics: &Metrics,
    ) {
        let Some(message) = self.deliveries.remove(&token) else {
            return;
        };
        metrics
            .stages
            .record(Stage::Settled, message.sent.elapsed());
        // MET-5.
        let counted = match &state {
            Some(DeliveryOutcome::Accepted) => Some(metrics::Outcome::accepted),
            Some(DeliveryOutcome::Rejected(_)) => Some(metrics::Outcome::rejected),
            Some(DeliveryOutcome::Released) => Some(metrics::Outcome::released),
            Some(DeliveryOutcome::Modified { .. }) => Some(metrics::Outcome::modified),
            _ => None,
        };
        if let Some(o) = counted {
            metrics.disposition(o);
        }
        let outcome = match state {
            //
            Some(DeliveryOutcome::Accepted) | Some(DeliveryOutcome::Rejected(_)) | None => {
                Outcome::Ack
            }
            //
            _ => Outcome::Nack,
        };
        self.settled.push((link, message.settled(outcome)));
        self.demand_changed.push(link);
    }

    /// A produce link ended: what it sent is still stored; the outcomes find no link.
    pub(crate) fn producer_closed(&mut self, Producer { mut lane }: Producer) {
        lane.close();
        if !lane.is_idle() {
            self.closing_lanes.push(lane);
        }
    }

    /// A consume link ended: this turn's settlements first; then: every unsettled
    /// delivery NAcked, once (the engine reports each once), and the link leaves its Get loop.
    pub(crate) fn consumer_closed(
        &mut self,
        (link, QueueConsumer { fetcher, .. }): (LinkId, QueueConsumer),
        unsettled: &[DeliveryToken],
        connection: u64,
    ) {
        let mut settled = self.take_settled(link);
        for token in unsettled {
            if let Some(message) = self.deliveries.remove(token) {
                settled.push(message.settled(Outcome::Nack));
            }
        }
        if !settled.is_empty() {
            let _ = fetcher.send(Command::Settle(settled));
        }
        let _ = fetcher.send(Command::Leave((connection, link)));
        self.closed.insert(link, fetcher);
    }

    /// Collects finished sends and hand-outs; Ready when there is some to apply.
    pub(crate) fn poll<B: Backend>(
        &mut self,
        cx: &mut Context<'_>,
        backend: &Arc<B>,
        table: &mut impl QueueTable,
    ) -> Poll<()> {
        self.poll_lanes(cx, backend, table);
        while let Poll::Ready(Some(h)) = self.handout_rx.poll_recv(cx) {
            self.ready_handouts.push(h);
        }
        if self.ready_done.is_empty() && self.ready_handouts.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// Applies what [`QueueLinks::poll`] collected.
    pub(crate) fn work(
        &mut self,
        conn: &mut Connection,
        metrics: &Metrics,
        table: &mut impl QueueTable,
    ) {
        for d in std::mem::take(&mut self.ready_done) {
            metrics.stages.record(Stage::Stored, d.received.elapsed());
            if let Some(s) = &d.store_span {
                publish_spans(s, d.received.into_std(), &d.state);
            }
            // the outcome the backend reported; a link gone meanwhile needs nothing.
            settle_inbound(conn, metrics, d.link, d.delivery_id, d.presettled, d.state);
        }
        for item in std::mem::take(&mut self.ready_handouts) {
            match item {
                ToConsumer::Messages(handouts) => {
                    for h in handouts {
                        self.demand_changed.push(h.consumer.1);
                        self.consume(conn, h, metrics, table);
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

    /// Sends a handed-out message on its link within credit, or gives it back to the fetcher.
    fn consume(
        &mut self,
        conn: &mut Connection,
        h: Handout,
        metrics: &Metrics,
        table: &mut impl QueueTable,
    ) {
        let link = h.consumer.1;
        let Some(consumer) = table.consumer(link) else {
            // The link ended while the message was on its way: the fetcher offers it again.
            if let Some(f) = self.closed.get(&link) {
                let _ = f.send(Command::Return(Box::new(h)));
            }
            return;
        };
        consumer.taken += 1;
        let presettled = consumer.presettled;
        let receive_count = h.message.attributes.as_ref().map_or(1, |a| a.receive_count);
        let payload = self.egress.message(
            &h.message.metadata,
            &h.message.body,
            &h.message.tags,
            DeliveryInfo { receive_count },
        );
        let sent = self.outbound.send(conn, link, &payload, presettled);
        let mut traced = None;
        if sent.is_ok() {
            traced = spans::traced(&h.message.tags, Pattern::Queues, &h.message.channel);
            if let Some(t) = &traced {
                t.record(Step::Deliver, (h.taken.at, std::time::Instant::now()), &[]);
            }
            // MET-4.
            metrics.transfer(Direction::Out, Counted::Pattern(Pattern::Queues));
            metrics
                .channels
                .count(Pattern::Queues, &h.message.channel, Direction::Out);
            metrics.stages.record(Stage::Waited, h.taken.waited);
            metrics
                .stages
                .record(Stage::HandedOut, h.taken.at.elapsed());
        }
        match sent {
            Ok(token) => {
                let message = Unsettled {
                    transaction: h.transaction,
                    sequence: h.sequence,
                    sent: std::time::Instant::now(),
                    traced,
                };
                if presettled {
                    // at-most-once, acked as it is sent.
                    self.settled.push((link, message.settled(Outcome::Ack)));
                } else {
                    self.deliveries.insert(token, message);
                }
            }
            // No credit (a drain or a lower FLOW won the race): never sent beyond credit, Q-16.
            Err(_) => {
                let _ = consumer.fetcher.send(Command::Return(Box::new(h)));
            }
        }
    }

    /// Moves every produce lane on (finished batches' outcomes into `ready_done`, next batches
    /// started), and keeps the timer set for the earliest wait for a refill.
    fn poll_lanes<B: Backend>(
        &mut self,
        cx: &mut Context<'_>,
        backend: &Arc<B>,
        table: &mut impl QueueTable,
    ) {
        loop {
            let mut wake_at = None;
            let producers = table.producers().map(|p| &mut p.lane);
            for lane in producers.chain(self.closing_lanes.iter_mut()) {
                lane.poll(cx, backend, &mut self.ready_done);
                wake_at = wake_at.into_iter().chain(lane.wake_at()).min();
            }
            self.closing_lanes.retain(|l| !l.is_idle());
            let Some(at) = wake_at else {
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
    pub(crate) fn flush_turn(
        &mut self,
        conn: &Connection,
        connection: u64,
        shared: &Shared,
        table: &mut impl QueueTable,
    ) {
        if !self.settled.is_empty() {
            let mut by_link: FastMap<LinkId, Vec<Settlement>> = FastMap::default();
            for (link, s) in self.settled.drain(..) {
                by_link.entry(link).or_default().push(s);
            }
            for (link, settled) in by_link {
                if let Some(c) = table.consumer(link) {
                    let _ = c.fetcher.send(Command::Settle(settled));
                }
            }
        }
        if !self.demand_changed.is_empty() {
            let mut links = std::mem::take(&mut self.demand_changed);
            links.sort_unstable();
            links.dedup();
            for &link in &links {
                if self.drained.contains(&link) {
                    continue;
                }
                if let Some(c) = table.consumer(link) {
                    let _ = c.fetcher.send(Command::Demand(DemandReport {
                        consumer: (connection, link),
                        credit: demand(conn, (link, c), shared),
                        taken: c.taken,
                    }));
                }
            }
            links.clear();
            self.demand_changed = links;
        }
        self.drained.clear();
    }

    /// The connection ended: what its produce links received is still stored.
    pub(crate) fn finish<B: Backend>(
        &mut self,
        backend: &Arc<B>,
        producers: impl Iterator<Item = Producer>,
    ) {
        let lanes: Vec<Lane> = producers
            .map(|p| p.lane)
            .chain(self.closing_lanes.drain(..))
            .collect();
        if tokio::runtime::Handle::try_current().is_ok() {
            sender::finish(backend.clone(), lanes);
        }
    }
}

/// A stored message's publish span (from its complete delivery to its outcome, now) and, within
/// it, its batch's store span; a message the backend did not take says how (`error.type`).
fn publish_spans(s: &sender::StoreSpan, received: std::time::Instant, state: &DeliveryState) {
    let error = match state {
        DeliveryState::Accepted(_) => None,
        DeliveryState::Rejected(_) => Some(KeyValue::new("error.type", "rejected")),
        DeliveryState::Released(_) => Some(KeyValue::new("error.type", "released")),
        _ => Some(KeyValue::new("error.type", "_OTHER")),
    };
    let extra = error.as_slice();
    let now = std::time::Instant::now();
    if let Some(publish) = s.traced.record(Step::Publish, (received, now), extra) {
        s.traced
            .record_under(&publish, Step::Store, (s.from, s.to), extra);
    }
}

/// Credit the link can use now, within MaxUnsettledPerLink (Q-12, FLOW-7) and within what
/// its session's window takes (plus [`WINDOW_SLACK`] for a link whose deliveries are
/// settled by the client): a client that grants credit but no session window gets no more
/// messages taken off the queue than the wire can carry, and a pre-settled one none.
fn demand(conn: &Connection, (link, consumer): (LinkId, &QueueConsumer), shared: &Shared) -> u32 {
    let room = (shared.max_unsettled as usize).saturating_sub(conn.unsettled_count(link));
    let session = conn.session_room(link);
    let slack = if consumer.presettled { 0 } else { WINDOW_SLACK };
    let wire = session
        .window
        .saturating_add(slack)
        .saturating_sub(session.waiting) as usize;
    (conn.credit(link) as usize).min(room).min(wire) as u32
}

#[cfg(test)]
impl QueueLinks {
    /// Consume links that ended and still wait for their Get loop to confirm the Leave.
    pub(crate) fn awaiting_leave(&self) -> usize {
        self.closed.len()
    }
}
