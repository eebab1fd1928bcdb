//! Keeping a Get off the wire while KubeMQ is still closing transactions.
//!
//! Settling the last message of a KubeMQ v2.4 transaction acknowledges it and closes the
//! transaction's member of the queue group in one step, and the broker can handle the close
//! before the acknowledgement: the message is then moved to another member, a Get that is out if
//! there is one, and fills that Get's room for the 100 ms until its redelivery timer fires
//! (KMQ-17). A Get
//! that overlaps a close therefore stalls for 100 ms even when the messages it asks for are
//! stored: without what follows, at 2,000 msg/s with consumers that accept each message, about
//! ten times a second, holding most messages for tens of milliseconds.
//!
//! KubeMQ answers a settlement with nothing, but it handles one stream's requests in order
//! (KMQ-5), and its close returns only once the broker removed the member. So after the closes
//! of a flush, the loop sends one request that is answered on each session it closed
//! transactions on ([`crate::backend::Downstream::handled`]), and the next Get waits for those
//! answers: a Get joins the group only once every close before it is over. An answer that does
//! not come within [`FENCE_WAIT`] no longer holds the Get back. The driver holds the answers
//! themselves; this counts them and keeps the time.

use std::time::{Duration, Instant};

/// The longest a Get waits for the answers (KubeMQ gives them within a millisecond or two).
pub(in crate::bridge::queues) const FENCE_WAIT: Duration = Duration::from_millis(50);

/// The answers the next Get waits for.
#[derive(Debug, Default)]
pub(super) struct Fences {
    /// Answers asked for and not come yet.
    pending: usize,
    /// When the wait ends at the latest; set when the loop first waits for them.
    until: Option<Instant>,
}

/// Where the wait for the answers stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fence {
    /// Nothing holds the Get back.
    Open,
    /// Wait for an answer, until the instant given.
    Wait(Instant),
    /// The answers did not come in time: the driver forgets them, and the Get goes.
    GaveUp,
}

impl Fences {
    /// One more answer to wait for.
    pub(super) fn push(&mut self) {
        self.pending += 1;
    }

    /// One answer came.
    pub(super) fn answered(&mut self) {
        self.pending = self.pending.saturating_sub(1);
        if self.pending == 0 {
            self.until = None;
        }
    }

    /// Whether the next Get may go at `now`: the wait starts at the first look.
    pub(super) fn check(&mut self, now: Instant) -> Fence {
        if self.pending == 0 {
            self.until = None;
            return Fence::Open;
        }
        let until = *self.until.get_or_insert(now + FENCE_WAIT);
        if now >= until {
            self.pending = 0;
            self.until = None;
            return Fence::GaveUp;
        }
        Fence::Wait(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_every_answer() {
        let t0 = Instant::now();
        let mut f = Fences::default();
        assert_eq!(f.check(t0), Fence::Open);
        f.push();
        f.push();
        assert_eq!(f.check(t0), Fence::Wait(t0 + FENCE_WAIT));
        f.answered();
        assert_eq!(
            f.check(t0 + Duration::from_millis(1)),
            Fence::Wait(t0 + FENCE_WAIT),
            "the wait started at the first look"
        );
        f.answered();
        assert_eq!(f.check(t0 + Duration::from_millis(2)), Fence::Open);
    }

    #[test]
    fn an_answer_that_never_comes_holds_back_no_longer_than_the_wait() {
        let t0 = Instant::now();
        let mut f = Fences::default();
        f.push();
        assert_eq!(f.check(t0), Fence::Wait(t0 + FENCE_WAIT));
        assert_eq!(f.check(t0 + FENCE_WAIT), Fence::GaveUp);
        assert_eq!(f.check(t0 + FENCE_WAIT), Fence::Open);
        f.push();
        let t1 = t0 + FENCE_WAIT * 2;
        assert_eq!(f.check(t1), Fence::Wait(t1 + FENCE_WAIT), "a new wait");
    }
}
