//! A scripted client for engine tests: builds frames with fe2o3 types, feeds them to the engine
//! with a virtual clock, and decodes what the engine answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::definitions::{ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Source, Target, TargetArchetype};
use fe2o3_amqp_types::performatives::{
    Attach, Begin, Detach, Disposition, End, Flow, Open, Transfer,
};
use fe2o3_amqp_types::sasl::{SaslMechanisms, SaslOutcome};
use serde_bytes::ByteBuf;

use crate::engine::codec::{decode_performative, Performative};
use crate::engine::frame::{split_frame, write_frame, TYPE_AMQP, TYPE_SASL};
use crate::engine::{AmqpError, Connection, EngineConfig, Event, NoAuth, Transport, HEADER_AMQP};

/// Something the engine wrote.
#[derive(Debug)]
pub enum Out {
    Header([u8; 8]),
    Mechanisms(SaslMechanisms),
    Outcome(SaslOutcome),
    Frame(u16, Performative),
    Heartbeat,
}

pub fn config() -> EngineConfig {
    EngineConfig {
        max_frame_size: 131_072,
        max_message_size: 104_857_600,
        session_max: 256,
        max_links_per_session: 256,
        idle_timeout: Some(Duration::from_secs(120)),
        handshake_timeout: Duration::from_secs(30),
        close_timeout: Duration::from_secs(2),
        authenticator: Arc::new(NoAuth),
    }
}

pub struct Client {
    pub conn: Connection,
    pub now: Instant,
    pub pending: BytesMut,
    pub input: BytesMut,
    pub events: Vec<Event>,
}

impl Client {
    pub fn new(cfg: EngineConfig) -> Self {
        Self::with(cfg, Transport::Plain, None)
    }

    pub fn with(cfg: EngineConfig, transport: Transport, admission: Option<AmqpError>) -> Self {
        let now = Instant::now();
        Client {
            conn: Connection::new(Arc::new(cfg), transport, admission, now),
            now,
            pending: BytesMut::new(),
            input: BytesMut::new(),
            events: Vec::new(),
        }
    }

    /// Feeds raw bytes and returns everything the engine wrote in response.
    pub fn raw(&mut self, bytes: &[u8]) -> Vec<Out> {
        self.input.extend_from_slice(bytes);
        self.conn.handle_input(self.now, &mut self.input);
        self.collect()
    }

    /// Output produced so far, decoded; events are stashed in `self.events`.
    pub fn collect(&mut self) -> Vec<Out> {
        while let Some(e) = self.conn.poll_event() {
            self.events.push(e);
        }
        let mut out = BytesMut::new();
        self.conn.poll_transmit(&mut out);
        self.pending.extend_from_slice(&out);
        decode_output(&mut self.pending)
    }

    pub fn frame<T: serde::Serialize>(&mut self, ch: u16, perf: &T) -> Vec<Out> {
        self.raw(&amqp_frame(ch, perf, &[]))
    }

    pub fn transfer(&mut self, ch: u16, t: &Transfer, payload: &[u8]) -> Vec<Out> {
        self.raw(&amqp_frame(ch, t, payload))
    }

    pub fn advance(&mut self, d: Duration) -> Vec<Out> {
        self.now += d;
        self.conn.handle_timeout(self.now);
        self.collect()
    }

    pub fn take_events(&mut self) -> Vec<Event> {
        self.collect();
        std::mem::take(&mut self.events)
    }

    /// Bare header and OPEN; returns the server's OPEN.
    pub fn open(&mut self) -> Open {
        let out = self.raw(&HEADER_AMQP);
        assert!(
            matches!(out[..], [Out::Header(h)] if h == HEADER_AMQP),
            "{out:?}"
        );
        let out = self.frame(0, &open("client-1"));
        match out.into_iter().next() {
            Some(Out::Frame(0, Performative::Open(o))) => *o,
            other => panic!("expected OPEN, got {other:?}"),
        }
    }

    /// Open plus BEGIN on channel 0.
    pub fn open_session(&mut self) -> Begin {
        self.open();
        let out = self.frame(0, &begin());
        self.events.clear();
        match out.into_iter().next() {
            Some(Out::Frame(0, Performative::Begin(b))) => b,
            other => panic!("expected BEGIN, got {other:?}"),
        }
    }

    /// Attaches a link and returns the id from AttachRequested (not yet accepted).
    pub fn request_link(&mut self, ch: u16, a: &Attach) -> crate::engine::LinkId {
        let out = self.frame(ch, a);
        assert!(
            out.is_empty(),
            "engine answered before the application: {out:?}"
        );
        let evs = self.take_events();
        match evs.into_iter().find(|e| !matches!(e, Event::Opened { .. })) {
            Some(Event::AttachRequested { link, .. }) => link,
            other => panic!("expected AttachRequested, got {other:?}"),
        }
    }
}

pub fn decode_output(buf: &mut BytesMut) -> Vec<Out> {
    let mut v = Vec::new();
    loop {
        if buf.len() >= 8 && &buf[..4] == b"AMQP" {
            let h = buf.split_to(8);
            v.push(Out::Header(h[..].try_into().unwrap()));
            continue;
        }
        match split_frame(buf, u32::MAX).expect("engine wrote a bad frame") {
            None => break,
            Some(f) if f.body.is_empty() => v.push(Out::Heartbeat),
            Some(f) if f.frame_type == TYPE_SASL => {
                if f.body[2] == 0x40 {
                    v.push(Out::Mechanisms(serde_amqp::from_slice(&f.body).unwrap()));
                } else {
                    v.push(Out::Outcome(serde_amqp::from_slice(&f.body).unwrap()));
                }
            }
            Some(f) => v.push(Out::Frame(
                f.channel,
                decode_performative(&f.body).expect("engine wrote an undecodable frame"),
            )),
        }
    }
    v
}

pub fn amqp_frame<T: serde::Serialize>(ch: u16, perf: &T, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    write_frame(&mut out, TYPE_AMQP, ch, |b| {
        b.extend_from_slice(&serde_amqp::to_vec(perf).unwrap());
        b.extend_from_slice(payload);
    });
    out.to_vec()
}

pub fn sasl_frame<T: serde::Serialize>(perf: &T) -> Vec<u8> {
    let mut out = BytesMut::new();
    write_frame(&mut out, TYPE_SASL, 0, |b| {
        b.extend_from_slice(&serde_amqp::to_vec(perf).unwrap())
    });
    out.to_vec()
}

pub fn open(container: &str) -> Open {
    Open {
        container_id: container.into(),
        hostname: Some("example.com".into()),
        max_frame_size: u32::MAX.into(),
        channel_max: u16::MAX.into(),
        idle_time_out: None,
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

pub fn begin() -> Begin {
    Begin {
        remote_channel: None,
        next_outgoing_id: 1,
        incoming_window: 5000,
        outgoing_window: 5000,
        handle_max: u32::MAX.into(),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// ATTACH of a client sender (it produces to `addr`).
pub fn attach_sender(name: &str, handle: u32, addr: &str) -> Attach {
    Attach {
        name: name.into(),
        handle: handle.into(),
        role: Role::Sender,
        snd_settle_mode: SenderSettleMode::Unsettled,
        rcv_settle_mode: ReceiverSettleMode::First,
        source: Some(Box::new(Source::builder().address("client").build())),
        target: Some(Box::new(TargetArchetype::Target(
            Target::builder().address(addr.to_string()).build(),
        ))),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: Some(0),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// ATTACH of a client receiver (it consumes from `addr`).
pub fn attach_receiver(name: &str, handle: u32, addr: &str) -> Attach {
    Attach {
        role: Role::Receiver,
        source: Some(Box::new(
            Source::builder().address(addr.to_string()).build(),
        )),
        target: Some(Box::new(TargetArchetype::Target(
            Target::builder().address("client").build(),
        ))),
        initial_delivery_count: None,
        ..attach_sender(name, handle, addr)
    }
}

pub fn link_flow(handle: u32, delivery_count: u32, credit: u32, drain: bool) -> Flow {
    Flow {
        next_incoming_id: Some(0),
        incoming_window: 5000,
        next_outgoing_id: 1,
        outgoing_window: 5000,
        handle: Some(handle.into()),
        delivery_count: Some(delivery_count),
        link_credit: Some(credit),
        available: None,
        drain,
        echo: false,
        properties: None,
    }
}

pub fn transfer(
    handle: u32,
    id: Option<u32>,
    tag: Option<&[u8]>,
    settled: bool,
    more: bool,
) -> Transfer {
    Transfer {
        handle: handle.into(),
        delivery_id: id,
        delivery_tag: tag.map(|t| ByteBuf::from(t.to_vec())),
        message_format: id.map(|_| 0),
        settled: Some(settled),
        more,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    }
}

pub fn disposition(
    first: u32,
    last: Option<u32>,
    settled: bool,
    state: Option<fe2o3_amqp_types::messaging::DeliveryState>,
) -> Disposition {
    Disposition {
        role: Role::Receiver,
        first,
        last,
        settled,
        state,
        batchable: false,
    }
}

pub fn detach(handle: u32) -> Detach {
    Detach {
        handle: handle.into(),
        closed: true,
        error: None,
    }
}

pub fn end() -> End {
    End { error: None }
}

/// The condition symbol of an error-carrying frame, if the frame is one.
pub fn condition_of(out: &Out) -> Option<String> {
    let err = match out {
        Out::Frame(_, Performative::Close(c)) => c.error.as_ref(),
        Out::Frame(_, Performative::End(e)) => e.error.as_ref(),
        Out::Frame(_, Performative::Detach(d)) => d.error.as_ref(),
        _ => None,
    }?;
    match serde_amqp::to_value(&err.condition).ok()? {
        serde_amqp::Value::Symbol(s) => Some(s.0),
        _ => None,
    }
}

pub fn description_of(out: &Out) -> Option<String> {
    match out {
        Out::Frame(_, Performative::Close(c)) => c.error.as_ref()?.description.clone(),
        Out::Frame(_, Performative::End(e)) => e.error.as_ref()?.description.clone(),
        Out::Frame(_, Performative::Detach(d)) => d.error.as_ref()?.description.clone(),
        _ => None,
    }
}

pub fn payload(out: &Out) -> Option<Bytes> {
    match out {
        Out::Frame(_, Performative::Transfer(_, p)) => Some(p.clone()),
        _ => None,
    }
}
