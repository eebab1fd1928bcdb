//! KubeMQ's own burn-in harness for its AMQP 1.0 connector (`kubemq-amqp-1-0`, module
//! `burnin`), unchanged, against this connector on every backend, two at a time: all six workers
//! (queues, events, events-store, commands, queries, credit flow) with the configuration
//! published beside the harness (`burnin-config-run.yaml`), for three minutes, must print
//! PASSED. The harness is not built by the suite (its module is not served by the Go module
//! proxy): it runs where `BURNIN_BINARY` or `$HOME/.cache/kubemq-amqp/burnin` exists, with its
//! configuration file beside it. Each run has 50 consumers beside it on other, empty queues of
//! the same connector, as a deployment's idle queues have them (KMQ-21): they must cost the run
//! nothing the harness's gates see, and receive nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use connector::config::Settings;
use interop_tests::fleet::{Fleet, Settle};
use interop_tests::real_kubemq;
use interop_tests::TestConnector;

/// How long each run lasts.
const DURATION: &str = "3m";
/// Consumers waiting on other, empty queues of the connector under test during each run.
const IDLE_NEIGHBOURS: usize = 50;

#[test]
fn the_burn_in_harness_passes_on_every_backend() {
    let Some(binary) = real_kubemq::for_this_test("burnin", real_kubemq::burnin_binary()) else {
        return;
    };
    let template = binary.with_file_name("burnin-config-run.yaml");
    let connectors = TestConnector::on_every_backend(Settings::default());
    let rt = interop_tests::runtime();
    let mut failed = Vec::new();
    // Two runs at a time: the harness, the connector under test and its broker share the
    // machine's two cores with the other run, and a starved run misses the harness's rate gate.
    for pair in connectors.chunks(2) {
        let runs: Vec<_> = pair
            .iter()
            .map(|c| {
                let idle = rt.block_on(Fleet::attach(
                    &c.url(),
                    &format!("burnin-idle.{}", connector::kubemq::new_id()),
                    0..IDLE_NEIGHBOURS,
                    10,
                    Settle::Accept,
                ));
                let dir = tempfile::tempdir().unwrap();
                let config = config_for(&template, dir.path());
                let child = Command::new(&binary)
                    .arg("-run")
                    .arg("-config")
                    .arg(&config)
                    .env("KUBEMQ_BROKER_ADDRESS", c.addr.to_string())
                    .stdout(std::fs::File::create(dir.path().join("out.txt")).unwrap())
                    .stderr(std::fs::File::create(dir.path().join("err.txt")).unwrap())
                    .spawn()
                    .expect("the burn-in harness starts");
                (c, idle, dir, child)
            })
            .collect();
        for (c, idle, dir, mut child) in runs {
            let status = child.wait().unwrap();
            // Recorded, not asserted: the pair's other run is still to be waited for.
            if idle.received() > 0 {
                failed.push(format!(
                    "{} backend: {} messages reached the idle neighbours, to which nothing was sent",
                    c.backend(),
                    idle.received()
                ));
            }
            rt.block_on(idle.detach());
            let out = std::fs::read_to_string(dir.path().join("out.txt")).unwrap_or_default();
            let err = std::fs::read_to_string(dir.path().join("err.txt")).unwrap_or_default();
            // The harness logs its verdict and prints its report; both say PASSED or FAILED.
            let verdict = err
                .lines()
                .chain(out.lines())
                .find(|l| l.contains("burn-in verdict"))
                .unwrap_or("no verdict")
                .to_string();
            eprintln!(
                "burn-in on the {} backend: {verdict} ({status})",
                c.backend()
            );
            if !status.success() || !verdict.contains("result=PASSED") {
                // The whole story goes to the captured output; the failure itself names the
                // harness's reasons only, so that they end the test's report.
                eprintln!(
                    "== {} backend: the harness's output\n{}\n{}",
                    c.backend(),
                    tail(&out, 80),
                    tail(&err, 80)
                );
                if let Some(k) = c.real_kubemq() {
                    eprintln!("== KubeMQ's log\n{}", tail(&k.log(), 40));
                }
                failed.push(format!(
                    "{} backend ({status}): {}",
                    c.backend(),
                    reasons(&err).join("; ")
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The reasons the harness's report gives for its verdict: its failed checks and its warnings
/// (where every failed threshold is named).
fn reasons(report: &str) -> Vec<String> {
    let mut reasons = Vec::new();
    let mut in_warnings = false;
    for line in report.lines() {
        let trimmed = line.trim();
        if trimmed == "Warnings:" {
            in_warnings = true;
        } else if let Some(warning) = trimmed.strip_prefix("- ").filter(|_| in_warnings) {
            reasons.push(warning.to_string());
        } else {
            in_warnings = false;
            if trimmed.contains(" FAIL ") {
                reasons.push(trimmed.split_whitespace().collect::<Vec<_>>().join(" "));
            }
        }
    }
    if reasons.is_empty() {
        reasons.push("no report (see the captured output)".into());
    }
    reasons
}

/// The published configuration with this run's duration, a free metrics port and a report
/// file in `dir`.
fn config_for(template: &Path, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(template)
        .unwrap_or_else(|e| panic!("{} must sit beside the harness: {e}", template.display()));
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    config["duration"] = DURATION.into();
    config["metrics"]["port"] = u64::from(testkit::free_port()).into();
    config["output"]["report_file"] = dir
        .join("report.json")
        .to_string_lossy()
        .into_owned()
        .into();
    let path = dir.join("burnin-config.yaml");
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The reasons are read from the report's layout: failed checks and warnings, not passed or
/// advisory checks.
#[test]
fn a_failed_reports_reasons_are_read() {
    let report = "\
 Checks:
   loss:queues                  PASS  0.0000%
   latency:events_store         FAIL  p99 2301.0ms > 2000.0ms
   memory                       WARN  growth 2.10x

 Warnings:
   - events_store: p99 latency 2301.0ms exceeds 2000.0ms
   - queues: loss 0.1000% exceeds threshold 0.0000%

 Resources:
";
    assert_eq!(
        reasons(report),
        [
            "latency:events_store FAIL p99 2301.0ms > 2000.0ms",
            "events_store: p99 latency 2301.0ms exceeds 2000.0ms",
            "queues: loss 0.1000% exceeds threshold 0.0000%",
        ]
    );
    assert_eq!(
        reasons("no report"),
        ["no report (see the captured output)"]
    );
}
