//! The vocabulary every layer shares: KubeMQ's five patterns and the node a message goes to.
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
