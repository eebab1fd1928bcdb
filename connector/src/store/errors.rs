//! KubeMQ's error texts for the queue operations the store implements (KMQ-4, KMQ-7,
//! 5.1). Clients branch on the `Error NNN` code; where the reference's exact wording is not
//! documented (133, 134, 135) the text is ours and says so in docs/decisions.md.

use crate::kubemq::request::RequestType;

/// Largest ExpirationSeconds and DelaySeconds (KMQ-9).
pub const MAX_POLICY_SECONDS: i32 = 43_200;
/// Largest MaxReceiveCount, and the value 0 is replaced with.
pub const MAX_RECEIVE_COUNT: i32 = 1024;

/// `Error 101`.
pub const CLIENT_ID_EMPTY: &str = "Error 101: invalid clientID value, cannot be empty";
/// `Error 120`.
pub const QUEUE_NAME_INVALID: &str =
    "Error 120: invalid queue name value, cannot be empty, contains wildcards ,white spaces and end with dot";
/// `Error 110`.
pub const MESSAGE_EMPTY: &str = "Error 110: invalid message, cannot be empty";
/// `Error 121`.
pub const CANNOT_SUBSCRIBE: &str = "Error 121: cannot subscribe to a queue";
/// `Error 133` (our wording).
pub const EXPIRATION_INVALID: &str =
    "Error 133: invalid queue message expiration seconds, must be between 0 and 43200";
/// `Error 134` (our wording).
pub const MAX_RECEIVE_INVALID: &str =
    "Error 134: invalid queue message max receive count, must be between 0 and 1024";
/// `Error 135` (our wording).
pub const DELAY_INVALID: &str =
    "Error 135: invalid queue message delay seconds, must be between 0 and 43200";

/// `Error 102`.
pub const CHANNEL_EMPTY: &str = "Error 102: invalid channel value, cannot be empty";
/// `Error 107`.
pub const CHANNEL_WILDCARDS: &str = "Error 107: invalid channel value, no wildcards are allowed";
/// `Error 108`.
pub const CHANNEL_WHITESPACE: &str =
    "Error 108: invalid channel value, no white spaces are allowed";
/// `Error 111`.
pub const SUBSCRIPTION_TYPE_UNDEFINED: &str =
    "Error 111: invalid subscription type, cannot be undefined or 0";
/// `Error 112`.
pub const START_SEQUENCE_INVALID: &str =
    "Error 112: invalid subscription type start at sequence value, cannot by 0 or negative";
/// `Error 113`.
pub const START_TIME_INVALID: &str =
    "Error 113: invalid subscription type start at time value, cannot by 0 or negative";
/// `Error 114`.
pub const START_DELTA_INVALID: &str =
    "Error 114: invalid subscription type start at time delta value, cannot by 0 or negative";
/// `Error 118`.
pub const NOT_EVENTS_STORE: &str =
    "Error 118: event store parameters were set but subscribe type is not event store";
/// `Error 119`.
pub const CHANNEL_TRAILING_DOT: &str = "Error 119: invalid channel value, cannot end with `.`";
/// `Error 207`.
pub const SUBSCRIBE_TYPE_INVALID: &str = "Error 207: invalid subscribe type";
/// An events-store ClientID outside `[A-Za-z0-9_-]+` (the broker's text).
pub const STREAM_CLIENT_ID_INVALID: &str =
    "stan: invalid clientID: only alphanumeric and `-` or `_` characters allowed";
/// A second live events-store subscription with one ClientID (the broker's text).
pub const STREAM_CLIENT_ID_TAKEN: &str = "stan: clientID already registered";
/// A channel or group the store cannot keep (the broker's rules: no leading `.`, no empty
/// token, no `/`, no `:` with a group); KubeMQ loses such events silently, the store refuses.
pub const STREAM_CHANNEL_INVALID: &str = "stan: invalid subject";

/// Transaction errors of 4.3.4, trailing spaces and typos included.
pub mod txn {
    /// Any op on a transaction this stream does not know.
    pub const NOT_FOUND: &str = "transaction is completed or transaction id not found";
    /// Ack on a closed transaction.
    pub const ACK_CLOSED: &str = "cannot ack messages with closed response ";
    /// NAck on a closed transaction.
    pub const NACK_CLOSED: &str = "cannot nack messages with closed response ";
    /// ReQueueRange on a closed transaction.
    pub const REQUEUE_CLOSED: &str = "cannot requeue messages with closed response ";
    /// ActiveOffsets on a closed transaction.
    pub const OFFSETS_CLOSED: &str = "cannot get active offsets with closed response ";
    /// AckRange with no sequences.
    pub const ACK_EMPTY: &str = "cannot ack empty list of of offsets";
    /// NAckRange with no sequences.
    pub const NACK_EMPTY: &str = "cannot nack empty list of of offsets";
    /// ReQueueRange with no sequences.
    pub const REQUEUE_EMPTY: &str = "cannot requeue empty list of of offsets";
    /// ReQueue without a destination.
    pub const REQUEUE_NO_CHANNEL: &str = "cannot requeue messages with empty channel destination ";
    /// Unsupported request types.
    pub const UNKNOWN: &str = "request unknown";
}

/// Whether `name` is a valid queue channel: non-empty, no whitespace, no `*` or `>`, no trailing
/// `.`, and the broker's rules (no leading `.`, no empty token, no `/`) that the reference reports
/// later or loses silently (5.1).
pub fn valid_queue_name(name: &str) -> bool {
    !name.is_empty()
        && !name.ends_with('.')
        && !name.starts_with('.')
        && !name.contains("..")
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c == '*' || c == '>' || c == '/')
}

/// Which subscription a channel is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscribeKind {
    /// Events: wildcards allowed.
    Events,
    /// Events-Store: no wildcards, and the broker's channel rules.
    EventsStore,
    /// Commands and queries: wildcards allowed (KubeMQ does not reject them).
    Requests,
}

/// Which of the two request patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// Commands: the sender gets the outcome only.
    Command,
    /// Queries: the sender gets the responder's data.
    Query,
}

impl RequestKind {
    /// The kind a Request's type names, if it names one.
    pub fn of(request_type: i32) -> Option<RequestKind> {
        match RequestType::try_from(request_type) {
            Ok(RequestType::Command) => Some(RequestKind::Command),
            Ok(RequestType::Query) => Some(RequestKind::Query),
            _ => None,
        }
    }
}

// Commands and queries (4.7). Only the numbers are documented for 109 … 206; the texts follow
// the form of KubeMQ's other validation errors.
/// `Error 109`: Timeout ≤ 0.
pub const REQUEST_TIMEOUT_INVALID: &str =
    "Error 109: invalid timeout value, must be greater than 0";
/// `Error 115`: Metadata and Body both empty.
pub const REQUEST_EMPTY: &str =
    "Error 115: invalid request, metadata and body cannot both be empty";
/// `Error 116`: a CacheKey without a CacheTTL.
pub const REQUEST_CACHE_TTL: &str =
    "Error 116: invalid cache ttl value, must be greater than 0 when a cache key is set";
/// `Error 117`: a response without a RequestID.
pub const RESPONSE_REQUEST_ID_EMPTY: &str = "Error 117: invalid request id value, cannot be empty";
/// `Error 206`: neither a command nor a query.
pub const REQUEST_TYPE_INVALID: &str = "Error 206: invalid request type";
/// `Error 301`: no response within the request's Timeout (also with no responder at all).
pub const REQUEST_TIMEOUT: &str = "Error 301: timeout for request message";

/// Checks a request as KubeMQ does (4.7 step 2): ClientID, channel, Timeout, the empty-request
/// rule, the cache fields, then the type.
pub fn request_validation(r: &crate::kubemq::Request) -> Result<RequestKind, &'static str> {
    if r.client_id.is_empty() {
        return Err(CLIENT_ID_EMPTY);
    }
    channel_rules(&r.channel, false)?;
    if r.timeout <= 0 {
        return Err(REQUEST_TIMEOUT_INVALID);
    }
    if r.metadata.is_empty() && r.body.is_empty() {
        return Err(REQUEST_EMPTY);
    }
    if !r.cache_key.is_empty() && r.cache_ttl <= 0 {
        return Err(REQUEST_CACHE_TTL);
    }
    RequestKind::of(r.request_type_data).ok_or(REQUEST_TYPE_INVALID)
}

/// Checks a response as KubeMQ does (4.7 step 4): ClientID, reply address, RequestID.
pub fn response_validation(r: &crate::kubemq::Response) -> Result<(), &'static str> {
    if r.client_id.is_empty() {
        return Err(CLIENT_ID_EMPTY);
    }
    if r.reply_channel.is_empty() {
        return Err(CHANNEL_EMPTY);
    }
    if r.request_id.is_empty() {
        return Err(RESPONSE_REQUEST_ID_EMPTY);
    }
    Ok(())
}

/// Checks an event send as KubeMQ does (4.5): ClientID, channel, then the empty-message rule.
pub fn event_validation(e: &crate::kubemq::Event) -> Result<(), &'static str> {
    if e.client_id.is_empty() {
        return Err(CLIENT_ID_EMPTY);
    }
    channel_rules(&e.channel, false)?;
    if e.metadata.is_empty() && e.body.is_empty() {
        return Err(MESSAGE_EMPTY);
    }
    Ok(())
}

/// Checks a subscription's ClientID and channel as KubeMQ does (4.5, 4.6).
pub fn subscribe_channel(
    client_id: &str,
    channel: &str,
    kind: SubscribeKind,
) -> Result<(), &'static str> {
    if client_id.is_empty() {
        return Err(CLIENT_ID_EMPTY);
    }
    channel_rules(channel, kind != SubscribeKind::EventsStore)
}

fn channel_rules(channel: &str, wildcards: bool) -> Result<(), &'static str> {
    if channel.is_empty() {
        return Err(CHANNEL_EMPTY);
    }
    if channel.ends_with('.') {
        return Err(CHANNEL_TRAILING_DOT);
    }
    if channel.chars().any(char::is_whitespace) {
        return Err(CHANNEL_WHITESPACE);
    }
    if !wildcards && channel.contains(['*', '>']) {
        return Err(CHANNEL_WILDCARDS);
    }
    Ok(())
}

/// Whether `s` is a valid events-store ClientID: `[A-Za-z0-9_-]+`.
pub fn valid_stream_client_id(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KMQ-8: queue channel rules.
    #[test]
    fn queue_names() {
        for ok in ["orders", "orders.eu-1.created", "a_b-c", "q:x"] {
            assert!(valid_queue_name(ok), "{ok}");
        }
        for bad in ["", "a.", ".a", "a..b", "a b", "a\tb", "a*", "a>", "a/b"] {
            assert!(!valid_queue_name(bad), "{bad:?}");
        }
    }
}
