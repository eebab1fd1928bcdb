//! Watching idle queues for messages without a Get that waits (KMQ-21).
//!
//! KubeMQ v2.4 serves every Get with one of 200 shared broker clients in turn and holds that
//! client for the Get's whole wait (at least a second). A Get waiting on an idle queue therefore
//! stalls, about every 200 Gets, a busy queue's Get that draws the same client. So a Get loop
//! whose queue looks idle does not wait on it with a Get: it watches the queue here, and Gets
//! only what is known to be there. Two things tell it:
//! - sends of this process to the channel, and messages it gives back, touch the channel's view
//!   at once ([`QueueWatch::touch`]);
//! - one QueuesInfo for every queue, repeated while some queue has been watched for
//!   [`IDLE_BEFORE_ASKING`] or longer, shows what other
//!   producers stored (another replica, a gRPC client, a delayed message coming due). It is
//!   asked again after [`COST_SHARE`] times as long as the last answers took (at least
//!   [`POLL_FLOOR`]), so that answering it never takes KubeMQ more than a small share of a core
//!   however many queues it holds: its cost grows with the queues KubeMQ lists.
//!
//! Where QueuesInfo cannot be read (refused, unavailable, or a queue whose name KubeMQ's listing
//! makes ambiguous) the view says [`BrokerCounts::Blind`], and the loop falls back to a Get that
//! waits.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::BackendError;
use crate::kubemq::QueuesInfo;

/// The shortest time between two QueuesInfo calls.
pub const POLL_FLOOR: Duration = Duration::from_millis(50);

/// The time between two QueuesInfo calls is at least this many times what one took to answer:
/// KubeMQ then spends at most about a twenty-fifth of a core (4 %) answering them.
pub const COST_SHARE: u32 = 25;

/// The longest time between two QueuesInfo calls, however slowly KubeMQ answers.
pub const POLL_CEILING: Duration = Duration::from_secs(5);

/// How long a queue must have been watched before QueuesInfo is asked about it: a busy queue
/// that catches up with its producers is watched for moments between its Gets, and this
/// process's sends wake it; only queues that stay idle need the broker's counts.
pub const IDLE_BEFORE_ASKING: Duration = Duration::from_millis(200);

/// How long a QueuesInfo may take before the watch counts it as failed.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);

/// How long the watch waits after a failed QueuesInfo before it asks again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// The QueuesInfo prefix of a queue's broker channel: KubeMQ lists a queue under its broker
/// channel name with every leading and trailing character of this prefix trimmed (Go's
/// `strings.Trim` takes it as a set of characters), so `ORDERS` is listed as `ORDER` (KMQ-22).
const LISTING_CUTSET: &str = "_QUEUES_.";

/// One QueuesInfo call for every queue, as the backend makes it.
pub type Poll = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<QueuesInfo, BackendError>> + Send>>
        + Send
        + Sync,
>;

/// What a watched queue's Get loop is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueView {
    /// Rises by the number of messages this process sends to the channel or gives back.
    pub touched: u64,
    /// What KubeMQ's last QueuesInfo said of the queue.
    pub broker: BrokerCounts,
    /// When that QueuesInfo was asked: its counts are as of then or later. An answer that
    /// repeats the counts before it updates this without waking the watcher.
    pub asked: Option<std::time::Instant>,
}

/// A queue's counts as KubeMQ's QueuesInfo gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BrokerCounts {
    /// Not asked yet since the queue was watched.
    #[default]
    Unasked,
    /// The last answer.
    Seen(Counts),
    /// QueuesInfo cannot tell (it failed, or the queue's listed name is ambiguous).
    Blind,
}

/// A queue's figures in a QueuesInfo answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// The sequence of the last message stored in the queue (0: none ever).
    pub last_sequence: u64,
    /// Messages not yet sent to any consumer plus those sent and not yet settled (KubeMQ's
    /// `Waiting`).
    pub waiting: u64,
}

/// The watched queues of one backend, and the poll that keeps their views current.
pub struct QueueWatch {
    /// `None`: the backend cannot list queues, every view stays [`BrokerCounts::Unasked`].
    poll: Option<Poll>,
    state: Mutex<State>,
}

impl std::fmt::Debug for QueueWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueWatch").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Watched>,
    /// A poll task is running.
    polling: bool,
    /// The last answer, for a queue that starts being watched between two polls.
    latest: Option<Listing>,
}

/// A watched channel: its view, and since when some loop has watched it without a break.
struct Watched {
    tx: watch::Sender<QueueView>,
    since: Instant,
}

/// One QueuesInfo answer, by listed name.
struct Listing {
    /// When it was asked.
    at: Instant,
    queues: HashMap<String, Vec<Counts>>,
}

impl Listing {
    fn of(info: &QueuesInfo, at: Instant) -> Listing {
        let mut queues: HashMap<String, Vec<Counts>> = HashMap::with_capacity(info.queues.len());
        for q in &info.queues {
            queues.entry(q.name.clone()).or_default().push(Counts {
                last_sequence: u64::try_from(q.last_sequence).unwrap_or(0),
                waiting: u64::try_from(q.waiting).unwrap_or(0),
            });
        }
        Listing { at, queues }
    }

    /// `channel`'s counts: under its own name (the store's façade), else under the name KubeMQ
    /// lists it by; a queue not listed has never held a message; two queues listed under one
    /// name cannot be told apart.
    fn counts(&self, channel: &str) -> BrokerCounts {
        let listed = listed_name(channel);
        let found = self
            .queues
            .get(channel)
            .or_else(|| self.queues.get(listed.as_str()));
        match found.map(Vec::as_slice) {
            None | Some([]) => BrokerCounts::Seen(Counts::default()),
            Some([one]) => BrokerCounts::Seen(*one),
            Some(_) => BrokerCounts::Blind,
        }
    }
}

/// The name KubeMQ's QueuesInfo lists `channel` under (KMQ-22).
pub fn listed_name(channel: &str) -> String {
    format!("{LISTING_CUTSET}{channel}")
        .trim_matches(|c| LISTING_CUTSET.contains(c))
        .to_string()
}

impl QueueWatch {
    /// A watch that lists queues with `poll`; `None` where the backend cannot.
    pub fn new(poll: Option<Poll>) -> QueueWatch {
        QueueWatch {
            poll,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts watching `channel` (or joins its watch): the view changes when this process
    /// touches the channel and when a QueuesInfo answer differs. Dropping the receiver stops
    /// watching. Needs a tokio runtime (the poll is a task of its own).
    pub fn watch(self: &Arc<Self>, channel: &str) -> watch::Receiver<QueueView> {
        let mut state = self.state();
        if let Some(w) = state.channels.get_mut(channel) {
            if w.tx.receiver_count() == 0 {
                w.since = Instant::now();
            }
            return w.tx.subscribe();
        }
        let (broker, asked) = match &state.latest {
            // Only a recent answer: a loop that starts watching acts on what it is given.
            Some(l) if l.at.elapsed() < IDLE_BEFORE_ASKING => {
                (l.counts(channel), Some(l.at.into_std()))
            }
            _ => (BrokerCounts::Unasked, None),
        };
        let (tx, rx) = watch::channel(QueueView {
            touched: 0,
            broker,
            asked,
        });
        state.channels.insert(
            channel.to_string(),
            Watched {
                tx,
                since: Instant::now(),
            },
        );
        if !state.polling {
            if let Some(poll) = self.poll.clone() {
                state.polling = true;
                tokio::spawn(self.clone().run(poll));
            }
        }
        rx
    }

    /// This process sent `count` messages to `channel`, or gave them back: its watcher looks
    /// again.
    pub fn touch(&self, channel: &str, count: usize) {
        let state = self.state();
        if let Some(w) = state.channels.get(channel) {
            w.tx.send_modify(|v| v.touched = v.touched.wrapping_add(count as u64));
        }
    }

    /// Asks QueuesInfo over and over while some queue has been watched long enough, and ends
    /// when none is watched.
    async fn run(self: Arc<Self>, poll: Poll) {
        let mut cost = Duration::ZERO;
        loop {
            let not_yet = {
                let mut state = self.state();
                state.channels.retain(|_, w| w.tx.receiver_count() > 0);
                if state.channels.is_empty() {
                    state.polling = false;
                    return;
                }
                let first_idle = state.channels.values().map(|w| w.since).min();
                first_idle
                    .and_then(|since| {
                        (since + IDLE_BEFORE_ASKING).checked_duration_since(Instant::now())
                    })
                    .filter(|d| !d.is_zero())
            };
            if let Some(wait) = not_yet {
                tokio::time::sleep(wait).await;
                continue;
            }
            let asked = Instant::now();
            let answer = tokio::time::timeout(ANSWER_LIMIT, poll()).await;
            let pause = match answer {
                Ok(Ok(info)) => {
                    let took = asked.elapsed();
                    // The mean of the last few answers: one slow answer (KubeMQ busy for a
                    // moment) does not stretch the watch for long.
                    cost = if cost.is_zero() {
                        took
                    } else {
                        (cost * 3 + took) / 4
                    };
                    self.publish(Listing::of(&info, asked));
                    tracing::debug!(
                        listed = info.queues.len(),
                        took_us = took.as_micros() as u64,
                        pause_ms = pause_after(cost).as_millis() as u64,
                        "QueuesInfo answered"
                    );
                    pause_after(cost)
                }
                Ok(Err(e)) => {
                    self.blind(&e.to_string());
                    RETRY_AFTER_FAILURE
                }
                Err(_) => {
                    self.blind("no answer in time");
                    RETRY_AFTER_FAILURE
                }
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// Gives every watched queue its counts from `listing`.
    fn publish(&self, listing: Listing) {
        let mut state = self.state();
        for (channel, w) in &state.channels {
            let broker = listing.counts(channel);
            w.tx.send_if_modified(|v| {
                let changed = v.broker != broker;
                v.broker = broker;
                v.asked = Some(listing.at.into_std());
                changed
            });
        }
        state.latest = Some(listing);
    }

    /// QueuesInfo failed: every watched queue's loop falls back to Gets that wait.
    fn blind(&self, why: &str) {
        let mut state = self.state();
        let mut newly = 0usize;
        for w in state.channels.values() {
            w.tx.send_if_modified(|v| {
                let changed = v.broker != BrokerCounts::Blind;
                newly += usize::from(changed);
                v.broker = BrokerCounts::Blind;
                changed
            });
        }
        state.latest = None;
        if newly > 0 {
            tracing::warn!(
                error = why,
                queues = newly,
                "QueuesInfo failed: idle queues are waited on with Gets until it answers again"
            );
        }
    }
}

/// The pause before the next QueuesInfo when answers take `cost`.
pub fn pause_after(cost: Duration) -> Duration {
    cost.saturating_mul(COST_SHARE)
        .clamp(POLL_FLOOR, POLL_CEILING)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubemq::QueueInfo;

    fn info(queues: &[(&str, i64, i64)]) -> QueuesInfo {
        QueuesInfo {
            queues: queues
                .iter()
                .map(|(name, last, waiting)| QueueInfo {
                    name: name.to_string(),
                    last_sequence: *last,
                    waiting: *waiting,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// KMQ-22: KubeMQ trims its channel prefix as a set of characters, so names that end in
    /// capitals of that set, or start or end with `_` or `.`, are listed shortened.
    #[test]
    fn a_queue_is_found_under_the_name_kubemq_lists_it_by() {
        assert_eq!(listed_name("orders"), "orders");
        assert_eq!(listed_name("ORDERS"), "ORDER");
        assert_eq!(listed_name("QUEUE1"), "1");
        assert_eq!(listed_name("a.b_"), "a.b");
        let l = Listing::of(&info(&[("ORDER", 7, 2), ("x", 3, 0)]), Instant::now());
        let seen = |last, waiting| {
            BrokerCounts::Seen(Counts {
                last_sequence: last,
                waiting,
            })
        };
        assert_eq!(l.counts("ORDERS"), seen(7, 2), "listed shortened");
        assert_eq!(l.counts("x"), seen(3, 0), "listed as it is");
        assert_eq!(l.counts("never-used"), seen(0, 0), "not listed: empty");
        let both = Listing::of(&info(&[("ORDER", 7, 2), ("ORDER", 9, 0)]), Instant::now());
        assert_eq!(both.counts("ORDERS"), BrokerCounts::Blind, "ambiguous");
    }

    #[test]
    fn the_poll_pause_keeps_kubemqs_share_small() {
        assert_eq!(pause_after(Duration::from_micros(400)), POLL_FLOOR);
        assert_eq!(
            pause_after(Duration::from_millis(5)),
            Duration::from_millis(125)
        );
        assert_eq!(pause_after(Duration::from_secs(1)), POLL_CEILING);
    }

    /// The poll runs only while a queue is watched, publishes what changed, touches wake the
    /// touched queue's watcher alone, and a failing QueuesInfo makes every view blind.
    #[tokio::test(start_paused = true)]
    async fn views_follow_the_listing_and_the_poll_stops_when_nobody_watches() {
        let answers = Arc::new(Mutex::new(Ok(info(&[("a", 5, 1)]))));
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let poll: Poll = {
            let answers = answers.clone();
            let calls = calls.clone();
            Arc::new(move || {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let a = answers.lock().unwrap().clone();
                Box::pin(async move { a })
            })
        };
        let w = Arc::new(QueueWatch::new(Some(poll)));
        let mut a = w.watch("a");
        let mut b = w.watch("b");
        assert_eq!(a.borrow().broker, BrokerCounts::Unasked);
        a.changed().await.unwrap();
        assert_eq!(
            a.borrow_and_update().broker,
            BrokerCounts::Seen(Counts {
                last_sequence: 5,
                waiting: 1
            })
        );
        b.changed().await.unwrap();
        assert_eq!(
            b.borrow_and_update().broker,
            BrokerCounts::Seen(Counts::default())
        );
        // An unchanged answer wakes nobody; a touch wakes only its queue.
        tokio::time::sleep(POLL_FLOOR * 3).await;
        assert!(!a.has_changed().unwrap());
        w.touch("b", 1);
        assert!(b.has_changed().unwrap());
        assert!(!a.has_changed().unwrap());
        b.borrow_and_update();
        *answers.lock().unwrap() = Err(BackendError::Unavailable("down".into()));
        a.changed().await.unwrap();
        assert_eq!(a.borrow_and_update().broker, BrokerCounts::Blind);
        // Nobody watches: the poll ends.
        drop((a, b));
        tokio::time::sleep(RETRY_AFTER_FAILURE * 2).await;
        let after = calls.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(RETRY_AFTER_FAILURE * 5).await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), after);
        assert!(!w.state().polling);
    }
}
