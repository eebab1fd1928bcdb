//! rhea and rhea-promise (npm) against the real connector on every backend: events fan-out and
//! groups, a selector in rhea's numeric-descriptor form, events-store start positions and a
//! durable subscription (tests/js/events.js).

use interop_tests::{run_client_script, run_client_script_on_both_backends, TestConnector};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/js");

fn run(scenario: &str) {
    run_client_script_on_both_backends("node", DIR, &["events.js", scenario, "{port}"], scenario);
}

/// EV-9, EV-5: three subscribers each get every event, pre-settled.
#[test]
fn ev_9_rhea_fan_out() {
    run("fanout");
}

/// GRP-1, GRP-2: two groups of two members.
#[test]
fn grp_2_rhea_two_groups_of_two() {
    run("groups");
}

/// SEL-1, SEL-9: rhea's selector filter (the numeric descriptor).
#[test]
fn sel_1_rhea_numeric_descriptor() {
    run("selector");
}

/// SP-9: start positions.
#[test]
fn sp_9_rhea_start_positions() {
    run("start_positions");
}

/// DUR-4 after a reconnect, with rhea's durable source.
#[test]
fn dur_4_rhea_durable_resume() {
    TestConnector::each_backend(connector::config::Settings::default(), |c| {
        run_client_script(
            "node",
            DIR,
            &["events.js", "durable", "{port}"],
            "durable",
            c.addr,
        );
    });
}
