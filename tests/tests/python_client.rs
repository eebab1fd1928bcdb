//! Interop with python-qpid-proton (PyPI) over real sockets, against the test-only in-memory node.
//! The client is installed by `tests/run.sh`; a missing client fails these tests loudly.

use interop_tests::{run_client_script, TestServer};

fn run(scenario: &str) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
    let server = TestServer::start_default();
    run_client_script(
        "python3",
        dir,
        &["interop.py", scenario, "{url}"],
        scenario,
        server.addr,
    );
}

/// Send, receive with credit, accept, release and redelivery.
#[test]
fn proton_basic() {
    run("basic");
}

/// Multi-frame messages at max-frame-size 4096 (XFER-1, XFER-3).
#[test]
fn proton_large() {
    run("large");
}

/// Pre-settled produce and consume.
#[test]
fn proton_presettled() {
    run("presettled");
}

/// Drain completes with credit 0 after what was available (FLOW-5).
#[test]
fn proton_drain() {
    run("drain");
}

/// 200 links on one session.
#[test]
fn proton_many_links() {
    run("many_links");
}

/// SASL PLAIN with credentials (SASL-2, SASL-4).
#[test]
fn proton_sasl_plain() {
    run("plain");
}

/// The server keeps an idle client alive with empty frames (CONN-12).
#[test]
fn proton_heartbeat() {
    run("heartbeat");
}
