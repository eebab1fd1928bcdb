//! The fe2o3-amqp client (crates.io) against the real connector: the Queues concept page's
//! scenarios on every backend (Q-S1 … Q-S4), then what a client library exercises beyond them
//! (a 5 MiB message in 512-byte frames, 200 links on one session, 50 connections at once) on the
//! embedded store.

use std::time::Duration;

use connector::config::Settings;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::definitions::{ReceiverSettleMode, SenderSettleMode};
use fe2o3_amqp::types::messaging::{Data, Message, Outcome};
use fe2o3_amqp::types::primitives::Binary;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::TestConnector;

fn rt() -> tokio::runtime::Runtime {
    interop_tests::runtime()
}

/// Q-S1: 10 sends each complete on `accepted`; credit 10 receives and accepts all; a further
/// receive with a 2 s deadline gets nothing.
#[test]
fn q_s1_send_receive_accept() {
    TestConnector::each_backend(Settings::default(), |c| {
        let url = c.url();
        rt().block_on(async {
            let mut conn = Connection::open("fe2o3-q-s1", url.as_str()).await.unwrap();
            let mut session = Session::begin(&mut conn).await.unwrap();
            let mut sender = Sender::attach(&mut session, "tx", "queues/fe-q-s1")
                .await
                .unwrap();
            for i in 0..10 {
                let o = sender.send(format!("order {i}")).await.unwrap();
                assert!(matches!(o, Outcome::Accepted(_)), "{o:?}");
            }
            let mut receiver = Receiver::builder()
                .name("rx")
                .source("queues/fe-q-s1")
                .credit_mode(CreditMode::Auto(10))
                .attach(&mut session)
                .await
                .unwrap();
            for i in 0..10 {
                let d = receiver.recv::<String>().await.unwrap();
                assert_eq!(d.body(), &format!("order {i}"));
                receiver.accept(&d).await.unwrap();
            }
            let more =
                tokio::time::timeout(Duration::from_secs(2), receiver.recv::<String>()).await;
            assert!(more.is_err(), "the queue is empty");
            conn.close().await.unwrap();
        });
    });
}

/// Q-S2 / Q-17: first deliveries are delivery-count 0; a released message returns with
/// delivery-count ≥ 1; a rejected one never returns.
#[test]
fn q_s2_outcomes_and_redelivery() {
    TestConnector::each_backend(Settings::default(), |c| {
        let url = c.url();
        rt().block_on(async {
            let mut conn = Connection::open("fe2o3-q-s2", url.as_str()).await.unwrap();
            let mut session = Session::begin(&mut conn).await.unwrap();
            let mut sender = Sender::attach(&mut session, "tx", "queues/fe-q-s2")
                .await
                .unwrap();
            for b in ["release-me", "reject-me", "accept-me"] {
                sender.send(b).await.unwrap();
            }
            let mut receiver = Receiver::attach(&mut session, "rx", "queues/fe-q-s2")
                .await
                .unwrap();
            for _ in 0..3 {
                let d = receiver.recv::<String>().await.unwrap();
                let h = d.message().header.clone().unwrap_or_default();
                assert_eq!(
                    (h.delivery_count, h.first_acquirer),
                    (0, true),
                    "{}",
                    d.body()
                );
                match d.body().as_str() {
                    "release-me" => receiver.release(&d).await.unwrap(),
                    "reject-me" => receiver.reject(&d, None).await.unwrap(),
                    _ => receiver.accept(&d).await.unwrap(),
                }
            }
            let d = receiver.recv::<String>().await.unwrap();
            let h = d.message().header.clone().unwrap_or_default();
            assert_eq!(d.body(), "release-me");
            assert!(h.delivery_count >= 1 && !h.first_acquirer);
            receiver.accept(&d).await.unwrap();
            let more =
                tokio::time::timeout(Duration::from_millis(1500), receiver.recv::<String>()).await;
            assert!(more.is_err(), "reject-me never returns");
            conn.close().await.unwrap();
        });
    });
}

/// Q-S3: pre-settled and unsettled produce drained by one `first` receiver; `second` refused.
#[test]
fn q_s3_settle_modes() {
    TestConnector::each_backend(Settings::default(), |c| {
        let url = c.url();
        rt().block_on(async {
            let mut conn = Connection::open("fe2o3-q-s3", url.as_str()).await.unwrap();
            let mut session = Session::begin(&mut conn).await.unwrap();
            let mut pre = Sender::builder()
                .name("pre")
                .target("queues/fe-q-s3")
                .sender_settle_mode(SenderSettleMode::Settled)
                .attach(&mut session)
                .await
                .unwrap();
            for i in 0..10 {
                pre.send(format!("pre {i}")).await.unwrap();
            }
            let mut sender = Sender::attach(&mut session, "unsettled", "queues/fe-q-s3")
                .await
                .unwrap();
            for i in 0..10 {
                sender.send(format!("unsettled {i}")).await.unwrap();
            }
            let mut receiver = Receiver::builder()
                .name("rx")
                .source("queues/fe-q-s3")
                .credit_mode(CreditMode::Auto(20))
                .attach(&mut session)
                .await
                .unwrap();
            let mut got = std::collections::HashSet::new();
            for _ in 0..20 {
                let d = tokio::time::timeout(Duration::from_secs(5), receiver.recv::<String>())
                    .await
                    .unwrap()
                    .unwrap();
                got.insert(d.body().clone());
                receiver.accept(&d).await.unwrap();
            }
            assert_eq!(got.len(), 20);
            let second = Receiver::builder()
                .name("second")
                .source("queues/fe-q-s3")
                .receiver_settle_mode(ReceiverSettleMode::Second)
                .attach(&mut session)
                .await;
            let err = format!("{:?}", second.err());
            assert!(
                err.contains("NotImplemented") || err.contains("not-implemented"),
                "{err}"
            );
            conn.close().await.unwrap();
        });
    });
}

/// Q-S4: 1 MiB at max-frame-size 4096, stored after the last fragment, one `accepted`, received
/// with the same length and bytes.
#[test]
fn q_s4_large_message() {
    TestConnector::each_backend(Settings::default(), |c| {
        let url = c.url();
        let body: Vec<u8> = (0..1_048_576u32)
            .map(|i| (i.wrapping_mul(7).wrapping_add(3) % 256) as u8)
            .collect();
        let sent = body.clone();
        let got = rt().block_on(async move {
            let mut conn = Connection::builder()
                .container_id("fe2o3-q-s4")
                .max_frame_size(4096)
                .open(url.as_str())
                .await
                .unwrap();
            let mut session = Session::begin(&mut conn).await.unwrap();
            let mut sender = Sender::attach(&mut session, "tx", "queues/fe-q-s4")
                .await
                .unwrap();
            let o = sender
                .send(Message::builder().data(Binary::from(sent)).build())
                .await
                .unwrap();
            assert!(matches!(o, Outcome::Accepted(_)));
            let mut receiver = Receiver::attach(&mut session, "rx", "queues/fe-q-s4")
                .await
                .unwrap();
            let d = receiver.recv::<Data>().await.unwrap();
            receiver.accept(&d).await.unwrap();
            let got = d.body().0.to_vec();
            conn.close().await.unwrap();
            got
        });
        assert!(got == body, "1 MiB body differs");
    });
}

/// A 5 MiB message at max-frame-size 512 goes both ways bit-exactly (XFER-1, XFER-3, CONN-8).
#[test]
fn five_mib_at_max_frame_512() {
    let c = TestConnector::start(Settings::default());
    let url = c.url();
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
    let c = TestConnector::start(Settings::default());
    let url = c.url();
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
    let c = TestConnector::start(Settings::default());
    let url = c.url();
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

/// A message's trace context (`traceparent`, `tracestate`, `Diagnostic-Id` among its application
/// properties) is kept through the broker: a KubeMQ client taking the message sees it as the
/// message's tags, and an AMQP consumer gets every application property unchanged, on every
/// backend, the real KubeMQ included.
#[test]
fn trace_context_is_kept_through_the_broker() {
    use fe2o3_amqp::types::messaging::ApplicationProperties;
    use fe2o3_amqp::types::primitives::SimpleValue;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let diagnostic = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let traced = |n: &str| {
        Message::builder()
            .application_properties(
                ApplicationProperties::builder()
                    .insert("traceparent", traceparent)
                    .insert("tracestate", "congo=t61rcWkgMzE")
                    .insert("Diagnostic-Id", diagnostic)
                    .insert("order", n)
                    .build(),
            )
            .data(Binary::from(n.as_bytes().to_vec()))
            .build()
    };
    TestConnector::each_backend(Settings::default(), |c| {
        let url = c.url();
        rt().block_on(async {
            let mut conn = Connection::open("fe2o3-trace", url.as_str()).await.unwrap();
            let mut session = Session::begin(&mut conn).await.unwrap();
            let mut sender = Sender::attach(&mut session, "tx", "queues/fe-trace")
                .await
                .unwrap();
            for n in ["1", "2"] {
                let o = sender.send(traced(n)).await.unwrap();
                assert!(matches!(o, Outcome::Accepted(_)), "{o:?}");
            }
            let mut receiver = Receiver::builder()
                .name("rx")
                .source("queues/fe-trace")
                .credit_mode(CreditMode::Manual)
                .attach(&mut session)
                .await
                .unwrap();
            receiver.set_credit(1).await.unwrap();
            let d = receiver.recv::<Data>().await.unwrap();
            let app = d.message().application_properties.clone().expect("kept");
            let want = [
                ("traceparent", traceparent),
                ("tracestate", "congo=t61rcWkgMzE"),
                ("Diagnostic-Id", diagnostic),
                ("order", "1"),
            ];
            assert_eq!(app.0.len(), want.len(), "{app:?}");
            for (k, v) in want {
                assert_eq!(app.0.get(k), Some(&SimpleValue::String(v.into())), "{k}");
            }
            receiver.accept(&d).await.unwrap();
            receiver.close().await.unwrap();
            conn.close().await.unwrap();
        });
        let taken = c.take_from_broker("fe-trace").expect("the second message");
        assert_eq!(taken.body.as_ref(), b"2");
        assert_eq!(
            taken.tags,
            std::collections::HashMap::from([
                ("traceparent".to_string(), traceparent.to_string()),
                ("tracestate".to_string(), "congo=t61rcWkgMzE".to_string()),
                ("Diagnostic-Id".to_string(), diagnostic.to_string()),
            ]),
            "on the {} backend",
            c.backend()
        );
    });
}
