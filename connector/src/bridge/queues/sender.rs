//! One produce link's path to the backend: messages are stored in the order they arrived, in
//! batches (every message waiting, up to 1,000, is one backend send, so a fast producer gets
//! batching and group commit), with up to `DEPTH` batches in flight so the next batch joins the
//! backend's queue while the previous one is being stored. Each message still gets its own
//! outcome (Q-6: `accepted` only once stored), in order.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use fe2o3_amqp_types::messaging::{Accepted, DeliveryState};
use tokio::sync::mpsc;

use super::rejected;
use crate::backend::{Backend, BackendError};
use crate::engine::{Condition, LinkId};
use crate::kubemq::{QueueMessage, SendQueueMessageResult};

/// Most messages in one backend send.
const MAX_BATCH: usize = 1000;
/// Most batches of one link in flight at once.
const DEPTH: usize = 4;

/// A produce that finished in the backend.
pub(super) struct Done {
    pub link: LinkId,
    pub delivery_id: u32,
    pub presettled: bool,
    pub state: DeliveryState,
}

/// What one message to store carries: (delivery-id, pre-settled, message).
pub(super) type ToStore = (u32, bool, QueueMessage);

type Results = Result<Vec<SendQueueMessageResult>, BackendError>;

/// A batch on its way: its deliveries, and the backend call or its finished result.
struct InFlight<F> {
    ids: Vec<(u32, bool)>,
    call: Pin<Box<F>>,
    result: Option<Results>,
}

/// The backend lane of `link` on connection `connection`: its own order, and spread over the
/// backend's parallel streams (the golden-ratio multiply keeps neighbouring ids apart).
fn lane(connection: u64, link: LinkId) -> u64 {
    connection.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ link.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
}

/// Starts the task for `link` of `connection`; outcomes go to `done`.
pub(super) fn spawn_sender<B: Backend>(
    backend: Arc<B>,
    connection: u64,
    link: LinkId,
    done: mpsc::UnboundedSender<Done>,
) -> mpsc::UnboundedSender<ToStore> {
    let lane = lane(connection, link);
    let (tx, mut rx) = mpsc::unbounded_channel::<ToStore>();
    tokio::spawn(async move {
        let mut flight = VecDeque::new();
        let mut open = true;
        while open || !flight.is_empty() {
            tokio::select! {
                // Oldest first: outcomes leave in the order the messages came.
                r = finish_front(&mut flight), if !flight.is_empty() => {
                    let (ids, results) = r;
                    report(link, &done, ids, results);
                }
                first = rx.recv(), if open && flight.len() < DEPTH => {
                    let Some(first) = first else {
                        open = false;
                        continue;
                    };
                    let mut batch = vec![first];
                    while batch.len() < MAX_BATCH {
                        match rx.try_recv() {
                            Ok(m) => batch.push(m),
                            Err(_) => break,
                        }
                    }
                    let mut ids = Vec::with_capacity(batch.len());
                    let mut messages = Vec::with_capacity(batch.len());
                    for (id, presettled, m) in batch {
                        ids.push((id, presettled));
                        messages.push(m);
                    }
                    // Polled once right here, before the next batch exists: that first poll
                    // takes the batch's place in the backend's order (Backend::send_queue).
                    let mut call = Box::pin(backend.send_queue(lane, messages));
                    let result = poll_fn(|cx| Poll::Ready(match call.as_mut().poll(cx) {
                        Poll::Ready(r) => Some(r),
                        Poll::Pending => None,
                    }))
                    .await;
                    flight.push_back(InFlight { ids, call, result });
                }
            }
        }
    });
    tx
}

/// Waits for the oldest batch in flight and takes it off the queue.
async fn finish_front<F: Future<Output = Results>>(
    flight: &mut VecDeque<InFlight<F>>,
) -> (Vec<(u32, bool)>, Results) {
    let results = poll_fn(|cx| match flight.front_mut() {
        Some(f) => match f.result.take() {
            Some(r) => Poll::Ready(r),
            None => f.call.as_mut().poll(cx),
        },
        None => Poll::Pending,
    })
    .await;
    let ids = flight.pop_front().map(|f| f.ids).unwrap_or_default();
    (ids, results)
}

/// Sends each message's outcome (ERR-9's mapping of produce failures).
fn report(
    link: LinkId,
    done: &mpsc::UnboundedSender<Done>,
    ids: Vec<(u32, bool)>,
    results: Results,
) {
    for (i, (delivery_id, presettled)) in ids.into_iter().enumerate() {
        let state = match &results {
            Ok(r) => match r.get(i) {
                Some(r) if !r.is_error => DeliveryState::Accepted(Accepted {}),
                Some(r) if r.error.starts_with("Error 500") => {
                    rejected(Condition::InternalError, r.error.clone())
                }
                Some(r) => rejected(Condition::InvalidField, r.error.clone()),
                None => rejected(Condition::InternalError, "no result for the message"),
            },
            Err(BackendError::Unavailable(e)) => {
                rejected(Condition::NotAllowed, format!("broker not ready: {e}"))
            }
            Err(BackendError::Rejected(e)) => rejected(Condition::InternalError, e.clone()),
        };
        let _ = done.send(Done {
            link,
            delivery_id,
            presettled,
            state,
        });
    }
}
