//! Logs written anywhere but a terminal (a file, a pipe, a pod's log) are plain text: no ANSI
//! colour codes around levels and fields.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::process::Command;

#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
        .arg("--enable")
        .arg("false")
        .env("RUST_LOG", "info")
        .output()
        .expect("the connector binary runs");
    assert!(out.status.success(), "{out:?}");
    let logs = String::from_utf8_lossy(&out.stdout);
    assert!(
        logs.contains("Enable is false"),
        "the start-up line is logged: {logs}"
    );
    assert!(!logs.contains('\u{1b}'), "colour codes in {logs:?}");
}

/// With `LogFormat: json` every line is one JSON object, for log collectors.
#[test]
fn json_logs_are_one_object_per_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubemq-amqp-connector"))
        .args(["--enable", "false", "--log-format", "json"])
        .env("RUST_LOG", "info")
        .output()
        .expect("the connector binary runs");
    assert!(out.status.success(), "{out:?}");
    let logs = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = logs.lines().collect();
    assert!(!lines.is_empty(), "nothing logged");
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(v["level"], "INFO", "{line}");
        assert!(v["fields"]["message"].is_string(), "{line}");
    }
}
