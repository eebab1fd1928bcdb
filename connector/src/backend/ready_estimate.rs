//! How many messages a channel probably has ready, counted from this process's own traffic.
//!
//! KubeMQ's Get waits for MaxItems messages or its full WaitTimeout (at least 1 s), and KubeMQ
//! cannot say cheaply what a queue holds. A Get sized from a guess therefore holds the last
//! messages of a burst for a second. Most traffic of a channel served through this connector is
//! produced through it too, and those sends are counted here: sent (stored, or being stored)
//! minus fetched is what is waiting or about to be, and a Get for that many returns as soon as
//! they are stored (KMQ-6: "ask for the number of messages already known to be
//! waiting").
//!
//! Only an over-count costs anything (a Get that waits its second), so the count errs low:
//! - a send counts from the moment it leaves; one KubeMQ refuses is taken back, and messages a
//!   Get fetched before their send was confirmed are not counted twice;
//! - a Get that came back short proves the queue was empty then: the count drops to zero, keeping
//!   only the debt that sends still unconfirmed can repay;
//! - messages from other producers are fetched too and push the count below zero, where it reads
//!   as "unknown" and the caller falls back to its own sizing until the next short Get.
//!
//! Messages that leave without being fetched (expired, dead-lettered, taken by another connector
//! process) are an over-count until the next short Get corrects it: one Get's wait, the same as
//! without this count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::queue_watch::QueueWatch;
use crate::kubemq::{QueueMessage, SendQueueMessageResult};

#[derive(Debug, Default, Clone, Copy)]
struct Count {
    /// Confirmed sends minus fetched messages since the last short Get; negative while fetched
    /// messages are not yet confirmed, or while other producers' messages were fetched.
    ready: i64,
    /// Messages sent and not yet confirmed or refused.
    unconfirmed: i64,
}

/// Messages of one send, by channel, not yet confirmed or refused.
pub struct Sending {
    estimate: Arc<ReadyEstimate>,
    /// Consecutive messages to the same channel: (channel, count), in order.
    runs: Vec<(String, usize)>,
}

impl Sending {
    /// The send's results (one per message, in order; none if the send failed as a whole).
    pub fn finish(mut self, results: &[SendQueueMessageResult]) {
        let mut results = results.iter();
        for (channel, n) in std::mem::take(&mut self.runs) {
            let stored = results.by_ref().take(n).filter(|r| !r.is_error).count();
            self.estimate.with(&channel, |c| {
                c.unconfirmed -= n as i64;
                c.ready += stored as i64;
            });
        }
        self.estimate.rose.send_replace(());
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        for (channel, n) in std::mem::take(&mut self.runs) {
            self.estimate.with(&channel, |c| c.unconfirmed -= n as i64);
        }
    }
}

/// Per-channel counts of this process's sends and fetches.
#[derive(Debug)]
pub struct ReadyEstimate {
    channels: Mutex<HashMap<String, Count>>,
    /// Touched whenever a count may have risen, for Get loops holding a Get back until
    /// messages are ready.
    rose: tokio::sync::watch::Sender<()>,
    /// The Get loops of idle queues, told of this process's sends and give-backs per channel.
    watch: Arc<QueueWatch>,
}

impl Default for ReadyEstimate {
    fn default() -> Self {
        ReadyEstimate::watched_by(Arc::new(QueueWatch::new(None)))
    }
}

impl ReadyEstimate {
    /// A count whose rises also touch the channel's view in `watch`.
    pub fn watched_by(watch: Arc<QueueWatch>) -> Self {
        ReadyEstimate {
            channels: Mutex::default(),
            rose: tokio::sync::watch::Sender::new(()),
            watch,
        }
    }

    /// The watch of idle queues this count touches.
    pub fn watch(&self) -> &Arc<QueueWatch> {
        &self.watch
    }

    /// Applies `f` to `channel`'s count; a count back at nothing is dropped, so channels used
    /// once do not stay in the map.
    fn with(&self, channel: &str, f: impl FnOnce(&mut Count)) {
        let mut map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        let settled = match map.get_mut(channel) {
            Some(c) => {
                f(c);
                c.ready == 0 && c.unconfirmed == 0
            }
            None => {
                let mut c = Count::default();
                f(&mut c);
                if c.ready == 0 && c.unconfirmed == 0 {
                    return;
                }
                map.insert(channel.to_string(), c);
                false
            }
        };
        if settled {
            map.remove(channel);
        }
    }

    /// `messages` are on their way to the broker: counted per channel until the returned guard
    /// is given their results, or dropped (a send abandoned midway counts as refused, so an
    /// unfinished send can never leave the count high).
    pub fn sending(self: &Arc<Self>, messages: &[QueueMessage]) -> Sending {
        let mut runs: Vec<(String, usize)> = Vec::new();
        for m in messages {
            match runs.last_mut() {
                Some((channel, n)) if *channel == m.channel => *n += 1,
                _ => runs.push((m.channel.clone(), 1)),
            }
        }
        for (channel, n) in &runs {
            self.with(channel, |c| c.unconfirmed += *n as i64);
            self.watch.touch(channel, *n);
        }
        self.rose.send_replace(());
        Sending {
            estimate: self.clone(),
            runs,
        }
    }

    /// A Get for `asked` messages of `channel` returned `got`.
    pub fn fetched(&self, channel: &str, asked: usize, got: usize) {
        self.with(channel, |c| {
            c.ready -= got as i64;
            if got < asked {
                c.ready = c.ready.min(0).max(-c.unconfirmed);
            }
        });
    }

    /// `count` messages of `channel` went back to the queue (NAck, CloseByClient, a lost
    /// session): a Get for them all takes them at once, where a smaller one would leave the rest
    /// to be captured by its transaction on a real KubeMQ (KMQ-2).
    pub fn returned(&self, channel: &str, count: usize) {
        self.with(channel, |c| c.ready += count as i64);
        self.watch.touch(channel, count);
        self.rose.send_replace(());
    }

    /// Messages of `channel` confirmed stored (or given back) and not fetched since: a Get for
    /// that many finds them all.
    pub fn stored(&self, channel: &str) -> u64 {
        let map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        map.get(channel)
            .map_or(0, |c| u64::try_from(c.ready).unwrap_or(0))
    }

    /// A signal that changes whenever a count may have risen.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.rose.subscribe()
    }

    /// Messages of `channel` probably ready now or within a send's time; `None` when other
    /// producers' messages were fetched since the last short Get (the count is below zero). A
    /// channel with nothing counted has none: a Get for one returns on the next arrival.
    pub fn ready(&self, channel: &str) -> Option<u64> {
        let map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        map.get(channel)
            .map_or(Some(0), |c| u64::try_from(c.ready + c.unconfirmed).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(channel: &str, n: usize) -> Vec<QueueMessage> {
        (0..n)
            .map(|_| QueueMessage {
                channel: channel.into(),
                ..Default::default()
            })
            .collect()
    }

    fn results(errors: &[bool]) -> Vec<SendQueueMessageResult> {
        errors
            .iter()
            .map(|&is_error| SendQueueMessageResult {
                is_error,
                ..Default::default()
            })
            .collect()
    }

    /// Sends and stores `n` messages to `channel`, all confirmed.
    fn sent(e: &Arc<ReadyEstimate>, channel: &str, n: usize) {
        e.sending(&to(channel, n)).finish(&results(&vec![false; n]));
    }

    #[test]
    fn sends_minus_fetches_per_channel() {
        let e = Arc::new(ReadyEstimate::default());
        let mut batch = to("q", 10);
        batch.extend(to("other", 2));
        let sending = e.sending(&batch);
        assert_eq!(e.ready("q"), Some(10), "sends on their way count");
        assert_eq!(e.ready("other"), Some(2));
        let mut outcome = vec![false; 12];
        outcome[3] = true;
        sending.finish(&results(&outcome));
        assert_eq!(e.ready("q"), Some(9), "a refused message is not counted");
        e.fetched("q", 5, 5);
        assert_eq!(e.ready("q"), Some(4));
        assert_eq!(e.ready("other"), Some(2));
        assert_eq!(e.ready("none"), Some(0));
    }

    #[test]
    fn an_abandoned_or_failed_send_counts_nothing() {
        let e = Arc::new(ReadyEstimate::default());
        drop(e.sending(&to("q", 7)));
        assert_eq!(e.ready("q"), Some(0), "dropped midway");
        e.sending(&to("q", 3)).finish(&[]);
        assert_eq!(e.ready("q"), Some(0), "failed as a whole");
        assert!(
            e.channels.lock().unwrap().is_empty(),
            "nothing kept for a settled channel"
        );
    }

    #[test]
    fn fetched_before_confirmed_is_not_counted_twice() {
        let e = Arc::new(ReadyEstimate::default());
        let sending = e.sending(&to("q", 3));
        // The consumer saw the three before their send was confirmed, then asked for more.
        e.fetched("q", 3, 3);
        assert_eq!(e.ready("q"), Some(0));
        e.fetched("q", 4, 0);
        assert_eq!(e.ready("q"), Some(0));
        sending.finish(&results(&[false; 3]));
        assert_eq!(
            e.ready("q"),
            Some(0),
            "those three are gone: no Get should wait for them"
        );
    }

    #[test]
    fn returned_messages_count_as_ready() {
        let e = Arc::new(ReadyEstimate::default());
        sent(&e, "q", 3);
        e.fetched("q", 3, 3);
        assert_eq!(e.ready("q"), Some(0));
        e.returned("q", 3);
        assert_eq!(e.ready("q"), Some(3), "a NAck of three makes three ready");
    }

    #[test]
    fn a_short_get_forgets_other_producers_and_over_counts() {
        let e = Arc::new(ReadyEstimate::default());
        // Another producer's 50 were fetched: below zero, read as unknown.
        e.fetched("q", 50, 50);
        assert_eq!(e.ready("q"), None);
        sent(&e, "q", 2);
        assert_eq!(e.ready("q"), None, "still owed from the other producer");
        // The queue ran dry: the debt is forgotten, local sends count again.
        e.fetched("q", 10, 3);
        sent(&e, "q", 1);
        assert_eq!(e.ready("q"), Some(1));
        // An over-count (say, messages that expired) ends at the next short Get.
        sent(&e, "q", 5);
        e.fetched("q", 6, 2);
        assert_eq!(e.ready("q"), Some(0));
        assert!(
            e.channels.lock().unwrap().is_empty(),
            "nothing kept for a settled channel"
        );
    }
}
