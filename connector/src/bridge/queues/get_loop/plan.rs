//! Settling on KubeMQ's sessions: the requests of one flush of settlements, or of one round
//! that closes held transactions (rehome.rs), sent one at a time, each answered before the next
//! goes, since a session whose request fails is forgotten with its transactions and nothing
//! more is sent on it.
//!
//! A flush sends, per transaction and outcome, one request with the sequences de-duplicated and
//! ascending (Q-27; a duplicate would make KubeMQ fail the rest of the range). On a backend that
//! captures, a partly settled transaction's settlements wait until all of it is settled (a
//! partly settled transaction would take ready messages into the room its settlements free and
//! hide them until it closes), and a transaction settled whole is then closed, since a message
//! can join it after its Get was answered (KMQ-18); after the closes, one request per session
//! asks for the answer that tells they are over (close_fence.rs). Settlements of the session
//! lent to the running Get wait for it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::rehome::GivenBack;
use super::sessions::SessionId;
use super::{Action, GetLoop, Outcome, Settlement};
use crate::backend::BackendError;

/// One step of a plan.
#[derive(Debug)]
pub(super) enum Op {
    /// One transaction's settlements of one outcome.
    Settle(Vec<Settlement>),
    /// Close a transaction every message of which was settled.
    CloseSettled {
        session: SessionId,
        transaction: Arc<str>,
    },
    /// Close a transaction under its consumers, `count` messages held (rehome.rs).
    Rehome {
        session: SessionId,
        transaction: Arc<str>,
        count: usize,
    },
    /// Ask each session that closed transactions for its answer.
    Fences,
    /// Ask one session.
    Fence {
        session: SessionId,
        transaction: Arc<str>,
    },
    /// Forget the sessions whose requests failed.
    LoseLost,
}

/// The request whose answer the plan waits for.
#[derive(Debug)]
pub(super) enum Awaiting {
    /// One transaction's settlements of one outcome, `count` distinct messages.
    Settle {
        session: SessionId,
        transaction: Arc<str>,
        outcome: Outcome,
        count: usize,
    },
    /// A close or a fence, as planned ([`Op::CloseSettled`], [`Op::Rehome`], [`Op::Fence`]).
    Sent(Op),
}

/// The requests under way.
#[derive(Debug, Default)]
pub(super) struct Plan {
    ops: VecDeque<Op>,
    /// The request sent and not answered yet.
    pub awaiting: Option<Awaiting>,
    /// Sessions whose requests failed in this plan.
    pub lost: Vec<SessionId>,
    /// Transactions closed in this plan, with their sessions.
    closed: Vec<(SessionId, Arc<str>)>,
}

impl GetLoop {
    /// Plans sending every pending settlement.
    pub(super) fn start_flush(&mut self) {
        self.fresh = false;
        self.gate.restart();
        // One Arc per transaction (take_batch), so its address names it: sorted by it, a
        // transaction's settlements lie together without hashing its id for each.
        self.settle.sort_unstable_by_key(|s| {
            let txn = Arc::as_ptr(&s.transaction) as *const u8 as usize;
            (txn, s.outcome as u8, s.sequence)
        });
        let settle = std::mem::take(&mut self.settle);
        for of_txn in settle.chunk_by(|a, b| Arc::ptr_eq(&a.transaction, &b.transaction)) {
            let Some(txn) = of_txn
                .first()
                .and_then(|s| self.sessions.txns.get(&s.transaction))
            else {
                // Its session was lost: KubeMQ gave its messages back already.
                continue;
            };
            if self.captures && of_txn.len() < txn.left {
                self.settle.extend_from_slice(of_txn);
                continue;
            }
            for group in of_txn.chunk_by(|a, b| a.outcome == b.outcome) {
                self.plan.ops.push_back(Op::Settle(group.to_vec()));
            }
        }
        self.plan.ops.push_back(Op::Fences);
        self.plan.ops.push_back(Op::LoseLost);
    }

    /// Plans closing every open transaction while the consumers hold their messages, so that
    /// KubeMQ gives back whatever those transactions hide (KMQ-20, rehome.rs). Only between
    /// Gets, with nothing buffered: every message of these transactions is at a consumer.
    pub(super) fn start_rehome(&mut self, now: Instant) {
        self.moved.forget_old(now);
        let ids: Vec<Arc<str>> = self.sessions.txns.keys().cloned().collect();
        let mut held = 0usize;
        let mut transactions = 0usize;
        for t in ids {
            let Some(txn) = self.sessions.end_txn(&t) else {
                continue;
            };
            for &s in &txn.seqs {
                self.moved.out(s, now);
            }
            held += txn.seqs.len();
            transactions += 1;
            self.plan.ops.push_back(Op::Rehome {
                session: txn.session,
                transaction: t,
                count: txn.seqs.len(),
            });
        }
        self.plan.ops.push_back(Op::LoseLost);
        // Settlements still waiting for the rest of their transaction now wait for their
        // message to come back.
        for s in std::mem::take(&mut self.settle) {
            if let Some(s) = self.follow(s) {
                self.settle.push(s);
            }
        }
        self.fresh = !self.settle.is_empty();
        self.handed.clear();
        // A short Get and the gaps may count the same hidden messages: the larger count. Gaps
        // count only for the queue's one consumer (others' are other consumers' messages).
        let short = self.hidden.take().map_or(0, |h| h.count);
        let skipped = if self.gaps.exclusive() {
            u32::try_from(self.gaps.overdue(now)).unwrap_or(u32::MAX)
        } else {
            0
        };
        let hidden = short.max(skipped);
        self.gaps.rounded(now);
        self.given_back = Some(GivenBack {
            held: u32::try_from(held).unwrap_or(u32::MAX),
            hidden,
        });
        self.stall.rounded(now);
        tracing::info!(
            channel = %self.channel,
            transactions,
            messages = held,
            hidden,
            "consumers with credit wait while holding every open transaction, and a Get missed stored messages or skipped sequences beside them (hidden > 0), or nothing new came for a while: closing those transactions so that KubeMQ gives back what they hide (KMQ-20)"
        );
    }

    /// The next request of the plan, skipping what a failed session or the running Get makes
    /// moot; `None` when the plan is done.
    pub(super) fn next_op(&mut self) -> Option<Action> {
        while let Some(op) = self.plan.ops.pop_front() {
            match op {
                Op::Settle(group) => {
                    let Some(first) = group.first() else {
                        continue;
                    };
                    let (transaction, outcome) = (first.transaction.clone(), first.outcome);
                    let Some(session) = self.sessions.txns.get(&transaction).map(|t| t.session)
                    else {
                        continue;
                    };
                    if self.plan.lost.contains(&session) || !self.sessions.exists(session) {
                        // Forgotten with its transactions at the end of the plan.
                        continue;
                    }
                    if !self.sessions.usable(session) {
                        // Lent to the running Get: after it.
                        self.settle.extend(group);
                        continue;
                    }
                    let mut sequences: Vec<u64> = group.iter().map(|s| s.sequence).collect();
                    sequences.dedup();
                    self.plan.awaiting = Some(Awaiting::Settle {
                        session,
                        transaction: transaction.clone(),
                        outcome,
                        count: sequences.len(),
                    });
                    return Some(Action::Settle {
                        session,
                        transaction,
                        outcome,
                        sequences,
                    });
                }
                Op::CloseSettled {
                    session,
                    ref transaction,
                }
                | Op::Rehome {
                    session,
                    ref transaction,
                    ..
                }
                | Op::Fence {
                    session,
                    ref transaction,
                } => {
                    if self.plan.lost.contains(&session) || !self.sessions.usable(session) {
                        continue;
                    }
                    let action = match op {
                        Op::Fence { .. } => Action::Fence {
                            session,
                            transaction: transaction.clone(),
                        },
                        _ => close(session, transaction.clone()),
                    };
                    self.plan.awaiting = Some(Awaiting::Sent(op));
                    return Some(action);
                }
                Op::Fences => {
                    // One answer per session tells when KubeMQ has closed what was closed on it.
                    let mut closed = std::mem::take(&mut self.plan.closed);
                    closed.sort_unstable_by_key(|(sid, _)| *sid);
                    closed.dedup_by_key(|(sid, _)| *sid);
                    for (session, transaction) in closed.into_iter().rev() {
                        self.plan.ops.push_front(Op::Fence {
                            session,
                            transaction,
                        });
                    }
                }
                Op::LoseLost => {
                    let mut lost = std::mem::take(&mut self.plan.lost);
                    lost.sort_unstable();
                    lost.dedup();
                    // What losing a session asks of the driver goes out through `out`.
                    for session in lost {
                        if self.sessions.usable(session) {
                            self.lose_session(session);
                        }
                    }
                }
            }
        }
        None
    }

    /// What follows the answer to one transaction's settlements.
    pub(super) fn after_settle(
        &mut self,
        session: SessionId,
        transaction: Arc<str>,
        outcome: Outcome,
        count: usize,
        r: Result<(), BackendError>,
    ) {
        if let Err(e) = r {
            tracing::warn!(channel = %self.channel, transaction = %transaction, error = %e, "settlement failed; KubeMQ returns the messages when the session ends");
            self.plan.lost.push(session);
            return;
        }
        if outcome != Outcome::Ack {
            self.out.push_back(Action::Returned { session, count });
        }
        let done = match self.sessions.txns.get_mut(&transaction) {
            Some(txn) if outcome == Outcome::Close => {
                txn.left = 0;
                true
            }
            Some(txn) => {
                txn.left = txn.left.saturating_sub(count);
                txn.left == 0
            }
            None => false,
        };
        if !done {
            return;
        }
        self.sessions.end_txn(&transaction);
        if self.captures {
            // On KubeMQ a message can join a transaction after its Get was answered (one that
            // arrives as the Get times out, KMQ-18): the loop never saw it, so settling what it
            // saw leaves the transaction open, and that message hidden, for as long as the
            // session lives. Closing the transaction gives such a message back; for one already
            // closed it does nothing.
            if outcome != Outcome::Close {
                self.plan.ops.push_front(Op::CloseSettled {
                    session,
                    transaction: transaction.clone(),
                });
            }
            self.plan.closed.push((session, transaction));
        }
    }
}

/// A CloseByClient of `transaction`.
fn close(session: SessionId, transaction: Arc<str>) -> Action {
    Action::Settle {
        session,
        transaction,
        outcome: Outcome::Close,
        sequences: Vec::new(),
    }
}
