//! What a client is told about its messages: a backend failure as an AMQP outcome or link error
//! (one mapping for every pattern, ERR-9, ERR-10), and the settling of inbound deliveries.

use fe2o3_amqp_types::messaging::{DeliveryState, Rejected, Released};

use super::envelope;
use crate::backend::BackendError;
use crate::engine::{AmqpError, Condition, Connection, Delivery, LinkId};
use crate::metrics::{self, Metrics};

/// A `rejected` outcome with `condition` and `text` (cut as ERR-3 says by [`AmqpError::new`]).
pub(crate) fn rejected(condition: Condition, text: impl Into<String>) -> DeliveryState {
    refused(&AmqpError::new(condition, text))
}

/// A `rejected` outcome carrying `error`.
pub(crate) fn refused(error: &AmqpError) -> DeliveryState {
    DeliveryState::Rejected(Rejected {
        error: Some(error.to_wire()),
    })
}

/// ERR-9 for a message the backend did not take (an event send, a response); a message whose
/// fate is not known is `released` (ERR-10), never `rejected`.
pub(crate) fn send_failure(e: &BackendError) -> DeliveryState {
    match e {
        BackendError::Unavailable(t) => {
            rejected(Condition::NotAllowed, format!("broker not ready: {t}"))
        }
        BackendError::Unknown(_) => DeliveryState::Released(Released {}),
        // KubeMQ's validation refusals are the message's; the rest the broker's.
        BackendError::Invalid(t) => rejected(Condition::InvalidField, t.clone()),
        BackendError::Rejected(t) | BackendError::ClientIdInUse(t) => {
            rejected(Condition::InternalError, t.clone())
        }
        BackendError::Unauthorized(_) => refused(&crate::auth::refused_by_kubemq()),
    }
}

/// The refusal of a consume link whose backend subscription did not open.
pub(crate) fn subscribe_refusal(e: &BackendError) -> AmqpError {
    match e {
        BackendError::Unauthorized(_) => crate::auth::refused_by_kubemq(),
        BackendError::Unavailable(t) | BackendError::Unknown(t) => {
            AmqpError::new(Condition::InternalError, format!("broker not ready: {t}"))
        }
        BackendError::Invalid(t) | BackendError::Rejected(t) | BackendError::ClientIdInUse(t) => {
            AmqpError::new(Condition::InternalError, t.clone())
        }
    }
}

/// The detach of a consume link whose backend subscription ended under it (the broker lost, or
/// the stream ended by KubeMQ).
pub(crate) fn subscription_ended(e: &BackendError) -> AmqpError {
    match e {
        BackendError::Unauthorized(_) => crate::auth::refused_by_kubemq(),
        e => AmqpError::new(Condition::InternalError, format!("subscription ended: {e}")),
    }
}

/// A backend call made for one inbound delivery (an event send, a response), with what settling
/// the delivery takes once the call is over.
pub(crate) struct Settling {
    link: LinkId,
    delivery_id: u32,
    presettled: bool,
    result: Result<(), BackendError>,
}

/// `call`, made for delivery `d`: its [`Settling`] once it is over.
pub(crate) fn settling<T>(
    d: &Delivery,
    call: impl std::future::Future<Output = Result<T, BackendError>> + Send + 'static,
) -> impl std::future::Future<Output = Settling> + Send + 'static {
    let (link, delivery_id, presettled) = (d.link, d.delivery_id, d.settled);
    async move {
        Settling {
            link,
            delivery_id,
            presettled,
            result: call.await.map(|_| ()),
        }
    }
}

impl Settling {
    /// Settles the delivery: `accepted` once the backend took it, ERR-9's rejection otherwise.
    /// A link gone meanwhile needs nothing (the engine refuses the settlement).
    pub(crate) fn settle(self, conn: &mut Connection, metrics: &Metrics) {
        let state = match &self.result {
            Ok(()) => DeliveryState::Accepted(fe2o3_amqp_types::messaging::Accepted {}),
            Err(e) => {
                let state = send_failure(e);
                // Every refused send says why, where the client may see only the outcome.
                let outcome = match state {
                    DeliveryState::Released(_) => "released",
                    _ => "rejected",
                };
                tracing::warn!(link = self.link, error = %e, "send failed; answered {outcome}");
                state
            }
        };
        settle_inbound(
            conn,
            metrics,
            self.link,
            self.delivery_id,
            self.presettled,
            state,
        );
    }
}

/// The stored form of an inbound delivery of any pattern, or its refusal: an AmqpSequence body
/// is rejected and its link detached, both `amqp:not-implemented` (ENV-9, Q-9); a message that
/// does not decode is rejected `amqp:decode-error` and the link stays (ERR-9).
pub(crate) fn ingress_or_refuse(
    conn: &mut Connection,
    metrics: &Metrics,
    d: &Delivery,
) -> Option<envelope::Stored> {
    let (condition, text) = match envelope::ingress(&d.payload) {
        Ok(stored) => return Some(stored),
        Err(envelope::IngressError::SequenceBody) => (
            Condition::NotImplemented,
            "amqp-sequence bodies are not supported".to_string(),
        ),
        Err(e) => (Condition::DecodeError, e.to_string()),
    };
    settle_delivery(conn, metrics, d, rejected(condition, text.clone()));
    if condition == Condition::NotImplemented {
        let _ = conn.detach(d.link, Some(AmqpError::new(condition, text)));
    }
    None
}

/// Settles delivery `d` ([`settle_inbound`]).
pub(crate) fn settle_delivery(
    conn: &mut Connection,
    metrics: &Metrics,
    d: &Delivery,
    state: DeliveryState,
) {
    settle_inbound(conn, metrics, d.link, d.delivery_id, d.settled, state);
}

/// Settles an inbound delivery of any pattern, counting a rejection as a link-scope error when
/// it goes on the wire (ERR-6) and as a dropped message when the client had pre-settled it (Q-7,
/// MET-8).
pub(crate) fn settle_inbound(
    conn: &mut Connection,
    metrics: &Metrics,
    link: LinkId,
    delivery_id: u32,
    presettled: bool,
    state: DeliveryState,
) {
    if matches!(state, DeliveryState::Rejected(_)) {
        if presettled {
            metrics.transfers_in_dropped.inc();
        } else {
            metrics.errors(metrics::Scope::link, 1);
        }
    }
    let _ = conn.settle(link, delivery_id, state);
}
