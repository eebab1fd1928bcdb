//! python-qpid-proton against the real connector (driver, queues bridge) over a real socket: the
//! Queues concept page's scenarios and drain on every backend (the embedded store in-process, and
//! the KubeMQ gRPC client talking to the store's gRPC façade; Q-S1 … Q-S4, Q-32, FLOW-5), and what
//! does not depend on the backend (many links, SASL PLAIN, heartbeats) on the embedded store.

use connector::config::Settings;
use interop_tests::{run_client_script, run_client_script_on_both_backends, TestConnector};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python");

fn run(scenario: &str) {
    run_client_script_on_both_backends("python3", DIR, &["queues.py", scenario, "{url}"], scenario);
}

/// A scenario on the embedded store only.
fn run_embedded(scenario: &str) {
    let c = TestConnector::start(Settings::default());
    run_client_script(
        "python3",
        DIR,
        &["queues.py", scenario, "{url}"],
        scenario,
        c.addr,
    );
}

/// Q-S1: send / receive / accept / confirm empty.
#[test]
fn q_s1_send_receive_accept() {
    run("q_s1");
}

/// Q-S2: release, reject, accept and redelivery headers (Q-17, Q-20 … Q-22).
#[test]
fn q_s2_outcomes_and_redelivery() {
    run("q_s2");
}

/// Q-S3: pre-settled and unsettled produce drained by one receiver; `second` refused.
#[test]
fn q_s3_settle_modes() {
    run("q_s3");
}

/// Q-S4: 1 MiB at max-frame-size 4096.
#[test]
fn q_s4_large_message() {
    run("q_s4");
}

/// a disconnecting consumer loses nothing.
#[test]
fn q_32_teardown_returns_messages() {
    run("teardown");
}

/// FLOW-5: a drain with credit 5 while two messages wait gets both, then credit 0.
#[test]
fn flow_5_drain() {
    run("drain");
}

/// CFG-7: 200 links on one session (the default limit is 256), each used once.
#[test]
fn two_hundred_links_one_session() {
    run_embedded("many_links");
}

/// SASL-2 / SASL-4: SASL PLAIN with a username and password is accepted (authentication off).
#[test]
fn sasl_plain() {
    run_embedded("plain");
}

/// CONN-12: a client with a 1 s idle-time-out and no traffic of its own for 3 s stays connected,
/// kept alive by the connector's empty frames.
#[test]
fn conn_12_heartbeat() {
    run_embedded("heartbeat");
}

/// a client process killed with SIGKILL while holding unsettled deliveries loses
/// nothing: a fresh consumer gets them all, with delivery-count increased; on both backends.
#[test]
fn q_32_sigkilled_client_loses_nothing() {
    TestConnector::each_backend(Settings::default(), |c| {
        let script = format!("{DIR}/queues.py");
        let out = std::process::Command::new("python3")
            .args([script.as_str(), "killed", &c.url()])
            .output()
            .expect("python3");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("HELD"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "the client died by SIGKILL");
        let url = c.url();
        let counts = interop_tests::runtime().block_on(async move {
            use fe2o3_amqp::link::receiver::CreditMode;
            let mut conn = fe2o3_amqp::Connection::open("after-kill", url.as_str())
                .await
                .unwrap();
            let mut session = fe2o3_amqp::Session::begin(&mut conn).await.unwrap();
            let mut rx = fe2o3_amqp::Receiver::builder()
                .name("rx")
                .source("queues/killed")
                .credit_mode(CreditMode::Auto(10))
                .attach(&mut session)
                .await
                .unwrap();
            let mut counts = Vec::new();
            for _ in 0..3 {
                let d =
                    tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv::<String>())
                        .await
                        .unwrap()
                        .unwrap();
                counts.push(d.message().header.as_ref().map_or(0, |h| h.delivery_count));
                rx.accept(&d).await.unwrap();
            }
            conn.close().await.unwrap();
            counts
        });
        assert!(counts.iter().all(|n| *n >= 1), "redeliveries: {counts:?}");
    });
}
