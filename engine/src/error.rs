//! The connector's error vocabulary: exactly the 13 AMQP conditions of ERR-1, and the error value
//! (condition + sanitized description) carried on DETACH, END, CLOSE and `rejected` outcomes.

use fe2o3_amqp_types::definitions::{Error as WireError, ErrorCondition};
use fe2o3_amqp_types::primitives::Symbol;

/// One of the 13 symbolic conditions the connector may report (ERR-1); no other is ever sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Condition {
    /// `amqp:internal-error`: unexpected server-side or broker failure.
    InternalError,
    /// `amqp:not-found`: unknown address prefix or invalid channel.
    NotFound,
    /// `amqp:unauthorized-access`: authorization denied.
    UnauthorizedAccess,
    /// `amqp:decode-error`: malformed frame or undecodable message.
    DecodeError,
    /// `amqp:resource-limit-exceeded`: a cap reached, idle timeout, stalled credit.
    ResourceLimitExceeded,
    /// `amqp:not-allowed`: protocol or state violation, or a conflict.
    NotAllowed,
    /// `amqp:invalid-field`: a field or property with an invalid value.
    InvalidField,
    /// `amqp:not-implemented`: a well-formed request for an unsupported feature.
    NotImplemented,
    /// `amqp:precondition-failed`: anonymous-terminus `to` missing, invalid or unreachable.
    PreconditionFailed,
    /// `amqp:link:message-size-exceeded`: message over `MaxMessageSize`.
    MessageSizeExceeded,
    /// `amqp:session:window-violation`: transfer beyond the session incoming window.
    WindowViolation,
    /// `amqp:session:errant-link`: unknown handle, handle in use, duplicate channel.
    ErrantLink,
    /// `amqp:connection:forced`: server-initiated close (shutdown, broker down).
    ConnectionForced,
}

/// Every condition, in the order of ERR-1's table, so tests can assert across layers.
pub const ALL_CONDITIONS: [Condition; 13] = [
    Condition::InternalError,
    Condition::NotFound,
    Condition::UnauthorizedAccess,
    Condition::DecodeError,
    Condition::ResourceLimitExceeded,
    Condition::NotAllowed,
    Condition::InvalidField,
    Condition::NotImplemented,
    Condition::PreconditionFailed,
    Condition::MessageSizeExceeded,
    Condition::WindowViolation,
    Condition::ErrantLink,
    Condition::ConnectionForced,
];

impl Condition {
    /// The AMQP symbol sent on the wire.
    pub fn symbol(self) -> &'static str {
        match self {
            Condition::InternalError => "amqp:internal-error",
            Condition::NotFound => "amqp:not-found",
            Condition::UnauthorizedAccess => "amqp:unauthorized-access",
            Condition::DecodeError => "amqp:decode-error",
            Condition::ResourceLimitExceeded => "amqp:resource-limit-exceeded",
            Condition::NotAllowed => "amqp:not-allowed",
            Condition::InvalidField => "amqp:invalid-field",
            Condition::NotImplemented => "amqp:not-implemented",
            Condition::PreconditionFailed => "amqp:precondition-failed",
            Condition::MessageSizeExceeded => "amqp:link:message-size-exceeded",
            Condition::WindowViolation => "amqp:session:window-violation",
            Condition::ErrantLink => "amqp:session:errant-link",
            Condition::ConnectionForced => "amqp:connection:forced",
        }
    }

    /// The condition for a symbol, if it is one of ours.
    pub fn from_symbol(s: &str) -> Option<Condition> {
        ALL_CONDITIONS.into_iter().find(|c| c.symbol() == s)
    }
}

/// Longest description ever put on the wire (ERR-3), in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 512;

/// An error as the connector reports it: a condition and an optional, already sanitized text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpError {
    /// The condition symbol.
    pub condition: Condition,
    /// Human-readable text, at most 512 characters (ERR-3).
    pub description: Option<String>,
}

impl AmqpError {
    /// An error with a description, cut to 512 characters on a character boundary.
    pub fn new(condition: Condition, description: impl Into<String>) -> Self {
        let mut d: String = description.into();
        if let Some((idx, _)) = d.char_indices().nth(MAX_DESCRIPTION_CHARS) {
            d.truncate(idx);
        }
        AmqpError {
            condition,
            description: Some(d),
        }
    }

    /// An error without a description.
    pub fn bare(condition: Condition) -> Self {
        AmqpError {
            condition,
            description: None,
        }
    }

    /// The fe2o3 wire form.
    pub fn to_wire(&self) -> WireError {
        WireError::new(
            ErrorCondition::Custom(Symbol::from(self.condition.symbol())),
            self.description.clone(),
            None,
        )
    }
}

impl std::fmt::Display for AmqpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.description {
            Some(d) => write!(f, "{}: {}", self.condition.symbol(), d),
            None => f.write_str(self.condition.symbol()),
        }
    }
}

/// The condition symbol of an error as it was on the wire.
pub(crate) fn wire_symbol(e: &fe2o3_amqp_types::definitions::Error) -> String {
    match serde_amqp::to_value(&e.condition) {
        Ok(serde_amqp::Value::Symbol(s)) => s.0,
        _ => format!("{:?}", e.condition),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ERR-1: thirteen distinct conditions, each round-tripping through its symbol.
    #[test]
    fn err_1_thirteen_distinct_conditions() {
        let mut syms: Vec<_> = ALL_CONDITIONS.iter().map(|c| c.symbol()).collect();
        syms.sort();
        syms.dedup();
        assert_eq!(syms.len(), 13);
        for c in ALL_CONDITIONS {
            assert_eq!(Condition::from_symbol(c.symbol()), Some(c));
        }
        assert_eq!(Condition::from_symbol("amqp:link:stolen"), None);
    }

    /// ERR-3: descriptions are cut to 512 characters without splitting a UTF-8 character.
    #[test]
    fn err_3_description_truncated_on_char_boundary() {
        let e = AmqpError::new(Condition::InternalError, "é".repeat(600));
        let d = e.description.unwrap();
        assert_eq!(d.chars().count(), 512);
        assert!(d.len() > 512);
    }
}
