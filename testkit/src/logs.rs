//! The suite's logs and the secrets its tests used: every connector and operator process a test
//! starts writes its log into [`dir`], every test that hands a process a password, token or
//! private key records it with [`used_secret`], and `connector/tests/secrets_in_logs.rs` fails if
//! any log holds any of them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// The file in [`dir`] that lists the secrets, one line each.
pub const SECRETS_FILE: &str = "secrets.txt";
/// Secret lines shorter than this are left out (a PEM's short last line): they would match too
/// much. A PEM's `-----BEGIN …` and `-----END …` lines are left out too.
pub const MIN_SECRET_LINE: usize = 12;

/// Where the suite's logs go: `$KUBEMQ_AMQP_TEST_LOGS`, or `target/test-logs` of the workspace.
pub fn dir() -> PathBuf {
    let dir = std::env::var_os("KUBEMQ_AMQP_TEST_LOGS").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/test-logs")),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).expect("the test log folder");
    dir
}

/// A new log file in [`dir`], named after `name`, the test process and a counter.
pub fn file(name: &str) -> (PathBuf, File) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = dir().join(format!("{name}-{}-{n}.log", std::process::id()));
    let file = File::create(&path).expect("a test log file");
    (path, file)
}

/// Records that a test gave a process `secret`: each of its lines of at least
/// [`MIN_SECRET_LINE`] characters (PEM armour aside) must appear in no log.
pub fn used_secret(secret: &str) {
    let lines: String = secret
        .lines()
        .map(str::trim)
        .filter(|l| l.len() >= MIN_SECRET_LINE && !l.starts_with("-----"))
        .map(|l| format!("{l}\n"))
        .collect();
    if lines.is_empty() {
        return;
    }
    // One append per call: concurrent tests' records do not interleave within a line.
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir().join(SECRETS_FILE))
        .expect("the secrets file");
    f.write_all(lines.as_bytes()).expect("the secrets file");
}
