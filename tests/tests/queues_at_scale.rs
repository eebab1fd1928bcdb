//! Queues in the shapes a deployment gives them, through a broker that behaves as KubeMQ v2.4
//! does: the store's façade imitating its capture of messages by open transactions, then a real
//! KubeMQ where its binary exists. Many queues whose consumers come and go in waves beside a busy
//! queue (KMQ-21), a consumer that settles in batches (KMQ-20), and two connectors in front of
//! one queue (replicas). Each must deliver every message, and none twice once accepted. How fast
//! they go is measured and printed, for BENCHMARKS.md ("Through a real KubeMQ"), never asserted.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use connector::backend::grpc::{GrpcOptions, KubemqGrpc};
use connector::backend::Backend;
use connector::kubemq::QueueMessage;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::{Message, Outcome, Properties};
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::fleet::{Fleet, Settle};
use interop_tests::restartable::Broker;

/// Waves of consumers; each attaches to queues of its own.
const WAVES: usize = 4;
/// Queues a wave's consumers attach to: the waves touch 1,000 queues in all.
const PER_WAVE: usize = 250;
/// Messages each of the one-queue shapes sends.
const MESSAGES: usize = 4_000;
/// How long a message may take to arrive before the test gives up on it.
const ARRIVAL: Duration = Duration::from_secs(60);

/// KMQ-21: while consumers attach and detach on 1,000 queues in waves — half of each
/// wave accepting its queue's message, half holding it until they detach, after which the next
/// wave's consumers must get it — a busy queue keeps flowing beside them, and every message of
/// every queue is accepted exactly once. A wave's messages go half through the connector, half
/// straight to the broker from another gRPC client.
#[test]
fn q_2_many_queues_with_consumers_in_waves_lose_and_duplicate_nothing() {
    for broker in Broker::kubemq_shaped() {
        many_queues(&broker);
    }
}

fn many_queues(broker: &Broker) {
    let name = broker.name();
    let c = broker.connector();
    let url = c.url();
    let run = connector::kubemq::new_id();
    let busy = format!("queues/scale.{run}.busy");
    let rt = interop_tests::runtime();
    rt.block_on(async {
        let tally = Tally::new();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (stop_sending, sending_stopped) = tokio::sync::watch::channel(false);
        let consumer = tokio::spawn(consume(
            url.clone(),
            busy.clone(),
            100,
            1,
            tally.clone(),
            stopped,
        ));
        let producer = tokio::spawn(produce(
            url.clone(),
            busy.clone(),
            Until::Told(sending_stopped),
            Some(Duration::from_millis(2)),
            tally.clone(),
        ));
        let grpc = KubemqGrpc::connect(&broker.grpc().to_string(), GrpcOptions::default()).unwrap();
        let mut relay = Relay::open(&url).await;

        // The previous wave's prefix, and its queues that may hold two copies.
        let mut returning: Option<(String, HashSet<usize>)> = None;
        let waves_began = Instant::now();
        for w in 0..=WAVES {
            // The previous wave's held messages, back in their queues, for this wave to take.
            let mut fleets = Vec::new();
            if let Some((prefix, twice)) = returning.take() {
                let back =
                    Fleet::attach(&url, &prefix, PER_WAVE / 2..PER_WAVE, 10, Settle::Accept).await;
                fleets.push(("taking what the last wave held", back, PER_WAVE / 2, twice));
            }
            let this = (w < WAVES).then(|| format!("scale.{run}.wave{w}"));
            if let Some(prefix) = &this {
                let accepting =
                    Fleet::attach(&url, prefix, 0..PER_WAVE / 2, 10, Settle::Accept).await;
                let holding =
                    Fleet::attach(&url, prefix, PER_WAVE / 2..PER_WAVE, 10, Settle::Hold).await;
                let twice = send_one_to_each(&grpc, &mut relay.sender, prefix).await;
                fleets.push(("accepting", accepting, 0, twice.clone()));
                fleets.push(("holding", holding, PER_WAVE / 2, twice.clone()));
                returning = Some((prefix.clone(), twice));
            }
            for (what, fleet, _, _) in &fleets {
                let deadline = Instant::now() + ARRIVAL;
                while fleet.still_waiting() > 0 {
                    assert!(
                        Instant::now() < deadline,
                        "{name}, wave {w}: {} consumers {what} got nothing",
                        fleet.still_waiting()
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            // Anything delivered twice would show by now.
            tokio::time::sleep(Duration::from_millis(300)).await;
            for (what, fleet, first, sent_twice) in fleets {
                // A queue whose message was sent again may hold both copies.
                let wrong: Vec<usize> = (0..PER_WAVE / 2)
                    .filter(|s| {
                        let most = if sent_twice.contains(&(first + s)) {
                            2
                        } else {
                            1
                        };
                        fleet.arrivals(*s) > most
                    })
                    .collect();
                assert!(
                    wrong.is_empty(),
                    "{name}, wave {w}: consumers {what} got a message more than once: {wrong:?}"
                );
                fleet.detach().await;
            }
        }
        let waves = waves_began.elapsed();
        let _ = stop_sending.send(true);
        let sent = producer.await.unwrap();
        tally.all_arrive(sent, name).await;
        let _ = stop.send(true);
        let _ = consumer.await;
        let _ = relay.conn.close().await;
        eprintln!(
            "{name}: {} queues in {WAVES} waves in {:.1} s; beside them the busy queue {}",
            WAVES * PER_WAVE,
            waves.as_secs_f64(),
            tally.summary(sent)
        );
    });
}

/// KMQ-20: a consumer that settles 50 at a time with a window of 100 (many client
/// libraries' shape) gets every message, each once, the last ones included.
#[test]
fn q_4_a_consumer_settling_in_batches_gets_every_message_once() {
    for broker in Broker::kubemq_shaped() {
        let name = broker.name();
        let c = broker.connector();
        let queue = format!("queues/scale.{}.batches", connector::kubemq::new_id());
        interop_tests::runtime().block_on(async {
            let tally = Tally::new();
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let consumer = tokio::spawn(consume(
                c.url(),
                queue.clone(),
                100,
                50,
                tally.clone(),
                stopped.clone(),
            ));
            let sent = produce(c.url(), queue, Until::Sent(MESSAGES), None, tally.clone()).await;
            let last_sent = tally.since_start();
            tally.all_arrive(sent, name).await;
            let after_last = tally.since_start().saturating_sub(last_sent);
            let _ = stop.send(true);
            let _ = consumer.await;
            eprintln!(
                "{name}: settling 50 at a time, {}; the last arrived {} ms after the last send",
                tally.summary(sent),
                after_last.as_millis()
            );
        });
    }
}

/// across replicas: two connectors in front of one broker share a queue's messages between
/// two consumers on each; a producer on one of them sends, and every message is accepted once.
#[test]
fn q_3_two_connectors_share_a_queue_and_deliver_each_message_once() {
    for broker in Broker::kubemq_shaped() {
        let name = broker.name();
        let (a, b) = (broker.connector(), broker.connector());
        let queue = format!("queues/scale.{}.replicas", connector::kubemq::new_id());
        interop_tests::runtime().block_on(async {
            let tally = Tally::new();
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let consumers: Vec<_> = [a.url(), a.url(), b.url(), b.url()]
                .into_iter()
                .map(|url| tokio::spawn(consume(url, queue.clone(), 100, 1, tally.clone(), stopped.clone())))
                .collect();
            let sent = produce(a.url(), queue, Until::Sent(MESSAGES), None, tally.clone()).await;
            tally.all_arrive(sent, name).await;
            let _ = stop.send(true);
            let by_consumer: Vec<usize> = {
                let mut got = Vec::new();
                for c in consumers {
                    got.push(c.await.unwrap());
                }
                got
            };
            eprintln!(
                "{name}: two connectors, {}; accepted per consumer (first two on the producer's connector) {by_consumer:?}",
                tally.summary(sent)
            );
        });
    }
}

/// What arrived of a run's messages: how often each number arrived, and each first arrival's
/// latency.
#[derive(Clone)]
struct Tally {
    started: Instant,
    seen: Arc<Mutex<Seen>>,
}

#[derive(Default)]
struct Seen {
    arrived: HashMap<u64, u32>,
    latencies: Vec<Duration>,
    /// Messages sent again after KubeMQ left a send unanswered (`released`, KMQ-19, ERR-10):
    /// the first send may have been stored too, so these may arrive twice.
    resent: HashSet<u64>,
    /// How long each accepted send took to be answered.
    sends: Vec<Duration>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            started: Instant::now(),
            seen: Arc::default(),
        }
    }

    fn since_start(&self) -> Duration {
        self.started.elapsed()
    }

    /// A body for message `n`: its number and when it was sent.
    fn body(&self, n: u64) -> String {
        format!("{n} {}", self.started.elapsed().as_micros())
    }

    /// Counts the arrival of `body`.
    fn arrived(&self, body: &str) {
        let (n, sent) = body
            .split_once(' ')
            .and_then(|(n, t)| Some((n.parse::<u64>().ok()?, t.parse::<u64>().ok()?)))
            .unwrap_or_else(|| panic!("a body the test sent: {body:?}"));
        let latency = self
            .started
            .elapsed()
            .saturating_sub(Duration::from_micros(sent));
        let mut seen = self.seen.lock().unwrap();
        let count = seen.arrived.entry(n).or_default();
        *count += 1;
        if *count == 1 {
            seen.latencies.push(latency);
        }
    }

    /// Waits until every one of the `sent` messages arrived, then a moment for late copies, and
    /// asserts that none arrived twice.
    async fn all_arrive(&self, sent: u64, name: &str) {
        let deadline = Instant::now() + ARRIVAL;
        loop {
            let got = self.seen.lock().unwrap().arrived.len() as u64;
            if got == sent {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: {} of {sent} messages never arrived",
                sent - got
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let seen = self.seen.lock().unwrap();
        let mut twice: Vec<u64> = seen
            .arrived
            .iter()
            .filter(|(n, count)| **count > 1 && !seen.resent.contains(n))
            .map(|(n, _)| *n)
            .collect();
        twice.sort_unstable();
        assert!(
            twice.is_empty(),
            "{name}: {} messages arrived more than once: {twice:?}",
            twice.len()
        );
        assert_eq!(
            seen.arrived.len() as u64,
            sent,
            "{name}: only what was sent arrives"
        );
    }

    /// Rate and latency percentiles, for the test's report.
    fn summary(&self, sent: u64) -> String {
        let seen = self.seen.lock().unwrap();
        let (mut l, mut sends) = (seen.latencies.clone(), seen.sends.clone());
        l.sort_unstable();
        sends.sort_unstable();
        let at = |q: f64| quantile_ms(&l, q);
        let send = |q: f64| quantile_ms(&sends, q);
        format!(
            "{sent} messages ({} sent again after a send of unknown outcome), {:.0} msg/s, latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (a send's answer: p99 {:.1} ms, max {:.1} ms)",
            seen.resent.len(),
            sent as f64 / self.started.elapsed().as_secs_f64(),
            at(0.5),
            at(0.99),
            at(1.0),
            send(0.99),
            send(1.0)
        )
    }
}

/// The `q` quantile of `sorted` durations, in milliseconds.
fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    let at = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[at].as_secs_f64() * 1e3
}

/// How long a producer sends.
enum Until {
    /// This many messages.
    Sent(usize),
    /// Until the sender of this channel says so.
    Told(tokio::sync::watch::Receiver<bool>),
}

impl Until {
    fn done(&self, sent: u64) -> bool {
        match self {
            Until::Sent(count) => sent >= *count as u64,
            Until::Told(stopped) => *stopped.borrow(),
        }
    }
}

/// Sends numbered messages to `address`, each until it is `accepted`, `pace` apart, until
/// told; returns how many it sent.
async fn produce(
    url: String,
    address: String,
    until: Until,
    pace: Option<Duration>,
    tally: Tally,
) -> u64 {
    let mut conn = Connection::open("scale-producer", url.as_str())
        .await
        .unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let mut sender = Sender::attach(&mut session, "tx", address).await.unwrap();
    let mut n = 0;
    while !until.done(n) {
        loop {
            let began = Instant::now();
            match sender.send(tally.body(n)).await.unwrap() {
                Outcome::Accepted(_) => {
                    tally.seen.lock().unwrap().sends.push(began.elapsed());
                    break;
                }
                // KubeMQ left the send unanswered (KMQ-19): it may be stored; send it again.
                Outcome::Released(_) => {
                    tally.seen.lock().unwrap().resent.insert(n);
                }
                other => panic!("message {n}: {other:?}"),
            }
        }
        n += 1;
        if let Some(pace) = pace {
            tokio::time::sleep(pace).await;
        }
    }
    let _ = sender.close().await;
    let _ = conn.close().await;
    n
}

/// A consumer on `address` with a window of `credit` that accepts what it got `settle_every`
/// messages at a time, until told to stop (then it accepts what it holds); returns how many it
/// accepted.
async fn consume(
    url: String,
    address: String,
    credit: u32,
    settle_every: usize,
    tally: Tally,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> usize {
    let mut conn = Connection::open("scale-consumer", url.as_str())
        .await
        .unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let mut receiver = Receiver::builder()
        .name("rx")
        .source(address)
        .credit_mode(CreditMode::Auto(credit))
        .attach(&mut session)
        .await
        .unwrap();
    let mut batch = Vec::new();
    let mut accepted = 0;
    loop {
        tokio::select! {
            d = receiver.recv::<String>() => {
                let d = d.unwrap();
                tally.arrived(d.body());
                batch.push(d);
            }
            // A batch settler holds its last, short batch until then: the test counts a
            // message when it arrives, and waits for every one before it stops the consumer.
            _ = stopped.changed() => break,
        }
        if batch.len() >= settle_every {
            accepted += batch.len();
            receiver.accept_all(batch.drain(..)).await.unwrap();
        }
    }
    accepted += batch.len();
    receiver.accept_all(batch.drain(..)).await.unwrap();
    let _ = receiver.close().await;
    let _ = conn.close().await;
    accepted
}

/// An anonymous sender (ADDR-13) for messages addressed one by one, with its connection and
/// session.
struct Relay {
    conn: fe2o3_amqp::connection::ConnectionHandle<()>,
    _session: fe2o3_amqp::session::SessionHandle<()>,
    sender: Sender,
}

impl Relay {
    async fn open(url: &str) -> Relay {
        let mut conn = Connection::open("scale-relay", url).await.unwrap();
        let mut session = Session::begin(&mut conn).await.unwrap();
        let sender = interop_tests::relay_sender(&mut session, "relay").await;
        Relay {
            conn,
            _session: session,
            sender,
        }
    }
}

/// One message to each queue `<prefix>.<i>` of a wave: the even ones through the connector, the
/// odd ones from another gRPC client straight to the broker. A send whose outcome KubeMQ left
/// unknown (`released`, KMQ-19, ERR-10; a gRPC batch left unanswered) is sent again; the
/// indices of those queues, which may then hold two copies, are returned.
async fn send_one_to_each(grpc: &KubemqGrpc, relay: &mut Sender, prefix: &str) -> HashSet<usize> {
    let mut twice = HashSet::new();
    let mut straight = Vec::new();
    for i in 0..PER_WAVE {
        let channel = format!("{prefix}.{i}");
        if i % 2 == 1 {
            straight.push(QueueMessage {
                message_id: format!("{prefix}-{i}"),
                client_id: "another-kubemq-client".into(),
                channel,
                body: b"from another client".to_vec().into(),
                ..Default::default()
            });
            continue;
        }
        loop {
            let message = Message::builder()
                .properties(
                    Properties::builder()
                        .to(format!("queues/{channel}"))
                        .build(),
                )
                .value(Value::String(format!("to {channel}")))
                .build();
            match relay.send(message).await.unwrap() {
                Outcome::Accepted(_) => break,
                Outcome::Released(_) => {
                    twice.insert(i);
                }
                other => panic!("{channel}: {other:?}"),
            }
        }
    }
    loop {
        match grpc.send_queue(0, straight.clone()).await {
            Ok(results) => {
                for r in results {
                    assert!(!r.is_error, "{}", r.error);
                }
                break;
            }
            Err(e) => {
                eprintln!("{prefix}: the straight batch is sent again after {e}");
                twice.extend((0..PER_WAVE).filter(|i| i % 2 == 1));
            }
        }
    }
    twice
}
