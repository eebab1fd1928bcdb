//! The requester's side of RPC (RPC-1 … RPC-8): a message on `commands/<ch>` or `queries/<ch>`
//! becomes a KubeMQ request with the timeout its ttl asks for, and the response, a failure or a
//! timeout becomes the reply delivered on the requester's dynamic node.

use std::time::Duration;

use serde_amqp::Value;

use super::super::envelope::{stamped_egress, DeliveryInfo, Stamps, Stored};
use crate::backend::BackendError;
use crate::engine::AmqpError;
use crate::kubemq::request::RequestType;
use crate::kubemq::{Request, Response};
use crate::pattern::Pattern;

/// Application-property of a command reply: whether the responder executed it (RPC-7).
pub const EXECUTED: &str = "x-opt-kubemq-executed";
/// Application-property of a command reply: the error text, when there is one (RPC-7).
pub const ERROR: &str = "x-opt-kubemq-error";

/// The timeout of a request (RPC-3): its ttl clamped to [1 s, 10 × the default], or the default
/// without one.
pub fn timeout(ttl_ms: Option<u32>, default: Duration) -> Duration {
    match ttl_ms {
        Some(ms) => {
            Duration::from_millis(u64::from(ms)).clamp(Duration::from_secs(1), default * 10)
        }
        None => default,
    }
}

/// A request waiting for its response: where its reply goes and what it is correlated by.
#[derive(Debug, Clone)]
pub struct Asked {
    /// The call's number on its connection.
    pub call: u64,
    /// Commands or queries.
    pub pattern: Pattern,
    /// The requester's dynamic node (its `reply-to`).
    pub reply_to: String,
    /// The request's correlation-id, or its message-id (RPC-6).
    pub correlation: Option<Value>,
}

/// The KubeMQ request for a stored message.
pub fn request(
    pattern: Pattern,
    channel: String,
    client_id: &str,
    stored: Stored,
    timeout: Duration,
) -> Request {
    let kind = if pattern == Pattern::Commands {
        RequestType::Command
    } else {
        RequestType::Query
    };
    Request {
        request_id: crate::kubemq::new_id(),
        request_type_data: kind as i32,
        client_id: client_id.to_string(),
        channel,
        metadata: stored.metadata,
        body: stored.body.to_vec(),
        timeout: i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX),
        tags: stored.trace_tags,
        ..Default::default()
    }
}

/// The reply to deliver for a request's outcome, or `None` when nothing is delivered (a query
/// that failed or timed out, RPC-8).
pub fn reply(asked: &Asked, outcome: &Result<Response, BackendError>) -> Option<Vec<u8>> {
    // The correlation is stamped only when the request had one (RPC-6).
    let mut props = [
        ("to", Value::String(asked.reply_to.clone())),
        (
            "correlation_id",
            asked.correlation.clone().unwrap_or_default(),
        ),
    ];
    let stamped = if asked.correlation.is_some() { 2 } else { 1 };
    let props = props.get_mut(..stamped).unwrap_or_default();
    let tags = std::collections::HashMap::new();
    let info = DeliveryInfo { receive_count: 1 };
    match (asked.pattern, outcome) {
        (Pattern::Commands, outcome) => {
            // RPC-7: the outcome, never data; a failure or a timeout is `executed = false`.
            let (executed, error) = match outcome {
                Ok(r) => (r.executed, r.error.clone()),
                Err(e) => (false, error_text(e)),
            };
            let with_error = !error.is_empty();
            let mut app = [
                (EXECUTED, Value::Bool(executed)),
                (ERROR, Value::String(error)),
            ];
            let stamps = Stamps {
                props,
                app: app
                    .get_mut(..if with_error { 2 } else { 1 })
                    .unwrap_or_default(),
            };
            Some(stamped_egress("", stamps, &[], &tags, info))
        }
        (_, Ok(r)) => {
            let stamps = Stamps {
                props,
                app: &mut [],
            };
            Some(stamped_egress(&r.metadata, stamps, &r.body, &tags, info))
        }
        (_, Err(_)) => None,
    }
}

/// A failed request's text for its command reply (OP-RPC-4): KubeMQ's own (`Error 301: timeout
/// for request message` for a timeout), within ERR-3's length.
fn error_text(e: &BackendError) -> String {
    let text = match e {
        BackendError::Unauthorized(_) => crate::auth::refused_by_kubemq().description,
        e => Some(e.to_string()),
    };
    AmqpError::new(
        crate::engine::Condition::InternalError,
        text.unwrap_or_default(),
    )
    .description
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RPC-3: ttl clamped to [1 s, 10 × default]; the default without a ttl.
    #[test]
    fn rpc_3_timeout_from_ttl() {
        let d = Duration::from_secs(30);
        assert_eq!(timeout(None, d), d);
        assert_eq!(timeout(Some(200), d), Duration::from_secs(1));
        assert_eq!(timeout(Some(2_500), d), Duration::from_millis(2_500));
        assert_eq!(timeout(Some(u32::MAX), d), Duration::from_secs(300));
    }
}
