//! A raw-socket AMQP peer for tests that no client library can express: it writes exactly the
//! frames it is told to and decodes whatever the server answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use engine::codec::decode_performative;
pub use engine::codec::Performative;
use engine::frame::{split_frame, TYPE_AMQP};
use engine::peer::{self, error_of, error_symbol};
use engine::HEADER_AMQP;

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
    /// Connects to `addr`; nothing is written.
    pub fn connect(addr: SocketAddr) -> RawPeer {
        RawPeer::from_stream(TcpStream::connect(addr).expect("connect"))
    }

    /// Connects to `addr` from the local address `from` (on loopback, any of 127.0.0.0/8: a
    /// client that looks like another host); nothing is written.
    pub fn connect_from(from: std::net::IpAddr, addr: SocketAddr) -> RawPeer {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .expect("socket");
        socket
            .bind(&SocketAddr::new(from, 0).into())
            .expect("bind the source address");
        socket.connect(&addr.into()).expect("connect");
        RawPeer::from_stream(socket.into())
    }

    fn from_stream(stream: TcpStream) -> RawPeer {
        // Short, so that reads with a small window return on time.
        stream
            .set_read_timeout(Some(Duration::from_millis(10)))
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

    /// Connects to `addr` and writes the protocol header, an OPEN (container `container`)
    /// and a BEGIN on channel 0.
    pub fn open_session(addr: SocketAddr, container: &str) -> RawPeer {
        let mut p = RawPeer::connect(addr);
        p.write(&HEADER_AMQP);
        p.write(&peer::frame(0, &peer::open(container), &[]));
        p.write(&peer::frame(0, &peer::begin(), &[]));
        p
    }

    /// Writes raw bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// Writes raw bytes; false once the server has closed the connection.
    pub fn try_write(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).is_ok()
    }

    /// The performatives of the AMQP frames read within `within` (headers, heartbeats and SASL
    /// frames left out); `None` once the server closed the socket and nothing more came.
    pub fn performatives(&mut self, within: Duration) -> Option<Vec<Performative>> {
        let (got, closed) = self.read_all(within);
        let frames: Vec<Performative> = got
            .into_iter()
            .filter_map(|r| match r {
                Received::Frame(_, p) => Some(p),
                _ => None,
            })
            .collect();
        (!closed || !frames.is_empty()).then_some(frames)
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

pub use engine::peer::frame as frame_bytes;

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
