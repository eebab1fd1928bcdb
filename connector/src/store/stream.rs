//! The events-store (KubeMQ 4.6): per-channel persisted streams with sequences from 1 that are
//! never reused, subscriptions that start where the subscriber asks, and durable cursors.
//!
//! Events live in their own log (the same segment files, group commit and recovery as the
//! queue log) in `<store>/events-store`; memory holds an index of where each event is. A
//! subscription without a group has a cursor keyed by (ClientID, channel), a group shares one
//! keyed by (channel, group); a subscriber that comes back resumes its cursor and its start
//! position is ignored, as on KubeMQ. An event counts as consumed once it is in the
//! subscription's buffer. Cursors go to the log as they move (without an fsync of their own),
//! so a crash may deliver the last few again but never skips one. Events older than the
//! retention period go with their segment.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::BytesMut;
use tokio::sync::{mpsc, Notify};

use super::errors::{subscribe_channel, valid_stream_client_id, StoreError, SubscribeKind};
use super::log::{self, Location, Log};
use super::now_ns;
use super::record::{self, Checkpoint, Cursor, Kind, StoredEvent};
use crate::kubemq::subscribe::EventsStoreType;
use crate::kubemq::{Event, EventReceive};

/// How long events are kept by default (KubeMQ's default retention).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Events a subscription's buffer holds; the reader waits for room (nothing is dropped).
pub const SUBSCRIPTION_BUFFER: usize = 256;
/// Events read from disk at a time for one subscription.
const READ_BATCH: usize = 256;

/// Where a subscription starts (the Subscribe request's EventsStoreType and value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// Events stored after the subscription starts.
    NewOnly,
    /// The oldest retained event.
    First,
    /// The newest stored event, then new ones.
    Last,
    /// This sequence (clamped to what is retained; past the end: new only).
    Sequence(u64),
    /// The first event stored at or after this Unix time in ns.
    Time(i64),
    /// The first event stored within this many seconds before now.
    TimeDelta(i64),
}

impl StartAt {
    /// The start position of a Subscribe request, or KubeMQ's refusal (Error 111 … 114).
    pub fn from_request(kind: i32, value: i64) -> Result<StartAt, StoreError> {
        match EventsStoreType::try_from(kind).unwrap_or(EventsStoreType::Undefined) {
            EventsStoreType::Undefined => Err(StoreError::SubscriptionTypeUndefined),
            EventsStoreType::StartNewOnly => Ok(StartAt::NewOnly),
            EventsStoreType::StartFromFirst => Ok(StartAt::First),
            EventsStoreType::StartFromLast => Ok(StartAt::Last),
            EventsStoreType::StartAtSequence if value > 0 => Ok(StartAt::Sequence(value as u64)),
            EventsStoreType::StartAtSequence => Err(StoreError::StartSequenceInvalid),
            EventsStoreType::StartAtTime if value > 0 => Ok(StartAt::Time(value)),
            EventsStoreType::StartAtTime => Err(StoreError::StartTimeInvalid),
            EventsStoreType::StartAtTimeDelta if value > 0 => Ok(StartAt::TimeDelta(value)),
            EventsStoreType::StartAtTimeDelta => Err(StoreError::StartDeltaInvalid),
        }
    }
}

/// Where an event is in the log.
#[derive(Debug, Clone, Copy)]
struct Indexed {
    ts: i64,
    loc: Location,
    len: u32,
}

#[derive(Default)]
struct ChannelLog {
    last_sequence: u64,
    /// Stored events by sequence.
    events: BTreeMap<u64, Indexed>,
    /// Every sequence up to this one is stored or lost for good: subscribers read up to here,
    /// so an event still being written never lets a later one overtake it.
    visible: u64,
    /// Sequences whose write failed: skipped when `visible` moves.
    failed: HashSet<u64>,
    /// Sequences being written, with their timestamps: a subscription starting now counts them
    /// as stored, or it would miss them.
    writing: BTreeMap<u64, i64>,
    notify: Arc<Notify>,
}

impl ChannelLog {
    fn advance(&mut self) {
        loop {
            let next = self.visible + 1;
            if self.events.contains_key(&next) || self.failed.remove(&next) {
                self.visible = next;
            } else {
                return;
            }
        }
    }

    /// The sequence a new subscription starts at.
    fn start(&self, at: StartAt, now: i64) -> u64 {
        let new_only = self.last_sequence + 1;
        let first_of = |stored: Option<u64>, writing: Option<u64>| match (stored, writing) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(new_only),
        };
        let first = first_of(
            self.events.keys().next().copied(),
            self.writing.keys().next().copied(),
        );
        let at_time = |t: i64| {
            first_of(
                self.events.iter().find(|(_, e)| e.ts >= t).map(|(s, _)| *s),
                self.writing
                    .iter()
                    .find(|(_, ts)| **ts >= t)
                    .map(|(s, _)| *s),
            )
        };
        match at {
            StartAt::NewOnly => new_only,
            StartAt::First => first,
            StartAt::Last => self.last_sequence.max(first.min(new_only)),
            StartAt::Sequence(n) if n > self.last_sequence => new_only,
            StartAt::Sequence(n) => n.max(first),
            StartAt::Time(t) => at_time(t),
            StartAt::TimeDelta(s) => at_time(now.saturating_sub(s.saturating_mul(1_000_000_000))),
        }
    }
}

/// Who owns a cursor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum CursorKey {
    Client { client_id: String, channel: String },
    Group { channel: String, group: String },
}

impl CursorKey {
    fn record(&self, next: u64, touched_ns: i64, removed: bool) -> Cursor {
        let (client_id, channel, group) = match self {
            CursorKey::Client { client_id, channel } => (client_id.clone(), channel.clone(), ""),
            CursorKey::Group { channel, group } => (String::new(), channel.clone(), group.as_str()),
        };
        Cursor {
            client_id,
            channel,
            group: group.to_string(),
            next,
            touched_ns,
            removed,
        }
    }

    fn of(c: &Cursor) -> CursorKey {
        if c.group.is_empty() {
            CursorKey::Client {
                client_id: c.client_id.clone(),
                channel: c.channel.clone(),
            }
        } else {
            CursorKey::Group {
                channel: c.channel.clone(),
                group: c.group.clone(),
            }
        }
    }
}

/// A group's live members, fed by one reader.
#[derive(Default)]
struct Members {
    senders: Vec<mpsc::Sender<EventReceive>>,
    turn: usize,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, ChannelLog>,
    /// Next sequence to deliver and last use, per cursor.
    cursors: HashMap<CursorKey, (u64, i64)>,
    /// ClientIDs with a live subscription.
    active: HashSet<String>,
    /// Live groups: their members, shared with the group's reader.
    groups: HashMap<CursorKey, Arc<Mutex<Members>>>,
    /// Newest store time of the events in each segment.
    newest_in_segment: BTreeMap<u64, i64>,
}

impl State {
    fn channel(&mut self, name: &str) -> &mut ChannelLog {
        self.channels.entry(name.to_string()).or_default()
    }

    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            last_sequence: self
                .channels
                .iter()
                .map(|(k, c)| (k.clone(), c.last_sequence))
                .collect(),
            next_delay_id: 0,
            cursors: self
                .cursors
                .iter()
                .map(|(k, (next, touched))| k.record(*next, *touched, false))
                .collect(),
        }
    }
}

/// What opening the events-store found.
#[derive(Debug, Clone, Default)]
pub struct StreamReport {
    /// Damaged bytes skipped or truncated.
    pub dropped: Vec<log::Dropped>,
    /// Events retained, all channels.
    pub events: usize,
}

/// The events-store.
pub struct Streams {
    log: Log,
    state: Arc<Mutex<State>>,
    retention_ns: i64,
    stop: Arc<Notify>,
}

impl Streams {
    /// Opens (or creates) the events-store in `dir`, replaying its log.
    pub fn open(
        dir: &Path,
        segment_bytes: u64,
        retention: Duration,
    ) -> io::Result<(Arc<Streams>, StreamReport)> {
        let mut st = State::default();
        let (segments, dropped) =
            log::recover(dir, |rec, loc, len| replay(&mut st, rec, loc, len))?;
        for c in st.channels.values_mut() {
            // Everything recovered is stored; gaps are events lost to retention or a crash.
            c.visible = c.last_sequence;
        }
        let report = StreamReport {
            dropped,
            events: st.channels.values().map(|c| c.events.len()).sum(),
        };
        let state = Arc::new(Mutex::new(st));
        let log = Log::start(
            dir,
            &segments,
            segment_bytes,
            log::checkpoints(state.clone(), State::checkpoint),
        )?;
        let streams = Arc::new(Streams {
            log,
            state,
            retention_ns: i64::try_from(retention.as_nanos()).unwrap_or(i64::MAX),
            stop: Arc::new(Notify::new()),
        });
        streams.expire(now_ns());
        Ok((streams, report))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the task that drops expired events every few seconds. Needs a runtime.
    pub fn start_expiry(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.notified() => return,
                }
                let Some(streams) = weak.upgrade() else {
                    return;
                };
                streams.expire(now_ns());
            }
        });
    }

    /// Stops background work and flushes the log.
    pub fn close(&self) {
        self.stop.notify_waiters();
        self.log.close();
    }

    /// Stores an event (`Store = true`): validated as KubeMQ does, given the channel's next
    /// sequence, and on disk when this returns.
    pub async fn append(self: &Arc<Self>, event: Event) -> Result<EventReceive, StoreError> {
        super::errors::event_validation(&event)?;
        if !super::errors::valid_queue_name(&event.channel) {
            return Err(StoreError::StreamChannelInvalid);
        }
        let ts = now_ns();
        let event_id = if event.event_id.is_empty() {
            crate::kubemq::new_id()
        } else {
            event.event_id
        };
        let (written, stored) = {
            let mut st = self.lock();
            let c = st.channel(&event.channel);
            c.last_sequence += 1;
            c.writing.insert(c.last_sequence, ts);
            let stored = EventReceive {
                event_id,
                channel: event.channel,
                metadata: event.metadata,
                body: event.body,
                timestamp: ts,
                sequence: c.last_sequence,
                tags: event.tags,
            };
            let mut b = BytesMut::new();
            record::frame(
                &mut b,
                Kind::Stored(StoredEvent {
                    event: Some(stored.clone()),
                }),
            );
            let len = b.len() as u32;
            // Handed to the writer under the lock, so the log holds a channel's events in
            // sequence order.
            ((self.log.append_in_order(b), len), stored)
        };
        let (written, len) = written;
        // Indexed by a task of its own: a caller that goes away while the event is written (a
        // gRPC client hanging up) must not leave its sequence unresolved, which would hold back
        // every later event of the channel.
        let streams = self.clone();
        super::to_the_end(async move {
            let result = written.await;
            streams.written(stored, ts, len, result)
        })
        .await
        .ok_or(StoreError::StreamWriteAbandoned)?
    }

    /// Records how the write of `stored` ended: indexed and visible in order, or skipped.
    fn written(
        &self,
        stored: EventReceive,
        ts: i64,
        len: u32,
        result: io::Result<(Location, log::SegmentPin)>,
    ) -> Result<EventReceive, StoreError> {
        let mut st = self.lock();
        let c = st.channel(&stored.channel);
        c.writing.remove(&stored.sequence);
        match result {
            Ok((loc, pin)) => {
                c.events.insert(stored.sequence, Indexed { ts, loc, len });
                drop(pin);
                c.advance();
                c.notify.notify_waiters();
                let newest = st.newest_in_segment.entry(loc.segment).or_default();
                *newest = (*newest).max(ts);
                Ok(stored)
            }
            Err(e) => {
                c.failed.insert(stored.sequence);
                c.advance();
                c.notify.notify_waiters();
                Err(StoreError::StreamWrite(e.to_string()))
            }
        }
    }

    /// Subscribes to `channel`'s stream from `start` (or from the subscriber's cursor if it has
    /// one). With a `group`, members share one cursor and each event goes to one of them. The
    /// subscription ends when the returned receiver is dropped.
    pub fn subscribe(
        self: &Arc<Self>,
        client_id: &str,
        channel: &str,
        group: &str,
        start: StartAt,
    ) -> Result<mpsc::Receiver<EventReceive>, StoreError> {
        self.subscribe_replaying(client_id, channel, group, start)
            .map(|(rx, _)| rx)
    }

    /// [`Streams::subscribe`], also saying whether the subscription starts with stored events to
    /// replay (a new member of a live group joins its reader where it is: never).
    pub fn subscribe_replaying(
        self: &Arc<Self>,
        client_id: &str,
        channel: &str,
        group: &str,
        start: StartAt,
    ) -> Result<(mpsc::Receiver<EventReceive>, bool), StoreError> {
        subscribe_channel(client_id, channel, SubscribeKind::EventsStore)?;
        if !valid_stream_client_id(client_id) {
            return Err(StoreError::StreamClientIdInvalid);
        }
        if !super::errors::valid_queue_name(channel)
            || (!group.is_empty() && (channel.contains(':') || group.contains(':')))
        {
            return Err(StoreError::StreamChannelInvalid);
        }
        let now = now_ns();
        let (tx, rx) = mpsc::channel(SUBSCRIPTION_BUFFER);
        let mut st = self.lock();
        if !st.active.insert(client_id.to_string()) {
            return Err(StoreError::StreamClientIdTaken);
        }
        let key = if group.is_empty() {
            CursorKey::Client {
                client_id: client_id.to_string(),
                channel: channel.to_string(),
            }
        } else {
            CursorKey::Group {
                channel: channel.to_string(),
                group: group.to_string(),
            }
        };
        let claim = Claim {
            streams: Arc::downgrade(self),
            client_id: client_id.to_string(),
        };
        if let Some(members) = st.groups.get(&key) {
            // A live group: the new member joins its reader.
            members
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .senders
                .push(tx.clone());
            tokio::spawn(hold_claim(claim, tx));
            return Ok((rx, false));
        }
        let next = match st.cursors.get(&key) {
            Some((next, _)) => *next,
            None => st.channel(channel).start(start, now),
        };
        st.cursors.insert(key.clone(), (next, now));
        let replaying = next <= st.channel(channel).visible;
        let sink = if group.is_empty() {
            Sink::One(tx)
        } else {
            let members = Arc::new(Mutex::new(Members {
                senders: vec![tx.clone()],
                turn: 0,
            }));
            st.groups.insert(key.clone(), members.clone());
            tokio::spawn(hold_claim(claim.clone(), tx));
            Sink::Group(members)
        };
        let notify = st.channel(channel).notify.clone();
        drop(st);
        let reader = Reader {
            streams: Arc::downgrade(self),
            channel: channel.to_string(),
            key,
            next,
            notify,
            sink,
            stop: self.stop.clone(),
        };
        tokio::spawn(reader.run(claim));
        Ok((rx, replaying))
    }

    /// Deletes every subscription cursor of `client_id` (one per channel it subscribed to): the
    /// next subscription with that ClientID starts from its start position. Returns how many
    /// there were.
    pub fn forget(&self, client_id: &str) -> usize {
        let removed: Vec<CursorKey> = {
            let mut st = self.lock();
            let keys: Vec<CursorKey> = st
                .cursors
                .keys()
                .filter(|k| matches!(k, CursorKey::Client { client_id: c, .. } if c == client_id))
                .cloned()
                .collect();
            for k in &keys {
                st.cursors.remove(k);
            }
            keys
        };
        let now = now_ns();
        for key in &removed {
            let mut b = BytesMut::new();
            record::frame(&mut b, Kind::Cursor(key.record(0, now, true)));
            self.log.append_nowait(b);
        }
        removed.len()
    }

    /// First retained and last sequence of `channel` (0, 0 when it has none).
    pub fn bounds(&self, channel: &str) -> (u64, u64) {
        let st = self.lock();
        st.channels.get(channel).map_or((0, 0), |c| {
            (
                c.events.keys().next().copied().unwrap_or(0),
                c.last_sequence,
            )
        })
    }

    /// Drops what is older than the retention period: whole segments, their index entries and
    /// cursors unused for as long.
    fn expire(&self, now: i64) {
        let horizon = now.saturating_sub(self.retention_ns);
        let active = self.log.active_segment();
        let spent: Vec<u64> = {
            let st = self.lock();
            st.newest_in_segment
                .iter()
                .take_while(|(seg, newest)| **seg < active && **newest < horizon)
                .map(|(seg, _)| *seg)
                .collect()
        };
        for &seg in &spent {
            if !matches!(self.log.remove(seg), Ok(true)) {
                break;
            }
            let mut st = self.lock();
            st.newest_in_segment.remove(&seg);
            for c in st.channels.values_mut() {
                c.events.retain(|_, e| e.loc.segment != seg);
            }
        }
        let mut st = self.lock();
        let active_ids = st.active.clone();
        st.cursors.retain(|k, (_, touched)| {
            *touched >= horizon
                || matches!(k, CursorKey::Client { client_id, .. } if active_ids.contains(client_id))
        });
        // Segments without events (checkpoints and cursors only) go once a later one exists.
        drop(st);
        for seg in self.log.segments() {
            if seg + 1 >= active || self.lock().newest_in_segment.contains_key(&seg) {
                break;
            }
            if !matches!(self.log.remove(seg), Ok(true)) {
                break;
            }
        }
    }

    /// Reads the indexed events of `channel` from `next` on, up to what is visible.
    fn read(&self, channel: &str, next: u64) -> Vec<EventReceive> {
        let spans: Vec<(Location, u32)> = {
            let st = self.lock();
            let Some(c) = st.channels.get(channel) else {
                return Vec::new();
            };
            if next > c.visible {
                return Vec::new();
            }
            c.events
                .range(next..=c.visible)
                .take(READ_BATCH)
                .map(|(_, e)| (e.loc, e.len))
                .collect()
        };
        self.log
            .read_many(&spans)
            .into_iter()
            .filter_map(|r| match r {
                Ok(record::Record {
                    kind: Some(Kind::Stored(StoredEvent { event: Some(e) })),
                }) => Some(e),
                Ok(_) => None,
                Err(e) => {
                    // A segment expired under the reader: its events are gone.
                    tracing::debug!(error = %e, "events-store read skipped");
                    None
                }
            })
            .collect()
    }

    /// The next sequence after `next` that is visible, skipping gaps (expired or lost events).
    fn skip_gap(&self, channel: &str, next: u64) -> u64 {
        let st = self.lock();
        let Some(c) = st.channels.get(channel) else {
            return next;
        };
        if next > c.visible {
            return next;
        }
        c.events
            .range(next..=c.visible)
            .next()
            .map_or(c.visible + 1, |(s, _)| *s)
    }

    fn save_cursor(&self, key: &CursorKey, next: u64) {
        let now = now_ns();
        self.lock().cursors.insert(key.clone(), (next, now));
        let mut b = BytesMut::new();
        record::frame(&mut b, Kind::Cursor(key.record(next, now, false)));
        self.log.append_nowait(b);
    }
}

/// A live subscription's hold on its ClientID: released when dropped.
#[derive(Clone)]
struct Claim {
    streams: Weak<Streams>,
    client_id: String,
}

impl Claim {
    fn release(&self) {
        if let Some(s) = self.streams.upgrade() {
            s.lock().active.remove(&self.client_id);
        }
    }
}

/// Keeps a group member's ClientID claimed until its receiver is dropped.
async fn hold_claim(claim: Claim, tx: mpsc::Sender<EventReceive>) {
    tx.closed().await;
    claim.release();
}

enum Sink {
    One(mpsc::Sender<EventReceive>),
    Group(Arc<Mutex<Members>>),
}

/// Feeds one subscription (or one group) from its cursor.
struct Reader {
    streams: Weak<Streams>,
    channel: String,
    key: CursorKey,
    next: u64,
    notify: Arc<Notify>,
    sink: Sink,
    stop: Arc<Notify>,
}

impl Reader {
    async fn run(mut self, claim: Claim) {
        loop {
            let notified = self.notify.clone();
            let notified = notified.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let Some(streams) = self.streams.upgrade() else {
                return;
            };
            let batch = streams.read(&self.channel, self.next);
            if batch.is_empty() {
                let skipped = streams.skip_gap(&self.channel, self.next);
                if skipped != self.next {
                    self.next = skipped;
                    continue;
                }
                drop(streams);
                let gone = async {
                    match &self.sink {
                        Sink::One(tx) => tx.closed().await,
                        // A group ends when its last member leaves; checked on each wake.
                        Sink::Group(_) => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    _ = notified => {}
                    _ = gone => break,
                    _ = self.stop.notified() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)), if matches!(self.sink, Sink::Group(_)) => {
                        if self.try_end_group() { break; }
                    }
                }
                continue;
            }
            drop(streams);
            let mut ended = false;
            for e in batch {
                let seq = e.sequence;
                if !self.deliver(e).await {
                    ended = true;
                    break;
                }
                self.next = seq + 1;
            }
            if let Some(streams) = self.streams.upgrade() {
                streams.save_cursor(&self.key, self.next);
            }
            if ended {
                break;
            }
        }
        if let Some(streams) = self.streams.upgrade() {
            streams.save_cursor(&self.key, self.next);
        }
        if let Sink::One(_) = &self.sink {
            claim.release();
        }
    }

    /// Ends a group whose members all left: under the state lock (taken before the members'
    /// lock, as `subscribe` takes them), so a member joining at the same moment either joins
    /// this reader before it checks or finds no live group and starts a new reader.
    fn try_end_group(&self) -> bool {
        let Sink::Group(members) = &self.sink else {
            return false;
        };
        let Some(streams) = self.streams.upgrade() else {
            return true;
        };
        let mut st = streams.lock();
        let mut m = members.lock().unwrap_or_else(|e| e.into_inner());
        m.senders.retain(|s| !s.is_closed());
        if m.senders.is_empty() {
            st.groups.remove(&self.key);
            true
        } else {
            false
        }
    }

    /// Hands one event to the subscriber (or a group member in turn), waiting for room;
    /// false when no one is left to take it.
    async fn deliver(&self, e: EventReceive) -> bool {
        match &self.sink {
            Sink::One(tx) => tx.send(e).await.is_ok(),
            Sink::Group(members) => loop {
                let member = {
                    let mut m = members.lock().unwrap_or_else(|e| e.into_inner());
                    m.senders.retain(|s| !s.is_closed());
                    m.turn = m.turn.wrapping_add(1);
                    let turn = m.turn;
                    m.senders.get(turn % m.senders.len().max(1)).cloned()
                };
                let Some(member) = member else {
                    if self.try_end_group() {
                        return false;
                    }
                    continue;
                };
                if member.send(e.clone()).await.is_ok() {
                    return true;
                }
            },
        }
    }
}

fn replay(st: &mut State, rec: record::Record, loc: Location, len: u32) {
    match rec.kind {
        Some(Kind::Checkpoint(cp)) => {
            for (ch, last) in cp.last_sequence {
                let c = st.channel(&ch);
                c.last_sequence = c.last_sequence.max(last);
            }
            for cur in cp.cursors {
                st.cursors
                    .insert(CursorKey::of(&cur), (cur.next, cur.touched_ns));
            }
        }
        Some(Kind::Stored(StoredEvent { event: Some(e) })) => {
            let newest = st.newest_in_segment.entry(loc.segment).or_default();
            *newest = (*newest).max(e.timestamp);
            let c = st.channel(&e.channel);
            c.last_sequence = c.last_sequence.max(e.sequence);
            c.events.insert(
                e.sequence,
                Indexed {
                    ts: e.timestamp,
                    loc,
                    len,
                },
            );
        }
        Some(Kind::Cursor(cur)) => {
            let key = CursorKey::of(&cur);
            if cur.removed {
                st.cursors.remove(&key);
            } else {
                st.cursors.insert(key, (cur.next, cur.touched_ns));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::in_flight;
    use super::*;

    fn event(channel: &str, label: &str) -> Event {
        Event {
            client_id: "p".into(),
            channel: channel.into(),
            metadata: label.into(),
            store: true,
            ..Default::default()
        }
    }

    fn open(dir: &Path) -> Arc<Streams> {
        Streams::open(dir, log::SEGMENT_BYTES, DEFAULT_RETENTION)
            .expect("open")
            .0
    }

    async fn take(rx: &mut mpsc::Receiver<EventReceive>, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            let e = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("an event in time")
                .expect("subscription open");
            out.push(e.metadata);
        }
        out
    }

    async fn nothing_more(rx: &mut mpsc::Receiver<EventReceive>) {
        let got = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await;
        assert!(got.is_err(), "no further event: {got:?}");
    }

    async fn six(s: &Arc<Streams>, ch: &str) {
        for i in 0..6 {
            s.append(event(ch, &format!("es-{i:03}"))).await.unwrap();
        }
    }

    /// Appends `label` to `ch` and, while it is on its way to the log, subscribes `client` from
    /// `start`; whether the append was caught in flight, and the subscription once the append is
    /// done.
    async fn subscribe_during_append(
        s: &Arc<Streams>,
        ch: &str,
        label: &str,
        client: &str,
        start: StartAt,
    ) -> (bool, mpsc::Receiver<EventReceive>) {
        let append = s.append(event(ch, label));
        tokio::pin!(append);
        let raced = in_flight(append.as_mut()).await;
        let rx = s.subscribe(client, ch, "", start).unwrap();
        append.await.unwrap();
        (raced, rx)
    }

    /// A subscription from the first event that starts while a channel's first event is still
    /// being written gets that event.
    #[tokio::test]
    async fn from_first_includes_an_event_being_written() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let mut raced = false;
        for i in 0..20 {
            let ch = format!("race-{i}");
            let (caught, mut rx) =
                subscribe_during_append(&s, &ch, "first", &format!("c{i}"), StartAt::First).await;
            raced |= caught;
            assert_eq!(take(&mut rx, 1).await, ["first"], "{ch}");
        }
        assert!(raced, "no append was caught in flight");
    }

    /// A subscription from a point in time that starts while an event of that time is still
    /// being written gets it.
    #[tokio::test]
    async fn from_a_time_includes_an_event_being_written() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let mut raced = false;
        for i in 0..20 {
            let ch = format!("when-{i}");
            s.append(event(&ch, "before")).await.unwrap();
            let since = StartAt::Time(now_ns());
            let (caught, mut rx) =
                subscribe_during_append(&s, &ch, "during", &format!("c{i}"), since).await;
            raced |= caught;
            assert_eq!(take(&mut rx, 1).await, ["during"], "{ch}");
            nothing_more(&mut rx).await;
        }
        assert!(raced, "no append was caught in flight");
    }

    /// An append whose caller goes away while it is written (a gRPC client that hangs up) is
    /// still indexed: the event is in the log, and the events after it reach subscribers.
    #[tokio::test]
    async fn an_abandoned_append_does_not_stall_its_channel() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let mut raced = false;
        for i in 0..20 {
            let ch = format!("gone-{i}");
            {
                let append = s.append(event(&ch, "abandoned"));
                tokio::pin!(append);
                raced |= in_flight(append.as_mut()).await;
            }
            s.append(event(&ch, "next")).await.unwrap();
            let mut rx = s
                .subscribe(&format!("c{i}"), &ch, "", StartAt::First)
                .unwrap();
            assert_eq!(take(&mut rx, 2).await, ["abandoned", "next"], "{ch}");
        }
        assert!(raced, "no append was caught in flight");
    }

    /// KubeMQ 4.6: sequences start at 1 and each start position begins where its table says.
    #[tokio::test]
    async fn start_positions() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        six(&s, "ch").await;
        assert_eq!(s.bounds("ch"), (1, 6));
        let cases: [(StartAt, &[&str]); 6] = [
            (
                StartAt::First,
                &["es-000", "es-001", "es-002", "es-003", "es-004", "es-005"],
            ),
            (StartAt::Sequence(4), &["es-003", "es-004", "es-005"]),
            (StartAt::Last, &["es-005"]),
            (
                StartAt::TimeDelta(3600),
                &["es-000", "es-001", "es-002", "es-003", "es-004", "es-005"],
            ),
            (
                StartAt::Time(1),
                &["es-000", "es-001", "es-002", "es-003", "es-004", "es-005"],
            ),
            (StartAt::Sequence(1000), &[]),
        ];
        for (i, (at, want)) in cases.iter().enumerate() {
            let mut rx = s.subscribe(&format!("c{i}"), "ch", "", *at).unwrap();
            assert_eq!(take(&mut rx, want.len()).await, *want, "{at:?}");
            nothing_more(&mut rx).await;
        }
        let mut rx = s.subscribe("new", "ch", "", StartAt::NewOnly).unwrap();
        nothing_more(&mut rx).await;
        s.append(event("ch", "later")).await.unwrap();
        assert_eq!(take(&mut rx, 1).await, ["later"]);
        assert_eq!(
            StartAt::from_request(4, 0).unwrap_err(),
            StoreError::StartSequenceInvalid
        );
        assert_eq!(
            StartAt::from_request(0, 0).unwrap_err(),
            StoreError::SubscriptionTypeUndefined
        );
    }

    /// A ClientID resumes its cursor (its start position ignored); a second live subscription
    /// with the same ClientID is refused; a forgotten cursor starts afresh.
    #[tokio::test]
    async fn cursors_resume_per_client() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        six(&s, "ch").await;
        let mut rx = s.subscribe("d", "ch", "", StartAt::First).unwrap();
        assert_eq!(take(&mut rx, 6).await.len(), 6);
        assert_eq!(
            s.subscribe("d", "ch", "", StartAt::First).unwrap_err(),
            StoreError::StreamClientIdTaken
        );
        drop(rx);
        for i in 0..3 {
            s.append(event("ch", &format!("away-{i}"))).await.unwrap();
        }
        let mut rx = loop {
            match s.subscribe("d", "ch", "", StartAt::First) {
                Ok(rx) => break rx,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        assert_eq!(take(&mut rx, 3).await, ["away-0", "away-1", "away-2"]);
        nothing_more(&mut rx).await;
        drop(rx);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(s.forget("d"), 1);
        let mut rx = s.subscribe("d", "ch", "", StartAt::Sequence(8)).unwrap();
        assert_eq!(take(&mut rx, 2).await, ["away-1", "away-2"]);
    }

    /// A group's members share one cursor: each event goes to one member.
    #[tokio::test]
    async fn groups_share_a_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let mut a = s.subscribe("a", "ch", "g", StartAt::NewOnly).unwrap();
        let mut b = s.subscribe("b", "ch", "g", StartAt::First).unwrap();
        for i in 0..20 {
            s.append(event("ch", &format!("e{i}"))).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut got = Vec::new();
        let mut shares = Vec::new();
        for rx in [&mut a, &mut b] {
            let mut n = 0;
            while let Ok(e) = rx.try_recv() {
                got.push(e.sequence);
                n += 1;
            }
            shares.push(n);
        }
        got.sort_unstable();
        assert_eq!(got, (1..=20).collect::<Vec<_>>(), "each event once");
        assert!(
            shares.iter().all(|n| *n > 0),
            "both members served: {shares:?}"
        );
    }

    /// After a reopen, sequences continue and cursors hold.
    #[tokio::test]
    async fn reopen_keeps_sequences_and_cursors() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = open(dir.path());
            six(&s, "ch").await;
            let mut rx = s.subscribe("d", "ch", "", StartAt::First).unwrap();
            take(&mut rx, 4).await;
            drop(rx);
            tokio::time::sleep(Duration::from_millis(100)).await;
            s.close();
        }
        let s = open(dir.path());
        assert_eq!(s.bounds("ch"), (1, 6));
        let e = s.append(event("ch", "es-006")).await.unwrap();
        assert_eq!(e.sequence, 7);
        let mut rx = s.subscribe("d", "ch", "", StartAt::NewOnly).unwrap();
        // The six were all in the subscription's buffer when it ended: consumed, as on KubeMQ.
        assert_eq!(take(&mut rx, 1).await, ["es-006"]);
        nothing_more(&mut rx).await;
    }

    /// KubeMQ's refusals: wildcards, a ClientID outside `[A-Za-z0-9_-]`.
    #[tokio::test]
    async fn refusals() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        assert_eq!(
            s.subscribe("c", "a.*", "", StartAt::First).unwrap_err(),
            StoreError::ChannelWildcards
        );
        assert_eq!(
            s.subscribe("c d", "a", "", StartAt::First).unwrap_err(),
            StoreError::StreamClientIdInvalid
        );
        assert!(s.append(event("a/b", "x")).await.is_err());
    }

    /// A ClientID that comes back at once, while events arrive, resumes exactly where it
    /// stopped.
    #[tokio::test]
    async fn an_immediate_resume_misses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let s = Streams::open(dir.path(), log::SEGMENT_BYTES, DEFAULT_RETENTION)
            .unwrap()
            .0;
        let ev = |l: &str| Event {
            client_id: "p".into(),
            channel: "ch".into(),
            metadata: l.into(),
            store: true,
            ..Default::default()
        };
        s.append(ev("s0")).await.unwrap();
        let mut rx = s.subscribe("d", "ch", "", StartAt::NewOnly).unwrap();
        s.append(ev("d0")).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().metadata, "d0");
        drop(rx);
        s.append(ev("d1")).await.unwrap();
        s.append(ev("d2")).await.unwrap();
        let mut rx = loop {
            match s.subscribe("d", "ch", "", StartAt::NewOnly) {
                Ok(rx) => break rx,
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        };
        let a = tokio::time::timeout(Duration::from_secs(2), rx.recv()).await;
        assert_eq!(a.unwrap().unwrap().metadata, "d1");
    }
}
