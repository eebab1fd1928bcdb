//! The real operator binary against the project's stateful fake API server
//! (tests/python/fake_apiserver.py) on loopback — no cluster can run on these machines. What the
//! fake does not model (admission, field-ownership conflicts, asynchronous garbage collection,
//! real rollouts) is not tested here.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const CRS: &str = "/apis/amqp.kubemq.io/v1alpha1/namespaces/apps/amqpconnectors";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The fake API server and a kubeconfig pointing at it.
struct Fake {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Fake {
    fn start(tag: &str) -> Fake {
        let dir = std::env::temp_dir().join(format!("fake-k8s-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let port_file = dir.join("port");
        let _ = std::fs::remove_file(&port_file);
        let child = Command::new("python3")
            .arg(root().join("tests/python/fake_apiserver.py"))
            .arg(&port_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3");
        let deadline = Instant::now() + Duration::from_secs(10);
        let port = loop {
            if let Some(p) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break p;
            }
            assert!(Instant::now() < deadline, "fake API server did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        std::fs::write(
            dir.join("kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: test\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: test\n    namespace: apps\ncurrent-context: fake\n"
            ),
        )
        .expect("kubeconfig");
        Fake { child, port, dir }
    }

    /// One request; returns the status code and the JSON body.
    fn call(&self, method: &str, path: &str, body: Option<&Value>, ctype: &str) -> (u16, Value) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("write");
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).expect("status line");
        let code = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let mut len = 0;
        loop {
            line.clear();
            r.read_line(&mut line).expect("header");
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut buf = vec![0; len];
        r.read_exact(&mut buf).expect("body");
        (code, serde_json::from_slice(&buf).unwrap_or(Value::Null))
    }

    fn get(&self, path: &str) -> Option<Value> {
        match self.call("GET", path, None, "application/json") {
            (200, v) => Some(v),
            _ => None,
        }
    }

    fn merge(&self, path: &str, patch: Value) {
        let (code, v) = self.call("PATCH", path, Some(&patch), "application/merge-patch+json");
        assert_eq!(code, 200, "{v}");
    }

    fn stats(&self) -> Value {
        self.get("/_fake/stats").expect("stats")
    }

    fn operator(&self) -> Operator {
        self.operator_named("operator-under-test")
    }

    fn operator_named(&self, pod: &str) -> Operator {
        let http = testkit::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-operator"))
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("POD_NAME", pod)
            .env("POD_NAMESPACE", "kube-system")
            .env("RUST_LOG", "warn")
            .args(["--http-address", &format!("127.0.0.1:{http}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("operator starts");
        let op = Operator { child, http };
        wait("the operator is ready", || op.ready());
        op
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Operator {
    child: Child,
    http: u16,
}

impl Operator {
    fn ready(&self) -> bool {
        self.get("/readyz").is_some_and(|r| r.status == 200)
    }

    fn get(&self, path: &str) -> Option<testkit::Reply> {
        testkit::http_get(SocketAddr::from(([127, 0, 0, 1], self.http)), path)
    }

    fn metrics(&self) -> String {
        self.get("/metrics").map(|r| r.body).unwrap_or_default()
    }

    /// Reconciles this operator has started (from its /metrics).
    fn reconciles(&self) -> u64 {
        self.metric("amqp_connector_operator_reconciles_total")
    }

    /// Whether every reconcile it started has finished and scheduled its next run: with no
    /// change pending, nothing more happens until the cluster changes.
    fn idle(&self) -> bool {
        let text = self.metrics();
        let started = metric_in(&text, "amqp_connector_operator_reconciles_total");
        started == metric_in(&text, "amqp_connector_operator_reconciles_done_total")
    }

    /// Whether it reconciles (holds the Lease).
    fn leading(&self) -> bool {
        self.metric("amqp_connector_operator_leading") == 1
    }

    /// Reconciles that scheduled their next run after a delay (a drift check or a retry).
    fn timed_reruns(&self) -> u64 {
        self.metric("amqp_connector_operator_timed_reruns_total")
    }

    fn metric(&self, name: &str) -> u64 {
        metric_in(&self.metrics(), name)
    }

    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        panic!("the operator did not stop on SIGTERM within 10 s");
    }
}

/// A sample's value in a Prometheus text exposition (0 when absent).
fn metric_in(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `done` holds (15 s at most: the operator's retries start at 1 s).
fn wait(what: &str, done: impl Fn() -> bool) {
    testkit::eventually(what, Duration::from_secs(15), done);
}

fn example() -> Value {
    let text =
        std::fs::read_to_string(root().join("examples/amqpconnector.yaml")).expect("example");
    let v: Value = serde_yaml::from_str(&text).expect("example");
    v
}

fn condition(cr: &Value, t: &str) -> Option<(String, String)> {
    cr["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["reason"].as_str().unwrap_or("").to_string(),
            )
        })
}

/// Changing writes, except the Lease's (leader election renews it by design).
/// (type, reason, note) of the Events about AmqpConnector `name`.
fn events(fake: &Fake, name: &str) -> Vec<(String, String, String)> {
    let list = fake
        .get("/apis/events.k8s.io/v1/namespaces/apps/events")
        .unwrap_or(Value::Null);
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|e| {
                    e["regarding"]["name"] == name && e["regarding"]["kind"] == "AmqpConnector"
                })
                .map(|e| {
                    let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
                    (s("type"), s("reason"), s("note"))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn writes(stats: &Value) -> u64 {
    stats["writes"].as_object().map_or(0, |m| {
        m.iter()
            .filter(|(k, _)| !k.ends_with(" Lease"))
            .filter_map(|(_, v)| v.as_u64())
            .sum()
    })
}

#[test]
fn create_update_scale_and_delete() {
    let fake = Fake::start("lifecycle");
    let _op = fake.operator();
    let (code, cr) = fake.call("POST", CRS, Some(&example()), "application/json");
    assert_eq!(code, 201, "{cr}");
    let uid = cr["metadata"]["uid"].as_str().expect("uid").to_string();

    // Children appear, owned and labelled; status reports Ready.
    wait("the children exist", || {
        fake.get("/api/v1/namespaces/apps/configmaps/orders-config")
            .is_some()
            && fake
                .get("/apis/apps/v1/namespaces/apps/deployments/orders")
                .is_some()
            && fake
                .get("/api/v1/namespaces/apps/services/orders")
                .is_some()
            && fake
                .get("/api/v1/namespaces/apps/services/orders-metrics")
                .is_some()
            && fake
                .get("/apis/policy/v1/namespaces/apps/poddisruptionbudgets/orders")
                .is_some()
    });
    for path in [
        "/api/v1/namespaces/apps/configmaps/orders-config",
        "/apis/apps/v1/namespaces/apps/deployments/orders",
        "/api/v1/namespaces/apps/services/orders",
    ] {
        let child = fake.get(path).expect("child");
        assert_eq!(
            child["metadata"]["ownerReferences"][0]["uid"],
            uid.as_str(),
            "{path}"
        );
        assert_eq!(
            child["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "amqp-connector-operator"
        );
    }
    wait("Ready", || {
        fake.get(&format!("{CRS}/orders"))
            .and_then(|cr| condition(&cr, "Ready"))
            .is_some_and(|(s, _)| s == "True")
    });
    let cr = fake.get(&format!("{CRS}/orders")).expect("cr");
    assert_eq!(cr["status"]["observedGeneration"], 1);
    let applied = events(&fake, "orders");
    assert!(
        applied
            .iter()
            .any(|(t, r, n)| t == "Normal" && r == "Applied" && n.contains("generation 1")),
        "{applied:?}"
    );
    assert_eq!(
        cr["status"]["endpoints"]["amqp"],
        "amqp://orders.apps.svc:5672"
    );
    assert_eq!(
        cr["status"]["selector"],
        "app.kubernetes.io/instance=orders,app.kubernetes.io/name=amqp-connector"
    );

    // A tunable changes the configuration hash on the pod template: the pods roll.
    let hash = |fake: &Fake| {
        fake.get("/apis/apps/v1/namespaces/apps/deployments/orders")
            .expect("deployment")["spec"]["template"]["metadata"]["annotations"]
            ["amqp.kubemq.io/config-hash"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let before = hash(&fake);
    fake.merge(
        &format!("{CRS}/orders"),
        json!({"spec": {"amqp": {"getBatchSize": 64}}}),
    );
    wait("the pod template has the new hash", || {
        hash(&fake) != before
    });
    let cm = fake
        .get("/api/v1/namespaces/apps/configmaps/orders-config")
        .expect("cm");
    assert!(cm["data"]["connector.yaml"]
        .as_str()
        .expect("file")
        .contains("GetBatchSize: 64\n"));

    // Scale to one: the PDB goes; back to three: it returns.
    let pdb = "/apis/policy/v1/namespaces/apps/poddisruptionbudgets/orders";
    fake.merge(&format!("{CRS}/orders"), json!({"spec": {"replicas": 1}}));
    wait("the PDB is gone", || fake.get(pdb).is_none());
    fake.merge(&format!("{CRS}/orders"), json!({"spec": {"replicas": 3}}));
    wait("the PDB is back", || fake.get(pdb).is_some());

    // Delete: the children go with it (the fake cascades like the garbage collector).
    let (code, _) = fake.call("DELETE", &format!("{CRS}/orders"), None, "application/json");
    assert_eq!(code, 200);
    assert!(fake
        .get("/apis/apps/v1/namespaces/apps/deployments/orders")
        .is_none());
    assert!(fake
        .get("/api/v1/namespaces/apps/configmaps/orders-config")
        .is_none());
}

#[test]
fn unsupported_spec_is_degraded_without_a_hot_loop() {
    let fake = Fake::start("degraded");
    let op = fake.operator();
    let mut cr = example();
    cr["spec"]["listeners"]["amqps"]["enabled"] = true.into();
    cr["spec"]["tls"] = json!({"secretName": "orders-tls"});
    let (code, v) = fake.call("POST", CRS, Some(&cr), "application/json");
    assert_eq!(code, 201, "{v}");
    wait("Degraded", || {
        fake.get(&format!("{CRS}/orders"))
            .and_then(|cr| condition(&cr, "Degraded"))
            .is_some_and(|(s, r)| s == "True" && r == "InvalidSpec")
    });
    let cr = fake.get(&format!("{CRS}/orders")).expect("cr");
    let message = cr["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Degraded"))
        .and_then(|c| c["message"].as_str())
        .unwrap_or("")
        .to_string();
    assert!(
        message.contains("spec.listeners.amqps") && message.contains("spec.tls"),
        "{message}"
    );
    let warned = events(&fake, "orders");
    assert!(
        warned
            .iter()
            .any(|(t, r, n)| t == "Warning" && r == "InvalidSpec" && n.contains("spec.tls")),
        "{warned:?}"
    );
    assert!(fake
        .get("/apis/apps/v1/namespaces/apps/deployments/orders")
        .is_none());
    // No retry spin: nothing is scheduled to run again, and what the failed reconcile set off
    // (its own status write, seen by its watch) is over once a later change on the same watch
    // has been reconciled.
    wait("the operator is idle", || op.idle());
    assert_eq!(
        op.timed_reruns(),
        0,
        "an invalid spec is not tried again until it changes"
    );
    fake.call("POST", "/_fake/reset-stats", None, "application/json");
    let before = op.reconciles();
    barrier(&fake, &op, before);
    assert_eq!(op.timed_reruns(), 0, "nor after the barrier");
    let stats = fake.stats();
    assert_eq!(
        op.reconciles(),
        before + 1,
        "only the barrier was reconciled: {stats}"
    );
    assert_eq!(
        writes(&stats),
        1,
        "no write but the barrier's own annotation: {stats}"
    );
}

/// Annotates the `orders` AmqpConnector (a change without a new generation) and waits until
/// the operator has reconciled it: everything that came earlier on the same watch has been
/// handled by then.
fn barrier(fake: &Fake, op: &Operator, reconciles_before: u64) {
    fake.merge(
        &format!("{CRS}/orders"),
        json!({"metadata": {"annotations": {"test.kubemq.io/barrier": reconciles_before.to_string()}}}),
    );
    wait("the barrier was reconciled", || {
        op.reconciles() > reconciles_before && op.idle()
    });
}

#[test]
fn restart_writes_nothing_and_sigterm_stops() {
    let fake = Fake::start("restart");
    let op = fake.operator();
    let (code, v) = fake.call("POST", CRS, Some(&example()), "application/json");
    assert_eq!(code, 201, "{v}");
    wait("Ready", || {
        fake.get(&format!("{CRS}/orders"))
            .and_then(|cr| condition(&cr, "Ready"))
            .is_some_and(|(s, _)| s == "True")
    });
    wait("the operator is idle", || op.idle());
    op.stop();
    fake.call("POST", "/_fake/reset-stats", None, "application/json");
    let op = fake.operator();
    // The new operator lists, watches and re-applies everything; none of it changes anything.
    wait("the restarted operator re-applied the Deployment", || {
        fake.stats()["requests"]["PATCH Deployment"]
            .as_u64()
            .unwrap_or(0)
            >= 1
    });
    wait("the restarted operator is idle", || op.idle());
    let stats = fake.stats();
    assert_eq!(writes(&stats), 0, "{stats}");
}

const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/amqp-connector-operator";

fn holder(fake: &Fake) -> Option<String> {
    fake.get(LEASE)
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(String::from))
}

/// Two operators: only the Lease holder reconciles; on SIGTERM it releases the Lease and the
/// standby takes over.
#[test]
fn two_operators_only_the_leader_reconciles() {
    let fake = Fake::start("leader");
    let a = fake.operator_named("op-a");
    wait("op-a leads", || holder(&fake).as_deref() == Some("op-a"));
    let b = fake.operator_named("op-b");
    let (code, v) = fake.call("POST", CRS, Some(&example()), "application/json");
    assert_eq!(code, 201, "{v}");
    wait("the leader reconciled", || {
        fake.get("/apis/apps/v1/namespaces/apps/deployments/orders")
            .is_some()
    });
    assert!(a.reconciles() > 0);
    assert!(a.leading());
    // Its controller starts only once it leads.
    assert!(!b.leading(), "the standby does not lead");
    assert_eq!(b.reconciles(), 0, "the standby does not reconcile");
    assert_eq!(holder(&fake).as_deref(), Some("op-a"));

    a.stop();
    // Released on SIGTERM (not left to expire), and the standby takes it.
    wait("op-b leads", || holder(&fake).as_deref() == Some("op-b"));
    fake.merge(&format!("{CRS}/orders"), json!({"spec": {"replicas": 3}}));
    wait("the new leader reconciles", || {
        fake.get("/apis/apps/v1/namespaces/apps/deployments/orders")
            .is_some_and(|d| d["spec"]["replicas"] == 3)
    });
    assert!(b.reconciles() > 0);
    b.stop();
    wait("the Lease is free", || holder(&fake).is_none());
}

/// A transient API error: the object shows Degraded (ApplyFailed) while it lasts, the operator
/// retries with backoff instead of hammering the server, and recovers to Ready.
#[test]
fn transient_errors_back_off_and_recover() {
    let fake = Fake::start("transient");
    let _op = fake.operator();
    fake.call(
        "POST",
        "/_fake/fail",
        Some(&json!({"request": "PATCH Deployment", "times": 3})),
        "application/json",
    );
    let (code, v) = fake.call("POST", CRS, Some(&example()), "application/json");
    assert_eq!(code, 201, "{v}");
    wait("Degraded while the API fails", || {
        fake.get(&format!("{CRS}/orders"))
            .and_then(|cr| condition(&cr, "Degraded"))
            .is_some_and(|(s, r)| s == "True" && r == "ApplyFailed")
    });
    wait("Ready once the API works again", || {
        fake.get(&format!("{CRS}/orders"))
            .and_then(|cr| condition(&cr, "Ready"))
            .is_some_and(|(s, _)| s == "True")
    });
    let cr = fake.get(&format!("{CRS}/orders")).expect("cr");
    assert_eq!(
        condition(&cr, "Degraded").map(|c| c.0).as_deref(),
        Some("False")
    );
    // Three failures and the success, plus at most a few reconciles woken by child events.
    let attempts = fake.stats()["requests"]["PATCH Deployment"]
        .as_u64()
        .unwrap_or(0);
    assert!((4..=8).contains(&attempts), "{attempts} attempts");
    let warned = events(&fake, "orders");
    assert!(
        warned
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "ApplyFailed"),
        "{warned:?}"
    );
}
