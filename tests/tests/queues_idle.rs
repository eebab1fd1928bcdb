//! Idle queues behind one connector (KMQ-21; docs/decisions.md, "Idle queues are watched"): a
//! consumer waiting on an empty queue keeps no Get waiting at the broker, and still gets what
//! is sent through the connector and what other KubeMQ clients send.

use std::time::Duration;

use connector::backend::grpc::{GrpcOptions, KubemqGrpc};
use connector::backend::{Backend, ReadCheck};
use connector::config::Settings;
use connector::kubemq::QueueMessage;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::Outcome;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::TestConnector;

/// The KubeMQ-compatible gRPC server behind `c`: the façade, or the real KubeMQ.
fn broker_grpc(c: &TestConnector) -> Option<std::net::SocketAddr> {
    c.real_kubemq().map(|k| k.grpc).or_else(|| c.facade_addr())
}

/// Every sample of the store's waiting Gets over `span` is zero (a store behind the gRPC
/// façade: the Gets the connector puts on the wire).
async fn no_get_waits(c: &TestConnector, span: Duration) {
    if c.backend() == "embedded" || c.backend() == "real-kubemq" {
        // In process a waiting Get costs nothing; KubeMQ does not say what waits.
        return;
    }
    let store = c.store();
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        assert_eq!(
            store.waiting_gets(),
            0,
            "a Get waits on the idle queue ({})",
            c.backend()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// AUTHZ-9: a queue's first Get goes on the wire even when the queue is idle (only a Get tells
/// whether KubeMQ lets the connector's client read it): a Get waits at the broker, and is
/// answered within its second.
async fn first_get_comes_and_goes(c: &TestConnector) {
    if c.backend() == "embedded" || c.backend() == "real-kubemq" {
        // Nothing to see: let the first Get's second pass before judging what waits.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        return;
    }
    let store = c.store();
    for (what, waiting) in [("the first Get waits", 1), ("the first Get is answered", 0)] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while store.waiting_gets() != waiting {
            assert!(
                tokio::time::Instant::now() < deadline,
                "never happened: {what} ({})",
                c.backend()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// KMQ-21: a consumer with credit on an empty queue makes the connector watch the queue
/// instead of waiting on it with a Get; a message sent through the connector, and one sent
/// straight to the broker by another gRPC client, both reach it, and afterwards nothing waits
/// again. Only the loop's first Get waits (AUTHZ-9).
#[test]
fn an_idle_consumer_puts_no_get_on_the_wire() {
    TestConnector::each_backend(Settings::default(), |c| {
        let url = c.url();
        let external = broker_grpc(c);
        interop_tests::runtime().block_on(async {
            let mut conn = Connection::open("idle-watch", url.as_str()).await.unwrap();
            let mut session = Session::begin(&mut conn).await.unwrap();
            let mut receiver = Receiver::builder()
                .name("rx")
                .source("queues/idle-watch")
                .credit_mode(CreditMode::Auto(10))
                .attach(&mut session)
                .await
                .unwrap();
            first_get_comes_and_goes(c).await;
            no_get_waits(c, Duration::from_millis(1500)).await;

            let mut sender = Sender::attach(&mut session, "tx", "queues/idle-watch")
                .await
                .unwrap();
            let o = sender.send("through the connector").await.unwrap();
            assert!(matches!(o, Outcome::Accepted(_)), "{o:?}");
            let d = tokio::time::timeout(Duration::from_secs(5), receiver.recv::<String>())
                .await
                .expect("a message sent through the connector arrives")
                .unwrap();
            assert_eq!(d.body(), "through the connector");
            receiver.accept(&d).await.unwrap();
            no_get_waits(c, Duration::from_millis(500)).await;

            if let Some(addr) = external {
                let grpc = KubemqGrpc::connect(&addr.to_string(), GrpcOptions::default()).unwrap();
                let sent = grpc
                    .send_queue(
                        0,
                        vec![QueueMessage {
                            message_id: "from-grpc".into(),
                            client_id: "another-kubemq-client".into(),
                            channel: "idle-watch".into(),
                            body: b"from another client".to_vec().into(),
                            ..Default::default()
                        }],
                    )
                    .await
                    .unwrap();
                assert!(!sent[0].is_error, "{}", sent[0].error);
                let d =
                    tokio::time::timeout(
                        Duration::from_secs(5),
                        receiver.recv::<fe2o3_amqp::types::messaging::Body<
                            fe2o3_amqp::types::primitives::Value,
                        >>(),
                    )
                    .await
                    .expect("a message another KubeMQ client sent arrives")
                    .unwrap();
                receiver.accept(&d).await.unwrap();
                no_get_waits(c, Duration::from_millis(500)).await;
            }
            let more =
                tokio::time::timeout(Duration::from_secs(2), receiver.recv::<String>()).await;
            assert!(more.is_err(), "nothing else was sent");
            conn.close().await.unwrap();
        });
    });
}

/// KMQ-23: asking KubeMQ whether a client may read a queue, with a peek for no message, gets an
/// answer that says it may (KubeMQ refuses the peek itself, after its access check, without
/// waiting); a server without the call (the store's façade) cannot tell, and the Get loop's
/// first Get then tells instead (AUTHZ-9).
#[test]
fn kmq_23_a_read_check_needs_no_get() {
    TestConnector::each_backend(Settings::default(), |c| {
        let Some(addr) = broker_grpc(c) else {
            return;
        };
        interop_tests::runtime().block_on(async {
            let grpc = KubemqGrpc::connect(&addr.to_string(), GrpcOptions::default()).unwrap();
            let expected = if c.real_kubemq().is_some() {
                ReadCheck::Allowed
            } else {
                ReadCheck::Unknown
            };
            let checked = grpc.check_read("read-check", "a-client").await.unwrap();
            assert_eq!(checked, expected, "{}", c.backend());
        });
    });
}
