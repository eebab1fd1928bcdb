//! The delivery states a DISPOSITION (or a TRANSFER) carries, as the engine acts on them, and
//! the DISPOSITION frame itself: shared by the strict decoder (`codec`) and the fast one
//! (`quick_decode`).

use fe2o3_amqp_types::definitions::{Error as WireError, Role};
use fe2o3_amqp_types::messaging::DeliveryState;
use serde_amqp::descriptor::Descriptor;
use serde_amqp::Value;

/// A delivery state as the connector acts on it: the five AMQP states plus anything else.
#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryOutcome {
    /// `accepted`.
    Accepted,
    /// `rejected`, with the peer's error if it gave one.
    Rejected(Option<WireError>),
    /// `released`.
    Released,
    /// `modified`.
    Modified {
        /// `delivery-failed`.
        delivery_failed: bool,
        /// `undeliverable-here`.
        undeliverable_here: bool,
    },
    /// `received` (non-terminal).
    Received,
    /// A state we do not know (for example a transactional state), by its descriptor.
    Unknown(String),
}

impl DeliveryOutcome {
    /// Whether this state ends the delivery (everything but `received`).
    pub fn is_terminal(&self) -> bool {
        !matches!(self, DeliveryOutcome::Received)
    }

    pub(crate) fn from_state(s: DeliveryState) -> Self {
        match s {
            DeliveryState::Accepted(_) => DeliveryOutcome::Accepted,
            DeliveryState::Rejected(r) => DeliveryOutcome::Rejected(r.error),
            DeliveryState::Released(_) => DeliveryOutcome::Released,
            DeliveryState::Modified(m) => DeliveryOutcome::Modified {
                delivery_failed: m.delivery_failed.unwrap_or(false),
                undeliverable_here: m.undeliverable_here.unwrap_or(false),
            },
            DeliveryState::Received(_) => DeliveryOutcome::Received,
        }
    }

    /// A state fe2o3's strict decode refused (an unusual but legal encoding of a known state, or
    /// a state we do not know): known descriptors keep their meaning, fields that do not fit are
    /// dropped; anything else is Unknown.
    pub(crate) fn from_value(v: Value) -> Self {
        let Value::Described(d) = v else {
            return DeliveryOutcome::Unknown(format!("{v:?}"));
        };
        let code = match &d.descriptor {
            Descriptor::Code(c) => Some(*c),
            Descriptor::Name(n) => match n.as_str() {
                "amqp:received:list" => Some(0x23),
                "amqp:accepted:list" => Some(0x24),
                "amqp:rejected:list" => Some(0x25),
                "amqp:released:list" => Some(0x26),
                "amqp:modified:list" => Some(0x27),
                _ => None,
            },
        };
        let fields = match &d.value {
            Value::List(l) => l.as_slice(),
            _ => &[],
        };
        let flag = |i: usize| matches!(fields.get(i), Some(Value::Bool(true)));
        match code {
            Some(0x23) => DeliveryOutcome::Received,
            Some(0x24) => DeliveryOutcome::Accepted,
            Some(0x25) => {
                let error = fields
                    .first()
                    .and_then(|e| serde_amqp::to_vec(e).ok())
                    .and_then(|b| serde_amqp::from_slice::<WireError>(&b).ok());
                DeliveryOutcome::Rejected(error)
            }
            Some(0x26) => DeliveryOutcome::Released,
            Some(0x27) => DeliveryOutcome::Modified {
                delivery_failed: flag(0),
                undeliverable_here: flag(1),
            },
            _ => DeliveryOutcome::Unknown(match &d.descriptor {
                Descriptor::Code(c) => format!("0x{c:x}"),
                Descriptor::Name(n) => n.as_str().to_string(),
            }),
        }
    }
}

/// A DISPOSITION frame as the engine uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct DispositionFrame {
    /// Role of the peer that sent it.
    pub role: Role,
    /// First delivery-id of the range.
    pub first: u32,
    /// Last delivery-id (inclusive); `first` when absent.
    pub last: u32,
    /// Whether the peer settled the range.
    pub settled: bool,
    /// The state, if any.
    pub state: Option<DeliveryOutcome>,
}
