//! Interop with rhea and rhea-promise (npm) over real sockets, against the test-only in-memory
//! node. The packages are installed into tests/js by `tests/run.sh`; missing ones fail loudly.

use std::process::Command;

use interop_tests::TestServer;

fn run(scenario: &str) {
    let server = TestServer::start_default();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/js");
    let out = Command::new("node")
        .current_dir(dir)
        .args(["interop.js", scenario, &server.addr.port().to_string()])
        .output()
        .expect("node must be installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scenario {scenario} failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(&format!("PASS {scenario}")), "{stdout}");
}

/// Send (awaiting accepted), receive with credit, accept.
#[test]
fn rhea_basic() {
    run("basic");
}

/// Multi-frame messages at max-frame-size 4096.
#[test]
fn rhea_large() {
    run("large");
}

/// Released delivery comes back.
#[test]
fn rhea_release() {
    run("release");
}

/// Drain: receiver_drained after what was available, credit 0 (FLOW-5).
#[test]
fn rhea_drain() {
    run("drain");
}
