//! Logs written anywhere but a terminal (a file, a pipe, a pod's log) are plain text: no ANSI
//! colour codes around levels and fields.

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
