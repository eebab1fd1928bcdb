//! Interop with rhea and rhea-promise (npm) over real sockets, against the test-only in-memory
//! node. The packages are installed into tests/js by `tests/run.sh`; missing ones fail loudly.

use interop_tests::{run_client_script, TestServer};

fn run(scenario: &str) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/js");
    let server = TestServer::start_default();
    run_client_script(
        "node",
        dir,
        &["interop.js", scenario, "{port}"],
        scenario,
        server.addr,
    );
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
