//! The responder's side of RPC (RPC-11 … RPC-14): requests delivered with a reply token of
//! their own (`/responses/<RequestID>`), the connection's table of tokens awaiting a response,
//! and the KubeMQ response a reply message becomes.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use serde_amqp::Value;

use super::super::envelope::{
    application_properties, stamped_egress, DeliveryInfo, Stamps, Stored,
};
use super::requester::{ERROR, EXECUTED};
use crate::kubemq::{Request, Response};
use crate::pattern::Pattern;
use crate::spans::Traced;

/// How long a token outlives its request's timeout (RPC-14).
pub const GRACE: Duration = Duration::from_secs(5);
/// Expired tokens remembered, so that a reply to one is told from a reply to a token that never
/// existed (RPC-14, MET-11).
const EXPIRED_REMEMBERED: usize = 1024;

/// What the connection must know to answer one delivered request.
#[derive(Debug, Clone)]
struct Token {
    reply_channel: String,
    pattern: Pattern,
    expires: Instant,
    /// The request's trace, when its spans are recorded: the reply's span joins it.
    traced: Option<Box<Traced>>,
}

/// The KubeMQ response a reply makes, with the trace of the request it answers.
#[derive(Debug)]
pub struct Answer {
    /// What goes to KubeMQ.
    pub response: Response,
    /// The request's trace, when its spans are recorded.
    pub traced: Option<Box<Traced>>,
}

/// Why a reply found no request to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRequest {
    /// Its token expired: the request's timeout and the grace period passed (RPC-14).
    Expired,
    /// No request of this connection ever had this token (OP-RPC-5).
    Unknown,
}

/// The tokens of requests this connection's responders received and have not answered.
#[derive(Debug, Default)]
pub struct Tokens {
    live: HashMap<String, Token>,
    expired: HashSet<String>,
    expired_order: VecDeque<String>,
}

impl Tokens {
    /// Tokens awaiting a response.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether none awaits a response.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Records a delivered request of `pattern`, answerable until `expires`, with its trace
    /// when its spans are recorded.
    pub fn insert(
        &mut self,
        request: Request,
        (pattern, traced): (Pattern, Option<Box<Traced>>),
        expires: Instant,
    ) {
        self.live.insert(
            request.request_id,
            Token {
                reply_channel: request.reply_channel,
                pattern,
                expires,
                traced,
            },
        );
    }

    /// Moves the tokens whose time is over to the expired ones; returns the next expiry.
    pub fn expire(&mut self, now: Instant) -> Option<Instant> {
        let over: Vec<String> = self
            .live
            .iter()
            .filter(|(_, t)| t.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in over {
            self.live.remove(&id);
            self.remember_expired(id);
        }
        self.live.values().map(|t| t.expires).min()
    }

    fn remember_expired(&mut self, id: String) {
        if self.expired.insert(id.clone()) {
            self.expired_order.push_back(id);
        }
        while self.expired_order.len() > EXPIRED_REMEMBERED {
            if let Some(old) = self.expired_order.pop_front() {
                self.expired.remove(&old);
            }
        }
    }

    /// Takes the token `request_id` to answer it.
    fn take(&mut self, request_id: &str, now: Instant) -> Result<Token, NoRequest> {
        match self.live.remove(request_id) {
            Some(t) if t.expires > now => Ok(t),
            Some(_) => {
                self.remember_expired(request_id.to_string());
                Err(NoRequest::Expired)
            }
            None if self.expired.contains(request_id) => Err(NoRequest::Expired),
            None => Err(NoRequest::Unknown),
        }
    }

    /// The KubeMQ response a reply message to `request_id` makes (RPC-13): for a command its
    /// outcome from `x-opt-kubemq-executed` (true when absent and no error is given) and
    /// `x-opt-kubemq-error`; for a query its Metadata and body as well.
    pub fn answer(
        &mut self,
        request_id: &str,
        client_id: &str,
        reply: Stored,
        now: Instant,
    ) -> Result<Answer, NoRequest> {
        let token = self.take(request_id, now)?;
        let [error, executed] = application_properties(&reply.metadata, [ERROR, EXECUTED]);
        let error = match error {
            Some(Value::String(e)) => e,
            _ => String::new(),
        };
        let executed = match executed {
            Some(Value::Bool(b)) => b,
            _ => error.is_empty(),
        };
        let mut response = Response {
            client_id: client_id.to_string(),
            request_id: request_id.to_string(),
            reply_channel: token.reply_channel,
            timestamp: crate::store::now_ns(),
            executed,
            error,
            ..Default::default()
        };
        response.tags = reply.trace_tags;
        if token.pattern == Pattern::Queries {
            response.metadata = reply.metadata;
            response.body = reply.body.to_vec();
        }
        Ok(Answer {
            response,
            traced: token.traced,
        })
    }
}

/// The message a responder receives for a request (RPC-12): its body and metadata, with
/// `reply-to` the request's token and `correlation-id` its RequestID.
pub fn delivered(request: &Request) -> Vec<u8> {
    let token = ["/responses/", request.request_id.as_str()].concat();
    let mut props = [
        ("reply_to", Value::String(token)),
        ("correlation_id", Value::String(request.request_id.clone())),
    ];
    let stamps = Stamps {
        props: &mut props,
        app: &mut [],
    };
    stamped_egress(
        &request.metadata,
        stamps,
        &request.body,
        &request.tags,
        DeliveryInfo { receive_count: 1 },
    )
}

/// How long a delivered request stays answerable: its timeout plus [`GRACE`].
pub fn answerable_for(request: &Request, default: Duration) -> Duration {
    let timeout = u64::try_from(request.timeout)
        .ok()
        .filter(|ms| *ms > 0)
        .map_or(default, Duration::from_millis);
    timeout + GRACE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(metadata: &str) -> Stored {
        Stored {
            metadata: metadata.into(),
            body: bytes::Bytes::from_static(b"body"),
            to: None,
            reply_to: None,
            ttl: None,
            correlation: None,
            trace_tags: Default::default(),
        }
    }

    /// RPC-13, RPC-14: a token answers once; after its expiry it is told apart from one that
    /// never existed; a command's response carries the outcome only.
    #[test]
    fn rpc_14_tokens_answer_once_and_expire() {
        let now = Instant::now();
        let mut t = Tokens::default();
        let r = |id: &str| Request {
            request_id: id.into(),
            reply_channel: format!("_INBOX.{id}"),
            ..Default::default()
        };
        t.insert(
            r("a"),
            (Pattern::Commands, None),
            now + Duration::from_secs(10),
        );
        t.insert(
            r("b"),
            (Pattern::Queries, None),
            now + Duration::from_secs(1),
        );
        let failed =
            r#"{"amqp10":{"app":{"x-opt-kubemq-executed":false,"x-opt-kubemq-error":"no"}}}"#;
        let a = t.answer("a", "me", stored(failed), now).unwrap().response;
        assert!(!a.executed && a.error == "no" && a.body.is_empty());
        assert_eq!(a.reply_channel, "_INBOX.a");
        assert_eq!(
            t.answer("a", "me", stored(failed), now).unwrap_err(),
            NoRequest::Unknown
        );
        assert_eq!(t.expire(now + Duration::from_secs(2)), None);
        assert!(t.is_empty());
        assert_eq!(
            t.answer("b", "me", stored(""), now).unwrap_err(),
            NoRequest::Expired
        );
        t.insert(
            r("c"),
            (Pattern::Queries, None),
            now + Duration::from_secs(1),
        );
        let c = t.answer("c", "me", stored("{}"), now).unwrap().response;
        assert!(c.executed && &c.body[..] == b"body" && c.metadata == "{}");
    }
}
