//! One channel's Get loop, decided without I/O and without a clock
//! (docs/queues-consume-design.md): the loop is shared by every consume link of that channel
//! and credential in this process; it sizes Gets to the links' total demand, hands messages out
//! by demand, completes drains, and settles what consumers settled, grouped by transaction,
//! before each Get.
//!
//! [`GetLoop`] is driven the way `engine/` is: the driver (`fetcher.rs`) gives it consumers'
//! orders and the backend's answers, each with the instant, and asks [`GetLoop::poll`] what to
//! do: an [`Action`] to perform (some to be answered before the next poll), a [`Wait`] for
//! something to happen by an instant, or [`Step::Idle`]. Every KubeMQ v2.4 rule the loop
//! applies is met in [`GetLoop::poll`], in the order it applies:
//! 1. messages buffered go to consumers with credit; drains with nothing more end (FLOW-5);
//! 2. settlements go out, per transaction and outcome, a transaction closed once all of
//!    it is settled where KubeMQ captures (KMQ-18); `close_fence.rs`, for the answer that tells
//!    the closes are over;
//! 3. after a large Get, the next waits briefly for the consumers' credit to come back whole
//!    (`refill_wait.rs`);
//! 4. no Get joins KubeMQ's queue group while a close before it may still be under way
//!    (`close_fence.rs`, KMQ-17);
//! 5. consumers that hold every open transaction, beside which a Get for messages known to be
//!    there came back short or a sequence stays skipped (`gaps.rs`), or that got nothing new for
//!    a while, have those transactions closed so that KubeMQ gives back what they hide
//!    (`rehome.rs`, KMQ-20);
//! 6. an idle queue is watched, not waited on with a Get, and a drain on it ends on a recent
//!    count (`idle_watch.rs`, KMQ-21);
//! 7. a Get that would wait is held back while transactions are open (`get_gate.rs`, KMQ-17);
//! 8. the Get goes on a session with no open transaction (`sessions.rs`, KMQ-5), sized by what
//!    is ready; while it is out, settlements wait for it unless it turns out to wait, and a
//!    drain ends once it outlived [`DRAIN_GRACE`].

mod close_fence;
mod consumers;
mod gaps;
mod get_gate;
mod handout;
mod idle_watch;
mod plan;
mod rehome;
mod sessions;
#[cfg(test)]
mod tests;

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(test)]
pub(super) use self::close_fence::FENCE_WAIT;
use self::close_fence::{Fence, Fences};
use self::consumers::{put_back, Consumers, Fetched};
use self::gaps::Gaps;
pub(super) use self::get_gate::OVERLAP_WAIT;
use self::get_gate::{GetGate, Moment};
pub use self::handout::{
    ConsumerKey, DemandReport, FetchLimits, Handout, Outcome, Settlement, Taken, ToConsumer,
};
use self::idle_watch::{Holding, IdleWatch, Look};
use self::plan::{Awaiting, Op, Plan};
use self::rehome::{Arrival, GivenBack, Hidden, Moved, StallWatch};
pub(super) use self::sessions::SessionId;
use self::sessions::{Lend, Sessions, Txn};
use super::refill_wait::RefillWait;
use crate::backend::queue_watch::{BrokerCounts, QueueView};
use crate::backend::{BackendError, Batch, ReadCheck, ReadyHint};
use crate::kubemq::QueueMessage;

/// How long a drain waits for a Get to answer before it counts as "nothing more is immediately
/// available" (FLOW-5), when the backend cannot say how many messages are ready. KubeMQ answers a
/// Get for messages that are there within a few milliseconds (KMQ-10: p99 2.4 ms); a Get
/// still waiting after this is waiting for messages that do not exist yet.
pub const DRAIN_GRACE: Duration = Duration::from_millis(50);

/// How recent KubeMQ's count of a watched queue must be for a drain to end on its word, without
/// a Get: QueuesInfo is asked every 50 ms while few queues are watched (less often with many),
/// and a message another process stored since then waits for the consumer's next credit.
pub(super) const DRAIN_VIEW_AGE: Duration = Duration::from_millis(250);

/// How long the loop waits before it opens a session again after opening one failed.
const OPEN_RETRY: Duration = Duration::from_millis(500);

/// How long the loop waits before the next Get after a Get failed.
const GET_RETRY: Duration = Duration::from_millis(100);

/// What the backend shows at the moment the loop decides (read, never waited for).
pub(super) trait Sight {
    /// The backend's count of ready messages on the loop's channel.
    fn ready(&self) -> ReadyHint;
    /// Messages known stored on the channel and not fetched yet.
    fn stored(&self) -> u64;
    /// The watched queue's view as it is now, marked seen; `None` while nothing is watched.
    fn view(&mut self) -> Option<QueueView>;
}

/// What consumers tell the loop.
#[derive(Debug)]
pub(super) enum Order {
    /// A consumer joined.
    Join(ConsumerKey),
    /// A consumer's demand.
    Demand(DemandReport),
    /// A consumer drains (FLOW-5): hand it what is immediately available within its demand,
    /// then report DrainDone. Never waits for new messages.
    Drain(DemandReport),
    /// A consumer left; its remaining demand is gone (its unsettled deliveries come as Settle).
    Leave(ConsumerKey),
    /// Deliveries were settled, gathered over a turn of the consumer's connection.
    Settle(Vec<Settlement>),
    /// A handed-out message could not be delivered (credit gone): offer it again.
    Return(Box<Handout>),
}

/// Something for the driver to do.
#[derive(Debug)]
pub(super) enum Action {
    /// Send this to the consumer; a batch its connection cannot take comes back through
    /// [`GetLoop::undelivered`].
    Tell(ConsumerKey, ToConsumer),
    /// Open a downstream session under this id; answer with [`GetLoop::opened`].
    Open(SessionId),
    /// Put a Get for `want` messages on the session (lent until the answer); answer with
    /// [`GetLoop::answered`] whenever it returns.
    Get {
        /// The session it goes on.
        session: SessionId,
        /// MaxItems.
        want: u32,
    },
    /// Settle messages of a transaction on its session (sequences ascending and distinct;
    /// none for a close); answer with [`GetLoop::settled`].
    Settle {
        /// The session that owns the transaction.
        session: SessionId,
        /// The transaction.
        transaction: Arc<str>,
        /// Ack, NAck, or close.
        outcome: Outcome,
        /// The messages.
        sequences: Vec<u64>,
    },
    /// Ask the session to answer once it handled every request sent before, and keep the
    /// answer for the next [`Wait`] with `fences`; answer the request with [`GetLoop::settled`]
    /// and the answer with [`GetLoop::fence_answered`].
    Fence {
        /// The session.
        session: SessionId,
        /// The last transaction closed on it.
        transaction: Arc<str>,
    },
    /// `count` messages went back to the queue on this session (the backend's own count).
    Returned {
        /// The session.
        session: SessionId,
        /// How many.
        count: usize,
    },
    /// Drop the session: it failed, and KubeMQ gives back what it held.
    Drop(SessionId),
    /// Watch the queue; answer with [`GetLoop::watched`].
    Watch,
    /// Ask the backend whether the loop's client may read the queue, short of a Get; answer
    /// with [`GetLoop::read_checked`].
    CheckRead,
    /// Stop watching the queue.
    Unwatch,
    /// Forget the answers kept for fences: they came too late.
    ForgetFences,
}

/// What the loop waits for: always a consumer's order and the running Get's answer; the rest
/// as flagged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Wait {
    /// Look again at this instant.
    pub until: Option<Instant>,
    /// …or when the watched queue's view changes.
    pub view: bool,
    /// …or when the backend's ready count may have risen.
    pub ready: bool,
    /// …or when a fence's answer comes.
    pub fences: bool,
}

impl Wait {
    /// Wait for an order (or the running Get), or until `until`.
    pub(super) fn until(until: Option<Instant>) -> Wait {
        Wait {
            until,
            ..Wait::default()
        }
    }
}

/// What [`GetLoop::poll`] asks of the driver.
#[derive(Debug)]
pub(super) enum Step {
    /// Do this, then poll again.
    Act(Action),
    /// Nothing to do until something in the wait happens.
    Wait(Wait),
    /// No consumer and nothing held: the loop may end once nobody joins for a while.
    Idle,
}

/// The instants a Get answered at: the loop's, and the clocks a message's wait is read on.
#[derive(Debug, Clone, Copy)]
pub(super) struct AnsweredAt {
    /// The loop's instant.
    pub now: Instant,
    /// The process's monotonic clock, for [`Taken`].
    pub taken: Instant,
    /// The wall clock, Unix nanoseconds, for [`Taken`].
    pub wall_ns: i64,
}

/// The Get on the wire.
#[derive(Debug)]
struct GetOut {
    session: SessionId,
    want: u32,
    /// The demand it was sized for.
    demand: u32,
    /// Messages known stored when it went.
    stored: u64,
    /// It asked only for messages known to be there: stored by this process, or counted
    /// waiting by the broker beyond what the loop holds.
    counted: bool,
    /// When it went.
    asked: Instant,
    /// Settlements wait for it until then (a Get for stored messages), or not at all.
    overlap_until: Option<Instant>,
    /// Drains stop waiting for it then.
    grace_until: Instant,
}

/// Whether the loop watches its queue (idle_watch.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watching {
    /// No view held.
    Off,
    /// The view is held.
    On,
    /// The backend has no view to give: Gets wait as without a watch.
    Never,
}

/// One channel's Get loop.
pub(super) struct GetLoop {
    /// The channel, for the log.
    channel: Arc<str>,
    limits: FetchLimits,
    /// The backend takes ready messages into open transactions (KubeMQ).
    captures: bool,
    consumers: Consumers,
    buffer: VecDeque<Fetched>,
    /// Settlements not sent yet.
    settle: Vec<Settlement>,
    /// `settle` holds something the last flush did not try.
    fresh: bool,
    /// Transactions some of whose messages were handed out (those cannot be closed unchanged).
    handed: HashSet<Arc<str>, foldhash::fast::RandomState>,
    sessions: Sessions,
    /// The next Get's size when the backend gives no ready count: 1 while the queue looks idle,
    /// doubling after every full Get.
    batch: u32,
    /// The wait for the consumers' credit after a large Get.
    refill: Option<RefillWait>,
    /// Holds back a Get that would wait while transactions are open.
    gate: GetGate,
    /// Answers that tell the transactions closed so far are closed.
    fences: Fences,
    /// When to close transactions held by consumers that wait for more.
    stall: StallWatch,
    /// Messages of transactions closed under their consumers, until they come back.
    moved: Moved<Outcome>,
    /// What the last round gave back, for the next Get to bring on top of the demand.
    given_back: Option<GivenBack>,
    /// Messages a Get for ones known to be there missed beside open transactions, until a
    /// round or until those transactions closed.
    hidden: Option<Hidden>,
    /// Sequences the loop's Gets skipped (where the backend captures).
    gaps: Gaps,
    watching: Watching,
    /// Whether the backend was asked if the loop may read its queue (once, before it first
    /// watches instead of Getting).
    read_checked: bool,
    /// What the loop made of its views so far.
    idle: Option<IdleWatch>,
    /// The size of the next Get as the view gave it, until that Get goes.
    looked: Option<u32>,
    /// The view as the last look saw it.
    last_view: Option<QueueView>,
    get: Option<GetOut>,
    /// Settlements, closes and fences under way.
    plan: Plan,
    /// Actions decided and not handed to the driver yet.
    out: VecDeque<Action>,
    /// No Get before then (a Get or a session failed).
    retry_at: Option<Instant>,
}

impl GetLoop {
    /// A loop for `channel` on a backend that captures (`captures`) or not.
    pub(super) fn new(channel: &str, limits: FetchLimits, captures: bool) -> GetLoop {
        GetLoop {
            channel: Arc::from(channel),
            limits,
            captures,
            consumers: Consumers::default(),
            buffer: VecDeque::new(),
            settle: Vec::new(),
            fresh: false,
            handed: HashSet::default(),
            sessions: Sessions::default(),
            batch: 1,
            refill: None,
            gate: GetGate::default(),
            fences: Fences::default(),
            stall: StallWatch::default(),
            moved: Moved::default(),
            given_back: None,
            hidden: None,
            gaps: Gaps::default(),
            watching: Watching::Off,
            read_checked: false,
            idle: None,
            looked: None,
            last_view: None,
            get: None,
            plan: Plan::default(),
            out: VecDeque::new(),
            retry_at: None,
        }
    }

    /// What to do next, at `now`.
    pub(super) fn poll(&mut self, now: Instant, sight: &mut dyn Sight) -> Step {
        loop {
            if let Some(a) = self.out.pop_front() {
                return Step::Act(a);
            }
            if self.plan.awaiting.is_some() {
                // The driver answers an action before it polls again; until it has, nothing
                // else may go.
                return Step::Wait(Wait::default());
            }
            if let Some(a) = self.next_op() {
                return Step::Act(a);
            }
            if !self.out.is_empty() {
                // The plan's last step forgot failed sessions.
                continue;
            }
            if self.get.is_some() {
                match self.while_getting(now) {
                    Some(step) => return step,
                    None => continue,
                }
            }
            match self.between_gets(now, sight) {
                Some(step) => return step,
                None => continue,
            }
        }
    }

    /// While a Get is out: settlements go once it is known to wait, drains end once it outlived
    /// the grace. `None` when actions were queued.
    fn while_getting(&mut self, now: Instant) -> Option<Step> {
        let g = self.get.as_mut()?;
        if g.overlap_until.is_some_and(|u| now >= u) {
            // A Get for stored messages that did not answer in time is waiting after all:
            // what was settled meanwhile goes, as KubeMQ may hold what it frees until then.
            g.overlap_until = None;
            if !self.settle.is_empty() {
                self.start_flush();
                return None;
            }
        }
        let overlapped = g.overlap_until.is_none();
        let graced = now >= g.grace_until;
        let grace = (!graced).then_some(g.grace_until);
        let until = g.overlap_until.into_iter().chain(grace).min();
        if overlapped && self.fresh {
            self.start_flush();
            return None;
        }
        // A Get still waiting this long has nothing immediately available for a drain; what it
        // brings later is held for the next credit.
        if graced && self.end_drains(false) {
            return None;
        }
        Some(Step::Wait(Wait::until(until)))
    }

    /// Between Gets: hand out, settle, and decide the next Get. `None` when actions were
    /// queued.
    fn between_gets(&mut self, now: Instant, sight: &mut dyn Sight) -> Option<Step> {
        if self.buffer.is_empty() {
            // Only buffered messages are ever closed unchanged; with none left, forget.
            self.handed.clear();
        }
        let batches = self.consumers.hand_out(&mut self.buffer, &mut self.handed);
        if !batches.is_empty() {
            for (k, batch) in batches {
                self.out
                    .push_back(Action::Tell(k, ToConsumer::Messages(batch)));
            }
            return None;
        }
        if self.consumers.draining() {
            let ready_now = self.buffer.is_empty() && sight.ready() != ReadyHint::Exact(0);
            if self.end_drains(ready_now) {
                return None;
            }
        }
        if self.fresh {
            self.start_flush();
            return None;
        }
        if self.consumers.is_empty() && self.buffer.is_empty() && self.settle.is_empty() {
            // Everyone left and nothing is held. Nobody needs the queue watched.
            if self.watching == Watching::On {
                self.watching = Watching::Off;
                self.out.push_back(Action::Unwatch);
                return None;
            }
            return Some(Step::Idle);
        }
        if self.consumers.is_empty() && !self.buffer.is_empty() {
            self.give_back();
            return None;
        }
        let demand = self.consumers.total_demand();
        if demand == 0 || !self.buffer.is_empty() {
            self.stall.calm();
            return Some(Step::Wait(Wait::default()));
        }
        let draining = self.consumers.draining();
        // After a large Get, the next waits (briefly) for the consumers' credit to come back
        // whole, unless what is back already takes everything ready; a drain never waits.
        if let Some(m) = self.refill {
            if !draining && !m.over(demand as usize, sight.ready().known(), now) {
                return Some(Step::Wait(Wait::until(Some(m.until()))));
            }
            self.refill = None;
        }
        // No Get joins KubeMQ's queue group while a close before it may still be under way.
        match self.fences.check(now) {
            Fence::Open => {}
            Fence::Wait(until) => {
                return Some(Step::Wait(Wait {
                    until: Some(until),
                    fences: true,
                    ..Wait::default()
                }))
            }
            Fence::GaveUp => {
                self.out.push_back(Action::ForgetFences);
                return None;
            }
        }
        let at = Moment {
            captures: self.captures,
            open: !self.sessions.txns.is_empty(),
            draining,
        };
        // Consumers with credit that hold every open transaction may be waiting for messages
        // those transactions hide: a Get missed messages known to be there beside them, a
        // sequence stays skipped (gaps.rs), or nothing new came for a while.
        let stuck = at.captures && at.open && !at.draining;
        if let Some(h) = &self.hidden {
            if !h
                .suspects
                .iter()
                .any(|t| self.sessions.txns.contains_key(t))
            {
                // Closed by their consumers since: what they hid went back with them.
                self.hidden = None;
            }
        }
        let evidence =
            self.hidden.as_ref().is_some_and(|h| h.alone) || (stuck && self.gaps.due(now));
        if self.stall.due(stuck, evidence, now) {
            self.start_rehome(now);
            return None;
        }
        // An idle queue is watched, not waited on with a Get; a drain on it ends on a recent
        // count's word that nothing is there (KMQ-21: a Get for one would hold one of KubeMQ's
        // shared clients for its whole second).
        if self.looked.is_none() && self.given_back.is_none() {
            match self.look(now, sight) {
                Some(Looked::Act(a)) => return Some(Step::Act(a)),
                Some(Looked::At(Look::Watch(None))) if draining && self.view_is_recent(now) => {
                    self.end_drains(false);
                    return None;
                }
                // Without a recent count, a drain Gets one as without a watch.
                Some(Looked::At(Look::Watch(_))) if draining => {}
                Some(Looked::At(Look::Watch(until))) => {
                    return Some(Step::Wait(Wait {
                        until,
                        view: true,
                        ..Wait::default()
                    }))
                }
                // Kept until the Get goes, whatever holds it back before.
                Some(Looked::At(Look::Get(n))) => self.looked = Some(n),
                Some(Looked::At(Look::Blind)) | None => {}
            }
        }
        // A Get that would wait is held back while transactions are open.
        let stored = sight.stored();
        if let Some(until) = self.gate.hold(at, || stored > 0, now) {
            return Some(Step::Wait(Wait {
                until: Some(until),
                ready: true,
                ..Wait::default()
            }));
        }
        if let Some(t) = self.retry_at {
            if now < t {
                return Some(Step::Wait(Wait::until(Some(t))));
            }
            self.retry_at = None;
        }
        let session = match self.sessions.lend() {
            Lend::On(session) => session,
            Lend::Open(id) => return Some(Step::Act(Action::Open(id))),
        };
        let from_view = self.looked.is_some();
        let mut want = match self.looked.take() {
            Some(n) => n.min(demand.min(self.limits.max_batch)).max(1),
            None => self.get_size(demand, sight),
        };
        if let Some(back) = self.given_back.take() {
            // Everything the closed transactions held comes to this Get's member at once; what
            // is beyond its MaxItems would stay hidden in it. The backend counts what they
            // held as ready again: only what it counts beyond that is new.
            let new = match sight.ready().known() {
                Some(ready) => {
                    let beyond = ready.saturating_sub(u64::from(back.held));
                    u32::try_from(beyond).unwrap_or(u32::MAX).min(demand)
                }
                None => want,
            };
            want = back
                .held
                .saturating_add(back.hidden)
                .saturating_add(new)
                .clamp(1, self.limits.max_batch.max(1));
        }
        if at.captures && at.open && stored > 0 {
            // Beside open transactions, a Get asks only for what is stored, so that it cannot
            // wait.
            want = want.min(u32::try_from(stored).unwrap_or(u32::MAX));
        }
        // A Get for stored messages answers within a few milliseconds; a close sent while it is
        // out could stall it for 100 ms, so settlements wait for it, unless it turns out to be
        // waiting after all.
        let for_stored = u64::from(want) <= stored;
        let prompt = at.captures && for_stored;
        self.gate.restart();
        self.get = Some(GetOut {
            session,
            want,
            demand,
            stored,
            counted: from_view || for_stored,
            asked: now,
            overlap_until: prompt.then(|| now + OVERLAP_WAIT),
            grace_until: now + DRAIN_GRACE,
        });
        Some(Step::Act(Action::Get { session, want }))
    }

    /// A consumer's order.
    pub(super) fn order(&mut self, order: Order) {
        match order {
            Order::Join(k) => self.consumers.join(k),
            Order::Demand(d) => self.consumers.demand(d),
            Order::Drain(d) => self.consumers.drain(d),
            Order::Leave(k) => {
                if self.consumers.leave(k) {
                    // Behind every hand-out sent to it on the same channel.
                    self.out.push_back(Action::Tell(k, ToConsumer::Left(k)));
                }
            }
            Order::Settle(mut settled) => {
                if settled.is_empty() {
                    return;
                }
                self.fresh = true;
                if self.moved.is_empty() {
                    self.settle.append(&mut settled);
                } else {
                    for s in settled {
                        if let Some(s) = self.follow(s) {
                            self.settle.push(s);
                        }
                    }
                }
            }
            Order::Return(h) => {
                let mut h = *h;
                if self.is_moved(&h.transaction, h.sequence) {
                    match self.moved.returned(h.sequence) {
                        Some(now_in) => h.transaction = now_in,
                        // Still out at KubeMQ: handed out afresh when it comes back.
                        None => return,
                    }
                }
                self.handed.insert(h.transaction.clone());
                put_back(&mut self.buffer, Fetched::from(h));
            }
        }
    }

    /// A batch told to consumer `k` could not reach it (its connection is gone): the messages
    /// wait for someone else.
    pub(super) fn undelivered(&mut self, k: ConsumerKey, batch: Vec<Handout>) {
        self.consumers.gone(k);
        for h in batch {
            put_back(&mut self.buffer, Fetched::from(h));
        }
    }

    /// Session `id` opened, or could not be.
    pub(super) fn opened(&mut self, id: SessionId, r: Result<(), BackendError>, now: Instant) {
        match r {
            Ok(()) => self.sessions.opened(id),
            Err(e) => {
                self.refuse_if_unauthorized(&e);
                tracing::warn!(channel = %self.channel, error = %e, "cannot open a downstream session; retrying");
                // Nothing is available while the broker is unreachable.
                self.end_drains(false);
                self.retry_at = Some(now + OPEN_RETRY);
            }
        }
    }

    /// The running Get returned.
    pub(super) fn answered(&mut self, r: Result<Batch, BackendError>, at: AnsweredAt) {
        let Some(g) = self.get.take() else {
            return;
        };
        self.sessions.returned(g.session);
        tracing::trace!(
            channel = %self.channel,
            session = g.session,
            want = g.want,
            stored = g.stored,
            open = self.sessions.txns.len(),
            got = r.as_ref().map_or(-1, |b| b.messages.len() as i64),
            waited_us = at.now.saturating_duration_since(g.asked).as_micros() as u64,
            "Get answered"
        );
        match r {
            Ok(b) => {
                self.refill = RefillWait::after(b.messages.len(), g.demand as usize, at.now);
                let got = u32::try_from(b.messages.len()).unwrap_or(u32::MAX);
                if self.captures && g.counted && got < g.want && !self.sessions.txns.is_empty() {
                    // Messages known to be there that a Get could not find: on KubeMQ, hidden
                    // in a transaction open beside it (KMQ-20).
                    self.hidden = Some(Hidden {
                        count: g.want - got,
                        alone: self.gaps.exclusive(),
                        suspects: self.sessions.txns.keys().cloned().collect(),
                    });
                }
                if let Some(idle) = self.idle.as_mut() {
                    let last = b
                        .messages
                        .iter()
                        .filter_map(|m| m.attributes.as_ref().map(|a| a.sequence))
                        .max();
                    if let Some(p) = idle.answered(g.want, b.messages.len(), last, at.now) {
                        tracing::warn!(
                            channel = %self.channel,
                            messages = p.counted,
                            "KubeMQ has counted messages of this queue as waiting for over half a minute that no Get returns: held unsettled by another consumer, or kept for good by members a KubeMQ crash left behind (KMQ-24)"
                        );
                    }
                }
                self.take_batch(b, g.want, g.session, at);
            }
            Err(e) => {
                self.refuse_if_unauthorized(&e);
                // The session is gone, and with it its transactions: KubeMQ returns their
                // messages, so whatever is buffered or pending for them is dropped here.
                tracing::warn!(channel = %self.channel, error = %e, "Get failed; reopening the session");
                self.lose_session(g.session);
                self.batch = 1;
                self.end_drains(false);
                self.retry_at = Some(at.now + GET_RETRY);
            }
        }
        if !self.settle.is_empty() {
            // What waited for the Get's session can go now.
            self.fresh = true;
        }
    }

    /// The answer to the last [`Action::Settle`] or [`Action::Fence`], come `now`.
    pub(super) fn settled(&mut self, r: Result<(), BackendError>, now: Instant) {
        let Some(awaiting) = self.plan.awaiting.take() else {
            return;
        };
        if let (Ok(()), Some(idle)) = (&r, self.idle.as_mut()) {
            idle.settled(now);
        }
        match awaiting {
            Awaiting::Settle {
                session,
                transaction,
                outcome,
                count,
            } => self.after_settle(session, transaction, outcome, count, r),
            Awaiting::Sent(Op::Rehome {
                session,
                transaction,
                count,
            }) => match r {
                Ok(()) => self.out.push_back(Action::Returned { session, count }),
                Err(e) => {
                    tracing::warn!(channel = %self.channel, transaction = %transaction, error = %e, "closing a held transaction failed; KubeMQ returns its messages when the session ends");
                    self.plan.lost.push(session);
                }
            },
            Awaiting::Sent(Op::Fence { session, .. }) => match r {
                Ok(()) => self.fences.push(),
                Err(_) => self.plan.lost.push(session),
            },
            // A close of a settled transaction (and, never sent, the plan's markers).
            Awaiting::Sent(op) => {
                if let (
                    Err(e),
                    Op::CloseSettled {
                        session,
                        transaction,
                    },
                ) = (r, op)
                {
                    tracing::warn!(channel = %self.channel, transaction = %transaction, error = %e, "closing a settled transaction failed; KubeMQ returns what it held when the session ends");
                    self.plan.lost.push(session);
                }
            }
        }
    }

    /// A fence's answer came.
    pub(super) fn fence_answered(&mut self) {
        self.fences.answered();
    }

    /// The backend's view of the queue, now watched; `None` if it has none to give.
    pub(super) fn watched(&mut self, view: Option<QueueView>) {
        match view {
            None => self.watching = Watching::Never,
            Some(v) => {
                // What this process sent before now is in the backend's count, which the next
                // look reads again now that the view exists, so no send falls between the two.
                self.idle
                    .get_or_insert_with(|| IdleWatch::new(v.touched))
                    .skip_touches(v.touched);
                self.watching = Watching::On;
            }
        }
    }

    /// The backend's answer to [`Action::CheckRead`]: allowed, the idle queue is watched from
    /// the start; refused, every consumer is told (AUTHZ-9); otherwise the first Get tells.
    pub(super) fn read_checked(&mut self, r: Result<ReadCheck, BackendError>) {
        match r {
            Ok(ReadCheck::Allowed) => {
                if let Some(idle) = self.idle.as_mut() {
                    idle.read_allowed();
                }
            }
            Ok(ReadCheck::Unknown) => {}
            Err(e) => {
                tracing::debug!(channel = %self.channel, error = %e, "read check refused");
                self.refuse_if_unauthorized(&e);
            }
        }
    }

    /// The backend stopped watching: Gets wait again.
    pub(super) fn view_closed(&mut self) {
        self.watching = Watching::Never;
    }

    /// What to do about an idle queue before the next Get (idle_watch.rs): `None` to Get as the
    /// backend's own count says (it knows of messages ready, or it has no watch: a Get that
    /// waits costs nothing there). The loop holds its queue's view only while it watches, so
    /// the backend asks the broker only about queues that stay idle.
    fn look(&mut self, now: Instant, sight: &mut dyn Sight) -> Option<Looked> {
        if self.watching == Watching::Never {
            return None;
        }
        if ready_known(sight) {
            if self.watching == Watching::On {
                self.watching = Watching::Off;
                return Some(Looked::Act(Action::Unwatch));
            }
            return None;
        }
        if self.watching == Watching::Off {
            return Some(Looked::Act(Action::Watch));
        }
        if !self.read_checked {
            // Without the backend's word that the loop may read, its first Get goes anyway,
            // as the only way to learn whether KubeMQ refuses it (AUTHZ-9).
            self.read_checked = true;
            return Some(Looked::Act(Action::CheckRead));
        }
        let held = self.sessions.txns.values().map(|t| t.left as u64).sum();
        let view = sight.view()?;
        self.last_view = Some(view);
        Some(Looked::At(
            self.idle.as_mut()?.look(&view, Holding { held, now }),
        ))
    }

    /// Whether the last look saw KubeMQ's counts, asked within [`DRAIN_VIEW_AGE`] of `now`.
    fn view_is_recent(&self, now: Instant) -> bool {
        self.last_view.is_some_and(|v| {
            matches!(v.broker, BrokerCounts::Seen(_))
                && v.asked
                    .is_some_and(|a| now.saturating_duration_since(a) <= DRAIN_VIEW_AGE)
        })
    }

    /// With an exact count of ready messages, ask for just those (or 1 to wait for the next);
    /// with an estimate, the same (a Get for more than is there holds them a whole WaitTimeout;
    /// an estimate of 0 — drained, nothing on its way — asks for 1); otherwise the adaptive
    /// batch, or 1 at a time while a drain is on: a Get for more than is there would outlive
    /// DRAIN_GRACE and end the drain with messages still waiting. Never more than the demand
    ///
    fn get_size(&self, demand: u32, sight: &dyn Sight) -> u32 {
        let cap = demand.min(self.limits.max_batch);
        let count = |n: u64| cap.min(u32::try_from(n).unwrap_or(u32::MAX)).max(1);
        match sight.ready().known() {
            Some(ready) => count(ready),
            None if self.consumers.draining() => 1,
            None => cap.min(self.batch).max(1),
        }
    }

    /// Buffers a Get's messages and adapts the next batch size.
    fn take_batch(&mut self, b: Batch, want: u32, session: SessionId, at: AnsweredAt) {
        let n = b.messages.len() as u32;
        self.batch = if n >= want {
            (want * 2).min(self.limits.max_batch)
        } else {
            1
        };
        let txn: Arc<str> = Arc::from(b.transaction_id.as_str());
        let seq = |m: &QueueMessage| m.attributes.as_ref().map_or(0, |a| a.sequence);
        // A real KubeMQ has been seen to repeat a sequence in one reply; ascending sequences
        // (the usual reply) cannot repeat one, so only others are checked one by one.
        let ascending = b
            .messages
            .iter()
            .zip(b.messages.iter().skip(1))
            .all(|(a, next)| seq(a) < seq(next));
        let mut seen = HashSet::new();
        let mut seqs = Vec::with_capacity(b.messages.len());
        let mut new = 0usize;
        for m in b.messages {
            let s = seq(&m);
            if !ascending && !seen.insert(s) {
                continue;
            }
            seqs.push(s);
            let arrival = if self.moved.is_empty() {
                Arrival::New
            } else {
                self.moved.fetched(s, &txn)
            };
            match arrival {
                Arrival::New => {
                    new += 1;
                    let stored_ns = m.attributes.as_ref().map_or(0, |a| a.timestamp);
                    self.buffer.push_back(Fetched {
                        transaction: txn.clone(),
                        sequence: s,
                        message: m,
                        taken: Taken::at(at.taken, at.wall_ns, stored_ns),
                    });
                }
                // Its consumer holds it: the transaction cannot be closed unchanged.
                Arrival::Bound => {
                    self.handed.insert(txn.clone());
                }
                Arrival::Settle(outcome) => {
                    self.handed.insert(txn.clone());
                    self.fresh = true;
                    self.settle.push(Settlement {
                        transaction: txn.clone(),
                        sequence: s,
                        outcome,
                    });
                }
            }
        }
        if new > 0 {
            self.stall.progressed();
        }
        if self.captures {
            self.gaps.fetched(&seqs, at.now);
        }
        let left = seqs.len();
        if left > 0 {
            self.sessions.open_txn(
                txn,
                Txn {
                    session,
                    left,
                    seqs,
                },
            );
        }
    }

    /// Ends the drains that have nothing more coming at once (FLOW-5): demand used up, or
    /// nothing ready (`ready_now` false: the backend's count says none, a Get outlived
    /// DRAIN_GRACE, or the broker is unreachable). Whether any ended.
    fn end_drains(&mut self, ready_now: bool) -> bool {
        let done = self.consumers.finish_drains(ready_now);
        let any = !done.is_empty();
        for k in done {
            self.out
                .push_back(Action::Tell(k, ToConsumer::DrainDone(k)));
        }
        any
    }

    /// Nobody can take the buffered messages: a transaction never touched goes back unchanged,
    /// leftovers of one that was partly delivered are NAcked.
    fn give_back(&mut self) {
        self.fresh = true;
        for f in self.buffer.drain(..) {
            let outcome = if self.handed.contains(&f.transaction) {
                Outcome::Nack
            } else {
                Outcome::Close
            };
            self.settle.push(Settlement {
                transaction: f.transaction,
                sequence: f.sequence,
                outcome,
            });
        }
    }

    /// Tells every consumer to end when KubeMQ refused the loop's credential: retrying cannot
    /// help, and a consumer left waiting would never learn why nothing comes.
    fn refuse_if_unauthorized(&mut self, e: &BackendError) {
        if matches!(e, BackendError::Unauthorized(_)) {
            for k in self.consumers.keys() {
                self.out.push_back(Action::Tell(k, ToConsumer::Refused(k)));
            }
        }
    }

    /// Forgets a session that failed, with its transactions: KubeMQ returns their unsettled
    /// messages to the queue, so what is buffered or pending for them goes.
    fn lose_session(&mut self, session: SessionId) {
        let gone = self.sessions.lose(session);
        let returned: usize = gone.iter().map(|(_, n)| n).sum();
        if returned > 0 {
            self.out.push_back(Action::Returned {
                session,
                count: returned,
            });
        }
        self.out.push_back(Action::Drop(session));
        for (id, _) in &gone {
            self.handed.remove(id);
        }
        let lost = |t: &Arc<str>| gone.iter().any(|(id, _)| Arc::ptr_eq(id, t));
        self.buffer.retain(|f| !lost(&f.transaction));
        self.settle.retain(|s| !lost(&s.transaction));
    }

    /// Whether message `seq` of `transaction` belongs to a transaction closed under its
    /// consumer (rehome.rs).
    fn is_moved(&self, transaction: &Arc<str>, seq: u64) -> bool {
        !self.moved.is_empty()
            && !self.sessions.txns.contains_key(transaction)
            && self.moved.tracks(seq)
    }

    /// A settlement as it is to be sent: unchanged, rewritten to the transaction its message is
    /// in now, or `None` while the message has not come back.
    fn follow(&mut self, s: Settlement) -> Option<Settlement> {
        if !self.is_moved(&s.transaction, s.sequence) {
            return Some(s);
        }
        let transaction = self.moved.settle(s.sequence, s.outcome)?;
        Some(Settlement { transaction, ..s })
    }
}

/// What a look at an idle queue asks.
enum Looked {
    /// Start or stop watching first.
    Act(Action),
    /// The watch's verdict.
    At(Look),
}

/// Whether the backend's own count says messages are ready (sent through this process and not
/// fetched yet, or given back): a Get for them returns at once.
fn ready_known(sight: &dyn Sight) -> bool {
    sight.ready().known().is_some_and(|n| n > 0) || sight.stored() > 0
}
