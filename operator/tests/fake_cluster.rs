//! The real operator binary against the project's stateful fake API server
//! (tests/python/fake_apiserver.py) on loopback, for what the real control plane (real_cluster)
//! cannot be made to do here: fail chosen API requests, to see the operator report Degraded,
//! back off and recover. Everything else about the operator runs against the real one.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod cases;

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

    fn stats(&self) -> Value {
        self.get("/_fake/stats").expect("stats")
    }

    fn operator(&self) -> Operator {
        let http = testkit::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-operator"))
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("POD_NAME", "operator-under-test")
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
    cases::example("amqpconnector.yaml")
}

/// (type, reason, note) of the Events about AmqpConnector `name`.
fn events(fake: &Fake, name: &str) -> Vec<(String, String, String)> {
    let list = fake
        .get("/apis/events.k8s.io/v1/namespaces/apps/events")
        .unwrap_or(Value::Null);
    cases::events_about(&list, name)
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
            .and_then(|cr| cases::condition(&cr, "Degraded"))
            .is_some_and(|(s, r)| s == "True" && r == "ApplyFailed")
    });
    wait("Ready once the API works again", || {
        fake.get(&format!("{CRS}/orders"))
            .and_then(|cr| cases::condition(&cr, "Ready"))
            .is_some_and(|(s, _)| s == "True")
    });
    let cr = fake.get(&format!("{CRS}/orders")).expect("cr");
    assert_eq!(
        cases::condition(&cr, "Degraded").map(|c| c.0).as_deref(),
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
