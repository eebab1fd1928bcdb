//! Event sends over one SendEventsStream: a bidirectional stream keeps a publisher's events in
//! the order they were sent (concurrent unary SendEvent calls would not), and costs one message
//! per event instead of one call. KubeMQ answers every events-store event (`Store = true`) with
//! a Result, matched here by EventID, and an event (`Store = false`) only when it failed: such a
//! send is done once it is on the stream, and a late failure is logged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

/// One send: the event and where its outcome goes.
pub struct EventSend {
    /// The event.
    pub event: Event,
    /// Its EventID, or why it failed.
    pub done: oneshot::Sender<Result<String, BackendError>>,
}

type Waiting = Arc<Mutex<HashMap<String, oneshot::Sender<Result<String, BackendError>>>>>;

/// Starts the sender; sends queued on the returned channel go out in order.
pub fn spawn(
    client: KubemqClient<Channel>,
    token: Option<MetadataValue<Ascii>>,
) -> mpsc::UnboundedSender<EventSend> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(client, token, rx));
    tx
}

async fn run(
    client: KubemqClient<Channel>,
    token: Option<MetadataValue<Ascii>>,
    mut sends: mpsc::UnboundedReceiver<EventSend>,
) {
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
                let _ = done.send(Err(BackendError::Rejected(r.error)));
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
