//! Sequences a Get loop skipped: the trace of messages hidden in transactions on KubeMQ v2.4
//! (KMQ-20).
//!
//! KubeMQ numbers a queue's messages in the order they are stored, and hands them to Gets in that
//! order, except a message moved out of a closing transaction, which comes back about 100 ms
//! later (KMQ-17). A message moved into a transaction whose Get was already answered comes back
//! only when that transaction closes, and then often into another open one: under a steady flow
//! there is almost always one, and such a message hops from transaction to transaction for
//! seconds while newer messages flow past it. No count shows it (it was stored and counted long
//! ago); its sequence does: it stays a gap below the highest sequence the loop fetched.
//!
//! So the loop remembers the gaps it fetched across, and a gap older than [`GAP_WAIT`] while
//! consumers hold open transactions is evidence that those transactions hide it: the loop closes
//! them (`rehome.rs`). A gap can also be a message someone else took (another connector
//! process, another KubeMQ client) or one KubeMQ dropped (expired, dead-lettered): a gap still
//! open after the round that should have brought it back is forgotten, and rounds that bring no
//! gap back come further apart, from [`ROUND_SPACING_FIRST`] to [`ROUND_SPACING_LONGEST`].
//!
//! A round gives the messages the consumers hold back to the queue until the loop's next Get
//! takes them again, and another consumer of the queue may take one first and deliver it a
//! second time. Hidden messages are a handful in thousands; when more than one sequence in
//! [`SHARED_SHARE`] is skipped, others consume the queue too, and until the loop fetched
//! [`EXCLUSIVE_AFTER`] sequences it cannot tell: only a loop that is its queue's one consumer
//! ([`Gaps::exclusive`]) takes a gap or a short Get as a reason for a round (the timed round
//! applies to every loop).
//!
//! No clock and no I/O here: the loop passes the sequences it fetched and the instant.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a gap may stay open before it counts as hidden: a moved message comes back after
/// about 100 ms, 120 ms at most when KubeMQ is busy (KMQ-17).
pub(super) const GAP_WAIT: Duration = Duration::from_millis(250);

/// The shortest time between rounds on a gap's evidence.
pub(super) const ROUND_SPACING_FIRST: Duration = Duration::from_millis(250);

/// The longest, reached after rounds that brought no gap back (another consumer takes
/// messages of the queue).
pub(super) const ROUND_SPACING_LONGEST: Duration = Duration::from_secs(8);

/// Above one skipped sequence in this many fetched (and at least [`SHARED_LEAST`] skipped), the
/// queue has other consumers.
const SHARED_SHARE: u64 = 10;

/// The sequences a loop must have fetched before it can tell that it is its queue's one
/// consumer.
const EXCLUSIVE_AFTER: u64 = 64;

/// The fewest skipped sequences that can say the queue has other consumers.
const SHARED_LEAST: u64 = 8;

/// Sequences counted before the counts are halved, so that they follow the recent past.
const COUNT_SPAN: u64 = 2_048;

/// The most gaps remembered: a jump wider than this (the loop joined a queue others consume,
/// or many messages expired) starts the record afresh, so memory stays bounded.
const MOST_GAPS: u64 = 4_096;

/// The gaps below the highest sequence fetched, and when each was first seen.
#[derive(Debug)]
pub(super) struct Gaps {
    /// The highest sequence fetched so far.
    top: Option<u64>,
    /// Sequences below `top` never fetched, with the instant the loop first fetched past them.
    open: BTreeMap<u64, Instant>,
    /// When the last round on this evidence was, and the gaps it was to bring back.
    round: Option<Round>,
    /// The time between rounds on this evidence.
    spacing: Duration,
    /// Sequences fetched, recently.
    fetched: u64,
    /// Sequences skipped, recently.
    skipped: u64,
}

/// A round taken on gaps' evidence.
#[derive(Debug)]
struct Round {
    at: Instant,
    /// Gaps overdue when it began: those it should bring back.
    overdue: Vec<u64>,
    /// Whether a Get answered since.
    answered: bool,
}

impl Default for Gaps {
    fn default() -> Self {
        Gaps {
            top: None,
            open: BTreeMap::new(),
            round: None,
            spacing: ROUND_SPACING_FIRST,
            fetched: 0,
            skipped: 0,
        }
    }
}

impl Gaps {
    /// A Get answered at `now` with these sequences.
    pub(super) fn fetched(&mut self, seqs: &[u64], now: Instant) {
        for &s in seqs {
            self.open.remove(&s);
            self.fetched += 1;
            match self.top {
                None => self.top = Some(s),
                Some(top) if s > top => {
                    let skipped = s - top - 1;
                    self.skipped += skipped.min(MOST_GAPS);
                    if skipped >= MOST_GAPS {
                        self.open.clear();
                    } else {
                        self.open.extend((top + 1..s).map(|g| (g, now)));
                    }
                    self.top = Some(s);
                }
                Some(_) => {}
            }
        }
        if self.fetched > COUNT_SPAN {
            self.fetched /= 2;
            self.skipped /= 2;
        }
        self.after_round_get();
    }

    /// Once the Get after a round answered, the gaps that round was to bring back and did not
    /// are someone else's: forgotten. A round that brought some back keeps rounds close;
    /// one that brought none spaces them further.
    fn after_round_get(&mut self) {
        let Some(r) = self.round.as_mut() else {
            return;
        };
        if r.answered {
            return;
        }
        r.answered = true;
        let before = r.overdue.len();
        let mut missing = 0;
        for g in &r.overdue {
            if self.open.remove(g).is_some() {
                missing += 1;
            }
        }
        self.spacing = if missing < before {
            ROUND_SPACING_FIRST
        } else {
            (self.spacing * 2).min(ROUND_SPACING_LONGEST)
        };
    }

    /// Whether a gap open for [`GAP_WAIT`] or longer at `now` calls for a round: the last
    /// round's Get answered and its spacing passed.
    pub(super) fn due(&self, now: Instant) -> bool {
        if !self.exclusive() {
            return false;
        }
        if let Some(r) = &self.round {
            if !r.answered || now.duration_since(r.at) < self.spacing {
                return false;
            }
        }
        self.overdue(now) > 0
    }

    /// Whether the loop is its queue's one consumer, as far as the sequences it fetched
    /// recently tell: enough of them, and few skipped.
    pub(super) fn exclusive(&self) -> bool {
        let shared = self.skipped >= SHARED_LEAST && self.skipped * SHARED_SHARE > self.fetched;
        self.fetched >= EXCLUSIVE_AFTER && !shared
    }

    /// Counts the loop as having fetched enough sequences, none skipped, to know it is its
    /// queue's one consumer (for tests that script a few sequences).
    #[cfg(test)]
    pub(super) fn assume_exclusive(&mut self) {
        self.fetched = self.fetched.max(EXCLUSIVE_AFTER);
    }

    /// How many gaps are open for [`GAP_WAIT`] or longer at `now`.
    pub(super) fn overdue(&self, now: Instant) -> usize {
        self.overdue_gaps(now).count()
    }

    /// The gaps open for [`GAP_WAIT`] or longer at `now`.
    fn overdue_gaps(&self, now: Instant) -> impl Iterator<Item = u64> + '_ {
        self.open
            .iter()
            .filter(move |(_, since)| now.duration_since(**since) >= GAP_WAIT)
            .map(|(g, _)| *g)
    }

    /// A round closes the held transactions at `now`: the overdue gaps should come back.
    pub(super) fn rounded(&mut self, now: Instant) {
        let overdue = self.overdue_gaps(now).collect();
        self.round = Some(Round {
            at: now,
            overdue,
            answered: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skipped_sequence_is_overdue_after_the_wait_unless_fetched() {
        let t0 = Instant::now();
        let mut g = Gaps::default();
        g.assume_exclusive();
        g.fetched(&[1, 2], t0);
        g.fetched(&[4, 5], t0);
        g.fetched(&[8], t0);
        assert_eq!(g.overdue(t0 + GAP_WAIT - Duration::from_millis(1)), 0);
        assert_eq!(g.overdue(t0 + GAP_WAIT), 3, "3, 6 and 7");
        g.fetched(&[6, 3], t0 + Duration::from_millis(120));
        assert_eq!(g.overdue(t0 + GAP_WAIT), 1, "moved back in time: only 7");
    }

    #[test]
    fn a_round_that_brings_nothing_back_forgets_its_gaps_and_spaces_the_next() {
        let t0 = Instant::now();
        let mut g = Gaps::default();
        g.assume_exclusive();
        g.fetched(&[1, 3], t0);
        let t1 = t0 + GAP_WAIT;
        assert!(g.due(t1));
        g.rounded(t1);
        assert!(!g.due(t1), "not before the round's Get answered");
        g.fetched(&[4, 6], t1);
        assert!(!g.open.contains_key(&2), "2 forgotten");
        let longer = t1 + ROUND_SPACING_FIRST * 2;
        assert!(
            !g.due(longer - Duration::from_millis(1)),
            "the next round waits twice as long"
        );
        assert!(g.due(longer), "for 5");
    }

    #[test]
    fn a_round_that_brings_a_gap_back_keeps_rounds_close() {
        let t0 = Instant::now();
        let mut g = Gaps::default();
        g.assume_exclusive();
        g.fetched(&[1, 3], t0);
        let t1 = t0 + GAP_WAIT;
        g.rounded(t1);
        g.fetched(&[2, 4, 6], t1);
        assert!(g.due(t1 + ROUND_SPACING_FIRST), "for 5");
    }

    #[test]
    fn a_queue_others_consume_too_calls_no_round() {
        let t0 = Instant::now();
        let mut g = Gaps::default();
        // Every other sequence goes to another consumer.
        let mine: Vec<u64> = (1..=40).map(|n| n * 2).collect();
        g.fetched(&mine, t0);
        assert!(!g.exclusive());
        assert!(
            !g.due(t0 + GAP_WAIT),
            "{} gaps, none hidden",
            g.overdue(t0 + GAP_WAIT)
        );
        // A sole consumer with a few hidden in a thousand.
        let mut g = Gaps::default();
        let mine: Vec<u64> = (1..=1000).filter(|n| n % 100 != 0).collect();
        g.fetched(&mine, t0);
        assert!(g.exclusive());
        assert!(g.due(t0 + GAP_WAIT));
    }

    #[test]
    fn a_wide_jump_starts_afresh() {
        let t0 = Instant::now();
        let mut g = Gaps::default();
        g.assume_exclusive();
        g.fetched(&[1, 3], t0);
        g.fetched(&[3 + MOST_GAPS + 1], t0);
        assert!(!g.due(t0 + GAP_WAIT));
        assert!(g.open.is_empty());
    }
}
