//! The KubeMQ gRPC client (tonic), for a real KubeMQ or the embedded store's façade.
//!
//! - One lazily connected channel; tonic reconnects it, and calls that find KubeMQ unreachable
//!   are retried with exponential backoff until their deadline.
//! - Concurrent queue sends are coalesced into QueuesUpstream requests of up to 1,000 messages
//!   (KubeMQ stores ~40k msg/s that way against ~2k msg/s for unary sends, KMQ-10);
//!   each message still gets its own result. One request is in flight at a time, so messages keep
//!   the order in which they were sent, and every request has a deadline (a real KubeMQ can leave
//!   one unanswered).
//! - A downstream session is one QueuesDownstream stream, opened by its first Get; a lost stream
//!   fails the waiting Get and every later call with `Unavailable`, never a hang.
//! - Every streaming call carries its first request before the call is awaited: KubeMQ (grpc-go)
//!   sends a stream's response headers only with its first response.
//! - 100 MiB messages both ways; an optional token goes in the `authorization` metadata.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use super::queue_watch::{Poll, QueueView, QueueWatch};
use super::ready_estimate::ReadyEstimate;
use super::status::{credential_refused, failure, refused, retryable, unavailable};
use super::SEND_STALL;
use super::{
    kubemq_code, Backend, BackendError, Batch, Downstream, EventStream, Handled, ReadCheck,
    ReadyHint, RequestStream,
};
use crate::engine::Credential;
use crate::kubemq::kubemq_client::KubemqClient;
use crate::kubemq::new_id;
use crate::kubemq::transport::{CONNECTION_WINDOW, MAX_FRAME, MAX_GRPC_MESSAGE, STREAM_WINDOW};
use crate::kubemq::{
    Empty, Event, PingResult, QueueMessage, QueuesDownstreamRequest,
    QueuesDownstreamRequestType as Op, QueuesDownstreamResponse, QueuesInfo, QueuesInfoRequest,
    QueuesUpstreamRequest, QueuesUpstreamResponse, ReceiveQueueMessagesRequest, Request, Response,
    SendQueueMessageResult, Subscribe,
};

/// Messages per QueuesUpstream request at most.
const MAX_BATCH: usize = 1000;
/// First retry delay; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest retry delay.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long a queue send that reached KubeMQ waits for its answer. KubeMQ v2.4 answers a send
/// once its broker acknowledged the messages or gave up after its publish-ack wait (60 s by
/// default, `Queue.PubAckWaitSeconds`), or never (KMQ-19); a send still unanswered after this
/// is of unknown outcome.
const SEND_ANSWER_WAIT: Duration = Duration::from_secs(65);
/// How long a subscription waits for KubeMQ's answer before it is taken as open: KubeMQ
/// (grpc-go) may send a server stream's headers only with its first event, and a refusal
/// comes at once.
const SUBSCRIBE_ANSWER: Duration = Duration::from_millis(500);
/// Items (events, requests) a subscription's reader holds for the bridge.
const SUBSCRIPTION_BUFFER: usize = 256;

/// How the client behaves.
#[derive(Debug, Clone)]
pub struct GrpcOptions {
    /// Deadline of each call (a Get's own wait is added to it).
    pub deadline: Duration,
    /// Token sent as `authorization` metadata, if any.
    pub token: Option<String>,
    /// Clients authenticate (AUTHZ-9): each sender's first event per ClientID and channel then
    /// waits for KubeMQ's verdict. Connections presenting their own token always do.
    pub clients_authenticate: bool,
}

impl Default for GrpcOptions {
    fn default() -> Self {
        GrpcOptions {
            deadline: Duration::from_secs(10),
            token: None,
            clients_authenticate: false,
        }
    }
}

impl GrpcOptions {
    /// The options the connector's settings give: its own token, and whether clients
    /// authenticate.
    pub fn from_settings(settings: &crate::config::Settings) -> GrpcOptions {
        GrpcOptions {
            token: settings.kubemq_token.clone(),
            clients_authenticate: settings.authentication,
            ..GrpcOptions::default()
        }
    }
}

struct Shared {
    client: KubemqClient<Channel>,
    token: Option<MetadataValue<tonic::metadata::Ascii>>,
    deadline: Duration,
    /// Whether events wait for KubeMQ's verdict on their first per ClientID and channel.
    verify_first_events: bool,
}

impl Shared {
    fn request<T>(&self, body: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(body);
        if let Some(t) = &self.token {
            r.metadata_mut().insert("authorization", t.clone());
        }
        r
    }
}

/// One caller's messages, stored together with other callers' in one QueuesUpstream request.
struct Pending {
    messages: Vec<QueueMessage>,
    done: oneshot::Sender<Result<Vec<SendQueueMessageResult>, BackendError>>,
}

/// QueuesUpstream streams per client (opened when first used). Requests on one stream are sent
/// one at a time, so a lane's order holds; several streams let different producers' batches be
/// stored in parallel instead of queueing behind one another's fsync.
const UPSTREAM_STREAMS: usize = 4;

/// The upstream stream a lane's sends take: consecutive lanes take different streams.
fn stream_of(lane: u64) -> usize {
    (lane % UPSTREAM_STREAMS as u64) as usize
}

/// A KubeMQ server reached over gRPC.
#[derive(Clone)]
pub struct KubemqGrpc {
    shared: Arc<Shared>,
    /// Unbounded so that a send joins the queue on its first poll (Backend::send_queue); what is
    /// queued is bounded by the producers' credit windows.
    /// One send batcher per QueuesUpstream stream, each with one request in flight; a lane
    /// always uses the same one, so its sends stay in order while other lanes' go in parallel.
    upstream: Arc<[mpsc::UnboundedSender<Pending>]>,
    /// This process's sends and fetches per channel, for Get sizing.
    ready: Arc<ReadyEstimate>,
    /// Event sends, in order, over one SendEventsStream.
    events: mpsc::UnboundedSender<super::event_sender::EventSend>,
    /// Counts the queue sends KubeMQ answered, on any stream of any credential.
    answers: Answers,
}

/// Counts the queue sends KubeMQ answered: a send still unanswered when a later one was answered
/// lost its answer (KMQ-19) rather than waiting for a slow broker.
type Answers = Arc<watch::Sender<u64>>;

impl KubemqGrpc {
    /// A client of the KubeMQ at `address` (`host:port`, or a URL). Connects lazily: nothing
    /// fails here if KubeMQ is down. Needs a tokio runtime (it starts the send batcher).
    pub fn connect(address: &str, opts: GrpcOptions) -> Result<KubemqGrpc, BackendError> {
        let uri = if address.contains("://") {
            address.to_string()
        } else {
            format!("http://{address}")
        };
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|e| {
                BackendError::Unavailable(format!("invalid KubeMQ address {address:?}: {e}"))
            })?
            .connect_timeout(Duration::from_secs(5))
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .tcp_nodelay(true)
            .max_frame_size(MAX_FRAME)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(10));
        let client = KubemqClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_GRPC_MESSAGE)
            .max_encoding_message_size(MAX_GRPC_MESSAGE);
        let token = match opts.token {
            Some(t) => Some(MetadataValue::try_from(t).map_err(|_| {
                BackendError::Unavailable("the KubeMQ token is not valid metadata".into())
            })?),
            None => None,
        };
        let watch = QueueWatch::new(Some(list_queues(client.clone(), token.clone())));
        Ok(KubemqGrpc::over(
            Shared {
                client,
                token,
                deadline: opts.deadline,
                verify_first_events: opts.clients_authenticate,
            },
            Arc::new(ReadyEstimate::watched_by(Arc::new(watch))),
            Arc::new(watch::Sender::new(0)),
        ))
    }

    /// A client with its own send batchers over `shared`'s channel.
    fn over(shared: Shared, ready: Arc<ReadyEstimate>, answers: Answers) -> KubemqGrpc {
        let shared = Arc::new(shared);
        let upstream = (0..UPSTREAM_STREAMS)
            .map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(Batcher::new(shared.clone(), answers.clone()).run(rx));
                tx
            })
            .collect();
        let events = super::event_sender::spawn(
            shared.client.clone(),
            shared.token.clone(),
            shared.deadline,
            shared.verify_first_events,
        );
        KubemqGrpc {
            shared,
            upstream,
            ready,
            events,
            answers,
        }
    }

    /// Retries `call` on transient failures with exponential backoff until the deadline.
    async fn unary<T, F, Fut>(&self, mut call: F) -> Result<T, BackendError>
    where
        F: FnMut(KubemqClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let deadline = tokio::time::Instant::now() + self.shared.deadline;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let attempt = tokio::time::timeout_at(deadline, call(self.shared.client.clone())).await;
            match attempt {
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(s)) if retryable(&s) && tokio::time::Instant::now() + backoff < deadline => {
                    tracing::debug!(error = %s, ?backoff, "KubeMQ unavailable; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Ok(Err(s)) if retryable(&s) => return Err(unavailable(&s)),
                Ok(Err(s)) => return Err(refused(&s)),
                Err(_) => return Err(BackendError::Unavailable("deadline exceeded".into())),
            }
        }
    }
}

/// One QueuesInfo for every queue, with the connector's own token, tried once: the queue watch
/// asks again soon anyway.
fn list_queues(
    client: KubemqClient<Channel>,
    token: Option<MetadataValue<tonic::metadata::Ascii>>,
) -> Poll {
    Arc::new(move || {
        let mut client = client.clone();
        let mut request = tonic::Request::new(QueuesInfoRequest {
            request_id: new_id(),
            queue_name: String::new(),
        });
        if let Some(t) = &token {
            request.metadata_mut().insert("authorization", t.clone());
        }
        Box::pin(async move {
            match client.queues_info(request).await {
                Ok(r) => Ok(r.into_inner().info.unwrap_or_default()),
                Err(s) if retryable(&s) => Err(unavailable(&s)),
                Err(s) => Err(refused(&s)),
            }
        })
    })
}

/// Why an upstream stream did not open.
enum OpenFailure {
    /// Before the call took the request: it never reached KubeMQ and can be sent again.
    NotSent(Status),
    /// After the call took the request: it may or may not be stored.
    LostWithRequest(Status),
}

/// Coalesces queued sends into QueuesUpstream requests on one long-lived stream.
struct Batcher {
    shared: Arc<Shared>,
    answers: Answers,
    stream: Option<(
        mpsc::Sender<QueuesUpstreamRequest>,
        tonic::Streaming<QueuesUpstreamResponse>,
    )>,
}

impl Batcher {
    fn new(shared: Arc<Shared>, answers: Answers) -> Self {
        Batcher {
            shared,
            answers,
            stream: None,
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Pending>) {
        while let Some(first) = rx.recv().await {
            // Messages move into the request (no copies); each caller keeps its count so the
            // results can be split back in order.
            let mut counts = vec![first.messages.len()];
            let mut dones = vec![first.done];
            let mut messages = first.messages;
            while messages.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(p) => {
                        counts.push(p.messages.len());
                        dones.push(p.done);
                        messages.extend(p.messages);
                    }
                    Err(_) => break,
                }
            }
            match self.send(messages).await {
                Answer::Now(result) => deliver(result, counts, dones),
                // The stream is left to the request it holds; the next batch opens another.
                Answer::Later(answer) => {
                    tokio::spawn(async move { deliver(answer.await, counts, dones) });
                }
            }
        }
    }

    /// One request on the stream, opening it (with backoff) when needed.
    async fn send(&mut self, messages: Vec<QueueMessage>) -> Answer {
        let deadline = tokio::time::Instant::now() + self.shared.deadline;
        let mut backoff = FIRST_BACKOFF;
        let mut request = QueuesUpstreamRequest {
            request_id: new_id(),
            messages,
        };
        let request_id = request.request_id.clone();
        loop {
            let Some((tx, _)) = self.stream.as_mut() else {
                let taken = Arc::new(AtomicBool::new(false));
                match tokio::time::timeout_at(deadline, self.open(&request, &taken)).await {
                    Ok(Ok(s)) => {
                        self.stream = Some(s);
                        return self.reply(request_id).await;
                    }
                    Ok(Err(OpenFailure::LostWithRequest(s))) => {
                        return Answer::Now(Err(BackendError::Unknown(format!(
                            "upstream stream lost after the send left: {}",
                            s.message()
                        ))))
                    }
                    Ok(Err(OpenFailure::NotSent(s)))
                        if retryable(&s) && tokio::time::Instant::now() + backoff < deadline =>
                    {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                    Ok(Err(OpenFailure::NotSent(s))) if retryable(&s) => {
                        return Answer::Now(Err(unavailable(&s)))
                    }
                    Ok(Err(OpenFailure::NotSent(s))) => return Answer::Now(Err(refused(&s))),
                    // The call may have taken the request before the deadline cut it.
                    Err(_) if taken.load(Ordering::Acquire) => {
                        return Answer::Now(Err(BackendError::Unknown(
                            "upstream stream did not open in time after the send left".into(),
                        )))
                    }
                    Err(_) => return Answer::Now(Err(deadline_exceeded())),
                }
            };
            // A stream that is gone hands the request back for the retry on a new one.
            if let Err(mpsc::error::SendError(back)) = tx.send(request).await {
                request = back;
                self.stream = None;
                continue;
            }
            return self.reply(request_id).await;
        }
    }

    /// The reply to the one request in flight on the open stream. KubeMQ answers within
    /// milliseconds, or after up to its publish-ack wait when its broker is slow, or never: its
    /// batch dispatcher can miss the acknowledgements of messages it did store (KMQ-19). A
    /// request still unanswered after [`SEND_STALL`] keeps its stream, and its callers keep
    /// waiting for the answer until KubeMQ answers a later send (then this answer was lost) or
    /// up to [`SEND_ANSWER_WAIT`], while later sends go on a new stream: one lost answer must not
    /// hold back every later send of the lanes sharing the stream.
    async fn reply(&mut self, request_id: String) -> Answer {
        let Some((_, rx)) = self.stream.as_mut() else {
            return Answer::Now(Err(BackendError::Unknown("upstream stream lost".into())));
        };
        match tokio::time::timeout(SEND_STALL, rx.next()).await {
            Ok(reply) => {
                let (result, keep) = judge(reply, &request_id);
                if !keep {
                    self.stream = None;
                } else {
                    self.answers.send_modify(|n| *n += 1);
                }
                Answer::Now(result)
            }
            Err(_) => {
                let Some((tx, mut rx)) = self.stream.take() else {
                    return Answer::Now(Err(BackendError::Unknown("upstream stream lost".into())));
                };
                tracing::warn!(request = %request_id, "KubeMQ has not answered a send for {} s; later sends go on a new stream", SEND_STALL.as_secs());
                // Seen from here on: only answers to sends after this one count.
                let mut later = self.answers.subscribe();
                Answer::Later(Box::pin(async move {
                    let give_up = tokio::time::sleep(SEND_ANSWER_WAIT - SEND_STALL);
                    tokio::pin!(give_up);
                    let result = tokio::select! {
                        reply = rx.next() => judge(reply, &request_id).0,
                        // KubeMQ answers a slow broker's sends in turn: one that is answered
                        // while this one is not means this answer was lost (KMQ-19).
                        Ok(()) = later.changed() => Err(BackendError::Unknown(
                            "KubeMQ answered later sends but not this one".into(),
                        )),
                        _ = &mut give_up => Err(BackendError::Unknown(format!(
                            "KubeMQ did not answer the send within {} s",
                            SEND_ANSWER_WAIT.as_secs()
                        ))),
                    };
                    drop(tx);
                    result
                }))
            }
        }
    }

    /// Opens a stream that carries `first` from its start. KubeMQ (grpc-go) sends a streaming
    /// call's response headers only with its first response, which needs a request first: the
    /// request is written before the call is awaited, never after.
    async fn open(
        &self,
        first: &QueuesUpstreamRequest,
        taken: &Arc<AtomicBool>,
    ) -> Result<
        (
            mpsc::Sender<QueuesUpstreamRequest>,
            tonic::Streaming<QueuesUpstreamResponse>,
        ),
        OpenFailure,
    > {
        let (tx, rx) = mpsc::channel(4);
        // A fresh channel has room. The copy (made only when a stream opens) stays with the
        // caller for a retry if the open fails before the request left.
        let _ = tx.try_send(first.clone());
        let requests = tracked(rx, taken.clone());
        let mut client = self.shared.client.clone();
        match client.queues_upstream(self.shared.request(requests)).await {
            Ok(resp) => Ok((tx, resp.into_inner())),
            // A refused token is refused before the request is read: nothing was stored.
            Err(s) if credential_refused(&s) => Err(OpenFailure::NotSent(s)),
            Err(s) if taken.load(Ordering::Acquire) => Err(OpenFailure::LostWithRequest(s)),
            Err(s) => Err(OpenFailure::NotSent(s)),
        }
    }
}

/// What became of a QueuesUpstream request: answered (or failed) now, or still waiting for
/// KubeMQ's answer on a stream of its own.
enum Answer {
    Now(Result<Vec<SendQueueMessageResult>, BackendError>),
    Later(
        std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<Vec<SendQueueMessageResult>, BackendError>>
                    + Send,
            >,
        >,
    ),
}

/// KubeMQ's reply to request `request_id`, and whether the stream can carry the next request.
fn judge(
    reply: Option<Result<QueuesUpstreamResponse, Status>>,
    request_id: &str,
) -> (Result<Vec<SendQueueMessageResult>, BackendError>, bool) {
    match reply {
        Some(Ok(r)) if r.ref_request_id == request_id => {
            if r.is_error {
                (Err(BackendError::refusal(r.error)), true)
            } else {
                (Ok(r.results), true)
            }
        }
        Some(Ok(r)) => {
            // Only one request is in flight: anything else is a stale reply.
            tracing::warn!(reference = %r.ref_request_id, "unexpected QueuesUpstream reply; reopening the stream");
            (
                Err(BackendError::Unknown("upstream reply out of order".into())),
                false,
            )
        }
        // The stream broke before replying: the request may or may not be stored.
        _ => (
            Err(BackendError::Unknown(
                "upstream stream lost before KubeMQ answered".into(),
            )),
            false,
        ),
    }
}

/// Splits one request's results back to the callers whose messages it carried (`counts` of
/// them each, in order).
fn deliver(
    result: Result<Vec<SendQueueMessageResult>, BackendError>,
    counts: Vec<usize>,
    dones: Vec<oneshot::Sender<Result<Vec<SendQueueMessageResult>, BackendError>>>,
) {
    let total: usize = counts.iter().sum();
    let result = match result {
        Ok(results) if results.len() != total => Err(BackendError::Unknown(format!(
            "KubeMQ returned {} results for {total} messages",
            results.len(),
        ))),
        other => other,
    };
    match result {
        Ok(results) => {
            let mut results = results.into_iter();
            for (n, done) in counts.into_iter().zip(dones) {
                let _ = done.send(Ok(results.by_ref().take(n).collect()));
            }
        }
        Err(e) => {
            for done in dones {
                let _ = done.send(Err(e.clone()));
            }
        }
    }
}

/// A request stream that records whether the call took its first request: a call that failed
/// before that never reached KubeMQ and can be made again as it is.
fn tracked<T>(
    rx: mpsc::Receiver<T>,
    taken: Arc<AtomicBool>,
) -> impl tokio_stream::Stream<Item = T> + Send + 'static
where
    T: Send + 'static,
{
    ReceiverStream::new(rx).map(move |r| {
        taken.store(true, Ordering::Release);
        r
    })
}

fn deadline_exceeded() -> BackendError {
    BackendError::Unavailable("upstream request deadline exceeded".into())
}

type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<QueuesDownstreamResponse>>>>;

/// Forgets the requests nobody waits for any more: the Get loop stops waiting for a
/// [`Downstream::handled`] answer after a while, and one that never came must not stay for the
/// stream's life.
fn forget_unheard(waiters: &mut HashMap<String, oneshot::Sender<QueuesDownstreamResponse>>) {
    waiters.retain(|_, w| !w.is_closed());
}

/// One QueuesDownstream stream. It opens with its first Get: KubeMQ (grpc-go) answers the call's
/// headers only with its first response, so the call cannot be awaited before a request is on
/// it. A stream that was open and is lost fails every later call with `Unavailable` (its
/// transactions are gone with it), never a hang.
pub struct GrpcDownstream {
    shared: Arc<Shared>,
    stream: Option<OpenStream>,
    ready: Arc<ReadyEstimate>,
}

/// The open stream: its request side, the Gets waiting for replies, and the reader of replies.
struct OpenStream {
    tx: mpsc::Sender<QueuesDownstreamRequest>,
    waiters: Waiters,
    lost: Arc<AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        // Dropping the response stream cancels the call, which is what makes KubeMQ return the
        // session's unsettled messages (client EOF alone would not).
        self.reader.abort();
    }
}

impl OpenStream {
    fn check(&self) -> Result<(), BackendError> {
        if self.lost.load(Ordering::Acquire) {
            Err(BackendError::Unavailable("downstream stream lost".into()))
        } else {
            Ok(())
        }
    }

    fn waiters(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<QueuesDownstreamResponse>>> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Routes a stream's replies to the Gets waiting for them until the stream ends; reports on
/// `opened` whether the call was answered at all.
async fn read_replies(
    call: impl std::future::Future<
        Output = Result<tonic::Response<tonic::Streaming<QueuesDownstreamResponse>>, Status>,
    >,
    waiters: Waiters,
    lost: Arc<AtomicBool>,
    opened: oneshot::Sender<Result<(), Status>>,
) {
    let mut inbound = match call.await {
        Ok(r) => {
            let _ = opened.send(Ok(()));
            r.into_inner()
        }
        Err(s) => {
            lost.store(true, Ordering::Release);
            waiters.lock().unwrap_or_else(|e| e.into_inner()).clear();
            let _ = opened.send(Err(s));
            return;
        }
    };
    while let Some(Ok(resp)) = inbound.next().await {
        let waiter = waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&resp.ref_request_id);
        match waiter {
            Some(done) => {
                let _ = done.send(resp);
            }
            None if resp.is_error => {
                tracing::warn!(transaction = %resp.transaction_id, error = %resp.error, "KubeMQ refused a settlement")
            }
            None => {}
        }
    }
    lost.store(true, Ordering::Release);
    // Waiting Gets learn of the loss when their senders drop here.
    waiters.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

impl GrpcDownstream {
    /// Opens the stream with `first` (a Get) as its first request, retrying with backoff while
    /// KubeMQ is unreachable; returns where the Get's reply will arrive.
    async fn open_with(
        &mut self,
        first: &QueuesDownstreamRequest,
        limit: Duration,
    ) -> Result<oneshot::Receiver<QueuesDownstreamResponse>, BackendError> {
        let start = tokio::time::Instant::now();
        // Attempts that never reached KubeMQ are retried within the call deadline; once the Get
        // is on its way, its own wait counts too.
        let deadline = start + self.shared.deadline;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let (tx, rx) = mpsc::channel(64);
            let waiters: Waiters = Arc::default();
            let (done, wait) = oneshot::channel();
            waiters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(first.request_id.clone(), done);
            // A fresh channel has room: the Get is on the stream before the call is awaited.
            let _ = tx.try_send(first.clone());
            let lost = Arc::new(AtomicBool::new(false));
            let (opened_tx, opened) = oneshot::channel();
            let taken = Arc::new(AtomicBool::new(false));
            let requests = tracked(rx, taken.clone());
            let mut client = self.shared.client.clone();
            let request = self.shared.request(requests);
            let reader = tokio::spawn(read_replies(
                async move { client.queues_downstream(request).await },
                waiters.clone(),
                lost.clone(),
                opened_tx,
            ));
            let stream = OpenStream {
                tx,
                waiters,
                lost,
                reader,
            };
            match tokio::time::timeout_at(start + limit, opened).await {
                Ok(Ok(Ok(()))) => {
                    self.stream = Some(stream);
                    return Ok(wait);
                }
                // KubeMQ checks the token before it reads the Get: nothing was taken.
                Ok(Ok(Err(s))) if credential_refused(&s) => return Err(refused(&s)),
                // The Get reached KubeMQ and the stream broke: a lost stream, not a failed open.
                Ok(Ok(Err(s))) if taken.load(Ordering::Acquire) => {
                    return Err(BackendError::Unavailable(format!(
                        "downstream stream lost during Get: {}",
                        s.message()
                    )))
                }
                Ok(Ok(Err(s)))
                    if retryable(&s) && tokio::time::Instant::now() + backoff < deadline =>
                {
                    tracing::debug!(error = %s, ?backoff, "KubeMQ unavailable; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Ok(Ok(Err(s))) if retryable(&s) => return Err(unavailable(&s)),
                Ok(Ok(Err(s))) => return Err(refused(&s)),
                Ok(Err(_)) => {
                    return Err(BackendError::Unavailable(
                        "downstream stream lost while opening".into(),
                    ))
                }
                Err(_) => {
                    return Err(BackendError::Unavailable(
                        "downstream open deadline exceeded".into(),
                    ))
                }
            }
        }
    }
}

impl Downstream for GrpcDownstream {
    async fn get(
        &mut self,
        channel: &str,
        client_id: &str,
        max_items: i32,
        wait_ms: i32,
    ) -> Result<Batch, BackendError> {
        let req = get_request(channel, client_id, max_items, wait_ms);
        let limit = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0).max(1000))
            + self.shared.deadline;
        let id = req.request_id.clone();
        let wait = match self.stream.as_ref() {
            None => self.open_with(&req, limit).await?,
            Some(s) => {
                s.check()?;
                let (done, wait) = oneshot::channel();
                s.waiters().insert(id.clone(), done);
                if s.tx.send(req).await.is_err() {
                    s.waiters().remove(&id);
                    return Err(BackendError::Unavailable("downstream stream lost".into()));
                }
                wait
            }
        };
        match tokio::time::timeout(limit, wait).await {
            Ok(Ok(r)) => {
                let batch = batch_from(r)?;
                self.ready.fetched(
                    channel,
                    usize::try_from(max_items).unwrap_or(0),
                    batch.messages.len(),
                );
                Ok(batch)
            }
            Ok(Err(_)) => Err(BackendError::Unavailable(
                "downstream stream lost during Get".into(),
            )),
            Err(_) => {
                if let Some(s) = self.stream.as_ref() {
                    s.waiters().remove(&id);
                }
                Err(BackendError::Unavailable("Get deadline exceeded".into()))
            }
        }
    }

    fn returned(&mut self, channel: &str, count: usize) {
        self.ready.returned(channel, count);
    }

    async fn ack(&mut self, transaction: &str, sequences: &[u64]) -> Result<(), BackendError> {
        self.settle(settle_request(Op::AckRange, transaction, sequences, ""))
            .await
    }

    async fn nack(&mut self, transaction: &str, sequences: &[u64]) -> Result<(), BackendError> {
        self.settle(settle_request(Op::NAckRange, transaction, sequences, ""))
            .await
    }

    async fn requeue(
        &mut self,
        transaction: &str,
        sequences: &[u64],
        channel: &str,
    ) -> Result<(), BackendError> {
        let request = settle_request(Op::ReQueueRange, transaction, sequences, channel);
        self.settle(request).await
    }

    async fn close(&mut self, transaction: &str) -> Result<(), BackendError> {
        self.settle(settle_request(Op::CloseByClient, transaction, &[], ""))
            .await
    }

    async fn handled(&mut self, transaction: &str) -> Result<Handled, BackendError> {
        let Some(s) = self.stream.as_ref() else {
            return Ok(Handled::now());
        };
        s.check()?;
        // ActiveOffsets is answered whether the transaction is open, closed or unknown, and
        // only after what came before it on the stream (KMQ-5).
        let req = settle_request(Op::ActiveOffsets, transaction, &[], "");
        let id = req.request_id.clone();
        let (done, answer) = oneshot::channel();
        {
            let mut waiters = s.waiters();
            forget_unheard(&mut waiters);
            waiters.insert(id.clone(), done);
        }
        if s.tx.send(req).await.is_err() {
            s.waiters().remove(&id);
            return Err(BackendError::Unavailable("downstream stream lost".into()));
        }
        Ok(Handled::when(answer))
    }
}

impl GrpcDownstream {
    /// Sends one settlement request on the stream the transaction's Get went on; KubeMQ answers
    /// a successful one with nothing.
    async fn settle(&mut self, req: QueuesDownstreamRequest) -> Result<(), BackendError> {
        // A transaction exists only on a stream that a Get opened.
        let Some(s) = self.stream.as_ref() else {
            return Err(BackendError::Unavailable(
                "no downstream stream for this transaction".into(),
            ));
        };
        s.check()?;
        s.tx.send(req)
            .await
            .map_err(|_| BackendError::Unavailable("downstream stream lost".into()))
    }
}

/// The Batch of a Get's response, or KubeMQ's refusal.
fn batch_from(r: crate::kubemq::QueuesDownstreamResponse) -> Result<Batch, BackendError> {
    if r.is_error {
        return Err(BackendError::refusal(r.error));
    }
    Ok(Batch {
        transaction_id: r.transaction_id,
        messages: r.messages,
    })
}

/// A Get request of the downstream protocol.
fn get_request(
    channel: &str,
    client_id: &str,
    max_items: i32,
    wait_ms: i32,
) -> crate::kubemq::QueuesDownstreamRequest {
    crate::kubemq::QueuesDownstreamRequest {
        request_id: crate::kubemq::new_id(),
        client_id: client_id.to_string(),
        request_type_data: Op::Get as i32,
        channel: channel.to_string(),
        max_items,
        wait_timeout: wait_ms,
        ..Default::default()
    }
}

/// A settlement request of the downstream protocol.
fn settle_request(
    op: Op,
    transaction: &str,
    sequences: &[u64],
    channel: &str,
) -> QueuesDownstreamRequest {
    QueuesDownstreamRequest {
        request_id: crate::kubemq::new_id(),
        request_type_data: op as i32,
        ref_transaction_id: transaction.to_string(),
        sequence_range: sequences.iter().map(|s| *s as i64).collect(),
        re_queue_channel: channel.to_string(),
        ..Default::default()
    }
}

impl Backend for KubemqGrpc {
    type Downstream = GrpcDownstream;

    async fn send_queue(
        &self,
        lane: u64,
        messages: Vec<QueueMessage>,
    ) -> Result<Vec<SendQueueMessageResult>, BackendError> {
        let (done, wait) = oneshot::channel();
        let sending = self.ready.sending(&messages);
        let sent = match self.upstream.get(stream_of(lane)) {
            Some(batcher) => batcher.send(Pending { messages, done }).map_err(|_| ()),
            None => Err(()),
        };
        let result = match sent {
            Ok(()) => wait
                .await
                .map_err(|_| BackendError::Unavailable("send batcher stopped".into()))
                .and_then(|r| r),
            Err(_) => Err(BackendError::Unavailable("send batcher stopped".into())),
        };
        sending.finish(result.as_deref().unwrap_or_default());
        result
    }

    fn with_credential(&self, credential: &Credential) -> Option<Self> {
        // A JWT that passed verification is base64url and dots, always valid metadata; one that
        // were not goes without a token, so KubeMQ refuses it rather than taking the
        // connector's own.
        let token = MetadataValue::try_from(credential.expose()).ok();
        Some(KubemqGrpc::over(
            Shared {
                client: self.shared.client.clone(),
                token,
                deadline: self.shared.deadline,
                verify_first_events: true,
            },
            self.ready.clone(),
            self.answers.clone(),
        ))
    }

    fn captures(&self) -> bool {
        // A real KubeMQ v2.4 does; the store's façade, also reached this way, has the same
        // settlements either way.
        true
    }

    fn stored_hint(&self, channel: &str) -> u64 {
        self.ready.stored(channel)
    }

    fn ready_changes(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        Some(self.ready.changes())
    }

    fn watch_queue(&self, channel: &str) -> Option<watch::Receiver<QueueView>> {
        // Every Get KubeMQ serves holds one of its shared clients for its whole wait (KMQ-21).
        Some(self.ready.watch().watch(channel))
    }

    fn ready_hint(&self, channel: &str) -> ReadyHint {
        match self.ready.ready(channel) {
            Some(n) => ReadyHint::Estimate(n),
            None => ReadyHint::Unknown,
        }
    }

    async fn open_downstream(&self) -> Result<GrpcDownstream, BackendError> {
        // The stream itself opens with the session's first Get (see GrpcDownstream).
        Ok(GrpcDownstream {
            shared: self.shared.clone(),
            stream: None,
            ready: self.ready.clone(),
        })
    }

    async fn queues_info(&self, filter: &str) -> Result<QueuesInfo, BackendError> {
        let shared = self.shared.clone();
        let filter = filter.to_string();
        let r = self
            .unary(|mut c| {
                let req = shared.request(QueuesInfoRequest {
                    request_id: new_id(),
                    queue_name: filter.clone(),
                });
                async move { c.queues_info(req).await }
            })
            .await?;
        Ok(r.info.unwrap_or_default())
    }

    /// A peek for no message: KubeMQ v2.4 checks a ReceiveQueueMessages against its access
    /// control before anything else, then refuses one that asks for no message (`Error 122`)
    /// before it subscribes or waits (KMQ-23). That refusal says the read is allowed; an access
    /// refusal says it is not; anything else (a server without the call) cannot tell.
    async fn check_read(&self, channel: &str, client_id: &str) -> Result<ReadCheck, BackendError> {
        let shared = self.shared.clone();
        let r = self
            .unary(|mut c| {
                let req = shared.request(ReceiveQueueMessagesRequest {
                    request_id: new_id(),
                    client_id: client_id.to_string(),
                    channel: channel.to_string(),
                    max_number_of_messages: 0,
                    wait_time_seconds: 0,
                    is_peak: true,
                });
                async move { c.receive_queue_messages(req).await }
            })
            .await;
        match r {
            Ok(answer) if answer.is_error && kubemq_code(&answer.error) == Some(122) => {
                Ok(ReadCheck::Allowed)
            }
            Ok(_) => Ok(ReadCheck::Unknown),
            Err(e @ BackendError::Unauthorized(_)) => Err(e),
            Err(_) => Ok(ReadCheck::Unknown),
        }
    }

    async fn ping(&self) -> Result<PingResult, BackendError> {
        let shared = self.shared.clone();
        self.unary(|mut c| {
            let req = shared.request(Empty {});
            async move { c.ping(req).await }
        })
        .await
    }

    async fn send_event(&self, event: Event) -> Result<String, BackendError> {
        let (done, result) = oneshot::channel();
        self.events
            .send(super::event_sender::EventSend { event, done })
            .map_err(|_| BackendError::Unavailable("event sender stopped".into()))?;
        result
            .await
            .map_err(|_| BackendError::Unavailable("event sender stopped".into()))?
    }

    async fn subscribe_events(&self, request: Subscribe) -> Result<EventStream, BackendError> {
        let req = self.shared.request(request);
        let stream = subscription(self.shared.client.clone(), move |mut c| async move {
            c.subscribe_to_events(req).await
        })
        .await?;
        Ok(Box::pin(stream))
    }

    async fn send_request(&self, request: Request) -> Result<Response, BackendError> {
        // Sent once: a command must not run twice because a retry crossed its first attempt.
        let wait = Duration::from_millis(u64::try_from(request.timeout).unwrap_or(0));
        let mut client = self.shared.client.clone();
        let req = self.shared.request(request);
        match tokio::time::timeout(wait + self.shared.deadline, client.send_request(req)).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) if retryable(&s) => Err(unavailable(&s)),
            Ok(Err(s)) => Err(refused(&s)),
            Err(_) => Err(BackendError::Unavailable("deadline exceeded".into())),
        }
    }

    async fn subscribe_requests(&self, request: Subscribe) -> Result<RequestStream, BackendError> {
        let req = self.shared.request(request);
        let stream = subscription(self.shared.client.clone(), move |mut c| async move {
            c.subscribe_to_requests(req).await
        })
        .await?;
        Ok(Box::pin(stream))
    }

    async fn send_response(&self, response: Response) -> Result<(), BackendError> {
        let shared = self.shared.clone();
        self.unary(|mut c| {
            let req = shared.request(response.clone());
            async move { c.send_response(req).await }
        })
        .await
        .map(|Empty {}| ())
    }
}

/// Opens a server-streaming subscription with `open` and reads it in a task of its own, so that
/// its items wait in a bounded buffer for the bridge. Counts as open once KubeMQ answered, or
/// after [`SUBSCRIBE_ANSWER`] without a refusal (grpc-go sends the headers with the first item);
/// a refusal after that comes in the stream.
async fn subscription<T, F, Fut>(
    client: KubemqClient<Channel>,
    open: F,
) -> Result<ReceiverStream<Result<T, BackendError>>, BackendError>
where
    T: Send + 'static,
    F: FnOnce(KubemqClient<Channel>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<tonic::Response<tonic::Streaming<T>>, Status>> + Send,
{
    let (tx, rx) = mpsc::channel::<Result<T, BackendError>>(SUBSCRIPTION_BUFFER);
    let (answered, answer) = oneshot::channel::<Result<(), BackendError>>();
    tokio::spawn(async move {
        let opened = tokio::select! {
            r = open(client) => r,
            // The subscriber left before KubeMQ answered.
            _ = tx.closed() => return,
        };
        let mut stream = match opened {
            Ok(r) => {
                let _ = answered.send(Ok(()));
                r.into_inner()
            }
            Err(s) => {
                let e = failure(&s);
                // Told to the subscriber as the answer, or in the stream if it came late.
                if let Err(Err(e)) = answered.send(Err(e)) {
                    let _ = tx.send(Err(e)).await;
                }
                return;
            }
        };
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                _ = tx.closed() => return,
            };
            let item = match item {
                Some(Ok(e)) => Ok(e),
                Some(Err(s)) => Err(failure(&s)),
                None => Err(BackendError::Unavailable(
                    "subscription ended by KubeMQ".into(),
                )),
            };
            let end = item.is_err();
            if tx.send(item).await.is_err() || end {
                return;
            }
        }
    });
    match tokio::time::timeout(SUBSCRIBE_ANSWER, answer).await {
        Ok(Ok(Err(e))) => Err(e),
        Ok(Err(_)) => Err(BackendError::Unavailable("subscription task ended".into())),
        // Open, or not answered yet (items, then any refusal, come in the stream).
        Ok(Ok(Ok(()))) | Err(_) => Ok(ReceiverStream::new(rx)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The queues bridge hands produce links consecutive lanes, so links opened one after another
    /// each get a stream of their own (up to UPSTREAM_STREAMS) instead of one waiting for the
    /// other's batch on a shared one, wherever the count starts.
    #[test]
    fn consecutive_lanes_take_different_streams() {
        for first in [0u64, 7, u64::MAX - 2] {
            let streams: std::collections::HashSet<usize> = (0..UPSTREAM_STREAMS as u64)
                .map(|i| stream_of(first.wrapping_add(i)))
                .collect();
            assert_eq!(streams.len(), UPSTREAM_STREAMS, "from lane {first}");
        }
    }

    /// A request whose answer nobody waits for any more is forgotten; one still awaited stays.
    #[test]
    fn unheard_requests_are_forgotten() {
        let mut waiters = HashMap::new();
        let (heard, _kept) = oneshot::channel();
        let (unheard, gone) = oneshot::channel();
        waiters.insert("heard".to_string(), heard);
        waiters.insert("unheard".to_string(), unheard);
        drop(gone);
        forget_unheard(&mut waiters);
        assert_eq!(waiters.keys().collect::<Vec<_>>(), ["heard"]);
    }

    /// Where KubeMQ authorizes, a denied send is its Error 412 in the upstream result.
    #[test]
    fn an_upstream_error_412_is_unauthorized() {
        let reply = QueuesUpstreamResponse {
            ref_request_id: "r".into(),
            is_error: true,
            error: "Error 412: access denied to resource".into(),
            ..Default::default()
        };
        assert!(matches!(
            judge(Some(Ok(reply)), "r").0,
            Err(BackendError::Unauthorized(_))
        ));
        let get = crate::kubemq::QueuesDownstreamResponse {
            is_error: true,
            error: "Error 412: access denied to resource".into(),
            ..Default::default()
        };
        assert!(matches!(
            super::batch_from(get),
            Err(BackendError::Unauthorized(_))
        ));
    }
}
