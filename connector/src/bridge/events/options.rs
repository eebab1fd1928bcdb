//! What a client asks of an events or events-store link in its ATTACH: the consumer group
//! (GRP-1), the start position (SP-1 … SP-7), the selector (SEL-1) and durability (DUR-1).

use fe2o3_amqp_types::definitions::Fields;
use fe2o3_amqp_types::messaging::{Source, TerminusExpiryPolicy};
use serde_amqp::descriptor::Descriptor;
use serde_amqp::Value;

use crate::bridge::selector::Selector;
use crate::engine::{AmqpError, Condition};
use crate::kubemq::subscribe::EventsStoreType;

/// Link property naming the consumer group (GRP-1).
pub const GROUP_PROPERTY: &str = "x-opt-kubemq-group";
/// Link property naming the start position (SP-1).
pub const START_PROPERTY: &str = "x-opt-kubemq-start";
/// The selector filter's key and descriptor name (SEL-1).
pub const SELECTOR_FILTER: &str = "apache.org:selector-filter:string";
/// The selector filter's alias key (SEL-1).
pub const SELECTOR_ALIAS: &str = "jms-selector";
/// The selector filter's numeric descriptor (SEL-1).
pub const SELECTOR_CODE: u64 = 0x0000_468C_0000_0004;

/// An events-store start position as the Subscribe request carries it (SP-3 … SP-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartPosition {
    /// The EventsStoreType.
    pub kind: EventsStoreType,
    /// Its value: a sequence, Unix ns or seconds.
    pub value: i64,
}

impl StartPosition {
    /// Only events stored after the subscription starts (the default).
    pub const NEW_ONLY: StartPosition = StartPosition {
        kind: EventsStoreType::StartNewOnly,
        value: 0,
    };

    /// Reads the `x-opt-kubemq-start` value (SP-2); the refusal names the offending value
    /// (SP-7).
    pub fn parse(text: &str) -> Result<StartPosition, AmqpError> {
        let invalid = |d: String| Err(AmqpError::new(Condition::InvalidField, d));
        let at = |kind, value| Ok(StartPosition { kind, value });
        match text {
            "" | "new-only" => return Ok(StartPosition::NEW_ONLY),
            "first" => return at(EventsStoreType::StartFromFirst, 0),
            "last" => return at(EventsStoreType::StartFromLast, 0),
            _ => {}
        }
        if let Some(seq) = text.strip_prefix("sequence:") {
            return match digits(seq) {
                // Sequences are 1-based: 0 names nothing (OP-ES-4).
                Some(n) if n > 0 => at(EventsStoreType::StartAtSequence, n),
                _ => invalid(format!("invalid start sequence: {}", shown(seq))),
            };
        }
        if let Some(t) = text.strip_prefix("time:") {
            let ns = match rfc3339_ns(t) {
                Some(ns) => Some(ns),
                None => digits(t).and_then(|s| s.checked_mul(1_000_000_000)),
            };
            return match ns {
                Some(ns) if ns > 0 => at(EventsStoreType::StartAtTime, ns),
                _ => invalid(format!("invalid start time: {}", shown(t))),
            };
        }
        if let Some(s) = text.strip_prefix("time-delta:") {
            return match digits(s) {
                Some(n) if n > 0 => at(EventsStoreType::StartAtTimeDelta, n),
                _ => invalid(format!("invalid start time-delta: {}", shown(s))),
            };
        }
        invalid(format!("unknown start position: {}", shown(text)))
    }
}

/// The value as the description shows it: at most 64 characters of it.
fn shown(s: &str) -> String {
    s.chars().take(64).collect()
}

/// `1*DIGIT` as an i64.
fn digits(s: &str) -> Option<i64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// An RFC 3339 date-time as Unix ns (SP-4).
fn rfc3339_ns(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos()).ok()
}

/// The string value of link property `name`; a property of another type is refused.
fn string_property(props: Option<&Fields>, name: &str) -> Result<Option<String>, AmqpError> {
    let Some(v) = props.and_then(|p| p.iter().find(|(k, _)| k.as_str() == name).map(|(_, v)| v))
    else {
        return Ok(None);
    };
    match v {
        Value::String(s) => Ok(Some(s.clone())),
        Value::Symbol(s) => Ok(Some(s.0.clone())),
        Value::Null => Ok(None),
        _ => Err(AmqpError::new(
            Condition::InvalidField,
            format!("{name} must be a string"),
        )),
    }
}

/// The consumer group of GRP-1 (empty: none).
pub fn group(props: Option<&Fields>) -> Result<String, AmqpError> {
    Ok(string_property(props, GROUP_PROPERTY)?.unwrap_or_default())
}

/// The start position of SP-1 (link properties, not source properties).
pub fn start(props: Option<&Fields>) -> Result<StartPosition, AmqpError> {
    match string_property(props, START_PROPERTY)? {
        Some(text) => StartPosition::parse(&text),
        None => Ok(StartPosition::NEW_ONLY),
    }
}

/// Whether the source carries a filter entry (of any key).
pub fn has_filter(source: Option<&Source>) -> bool {
    source
        .and_then(|s| s.filter.as_ref())
        .is_some_and(|f| !f.is_empty())
}

/// The selector of SEL-1: the entry under the selector key or its alias, as a described string
/// under either descriptor (or a plain string, OP-EV-5); other keys are ignored. A malformed
/// selector refuses the attach (SEL-5).
pub fn selector(source: Option<&Source>) -> Result<Option<Selector>, AmqpError> {
    let Some(filter) = source.and_then(|s| s.filter.as_ref()) else {
        return Ok(None);
    };
    let Some((_, v)) = filter
        .iter()
        .find(|(k, _)| k.as_str() == SELECTOR_FILTER || k.as_str() == SELECTOR_ALIAS)
    else {
        return Ok(None);
    };
    let text = match v {
        Value::Described(d) => {
            let known = match &d.descriptor {
                Descriptor::Code(c) => *c == SELECTOR_CODE,
                Descriptor::Name(n) => n.as_str() == SELECTOR_FILTER,
            };
            match (&d.value, known) {
                (Value::String(s), true) => s.clone(),
                _ => {
                    return Err(AmqpError::new(
                        Condition::InvalidField,
                        "invalid selector: the filter is not a selector string",
                    ))
                }
            }
        }
        Value::String(s) => s.clone(),
        _ => {
            return Err(AmqpError::new(
                Condition::InvalidField,
                "invalid selector: the filter is not a selector string",
            ))
        }
    };
    Selector::parse(&text)
        .map(Some)
        .map_err(|e| AmqpError::new(Condition::InvalidField, e.to_string()))
}

/// Whether a consume link asks for a durable subscription (DUR-1): `expiry-policy = never`.
pub fn durable(source: Option<&Source>) -> bool {
    source.is_some_and(|s| s.expiry_policy == TerminusExpiryPolicy::Never)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::messaging::FilterSet;
    use serde_amqp::described::Described;
    use serde_amqp::primitives::Symbol;

    fn source(key: &str, value: Value) -> Source {
        let mut filter = FilterSet::new();
        filter.insert(Symbol::from(key), value);
        Source::builder().filter(filter).build()
    }

    fn described(descriptor: Descriptor, text: &str) -> Value {
        Value::Described(Box::new(Described {
            descriptor,
            value: Value::String(text.into()),
        }))
    }

    /// SEL-1, OP-EV-5: both descriptor forms, the alias key and a plain string are read;
    /// another key is ignored; a filter that is not a string refuses the attach.
    #[test]
    fn sel_1_filter_forms() {
        let text = |s: &Source| selector(Some(s)).unwrap().map(|s| s.text().to_string());
        let by_code = source(
            SELECTOR_FILTER,
            described(Descriptor::Code(SELECTOR_CODE), "a = 1"),
        );
        assert_eq!(text(&by_code).as_deref(), Some("a = 1"));
        let by_name = source(
            SELECTOR_ALIAS,
            described(Descriptor::Name(Symbol::from(SELECTOR_FILTER)), "b = 2"),
        );
        assert_eq!(text(&by_name).as_deref(), Some("b = 2"));
        let plain = source(SELECTOR_FILTER, Value::String("c = 3".into()));
        assert_eq!(text(&plain).as_deref(), Some("c = 3"));
        let other = source(
            "selector",
            described(Descriptor::Code(SELECTOR_CODE), "d = 4"),
        );
        assert_eq!(text(&other), None);
        let wrong = source(SELECTOR_FILTER, Value::Long(1));
        assert_eq!(
            selector(Some(&wrong)).unwrap_err().condition,
            Condition::InvalidField
        );
    }

    fn err(text: &str) -> String {
        StartPosition::parse(text)
            .unwrap_err()
            .description
            .unwrap_or_default()
    }

    /// SP-2 … SP-5: every form, the units handed to the broker, and RFC 3339 = Unix seconds.
    #[test]
    fn sp_2_start_grammar() {
        let p = |t: &str| StartPosition::parse(t).unwrap();
        assert_eq!(p(""), StartPosition::NEW_ONLY);
        assert_eq!(p("new-only"), StartPosition::NEW_ONLY);
        assert_eq!(p("first").kind, EventsStoreType::StartFromFirst);
        assert_eq!(p("last").kind, EventsStoreType::StartFromLast);
        assert_eq!(
            p("sequence:4"),
            StartPosition {
                kind: EventsStoreType::StartAtSequence,
                value: 4
            }
        );
        let rfc = p("time:2024-01-02T03:04:05Z");
        let secs = p("time:1704164645");
        assert_eq!(rfc, secs, "SP-4: the same instant either way");
        assert_eq!(rfc.value, 1_704_164_645_000_000_000, "SP-4: nanoseconds");
        assert_eq!(
            p("time-delta:3600"),
            StartPosition {
                kind: EventsStoreType::StartAtTimeDelta,
                value: 3600
            },
            "SP-5: seconds, unchanged"
        );
    }

    /// SP-7: malformed values refuse the attach naming the value.
    #[test]
    fn sp_7_malformed_values() {
        assert_eq!(err("sequence:abc"), "invalid start sequence: abc");
        assert_eq!(err("sequence:-1"), "invalid start sequence: -1");
        assert_eq!(err("sequence:0"), "invalid start sequence: 0");
        assert_eq!(err("time:not-a-time"), "invalid start time: not-a-time");
        assert_eq!(err("time-delta:nope"), "invalid start time-delta: nope");
        assert_eq!(err("time-delta:-5"), "invalid start time-delta: -5");
        assert_eq!(err("whenever"), "unknown start position: whenever");
        // SP-8: there is no "last N" form.
        assert_eq!(err("last:5"), "unknown start position: last:5");
        let e = StartPosition::parse("whenever").unwrap_err();
        assert_eq!(e.condition, Condition::InvalidField);
    }
}
