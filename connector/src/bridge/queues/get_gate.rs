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
//! such members and are never held back.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// The longest a Get that would wait is held back behind open transactions.
pub(super) const OVERLAP_WAIT: Duration = Duration::from_millis(5);

/// The hold on the next Get, with the signal that messages may have become ready.
pub(super) struct GetGate {
    /// When the current hold ends at the latest; `None` while nothing is held back.
    until: Option<Instant>,
    /// Changes whenever the backend's ready count may have risen; `None` for a backend without
    /// one.
    ready: Option<watch::Receiver<()>>,
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
    /// A gate woken by `ready` (see [`crate::backend::Backend::ready_changes`]).
    pub(super) fn new(ready: Option<watch::Receiver<()>>) -> GetGate {
        GetGate { until: None, ready }
    }

    /// Until when the Get must wait, or `None` to issue it now. `ready_now` tells whether the
    /// Get would find its messages stored; it is asked after the ready signal was marked seen,
    /// so a rise after it wakes [`GetGate::ready_rose`].
    pub(super) fn hold(&mut self, at: Moment, ready_now: impl FnOnce() -> bool) -> Option<Instant> {
        if let Some(r) = &mut self.ready {
            r.borrow_and_update();
        }
        if !at.captures || !at.open || at.draining || ready_now() {
            self.until = None;
            return None;
        }
        let until = *self
            .until
            .get_or_insert_with(|| Instant::now() + OVERLAP_WAIT);
        if Instant::now() >= until {
            self.until = None;
            return None;
        }
        Some(until)
    }

    /// Resolves when the ready count may have risen since [`GetGate::hold`] looked; never for a
    /// backend without one.
    pub(super) async fn ready_rose(&mut self) {
        let rose = match &mut self.ready {
            Some(r) => r.changed().await.is_ok(),
            None => false,
        };
        if !rose {
            std::future::pending::<()>().await;
        }
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

    #[tokio::test]
    async fn holds_only_a_waiting_get_behind_open_transactions_and_not_for_ever() {
        let mut g = GetGate::new(None);
        assert!(
            g.hold(moment(false, true, false), || false).is_none(),
            "no capture"
        );
        assert!(
            g.hold(moment(true, false, false), || false).is_none(),
            "nothing open"
        );
        assert!(
            g.hold(moment(true, true, true), || false).is_none(),
            "a drain"
        );
        assert!(
            g.hold(moment(true, true, false), || true).is_none(),
            "messages ready"
        );
        let until = g.hold(moment(true, true, false), || false).expect("held");
        assert_eq!(
            g.hold(moment(true, true, false), || false),
            Some(until),
            "the same hold, not a new one"
        );
        tokio::time::sleep_until(until).await;
        assert!(
            g.hold(moment(true, true, false), || false).is_none(),
            "over"
        );
        assert!(
            g.hold(moment(true, true, false), || false).is_some(),
            "a new hold"
        );
    }

    #[tokio::test]
    async fn a_rise_after_the_look_wakes_the_wait() {
        let (tx, rx) = watch::channel(());
        let mut g = GetGate::new(Some(rx));
        tx.send_replace(());
        // The look marks everything before it seen…
        assert!(g.hold(moment(true, true, false), || false).is_some());
        let early = tokio::time::timeout(Duration::from_millis(20), g.ready_rose()).await;
        assert!(early.is_err(), "nothing new since the look");
        // …and a rise after it wakes the wait.
        tx.send_replace(());
        tokio::time::timeout(Duration::from_secs(5), g.ready_rose())
            .await
            .expect("woken");
    }
}
