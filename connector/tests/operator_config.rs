//! The configuration files the operator renders (its golden ConfigMaps in
//! operator/tests/golden/) fed to the real connector binary: it accepts each one,
//! reports exactly the settings in it, and starts with it — alive on `/livez`, and not ready on
//! `/readyz` while the broker it names is unreachable.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::free_port;

fn goldens() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../operator/tests/golden");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("operator/tests/golden")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no golden renderings in {}",
        dir.display()
    );
    files
}

/// The `connector.yaml` of the golden file's ConfigMap.
fn rendered_config(golden: &Path) -> String {
    let text = std::fs::read_to_string(golden).expect("golden");
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: serde_yaml::Value = serde::Deserialize::deserialize(doc).expect("YAML");
        if v["kind"] == "ConfigMap" {
            return v["data"]["connector.yaml"]
                .as_str()
                .expect("connector.yaml")
                .to_string();
        }
    }
    panic!("no ConfigMap in {}", golden.display());
}

fn scalar(v: &serde_yaml::Value) -> String {
    match v {
        serde_yaml::Value::String(s) => s.clone(),
        serde_yaml::Value::Number(n) => n.to_string(),
        serde_yaml::Value::Bool(b) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn write_config(golden: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("connector.yaml");
    std::fs::write(&path, rendered_config(golden)).expect("write");
    (dir, path)
}

#[test]
fn connector_reports_the_rendered_settings() {
    for golden in goldens() {
        let (_dir, path) = write_config(&golden);
        let out = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
            .arg("--config")
            .arg(&path)
            .arg("--print-config")
            .output()
            .expect("connector runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {stderr}", golden.display());
        let printed: serde_yaml::Mapping =
            serde_yaml::from_slice(&out.stdout).expect("printed settings");
        let file: serde_yaml::Mapping =
            serde_yaml::from_str(&rendered_config(&golden)).expect("rendered file");
        assert!(file.len() >= 4, "{file:?}");
        for (k, v) in &file {
            let got = printed.get(k).map(scalar);
            assert_eq!(got, Some(scalar(v)), "{}: {k:?}", golden.display());
        }
    }
}

/// The status of `GET path` on the loopback `port`, if anything answers.
fn get(port: u16, path: &str) -> Option<u16> {
    testkit::http_get(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path).map(|r| r.status)
}

#[test]
fn connector_starts_with_each_rendered_configuration() {
    for golden in goldens() {
        let (_dir, path) = write_config(&golden);
        let (amqp, http) = (free_port(), free_port());
        // Ports moved off 5672/9090 so parallel runs cannot collide; everything else as rendered.
        let mut child = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
            .arg("--config")
            .arg(&path)
            .args(["--port", &amqp.to_string(), "--bind-address", "127.0.0.1"])
            .args(["--http-address", &format!("127.0.0.1:{http}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("connector starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while get(http, "/livez") != Some(200) {
            assert!(
                Instant::now() < deadline,
                "{}: never alive",
                golden.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            get(http, "/readyz"),
            Some(503),
            "{}: not ready while the broker is unreachable",
            golden.display()
        );
        let _ = child.kill();
        let _ = child.wait();
    }
}
