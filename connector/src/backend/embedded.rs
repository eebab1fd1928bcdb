//! The in-process backend: the durable store, with exactly the request/response semantics the
//! gRPC façade serves, minus the socket.

use std::sync::Arc;

use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use super::{Backend, BackendError, Batch, Downstream, EventStream, ReadyHint, RequestStream};
use crate::kubemq::REPORTED_VERSION;
use crate::kubemq::{
    Event, PingResult, QueueMessage, QueuesInfo, Request, Response, SendQueueMessageResult,
    Subscribe,
};
use crate::store::session::{Disposal, GetRequest, Session, TxnId, Which};
use crate::store::{now_ns, Store, TxnError};

/// Longest wait for a replaying subscription's first stored event (it is read from disk).
const FIRST_REPLAYED: std::time::Duration = std::time::Duration::from_secs(2);

/// The embedded store as a backend.
#[derive(Clone)]
pub struct Embedded {
    store: Arc<Store>,
    started: i64,
}

impl Embedded {
    /// A backend over an open store.
    pub fn new(store: Arc<Store>) -> Self {
        Embedded {
            store,
            started: now_ns() / 1_000_000_000,
        }
    }
}

/// A consumer session of the store, called directly.
pub struct EmbeddedDownstream(Session);

impl EmbeddedDownstream {
    /// Settles `sequences` of `transaction` with `disposal`.
    async fn settle(
        &mut self,
        transaction: &str,
        disposal: Disposal,
        sequences: &[u64],
    ) -> Result<(), BackendError> {
        let listed = Which::Listed(sequences.iter().map(|s| *s as i64).collect());
        self.0
            .settle(&TxnId::from(transaction), disposal, listed)
            .await
            .map_err(refused)
    }
}

/// A settlement the store refused: KubeMQ's refusal of a transaction's request, in its words.
fn refused(e: TxnError) -> BackendError {
    BackendError::Rejected(e.to_string())
}

impl Downstream for EmbeddedDownstream {
    async fn get(
        &mut self,
        channel: &str,
        client_id: &str,
        max_items: i32,
        wait_ms: i32,
    ) -> Result<Batch, BackendError> {
        let got = self
            .0
            .get(GetRequest {
                channel,
                client_id,
                max_items,
                wait_ms,
                auto_ack: false,
            })
            .await?;
        Ok(Batch {
            transaction_id: got.transaction.to_string(),
            messages: got.messages,
        })
    }

    async fn ack(&mut self, transaction: &str, sequences: &[u64]) -> Result<(), BackendError> {
        self.settle(transaction, Disposal::Ack, sequences).await
    }

    async fn nack(&mut self, transaction: &str, sequences: &[u64]) -> Result<(), BackendError> {
        self.settle(transaction, Disposal::Nack, sequences).await
    }

    async fn requeue(
        &mut self,
        transaction: &str,
        sequences: &[u64],
        channel: &str,
    ) -> Result<(), BackendError> {
        let disposal = Disposal::Requeue {
            channel: channel.to_string(),
        };
        self.settle(transaction, disposal, sequences).await
    }

    async fn close(&mut self, transaction: &str) -> Result<(), BackendError> {
        self.0.close(&TxnId::from(transaction)).map_err(refused)
    }
}

impl Backend for Embedded {
    type Downstream = EmbeddedDownstream;

    async fn send_queue(
        &self,
        _lane: u64,
        messages: Vec<QueueMessage>,
    ) -> Result<Vec<SendQueueMessageResult>, BackendError> {
        // One order for every lane: the store takes each call's place at its first poll.
        Ok(self.store.send(messages).await)
    }

    async fn open_downstream(&self) -> Result<EmbeddedDownstream, BackendError> {
        Ok(EmbeddedDownstream(Session::new(self.store.clone())))
    }

    async fn queues_info(&self, filter: &str) -> Result<QueuesInfo, BackendError> {
        // The façade's answer: one translation of the store's figures into KubeMQ's.
        Ok(crate::facade::queues_info(&self.store, filter))
    }

    fn ready_hint(&self, channel: &str) -> ReadyHint {
        ReadyHint::Exact(self.store.ready_count(channel) as u64)
    }

    async fn send_event(&self, event: Event) -> Result<String, BackendError> {
        self.store
            .send_event(event)
            .await
            .map_err(BackendError::from)
    }

    async fn subscribe_events(&self, request: Subscribe) -> Result<EventStream, BackendError> {
        let subscribed = self
            .store
            .subscribe_events(&request)
            .map_err(BackendError::from)?;
        let mut events = subscribed.events;
        // An events-store subscription that replays stored events counts as open once the first
        // is read, as it does over gRPC (KubeMQ's answer comes with the first event): a drain
        // right after the attach then finds them (ES-9).
        let first = if subscribed.replaying {
            tokio::time::timeout(FIRST_REPLAYED, events.recv())
                .await
                .ok()
                .flatten()
        } else {
            None
        };
        let rest = ReceiverStream::new(events);
        Ok(Box::pin(tokio_stream::iter(first).chain(rest).map(Ok)) as EventStream)
    }

    async fn send_request(&self, request: Request) -> Result<Response, BackendError> {
        self.store
            .requests()
            .send(request)
            .await
            .map_err(BackendError::from)
    }

    async fn subscribe_requests(&self, request: Subscribe) -> Result<RequestStream, BackendError> {
        self.store
            .subscribe_requests(&request)
            .map(|rx| Box::pin(ReceiverStream::new(rx).map(Ok)) as RequestStream)
            .map_err(BackendError::from)
    }

    async fn send_response(&self, response: Response) -> Result<(), BackendError> {
        self.store
            .requests()
            .respond(response)
            .map_err(BackendError::from)
    }

    async fn forget_cursor(&self, client_id: &str) -> Result<bool, BackendError> {
        Ok(self.store.streams().forget(client_id) > 0)
    }

    async fn ping(&self) -> Result<PingResult, BackendError> {
        let now = now_ns() / 1_000_000_000;
        Ok(PingResult {
            host: std::env::var("HOSTNAME").unwrap_or_else(|_| "kubemq-amqp-connector".into()),
            version: REPORTED_VERSION.into(),
            server_start_time: self.started,
            server_up_time_seconds: now - self.started,
        })
    }
}
