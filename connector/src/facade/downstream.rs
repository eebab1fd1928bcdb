//! One QueuesDownstream stream of the façade: KubeMQ's downstream requests read into calls on a
//! store [`Session`], and its answers and refusals written as KubeMQ writes them (KMQ-5, KMQ-6,
//! KMQ-7, KMQ-12). Requests are handled one at a time by the caller, in arrival order; a
//! successful settlement has no response.

use std::sync::Arc;

use crate::kubemq::{
    new_id, QueuesDownstreamRequest, QueuesDownstreamRequestType as Op, QueuesDownstreamResponse,
};
use crate::store::session::{Disposal, GetRequest, Session, TxnId, TxnWatcher, Which};
use crate::store::{Seq, Store, TxnError};

/// One stream: its session, whose transactions live as long as the stream.
pub struct Downstream {
    session: Session,
}

/// A refusal, echoing the transaction and the request.
fn error(
    txn_id: &str,
    req: &QueuesDownstreamRequest,
    op: Op,
    refusal: impl ToString,
) -> QueuesDownstreamResponse {
    QueuesDownstreamResponse {
        transaction_id: txn_id.to_string(),
        ref_request_id: req.request_id.clone(),
        request_type_data: op as i32,
        is_error: true,
        error: refusal.to_string(),
        ..Default::default()
    }
}

impl Downstream {
    /// A new stream on `store`.
    pub fn new(store: Arc<Store>) -> Self {
        Downstream {
            session: Session::new(store),
        }
    }

    /// A new stream whose transactions `watcher` watches (the façade's imitation of KubeMQ).
    pub fn watched(store: Arc<Store>, watcher: Arc<dyn TxnWatcher>) -> Self {
        Downstream {
            session: Session::watched(store, watcher),
        }
    }

    /// The session, for tests of its table.
    #[cfg(test)]
    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    /// Handles one request; `None` means success without a response.
    pub async fn handle(
        &mut self,
        req: QueuesDownstreamRequest,
    ) -> Option<QueuesDownstreamResponse> {
        // A type this stream does not serve; a real KubeMQ echoes the referenced transaction here
        // too.
        let unknown = |req: &QueuesDownstreamRequest| {
            let id = &req.ref_transaction_id;
            Some(error(
                id,
                req,
                Op::PollRequestTypeUnknown,
                TxnError::Unknown,
            ))
        };
        let Ok(op) = Op::try_from(req.request_type_data) else {
            return unknown(&req);
        };
        let txn = TxnId::from(req.ref_transaction_id.as_str());
        let listed = || Which::Listed(req.sequence_range.clone());
        let requeue = || Disposal::Requeue {
            channel: req.re_queue_channel.clone(),
        };
        let settled = match op {
            Op::Get => return Some(self.get(&req).await),
            Op::AckAll => self.session.settle(&txn, Disposal::Ack, Which::All).await,
            Op::AckRange => self.session.settle(&txn, Disposal::Ack, listed()).await,
            Op::NAckAll => self.session.settle(&txn, Disposal::Nack, Which::All).await,
            Op::NAckRange => self.session.settle(&txn, Disposal::Nack, listed()).await,
            Op::ReQueueAll => self.session.settle(&txn, requeue(), Which::All).await,
            Op::ReQueueRange => self.session.settle(&txn, requeue(), listed()).await,
            Op::CloseByClient => self.session.close(&txn),
            Op::ActiveOffsets => {
                return Some(match self.session.active_offsets(&txn) {
                    Ok(offsets) => QueuesDownstreamResponse {
                        transaction_id: txn.to_string(),
                        ref_request_id: req.request_id.clone(),
                        request_type_data: Op::ActiveOffsets as i32,
                        active_offsets: offsets.into_iter().map(Seq::to_wire).collect(),
                        ..Default::default()
                    },
                    Err(e) => error(txn.as_str(), &req, op, e),
                });
            }
            _ => return unknown(&req),
        };
        settled.err().map(|e| error(txn.as_str(), &req, op, e))
    }

    async fn get(&mut self, req: &QueuesDownstreamRequest) -> QueuesDownstreamResponse {
        let got = self
            .session
            .get(GetRequest {
                channel: &req.channel,
                client_id: &req.client_id,
                max_items: req.max_items,
                wait_ms: req.wait_timeout,
                auto_ack: req.auto_ack,
            })
            .await;
        match got {
            Ok(got) => QueuesDownstreamResponse {
                transaction_id: got.transaction.to_string(),
                ref_request_id: req.request_id.clone(),
                request_type_data: Op::Get as i32,
                messages: got.messages,
                ..Default::default()
            },
            // A refused Get names a transaction of its own, as KubeMQ's does.
            Err(e) => error(&new_id(), req, Op::Get, e),
        }
    }
}
