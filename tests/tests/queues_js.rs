//! rhea and rhea-promise (npm) against the real connector on every backend: the Queues concept
//! page's scenarios (Q-S1 … Q-S4) and drain (FLOW-5).

use interop_tests::run_client_script_on_both_backends;

fn run(scenario: &str) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/js");
    run_client_script_on_both_backends("node", dir, &["queues.js", scenario, "{port}"], scenario);
}

/// Q-S1.
#[test]
fn q_s1_send_receive_accept() {
    run("q_s1");
}

/// Q-S2.
#[test]
fn q_s2_outcomes_and_redelivery() {
    run("q_s2");
}

/// Q-S3.
#[test]
fn q_s3_settle_modes() {
    run("q_s3");
}

/// Q-S4.
#[test]
fn q_s4_large_message() {
    run("q_s4");
}

/// FLOW-5: with two messages waiting, a drain with credit 5 delivers both, then reports drained
/// with credit 0.
#[test]
fn flow_5_drain() {
    run("drain");
}
