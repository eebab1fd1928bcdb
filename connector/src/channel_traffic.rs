//! Messages per channel, for the dashboard's traffic by channel. Each pattern's first
//! [`MAX_CHANNELS`] channels are counted under their own name and any later one under
//! [`OTHER`], so that clients making up channel names cannot grow the scrape (or Prometheus's
//! series) without bound. Served at `/metrics/operations` as
//! `kubemq_amqp_connector_channel_transfers_total{pattern, channel, direction}`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::engine::FastMap;
use crate::pattern::{Direction, Pattern};

/// Channels of one pattern counted under their own name.
pub const MAX_CHANNELS: usize = 100;
/// The `channel` label of every channel beyond the first [`MAX_CHANNELS`] of its pattern.
pub const OTHER: &str = "_other";

/// Every pattern, in the order of [`index`].
const PATTERNS: [Pattern; 5] = [
    Pattern::Queues,
    Pattern::Events,
    Pattern::EventsStore,
    Pattern::Commands,
    Pattern::Queries,
];

fn index(p: Pattern) -> usize {
    match p {
        Pattern::Queues => 0,
        Pattern::Events => 1,
        Pattern::EventsStore => 2,
        Pattern::Commands => 3,
        Pattern::Queries => 4,
    }
}

/// One channel's transfers, into the connector and out of it.
#[derive(Debug, Default)]
struct Count {
    inbound: AtomicU64,
    outbound: AtomicU64,
}

impl Count {
    fn add(&self, direction: Direction) {
        let c = match direction {
            Direction::In => &self.inbound,
            Direction::Out => &self.outbound,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// One pattern's channels.
#[derive(Debug, Default)]
struct PatternChannels {
    named: RwLock<FastMap<Box<str>, Arc<Count>>>,
    other: Count,
}

/// The per-channel transfer counts of the process.
#[derive(Debug, Default)]
pub struct ChannelTraffic {
    patterns: [PatternChannels; 5],
}

/// One series of the family at a scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelTransfers {
    /// The pattern.
    pub pattern: Pattern,
    /// The channel, or [`OTHER`].
    pub channel: String,
    /// Into the connector or out of it.
    pub direction: Direction,
    /// Transfers counted so far.
    pub count: u64,
}

impl ChannelTraffic {
    /// Counts one transfer of a message of `pattern` on `channel`.
    pub fn count(&self, pattern: Pattern, channel: &str, direction: Direction) {
        let Some(p) = self.patterns.get(index(pattern)) else {
            return;
        };
        let named = p.named.read().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = named.get(channel) {
            c.add(direction);
            return;
        }
        let full = named.len() >= MAX_CHANNELS;
        drop(named);
        if full {
            p.other.add(direction);
            return;
        }
        let mut named = p.named.write().unwrap_or_else(|e| e.into_inner());
        // Another thread may have filled the last place meanwhile.
        if named.len() >= MAX_CHANNELS && !named.contains_key(channel) {
            drop(named);
            p.other.add(direction);
            return;
        }
        named
            .entry(channel.into())
            .or_insert_with(Default::default)
            .add(direction);
    }

    /// Every series with a count, the named channels first.
    pub fn snapshot(&self) -> Vec<ChannelTransfers> {
        let mut out = Vec::new();
        for (pattern, p) in PATTERNS.iter().zip(&self.patterns) {
            let mut push = |channel: &str, c: &Count| {
                for (direction, n) in [(Direction::In, &c.inbound), (Direction::Out, &c.outbound)] {
                    let count = n.load(Ordering::Relaxed);
                    if count > 0 {
                        out.push(ChannelTransfers {
                            pattern: *pattern,
                            channel: channel.to_string(),
                            direction,
                            count,
                        });
                    }
                }
            };
            let named = p.named.read().unwrap_or_else(|e| e.into_inner());
            for (channel, c) in named.iter() {
                push(channel, c);
            }
            drop(named);
            push(OTHER, &p.other);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(t: &ChannelTraffic, pattern: Pattern, channel: &str, d: Direction) -> u64 {
        t.snapshot()
            .into_iter()
            .find(|s| s.pattern == pattern && s.channel == channel && s.direction == d)
            .map_or(0, |s| s.count)
    }

    /// Each pattern's channels are counted apart, by direction; beyond the first
    /// [`MAX_CHANNELS`] of a pattern every new channel counts under [`OTHER`], and a channel
    /// counted before keeps its own series.
    #[test]
    fn channels_are_counted_apart_up_to_the_bound() {
        let t = ChannelTraffic::default();
        t.count(Pattern::Queues, "a", Direction::In);
        t.count(Pattern::Queues, "a", Direction::In);
        t.count(Pattern::Queues, "a", Direction::Out);
        t.count(Pattern::Events, "a", Direction::In);
        assert_eq!(counted(&t, Pattern::Queues, "a", Direction::In), 2);
        assert_eq!(counted(&t, Pattern::Queues, "a", Direction::Out), 1);
        assert_eq!(counted(&t, Pattern::Events, "a", Direction::In), 1);
        assert_eq!(counted(&t, Pattern::Events, "a", Direction::Out), 0);
        for n in 1..MAX_CHANNELS + 50 {
            t.count(Pattern::Queues, &format!("c{n}"), Direction::In);
        }
        t.count(Pattern::Queues, "a", Direction::In);
        let queues: Vec<_> = t
            .snapshot()
            .into_iter()
            .filter(|s| s.pattern == Pattern::Queues && s.direction == Direction::In)
            .collect();
        assert_eq!(queues.len(), MAX_CHANNELS + 1, "the named ones and {OTHER}");
        assert_eq!(counted(&t, Pattern::Queues, "a", Direction::In), 3);
        assert_eq!(counted(&t, Pattern::Queues, OTHER, Direction::In), 50);
        // Another pattern has room of its own.
        t.count(Pattern::Commands, "c120", Direction::In);
        assert_eq!(counted(&t, Pattern::Commands, "c120", Direction::In), 1);
    }
}
