//! The vocabulary every layer shares: KubeMQ's five patterns, the node a message goes to, and
//! which way a message crosses the connector.
//! Addresses resolve to them (`bridge::address`), the policy decides on them (`auth`), the
//! metrics count by them.

pub use ops::vocabulary::Pattern;

/// The node a message goes to: a pattern and a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The pattern.
    pub pattern: Pattern,
    /// The channel.
    pub channel: String,
}

/// Which way a message crosses the connector (MET-4).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Direction {
    /// From clients.
    In,
    /// To clients.
    Out,
}
