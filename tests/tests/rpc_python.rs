//! python-qpid-proton against the real connector: commands and queries (tests/python/rpc.py) on
//! every backend — the embedded store, gRPC to the store's façade, and gRPC to the façade
//! imitating KubeMQ v2.4. After each scenario neither the connector (requests waiting for their
//! response, delivered requests waiting for an answer) nor the store (requests waiting) holds
//! anything.

use std::time::Duration;

use connector::config::Settings;
use interop_tests::{run_client_script, TestConnector};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python");

/// Runs a scenario on each backend; `check` then looks at the connector.
fn each(settings: Settings, scenario: &str, check: impl Fn(&TestConnector)) {
    TestConnector::each_backend(settings, |c| {
        run_client_script(
            "python3",
            DIR,
            &["rpc.py", scenario, "{url}"],
            scenario,
            c.addr,
        );
        check(c);
        c.no_rpc_left();
    });
}

fn run(scenario: &str) {
    each(Settings::default(), scenario, |_| {});
}

/// RPC-1, RPC-4, RPC-6, RPC-7, RPC-9, RPC-10, RPC-12, RPC-13, RPC-S1: a command executed and one
/// refused by its handler, correlated by correlation-id and by message-id.
#[test]
fn rpc_s1_commands_executed_and_refused() {
    each(Settings::default(), "command", |c| {
        assert_eq!(c.rpc_requests("commands"), 2, "MET-6");
    });
}

/// RPC-6, RPC-8, RPC-S2, OP-RPC-6: query replies carry the responder's body and properties, the
/// uuid correlation-id keeps its type, and no executed/error properties.
#[test]
fn rpc_s2_queries_answered() {
    each(Settings::default(), "query", |c| {
        assert_eq!(c.rpc_requests("queries"), 3, "MET-6");
    });
}

/// ADDR-13, ADDR-18, ADDR-16: requests and replies through anonymous senders; the same
/// anonymous link reaches a queue.
#[test]
fn addr_18_requests_and_replies_through_the_relay() {
    run("relay");
}

/// ADDR-10: a responder answers on a sender attached to `responses/<RequestID>`.
#[test]
fn addr_10_fixed_responses_target() {
    run("fixed-target");
}

/// RPC-3, RPC-7, RPC-8, OP-RPC-4: a silent responder: the command's reply says executed =
/// false with KubeMQ's timeout text after the ttl; the query gets nothing.
#[test]
fn rpc_3_timeout_from_ttl() {
    run("timeout");
}

/// RPC-7: no responder at all is the same failure as a silent one (KubeMQ has no fast path).
#[test]
fn rpc_7_no_responder() {
    run("no-responder");
}

/// RPC-2, ADDR-14, OP-RPC-3, OP-RPC-5: reply-to missing or not this connection's, an unknown
/// reply token and an unroutable `to` are rejected message by message; the links stay.
#[test]
fn rpc_2_refusals() {
    run("refusals");
}

/// RPC-5: the fourth request in flight with RpcMaxPending 3 is refused.
#[test]
fn rpc_5_pending_cap() {
    let settings = Settings {
        rpc_max_pending: 3,
        ..Settings::default()
    };
    each(settings, "pending-cap", |_| {});
}

/// RPC-11, GRP-1: two responders in one group take turns.
#[test]
fn rpc_11_grouped_responders_share_requests() {
    run("groups");
}

/// RPC-14, MET-11: the requester's connection closed with its request pending; the answer that
/// still comes is dropped and counted, and nothing is left behind.
#[test]
fn rpc_14_late_response_counted() {
    each(Settings::default(), "late", |c| {
        testkit::eventually(
            "MET-11 counts the late response",
            Duration::from_secs(10),
            || c.metrics.rpc_late_responses.get() >= 1,
        );
    });
}
