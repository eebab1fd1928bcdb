//! What the workspace's tests share, in one place: a free loopback port, a blocking HTTP GET for
//! the `/livez` `/readyz` `/metrics` endpoints, waiting until a condition holds, a raw-socket
//! AMQP peer for what no client library can express, a TLS client configuration, where the
//! suite's logs and the secrets they must not hold are kept, where the real KubeMQ tier's
//! binaries are, and running the repository's build scripts.

pub mod logs;
pub mod raw;
pub mod reference;
pub mod tls;

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Loopback with port 0: binding it takes an ephemeral port (no race with other tests).
pub const ANY_LOOPBACK_PORT: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0));

/// `N` distinct ports nobody listens on right now, outside the system's ephemeral range (below
/// 32768, where Linux's range starts): for a server that also takes ephemeral ports of its own
/// while it starts (KubeMQ), which could otherwise be handed a port chosen here before the
/// server binds it.
pub fn free_fixed_ports<const N: usize>() -> [u16; N] {
    // Each process starts at its own place in 20000..32000 (neighbouring process ids land 997
    // ports apart), and every call in the process moves on past the ports an earlier call
    // returned: a port found free here is only bound later by the child, so two tests of one
    // binary probing the same place at once would both be handed it.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const SPAN: u32 = 12_000;
    let start = (std::process::id().wrapping_mul(997)) % SPAN;
    let mut found = [0u16; N];
    let mut taken = 0;
    while taken < N {
        let i = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(i < SPAN, "no free port left below the ephemeral range");
        let port = (20_000 + (start + i) % SPAN) as u16;
        if TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok()
            && TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)).is_ok()
        {
            found[taken] = port;
            taken += 1;
        }
    }
    found
}

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
/// (not listening, closed early, or not HTTP). A chunked body is given whole.
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
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding") && v.trim() == "chunked"
        })
    });
    let body = if chunked {
        dechunked(body)?
    } else {
        body.to_string()
    };
    Some(Reply { status, body })
}

/// The data of a chunked body (RFC 9112 7.1); `None` when it is cut short.
fn dechunked(mut rest: &str) -> Option<String> {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(body);
        }
        body.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
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

/// Runs `bash script args...` (one of the repository's build scripts, which print the folder
/// they built into) and returns that folder; fails with what the script printed. What cargo set
/// for the calling test is not passed on: ring's build script, for one, reruns when
/// CARGO_MANIFEST_DIR changes, which would make a release build tests/run.sh did start over.
pub fn built_by(script: &Path, args: &[&OsStr]) -> PathBuf {
    let mut cmd = Command::new("bash");
    cmd.arg(script).args(args).stderr(Stdio::inherit());
    for (key, _) in std::env::vars() {
        if key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_TARGET_DIR" {
            cmd.env_remove(key);
        }
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("bash runs {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stdout)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks are joined, extensions ignored, and a body cut short is no body.
    #[test]
    fn a_chunked_body_is_joined() {
        assert_eq!(
            dechunked("5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n").as_deref(),
            Some("hello, world")
        );
        assert_eq!(dechunked("5\r\nhel").as_deref(), None);
        assert_eq!(dechunked("").as_deref(), None);
    }

    #[test]
    fn concurrent_callers_are_handed_different_fixed_ports() {
        let threads: Vec<_> = (0..8)
            .map(|_| std::thread::spawn(free_fixed_ports::<3>))
            .collect();
        let mut ports: Vec<u16> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("a thread"))
            .collect();
        assert!(ports.iter().all(|p| (20_000..32_000).contains(p)));
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 24, "a port was handed out twice");
    }
}
