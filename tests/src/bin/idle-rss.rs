//! Measures the connector's resident memory per idle AMQP connection: starts the connector
//! binary, opens N connections (header, OPEN, BEGIN each) and reports the RSS growth per
//! connection. Usage: idle-rss [CONNECTOR_BINARY] [N] [CERT KEY CA]; with the three PEM files the
//! connections are made over TLS to the connector's TLS listener (target then 96 KiB). Linux
//! only (reads /proc).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use connector::engine::peer::{self, frame as frame_bytes};
use connector::engine::HEADER_AMQP;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A blocking stream to the connector: TCP, or TLS (rustls) when a client configuration is given.
trait Io: Read + Write {}
impl<T: Read + Write> Io for T {}

fn handshake(port: u16, tls: Option<&Arc<rustls::ClientConfig>>, i: usize) -> Box<dyn Io> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut s: Box<dyn Io> = match tls {
        None => Box::new(tcp),
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
            let conn = rustls::ClientConnection::new(config.clone(), name).expect("TLS client");
            Box::new(rustls::StreamOwned::new(conn, tcp))
        }
    };
    let open = peer::open(&format!("idle-{i}"));
    let begin = peer::begin();
    let mut bytes = HEADER_AMQP.to_vec();
    bytes.extend(frame_bytes(0, &open, &[]));
    bytes.extend(frame_bytes(0, &begin, &[]));
    s.write_all(&bytes).expect("write");
    s.flush().expect("flush");
    let mut got = 0;
    let mut buf = [0u8; 1024];
    // header (8) + OPEN + BEGIN: at least 40 bytes; good enough to know the server has them.
    while got < 40 {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "server closed connection {i}");
        got += n;
    }
    s
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let binary = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "target/release/kubemq-amqp-connector".into());
    let n: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1000);
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let tls_files = args.get(3..6);
    let mut cmd = Command::new(&binary);
    cmd.args([
        "--bind-address",
        "127.0.0.1",
        "--max-connections",
        "0",
        "--idle-timeout-seconds",
        "0",
    ]);
    let tls = match tls_files {
        None => {
            cmd.args(["--port", &port.to_string()]);
            None
        }
        Some([cert, key, ca]) => {
            cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--tls-cert-file", cert, "--tls-key-file", key]);
            Some(testkit::tls::client_config(std::path::Path::new(ca)).expect("the CA file"))
        }
        Some(_) => unreachable!("get(3..6) is three files"),
    };
    let target = if tls.is_some() { 96.0 } else { 64.0 };
    let mut child = cmd
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
    let pid = child.id();
    let mut warm = None;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(50));
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            warm = Some(handshake(port, tls.as_ref(), usize::MAX));
            break;
        }
    }
    assert!(warm.is_some(), "connector did not start");
    std::thread::sleep(Duration::from_millis(300));
    let before = rss_kib(pid);
    let conns: Vec<Box<dyn Io>> = (0..n).map(|i| handshake(port, tls.as_ref(), i)).collect();
    std::thread::sleep(Duration::from_secs(1));
    let after = rss_kib(pid);
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    println!("connections: {n}; RSS before {before} KiB, after {after} KiB; per idle connection {per:.1} KiB");
    drop(conns);
    drop(warm);
    let _ = child.kill();
    let _ = child.wait();
    if per > target {
        eprintln!("over the {target} KiB target");
        std::process::exit(1);
    }
}
