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
//!
//! Nor does a round trip wait for what a client sending at a steady rate is going to send anyway:
//! its messages trickle in and would only be held (up to `REFILL_WAIT` each, which is most of the
//! tail at 10,000 msg/s). A pipelining client's refill comes as a burst, a paced client's
//! messages spread over the whole time between two batches ([`came_in_a_burst`]); and a Get does
//! not wait once the credit back covers every message ready.

use std::time::Duration;

use std::time::Instant;

/// The smallest round trip taken as a pipelining client's.
pub(super) const REFILL_MIN: usize = 16;
/// The longest the next round trip waits (tokio's timer has 1 ms resolution).
pub(super) const REFILL_WAIT: Duration = Duration::from_millis(1);

/// Whether the messages of a batch arrived as a pipelining client's refill does: within the
/// first half of the time from the batch before it started (`previous`) to this one's start
/// (`started`), rather than spread over all of it as a client sending at a steady rate sends
/// them. A batch with no batch before it counts as a burst.
pub(super) fn came_in_a_burst(
    first: Instant,
    last: Instant,
    previous: Option<Instant>,
    started: Instant,
) -> bool {
    previous.is_none_or(|p| {
        let spread = last.saturating_duration_since(first);
        spread * 2 < started.saturating_duration_since(p)
    })
}

/// A wait for `want` (messages queued, or credit back) until `until`.
#[derive(Debug, Clone, Copy)]
pub(super) struct RefillWait {
    want: usize,
    until: Instant,
}

impl RefillWait {
    /// The wait after a round trip that carried `carried` and ended `now`, for `want` to be
    /// back; none when the round trip was small.
    pub(super) fn after(carried: usize, want: usize, now: Instant) -> Option<RefillWait> {
        (carried >= REFILL_MIN).then(|| RefillWait {
            want,
            until: now + REFILL_WAIT,
        })
    }

    /// Whether the wait is over with `have` back, where `ready` (when known) messages wait to
    /// be carried: `have` covers them all, or as much as the window held is back, or time is up.
    pub(super) fn over(&self, have: usize, ready: Option<u64>, now: Instant) -> bool {
        let covered = ready.is_some_and(|r| have as u64 >= r);
        covered || have >= self.want || now >= self.until
    }

    /// When the wait ends at the latest.
    pub(super) fn until(&self) -> Instant {
        self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refill_is_a_burst_and_a_steady_rate_is_not() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_micros(n * 100);
        // The batch before started at 0; this one at 10 (1 ms later).
        assert!(came_in_a_burst(ms(3), ms(4), Some(t0), ms(10)));
        assert!(!came_in_a_burst(ms(1), ms(10), Some(t0), ms(10)));
        assert!(!came_in_a_burst(ms(4), ms(9), Some(t0), ms(10)));
        assert!(came_in_a_burst(ms(1), ms(10), None, ms(10)));
    }

    #[test]
    fn small_round_trips_never_wait_and_a_wait_ends() {
        let t0 = Instant::now();
        assert!(RefillWait::after(REFILL_MIN - 1, 100, t0).is_none());
        let m = RefillWait::after(REFILL_MIN, 100, t0).expect("a wait");
        assert!(!m.over(99, None, t0));
        assert!(m.over(100, None, t0));
        assert!(!m.over(40, Some(41), t0), "more ready than the credit back");
        assert!(
            m.over(40, Some(40), t0),
            "the credit back takes everything ready"
        );
        assert!(m.over(0, Some(0), t0), "nothing ready to wait for");
        assert_eq!(m.until(), t0 + REFILL_WAIT);
        assert!(!m.over(0, None, m.until() - Duration::from_micros(1)));
        assert!(m.over(0, None, m.until()), "over once the deadline passed");
    }
}
