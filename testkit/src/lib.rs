//! What the workspace's tests share, in one place: a free loopback port, a blocking HTTP GET for
//! the `/livez` `/readyz` `/metrics` endpoints, waiting until a condition holds, a raw-socket
//! AMQP peer for what no client library can express, a TLS client configuration, and where the
//! suite's logs and the secrets they must not hold are kept.

pub mod logs;
pub mod raw;
pub mod tls;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Loopback with port 0: binding it takes an ephemeral port (no race with other tests).
pub const ANY_LOOPBACK_PORT: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0));

/// A loopback port nobody listens on right now, for a child process to bind (prefer binding
/// [`ANY_LOOPBACK_PORT`] where the test binds the socket itself).
pub fn free_port() -> u16 {
    TcpListener::bind(ANY_LOOPBACK_PORT)
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// An HTTP reply: the status code and the whole response text (head and body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The body, after the blank line.
    pub body: String,
}

/// `GET path` on `addr` with `Connection: close`, waiting up to 5 s; `None` when nothing answers
/// (not listening, closed early, or not HTTP).
pub fn http_get(addr: SocketAddr, path: &str) -> Option<Reply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some(Reply { status, body })
}

/// Checks `done` every 10 ms until it holds; fails naming `what` after `within` (a guard against
/// hanging, not a speed check).
pub fn eventually(what: &str, within: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
