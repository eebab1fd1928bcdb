//! Queues across access paths and consumers (queues.md; GEN-4).

use std::process::Command;
use std::time::Duration;

use connector::config::Settings;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::TestConnector;

/// Q-38 / GEN-4: a message sent over KubeMQ's gRPC API (its Python SDK) is received over AMQP and
/// vice versa, on the same channel.
#[test]
fn q_38_grpc_and_amqp_share_queues() {
    let c = TestConnector::start_over_grpc(Settings::default());
    let facade = c.facade_addr().expect("façade");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/interop_grpc.py");
    let out = Command::new("python3")
        .args([script, &c.url(), &facade.to_string()])
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("PASS interop_grpc"), "{stdout}");
}

/// competing consumers on different connections share a queue; each message goes to
/// exactly one of them, and both get some.
#[test]
fn q_2_q_3_competing_consumers() {
    let c = TestConnector::start(Settings::default());
    let url = c.url();
    interop_tests::runtime().block_on(async {
        let mut consumers = Vec::new();
        for i in 0..2 {
            let url = url.clone();
            consumers.push(tokio::spawn(async move {
                let mut conn = Connection::open(format!("worker-{i}"), url.as_str())
                    .await
                    .unwrap();
                let mut session = Session::begin(&mut conn).await.unwrap();
                let mut rx = Receiver::builder()
                    .name("rx")
                    .source("queues/work")
                    .credit_mode(CreditMode::Auto(5))
                    .attach(&mut session)
                    .await
                    .unwrap();
                let mut got = Vec::new();
                while let Ok(Ok(d)) =
                    tokio::time::timeout(Duration::from_millis(1500), rx.recv::<String>()).await
                {
                    got.push(d.body().clone());
                    rx.accept(&d).await.unwrap();
                }
                rx.close().await.unwrap();
                conn.close().await.unwrap();
                got
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut conn = Connection::open("producer", url.as_str()).await.unwrap();
        let mut session = Session::begin(&mut conn).await.unwrap();
        let mut tx = Sender::attach(&mut session, "tx", "queues/work")
            .await
            .unwrap();
        for i in 0..200 {
            tx.send(format!("job {i}")).await.unwrap();
        }
        tx.close().await.unwrap();
        conn.close().await.unwrap();
        let mut all = Vec::new();
        let mut per = Vec::new();
        for h in consumers {
            let got = h.await.unwrap();
            per.push(got.len());
            all.extend(got);
        }
        all.sort();
        let mut expected: Vec<String> = (0..200).map(|i| format!("job {i}")).collect();
        expected.sort();
        assert_eq!(all, expected, "every message exactly once across consumers");
        assert!(
            per.iter().all(|n| *n > 0),
            "both consumers got work: {per:?}"
        );
    });
}
