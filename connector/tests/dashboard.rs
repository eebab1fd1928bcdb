//! The chart's Grafana dashboard against the connector binary: every metric a panel's query
//! names is one the connector serves on `/metrics` or `/metrics/operations` (with TLS on, so
//! the certificate gauge is there too), and the failure counters it shows count a failed TLS
//! handshake.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::pki::Pki;
use common::{free_port, start_connector, wait_listening, Reaper};

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../helm/amqp-connector-operator/dashboards/amqp-connector.json"
);

/// The names of the samples an exposition carries (`name{labels} value` or `name value`).
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// The metric names in a PromQL query: the connector's prefixes, up to the first character
/// that cannot be in a name.
fn named_metrics(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("kubemq_amqp") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.insert(name);
    }
    out
}

fn scrape(http: SocketAddr, path: &str) -> String {
    let reply = testkit::http_get(http, path).expect("answered");
    assert_eq!(reply.status, 200, "{path}: {reply:?}");
    reply.body
}

/// The value of the sample `name` (without labels) in `text`.
fn value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
}

#[test]
fn every_metric_the_dashboard_names_is_served() {
    let pki = Pki::new("dashboard CA");
    pki.issue("server", "127.0.0.1", 41, false, false);
    let data = tempfile::tempdir().unwrap();
    let tls_port = free_port();
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let cert = pki.path("server.pem");
    let key = pki.path("server.key");
    let _connector = Reaper(vec![start_connector(
        data.path(),
        free_port(),
        &[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
            "--http-address",
            &http.to_string(),
        ],
    )]);
    wait_listening(tls_port);

    // The connection that saw the TLS port listen closed without a handshake: that is one
    // failure; a client that speaks no TLS is the second.
    let failures = "kubemq_amqp_connector_tls_handshake_failures_total";
    let reaches = |n: u64| {
        (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            value(&scrape(http, "/metrics/operations"), failures) == Some(n)
        })
    };
    assert!(reaches(1), "{}", scrape(http, "/metrics/operations"));
    let mut bad = TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    bad.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = bad.read(&mut [0u8; 64]);
    drop(bad);
    assert!(reaches(2), "{}", scrape(http, "/metrics/operations"));

    let served: BTreeSet<String> = sample_names(&scrape(http, "/metrics"))
        .into_iter()
        .chain(sample_names(&scrape(http, "/metrics/operations")))
        .collect();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut named = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let names = named_metrics(expr);
            assert!(!names.is_empty(), "{}: {expr}", panel["title"]);
            for name in names {
                assert!(
                    served.contains(&name),
                    "{}: {name} is not served; served: {served:?}",
                    panel["title"]
                );
                named.insert(name);
            }
        }
    }
    // Every family of the connector's own has a panel, but the stage histogram's sum and count.
    let unshown: Vec<&String> = served
        .iter()
        .filter(|s| !named.contains(*s))
        .filter(|s| !s.starts_with("kubemq_amqp_connector_queue_stage_seconds_"))
        .collect();
    assert!(unshown.is_empty(), "no panel shows {unshown:?}");
}
