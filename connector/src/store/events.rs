//! Events in memory (KubeMQ 4.5): a send reaches every subscriber without a group and one
//! member of each group whose channel (or wildcard) matches, at most once; nothing is kept.
//! Each subscription has a bounded buffer; an event that finds it full is dropped for that
//! subscriber (KubeMQ drops a slow consumer's events too), so a stalled reader never makes
//! the store grow.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::errors::{event_validation, subscribe_channel, SubscribeKind};
use crate::kubemq::{Event, EventReceive};

/// Events a subscription's buffer holds before further events are dropped for it.
pub const SUBSCRIPTION_BUFFER: usize = 1024;

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

struct Subscriber {
    pattern: ChannelPattern,
    group: String,
    tx: mpsc::Sender<EventReceive>,
}

#[derive(Default)]
struct Subscribers {
    by_id: HashMap<u64, Subscriber>,
    /// Round-robin position per (pattern text, group).
    turns: HashMap<(String, String), usize>,
    next_id: u64,
}

/// The in-memory events router.
#[derive(Default)]
pub struct EventsHub {
    subs: Mutex<Subscribers>,
    /// Events dropped because a subscriber's buffer was full.
    dropped: AtomicU64,
}

/// What a send did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The event's id (generated when the sender left it empty).
    pub event_id: String,
    /// Subscribers it was queued for.
    pub delivered: usize,
}

impl EventsHub {
    /// Sends an event (`Store = false`): validated as KubeMQ does, then queued for every
    /// matching subscriber without a group and one member of each matching group.
    pub fn publish(&self, mut event: Event) -> Result<Published, &'static str> {
        event_validation(&event)?;
        if event.event_id.is_empty() {
            event.event_id = crate::kubemq::new_id();
        }
        let received = EventReceive {
            event_id: event.event_id.clone(),
            channel: event.channel,
            metadata: event.metadata,
            body: event.body,
            timestamp: 0,
            sequence: 0,
            tags: event.tags,
        };
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        let mut groups: HashMap<(String, String), Vec<u64>> = HashMap::new();
        let mut targets = Vec::new();
        let mut closed = Vec::new();
        for (&id, s) in &subs.by_id {
            if s.tx.is_closed() {
                closed.push(id);
            } else if s.pattern.matches(&received.channel) {
                if s.group.is_empty() {
                    targets.push(id);
                } else {
                    let key = (pattern_key(&s.pattern), s.group.clone());
                    groups.entry(key).or_default().push(id);
                }
            }
        }
        for id in closed {
            subs.by_id.remove(&id);
        }
        for (key, mut members) in groups {
            // A stable order, so that the turn walks the members round-robin.
            members.sort_unstable();
            let turn = subs.turns.entry(key).or_default();
            *turn = turn.wrapping_add(1);
            if let Some(&id) = members.get(*turn % members.len()) {
                targets.push(id);
            }
        }
        let mut delivered = 0;
        for id in targets {
            if let Some(s) = subs.by_id.get(&id) {
                match s.tx.try_send(received.clone()) {
                    Ok(()) => delivered += 1,
                    Err(_) => {
                        self.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        Ok(Published {
            event_id: received.event_id,
            delivered,
        })
    }

    /// Subscribes to events on `channel` (wildcards allowed) in `group` (empty: every event).
    /// The subscription ends when the returned receiver is dropped.
    pub fn subscribe(
        &self,
        client_id: &str,
        channel: &str,
        group: &str,
    ) -> Result<mpsc::Receiver<EventReceive>, &'static str> {
        subscribe_channel(client_id, channel, SubscribeKind::Events)?;
        let (tx, rx) = mpsc::channel(SUBSCRIPTION_BUFFER);
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        subs.by_id.retain(|_, s| !s.tx.is_closed());
        let live: std::collections::HashSet<(String, String)> = subs
            .by_id
            .values()
            .map(|s| (pattern_key(&s.pattern), s.group.clone()))
            .collect();
        subs.turns.retain(|k, _| live.contains(k));
        let id = subs.next_id;
        subs.next_id += 1;
        subs.by_id.insert(
            id,
            Subscriber {
                pattern: ChannelPattern::parse(channel),
                group: group.to_string(),
                tx,
            },
        );
        Ok(rx)
    }

    /// Live subscriptions (their receivers not yet dropped).
    pub fn subscriptions(&self) -> usize {
        let subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        subs.by_id.values().filter(|s| !s.tx.is_closed()).count()
    }

    /// Events dropped so far because a subscriber's buffer was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
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

    fn event(channel: &str, body: &'static [u8]) -> Event {
        Event {
            client_id: "c".into(),
            channel: channel.into(),
            body: bytes::Bytes::from_static(body),
            ..Default::default()
        }
    }

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

    /// Fan-out to every subscriber; one member per group, taking turns.
    #[tokio::test]
    async fn fan_out_and_groups() {
        let hub = EventsHub::default();
        let mut a = hub.subscribe("a", "ch", "").unwrap();
        let mut b = hub.subscribe("b", "ch", "").unwrap();
        let mut g1 = hub.subscribe("g1", "ch", "g").unwrap();
        let mut g2 = hub.subscribe("g2", "ch", "g").unwrap();
        for _ in 0..10 {
            let p = hub.publish(event("ch", b"x")).unwrap();
            assert_eq!(p.delivered, 3);
        }
        let count = |rx: &mut mpsc::Receiver<EventReceive>| {
            let mut n = 0;
            while rx.try_recv().is_ok() {
                n += 1;
            }
            n
        };
        assert_eq!(count(&mut a), 10);
        assert_eq!(count(&mut b), 10);
        assert_eq!((count(&mut g1), count(&mut g2)), (5, 5));
        drop(a);
        assert_eq!(hub.publish(event("ch", b"x")).unwrap().delivered, 2);
        assert_eq!(hub.subscriptions(), 3);
    }

    /// A full buffer drops for that subscriber only, and counts the drop.
    #[tokio::test]
    async fn a_full_buffer_drops() {
        let hub = EventsHub::default();
        let _slow = hub.subscribe("s", "ch", "").unwrap();
        for _ in 0..SUBSCRIPTION_BUFFER + 5 {
            hub.publish(event("ch", b"x")).unwrap();
        }
        assert_eq!(hub.dropped(), 5);
    }

    /// KubeMQ's validation texts.
    #[test]
    fn validation() {
        let hub = EventsHub::default();
        let mut e = event("ch", b"x");
        e.client_id.clear();
        assert!(hub.publish(e).unwrap_err().starts_with("Error 101"));
        assert!(hub
            .publish(event("a.*", b"x"))
            .unwrap_err()
            .starts_with("Error 107"));
        assert!(hub
            .publish(event("ch", b""))
            .unwrap_err()
            .starts_with("Error 110"));
        assert!(hub.subscribe("c", "a.*", "").is_ok());
        assert!(hub
            .subscribe("c", "a.", "")
            .unwrap_err()
            .starts_with("Error 119"));
    }
}
