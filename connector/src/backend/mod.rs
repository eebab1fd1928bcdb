//! The connector's view of KubeMQ: what the pattern bridges need, behind one trait with two
//! implementations — [`embedded::Embedded`] (the durable store in this process, the default) and
//! [`grpc::KubemqGrpc`] (a KubeMQ server, or the store's façade, over gRPC).
//!
//! Queues (send, downstream sessions), events / events-store (send, subscription streams) and
//! commands / queries (request, responder subscription streams, response).

#[cfg(test)]
pub(crate) mod double;
pub mod embedded;
mod event_sender;
pub mod grpc;
pub mod queue_watch;
pub mod readiness;
pub mod ready_estimate;
mod status;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::engine::Credential;
use crate::kubemq::{
    Event, EventReceive, PingResult, QueueMessage, QueuesInfo, Request, Response,
    SendQueueMessageResult, Subscribe,
};
use crate::store::StoreError;

/// How long a queue send may go unanswered before it no longer holds back the sends after it:
/// KubeMQ answers within milliseconds, after its publish-ack wait, or never (KMQ-19).
pub const SEND_STALL: Duration = Duration::from_secs(3);

/// A live events or events-store subscription: its events in order; it ends with an error or
/// when the backend ends it, and dropping it unsubscribes.
pub type EventStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<EventReceive, BackendError>> + Send>>;

/// A live responder subscription (commands or queries): requests in arrival order, each with
/// the reply address its response must name; it ends with an error or when the backend ends it,
/// and dropping it unsubscribes.
pub type RequestStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<Request, BackendError>> + Send>>;

/// Why a backend operation failed, as a bridge must act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// KubeMQ could not be reached, the stream was lost, or a deadline passed: transient.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The request may have reached KubeMQ and no answer came (the stream was lost after it
    /// left, or KubeMQ did not answer in time): whether it took effect is not known.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// KubeMQ found the request itself invalid (its validation, `Error 1xx`); the text is
    /// KubeMQ's (e.g. `Error 120: ...`).
    #[error("{0}")]
    Invalid(String),
    /// Another live subscription holds the ClientID (KubeMQ allows one per events-store
    /// ClientID); the text is KubeMQ's.
    #[error("{0}")]
    ClientIdInUse(String),
    /// KubeMQ refused the operation for a reason of its own (e.g. `Error 301: timeout for
    /// request message`); the text is KubeMQ's.
    #[error("{0}")]
    Rejected(String),
    /// KubeMQ refused the credentials the call carried (gRPC `Unauthenticated` or
    /// `PermissionDenied`) or its access control refused the call (`Error 412: access denied to
    /// resource`, where KubeMQ authorizes); the text is KubeMQ's, for the log only.
    #[error("refused by KubeMQ: {0}")]
    Unauthorized(String),
}

/// KubeMQ's code for a refused access (its access control, where it enforces one).
const ACCESS_DENIED: u16 = 412;

/// What KubeMQ (and the embedded store) say when a ClientID is subscribed already.
const CLIENT_ID_IN_USE: &str = "clientID already registered";

impl BackendError {
    /// A refusal KubeMQ gave as text (a result's `Error`, a status message), read once here:
    /// access denied, its validation (`Error 1xx`), a ClientID in use, or anything else.
    pub fn refusal(text: String) -> BackendError {
        let in_use = text.contains(CLIENT_ID_IN_USE);
        BackendError::classified(kubemq_code(&text), in_use, text)
    }

    /// A refusal by its KubeMQ code, and whether it says the ClientID is in use.
    fn classified(code: Option<u16>, client_id_in_use: bool, text: String) -> BackendError {
        match code {
            Some(ACCESS_DENIED) => BackendError::Unauthorized(text),
            Some(100..=199) => BackendError::Invalid(text),
            _ if client_id_in_use => BackendError::ClientIdInUse(text),
            _ => BackendError::Rejected(text),
        }
    }
}

impl From<StoreError> for BackendError {
    /// The embedded store's refusal, read by its type instead of its text.
    fn from(e: StoreError) -> BackendError {
        let in_use = e == StoreError::StreamClientIdTaken;
        BackendError::classified(e.code(), in_use, e.to_string())
    }
}

/// The code of a KubeMQ error text (`Error NNN: ...`), if it has one.
pub(super) fn kubemq_code(text: &str) -> Option<u16> {
    let digits = text.strip_prefix("Error ")?.split(':').next()?;
    digits.trim().parse().ok()
}

/// Messages returned by one Get, owned by one transaction.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// The transaction the messages must be settled on.
    pub transaction_id: String,
    /// The messages, with Attributes (Sequence, ReceiveCount, ...).
    pub messages: Vec<QueueMessage>,
}

/// Resolves once a downstream session has handled every request sent on it before
/// ([`Downstream::handled`]); a session that ends meanwhile counts as handled (its transactions
/// are over with it).
#[derive(Debug)]
pub struct Handled(Option<tokio::sync::oneshot::Receiver<crate::kubemq::QueuesDownstreamResponse>>);

impl Handled {
    /// Already handled.
    pub fn now() -> Handled {
        Handled(None)
    }

    /// Handled when `answer` arrives (or its sender goes).
    pub fn when(
        answer: tokio::sync::oneshot::Receiver<crate::kubemq::QueuesDownstreamResponse>,
    ) -> Handled {
        Handled(Some(answer))
    }
}

impl Future for Handled {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        match &mut self.0 {
            None => std::task::Poll::Ready(()),
            Some(answer) => Pin::new(answer).poll(cx).map(|_| ()),
        }
    }
}

/// A KubeMQ backend.
pub trait Backend: Send + Sync + 'static {
    /// The downstream session type.
    type Downstream: Downstream;

    /// Sends queue messages; every message gets its own result, in order (an in-band error is a
    /// result, not an `Err`). The first poll of the returned future takes the messages' place in
    /// `lane`'s order without waiting, so calls on one lane whose futures are first polled one
    /// after the other are stored in that order even while earlier ones are still in flight.
    /// Calls on different lanes may be stored in either order (a producer link is a lane: KubeMQ
    /// stores concurrent upstream requests in either order, KMQ-4).
    fn send_queue(
        &self,
        lane: u64,
        messages: Vec<QueueMessage>,
    ) -> impl Future<Output = Result<Vec<SendQueueMessageResult>, BackendError>> + Send;

    /// Opens a consumer session (one QueuesDownstream stream). Sessions can be shared by every
    /// consumer of a channel in this process.
    fn open_downstream(
        &self,
    ) -> impl Future<Output = Result<Self::Downstream, BackendError>> + Send;

    /// Queue statistics; `filter` is empty or exact names separated by `;`.
    fn queues_info(
        &self,
        filter: &str,
    ) -> impl Future<Output = Result<QueuesInfo, BackendError>> + Send;

    /// Sends an event (`Store = false`) or an events-store event (`Store = true`); returns the
    /// EventID once KubeMQ took it (for the embedded events-store: once it is on disk).
    fn send_event(&self, event: Event)
        -> impl Future<Output = Result<String, BackendError>> + Send;

    /// Subscribes to events or an events-store channel (SubscribeToEvents).
    fn subscribe_events(
        &self,
        request: Subscribe,
    ) -> impl Future<Output = Result<EventStream, BackendError>> + Send;

    /// Deletes the events-store cursors of `client_id`, so that the next subscription with that
    /// ClientID starts from its start position; `Ok(false)` when there were none. KubeMQ's API
    /// has no such call: there it is `Rejected`.
    fn forget_cursor(
        &self,
        _client_id: &str,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send {
        std::future::ready(Err(BackendError::Rejected(
            "KubeMQ cannot delete an events-store subscription".into(),
        )))
    }

    /// Sends a command or query (SendRequest) and waits for its first response, at most the
    /// request's Timeout; no response in time (also with no responder) is KubeMQ's `Error 301`.
    fn send_request(
        &self,
        request: Request,
    ) -> impl Future<Output = Result<Response, BackendError>> + Send;

    /// Subscribes a responder to commands or queries (SubscribeToRequests).
    fn subscribe_requests(
        &self,
        request: Subscribe,
    ) -> impl Future<Output = Result<RequestStream, BackendError>> + Send;

    /// Answers a request (SendResponse); a response for a request that is over is discarded by
    /// KubeMQ without an error.
    fn send_response(
        &self,
        response: Response,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Health check.
    fn ping(&self) -> impl Future<Output = Result<PingResult, BackendError>> + Send;

    /// A handle whose calls present `credential` (a client's KubeMQ JWT) instead of the
    /// connector's own token, so that KubeMQ checks the client (SASL-3); `None` when this
    /// backend has no use for credentials and the shared handle serves every connection.
    fn with_credential(&self, _credential: &Credential) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// Whether the backend's open transactions take ready messages into the room a settlement
    /// frees, hiding them until the transaction closes (KubeMQ v2.4's capture, KMQ-2
    /// 4.3.11). The Get loop then settles a transaction only as a whole.
    fn captures(&self) -> bool {
        false
    }

    /// How many messages `channel` has ready right now, as far as the backend can tell cheaply.
    /// Lets a Get ask for what is there instead of waiting for a batch that cannot fill.
    fn ready_hint(&self, _channel: &str) -> ReadyHint {
        ReadyHint::Unknown
    }

    /// Messages of `channel` known to be stored and not fetched yet (sent through this process
    /// and confirmed, or given back): a Get for at most that many returns at once. 0 when the
    /// backend cannot tell.
    fn stored_hint(&self, _channel: &str) -> u64 {
        0
    }

    /// A signal that changes whenever some channel's [`Backend::ready_hint`] or
    /// [`Backend::stored_hint`] may have risen (a send left or was confirmed, messages were
    /// given back); `None` for a backend whose hints never rise that way.
    fn ready_changes(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        None
    }

    /// Watches `channel` for messages a Get could take at once, for a Get loop whose queue
    /// looks idle ([`queue_watch`]): the view changes when this process sends to the channel
    /// and when the broker's counts change. `None` for a backend where a Get that waits costs
    /// nothing beyond itself (the embedded store); the loop then waits with a Get.
    fn watch_queue(
        &self,
        _channel: &str,
    ) -> Option<tokio::sync::watch::Receiver<queue_watch::QueueView>> {
        None
    }

    /// Asks whether `client_id` may read `channel` without taking a message or waiting for one,
    /// so that a loop that watches an idle queue learns whether the broker refuses it (AUTHZ-9)
    /// without a Get that waits (KMQ-21, KMQ-23). `Err(Unauthorized)` when it refuses.
    fn check_read(
        &self,
        _channel: &str,
        _client_id: &str,
    ) -> impl Future<Output = Result<ReadCheck, BackendError>> + Send {
        std::future::ready(Ok(ReadCheck::Unknown))
    }
}

/// What the broker says of a client's right to read a queue, short of a Get
/// ([`Backend::check_read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadCheck {
    /// The broker checked the right and allows it.
    Allowed,
    /// The broker cannot say without a Get.
    Unknown,
}

/// What a backend knows about a channel's ready messages (see [`Backend::ready_hint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyHint {
    /// Nothing.
    Unknown,
    /// Exactly this many (the embedded store counts them).
    Exact(u64),
    /// Probably this many, counted from this process's own sends and fetches
    /// ([`ready_estimate`]): low rather than high; 0 when nothing is waiting or on its way.
    Estimate(u64),
}

impl ReadyHint {
    /// The count, exact or estimated; `None` when nothing is known.
    pub fn known(self) -> Option<u64> {
        match self {
            ReadyHint::Exact(n) | ReadyHint::Estimate(n) => Some(n),
            ReadyHint::Unknown => None,
        }
    }
}

/// One consumer session: Gets open transactions, settlements apply to them. KubeMQ answers a
/// successful settlement with nothing, so settlement methods return once the request is sent
/// (the embedded store applies it before returning); a failure reported later is logged.
pub trait Downstream: Send + 'static {
    /// Waits for `max_items` messages or `wait_ms` (KubeMQ raises it to at least 1000).
    fn get(
        &mut self,
        channel: &str,
        client_id: &str,
        max_items: i32,
        wait_ms: i32,
    ) -> impl Future<Output = Result<Batch, BackendError>> + Send;

    /// AckRange.
    fn ack(
        &mut self,
        transaction: &str,
        sequences: &[u64],
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// NAckRange: each message goes back to the tail with ReceiveCount + 1 (or dead-letters).
    fn nack(
        &mut self,
        transaction: &str,
        sequences: &[u64],
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// ReQueueRange to `channel`.
    fn requeue(
        &mut self,
        transaction: &str,
        sequences: &[u64],
        channel: &str,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// `count` messages of `channel` went back to the queue (NAcked, closed, or with a lost
    /// session): nothing is sent, but a backend that sizes Gets from its own count
    /// ([`ReadyHint::Estimate`]) counts them as ready.
    fn returned(&mut self, _channel: &str, _count: usize) {}

    /// CloseByClient: every unsettled message goes back unchanged.
    fn close(&mut self, transaction: &str)
        -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Asks the session to answer once it has handled every request sent on it before, naming
    /// `transaction` (the last one settled on it). KubeMQ answers a settlement with nothing, so
    /// only the answer to a later request on the same stream tells that it closed the
    /// transaction (KMQ-5). The embedded store applies a settlement before returning: handled
    /// at once.
    fn handled(
        &mut self,
        _transaction: &str,
    ) -> impl Future<Output = Result<Handled, BackendError>> + Send {
        std::future::ready(Ok(Handled::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KubeMQ's refusal texts are read once, where they enter: access denied, validation, a
    /// ClientID in use, anything else.
    #[test]
    fn a_refusal_is_classified_once_by_kubemq_code() {
        let kind = |t: &str| match BackendError::refusal(t.into()) {
            BackendError::Unauthorized(_) => "unauthorized",
            BackendError::Invalid(_) => "invalid",
            BackendError::ClientIdInUse(_) => "in use",
            BackendError::Rejected(_) => "rejected",
            other => panic!("{other:?}"),
        };
        assert_eq!(kind("Error 412: access denied to resource"), "unauthorized");
        assert_eq!(
            kind("Error 101: invalid clientID value, cannot be empty"),
            "invalid"
        );
        assert_eq!(
            kind("Error 135: invalid queue message delay seconds"),
            "invalid"
        );
        assert_eq!(kind("stan: clientID already registered"), "in use");
        assert_eq!(kind("Error 301: timeout for request message"), "rejected");
        assert_eq!(kind("Error 500: storage failure"), "rejected");
        assert_eq!(kind("Error 1"), "rejected");
        assert_eq!(kind("stan: invalid subject"), "rejected");
    }

    /// The embedded store's refusals, read by their type, classify as their KubeMQ text does
    /// when it comes over gRPC.
    #[test]
    fn a_store_refusal_classifies_as_its_text() {
        for e in crate::store::errors::every_refusal() {
            assert_eq!(
                BackendError::from(e.clone()),
                BackendError::refusal(e.to_string()),
                "{e}"
            );
        }
    }
}
