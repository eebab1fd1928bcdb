//! amqp-bench against the real connector: it runs, reports, and finds no loss (its exit code says
//! so); and it exits non-zero when messages are missing. No timing is asserted.

use std::process::Command;

use connector::config::Settings;
use interop_tests::TestConnector;

fn bench(url: &str, extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_amqp-bench"))
        .args(["--url", url, "--idle-timeout", "3"])
        .args(extra)
        .output()
        .expect("amqp-bench runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn unsettled_and_presettled_runs_lose_nothing() {
    let c = TestConnector::start(Settings::default());
    let (ok, out) = bench(
        &c.url(),
        &["--messages", "2000", "--producers", "2", "--consumers", "2"],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("2000 received") && out.contains("lost 0 duplicated 0"),
        "{out}"
    );
    let (ok, out) = bench(
        &c.url(),
        &[
            "--messages",
            "500",
            "--presettled",
            "--address",
            "queues/pre",
        ],
    );
    assert!(ok, "{out}");
    assert!(out.contains("lost 0"), "{out}");
}

/// The lean client (`--client lean`) moves the same loads: unsettled with two of each, pre-settled,
/// and messages larger than a frame (multi-frame TRANSFERs both ways), with nothing lost.
#[test]
fn lean_client_runs_lose_nothing() {
    let c = TestConnector::start(Settings::default());
    let lean = ["--client", "lean"];
    for (extra, n) in [
        (
            &[
                "--producers",
                "2",
                "--consumers",
                "2",
                "--address",
                "queues/lean",
            ][..],
            "2000",
        ),
        (&["--presettled", "--address", "queues/lean-pre"][..], "500"),
        (
            &["--size", "300000", "--address", "queues/lean-big"][..],
            "20",
        ),
    ] {
        let args: Vec<&str> = lean
            .iter()
            .chain(extra)
            .copied()
            .chain(["--messages", n])
            .collect();
        let (ok, out) = bench(&c.url(), &args);
        assert!(ok, "{args:?}: {out}");
        assert!(
            out.contains(&format!("{n} received")) && out.contains("lost 0 duplicated 0"),
            "{args:?}: {out}"
        );
    }
    assert_eq!(c.store().ready_count("lean"), 0, "everything was accepted");
}

/// The loss check is real: with no consumer, every message sent counts as lost and the run fails.
#[test]
fn missing_messages_fail_the_run() {
    let c = TestConnector::start(Settings::default());
    let (ok, out) = bench(
        &c.url(),
        &[
            "--messages",
            "300",
            "--address",
            "queues/nobody",
            "--consumers",
            "0",
        ],
    );
    assert!(!ok, "a run with lost messages must fail:\n{out}");
    assert!(out.contains("lost 300"), "{out}");
    assert_eq!(
        c.store().ready_count("nobody"),
        300,
        "the messages are safe in the queue, just not received"
    );
}

/// The direct gRPC mode (the baseline for the connector's overhead) runs the same load against the
/// store's gRPC façade and finds every message exactly once.
#[test]
fn direct_grpc_mode_loses_nothing() {
    let f = interop_tests::TestFacade::start();
    let out = Command::new(env!("CARGO_BIN_EXE_amqp-bench"))
        .args(["--grpc", &f.addr.to_string(), "--idle-timeout", "3"])
        .args(["--messages", "2000", "--producers", "2", "--consumers", "2"])
        .args(["--address", "queues/direct"])
        .output()
        .expect("amqp-bench runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("2000 received") && text.contains("lost 0 duplicated 0"),
        "{text}"
    );
}

/// tcp-forward (overhead.sh's extra-hop baseline) passes the direct gRPC load through unchanged:
/// both directions, several connections, every message exactly once.
#[test]
fn tcp_forward_passes_the_direct_load_through() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let f = interop_tests::TestFacade::start();
    let mut forward = Command::new(env!("CARGO_BIN_EXE_tcp-forward"))
        .args(["127.0.0.1:0", &f.addr.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("tcp-forward starts");
    let mut line = String::new();
    BufReader::new(forward.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("tcp-forward prints its address");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_amqp-bench"))
        .args(["--grpc", &addr, "--idle-timeout", "3"])
        .args(["--messages", "2000", "--producers", "2", "--consumers", "2"])
        .args(["--address", "queues/forwarded"])
        .output()
        .expect("amqp-bench runs");
    let _ = forward.kill();
    let _ = forward.wait();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("2000 received") && text.contains("lost 0 duplicated 0"),
        "{text}"
    );
}

/// With `--stages`, the run prints the connector's account of each stage of its queue messages
/// (read from the connector's HTTP endpoint before and after), and the producers' own send to
/// accepted times; every message of the run is counted in every stage.
#[test]
fn stages_are_reported_from_the_connector() {
    let c = TestConnector::start(Settings::default());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let http = listener.local_addr().expect("address");
    let metrics = c.metrics.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            listener.set_nonblocking(true).expect("non-blocking");
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let health = connector::http::Health {
                metrics,
                ready: tokio::sync::watch::channel(true).1,
                registry: Default::default(),
                operations: connector::operations::Operations {
                    budget: connector::engine::ProcessBudget::new(1 << 20),
                    max_connections: 0,
                    tls: None,
                },
            };
            connector::http::serve(listener, health).await
        })
    });
    let (ok, out) = bench(
        &c.url(),
        &[
            "--messages",
            "300",
            "--address",
            "queues/stages",
            "--stages",
            &format!("http://{http}"),
        ],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("latency p50") && out.contains(" p999 "),
        "{out}"
    );
    assert!(out.contains("send to accepted p50"), "{out}");
    for stage in ["stored", "waited", "handed_out", "settled"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("connector {stage} ")))
            .unwrap_or_else(|| panic!("no {stage} line in:\n{out}"));
        assert!(line.contains("n     300"), "{line}");
    }
}
