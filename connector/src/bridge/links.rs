//! What each link of a connection is: the part of the bridge that serves it ([`LinkEntry`]) and
//! what it serves ([`Serves`], shown by the links endpoint, OBS-3), in the connection's table of
//! them, which keeps the links gauge (MET-3).

use std::sync::Arc;

use crate::detail::{LinkLabel, LinkLabels};
use crate::engine::{FastMap, LinkId};
use crate::metrics::{self, Metrics};
use crate::pattern::Pattern;

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

/// What a link is, by the part of the bridge that serves it; that part keeps the link's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkEntry {
    /// The client produces to one queue channel.
    QueueProducer,
    /// The client produces with each message's `to` naming its node (ADDR-13).
    AnonymousProducer,
    /// The client consumes one queue channel.
    QueueConsumer,
    /// The client publishes to an events or events-store channel.
    EventPublisher,
    /// The client subscribes to events or events-store, or deletes a durable subscription
    /// (DUR-9).
    EventSubscriber,
    /// The client sends requests to a commands or queries channel.
    Requester,
    /// The client answers the requests of a commands or queries channel.
    Responder,
    /// The client sends the reply to one request (ADDR-10).
    ReplySender,
    /// The client sends into the dynamic node this link minted (OP-ADDR-7).
    DynamicTarget,
    /// The client consumes a dynamic node: one this link minted (ADDR-11), or one a sender of
    /// the connection minted (ADDR-12).
    DynamicSource,
}

impl LinkEntry {
    /// The server's role on the link, as the links gauge counts it.
    pub(crate) fn role(self) -> metrics::Role {
        match self {
            LinkEntry::QueueProducer
            | LinkEntry::AnonymousProducer
            | LinkEntry::EventPublisher
            | LinkEntry::Requester
            | LinkEntry::ReplySender
            | LinkEntry::DynamicTarget => metrics::Role::receiver,
            LinkEntry::QueueConsumer
            | LinkEntry::EventSubscriber
            | LinkEntry::Responder
            | LinkEntry::DynamicSource => metrics::Role::sender,
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
        let accepted = Accepted {
            entry,
            label: serves.label(),
        };
        if let Some(old) = self.entries.insert(link, accepted) {
            self.metrics.link(old.entry.role()).dec();
        }
        self.metrics.link(entry.role()).inc();
    }

    /// What `link` is, if it is accepted.
    pub(crate) fn get(&self, link: LinkId) -> Option<LinkEntry> {
        self.entries.get(&link).map(|a| a.entry)
    }

    /// Forgets a link that ended; what it was.
    pub(crate) fn remove(&mut self, link: LinkId) -> Option<LinkEntry> {
        let gone = self.entries.remove(&link)?;
        self.metrics.link(gone.entry.role()).dec();
        Some(gone.entry)
    }

    /// Whether there are none.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl LinkLabels for Links {
    fn link_label(&self, link: LinkId) -> Option<LinkLabel> {
        self.entries.get(&link).map(|a| a.label.clone())
    }
}
