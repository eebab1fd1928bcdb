//! Address resolution (ADDR-*): a terminus address or a per-message `to` becomes a KubeMQ
//! `(pattern, channel)`, an RPC reply token, or a refusal with `amqp:not-found`.

use crate::engine::{AmqpError, Condition};
use crate::pattern::Pattern;

/// What an address resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// A KubeMQ channel of a pattern.
    Node {
        /// The pattern.
        pattern: Pattern,
        /// The channel, verbatim (ADDR-5).
        channel: String,
    },
    /// `responses/<RequestID>`: an RPC reply token (ADDR-10), validated later by the RPC layer.
    Response {
        /// The opaque RequestID.
        request_id: String,
    },
}

/// Why an address does not resolve; every one is `amqp:not-found` (ADDR-6, ADDR-7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressError {
    /// No known prefix, and a `/` in the address (ADDR-7).
    UnknownPrefix,
    /// The channel breaks a rule of ADDR-6; the text is the rule's reason.
    InvalidChannel(&'static str),
    /// An empty address that is neither dynamic nor anonymous (OP-ADDR-9).
    EmptyAddress,
    /// `responses/` with nothing after it (ADDR-10).
    EmptyRequestId,
}

impl AddressError {
    /// The description sent on the DETACH.
    pub fn description(self) -> &'static str {
        match self {
            AddressError::UnknownPrefix => "unknown address prefix",
            AddressError::InvalidChannel(reason) => reason,
            AddressError::EmptyAddress => "empty address",
            AddressError::EmptyRequestId => "empty request id",
        }
    }

    /// The AMQP error: always `amqp:not-found`.
    pub fn to_amqp(self) -> AmqpError {
        AmqpError::new(Condition::NotFound, self.description())
    }
}

/// Longest channel, in characters (ADDR-6, OP-ADDR-2).
pub const MAX_CHANNEL_CHARS: usize = 255;

/// Prefixes in the order they are tried (ADDR-4): `events-store/` before `events/`.
const PREFIXES: [(&str, Option<Pattern>); 6] = [
    ("events-store/", Some(Pattern::EventsStore)),
    ("queues/", Some(Pattern::Queues)),
    ("events/", Some(Pattern::Events)),
    ("commands/", Some(Pattern::Commands)),
    ("queries/", Some(Pattern::Queries)),
    ("responses/", None),
];

/// The pattern a bare address gets from the terminus capabilities the client sent (ADDR-8,
/// OP-ADDR-4): `queue` or `temporary-queue` → queues, `topic` or `temporary-topic` → events.
pub fn capability_hint<'a>(capabilities: impl IntoIterator<Item = &'a str>) -> Option<Pattern> {
    capabilities.into_iter().find_map(|c| match c {
        "queue" | "temporary-queue" => Some(Pattern::Queues),
        "topic" | "temporary-topic" => Some(Pattern::Events),
        _ => None,
    })
}

/// Checks a channel against ADDR-6 (stricter than KubeMQ, so an accepted channel is always
/// accepted by the broker) plus what KubeMQ's store rejects beyond ADDR-6's table: `/`
/// (OP-ADDR-1), a leading `.` and an empty segment `..`.
pub fn validate_channel(channel: &str) -> Result<(), AddressError> {
    let bad = |reason| Err(AddressError::InvalidChannel(reason));
    if channel.is_empty() {
        return bad("empty channel");
    }
    if channel.chars().count() > MAX_CHANNEL_CHARS {
        return bad("channel exceeds 255 chars");
    }
    if channel.ends_with('.') {
        return bad("channel has trailing '.'");
    }
    // KubeMQ's store refuses these on send and cannot Get from them (KMQ-8).
    if channel.starts_with('.') {
        return bad("channel has leading '.'");
    }
    if channel.contains("..") {
        return bad("channel has an empty segment '..'");
    }
    if channel.chars().any(char::is_whitespace) {
        return bad("channel contains whitespace");
    }
    if channel.contains(['*', '>']) {
        return bad("channel contains wildcard");
    }
    if channel.contains([';', ':']) {
        return bad("channel contains ';' or ':'");
    }
    if channel.contains('/') {
        return bad("channel contains '/'");
    }
    Ok(())
}

/// Resolves an address (ADDR-3 … ADDR-8, ADDR-10). `hint` is the capability hint for bare
/// addresses, `default` the configured DefaultPattern.
pub fn resolve(
    address: &str,
    hint: Option<Pattern>,
    default: Pattern,
) -> Result<Resolved, AddressError> {
    if address.is_empty() {
        return Err(AddressError::EmptyAddress);
    }
    // ADDR-3: at most one leading slash.
    let stripped = address.strip_prefix('/').unwrap_or(address);
    for (prefix, pattern) in PREFIXES {
        if let Some(rest) = stripped.strip_prefix(prefix) {
            return match pattern {
                Some(pattern) => {
                    validate_channel(rest)?;
                    Ok(Resolved::Node {
                        pattern,
                        channel: rest.to_string(),
                    })
                }
                None if rest.is_empty() => Err(AddressError::EmptyRequestId),
                None => Ok(Resolved::Response {
                    request_id: rest.to_string(),
                }),
            };
        }
    }
    if stripped.contains('/') {
        return Err(AddressError::UnknownPrefix);
    }
    // ADDR-8: a bare address; OP-ADDR-3: its channel obeys ADDR-6 too.
    validate_channel(stripped)?;
    Ok(Resolved::Node {
        pattern: hint.unwrap_or(default),
        channel: stripped.to_string(),
    })
}

/// [`resolve`] for a client receiver: an events channel may also be a KubeMQ wildcard
/// subscription, `*` standing for one `.`-separated token and a last `>` for one or more (KubeMQ
/// accepts them on events subscriptions only; ADDR-6 refuses them everywhere else).
pub fn resolve_subscription(
    address: &str,
    hint: Option<Pattern>,
    default: Pattern,
) -> Result<Resolved, AddressError> {
    let refused = match resolve(address, hint, default) {
        Err(e @ AddressError::InvalidChannel("channel contains wildcard")) => e,
        other => return other,
    };
    let stripped = address.strip_prefix('/').unwrap_or(address);
    let Some(channel) = stripped.strip_prefix("events/") else {
        return Err(refused);
    };
    // Whole-token wildcards, `>` only last, stand in as a plain token for the other rules.
    let tokens: Vec<&str> = channel.split('.').collect();
    let last = tokens.len().saturating_sub(1);
    let masked: Vec<&str> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| match (*t, i == last) {
            ("*", _) | (">", true) => "w",
            _ => t,
        })
        .collect();
    validate_channel(&masked.join("."))?;
    Ok(Resolved::Node {
        pattern: Pattern::Events,
        channel: channel.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wildcards are a subscription's, on events only, and only as whole tokens.
    #[test]
    fn wildcard_subscriptions() {
        let q = Pattern::Queues;
        for ok in ["events/a.*", "events/a.>", "events/*.b.>", "/events/*"] {
            let channel = ok.trim_start_matches('/').trim_start_matches("events/");
            assert_eq!(
                resolve_subscription(ok, None, q),
                node(Pattern::Events, channel),
                "{ok}"
            );
        }
        let wildcard = Err(AddressError::InvalidChannel("channel contains wildcard"));
        for bad in [
            "events/a*",
            "events/a.>.b",
            "queues/a.*",
            "events-store/a.*",
        ] {
            assert_eq!(resolve_subscription(bad, None, q), wildcard, "{bad}");
        }
        assert_eq!(resolve("events/a.*", None, q), wildcard, "not for senders");
    }

    fn node(p: Pattern, c: &str) -> Result<Resolved, AddressError> {
        Ok(Resolved::Node {
            pattern: p,
            channel: c.into(),
        })
    }

    /// ADDR-22: the normative resolution vectors (the role-dependent ones are the link's job).
    #[test]
    fn addr_22_vectors() {
        let q = Pattern::Queues;
        assert_eq!(
            resolve("queues/orders", None, q),
            node(Pattern::Queues, "orders")
        );
        assert_eq!(
            resolve("/events/telemetry", None, q),
            node(Pattern::Events, "telemetry")
        );
        assert_eq!(
            resolve("events-store/audit", None, q),
            node(Pattern::EventsStore, "audit")
        );
        assert_eq!(
            resolve("commands/dispatch", None, q),
            node(Pattern::Commands, "dispatch")
        );
        assert_eq!(
            resolve("queries/status", None, q),
            node(Pattern::Queries, "status")
        );
        assert_eq!(
            resolve("responses/abc123", None, q),
            Ok(Resolved::Response {
                request_id: "abc123".into()
            })
        );
        assert_eq!(
            resolve("orders", capability_hint(["queue"]), Pattern::Events),
            node(Pattern::Queues, "orders")
        );
        assert_eq!(
            resolve("orders", capability_hint(["topic"]), q),
            node(Pattern::Events, "orders")
        );
        assert_eq!(resolve("orders", None, q), node(Pattern::Queues, "orders"));
        assert_eq!(
            resolve("bogus/prefix/x", None, q),
            Err(AddressError::UnknownPrefix)
        );
        assert_eq!(
            resolve("//queues/orders", None, q),
            Err(AddressError::UnknownPrefix),
            "ADDR-3: one slash only"
        );
        assert_eq!(
            resolve("Queues/x", None, q),
            Err(AddressError::UnknownPrefix),
            "ADDR-2: case-sensitive"
        );
        assert_eq!(
            resolve("queues/", None, q),
            Err(AddressError::InvalidChannel("empty channel"))
        );
        assert_eq!(
            resolve("queues/orders.", None, q),
            Err(AddressError::InvalidChannel("channel has trailing '.'"))
        );
        assert_eq!(
            resolve("queues/my orders", None, q),
            Err(AddressError::InvalidChannel("channel contains whitespace"))
        );
        // What KubeMQ's store refuses on send, and cannot Get from, is refused here too.
        for w in ["queues/.orders", "events-store/.a.b", ".orders"] {
            assert_eq!(
                resolve(w, None, q),
                Err(AddressError::InvalidChannel("channel has leading '.'")),
                "{w}"
            );
        }
        for w in ["queues/a..b", "commands/x...y"] {
            assert_eq!(
                resolve(w, None, q),
                Err(AddressError::InvalidChannel(
                    "channel has an empty segment '..'"
                )),
                "{w}"
            );
        }
        assert_eq!(
            resolve("queues/a\tb", None, q),
            Err(AddressError::InvalidChannel("channel contains whitespace"))
        );
        for w in ["queues/orders.*", "queues/a>b"] {
            assert_eq!(
                resolve(w, None, q),
                Err(AddressError::InvalidChannel("channel contains wildcard"))
            );
        }
        for w in ["queues/a:b", "events/x;y"] {
            assert_eq!(
                resolve(w, None, q),
                Err(AddressError::InvalidChannel("channel contains ';' or ':'"))
            );
        }
        let long = "x".repeat(256);
        assert_eq!(
            resolve(&format!("queues/{long}"), None, q),
            Err(AddressError::InvalidChannel("channel exceeds 255 chars"))
        );
        assert!(resolve(&format!("queues/{}", &long[..255]), None, q).is_ok());
    }

    /// ADDR-4: `events-store/` is never read as `events`; ADDR-5: the channel is verbatim.
    /// ADDR-21: the examples' and the burn-in's dotted channel names are channels like any other.
    #[test]
    fn addr_21_dotted_channel_names() {
        let q = Pattern::Queues;
        for ch in ["amqp10.examples.orders", "amqp10.burnin.w1.0042"] {
            assert_eq!(
                resolve(&format!("queues/{ch}"), None, q),
                node(Pattern::Queues, ch)
            );
            assert_eq!(resolve(ch, None, q), node(Pattern::Queues, ch));
        }
    }

    #[test]
    fn addr_4_5_prefix_order_and_verbatim_channel() {
        assert_eq!(
            resolve("events-store/a.b-c_D", None, Pattern::Queues),
            node(Pattern::EventsStore, "a.b-c_D")
        );
        assert_eq!(
            resolve("queues/amqp.vhost.q", None, Pattern::Queues),
            node(Pattern::Queues, "amqp.vhost.q")
        );
    }

    /// OP-ADDR-1/2/3/4/9 decisions.
    #[test]
    fn open_point_decisions() {
        let q = Pattern::Queues;
        assert_eq!(
            resolve("queues/a/b", None, q),
            Err(AddressError::InvalidChannel("channel contains '/'"))
        );
        assert!(
            resolve(&format!("queues/{}", "é".repeat(255)), None, q).is_ok(),
            "255 characters, not bytes"
        );
        assert_eq!(
            resolve("queues/a\u{a0}b", None, q),
            Err(AddressError::InvalidChannel("channel contains whitespace"))
        );
        assert_eq!(
            resolve("bad*", None, q),
            Err(AddressError::InvalidChannel("channel contains wildcard")),
            "bare channels obey ADDR-6"
        );
        assert_eq!(capability_hint(["temporary-topic"]), Some(Pattern::Events));
        assert_eq!(
            capability_hint(["shared", "temporary-queue"]),
            Some(Pattern::Queues)
        );
        assert_eq!(capability_hint(["shared"]), None);
        assert_eq!(resolve("", None, q), Err(AddressError::EmptyAddress));
        assert_eq!(
            resolve("responses/", None, q),
            Err(AddressError::EmptyRequestId)
        );
        assert_eq!(
            AddressError::UnknownPrefix.to_amqp().condition,
            Condition::NotFound
        );
    }
}
