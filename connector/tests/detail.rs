//! The connector binary's detail endpoints, `GET /api/amqp10/connections` and
//! `GET /api/amqp10/links`, read while python-qpid-proton holds connections open over plain TCP,
//! without SASL and over TLS (tests/python/detail.py).
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::pki::Pki;
use common::{free_port, wait_listening, Reaper};
use serde_json::Value;

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/python/detail.py");

/// The JSON an endpoint answers, after checking its status and type.
fn get(http: SocketAddr, path: &str) -> Value {
    let reply = testkit::http_get(http, path).expect("the endpoint answers");
    assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", reply.body))
}

/// The listing under `key` once `done` holds for it (the clients' FLOWs may still be on their
/// way when they say they are ready).
fn listing(http: SocketAddr, path: &str, key: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut last = Value::Null;
    for _ in 0..500 {
        last = get(http, path);
        let items = last[key].as_array().unwrap().clone();
        assert_eq!(last["total"], items.len(), "{last}");
        if done(&items) {
            return items;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{path} never showed what was expected: {last}");
}

/// The one item of `items` that `is` picks.
fn one(items: &[Value], is: impl Fn(&Value) -> bool) -> &Value {
    let mut found = items.iter().filter(|i| is(i));
    let item = found.next().unwrap_or_else(|| panic!("none in {items:?}"));
    assert!(found.next().is_none(), "more than one in {items:?}");
    item
}

/// The one item of `items` whose `field` is `value`.
fn by<'a>(items: &'a [Value], field: &str, value: &str) -> &'a Value {
    one(items, |i| i[field] == value)
}

/// Waits for `line` from the client script.
fn expect_line(out: &mut BufReader<ChildStdout>, line: &str) {
    let mut got = String::new();
    out.read_line(&mut got).unwrap();
    assert_eq!(got.trim(), line, "the client script said {got:?}");
}

fn go_on(stdin: &mut ChildStdin) {
    stdin.write_all(b"\n").unwrap();
    stdin.flush().unwrap();
}

/// OBS-1 … OBS-4, TLS-6, OP-OBS-5: one element per open connection and per attached link, with
/// the fields the spec lists; a connection's links leave with it.
#[test]
fn obs_2_3_tls_6_connections_and_links_as_clients_hold_them() {
    let pki = Pki::new("test CA");
    pki.issue("server", "127.0.0.1", 10, false, false);
    let data = tempfile::tempdir().unwrap();
    let (port, tls_port) = (free_port(), free_port());
    let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let connector = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
        .args(["--port", &port.to_string(), "--bind-address", "127.0.0.1"])
        .args(["--tls-port", &tls_port.to_string()])
        .arg("--tls-cert-file")
        .arg(pki.path("server.pem"))
        .arg("--tls-key-file")
        .arg(pki.path("server.key"))
        .args(["--http-address", &http.to_string()])
        .arg("--data-dir")
        .arg(data.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reaper = Reaper(vec![connector]);
    wait_listening(port);
    wait_listening(tls_port);
    // The HTTP listener is bound after the AMQP ones, once the backend answered.
    testkit::eventually("the connector is ready", Duration::from_secs(20), || {
        testkit::http_get(http, "/readyz").is_some_and(|r| r.status == 200)
    });
    // OBS-4: empty, and answered, before any client came.
    let empty = get(http, "/api/amqp10/connections");
    assert_eq!(empty, serde_json::json!({"connections": [], "total": 0}));
    let empty = get(http, "/api/amqp10/links");
    assert_eq!(empty, serde_json::json!({"links": [], "total": 0}));

    let mut client = Command::new("python3")
        .arg(PYTHON)
        .args([port.to_string(), tls_port.to_string()])
        .arg(pki.path("ca.pem"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = client.stdin.take().unwrap();
    let mut out = BufReader::new(client.stdout.take().unwrap());
    reaper.0.push(client);
    let mut ready = String::new();
    out.read_line(&mut ready).unwrap();
    let credit: Vec<i64> = match ready.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["READY", numbers @ ..] => numbers.iter().map(|n| n.parse().unwrap()).collect(),
        _ => panic!("the client script said {ready:?}"),
    };
    let (events_credit, dynamic_credit) = (credit[0], credit[1]);
    assert!(events_credit >= 7 && dynamic_credit >= 3, "{credit:?}");

    let connections = listing(http, "/api/amqp10/connections", "connections", |c| {
        c.len() == 3
    });
    let plain = by(&connections, "container_id", "detail_plain_1");
    assert_eq!(plain["client_id"], "detail_plain_1");
    assert_eq!(plain["product"], "detail-test");
    assert_eq!(plain["version"], "1.2.3");
    assert_eq!(plain["sessions"], 1);
    assert_eq!(plain["links"], 3);
    assert_eq!(plain["source_ip"], "127.0.0.1");
    assert_eq!(plain["sasl"], "anonymous");
    assert_eq!(plain["tls"], false);
    let at = plain["connected_at"].as_str().unwrap();
    let at = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("connected_at {at}: {e}"));
    let age = time::OffsetDateTime::now_utc() - at;
    assert!(
        age >= time::Duration::ZERO && age < time::Duration::minutes(2),
        "connected {age} ago"
    );
    let bare = by(&connections, "container_id", "detail-bare");
    assert_eq!(bare["sasl"], "none");
    assert_eq!(bare["product"], "");
    assert_eq!(bare["links"], 0);
    assert_eq!(bare["tls"], false);
    // TLS-6.
    let tls = by(&connections, "container_id", "detail-tls");
    assert_eq!(tls["tls"], true);
    assert_eq!(tls["sasl"], "anonymous");
    assert_eq!(tls["links"], 1);

    let links = listing(http, "/api/amqp10/links", "links", |l| {
        l.len() == 4
            && l.iter()
                .any(|x| x["pattern"] == "events" && x["credit"] == events_credit)
            && l.iter()
                .any(|x| x["dynamic"] == true && x["credit"] == dynamic_credit)
            && l.iter().any(|x| x["unsettled"] == 1)
    });
    let produce = one(&links, |l| {
        l["pattern"] == "queues" && l["client_id"] == "detail_plain_1"
    });
    assert_eq!(produce["client_id"], "detail_plain_1");
    // The client sends: the server receives.
    assert_eq!(produce["role"], "receiver");
    assert_eq!(produce["address"], "queues/detail-q");
    assert_eq!(produce["channel"], "detail-q");
    assert!(produce["credit"].as_i64().unwrap() > 0, "{produce}");
    assert_eq!(produce["durable"], false);
    assert_eq!(produce["dynamic"], false);
    let events = by(&links, "pattern", "events");
    assert_eq!(events["role"], "sender");
    assert_eq!(events["address"], "events/detail-e");
    assert_eq!(events["channel"], "detail-e");
    assert_eq!(events["credit"], events_credit);
    assert_eq!(events["unsettled"], 0);
    let dynamic = one(&links, |l| l["dynamic"] == true);
    assert_eq!(dynamic["pattern"], "dynamic");
    assert_eq!(dynamic["role"], "sender");
    assert!(
        dynamic["address"]
            .as_str()
            .unwrap()
            .starts_with("_amqp10.tmp."),
        "{dynamic}"
    );
    assert_eq!(dynamic["credit"], dynamic_credit);
    let consume = by(&links, "client_id", "detail-tls");
    assert_eq!(consume["role"], "sender");
    assert_eq!(consume["address"], "queues/detail-q");
    // Proton's blocking receiver tops its credit up on its own schedule, so only the delivery
    // held unsettled is exact here.
    assert!(consume["credit"].as_i64().unwrap() > 0, "{consume}");
    assert_eq!(consume["unsettled"], 1);
    for l in &links {
        assert!(l["name"].as_str().is_some_and(|n| !n.is_empty()), "{l}");
    }

    // A connection that closes leaves both listings, with its links.
    go_on(&mut stdin);
    expect_line(&mut out, "CLOSED");
    let connections = listing(http, "/api/amqp10/connections", "connections", |c| {
        c.len() == 2
    });
    assert!(connections
        .iter()
        .all(|c| c["container_id"] != "detail_plain_1"));
    let links = listing(http, "/api/amqp10/links", "links", |l| l.len() == 1);
    assert_eq!(links[0]["client_id"], "detail-tls");

    go_on(&mut stdin);
    expect_line(&mut out, "DONE");
    listing(http, "/api/amqp10/connections", "connections", |c| {
        c.is_empty()
    });
    listing(http, "/api/amqp10/links", "links", |l| l.is_empty());
}
