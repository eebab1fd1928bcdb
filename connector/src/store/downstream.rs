//! One QueuesDownstream stream: its table of transactions and the operations on them, with
//! KubeMQ's effects and error texts (KMQ-5, KMQ-6, KMQ-7, KMQ-12). Requests are handled one
//! at a time by the caller, in arrival order; a successful settlement has no response.
//!
//! Dropping the stream returns every unsettled message unchanged (4.3.7).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::capture::Capture;
use super::errors::{self, StoreError, TxnError};
use super::Store;
use crate::kubemq::new_id;
use crate::kubemq::{
    QueuesDownstreamRequest, QueuesDownstreamRequestType as Op, QueuesDownstreamResponse,
};

/// MaxItems used when a Get asks for ≤ 0 (4.3.2).
pub const UNBOUNDED_MAX_ITEMS: usize = 200_000;
/// The smallest WaitTimeout, in milliseconds.
pub const MIN_WAIT_MS: u64 = 1000;

/// An open transaction.
struct Txn {
    queue: String,
    /// Sequences handed out and not yet settled, in delivery order.
    unsettled: Vec<u64>,
}

/// How many closed transactions a stream remembers. KubeMQ keeps every one for the stream's
/// life, so settling a closed transaction says "closed response"; a connector's shared session
/// lives as long as its consumers and makes thousands of Gets a second, so the table would grow
/// without bound. Past this many, the oldest is forgotten, and settling it gets the unknown-id
/// error, whose text ("transaction is completed or transaction id not found") covers it too.
pub const CLOSED_KEPT: usize = 4096;

/// The ids of the stream's most recently closed transactions, oldest first.
#[derive(Default)]
struct Closed {
    order: VecDeque<String>,
    ids: HashSet<String>,
}

impl Closed {
    fn insert(&mut self, id: String) {
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

/// The per-stream transaction table: the open transactions, and the ids of those closed lately.
pub struct Downstream {
    store: Arc<Store>,
    txns: HashMap<String, Txn>,
    closed: Closed,
    /// KubeMQ's capture of messages by open transactions, when the façade imitates it.
    capture: Option<Arc<Capture>>,
}

fn error(
    txn_id: &str,
    req: &QueuesDownstreamRequest,
    op: Op,
    refusal: TxnError,
) -> QueuesDownstreamResponse {
    QueuesDownstreamResponse {
        transaction_id: txn_id.to_string(),
        ref_request_id: req.request_id.clone(),
        request_type_data: op as i32,
        is_error: true,
        error: refusal.to_string(),
        ..Default::default()
    }
}

impl Downstream {
    /// A new stream on `store`.
    pub fn new(store: Arc<Store>) -> Self {
        Downstream {
            store,
            txns: HashMap::new(),
            closed: Closed::default(),
            capture: None,
        }
    }

    /// A new stream whose open transactions capture messages as KubeMQ's do ([`Capture`]).
    pub fn capturing(store: Arc<Store>, capture: Arc<Capture>) -> Self {
        Downstream {
            store,
            txns: HashMap::new(),
            closed: Closed::default(),
            capture: Some(capture),
        }
    }

    /// (open transactions, closed ones remembered), for tests of the table's bounds.
    #[cfg(test)]
    pub(super) fn table_sizes(&self) -> (usize, usize) {
        (self.txns.len(), self.closed.order.len())
    }

    /// Handles one request; `None` means success without a response.
    pub async fn handle(
        &mut self,
        req: QueuesDownstreamRequest,
    ) -> Option<QueuesDownstreamResponse> {
        let op = match Op::try_from(req.request_type_data) {
            Ok(
                op @ (Op::Get
                | Op::AckAll
                | Op::AckRange
                | Op::NAckAll
                | Op::NAckRange
                | Op::ReQueueAll
                | Op::ReQueueRange
                | Op::ActiveOffsets
                | Op::CloseByClient),
            ) => op,
            // A real KubeMQ echoes the referenced transaction here too.
            _ => {
                let id = req.ref_transaction_id.clone();
                return Some(error(
                    &id,
                    &req,
                    Op::PollRequestTypeUnknown,
                    TxnError::Unknown,
                ));
            }
        };
        if op == Op::Get {
            return Some(self.get(&req).await);
        }
        let id = req.ref_transaction_id.clone();
        let Some(t) = self.txns.get_mut(&id) else {
            if !self.closed.ids.contains(&id) {
                return Some(error(&id, &req, op, TxnError::NotFound));
            }
            let text = match op {
                Op::AckAll | Op::AckRange | Op::ReQueueAll => TxnError::AckClosed,
                Op::NAckAll | Op::NAckRange => TxnError::NackClosed,
                Op::ReQueueRange => TxnError::RequeueClosed,
                Op::ActiveOffsets => TxnError::OffsetsClosed,
                _ => return None, // CloseByClient on a closed transaction is ignored
            };
            return Some(error(&id, &req, op, text));
        };
        let queue = t.queue.clone();
        let (seqs, failure) = match op {
            Op::AckAll | Op::NAckAll | Op::ReQueueAll | Op::CloseByClient => {
                (t.unsettled.clone(), None)
            }
            Op::AckRange | Op::NAckRange | Op::ReQueueRange => {
                let (empty, invalid): (_, fn(i64) -> TxnError) = match op {
                    Op::AckRange => (TxnError::AckEmpty, TxnError::InvalidAckSequence),
                    Op::NAckRange => (TxnError::NackEmpty, TxnError::InvalidNackSequence),
                    _ => (TxnError::RequeueEmpty, TxnError::InvalidAckSequence),
                };
                if op == Op::ReQueueRange && req.re_queue_channel.is_empty() {
                    return Some(error(&id, &req, op, TxnError::RequeueNoChannel));
                }
                if req.sequence_range.is_empty() {
                    return Some(error(&id, &req, op, empty));
                }
                let (valid, bad) = pick(&t.unsettled, &req.sequence_range);
                // Entries before a bad one stay applied (4.3.4).
                (valid, bad.map(invalid))
            }
            Op::ActiveOffsets => {
                return Some(QueuesDownstreamResponse {
                    transaction_id: id.clone(),
                    ref_request_id: req.request_id.clone(),
                    request_type_data: Op::ActiveOffsets as i32,
                    active_offsets: t.unsettled.iter().map(|s| *s as i64).collect(),
                    ..Default::default()
                });
            }
            _ => {
                return Some(error(
                    &id,
                    &req,
                    Op::PollRequestTypeUnknown,
                    TxnError::Unknown,
                ))
            }
        };
        if matches!(op, Op::ReQueueAll) && req.re_queue_channel.is_empty() {
            return Some(error(&id, &req, op, TxnError::RequeueNoChannel));
        }
        let mut op_error = failure;
        // Acks and releases cannot fail and go to the store together; a NAck or ReQueue is a
        // send of its own that can, and the first failure stops the rest (4.3.4).
        let done: HashSet<u64> = match op {
            Op::AckAll | Op::AckRange => {
                self.store.ack(&queue, &seqs);
                seqs.iter().copied().collect()
            }
            Op::NAckAll | Op::NAckRange | Op::ReQueueAll | Op::ReQueueRange => {
                let mut done = HashSet::new();
                for s in &seqs {
                    let result = if matches!(op, Op::NAckAll | Op::NAckRange) {
                        self.store.nack(&queue, *s).await
                    } else {
                        self.store.requeue(&queue, *s, &req.re_queue_channel).await
                    };
                    match result {
                        Ok(()) => {
                            done.insert(*s);
                        }
                        Err(e) => {
                            op_error = Some(TxnError::Store(e));
                            break;
                        }
                    }
                }
                done
            }
            _ => {
                match &self.capture {
                    Some(c) => c.hand_over(&self.store, &queue, &id, &seqs),
                    None => self.store.release(&queue, &seqs),
                }
                seqs.iter().copied().collect()
            }
        };
        if let Some(t) = self.txns.get_mut(&id) {
            t.unsettled.retain(|x| !done.contains(x));
        }
        let ends = self.txns.get(&id).is_some_and(|t| {
            t.unsettled.is_empty()
                || matches!(
                    op,
                    Op::AckAll | Op::NAckAll | Op::ReQueueAll | Op::CloseByClient
                )
        });
        if ends {
            if let Some(t) = self.txns.remove(&id) {
                if !t.unsettled.is_empty() {
                    // A failed NAck/ReQueue of "all": whatever is left goes back unchanged.
                    self.store.release(&queue, &t.unsettled);
                }
            }
            self.closed.insert(id.clone());
        }
        if let Some(c) = &self.capture {
            if matches!(op, Op::ReQueueAll | Op::ReQueueRange) {
                c.arrived(&self.store, &req.re_queue_channel);
            }
            match self.txns.get(&id) {
                Some(t) => c.settled(&self.store, &queue, &id, t.unsettled.len()),
                None => c.closed(&self.store, &queue, &id),
            }
        }
        op_error.map(|e| error(&id, &req, op, e))
    }

    async fn get(&mut self, req: &QueuesDownstreamRequest) -> QueuesDownstreamResponse {
        let fail = |e: StoreError| QueuesDownstreamResponse {
            transaction_id: new_id(),
            ref_request_id: req.request_id.clone(),
            request_type_data: Op::Get as i32,
            is_error: true,
            error: e.to_string(),
            ..Default::default()
        };
        if req.client_id.is_empty() {
            return fail(StoreError::ClientIdEmpty);
        }
        if !errors::valid_queue_name(&req.channel) {
            return fail(StoreError::QueueNameInvalid);
        }
        if req.channel.contains(':') {
            return fail(StoreError::CannotSubscribe);
        }
        let max = if req.max_items <= 0 {
            UNBOUNDED_MAX_ITEMS
        } else {
            req.max_items as usize
        };
        let wait = Duration::from_millis(
            u64::try_from(req.wait_timeout)
                .unwrap_or(0)
                .max(MIN_WAIT_MS),
        );
        let delivered = self.store.get(&req.channel, max, wait).await;
        let id = new_id();
        let seqs: Vec<u64> = delivered.iter().map(|d| d.sequence).collect();
        if req.auto_ack {
            self.store.ack(&req.channel, &seqs);
        }
        if let Some(c) = &self.capture {
            let open = (!req.auto_ack && !seqs.is_empty()).then_some(id.as_str());
            c.got(&self.store, &req.channel, max, open, seqs.len());
        }
        if req.auto_ack || seqs.is_empty() {
            self.closed.insert(id.clone());
        } else {
            self.txns.insert(
                id.clone(),
                Txn {
                    queue: req.channel.clone(),
                    unsettled: seqs,
                },
            );
        }
        QueuesDownstreamResponse {
            transaction_id: id,
            ref_request_id: req.request_id.clone(),
            request_type_data: Op::Get as i32,
            messages: delivered.into_iter().map(|d| d.message).collect(),
            ..Default::default()
        }
    }
}

/// The listed sequences up to the first that is not an unsettled message of the transaction (or
/// repeats an earlier entry), and that first bad entry.
fn pick(unsettled: &[u64], listed: &[i64]) -> (Vec<u64>, Option<i64>) {
    let unsettled: HashSet<u64> = unsettled.iter().copied().collect();
    let mut seen = HashSet::with_capacity(listed.len());
    let mut valid: Vec<u64> = Vec::with_capacity(listed.len());
    for &s in listed {
        match u64::try_from(s) {
            Ok(u) if unsettled.contains(&u) && seen.insert(u) => valid.push(u),
            _ => return (valid, Some(s)),
        }
    }
    (valid, None)
}

impl Drop for Downstream {
    fn drop(&mut self) {
        for (id, t) in self.txns.iter() {
            match &self.capture {
                Some(c) => {
                    c.hand_over(&self.store, &t.queue, id, &t.unsettled);
                    c.closed(&self.store, &t.queue, id);
                }
                None => self.store.release(&t.queue, &t.unsettled),
            }
        }
    }
}
