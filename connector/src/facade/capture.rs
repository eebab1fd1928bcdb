//! KubeMQ v2.4's "capture" of queue messages by open transactions (KMQ-2), for the gRPC façade
//! when it stands in for a real KubeMQ in tests ([`super::Facade::imitating_kubemq`]), so that the
//! connector's Get loop is tested against the broker it will meet. The embedded store never does
//! this, and the connector is built without it: only the `kubemq-imitation` feature, which the
//! tests turn on, compiles it.
//!
//! The model, from what a real KubeMQ v2.4.0 was seen to do (docs/kubemq-behaviour.md):
//! - A Get's transaction stays a consumer of its queue until it closes, with room for as many
//!   messages as the largest Get on that queue asked for so far (KubeMQ reuses its pooled
//!   consumers), less what it returned and has not had settled.
//! - Whenever messages become ready on the queue (a send, a NAck's copy, a release) or a
//!   transaction gets room (a settlement), ready messages move into open transactions that have
//!   room, oldest transaction first. There they are **held**: no Get returns them, and the client
//!   cannot settle them.
//! - When a transaction closes (its last message settled, AckAll/NAckAll, CloseByClient, its
//!   stream ending), what it held, and what its client never settled, moves to another open
//!   transaction of the queue — regardless of room, held there too — or, with none open, back
//!   to the queue unchanged (KMQ-20).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Imitation;
use crate::kubemq::QueueMessage;
use crate::store::session::{TxnId, TxnWatcher};
use crate::store::{Seq, Store};

/// A message tag that makes the imitating façade store the QueuesUpstream request carrying it
/// (as its first message) and never answer it, as KubeMQ v2.4 sometimes does (KMQ-19): the
/// value is [`LOST_ANSWER`].
pub const IMITATE_TAG: &str = "x-imitate-kubemq";
/// See [`IMITATE_TAG`].
pub const LOST_ANSWER: &str = "lost-answer";

/// One open transaction as a consumer of its queue.
struct Captor {
    transaction: TxnId,
    /// How many unacknowledged messages it may have: returned-and-unsettled plus held.
    room: usize,
    /// Returned by its Get and not settled yet.
    unsettled: usize,
    /// Taken from the queue after its Get returned: invisible until it closes.
    held: Vec<Seq>,
}

impl Captor {
    fn spare(&self) -> usize {
        self.room.saturating_sub(self.unsettled + self.held.len())
    }
}

#[derive(Default)]
struct Queue {
    /// Open transactions, oldest first.
    captors: Vec<Captor>,
    /// The largest MaxItems a Get on this queue asked for.
    pooled_room: usize,
}

/// Every open transaction of every stream of one façade, by queue.
#[derive(Default)]
pub struct Capture {
    queues: Mutex<HashMap<String, Queue>>,
}

impl Capture {
    /// A new table, shared by the streams of one façade.
    pub fn new() -> Arc<Capture> {
        Arc::default()
    }

    fn with<R>(&self, queue: &str, f: impl FnOnce(&mut Queue) -> R) -> R {
        let mut map = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        f(map.entry(queue.to_string()).or_default())
    }

    /// How many messages open transactions hold on `queue`, for tests.
    pub fn held(&self, queue: &str) -> usize {
        self.with(queue, |q| q.captors.iter().map(|c| c.held.len()).sum())
    }
}

impl TxnWatcher for Capture {
    fn got(
        &self,
        store: &Store,
        queue: &str,
        max_items: usize,
        open: Option<&TxnId>,
        returned: usize,
    ) {
        self.with(queue, |q| {
            q.pooled_room = q.pooled_room.max(max_items);
            if let Some(t) = open {
                q.captors.push(Captor {
                    transaction: t.clone(),
                    room: q.pooled_room,
                    unsettled: returned,
                    held: Vec::new(),
                });
            }
            pass(store, queue, q);
        });
    }

    fn settled(&self, store: &Store, queue: &str, txn: &TxnId, unsettled: usize) {
        self.with(queue, |q| {
            if let Some(c) = q.captors.iter_mut().find(|c| c.transaction == *txn) {
                c.unsettled = unsettled;
            }
            pass(store, queue, q);
        });
    }

    /// Like what the transaction held, what its client never settled moves to another open
    /// transaction of the queue regardless of room (hidden there), or back to the queue.
    fn closing(&self, store: &Store, queue: &str, txn: &TxnId, unsettled: &[Seq]) {
        self.with(queue, |q| {
            match q.captors.iter_mut().find(|c| c.transaction != *txn) {
                Some(other) => other.held.extend_from_slice(unsettled),
                None => store.release(queue, unsettled),
            }
        });
    }

    /// What the transaction held moves on.
    fn closed(&self, store: &Store, queue: &str, txn: &TxnId) {
        self.with(queue, |q| {
            let Some(at) = q.captors.iter().position(|c| c.transaction == *txn) else {
                return;
            };
            let gone = q.captors.remove(at);
            match q.captors.first_mut() {
                Some(other) => other.held.extend(gone.held),
                None => store.release(queue, &gone.held),
            }
            pass(store, queue, q);
        });
    }

    fn arrived(&self, store: &Store, queue: &str) {
        self.with(queue, |q| pass(store, queue, q));
    }
}

impl Imitation for Capture {
    fn loses_answer(&self, first: &QueueMessage) -> bool {
        first.tags.get(IMITATE_TAG).map(String::as_str) == Some(LOST_ANSWER)
    }
}

/// Moves ready messages into the open transactions that have room, oldest first.
fn pass(store: &Store, queue: &str, q: &mut Queue) {
    for c in q.captors.iter_mut() {
        let spare = c.spare();
        if spare > 0 {
            c.held.extend(store.take_ready(queue, spare));
        }
    }
}
