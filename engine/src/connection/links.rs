//! The link-level frames of a connection: ATTACH and DETACH, link FLOW and credit, TRANSFER in
//! both directions (reassembly, settlement) and what the application commands of its links
//! (LINK-*, FLOW-*, XFER-*).

use super::{wire_to_error, Connection, MAX_UNWRITTEN};
use crate::codec::{self, AttachFrame, TransferHead};
use crate::error::{AmqpError, Condition};
use crate::event::{CommandError, Delivery, Event};
use crate::frame::{write_frame, HEADER_LEN, TYPE_AMQP};
use crate::link::{
    Delivered, InFlight, Link, LinkAccept, LinkView, Partial, Phase, ReceiverState, SenderState,
    ServerRole, SessionRoom, Side, MAX_DISPOSITION_SPAN, MAX_TAG_LEN,
};
use crate::outcome::{DeliveryOutcome, DispositionFrame};
use crate::reassembly::Reassembly;
use crate::serial;
use crate::session::LinkFlow;
use crate::LinkId;
use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::definitions::{ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{DeliveryState, Rejected, TargetArchetype};
use fe2o3_amqp_types::performatives::{Attach, Detach, Flow, Transfer};
use std::sync::Arc;

impl Connection {
    pub(super) fn on_attach(&mut self, ch: u16, frame: AttachFrame) {
        let handle_max = self.cfg.max_links_per_session.saturating_sub(1);
        let max_links = self.cfg.max_links_per_session as usize;
        let (name, handle, role): (Arc<str>, _, _) = match &frame {
            AttachFrame::Full(a) => (Arc::from(a.name.as_str()), a.handle.0, a.role.clone()),
            AttachFrame::Head {
                name, handle, role, ..
            } => (Arc::from(name.as_str()), *handle, role.clone()),
        };
        let Some(s) = self.live_session(ch) else {
            return;
        };
        let live_links = s.names.len();
        if s.by_handle.contains_key(&handle) {
            // SESS-5.
            return self.end_session(ch, AmqpError::new(Condition::ErrantLink, "handle in use"));
        }
        // Past handle-max without being at the cap, the client ignored our BEGIN. At the cap,
        // LINK-2 step 3 below answers it at link level instead, and the refused link's handle
        // stays taken until the client's DETACH: as many of those as live links at most, so
        // refused ATTACHes cannot pile up.
        let pending = s.by_handle.len().saturating_sub(live_links);
        if handle > handle_max && (live_links < max_links || pending >= max_links) {
            return self.end_session(
                ch,
                AmqpError::new(Condition::ErrantLink, "handle exceeds handle-max"),
            );
        }
        let duplicate = s.names.contains(&(is_sender(&role), name.clone()));
        let id = self.next_link_id;
        self.next_link_id += 1;
        let side = if is_sender(&role) {
            Side::Receiver(ReceiverState::new(self.budget.empty()))
        } else {
            Side::Sender(SenderState::default())
        };
        let mut link = Link {
            channel: ch,
            handle,
            name: name.clone(),
            named: false,
            client_role: role.clone(),
            phase: Phase::Attaching,
            accepted: false,
            delivery_count: 0,
            credit: 0,
            side,
            request: None,
            dynamic: false,
            state: None,
        };
        let refusal = match frame {
            AttachFrame::Head {
                coordinator: true, ..
            } => Some(AmqpError::new(
                Condition::NotImplemented,
                "transactions are not supported",
            )),
            AttachFrame::Head { .. } => Some(AmqpError::new(
                Condition::InvalidField,
                "attach carries an invalid field",
            )),
            AttachFrame::Full(a) => {
                let r = if a.rcv_settle_mode == ReceiverSettleMode::Second {
                    // LINK-2 step 1.
                    Some(AmqpError::bare(Condition::NotImplemented))
                } else if duplicate {
                    // LINK-2 step 2.
                    Some(AmqpError::new(Condition::NotAllowed, "duplicate link name"))
                } else if live_links >= max_links {
                    // LINK-2 step 3.
                    Some(AmqpError::new(
                        Condition::ResourceLimitExceeded,
                        "link limit of the session reached",
                    ))
                } else if a.unsettled.as_ref().is_some_and(|u| !u.is_empty()) {
                    // LINK-7 / OP-LINK-3: offering unsettled state is an attempt to resume.
                    Some(AmqpError::new(
                        Condition::NotAllowed,
                        "link re-attach not supported",
                    ))
                } else {
                    // The state the link makes the connector keep, within the process budget.
                    match self.cfg.process_memory.reserve(self.cfg.link_state_bytes) {
                        Ok(r) => {
                            link.state = Some(r);
                            None
                        }
                        Err(e) => Some(e.to_error()),
                    }
                };
                link.dynamic = if is_sender(&role) {
                    matches!(a.target.as_deref(), Some(TargetArchetype::Target(t)) if t.dynamic)
                } else {
                    a.source.as_ref().is_some_and(|s| s.dynamic)
                };
                link.request = Some(a);
                r
            }
        };
        if let Some(s) = self.sessions.get_mut(&ch) {
            s.by_handle.insert(handle, id);
            if refusal.is_none() {
                s.names.insert((is_sender(&role), name));
                link.named = true;
            }
        }
        let attach = link.request.clone();
        self.links.insert(id, link);
        match refusal {
            Some(err) => {
                let _ = self.refuse_link(id, err);
            }
            None => {
                if let Some(attach) = attach {
                    self.events
                        .push_back(Event::AttachRequested { link: id, attach });
                }
            }
        }
    }

    /// Accepts a link the application was asked about: reply ATTACH (LINK-4), and for a
    /// server-receiver link the initial credit (FLOW-1).
    pub fn accept_link(&mut self, id: LinkId, accept: LinkAccept) -> Result<(), CommandError> {
        let max_message_size = self.cfg.max_message_size;
        let link = self.links.get_mut(&id).ok_or(CommandError::NoLink)?;
        if link.phase != Phase::Attaching {
            return Err(CommandError::NoLink);
        }
        link.phase = Phase::Attached;
        link.accepted = true;
        let request = link.request.take();
        let (ch, handle) = (link.channel, link.handle);
        let server_sends = matches!(link.side, Side::Sender(_));
        if let Side::Receiver(r) = &mut link.side {
            r.window = accept.credit_window.max(1);
            link.credit = r.window;
            // A receiver's delivery-count starts at the sender's initial-delivery-count.
            link.delivery_count = request
                .as_ref()
                .and_then(|a| a.initial_delivery_count)
                .unwrap_or(0);
        }
        let (credit, delivery_count) = (link.credit, link.delivery_count);
        let reply = reply_attach(link, request, max_message_size, false);
        self.write_perf(ch, &reply);
        if !server_sends {
            self.write_session_flow(
                ch,
                Some(LinkFlow {
                    handle,
                    delivery_count,
                    credit,
                    drain: false,
                }),
            );
        }
        tracing::debug!(link = id, channel = ch, handle, "link attached");
        if let Some(Link {
            side: Side::Sender(s),
            credit,
            ..
        }) = self.links.get(&id)
        {
            if *credit > 0 || s.drain {
                // Credit that arrived with the ATTACH, before acceptance.
                self.events.push_back(Event::Credit {
                    link: id,
                    credit: *credit,
                    drain: s.drain,
                });
            }
        }
        Ok(())
    }

    /// Accepts a link whose client asked for a dynamic node, naming the node the server minted in
    /// the reply's terminus (ADDR-11).
    pub fn accept_dynamic(
        &mut self,
        id: LinkId,
        accept: LinkAccept,
        address: String,
    ) -> Result<(), CommandError> {
        let link = self.links.get_mut(&id).ok_or(CommandError::NoLink)?;
        let server_sends = matches!(link.side, Side::Sender(_));
        if let Some(req) = link.request.as_mut() {
            if server_sends {
                if let Some(source) = req.source.as_mut() {
                    source.address = Some(address);
                }
            } else if let Some(fe2o3_amqp_types::messaging::TargetArchetype::Target(t)) =
                req.target.as_deref_mut()
            {
                t.address = Some(address);
            }
        }
        self.accept_link(id, accept)
    }

    /// Accepts a client receiver's link, answering with `source` in the reply ATTACH instead of
    /// the one the client sent (what a JMS client reads back when it removes a durable
    /// subscription: the subscription's source when there was one, none otherwise).
    pub fn accept_with_source(
        &mut self,
        id: LinkId,
        accept: LinkAccept,
        source: Option<fe2o3_amqp_types::messaging::Source>,
    ) -> Result<(), CommandError> {
        let link = self.links.get_mut(&id).ok_or(CommandError::NoLink)?;
        if let Some(req) = link.request.as_mut() {
            req.source = source.map(Box::new);
        }
        self.accept_link(id, accept)
    }

    /// Refuses a link: a reply ATTACH with a null terminus, then DETACH (closed) with `err`
    /// (LINK-5, and the specification's form of OP-LINK-1).
    pub fn refuse_link(&mut self, id: LinkId, err: AmqpError) -> Result<(), CommandError> {
        let max_message_size = self.cfg.max_message_size;
        let link = self.links.get_mut(&id).ok_or(CommandError::NoLink)?;
        if link.phase != Phase::Attaching {
            return Err(CommandError::NoLink);
        }
        tracing::debug!(link = id, name = %link.name, error = %err, "refusing link");
        let request = link.request.take();
        let reply = reply_attach(link, request, max_message_size, true);
        let ch = link.channel;
        self.write_perf(ch, &reply);
        self.send_detach(id, Some(err));
        Ok(())
    }

    /// Detaches an attached link with an optional error (closed = true).
    pub fn detach(&mut self, id: LinkId, err: Option<AmqpError>) -> Result<(), CommandError> {
        let link = self.links.get(&id).ok_or(CommandError::NoLink)?;
        if link.phase != Phase::Attached {
            return Err(CommandError::NoLink);
        }
        self.send_detach(id, err);
        Ok(())
    }

    /// Writes DETACH(closed) for a link and retires it; its handle stays taken until the client's
    /// DETACH arrives.
    fn send_detach(&mut self, id: LinkId, err: Option<AmqpError>) {
        let Some(link) = self.links.get(&id) else {
            return;
        };
        let (ch, handle) = (link.channel, link.handle);
        if err.is_some() {
            self.errors_sent.link += 1;
        }
        let detach = Detach {
            handle: handle.into(),
            closed: true,
            error: err.as_ref().map(|e| e.to_wire()),
        };
        self.write_perf(ch, &detach);
        self.retire_link(id, err);
        if let Some(link) = self.links.get_mut(&id) {
            link.phase = Phase::DetachSent;
        }
    }

    /// Ends a link's life as the application sees it: the name is free again, its unsettled
    /// deliveries are reported once. The link object itself may live on until the
    /// handle is released.
    fn retire_link(&mut self, id: LinkId, err: Option<AmqpError>) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        if link.phase == Phase::DetachSent {
            return;
        }
        let accepted = link.accepted;
        link.accepted = false;
        let ch = link.channel;
        let key = (
            is_sender(&link.client_role),
            std::mem::replace(&mut link.name, Arc::from("")),
        );
        let named = std::mem::replace(&mut link.named, false);
        let unsettled: Vec<(u32, u64)> = match &mut link.side {
            Side::Sender(s) => std::mem::take(&mut s.unsettled).into_iter().collect(),
            Side::Receiver(r) => {
                r.in_flight.clear();
                r.partial = None;
                r.charge.shrink(u64::MAX);
                Vec::new()
            }
        };
        // The state it was charged for goes with it (the application drops its part on
        // `LinkClosed`).
        link.state = None;
        link.phase = Phase::DetachSent;
        // Only the handle matters until the client's DETACH: the name (up to a whole frame) is
        // not kept for it.
        if let Some(s) = self.sessions.get_mut(&ch) {
            if named {
                s.names.remove(&key);
            }
            for (delivery_id, _) in &unsettled {
                s.out_unsettled.remove(delivery_id);
            }
        }
        if accepted {
            self.events.push_back(Event::LinkClosed {
                link: id,
                unsettled: unsettled.into_iter().map(|(_, t)| t).collect(),
                error: err,
            });
        }
    }

    /// Removes a link entirely (its session is gone or the client's DETACH released the handle).
    pub(super) fn drop_link(&mut self, id: LinkId, err: Option<AmqpError>) {
        self.retire_link(id, err);
        if let Some(link) = self.links.remove(&id) {
            if let Some(s) = self.sessions.get_mut(&link.channel) {
                s.by_handle.remove(&link.handle);
            }
        }
    }

    pub(super) fn on_detach(&mut self, ch: u16, detach: Detach) {
        let Some(s) = self.live_session(ch) else {
            return;
        };
        let Some(&id) = s.by_handle.get(&detach.handle.0) else {
            return self.end_session(
                ch,
                AmqpError::new(Condition::ErrantLink, "detach of an unattached handle"),
            );
        };
        let Some(link) = self.links.get(&id) else {
            return;
        };
        let phase = link.phase;
        let err = detach.error.as_ref().map(wire_to_error);
        match phase {
            Phase::DetachSent => self.drop_link(id, None),
            Phase::Attaching => {
                // The client gave up before we answered: answer, then confirm its detach.
                let _ = self.refuse_link(id, AmqpError::bare(Condition::NotAllowed));
                self.drop_link(id, None);
            }
            Phase::Attached => {
                // LINK-6: every client DETACH is final; we answer closed = true.
                tracing::debug!(link = id, error = ?err, "client detached link");
                self.retire_link(id, err);
                self.send_detach(id, None);
                self.drop_link(id, None);
            }
        }
    }

    pub(super) fn on_flow(&mut self, ch: u16, flow: Flow) {
        if self.live_session(ch).is_none() {
            return;
        }
        self.on_session_flow(ch, &flow);
        let Some(handle) = flow.handle else { return };
        let Some(&id) = self
            .sessions
            .get(&ch)
            .and_then(|s| s.by_handle.get(&handle.0))
        else {
            return self.end_session(
                ch,
                AmqpError::new(Condition::ErrantLink, "flow for an unattached handle"),
            );
        };
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        if link.phase == Phase::DetachSent {
            return;
        }
        // A client may send its FLOW right behind its ATTACH, before the application has
        // accepted the link: the credit is kept and reported on acceptance.
        let attached = link.phase == Phase::Attached;
        if let Side::Sender(s) = &mut link.side {
            // FLOW-3; a FLOW without delivery-count counts from the initial 0 (OP-LINK-7).
            let peer_count = flow.delivery_count.unwrap_or(0);
            let limit = peer_count.wrapping_add(flow.link_credit.unwrap_or(0));
            link.credit = if serial::lt(link.delivery_count, limit) {
                limit.wrapping_sub(link.delivery_count)
            } else {
                0
            };
            s.drain = flow.drain;
            if attached {
                self.events.push_back(Event::Credit {
                    link: id,
                    credit: link.credit,
                    drain: flow.drain,
                });
            }
        }
        if !attached {
            return;
        }
        if flow.echo {
            self.write_link_flow(id);
        }
    }

    fn write_link_flow(&mut self, id: LinkId) {
        let Some(link) = self.links.get(&id) else {
            return;
        };
        let drain = matches!(&link.side, Side::Sender(s) if s.drain);
        let lf = LinkFlow {
            handle: link.handle,
            delivery_count: link.delivery_count,
            credit: link.credit,
            drain,
        };
        self.write_session_flow(link.channel, Some(lf));
    }

    /// Completes a drain (FLOW-5): the unused credit is spent by advancing delivery-count and the
    /// client gets FLOW(link-credit = 0, drain = true).
    pub fn drain_done(&mut self, id: LinkId) -> Result<(), CommandError> {
        let link = self.links.get_mut(&id).ok_or(CommandError::NoLink)?;
        if link.phase != Phase::Attached {
            return Err(CommandError::NoLink);
        }
        let Side::Sender(s) = &mut link.side else {
            return Err(CommandError::WrongRole);
        };
        if !s.drain {
            return Ok(());
        }
        link.delivery_count = link.delivery_count.wrapping_add(link.credit);
        link.credit = 0;
        self.write_link_flow(id);
        if let Some(Link {
            side: Side::Sender(s),
            ..
        }) = self.links.get_mut(&id)
        {
            s.drain = false;
        }
        Ok(())
    }

    /// Every attached link, as the server sees it now (OBS-3).
    pub fn link_views(&self) -> Vec<LinkView> {
        let mut views: Vec<(LinkId, LinkView)> = self
            .links
            .iter()
            .filter(|(_, l)| l.phase == Phase::Attached)
            .map(|(id, l)| {
                let (role, unsettled) = match &l.side {
                    Side::Sender(s) => (ServerRole::Sender, s.unsettled.len()),
                    Side::Receiver(r) => (ServerRole::Receiver, r.in_flight.len()),
                };
                let view = LinkView {
                    id: *id,
                    name: l.name.to_string(),
                    role,
                    credit: l.credit,
                    unsettled,
                    dynamic: l.dynamic,
                };
                (*id, view)
            })
            .collect();
        // In the order the links were attached.
        views.sort_unstable_by_key(|(id, _)| *id);
        views.into_iter().map(|(_, v)| v).collect()
    }

    /// Credit a server-sender link has now.
    pub fn credit(&self, id: LinkId) -> u32 {
        self.links
            .get(&id)
            .filter(|l| l.phase == Phase::Attached)
            .map_or(0, |l| l.credit)
    }

    /// The client's incoming window on the link's session and the TRANSFER frames waiting for
    /// it (both 0 for an unknown link): what a sender can put on the wire without waiting.
    pub fn session_room(&self, id: LinkId) -> SessionRoom {
        self.links
            .get(&id)
            .and_then(|l| self.sessions.get(&l.channel))
            .map_or(SessionRoom::default(), |s| SessionRoom {
                // A transport that has not taken what was sent shuts every window.
                window: if self.transport_full() {
                    0
                } else {
                    s.remote_incoming_window
                },
                waiting: s.blocked.len().min(u32::MAX as usize) as u32,
            })
    }

    /// Whether a transfer sent on `id` now would go out, or wait in its session behind less than
    /// [`MAX_UNWRITTEN`] bytes (the client's window shut, or the transport full). Senders that can
    /// hold or drop what they have stop there; [`Event::WindowOpened`] says when the waiting
    /// frames went.
    pub fn has_room(&self, id: LinkId) -> bool {
        self.links
            .get(&id)
            .and_then(|l| self.sessions.get(&l.channel))
            .is_some_and(|s| s.blocked.bytes() < MAX_UNWRITTEN as u64)
    }

    /// Deliveries sent on a server-sender link that the client has not settled (FLOW-7).
    pub fn unsettled_count(&self, id: LinkId) -> usize {
        match self.links.get(&id).map(|l| &l.side) {
            Some(Side::Sender(s)) => s.unsettled.len(),
            _ => 0,
        }
    }

    /// Sends one message on a server-sender link within its credit, fragmented to the frame size
    /// (XFER-3). `token` comes back in `Settled` or `LinkClosed`. Returns the delivery-id.
    pub fn send(
        &mut self,
        id: LinkId,
        tag: &[u8],
        payload: &[u8],
        settled: bool,
        token: u64,
    ) -> Result<u32, CommandError> {
        if !self.is_open() {
            return Err(CommandError::Closed);
        }
        let link = self.links.get_mut(&id).ok_or(CommandError::NoLink)?;
        if link.phase != Phase::Attached {
            return Err(CommandError::NoLink);
        }
        let Side::Sender(s) = &mut link.side else {
            return Err(CommandError::WrongRole);
        };
        if link.credit == 0 {
            // FLOW-3: never beyond credit.
            return Err(CommandError::NoCredit);
        }
        link.credit -= 1;
        link.delivery_count = link.delivery_count.wrapping_add(1);
        let (ch, handle) = (link.channel, link.handle);
        let session = self.sessions.get_mut(&ch).ok_or(CommandError::NoLink)?;
        let delivery_id = session.next_delivery_id;
        session.next_delivery_id = delivery_id.wrapping_add(1);
        if !settled {
            s.unsettled.insert(delivery_id, token);
            session.out_unsettled.insert(delivery_id, id);
        }
        self.write_transfers(ch, handle, delivery_id, tag, payload, settled);
        Ok(delivery_id)
    }

    fn write_transfers(
        &mut self,
        ch: u16,
        handle: u32,
        delivery_id: u32,
        tag: &[u8],
        payload: &[u8],
        settled: bool,
    ) {
        self.flush_disposition();
        let first = TransferHead {
            handle,
            delivery_id: Some(delivery_id),
            tag: Some(tag),
            message_format: Some(0),
            settled: Some(settled),
            more: true,
        };
        // The first frame's performative is the largest; size every chunk by it.
        self.scratch.clear();
        codec::encode_transfer(&mut self.scratch, &first);
        let room = (self.max_frame as usize)
            .saturating_sub(HEADER_LEN + self.scratch.len())
            .max(1);
        let mut rest = payload;
        let mut head = first;
        loop {
            let (chunk, after) = rest.split_at(rest.len().min(room));
            head.more = !after.is_empty();
            self.write_transfer_frame(ch, &head, chunk);
            rest = after;
            if !head.more {
                break;
            }
            head = TransferHead {
                handle,
                delivery_id: None,
                tag: None,
                message_format: None,
                settled: None,
                more: true,
            };
        }
    }

    /// One TRANSFER frame, sent now if the client's incoming window allows and the transport
    /// has room, queued in its session otherwise.
    fn write_transfer_frame(&mut self, ch: u16, head: &TransferHead<'_>, chunk: &[u8]) {
        let transport_full = self.transport_full();
        self.held_for_transport |= transport_full;
        let Some(s) = self.sessions.get_mut(&ch) else {
            return;
        };
        let write = |b: &mut BytesMut| {
            codec::encode_transfer(b, head);
            b.extend_from_slice(chunk);
        };
        if s.remote_incoming_window > 0 && s.blocked.is_empty() && !transport_full {
            s.remote_incoming_window -= 1;
            s.next_outgoing_id = s.next_outgoing_id.wrapping_add(1);
            write_frame(&mut self.out, TYPE_AMQP, ch, write);
        } else {
            let mut frame = BytesMut::new();
            write_frame(&mut frame, TYPE_AMQP, ch, write);
            s.blocked.push(frame.freeze());
        }
    }

    pub(super) fn on_transfer(&mut self, ch: u16, t: Transfer, payload: Bytes) {
        if self.live_session(ch).is_none() || !self.take_incoming_window(ch) {
            return;
        }
        let Some(&id) = self
            .sessions
            .get(&ch)
            .and_then(|s| s.by_handle.get(&t.handle.0))
        else {
            return self.end_session(
                ch,
                AmqpError::new(Condition::ErrantLink, "transfer on an unattached handle"),
            );
        };
        let max_message_size = self.cfg.max_message_size;
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        match link.phase {
            Phase::DetachSent => return, // in flight when we detached
            Phase::Attaching => {
                // No credit was ever granted: answer the ATTACH with the refusal.
                let _ = self.refuse_link(
                    id,
                    AmqpError::new(
                        Condition::NotAllowed,
                        "transfer before the link was attached",
                    ),
                );
                return;
            }
            Phase::Attached => {}
        }
        let credit = link.credit;
        let Side::Receiver(r) = &mut link.side else {
            return self.send_detach(
                id,
                Some(AmqpError::new(
                    Condition::NotAllowed,
                    "transfer on a link where the client receives",
                )),
            );
        };
        // Start or continue the delivery, checking what must not change between frames.
        let problem = match &mut r.partial {
            None => {
                if credit == 0 {
                    Some(AmqpError::new(
                        Condition::NotAllowed,
                        "transfer exceeds link credit",
                    ))
                } else {
                    match (t.delivery_id, &t.delivery_tag) {
                        (Some(did), Some(tag)) if tag.len() <= MAX_TAG_LEN => {
                            r.partial = Some(Partial {
                                id: did,
                                tag: Bytes::copy_from_slice(tag),
                                settled: t.settled.unwrap_or(false),
                                body: Reassembly::new(),
                            });
                            None
                        }
                        (Some(_), Some(_)) => Some(AmqpError::new(
                            Condition::InvalidField,
                            "delivery-tag longer than 32 bytes",
                        )),
                        _ => Some(AmqpError::new(
                            Condition::NotAllowed,
                            "first transfer of a delivery lacks delivery-id or delivery-tag",
                        )),
                    }
                }
            }
            Some(p) => {
                if t.delivery_id.is_some_and(|d| d != p.id)
                    || t.delivery_tag
                        .as_ref()
                        .is_some_and(|g| g.as_slice() != &p.tag[..])
                {
                    Some(AmqpError::new(
                        Condition::NotAllowed,
                        "delivery-id or tag changed within a multi-frame delivery",
                    ))
                } else {
                    p.settled |= t.settled.unwrap_or(false);
                    None
                }
            }
        };
        if let Some(err) = problem {
            return self.send_detach(id, Some(err));
        }
        let Some(p) = r.partial.as_mut() else { return };
        if t.aborted {
            // An aborted delivery is discarded but has used its credit.
            r.discard_partial();
            link.credit -= 1;
            link.delivery_count = link.delivery_count.wrapping_add(1);
            return;
        }
        let held = p.body.len();
        let refusal = if (held as u64).saturating_add(payload.len() as u64) > max_message_size {
            // XFER-2.
            Some(AmqpError::new(
                Condition::MessageSizeExceeded,
                format!("message exceeds max-message-size {max_message_size}"),
            ))
        } else {
            p.body
                .append(payload, max_message_size, &mut r.charge)
                .err()
        };
        if let Some(err) = refusal {
            // The client learns of the failed send, then the link is detached: the rest of the
            // delivery would have nowhere to go.
            let (did, settled) = (p.id, p.settled);
            r.discard_partial();
            self.dropped_in += 1;
            if !settled {
                self.errors_sent.link += 1;
                let state = DeliveryState::Rejected(Rejected {
                    error: Some(err.to_wire()),
                });
                self.queue_disposition(ch, Role::Receiver, did, Some(state));
            }
            return self.send_detach(id, Some(err));
        }
        if t.more {
            return;
        }
        let Some(p) = r.partial.take() else { return };
        let (
            Delivered {
                id: did,
                tag,
                settled,
                payload: body,
            },
            bytes,
        ) = p.finish();
        link.credit -= 1;
        link.delivery_count = link.delivery_count.wrapping_add(1);
        r.in_flight.insert(
            did,
            InFlight {
                wants_disposition: !settled,
                bytes,
            },
        );
        self.events.push_back(Event::Delivery(Delivery {
            link: id,
            delivery_id: did,
            tag,
            settled,
            payload: body,
        }));
        self.refill_credit(id);
    }

    /// FLOW-1: top the credit back up to the window once it fell below half, but only while fewer
    /// than a window of deliveries wait for the application (the backend's confirmation), and
    /// while the connection's memory budget is less than half used (a slow backend or large
    /// messages stop new credit before they reach the budget).
    fn refill_credit(&mut self, id: LinkId) {
        let over_half = self.budget.used() > self.budget.limit() / 2;
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        if link.phase != Phase::Attached {
            return;
        }
        let Side::Receiver(r) = &link.side else {
            return;
        };
        if link.credit > (r.window - 1) / 2 || r.in_flight.len() >= r.window as usize {
            return;
        }
        if over_half {
            self.credit_withheld = true;
            return;
        }
        link.credit = r.window;
        self.write_link_flow(id);
    }

    /// Tops up the links whose credit was withheld for the budget, once it is below half used.
    pub(super) fn grant_withheld_credit(&mut self) {
        if !self.credit_withheld || self.budget.used() > self.budget.limit() / 2 {
            return;
        }
        self.credit_withheld = false;
        let receivers: Vec<LinkId> = self
            .links
            .iter()
            .filter(|(_, l)| matches!(l.side, Side::Receiver(_)))
            .map(|(id, _)| *id)
            .collect();
        for id in receivers {
            self.refill_credit(id);
        }
    }

    /// Settles a delivery received on a server-receiver link: sends the DISPOSITION with `state`
    /// unless the client pre-settled it. Must be called once per `Event::Delivery`.
    pub fn settle(
        &mut self,
        id: LinkId,
        delivery_id: u32,
        state: DeliveryState,
    ) -> Result<(), CommandError> {
        let link = self.links.get_mut(&id).ok_or(CommandError::NoLink)?;
        if link.phase != Phase::Attached {
            return Err(CommandError::NoLink);
        }
        let Side::Receiver(r) = &mut link.side else {
            return Err(CommandError::WrongRole);
        };
        let done = r
            .in_flight
            .remove(&delivery_id)
            .ok_or(CommandError::NoDelivery)?;
        let ch = link.channel;
        r.charge.shrink(done.bytes);
        if done.wants_disposition {
            self.queue_disposition(ch, Role::Receiver, delivery_id, Some(state));
        }
        self.refill_credit(id);
        self.grant_withheld_credit();
        Ok(())
    }

    pub(super) fn on_disposition(&mut self, ch: u16, d: DispositionFrame) {
        tracing::trace!(channel = ch, first = d.first, last = d.last, settled = d.settled, state = ?d.state, "disposition");
        if self.live_session(ch).is_none() {
            return;
        }
        if d.role == Role::Sender {
            // About deliveries the client sent us: we settle those first (rcv-settle-mode first),
            // so there is nothing for us to do.
            return;
        }
        let Some(s) = self.sessions.get_mut(&ch) else {
            return;
        };
        let terminal = d.state.as_ref().is_some_and(DeliveryOutcome::is_terminal);
        if !d.settled && !terminal {
            return;
        }
        // at most 65536 ids of one range are considered; the rest stay unsettled (and are
        // NAcked at teardown). Walk only the unsettled ids inside; a wrapped range is two spans.
        let span = d.last.wrapping_sub(d.first);
        let last = if span > MAX_DISPOSITION_SPAN {
            d.first.wrapping_add(MAX_DISPOSITION_SPAN)
        } else {
            d.last
        };
        let d = DispositionFrame { last, ..d };
        let ids: Vec<(u32, LinkId)> = if d.first <= d.last {
            s.out_unsettled
                .range(d.first..=d.last)
                .map(|(k, v)| (*k, *v))
                .collect()
        } else {
            s.out_unsettled
                .range(d.first..)
                .chain(s.out_unsettled.range(..=d.last))
                .map(|(k, v)| (*k, *v))
                .collect()
        };
        let state = if d.settled {
            None
        } else {
            d.state.as_ref().and_then(outcome_to_state)
        };
        for (delivery_id, link_id) in ids {
            if let Some(s) = self.sessions.get_mut(&ch) {
                s.out_unsettled.remove(&delivery_id);
            }
            let token = match self.links.get_mut(&link_id).map(|l| &mut l.side) {
                Some(Side::Sender(snd)) => snd.unsettled.remove(&delivery_id),
                _ => None,
            };
            if let Some(token) = token {
                self.events.push_back(Event::Settled {
                    link: link_id,
                    token,
                    state: d.state.clone(),
                });
            }
            if !d.settled {
                // A terminal state without settling: settle it on the client's behalf.
                self.queue_disposition(ch, Role::Sender, delivery_id, state.clone());
            }
        }
    }
}

fn is_sender(role: &Role) -> bool {
    matches!(role, Role::Sender)
}

/// The reply ATTACH: LINK-4's fields, or for a refusal the same with a null terminus on our side.
fn reply_attach(
    link: &Link,
    request: Option<Box<Attach>>,
    max_message_size: u64,
    refuse: bool,
) -> Attach {
    let server_sends = matches!(link.side, Side::Sender(_));
    let (snd_settle_mode, mut source, mut target) = match request {
        Some(a) => {
            let mode = if a.snd_settle_mode == SenderSettleMode::Settled {
                SenderSettleMode::Settled
            } else {
                SenderSettleMode::Unsettled
            };
            (mode, a.source, a.target)
        }
        None => (SenderSettleMode::Unsettled, None, None),
    };
    if refuse {
        if server_sends {
            source = None;
        } else {
            target = None;
        }
    }
    Attach {
        name: link.name.to_string(),
        handle: link.handle.into(),
        role: if server_sends {
            Role::Sender
        } else {
            Role::Receiver
        },
        snd_settle_mode,
        rcv_settle_mode: ReceiverSettleMode::First,
        source,
        target,
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: server_sends.then_some(0),
        max_message_size: Some(max_message_size),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// A delivery state to echo back when settling on the client's behalf.
fn outcome_to_state(o: &DeliveryOutcome) -> Option<DeliveryState> {
    use fe2o3_amqp_types::messaging::{Accepted, Modified, Released};
    Some(match o {
        DeliveryOutcome::Accepted => DeliveryState::Accepted(Accepted {}),
        DeliveryOutcome::Rejected(e) => DeliveryState::Rejected(Rejected { error: e.clone() }),
        DeliveryOutcome::Released => DeliveryState::Released(Released {}),
        DeliveryOutcome::Modified {
            delivery_failed,
            undeliverable_here,
        } => DeliveryState::Modified(Modified {
            delivery_failed: Some(*delivery_failed),
            undeliverable_here: Some(*undeliverable_here),
            message_annotations: None,
        }),
        DeliveryOutcome::Received | DeliveryOutcome::Unknown(_) => return None,
    })
}
