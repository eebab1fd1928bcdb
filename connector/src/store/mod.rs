//! The embedded, durable, KubeMQ-compatible queue store: the default backend when no KubeMQ
//! address is configured.
//!
//! Data path: [`Store::send`] validates and stamps messages like KubeMQ (KMQ-4),
//! assigns per-queue sequences, frames them as records ([`record`]) and waits until the writer
//! thread of [`log`] has them on disk (group commit); only then are they visible. [`Store::get`]
//! waits for MaxItems or WaitTimeout exactly like KubeMQ (4.3.2) and locks what it hands out;
//! settlement in a consumer [`session`] acks, NAcks to the tail, dead-letters, re-queues or returns
//! them.
//! Message bodies live only on disk; memory holds an index of where each one is.
//!
//! Events fan out in memory ([`events`]); the events-store keeps its streams and cursors in a
//! log of its own ([`stream`]); commands and queries are routed in memory ([`requests`]), both
//! over [`fanout`].

mod deleter;
pub mod errors;
pub mod events;
pub mod fanout;
pub mod log;
pub mod record;
pub mod requests;
pub mod seq;
pub mod session;
pub mod stream;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use tokio::sync::Notify;

use crate::kubemq::{
    QueueMessage, QueueMessageAttributes, QueueMessagePolicy, SendQueueMessageResult,
};
use errors::{valid_queue_name, MAX_POLICY_SECONDS, MAX_RECEIVE_COUNT};
pub use errors::{StoreError, TxnError};
use log::{Dropped, Location, Log};
use record::{Ack, Checkpoint, Delay, Enqueue, Kind, Release};
pub use seq::Seq;

/// One queue's figures, as KubeMQ's QueuesInfo reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue (channel) name.
    pub name: String,
    /// Messages ready to be taken.
    pub ready: u64,
    /// Messages a transaction holds.
    pub locked: u64,
    /// The lowest sequence still held (ready or locked), 0 when none is.
    pub first_sequence: u64,
    /// The last sequence the queue gave.
    pub last_sequence: u64,
}

/// Unix time in nanoseconds.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Where a stored copy is, and what must be known about it without reading it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    loc: Location,
    len: u32,
}

#[derive(Default)]
struct QueueState {
    last_sequence: Seq,
    /// Visible, not locked: sequence → entry. A Get takes the lowest sequences first.
    ready: BTreeMap<Seq, Entry>,
    /// Handed out by a Get and not yet settled or returned.
    locked: HashMap<Seq, Entry>,
    notify: Arc<Notify>,
}

impl QueueState {
    /// Gives the queue's next sequence.
    fn next_sequence(&mut self) -> Seq {
        self.last_sequence = self.last_sequence.next();
        self.last_sequence
    }
}

#[derive(Default)]
struct State {
    queues: HashMap<String, QueueState>,
    /// Delayed messages by (due ns, id).
    delayed: BTreeMap<(i64, u64), Entry>,
    delay_keys: HashMap<u64, i64>,
    next_delay_id: u64,
    /// Live records (stored copies and waiting delayed messages) per segment.
    live: BTreeMap<u64, u64>,
}

impl State {
    fn queue(&mut self, name: &str) -> &mut QueueState {
        self.queues.entry(name.to_string()).or_default()
    }

    fn add_live(&mut self, seg: u64) {
        *self.live.entry(seg).or_default() += 1;
    }

    fn drop_live(&mut self, seg: u64) {
        if let Some(n) = self.live.get_mut(&seg) {
            *n = n.saturating_sub(1);
        }
    }

    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            last_sequence: self
                .queues
                .iter()
                .map(|(k, q)| (k.clone(), q.last_sequence.get()))
                .collect(),
            next_delay_id: self.next_delay_id,
            cursors: Vec::new(),
        }
    }
}

/// A message handed out by a Get: its sequence and the message as the consumer sees it.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// The stored copy's sequence (the settlement handle).
    pub sequence: Seq,
    /// The message with attributes for this delivery.
    pub message: QueueMessage,
}

/// The store.
pub struct Store {
    log: Log,
    state: Arc<Mutex<State>>,
    sends: AtomicU64,
    /// Gets that waited out their WaitTimeout short of MaxItems.
    waited_out: AtomicU64,
    /// Gets waiting for messages right now.
    waiting: AtomicU64,
    stop: Arc<Notify>,
    /// Events (in memory).
    events: events::EventsHub,
    /// The events-store (its own log, in `events-store/`).
    streams: Arc<stream::Streams>,
    /// Commands and queries (in memory).
    requests: requests::RequestsHub,
}

/// An events or events-store subscription of the store.
#[derive(Debug)]
pub struct EventSubscription {
    /// Its events, in order.
    pub events: tokio::sync::mpsc::Receiver<crate::kubemq::EventReceive>,
    /// It starts with stored events to replay: the first is on its way.
    pub replaying: bool,
}

/// A Get counted as waiting while this lives (also when the Get is cancelled mid-wait).
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicU64) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What opening a store found.
#[derive(Debug, Clone)]
pub struct OpenReport {
    /// Damaged bytes skipped or truncated, per segment.
    pub dropped: Vec<Dropped>,
    /// Messages ready after recovery, all queues.
    pub ready: usize,
    /// Delayed messages waiting after recovery.
    pub delayed: usize,
    /// Events-store events retained after recovery.
    pub stored_events: usize,
}

/// Where the events-store keeps its log, inside the store's directory.
pub const STREAM_DIR: &str = "events-store";

/// What a send did: each message's result, in order, and whether the write that held the valid
/// ones failed (a batch's HaveErrors reports that alone, not refusals, 4.2 step 5).
#[derive(Debug)]
pub struct Sent {
    /// Each message's result.
    pub results: Vec<SendQueueMessageResult>,
    /// The write failed: every message not refused up front has `Error 500`.
    pub storage_failed: bool,
}

impl Store {
    /// Opens (or creates) the store in `dir`, replaying its log. In-flight messages of a previous
    /// run are ready again with their sequence and receive count unchanged.
    pub fn open(dir: &Path) -> io::Result<(Arc<Store>, OpenReport)> {
        Self::open_with(dir, log::SEGMENT_BYTES)
    }

    /// [`Store::open`] with a segment size (small ones make reclaim testable).
    pub fn open_with(dir: &Path, segment_bytes: u64) -> io::Result<(Arc<Store>, OpenReport)> {
        let mut st = State {
            next_delay_id: 1,
            ..State::default()
        };
        let (segments, dropped) = log::recover(dir, |rec, loc, len| {
            replay(&mut st, rec, Entry { loc, len })
        })?;
        log::warn_dropped("store", &dropped);
        let (streams, stream_report) = stream::Streams::open(
            &dir.join(STREAM_DIR),
            segment_bytes,
            stream::DEFAULT_RETENTION,
        )?;
        log::warn_dropped("events-store", &stream_report.dropped);
        let report = OpenReport {
            dropped: dropped.into_iter().chain(stream_report.dropped).collect(),
            ready: st.queues.values().map(|q| q.ready.len()).sum(),
            delayed: st.delayed.len(),
            stored_events: stream_report.events,
        };
        let state = Arc::new(Mutex::new(st));
        let log = Log::start(
            dir,
            &segments,
            segment_bytes,
            log::checkpoints(state.clone(), State::checkpoint),
        )?;
        let store = Arc::new(Store {
            log,
            state,
            sends: AtomicU64::new(0),
            waited_out: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            stop: Arc::new(Notify::new()),
            events: events::EventsHub::default(),
            streams,
            requests: requests::RequestsHub::default(),
        });
        store.reclaim();
        Ok((store, report))
    }

    /// Starts the task that releases delayed messages (every 500 ms, 4.3.8). Needs a runtime.
    pub fn start_delay_releaser(self: &Arc<Self>) {
        self.streams.start_expiry();
        let weak = Arc::downgrade(self);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.notified() => return,
                }
                let Some(store) = weak.upgrade() else { return };
                store.release_due(now_ns()).await;
            }
        });
    }

    /// Stops background work and flushes the log.
    pub fn close(&self) {
        self.stop.notify_waiters();
        self.log.close();
        self.streams.close();
    }

    /// Sends an event (SendEvent): to the events-store with `Store = true`, else fanned out in
    /// memory; returns its EventID, or KubeMQ's refusal text.
    pub async fn send_event(&self, event: crate::kubemq::Event) -> Result<String, StoreError> {
        if event.store {
            self.streams.append(event).await.map(|e| e.event_id)
        } else {
            self.events.publish(event).map(|p| p.event_id)
        }
    }

    /// A SubscribeToEvents request (events or events-store), refused as KubeMQ refuses it.
    pub fn subscribe_events(
        &self,
        request: &crate::kubemq::Subscribe,
    ) -> Result<EventSubscription, StoreError> {
        use crate::kubemq::subscribe::SubscribeType;
        match SubscribeType::try_from(request.subscribe_type_data) {
            Ok(SubscribeType::Events) => {
                if request.events_store_type_data != 0 {
                    return Err(StoreError::NotEventsStore);
                }
                let events =
                    self.events
                        .subscribe(&request.client_id, &request.channel, &request.group)?;
                Ok(EventSubscription {
                    events,
                    replaying: false,
                })
            }
            Ok(SubscribeType::EventsStore) => {
                let start = stream::StartAt::from_request(
                    request.events_store_type_data,
                    request.events_store_type_value,
                )?;
                let (events, replaying) = self.streams.subscribe_replaying(
                    &request.client_id,
                    &request.channel,
                    &request.group,
                    start,
                )?;
                Ok(EventSubscription { events, replaying })
            }
            _ => Err(StoreError::SubscribeTypeInvalid),
        }
    }

    /// Events: in-memory fan-out.
    pub fn events(&self) -> &events::EventsHub {
        &self.events
    }

    /// A SubscribeToRequests request (commands or queries), refused as KubeMQ refuses it.
    pub fn subscribe_requests(
        &self,
        request: &crate::kubemq::Subscribe,
    ) -> Result<tokio::sync::mpsc::Receiver<crate::kubemq::Request>, StoreError> {
        use crate::kubemq::subscribe::SubscribeType;
        let kind = match SubscribeType::try_from(request.subscribe_type_data) {
            Ok(SubscribeType::Commands) => errors::RequestKind::Command,
            Ok(SubscribeType::Queries) => errors::RequestKind::Query,
            _ => return Err(StoreError::SubscribeTypeInvalid),
        };
        self.requests
            .subscribe(kind, &request.client_id, &request.channel, &request.group)
    }

    /// Commands and queries: in-memory routing.
    pub fn requests(&self) -> &requests::RequestsHub {
        &self.requests
    }

    /// The events-store.
    pub fn streams(&self) -> &Arc<stream::Streams> {
        &self.streams
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends messages as SendQueueMessage / a batch / an upstream request would: each gets its own
    /// result, in order; valid messages are durable when this returns, and counted in the queues
    /// even if the caller stops waiting. Consumers may have them from the moment they are
    /// written, before their fdatasync ends.
    pub async fn send(
        self: &Arc<Self>,
        messages: Vec<QueueMessage>,
    ) -> Vec<SendQueueMessageResult> {
        self.send_reporting(messages).await.results
    }

    /// [`Store::send`], saying also whether the write that held the valid messages failed.
    pub async fn send_reporting(self: &Arc<Self>, messages: Vec<QueueMessage>) -> Sent {
        let Placement {
            mut results,
            records,
            placed,
        } = self.place(messages);
        if placed.is_empty() {
            return Sent {
                results,
                storage_failed: false,
            };
        }
        let sent = results.len() as u64;
        let store = self.clone();
        // The records are written on this thread and counted live as soon as they are, before
        // their fdatasync and whether or not this caller still waits: a consumer can have them
        // while the disk syncs. The sender hears of success only once they are on disk.
        let appended = self.log.append_early(records, move |written| {
            if let Ok((base, _pin)) = written {
                store.count_placed(base, placed, sent);
            }
        });
        let failure = match appended {
            Err(e) => e.to_string(),
            Ok(synced) => match synced.await {
                Ok(Ok(())) => {
                    return Sent {
                        results,
                        storage_failed: false,
                    }
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => "store stopped".to_string(),
            },
        };
        // Every message not refused up front was in the write that failed.
        for r in results.iter_mut().filter(|r| !r.is_error) {
            r.is_error = true;
            r.error = StoreError::Storage(failure.clone()).to_string();
            r.sent_at = 0;
        }
        Sent {
            results,
            storage_failed: true,
        }
    }

    /// Stamps `messages`, gives the valid ones their sequences (or delay ids) and frames their
    /// records; the refused ones get their error result here.
    fn place(&self, messages: Vec<QueueMessage>) -> Placement {
        let now = now_ns();
        let mut results = Vec::with_capacity(messages.len());
        let mut records = BytesMut::new();
        let mut placed: Vec<Placed> = Vec::new();
        let mut st = self.lock();
        for msg in messages {
            match stamp(msg, now) {
                Err((id, text)) => results.push(error_result(id, text)),
                Ok(mut msg) => {
                    let attrs = msg.attributes.clone().unwrap_or_default();
                    results.push(SendQueueMessageResult {
                        message_id: msg.message_id.clone(),
                        sent_at: now,
                        expiration_at: attrs.expiration_at,
                        delayed_to: attrs.delayed_to,
                        ..Default::default()
                    });
                    let off = records.len();
                    if attrs.delayed_to > 0 {
                        let id = st.next_delay_id;
                        st.next_delay_id += 1;
                        let due = attrs.delayed_to;
                        let len = record::frame(
                            &mut records,
                            Kind::Delay(Delay {
                                id,
                                due_ns: due,
                                message: Some(msg),
                            }),
                        );
                        placed.push(Placed {
                            goes: Goes::Delayed { id, due },
                            offset: off,
                            len: len as u32,
                        });
                    } else {
                        let q = st.queue(&msg.channel);
                        let seq = q.next_sequence();
                        if let Some(a) = msg.attributes.as_mut() {
                            a.sequence = seq.get();
                        }
                        let name = msg.channel.clone();
                        let len = record::frame(
                            &mut records,
                            Kind::Enqueue(Enqueue { message: Some(msg) }),
                        );
                        placed.push(Placed {
                            goes: Goes::Queue { name, seq },
                            offset: off,
                            len: len as u32,
                        });
                    }
                }
            }
        }
        Placement {
            results,
            records,
            placed,
        }
    }

    /// Counts the placed messages live once their records are written at `base` (their segment
    /// is pinned by the caller until this returns), and wakes the Gets waiting for them.
    fn count_placed(&self, base: Location, placed: Vec<Placed>, sent: u64) {
        let mut st = self.lock();
        for p in placed {
            let e = Entry {
                loc: Location {
                    segment: base.segment,
                    offset: base.offset + p.offset as u64,
                },
                len: p.len,
            };
            st.add_live(e.loc.segment);
            match p.goes {
                Goes::Queue { name, seq } => {
                    let qs = st.queue(&name);
                    qs.ready.insert(seq, e);
                    qs.notify.notify_waiters();
                }
                Goes::Delayed { id, due } => {
                    st.delayed.insert((due, id), e);
                    st.delay_keys.insert(id, due);
                }
            }
        }
        self.sends.fetch_add(sent, Ordering::Relaxed);
    }

    /// Takes up to `max_items` messages of `queue`, waiting until that many arrived or `wait`
    /// passed (4.3.2 step 3: no early return with a partial batch). Expired messages are dropped
    /// and over-count messages dead-lettered or dropped (step 4); they count toward `max_items`.
    /// What is returned is locked until settled or returned. Cancel-safe: if the future is
    /// dropped, whatever it had collected is returned to the queue.
    pub async fn get(
        self: &Arc<Self>,
        queue: &str,
        max_items: usize,
        wait: Duration,
    ) -> Vec<Delivered> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut guard = Collected {
            store: self.as_ref(),
            queue: queue.to_string(),
            seqs: Vec::new(),
        };
        loop {
            let notify = {
                let mut st = self.lock();
                let q = st.queue(queue);
                while guard.seqs.len() < max_items {
                    let Some((seq, e)) = q.ready.pop_first() else {
                        break;
                    };
                    q.locked.insert(seq, e);
                    guard.seqs.push(seq);
                }
                q.notify.clone()
            };
            if guard.seqs.len() >= max_items {
                break;
            }
            let notified = notify.notified();
            tokio::pin!(notified);
            // Register before re-checking, so a send between the check and the wait is not missed.
            notified.as_mut().enable();
            let ready_now = !self.lock().queue(queue).ready.is_empty();
            if ready_now {
                continue;
            }
            let _waiting = Waiting::count(&self.waiting);
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                self.waited_out.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        self.deliver(&mut guard).await
    }

    /// Reads the collected copies and applies the delivery-time policy. What it delivers stays
    /// in `collected` until it returns, so a caller that stops waiting meanwhile returns it to
    /// the queue; a dead-letter move, once begun, runs to its end.
    async fn deliver(self: &Arc<Self>, collected: &mut Collected<'_>) -> Vec<Delivered> {
        let now = now_ns();
        let queue = collected.queue.clone();
        let mut out = Vec::with_capacity(collected.seqs.len());
        for (seq, msg) in self.read_locked_many(&queue, collected.seqs.clone()) {
            let Some(mut msg) = msg else {
                collected.forget(seq);
                continue;
            };
            let attrs = msg.attributes.get_or_insert_with(Default::default);
            if attrs.expiration_at > 0 && attrs.expiration_at < now {
                // 4.3.9: expired messages are dropped silently, never dead-lettered.
                collected.forget(seq);
                self.ack(&queue, &[seq]);
                continue;
            }
            attrs.receive_count += 1;
            let shown = attrs.receive_count;
            let max = msg.policy.as_ref().map_or(0, |p| p.max_receive_count);
            if max > 0 && shown > max {
                collected.forget(seq);
                let (store, q) = (self.clone(), queue.clone());
                to_the_end(async move { store.dead_letter_or_drop(&q, seq, msg).await }).await;
                continue;
            }
            out.push(Delivered {
                sequence: seq,
                message: msg,
            });
        }
        collected.seqs.clear();
        out
    }

    /// The stored message of locked `seq`.
    fn read_locked(&self, queue: &str, seq: Seq) -> Option<QueueMessage> {
        self.read_locked_many(queue, vec![seq]).pop()?.1
    }

    /// The stored messages of those of `seqs` that are locked, read together (messages sent
    /// together lie together on disk); one that cannot be read is dropped and logged.
    fn read_locked_many(&self, queue: &str, seqs: Vec<Seq>) -> Vec<(Seq, Option<QueueMessage>)> {
        let entries: Vec<(Seq, Entry)> = {
            let mut st = self.lock();
            let q = st.queue(queue);
            seqs.into_iter()
                .filter_map(|seq| Some((seq, *q.locked.get(&seq)?)))
                .collect()
        };
        let spans: Vec<_> = entries.iter().map(|(_, e)| (e.loc, e.len)).collect();
        let records = self.log.read_many(&spans);
        entries
            .into_iter()
            .zip(records)
            .map(|((seq, _), r)| match r {
                Ok(record::Record {
                    kind: Some(Kind::Enqueue(Enqueue { message: Some(m) })),
                }) => (seq, Some(m)),
                other => {
                    tracing::error!(queue, seq = seq.get(), error = ?other.err(), "stored message unreadable; dropping it");
                    self.ack(queue, &[seq]);
                    (seq, None)
                }
            })
            .collect()
    }

    /// Removes locked copies for good (ack). Unknown sequences are ignored.
    pub fn ack(&self, queue: &str, seqs: &[Seq]) {
        let mut buf = BytesMut::new();
        {
            let mut st = self.lock();
            for &seq in seqs {
                let Some(e) = st.queue(queue).locked.remove(&seq) else {
                    continue;
                };
                st.drop_live(e.loc.segment);
                record::frame(
                    &mut buf,
                    Kind::Ack(Ack {
                        queue: queue.to_string(),
                        sequence: seq.get(),
                    }),
                );
            }
        }
        if !buf.is_empty() {
            self.log.append_nowait(buf);
            self.reclaim();
        }
    }

    /// How many Gets so far waited out their WaitTimeout with fewer than MaxItems messages: a
    /// consumer waiting on messages that exist but are held shows here.
    pub fn waited_out_gets(&self) -> u64 {
        self.waited_out.load(Ordering::Relaxed)
    }

    /// How many Gets are waiting for messages at this moment, on any queue.
    pub fn waiting_gets(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Locks up to `n` ready messages of `queue` (lowest sequences first) without delivering
    /// them, for the façade's imitation of KubeMQ's capture ([`capture`]); [`Store::release`]
    /// returns them.
    pub fn take_ready(&self, queue: &str, n: usize) -> Vec<Seq> {
        let mut st = self.lock();
        let q = st.queue(queue);
        let mut taken = Vec::new();
        while taken.len() < n {
            let Some((seq, e)) = q.ready.pop_first() else {
                break;
            };
            q.locked.insert(seq, e);
            taken.push(seq);
        }
        taken
    }

    /// Returns locked copies to the queue unchanged: same sequence, same stored receive count
    /// (stream close, CloseByClient: 4.3.7). They go ahead of newer messages.
    pub fn release(&self, queue: &str, seqs: &[Seq]) {
        let mut st = self.lock();
        let q = st.queue(queue);
        let mut any = false;
        for seq in seqs {
            if let Some(e) = q.locked.remove(seq) {
                q.ready.insert(*seq, e);
                any = true;
            }
        }
        if any {
            q.notify.notify_waiters();
        }
    }

    /// NAck of a locked copy shown with receive count `shown`: a copy at the tail with a new
    /// sequence and persisted count `shown`, or past MaxReceiveCount a dead-letter copy or a drop;
    /// the original is acked (4.3.6). Durable when this returns; a NAck that fails gives the
    /// original back to the queue unchanged.
    pub async fn nack(self: &Arc<Self>, queue: &str, seq: Seq) -> Result<(), StoreError> {
        let (store, q) = (self.clone(), queue.to_string());
        to_the_end(async move {
            store
                .nack_now(&q, seq)
                .await
                .inspect_err(|_| store.release(&q, &[seq]))
        })
        .await
        .unwrap_or_else(|| {
            Err(StoreError::Nack {
                seq,
                why: "store stopped".into(),
            })
        })
    }

    async fn nack_now(&self, queue: &str, seq: Seq) -> Result<(), StoreError> {
        let Some(mut msg) = self.read_locked(queue, seq) else {
            return Err(StoreError::Nack {
                seq,
                why: "message not found".into(),
            });
        };
        let attrs = msg.attributes.get_or_insert_with(Default::default);
        let shown = attrs.receive_count + 1;
        let max = msg.policy.as_ref().map_or(0, |p| p.max_receive_count);
        if max > 0 && shown + 1 > max {
            attrs.receive_count = shown;
            self.dead_letter_or_drop(queue, seq, msg).await;
            return Ok(());
        }
        attrs.receive_count = shown;
        attrs.timestamp = now_ns();
        self.move_copy(queue, seq, msg)
            .await
            .map_err(|e| StoreError::Nack {
                seq,
                why: e.to_string(),
            })
    }

    /// Dead-letters a locked copy into its MaxReceiveQueue (count 0, ReRouted, policy zeroed), or
    /// drops it when there is none; the original is acked.
    async fn dead_letter_or_drop(&self, queue: &str, seq: Seq, mut msg: QueueMessage) {
        let dlq = msg
            .policy
            .as_ref()
            .map(|p| p.max_receive_queue.clone())
            .unwrap_or_default();
        if dlq.is_empty() {
            self.ack(queue, &[seq]);
            return;
        }
        msg.channel = dlq;
        msg.policy = Some(QueueMessagePolicy::default());
        let attrs = msg.attributes.get_or_insert_with(Default::default);
        attrs.receive_count = 0;
        attrs.re_routed = true;
        attrs.re_routed_from_queue = queue.to_string();
        attrs.timestamp = now_ns();
        if let Err(e) = self.move_copy(queue, seq, msg).await {
            tracing::error!(queue, seq = seq.get(), error = %e, "dead-lettering failed; the message stays locked until returned");
        }
    }

    /// Appends `copy` (already stamped) to its channel with a new sequence and acks the locked
    /// original in the same durable write.
    async fn move_copy(&self, queue: &str, seq: Seq, mut copy: QueueMessage) -> io::Result<()> {
        let mut buf = BytesMut::new();
        let (target, new_seq, len) = {
            let mut st = self.lock();
            let target = copy.channel.clone();
            let q = st.queue(&target);
            let new_seq = q.next_sequence();
            copy.attributes
                .get_or_insert_with(Default::default)
                .sequence = new_seq.get();
            let len = record::frame(
                &mut buf,
                Kind::Enqueue(Enqueue {
                    message: Some(copy),
                }),
            );
            record::frame(
                &mut buf,
                Kind::Ack(Ack {
                    queue: queue.to_string(),
                    sequence: seq.get(),
                }),
            );
            (target, new_seq, len as u32)
        };
        let (base, _pin) = self.log.append(buf).await?;
        let mut st = self.lock();
        if let Some(e) = st.queue(queue).locked.remove(&seq) {
            st.drop_live(e.loc.segment);
        }
        st.add_live(base.segment);
        let q = st.queue(&target);
        q.ready.insert(new_seq, Entry { loc: base, len });
        q.notify.notify_waiters();
        drop(st);
        self.reclaim();
        Ok(())
    }

    /// ReQueue of a locked copy: a fresh send of it to `channel` (policy re-applied, count 0),
    /// then the original is acked (4.3.4); a ReQueue that fails gives the original back to the
    /// queue unchanged.
    pub async fn requeue(
        self: &Arc<Self>,
        queue: &str,
        seq: Seq,
        channel: &str,
    ) -> Result<(), StoreError> {
        let (store, q, to) = (self.clone(), queue.to_string(), channel.to_string());
        to_the_end(async move {
            store
                .requeue_now(&q, seq, &to)
                .await
                .inspect_err(|_| store.release(&q, &[seq]))
        })
        .await
        .unwrap_or_else(|| {
            Err(StoreError::Requeue {
                seq,
                why: "store stopped".into(),
            })
        })
    }

    async fn requeue_now(
        self: &Arc<Self>,
        queue: &str,
        seq: Seq,
        channel: &str,
    ) -> Result<(), StoreError> {
        let failed = |why: &str| StoreError::Requeue {
            seq,
            why: why.to_string(),
        };
        let Some(mut msg) = self.read_locked(queue, seq) else {
            return Err(failed("message not found"));
        };
        msg.channel = channel.to_string();
        msg.attributes = None;
        let r = self.send(vec![msg]).await;
        match r.first() {
            Some(res) if !res.is_error => {
                self.ack(queue, &[seq]);
                Ok(())
            }
            Some(res) => Err(failed(&res.error)),
            None => Err(failed("no result")),
        }
    }

    /// Releases every delayed message due at `now` into its queue (4.3.8): a new sequence at
    /// release, DelayedTo 0, DelaySeconds 0, TTL counted from release.
    pub async fn release_due(&self, now: i64) {
        let due: Vec<((i64, u64), Entry)> = {
            let st = self.lock();
            st.delayed
                .range(..=(now, u64::MAX))
                .map(|(k, e)| (*k, *e))
                .collect()
        };
        for ((due_ns, id), e) in due {
            let msg = match self.log.read(e.loc, e.len) {
                Ok(record::Record {
                    kind:
                        Some(Kind::Delay(Delay {
                            message: Some(m), ..
                        })),
                }) => m,
                _ => {
                    tracing::error!(id, "delayed message unreadable; dropping it");
                    self.forget_delayed(due_ns, id, e);
                    continue;
                }
            };
            let mut msg = msg;
            let policy = msg.policy.get_or_insert_with(Default::default);
            policy.delay_seconds = 0;
            let ttl = policy.expiration_seconds;
            let attrs = msg.attributes.get_or_insert_with(Default::default);
            attrs.delayed_to = 0;
            attrs.timestamp = now;
            attrs.expiration_at = if ttl > 0 {
                now + i64::from(ttl) * 1_000_000_000
            } else {
                0
            };
            let mut buf = BytesMut::new();
            let (target, seq, len) = {
                let mut st = self.lock();
                let q = st.queue(&msg.channel);
                let seq = q.next_sequence();
                attrs.sequence = seq.get();
                let target = msg.channel.clone();
                let len = record::frame(&mut buf, Kind::Enqueue(Enqueue { message: Some(msg) }));
                record::frame(&mut buf, Kind::Release(Release { id }));
                (target, seq, len as u32)
            };
            match self.log.append(buf).await {
                Ok((base, _pin)) => {
                    self.forget_delayed(due_ns, id, e);
                    let mut st = self.lock();
                    st.add_live(base.segment);
                    let q = st.queue(&target);
                    q.ready.insert(seq, Entry { loc: base, len });
                    q.notify.notify_waiters();
                }
                Err(err) => {
                    tracing::error!(error = %err, "releasing a delayed message failed; will retry");
                    return;
                }
            }
        }
        self.reclaim();
    }

    fn forget_delayed(&self, due: i64, id: u64, e: Entry) {
        let mut st = self.lock();
        if st.delayed.remove(&(due, id)).is_some() {
            st.delay_keys.remove(&id);
            st.drop_live(e.loc.segment);
        }
    }

    /// Deletes closed segments from the oldest while nothing in them is live. A segment with an
    /// append not yet counted (pinned) is live too: it is checked first, because an appender
    /// counts its records before it unpins.
    fn reclaim(&self) {
        let active = self.log.active_segment();
        for seg in self.log.segments() {
            if seg >= active || self.log.pinned(seg) {
                break;
            }
            let live = self.lock().live.get(&seg).copied().unwrap_or(0);
            if live > 0 {
                break;
            }
            match self.log.remove(seg) {
                Ok(true) => {
                    self.lock().live.remove(&seg);
                }
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(segment = seg, error = %e, "could not delete a spent segment");
                    break;
                }
            }
        }
    }

    /// Acks every ready message of `queue` (AckAllQueueMessages, 4.4); returns how many.
    pub fn purge(&self, queue: &str) -> u64 {
        let seqs: Vec<Seq> = {
            let mut st = self.lock();
            let q = st.queue(queue);
            let taken: Vec<(Seq, Entry)> = std::mem::take(&mut q.ready).into_iter().collect();
            let seqs = taken.iter().map(|(s, _)| *s).collect();
            q.locked.extend(taken);
            seqs
        };
        self.ack(queue, &seqs);
        seqs.len() as u64
    }

    /// Per-queue figures for QueuesInfo, by name, of the queues `filter` names (KubeMQ's
    /// `;`-separated list; empty for every queue).
    pub fn queue_stats(&self, filter: &str) -> Vec<QueueStats> {
        let wanted: Vec<&str> = filter.split(';').filter(|s| !s.is_empty()).collect();
        let st = self.lock();
        let mut v: Vec<QueueStats> = st
            .queues
            .iter()
            .filter(|(name, _)| wanted.is_empty() || wanted.contains(&name.as_str()))
            .map(|(name, q)| {
                let first = q
                    .ready
                    .keys()
                    .next()
                    .copied()
                    .into_iter()
                    .chain(q.locked.keys().copied())
                    .min()
                    .unwrap_or(Seq::NONE);
                QueueStats {
                    name: name.clone(),
                    ready: q.ready.len() as u64,
                    locked: q.locked.len() as u64,
                    first_sequence: first.get(),
                    last_sequence: q.last_sequence.get(),
                }
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Messages ready (not locked, not delayed) in `queue`.
    pub fn ready_count(&self, queue: &str) -> usize {
        self.lock().queues.get(queue).map_or(0, |q| q.ready.len())
    }

    /// Messages locked by Gets in `queue`.
    pub fn locked_count(&self, queue: &str) -> usize {
        self.lock().queues.get(queue).map_or(0, |q| q.locked.len())
    }

    /// Segment files on disk.
    pub fn segment_count(&self) -> usize {
        self.log.segments().len()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}

/// Runs `work` — a write to a log and the bookkeeping that counts it — to its end in a task of
/// its own, whether or not its caller keeps waiting: a record in the log but not counted in
/// memory would leave memory behind the log (a gRPC client that hangs up drops its call
/// mid-write). `None` when the task could not finish (the runtime is shutting down).
async fn to_the_end<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    tokio::spawn(work).await.ok()
}

/// A send's messages once placed: every message's result, the valid ones' records to write,
/// and where each of those goes.
struct Placement {
    results: Vec<SendQueueMessageResult>,
    records: BytesMut,
    placed: Vec<Placed>,
}

/// Where one message of a send goes once its write is done.
struct Placed {
    /// Its queue or the delayed messages.
    goes: Goes,
    /// Where its record starts in the written bytes.
    offset: usize,
    /// Its record's length.
    len: u32,
}

/// Where a placed message is counted.
enum Goes {
    /// Ready in queue `name` at `seq`.
    Queue { name: String, seq: Seq },
    /// Among the delayed messages, as `id`, until `due` (Unix ns).
    Delayed { id: u64, due: i64 },
}

/// Messages a Get has locked but not yet handed over; returned to the queue if the Get is
/// cancelled.
struct Collected<'a> {
    store: &'a Store,
    queue: String,
    seqs: Vec<Seq>,
}

impl Collected<'_> {
    /// Stops answering for `seq`: it was settled, or is being moved, meanwhile.
    fn forget(&mut self, seq: Seq) {
        self.seqs.retain(|s| *s != seq);
    }
}

impl Drop for Collected<'_> {
    fn drop(&mut self) {
        if !self.seqs.is_empty() {
            self.store.release(&self.queue, &self.seqs);
        }
    }
}

/// Applies one replayed record to the state.
fn replay(st: &mut State, rec: record::Record, e: Entry) {
    match rec.kind {
        Some(Kind::Checkpoint(cp)) => {
            for (q, last) in cp.last_sequence {
                let qs = st.queue(&q);
                qs.last_sequence = qs.last_sequence.max(Seq::new(last));
            }
            st.next_delay_id = st.next_delay_id.max(cp.next_delay_id);
        }
        Some(Kind::Enqueue(Enqueue { message: Some(m) })) => {
            let seq = Seq::new(m.attributes.as_ref().map_or(0, |a| a.sequence));
            let qs = st.queue(&m.channel);
            qs.last_sequence = qs.last_sequence.max(seq);
            qs.ready.insert(seq, e);
            st.add_live(e.loc.segment);
        }
        Some(Kind::Ack(a)) => {
            let removed = st.queue(&a.queue).ready.remove(&Seq::new(a.sequence));
            if let Some(old) = removed {
                st.drop_live(old.loc.segment);
            }
        }
        Some(Kind::Delay(d)) => {
            st.delayed.insert((d.due_ns, d.id), e);
            st.delay_keys.insert(d.id, d.due_ns);
            st.next_delay_id = st.next_delay_id.max(d.id + 1);
            st.add_live(e.loc.segment);
        }
        Some(Kind::Release(r)) => {
            if let Some(due) = st.delay_keys.remove(&r.id) {
                if let Some(old) = st.delayed.remove(&(due, r.id)) {
                    st.drop_live(old.loc.segment);
                }
            }
        }
        // The stream log's kinds never appear in the queue log.
        Some(Kind::Enqueue(Enqueue { message: None }))
        | Some(Kind::Stored(_))
        | Some(Kind::Cursor(_))
        | None => {}
    }
}

/// The send result of a message the store refused.
fn error_result(message_id: String, refusal: StoreError) -> SendQueueMessageResult {
    SendQueueMessageResult {
        message_id,
        is_error: true,
        error: refusal.to_string(),
        ..Default::default()
    }
}

/// Validates a message in KubeMQ's order (4.2 step 3) and stamps it: MessageID, Attributes
/// (server-owned), Policy defaults. Returns the message id and the refusal on failure.
fn stamp(mut msg: QueueMessage, now: i64) -> Result<QueueMessage, (String, StoreError)> {
    if msg.message_id.is_empty() {
        msg.message_id = crate::kubemq::new_id();
    }
    let id = msg.message_id.clone();
    if msg.client_id.is_empty() {
        return Err((id, StoreError::ClientIdEmpty));
    }
    if !valid_queue_name(&msg.channel) {
        return Err((id, StoreError::QueueNameInvalid));
    }
    if msg.metadata.is_empty() && msg.body.is_empty() {
        return Err((id, StoreError::MessageEmpty));
    }
    let mut policy = msg.policy.take().unwrap_or_default();
    if !(0..=MAX_POLICY_SECONDS).contains(&policy.expiration_seconds) {
        return Err((id, StoreError::ExpirationInvalid));
    }
    if !(0..=MAX_RECEIVE_COUNT).contains(&policy.max_receive_count) {
        return Err((id, StoreError::MaxReceiveInvalid));
    }
    if !(0..=MAX_POLICY_SECONDS).contains(&policy.delay_seconds) {
        return Err((id, StoreError::DelayInvalid));
    }
    if !policy.max_receive_queue.is_empty() && !valid_queue_name(&policy.max_receive_queue) {
        return Err((id, StoreError::QueueNameInvalid));
    }
    if policy.max_receive_count == 0 {
        policy.max_receive_count = MAX_RECEIVE_COUNT;
    }
    const NS: i64 = 1_000_000_000;
    let delay = i64::from(policy.delay_seconds) * NS;
    msg.attributes = Some(QueueMessageAttributes {
        timestamp: now,
        expiration_at: if policy.expiration_seconds > 0 {
            now + i64::from(policy.expiration_seconds) * NS + delay
        } else {
            0
        },
        delayed_to: if policy.delay_seconds > 0 {
            now + delay
        } else {
            0
        },
        ..Default::default()
    });
    msg.policy = Some(policy);
    Ok(msg)
}

#[cfg(test)]
mod tests;
