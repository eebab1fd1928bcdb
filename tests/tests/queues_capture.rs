//! What KubeMQ v2.4's capture of messages by open transactions (KMQ-2) must not do to AMQP
//! consumers, on the store's backends — the third being the façade imitating capture — and, for
//! the case that needs no look into the store, on the real KubeMQ where its binary exists. Each
//! case delivers every message, once, without a consumer waiting out Gets for messages that exist
//! (counted by the store as Gets that waited out their timeout short of MaxItems).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use connector::backend::grpc::KubemqGrpc;
use connector::backend::{Backend, Downstream};
use connector::config::Settings;
use connector::kubemq::QueueMessage;
use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::{AmqpValue, Body};
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::TestConnector;

const WAIT: Duration = Duration::from_secs(10);

/// A body as text: an AMQP string (sent over AMQP) or Data sections (sent over gRPC).
fn text(b: &Body<Value>) -> String {
    match b {
        Body::Value(AmqpValue(Value::String(s))) => s.clone(),
        Body::Data(sections) => sections
            .iter()
            .map(|d| String::from_utf8_lossy(&d.0).into_owned())
            .collect(),
        other => format!("{other:?}"),
    }
}

fn rt() -> tokio::runtime::Runtime {
    interop_tests::runtime()
}

async fn receiver(
    conn: &mut ConnectionHandle<()>,
    name: &str,
    queue: &str,
    credit: u32,
) -> (SessionHandle<()>, Receiver) {
    let mut session = Session::begin(conn).await.unwrap();
    let r = Receiver::builder()
        .name(name)
        .source(format!("queues/{queue}"))
        .credit_mode(CreditMode::Auto(credit))
        .attach(&mut session)
        .await
        .unwrap();
    (session, r)
}

async fn send_all(url: &str, queue: &str, bodies: impl IntoIterator<Item = String>) {
    let mut conn = Connection::open("capture-producer", url).await.unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let mut sender = Sender::attach(&mut session, "tx", format!("queues/{queue}"))
        .await
        .unwrap();
    for b in bodies {
        sender.send(b).await.unwrap();
    }
    sender.close().await.unwrap();
    conn.close().await.unwrap();
}

/// Q-32 / Q-34 under capture: a consumer leaves with 20 unsettled deliveries; a new consumer gets
/// all 20 at once, not one per second.
#[test]
fn teardown_returns_everything_at_once() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let url = c.url();
        rt().block_on(async {
            send_all(&url, "cap-td", (0..20).map(|i| format!("t{i}"))).await;
            let mut worker = Connection::open("capture-worker", url.as_str())
                .await
                .unwrap();
            let (_s, mut w) = receiver(&mut worker, "w", "cap-td", 20).await;
            for _ in 0..20 {
                tokio::time::timeout(WAIT, w.recv::<String>())
                    .await
                    .unwrap()
                    .unwrap();
            }
            worker.close().await.unwrap();

            let before = c.store().waited_out_gets();
            let mut conn = Connection::open("capture-after", url.as_str())
                .await
                .unwrap();
            let (_s, mut r) = receiver(&mut conn, "r", "cap-td", 20).await;
            let mut got = HashSet::new();
            for _ in 0..20 {
                let d = tokio::time::timeout(WAIT, r.recv::<String>())
                    .await
                    .expect("a returned message stayed hidden")
                    .unwrap();
                got.insert(d.body().clone());
                r.accept(&d).await.unwrap();
            }
            assert_eq!(got.len(), 20, "{got:?}");
            assert_eq!(
                c.store().waited_out_gets() - before,
                0,
                "a Get waited for messages that were there ({})",
                c.backend()
            );
            conn.close().await.unwrap();
        });
    });
}

/// A consumer holds a delivery while another waits: what arrives meanwhile and is held by the
/// first one's open transaction (which has the room of an earlier, larger Get) reaches the
/// waiting consumer once the first settles, with at most one Get waited out.
#[test]
fn settling_while_another_transaction_is_open() {
    TestConnector::each_store_backend(Settings::default(), |c| {
        let url = c.url();
        rt().block_on(async {
            // A burst first, so that KubeMQ's pooled consumer has room for twenty.
            send_all(&url, "cap-open", (0..20).map(|i| format!("b{i}"))).await;
            let mut fast = Connection::open("capture-fast", url.as_str())
                .await
                .unwrap();
            let (_s2, mut b) = receiver(&mut fast, "fast", "cap-open", 50).await;
            for _ in 0..20 {
                let d = tokio::time::timeout(WAIT, b.recv::<String>())
                    .await
                    .unwrap()
                    .unwrap();
                b.accept(&d).await.unwrap();
            }
            send_all(&url, "cap-open", ["first".to_string()]).await;
            let mut slow = Connection::open("capture-slow", url.as_str())
                .await
                .unwrap();
            let (_s1, mut a) = receiver(&mut slow, "slow", "cap-open", 1).await;
            // Either consumer may get it; the slow one must hold one delivery.
            let held = loop {
                tokio::select! {
                    d = a.recv::<String>() => break d.unwrap(),
                    d = b.recv::<String>() => {
                        let d = d.unwrap();
                        b.accept(&d).await.unwrap();
                        send_all(&url, "cap-open", ["first".to_string()]).await;
                    }
                }
            };
            send_all(&url, "cap-open", (0..30).map(|i| format!("m{i}"))).await;
            // Whatever is not held reaches the other consumer.
            let mut got = HashSet::new();
            while let Ok(d) =
                tokio::time::timeout(Duration::from_millis(1500), b.recv::<String>()).await
            {
                let d = d.unwrap();
                got.insert(d.body().clone());
                b.accept(&d).await.unwrap();
            }
            let before = c.store().waited_out_gets();
            a.accept(&held).await.unwrap();
            // Done: with credit left it would take (and hold) another message.
            a.close().await.unwrap();
            while got.len() < 30 {
                let d = tokio::time::timeout(WAIT, b.recv::<String>())
                    .await
                    .unwrap_or_else(|_| panic!("{} of 30 arrived ({})", got.len(), c.backend()))
                    .unwrap();
                assert!(got.insert(d.body().clone()), "{} came twice", d.body());
                b.accept(&d).await.unwrap();
            }
            let waited = c.store().waited_out_gets() - before;
            assert!(
                waited <= 1,
                "{waited} Gets waited out after the slow consumer settled ({})",
                c.backend()
            );
            slow.close().await.unwrap();
            fast.close().await.unwrap();
        });
    });
}

/// A queue filled by another producer before anyone consumes (so the connector has no count of
/// it) drains through two consumers: every message once, and at most one Get waited out.
#[test]
fn a_filled_queue_drains_without_stalls() {
    const N: usize = 2000;
    TestConnector::each_store_backend(Settings::default(), |c| {
        let url = c.url();
        let facade = c.facade_addr();
        rt().block_on(async {
            let bodies = (0..N).map(|i| format!("f{i}"));
            match facade {
                // Straight to the broker: another producer than this connector.
                Some(addr) => {
                    let other = KubemqGrpc::connect(&addr.to_string(), Default::default()).unwrap();
                    let batch: Vec<QueueMessage> = bodies
                        .map(|b| QueueMessage {
                            client_id: "other-producer".into(),
                            channel: "cap-fill".into(),
                            body: b.into_bytes().into(),
                            ..Default::default()
                        })
                        .collect();
                    for chunk in batch.chunks(500) {
                        let r = other.send_queue(0, chunk.to_vec()).await.unwrap();
                        assert!(r.iter().all(|r| !r.is_error));
                    }
                }
                None => send_all(&url, "cap-fill", bodies).await,
            }
            let before = c.store().waited_out_gets();
            // The store's count when the last message arrived: the consumers' final receives
            // wait on an empty queue, and Gets that wait out then are no stalls.
            let received = Arc::new(AtomicUsize::new(0));
            let at_end = Arc::new(OnceLock::new());
            let mut consumers = Vec::new();
            for i in 0..2 {
                let url = url.clone();
                let (received, at_end, store) =
                    (received.clone(), at_end.clone(), c.store().clone());
                consumers.push(tokio::spawn(async move {
                    let mut conn = Connection::open(format!("drain-{i}"), url.as_str())
                        .await
                        .unwrap();
                    let (_s, mut r) = receiver(&mut conn, "r", "cap-fill", 50).await;
                    let mut got = Vec::new();
                    while let Ok(d) =
                        tokio::time::timeout(Duration::from_secs(3), r.recv::<Body<Value>>()).await
                    {
                        let d = d.unwrap();
                        if received.fetch_add(1, Ordering::SeqCst) + 1 == N {
                            let _ = at_end.set(store.waited_out_gets());
                        }
                        got.push(text(d.body()));
                        r.accept(&d).await.unwrap();
                    }
                    conn.close().await.unwrap();
                    got
                }));
            }
            let mut all = Vec::new();
            for t in consumers {
                all.extend(t.await.unwrap());
            }
            let unique: HashSet<&String> = all.iter().collect();
            assert_eq!(
                (all.len(), unique.len()),
                (N, N),
                "every message once ({})",
                c.backend()
            );
            let waited = at_end.get().copied().unwrap_or(u64::MAX) - before;
            assert!(
                waited <= 1,
                "{waited} Gets waited out while messages were there ({})",
                c.backend()
            );
        });
    });
}

/// Q-12 / Q-14 under KMQ-20: another client of the broker takes a message and gives it back
/// (CloseByClient) while a consumer holds a delivery of an open transaction; KubeMQ moves the
/// message into that transaction, where no Get sees it. The consumer, still holding its
/// delivery, asks for one more and gets the moved message within seconds — and nothing twice:
/// the delivery it holds stays the one it settles.
#[test]
fn a_message_moved_into_a_held_transaction_reaches_its_waiting_consumer() {
    TestConnector::each_backend(Settings::default(), |c| {
        // The move needs a second client of the broker; the embedded store has no other.
        let Some(broker) = c.facade_addr().or_else(|| c.real_kubemq().map(|k| k.grpc)) else {
            return;
        };
        let url = c.url();
        let q = "cap-moved";
        rt().block_on(async {
            send_all(&url, q, ["held".to_string()]).await;
            let mut conn = Connection::open("capture-holder", url.as_str())
                .await
                .unwrap();
            let mut session = Session::begin(&mut conn).await.unwrap();
            let mut r = Receiver::builder()
                .name("holder")
                .source(format!("queues/{q}"))
                .credit_mode(CreditMode::Manual)
                .attach(&mut session)
                .await
                .unwrap();
            r.set_credit(1).await.unwrap();
            let held = tokio::time::timeout(WAIT, r.recv::<Body<Value>>())
                .await
                .expect("the first message")
                .unwrap();
            assert_eq!(text(held.body()), "held");

            let other = KubemqGrpc::connect(&broker.to_string(), Default::default()).unwrap();
            let sent = other
                .send_queue(
                    0,
                    vec![QueueMessage {
                        client_id: "other-client".into(),
                        channel: q.into(),
                        body: b"moved".to_vec().into(),
                        ..Default::default()
                    }],
                )
                .await
                .unwrap();
            assert!(sent.iter().all(|r| !r.is_error));
            let mut d = other.open_downstream().await.unwrap();
            let taken = d.get(q, "other-client", 1, 1000).await.unwrap();
            assert_eq!(taken.messages.len(), 1, "the other client takes it");
            d.close(&taken.transaction_id).await.unwrap();
            // KubeMQ redelivers a moved message 100 ms after the close, to the member with the
            // fewest outstanding messages that has room, else to the first: with no Get waiting
            // by then, that is the consumer's held transaction.
            tokio::time::sleep(Duration::from_millis(500)).await;
            r.set_credit(1).await.unwrap();
            let moved = tokio::time::timeout(Duration::from_secs(15), r.recv::<Body<Value>>())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "the moved message stayed hidden while the consumer held another ({})",
                        c.backend()
                    )
                })
                .unwrap();
            assert_eq!(text(moved.body()), "moved");
            r.set_credit(5).await.unwrap();
            let again = tokio::time::timeout(Duration::from_secs(4), r.recv::<Body<Value>>()).await;
            assert!(
                again.is_err(),
                "a message came twice: {:?} ({})",
                again.map(|d| d.map(|d| text(d.body()))),
                c.backend()
            );
            r.accept(&held).await.unwrap();
            r.accept(&moved).await.unwrap();
            r.close().await.unwrap();
            conn.close().await.unwrap();
        });
        // Both settlements reached the broker: nothing is left to deliver.
        let deadline = std::time::Instant::now() + WAIT;
        while c.queue_depth(q) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "settled messages are still queued ({})",
                c.backend()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    });
}
