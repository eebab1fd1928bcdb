//! Store semantics, each test citing the KubeMQ behaviour it pins (`KMQ-` in
//! docs/kubemq-behaviour.md). Real files, real fsync, real time (the minimum Get wait is 1 s, so
//! some tests take a second).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::facade::capture::Capture;
use crate::facade::downstream::Downstream;
use crate::kubemq::{
    QueueMessage, QueueMessagePolicy, QueuesDownstreamRequest, QueuesDownstreamRequestType as Op,
};
use crate::store::session::TxnWatcher;

/// A store on a fresh folder of real files, and the runtime a test drives it on.
struct Fixture {
    /// Shared with `run`, which keeps the folder until the body is done even when the body
    /// drops its fixture.
    dir: Arc<tempfile::TempDir>,
    segment_bytes: u64,
}

impl Fixture {
    /// A fresh folder; the store gets the production segment size.
    fn new() -> Fixture {
        Fixture::with_segments(super::log::SEGMENT_BYTES)
    }

    /// A fresh folder; the store closes its segments at `segment_bytes` (small ones make
    /// reclaim happen often).
    fn with_segments(segment_bytes: u64) -> Fixture {
        Fixture {
            dir: Arc::new(tempfile::tempdir().unwrap()),
            segment_bytes,
        }
    }

    /// The store's folder.
    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Opens the store on the folder: the first time, or again after a close (a restart).
    fn open(&self) -> (Arc<Store>, OpenReport) {
        Store::open_with(self.path(), self.segment_bytes).unwrap()
    }

    /// Opens the store and runs `body` with it on a two-thread runtime.
    fn run<Fut: std::future::Future<Output = ()>>(
        self,
        body: impl FnOnce(Fixture, Arc<Store>) -> Fut,
    ) {
        self.run_unopened(|f| {
            let (store, _) = f.open();
            body(f, store)
        })
    }

    /// Runs `body` on a two-thread runtime; it opens the store itself (to read what opening
    /// found).
    fn run_unopened<Fut: std::future::Future<Output = ()>>(
        self,
        body: impl FnOnce(Fixture) -> Fut,
    ) {
        let _folder = self.dir.clone();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(body(self));
    }
}

fn msg(queue: &str, body: &str) -> QueueMessage {
    QueueMessage {
        client_id: "tester".into(),
        channel: queue.into(),
        body: body.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

fn with_policy(mut m: QueueMessage, p: QueueMessagePolicy) -> QueueMessage {
    m.policy = Some(p);
    m
}

fn bodies(d: &[Delivered]) -> Vec<String> {
    d.iter()
        .map(|x| String::from_utf8_lossy(&x.message.body).into_owned())
        .collect()
}

fn req(op: Op) -> QueuesDownstreamRequest {
    QueuesDownstreamRequest {
        request_id: "r".into(),
        client_id: "tester".into(),
        request_type_data: op as i32,
        ..Default::default()
    }
}

fn get_req(queue: &str, max: i32, wait_ms: i32) -> QueuesDownstreamRequest {
    QueuesDownstreamRequest {
        channel: queue.into(),
        max_items: max,
        wait_timeout: wait_ms,
        ..req(Op::Get)
    }
}

fn settle(op: Op, txn: &str, seqs: &[i64]) -> QueuesDownstreamRequest {
    QueuesDownstreamRequest {
        ref_transaction_id: txn.into(),
        sequence_range: seqs.to_vec(),
        ..req(op)
    }
}

const WAIT: Duration = Duration::from_millis(1000);

/// Waits until `condition` holds, checking every few milliseconds; fails naming `what` if it
/// does not within 30 s (a guard against hanging, not a speed check).
async fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// KMQ-4 / KMQ-6 / KMQ-9: sequences from 1, ReceiveCount 1 on first delivery, stamped attributes,
/// MaxReceiveCount 0 → 1024; a full batch returns at once; acked messages are gone.
#[test]
fn send_get_ack() {
    Fixture::new().run(|_, store| async move {
        let r = store
            .send(vec![msg("q", "a"), msg("q", "b"), msg("q", "c")])
            .await;
        assert!(r
            .iter()
            .all(|r| !r.is_error && r.sent_at > 0 && !r.message_id.is_empty()));
        let got = store.get("q", 3, WAIT).await;
        assert_eq!(
            store.waited_out_gets(),
            0,
            "a full batch returns at once, not at its timeout"
        );
        assert_eq!(bodies(&got), ["a", "b", "c"]);
        assert_eq!(
            got.iter().map(|d| d.sequence.get()).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        let a = got[0].message.attributes.clone().unwrap();
        assert_eq!((a.sequence, a.receive_count), (1, 1));
        assert!(a.timestamp > 0);
        assert_eq!(
            got[0].message.policy.as_ref().unwrap().max_receive_count,
            1024
        );
        store.ack("q", &[Seq::new(1), Seq::new(2), Seq::new(3)]);
        assert_eq!(store.ready_count("q") + store.locked_count("q"), 0);
        let r = store.send(vec![msg("q", "d")]).await;
        assert!(!r[0].is_error);
        let got = store.get("q", 1, WAIT).await;
        assert_eq!(got[0].sequence.get(), 4, "sequences are never reused");
    });
}

/// KMQ-6: a Get with MaxItems > available waits the full WaitTimeout; MaxItems 1 returns
/// as soon as one message arrives.
#[test]
fn get_waits_for_batch_or_timeout() {
    Fixture::new().run(|_, store| async move {
        store.send(vec![msg("q", "a"), msg("q", "b")]).await;
        let got = store.get("q", 5, WAIT).await;
        assert_eq!(got.len(), 2);
        assert_eq!(
            store.waited_out_gets(),
            1,
            "no early return with a partial batch: it ended at its timeout"
        );
        let s2 = store.clone();
        let waiter = tokio::spawn(async move { s2.get("q2", 1, Duration::from_secs(60)).await });
        until("the Get waits", || store.waiting_gets() == 1).await;
        store.send(vec![msg("q2", "x")]).await;
        let got = waiter.await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            store.waited_out_gets(),
            1,
            "MaxItems 1 returned on arrival, not at its timeout"
        );
    });
}

/// KMQ-4: validation order and texts, each failure in-band; valid messages still stored.
#[test]
fn send_validation() {
    Fixture::new().run(|_, store| async move {
        let mut no_client = msg("q", "x");
        no_client.client_id.clear();
        let cases = vec![
            (no_client, StoreError::ClientIdEmpty),
            (msg("bad queue", "x"), StoreError::QueueNameInvalid),
            (msg("q.", "x"), StoreError::QueueNameInvalid),
            (msg("q", ""), StoreError::MessageEmpty),
            (
                with_policy(
                    msg("q", "x"),
                    QueueMessagePolicy {
                        expiration_seconds: 43_201,
                        ..Default::default()
                    },
                ),
                StoreError::ExpirationInvalid,
            ),
            (
                with_policy(
                    msg("q", "x"),
                    QueueMessagePolicy {
                        max_receive_count: 1025,
                        ..Default::default()
                    },
                ),
                StoreError::MaxReceiveInvalid,
            ),
            (
                with_policy(
                    msg("q", "x"),
                    QueueMessagePolicy {
                        delay_seconds: -1,
                        ..Default::default()
                    },
                ),
                StoreError::DelayInvalid,
            ),
            (
                with_policy(
                    msg("q", "x"),
                    QueueMessagePolicy {
                        max_receive_queue: "d l q".into(),
                        ..Default::default()
                    },
                ),
                StoreError::QueueNameInvalid,
            ),
        ];
        let (msgs, texts): (Vec<_>, Vec<_>) = cases.into_iter().unzip();
        let mut all = msgs;
        all.push(msg("q", "valid"));
        let r = store.send(all).await;
        for (res, text) in r.iter().zip(texts) {
            assert!(res.is_error);
            assert_eq!(res.error, text.to_string());
            assert!(!res.message_id.is_empty(), "MessageID is set even on error");
        }
        assert!(!r.last().unwrap().is_error);
        let mut meta_only = msg("q", "");
        meta_only.metadata = "m".into();
        assert!(
            !store.send(vec![meta_only]).await[0].is_error,
            "metadata alone is a message"
        );
        assert_eq!(store.ready_count("q"), 2);
    });
}

/// KMQ-11, KMQ-12: a downstream that ends while a NAck it sent is still being written leaves
/// the NAck's copy alone in the queue: the original it NAcked does not come back beside it.
#[test]
fn a_stream_that_ends_during_a_nack_leaves_one_copy() {
    Fixture::new().run(|_, store| async move {
        for round in 0..10 {
            store.send(vec![msg("q", "m")]).await;
            let mut ds = Downstream::new(store.clone());
            let r = ds.handle(get_req("q", 1, 1000)).await.unwrap();
            let seq = r.messages[0].attributes.as_ref().unwrap().sequence as i64;
            // Polled once, so the NAck's write is under way, then dropped with its stream.
            let nack = ds.handle(settle(Op::NAckRange, &r.transaction_id, &[seq]));
            let _ = tokio::time::timeout(Duration::ZERO, nack).await;
            drop(ds);
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut ds = Downstream::new(store.clone());
            let r = ds.handle(get_req("q", 2, 300)).await.unwrap();
            assert_eq!(
                r.messages.len(),
                1,
                "round {round}: one message, not {:?}",
                r.messages
            );
            ds.handle(settle(Op::AckAll, &r.transaction_id, &[])).await;
        }
    });
}

/// KMQ-11: NAck re-queues a copy at the tail with a new sequence and ReceiveCount + 1; with
/// MaxReceiveCount 2 and a MaxReceiveQueue, the second NAck dead-letters it (count 0, ReRouted,
/// ReRoutedFromQueue, policy zeroed).
#[test]
fn nack_requeue_and_dead_letter() {
    Fixture::new().run(|_, store| async move {
        let p = QueueMessagePolicy {
            max_receive_count: 2,
            max_receive_queue: "dlq".into(),
            ..Default::default()
        };
        store
            .send(vec![with_policy(msg("q", "poison"), p), msg("q", "other")])
            .await;
        let mut ds = Downstream::new(store.clone());
        let r = ds.handle(get_req("q", 1, 1000)).await.unwrap();
        assert_eq!(r.messages[0].attributes.as_ref().unwrap().receive_count, 1);
        assert!(
            ds.handle(settle(Op::NAckRange, &r.transaction_id, &[1]))
                .await
                .is_none(),
            "success has no response"
        );
        let r = ds.handle(get_req("q", 2, 1000)).await.unwrap();
        let seqs: Vec<u64> = r
            .messages
            .iter()
            .map(|m| m.attributes.as_ref().unwrap().sequence)
            .collect();
        assert_eq!(
            seqs,
            [2, 3],
            "the NAck copy went to the tail with a new sequence"
        );
        let copy = &r.messages[1];
        assert_eq!(copy.attributes.as_ref().unwrap().receive_count, 2);
        assert_eq!(r.messages[0].message_id.len(), copy.message_id.len());
        assert!(ds
            .handle(settle(Op::AckRange, &r.transaction_id, &[2]))
            .await
            .is_none());
        assert!(ds
            .handle(settle(Op::NAckRange, &r.transaction_id, &[3]))
            .await
            .is_none());
        assert_eq!(store.ready_count("q"), 0);
        let r = ds.handle(get_req("dlq", 1, 1000)).await.unwrap();
        let d = &r.messages[0];
        let a = d.attributes.as_ref().unwrap();
        assert!(a.re_routed);
        assert_eq!(a.re_routed_from_queue, "q");
        assert_eq!(a.receive_count, 1, "stored with count 0, shown as 1");
        assert_eq!(
            d.policy.clone().unwrap_or_default(),
            QueueMessagePolicy::default()
        );
        assert_eq!(&d.body[..], b"poison");
    });
}

/// KMQ-11: MaxReceiveCount 1 without a dead-letter queue: the first NAck drops the message.
#[test]
fn nack_drop_without_dead_letter_queue() {
    Fixture::new().run(|_, store| async move {
        store
            .send(vec![with_policy(
                msg("q", "x"),
                QueueMessagePolicy {
                    max_receive_count: 1,
                    ..Default::default()
                },
            )])
            .await;
        let mut ds = Downstream::new(store.clone());
        let r = ds.handle(get_req("q", 1, 1000)).await.unwrap();
        ds.handle(settle(Op::NAckAll, &r.transaction_id, &[])).await;
        assert_eq!(store.ready_count("q") + store.locked_count("q"), 0);
    });
}

/// KMQ-12: closing a stream (or CloseByClient) returns unsettled messages with the same sequence
/// and no ReceiveCount increment, ahead of newer messages.
#[test]
fn close_returns_without_increment() {
    Fixture::new().run(|_, store| async move {
        store.send(vec![msg("q", "a"), msg("q", "b")]).await;
        {
            let mut ds = Downstream::new(store.clone());
            let r = ds.handle(get_req("q", 2, 1000)).await.unwrap();
            assert_eq!(r.messages.len(), 2);
        } // stream ends
        store.send(vec![msg("q", "c")]).await;
        let mut ds = Downstream::new(store.clone());
        let r = ds.handle(get_req("q", 1, 1000)).await.unwrap();
        let a = r.messages[0].attributes.clone().unwrap();
        assert_eq!((a.sequence, a.receive_count), (1, 1));
        assert!(ds
            .handle(settle(Op::CloseByClient, &r.transaction_id, &[]))
            .await
            .is_none());
        let r = ds.handle(get_req("q", 3, 1000)).await.unwrap();
        let seqs: Vec<u64> = r
            .messages
            .iter()
            .map(|m| m.attributes.as_ref().unwrap().sequence)
            .collect();
        assert_eq!(seqs, [1, 2, 3]);
    });
}

/// A session that lives as long as its consumers (the connector's shared Get loop) keeps what it
/// needs and no more: every settled transaction leaves the table, and only the last CLOSED_KEPT
/// closed ids are remembered (settling one still says "closed response"; an older one gets the
/// unknown-id error, whose text covers completed transactions). Before, each Get left its entry
/// for good: memory grew with every Get for the session's whole life.
#[test]
fn a_long_lived_session_keeps_a_bounded_table() {
    use super::session::CLOSED_KEPT;
    Fixture::new().run(|_, store| async move {
        let n = CLOSED_KEPT + 10;
        store
            .send((0..n).map(|i| msg("long", &i.to_string())).collect())
            .await;
        let mut ds = Downstream::new(store.clone());
        let mut ids = Vec::new();
        for _ in 0..n {
            let r = ds.handle(get_req("long", 1, 1000)).await.unwrap();
            let seq = r.messages[0].attributes.as_ref().unwrap().sequence as i64;
            assert!(ds
                .handle(settle(Op::AckRange, &r.transaction_id, &[seq]))
                .await
                .is_none());
            ids.push(r.transaction_id);
        }
        assert_eq!(ds.session().table_sizes(), (0, CLOSED_KEPT));
        let recent = ds
            .handle(settle(Op::AckAll, &ids[n - 1], &[]))
            .await
            .unwrap();
        assert_eq!(recent.error, "cannot ack messages with closed response ");
        let oldest = ds.handle(settle(Op::AckAll, &ids[0], &[])).await.unwrap();
        assert_eq!(
            oldest.error,
            "transaction is completed or transaction id not found"
        );
        assert_eq!(store.ready_count("long") + store.locked_count("long"), 0);
    });
}

/// KMQ-7: settlement errors, texts and partial application; ActiveOffsets; unknown requests.
#[test]
fn settlement_errors() {
    Fixture::new().run(|_, store| async move {
        store
            .send((0..4).map(|i| msg("q", &i.to_string())).collect())
            .await;
        let mut ds = Downstream::new(store.clone());
        let r = ds.handle(get_req("q", 4, 1000)).await.unwrap();
        let t = r.transaction_id.clone();
        let e = ds.handle(settle(Op::AckRange, &t, &[])).await.unwrap();
        assert_eq!(
            (e.is_error, e.error.as_str()),
            (true, "cannot ack empty list of of offsets")
        );
        // 1 is applied, 9 is invalid, 2 is skipped.
        let e = ds
            .handle(settle(Op::AckRange, &t, &[1, 9, 2]))
            .await
            .unwrap();
        assert_eq!(e.error, "invalid ack sequence id 9");
        assert_eq!(e.transaction_id, t);
        assert_eq!(e.request_type_data, Op::AckRange as i32);
        let off = ds.handle(settle(Op::ActiveOffsets, &t, &[])).await.unwrap();
        let mut offs = off.active_offsets.clone();
        offs.sort_unstable();
        assert_eq!(offs, [2, 3, 4]);
        let e = ds.handle(settle(Op::NAckRange, &t, &[2, 2])).await.unwrap();
        assert_eq!(
            e.error, "invalid nack sequence id 2",
            "a duplicate is invalid"
        );
        let e = ds.handle(settle(Op::ReQueueRange, &t, &[3])).await.unwrap();
        assert_eq!(
            e.error,
            "cannot requeue messages with empty channel destination "
        );
        assert!(ds.handle(settle(Op::AckAll, &t, &[])).await.is_none());
        for (op, text) in [
            (Op::AckAll, "cannot ack messages with closed response "),
            (Op::AckRange, "cannot ack messages with closed response "),
            (Op::NAckRange, "cannot nack messages with closed response "),
            (
                Op::ReQueueRange,
                "cannot requeue messages with closed response ",
            ),
            (
                Op::ActiveOffsets,
                "cannot get active offsets with closed response ",
            ),
        ] {
            let e = ds.handle(settle(op, &t, &[1])).await.unwrap();
            assert_eq!(e.error, text, "{op:?}");
        }
        assert!(
            ds.handle(settle(Op::CloseByClient, &t, &[]))
                .await
                .is_none(),
            "ignored when closed"
        );
        let e = ds.handle(settle(Op::AckAll, "nope", &[])).await.unwrap();
        assert_eq!(
            (e.error.as_str(), e.transaction_id.as_str()),
            (
                "transaction is completed or transaction id not found",
                "nope"
            )
        );
        for op in [
            Op::TransactionStatus,
            Op::CloseByServer,
            Op::PollRequestTypeUnknown,
        ] {
            let e = ds.handle(settle(op, &t, &[])).await.unwrap();
            assert_eq!(
                (
                    e.error.as_str(),
                    e.request_type_data,
                    e.transaction_id.as_str()
                ),
                ("request unknown", 0, t.as_str()),
                "the referenced transaction is echoed, as a real KubeMQ does"
            );
        }
        // An empty Get is a success whose transaction is already closed.
        let r = ds.handle(get_req("empty", 1, 1000)).await.unwrap();
        assert!(!r.is_error && r.messages.is_empty() && !r.transaction_id.is_empty());
        let e = ds
            .handle(settle(Op::AckAll, &r.transaction_id, &[]))
            .await
            .unwrap();
        assert_eq!(e.error, "cannot ack messages with closed response ");
        // Get validation.
        let mut g = get_req("q", 1, 1000);
        g.client_id.clear();
        assert_eq!(
            ds.handle(g).await.unwrap().error,
            StoreError::ClientIdEmpty.to_string()
        );
        assert_eq!(
            ds.handle(get_req("a b", 1, 1000)).await.unwrap().error,
            StoreError::QueueNameInvalid.to_string()
        );
        assert_eq!(
            ds.handle(get_req("a:b", 1, 1000)).await.unwrap().error,
            StoreError::CannotSubscribe.to_string()
        );
    });
}

/// KMQ-7 ReQueue: a fresh send of the copy to another queue (count 0, new sequence there).
/// KMQ-6: AutoAck acks before replying.
#[test]
fn requeue_and_auto_ack() {
    Fixture::new().run(|_, store| async move {
        store
            .send(vec![msg("q", "move me"), msg("auto", "x")])
            .await;
        let mut ds = Downstream::new(store.clone());
        let r = ds.handle(get_req("q", 1, 1000)).await.unwrap();
        let mut rq = settle(Op::ReQueueRange, &r.transaction_id, &[1]);
        rq.re_queue_channel = "other".into();
        assert!(ds.handle(rq).await.is_none());
        assert_eq!(store.ready_count("q") + store.locked_count("q"), 0);
        let r = ds.handle(get_req("other", 1, 1000)).await.unwrap();
        let a = r.messages[0].attributes.clone().unwrap();
        assert_eq!((a.sequence, a.receive_count, a.re_routed), (1, 1, false));
        let mut g = get_req("auto", 1, 1000);
        g.auto_ack = true;
        let r = ds.handle(g).await.unwrap();
        assert_eq!(r.messages.len(), 1);
        assert_eq!(store.locked_count("auto") + store.ready_count("auto"), 0);
        let e = ds
            .handle(settle(Op::AckAll, &r.transaction_id, &[]))
            .await
            .unwrap();
        assert!(e.is_error, "an AutoAck transaction is closed");
    });
}

/// KMQ-13: a delayed message is invisible until due, then released with a new sequence,
/// DelayedTo 0 and DelaySeconds 0; KMQ-14: an expired message is dropped silently at delivery.
#[test]
fn delay_and_expiration() {
    Fixture::new().run(|_, store| async move {
        let r = store
            .send(vec![with_policy(
                msg("q", "later"),
                QueueMessagePolicy {
                    delay_seconds: 60,
                    ..Default::default()
                },
            )])
            .await;
        assert!(r[0].delayed_to > r[0].sent_at);
        assert_eq!(store.ready_count("q"), 0);
        store.release_due(now_ns()).await;
        assert_eq!(store.ready_count("q"), 0, "not yet due");
        store.release_due(now_ns() + 61_000_000_000).await;
        let got = store.get("q", 1, WAIT).await;
        let m = &got[0].message;
        assert_eq!(m.attributes.as_ref().unwrap().delayed_to, 0);
        assert_eq!(m.policy.as_ref().unwrap().delay_seconds, 0);
        store.ack("q", &[got[0].sequence]);

        store
            .send(vec![
                with_policy(
                    msg("q", "short-lived"),
                    QueueMessagePolicy {
                        expiration_seconds: 1,
                        ..Default::default()
                    },
                ),
                msg("q", "keeper"),
            ])
            .await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let got = store.get("q", 2, WAIT).await;
        assert_eq!(
            bodies(&got),
            ["keeper"],
            "the expired message counts toward MaxItems but is not delivered"
        );
        assert_eq!(store.ready_count("q") + store.locked_count("q"), 1);
    });
}

/// Polls `op` once; `true` when it is still under way (its write on its way to the log),
/// `false` when the writer was quicker than the poll.
pub(super) async fn in_flight<F: std::future::Future>(op: std::pin::Pin<&mut F>) -> bool {
    let mut op = op;
    std::future::poll_fn(|cx| std::task::Poll::Ready(op.as_mut().poll(cx).is_pending())).await
}

/// A send whose write fails answers every message it placed with the storage failure, in its
/// place, and counts none of them; a message refused up front keeps its own error.
#[test]
fn a_failed_write_fails_every_placed_message() {
    Fixture::new().run(|_, store| async move {
        store.close();
        let sent = store
            .send_reporting(vec![msg("q", "a"), msg("", "no channel"), msg("q", "b")])
            .await;
        assert!(
            sent.storage_failed,
            "the batch says its write failed (HaveErrors)"
        );
        let r = sent.results;
        assert_eq!(r.len(), 3);
        for i in [0, 2] {
            assert!(r[i].is_error, "{:?}", r[i]);
            assert!(
                r[i].error.starts_with("Error 500: storage failure"),
                "{}",
                r[i].error
            );
            assert_eq!(r[i].sent_at, 0);
        }
        assert_eq!(r[1].error, StoreError::QueueNameInvalid.to_string());
        assert_eq!(store.ready_count("q"), 0);
        let refused = store.send_reporting(vec![msg("", "no channel")]).await;
        assert!(
            !refused.storage_failed,
            "a refusal alone is no failed write"
        );
    });
}

/// A send or a NAck whose caller goes away while it is written (a gRPC client that hangs up)
/// still takes effect in the queues, not only in the log: the sent message is delivered now,
/// and the NAcked one comes back as its new copy with the original no longer locked.
#[test]
fn abandoned_writes_still_take_effect() {
    Fixture::new().run(|_, store| async move {
        let mut raced = 0;
        for i in 0..20 {
            let q = format!("gone-{i}");
            {
                let send = store.send(vec![msg(&q, "abandoned")]);
                tokio::pin!(send);
                raced += usize::from(in_flight(send.as_mut()).await);
            }
            let got = store.get(&q, 1, WAIT).await;
            assert_eq!(bodies(&got), ["abandoned"], "{q}");
            {
                let nack = store.nack(&q, got[0].sequence);
                tokio::pin!(nack);
                raced += usize::from(in_flight(nack.as_mut()).await);
            }
            let again = store.get(&q, 1, WAIT).await;
            assert_eq!(bodies(&again), ["abandoned"], "{q}");
            assert!(again[0].sequence > got[0].sequence, "the NAck's copy");
            store.ack(&q, &[again[0].sequence]);
            assert_eq!(store.ready_count(&q) + store.locked_count(&q), 0, "{q}");
        }
        assert!(raced > 0, "no write was caught in flight");
    });
}

/// Checklist "MUST keep ready, in-flight and delayed messages across a restart"; in-flight
/// messages come back with the same sequence and no ReceiveCount change; sequences continue.
#[test]
fn restart_keeps_everything() {
    Fixture::new().run(|f, store| async move {
        store
            .send(vec![msg("q", "a"), msg("q", "b"), msg("q", "c")])
            .await;
        store
            .send(vec![with_policy(
                msg("q", "d"),
                QueueMessagePolicy {
                    delay_seconds: 3600,
                    ..Default::default()
                },
            )])
            .await;
        let got = store.get("q", 2, WAIT).await;
        store.ack("q", &[got[0].sequence]);
        // "b" stays in flight; drop without returning it, as a crash would.
        store.close();
        drop(store);
        let (store, report) = f.open();
        assert!(report.dropped.is_empty());
        assert_eq!((report.ready, report.delayed), (2, 1));
        let got = store.get("q", 2, WAIT).await;
        assert_eq!(bodies(&got), ["b", "c"]);
        let a = got[0].message.attributes.clone().unwrap();
        assert_eq!((a.sequence, a.receive_count), (2, 1));
        let r = store.send(vec![msg("q", "e")]).await;
        assert!(!r[0].is_error);
        store.release("q", &[Seq::new(2), Seq::new(3)]);
        let got = store.get("q", 3, WAIT).await;
        assert_eq!(
            got.iter().map(|d| d.sequence.get()).collect::<Vec<_>>(),
            [2, 3, 4]
        );
    });
}

/// A torn tail (a crash mid-write) is detected and truncated; a corrupt record is dropped and
/// reported; no garbage is ever returned.
#[test]
fn torn_and_corrupt_segments() {
    Fixture::new().run(|f, store| async move {
        store.send(vec![msg("q", "one"), msg("q", "two")]).await;
        store.close();
        drop(store);
        let seg = std::fs::read_dir(f.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .max()
            .unwrap();
        let mut data = std::fs::read(&seg).unwrap();
        data.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3, 4, 9, 9]); // a record cut short
        std::fs::write(&seg, &data).unwrap();
        let (store, report) = f.open();
        assert_eq!(report.dropped.len(), 1);
        assert_eq!(report.dropped[0].reason, "torn tail");
        assert_eq!(report.ready, 2);
        store.close();
        drop(store);
        // Flip a byte inside the second message's record of that segment.
        let mut data = std::fs::read(&seg).unwrap();
        let pos = data.windows(3).position(|w| w == b"two").unwrap();
        data[pos] ^= 0x20;
        std::fs::write(&seg, &data).unwrap();
        let (store, report) = f.open();
        assert_eq!(report.dropped.len(), 1);
        assert_eq!(report.dropped[0].reason, "corrupt record");
        let got = store.get("q", 2, WAIT).await;
        assert_eq!(bodies(&got), ["one"], "nothing after the damage is misread");
    });
}

/// Space is reclaimed: once every message of a segment is acked, the segment goes; disk use
/// stays bounded under steady produce/consume.
#[test]
fn segments_reclaimed() {
    Fixture::with_segments(16 * 1024).run(|f, store| async move {
        let body = "x".repeat(1024);
        for round in 0..20 {
            store.send((0..20).map(|_| msg("q", &body)).collect()).await;
            let got = store.get("q", 20, WAIT).await;
            assert_eq!(got.len(), 20, "round {round}");
            let seqs: Vec<Seq> = got.iter().map(|d| d.sequence).collect();
            store.ack("q", &seqs);
        }
        // Acks are written without waiting: one more durable write flushes them.
        store.send(vec![msg("flush", "x")]).await;
        store.send(vec![msg("flush", "y")]).await;
        let segments = store.segment_count();
        assert!(
            segments <= 3,
            "{segments} segments left after 400 KiB through 16 KiB segments"
        );
        store.close();
        drop(store);
        let (store, report) = f.open();
        assert_eq!(report.ready, 2);
        let r = store.send(vec![msg("q", "next")]).await;
        assert!(!r[0].is_error);
        let got = store.get("q", 1, WAIT).await;
        assert_eq!(
            got[0].sequence.get(),
            401,
            "the checkpoint kept the sequence counter"
        );
    });
}

/// A Get cancelled mid-wait returns what it had collected.
#[test]
fn cancelled_get_returns_messages() {
    Fixture::new().run(|_, store| async move {
        store.send(vec![msg("q", "a")]).await;
        // Dropped (cancelled) as soon as it is seen waiting for the other four.
        tokio::select! {
            _ = store.get("q", 5, Duration::from_secs(60)) => panic!("returned short of MaxItems"),
            () = until("the Get waits", || store.waiting_gets() == 1) => {}
        }
        assert_eq!((store.ready_count("q"), store.locked_count("q")), (1, 0));
        assert_eq!(store.waiting_gets(), 0, "a cancelled Get waits no more");
    });
}

/// Group commit: many concurrent senders, every result durable and distinct.
#[test]
fn concurrent_senders() {
    Fixture::new().run(|_, store| async move {
        let mut tasks = Vec::new();
        for t in 0..32 {
            let s: Arc<Store> = store.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..20 {
                    let r = s.send(vec![msg("q", &format!("{t}-{i}"))]).await;
                    assert!(!r[0].is_error);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(store.ready_count("q"), 640);
        let got = store.get("q", 640, WAIT).await;
        let mut seqs: Vec<u64> = got.iter().map(|d| d.sequence.get()).collect();
        seqs.dedup();
        assert_eq!(seqs, (1..=640).collect::<Vec<u64>>());
    });
}

/// KMQ-7: NAckAll re-queues every unsettled message with ReceiveCount + 1 and closes the
/// transaction; ReQueueAll moves every one to another queue as a fresh send.
#[test]
fn nack_all_and_requeue_all() {
    Fixture::new().run(|_, store| async move {
        store.send(vec![msg("q", "a"), msg("q", "b")]).await;
        let mut ds = Downstream::new(store.clone());
        let r = ds.handle(get_req("q", 2, 1000)).await.unwrap();
        assert!(ds
            .handle(settle(Op::NAckAll, &r.transaction_id, &[]))
            .await
            .is_none());
        let e = ds
            .handle(settle(Op::AckAll, &r.transaction_id, &[]))
            .await
            .unwrap();
        assert_eq!(e.error, "cannot ack messages with closed response ");
        let r = ds.handle(get_req("q", 2, 1000)).await.unwrap();
        let counts: Vec<i32> = r
            .messages
            .iter()
            .map(|m| m.attributes.as_ref().unwrap().receive_count)
            .collect();
        assert_eq!(counts, [2, 2]);
        let mut rq = settle(Op::ReQueueAll, &r.transaction_id, &[]);
        rq.re_queue_channel = "elsewhere".into();
        assert!(ds.handle(rq).await.is_none());
        assert_eq!(store.ready_count("q") + store.locked_count("q"), 0);
        let r = ds.handle(get_req("elsewhere", 2, 1000)).await.unwrap();
        let counts: Vec<i32> = r
            .messages
            .iter()
            .map(|m| m.attributes.as_ref().unwrap().receive_count)
            .collect();
        assert_eq!(counts, [1, 1], "a re-queued message starts over");
    });
}

/// KMQ-13: a delayed message's TTL restarts at release (release time + ExpirationSeconds), and
/// due messages are released in due-time order.
#[test]
fn delay_ttl_restarts_at_release() {
    Fixture::new().run(|_, store| async move {
        let p = |d| QueueMessagePolicy {
            delay_seconds: d,
            expiration_seconds: 10,
            ..Default::default()
        };
        let r = store
            .send(vec![
                with_policy(msg("q", "second"), p(20)),
                with_policy(msg("q", "first"), p(10)),
            ])
            .await;
        assert_eq!(
            r[0].expiration_at - r[0].sent_at,
            30_000_000_000,
            "TTL counts from send plus delay"
        );
        let release = now_ns() + 60_000_000_000;
        store.release_due(release).await;
        let got = store.get("q", 2, WAIT).await;
        assert_eq!(
            bodies(&got),
            ["first", "second"],
            "released in due-time order"
        );
        for d in &got {
            assert_eq!(
                d.message.attributes.as_ref().unwrap().expiration_at,
                release + 10_000_000_000
            );
        }
    });
}

/// A segment of random bytes (not written by us) opens without a panic, is reported, and yields
/// no messages.
#[test]
fn garbage_segment_yields_nothing() {
    let fixture = Fixture::new();
    let mut junk = vec![0u8; 64 * 1024];
    let mut x: u32 = 12345;
    for b in junk.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    std::fs::write(fixture.path().join("seg-0000000001.log"), &junk).unwrap();
    fixture.run_unopened(|f| async move {
        let (store, report) = f.open();
        assert_eq!(report.ready, 0);
        assert_eq!(report.dropped.len(), 1);
        let r = store.send(vec![msg("q", "fresh")]).await;
        assert!(!r[0].is_error);
        let got = store.get("q", 1, WAIT).await;
        assert_eq!(bodies(&got), ["fresh"]);
    });
}

/// Segments close and are deleted while sends and acks run on several threads: a send whose
/// records landed in a segment that a later write closed must not lose them to a reclaim that
/// ran before the send counted them live (found as 100 messages lost in ~1 of 40 load runs).
/// Small segments make that window frequent (without the segment pins about one round in six
/// lost a batch); every message must be read back exactly once, in every round.
#[test]
fn segments_closing_under_concurrent_sends_and_acks_lose_nothing() {
    for round in 0..15 {
        Fixture::with_segments(2048).run(|_, store| async move {
            let (senders, per, batch) = (4u32, 1000u32, 10u32);
            let mut tasks = Vec::new();
            for t in 0..senders {
                let s: Arc<Store> = store.clone();
                tasks.push(tokio::spawn(async move {
                    for b in 0..per / batch {
                        let msgs = (0..batch)
                            .map(|i| msg("q", &format!("{t}-{}", b * batch + i)))
                            .collect();
                        assert!(s.send(msgs).await.iter().all(|r| !r.is_error));
                    }
                }));
            }
            // The consumer acks as it goes, which is what runs reclaim.
            let total = (senders * per) as usize;
            let mut seen = std::collections::HashSet::new();
            while seen.len() < total {
                let got = store.get("q", 25, Duration::from_millis(1000)).await;
                assert!(
                    !got.is_empty(),
                    "round {round}: {} of {total} read back",
                    seen.len()
                );
                let seqs: Vec<Seq> = got.iter().map(|d| d.sequence).collect();
                for b in bodies(&got) {
                    assert!(seen.insert(b), "delivered twice");
                }
                store.ack("q", &seqs);
            }
            for t in tasks {
                t.await.unwrap();
            }
            assert_eq!(store.ready_count("q"), 0);
        });
    }
}

/// The façade's imitation of KubeMQ v2.4's capture (KMQ-2, docs/kubemq-behaviour.md), pinned to
/// what a real KubeMQ v2.4.0 was seen to do: after five messages are NAcked, a Get(1) returns one
/// and its open transaction holds the other four, so a Get(4) on another stream waits out its
/// second with nothing; once that transaction closes they are visible again. A Get at least as
/// large as the largest so far takes them all at once.
#[test]
fn capture_holds_messages_in_an_open_transaction() {
    Fixture::new().run(|_, store| async move {
        let (capture, mut a, mut b) = capturing_streams(&store);
        let five: Vec<QueueMessage> = (0..5).map(|i| msg("cap", &format!("m{i}"))).collect();
        store.send(five).await;
        let r = a.handle(get_req("cap", 5, 1000)).await.unwrap();
        assert_eq!(r.messages.len(), 5);
        assert!(a
            .handle(settle(Op::NAckRange, &r.transaction_id, &[1, 2, 3, 4, 5]))
            .await
            .is_none());
        assert_eq!(store.ready_count("cap"), 5, "the NAck copies are ready");

        let one = a.handle(get_req("cap", 1, 1000)).await.unwrap();
        assert_eq!(one.messages.len(), 1);
        assert_eq!(
            capture.held("cap"),
            4,
            "the open transaction holds the rest"
        );
        let waited = store.waited_out_gets();
        let four = b.handle(get_req("cap", 4, 1000)).await.unwrap();
        assert!(four.messages.is_empty(), "held messages are invisible");
        assert_eq!(
            store.waited_out_gets(),
            waited + 1,
            "it waited out its second"
        );

        let seq = one.messages[0].attributes.as_ref().unwrap().sequence as i64;
        assert!(a
            .handle(settle(Op::AckRange, &one.transaction_id, &[seq]))
            .await
            .is_none());
        assert_eq!(capture.held("cap"), 0);
        assert_eq!(store.ready_count("cap"), 4, "closing it let them go");
        let rest = b.handle(get_req("cap", 5, 1000)).await.unwrap();
        assert_eq!(bodies_of(&rest.messages), ["m1", "m2", "m3", "m4"]);
    });
}

/// Capture (KMQ-2): a settlement that gives an open transaction room lets it take what arrives
/// meanwhile, and what a closing transaction held moves to another open one rather than back to
/// the queue; a stream's end lets everything go.
#[test]
fn capture_moves_held_messages_between_open_transactions() {
    Fixture::new().run(|_, store| async move {
        let (capture, mut a, mut b) = capturing_streams(&store);
        store
            .send((0..4).map(|i| msg("mv", &format!("m{i}"))).collect())
            .await;
        let first = a.handle(get_req("mv", 2, 1000)).await.unwrap();
        let second = b.handle(get_req("mv", 2, 1000)).await.unwrap();
        assert_eq!((first.messages.len(), second.messages.len()), (2, 2));
        // An ack of one of `first`'s gives it room: a new message is held there.
        assert!(a
            .handle(settle(Op::AckRange, &first.transaction_id, &[1]))
            .await
            .is_none());
        store.send(vec![msg("mv", "late")]).await;
        capture.arrived(&store, "mv");
        assert_eq!((capture.held("mv"), store.ready_count("mv")), (1, 0));
        // `first` closes: what it held moves to `second`, still invisible.
        assert!(a
            .handle(settle(Op::AckRange, &first.transaction_id, &[2]))
            .await
            .is_none());
        assert_eq!((capture.held("mv"), store.ready_count("mv")), (1, 0));
        // `second`'s stream ends: its unsettled messages and the held one are ready again.
        drop(b);
        assert_eq!((capture.held("mv"), store.ready_count("mv")), (0, 3));
    });
}

/// Two downstream streams on `store` whose transactions capture messages.
fn capturing_streams(store: &Arc<Store>) -> (Arc<Capture>, Downstream, Downstream) {
    let capture = Capture::new();
    let a = Downstream::watched(store.clone(), capture.clone());
    let b = Downstream::watched(store.clone(), capture.clone());
    (capture, a, b)
}

fn bodies_of(m: &[QueueMessage]) -> Vec<String> {
    m.iter()
        .map(|x| String::from_utf8_lossy(&x.body).into_owned())
        .collect()
}
