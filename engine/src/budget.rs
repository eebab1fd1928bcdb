//! Memory budgets: the bytes a client can make the connector hold on its behalf — deliveries
//! being reassembled, deliveries waiting for the backend, transfers waiting for the client's
//! session window, dynamic-node mailboxes — are charged to its connection's budget and, beyond a
//! small share every connection is guaranteed, to one budget for the whole process.
//!
//! A [`Charge`] gives its bytes back when dropped, so a buffer freed on any path (settled,
//! detached, session ended, connection gone) can never leave its bytes counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::error::{AmqpError, Condition};

/// Bytes each connection may hold whatever the process budget says, so that a few abusers
/// filling the process budget do not stop well-behaved clients' small messages.
pub const GUARANTEED_PER_CONNECTION: u64 = 256 * 1024;

/// The process-wide budget, shared by every connection's [`ConnectionBudget`].
#[derive(Debug)]
pub struct ProcessBudget {
    limit: u64,
    used: AtomicU64,
}

impl ProcessBudget {
    /// A process budget of `limit` bytes (beyond each connection's guaranteed share).
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(ProcessBudget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// Its size in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes charged to it now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn try_take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// Takes `n` bytes straight from the process budget (state kept for a live link, not a
    /// connection's buffers), or says it does not fit.
    pub fn reserve(self: &Arc<Self>, n: u64) -> Result<Reserved, BudgetExceeded> {
        if !self.try_take(n) {
            return Err(BudgetExceeded::Process { limit: self.limit });
        }
        Ok(Reserved {
            process: self.clone(),
            bytes: n,
        })
    }
}

/// Bytes reserved in the process budget by [`ProcessBudget::reserve`], given back when dropped.
#[derive(Debug)]
pub struct Reserved {
    process: Arc<ProcessBudget>,
    bytes: u64,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.process.give_back(self.bytes);
    }
}

/// Which budget a charge did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetExceeded {
    /// The connection's own budget.
    Connection {
        /// Its size in bytes.
        limit: u64,
    },
    /// The process-wide budget.
    Process {
        /// Its size in bytes.
        limit: u64,
    },
}

impl BudgetExceeded {
    /// The refusal a client gets: `amqp:resource-limit-exceeded` naming the budget.
    pub fn to_error(self) -> AmqpError {
        let text = match self {
            BudgetExceeded::Connection { limit } => {
                format!("connection memory budget of {limit} bytes exceeded")
            }
            BudgetExceeded::Process { limit } => {
                format!("connector memory budget of {limit} bytes exceeded")
            }
        };
        AmqpError::new(Condition::ResourceLimitExceeded, text)
    }
}

/// One connection's budget; [`Charge`]s draw on it.
#[derive(Debug, Clone)]
pub struct ConnectionBudget {
    inner: Arc<Pool>,
}

#[derive(Debug)]
struct Pool {
    limit: u64,
    /// Atomic because the connection moves between threads with its task; only that task
    /// charges and frees (every [`Charge`] lives in the engine or its handler), so a load then a
    /// store is exact.
    used: AtomicU64,
    process: Arc<ProcessBudget>,
}

impl ConnectionBudget {
    /// A budget of `limit` bytes for one connection, drawing on `process` beyond the guaranteed
    /// share.
    pub fn new(limit: u64, process: Arc<ProcessBudget>) -> Self {
        ConnectionBudget {
            inner: Arc::new(Pool {
                limit,
                used: AtomicU64::new(0),
                process,
            }),
        }
    }

    /// Bytes charged to this connection now.
    #[inline]
    pub fn used(&self) -> u64 {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// Its size in bytes.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// An empty charge, grown as a buffer grows.
    pub fn empty(&self) -> Charge {
        Charge {
            pool: self.inner.clone(),
            bytes: 0,
        }
    }

    /// A charge of `n` bytes, or which budget it does not fit.
    pub fn charge(&self, n: u64) -> Result<Charge, BudgetExceeded> {
        let mut c = self.empty();
        c.grow(n)?;
        Ok(c)
    }
}

impl Pool {
    /// The part of the connection's use that the process budget carries.
    #[inline]
    fn beyond_share(used: u64) -> u64 {
        used.saturating_sub(GUARANTEED_PER_CONNECTION)
    }

    #[inline]
    fn take(&self, n: u64, force: bool) -> Result<(), BudgetExceeded> {
        // A load and a store, not a read-modify-write: only the connection's task changes it
        // (see `used`), and this runs for every delivery.
        let before = self.used.load(Ordering::Relaxed);
        let after = before.saturating_add(n);
        if after > self.limit && !force {
            return Err(BudgetExceeded::Connection { limit: self.limit });
        }
        let extra = Self::beyond_share(after) - Self::beyond_share(before);
        if extra > 0 {
            if force {
                self.process.used.fetch_add(extra, Ordering::AcqRel);
            } else if !self.process.try_take(extra) {
                return Err(BudgetExceeded::Process {
                    limit: self.process.limit,
                });
            }
        }
        self.used.store(after, Ordering::Relaxed);
        Ok(())
    }

    /// Gives back `n` bytes (never more than were taken: a [`Charge`] gives back what it holds).
    #[inline]
    fn give(&self, n: u64) {
        let before = self.used.load(Ordering::Relaxed);
        let after = before.saturating_sub(n);
        let freed = Self::beyond_share(before) - Self::beyond_share(after);
        if freed > 0 {
            self.process.give_back(freed);
        }
        self.used.store(after, Ordering::Relaxed);
    }
}

/// Bytes held against a connection's budget, given back when dropped.
#[derive(Debug)]
pub struct Charge {
    pool: Arc<Pool>,
    bytes: u64,
}

impl Charge {
    /// Adds `n` bytes, or says which budget they do not fit (the charge is then unchanged).
    #[inline]
    pub fn grow(&mut self, n: u64) -> Result<(), BudgetExceeded> {
        self.pool.take(n, false)?;
        self.bytes += n;
        Ok(())
    }

    /// Adds `n` bytes the connector holds whatever the budget says (its own outgoing transfers,
    /// bounded by the demand it asks of the backend), so that they count against what clients
    /// may add.
    pub fn grow_anyway(&mut self, n: u64) {
        let _ = self.pool.take(n, true);
        self.bytes += n;
    }

    /// Gives `n` bytes back (at most what it holds).
    #[inline]
    pub fn shrink(&mut self, n: u64) {
        let n = n.min(self.bytes);
        self.pool.give(n);
        self.bytes -= n;
    }

    /// Whether an eighth of the process budget or more is in use: from there, memory the
    /// allocator keeps for a while after a free could push the process past its budget.
    pub fn process_pressed(&self) -> bool {
        let process = &self.pool.process;
        process.used().saturating_mul(8) >= process.limit
    }

    /// The bytes it holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.pool.give(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_refused_past_its_own_budget() {
        let process = ProcessBudget::new(u64::MAX / 2);
        let conn = ConnectionBudget::new(1000, process.clone());
        let a = conn.charge(600).expect("fits");
        assert_eq!(
            conn.charge(401).unwrap_err(),
            BudgetExceeded::Connection { limit: 1000 }
        );
        let b = conn.charge(400).expect("fits exactly");
        assert_eq!(conn.used(), 1000);
        drop((a, b));
        assert_eq!(conn.used(), 0);
        assert_eq!(process.used(), 0);
    }

    #[test]
    fn the_process_budget_carries_only_what_is_beyond_each_share() {
        let share = GUARANTEED_PER_CONNECTION;
        let process = ProcessBudget::new(share);
        let one = ConnectionBudget::new(u64::MAX / 4, process.clone());
        let two = ConnectionBudget::new(u64::MAX / 4, process.clone());
        let big = one
            .charge(2 * share)
            .expect("share plus the whole process budget");
        assert_eq!(process.used(), share);
        assert_eq!(
            one.charge(1).unwrap_err(),
            BudgetExceeded::Process { limit: share }
        );
        // The other connection still has its guaranteed share, and not a byte more.
        let small = two.charge(share).expect("within the guaranteed share");
        assert!(two.charge(1).is_err());
        drop(big);
        assert_eq!(process.used(), 0);
        assert!(two.charge(1).is_ok());
        drop(small);
        assert_eq!(two.used(), 0);
    }

    #[test]
    fn a_charge_grows_shrinks_and_gives_back_on_drop() {
        let process = ProcessBudget::new(0);
        let conn = ConnectionBudget::new(GUARANTEED_PER_CONNECTION, process.clone());
        let mut c = conn.empty();
        c.grow(100).expect("fits");
        assert!(c.grow(GUARANTEED_PER_CONNECTION).is_err());
        assert_eq!(c.bytes(), 100, "a refused growth changes nothing");
        c.shrink(40);
        assert_eq!(conn.used(), 60);
        c.grow_anyway(2 * GUARANTEED_PER_CONNECTION);
        assert_eq!(process.used(), 60 + GUARANTEED_PER_CONNECTION);
        drop(c);
        assert_eq!((conn.used(), process.used()), (0, 0));
    }
}
