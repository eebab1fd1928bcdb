//! Event sends over one SendEventsStream: a bidirectional stream keeps a publisher's events in
//! the order they were sent (concurrent unary SendEvent calls would not), and costs one message
//! per event instead of one call. KubeMQ answers every events-store event (`Store = true`) with
//! a Result, matched here by EventID, and an event (`Store = false`) only when it failed: such a
//! send is done once it is on the stream, and a late failure is logged. Where clients
//! authenticate, a KubeMQ that authorizes decides by ClientID and channel, so the first event of
//! each ClientID and channel goes alone as a unary call and is done with KubeMQ's verdict
//! (AUTHZ-9): an event KubeMQ refuses is never accepted first. Without authentication no event
//! waits: a unary call would hold every connection's events behind it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

use super::BackendError;
use crate::kubemq::kubemq_client::KubemqClient;
use crate::kubemq::{new_id, Event};

/// Events waiting to be written to the stream at most.
const STREAM_QUEUE: usize = 1024;

/// ClientID and channel pairs whose first event KubeMQ took, remembered at most; past this the
/// memory starts again (each pair then costs one more unary call).
const MAX_VERIFIED: usize = 4096;

/// One send: the event and where its outcome goes.
pub struct EventSend {
    /// The event.
    pub event: Event,
    /// Its EventID, or why it failed.
    pub done: oneshot::Sender<Result<String, BackendError>>,
}

type Waiting = Arc<Mutex<HashMap<String, oneshot::Sender<Result<String, BackendError>>>>>;

/// Starts the sender; sends queued on the returned channel go out in order. With `verify`, the
/// first event per ClientID and channel waits for KubeMQ's verdict; a unary call that is not
/// answered within `deadline` leaves its event's fate unknown.
pub fn spawn(
    client: KubemqClient<Channel>,
    token: Option<MetadataValue<Ascii>>,
    deadline: Duration,
    verify: bool,
) -> mpsc::UnboundedSender<EventSend> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(client, token, deadline, verify, rx));
    tx
}

/// The ClientID and channel of an event: what a KubeMQ that authorizes decides by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Sender {
    client_id: String,
    channel: String,
}

async fn run(
    client: KubemqClient<Channel>,
    token: Option<MetadataValue<Ascii>>,
    deadline: Duration,
    verify: bool,
    mut sends: mpsc::UnboundedReceiver<EventSend>,
) {
    let mut verified: HashSet<Sender> = HashSet::new();
    let mut next = sends.recv().await;
    while next.is_some() {
        // A stream, opened for the first send after the last one was lost.
        let (stream_tx, stream_rx) = mpsc::channel::<Event>(STREAM_QUEUE);
        let waiting: Waiting = Arc::default();
        let mut request = tonic::Request::new(ReceiverStream::new(stream_rx));
        if let Some(t) = &token {
            request.metadata_mut().insert("authorization", t.clone());
        }
        tokio::spawn(read_results(client.clone(), request, waiting.clone()));
        while let Some(mut s) = next.take() {
            if s.event.event_id.is_empty() {
                s.event.event_id = new_id();
            }
            let id = s.event.event_id.clone();
            let sender = Sender {
                client_id: s.event.client_id.clone(),
                channel: s.event.channel.clone(),
            };
            if verify && !s.event.store && !verified.contains(&sender) {
                // Later sends wait behind this one, so that one sender's events stay in order.
                let verdict = unary(&client, &token, deadline, s.event).await;
                if verdict.is_ok() {
                    if verified.len() >= MAX_VERIFIED {
                        verified.clear();
                    }
                    verified.insert(sender);
                }
                let _ = s.done.send(verdict);
                next = sends.recv().await;
                continue;
            }
            // An events-store send waits for its Result; an event's is done once it is written.
            let done_now = if s.event.store {
                lock(&waiting).insert(id.clone(), s.done);
                None
            } else {
                Some(s.done)
            };
            if stream_tx.send(s.event).await.is_err() {
                // The stream is gone: this send failed, the next one opens a new stream.
                let done = done_now.or_else(|| lock(&waiting).remove(&id));
                if let Some(done) = done {
                    let _ = done.send(Err(lost()));
                }
                break;
            }
            if let Some(done) = done_now {
                let _ = done.send(Ok(id));
            }
            next = sends.recv().await;
        }
        fail_all(&waiting);
        if next.is_none() {
            next = sends.recv().await;
        }
    }
}

/// Sends `event` by itself and returns KubeMQ's verdict on it.
async fn unary(
    client: &KubemqClient<Channel>,
    token: &Option<MetadataValue<Ascii>>,
    deadline: Duration,
    event: Event,
) -> Result<String, BackendError> {
    let mut request = tonic::Request::new(event);
    if let Some(t) = token {
        request.metadata_mut().insert("authorization", t.clone());
    }
    let mut client = client.clone();
    match tokio::time::timeout(deadline, client.send_event(request)).await {
        Ok(Ok(r)) => {
            let r = r.into_inner();
            if r.sent {
                Ok(r.event_id)
            } else {
                Err(BackendError::refusal(r.error))
            }
        }
        Ok(Err(status)) => Err(super::status::failure(&status)),
        // It may have been delivered: its outcome is not known (ERR-10).
        Err(_) => Err(BackendError::Unknown("no answer from KubeMQ".into())),
    }
}

/// Reads KubeMQ's Results until the stream ends, completing the sends they answer.
async fn read_results(
    mut client: KubemqClient<Channel>,
    request: tonic::Request<ReceiverStream<Event>>,
    waiting: Waiting,
) {
    let mut results = match client.send_events_stream(request).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
            tracing::debug!(error = %s, "SendEventsStream failed");
            fail_all(&waiting);
            return;
        }
    };
    while let Some(Ok(r)) = results.next().await {
        let done = lock(&waiting).remove(&r.event_id);
        match done {
            Some(done) if r.sent => {
                let _ = done.send(Ok(r.event_id));
            }
            Some(done) => {
                let _ = done.send(Err(BackendError::refusal(r.error)));
            }
            None if !r.sent => {
                tracing::warn!(event_id = %r.event_id, error = %r.error, "KubeMQ refused an event");
            }
            None => {}
        }
    }
    fail_all(&waiting);
}

fn lock(
    w: &Waiting,
) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Result<String, BackendError>>>> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

fn lost() -> BackendError {
    BackendError::Unavailable("event stream lost".into())
}

fn fail_all(waiting: &Waiting) {
    for (_, done) in lock(waiting).drain() {
        let _ = done.send(Err(lost()));
    }
}
