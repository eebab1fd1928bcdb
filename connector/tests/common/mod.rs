//! What the tests that run the connector binary share: starting it on a free port, reading its
//! memory, and raw AMQP peers on it (testkit's).

#![allow(dead_code)] // each test binary uses its own part of it

pub mod pki;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::raw::RawPeer;

pub use testkit::free_port;

/// Kills the children when the test ends, however it ends.
pub struct Reaper(pub Vec<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts the connector on its embedded store in `dir`, listening on `port`, with `args` added
/// to its command line (its HTTP endpoint off unless they set `--http-address`); returns once it
/// listens, on its HTTP endpoint too when one is given.
pub fn start_connector(dir: &std::path::Path, port: u16, args: &[&str]) -> Child {
    let (_, log) = testkit::logs::file("connector");
    let mut command = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"));
    command.args(["--port", &port.to_string(), "--bind-address", "127.0.0.1"]);
    if !args.contains(&"--http-address") {
        command.args(["--http-address", "off"]);
    }
    let child = command
        .args(["--data-dir", dir.to_str().expect("utf-8 path")])
        .args(args)
        .env("RUST_LOG", "info")
        // Into the suite's logs, which the secrets check reads.
        .stdout(Stdio::from(log.try_clone().expect("the log file")))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("connector starts");
    wait_listening(port);
    // The HTTP endpoint is bound after the AMQP listeners: wait for it too when asked for.
    let http = args
        .iter()
        .position(|a| *a == "--http-address")
        .and_then(|i| args.get(i + 1))
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok());
    if let Some(http) = http {
        wait_listening(http.port());
    }
    child
}

/// Returns once something listens on loopback `port`; fails after 10 s.
pub fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a client program (python3, node) that prints `PASS ...` when its scenario held; fails
/// with its output otherwise.
pub fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .expect("the client runs (tests/run.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "{cmd:?}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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

/// A raw peer on `port` with the protocol header, OPEN and a BEGIN on channel 0 written.
pub fn connect(port: u16) -> RawPeer {
    RawPeer::open_session(loopback(port), "raw-test")
}

/// A raw peer on `port`, nothing written.
pub fn connect_bare(port: u16) -> RawPeer {
    RawPeer::connect(loopback(port))
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}
