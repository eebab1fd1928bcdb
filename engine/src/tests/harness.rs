//! A scripted client for engine tests: builds frames with fe2o3 types, feeds them to the engine
//! with a virtual clock, and decodes what the engine answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::performatives::{Attach, Begin, Detach, Disposition, End, Open, Transfer};
use fe2o3_amqp_types::sasl::{SaslMechanisms, SaslOutcome};

use crate::codec::{decode_performative, Performative};
use crate::frame::{split_frame, TYPE_SASL};
pub use crate::peer::{
    attach_receiver, attach_sender, begin, link_flow, open, sasl_frame, transfer,
};
use crate::peer::{error_of, error_symbol};
use crate::{AmqpError, AuthPolicy, Connection, EngineConfig, Event, Transport, HEADER_AMQP};

/// One AMQP frame's bytes.
pub fn amqp_frame<T: serde::Serialize>(ch: u16, perf: &T, payload: &[u8]) -> Vec<u8> {
    crate::peer::frame(ch, perf, payload)
}

/// The condition symbol of an error-carrying frame, if the frame is one.
pub fn condition_of(out: &Out) -> Option<String> {
    match out {
        Out::Frame(_, p) => error_of(p).map(error_symbol),
        _ => None,
    }
}

/// The description of an error-carrying frame, if any.
pub fn description_of(out: &Out) -> Option<String> {
    match out {
        Out::Frame(_, p) => error_of(p)?.description.clone(),
        _ => None,
    }
}

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
        auth: AuthPolicy::Disabled,
        connection_memory: 268_435_456,
        process_memory: crate::ProcessBudget::new(1 << 30),
        // The budget tests count deliveries only; link state has its own test.
        link_state_bytes: 0,
        session_state_bytes: 0,
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
    pub fn request_link(&mut self, ch: u16, a: &Attach) -> crate::LinkId {
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

pub fn payload(out: &Out) -> Option<Bytes> {
    match out {
        Out::Frame(_, Performative::Transfer(_, p)) => Some(p.clone()),
        _ => None,
    }
}
