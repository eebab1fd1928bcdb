//! Events in memory (KubeMQ 4.5): a send reaches every subscriber without a group and one
//! member of each group whose channel (or wildcard) matches, at most once; nothing is kept.
//! Each subscription has a bounded buffer; an event that finds it full is dropped for that
//! subscriber (KubeMQ drops a slow consumer's events too), so a stalled reader never makes
//! the store grow.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use super::errors::{event_validation, subscribe_channel, StoreError, SubscribeKind};
use super::fanout::{Channeled, Fanout};
use crate::kubemq::{Event, EventReceive};

/// Events a subscription's buffer holds before further events are dropped for it.
pub const SUBSCRIPTION_BUFFER: usize = 1024;

impl Channeled for EventReceive {
    fn channel(&self) -> &str {
        &self.channel
    }
}

/// The in-memory events router.
pub struct EventsHub {
    subs: Fanout<EventReceive>,
    /// Events dropped because a subscriber's buffer was full.
    dropped: AtomicU64,
}

impl Default for EventsHub {
    fn default() -> Self {
        EventsHub {
            subs: Fanout::new(SUBSCRIPTION_BUFFER),
            dropped: AtomicU64::new(0),
        }
    }
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
    pub fn publish(&self, mut event: Event) -> Result<Published, StoreError> {
        event_validation(&event)?;
        if event.event_id.is_empty() {
            event.event_id = crate::kubemq::new_id();
        }
        let event_id = event.event_id.clone();
        let received = EventReceive {
            event_id: event.event_id,
            channel: event.channel,
            metadata: event.metadata,
            body: event.body,
            timestamp: 0,
            sequence: 0,
            tags: event.tags,
        };
        let routed = self.subs.route(received);
        self.dropped
            .fetch_add(routed.dropped as u64, Ordering::Relaxed);
        Ok(Published {
            event_id,
            delivered: routed.delivered,
        })
    }

    /// Subscribes to events on `channel` (wildcards allowed) in `group` (empty: every event).
    /// The subscription ends when the returned receiver is dropped.
    pub fn subscribe(
        &self,
        client_id: &str,
        channel: &str,
        group: &str,
    ) -> Result<mpsc::Receiver<EventReceive>, StoreError> {
        subscribe_channel(client_id, channel, SubscribeKind::Events)?;
        Ok(self.subs.subscribe(channel, group))
    }

    /// Live subscriptions (their receivers not yet dropped).
    pub fn subscriptions(&self) -> usize {
        self.subs.subscriptions()
    }

    /// Events dropped so far because a subscriber's buffer was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
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
        assert!(hub
            .publish(e)
            .unwrap_err()
            .to_string()
            .starts_with("Error 101"));
        assert!(hub
            .publish(event("a.*", b"x"))
            .unwrap_err()
            .to_string()
            .starts_with("Error 107"));
        assert!(hub
            .publish(event("ch", b""))
            .unwrap_err()
            .to_string()
            .starts_with("Error 110"));
        assert!(hub.subscribe("c", "a.*", "").is_ok());
        assert!(hub
            .subscribe("c", "a.", "")
            .unwrap_err()
            .to_string()
            .starts_with("Error 119"));
    }
}
