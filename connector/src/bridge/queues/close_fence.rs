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
//! not come within [`FENCE_WAIT`] no longer holds the Get back.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Handled;

/// The longest a Get waits for the answers (KubeMQ gives them within a millisecond or two).
pub(super) const FENCE_WAIT: Duration = Duration::from_millis(50);

/// The answers the next Get waits for.
#[derive(Debug, Default)]
pub(super) struct Fences {
    pending: Vec<Handled>,
    /// When the wait ends at the latest; set when the first of them is waited for.
    until: Option<Instant>,
}

impl Fences {
    /// One more answer to wait for.
    pub(super) fn push(&mut self, handled: Handled) {
        self.pending.push(handled);
    }

    /// Nothing to wait for.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Waits for the next answer, or gives them all up once [`FENCE_WAIT`] has passed since the
    /// first wait. Cancel-safe: an answer that arrives after a cancelled wait is seen by the next.
    pub(super) async fn next(&mut self) {
        let until = *self
            .until
            .get_or_insert_with(|| Instant::now() + FENCE_WAIT);
        let Some(first) = self.pending.last_mut() else {
            self.until = None;
            return;
        };
        tokio::select! {
            () = first => {
                self.pending.pop();
            }
            () = tokio::time::sleep_until(until) => {
                self.pending.clear();
            }
        }
        if self.pending.is_empty() {
            self.until = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn waits_for_every_answer_in_turn() {
        let mut f = Fences::default();
        assert!(f.is_empty());
        let (a_tx, a_rx) = oneshot::channel();
        let (b_tx, b_rx) = oneshot::channel();
        f.push(Handled::when(a_rx));
        f.push(Handled::when(b_rx));
        f.push(Handled::now());
        f.next().await;
        assert!(!f.is_empty(), "the ready one went first");
        let early = tokio::time::timeout(Duration::from_millis(10), f.next()).await;
        assert!(early.is_err(), "no answer yet");
        b_tx.send(Default::default()).expect("sent");
        f.next().await;
        drop(a_tx); // a session that ended counts as handled
        f.next().await;
        assert!(f.is_empty());
    }

    #[tokio::test]
    async fn an_answer_that_never_comes_holds_back_no_longer_than_the_wait() {
        let mut f = Fences::default();
        let (_kept, rx) = oneshot::channel();
        f.push(Handled::when(rx));
        let start = Instant::now();
        f.next().await;
        assert!(f.is_empty());
        assert!(start.elapsed() >= FENCE_WAIT, "{:?}", start.elapsed());
    }
}
