//! A session's state: its incoming and outgoing transfer windows (SESS-*), the transfers waiting
//! for them, and the session-scoped delivery-id maps that route DISPOSITION ranges to links. The
//! frames that change it are handled in `connection/sessions.rs`.
//!
//! The server uses the client's channel number as its own for each session: channels are then
//! bounded by the channel-max we advertised, and SESS-2's cap falls out of it.

use std::collections::{BTreeMap, HashSet, VecDeque};

use bytes::Bytes;
use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::messaging::DeliveryState;

use super::budget::{Charge, ConnectionBudget, Reserved};
use super::LinkId;

/// The session windows the server advertises (SESS-1), in transfer frames.
pub const SESSION_WINDOW: u32 = 2048;

/// One session, keyed by channel.
#[derive(Debug)]
pub(crate) struct Session {
    /// We sent END (with an error) or refused the BEGIN; waiting for the client's END.
    pub ending: bool,
    pub next_incoming_id: u32,
    /// Transfer frames the client may still send before we re-advertise.
    pub incoming_window: u32,
    pub next_outgoing_id: u32,
    pub remote_incoming_window: u32,
    pub next_delivery_id: u32,
    pub by_handle: super::FastMap<u32, LinkId>,
    /// Names of live links, per client role (LINK-8).
    pub names: HashSet<(bool, std::sync::Arc<str>)>,
    /// Deliveries we sent and the client has not settled: delivery-id → link.
    pub out_unsettled: BTreeMap<u32, LinkId>,
    /// Encoded TRANSFER frames waiting for the client's incoming window to open.
    pub blocked: Blocked,
    /// `EngineConfig::session_state_bytes` reserved in the process budget while it lives.
    pub(crate) _state: Reserved,
}

/// TRANSFER frames waiting for the client's incoming window, counted against the connection's
/// memory budget. The connector never refuses its own frames here: what waits is bounded by the
/// demand it asks of the backend (at most a few messages beyond the window, see `session_room`).
#[derive(Debug)]
pub(crate) struct Blocked {
    pub(crate) frames: VecDeque<Bytes>,
    pub(crate) charge: Charge,
}

impl Blocked {
    pub(crate) fn new(budget: &ConnectionBudget) -> Self {
        Blocked {
            frames: VecDeque::new(),
            charge: budget.empty(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.frames.len()
    }

    /// The bytes of the frames waiting.
    pub(crate) fn bytes(&self) -> u64 {
        self.charge.bytes()
    }

    pub(crate) fn push(&mut self, frame: Bytes) {
        self.charge.grow_anyway(frame.len() as u64);
        self.frames.push_back(frame);
    }

    pub(crate) fn pop(&mut self) -> Option<Bytes> {
        let frame = self.frames.pop_front()?;
        self.charge.shrink(frame.len() as u64);
        Some(frame)
    }

    pub(crate) fn clear(&mut self) {
        self.frames.clear();
        self.charge.shrink(u64::MAX);
    }
}

/// The channels whose BEGIN was refused and whose END has not come yet: one bit per channel,
/// allocated at the first refusal (8 KiB at most, whatever the client sends), instead of a
/// session kept for each.
#[derive(Debug, Default)]
pub(crate) struct RefusedChannels(Option<Box<[u64; 1024]>>);

impl RefusedChannels {
    pub(crate) fn at(ch: u16) -> (usize, u64) {
        (usize::from(ch / 64), 1 << (ch % 64))
    }

    pub(crate) fn insert(&mut self, ch: u16) {
        let (i, bit) = Self::at(ch);
        let bits = self.0.get_or_insert_with(|| Box::new([0; 1024]));
        if let Some(word) = bits.get_mut(i) {
            *word |= bit;
        }
    }

    pub(crate) fn contains(&self, ch: u16) -> bool {
        let (i, bit) = Self::at(ch);
        self.0
            .as_ref()
            .and_then(|b| b.get(i))
            .is_some_and(|word| word & bit != 0)
    }

    /// Removes `ch`; whether it was there.
    pub(crate) fn remove(&mut self, ch: u16) -> bool {
        let (i, bit) = Self::at(ch);
        match self.0.as_mut().and_then(|b| b.get_mut(i)) {
            Some(word) if *word & bit != 0 => {
                *word &= !bit;
                true
            }
            _ => false,
        }
    }
}

/// A pending outgoing DISPOSITION range, extended while contiguous settlements share a state.
#[derive(Debug)]
pub(crate) struct PendingDisposition {
    pub channel: u16,
    pub role: Role,
    pub first: u32,
    pub last: u32,
    pub state: Option<DeliveryState>,
}

/// Link fields of an outgoing FLOW.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinkFlow {
    pub handle: u32,
    pub delivery_count: u32,
    pub credit: u32,
    pub drain: bool,
}
