//! The request/reply examples of README.md (examples/rpc/) run as they are, Python and
//! JavaScript, against the connector on the embedded store (the examples are about the client
//! side; every backend is covered by rpc_pairs.rs), and README.md shows them as they are.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use connector::config::Settings;
use interop_tests::TestConnector;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rpc");
const NODE_MODULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/js/node_modules");

/// Runs `responder` (which answers two requests and says `ready` once attached), then
/// `requester`; returns what the requester printed.
fn run_pair(program: &str, responder: &str, requester: &str, target: &str) -> String {
    let mut r = Command::new(program)
        .current_dir(EXAMPLES)
        .env("NODE_PATH", NODE_MODULES)
        .args([responder, target, "2"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the example runs (tests/run.sh installs the clients)");
    let mut out = BufReader::new(r.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("a line");
    assert_eq!(line.trim(), "ready", "{responder} said {line:?}");
    let asked = Command::new(program)
        .current_dir(EXAMPLES)
        .env("NODE_PATH", NODE_MODULES)
        .args([requester, target])
        .output()
        .expect("the example runs");
    let mut rest = String::new();
    let _ = out.read_to_string(&mut rest);
    let status = r.wait().expect("the responder ends");
    assert!(status.success(), "{responder}: {status} {rest}");
    assert!(
        asked.status.success(),
        "{requester}: {}",
        String::from_utf8_lossy(&asked.stderr)
    );
    String::from_utf8_lossy(&asked.stdout).into_owned()
}

/// RPC-1, RPC-7, RPC-8, RPC-13: the Python requester and responder of README.md.
#[test]
fn readme_python_request_reply() {
    let c = TestConnector::start(Settings::default());
    let out = run_pair("python3", "responder.py", "requester.py", &c.url());
    assert_eq!(out, "c-1 executed: True\nq-1 answer: in stock: sku-7\n");
}

/// RPC-1, RPC-7, RPC-8, RPC-13: the JavaScript (rhea-promise) requester and responder of
/// README.md.
#[test]
fn readme_javascript_request_reply() {
    let c = TestConnector::start(Settings::default());
    let port = c.addr.port().to_string();
    let out = run_pair("node", "responder.js", "requester.js", &port);
    assert_eq!(out, "c-1 executed: true\nq-1 answer: in stock: sku-7\n");
}

/// README.md shows the examples exactly as they are in examples/rpc/.
#[test]
fn readme_shows_the_rpc_examples_as_they_are() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    for file in [
        "requester.py",
        "responder.py",
        "requester.js",
        "responder.js",
    ] {
        let text = std::fs::read_to_string(format!("{EXAMPLES}/{file}")).expect("the example");
        assert!(
            readme.contains(&text),
            "README.md does not show examples/rpc/{file} as it is"
        );
    }
}
