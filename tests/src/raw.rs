//! A raw-socket AMQP peer for tests that no client library can express: it writes exactly the
//! frames it is told to and decodes whatever the server answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connector::engine::codec::{decode_performative, Performative};
use connector::engine::frame::{split_frame, write_frame, TYPE_AMQP};

/// What the server sent.
#[derive(Debug)]
pub enum Received {
    /// An 8-byte protocol header.
    Header([u8; 8]),
    /// An AMQP frame with a performative.
    Frame(u16, Performative),
    /// An empty frame.
    Heartbeat,
    /// A SASL frame (body undecoded).
    Sasl(bytes::Bytes),
}

/// A raw peer on a blocking socket.
pub struct RawPeer {
    stream: TcpStream,
    buf: BytesMut,
    expect_header: bool,
}

impl RawPeer {
    /// Connects to `addr`.
    pub fn connect(addr: SocketAddr) -> RawPeer {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        RawPeer {
            stream,
            buf: BytesMut::new(),
            expect_header: true,
        }
    }

    /// Writes raw bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// Writes one AMQP frame.
    pub fn frame<T: serde::Serialize>(&mut self, ch: u16, perf: &T, payload: &[u8]) {
        self.write(&frame_bytes(ch, perf, payload));
    }

    /// Reads until the server closes the socket or `within` passes; returns what arrived and
    /// whether the socket was closed by the server.
    pub fn read_all(&mut self, within: Duration) -> (Vec<Received>, bool) {
        let deadline = Instant::now() + within;
        let mut out = Vec::new();
        let mut closed = false;
        let mut chunk = [0u8; 65536];
        while Instant::now() < deadline {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
            self.decode(&mut out);
        }
        self.decode(&mut out);
        (out, closed)
    }

    /// Reads until `pred` matches a received item or `within` passes.
    pub fn read_until(
        &mut self,
        within: Duration,
        pred: impl Fn(&Received) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + within;
        let mut out = Vec::new();
        let mut chunk = [0u8; 65536];
        while Instant::now() < deadline {
            if out.iter().any(&pred) {
                break;
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
            self.decode(&mut out);
        }
        out
    }

    fn decode(&mut self, out: &mut Vec<Received>) {
        loop {
            if self.buf.len() >= 8 && &self.buf[..4] == b"AMQP" && self.expect_header {
                let h = self.buf.split_to(8);
                out.push(Received::Header(h[..].try_into().expect("8 bytes")));
                continue;
            }
            match split_frame(&mut self.buf, u32::MAX) {
                Ok(Some(f)) if f.body.is_empty() => out.push(Received::Heartbeat),
                Ok(Some(f)) if f.frame_type != TYPE_AMQP => out.push(Received::Sasl(f.body)),
                Ok(Some(f)) => {
                    self.expect_header = false;
                    out.push(Received::Frame(
                        f.channel,
                        decode_performative(&f.body).expect("server frame decodes"),
                    ));
                }
                _ => break,
            }
        }
    }
}

/// The bytes of one AMQP frame.
pub fn frame_bytes<T: serde::Serialize>(ch: u16, perf: &T, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    write_frame(&mut out, TYPE_AMQP, ch, |b| {
        b.extend_from_slice(&serde_amqp::to_vec(perf).expect("encode"));
        b.extend_from_slice(payload);
    });
    out.to_vec()
}

/// The condition symbol carried by a CLOSE, END or DETACH, if any.
pub fn condition(r: &Received) -> Option<String> {
    let err = match r {
        Received::Frame(_, Performative::Close(c)) => c.error.as_ref(),
        Received::Frame(_, Performative::End(e)) => e.error.as_ref(),
        Received::Frame(_, Performative::Detach(d)) => d.error.as_ref(),
        _ => None,
    }?;
    match serde_amqp::to_value(&err.condition).ok()? {
        serde_amqp::Value::Symbol(s) => Some(s.0),
        _ => None,
    }
}

/// The description carried by a CLOSE, END or DETACH, if any.
pub fn description(r: &Received) -> Option<String> {
    match r {
        Received::Frame(_, Performative::Close(c)) => c.error.as_ref()?.description.clone(),
        Received::Frame(_, Performative::End(e)) => e.error.as_ref()?.description.clone(),
        Received::Frame(_, Performative::Detach(d)) => d.error.as_ref()?.description.clone(),
        _ => None,
    }
}
