//! Azure/go-amqp (the Go module proxy) against the real connector over real sockets, on both
//! backends: the Queues concept page's Go program as the page writes it (its address comes from
//! `KUBEMQ_AMQP_URL`, as the page reads it), and the scenarios of `tests/go/scenarios`. The
//! programs are built by `tests/run.sh` into `tests/go/bin`; a missing build fails these tests.

use connector::config::Settings;
use interop_tests::{run_client_script_on_both_backends, TestConnector};

const BIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/go/bin");

fn scenario(name: &str) {
    run_client_script_on_both_backends(&format!("{BIN}/scenarios"), BIN, &[name, "{url}"], name);
}

/// Q-S1 with go-amqp: the page's program sends 10 messages, each confirmed, consumes and accepts
/// them, and finds the queue empty.
#[test]
fn q_s1_the_concept_pages_go_program() {
    TestConnector::each_backend(Settings::default(), |c| {
        let out = std::process::Command::new(format!("{BIN}/seed"))
            .env("KUBEMQ_AMQP_URL", c.url())
            .output()
            .expect("tests/go/bin/seed is built by tests/run.sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("consumed and accepted 10 messages"),
            "{stdout}"
        );
        assert_eq!(c.queue_depth("amqp10.examples.basic"), 0);
    });
}

/// confirmed sends, in-order first deliveries (delivery-count 0), accept removes.
#[test]
fn go_amqp_send_receive_accept() {
    scenario("basic");
}

/// Q-11, FLOW-5: no delivery beyond credit; settling re-grants it; manual credit and drain.
#[test]
fn go_amqp_credit_and_drain() {
    scenario("credit");
}

/// released and modified messages come back as redeliveries.
#[test]
fn go_amqp_release_and_redelivery() {
    scenario("release");
}

/// a rejected message never comes back.
#[test]
fn go_amqp_reject() {
    scenario("reject");
}

/// a consumer that leaves with unsettled deliveries loses nothing.
#[test]
fn go_amqp_teardown() {
    scenario("teardown");
}

/// EV-9, GRP-2, SEL-1 (go-amqp's numeric selector descriptor) with Azure/go-amqp.
#[test]
fn ev_9_go_amqp_fan_out_group_and_selector() {
    scenario("events");
}

/// SP-9, DUR-4 with Azure/go-amqp: start positions and a durable subscription resumed.
#[test]
fn sp_9_go_amqp_start_positions_and_durable_resume() {
    scenario("store");
}
