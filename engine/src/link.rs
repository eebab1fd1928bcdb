//! A link's state: its phase, credit and drain (FLOW-*), an inbound delivery being reassembled
//! and the deliveries in flight both ways (XFER-*), and the views the application gets of it. The
//! frames that change it are handled in `connection/links.rs` (LINK-*).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::performatives::Attach;

use super::budget::{Charge, Reserved};
use super::reassembly::Reassembly;
use super::LinkId;

/// Ids of one DISPOSITION range considered beyond the first (Q-28: 65536 ids in all).
pub const MAX_DISPOSITION_SPAN: u32 = 65_535;

/// Longest delivery tag accepted (AMQP allows 32 bytes).
pub const MAX_TAG_LEN: usize = 32;

/// Where a link is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// ATTACH received; the application has not answered.
    Attaching,
    /// Reply ATTACH sent.
    Attached,
    /// We sent DETACH; the client's DETACH frees the handle.
    DetachSent,
}

/// The server's side of the link.
#[derive(Debug)]
pub(crate) enum Side {
    /// The client produces: we receive, grant credit and reassemble.
    Receiver(ReceiverState),
    /// The client consumes: we send within its credit.
    Sender(SenderState),
}

#[derive(Debug)]
pub(crate) struct ReceiverState {
    /// Credit window refilled to (FLOW-1).
    pub(crate) window: u32,
    pub(crate) partial: Option<Partial>,
    /// Deliveries handed to the application and not yet settled by it.
    pub(crate) in_flight: super::FastMap<u32, InFlight>,
    /// The bytes of `partial` and `in_flight`: one charge for the link, so a delivery costs no
    /// charge of its own, and whatever ends the link gives them all back.
    pub(crate) charge: Charge,
}

impl ReceiverState {
    pub(crate) fn new(charge: Charge) -> Self {
        ReceiverState {
            window: 0,
            partial: None,
            in_flight: Default::default(),
            charge,
        }
    }

    /// Drops the delivery being reassembled and gives its bytes back.
    pub(crate) fn discard_partial(&mut self) {
        if let Some(p) = self.partial.take() {
            self.charge.shrink(p.body.charged());
        }
    }
}

/// A delivery the application has and has not settled yet.
#[derive(Debug)]
pub(crate) struct InFlight {
    /// The client sent it unsettled, so it wants a disposition.
    pub(crate) wants_disposition: bool,
    /// Its bytes in the link's charge, given back when it is settled.
    pub(crate) bytes: u64,
}

#[derive(Debug)]
pub(crate) struct Partial {
    pub(crate) id: u32,
    pub(crate) tag: Bytes,
    pub(crate) settled: bool,
    pub(crate) body: Reassembly,
}

impl Partial {
    /// The reassembled message and the bytes it keeps charged (the tag moves, not copied).
    pub(crate) fn finish(self) -> (Delivered, u64) {
        let (payload, charged) = self.body.finish();
        let d = Delivered {
            id: self.id,
            tag: self.tag,
            settled: self.settled,
            payload,
        };
        (d, charged)
    }
}

/// A delivery whose last frame came.
pub(crate) struct Delivered {
    pub(crate) id: u32,
    pub(crate) tag: Bytes,
    pub(crate) settled: bool,
    pub(crate) payload: Bytes,
}

#[derive(Debug, Default)]
pub(crate) struct SenderState {
    pub(crate) drain: bool,
    /// Unsettled deliveries sent on this link: delivery-id → application token.
    pub(crate) unsettled: BTreeMap<u32, u64>,
}

/// One link.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) channel: u16,
    pub(crate) handle: u32,
    /// Shared with the session's live names: one copy of a name of up to a whole frame.
    pub(crate) name: Arc<str>,
    /// Its name is in the session's live names (not for a link the engine refused at once,
    /// which may carry the name of a live one).
    pub(crate) named: bool,
    pub(crate) client_role: Role,
    pub(crate) phase: Phase,
    /// The application accepted it, so it gets exactly one `LinkClosed`.
    pub(crate) accepted: bool,
    pub(crate) delivery_count: u32,
    pub(crate) credit: u32,
    pub(crate) side: Side,
    /// The client's ATTACH, kept until the reply echoes its terminus.
    pub(crate) request: Option<Box<Attach>>,
    /// The client asked for a dynamic node (ADDR-11).
    pub(crate) dynamic: bool,
    /// `EngineConfig::link_state_bytes` reserved in the process budget while the link lives
    /// (none for a link refused at once).
    pub(crate) state: Option<Reserved>,
}

impl Link {
    /// The bytes the link keeps for its name, for tests of what refused links hold.
    #[cfg(test)]
    pub(crate) fn name_len(&self) -> usize {
        self.name.len()
    }

    /// Whether the client's ATTACH is still kept.
    #[cfg(test)]
    pub(crate) fn holds_request(&self) -> bool {
        self.request.is_some()
    }

    /// How many places hold the link's name (the link, and the session while it is live).
    #[cfg(test)]
    pub(crate) fn name_holders(&self) -> usize {
        Arc::strong_count(&self.name)
    }
}

/// How much a session's client takes now: its incoming window, and the frames already waiting
/// for it to open (non-zero only while the window is 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionRoom {
    /// Transfer frames the client's incoming window admits now.
    pub window: u32,
    /// Transfer frames written and waiting for the window.
    pub waiting: u32,
}

/// Which side of a link the server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerRole {
    /// The server sends (the client consumes).
    Sender,
    /// The server receives (the client produces).
    Receiver,
}

impl ServerRole {
    /// `sender` or `receiver`.
    pub fn name(self) -> &'static str {
        match self {
            ServerRole::Sender => "sender",
            ServerRole::Receiver => "receiver",
        }
    }
}

/// One attached link as the server sees it now (OBS-3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkView {
    /// The link.
    pub id: LinkId,
    /// The link's name, chosen by the client.
    pub name: String,
    /// The server's role.
    pub role: ServerRole,
    /// Current link credit: what the client granted a server sender, or what the server granted
    /// a client sender.
    pub credit: u32,
    /// Deliveries not yet settled: sent and awaiting the client's settlement, or received and
    /// awaiting the application's.
    pub unsettled: usize,
    /// A dynamic-node terminus (ADDR-11).
    pub dynamic: bool,
}

/// What the application decides when it accepts a link.
#[derive(Debug, Clone, Copy)]
pub struct LinkAccept {
    /// For server-receiver links: the credit window granted and kept topped up (FLOW-1).
    pub credit_window: u32,
}
