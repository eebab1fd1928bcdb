//! A raw-socket AMQP peer for tests that no client library can express: it writes exactly the
//! frames it is told to and decodes whatever the server answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connector::engine::codec::{decode_performative, Performative};
use connector::engine::frame::{split_frame, TYPE_AMQP};
use connector::engine::peer::{error_of, error_symbol};

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

    /// Drops the connection with a TCP reset (SO_LINGER 0), as a crashed host or a middlebox
    /// would: no CLOSE, no FIN.
    pub fn reset(self) {
        socket2::SockRef::from(&self.stream)
            .set_linger(Some(Duration::ZERO))
            .expect("SO_LINGER");
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
        self.read(within, |_| false)
    }

    /// Reads until `pred` matches a received item, the socket closes, or `within` passes.
    pub fn read_until(
        &mut self,
        within: Duration,
        pred: impl Fn(&Received) -> bool,
    ) -> Vec<Received> {
        self.read(within, pred).0
    }

    fn read(
        &mut self,
        within: Duration,
        pred: impl Fn(&Received) -> bool,
    ) -> (Vec<Received>, bool) {
        let deadline = Instant::now() + within;
        let mut out = Vec::new();
        let mut closed = false;
        let mut chunk = [0u8; 65536];
        while Instant::now() < deadline && !out.iter().any(&pred) {
            match self.stream.read(&mut chunk) {
                Ok(0) => closed = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => closed = true,
            }
            self.decode(&mut out);
            if closed {
                break;
            }
        }
        (out, closed)
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

pub use connector::engine::peer::frame as frame_bytes;

/// The condition symbol carried by a CLOSE, END or DETACH, if any.
pub fn condition(r: &Received) -> Option<String> {
    match r {
        Received::Frame(_, p) => error_of(p).map(error_symbol),
        _ => None,
    }
}

/// The description carried by a CLOSE, END or DETACH, if any.
pub fn description(r: &Received) -> Option<String> {
    match r {
        Received::Frame(_, p) => error_of(p)?.description.clone(),
        _ => None,
    }
}
