//! Where the real KubeMQ tier's binaries are, and which tests used them.
//!
//! The suite never builds KubeMQ or its burn-in harness (their source is not served by the Go
//! module proxy): it runs the binary an environment variable names, else the one cached in
//! `$HOME/.cache/kubemq-amqp/`, and otherwise that tier is not run. `tests/run.sh` prints how
//! many tests used each binary, from what [`record_use`] wrote.

use std::io::Write;
use std::path::PathBuf;

/// KubeMQ community v2.4.0 (`KUBEMQ_BINARY`, else `$HOME/.cache/kubemq-amqp/kubemq-community`),
/// if there is one.
pub fn kubemq_binary() -> Option<PathBuf> {
    named_or_cached("KUBEMQ_BINARY", "kubemq-community")
}

/// A KubeMQ build that enforces its own authentication and authorization
/// (`KUBEMQ_ENFORCING_BINARY`, else `$HOME/.cache/kubemq-amqp/kubemq-community-enforcing`), if
/// there is one: community v2.4.0 reads those settings but enforces neither, the commit before
/// it (e0aeae1) still does.
pub fn enforcing_binary() -> Option<PathBuf> {
    named_or_cached("KUBEMQ_ENFORCING_BINARY", "kubemq-community-enforcing")
}

/// The burn-in harness binary (`BURNIN_BINARY`, else `$HOME/.cache/kubemq-amqp/burnin`), if
/// there is one.
pub fn burnin_binary() -> Option<PathBuf> {
    named_or_cached("BURNIN_BINARY", "burnin")
}

fn named_or_cached(var: &str, file: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "{var} names {}, which is not a file",
            p.display()
        );
        return Some(p);
    }
    let cached = PathBuf::from(std::env::var_os("HOME")?)
        .join(".cache/kubemq-amqp")
        .join(file);
    cached.is_file().then_some(cached)
}

/// What a test that needs one of the tier's binaries starts with: `found` counted as used under
/// `what` by the running test, or, when the machine has no such binary, `None` and a line on
/// standard error saying the test did not run.
pub fn for_this_test(what: &str, found: Option<PathBuf>) -> Option<PathBuf> {
    match found {
        Some(binary) => {
            record_use(what);
            Some(binary)
        }
        None => {
            eprintln!("{what}: no binary on this machine, tier not run");
            None
        }
    }
}

/// Notes that the running test used `what` (a real KubeMQ, the burn-in harness), for the count
/// `tests/run.sh` prints.
pub fn record_use(what: &str) {
    let Some(dir) = std::env::var_os("KUBEMQ_AMQP_TEST_LOGS") else {
        return;
    };
    let _ = std::fs::create_dir_all(&dir);
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .to_string();
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(PathBuf::from(dir).join(format!("{what}-tests.txt")))
    {
        let _ = writeln!(f, "{bin}::{test}");
    }
}
