//! When the Get loop may put a Get on the wire while some of its transactions are still open.
//!
//! On KubeMQ v2.4 every Get is a member of the queue's durable queue group, and a transaction
//! stays a member until its last message is settled. KubeMQ acknowledges the messages and closes
//! the member in one step, and its broker can process the close before the acknowledgements: the
//! leaving member's messages are then moved to another member and redelivered after 100 ms
//! (KMQ-17 in docs/kubemq-behaviour.md). When that other member is a Get waiting on an idle
//! queue, the moved message fills its room for those 100 ms and every message sent meanwhile
//! waits: the stalls of 100–120 ms that an idle queue showed through a real KubeMQ. A Get that
//! finds its messages already stored returns at once and is never such a member.
//!
//! So while a transaction is open, a Get that would have to wait is held back until the
//! consumers have settled every open transaction (most clients accept each message as it
//! arrives), until messages are known to be stored (sent through this connector and confirmed,
//! or given back; the Get then asks for just those and returns at once), or for at most
//! [`OVERLAP_WAIT`] (for consumers that hold messages while producers this process does not see
//! send more). A drain never waits. Backends that do not capture (the embedded store) have no
//! such members and are never held back. While a Get is held back, a rise of the backend's ready
//! count wakes the loop to look again (the driver listens for it).

use std::time::{Duration, Instant};

/// The longest a Get that would wait is held back behind open transactions.
pub(in crate::bridge::queues) const OVERLAP_WAIT: Duration = Duration::from_millis(5);

/// The hold on the next Get.
#[derive(Debug, Default)]
pub(super) struct GetGate {
    /// When the current hold ends at the latest; `None` while nothing is held back.
    until: Option<Instant>,
}

/// What the loop knows when it is about to issue a Get.
#[derive(Debug, Clone, Copy)]
pub(super) struct Moment {
    /// The backend takes ready messages into open transactions (KubeMQ).
    pub captures: bool,
    /// Some transaction of the loop is open.
    pub open: bool,
    /// A consumer is draining (FLOW-5): its Get must not wait.
    pub draining: bool,
}

impl GetGate {
    /// Until when the Get must wait, or `None` to issue it now. `ready_now` tells whether the
    /// Get would find its messages stored.
    pub(super) fn hold(
        &mut self,
        at: Moment,
        ready_now: impl FnOnce() -> bool,
        now: Instant,
    ) -> Option<Instant> {
        if !at.captures || !at.open || at.draining || ready_now() {
            self.until = None;
            return None;
        }
        let until = *self.until.get_or_insert(now + OVERLAP_WAIT);
        // An expired hold stays over until the Get goes or settlements go (opening its
        // session first must not start a new one).
        (now < until).then_some(until)
    }

    /// The Get went, or settlements changed what is open: the next Get is held afresh.
    pub(super) fn restart(&mut self) {
        self.until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moment(captures: bool, open: bool, draining: bool) -> Moment {
        Moment {
            captures,
            open,
            draining,
        }
    }

    #[test]
    fn holds_only_a_waiting_get_behind_open_transactions_and_not_for_ever() {
        let t0 = Instant::now();
        let mut g = GetGate::default();
        let hold = |g: &mut GetGate, m, ready, now| g.hold(m, || ready, now);
        assert!(
            hold(&mut g, moment(false, true, false), false, t0).is_none(),
            "no capture"
        );
        assert!(
            hold(&mut g, moment(true, false, false), false, t0).is_none(),
            "nothing open"
        );
        assert!(
            hold(&mut g, moment(true, true, true), false, t0).is_none(),
            "a drain"
        );
        assert!(
            hold(&mut g, moment(true, true, false), true, t0).is_none(),
            "messages ready"
        );
        let until = hold(&mut g, moment(true, true, false), false, t0).expect("held");
        assert_eq!(until, t0 + OVERLAP_WAIT);
        let later = t0 + Duration::from_millis(1);
        assert_eq!(
            hold(&mut g, moment(true, true, false), false, later),
            Some(until),
            "the same hold, not a new one"
        );
        assert!(
            hold(&mut g, moment(true, true, false), false, until).is_none(),
            "over"
        );
        assert!(
            hold(&mut g, moment(true, true, false), false, until).is_none(),
            "still over while the Get has not gone"
        );
        g.restart();
        assert_eq!(
            hold(&mut g, moment(true, true, false), false, until),
            Some(until + OVERLAP_WAIT),
            "a new hold"
        );
    }
}
