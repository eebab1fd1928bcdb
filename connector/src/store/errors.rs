//! Why the store refuses what it refuses, in KubeMQ's words (KMQ-4, KMQ-7, 5.1), and KubeMQ's
//! validation rules. Clients branch on the `Error NNN` code; where the reference's exact wording
//! is not documented (133, 134, 135) the text is ours and says so in docs/decisions.md.

use super::seq::Seq;
use crate::kubemq::request::RequestType;

/// Largest ExpirationSeconds and DelaySeconds (KMQ-9).
pub const MAX_POLICY_SECONDS: i32 = 43_200;
/// Largest MaxReceiveCount, and the value 0 is replaced with.
pub const MAX_RECEIVE_COUNT: i32 = 1024;

/// Why the store refused or failed an operation. `Display` is KubeMQ's wording, exactly (the
/// text a client of the façade sees and may branch on); [`StoreError::code`] is its number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// `Error 101`.
    #[error("Error 101: invalid clientID value, cannot be empty")]
    ClientIdEmpty,
    /// `Error 102`.
    #[error("Error 102: invalid channel value, cannot be empty")]
    ChannelEmpty,
    /// `Error 107`.
    #[error("Error 107: invalid channel value, no wildcards are allowed")]
    ChannelWildcards,
    /// `Error 108`.
    #[error("Error 108: invalid channel value, no white spaces are allowed")]
    ChannelWhitespace,
    /// `Error 109`: a request's Timeout ≤ 0.
    #[error("Error 109: invalid timeout value, must be greater than 0")]
    RequestTimeoutInvalid,
    /// `Error 110`.
    #[error("Error 110: invalid message, cannot be empty")]
    MessageEmpty,
    /// `Error 111`.
    #[error("Error 111: invalid subscription type, cannot be undefined or 0")]
    SubscriptionTypeUndefined,
    /// `Error 112`.
    #[error(
        "Error 112: invalid subscription type start at sequence value, cannot by 0 or negative"
    )]
    StartSequenceInvalid,
    /// `Error 113`.
    #[error("Error 113: invalid subscription type start at time value, cannot by 0 or negative")]
    StartTimeInvalid,
    /// `Error 114`.
    #[error(
        "Error 114: invalid subscription type start at time delta value, cannot by 0 or negative"
    )]
    StartDeltaInvalid,
    /// `Error 115`: a request's Metadata and Body both empty.
    #[error("Error 115: invalid request, metadata and body cannot both be empty")]
    RequestEmpty,
    /// `Error 116`: a CacheKey without a CacheTTL.
    #[error("Error 116: invalid cache ttl value, must be greater than 0 when a cache key is set")]
    RequestCacheTtl,
    /// `Error 117`: a response without a RequestID.
    #[error("Error 117: invalid request id value, cannot be empty")]
    ResponseRequestIdEmpty,
    /// `Error 118`.
    #[error("Error 118: event store parameters were set but subscribe type is not event store")]
    NotEventsStore,
    /// `Error 119`.
    #[error("Error 119: invalid channel value, cannot end with `.`")]
    ChannelTrailingDot,
    /// `Error 120`.
    #[error(
        "Error 120: invalid queue name value, cannot be empty, contains wildcards ,white spaces and end with dot"
    )]
    QueueNameInvalid,
    /// `Error 121`.
    #[error("Error 121: cannot subscribe to a queue")]
    CannotSubscribe,
    /// `Error 133` (our wording).
    #[error("Error 133: invalid queue message expiration seconds, must be between 0 and 43200")]
    ExpirationInvalid,
    /// `Error 134` (our wording).
    #[error("Error 134: invalid queue message max receive count, must be between 0 and 1024")]
    MaxReceiveInvalid,
    /// `Error 135` (our wording).
    #[error("Error 135: invalid queue message delay seconds, must be between 0 and 43200")]
    DelayInvalid,
    /// `Error 206`: neither a command nor a query.
    #[error("Error 206: invalid request type")]
    RequestTypeInvalid,
    /// `Error 207`.
    #[error("Error 207: invalid subscribe type")]
    SubscribeTypeInvalid,
    /// `Error 301`: no response within the request's Timeout (also with no responder at all).
    #[error("Error 301: timeout for request message")]
    RequestTimeout,
    /// `Error 500`: the write that held the message failed.
    #[error("Error 500: storage failure: {0}")]
    Storage(String),
    /// An events-store ClientID outside `[A-Za-z0-9_-]+` (the broker's text).
    #[error("stan: invalid clientID: only alphanumeric and `-` or `_` characters allowed")]
    StreamClientIdInvalid,
    /// A second live events-store subscription with one ClientID (the broker's text).
    #[error("stan: clientID already registered")]
    StreamClientIdTaken,
    /// A channel or group the store cannot keep (the broker's rules: no leading `.`, no empty
    /// token, no `/`, no `:` with a group); KubeMQ loses such events silently, the store refuses.
    #[error("stan: invalid subject")]
    StreamChannelInvalid,
    /// The write of an events-store event failed.
    #[error("events-store write failed: {0}")]
    StreamWrite(String),
    /// The store stopped while an events-store event was being written.
    #[error("events-store write abandoned")]
    StreamWriteAbandoned,
    /// A NAck of a locked message failed.
    #[error("nack message with seq {seq} failed, {why}")]
    Nack {
        /// The message.
        seq: Seq,
        /// Why.
        why: String,
    },
    /// A ReQueue of a locked message failed.
    #[error("re-queue message with seq {seq} failed, {why}")]
    Requeue {
        /// The message.
        seq: Seq,
        /// Why.
        why: String,
    },
}

impl StoreError {
    /// KubeMQ's number for the error (`Error NNN`), if it has one.
    pub fn code(&self) -> Option<u16> {
        Some(match self {
            StoreError::ClientIdEmpty => 101,
            StoreError::ChannelEmpty => 102,
            StoreError::ChannelWildcards => 107,
            StoreError::ChannelWhitespace => 108,
            StoreError::RequestTimeoutInvalid => 109,
            StoreError::MessageEmpty => 110,
            StoreError::SubscriptionTypeUndefined => 111,
            StoreError::StartSequenceInvalid => 112,
            StoreError::StartTimeInvalid => 113,
            StoreError::StartDeltaInvalid => 114,
            StoreError::RequestEmpty => 115,
            StoreError::RequestCacheTtl => 116,
            StoreError::ResponseRequestIdEmpty => 117,
            StoreError::NotEventsStore => 118,
            StoreError::ChannelTrailingDot => 119,
            StoreError::QueueNameInvalid => 120,
            StoreError::CannotSubscribe => 121,
            StoreError::ExpirationInvalid => 133,
            StoreError::MaxReceiveInvalid => 134,
            StoreError::DelayInvalid => 135,
            StoreError::RequestTypeInvalid => 206,
            StoreError::SubscribeTypeInvalid => 207,
            StoreError::RequestTimeout => 301,
            StoreError::Storage(_) => 500,
            StoreError::StreamClientIdInvalid
            | StoreError::StreamClientIdTaken
            | StoreError::StreamChannelInvalid
            | StoreError::StreamWrite(_)
            | StoreError::StreamWriteAbandoned
            | StoreError::Nack { .. }
            | StoreError::Requeue { .. } => return None,
        })
    }
}

/// Why a request on a downstream transaction was refused (4.3.4); `Display` is KubeMQ's wording,
/// trailing spaces and typos included.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    /// Any op on a transaction this stream does not know.
    #[error("transaction is completed or transaction id not found")]
    NotFound,
    /// Ack on a closed transaction.
    #[error("cannot ack messages with closed response ")]
    AckClosed,
    /// NAck on a closed transaction.
    #[error("cannot nack messages with closed response ")]
    NackClosed,
    /// ReQueueRange on a closed transaction.
    #[error("cannot requeue messages with closed response ")]
    RequeueClosed,
    /// ActiveOffsets on a closed transaction.
    #[error("cannot get active offsets with closed response ")]
    OffsetsClosed,
    /// AckRange with no sequences.
    #[error("cannot ack empty list of of offsets")]
    AckEmpty,
    /// NAckRange with no sequences.
    #[error("cannot nack empty list of of offsets")]
    NackEmpty,
    /// ReQueueRange with no sequences.
    #[error("cannot requeue empty list of of offsets")]
    RequeueEmpty,
    /// ReQueue without a destination.
    #[error("cannot requeue messages with empty channel destination ")]
    RequeueNoChannel,
    /// AckRange or ReQueueRange naming a sequence the transaction does not hold.
    #[error("invalid ack sequence id {0}")]
    InvalidAckSequence(i64),
    /// NAckRange naming a sequence the transaction does not hold.
    #[error("invalid nack sequence id {0}")]
    InvalidNackSequence(i64),
    /// Unsupported request types.
    #[error("request unknown")]
    Unknown,
    /// A NAck or ReQueue the store could not carry out.
    #[error("{0}")]
    Store(StoreError),
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

/// Checks a request as KubeMQ does (4.7 step 2): ClientID, channel, Timeout, the empty-request
/// rule, the cache fields, then the type.
pub fn request_validation(r: &crate::kubemq::Request) -> Result<RequestKind, StoreError> {
    if r.client_id.is_empty() {
        return Err(StoreError::ClientIdEmpty);
    }
    channel_rules(&r.channel, false)?;
    if r.timeout <= 0 {
        return Err(StoreError::RequestTimeoutInvalid);
    }
    if r.metadata.is_empty() && r.body.is_empty() {
        return Err(StoreError::RequestEmpty);
    }
    if !r.cache_key.is_empty() && r.cache_ttl <= 0 {
        return Err(StoreError::RequestCacheTtl);
    }
    RequestKind::of(r.request_type_data).ok_or(StoreError::RequestTypeInvalid)
}

/// Checks a response as KubeMQ does (4.7 step 4): ClientID, reply address, RequestID.
pub fn response_validation(r: &crate::kubemq::Response) -> Result<(), StoreError> {
    if r.client_id.is_empty() {
        return Err(StoreError::ClientIdEmpty);
    }
    if r.reply_channel.is_empty() {
        return Err(StoreError::ChannelEmpty);
    }
    if r.request_id.is_empty() {
        return Err(StoreError::ResponseRequestIdEmpty);
    }
    Ok(())
}

/// Checks an event send as KubeMQ does (4.5): ClientID, channel, then the empty-message rule.
pub fn event_validation(e: &crate::kubemq::Event) -> Result<(), StoreError> {
    if e.client_id.is_empty() {
        return Err(StoreError::ClientIdEmpty);
    }
    channel_rules(&e.channel, false)?;
    if e.metadata.is_empty() && e.body.is_empty() {
        return Err(StoreError::MessageEmpty);
    }
    Ok(())
}

/// Checks a subscription's ClientID and channel as KubeMQ does (4.5, 4.6).
pub fn subscribe_channel(
    client_id: &str,
    channel: &str,
    kind: SubscribeKind,
) -> Result<(), StoreError> {
    if client_id.is_empty() {
        return Err(StoreError::ClientIdEmpty);
    }
    channel_rules(channel, kind != SubscribeKind::EventsStore)
}

fn channel_rules(channel: &str, wildcards: bool) -> Result<(), StoreError> {
    if channel.is_empty() {
        return Err(StoreError::ChannelEmpty);
    }
    if channel.ends_with('.') {
        return Err(StoreError::ChannelTrailingDot);
    }
    if channel.chars().any(char::is_whitespace) {
        return Err(StoreError::ChannelWhitespace);
    }
    if !wildcards && channel.contains(['*', '>']) {
        return Err(StoreError::ChannelWildcards);
    }
    Ok(())
}

/// Whether `s` is a valid events-store ClientID: `[A-Za-z0-9_-]+`.
pub fn valid_stream_client_id(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One of each refusal, for tests that hold every one to a rule.
#[cfg(test)]
pub(crate) fn every_refusal() -> Vec<StoreError> {
    use StoreError::*;
    vec![
        ClientIdEmpty,
        ChannelEmpty,
        ChannelWildcards,
        ChannelWhitespace,
        RequestTimeoutInvalid,
        MessageEmpty,
        SubscriptionTypeUndefined,
        StartSequenceInvalid,
        StartTimeInvalid,
        StartDeltaInvalid,
        RequestEmpty,
        RequestCacheTtl,
        ResponseRequestIdEmpty,
        NotEventsStore,
        ChannelTrailingDot,
        QueueNameInvalid,
        CannotSubscribe,
        ExpirationInvalid,
        MaxReceiveInvalid,
        DelayInvalid,
        RequestTypeInvalid,
        SubscribeTypeInvalid,
        RequestTimeout,
        Storage("disk full".into()),
        StreamClientIdInvalid,
        StreamClientIdTaken,
        StreamChannelInvalid,
        StreamWrite("disk full".into()),
        StreamWriteAbandoned,
        Nack {
            seq: Seq::new(7),
            why: "message not found".into(),
        },
        Requeue {
            seq: Seq::new(7),
            why: "store stopped".into(),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KMQ-7: a refusal's number is the one its text starts with, and a refusal without one
    /// does not look like KubeMQ's numbered errors.
    #[test]
    fn each_refusal_says_its_number() {
        for e in every_refusal() {
            let text = e.to_string();
            match e.code() {
                Some(code) => assert!(text.starts_with(&format!("Error {code}: ")), "{text}"),
                None => assert!(!text.starts_with("Error "), "{text}"),
            }
        }
    }

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
