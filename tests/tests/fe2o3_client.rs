//! Interop with the fe2o3-amqp client (crates.io) over real sockets, against the test-only
//! in-memory node (see `interop_tests` crate docs): not the queues pattern.

use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::{Data, Message, Outcome};
use fe2o3_amqp::types::primitives::Binary;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::TestServer;

fn rt() -> tokio::runtime::Runtime {
    interop_tests::runtime()
}

/// Send, receive with credit, accept; the queue is empty afterwards (XFER-1, FLOW-1, FLOW-3).
#[test]
fn send_receive_accept() {
    let server = TestServer::start_default();
    let url = server.url();
    rt().block_on(async {
        let mut conn = Connection::open("fe2o3-client", url.as_str())
            .await
            .unwrap();
        let mut session = Session::begin(&mut conn).await.unwrap();
        let mut sender = Sender::attach(&mut session, "tx", "queues/fe2o3")
            .await
            .unwrap();
        for i in 0..20 {
            let outcome = sender.send(format!("hello {i}")).await.unwrap();
            assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
        }
        let mut receiver = Receiver::attach(&mut session, "rx", "queues/fe2o3")
            .await
            .unwrap();
        for i in 0..20 {
            let d = receiver.recv::<String>().await.unwrap();
            assert_eq!(d.body(), &format!("hello {i}"));
            receiver.accept(&d).await.unwrap();
        }
        sender.close().await.unwrap();
        receiver.close().await.unwrap();
        session.end().await.unwrap();
        conn.close().await.unwrap();
    });
    assert_eq!(server.node.depth("queues/fe2o3"), 0);
}

/// A released delivery is delivered again; an accepted one is not.
#[test]
fn release_then_redelivery() {
    let server = TestServer::start_default();
    let url = server.url();
    rt().block_on(async {
        let mut conn = Connection::open("fe2o3-release", url.as_str())
            .await
            .unwrap();
        let mut session = Session::begin(&mut conn).await.unwrap();
        let mut sender = Sender::attach(&mut session, "tx", "queues/rel")
            .await
            .unwrap();
        sender.send("once").await.unwrap();
        let mut receiver = Receiver::attach(&mut session, "rx", "queues/rel")
            .await
            .unwrap();
        let d = receiver.recv::<String>().await.unwrap();
        receiver.release(&d).await.unwrap();
        let d = receiver.recv::<String>().await.unwrap();
        assert_eq!(d.body(), "once");
        receiver.accept(&d).await.unwrap();
        receiver.close().await.unwrap();
        sender.close().await.unwrap();
        conn.close().await.unwrap();
    });
    assert_eq!(server.node.depth("queues/rel"), 0);
}

/// A 5 MiB message at max-frame-size 512 goes both ways bit-exactly (XFER-1, XFER-3, CONN-8).
#[test]
fn five_mib_at_max_frame_512() {
    let server = TestServer::start_default();
    let url = server.url();
    let body: Vec<u8> = (0..5 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let sent = body.clone();
    let got = rt().block_on(async move {
        let mut conn = Connection::builder()
            .container_id("fe2o3-big")
            .max_frame_size(512)
            .open(url.as_str())
            .await
            .unwrap();
        let mut session = Session::begin(&mut conn).await.unwrap();
        let mut sender = Sender::attach(&mut session, "tx", "queues/big")
            .await
            .unwrap();
        let outcome = sender
            .send(Message::builder().data(Binary::from(sent)).build())
            .await
            .unwrap();
        assert!(matches!(outcome, Outcome::Accepted(_)));
        let mut receiver = Receiver::attach(&mut session, "rx", "queues/big")
            .await
            .unwrap();
        let d = receiver.recv::<Data>().await.unwrap();
        receiver.accept(&d).await.unwrap();
        let got = d.body().0.to_vec();
        receiver.close().await.unwrap();
        sender.close().await.unwrap();
        conn.close().await.unwrap();
        got
    });
    assert_eq!(got.len(), body.len());
    assert!(got == body, "payload differs");
}

/// 200 links on one session, each sending and then receiving its own message (CFG-7 default 256).
#[test]
fn two_hundred_links_one_session() {
    let server = TestServer::start_default();
    let url = server.url();
    rt().block_on(async {
        let mut conn = Connection::open("fe2o3-links", url.as_str()).await.unwrap();
        let mut session = Session::begin(&mut conn).await.unwrap();
        let mut senders = Vec::new();
        for i in 0..100 {
            senders.push(
                Sender::attach(&mut session, format!("tx-{i}"), format!("queues/l{i}"))
                    .await
                    .unwrap(),
            );
        }
        let mut receivers = Vec::new();
        for i in 0..100 {
            let r = Receiver::builder()
                .name(format!("rx-{i}"))
                .source(format!("queues/l{i}"))
                .credit_mode(CreditMode::Auto(5))
                .attach(&mut session)
                .await
                .unwrap();
            receivers.push(r);
        }
        for (i, s) in senders.iter_mut().enumerate() {
            s.send(format!("m{i}")).await.unwrap();
        }
        for (i, r) in receivers.iter_mut().enumerate() {
            let d = r.recv::<String>().await.unwrap();
            assert_eq!(d.body(), &format!("m{i}"));
            r.accept(&d).await.unwrap();
        }
        for s in senders {
            s.close().await.unwrap();
        }
        for r in receivers {
            r.close().await.unwrap();
        }
        conn.close().await.unwrap();
    });
}

/// 50 concurrent connections, each producing and consuming on its own address.
#[test]
fn fifty_concurrent_connections() {
    let server = TestServer::start_default();
    let url = server.url();
    rt().block_on(async {
        let mut tasks = Vec::new();
        for c in 0..50 {
            let url = url.clone();
            tasks.push(tokio::spawn(async move {
                let mut conn = Connection::open(format!("conn-{c}"), url.as_str())
                    .await
                    .unwrap();
                let mut session = Session::begin(&mut conn).await.unwrap();
                let addr = format!("queues/c{c}");
                let mut sender = Sender::attach(&mut session, "tx", addr.as_str())
                    .await
                    .unwrap();
                let mut receiver = Receiver::attach(&mut session, "rx", addr.as_str())
                    .await
                    .unwrap();
                for i in 0..10 {
                    sender.send(format!("{c}-{i}")).await.unwrap();
                }
                for i in 0..10 {
                    let d = receiver.recv::<String>().await.unwrap();
                    assert_eq!(d.body(), &format!("{c}-{i}"));
                    receiver.accept(&d).await.unwrap();
                }
                sender.close().await.unwrap();
                receiver.close().await.unwrap();
                conn.close().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}
