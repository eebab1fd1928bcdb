//! What the tests that run the connector binary share: starting it on a free port, reading its
//! memory, and a minimal raw AMQP client (frames out, performatives in).

#![allow(dead_code)] // each test binary uses its own part of it

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use connector::engine::codec::{decode_performative, Performative};
use connector::engine::frame::split_frame;
use connector::engine::peer;
use connector::engine::HEADER_AMQP;

/// A loopback port nobody listens on.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

/// Starts the connector on its embedded store in `dir`, listening on `port`, with `args` added
/// to its command line; returns once it listens.
pub fn start_connector(dir: &std::path::Path, port: u16, args: &[&str]) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
        .args([
            "--port",
            &port.to_string(),
            "--bind-address",
            "127.0.0.1",
            "--http-address",
            "off",
        ])
        .args(["--data-dir", dir.to_str().expect("utf-8 path")])
        .args(args)
        .env("RUST_LOG", "warn")
        // Freed memory goes back to the system at once instead of after mimalloc's delay, so the
        // memory tests measure what the connector holds rather than the allocator's retention.
        .env("MIMALLOC_PURGE_DELAY", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("connector starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "connector did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// A field of `/proc/<pid>/status` in bytes (`VmRSS`, `VmHWM`).
pub fn memory_of(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A minimal raw client: frames out, performatives in.
pub struct Client {
    s: TcpStream,
    buf: BytesMut,
    /// The server closed the socket; what came before was returned already.
    closed: bool,
}

impl Client {
    /// Connected, with the protocol header, OPEN and a BEGIN on channel 0 written.
    pub fn connect(port: u16) -> Client {
        let mut c = Client::connect_bare(port);
        c.write(&HEADER_AMQP);
        c.write(&peer::frame(0, &peer::open("raw-test"), &[]));
        c.write(&peer::frame(0, &peer::begin(), &[]));
        c
    }

    /// Connected, nothing written.
    pub fn connect_bare(port: u16) -> Client {
        let s = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        Client {
            s,
            buf: BytesMut::new(),
            closed: false,
        }
    }

    /// Writes `b`; false once the connection is gone.
    pub fn write(&mut self, b: &[u8]) -> bool {
        self.s.write_all(b).is_ok()
    }

    /// Performatives read within `wait`; `None` once the socket is closed and everything before
    /// the close was returned.
    pub fn read(&mut self, wait: Duration) -> Option<Vec<(Performative, bytes::Bytes)>> {
        if self.closed {
            return None;
        }
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        let mut chunk = [0u8; 65536];
        loop {
            let read = self.s.read(&mut chunk);
            if matches!(read, Ok(0)) {
                self.closed = true;
            }
            match read {
                Ok(0) if out.is_empty() && self.buf.is_empty() => return None,
                Ok(0) => {}
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return None,
            }
            if self.buf.len() >= 8 && &self.buf[..4] == b"AMQP" {
                let _ = self.buf.split_to(8);
            }
            while let Ok(Some(f)) = split_frame(&mut self.buf, u32::MAX) {
                if let Ok(p) = decode_performative(&f.body) {
                    let payload = match &p {
                        Performative::Transfer(_, pl) => pl.clone(),
                        _ => bytes::Bytes::new(),
                    };
                    out.push((p, payload));
                }
            }
            if self.closed || Instant::now() >= deadline {
                return Some(out);
            }
        }
    }
}
