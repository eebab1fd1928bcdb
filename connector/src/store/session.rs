//! One consumer session of the store: the transactions its Gets opened and the settlements on
//! them, with KubeMQ's effects and refusals (KMQ-5, KMQ-6, KMQ-7, KMQ-12). Calls are made one at
//! a time, in order. Dropping the session returns every unsettled message unchanged (4.3.7).
//!
//! The embedded backend calls it directly; the gRPC façade serves it as KubeMQ's
//! QueuesDownstream stream.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::errors::{self, StoreError, TxnError};
use super::{Seq, Store};
use crate::kubemq::{new_id, QueueMessage};

/// MaxItems used when a Get asks for ≤ 0 (4.3.2).
pub const UNBOUNDED_MAX_ITEMS: usize = 200_000;
/// The smallest WaitTimeout, in milliseconds.
pub const MIN_WAIT_MS: u64 = 1000;

/// How many closed transactions a session remembers. KubeMQ keeps every one for the stream's
/// life, so settling a closed transaction says "closed response"; a connector's shared session
/// lives as long as its consumers and makes thousands of Gets a second, so the table would grow
/// without bound. Past this many, the oldest is forgotten, and settling it gets the unknown-id
/// error, whose text ("transaction is completed or transaction id not found") covers it too.
pub const CLOSED_KEPT: usize = 4096;

/// A transaction's id, as KubeMQ makes them (a random UUID) and clients name them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TxnId(String);

impl TxnId {
    /// A new id.
    fn new() -> TxnId {
        TxnId(new_id())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for TxnId {
    fn from(id: &str) -> TxnId {
        TxnId(id.to_string())
    }
}

impl From<String> for TxnId {
    fn from(id: String) -> TxnId {
        TxnId(id)
    }
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a Get asks for (4.3.2).
#[derive(Debug, Clone, Copy)]
pub struct GetRequest<'a> {
    /// The queue.
    pub channel: &'a str,
    /// Who asks; KubeMQ requires one.
    pub client_id: &'a str,
    /// Most messages returned; ≤ 0 means [`UNBOUNDED_MAX_ITEMS`].
    pub max_items: i32,
    /// How long to wait for the first message, in milliseconds (at least [`MIN_WAIT_MS`]).
    pub wait_ms: i32,
    /// Acknowledge what is returned at once: no transaction stays open.
    pub auto_ack: bool,
}

/// What a Get returned: its transaction, and the messages in it (none when the wait ran out).
#[derive(Debug, Clone)]
pub struct Got {
    /// The transaction the messages are settled on.
    pub transaction: TxnId,
    /// The messages, with their Attributes.
    pub messages: Vec<QueueMessage>,
}

/// What a settlement does with messages of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposal {
    /// Done with: removed from the queue.
    Ack,
    /// Back to the tail with ReceiveCount + 1, or dead-lettered past MaxReceiveCount.
    Nack,
    /// Sent afresh to `channel`.
    Requeue {
        /// Where to.
        channel: String,
    },
}

/// Which messages of a transaction a settlement takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Which {
    /// Every one not settled yet; the transaction closes.
    All,
    /// These sequences, as the client listed them: applied up to the first that is not an
    /// unsettled message of the transaction, which fails the call.
    Listed(Vec<i64>),
}

/// What an imitation of KubeMQ watches of a session's transactions, to move messages between
/// them as KubeMQ's server does (the gRPC façade's `capture`, for tests).
pub trait TxnWatcher: Send + Sync + 'static {
    /// A Get on `queue` asked for `max_items`, returned `returned` messages and left `open` open.
    fn got(
        &self,
        store: &Store,
        queue: &str,
        max_items: usize,
        open: Option<&TxnId>,
        returned: usize,
    );
    /// `txn` has `unsettled` returned messages left; it stays open.
    fn settled(&self, store: &Store, queue: &str, txn: &TxnId, unsettled: usize);
    /// `txn` is closing with `unsettled` messages its client never settled: the watcher puts
    /// them where they go (the session does not release them).
    fn closing(&self, store: &Store, queue: &str, txn: &TxnId, unsettled: &[Seq]);
    /// `txn` closed.
    fn closed(&self, store: &Store, queue: &str, txn: &TxnId);
    /// Messages may have become ready on `queue`.
    fn arrived(&self, store: &Store, queue: &str);
}

/// An open transaction.
struct Txn {
    queue: String,
    /// Sequences handed out and not yet settled, in delivery order.
    unsettled: Vec<Seq>,
}

/// The ids of the session's most recently closed transactions, oldest first.
#[derive(Default)]
struct Closed {
    order: VecDeque<TxnId>,
    ids: HashSet<TxnId>,
}

impl Closed {
    fn insert(&mut self, id: TxnId) {
        if self.ids.insert(id.clone()) {
            self.order.push_back(id);
        }
        while self.order.len() > CLOSED_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
    }
}

/// One consumer session: its open transactions, and the ids of those closed lately.
pub struct Session {
    store: Arc<Store>,
    txns: HashMap<TxnId, Txn>,
    closed: Closed,
    watcher: Option<Arc<dyn TxnWatcher>>,
}

impl Session {
    /// A new session on `store`.
    pub fn new(store: Arc<Store>) -> Self {
        Session {
            store,
            txns: HashMap::new(),
            closed: Closed::default(),
            watcher: None,
        }
    }

    /// A new session whose transactions `watcher` watches.
    pub fn watched(store: Arc<Store>, watcher: Arc<dyn TxnWatcher>) -> Self {
        let mut session = Session::new(store);
        session.watcher = Some(watcher);
        session
    }

    /// (open transactions, closed ones remembered), for tests of the table's bounds.
    #[cfg(test)]
    pub(crate) fn table_sizes(&self) -> (usize, usize) {
        (self.txns.len(), self.closed.order.len())
    }

    /// A Get (4.3.2): waits for up to `max_items` messages or the wait, and opens a transaction
    /// holding them (none when nothing came, or with `auto_ack`).
    pub async fn get(&mut self, r: GetRequest<'_>) -> Result<Got, StoreError> {
        if r.client_id.is_empty() {
            return Err(StoreError::ClientIdEmpty);
        }
        if !errors::valid_queue_name(r.channel) {
            return Err(StoreError::QueueNameInvalid);
        }
        if r.channel.contains(':') {
            return Err(StoreError::CannotSubscribe);
        }
        let max = if r.max_items <= 0 {
            UNBOUNDED_MAX_ITEMS
        } else {
            r.max_items as usize
        };
        let wait = Duration::from_millis(u64::try_from(r.wait_ms).unwrap_or(0).max(MIN_WAIT_MS));
        let delivered = self.store.get(r.channel, max, wait).await;
        let id = TxnId::new();
        let seqs: Vec<Seq> = delivered.iter().map(|d| d.sequence).collect();
        if r.auto_ack {
            self.store.ack(r.channel, &seqs);
        }
        let opens = !r.auto_ack && !seqs.is_empty();
        if let Some(w) = &self.watcher {
            w.got(
                &self.store,
                r.channel,
                max,
                opens.then_some(&id),
                seqs.len(),
            );
        }
        if opens {
            let txn = Txn {
                queue: r.channel.to_string(),
                unsettled: seqs,
            };
            self.txns.insert(id.clone(), txn);
        } else {
            self.closed.insert(id.clone());
        }
        Ok(Got {
            transaction: id,
            messages: delivered.into_iter().map(|d| d.message).collect(),
        })
    }

    /// Settles messages of `txn` (4.3.4): acknowledged, NAcked or re-queued. With
    /// [`Which::All`], or once nothing is left unsettled, the transaction closes. A NAck or a
    /// re-queue is a send of its own that can fail; the first failure stops the rest.
    pub async fn settle(
        &mut self,
        txn: &TxnId,
        disposal: Disposal,
        which: Which,
    ) -> Result<(), TxnError> {
        let all = which == Which::All;
        let Some(t) = self.txns.get(txn) else {
            return Err(self.not_open(txn, closed_refusal(&disposal, all)));
        };
        let queue = t.queue.clone();
        if matches!(&disposal, Disposal::Requeue { channel } if channel.is_empty()) {
            return Err(TxnError::RequeueNoChannel);
        }
        let (seqs, mut failure) = match &which {
            Which::All => (t.unsettled.clone(), None),
            Which::Listed(listed) => {
                if listed.is_empty() {
                    return Err(match disposal {
                        Disposal::Ack => TxnError::AckEmpty,
                        Disposal::Nack => TxnError::NackEmpty,
                        Disposal::Requeue { .. } => TxnError::RequeueEmpty,
                    });
                }
                let (valid, bad) = pick(&t.unsettled, listed);
                // Entries before a bad one stay applied (4.3.4).
                let invalid = match disposal {
                    Disposal::Nack => TxnError::InvalidNackSequence,
                    _ => TxnError::InvalidAckSequence,
                };
                (valid, bad.map(invalid))
            }
        };
        let done: HashSet<Seq> = match &disposal {
            // Acks cannot fail and go to the store together.
            Disposal::Ack => {
                self.store.ack(&queue, &seqs);
                seqs.iter().copied().collect()
            }
            Disposal::Nack | Disposal::Requeue { .. } => {
                let mut done = HashSet::new();
                for s in &seqs {
                    // Out of the transaction before the write starts: a session dropped while
                    // it runs must not give back the original beside its copy. The store gives
                    // the message back itself if the write fails.
                    if let Some(t) = self.txns.get_mut(txn) {
                        t.unsettled.retain(|x| x != s);
                    }
                    let result = match &disposal {
                        Disposal::Requeue { channel } => {
                            self.store.requeue(&queue, *s, channel).await
                        }
                        _ => self.store.nack(&queue, *s).await,
                    };
                    match result {
                        Ok(()) => {
                            done.insert(*s);
                        }
                        Err(e) => {
                            failure = Some(TxnError::Store(e));
                            break;
                        }
                    }
                }
                done
            }
        };
        if let Some(t) = self.txns.get_mut(txn) {
            t.unsettled.retain(|x| !done.contains(x));
        }
        let ends = self
            .txns
            .get(txn)
            .is_some_and(|t| all || t.unsettled.is_empty());
        if ends {
            if let Some(t) = self.txns.remove(txn) {
                if !t.unsettled.is_empty() {
                    // A failed NAck/ReQueue of "all": whatever is left goes back unchanged.
                    self.store.release(&queue, &t.unsettled);
                }
            }
            self.closed.insert(txn.clone());
        }
        if let Some(w) = &self.watcher {
            if let Disposal::Requeue { channel } = &disposal {
                w.arrived(&self.store, channel);
            }
            self.watched_after(w.as_ref(), &queue, txn);
        }
        failure.map_or(Ok(()), Err)
    }

    /// The unsettled sequences of `txn`, in delivery order (ActiveOffsets).
    pub fn active_offsets(&self, txn: &TxnId) -> Result<Vec<Seq>, TxnError> {
        match self.txns.get(txn) {
            Some(t) => Ok(t.unsettled.clone()),
            None => Err(self.not_open(txn, TxnError::OffsetsClosed)),
        }
    }

    /// CloseByClient: every unsettled message of `txn` goes back unchanged; closing a closed
    /// transaction does nothing.
    pub fn close(&mut self, txn: &TxnId) -> Result<(), TxnError> {
        let Some(t) = self.txns.remove(txn) else {
            return if self.closed.ids.contains(txn) {
                Ok(())
            } else {
                Err(TxnError::NotFound)
            };
        };
        match &self.watcher {
            Some(w) => w.closing(&self.store, &t.queue, txn, &t.unsettled),
            None => self.store.release(&t.queue, &t.unsettled),
        }
        self.closed.insert(txn.clone());
        if let Some(w) = &self.watcher {
            self.watched_after(w.as_ref(), &t.queue, txn);
        }
        Ok(())
    }

    /// The refusal for a transaction that is not open: unknown, or closed (`closed`).
    fn not_open(&self, txn: &TxnId, closed: TxnError) -> TxnError {
        if self.closed.ids.contains(txn) {
            closed
        } else {
            TxnError::NotFound
        }
    }

    /// Tells the watcher how `txn` stands after a settlement.
    fn watched_after(&self, w: &dyn TxnWatcher, queue: &str, txn: &TxnId) {
        match self.txns.get(txn) {
            Some(t) => w.settled(&self.store, queue, txn, t.unsettled.len()),
            None => w.closed(&self.store, queue, txn),
        }
    }
}

/// KubeMQ's refusal of a settlement on a closed transaction, which names the operation (a
/// ReQueue of everything says "ack", as KubeMQ's does).
fn closed_refusal(disposal: &Disposal, all: bool) -> TxnError {
    match disposal {
        Disposal::Ack => TxnError::AckClosed,
        Disposal::Nack => TxnError::NackClosed,
        Disposal::Requeue { .. } if all => TxnError::AckClosed,
        Disposal::Requeue { .. } => TxnError::RequeueClosed,
    }
}

/// The listed sequences up to the first that is not an unsettled message of the transaction (or
/// repeats an earlier entry), and that first bad entry.
fn pick(unsettled: &[Seq], listed: &[i64]) -> (Vec<Seq>, Option<i64>) {
    let unsettled: HashSet<Seq> = unsettled.iter().copied().collect();
    let mut seen = HashSet::with_capacity(listed.len());
    let mut valid: Vec<Seq> = Vec::with_capacity(listed.len());
    for &s in listed {
        match Seq::try_from(s) {
            Ok(u) if unsettled.contains(&u) && seen.insert(u) => valid.push(u),
            _ => return (valid, Some(s)),
        }
    }
    (valid, None)
}

impl Drop for Session {
    fn drop(&mut self) {
        for (id, t) in self.txns.iter() {
            match &self.watcher {
                Some(w) => {
                    w.closing(&self.store, &t.queue, id, &t.unsettled);
                    w.closed(&self.store, &t.queue, id);
                }
                None => self.store.release(&t.queue, &t.unsettled),
            }
        }
    }
}
