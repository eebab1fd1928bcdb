//! The embedded store served as KubeMQ's gRPC API (queues, events, events-store and Ping), so that the
//! connector's KubeMQ client, KubeMQ's own SDKs and tests can all talk to it over a real socket:
//! the one place that reads KubeMQ's requests into the store's calls and writes the store's
//! answers as KubeMQ's ([`downstream`] for the QueuesDownstream stream). For tests it can also
//! imitate how KubeMQ v2.4's server differs from the store (`capture`, compiled with the
//! `kubemq-imitation` feature).
//! Errors are placed as KubeMQ places them (KMQ-3): in-band for queue sends and
//! streams and SendEventsStream, gRPC INTERNAL with KubeMQ's `Error NNN` text for events and
//! subscriptions. Commands, Queries and the legacy queue RPCs answer UNIMPLEMENTED until their
//! patterns exist.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

#[cfg(any(test, feature = "kubemq-imitation"))]
pub mod capture;
pub mod downstream;

use self::downstream::Downstream;
use crate::auth::jwt::JwtVerifier;
use crate::kubemq::kubemq_server::{Kubemq, KubemqServer};
use crate::kubemq::transport::{CONNECTION_WINDOW, MAX_FRAME, MAX_GRPC_MESSAGE, STREAM_WINDOW};
use crate::kubemq::REPORTED_VERSION;
use crate::kubemq::{
    AckAllQueueMessagesRequest, AckAllQueueMessagesResponse, Empty, Event, EventReceive,
    PingResult, QueueInfo, QueueMessage, QueueMessagesBatchRequest, QueueMessagesBatchResponse,
    QueuesDownstreamRequest, QueuesDownstreamResponse, QueuesInfo, QueuesInfoRequest,
    QueuesInfoResponse, QueuesUpstreamRequest, QueuesUpstreamResponse, ReceiveQueueMessagesRequest,
    ReceiveQueueMessagesResponse, SendQueueMessageResult, StreamQueueMessagesRequest,
    StreamQueueMessagesResponse, Subscribe,
};
use crate::store::session::TxnWatcher;
use crate::store::StoreError;
use crate::store::{now_ns, Sent, Store};
use tonic::codegen::http;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// How KubeMQ v2.4's server differs from the store, imitated by a façade that stands in for it
/// in tests: it watches the transactions (KMQ-2, KMQ-20) and loses some answers (KMQ-19).
pub(crate) trait Imitation: TxnWatcher {
    /// Whether the QueuesUpstream request whose first message is `first` is stored and never
    /// answered.
    fn loses_answer(&self, first: &QueueMessage) -> bool;
}

/// The gRPC service over a store.
pub struct Facade {
    store: Arc<Store>,
    started: Instant,
    started_unix: i64,
    /// How KubeMQ v2.4 differs, when the façade imitates it (tests only).
    imitation: Option<Arc<dyn Imitation>>,
}

impl Facade {
    /// A façade over `store`, with the store's own semantics.
    pub fn new(store: Arc<Store>) -> Self {
        Facade {
            store,
            started: Instant::now(),
            started_unix: now_ns() / 1_000_000_000,
            imitation: None,
        }
    }

    /// A façade over `store` whose open transactions capture messages the way a real KubeMQ
    /// v2.4's do ([`capture`]): what the connector meets on the real broker, for tests.
    #[cfg(any(test, feature = "kubemq-imitation"))]
    pub fn imitating_kubemq(store: Arc<Store>) -> Self {
        Facade {
            imitation: Some(capture::Capture::new()),
            ..Self::new(store)
        }
    }

    /// Stores `messages` and lets open transactions capture them, as KubeMQ's would.
    async fn send(&self, messages: Vec<QueueMessage>) -> Sent {
        store_and_capture(&self.store, self.imitation.as_deref(), messages).await
    }

    /// The tonic service with KubeMQ's 100 MiB message limits.
    pub fn into_service(self) -> KubemqServer<Facade> {
        KubemqServer::new(self)
            .max_decoding_message_size(MAX_GRPC_MESSAGE)
            .max_encoding_message_size(MAX_GRPC_MESSAGE)
    }
}

/// KubeMQ's QueuesInfo answer for the queues `filter` names (its `;`-separated list; empty for
/// every queue), with its totals, from the store's figures (decisions.md says what each means).
pub fn queues_info(store: &Store, filter: &str) -> QueuesInfo {
    let queues: Vec<QueueInfo> = store
        .queue_stats(filter)
        .into_iter()
        .map(|s| QueueInfo {
            messages: (s.ready + s.locked) as i64,
            first_sequence: s.first_sequence as i64,
            last_sequence: s.last_sequence as i64,
            sent: s.last_sequence as i64,
            delivered: s.locked as i64,
            // As KubeMQ counts it: a message sent to a consumer and not yet settled still waits.
            waiting: (s.ready + s.locked) as i64,
            name: s.name,
            ..Default::default()
        })
        .collect();
    QueuesInfo {
        total_queue: queues.len() as i32,
        sent: queues.iter().map(|q| q.sent).sum(),
        delivered: queues.iter().map(|q| q.delivered).sum(),
        waiting: queues.iter().map(|q| q.waiting).sum(),
        queues,
    }
}

/// Serves the façade on `listener` until `shutdown` resolves; with `tokens`, callers must
/// present a token it accepts (see [`serve_facade`]).
pub async fn serve(
    store: Arc<Store>,
    listener: tokio::net::TcpListener,
    tokens: Option<Arc<JwtVerifier>>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_facade(Facade::new(store), listener, tokens, shutdown).await
}

/// What KubeMQ with authentication enabled checks before any call but Ping: an
/// `authorization` metadata value (the bare token) that verifies; otherwise the call is
/// answered `Unauthenticated`.
// The refusal is the HTTP response itself, the type tower-http's validator returns.
#[allow(clippy::result_large_err)]
fn token_check(
    tokens: Option<Arc<JwtVerifier>>,
) -> impl FnMut(&mut http::Request<tonic::body::Body>) -> Result<(), http::Response<tonic::body::Body>>
       + Clone {
    move |req| {
        let Some(verifier) = &tokens else {
            return Ok(());
        };
        if req.uri().path().ends_with("/Ping") {
            return Ok(());
        }
        let refused = |text: String| Err(tonic::Status::unauthenticated(text).into_http());
        match req.headers().get("authorization").map(|v| v.to_str()) {
            None => refused("Authorization token is not supplied".into()),
            Some(Err(_)) => refused("invalid auth token: not ASCII".into()),
            Some(Ok(token)) => match verifier.check(token) {
                Ok(_) => Ok(()),
                Err(e) => refused(format!("invalid auth token: {}", e.0)),
            },
        }
    }
}

/// Serves `facade` on `listener` until `shutdown` resolves; with `tokens`, every call but Ping
/// must carry a token it accepts, as KubeMQ's with authentication enabled.
pub async fn serve_facade(
    facade: Facade,
    listener: tokio::net::TcpListener,
    tokens: Option<Arc<JwtVerifier>>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .layer(
            tower_http::validate_request::ValidateRequestHeaderLayer::custom(token_check(tokens)),
        )
        // A QueuesUpstream batch is often larger than HTTP/2's default 64 KiB window, which
        // would cost a WINDOW_UPDATE round trip per batch (KubeMQ's own server grows its window).
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
        .max_frame_size(Some(MAX_FRAME))
        .add_service(facade.into_service())
        .serve_with_incoming_shutdown(
            // Small replies must not wait for Nagle's algorithm.
            TcpListenerStream::new(listener).map(|s| {
                s.inspect(|s| {
                    let _ = s.set_nodelay(true);
                })
            }),
            shutdown,
        )
        .await
}

/// Answers a streaming call as KubeMQ's grpc-go server does: the response headers go out with
/// the first response, not before. A client that awaits the headers before writing its first
/// request waits forever here, as it would against KubeMQ.
async fn headers_with_first<T: Send + 'static>(
    mut rx: mpsc::Receiver<Result<T, Status>>,
) -> Result<Response<BoxStream<T>>, Status> {
    let stream: BoxStream<T> = match rx.recv().await {
        Some(first) => Box::pin(tokio_stream::once(first).chain(ReceiverStream::new(rx))),
        None => Box::pin(tokio_stream::empty()),
    };
    Ok(Response::new(stream))
}

/// Stores `messages`; then, with an imitation, open transactions take what they have room for.
async fn store_and_capture(
    store: &Arc<Store>,
    imitation: Option<&dyn Imitation>,
    messages: Vec<QueueMessage>,
) -> Sent {
    let Some(c) = imitation else {
        return store.send_reporting(messages).await;
    };
    let mut channels: Vec<String> = messages.iter().map(|m| m.channel.clone()).collect();
    channels.sort_unstable();
    channels.dedup();
    let sent = store.send_reporting(messages).await;
    for ch in channels {
        c.arrived(store, &ch);
    }
    sent
}

/// A store refusal as KubeMQ answers it: status `Internal` with KubeMQ's text.
fn refused(e: StoreError) -> Status {
    Status::internal(e.to_string())
}

fn unimplemented<T>(what: &str) -> Result<T, Status> {
    Err(Status::unimplemented(format!(
        "{what} is not available in the embedded KubeMQ backend yet"
    )))
}

/// Serves a subscription's items as a response stream, ending it (and the subscription) when the
/// client leaves, also while nothing arrives.
async fn subscription<T: Send + 'static>(
    mut items: mpsc::Receiver<T>,
) -> Result<Response<BoxStream<T>>, Status> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                item = items.recv() => match item {
                    Some(item) => if tx.send(Ok(item)).await.is_err() { return },
                    None => return,
                },
                _ = tx.closed() => return,
            }
        }
    });
    headers_with_first(rx).await
}

#[tonic::async_trait]
impl Kubemq for Facade {
    async fn send_event(
        &self,
        request: Request<Event>,
    ) -> Result<Response<crate::kubemq::Result>, Status> {
        let event = request.into_inner();
        let event_id = self.store.send_event(event).await.map_err(refused)?;
        Ok(Response::new(crate::kubemq::Result {
            event_id,
            sent: true,
            error: String::new(),
        }))
    }

    type SendEventsStreamStream = BoxStream<crate::kubemq::Result>;
    async fn send_events_stream(
        &self,
        request: Request<Streaming<Event>>,
    ) -> Result<Response<Self::SendEventsStreamStream>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let store = self.store.clone();
        tokio::spawn(async move {
            while let Some(Ok(event)) = incoming.next().await {
                // KubeMQ answers every events-store send, and an events send only when it failed;
                // errors are in-band here.
                let stored = event.store;
                let id = event.event_id.clone();
                let result = match store.send_event(event).await {
                    Ok(event_id) if stored => Some(crate::kubemq::Result {
                        event_id,
                        sent: true,
                        error: String::new(),
                    }),
                    Ok(_) => None,
                    Err(error) => Some(crate::kubemq::Result {
                        event_id: id,
                        sent: false,
                        error: error.to_string(),
                    }),
                };
                if let Some(r) = result {
                    if tx.send(Ok(r)).await.is_err() {
                        return;
                    }
                }
            }
        });
        headers_with_first(rx).await
    }

    type SubscribeToEventsStream = BoxStream<EventReceive>;
    async fn subscribe_to_events(
        &self,
        request: Request<Subscribe>,
    ) -> Result<Response<Self::SubscribeToEventsStream>, Status> {
        let subscribed = self
            .store
            .subscribe_events(&request.into_inner())
            .map_err(refused)?;
        subscription(subscribed.events).await
    }

    type SubscribeToRequestsStream = BoxStream<crate::kubemq::Request>;
    async fn subscribe_to_requests(
        &self,
        request: Request<Subscribe>,
    ) -> Result<Response<Self::SubscribeToRequestsStream>, Status> {
        let requests = self
            .store
            .subscribe_requests(&request.into_inner())
            .map_err(refused)?;
        subscription(requests).await
    }

    async fn send_request(
        &self,
        request: Request<crate::kubemq::Request>,
    ) -> Result<Response<crate::kubemq::Response>, Status> {
        self.store
            .requests()
            .send(request.into_inner())
            .await
            .map(Response::new)
            .map_err(refused)
    }

    async fn send_response(
        &self,
        request: Request<crate::kubemq::Response>,
    ) -> Result<Response<Empty>, Status> {
        self.store
            .requests()
            .respond(request.into_inner())
            .map(|()| Response::new(Empty {}))
            .map_err(refused)
    }

    async fn send_queue_message(
        &self,
        req: Request<QueueMessage>,
    ) -> Result<Response<SendQueueMessageResult>, Status> {
        let mut r = self.send(vec![req.into_inner()]).await.results;
        r.pop()
            .map(Response::new)
            .ok_or_else(|| Status::internal("no result"))
    }

    async fn send_queue_messages_batch(
        &self,
        req: Request<QueueMessagesBatchRequest>,
    ) -> Result<Response<QueueMessagesBatchResponse>, Status> {
        let req = req.into_inner();
        if req.messages.is_empty() {
            return Err(Status::unknown("empty messages batch"));
        }
        let sent = self.send(req.messages).await;
        // HaveErrors reports store failures only, not validation failures (4.2 step 5).
        let (results, have_errors) = (sent.results, sent.storage_failed);
        Ok(Response::new(QueueMessagesBatchResponse {
            batch_id: req.batch_id,
            results,
            have_errors,
        }))
    }

    async fn receive_queue_messages(
        &self,
        _: Request<ReceiveQueueMessagesRequest>,
    ) -> Result<Response<ReceiveQueueMessagesResponse>, Status> {
        unimplemented("ReceiveQueueMessages")
    }

    type StreamQueueMessageStream = BoxStream<StreamQueueMessagesResponse>;
    async fn stream_queue_message(
        &self,
        _: Request<Streaming<StreamQueueMessagesRequest>>,
    ) -> Result<Response<Self::StreamQueueMessageStream>, Status> {
        unimplemented("StreamQueueMessage")
    }

    async fn ack_all_queue_messages(
        &self,
        req: Request<AckAllQueueMessagesRequest>,
    ) -> Result<Response<AckAllQueueMessagesResponse>, Status> {
        let req = req.into_inner();
        let fail = |e: StoreError| AckAllQueueMessagesResponse {
            request_id: req.request_id.clone(),
            is_error: true,
            error: e.to_string(),
            ..Default::default()
        };
        if req.client_id.is_empty() {
            return Ok(Response::new(fail(StoreError::ClientIdEmpty)));
        }
        if !crate::store::errors::valid_queue_name(&req.channel) {
            return Ok(Response::new(fail(StoreError::QueueNameInvalid)));
        }
        let n = self.store.purge(&req.channel);
        Ok(Response::new(AckAllQueueMessagesResponse {
            request_id: req.request_id,
            affected_messages: n,
            ..Default::default()
        }))
    }

    async fn ping(&self, _: Request<Empty>) -> Result<Response<PingResult>, Status> {
        Ok(Response::new(PingResult {
            host: std::env::var("HOSTNAME").unwrap_or_else(|_| "kubemq-amqp-connector".into()),
            version: REPORTED_VERSION.into(),
            server_start_time: self.started_unix,
            server_up_time_seconds: self.started.elapsed().as_secs() as i64,
        }))
    }

    type QueuesDownstreamStream = BoxStream<QueuesDownstreamResponse>;
    async fn queues_downstream(
        &self,
        req: Request<Streaming<QueuesDownstreamRequest>>,
    ) -> Result<Response<Self::QueuesDownstreamStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let mut ds = match &self.imitation {
            Some(i) => Downstream::watched(self.store.clone(), i.clone()),
            None => Downstream::new(self.store.clone()),
        };
        tokio::spawn(async move {
            // One request at a time, in arrival order (4.3.1). A client that goes away cancels a
            // waiting Get at once; dropping `ds` returns every unsettled message (4.3.7).
            loop {
                let next = tokio::select! {
                    n = inbound.next() => n,
                    _ = tx.closed() => return,
                };
                let Some(Ok(request)) = next else { break };
                let resp = tokio::select! {
                    r = ds.handle(request) => r,
                    _ = tx.closed() => return,
                };
                if let Some(resp) = resp {
                    if tx.send(Ok(resp)).await.is_err() {
                        return;
                    }
                }
            }
            // Client EOF alone does not end the stream: hold its transactions until it leaves.
            tx.closed().await;
            drop(ds);
        });
        headers_with_first(rx).await
    }

    type QueuesUpstreamStream = BoxStream<QueuesUpstreamResponse>;
    async fn queues_upstream(
        &self,
        req: Request<Streaming<QueuesUpstreamRequest>>,
    ) -> Result<Response<Self::QueuesUpstreamStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let store = self.store.clone();
        let imitation = self.imitation.clone();
        tokio::spawn(async move {
            while let Some(Ok(request)) = inbound.next().await {
                let lose_answer = imitation
                    .as_ref()
                    .zip(request.messages.first())
                    .is_some_and(|(i, first)| i.loses_answer(first));
                if lose_answer {
                    store_and_capture(&store, imitation.as_deref(), request.messages).await;
                    continue;
                }
                let resp = if request.messages.is_empty() {
                    QueuesUpstreamResponse {
                        ref_request_id: request.request_id,
                        is_error: true,
                        error: "no messages to send".into(),
                        ..Default::default()
                    }
                } else {
                    QueuesUpstreamResponse {
                        ref_request_id: request.request_id,
                        results: store_and_capture(&store, imitation.as_deref(), request.messages)
                            .await
                            .results,
                        ..Default::default()
                    }
                };
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
            }
            tx.closed().await;
        });
        headers_with_first(rx).await
    }

    async fn queues_info(
        &self,
        req: Request<QueuesInfoRequest>,
    ) -> Result<Response<QueuesInfoResponse>, Status> {
        let req = req.into_inner();
        Ok(Response::new(QueuesInfoResponse {
            info: Some(queues_info(&self.store, &req.queue_name)),
            ref_request_id: req.request_id,
        }))
    }
}
