//! Bringing back messages that a held transaction hides on KubeMQ v2.4 (KMQ-20).
//!
//! A transaction whose messages a consumer still holds stays a member of the queue's group, and
//! a member whose Get was already answered keeps every message the broker gives it afterwards: a
//! message moved to it when another member closed, or one it took into room its short Get left.
//! No Get sees such a message until that transaction closes, and a consumer that waits for more
//! messages before it settles the ones it holds (a client settling in batches, a credit window
//! larger than its settle batch) then waits for ever.
//!
//! So when consumers have credit, every transaction of the loop is held by them, and either a
//! Get that asked only for messages known to be there (stored by this process, or counted
//! waiting by KubeMQ beyond what the loop holds) came back short while those transactions were
//! open (the missing ones are hidden there: [`Hidden`]), a sequence the loop's Gets skipped
//! stays missing (`gaps.rs`), or no Get has brought a new message for [`StallWatch`]'s time,
//! the loop closes those transactions. KubeMQ gives back what they had, hidden messages
//! included, and the next Get takes it all. The
//! messages the consumers still hold come back too: each is bound to the delivery the consumer
//! already has (not handed out again), and its settlement — given before or after it came
//! back — goes to the transaction it is in now. [`Moved`] keeps that bookkeeping.
//!
//! A message that does not come back (another process took it) is forgotten after
//! [`MOVED_MEMORY`]; it is delivered there again, as at-least-once allows. Closing transactions
//! that hid nothing costs one Get of the held messages, so rounds that bring no new message back
//! off, from [`STALL_FIRST`] up to [`STALL_LONGEST`], and rounds on evidence (a short Get, a
//! skipped sequence) are at least an eighth of that apart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use std::time::Instant;

/// How long consumers wait with credit and no new message before held transactions are closed.
pub(super) const STALL_FIRST: Duration = Duration::from_secs(2);
/// The longest wait, reached after rounds that brought no new message.
pub(super) const STALL_LONGEST: Duration = Duration::from_secs(32);
/// How long a moved message that does not come back is remembered.
pub(super) const MOVED_MEMORY: Duration = Duration::from_secs(300);

/// When to close held transactions: on evidence that they hide messages (a short Get, a
/// skipped sequence), or after consumers with credit saw no new message for a while.
#[derive(Debug)]
pub(super) struct StallWatch {
    /// Since when the loop is stuck; `None` while it is not.
    since: Option<Instant>,
    /// How long it may be stuck before a round.
    after: Duration,
    /// When the last round was.
    last_round: Option<Instant>,
}

impl Default for StallWatch {
    fn default() -> Self {
        StallWatch {
            since: None,
            after: STALL_FIRST,
            last_round: None,
        }
    }
}

impl StallWatch {
    /// Whether a round is due now, given whether the loop is `stuck` (consumers with credit,
    /// nothing buffered, every open transaction held by consumers) and whether a short Get or a
    /// skipped sequence showed messages hidden in those transactions (`evidence`).
    pub(super) fn due(&mut self, stuck: bool, evidence: bool, now: Instant) -> bool {
        if !stuck {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        let spaced = self
            .last_round
            .is_none_or(|last| now.duration_since(last) >= self.after / 8);
        (evidence && spaced) || now.duration_since(since) >= self.after
    }

    /// The loop is not stuck (no credit, or messages waiting for it): the wait starts again.
    pub(super) fn calm(&mut self) {
        self.since = None;
    }

    /// A Get brought a message nobody had: the loop is not stuck, and the next wait is short.
    pub(super) fn progressed(&mut self) {
        self.since = None;
        self.after = STALL_FIRST;
    }

    /// A round closed the held transactions at `now`: the next one waits twice as long unless
    /// a new message comes meanwhile.
    pub(super) fn rounded(&mut self, now: Instant) {
        self.since = None;
        self.last_round = Some(now);
        self.after = (self.after * 2).min(STALL_LONGEST);
    }
}

/// Messages a Get asked for as known to be there and did not get, while transactions of the
/// loop were open: on KubeMQ those transactions may hide them (KMQ-20).
#[derive(Debug)]
pub(super) struct Hidden {
    /// How many the Get missed.
    pub count: u32,
    /// Whether the loop knew itself its queue's one consumer (`gaps.rs`): only then is the
    /// miss a reason for a round; otherwise it only sizes the next round's Get.
    pub alone: bool,
    /// The transactions open when it was answered.
    pub suspects: Vec<Arc<str>>,
}

/// What a round gave back, for the next Get's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct GivenBack {
    /// Messages of the closed transactions (the backend counts them ready again).
    pub held: u32,
    /// Messages a short Get or the skipped sequences showed hidden in them (no count has
    /// them).
    pub hidden: u32,
}

/// Where a moved message's delivery stands; `O` is how a delivery is settled.
#[derive(Debug, Clone)]
enum Fate<O> {
    /// Held by a consumer, and not back from KubeMQ yet.
    Out,
    /// Settled by its consumer before it came back: settle it so once it does.
    Settled(O),
    /// Given back by its consumer's connection before it was delivered: hand it out afresh.
    Returned,
    /// Back in this transaction, still held by its consumer.
    Bound(Arc<str>),
}

#[derive(Debug)]
struct Entry<O> {
    fate: Fate<O>,
    since: Instant,
}

/// What to do with a fetched message.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Arrival<O> {
    /// A message no consumer has: buffer it.
    New,
    /// A consumer holds it already: count it in its transaction, do not hand it out.
    Bound,
    /// Its consumer already settled it: settle it in its transaction with this outcome.
    Settle(O),
}

/// Messages of transactions closed under their consumers, by sequence; `O` is how a delivery is
/// settled.
#[derive(Debug)]
pub(super) struct Moved<O> {
    map: HashMap<u64, Entry<O>>,
}

impl<O> Default for Moved<O> {
    fn default() -> Self {
        Moved {
            map: HashMap::new(),
        }
    }
}

impl<O: Copy> Moved<O> {
    /// Nothing is being tracked (the common case: every check is skipped).
    pub(super) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Message `seq`'s transaction is being closed while a consumer holds it.
    pub(super) fn out(&mut self, seq: u64, now: Instant) {
        self.map.insert(
            seq,
            Entry {
                fate: Fate::Out,
                since: now,
            },
        );
    }

    /// Message `seq`'s delivery was settled with `outcome` under a transaction the loop no
    /// longer has: the transaction to settle it in now, or `None` when it is remembered until
    /// the message comes back (or was never tracked).
    pub(super) fn settle(&mut self, seq: u64, outcome: O) -> Option<Arc<str>> {
        self.bound_or(seq, Fate::Settled(outcome))
    }

    /// Whether `seq` is tracked here (a settlement or return for it is not a lost session's).
    pub(super) fn tracks(&self, seq: u64) -> bool {
        self.map.contains_key(&seq)
    }

    /// A delivery of message `seq` went back undelivered: the transaction it is in now, if it
    /// came back already (buffer it there), else `None` (hand it out afresh when it does).
    pub(super) fn returned(&mut self, seq: u64) -> Option<Arc<str>> {
        self.bound_or(seq, Fate::Returned)
    }

    /// What the consumer did with message `seq`'s delivery: if the message is back, forget it
    /// and name the transaction it is in now; otherwise remember `fate` until it comes back.
    fn bound_or(&mut self, seq: u64, fate: Fate<O>) -> Option<Arc<str>> {
        let e = self.map.get_mut(&seq)?;
        if let Fate::Bound(now_in) = &e.fate {
            let transaction = now_in.clone();
            self.map.remove(&seq);
            return Some(transaction);
        }
        e.fate = fate;
        None
    }

    /// Message `seq` came back in transaction `now_in`.
    pub(super) fn fetched(&mut self, seq: u64, now_in: &Arc<str>) -> Arrival<O> {
        let Some(e) = self.map.get_mut(&seq) else {
            return Arrival::New;
        };
        match e.fate {
            Fate::Out => {
                e.fate = Fate::Bound(now_in.clone());
                Arrival::Bound
            }
            Fate::Settled(o) => {
                self.map.remove(&seq);
                Arrival::Settle(o)
            }
            // Fetched again while bound: KubeMQ gave it back once more. Its consumer still
            // holds the one delivery.
            Fate::Bound(_) => {
                e.fate = Fate::Bound(now_in.clone());
                Arrival::Bound
            }
            Fate::Returned => {
                self.map.remove(&seq);
                Arrival::New
            }
        }
    }

    /// Forgets messages moved before `now - MOVED_MEMORY` that never came back.
    pub(super) fn forget_old(&mut self, now: Instant) {
        self.map.retain(|_, e| {
            matches!(e.fate, Fate::Bound(_)) || now.duration_since(e.since) < MOVED_MEMORY
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An outcome, as the Get loop's settlements carry one.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Outcome {
        Ack,
        Nack,
    }

    #[test]
    fn a_held_message_is_bound_and_its_settlement_follows_it() {
        let new: Arc<str> = "new".into();
        let mut m = Moved::default();
        m.out(7, Instant::now());
        assert_eq!(m.fetched(7, &new), Arrival::Bound);
        let now_in = m.settle(7, Outcome::Ack).expect("rewritten");
        assert!(Arc::ptr_eq(&now_in, &new));
        assert!(m.is_empty(), "settled: forgotten");
        assert_eq!(m.settle(7, Outcome::Ack), None, "not tracked");
    }

    #[test]
    fn a_settlement_before_the_message_comes_back_waits_for_it() {
        let new: Arc<str> = "new".into();
        let mut m = Moved::default();
        m.out(3, Instant::now());
        assert!(m.settle(3, Outcome::Nack).is_none());
        assert_eq!(m.fetched(3, &new), Arrival::Settle(Outcome::Nack));
        assert!(m.is_empty());
        assert_eq!(m.fetched(3, &new), Arrival::New, "unknown again");
    }

    #[test]
    fn a_returned_delivery_is_handed_out_afresh_or_buffered_where_it_is() {
        let new: Arc<str> = "new".into();
        let mut m = Moved::<Outcome>::default();
        m.out(1, Instant::now());
        m.out(2, Instant::now());
        assert_eq!(m.returned(1), None);
        assert_eq!(m.fetched(1, &new), Arrival::New);
        assert_eq!(m.fetched(2, &new), Arrival::Bound);
        assert_eq!(m.returned(2).as_deref(), Some("new"));
        assert!(m.is_empty());
    }

    #[test]
    fn what_never_comes_back_is_forgotten_but_not_a_bound_delivery() {
        let new: Arc<str> = "new".into();
        let t0 = Instant::now();
        let mut m = Moved::<Outcome>::default();
        m.out(1, t0);
        m.out(2, t0);
        assert_eq!(m.fetched(2, &new), Arrival::Bound);
        m.forget_old(t0 + MOVED_MEMORY - Duration::from_secs(1));
        assert!(m.tracks(1));
        m.forget_old(t0 + MOVED_MEMORY);
        assert!(!m.tracks(1) && m.tracks(2));
    }

    #[test]
    fn the_watch_fires_after_a_stall_and_backs_off_when_rounds_find_nothing() {
        let t0 = Instant::now();
        let mut w = StallWatch::default();
        assert!(!w.due(true, false, t0));
        assert!(!w.due(true, false, t0 + STALL_FIRST - Duration::from_millis(1)));
        assert!(w.due(true, false, t0 + STALL_FIRST));
        let t1 = t0 + STALL_FIRST;
        w.rounded(t1);
        assert!(!w.due(true, false, t1));
        assert!(!w.due(true, false, t1 + STALL_FIRST));
        assert!(w.due(true, false, t1 + STALL_FIRST * 2));
        for _ in 0..10 {
            w.rounded(t1);
        }
        assert!(!w.due(true, false, t1));
        assert!(!w.due(true, false, t1 + STALL_LONGEST - Duration::from_millis(1)));
        assert!(
            w.due(true, false, t1 + STALL_LONGEST),
            "never longer than this"
        );
        w.calm();
        assert!(
            !w.due(true, false, t1 + STALL_LONGEST * 2),
            "the wait starts again"
        );
        w.progressed();
        assert!(!w.due(true, false, t1));
        assert!(
            w.due(true, false, t1 + STALL_FIRST),
            "back to the first wait"
        );
    }
}
