//! Pattern bridges: what sits between AMQP links and the KubeMQ backend. Address resolution and
//! the `amqp10` envelope are shared; [`queues`] runs a connection's links and hands those on
//! `events/` and `events-store/` to [`events`], whose selectors are [`selector`]'s.

pub mod address;
pub mod envelope;
pub mod events;
pub mod queues;
pub mod selector;

use fe2o3_amqp_types::messaging::{DeliveryState, Rejected};

use crate::engine::{AmqpError, Condition, Connection, LinkId};
use crate::metrics::{self, Metrics};

/// A `rejected` outcome with `condition` and `text` (cut as ERR-3 says by [`AmqpError::new`]).
pub(crate) fn rejected(condition: Condition, text: impl Into<String>) -> DeliveryState {
    DeliveryState::Rejected(Rejected {
        error: Some(AmqpError::new(condition, text).to_wire()),
    })
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
