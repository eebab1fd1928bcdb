//! The same load without AMQP: a Rust gRPC client (the connector's own `KubemqGrpc`) talking
//! straight to a KubeMQ-compatible server. Comparing a run of this mode with an AMQP run through
//! a connector that uses that same server gives the connector's own overhead.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};

use connector::backend::grpc::{GrpcOptions, KubemqGrpc};
use connector::backend::{Backend, Downstream};
use connector::kubemq::QueueMessage;

use super::{body, record, Args, Seen, Tally};

/// The KubeMQ channel behind the node address (`queues/<channel>` or a bare channel).
fn channel(args: &Args) -> String {
    args.address
        .strip_prefix("queues/")
        .unwrap_or(&args.address)
        .to_string()
}

fn client(addr: &str) -> Result<KubemqGrpc, String> {
    KubemqGrpc::connect(addr, GrpcOptions::default()).map_err(|e| e.to_string())
}

/// Sends `count` messages, each in its own call (as each AMQP transfer is its own message), with
/// up to `pipeline` calls in flight (paced by `rate`; `--presettled` has no gRPC equivalent and is
/// ignored). The calls are polled in this task rather than spawned: the baseline should spend as
/// little client CPU as the AMQP load tool (`--client lean`), or the comparison flatters the
/// connector.
pub async fn produce(
    addr: &str,
    args: &Args,
    who: usize,
    first: u64,
    count: u64,
    started: Instant,
    tally: &Arc<Tally>,
) -> Result<(), String> {
    let grpc = client(addr)?;
    let channel = channel(args);
    let client_id = format!("amqp-bench-producer-{who}");
    let per_producer_rate = args.per_producer_rate();
    // The rate counts from this producer's start, not the run's: no burst to catch up.
    let paced = Instant::now();
    let window = args.pipeline.max(1) as u64;
    let message = |i: u64| QueueMessage {
        message_id: format!("{who}-{i}"),
        client_id: client_id.clone(),
        channel: channel.clone(),
        body: body(first + i, started, args.size).into(),
        ..Default::default()
    };
    let mut in_flight = FuturesUnordered::new();
    let mut sent = 0u64;
    loop {
        let due = (per_producer_rate > 0.0)
            .then(|| paced + Duration::from_secs_f64(sent as f64 / per_producer_rate));
        let may_send = sent < count && (in_flight.len() as u64) < window;
        if may_send && due.is_none_or(|d| d <= Instant::now()) {
            let m = message(sent);
            sent += 1;
            tally.sent.fetch_add(1, Ordering::Relaxed);
            in_flight.push(grpc.send_queue(who as u64, vec![m]));
            continue;
        }
        if in_flight.is_empty() && sent == count {
            break;
        }
        let done = match due.filter(|_| may_send) {
            Some(at) if in_flight.is_empty() => {
                tokio::time::sleep_until(at.into()).await;
                continue;
            }
            Some(at) => tokio::select! {
                d = in_flight.next() => d,
                _ = tokio::time::sleep_until(at.into()) => continue,
            },
            None => in_flight.next().await,
        };
        let Some(result) = done else {
            return Err("no send in flight".into());
        };
        let counter = match result {
            Ok(r) if r.iter().all(|r| !r.is_error) => &tally.accepted,
            _ => &tally.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Gets up to `credit` messages per round on one downstream session and acks them all.
pub async fn consume(
    addr: &str,
    args: &Args,
    who: usize,
    started: Instant,
    tally: &Arc<Tally>,
    seen: &Arc<Mutex<Seen>>,
    mut stop: crate::Stop,
) -> Result<(), String> {
    let grpc = client(addr)?;
    let channel = channel(args);
    let client_id = format!("amqp-bench-consumer-{who}");
    let mut ds = grpc.open_downstream().await.map_err(|e| e.to_string())?;
    loop {
        let batch = tokio::select! {
            b = ds.get(&channel, &client_id, args.credit.max(1) as i32, 1000) => {
                b.map_err(|e| e.to_string())?
            }
            _ = stop.changed() => break,
        };
        let mut seqs = Vec::with_capacity(batch.messages.len());
        for m in &batch.messages {
            record(&m.body, started, seen);
            seqs.extend(m.attributes.as_ref().map(|a| a.sequence));
        }
        if !seqs.is_empty() {
            ds.ack(&batch.transaction_id, &seqs)
                .await
                .map_err(|e| e.to_string())?;
        }
        tally
            .received
            .fetch_add(batch.messages.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}
