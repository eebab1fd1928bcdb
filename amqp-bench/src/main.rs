//! amqp-bench: drives an AMQP 1.0 queue (or an events or events-store channel) with pipelined
//! producers and credit-window consumers and reports throughput, latency percentiles and whether
//! every message sent was received (by every consumer, with `--fanout`). With `--rpc` the
//! producers are requesters and the consumers responders on `commands/` or `queries/`, and the
//! latency is each request's round trip ([`rpc`]).
//!
//! Each message carries its number and send time, so the consumers can tell lost, duplicated
//! and late messages apart. Exits 1 when a message is lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::definitions::SenderSettleMode;
use fe2o3_amqp::types::messaging::{ApplicationProperties, Data, Header, Message, Outcome};
use fe2o3_amqp::types::primitives::Binary;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};

mod coalesce;
mod direct;
mod lean;
mod rpc;
mod stages;

/// The same allocator as the connector, for both the AMQP and the direct gRPC load: the load
/// tool shares the cores with what it measures, and glibc's malloc made it the costliest process.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Command line.
#[derive(Debug, Clone, Parser)]
#[command(name = "amqp-bench", about = "Load tool for AMQP 1.0 queues")]
struct Args {
    /// Connector URL.
    #[arg(long, default_value = "amqp://127.0.0.1:5672")]
    url: String,
    /// Consumers connect here instead (fe2o3 client), in turn when given more than once: several
    /// connector replicas in front of one broker.
    #[arg(long = "consumer-url")]
    consumer_urls: Vec<String>,
    /// Node address.
    #[arg(long, default_value = "queues/amqp-bench")]
    address: String,
    /// Producer connections.
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Consumer connections.
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Messages in all.
    #[arg(long, default_value_t = 10_000)]
    messages: u64,
    /// Body size in bytes (at least 16).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Send pre-settled (at-most-once) instead of waiting for `accepted`.
    #[arg(long)]
    presettled: bool,
    /// Unsettled sends in flight per producer.
    #[arg(long, default_value_t = 100)]
    pipeline: usize,
    /// Credit window of each consumer.
    #[arg(long, default_value_t = 100)]
    credit: u32,
    /// Each consumer settles this many deliveries at a time (fe2o3 client; 0 = half the credit
    /// window). 1 is what most clients do by default: accept each message as it is processed.
    #[arg(long, default_value_t = 0)]
    settle_every: u32,
    /// Messages per second in all (0 = as fast as possible); use it to measure latency.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Give up waiting for the rest after this many seconds without progress.
    #[arg(long, default_value_t = 10)]
    idle_timeout: u64,
    /// The AMQP client: fe2o3-amqp, or the tool's own lean client (the same wire load at a
    /// fraction of the client CPU, for measuring the connector on cores it shares with the tool).
    #[arg(long, value_enum, default_value_t = Client::Fe2o3)]
    client: Client,
    /// Skip AMQP: drive a KubeMQ gRPC server at this `host:port` straight from a Rust client
    /// with the same load (pipelined sends; a Get of `credit` messages, then one AckRange, per
    /// round), to measure what the connector itself costs.
    #[arg(long)]
    grpc: Option<String>,
    /// Producers send straight to the KubeMQ gRPC server at this `host:port` (as another KubeMQ
    /// client would) while consumers go through the connector: what a connector sees of messages
    /// it did not send.
    #[arg(long)]
    producer_grpc: Option<String>,
    /// PEM CA bundle that verifies the connector's certificate, for `amqps://` URLs (lean
    /// client only).
    #[arg(long)]
    ca: Option<std::path::PathBuf>,
    /// Every consumer gets every message (events without groups): the run waits for
    /// messages × consumers deliveries, and a message some consumer missed counts as lost.
    #[arg(long)]
    fanout: bool,
    /// Consumers join this consumer group (`x-opt-kubemq-group`).
    #[arg(long)]
    group: Option<String>,
    /// Consumers start here (`x-opt-kubemq-start`, events-store).
    #[arg(long)]
    start: Option<String>,
    /// Send everything first, then start the consumers (an events-store replay).
    #[arg(long)]
    replay: bool,
    /// Request/reply on a `commands/` or `queries/` address: producers are requesters (up to
    /// `--pipeline` requests each in flight), consumers responders; latency is the round trip.
    #[arg(long)]
    rpc: bool,
    /// The connector's HTTP endpoint (`http://host:port`): its account of where queue messages'
    /// time went (stored, waited, handed out, settled) is read before and after the run and
    /// printed beside the tool's own times.
    #[arg(long)]
    stages: Option<String>,
    /// Each message carries a W3C `traceparent` of its own among its application properties,
    /// as a traced producer's do (fe2o3 client): the connector then records spans of it when
    /// its span export is on.
    #[arg(long)]
    traceparent: bool,
}

impl Args {
    /// Messages per second each producer sends (`--rate` shared out); 0 for as fast as possible.
    fn per_producer_rate(&self) -> f64 {
        self.rate as f64 / self.producers.max(1) as f64
    }

    /// Times each message must be received.
    fn copies(&self) -> u8 {
        if self.fanout {
            u8::try_from(self.consumers).unwrap_or(u8::MAX)
        } else {
            1
        }
    }

    /// The consumers' ATTACH link properties.
    fn link_properties(&self) -> fe2o3_amqp::types::definitions::Fields {
        use fe2o3_amqp::types::primitives::{Symbol, Value};
        let mut f = fe2o3_amqp::types::definitions::Fields::new();
        if let Some(g) = &self.group {
            f.insert(Symbol::from("x-opt-kubemq-group"), Value::String(g.clone()));
        }
        if let Some(s) = &self.start {
            f.insert(Symbol::from("x-opt-kubemq-start"), Value::String(s.clone()));
        }
        f
    }
}

/// Which AMQP client drives the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Client {
    /// fe2o3-amqp, a third-party client.
    Fe2o3,
    /// amqp-bench's own minimal client (lean.rs).
    Lean,
}

/// The credentials (`user:password@`) and the `host:port` of an `amqp://` URL.
fn split_url(url: &str) -> (Option<(&str, &str)>, &str) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (creds, host) = match rest.rsplit_once('@') {
        Some((c, h)) => (c.split_once(':'), h),
        None => (None, rest),
    };
    (creds, host.trim_end_matches('/'))
}

/// Opens a connection with TCP_NODELAY on its socket (small frames must not wait for Nagle's
/// algorithm and the peer's delayed ACK) and SASL PLAIN when the URL carries credentials.
async fn connect(
    url: &str,
    container_id: String,
) -> Result<fe2o3_amqp::connection::ConnectionHandle<()>, String> {
    let (creds, host) = split_url(url);
    let stream = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| format!("{host}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let hostname = host.rsplit_once(':').map_or(host, |(h, _)| h).to_string();
    let builder = Connection::builder()
        .container_id(container_id)
        .hostname(hostname.as_str());
    let builder = match creds {
        Some((user, pass)) => builder.sasl_profile(fe2o3_amqp::sasl_profile::SaslProfile::Plain {
            username: user.to_string(),
            password: pass.to_string(),
        }),
        None => builder,
    };
    builder
        .open_with_stream(coalesce::Coalesced::new(stream))
        .await
        .map_err(|e| e.to_string())
}

#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    accepted: AtomicU64,
    failed: AtomicU64,
    received: AtomicU64,
    /// Each accepted send's time from its send to its outcome, in ns.
    stored_ns: Mutex<Vec<u64>>,
}

impl Tally {
    /// One send accepted `took` after it was sent.
    fn stored(&self, took: Duration) {
        self.stored_ns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(took.as_nanos() as u64);
    }
}

/// Records the number and latency carried by one received body (both modes).
fn record(body: &[u8], started: Instant, seen: &Mutex<Seen>) {
    if body.len() >= 16 {
        let n = u64::from_be_bytes(body[..8].try_into().unwrap_or_default());
        let sent_ns = u64::from_be_bytes(body[8..16].try_into().unwrap_or_default());
        let latency = (started.elapsed().as_nanos() as u64).saturating_sub(sent_ns);
        seen.lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(n, latency);
    }
}

fn body(n: u64, started: Instant, size: usize) -> Vec<u8> {
    let mut b = vec![0x5a; size.max(16)];
    b[..8].copy_from_slice(&n.to_be_bytes());
    b[8..16].copy_from_slice(&(started.elapsed().as_nanos() as u64).to_be_bytes());
    b
}

/// A sampled W3C `traceparent` of a trace of message `n`'s own.
fn traceparent(n: u64) -> String {
    format!("00-{:016x}{n:016x}-{:016x}-01", std::process::id(), n + 1)
}

async fn produce(
    args: Args,
    who: usize,
    first: u64,
    count: u64,
    started: Instant,
    tally: Arc<Tally>,
) -> Result<(), String> {
    if args.rpc {
        return Err("requesters are started by main in --rpc mode".into());
    }
    match args.producer_grpc.clone().or_else(|| args.grpc.clone()) {
        Some(addr) => direct::produce(&addr, &args, who, first, count, started, &tally).await,
        None if args.client == Client::Lean && args.traceparent => {
            Err("--traceparent needs the fe2o3 client".into())
        }
        None if args.client == Client::Lean => {
            lean::produce(&args, who, first, count, started, &tally).await
        }
        None => produce_amqp(args, who, first, count, started, tally).await,
    }
}

async fn produce_amqp(
    args: Args,
    who: usize,
    first: u64,
    count: u64,
    started: Instant,
    tally: Arc<Tally>,
) -> Result<(), String> {
    let mut conn = connect(&args.url, format!("amqp-bench-producer-{who}")).await?;
    let mut session = Session::begin(&mut conn).await.map_err(|e| e.to_string())?;
    let mode = if args.presettled {
        SenderSettleMode::Settled
    } else {
        SenderSettleMode::Unsettled
    };
    let mut sender = Sender::builder()
        .name(format!("producer-{who}"))
        .target(args.address.clone())
        .sender_settle_mode(mode)
        .attach(&mut session)
        .await
        .map_err(|e| e.to_string())?;
    let per_producer_rate = args.per_producer_rate();
    // The rate counts from this producer's start, not the run's: no burst to catch up.
    let paced = Instant::now();
    let mut in_flight = tokio::task::JoinSet::new();
    for i in 0..count {
        if per_producer_rate > 0.0 {
            let due = paced + Duration::from_secs_f64(i as f64 / per_producer_rate);
            tokio::time::sleep_until(due.into()).await;
        }
        // Durable, so that brokers that keep other messages in memory only store these too.
        let msg = Message::builder()
            .header(Header {
                durable: true,
                ..Default::default()
            })
            .application_properties(args.traceparent.then(|| {
                ApplicationProperties::builder()
                    .insert("traceparent", traceparent(first + i))
                    .build()
            }))
            .data(Binary::from(body(first + i, started, args.size)))
            .build();
        let sent_at = Instant::now();
        let fut = sender
            .send_batchable(msg)
            .await
            .map_err(|e| e.to_string())?;
        tally.sent.fetch_add(1, Ordering::Relaxed);
        let t = tally.clone();
        let presettled = args.presettled;
        in_flight.spawn(async move {
            match fut.await {
                Ok(Outcome::Accepted(_)) => {
                    t.stored(sent_at.elapsed());
                    t.accepted.fetch_add(1, Ordering::Relaxed)
                }
                Ok(_) | Err(_) if !presettled => t.failed.fetch_add(1, Ordering::Relaxed),
                _ => t.accepted.fetch_add(1, Ordering::Relaxed),
            };
        });
        while in_flight.len() >= args.pipeline.max(1) {
            in_flight.join_next().await;
        }
    }
    while in_flight.join_next().await.is_some() {}
    let _ = sender.close().await;
    let _ = conn.close().await;
    Ok(())
}

async fn consume(
    args: Args,
    who: usize,
    started: Instant,
    tally: Arc<Tally>,
    seen: Arc<Mutex<Seen>>,
    stop: Stop,
) -> Result<(), String> {
    match args.grpc.clone() {
        Some(addr) => direct::consume(&addr, &args, who, started, &tally, &seen, stop).await,
        None if args.client == Client::Lean => {
            lean::consume(&args, who, started, &tally, &seen, stop).await
        }
        None => consume_amqp(args, who, started, tally, seen, stop).await,
    }
}

async fn consume_amqp(
    args: Args,
    who: usize,
    started: Instant,
    tally: Arc<Tally>,
    seen: Arc<Mutex<Seen>>,
    mut stop: Stop,
) -> Result<(), String> {
    let url = match args.consumer_urls.len() {
        0 => &args.url,
        n => &args.consumer_urls[who % n],
    };
    let mut conn = connect(url, format!("amqp-bench-consumer-{who}")).await?;
    let mut session = Session::begin(&mut conn).await.map_err(|e| e.to_string())?;
    let mut receiver = Receiver::builder()
        .name(format!("consumer-{who}"))
        .source(args.address.clone())
        .properties(args.link_properties())
        .credit_mode(CreditMode::Auto(args.credit))
        .attach(&mut session)
        .await
        .map_err(|e| e.to_string())?;
    // Settled in batches (half the credit window unless told), with ranged dispositions where the ids are
    // consecutive (the direct gRPC consumer acks a Get's messages with one AckRange: this is the
    // AMQP form of the same load). fe2o3 grants new credit once half the window is settled.
    let settle_every = match args.settle_every {
        0 => (args.credit / 2).max(1),
        n => n,
    } as usize;
    let mut batch = Vec::with_capacity(settle_every);
    loop {
        let d = tokio::select! {
            d = receiver.recv::<Data>() => d.map_err(|e| e.to_string())?,
            _ = stop.changed() => break,
        };
        record(&d.body().0, started, &seen);
        tally.received.fetch_add(1, Ordering::Relaxed);
        batch.push(d);
        if batch.len() >= settle_every {
            receiver
                .accept_all(batch.drain(..))
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    // What arrived since the last batch, before the link closes (or it would be released).
    receiver
        .accept_all(batch.drain(..))
        .await
        .map_err(|e| e.to_string())?;
    let _ = receiver.close().await;
    let _ = conn.close().await;
    Ok(())
}

/// Tells consumers to stop: resolves `changed()` once the run is over.
type Stop = tokio::sync::watch::Receiver<()>;

#[derive(Default)]
struct Seen {
    counts: Vec<u8>,
    latencies: Vec<u64>,
    /// Times each message must be received.
    copies: u8,
    /// Messages received at least `copies` times: the run is complete when all are, however
    /// many duplicates came (a redelivery must not end the run before the last message).
    complete: u64,
}

impl Seen {
    fn record(&mut self, n: u64, latency_ns: u64) {
        if let Some(c) = self.counts.get_mut(n as usize) {
            *c = c.saturating_add(1);
            if *c == self.copies {
                self.complete += 1;
            }
        }
        self.latencies.push(latency_ns);
    }
}

fn pct(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    Duration::from_nanos(sorted[((sorted.len() - 1) as f64 * p).round() as usize])
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let started = Instant::now();
    let tally = Arc::new(Tally::default());
    let seen = Arc::new(Mutex::new(Seen {
        counts: vec![0; args.messages as usize],
        latencies: Vec::with_capacity(args.messages as usize),
        copies: args.copies(),
        complete: 0,
    }));
    let (stop_all, stop) = tokio::sync::watch::channel(());
    let stages_before = match &args.stages {
        Some(url) => Some(stages::fetch(url).await.unwrap_or_else(|e| {
            eprintln!("connector stages: {e}");
            std::process::exit(2)
        })),
        None => None,
    };
    let start_consumers = || {
        (0..args.consumers)
            .map(|c| {
                let (args, tally, seen, stop) =
                    (args.clone(), tally.clone(), seen.clone(), stop.clone());
                tokio::spawn(async move {
                    if args.rpc {
                        rpc::respond(&args, c, stop).await
                    } else {
                        consume(args, c, started, tally, seen, stop).await
                    }
                })
            })
            .collect::<Vec<_>>()
    };
    let mut consumers = Vec::new();
    if !args.replay {
        consumers = start_consumers();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut producers = Vec::new();
    let per = args.messages / args.producers.max(1) as u64;
    for p in 0..args.producers {
        let first = per * p as u64;
        let count = if p + 1 == args.producers {
            args.messages - first
        } else {
            per
        };
        let (a, t, s) = (args.clone(), tally.clone(), seen.clone());
        producers.push(tokio::spawn(async move {
            if a.rpc {
                rpc::request(&a, p, first, count, started, &t, &s).await
            } else {
                produce(a, p, first, count, started, t).await
            }
        }));
    }
    let mut replay_started = None;
    if args.replay {
        for p in producers.drain(..) {
            if let Ok(Err(e)) = p.await {
                eprintln!("producer failed: {e}");
            }
        }
        eprintln!(
            "[{:>5.1}s] {} stored; replaying",
            started.elapsed().as_secs_f64(),
            tally.accepted.load(Ordering::Relaxed)
        );
        replay_started = Some(Instant::now());
        consumers = start_consumers();
    }
    // Check every 10 ms (so the elapsed time is exact to that) and print progress once a second,
    // until every message arrived or nothing moved for idle_timeout.
    let mut last = (0, Instant::now());
    let mut printed = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (s, r) = (
            tally.sent.load(Ordering::Relaxed),
            tally.received.load(Ordering::Relaxed),
        );
        let done = seen.lock().unwrap_or_else(|e| e.into_inner()).complete >= args.messages;
        if !done && printed.elapsed() < Duration::from_secs(1) {
            continue;
        }
        printed = Instant::now();
        eprintln!(
            "[{:>5.1}s] sent {s} accepted {} received {r} ({:.0} msg/s)",
            started.elapsed().as_secs_f64(),
            tally.accepted.load(Ordering::Relaxed),
            r as f64 / started.elapsed().as_secs_f64()
        );
        if done {
            break;
        }
        if r > last.0 {
            last = (r, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(args.idle_timeout) {
            eprintln!("no progress for {} s; stopping", args.idle_timeout);
            break;
        }
    }
    // A replay is timed from the consumers' start: the sends before it are not part of it.
    let elapsed = replay_started.unwrap_or(started).elapsed().as_secs_f64();
    // A producer still waiting (a request whose reply never comes, a send never settled) is
    // given up with the rest: the run ended at the loop above.
    for p in producers {
        match tokio::time::timeout(Duration::from_secs(5), p).await {
            Ok(Ok(Err(e))) => eprintln!("producer failed: {e}"),
            Ok(Err(e)) => eprintln!("producer task failed: {e}"),
            Err(_) => eprintln!("a producer did not finish within 5 s"),
            Ok(Ok(Ok(()))) => {}
        }
    }
    // A watch, not a Notify: a consumer busy settling when this is sent still sees it.
    stop_all.send_replace(());
    for c in consumers {
        match tokio::time::timeout(Duration::from_secs(5), c).await {
            Ok(Ok(Err(e))) => eprintln!("consumer failed: {e}"),
            Ok(Err(e)) => eprintln!("consumer task failed: {e}"),
            Err(_) => eprintln!("a consumer did not stop within 5 s"),
            Ok(Ok(Ok(()))) => {}
        }
    }
    let stages_after = match &args.stages {
        Some(url) => stages::fetch(url)
            .await
            .map_err(|e| eprintln!("connector stages: {e}"))
            .ok(),
        None => None,
    };
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    let copies = args.copies();
    let lost = seen.counts.iter().filter(|c| **c < copies).count();
    let duplicated = seen.counts.iter().filter(|c| **c > copies).count();
    let mut lat = seen.latencies.clone();
    lat.sort_unstable();
    let received = tally.received.load(Ordering::Relaxed);
    println!(
        "messages {} size {} B producers {} consumers {} {}: {received} received in {elapsed:.2}s = {:.0} msg/s",
        args.messages,
        args.size,
        args.producers,
        args.consumers,
        if args.presettled { "pre-settled" } else { "unsettled" },
        received as f64 / elapsed
    );
    println!(
        "latency p50 {:?} p90 {:?} p99 {:?} p999 {:?} max {:?}",
        pct(&lat, 0.5),
        pct(&lat, 0.9),
        pct(&lat, 0.99),
        pct(&lat, 0.999),
        lat.last()
            .map(|n| Duration::from_nanos(*n))
            .unwrap_or_default()
    );
    let mut stored = tally
        .stored_ns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if !stored.is_empty() {
        stored.sort_unstable();
        println!(
            "send to accepted p50 {:?} p99 {:?} p999 {:?} (n {})",
            pct(&stored, 0.5),
            pct(&stored, 0.99),
            pct(&stored, 0.999),
            stored.len()
        );
    }
    if let (Some(before), Some(after)) = (&stages_before, &stages_after) {
        for line in stages::report(before, after) {
            println!("{line}");
        }
    }
    println!(
        "lost {lost} duplicated {duplicated} failed sends {}",
        tally.failed.load(Ordering::Relaxed)
    );
    if lost > 0 {
        // Runs of consecutive numbers tell a lost send (one producer's run) from a lost Get.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (n, _) in seen.counts.iter().enumerate().filter(|(_, c)| **c < copies) {
            match runs.last_mut() {
                Some((_, last)) if *last + 1 == n => *last = n,
                _ => runs.push((n, n)),
            }
        }
        let shown: Vec<String> = runs
            .iter()
            .take(8)
            .map(|(a, b)| format!("{a}..={b}"))
            .collect();
        eprintln!("lost numbers ({} runs): {}", runs.len(), shown.join(", "));
        std::process::exit(1);
    }
}
