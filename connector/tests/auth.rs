//! The connector binary with `Authentication` on, with real clients: python-qpid-proton
//! (tests/python/auth.py) and rhea-promise (tests/js/auth.js) authenticate with KubeMQ JWTs made
//! here (good, bad signature, expired, malformed), with SASL EXTERNAL on mTLS, and meet KubeMQ's
//! access control list; the audit log is read back, and no secret the test used appears in it.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::pki::Pki;
use common::{free_port, run, wait_listening, Reaper};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/python/auth.py");
const JS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/js");
/// The HMAC secret KubeMQ and the connector share.
const SECRET: &str = "kubemq-hs256-secret-for-tests";

/// KubeMQ's access control list: `writer` may only write `orders`; `app` may read and write
/// `orders` and `audit`, and write events on `sub.` anything; `billing` (a certificate's CN) may
/// read and write `billing`; `alice` may read events on `sub.` and one more token.
const ACL: &str = r#"[
  {"Queues": true, "ClientID": "^writer$", "Channel": "^orders$", "Read": false, "Write": true},
  {"Queues": true, "ClientID": "^app$", "Channel": "^(orders|audit)$", "Read": true, "Write": true},
  {"Events": true, "ClientID": "^app$", "Channel": "^sub\\..+$", "Read": false, "Write": true},
  {"Queues": true, "ClientID": "^billing$", "Channel": "^billing$", "Read": true, "Write": true},
  {"Events": true, "ClientID": "^alice$", "Channel": "^sub\\.[^.]+$", "Read": true, "Write": false}
]"#;

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A token for `client_id` signed with `secret`, expiring `exp_in` seconds from now.
/// Both are recorded as secrets the suite's logs must not hold.
fn token(client_id: &str, secret: &str, exp_in: i64) -> String {
    testkit::logs::used_secret(secret);
    let token = encode(
        &Header::new(Algorithm::HS256),
        &serde_json::json!({"ClientID": client_id, "exp": now() + exp_in}),
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    testkit::logs::used_secret(&token);
    token
}

/// The connector with authentication and the ACL, its log captured as JSON lines.
struct Secured {
    child: Child,
    port: u16,
    tls_port: Option<u16>,
    log: PathBuf,
    /// `/metrics` and `/metrics/operations`.
    http: SocketAddr,
    /// Holds the key, the policy, the store and the log until the connector is gone.
    _dir: tempfile::TempDir,
}

impl Secured {
    /// Started with the key and the policy (and, with `pki`, an mTLS listener trusting its CA).
    fn start(pki: Option<&Pki>) -> Secured {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("jwt.key");
        std::fs::write(&key, SECRET).unwrap();
        testkit::logs::used_secret(SECRET);
        let acl = dir.path().join("acl.json");
        std::fs::write(&acl, ACL).unwrap();
        let path = |p: &std::path::Path| p.display().to_string();
        let mut args: Vec<String> = [
            "--authentication",
            "true",
            "--jwt-signature-type",
            "HS256",
            "--jwt-key-file",
            &path(&key),
            "--authorization-policy-file",
            &path(&acl),
        ]
        .map(String::from)
        .to_vec();
        let tls_port = pki.map(|pki| {
            let tls_port = free_port();
            args.extend([
                "--tls-port".to_string(),
                tls_port.to_string(),
                "--tls-mode".into(),
                "mtls".into(),
                "--tls-cert-file".into(),
                path(&pki.path("server.pem")),
                "--tls-key-file".into(),
                path(&pki.path("server.key")),
                "--tls-client-ca-file".into(),
                path(&pki.path("ca.pem")),
            ]);
            tls_port
        });
        let port = free_port();
        let (child, log, http) = spawn(dir.path(), "connector", port, &args);
        if let Some(p) = tls_port {
            wait_listening(p);
        }
        Secured {
            child,
            port,
            tls_port,
            log,
            http,
            _dir: dir,
        }
    }

    fn python(&self, scenario: &str, args: &[&str]) {
        python(self.port, scenario, args);
    }

    /// The audit events logged so far (JSON lines on the `audit` target).
    fn audit(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "audit")
            .collect()
    }

    /// The counter `name` of `/metrics/operations`.
    fn counter(&self, name: &str) -> u64 {
        let reply = testkit::http_get(self.http, "/metrics/operations").unwrap();
        reply
            .body
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {}", reply.body))
    }

    /// The audit events called `event`.
    fn audited_count(&self, event: &str) -> usize {
        self.audit()
            .iter()
            .filter(|v| v["fields"]["event"] == event)
            .count()
    }

    /// The whole log.
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for Secured {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs scenario `scenario` of tests/python/auth.py against `port`.
fn python(port: u16, scenario: &str, args: &[&str]) {
    run(Command::new("python3")
        .arg(PYTHON)
        .arg(scenario)
        .arg(port.to_string())
        .args(args));
}

/// The audit event named `event` whose `field` is `value`, waiting a little for it.
fn audited(c: &Secured, event: &str, field: &str, value: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = c.audit().into_iter().find(|v| {
            let fields = &v["fields"];
            fields["event"] == event && fields[field] == value
        });
        if let Some(v) = found {
            return v["fields"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {event} with {field}={value}: {:?}",
            c.audit()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SASL-3, SASL-6, SASL-12, AUD-1, AUD-2, AUD-3, AUD-4: PLAIN with a good JWT in the password
/// slot connects as the token's ClientID (the username is only recorded); a bad signature, an
/// expired and a malformed token, and ANONYMOUS, fail the connect; each exchange is audited with
/// the mechanism in lower case, the transport and the source address, and nothing else is an
/// audit event (no connect or disconnect events); no token or key reaches the log.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn sasl_3_plain_with_kubemq_jwts() {
    let c = Secured::start(None);
    let good = token("app", SECRET, 300);
    c.python("send", &["alice", &good, "orders"]);
    let ok = audited(&c, "auth.success", "ClientID", "app");
    assert_eq!(ok["Transport"], "amqp10");
    assert_eq!(ok["SourceIP"], "127.0.0.1");
    assert_eq!(ok["Metadata.mechanism"], "plain");
    assert_eq!(ok["Metadata.username"], "\"alice\"");

    let forged = token("app", "another-secret", 300);
    let expired = token("app", SECRET, -10);
    let malformed = "eyJhbGciOiJIUzI1NiJ9.not-json.sig".to_string();
    for (user, bad, reason) in [
        ("mallory", &forged, "token signature is invalid"),
        ("late", &expired, "token expired"),
        ("garbled", &malformed, "token"),
    ] {
        c.python("refused", &[user, bad]);
        let f = audited(
            &c,
            "auth.failure",
            "Metadata.username",
            &format!("\"{user}\""),
        );
        assert_eq!(f["Metadata.mechanism"], "plain");
        assert_eq!(f["ClientID"], "");
        assert!(f["Error"].as_str().unwrap().starts_with(reason), "{f}");
    }
    // SASL-5: ANONYMOUS is not offered (proton gives up before choosing it).
    c.python("anonymous", &[]);

    // AUD-3: the SASL exchanges are the only audit events here.
    for v in c.audit() {
        let event = v["fields"]["event"].as_str().unwrap_or("").to_string();
        assert!(event.starts_with("auth."), "{v}");
    }
    // AUD: no secret anywhere in the log, nor in --print-config.
    let log = c.log_text();
    for secret in [good.as_str(), &forged, &expired, SECRET] {
        assert!(!log.contains(secret), "a secret in the log");
    }
    let printed = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
        .args(["--authentication", "true", "--jwt-signature-type", "HS256"])
        .args(["--authorize-every-client", "true"])
        .args(["--jwt-key", SECRET, "--print-config"])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.contains("Authentication: true"), "{printed}");
    assert!(!printed.contains(SECRET), "{printed}");
}

/// SASL-9: with authentication on, a connection without a SASL layer is refused: the bare AMQP
/// header is answered with the SASL header and the socket closed.
#[test]
fn sasl_9_bare_header_refused() {
    use std::io::{Read, Write};
    let c = Secured::start(None);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", c.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"AMQP\x00\x01\x00\x00").unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert_eq!(got, b"AMQP\x03\x01\x00\x00");
}

/// AUTHZ-2, AUTHZ-6, ERR-3: a client the policy lets write but not read a channel sends to it,
/// and its receiver on it is refused `amqp:unauthorized-access` "not authorized for orders";
/// the denial is audited.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn authz_2_write_without_read_refuses_the_receiver() {
    let c = Secured::start(None);
    let writer = token("writer", SECRET, 300);
    c.python("write-only", &["w", &writer, "orders"]);
    let d = audited(&c, "authz.denied", "ClientID", "writer");
    assert_eq!(d["Action"], "read");
    assert_eq!(d["Resource"], "queues");
    // Each denial is counted for the dashboard, as it is audited.
    assert_eq!(
        c.counter("kubemq_amqp_connector_authorization_denials_total"),
        c.audited_count("authz.denied") as u64
    );
}

/// AUTHZ-4: on an anonymous sender each message is checked for Write on its `to`: one to a
/// channel the client may not write is rejected `amqp:unauthorized-access` and the next, to one
/// it may, is accepted on the same link (python-qpid-proton and rhea-promise).
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn authz_4_anonymous_terminus_checked_per_message() {
    let c = Secured::start(None);
    let app = token("app", SECRET, 300);
    c.python("anonymous-terminus", &["app", &app, "audit", "payroll"]);
    run(Command::new("node")
        .current_dir(JS_DIR)
        .arg("auth.js")
        .arg(c.port.to_string())
        .args(["app", &app, "audit", "payroll"]));
    let d = audited(&c, "authz.denied", "Channel", "\"payroll\"");
    assert_eq!(d["Action"], "write");
}

/// AUTHZ-7: a wildcard events subscription (`sub.>`, `sub.*`) whose string the policy lets
/// alice read gets only the events whose own channel she may read (`sub.x`, `sub.z`, not
/// `sub.x.y` or `sub.deep.er.z`); a subscription string the policy does not match (`>`, `*.x`,
/// `sub.*.>`) is refused at attach.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn authz_7_wildcard_subscriptions_get_only_readable_channels() {
    let c = Secured::start(None);
    c.python(
        "wildcard",
        &[&token("alice", SECRET, 300), &token("app", SECRET, 300)],
    );
}

/// One SASL PLAIN login with `token` on a raw socket; how long the server took to answer it
/// and close the connection.
fn failed_login(port: u16, token: &str) -> Duration {
    use std::io::{Read, Write};
    let started = Instant::now();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&connector::engine::HEADER_SASL).unwrap();
    let mut response = b"\0someone\0".to_vec();
    response.extend_from_slice(token.as_bytes());
    s.write_all(&connector::engine::peer::sasl_frame(
        &fe2o3_amqp_types::sasl::SaslInit {
            mechanism: "PLAIN".into(),
            initial_response: Some(serde_bytes::ByteBuf::from(response)),
            hostname: None,
        },
    ))
    .unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    started.elapsed()
}

/// AUD-5: one source that keeps failing to log in: its first five failures in ten seconds are
/// answered at once and audited one by one; from the sixth on each outcome waits a second and
/// the failures are audited as one line a second with a count; a good login from the same
/// source still succeeds.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn aud_5_repeated_failed_logins_are_slowed_and_summed_up() {
    let c = Secured::start(None);
    let forged = token("app", "not-the-key", 300);
    for i in 0..5 {
        let took = failed_login(c.port, &forged);
        assert!(
            took < Duration::from_millis(900),
            "failure {i} waited {took:?}"
        );
    }
    for i in 5..8 {
        let took = failed_login(c.port, &forged);
        assert!(
            took >= Duration::from_millis(900),
            "failure {i} answered after {took:?}"
        );
    }
    let summary = audited(
        &c,
        "auth.failure",
        "Error",
        "repeated failed logins; outcomes delayed",
    );
    assert!(
        summary["Metadata.count"].as_u64().unwrap() >= 1,
        "{summary}"
    );
    let one_by_one = c
        .audit()
        .iter()
        .filter(|v| {
            v["fields"]["event"] == "auth.failure" && v["fields"]["Metadata.count"].is_null()
        })
        .count();
    assert_eq!(one_by_one, 5, "{:?}", c.audit());
    // Every failure is counted, the ones not audited one by one too.
    assert_eq!(
        c.counter("kubemq_amqp_connector_authentication_failures_total"),
        8
    );
    c.python("send", &["app", &token("app", SECRET, 300), "orders"]);
}

/// AUTHZ-5: dynamic reply nodes are private to their connection and not checked: a client the
/// policy gives no right on them receives what its anonymous sender sends to its own node.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn authz_5_dynamic_nodes_are_not_checked() {
    let c = Secured::start(None);
    c.python("dynamic", &["app", &token("app", SECRET, 300)]);
    assert!(
        !c.audit()
            .iter()
            .any(|v| v["fields"]["event"] == "authz.denied"),
        "{:?}",
        c.audit()
    );
}

/// SASL-7, SASL-6 (3), TLS-4: an mTLS client whose certificate names CN `billing` authenticates
/// with SASL EXTERNAL and is authorized as `billing`.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn sasl_7_external_on_mtls() {
    let pki = Pki::new("test CA");
    pki.issue("server", "127.0.0.1", 10, false, false);
    pki.issue("billing", "billing", 11, true, false);
    let c = Secured::start(Some(&pki));
    let p = |f: &str| pki.path(f).display().to_string();
    python(
        c.tls_port.unwrap(),
        "external",
        &[
            &p("ca.pem"),
            &p("billing.pem"),
            &p("billing.key"),
            "billing",
        ],
    );
    let ok = audited(&c, "auth.success", "ClientID", "billing");
    assert_eq!(ok["Metadata.mechanism"], "external");
}

/// Starts the connector with `args` (and a store in `dir`) listening on `port`, logging to a
/// file of the suite's logs named after `name`; returns once its /readyz says it reaches its
/// backend (before that it refuses connections, CONN-15), with the log's path and its HTTP
/// endpoint.
fn spawn(
    dir: &std::path::Path,
    name: &str,
    port: u16,
    args: &[String],
) -> (Child, PathBuf, SocketAddr) {
    let (log, file) = testkit::logs::file(name);
    let http = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let child = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
        .args(["--port", &port.to_string(), "--bind-address", "127.0.0.1"])
        .args(["--http-address", &http.to_string(), "--log-format", "json"])
        .arg("--data-dir")
        .arg(dir.join(format!("{name}-data")))
        .args(args)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap();
    testkit::eventually(&format!("{name} ready"), Duration::from_secs(20), || {
        testkit::http_get(http, "/readyz").is_some_and(|r| r.status == 200)
    });
    (child, log, http)
}

/// SASL-3, AUTHZ (KubeMQ's refusal): the client's token, not the connector's, is what KubeMQ
/// checks. Stand-in for KubeMQ: the real server cannot be fetched on this machine (its Go
/// module is refused by the proxy), so the KubeMQ here is the embedded store's gRPC façade with
/// authentication on, which checks every call but Ping as KubeMQ's interceptor does. A
/// connector sharing its key forwards the client's token and works (it has no token of its
/// own, so only the forwarded one can pass); a connector with another key accepts its own
/// clients' tokens, KubeMQ refuses them, and the client sees `amqp:unauthorized-access` on the
/// message and on its receiver.
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs python-qpid-proton and rhea: tests/run.sh"
)]
fn sasl_3_client_token_is_what_kubemq_checks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("kubemq.key"), SECRET).unwrap();
    std::fs::write(d.join("other.key"), "a-key-kubemq-does-not-know").unwrap();
    testkit::logs::used_secret(SECRET);
    testkit::logs::used_secret("a-key-kubemq-does-not-know");
    let key = |f: &str| d.join(f).display().to_string();
    let auth = |key_file: String| {
        vec![
            "--authentication".to_string(),
            "true".into(),
            "--jwt-signature-type".into(),
            "HS256".into(),
            "--jwt-key-file".into(),
            key_file,
            "--authorize-every-client".into(),
            "true".into(),
        ]
    };
    let grpc = free_port();
    let mut kubemq_args = auth(key("kubemq.key"));
    kubemq_args.extend(["--serve-kubemq-grpc".into(), format!("127.0.0.1:{grpc}")]);
    let (kubemq, kubemq_log, _) = spawn(d, "kubemq", free_port(), &kubemq_args);
    let mut children = Reaper(vec![kubemq]);
    let through = |name: &str, key_file: String| {
        let port = free_port();
        let mut args = auth(key_file);
        args.extend(["--kubemq-address".into(), format!("127.0.0.1:{grpc}")]);
        let (child, log, _) = spawn(d, name, port, &args);
        (child, port, log)
    };
    let (same, same_port, same_log) = through("same-key", key("kubemq.key"));
    let (other, other_port, other_log) = through("other-key", key("other.key"));
    children.0.extend([same, other]);
    python(
        same_port,
        "send",
        &["app", &token("app", SECRET, 300), "fwd"],
    );
    let theirs = token("app", "a-key-kubemq-does-not-know", 300);
    python(other_port, "kubemq-refuses", &["app", &theirs, "fwd"]);
    run(Command::new("node")
        .current_dir(JS_DIR)
        .arg("auth.js")
        .arg(other_port.to_string())
        .args(["app", &theirs, "fwd", "unused", "kubemq-refuses"]));
    for (name, log) in [
        ("kubemq", kubemq_log),
        ("same-key", same_log),
        ("other-key", other_log),
    ] {
        let log = std::fs::read_to_string(log).unwrap();
        assert!(
            !log.contains(&theirs) && !log.contains(SECRET),
            "a secret in {name}'s log"
        );
    }
}
