//! The Queues concept page's scenarios with rhea-promise (npm) against the real connector on the
//! embedded store and over gRPC (Q-S1 … Q-S4).

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
