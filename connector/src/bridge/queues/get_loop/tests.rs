//! The Get loop driven by script: orders, backend answers and instants in, steps out, as
//! `engine/` tests drive a connection with frames.

use std::time::{Duration, Instant};

use super::close_fence::FENCE_WAIT;
use super::rehome::STALL_FIRST;
use super::*;
use crate::backend::queue_watch::{BrokerCounts, Counts};
use crate::kubemq::QueueMessageAttributes;

/// What the scripted backend shows.
#[derive(Debug, Clone, Copy)]
struct Shows {
    ready: ReadyHint,
    stored: u64,
    view: Option<QueueView>,
    /// The answer to a read check.
    read: ReadCheck,
}

impl Default for Shows {
    fn default() -> Self {
        Shows {
            ready: ReadyHint::Unknown,
            stored: 0,
            view: None,
            read: ReadCheck::Unknown,
        }
    }
}

impl Sight for Shows {
    fn ready(&self) -> ReadyHint {
        self.ready
    }

    fn stored(&self) -> u64 {
        self.stored
    }

    fn view(&mut self) -> Option<QueueView> {
        self.view
    }
}

const LIMITS: FetchLimits = FetchLimits {
    max_batch: 500,
    idle_exit: Duration::from_secs(60),
};

const ALICE: ConsumerKey = (1, 1);

/// A loop on a backend that captures (`kubemq`) or not, with one consumer of `credit`.
fn with_consumer(kubemq: bool, credit: u32) -> GetLoop {
    let mut l = GetLoop::new("q", LIMITS, kubemq);
    l.order(Order::Join(ALICE));
    l.order(Order::Demand(DemandReport {
        consumer: ALICE,
        credit,
        taken: 0,
    }));
    l
}

fn batch(transaction: &str, seqs: &[u64]) -> Batch {
    Batch {
        transaction_id: transaction.into(),
        messages: seqs
            .iter()
            .map(|&sequence| QueueMessage {
                channel: "q".into(),
                attributes: Some(QueueMessageAttributes {
                    sequence,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
    }
}

fn answered_at(now: Instant) -> AnsweredAt {
    AnsweredAt {
        now,
        taken: now,
        wall_ns: 0,
    }
}

/// Polls, answering sessions' opening, until the Get goes; returns its session and size.
fn until_get(l: &mut GetLoop, now: Instant, shows: &mut Shows) -> (SessionId, u32) {
    for _ in 0..20 {
        match l.poll(now, shows) {
            Step::Act(Action::Open(id)) => l.opened(id, Ok(()), now),
            Step::Act(Action::Get { session, want }) => return (session, want),
            Step::Act(Action::Watch) => l.watched(shows.view),
            Step::Act(Action::CheckRead) => l.read_checked(Ok(shows.read)),
            Step::Act(Action::Unwatch) => {}
            other => panic!("no Get but {other:?}"),
        }
    }
    panic!("no Get in 20 steps")
}

/// Every action until the loop waits, answered as a backend that does everything asked would;
/// the wait.
fn until_wait(l: &mut GetLoop, now: Instant, shows: &mut Shows) -> (Vec<Action>, Wait) {
    let mut acts = Vec::new();
    for _ in 0..50 {
        match l.poll(now, shows) {
            Step::Act(a) => {
                match &a {
                    Action::Settle { .. } | Action::Fence { .. } => l.settled(Ok(()), now),
                    Action::Open(id) => l.opened(*id, Ok(()), now),
                    Action::Watch => l.watched(shows.view),
                    Action::CheckRead => l.read_checked(Ok(shows.read)),
                    _ => {}
                }
                acts.push(a);
            }
            Step::Wait(w) => return (acts, w),
            Step::Idle => panic!("idle"),
        }
    }
    panic!("no wait in 50 steps: {acts:?}")
}

/// The sequences handed to consumers in `acts`.
fn handed(acts: &[Action]) -> Vec<u64> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Tell(_, ToConsumer::Messages(b)) => Some(b.iter().map(|h| h.sequence)),
            _ => None,
        })
        .flatten()
        .collect()
}

fn ack(transaction: &str, sequence: u64) -> Settlement {
    Settlement {
        transaction: Arc::from(transaction),
        sequence,
        outcome: Outcome::Ack,
    }
}

/// The handed-out transaction of `acts` (the loop's own Arc, as consumers get it).
fn txn_of(acts: &[Action]) -> Arc<str> {
    acts.iter()
        .find_map(|a| match a {
            Action::Tell(_, ToConsumer::Messages(b)) => b.first().map(|h| h.transaction.clone()),
            _ => None,
        })
        .expect("a hand-out")
}

/// A backend that lets the loop read and whose count, asked at `at`, shows an empty queue.
fn watched_empty(at: Instant) -> Shows {
    Shows {
        ready: ReadyHint::Estimate(0),
        view: Some(QueueView {
            touched: 0,
            broker: BrokerCounts::Seen(Counts::default()),
            asked: Some(at),
        }),
        read: ReadCheck::Allowed,
        ..Shows::default()
    }
}

/// Q-12 as decided (docs/queues-consume-design.md): a Get never asks for more than the backend
/// says is ready when it knows, exactly or by its own count; without a count it follows the
/// adaptive batch, and while a drain is on it asks for one. Always within the demand and the
/// ceiling.
#[test]
fn get_size_follows_the_ready_hint() {
    let size = |ready, draining| {
        let mut l = GetLoop::new("q", LIMITS, false);
        l.batch = 64;
        l.order(Order::Join(ALICE));
        if draining {
            l.order(Order::Drain(DemandReport {
                consumer: ALICE,
                credit: 0,
                taken: 0,
            }));
        }
        let shows = Shows {
            ready,
            ..Shows::default()
        };
        [
            l.get_size(100, &shows),
            l.get_size(1000, &shows),
            l.get_size(10, &shows),
        ]
    };
    use ReadyHint::*;
    assert_eq!(size(Exact(30), false), [30, 30, 10]);
    assert_eq!(
        size(Exact(0), false),
        [1, 1, 1],
        "one, to return on the next arrival"
    );
    assert_eq!(size(Exact(9000), false), [100, 500, 10]);
    assert_eq!(size(Estimate(30), false), [30, 30, 10]);
    assert_eq!(size(Estimate(30), true), [30, 30, 10]);
    assert_eq!(size(Estimate(0), false), [1, 1, 1], "nothing counted: one");
    assert_eq!(size(Unknown, false), [64, 64, 10]);
    assert_eq!(size(Unknown, true), [1, 1, 1]);
    assert_eq!(size(Estimate(0), true), [1, 1, 1]);
}

/// FLOW-3, Q-27: the first Get opens a session; what it brings goes to the consumer within its
/// credit, the rest waits in the buffer; settlements go as one request per transaction and
/// outcome, sequences ascending and distinct, before the next Get.
#[test]
fn messages_go_within_credit_and_settlements_before_the_next_get() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = with_consumer(false, 2);
    assert_eq!(
        until_get(&mut l, t0, &mut shows),
        (1, 1),
        "one while the queue looks idle"
    );
    let (acts, wait) = until_wait(&mut l, t0, &mut shows);
    assert!(acts.is_empty(), "nothing while the Get is out: {acts:?}");
    assert_eq!(wait.until, Some(t0 + DRAIN_GRACE), "the drain grace only");
    l.answered(Ok(batch("t1", &[1, 2, 3])), answered_at(t0));
    let (acts, wait) = until_wait(&mut l, t0, &mut shows);
    assert_eq!(handed(&acts), [1, 2], "within credit");
    assert_eq!(
        wait,
        Wait::default(),
        "no credit left: wait for the consumer"
    );
    let t1 = txn_of(&acts);
    l.order(Order::Settle(vec![
        ack("x", 0),
        Settlement {
            transaction: t1.clone(),
            ..ack("", 2)
        },
        Settlement {
            transaction: t1.clone(),
            ..ack("", 1)
        },
        Settlement {
            transaction: t1.clone(),
            ..ack("", 1)
        },
    ]));
    l.order(Order::Demand(DemandReport {
        consumer: ALICE,
        credit: 2,
        taken: 2,
    }));
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    assert_eq!(handed(&acts), [3], "the buffered one first");
    let settles: Vec<_> = acts
        .iter()
        .filter_map(|a| match a {
            Action::Settle {
                session,
                outcome,
                sequences,
                ..
            } => Some((*session, *outcome, sequences.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        settles,
        [(1, Outcome::Ack, vec![1, 2])],
        "one request, the unknown transaction's dropped"
    );
}

/// KMQ-17 (get_gate.rs): on KubeMQ a Get that would wait is held back behind open
/// transactions, for at most OVERLAP_WAIT, and goes at once for messages known stored.
#[test]
fn a_get_that_would_wait_is_held_behind_open_transactions() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = with_consumer(true, 10);
    let _ = until_get(&mut l, t0, &mut shows);
    l.answered(Ok(batch("t1", &[1])), answered_at(t0));
    let (acts, wait) = until_wait(&mut l, t0, &mut shows);
    assert_eq!(handed(&acts), [1]);
    assert_eq!(
        wait,
        Wait {
            until: Some(t0 + OVERLAP_WAIT),
            ready: true,
            ..Wait::default()
        }
    );
    shows.stored = 4;
    shows.ready = ReadyHint::Estimate(4);
    let (session, want) = until_get(&mut l, t0, &mut shows);
    assert_eq!(
        (session, want),
        (2, 4),
        "only what is stored, on a session without open transactions"
    );
    assert_eq!(
        until_wait(&mut l, t0, &mut shows).1.until,
        Some(t0 + OVERLAP_WAIT),
        "settlements wait for a Get of stored messages"
    );
}

/// KMQ-18, KMQ-17 (close_fence.rs): on KubeMQ a transaction settled whole is closed, and the
/// next Get waits for the session's answer that the close is over, or FENCE_WAIT.
#[test]
fn a_settled_transaction_is_closed_and_the_next_get_waits_for_the_close() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = with_consumer(true, 10);
    let _ = until_get(&mut l, t0, &mut shows);
    l.answered(Ok(batch("t1", &[1, 2])), answered_at(t0));
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    let t1 = txn_of(&acts);
    l.order(Order::Settle(vec![Settlement {
        transaction: t1.clone(),
        ..ack("", 1)
    }]));
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Settle { .. })),
        "half a transaction waits for the rest: {acts:?}"
    );
    l.order(Order::Settle(vec![Settlement {
        transaction: t1.clone(),
        ..ack("", 2)
    }]));
    let (acts, wait) = until_wait(&mut l, t0, &mut shows);
    let kinds: Vec<_> = acts
        .iter()
        .map(|a| match a {
            Action::Settle { outcome, .. } => format!("{outcome:?}"),
            Action::Fence { .. } => "fence".into(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["Ack", "Close", "fence"]);
    assert_eq!(
        wait,
        Wait {
            until: Some(t0 + FENCE_WAIT),
            fences: true,
            ..Wait::default()
        }
    );
    l.fence_answered();
    let (session, _) = until_get(&mut l, t0, &mut shows);
    assert_eq!(session, 1, "the session has no open transaction again");
}

/// An answer that never comes holds the Get back no longer than FENCE_WAIT.
#[test]
fn a_fence_that_never_answers_is_given_up() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = with_consumer(true, 10);
    let _ = until_get(&mut l, t0, &mut shows);
    l.answered(Ok(batch("t1", &[1])), answered_at(t0));
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    l.order(Order::Settle(vec![Settlement {
        transaction: txn_of(&acts),
        ..ack("", 1)
    }]));
    let (_, wait) = until_wait(&mut l, t0, &mut shows);
    assert!(wait.fences);
    let later = t0 + FENCE_WAIT;
    assert!(matches!(
        l.poll(later, &mut shows),
        Step::Act(Action::ForgetFences)
    ));
    let _ = until_get(&mut l, later, &mut shows);
}

/// FLOW-5: a drain whose Get outlives DRAIN_GRACE ends with nothing; a drain that used its
/// credit up ends at once.
#[test]
fn a_drain_ends_once_its_get_outlives_the_grace() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = GetLoop::new("q", LIMITS, false);
    l.order(Order::Join(ALICE));
    l.order(Order::Drain(DemandReport {
        consumer: ALICE,
        credit: 5,
        taken: 0,
    }));
    let (_, want) = until_get(&mut l, t0, &mut shows);
    assert_eq!(want, 1, "one at a time while a drain is on");
    let (acts, wait) = until_wait(&mut l, t0, &mut shows);
    assert!(acts.is_empty());
    assert_eq!(wait.until, Some(t0 + DRAIN_GRACE));
    let (acts, _) = until_wait(&mut l, t0 + DRAIN_GRACE, &mut shows);
    assert!(
        matches!(
            acts[..],
            [Action::Tell(ALICE, ToConsumer::DrainDone(ALICE))]
        ),
        "{acts:?}"
    );
}

/// FLOW-5, KMQ-21: a drain on a watched queue whose count KubeMQ gave within DRAIN_VIEW_AGE,
/// showing nothing beyond what the loop holds, ends at once and puts no Get on the wire (a Get
/// of one would hold one of KubeMQ's shared clients for its second); with an older count it
/// Gets one as without a watch.
#[test]
fn a_drain_on_a_watched_idle_queue_ends_on_a_recent_count() {
    use super::DRAIN_VIEW_AGE;
    let t0 = Instant::now();
    let mut shows = watched_empty(t0);
    let mut l = with_consumer(true, 0);
    let drain = |l: &mut GetLoop| {
        l.order(Order::Drain(DemandReport {
            consumer: ALICE,
            credit: 5,
            taken: 0,
        }))
    };
    drain(&mut l);
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    assert!(
        matches!(
            acts.last(),
            Some(Action::Tell(ALICE, ToConsumer::DrainDone(ALICE)))
        ),
        "{acts:?}"
    );
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Get { .. })),
        "{acts:?}"
    );
    // KubeMQ's count is older now: the drain Gets one.
    drain(&mut l);
    let later = t0 + DRAIN_VIEW_AGE + Duration::from_millis(1);
    let (_, want) = until_get(&mut l, later, &mut shows);
    assert_eq!(want, 1);
}

/// AUTHZ-9, KMQ-21: where the backend cannot say whether the loop may read, the first Get on an
/// idle queue goes on the wire; once it is answered the loop watches the queue instead, and Gets
/// what this process sends.
#[test]
fn an_idle_queue_is_watched_after_the_first_get() {
    let t0 = Instant::now();
    let mut shows = Shows {
        ready: ReadyHint::Estimate(0),
        view: Some(QueueView::default()),
        ..Shows::default()
    };
    let mut l = with_consumer(true, 10);
    let mut acts = Vec::new();
    let (session, want) = loop {
        match l.poll(t0, &mut shows) {
            Step::Act(Action::Open(id)) => l.opened(id, Ok(()), t0),
            Step::Act(Action::Watch) => {
                acts.push("watch");
                l.watched(shows.view)
            }
            Step::Act(Action::CheckRead) => {
                acts.push("check");
                l.read_checked(Ok(ReadCheck::Unknown))
            }
            Step::Act(Action::Get { session, want }) => break (session, want),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!((session, want, &acts[..]), (1, 1, &["watch", "check"][..]));
    l.answered(Ok(batch("t0", &[])), answered_at(t0));
    let counted = QueueView {
        touched: 0,
        broker: BrokerCounts::Seen(Counts {
            last_sequence: 0,
            waiting: 0,
        }),
        asked: Some(t0 + Duration::from_millis(1)),
    };
    shows.view = Some(counted);
    let (_, wait) = until_wait(&mut l, t0, &mut shows);
    assert_eq!(
        wait,
        Wait {
            view: true,
            ..Wait::default()
        }
    );
    shows.view = Some(QueueView {
        touched: 3,
        ..counted
    });
    let (_, want) = until_get(&mut l, t0, &mut shows);
    assert_eq!(want, 3, "what this process sent");
}

/// KMQ-20 (rehome.rs): consumers with credit that hold every open transaction and get nothing
/// new for STALL_FIRST have those transactions closed; the next Get brings their messages back
/// on top of the demand, bound to the deliveries the consumers hold.
#[test]
fn held_transactions_are_closed_when_consumers_starve() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = with_consumer(true, 3);
    let _ = until_get(&mut l, t0, &mut shows);
    l.answered(Ok(batch("t1", &[1, 2])), answered_at(t0));
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    assert_eq!(handed(&acts), [1, 2]);
    let held = txn_of(&acts);
    let (acts, wait) = until_wait(&mut l, t0, &mut shows);
    assert!(acts.is_empty());
    assert!(wait.ready, "held back behind the open transaction");
    let later = t0 + STALL_FIRST;
    let (acts, _) = until_wait(&mut l, later, &mut shows);
    assert!(
        matches!(
            &acts[..],
            [
                Action::Settle { outcome: Outcome::Close, transaction, .. },
                Action::Returned { count: 2, .. },
                Action::Get { want: 3, .. },
            ] if Arc::ptr_eq(transaction, &held)
        ),
        "closed, and the next Get asks for the one of demand and the two held: {acts:?}"
    );
    l.answered(Ok(batch("t2", &[1, 2, 5])), answered_at(later));
    let (acts, _) = until_wait(&mut l, later, &mut shows);
    assert_eq!(
        handed(&acts),
        [5],
        "the held two are bound, not handed out again"
    );
    l.order(Order::Settle(vec![Settlement {
        transaction: held,
        ..ack("", 1)
    }]));
    assert!(l.fresh);
    let moved: Vec<_> = l.settle.iter().map(|s| s.transaction.to_string()).collect();
    assert_eq!(moved, ["t2"], "the settlement follows its message");
}

/// KMQ-20 (rehome.rs): a Get for messages known to be stored that comes back short while a
/// consumer holds an open transaction shows where the missing ones are: that transaction is
/// closed at once, not after STALL_FIRST, and the next Get asks for what it held, the missing
/// ones and nothing the backend's count holds twice.
#[test]
fn a_short_get_for_stored_messages_closes_held_transactions_at_once() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = with_consumer(true, 100);
    // Its sequences have shown it to be the queue's one consumer (gaps.rs).
    l.gaps.assume_exclusive();
    let _ = until_get(&mut l, t0, &mut shows);
    let first: Vec<u64> = (1..=49).collect();
    l.answered(Ok(batch("t1", &first)), answered_at(t0));
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    assert_eq!(handed(&acts), first);
    let held = txn_of(&acts);
    // The consumer holds the 49 and waits for a 50th, which this process sent.
    shows.stored = 1;
    shows.ready = ReadyHint::Estimate(1);
    let (_, want) = until_get(&mut l, t0, &mut shows);
    assert_eq!(want, 1, "just the stored one");
    let later = t0 + Duration::from_secs(1);
    l.answered(Ok(batch("t2", &[])), answered_at(later));
    // The short Get reset the count; the round's give-back is counted ready again.
    shows.stored = 49;
    shows.ready = ReadyHint::Estimate(49);
    let (acts, _) = until_wait(&mut l, later, &mut shows);
    assert!(
        matches!(
            &acts[..],
            [
                Action::Settle { outcome: Outcome::Close, transaction, .. },
                Action::Returned { count: 49, .. },
                Action::Get { want: 50, .. },
            ] if Arc::ptr_eq(transaction, &held)
        ),
        "closed at once; the next Get asks for the 49 held and the one missing: {acts:?}"
    );
    let back: Vec<u64> = (1..=50).collect();
    l.answered(Ok(batch("t3", &back)), answered_at(later));
    let (acts, _) = until_wait(&mut l, later, &mut shows);
    assert_eq!(
        handed(&acts),
        [50],
        "the 49 held are bound, not handed out again"
    );
}

/// KMQ-20 (gaps.rs): a sequence the loop's Gets skipped and that stays missing for GAP_WAIT
/// while a consumer holds open transactions is hidden in them (it hops from one closing
/// transaction into the next under a steady flow): they are closed, and the next Get asks for
/// what they held and the skipped one.
#[test]
fn a_sequence_skipped_beside_held_transactions_brings_a_round() {
    use super::gaps::GAP_WAIT;
    let t0 = Instant::now();
    let mut shows = Shows {
        stored: 2,
        ready: ReadyHint::Estimate(2),
        ..Shows::default()
    };
    let mut l = with_consumer(true, 10);
    // Its sequences have shown it to be the queue's one consumer (gaps.rs).
    l.gaps.assume_exclusive();
    let (_, want) = until_get(&mut l, t0, &mut shows);
    assert_eq!(want, 2);
    l.answered(Ok(batch("t1", &[1, 2])), answered_at(t0));
    // Two more are stored meanwhile.
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    assert_eq!(handed(&acts), [1, 2]);
    assert!(
        matches!(acts.last(), Some(Action::Get { want: 2, .. })),
        "{acts:?}"
    );
    l.answered(Ok(batch("t2", &[4, 5])), answered_at(t0));
    shows.stored = 0;
    shows.ready = ReadyHint::Estimate(0);
    let (acts, wait) = until_wait(&mut l, t0, &mut shows);
    assert_eq!(handed(&acts), [4, 5], "3 skipped");
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Returned { .. })),
        "no round before GAP_WAIT: {acts:?}"
    );
    assert!(wait.until.is_some());
    let later = t0 + GAP_WAIT;
    shows.stored = 4;
    shows.ready = ReadyHint::Estimate(4);
    let (acts, _) = until_wait(&mut l, later, &mut shows);
    let closed = acts
        .iter()
        .filter(|a| {
            matches!(
                a,
                Action::Settle {
                    outcome: Outcome::Close,
                    ..
                }
            )
        })
        .count();
    assert_eq!(closed, 2, "both held transactions closed: {acts:?}");
    assert!(
        matches!(acts.last(), Some(Action::Get { want: 5, .. })),
        "the four held and the skipped one: {acts:?}"
    );
    l.answered(Ok(batch("t3", &[1, 2, 3, 4, 5])), answered_at(later));
    let (acts, _) = until_wait(&mut l, later, &mut shows);
    assert_eq!(handed(&acts), [3], "the held four are bound");
}

/// KMQ-20 (rehome.rs): a Get for messages KubeMQ counts as waiting beyond what the loop holds
/// that comes back short while a consumer holds an open transaction is evidence as a short Get
/// for stored messages is: the round's Get asks for the held messages and the missing ones.
#[test]
fn a_short_get_for_counted_messages_closes_held_transactions_at_once() {
    let t0 = Instant::now();
    let mut shows = watched_empty(t0);
    let mut l = with_consumer(true, 10);
    // Its sequences have shown it to be the queue's one consumer (gaps.rs).
    l.gaps.assume_exclusive();
    let (_, wait) = until_wait(&mut l, t0, &mut shows);
    assert!(wait.view, "watching the idle queue");
    // This process sent two: the view shows them.
    if let Some(v) = shows.view.as_mut() {
        v.touched = 2;
    }
    let (_, want) = until_get(&mut l, t0, &mut shows);
    assert_eq!(want, 2);
    l.answered(Ok(batch("t1", &[1, 2])), answered_at(t0));
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    assert_eq!(handed(&acts), [1, 2]);
    let held = txn_of(&acts);
    // KubeMQ counts the two held and three more.
    let later = t0 + Duration::from_millis(10);
    shows.view = Some(QueueView {
        touched: 2,
        broker: BrokerCounts::Seen(Counts {
            last_sequence: 5,
            waiting: 5,
        }),
        asked: Some(later),
    });
    let (acts, wait) = until_wait(&mut l, later, &mut shows);
    assert!(
        acts.is_empty() && wait.ready,
        "held back beside the open transaction"
    );
    // After the gate's wait the Get goes all the same, on a session of its own.
    let (_, want) = until_get(&mut l, later + OVERLAP_WAIT * 2, &mut shows);
    assert_eq!(want, 3);
    let later = later + OVERLAP_WAIT * 2;
    let answered = later + Duration::from_secs(1);
    l.answered(Ok(batch("t2", &[])), answered_at(answered));
    let (acts, _) = until_wait(&mut l, answered, &mut shows);
    assert!(
        matches!(
            &acts[..],
            [
                Action::Settle { outcome: Outcome::Close, transaction, .. },
                Action::Returned { count: 2, .. },
                Action::Get { want: 5, .. },
            ] if Arc::ptr_eq(transaction, &held)
        ),
        "closed at once; the next Get asks for the two held and the three missing: {acts:?}"
    );
}

/// A loop whose sequences have not shown it to be its queue's one consumer takes a short Get
/// as no reason for a round: another consumer may have taken what it missed, and a round would
/// hand the messages its consumers hold to that one too (gaps.rs). The timed round's Get still
/// asks for what the short Get missed on top of what the consumer held: asking for the held
/// ones alone would leave a hidden one beyond the Get's size, hidden again in its transaction.
#[test]
fn a_short_get_calls_no_round_until_the_loop_knows_it_consumes_alone() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = with_consumer(true, 100);
    let _ = until_get(&mut l, t0, &mut shows);
    l.answered(Ok(batch("t1", &[1, 2])), answered_at(t0));
    let _ = until_wait(&mut l, t0, &mut shows);
    shows.stored = 1;
    shows.ready = ReadyHint::Estimate(1);
    let _ = until_get(&mut l, t0, &mut shows);
    l.answered(Ok(batch("t2", &[])), answered_at(t0));
    shows.stored = 0;
    shows.ready = ReadyHint::Estimate(0);
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    assert!(l.hidden.as_ref().is_some_and(|h| !h.alone));
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Returned { .. })),
        "no round: {acts:?}"
    );
    let later = t0 + STALL_FIRST;
    shows.stored = 2;
    shows.ready = ReadyHint::Estimate(2);
    let (acts, _) = until_wait(&mut l, later, &mut shows);
    assert!(
        matches!(
            &acts[..],
            [
                Action::Settle {
                    outcome: Outcome::Close,
                    ..
                },
                Action::Returned { count: 2, .. },
                Action::Get { want: 3, .. },
            ]
        ),
        "the timed round asks for the two held and the one missed: {acts:?}"
    );
}

/// A short Get beside a transaction its consumer closes right after is no reason for a round:
/// what that transaction hid went back with it.
#[test]
fn a_short_get_is_forgotten_once_its_suspects_closed() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = with_consumer(true, 100);
    l.gaps.assume_exclusive();
    let _ = until_get(&mut l, t0, &mut shows);
    l.answered(Ok(batch("t1", &[1, 2])), answered_at(t0));
    let (acts, _) = until_wait(&mut l, t0, &mut shows);
    let held = txn_of(&acts);
    shows.stored = 1;
    shows.ready = ReadyHint::Estimate(1);
    let _ = until_get(&mut l, t0, &mut shows);
    l.order(Order::Settle(vec![
        Settlement {
            transaction: held.clone(),
            ..ack("", 1)
        },
        Settlement {
            transaction: held,
            ..ack("", 2)
        },
    ]));
    l.answered(Ok(batch("t2", &[])), answered_at(t0));
    shows.stored = 0;
    shows.ready = ReadyHint::Estimate(0);
    let (mut acts, _) = until_wait(&mut l, t0, &mut shows);
    // The close's fence answers; the loop goes on to its next Get.
    l.fence_answered();
    let (more, _) = until_wait(&mut l, t0, &mut shows);
    acts.extend(more);
    assert!(
        matches!(acts.last(), Some(Action::Get { want: 1, .. })),
        "the next Get: {acts:?}"
    );
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Returned { .. })),
        "no round gave anything back: {acts:?}"
    );
    assert!(l.hidden.is_none());
}

/// A failed Get loses its session with its transactions (KubeMQ gives their messages back);
/// the next Get waits GET_RETRY, on a new session. A refusal of the credential tells every
/// consumer (AUTHZ-9).
#[test]
fn a_failed_get_drops_its_session_and_a_refusal_ends_the_consumers() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = with_consumer(false, 1);
    let _ = until_get(&mut l, t0, &mut shows);
    l.answered(
        Err(BackendError::Unauthorized("Error 412".into())),
        answered_at(t0),
    );
    let (acts, wait) = until_wait(&mut l, t0, &mut shows);
    assert!(
        matches!(
            &acts[..],
            [
                Action::Tell(ALICE, ToConsumer::Refused(ALICE)),
                Action::Drop(1)
            ]
        ),
        "{acts:?}"
    );
    assert_eq!(wait.until, Some(t0 + GET_RETRY));
    let (session, _) = until_get(&mut l, t0 + GET_RETRY, &mut shows);
    assert_eq!(session, 2);
}

/// Without consumers, buffered messages go back: a transaction never handed out is closed
/// unchanged; then the loop is idle and stops watching.
#[test]
fn without_consumers_the_buffer_goes_back_and_the_loop_idles() {
    let t0 = Instant::now();
    let mut shows = Shows::default();
    let mut l = with_consumer(false, 1);
    let _ = until_get(&mut l, t0, &mut shows);
    l.order(Order::Leave(ALICE));
    l.answered(Ok(batch("t1", &[1, 2])), answered_at(t0));
    let mut acts = Vec::new();
    loop {
        match l.poll(t0, &mut shows) {
            Step::Act(a) => {
                if matches!(a, Action::Settle { .. }) {
                    l.settled(Ok(()), t0);
                }
                acts.push(a);
            }
            Step::Idle => break,
            Step::Wait(w) => panic!("waits: {w:?} after {acts:?}"),
        }
    }
    assert!(
        matches!(
            &acts[..],
            [
                Action::Tell(ALICE, ToConsumer::Left(ALICE)),
                Action::Settle {
                    outcome: Outcome::Close,
                    ..
                },
                Action::Returned { count: 2, .. }
            ]
        ),
        "{acts:?}"
    );
}

/// KMQ-23, AUTHZ-9: where the backend confirms the loop may read, an idle queue is watched from
/// the start, with no Get at all; where it refuses, every consumer is told.
#[test]
fn a_confirmed_read_watches_at_once_and_a_refused_one_ends_the_consumers() {
    let t0 = Instant::now();
    let mut shows = Shows {
        ready: ReadyHint::Estimate(0),
        view: Some(QueueView::default()),
        read: ReadCheck::Allowed,
        ..Shows::default()
    };
    let mut l = with_consumer(true, 10);
    let (acts, wait) = until_wait(&mut l, t0, &mut shows);
    assert!(
        matches!(&acts[..], [Action::Watch, Action::CheckRead]),
        "{acts:?}"
    );
    assert_eq!(
        wait,
        Wait {
            view: true,
            ..Wait::default()
        },
        "watched, no Get"
    );

    let mut l = with_consumer(true, 10);
    assert!(matches!(l.poll(t0, &mut shows), Step::Act(Action::Watch)));
    l.watched(shows.view);
    assert!(matches!(
        l.poll(t0, &mut shows),
        Step::Act(Action::CheckRead)
    ));
    l.read_checked(Err(BackendError::Unauthorized("Error 412".into())));
    assert!(matches!(
        l.poll(t0, &mut shows),
        Step::Act(Action::Tell(ALICE, ToConsumer::Refused(ALICE)))
    ));
}
