//! One channel's Get loop, shared by every consume link of that channel in this process
//! (docs/queues-consume-design.md): it owns the channel's downstream session, sizes Gets to the
//! links' total demand (1 while the queue looks idle, doubling after full batches), hands
//! messages out by demand, completes drains, and sends settlements grouped by transaction before
//! each Get.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::close_fence::Fences;
use super::get_gate::{GetGate, Moment, OVERLAP_WAIT};
use super::idle_watch::{Holding, IdleWatch, Look};
use super::refill_wait::RefillWait;
use super::rehome::{Arrival, Moved, StallWatch};
use crate::backend::queue_watch::QueueView;
use crate::backend::{Backend, BackendError, Downstream, ReadyHint};
use crate::bridge::caller::Caller;
use crate::engine::{Credential, FastMap};
use crate::kubemq::QueueMessage;

/// Identifies a consumer link across the process: (connection number, link id).
pub type ConsumerKey = (u64, u64);

/// A message handed to a consumer.
#[derive(Debug)]
pub struct Handout {
    /// The consumer it is for.
    pub consumer: ConsumerKey,
    /// The transaction that owns it.
    pub transaction: Arc<str>,
    /// Its sequence.
    pub sequence: u64,
    /// The message.
    pub message: QueueMessage,
    /// When the Get loop took it.
    pub taken: Taken,
}

/// When the Get loop took a message, and how long the message had waited in its queue before.
#[derive(Clone, Copy, Debug)]
pub struct Taken {
    /// When it was taken.
    pub at: std::time::Instant,
    /// From the store's timestamp of the message (`stored_ns`, Unix nanoseconds) to then.
    pub waited: std::time::Duration,
}

impl Taken {
    /// A message stored at `stored_ns` (Unix nanoseconds; 0 when unknown), taken at `at`, when
    /// the wall clock read `wall_ns`: the clocks are read once for all the messages of a Get.
    pub fn at(at: std::time::Instant, wall_ns: i64, stored_ns: i64) -> Taken {
        let waited = if stored_ns > 0 {
            u64::try_from(wall_ns.saturating_sub(stored_ns)).unwrap_or(0)
        } else {
            0
        };
        Taken {
            at,
            waited: std::time::Duration::from_nanos(waited),
        }
    }

    /// A message stored at `stored_ns`, taken now.
    pub fn now(stored_ns: i64) -> Taken {
        Taken::at(std::time::Instant::now(), crate::store::now_ns(), stored_ns)
    }
}

/// What the fetcher sends to a consumer's connection.
#[derive(Debug)]
pub enum ToConsumer {
    /// Messages to deliver within credit, in order (one send per hand-out round, not per
    /// message).
    Messages(Vec<Handout>),
    /// The consumer's drain is complete: everything immediately available was handed out.
    DrainDone(ConsumerKey),
    /// The loop has processed the consumer's Leave: nothing more comes for it.
    Left(ConsumerKey),
    /// KubeMQ refused the credential the loop's calls carry: the consumer's link is to end
    /// with `amqp:unauthorized-access`.
    Refused(ConsumerKey),
}

/// How a delivery ends (Q-20 … Q-25).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// AckRange: gone for good.
    Ack,
    /// NAckRange: back to the tail with ReceiveCount + 1.
    Nack,
    /// CloseByClient on the whole transaction: back unchanged (only for transactions none of
    /// whose messages were handed out).
    Close,
}

/// A settled delivery: which message of which transaction, and how it ended.
#[derive(Debug, Clone)]
pub struct Settlement {
    /// The transaction that owns the message.
    pub transaction: Arc<str>,
    /// The message's sequence.
    pub sequence: u64,
    /// How it was settled.
    pub outcome: Outcome,
}

/// What consumers tell the fetcher.
#[derive(Debug)]
pub enum Command {
    /// A consumer joined; its messages go to `to`.
    Join(ConsumerKey, mpsc::UnboundedSender<ToConsumer>),
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

/// A consumer's demand (credit it can still use) as an absolute value, and how many hand-outs
/// it had taken when it computed it: hand-outs still on their way are not demand any more.
#[derive(Debug, Clone, Copy)]
pub struct DemandReport {
    /// Who reports.
    pub consumer: ConsumerKey,
    /// Deliveries it can still take.
    pub credit: u32,
    /// Hand-outs it had taken when it computed `credit`.
    pub taken: u64,
}

/// Batch size limits of the adaptive Get.
#[derive(Debug, Clone, Copy)]
pub struct FetchLimits {
    /// Largest MaxItems per Get.
    pub max_batch: u32,
    /// How long a loop with no consumer and nothing held lives before it ends and closes its
    /// downstream session.
    pub idle_exit: std::time::Duration,
}

/// Loops without consumers kept waiting for one; past this many, a loop whose last consumer
/// leaves ends at once, so that consumers on ever new queue names leave nothing behind.
pub const MAX_IDLE_LOOPS: usize = 256;

/// Every running loop, by channel and credential, and how many of them are idle.
pub type Registry = Arc<Loops>;

/// The running loops: a loop is started and joined under the lock, and retires under it, so a
/// consumer can never join a loop that is ending.
#[derive(Debug, Default)]
pub struct Loops {
    map: std::sync::Mutex<HashMap<LoopKey, mpsc::UnboundedSender<Command>>>,
    idle: std::sync::atomic::AtomicUsize,
}

impl Loops {
    /// The loops by key, locked.
    pub fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<LoopKey, mpsc::UnboundedSender<Command>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one more idle loop; `kept` says whether it may wait for a consumer.
    fn idle(self: &Arc<Self>) -> Idle {
        let n = self.idle.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        Idle {
            loops: self.clone(),
            kept: n <= MAX_IDLE_LOOPS,
        }
    }
}

/// One loop's place among the idle ones, given back when dropped.
struct Idle {
    loops: Arc<Loops>,
    kept: bool,
}

impl Drop for Idle {
    fn drop(&mut self) {
        self.loops
            .idle
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// What a Get loop serves: a channel, for the consumers presenting one credential and one
/// ClientID to KubeMQ (`None` and [`Caller::Connector`]: the connector's own), so no consumer
/// takes messages under another's token or name (AUTHZ-9).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoopKey {
    /// The queue.
    pub channel: String,
    /// The token its calls carry.
    pub credential: Option<Credential>,
    /// Who its Gets are made as.
    pub caller: Caller,
}

impl LoopKey {
    /// The loop of `channel` for consumers whose calls carry the connector's own token and name.
    pub fn shared(channel: &str) -> LoopKey {
        LoopKey {
            channel: channel.to_string(),
            credential: None,
            caller: Caller::Connector,
        }
    }
}

/// Joins `key` to the loop of `loop_key` (starting one on `backend` if none runs) and returns
/// the loop's command channel.
pub fn join<B: Backend>(
    registry: &Registry,
    backend: &Arc<B>,
    loop_key: LoopKey,
    limits: FetchLimits,
    key: ConsumerKey,
    to: mpsc::UnboundedSender<ToConsumer>,
) -> mpsc::UnboundedSender<Command> {
    let mut map = registry.lock();
    if let Some(tx) = map.get(&loop_key) {
        if tx.send(Command::Join(key, to.clone())).is_ok() {
            return tx.clone();
        }
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(Command::Join(key, to));
    tokio::spawn(run(
        backend.clone(),
        loop_key.clone(),
        limits,
        rx,
        registry.clone(),
    ));
    map.insert(loop_key, tx.clone());
    tx
}

struct Consumer {
    demand: u32,
    draining: bool,
    /// Messages handed to it so far.
    handed: u64,
    to: mpsc::UnboundedSender<ToConsumer>,
}

impl Consumer {
    /// Demand as the consumer reported it, less what was handed out after it counted.
    fn set_demand(&mut self, credit: u32, taken: u64) {
        let on_the_way = u32::try_from(self.handed.saturating_sub(taken)).unwrap_or(u32::MAX);
        self.demand = credit.saturating_sub(on_the_way);
    }
}

/// Downstream sessions a loop keeps at most: a Get goes on one with no open transaction while
/// there is one, so consumers holding deliveries of a few Gets never make settlements wait.
const MAX_SESSIONS: usize = 4;

/// One of the loop's downstream sessions.
struct Session<D> {
    id: u64,
    /// `None` while lent to the running Get.
    d: Option<D>,
    /// Its open transactions (messages returned and not all settled).
    open: usize,
}

/// An open transaction: the session that owns it, how many of its messages are unsettled, and
/// their sequences (to bind them to their deliveries if it is closed under its consumers).
struct Txn {
    session: u64,
    left: usize,
    seqs: Vec<u64>,
}

/// A fetched message not yet handed to a consumer: (transaction, sequence, message).
/// A fetched message waiting in the buffer for a consumer with demand.
#[derive(Debug)]
struct Fetched {
    transaction: Arc<str>,
    sequence: u64,
    message: QueueMessage,
    taken: Taken,
}

/// How long a drain waits for a Get to answer before it counts as "nothing more is immediately
/// available" (FLOW-5), when the backend cannot say how many messages are ready. KubeMQ answers a
/// Get for messages that are there within a few milliseconds (KMQ-10: p99 2.4 ms); a Get
/// still waiting after this is waiting for messages that do not exist yet.
pub const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

/// Runs the loop for `channel` until it has had no consumer and nothing pending for
/// `limits.idle_exit`.
async fn run<B: Backend>(
    backend: Arc<B>,
    key: LoopKey,
    limits: FetchLimits,
    rx: mpsc::UnboundedReceiver<Command>,
    registry: Registry,
) {
    Fetcher::new(backend, key, limits, registry).run(rx).await
}

/// The loop's state: who wants how much, what was fetched and not handed out, what was settled
/// and not yet sent.
struct Fetcher<B: Backend> {
    backend: Arc<B>,
    limits: FetchLimits,
    consumers: FastMap<ConsumerKey, Consumer>,
    /// Round-robin order of hand-out.
    order: VecDeque<ConsumerKey>,
    buffer: VecDeque<Fetched>,
    settle: Vec<Settlement>,
    /// Transactions some of whose messages were handed out (those cannot be closed unchanged).
    handed: HashSet<Arc<str>, foldhash::fast::RandomState>,
    /// The loop's downstream sessions: a Get goes on one with no open transaction, so that
    /// settlements never wait behind it (KMQ-5).
    sessions: Vec<Session<B::Downstream>>,
    /// Open transactions: which session owns each and how many of its messages are unsettled.
    txns: FastMap<Arc<str>, Txn>,
    next_session: u64,
    /// The next Get's size when the backend gives no ready count: 1 while the queue looks idle,
    /// doubling after every full Get.
    batch: u32,
    /// Where this loop is registered; it removes itself when it retires.
    registry: Registry,
    /// The channel it fetches from, and the credential its calls carry.
    key: LoopKey,
    /// The wait for the consumers' credit after a large Get.
    refill_wait: Option<RefillWait>,
    /// Holds back a Get that would wait while transactions are open.
    gate: GetGate,
    /// Answers that tell the transactions closed so far are closed (close_fence.rs).
    closing: Fences,
    /// When to close transactions held by consumers that wait for more (rehome.rs).
    stall: StallWatch,
    /// Messages of transactions closed under their consumers, until they come back.
    moved: Moved<Outcome>,
    /// Messages the next Get is to bring back on top of the demand (those just given back).
    rehome_want: u32,
    /// The queue's view while the loop watches it (idle_watch.rs).
    view: Option<tokio::sync::watch::Receiver<QueueView>>,
    /// What the loop made of its views so far.
    idle: Option<IdleWatch>,
    /// Whether the backend may give a view (false once it said it has none).
    watchable: bool,
    /// The size of the next Get as the view gave it, until that Get goes.
    looked: Option<u32>,
}

/// An instant no wait reaches (a timer that is never armed).
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + std::time::Duration::from_secs(86_400 * 365)
}

impl<B: Backend> Fetcher<B> {
    fn new(backend: Arc<B>, key: LoopKey, limits: FetchLimits, registry: Registry) -> Self {
        Fetcher {
            key,
            limits,
            consumers: FastMap::default(),
            order: VecDeque::new(),
            buffer: VecDeque::new(),
            settle: Vec::new(),
            handed: HashSet::default(),
            sessions: Vec::new(),
            txns: FastMap::default(),
            next_session: 0,
            batch: 1,
            registry,
            refill_wait: None,
            gate: GetGate::new(backend.ready_changes()),
            closing: Fences::default(),
            stall: StallWatch::default(),
            moved: Moved::default(),
            rehome_want: 0,
            view: None,
            idle: None,
            watchable: true,
            looked: None,
            backend,
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            // Take every command that is already waiting.
            while let Ok(cmd) = rx.try_recv() {
                self.apply(cmd);
            }
            if self.buffer.is_empty() {
                // Only buffered messages are ever closed unchanged; with none left, forget.
                self.handed.clear();
            }
            self.hand_out();
            self.finish_drains(false);
            if !self.settle.is_empty() {
                // Boxed here and below: the loop's own future stays small while it waits, and
                // a loop is kept for every queue with consumers (and some idle ones).
                Box::pin(self.flush()).await;
            }
            if self.consumers.is_empty() && self.buffer.is_empty() && self.settle.is_empty() {
                // Everyone left and nothing is held: wait for a new consumer, or retire (at
                // once when enough loops wait already). Nobody needs the queue watched.
                self.view = None;
                let idle = self.registry.idle();
                let wait = if idle.kept {
                    self.limits.idle_exit
                } else {
                    std::time::Duration::ZERO
                };
                let next = tokio::time::timeout(wait, rx.recv()).await;
                drop(idle);
                match next {
                    Ok(Some(cmd)) => self.apply(cmd),
                    Ok(None) => return,
                    Err(_) if self.retire(&mut rx) => return,
                    Err(_) => {}
                }
                continue;
            }
            if self.consumers.is_empty() && !self.buffer.is_empty() {
                self.give_back();
                continue;
            }
            let demand = self.demand();
            if demand == 0 || !self.buffer.is_empty() {
                self.stall.calm();
                match rx.recv().await {
                    Some(cmd) => self.apply(cmd),
                    None => return,
                }
                continue;
            }
            // After a large Get, the next waits (briefly) for the consumers' credit to come back
            // whole, unless what is back already takes everything ready; a drain never waits
            // (FLOW-5).
            if let Some(m) = self.refill_wait {
                let draining = self.consumers.values().any(|c| c.draining);
                let ready = self.backend.ready_hint(&self.key.channel).known();
                if !draining && !m.over(demand as usize, ready) {
                    tokio::select! {
                        cmd = rx.recv() => match cmd {
                            Some(cmd) => self.apply(cmd),
                            None => return,
                        },
                        _ = tokio::time::sleep_until(m.until()) => {}
                    }
                    continue;
                }
                self.refill_wait = None;
            }
            // No Get joins KubeMQ's queue group while a close before it may still be under
            // way (close_fence.rs).
            if !self.closing.is_empty() {
                tokio::select! {
                    cmd = rx.recv() => match cmd {
                        Some(cmd) => self.apply(cmd),
                        None => return,
                    },
                    () = self.closing.next() => {}
                }
                continue;
            }
            let at = Moment {
                captures: self.backend.captures(),
                open: !self.txns.is_empty(),
                draining: self.consumers.values().any(|c| c.draining),
            };
            // Consumers with credit that hold every open transaction and got nothing new for a
            // while may be waiting for messages those transactions hide (rehome.rs).
            let stuck = at.captures && at.open && !at.draining;
            if self.stall.due(stuck, tokio::time::Instant::now()) {
                Box::pin(self.re_home()).await;
                continue;
            }
            // An idle queue is watched, not waited on with a Get (idle_watch.rs, KMQ-21).
            if self.looked.is_none() && !at.draining && self.rehome_want == 0 {
                match self.look() {
                    Some(Look::Watch(until)) => {
                        let Some(view) = self.view.as_mut() else {
                            continue;
                        };
                        let timer = tokio::time::sleep_until(until.unwrap_or_else(far_future));
                        tokio::select! {
                            cmd = rx.recv() => match cmd {
                                Some(cmd) => self.apply(cmd),
                                None => return,
                            },
                            changed = view.changed() => if changed.is_err() {
                                // The backend stopped watching: Gets wait again.
                                self.view = None;
                                self.watchable = false;
                            },
                            _ = timer, if until.is_some() => {}
                        }
                        continue;
                    }
                    // Kept until the Get goes, whatever holds it back before.
                    Some(Look::Get(n)) => self.looked = Some(n),
                    Some(Look::Blind) | None => {}
                }
            }
            // A Get that would wait is held back while transactions are open (get_gate.rs).
            let (backend, channel) = (&self.backend, &self.key.channel);
            let held = self.gate.hold(at, || backend.stored_hint(channel) > 0);
            if let Some(until) = held {
                tokio::select! {
                    cmd = rx.recv() => match cmd {
                        Some(cmd) => self.apply(cmd),
                        None => return,
                    },
                    _ = self.gate.ready_rose() => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
                continue;
            }
            let (sid, mut d) = match self.lend_session() {
                Some(lent) => lent,
                None => match Box::pin(self.backend.open_downstream()).await {
                    Ok(d) => {
                        self.next_session += 1;
                        self.sessions.push(Session {
                            id: self.next_session,
                            d: None,
                            open: 0,
                        });
                        (self.next_session, d)
                    }
                    Err(e) => {
                        self.refuse_if_unauthorized(&e);
                        tracing::warn!(channel = %self.key.channel, error = %e, "cannot open a downstream session; retrying");
                        // Nothing is available while the broker is unreachable.
                        self.finish_drains(true);
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        continue;
                    }
                },
            };
            let mut want = match self.looked.take() {
                Some(n) => n.min(demand.min(self.limits.max_batch)).max(1),
                None => self.get_size(demand),
            };
            if self.rehome_want > 0 {
                // Everything the closed transactions held comes to this Get's member at once;
                // what is beyond its MaxItems would stay hidden in it.
                want = want
                    .saturating_add(std::mem::take(&mut self.rehome_want))
                    .min(self.limits.max_batch.max(1));
            }
            let stored = self.backend.stored_hint(&self.key.channel);
            if at.captures && at.open && stored > 0 {
                // Beside open transactions, a Get asks only for what is stored, so that it
                // cannot wait (get_gate.rs).
                want = want.min(u32::try_from(stored).unwrap_or(u32::MAX));
            }
            // A Get for stored messages answers within a few milliseconds; a close sent while it
            // is out could stall it for 100 ms (close_fence.rs), so settlements wait for it,
            // unless it turns out to be waiting after all.
            let prompt = at.captures && u64::from(want) <= stored;
            let overlap = tokio::time::sleep(if prompt {
                OVERLAP_WAIT
            } else {
                std::time::Duration::ZERO
            });
            tokio::pin!(overlap);
            let mut overlapped = !prompt;
            // Commands that arrive while the Get waits are queued, not lost; settlements wait for
            // it because the stream processes requests in order anyway (KMQ-5).
            let channel = self.key.channel.clone();
            let caller = self.key.caller.clone();
            let asked = tokio::time::Instant::now();
            let got = {
                let mut get = Box::pin(d.get(&channel, caller.get_client_id(), want as i32, 1000));
                let grace = tokio::time::sleep(DRAIN_GRACE);
                tokio::pin!(grace);
                let mut graced = false;
                loop {
                    tokio::select! {
                        r = &mut get => break r,
                        cmd = rx.recv() => match cmd {
                            Some(cmd) => {
                                self.apply(cmd);
                                // Settlements of other sessions' transactions go once the Get
                                // is known to wait: on a real KubeMQ, what they free may be
                                // held until they are sent.
                                if overlapped && !self.settle.is_empty() {
                                    Box::pin(self.flush()).await;
                                }
                                // A drain that arrives once the Get has outlived the grace has
                                // nothing immediately available either.
                                if graced {
                                    self.finish_drains(true);
                                }
                            }
                            None => return,
                        },
                        _ = &mut overlap, if !overlapped => {
                            overlapped = true;
                            if !self.settle.is_empty() {
                                Box::pin(self.flush()).await;
                            }
                        }
                        // A Get still waiting this long has nothing immediately available for a
                        // drain; whatever it brings later is held for the next credit.
                        _ = &mut grace, if !graced => {
                            graced = true;
                            self.finish_drains(true);
                        }
                    }
                }
            };
            tracing::trace!(
                channel = %self.key.channel,
                session = sid,
                want,
                stored,
                open = self.txns.len(),
                got = got.as_ref().map_or(-1, |b| b.messages.len() as i64),
                waited_us = asked.elapsed().as_micros() as u64,
                "Get answered"
            );
            match got {
                Ok(b) => {
                    self.refill_wait = RefillWait::after(b.messages.len(), demand as usize);
                    if let Some(idle) = self.idle.as_mut() {
                        let last = b
                            .messages
                            .iter()
                            .filter_map(|m| m.attributes.as_ref().map(|a| a.sequence))
                            .max();
                        let now = tokio::time::Instant::now();
                        idle.answered(want, b.messages.len(), last, now);
                    }
                    self.take_batch(b, want, sid);
                    self.give_session_back(sid, d);
                }
                Err(e) => {
                    self.refuse_if_unauthorized(&e);
                    // The session is gone, and with it its transactions: KubeMQ returns their
                    // messages, so whatever is buffered or pending for them is dropped here.
                    tracing::warn!(channel = %self.key.channel, error = %e, "Get failed; reopening the session");
                    self.lose_session(sid, d);
                    self.batch = 1;
                    self.finish_drains(true);
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Whether the backend's own count says messages are ready (sent through this process and
    /// not fetched yet, or given back): a Get for them returns at once.
    fn ready_known(&self) -> bool {
        let channel = &self.key.channel;
        self.backend
            .ready_hint(channel)
            .known()
            .is_some_and(|n| n > 0)
            || self.backend.stored_hint(channel) > 0
    }

    /// What to do before the next Get (idle_watch.rs): `None` to Get as the backend's own
    /// count says (it knows of messages ready, or it has no watch: a Get that waits costs
    /// nothing there). The loop holds its queue's view only while it watches, so the backend
    /// asks the broker only about queues that stay idle.
    fn look(&mut self) -> Option<Look> {
        if !self.watchable {
            return None;
        }
        if self.ready_known() {
            self.view = None;
            return None;
        }
        if self.view.is_none() {
            let Some(view) = self.backend.watch_queue(&self.key.channel) else {
                self.watchable = false;
                return None;
            };
            // What this process sent before now is in the backend's count, read again below
            // after the view exists, so no send falls between the two.
            let touched = view.borrow().touched;
            self.idle
                .get_or_insert_with(|| IdleWatch::new(touched))
                .skip_touches(touched);
            self.view = Some(view);
            if self.ready_known() {
                self.view = None;
                return None;
            }
        }
        let held = self.txns.values().map(|t| t.left as u64).sum();
        let view = *self.view.as_mut()?.borrow_and_update();
        let now = tokio::time::Instant::now();
        Some(self.idle.as_mut()?.look(&view, Holding { held, now }))
    }

    /// Tells every consumer to end when KubeMQ refused the loop's credential: retrying cannot
    /// help, and a consumer left waiting would never learn why nothing comes.
    fn refuse_if_unauthorized(&self, e: &BackendError) {
        if matches!(e, BackendError::Unauthorized(_)) {
            for (key, c) in &self.consumers {
                let _ = c.to.send(ToConsumer::Refused(*key));
            }
        }
    }

    /// A session for the next Get, taken out of its slot: one with no open transaction, or
    /// `None` to open another while fewer than [`MAX_SESSIONS`] are open; past that, the one
    /// with the fewest (its settlements then wait for the Get, as on a single stream).
    fn lend_session(&mut self) -> Option<(u64, B::Downstream)> {
        let free = self.sessions.iter().position(|s| s.open == 0);
        let at = match free {
            Some(at) => at,
            None if self.sessions.len() < MAX_SESSIONS => return None,
            None => self
                .sessions
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.open)
                .map(|(at, _)| at)?,
        };
        let slot = self.sessions.get_mut(at)?;
        Some((slot.id, slot.d.take()?))
    }

    /// Puts a session back after its Get. Sessions stay open until the loop retires: settlements
    /// get no reply, so one closed just after its last settlement was sent could cancel the
    /// stream before KubeMQ read it, and KubeMQ would hand those messages out again.
    fn give_session_back(&mut self, sid: u64, d: B::Downstream) {
        if let Some(slot) = self.sessions.iter_mut().find(|s| s.id == sid) {
            slot.d = Some(d);
        }
    }

    /// Forgets a session that failed, with its transactions: KubeMQ returns their unsettled
    /// messages to the queue, so what is buffered or pending for them goes.
    fn lose_session(&mut self, sid: u64, mut d: B::Downstream) {
        self.sessions.retain(|s| s.id != sid);
        let gone: Vec<(Arc<str>, usize)> = self
            .txns
            .iter()
            .filter(|(_, t)| t.session == sid)
            .map(|(id, t)| (id.clone(), t.left))
            .collect();
        let returned: usize = gone.iter().map(|(_, n)| n).sum();
        if returned > 0 {
            d.returned(&self.key.channel, returned);
        }
        for (id, _) in &gone {
            self.txns.remove(id);
            self.handed.remove(id);
        }
        let lost = |t: &Arc<str>| gone.iter().any(|(id, _)| Arc::ptr_eq(id, t));
        self.buffer.retain(|f| !lost(&f.transaction));
        self.settle.retain(|s| !lost(&s.transaction));
    }

    /// Sends pending settlements on the sessions that own their transactions: per transaction
    /// and outcome one request, sequences de-duplicated and ascending (Q-27; a duplicate would
    /// make KubeMQ fail the rest of the range). Those of the session lent to a running Get wait
    /// for it; a session whose stream is lost is forgotten with its transactions.
    async fn flush(&mut self) {
        // One Arc per transaction (take_batch), so its address names it: sorted by it, a
        // transaction's settlements lie together without hashing its id for each.
        self.settle.sort_unstable_by_key(|s| {
            let txn = Arc::as_ptr(&s.transaction) as *const u8 as usize;
            (txn, s.outcome as u8, s.sequence)
        });
        let settle = std::mem::take(&mut self.settle);
        let whole = self.backend.captures();
        let mut lost: Vec<u64> = Vec::new();
        let mut closed: Vec<(u64, Arc<str>)> = Vec::new();
        for of_txn in settle.chunk_by(|a, b| Arc::ptr_eq(&a.transaction, &b.transaction)) {
            let Some(txn) = of_txn.first().and_then(|s| self.txns.get(&s.transaction)) else {
                // Its session was lost: KubeMQ gave its messages back already.
                continue;
            };
            // On a backend that captures, a partly settled transaction would take ready
            // messages into the room its settlements free and hide them until it closes: its
            // settlements wait until all of its messages are settled.
            if whole && of_txn.len() < txn.left {
                self.settle.extend_from_slice(of_txn);
                continue;
            }
            for group in of_txn.chunk_by(|a, b| a.outcome == b.outcome) {
                self.send_settlements(group, &mut lost, &mut closed).await;
            }
        }
        // One answer per session tells when KubeMQ has closed what was closed on it.
        closed.sort_unstable_by_key(|(sid, _)| *sid);
        closed.dedup_by_key(|(sid, _)| *sid);
        for (sid, t) in closed {
            if lost.contains(&sid) {
                continue;
            }
            let Some(d) = self
                .sessions
                .iter_mut()
                .find(|s| s.id == sid)
                .and_then(|s| s.d.as_mut())
            else {
                continue;
            };
            match d.handled(&t).await {
                Ok(h) => self.closing.push(h),
                Err(_) => lost.push(sid),
            }
        }
        lost.sort_unstable();
        lost.dedup();
        for sid in lost {
            let at = self.sessions.iter().position(|s| s.id == sid);
            if let Some(d) = at
                .and_then(|at| self.sessions.get_mut(at))
                .and_then(|s| s.d.take())
            {
                self.lose_session(sid, d);
            }
        }
    }

    /// Sends one transaction's settlements of one outcome on the session that owns it (or keeps
    /// them for after the running Get); a session whose send fails goes into `lost`, a
    /// transaction that this closes on a backend that captures into `closed`.
    async fn send_settlements(
        &mut self,
        group: &[Settlement],
        lost: &mut Vec<u64>,
        closed: &mut Vec<(u64, Arc<str>)>,
    ) {
        let Some(Settlement {
            transaction: t,
            outcome: o,
            ..
        }) = group.first()
        else {
            return;
        };
        let o = *o;
        let Some(txn) = self.txns.get(t) else {
            return;
        };
        let sid = txn.session;
        if lost.contains(&sid) {
            // Failed earlier in this flush: it is forgotten with its transactions below.
            return;
        }
        let Some(slot) = self.sessions.iter_mut().find(|s| s.id == sid) else {
            return;
        };
        let Some(d) = slot.d.as_mut() else {
            // Lent to the running Get: after it.
            self.settle.extend_from_slice(group);
            return;
        };
        let mut seqs: Vec<u64> = group.iter().map(|s| s.sequence).collect();
        seqs.dedup();
        let r = match o {
            Outcome::Ack => d.ack(t, &seqs).await,
            Outcome::Nack => d.nack(t, &seqs).await,
            Outcome::Close => d.close(t).await,
        };
        if let Err(e) = r {
            tracing::warn!(transaction = %t, error = %e, "settlement failed; KubeMQ returns the messages when the session ends");
            lost.push(sid);
            return;
        }
        if o != Outcome::Ack {
            d.returned(&self.key.channel, seqs.len());
        }
        let done = match self.txns.get_mut(t) {
            Some(txn) if o == Outcome::Close => {
                txn.left = 0;
                true
            }
            Some(txn) => {
                txn.left = txn.left.saturating_sub(seqs.len());
                txn.left == 0
            }
            None => false,
        };
        // On KubeMQ a message can join a transaction after its Get was answered (one that
        // arrives as the Get times out, KMQ-18): the loop never saw it, so settling what it saw
        // leaves the transaction open, and that message hidden, for as long as the session
        // lives. Closing the transaction gives such a message back; for one already closed it
        // does nothing.
        if done && o != Outcome::Close && self.backend.captures() {
            if let Err(e) = d.close(t).await {
                tracing::warn!(transaction = %t, error = %e, "closing a settled transaction failed; KubeMQ returns what it held when the session ends");
                lost.push(sid);
            }
        }
        if done {
            if self.backend.captures() {
                closed.push((sid, t.clone()));
            }
            self.txns.remove(t);
            slot.open = slot.open.saturating_sub(1);
        }
    }

    /// Ends this loop if nothing arrived meanwhile: under the registry's lock (the lock joins
    /// take), so no consumer can join a loop that is ending. Dropping the sessions returns
    /// whatever they still had locked.
    fn retire(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) -> bool {
        let mut map = self.registry.lock();
        match rx.try_recv() {
            Ok(cmd) => {
                drop(map);
                self.apply(cmd);
                false
            }
            Err(_) => {
                rx.close();
                if map.get(&self.key).is_some_and(|tx| tx.is_closed()) {
                    map.remove(&self.key);
                }
                tracing::debug!(channel = %self.key.channel, "Get loop idle; ending it");
                true
            }
        }
    }

    /// Total demand of every consumer.
    fn demand(&self) -> u32 {
        self.consumers
            .values()
            .map(|c| c.demand)
            .fold(0u32, u32::saturating_add)
    }

    /// With an exact count of ready messages, ask for just those (or 1 to wait for the next);
    /// with an estimate, the same (a Get for more than is there holds them a whole WaitTimeout;
    /// an estimate of 0 — drained, nothing on its way — asks for 1); otherwise the adaptive
    /// batch, or 1 at a time while a drain is on: a Get for more than is there would outlive
    /// DRAIN_GRACE and end the drain with messages still waiting. Never more than the demand
    ///
    fn get_size(&self, demand: u32) -> u32 {
        let cap = demand.min(self.limits.max_batch);
        let count = |n: u64| cap.min(u32::try_from(n).unwrap_or(u32::MAX)).max(1);
        match self.backend.ready_hint(&self.key.channel).known() {
            Some(ready) => count(ready),
            None if self.consumers.values().any(|c| c.draining) => 1,
            None => cap.min(self.batch).max(1),
        }
    }

    /// Buffers a Get's messages and adapts the next batch size.
    fn take_batch(&mut self, b: crate::backend::Batch, want: u32, session: u64) {
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
        let (taken_at, wall_ns) = (std::time::Instant::now(), crate::store::now_ns());
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
                        taken: Taken::at(taken_at, wall_ns, stored_ns),
                    });
                }
                // Its consumer holds it: the transaction cannot be closed unchanged.
                Arrival::Bound => {
                    self.handed.insert(txn.clone());
                }
                Arrival::Settle(outcome) => {
                    self.handed.insert(txn.clone());
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
        let left = seqs.len();
        if left > 0 {
            self.txns.insert(
                txn,
                Txn {
                    session,
                    left,
                    seqs,
                },
            );
            if let Some(slot) = self.sessions.iter_mut().find(|s| s.id == session) {
                slot.open += 1;
            }
        }
    }

    /// Completes the drains that have nothing more coming at once (FLOW-5): demand used up, or
    /// nothing ready — known from the backend's ready count, or, without one, because
    /// `nothing_more` says a Get outlived DRAIN_GRACE or the broker is unreachable.
    fn finish_drains(&mut self, nothing_more: bool) {
        // Runs on every turn of the loop: ask the backend only when someone drains.
        if !self.consumers.values().any(|c| c.draining) {
            return;
        }
        let ready_now = !nothing_more
            && self.buffer.is_empty()
            && self.backend.ready_hint(&self.key.channel) != ReadyHint::Exact(0);
        for (k, c) in self.consumers.iter_mut() {
            if c.draining && (c.demand == 0 || !ready_now) {
                c.draining = false;
                c.demand = 0;
                let _ = c.to.send(ToConsumer::DrainDone(*k));
            }
        }
    }

    /// Nobody can take the buffered messages: a transaction never touched goes back unchanged,
    /// leftovers of one that was partly delivered are NAcked.
    fn give_back(&mut self) {
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

    fn apply(&mut self, cmd: Command) {
        match cmd {
            Command::Join(k, to) => {
                self.consumers.insert(
                    k,
                    Consumer {
                        demand: 0,
                        draining: false,
                        handed: 0,
                        to,
                    },
                );
                self.order.push_back(k);
            }
            Command::Demand(d) => {
                if let Some(c) = self.consumers.get_mut(&d.consumer) {
                    if !c.draining {
                        c.set_demand(d.credit, d.taken);
                    }
                }
            }
            Command::Drain(d) => {
                if let Some(c) = self.consumers.get_mut(&d.consumer) {
                    c.set_demand(d.credit, d.taken);
                    c.draining = true;
                }
            }
            Command::Leave(k) => {
                if let Some(c) = self.consumers.remove(&k) {
                    // Behind every hand-out sent to it on the same channel.
                    let _ = c.to.send(ToConsumer::Left(k));
                }
                self.order.retain(|x| *x != k);
            }
            Command::Settle(mut settled) => {
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
            Command::Return(h) => {
                let mut h = *h;
                if self.is_moved(&h.transaction, h.sequence) {
                    match self.moved.returned(h.sequence) {
                        Some(now_in) => h.transaction = now_in,
                        // Still out at KubeMQ: handed out afresh when it comes back.
                        None => return,
                    }
                }
                self.handed.insert(h.transaction.clone());
                self.put_back(Fetched {
                    transaction: h.transaction,
                    sequence: h.sequence,
                    message: h.message,
                    taken: h.taken,
                });
            }
        }
    }

    /// Whether message `seq` of `transaction` belongs to a transaction closed under its
    /// consumer (rehome.rs).
    fn is_moved(&self, transaction: &Arc<str>, seq: u64) -> bool {
        !self.moved.is_empty() && !self.txns.contains_key(transaction) && self.moved.tracks(seq)
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

    /// Closes every open transaction while the consumers hold their messages, so that KubeMQ
    /// gives back whatever those transactions hide (KMQ-20, rehome.rs). Only called between
    /// Gets, with nothing buffered: every message of these transactions is at a consumer.
    async fn re_home(&mut self) {
        let now = tokio::time::Instant::now();
        self.moved.forget_old(now);
        let closing: Vec<(Arc<str>, Txn)> = self.txns.drain().collect();
        let mut held = 0usize;
        for (_, t) in &closing {
            for &s in &t.seqs {
                self.moved.out(s, now);
            }
            held += t.seqs.len();
        }
        // Settlements still waiting for the rest of their transaction now wait for their message
        // to come back.
        for s in std::mem::take(&mut self.settle) {
            if let Some(s) = self.follow(s) {
                self.settle.push(s);
            }
        }
        let mut lost: Vec<u64> = Vec::new();
        for (t, txn) in &closing {
            let Some(slot) = self.sessions.iter_mut().find(|s| s.id == txn.session) else {
                continue;
            };
            slot.open = slot.open.saturating_sub(1);
            let Some(d) = slot.d.as_mut() else {
                continue;
            };
            if lost.contains(&slot.id) {
                continue;
            }
            match d.close(t).await {
                Ok(()) => d.returned(&self.key.channel, txn.seqs.len()),
                Err(e) => {
                    tracing::warn!(channel = %self.key.channel, transaction = %t, error = %e, "closing a held transaction failed; KubeMQ returns its messages when the session ends");
                    lost.push(slot.id);
                }
            }
        }
        for sid in lost {
            let d = self
                .sessions
                .iter_mut()
                .find(|s| s.id == sid)
                .and_then(|s| s.d.take());
            if let Some(d) = d {
                self.lose_session(sid, d);
            }
        }
        self.handed.clear();
        self.rehome_want = u32::try_from(held).unwrap_or(u32::MAX);
        self.stall.rounded();
        tracing::info!(
            channel = %self.key.channel,
            transactions = closing.len(),
            messages = held,
            "consumers with credit got nothing new while holding every open transaction: closed those so that KubeMQ gives back what they hide (KMQ-20)"
        );
    }

    /// Hands buffered messages to consumers with demand, round robin, one send per consumer.
    fn hand_out(&mut self) {
        // A few consumers at most per round: found by a look along the list, not hashed per
        // message.
        let mut batches: Vec<(ConsumerKey, Vec<Handout>)> = Vec::new();
        let mut last_handed: Option<Arc<str>> = None;
        let mut idle_rounds = 0;
        while !self.buffer.is_empty() && idle_rounds < self.order.len() {
            let Some(k) = self.order.pop_front() else {
                break;
            };
            self.order.push_back(k);
            let Some(c) = self.consumers.get_mut(&k) else {
                continue;
            };
            if c.demand == 0 {
                idle_rounds += 1;
                continue;
            }
            idle_rounds = 0;
            let Some(Fetched {
                transaction,
                sequence,
                message,
                taken,
            }) = self.buffer.pop_front()
            else {
                break;
            };
            c.demand -= 1;
            c.handed += 1;
            // Messages of one transaction come in a run: note it once per run.
            if last_handed
                .as_ref()
                .is_none_or(|t| !Arc::ptr_eq(t, &transaction))
            {
                self.handed.insert(transaction.clone());
                last_handed = Some(transaction.clone());
            }
            let h = Handout {
                consumer: k,
                transaction,
                sequence,
                message,
                taken,
            };
            match batches.iter_mut().find(|(key, _)| *key == k) {
                Some((_, batch)) => batch.push(h),
                None => batches.push((k, vec![h])),
            }
        }
        for (k, batch) in batches {
            let Some(c) = self.consumers.get_mut(&k) else {
                continue;
            };
            if let Err(mpsc::error::SendError(ToConsumer::Messages(batch))) =
                c.to.send(ToConsumer::Messages(batch))
            {
                // The connection is gone: keep the messages for someone else.
                c.demand = 0;
                for h in batch {
                    self.put_back(Fetched {
                        transaction: h.transaction,
                        sequence: h.sequence,
                        message: h.message,
                        taken: h.taken,
                    });
                }
            }
        }
    }

    /// Puts a message that was handed out back into the buffer in queue order (sequences
    /// ascend along the queue), so messages returned one by one keep their order.
    fn put_back(&mut self, m: Fetched) {
        let at = self.buffer.partition_point(|f| f.sequence < m.sequence);
        self.buffer.insert(at, m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::double::{Double, Overrides};
    use crate::backend::embedded::Embedded;
    use crate::kubemq::QueuesDownstreamRequestType as Op;
    use crate::store::Store;

    /// Q-12 as decided (docs/queues-consume-design.md): a Get never asks for more than the
    /// backend says is ready when it knows, exactly or by its own count; without a count it
    /// follows the adaptive batch, and while a drain is on it asks for one. Always within the
    /// demand and the ceiling.
    #[test]
    fn get_size_follows_the_ready_hint() {
        let dir = tempfile::tempdir().expect("dir");
        let (store, _) = Store::open(dir.path()).expect("store");
        let limits = FetchLimits {
            max_batch: 500,
            idle_exit: std::time::Duration::from_secs(60),
        };
        let size = |hint, draining| {
            let backend = Arc::new(Double(Watched::new(store.clone(), Some(hint))));
            let mut f = Fetcher::new(backend, LoopKey::shared("q"), limits, Registry::default());
            f.batch = 64;
            let (to, _) = mpsc::unbounded_channel();
            f.consumers.insert(
                (1, 1),
                Consumer {
                    demand: 0,
                    draining,
                    handed: 0,
                    to,
                },
            );
            [f.get_size(100), f.get_size(1000), f.get_size(10)]
        };
        use ReadyHint::*;
        assert_eq!(size(Exact(30), false), [30, 30, 10]);
        assert_eq!(
            size(Exact(0), false),
            [1, 1, 1],
            "one, to return on the next arrival"
        );
        assert_eq!(size(Exact(9000), false), [100, 500, 10]);
        assert_eq!(size(Estimate(30), false), [30, 30, 10]);
        assert_eq!(size(Estimate(30), true), [30, 30, 10]);
        assert_eq!(
            size(Estimate(0), false),
            [1, 1, 1],
            "nothing counted: one, to return on the next arrival"
        );
        assert_eq!(size(Unknown, false), [64, 64, 10]);
        assert_eq!(size(Unknown, true), [1, 1, 1]);
        assert_eq!(size(Estimate(0), true), [1, 1, 1]);
    }

    fn message(channel: &str) -> QueueMessage {
        QueueMessage {
            client_id: "test".into(),
            channel: channel.into(),
            body: b"x".to_vec().into(),
            ..Default::default()
        }
    }

    /// A store, the embedded backend over it, an empty registry of Get loops, and limits.
    struct IdleRig {
        _dir: tempfile::TempDir,
        store: Arc<Store>,
        backend: Arc<Embedded>,
        registry: Registry,
        limits: FetchLimits,
    }

    /// An [`IdleRig`] whose loops end after `idle_exit` without consumers.
    fn idle_rig(idle_exit: std::time::Duration) -> IdleRig {
        let dir = tempfile::tempdir().expect("dir");
        let (store, _) = Store::open(dir.path()).expect("store");
        IdleRig {
            _dir: dir,
            backend: Arc::new(Embedded::new(store.clone())),
            store,
            registry: Registry::default(),
            limits: FetchLimits {
                max_batch: 10,
                idle_exit,
            },
        }
    }

    /// Consumers on ever new queue names leave at most `MAX_IDLE_LOOPS` loops behind:
    /// past that many, a loop whose last consumer leaves ends at once.
    #[tokio::test]
    async fn idle_loops_are_bounded() {
        let IdleRig {
            _dir,
            backend,
            registry,
            limits,
            ..
        } = idle_rig(std::time::Duration::from_secs(600));
        let names = MAX_IDLE_LOOPS + 200;
        let (to, mut from) = mpsc::unbounded_channel();
        for i in 0..names {
            let tx = join(
                &registry,
                &backend,
                LoopKey::shared(&format!("name-{i}")),
                limits,
                (1, i as u64),
                to.clone(),
            );
            let _ = tx.send(Command::Leave((1, i as u64)));
        }
        for _ in 0..names {
            let left = tokio::time::timeout(std::time::Duration::from_secs(5), from.recv()).await;
            assert!(matches!(left, Ok(Some(ToConsumer::Left(_)))), "{left:?}");
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while registry.lock().len() > MAX_IDLE_LOOPS {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} loops still run with no consumer",
                registry.lock().len()
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // The kept ones still serve a consumer that comes back.
        assert!(registry.lock().len() >= MAX_IDLE_LOOPS / 2);
    }

    /// A loop with no consumer ends after `idle_exit` and leaves the registry; the next consumer
    /// starts a fresh loop that delivers.
    #[tokio::test]
    async fn idle_loop_retires_and_a_new_consumer_starts_another() {
        let IdleRig {
            _dir,
            store,
            backend,
            registry,
            limits,
        } = idle_rig(std::time::Duration::from_millis(50));
        let (to, mut from) = mpsc::unbounded_channel();
        let tx = join(
            &registry,
            &backend,
            LoopKey::shared("idle"),
            limits,
            (1, 1),
            to.clone(),
        );
        let _ = tx.send(Command::Leave((1, 1)));
        let left = tokio::time::timeout(std::time::Duration::from_secs(5), from.recv()).await;
        assert!(
            matches!(left, Ok(Some(ToConsumer::Left((1, 1))))),
            "the loop confirms the Leave"
        );
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while registry.lock().contains_key(&LoopKey::shared("idle")) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the idle loop never retired"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(tx.is_closed(), "the retired loop's channel is closed");

        assert!(!store.send(vec![message("idle")]).await[0].is_error);
        let tx = join(
            &registry,
            &backend,
            LoopKey::shared("idle"),
            limits,
            (1, 2),
            to,
        );
        let _ = tx.send(Command::Demand(DemandReport {
            consumer: (1, 2),
            credit: 1,
            taken: 0,
        }));
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), from.recv())
            .await
            .expect("a delivery from the new loop");
        assert!(
            matches!(got, Some(ToConsumer::Messages(hs)) if hs.len() == 1 && hs[0].consumer == (1, 2))
        );
    }

    /// The embedded backend, with the ready hint chosen by the test (if any), each Get's
    /// MaxItems recorded with when it was issued, and every settlement request recorded; as a
    /// KubeMQ when `kubemq` is set (it captures, and its count of stored messages is the test's).
    struct Watched {
        inner: Embedded,
        hint: Option<ReadyHint>,
        log: Log,
        kubemq: Option<StoredCount>,
        /// Holds the answers to [`Downstream::handled`] for the test to give, when set.
        answers: Option<Answers>,
        /// How long each Get takes before it asks the store.
        get_delay: std::time::Duration,
    }

    /// Answers to [`Downstream::handled`] that a test gives itself.
    type Answers = Arc<
        std::sync::Mutex<
            Vec<tokio::sync::oneshot::Sender<crate::kubemq::QueuesDownstreamResponse>>,
        >,
    >;

    /// What a [`Watched`] backend saw, in order.
    type Log = Arc<std::sync::Mutex<Vec<Seen>>>;

    #[derive(Debug, Clone, PartialEq)]
    enum Seen {
        Get {
            max_items: i32,
            at: tokio::time::Instant,
        },
        Settle {
            op: i32,
            transaction: String,
            at: tokio::time::Instant,
        },
        Handled,
    }

    /// The messages a KubeMQ-like [`Watched`] counts as stored, and the signal that it rose.
    struct StoredCount {
        n: Arc<std::sync::atomic::AtomicU64>,
        rose: tokio::sync::watch::Sender<()>,
    }

    impl Watched {
        fn new(store: Arc<Store>, hint: Option<ReadyHint>) -> Watched {
            Watched {
                inner: Embedded::new(store),
                hint,
                log: Arc::default(),
                kubemq: None,
                answers: None,
                get_delay: std::time::Duration::ZERO,
            }
        }

        fn like_kubemq(store: Arc<Store>) -> Watched {
            Watched {
                kubemq: Some(StoredCount {
                    n: Arc::default(),
                    rose: tokio::sync::watch::Sender::new(()),
                }),
                ..Watched::new(store, None)
            }
        }

        fn seen(&self) -> Vec<Seen> {
            self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }

        /// Each Get's MaxItems and when it was issued, in order.
        fn gets_seen(&self) -> Vec<(i32, tokio::time::Instant)> {
            let get = |s: Seen| match s {
                Seen::Get { max_items, at } => Some((max_items, at)),
                _ => None,
            };
            self.seen().into_iter().filter_map(get).collect()
        }

        /// Each settlement request's type and transaction, in order.
        fn settles_seen(&self) -> Vec<(i32, String)> {
            let settle = |s: Seen| match s {
                Seen::Settle {
                    op, transaction, ..
                } => Some((op, transaction)),
                _ => None,
            };
            self.seen().into_iter().filter_map(settle).collect()
        }
    }

    /// The next hand-out, which must be one message.
    async fn one_handout(from: &mut mpsc::UnboundedReceiver<ToConsumer>) -> Handout {
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), from.recv()).await;
        let Ok(Some(ToConsumer::Messages(hs))) = got else {
            panic!("a message: {got:?}");
        };
        hs.into_iter().next().expect("one")
    }

    /// The consumer accepts `h`.
    fn ack(tx: &mpsc::UnboundedSender<Command>, h: &Handout) {
        let _ = tx.send(Command::Settle(vec![Settlement {
            transaction: h.transaction.clone(),
            sequence: h.sequence,
            outcome: Outcome::Ack,
        }]));
    }

    /// A store holding one message of `channel`, behind the [`Watched`] backend `make` builds
    /// on it, and one consumer of that channel with `credit`: its loop's sender and its
    /// hand-outs.
    async fn one_consumer_of(
        channel: &str,
        credit: u32,
        make: impl FnOnce(Arc<Store>) -> Watched,
    ) -> (
        tempfile::TempDir,
        Arc<Store>,
        Arc<Double<Watched>>,
        mpsc::UnboundedSender<Command>,
        mpsc::UnboundedReceiver<ToConsumer>,
    ) {
        let dir = tempfile::tempdir().expect("dir");
        let (store, _) = Store::open(dir.path()).expect("store");
        assert!(!store.send(vec![message(channel)]).await[0].is_error);
        let backend = Arc::new(Double(make(store.clone())));
        let limits = FetchLimits {
            max_batch: 10,
            idle_exit: std::time::Duration::from_secs(60),
        };
        let (to, from) = mpsc::unbounded_channel();
        let registry: Registry = Arc::default();
        let key = LoopKey::shared(channel);
        let tx = join(&registry, &backend, key, limits, (1, 1), to);
        let _ = tx.send(Command::Demand(DemandReport {
            consumer: (1, 1),
            credit,
            taken: 0,
        }));
        (dir, store, backend, tx, from)
    }

    /// A [`Watched`] backend's session: the embedded one, recorded, its Gets delayed and its
    /// answers held as the backend says.
    struct RecordedGets<D> {
        inner: D,
        log: Log,
        answers: Option<Answers>,
        get_delay: std::time::Duration,
    }

    impl<D> RecordedGets<D> {
        /// Records a settlement request as the downstream protocol names it.
        fn saw(&self, op: Op, transaction: &str) {
            self.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Seen::Settle {
                    op: op as i32,
                    transaction: transaction.to_string(),
                    at: tokio::time::Instant::now(),
                });
        }
    }

    impl<D: Downstream> Downstream for RecordedGets<D> {
        async fn get(
            &mut self,
            channel: &str,
            client_id: &str,
            max_items: i32,
            wait_ms: i32,
        ) -> Result<crate::backend::Batch, BackendError> {
            self.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Seen::Get {
                    max_items,
                    at: tokio::time::Instant::now(),
                });
            tokio::time::sleep(self.get_delay).await;
            self.inner.get(channel, client_id, max_items, wait_ms).await
        }

        async fn ack(&mut self, transaction: &str, sequences: &[u64]) -> Result<(), BackendError> {
            self.saw(Op::AckRange, transaction);
            self.inner.ack(transaction, sequences).await
        }

        async fn nack(&mut self, transaction: &str, sequences: &[u64]) -> Result<(), BackendError> {
            self.saw(Op::NAckRange, transaction);
            self.inner.nack(transaction, sequences).await
        }

        async fn requeue(
            &mut self,
            transaction: &str,
            sequences: &[u64],
            channel: &str,
        ) -> Result<(), BackendError> {
            self.saw(Op::ReQueueRange, transaction);
            self.inner.requeue(transaction, sequences, channel).await
        }

        async fn close(&mut self, transaction: &str) -> Result<(), BackendError> {
            self.saw(Op::CloseByClient, transaction);
            self.inner.close(transaction).await
        }

        async fn handled(
            &mut self,
            transaction: &str,
        ) -> Result<crate::backend::Handled, BackendError> {
            self.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Seen::Handled);
            match &self.answers {
                Some(answers) => {
                    let (done, answer) = tokio::sync::oneshot::channel();
                    answers.lock().unwrap_or_else(|e| e.into_inner()).push(done);
                    Ok(crate::backend::Handled::when(answer))
                }
                None => self.inner.handled(transaction).await,
            }
        }
    }

    impl Overrides for Watched {
        type Inner = Embedded;
        type Downstream = RecordedGets<<Embedded as Backend>::Downstream>;

        fn inner(&self) -> &Embedded {
            &self.inner
        }

        async fn open_downstream(&self) -> Result<<Self as Overrides>::Downstream, BackendError> {
            let d = self.inner.open_downstream().await?;
            Ok(RecordedGets {
                inner: d,
                log: self.log.clone(),
                answers: self.answers.clone(),
                get_delay: self.get_delay,
            })
        }

        fn ready_hint(&self, channel: &str) -> ReadyHint {
            match &self.kubemq {
                Some(_) => ReadyHint::Unknown,
                None => self.hint.unwrap_or_else(|| self.inner.ready_hint(channel)),
            }
        }

        fn captures(&self) -> bool {
            self.kubemq.is_some()
        }

        fn stored_hint(&self, _channel: &str) -> u64 {
            self.kubemq
                .as_ref()
                .map_or(0, |k| k.n.load(std::sync::atomic::Ordering::SeqCst))
        }

        fn ready_changes(&self) -> Option<tokio::sync::watch::Receiver<()>> {
            self.kubemq.as_ref().map(|k| k.rose.subscribe())
        }
    }

    /// KMQ-17, as the Get gate decides (get_gate.rs): on a backend that captures, with a
    /// transaction open and nothing known to be stored, the next Get waits until the
    /// consumer settled or OVERLAP_WAIT passed — never at once, as it did before the gate; once
    /// messages are known to be stored it goes at once and asks for just those.
    #[tokio::test]
    async fn a_get_that_would_wait_is_held_back_while_a_transaction_is_open() {
        use super::super::get_gate::OVERLAP_WAIT;
        let (_dir, store, backend, _tx, mut from) =
            one_consumer_of("gate", 10, Watched::like_kubemq).await;
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), from.recv())
            .await
            .expect("the first message");
        let handed_at = tokio::time::Instant::now();
        assert!(matches!(first, Some(ToConsumer::Messages(hs)) if hs.len() == 1));
        // The consumer holds its message: the next Get waits for the hold's limit.
        let gets = || backend.gets_seen();
        tokio::time::sleep(OVERLAP_WAIT * 4).await;
        let after_hold = gets();
        assert!(
            after_hold.len() >= 2,
            "a Get after the hold: {after_hold:?}"
        );
        let (_, second_at) = after_hold[1];
        assert!(
            second_at >= handed_at + OVERLAP_WAIT - std::time::Duration::from_millis(1),
            "the second Get was held back: {:?} after the hand-out",
            second_at - handed_at
        );
        // That Get (for one) is waiting; two messages are sent and counted as stored: they come.
        let batch = vec![message("gate"), message("gate")];
        assert!(store.send(batch).await.iter().all(|r| !r.is_error));
        let stored = backend.kubemq.as_ref().expect("like KubeMQ");
        stored.n.store(2, std::sync::atomic::Ordering::SeqCst);
        stored.rose.send_replace(());
        let mut got = 0;
        while got < 2 {
            match tokio::time::timeout(std::time::Duration::from_secs(5), from.recv()).await {
                Ok(Some(ToConsumer::Messages(hs))) => got += hs.len(),
                other => panic!("the stored messages come: {other:?}"),
            }
        }
        assert!(
            gets().iter().skip(2).all(|(max_items, _)| *max_items <= 2),
            "Gets beside the open transaction ask for what is stored: {:?}",
            gets()
        );
    }

    /// KMQ-18: on a backend that captures, a transaction whose messages were all settled is
    /// closed too (CloseByClient after the AckRange), so a message KubeMQ added to it after
    /// answering the Get is given back instead of staying hidden while the session lives.
    #[tokio::test]
    async fn a_settled_transaction_is_closed_on_a_backend_that_captures() {
        let (_dir, store, backend, tx, mut from) =
            one_consumer_of("close", 1, Watched::like_kubemq).await;
        let h = one_handout(&mut from).await;
        ack(&tx, &h);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let settles = || backend.settles_seen();
        while settles().len() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", settles());
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let t = h.transaction.to_string();
        assert_eq!(
            settles(),
            vec![
                (Op::AckRange as i32, t.clone()),
                (Op::CloseByClient as i32, t)
            ]
        );
        assert_eq!(store.ready_count("close") + store.locked_count("close"), 0);
    }

    /// KMQ-17, as close_fence.rs decides: once settling closed a transaction on a backend that
    /// captures, the next Get waits for KubeMQ's answer to the request sent behind the close,
    /// even with a message known to be stored, and goes as soon as that answer comes.
    #[tokio::test]
    async fn a_get_waits_until_the_closes_before_it_are_handled() {
        use super::super::close_fence::FENCE_WAIT;
        let answers: Answers = Arc::default();
        let held = answers.clone();
        let (_dir, store, backend, tx, mut from) =
            one_consumer_of("fence", 1, move |store| Watched {
                answers: Some(held),
                ..Watched::like_kubemq(store)
            })
            .await;
        let h = one_handout(&mut from).await;
        // A second message is stored and counted: without the fence, the Get for it would go
        // as soon as the consumer settles and asks for more.
        assert!(!store.send(vec![message("fence")]).await[0].is_error);
        let stored = backend.kubemq.as_ref().expect("like KubeMQ");
        stored.n.store(1, std::sync::atomic::Ordering::SeqCst);
        stored.rose.send_replace(());
        ack(&tx, &h);
        let _ = tx.send(Command::Demand(DemandReport {
            consumer: (1, 1),
            credit: 1,
            taken: 1,
        }));
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while !backend.seen().contains(&Seen::Handled) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                backend.seen()
            );
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let t = h.transaction.to_string();
        assert_eq!(
            backend.settles_seen(),
            vec![
                (Op::AckRange as i32, t.clone()),
                (Op::CloseByClient as i32, t)
            ],
            "the answer is asked for after the close"
        );
        tokio::time::sleep(FENCE_WAIT / 2).await;
        assert_eq!(backend.gets_seen().len(), 1, "no Get before the answer");
        let answered_at = tokio::time::Instant::now();
        for done in answers.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = done.send(Default::default());
        }
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), from.recv()).await;
        assert!(
            matches!(got, Ok(Some(ToConsumer::Messages(ref hs))) if hs.len() == 1),
            "{got:?}"
        );
        let gets = backend.gets_seen();
        assert_eq!(gets.len(), 2, "{gets:?}");
        assert!(gets[1].1 >= answered_at, "the Get went after the answer");
    }

    /// KMQ-17, as close_fence.rs decides: while a Get for messages known to be stored is out,
    /// the settlement of another transaction waits for it (or for OVERLAP_WAIT), so that its
    /// close cannot land beside the Get.
    #[tokio::test]
    async fn a_settlement_waits_for_a_get_of_stored_messages() {
        use super::super::get_gate::OVERLAP_WAIT;
        let delay = std::time::Duration::from_millis(100);
        let (_dir, store, backend, tx, mut from) = one_consumer_of("overlap", 2, move |store| {
            let w = Watched {
                get_delay: delay,
                ..Watched::like_kubemq(store)
            };
            let stored = w.kubemq.as_ref().expect("like KubeMQ");
            stored.n.store(2, std::sync::atomic::Ordering::SeqCst);
            w
        })
        .await;
        assert!(!store.send(vec![message("overlap")]).await[0].is_error);
        let h = one_handout(&mut from).await;
        // The second Get (for the stored second message) is out now.
        ack(&tx, &h);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), from.recv()).await;
        assert!(matches!(got, Ok(Some(ToConsumer::Messages(_)))), "{got:?}");
        let seen = backend.seen();
        let second_get = seen
            .iter()
            .filter_map(|s| match s {
                Seen::Get { at, .. } => Some(*at),
                _ => None,
            })
            .nth(1)
            .expect("a second Get");
        let ack = seen
            .iter()
            .find_map(|s| match s {
                Seen::Settle { op, at, .. } if *op == Op::AckRange as i32 => Some(*at),
                _ => None,
            })
            .expect("the AckRange");
        assert!(
            ack >= second_get + OVERLAP_WAIT - std::time::Duration::from_millis(1),
            "the settlement waited for the Get: {:?} after it",
            ack.saturating_duration_since(second_get)
        );
    }

    /// A consumer with credit to spare is not kept waiting for the rest of its window: after
    /// a Get of 40 for a credit of 100, with nothing more ready, the next Get goes out at once
    /// (on a paused clock: before the clock moves on from the hand-out), where waiting for the
    /// credit to come back whole would hold the next message for the full wait.
    #[tokio::test]
    async fn a_get_does_not_wait_for_credit_when_what_is_back_covers_the_ready() {
        let dir = tempfile::tempdir().expect("dir");
        let (store, _) = Store::open(dir.path()).expect("store");
        let batch: Vec<QueueMessage> = (0..40).map(|_| message("steady")).collect();
        assert!(store.send(batch).await.iter().all(|r| !r.is_error));
        tokio::time::pause();
        let backend = Arc::new(Double(Watched::new(store.clone(), None)));
        let registry: Registry = Arc::default();
        let limits = FetchLimits {
            max_batch: 1000,
            idle_exit: std::time::Duration::from_secs(60),
        };
        let key = (1, 1);
        let (to, mut from) = mpsc::unbounded_channel();
        let tx = join(
            &registry,
            &backend,
            LoopKey::shared("steady"),
            limits,
            key,
            to,
        );
        let _ = tx.send(Command::Demand(DemandReport {
            consumer: key,
            credit: 100,
            taken: 0,
        }));
        let mut taken = 0;
        while taken < 40 {
            match from.recv().await.expect("the loop runs") {
                ToConsumer::Messages(hs) => taken += hs.len(),
                _ => continue,
            }
        }
        // The clock stands still while any task can run: it has not moved since the hand-out.
        let handed = tokio::time::Instant::now();
        while backend.gets_seen().len() < 2 {
            tokio::time::sleep(std::time::Duration::from_micros(100)).await;
        }
        let gets = backend.gets_seen();
        assert_eq!(gets[0].0, 40, "{gets:?}");
        assert_eq!(gets[1].0, 1, "a Get for the next message: {gets:?}");
        assert!(
            gets[1].1 <= handed,
            "asked with the hand-out, not after a wait: {gets:?} {handed:?}"
        );
        drop(tx);
    }

    /// Two consumers with a window of 100 each that settle and re-grant every 50 (as clients
    /// do): after a Get of both windows, the next waits for the credit to come back whole
    /// instead of fetching for the first 50 that return (docs/queues-consume-design.md, "A
    /// window travels whole"). Everything is delivered once and acked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_get_waits_for_the_window_to_come_back_whole() {
        let dir = tempfile::tempdir().expect("dir");
        let (store, _) = Store::open(dir.path()).expect("store");
        let total = 2000usize;
        let batch: Vec<QueueMessage> = (0..total).map(|_| message("win")).collect();
        assert!(store.send(batch).await.iter().all(|r| !r.is_error));
        let backend = Arc::new(Double(Watched::new(store.clone(), None)));
        let registry: Registry = Arc::default();
        let limits = FetchLimits {
            max_batch: 1000,
            idle_exit: std::time::Duration::from_secs(60),
        };
        let mut clients = Vec::new();
        for link in 1..=2u64 {
            let key = (1, link);
            let (to, mut from) = mpsc::unbounded_channel();
            let tx = join(&registry, &backend, LoopKey::shared("win"), limits, key, to);
            let _ = tx.send(Command::Demand(DemandReport {
                consumer: key,
                credit: 100,
                taken: 0,
            }));
            clients.push(tokio::spawn(async move {
                let (mut taken, mut held) = (0u64, Vec::new());
                while let Ok(Some(m)) =
                    tokio::time::timeout(std::time::Duration::from_secs(1), from.recv()).await
                {
                    let ToConsumer::Messages(hs) = m else {
                        continue;
                    };
                    for h in hs {
                        taken += 1;
                        held.push(Settlement {
                            transaction: h.transaction.clone(),
                            sequence: h.sequence,
                            outcome: Outcome::Ack,
                        });
                        if held.len() == 50 {
                            let _ = tx.send(Command::Settle(std::mem::take(&mut held)));
                            let _ = tx.send(Command::Demand(DemandReport {
                                consumer: key,
                                credit: 100,
                                taken,
                            }));
                        }
                    }
                }
                taken
            }));
        }
        let mut delivered = 0;
        for c in clients {
            delivered += c.await.expect("client");
        }
        assert_eq!(delivered as usize, total);
        let gets: Vec<i32> = backend.gets_seen().into_iter().map(|(n, _)| n).collect();
        // Without the wait most Gets carry one consumer's half window (50; mean about 60);
        // with it a whole window: both (200), or one consumer's (100) or 150 on a loaded
        // machine where the 1 ms passes before the rest is back. So half windows are the
        // exception. The trailing Gets for one (an empty queue) do not count.
        let large: Vec<i32> = gets.iter().copied().filter(|n| *n >= 16).collect();
        let halves = large.iter().filter(|n| **n <= 50).count();
        assert!(
            halves * 3 < large.len(),
            "Gets of whole windows, mostly: {gets:?}"
        );
        assert_eq!(store.ready_count("win"), 0);
    }
}
