//! The reference connector's burn-in harness drives commands and queries with two RPC workers.
//! The harness cannot be fetched on this machine, so `tests/go/rpcsoak` stands in for those two
//! workers, written from their documented behaviour: the same client (go-amqp v1.7.0), links,
//! container-ids, message shape, rate (30 requests/s per pattern), 5 s reply budget and link
//! rebuild after a timeout. It is built by `tests/run.sh` into `tests/go/bin`.

use std::time::Duration;

use connector::config::Settings;
use interop_tests::{run_client_script, TestConnector};

const BIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/go/bin");

/// RPC-1, RPC-4, RPC-6, RPC-7, RPC-8, RPC-12, RPC-13 under the burn-in's RPC load, on every
/// backend, with each of the harness's two published body sizes (1 KiB; 256 B, 4 KiB and 64 KiB
/// at 80:15:5): 10 s of commands and queries without a ttl, one at a time per requester, from
/// connections that share the channel's container-id. Every request of the window is answered
/// within 5 s and correlated; every command executed; every query reply carries the request's
/// body bit-exact and its application-properties. Nothing is held afterwards.
#[test]
fn rpc_burn_in_workers_stand_in() {
    TestConnector::each_backend(Settings::default(), |c| {
        for sizes in ["fixed", "distribution"] {
            let started = std::time::Instant::now();
            run_client_script(
                &format!("{BIN}/rpcsoak"),
                BIN,
                &["{url}", "10", sizes],
                "rpc-soak",
                c.addr,
            );
            assert!(
                started.elapsed() >= Duration::from_secs(13),
                "the window ran"
            );
        }
        // 30/s for two warm-ups and windows, less what a slow hour takes off.
        for pattern in ["commands", "queries"] {
            let counted = c.rpc_requests(pattern);
            assert!(counted >= 360, "MET-6 {pattern}: {counted}");
        }
        c.no_rpc_left();
    });
}
