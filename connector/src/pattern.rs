//! The vocabulary every layer shares: KubeMQ's five patterns and the node a message goes to.
//! Addresses resolve to them (`bridge::address`), the policy decides on them (`auth`), the
//! metrics count by them.

use std::fmt;

/// The five KubeMQ patterns (ADDR-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// `queues/`.
    Queues,
    /// `events/`.
    Events,
    /// `events-store/`.
    EventsStore,
    /// `commands/`.
    Commands,
    /// `queries/`.
    Queries,
}

impl Pattern {
    /// The pattern named by a DefaultPattern value (CFG-10); anything else degrades to queues
    /// (ADDR-8; unreachable once configuration is validated).
    pub fn from_setting(name: &str) -> Pattern {
        match name {
            "events" => Pattern::Events,
            "events-store" => Pattern::EventsStore,
            "commands" => Pattern::Commands,
            "queries" => Pattern::Queries,
            _ => Pattern::Queues,
        }
    }

    /// The pattern's name as in addresses.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Queues => "queues",
            Pattern::Events => "events",
            Pattern::EventsStore => "events-store",
            Pattern::Commands => "commands",
            Pattern::Queries => "queries",
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The node a message goes to: a pattern and a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The pattern.
    pub pattern: Pattern,
    /// The channel.
    pub channel: String,
}
