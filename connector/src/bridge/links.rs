//! What each link of a connection is: the part of the bridge that serves it ([`LinkEntry`]) and
//! what it serves ([`Serves`], shown by the links endpoint, OBS-3), in the connection's table of
//! them, which keeps the links gauge (MET-3).

use std::sync::Arc;

use crate::detail::{LinkLabel, LinkLabels};
use crate::engine::{FastMap, LinkId};
use crate::metrics::{self, Metrics};
use crate::pattern::{Pattern, Target};

use super::events::{Subscriber, SubscriberTable};
use super::queues::{Producer, QueueConsumer, QueueTable};
use super::rpc::{Responder, ResponderTable};

/// What an accepted link serves, for the links endpoint (OBS-3).
pub(crate) enum Serves<'a> {
    /// A node of a pattern.
    Node {
        /// Its pattern.
        pattern: Pattern,
        /// Its channel.
        channel: &'a str,
        /// A durable events-store subscription (DUR-1).
        durable: bool,
    },
    /// A dynamic node this connection minted (ADDR-11), at this address.
    Dynamic(&'a str),
    /// An anonymous sender: each message names its node (ADDR-13).
    Anonymous,
    /// A sender to the reply token of one request (ADDR-10).
    Response(&'a str),
}

impl<'a> Serves<'a> {
    /// A queue channel.
    pub(crate) fn queue(channel: &'a str) -> Self {
        Serves::Node {
            pattern: Pattern::Queues,
            channel,
            durable: false,
        }
    }

    /// A node of a pattern, not durable.
    pub(crate) fn node(pattern: Pattern, channel: &'a str) -> Self {
        Serves::Node {
            pattern,
            channel,
            durable: false,
        }
    }

    /// As the links endpoint shows it.
    fn label(self) -> LinkLabel {
        match self {
            Serves::Node {
                pattern,
                channel,
                durable,
            } => LinkLabel {
                address: format!("{}/{channel}", pattern.name()),
                pattern: pattern.name(),
                channel: channel.to_string(),
                durable,
            },
            Serves::Dynamic(address) => LinkLabel {
                address: address.to_string(),
                pattern: "dynamic",
                ..LinkLabel::default()
            },
            Serves::Anonymous => LinkLabel {
                pattern: "anonymous",
                ..LinkLabel::default()
            },
            Serves::Response(request_id) => LinkLabel {
                address: format!("responses/{request_id}"),
                pattern: "responses",
                channel: request_id.to_string(),
                durable: false,
            },
        }
    }
}

/// What a link is, by the part of the bridge that serves it, with that link's own state; the
/// part keeps only what its links share (calls in flight, the Get loops' hand-outs, tokens).
pub(crate) enum LinkEntry {
    /// The client produces to one queue channel.
    QueueProducer {
        /// The channel.
        channel: String,
        /// Its path to the backend.
        producer: Producer,
    },
    /// The client produces with each message's `to` naming its node (ADDR-13).
    AnonymousProducer(Producer),
    /// The client consumes one queue channel.
    QueueConsumer(QueueConsumer),
    /// The client publishes to an events or events-store channel.
    EventPublisher(Target),
    /// The client subscribes to events or events-store, or deletes a durable subscription
    /// (DUR-9).
    EventSubscriber(Subscriber),
    /// The client sends requests to a commands or queries channel.
    Requester(Target),
    /// The client answers the requests of a commands or queries channel.
    Responder(Responder),
    /// The client sends the reply to the request of this token (ADDR-10).
    ReplySender(String),
    /// The client sends into the dynamic node at this address, which this link minted
    /// (OP-ADDR-7).
    DynamicTarget(String),
    /// The client consumes the dynamic node at this address: one this link minted (ADDR-11),
    /// or one a sender of the connection minted (ADDR-12).
    DynamicSource(String),
}

impl LinkEntry {
    /// The server's role on the link, as the links gauge counts it.
    pub(crate) fn role(&self) -> metrics::Role {
        match self {
            LinkEntry::QueueProducer { .. }
            | LinkEntry::AnonymousProducer(_)
            | LinkEntry::EventPublisher(_)
            | LinkEntry::Requester(_)
            | LinkEntry::ReplySender(_)
            | LinkEntry::DynamicTarget(_) => metrics::Role::receiver,
            LinkEntry::QueueConsumer(_)
            | LinkEntry::EventSubscriber(_)
            | LinkEntry::Responder(_)
            | LinkEntry::DynamicSource(_) => metrics::Role::sender,
        }
    }
}

/// A connection's accepted links, each counted in the links gauge while it is here (MET-3).
pub(crate) struct Links {
    entries: FastMap<LinkId, Accepted>,
    metrics: Arc<Metrics>,
}

/// One accepted link.
struct Accepted {
    entry: LinkEntry,
    label: LinkLabel,
}

impl Links {
    /// No links yet, counted in `metrics`.
    pub(crate) fn new(metrics: Arc<Metrics>) -> Links {
        Links {
            entries: FastMap::default(),
            metrics,
        }
    }

    /// Records a link the engine accepted: what it is and what it serves.
    pub(crate) fn insert(&mut self, link: LinkId, entry: LinkEntry, serves: Serves<'_>) {
        self.metrics.link(entry.role()).inc();
        let accepted = Accepted {
            entry,
            label: serves.label(),
        };
        if let Some(old) = self.entries.insert(link, accepted) {
            self.metrics.link(old.entry.role()).dec();
        }
    }

    /// What `link` is, if it is accepted.
    pub(crate) fn get_mut(&mut self, link: LinkId) -> Option<&mut LinkEntry> {
        self.entries.get_mut(&link).map(|a| &mut a.entry)
    }

    /// Every accepted link.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (LinkId, &mut LinkEntry)> {
        self.entries.iter_mut().map(|(l, a)| (*l, &mut a.entry))
    }

    /// Forgets a link that ended; what it was.
    pub(crate) fn remove(&mut self, link: LinkId) -> Option<LinkEntry> {
        let gone = self.entries.remove(&link)?;
        self.metrics.link(gone.entry.role()).dec();
        Some(gone.entry)
    }

    /// Forgets every link (the connection ended), counting each out: what they were.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = LinkEntry> + '_ {
        let metrics = &self.metrics;
        self.entries.drain().map(move |(_, a)| {
            metrics.link(a.entry.role()).dec();
            a.entry
        })
    }

    /// Whether there are none.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a produce or consume link of a queue is kept.
    #[cfg(test)]
    pub(crate) fn has_queue_links(&self) -> bool {
        self.entries.values().any(|a| {
            matches!(
                a.entry,
                LinkEntry::QueueProducer { .. }
                    | LinkEntry::AnonymousProducer(_)
                    | LinkEntry::QueueConsumer(_)
            )
        })
    }
}

impl LinkLabels for Links {
    fn link_label(&self, link: LinkId) -> Option<LinkLabel> {
        self.entries.get(&link).map(|a| a.label.clone())
    }
}

impl QueueTable for Links {
    fn consumer(&mut self, link: LinkId) -> Option<&mut QueueConsumer> {
        match self.get_mut(link) {
            Some(LinkEntry::QueueConsumer(c)) => Some(c),
            _ => None,
        }
    }

    fn consumer_links(&self) -> impl Iterator<Item = LinkId> {
        let consumers = self.entries.iter();
        consumers
            .filter(|(_, a)| matches!(a.entry, LinkEntry::QueueConsumer(_)))
            .map(|(l, _)| *l)
    }

    fn producers(&mut self) -> impl Iterator<Item = &mut Producer> {
        self.entries
            .values_mut()
            .filter_map(|a| match &mut a.entry {
                LinkEntry::QueueProducer { producer, .. }
                | LinkEntry::AnonymousProducer(producer) => Some(producer),
                _ => None,
            })
    }
}

impl SubscriberTable for Links {
    fn subscriber(&mut self, link: LinkId) -> Option<&mut Subscriber> {
        match self.get_mut(link) {
            Some(LinkEntry::EventSubscriber(s)) => Some(s),
            _ => None,
        }
    }

    fn subscribers(&mut self) -> impl Iterator<Item = (LinkId, &mut Subscriber)> {
        self.iter_mut().filter_map(|(l, e)| match e {
            LinkEntry::EventSubscriber(s) => Some((l, s)),
            _ => None,
        })
    }
}

impl ResponderTable for Links {
    fn responder(&mut self, link: LinkId) -> Option<&mut Responder> {
        match self.get_mut(link) {
            Some(LinkEntry::Responder(r)) => Some(r),
            _ => None,
        }
    }

    fn responders(&mut self) -> impl Iterator<Item = (LinkId, &mut Responder)> {
        self.iter_mut().filter_map(|(l, e)| match e {
            LinkEntry::Responder(r) => Some((l, r)),
            _ => None,
        })
    }
}
