//! The loop's consumers: their demand, their drains, and the round-robin hand-out of fetched
//! messages within that demand (FLOW-3, FLOW-5, Q-16).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use super::handout::{ConsumerKey, DemandReport, Handout, Taken};
use crate::engine::FastMap;
use crate::kubemq::QueueMessage;

/// A fetched message waiting in the buffer for a consumer with demand.
#[derive(Debug)]
pub(super) struct Fetched {
    pub transaction: Arc<str>,
    pub sequence: u64,
    pub message: QueueMessage,
    pub taken: Taken,
}

impl From<Handout> for Fetched {
    fn from(h: Handout) -> Fetched {
        Fetched {
            transaction: h.transaction,
            sequence: h.sequence,
            message: h.message,
            taken: h.taken,
        }
    }
}

/// One consumer's standing.
#[derive(Debug, Default)]
struct Consumer {
    /// Deliveries it can still take.
    demand: u32,
    /// It drains: what is immediately available, then DrainDone.
    draining: bool,
    /// Messages handed to it so far.
    handed: u64,
}

impl Consumer {
    /// Demand as the consumer reported it, less what was handed out after it counted.
    fn set_demand(&mut self, credit: u32, taken: u64) {
        let on_the_way = u32::try_from(self.handed.saturating_sub(taken)).unwrap_or(u32::MAX);
        self.demand = credit.saturating_sub(on_the_way);
    }
}

/// Every consumer of the loop, in hand-out order.
#[derive(Debug, Default)]
pub(super) struct Consumers {
    by_key: FastMap<ConsumerKey, Consumer>,
    /// Round-robin order of hand-out.
    order: VecDeque<ConsumerKey>,
}

impl Consumers {
    /// A consumer joined, with no demand yet.
    pub fn join(&mut self, k: ConsumerKey) {
        self.by_key.insert(k, Consumer::default());
        self.order.push_back(k);
    }

    /// A consumer left; whether it was known.
    pub fn leave(&mut self, k: ConsumerKey) -> bool {
        self.order.retain(|x| *x != k);
        self.by_key.remove(&k).is_some()
    }

    /// A consumer's demand, unless it drains (a drain's demand stands until it is done).
    pub fn demand(&mut self, d: DemandReport) {
        if let Some(c) = self.by_key.get_mut(&d.consumer) {
            if !c.draining {
                c.set_demand(d.credit, d.taken);
            }
        }
    }

    /// A consumer drains with the demand given.
    pub fn drain(&mut self, d: DemandReport) {
        if let Some(c) = self.by_key.get_mut(&d.consumer) {
            c.set_demand(d.credit, d.taken);
            c.draining = true;
        }
    }

    /// A consumer's connection is gone: it takes nothing more.
    pub fn gone(&mut self, k: ConsumerKey) {
        if let Some(c) = self.by_key.get_mut(&k) {
            c.demand = 0;
        }
    }

    /// Whether no consumer is left.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Every consumer.
    pub fn keys(&self) -> impl Iterator<Item = ConsumerKey> + '_ {
        self.by_key.keys().copied()
    }

    /// Whether some consumer drains.
    pub fn draining(&self) -> bool {
        self.by_key.values().any(|c| c.draining)
    }

    /// Total demand of every consumer.
    pub fn total_demand(&self) -> u32 {
        self.by_key
            .values()
            .map(|c| c.demand)
            .fold(0u32, u32::saturating_add)
    }

    /// Ends the drains that have nothing more coming at once: demand used up, or nothing ready
    /// (`ready_now` false). Returns the consumers to tell.
    pub fn finish_drains(&mut self, ready_now: bool) -> Vec<ConsumerKey> {
        let mut done = Vec::new();
        for (k, c) in self.by_key.iter_mut() {
            if c.draining && (c.demand == 0 || !ready_now) {
                c.draining = false;
                c.demand = 0;
                done.push(*k);
            }
        }
        done
    }

    /// Hands buffered messages to consumers with demand, round robin: one batch per consumer.
    /// Transactions some of whose messages were handed out go into `handed`.
    pub fn hand_out(
        &mut self,
        buffer: &mut VecDeque<Fetched>,
        handed: &mut HashSet<Arc<str>, foldhash::fast::RandomState>,
    ) -> Vec<(ConsumerKey, Vec<Handout>)> {
        // A few consumers at most per round: found by a look along the list, not hashed per
        // message.
        let mut batches: Vec<(ConsumerKey, Vec<Handout>)> = Vec::new();
        let mut last_handed: Option<Arc<str>> = None;
        let mut idle_rounds = 0;
        while !buffer.is_empty() && idle_rounds < self.order.len() {
            let Some(k) = self.order.pop_front() else {
                break;
            };
            self.order.push_back(k);
            let Some(c) = self.by_key.get_mut(&k) else {
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
            }) = buffer.pop_front()
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
                handed.insert(transaction.clone());
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
        batches
    }
}

/// Puts a message back into the buffer in queue order (sequences ascend along the queue), so
/// messages returned one by one keep their order.
pub(super) fn put_back(buffer: &mut VecDeque<Fetched>, m: Fetched) {
    let at = buffer.partition_point(|f| f.sequence < m.sequence);
    buffer.insert(at, m);
}
