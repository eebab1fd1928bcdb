//! Waiting briefly for a pipelining client's refill, so that a window travels whole.
//!
//! A backend round trip (a send stored, or a Get answered) carries whatever is waiting when it
//! starts. A client that keeps a window of messages or credit in flight refills it as the last
//! round trip's results reach it, which takes a trip through the connection and the client. If
//! the next round trip started on the first part of that refill, the rest would wait behind it,
//! and the window would settle into halves that alternate for good: half of the window per round
//! trip, where a client of the backend's own API gets all of it (BENCHMARKS.md). So after a round
//! trip that carried at least `REFILL_MIN`, the next one waits until as much as the window held is
//! back, or `REFILL_WAIT` has passed. Smaller round trips (a client sending or taking one message
//! at a time, an idle queue) never wait.

use std::time::Duration;

use tokio::time::Instant;

/// The smallest round trip taken as a pipelining client's.
pub(super) const REFILL_MIN: usize = 16;
/// The longest the next round trip waits (tokio's timer has 1 ms resolution).
pub(super) const REFILL_WAIT: Duration = Duration::from_millis(1);

/// A wait for `want` (messages queued, or credit back) until `until`.
#[derive(Debug, Clone, Copy)]
pub(super) struct RefillWait {
    want: usize,
    until: Instant,
}

impl RefillWait {
    /// The wait after a round trip that carried `carried`, for `want` to be back; none when the
    /// round trip was small.
    pub(super) fn after(carried: usize, want: usize) -> Option<RefillWait> {
        (carried >= REFILL_MIN).then(|| RefillWait {
            want,
            until: Instant::now() + REFILL_WAIT,
        })
    }

    /// Whether the wait is over with `have` back.
    pub(super) fn over(&self, have: usize) -> bool {
        have >= self.want || Instant::now() >= self.until
    }

    /// When the wait ends at the latest.
    pub(super) fn until(&self) -> Instant {
        self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn small_round_trips_never_wait_and_a_wait_ends() {
        assert!(RefillWait::after(REFILL_MIN - 1, 100).is_none());
        let m = RefillWait::after(REFILL_MIN, 100).expect("a wait");
        assert!(!m.over(99));
        assert!(m.over(100));
        tokio::time::sleep_until(m.until()).await;
        assert!(m.over(0), "over once the deadline passed");
    }
}
