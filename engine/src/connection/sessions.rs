//! The session-level frames of a connection: BEGIN, END, session FLOW and DISPOSITION, the
//! windows that pace transfers (SESS-*, FLOW-*), and the transfers that wait for them.

use super::Connection;
use super::{transport_full, wire_to_error};
use crate::codec;
use crate::error::{AmqpError, Condition};
use crate::event::Event;
use crate::session::{Blocked, LinkFlow, PendingDisposition, Session, SESSION_WINDOW};
use crate::LinkId;
use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::messaging::DeliveryState;
use fe2o3_amqp_types::performatives::{Begin, Disposition, End, Flow};
use std::collections::{BTreeMap, HashSet};

impl Connection {
    /// Answers a BEGIN with BEGIN + END carrying `error` (SESS-2), remembering the channel by
    /// one bit until the client's END.
    fn refuse_begin(&mut self, ch: u16, reply: Begin, error: AmqpError) {
        self.write_perf(ch, &reply);
        self.errors_sent.session += 1;
        let end = End {
            error: Some(error.to_wire()),
        };
        self.write_perf(ch, &end);
        self.refused.insert(ch);
    }

    pub(super) fn on_begin(&mut self, ch: u16, begin: Begin) {
        if begin.remote_channel.is_some() {
            // We never send BEGIN first, so this answers nothing.
            return self.protocol_failure(AmqpError::new(
                Condition::NotAllowed,
                "begin with remote-channel from a client",
            ));
        }
        if self.refused.contains(ch) {
            return;
        }
        if let Some(s) = self.sessions.get(&ch) {
            if s.ending {
                return;
            }
            // SESS-3: our channel equals theirs, so this END ends the live session too.
            return self.end_session(
                ch,
                AmqpError::new(Condition::ErrantLink, "channel already has a live session"),
            );
        }
        let reply = Begin {
            remote_channel: Some(ch),
            next_outgoing_id: 0,
            incoming_window: SESSION_WINDOW,
            outgoing_window: SESSION_WINDOW,
            handle_max: self.cfg.max_links_per_session.saturating_sub(1).into(),
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        };
        // Channels above the channel-max we advertised (SessionMax − 1, CONN-9) are the only way
        // past SessionMax live sessions: refused with BEGIN + END (SESS-2), remembered by one bit
        // until the client's END.
        if ch > self.channel_max() {
            let full = AmqpError::new(Condition::ResourceLimitExceeded, "session limit reached");
            return self.refuse_begin(ch, reply, full);
        }
        // The state the session makes the connector keep, within the process budget.
        let state = match self
            .cfg
            .process_memory
            .reserve(self.cfg.session_state_bytes)
        {
            Ok(r) => r,
            Err(e) => return self.refuse_begin(ch, reply, e.to_error()),
        };
        let session = Session {
            _state: state,
            ending: false,
            next_incoming_id: begin.next_outgoing_id,
            incoming_window: SESSION_WINDOW,
            next_outgoing_id: 0,
            remote_incoming_window: begin.incoming_window,
            next_delivery_id: 0,
            by_handle: Default::default(),
            names: HashSet::new(),
            out_unsettled: BTreeMap::new(),
            blocked: Blocked::new(&self.budget),
        };
        self.sessions.insert(ch, session);
        self.write_perf(ch, &reply);
    }

    pub(super) fn on_end(&mut self, ch: u16, end: End) {
        if self.refused.remove(ch) {
            // The END of a refused BEGIN: nothing to answer.
            return;
        }
        let Some(s) = self.sessions.get(&ch) else {
            return self.protocol_failure(AmqpError::new(
                Condition::NotAllowed,
                format!("end on channel {ch} without a session"),
            ));
        };
        let was_ending = s.ending;
        let err = end.error.as_ref().map(wire_to_error);
        self.drop_session(ch, err);
        if !was_ending {
            // SESS-6: answer without error; the channel is free again.
            self.write_perf(ch, &End { error: None });
        }
    }

    /// Sends END with `err` and ends every link of the session; the client's END completes it.
    pub(super) fn end_session(&mut self, ch: u16, err: AmqpError) {
        tracing::info!(channel = ch, error = %err, "ending session");
        let links: Vec<LinkId> = self
            .sessions
            .get(&ch)
            .map(|s| s.by_handle.values().copied().collect())
            .unwrap_or_default();
        for id in links {
            self.drop_link(id, Some(err.clone()));
        }
        if let Some(s) = self.sessions.get_mut(&ch) {
            s.ending = true;
            s.blocked.clear();
            s.out_unsettled.clear();
            s.names.clear();
        }
        self.errors_sent.session += 1;
        self.write_perf(
            ch,
            &End {
                error: Some(err.to_wire()),
            },
        );
    }

    /// Removes a session and ends its links, writing nothing.
    pub(super) fn drop_session(&mut self, ch: u16, err: Option<AmqpError>) {
        if let Some(s) = self.sessions.remove(&ch) {
            for id in s.by_handle.values() {
                self.drop_link(*id, err.clone());
            }
        }
    }

    /// The session for a frame on `ch`, or `None` after handling the error or an ending session.
    pub(super) fn live_session(&mut self, ch: u16) -> Option<&mut Session> {
        match self.sessions.get(&ch) {
            // A refused session's frames before its END are ignored, like an ending one's.
            None if self.refused.contains(ch) => None,
            None => {
                self.protocol_failure(AmqpError::new(
                    Condition::NotAllowed,
                    format!("frame on channel {ch} without a session"),
                ));
                None
            }
            Some(s) if s.ending => None,
            Some(_) => self.sessions.get_mut(&ch),
        }
    }

    /// Accounts one incoming TRANSFER frame against the session window (SESS-4); false when the
    /// session was ended for a violation.
    pub(super) fn take_incoming_window(&mut self, ch: u16) -> bool {
        let Some(s) = self.sessions.get_mut(&ch) else {
            return false;
        };
        if s.incoming_window == 0 {
            self.end_session(
                ch,
                AmqpError::new(
                    Condition::WindowViolation,
                    "transfer beyond the session incoming window",
                ),
            );
            return false;
        }
        s.incoming_window -= 1;
        s.next_incoming_id = s.next_incoming_id.wrapping_add(1);
        true
    }

    /// SESS-4: after a batch of input, re-advertise every incoming window that fell below half.
    /// Done per batch, not per frame: a client can only rely on a FLOW it has received, so frames
    /// pipelined past the window within one batch are a real violation.
    pub(super) fn replenish_windows(&mut self) {
        let low: Vec<u16> = self
            .sessions
            .iter()
            .filter(|(_, s)| !s.ending && s.incoming_window < SESSION_WINDOW / 2)
            .map(|(ch, _)| *ch)
            .collect();
        for ch in low {
            if let Some(s) = self.sessions.get_mut(&ch) {
                s.incoming_window = SESSION_WINDOW;
            }
            self.write_session_flow(ch, None);
        }
    }

    /// Session-level part of a client FLOW: the client's incoming window for our transfers.
    pub(super) fn on_session_flow(&mut self, ch: u16, flow: &Flow) {
        let Some(s) = self.sessions.get_mut(&ch) else {
            return;
        };
        let window_before = s.remote_incoming_window;
        let next_in = flow.next_incoming_id.unwrap_or(0);
        s.remote_incoming_window = next_in
            .wrapping_add(flow.incoming_window)
            .wrapping_sub(s.next_outgoing_id);
        if s.remote_incoming_window > flow.incoming_window {
            // The client's next-incoming-id is ahead of what we sent: trust only its window.
            s.remote_incoming_window = flow.incoming_window;
        }
        // Only a window that was used up can have cut a sender's demand to nothing; while it
        // was open, what went out keeps the application recomputing demand anyway, and every
        // FLOW of a busy client would otherwise make it re-report all its links.
        if window_before == 0 && s.remote_incoming_window > 0 {
            self.events.push_back(Event::WindowOpened);
        }
        self.flush_blocked(ch);
        if flow.handle.is_none() && flow.echo {
            self.write_session_flow(ch, None);
        }
    }

    /// Sends blocked TRANSFER frames while the client's incoming window allows.
    pub(super) fn flush_blocked(&mut self, ch: u16) {
        self.flush_disposition();
        let Some(s) = self.sessions.get_mut(&ch) else {
            return;
        };
        while s.remote_incoming_window > 0 && !s.blocked.is_empty() {
            if transport_full(self.out.len() + self.unwritten, self.held_for_transport) {
                self.held_for_transport = true;
                break;
            }
            let Some(frame) = s.blocked.pop() else {
                break;
            };
            s.remote_incoming_window -= 1;
            s.next_outgoing_id = s.next_outgoing_id.wrapping_add(1);
            self.out.extend_from_slice(&frame);
        }
    }

    /// Writes a FLOW with the session fields and, for a link, its link fields.
    pub(super) fn write_session_flow(&mut self, ch: u16, link: Option<LinkFlow>) {
        let Some(s) = self.sessions.get(&ch) else {
            return;
        };
        let flow = Flow {
            // SESS-7: always carry next-incoming-id.
            next_incoming_id: Some(s.next_incoming_id),
            incoming_window: s.incoming_window,
            next_outgoing_id: s.next_outgoing_id,
            outgoing_window: SESSION_WINDOW,
            handle: link.as_ref().map(|l| l.handle.into()),
            delivery_count: link.as_ref().map(|l| l.delivery_count),
            link_credit: link.as_ref().map(|l| l.credit),
            available: None,
            drain: link.as_ref().is_some_and(|l| l.drain),
            echo: false,
            properties: None,
        };
        self.write_perf(ch, &flow);
    }

    /// Queues a settled DISPOSITION for one delivery, merged with a contiguous pending range.
    pub(super) fn queue_disposition(
        &mut self,
        ch: u16,
        role: Role,
        id: u32,
        state: Option<DeliveryState>,
    ) {
        if let Some(p) = &mut self.pending_disposition {
            if p.channel == ch && p.role == role && p.state == state && p.last.wrapping_add(1) == id
            {
                p.last = id;
                return;
            }
        }
        self.flush_disposition();
        self.pending_disposition = Some(PendingDisposition {
            channel: ch,
            role,
            first: id,
            last: id,
            state,
        });
    }

    pub(super) fn pending_disposition_exists(&self) -> bool {
        self.pending_disposition.is_some()
    }

    /// Writes the pending DISPOSITION range, if any; every other frame write calls this first so
    /// frames leave in the order they were produced.
    pub(super) fn flush_disposition(&mut self) {
        if let Some(p) = self.pending_disposition.take() {
            if self.is_open() {
                let d = Disposition {
                    role: p.role,
                    first: p.first,
                    last: (p.last != p.first).then_some(p.last),
                    settled: true,
                    state: p.state,
                    batchable: false,
                };
                codec::write_amqp(&mut self.out, p.channel, &d, &[]);
            }
        }
    }

    /// Writes a performative after any pending DISPOSITION.
    pub(super) fn write_perf<T: serde::Serialize>(&mut self, ch: u16, perf: &T) {
        self.flush_disposition();
        codec::write_amqp(&mut self.out, ch, perf, &[]);
    }
}
