//! Whether a Get loop whose queue looks idle puts a Get on the wire, and for how many messages
//! (KMQ-21, docs/queues-consume-design.md "Idle queues are watched").
//!
//! On KubeMQ every Get holds one of the broker's 200 shared clients for as long as it waits, and
//! a Get on an idle queue waits at least a second: the busy queues' Gets that draw the same
//! client wait behind it. So when the loop knows of no message ready (its own count of what this
//! process sent says nothing, or cannot tell), it Gets only what the queue's view
//! ([`crate::backend::queue_watch`]) shows is there:
//! 1. messages this process sent to the channel or gave back since the last look;
//! 2. messages stored since the last look by anyone, as far as KubeMQ counts any of them as
//!    waiting beyond what this loop holds unsettled (another consumer may have taken them);
//! 3. messages KubeMQ counts as waiting beyond what this loop holds, with nothing new stored
//!    (given back by another connector process, or redelivered): a Get for them that comes back
//!    short makes the next such Get wait, from 1 s doubling to 32 s, since what it looked for
//!    may be held by someone else.
//!
//! Counts asked before the loop's last Get or settlement was answered say nothing of what that
//! Get left or that settlement took away (KubeMQ counts a message sent to a consumer as waiting
//! until it is settled): the loop looks again once a newer answer is in. Where KubeMQ's counts
//! cannot be read the loop falls back to a Get that waits.
//!
//! A consumer that may not read its queue must be told so at once, not left waiting (AUTHZ-9),
//! and QueuesInfo is not checked against KubeMQ's access control: unless the backend confirmed
//! that the loop may read (a check that costs no Get, KMQ-23), the loop's first Get goes on the
//! wire whatever the view says.
//!
//! No clock and no I/O here: the loop passes the view, what it holds and the instant.

use std::time::Duration;

use std::time::Instant;

use crate::backend::queue_watch::{BrokerCounts, Counts, QueueView, POLL_FLOOR};

/// The first wait after a Get for messages counted as waiting found fewer than it asked for.
const FIRST_EXCESS_PAUSE: Duration = Duration::from_secs(1);

/// The longest such wait.
const LAST_EXCESS_PAUSE: Duration = Duration::from_secs(32);

/// How long Gets for messages counted as waiting come back short before the loop reports it.
const PERSISTENT: Duration = Duration::from_secs(30);

/// What the loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Look {
    /// Get this many messages (at least one; the loop caps it by demand).
    Get(u32),
    /// Wait for the view to change, or until the instant given.
    Watch(Option<Instant>),
    /// The view cannot tell: Get as if there were no watch.
    Blind,
}

/// Messages KubeMQ has counted as waiting, beyond what the loop holds, for over half a minute
/// of Gets that did not return them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Persistent {
    /// How many KubeMQ counted as waiting beyond what the loop held, at its last look.
    pub counted: u64,
}

/// What a look sized a Get for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SizedBy {
    /// Messages sent or stored since the last look.
    New,
    /// This many that KubeMQ counts as waiting beyond what the loop holds, nothing new stored.
    Counted(u64),
}

/// What the loop holds and knows when it looks.
#[derive(Debug, Clone, Copy)]
pub(super) struct Holding {
    /// Messages of its open transactions that KubeMQ still counts as unsettled.
    pub held: u64,
    /// The instant now.
    pub now: Instant,
}

/// One loop's memory of what it has seen of its queue.
#[derive(Debug)]
pub(super) struct IdleWatch {
    /// The view's `touched` at the last look.
    touched: u64,
    /// The highest sequence known stored: fetched by the loop, or KubeMQ's last message when the
    /// loop looked.
    known_last: Option<u64>,
    /// When the last Get was answered. `None` until the loop's first Get is answered, which is
    /// how KubeMQ says whether the loop may read.
    answered: Option<Instant>,
    /// When the loop's last Get or settlement was answered: counts asked before then are stale.
    fresh_from: Option<Instant>,
    /// A Get for messages counted as waiting waits until then.
    excess_from: Option<Instant>,
    /// The next wait after such a Get comes back short.
    excess_pause: Duration,
    /// When the current run of Gets that came back short began.
    short_since: Option<Instant>,
    /// That run was reported.
    reported: bool,
    /// How a look sized the Get on the wire, if one did.
    looked: Option<SizedBy>,
    /// The backend confirmed that the loop may read: no first Get is needed to learn it.
    allowed: bool,
}

impl IdleWatch {
    /// A loop that starts watching a view whose `touched` reads `touched`.
    pub(super) fn new(touched: u64) -> IdleWatch {
        IdleWatch {
            touched,
            known_last: None,
            answered: None,
            fresh_from: None,
            excess_from: None,
            excess_pause: FIRST_EXCESS_PAUSE,
            short_since: None,
            reported: false,
            looked: None,
            allowed: false,
        }
    }

    /// What to do, given the queue's view.
    pub(super) fn look(&mut self, view: &QueueView, at: Holding) -> Look {
        let local = view.touched.wrapping_sub(self.touched);
        self.touched = view.touched;
        if local > 0 {
            return self.get(local, SizedBy::New);
        }
        if self.answered.is_none() && !self.allowed {
            return Look::Blind;
        }
        let Counts {
            last_sequence,
            waiting,
        } = match view.broker {
            BrokerCounts::Unasked => return Look::Watch(None),
            BrokerCounts::Blind => return Look::Blind,
            BrokerCounts::Seen(c) => c,
        };
        if let (Some(asked), Some(fresh_from)) = (view.asked, self.fresh_from) {
            if asked < fresh_from {
                return Look::Watch(Some(at.now + POLL_FLOOR));
            }
        }
        let known = *self.known_last.get_or_insert(last_sequence);
        let excess = waiting.saturating_sub(at.held);
        if last_sequence > known {
            self.known_last = Some(last_sequence);
            if excess > 0 {
                return self.get((last_sequence - known).min(excess), SizedBy::New);
            }
        }
        if excess == 0 {
            return Look::Watch(None);
        }
        match self.excess_from {
            Some(from) if at.now < from => Look::Watch(Some(from)),
            _ => self.get(excess, SizedBy::Counted(excess)),
        }
    }

    /// A settlement of the loop's (an ack, a NAck, a close) was answered `now`: KubeMQ's counts
    /// asked before then may still count what it settled as waiting.
    pub(super) fn settled(&mut self, now: Instant) {
        self.fresh_from = Some(self.fresh_from.map_or(now, |f| f.max(now)));
    }

    /// The backend confirmed that the loop may read its queue.
    pub(super) fn read_allowed(&mut self) {
        self.allowed = true;
    }

    /// The loop sized a Get from its own count, which includes what this process sent so far:
    /// those touches are not looked for again.
    pub(super) fn skip_touches(&mut self, touched: u64) {
        self.touched = touched;
    }

    fn get(&mut self, n: u64, sized: SizedBy) -> Look {
        self.looked = Some(sized);
        Look::Get(u32::try_from(n).unwrap_or(u32::MAX).max(1))
    }

    /// A Get for `asked` messages brought `got`, the highest sequence among them `last`.
    /// Returns the messages KubeMQ keeps counting as waiting that no Get has returned for
    /// [`PERSISTENT`], once per such run: held unsettled elsewhere that long, or by members a
    /// KubeMQ crash left behind, which keep them for good (KMQ-24) — worth an operator's look.
    pub(super) fn answered(
        &mut self,
        asked: u32,
        got: usize,
        last: Option<u64>,
        now: Instant,
    ) -> Option<Persistent> {
        self.answered = Some(now);
        self.settled(now);
        if let Some(last) = last {
            self.known_last = Some(self.known_last.map_or(last, |k| k.max(last)));
        }
        let sized = self.looked.take()?;
        if got < asked as usize {
            self.excess_from = Some(now + self.excess_pause);
            self.excess_pause = (self.excess_pause * 2).min(LAST_EXCESS_PAUSE);
            let since = *self.short_since.get_or_insert(now);
            let long = now.saturating_duration_since(since) >= PERSISTENT;
            let SizedBy::Counted(counted) = sized else {
                return None;
            };
            if self.reported || !long {
                return None;
            }
            self.reported = true;
            Some(Persistent { counted })
        } else {
            self.excess_from = None;
            self.excess_pause = FIRST_EXCESS_PAUSE;
            self.short_since = None;
            self.reported = false;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(last_sequence: u64, waiting: u64, asked: Instant) -> QueueView {
        QueueView {
            touched: 0,
            broker: BrokerCounts::Seen(Counts {
                last_sequence,
                waiting,
            }),
            asked: Some(asked),
        }
    }

    fn holding(held: u64, now: Instant) -> Holding {
        Holding { held, now }
    }

    /// A watch whose loop's first Get came back empty at `at`.
    fn after_first_get(touched: u64, at: Instant) -> IdleWatch {
        let mut w = IdleWatch::new(touched);
        w.answered(1, 0, None, at);
        w
    }

    /// AUTHZ-9: the loop's first Get goes on the wire even with nothing to fetch, unless the
    /// backend confirmed the read; once it is answered the loop watches.
    #[test]
    fn the_first_get_goes_whatever_the_view_says() {
        let t0 = Instant::now();
        let mut w = IdleWatch::new(0);
        assert_eq!(w.look(&seen(3, 0, t0), holding(0, t0)), Look::Blind);
        assert_eq!(
            w.look(&QueueView::default(), holding(0, t0)),
            Look::Blind,
            "nor while KubeMQ was not asked yet"
        );
        w.answered(1, 0, None, t0);
        assert_eq!(w.look(&seen(3, 0, t0), holding(0, t0)), Look::Watch(None));
        let mut confirmed = IdleWatch::new(0);
        confirmed.read_allowed();
        assert_eq!(
            confirmed.look(&seen(3, 0, t0), holding(0, t0)),
            Look::Watch(None),
            "KMQ-23: no first Get once the read is confirmed"
        );
    }

    /// KMQ-21: with nothing known to be there the loop waits on the view, not with a Get; what
    /// this process sends wakes it for exactly that many.
    #[test]
    fn nothing_known_watches_and_a_local_send_gets_what_it_sent() {
        let t0 = Instant::now();
        let mut w = after_first_get(7, t0);
        let mut v = seen(10, 0, t0);
        v.touched = 7;
        assert_eq!(w.look(&v, holding(0, t0)), Look::Watch(None));
        v.touched = 10;
        assert_eq!(w.look(&v, holding(0, t0)), Look::Get(3));
        assert_eq!(
            w.look(&v, holding(0, t0)),
            Look::Watch(None),
            "counted once"
        );
        let unasked = QueueView::default();
        assert_eq!(
            after_first_get(0, t0).look(&unasked, holding(0, t0)),
            Look::Watch(None)
        );
        let blind = QueueView {
            broker: BrokerCounts::Blind,
            ..QueueView::default()
        };
        assert_eq!(
            after_first_get(0, t0).look(&blind, holding(0, t0)),
            Look::Blind
        );
    }

    /// Messages stored elsewhere are fetched when KubeMQ lists them and counts them waiting
    /// beyond what the loop holds; stored and gone already (another consumer took them), they
    /// are not looked for.
    #[test]
    fn messages_stored_elsewhere_are_fetched_while_kubemq_counts_them_waiting() {
        let t0 = Instant::now();
        let mut w = after_first_get(0, t0);
        assert_eq!(w.look(&seen(5, 2, t0), holding(2, t0)), Look::Watch(None));
        assert_eq!(w.look(&seen(9, 6, t0), holding(2, t0)), Look::Get(4));
        w.answered(4, 4, Some(9), t0 + Duration::from_millis(1));
        let t1 = t0 + Duration::from_millis(60);
        assert_eq!(
            w.look(&seen(12, 0, t1), holding(0, t1)),
            Look::Watch(None),
            "taken by someone else"
        );
        assert_eq!(
            w.look(&seen(14, 5, t1), holding(4, t1)),
            Look::Get(1),
            "two stored, one of them waiting"
        );
    }

    /// Counts asked before the last Get was answered do not show what that Get took: the loop
    /// looks again after the next answer is due.
    #[test]
    fn counts_older_than_the_last_answer_are_not_acted_on() {
        let t0 = Instant::now();
        let mut w = after_first_get(0, t0);
        assert_eq!(w.look(&seen(1, 0, t0), holding(0, t0)), Look::Watch(None));
        assert_eq!(w.look(&seen(4, 3, t0), holding(0, t0)), Look::Get(3));
        let t1 = t0 + Duration::from_millis(2);
        w.answered(3, 3, Some(4), t1);
        assert_eq!(
            w.look(&seen(4, 3, t0), holding(0, t1)),
            Look::Watch(Some(t1 + POLL_FLOOR))
        );
        let t2 = t1 + POLL_FLOOR;
        assert_eq!(w.look(&seen(4, 0, t2), holding(0, t2)), Look::Watch(None));
    }

    /// KMQ-21, KMQ-22: KubeMQ counts a message its consumer holds as waiting until it is
    /// settled, so counts asked before the loop's settlement was answered still show it: the loop
    /// does not Get for it (such a Get finds nothing and waits a second on one of KubeMQ's
    /// shared clients), and looks again at counts asked after the settlement.
    #[test]
    fn counts_older_than_the_last_settlement_are_not_acted_on() {
        let t0 = Instant::now();
        let mut w = after_first_get(0, t0);
        assert_eq!(w.look(&seen(1, 1, t0), holding(1, t0)), Look::Watch(None));
        let t1 = t0 + Duration::from_millis(5);
        w.settled(t1);
        assert_eq!(
            w.look(&seen(1, 1, t0), holding(0, t1)),
            Look::Watch(Some(t1 + POLL_FLOOR)),
            "asked before the ack was answered"
        );
        let t2 = t1 + POLL_FLOOR;
        assert_eq!(w.look(&seen(1, 0, t2), holding(0, t2)), Look::Watch(None));
        assert_eq!(
            w.look(&seen(1, 1, t2), holding(0, t2)),
            Look::Get(1),
            "counted after the ack: given back by someone"
        );
    }

    /// Gets for what this process itself sent that come back short (another consumer was
    /// quicker) are no sign of hidden messages: never reported, however long that goes on.
    #[test]
    fn short_gets_for_own_sends_are_not_reported() {
        let t0 = Instant::now();
        let mut w = after_first_get(0, t0);
        for i in 1..=10u64 {
            let now = t0 + Duration::from_secs(10 * i);
            let view = QueueView {
                touched: i,
                ..seen(i, 0, now)
            };
            assert_eq!(w.look(&view, holding(0, now)), Look::Get(1));
            assert_eq!(w.answered(1, 0, None, now), None, "look {i}");
        }
    }

    /// Messages counted waiting with nothing new stored (returned by someone else, or hidden
    /// in a transaction) are looked for, and a look that finds nothing backs off, 1 s doubling
    /// to 32 s; one that finds them starts over.
    #[test]
    fn a_fruitless_get_for_the_waiting_count_backs_off() {
        let t0 = Instant::now();
        let mut w = after_first_get(0, t0);
        let mut now = t0;
        let mut pauses = Vec::new();
        let mut reports = Vec::new();
        for _ in 0..8 {
            assert_eq!(w.look(&seen(5, 3, now), holding(1, now)), Look::Get(2));
            reports.push(w.answered(2, 0, None, now));
            let Look::Watch(Some(until)) = w.look(&seen(5, 3, now), holding(1, now)) else {
                panic!("no back-off");
            };
            pauses.push((until - now).as_secs());
            now = until;
        }
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 32, 32]);
        // KMQ-24: reported once, by the short Get that comes 31 s after the first.
        let once = Some(Persistent { counted: 2 });
        assert_eq!(reports, [None, None, None, None, None, once, None, None]);
        assert_eq!(w.look(&seen(5, 3, now), holding(1, now)), Look::Get(2));
        assert_eq!(w.answered(2, 2, Some(5), now), None);
        assert_eq!(w.look(&seen(5, 3, now), holding(1, now)), Look::Get(2));
        assert_eq!(w.answered(2, 0, None, now), None);
        assert_eq!(
            w.look(&seen(5, 3, now), holding(1, now)),
            Look::Watch(Some(now + FIRST_EXCESS_PAUSE))
        );
    }
}
