//! AUD: no password, token or key reaches a log. Every test that hands a process a secret records
//! it (`testkit::logs::used_secret`), and every connector and operator process the suite starts
//! logs into the suite's log folder; this test reads them all. It first makes logs and secrets
//! of its own (a connector with authentication on, at debug level, given a good, a forged and an
//! expired token over SASL PLAIN), so it checks something whenever it runs; `tests/run.sh` runs it
//! once more after the whole suite, over every log the suite wrote.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_port, run};
use jsonwebtoken::{encode, EncodingKey, Header};

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/python/auth.py");

/// A token for `client_id` signed with `key`, expiring `exp_in` seconds from now; recorded.
fn token(client_id: &str, key: &str, exp_in: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let t = encode(
        &Header::default(),
        &serde_json::json!({"ClientID": client_id, "exp": now + exp_in}),
        &EncodingKey::from_secret(key.as_bytes()),
    )
    .unwrap();
    testkit::logs::used_secret(&t);
    t
}

/// Makes this test's own logs and secrets: a connector with authentication on given good and
/// bad tokens.
fn exercise_a_secured_connector() {
    let dir = tempfile::tempdir().unwrap();
    let key = format!("logs-check-key-{}", uuid::Uuid::new_v4().simple());
    testkit::logs::used_secret(&key);
    std::fs::write(dir.path().join("jwt.key"), &key).unwrap();
    let (_, log) = testkit::logs::file("secrets-check-connector");
    let (port, http) = (free_port(), SocketAddr::from(([127, 0, 0, 1], free_port())));
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
        .args(["--port", &port.to_string(), "--bind-address", "127.0.0.1"])
        .args(["--http-address", &http.to_string(), "--log-format", "json"])
        .args(["--authentication", "true", "--jwt-signature-type", "HS256"])
        .args(["--authorize-every-client", "true"])
        .arg("--jwt-key-file")
        .arg(dir.path().join("jwt.key"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "debug")
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    testkit::eventually("the connector is ready", Duration::from_secs(20), || {
        testkit::http_get(http, "/readyz").is_some_and(|r| r.status == 200)
    });
    let python = |args: &[&str]| {
        run(Command::new("python3")
            .arg(PYTHON)
            .arg(args[0])
            .arg(port.to_string())
            .args(&args[1..]));
    };
    let good = token("logs-check", &key, 300);
    python(&["send", "logs-check", &good, "logs-check"]);
    let forged = token("logs-check", "not-the-connectors-key", 300);
    python(&["refused", "logs-check", &forged]);
    let expired = token("logs-check", &key, -300);
    python(&["refused", "logs-check", &expired]);
    let _ = child.kill();
    let _ = child.wait();
}

/// AUD (no secret in any log), SASL-3.
#[test]
fn aud_no_secret_in_any_log_the_suite_wrote() {
    exercise_a_secured_connector();
    let dir = testkit::logs::dir();
    let secrets: Vec<String> = std::fs::read_to_string(dir.join(testkit::logs::SECRETS_FILE))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(secrets.len() >= 4, "this test's secrets are recorded");
    let mut logs = 0;
    let mut leaks = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        logs += 1;
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        for (i, s) in secrets.iter().enumerate() {
            if text.contains(s.as_str()) {
                // The secret's line number in the secrets file, not the secret.
                leaks.push(format!("{} holds secret #{}", path.display(), i + 1));
            }
        }
    }
    assert!(logs >= 1, "no log in {}", dir.display());
    assert!(leaks.is_empty(), "secrets in logs: {leaks:#?}");
    eprintln!(
        "{logs} logs in {} hold none of {} secrets",
        dir.display(),
        secrets.len()
    );
}
