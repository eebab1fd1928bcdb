//! Routing in memory as KubeMQ routes events, commands and queries (4.5, 4.7): an item sent to a
//! channel reaches every matching subscriber without a group and one member of each matching
//! group, in turn. Each subscription has a bounded buffer; an item that finds it full is dropped
//! for that subscriber, so a stalled reader never makes the process grow.

use std::collections::BTreeMap;
use std::sync::Mutex;

use smallvec::SmallVec;
use tokio::sync::mpsc;

use crate::engine::FastMap;

/// A channel a subscription listens on: one name, or a NATS-style pattern over `.`-separated
/// tokens (`*` one token, `>` one or more trailing tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelPattern {
    /// Exactly this channel.
    Exact(String),
    /// A wildcard pattern, split into tokens.
    Wildcard(Vec<String>),
}

impl ChannelPattern {
    /// The pattern `channel` stands for.
    pub fn parse(channel: &str) -> ChannelPattern {
        if channel.split('.').any(|t| t == "*" || t == ">") {
            ChannelPattern::Wildcard(channel.split('.').map(str::to_string).collect())
        } else {
            ChannelPattern::Exact(channel.to_string())
        }
    }

    /// Whether an event sent to `channel` matches.
    pub fn matches(&self, channel: &str) -> bool {
        match self {
            ChannelPattern::Exact(c) => c == channel,
            ChannelPattern::Wildcard(tokens) => {
                let mut parts = channel.split('.');
                for (i, t) in tokens.iter().enumerate() {
                    match t.as_str() {
                        // `>` must be last and takes at least one token.
                        ">" => return i + 1 == tokens.len() && parts.next().is_some(),
                        "*" => {
                            if parts.next().is_none() {
                                return false;
                            }
                        }
                        t => {
                            if parts.next() != Some(t) {
                                return false;
                            }
                        }
                    }
                }
                parts.next().is_none()
            }
        }
    }
}

struct Subscriber<T> {
    pattern: ChannelPattern,
    /// Its (pattern text, group) when it is in a group: the members of one take turns.
    group: Option<GroupKey>,
    tx: mpsc::Sender<T>,
}

/// A group of subscribers: the text of their pattern and the group's name.
type GroupKey = (String, String);

/// The members of one group that match an item, in their stable order.
struct Group<'a, T> {
    key: &'a GroupKey,
    members: SmallVec<[&'a Subscriber<T>; 4]>,
}

struct Subscribers<T> {
    /// By id, so that a group's members are in a stable order for their turns.
    by_id: BTreeMap<u64, Subscriber<T>>,
    /// Round-robin position per (pattern text, group).
    turns: FastMap<GroupKey, usize>,
    next_id: u64,
}

impl<T> Default for Subscribers<T> {
    fn default() -> Self {
        Subscribers {
            by_id: BTreeMap::new(),
            turns: FastMap::default(),
            next_id: 0,
        }
    }
}

/// What one send reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Routed {
    /// Subscribers it was queued for.
    pub delivered: usize,
    /// Subscribers whose buffer was full: it was dropped for them.
    pub dropped: usize,
}

/// The subscriptions of one kind of item, and the routing of items to them.
pub struct Fanout<T> {
    subs: Mutex<Subscribers<T>>,
    /// Capacity of each subscription's buffer.
    buffer: usize,
}

/// An item that names the channel it was sent to.
pub trait Channeled {
    /// The channel it was sent to.
    fn channel(&self) -> &str;
}

impl<T: Clone + Channeled> Fanout<T> {
    /// No subscriptions yet; each will buffer `buffer` items.
    pub fn new(buffer: usize) -> Self {
        Fanout {
            subs: Mutex::default(),
            buffer,
        }
    }

    /// Queues `item` for every subscriber matching its channel without a group and one member of
    /// each matching group (copied only when it goes to more than one).
    pub fn route(&self, item: T) -> Routed {
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        subs.by_id.retain(|_, s| !s.tx.is_closed());
        let Subscribers { by_id, turns, .. } = &mut *subs;
        // Few subscribers and fewer groups listen on one channel: lists kept inline, so that
        // routing one item allocates nothing.
        let mut targets: SmallVec<[&Subscriber<T>; 4]> = SmallVec::new();
        let mut groups: SmallVec<[Group<'_, T>; 2]> = SmallVec::new();
        for s in by_id.values().filter(|s| s.pattern.matches(item.channel())) {
            match &s.group {
                None => targets.push(s),
                Some(key) => match groups.iter_mut().find(|g| g.key == key) {
                    Some(g) => g.members.push(s),
                    None => groups.push(Group {
                        key,
                        members: smallvec::smallvec![s],
                    }),
                },
            }
        }
        for g in groups {
            let turn = match turns.get_mut(g.key) {
                Some(turn) => turn,
                None => turns.entry(g.key.clone()).or_default(),
            };
            *turn = turn.wrapping_add(1);
            if let Some(&s) = g.members.get(*turn % g.members.len()) {
                targets.push(s);
            }
        }
        let mut routed = Routed::default();
        let mut item = Some(item);
        let last = targets.len().saturating_sub(1);
        for (i, s) in targets.into_iter().enumerate() {
            let one = if i == last { item.take() } else { item.clone() };
            match one.map(|one| s.tx.try_send(one)) {
                Some(Ok(())) => routed.delivered += 1,
                Some(Err(_)) => routed.dropped += 1,
                None => {}
            }
        }
        routed
    }

    /// Subscribes to `channel` (wildcards allowed) in `group` (empty: every item). The
    /// subscription ends when the returned receiver is dropped.
    pub fn subscribe(&self, channel: &str, group: &str) -> mpsc::Receiver<T> {
        let (tx, rx) = mpsc::channel(self.buffer);
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        let Subscribers {
            by_id,
            turns,
            next_id,
        } = &mut *subs;
        by_id.retain(|_, s| !s.tx.is_closed());
        let live: std::collections::HashSet<&GroupKey> =
            by_id.values().filter_map(|s| s.group.as_ref()).collect();
        turns.retain(|k, _| live.contains(k));
        let pattern = ChannelPattern::parse(channel);
        let group = (!group.is_empty()).then(|| (pattern_key(&pattern), group.to_string()));
        by_id.insert(*next_id, Subscriber { pattern, group, tx });
        *next_id += 1;
        rx
    }

    /// Live subscriptions (their receivers not yet dropped).
    pub fn subscriptions(&self) -> usize {
        let subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        subs.by_id.values().filter(|s| !s.tx.is_closed()).count()
    }
}

fn pattern_key(p: &ChannelPattern) -> String {
    match p {
        ChannelPattern::Exact(c) => c.clone(),
        ChannelPattern::Wildcard(t) => t.join("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KMQ-EV: NATS wildcard semantics on `.`-separated tokens.
    #[test]
    fn wildcards_match_tokens() {
        let p = ChannelPattern::parse("orders.*.created");
        assert!(p.matches("orders.eu.created"));
        assert!(!p.matches("orders.eu.x.created"));
        assert!(!p.matches("orders.created"));
        let p = ChannelPattern::parse("orders.>");
        assert!(p.matches("orders.eu"));
        assert!(p.matches("orders.eu.created"));
        assert!(!p.matches("orders"));
        let p = ChannelPattern::parse("orders");
        assert!(p.matches("orders") && !p.matches("orders.eu"));
    }
}
