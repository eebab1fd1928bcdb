//! The same load without AMQP: a Rust gRPC client (the connector's own `KubemqGrpc`) talking
//! straight to a KubeMQ-compatible server. Comparing a run of this mode with an AMQP run through
//! a connector that uses that same server gives the connector's own overhead.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

/// Sends `count` messages, one per call, with up to `pipeline` calls in flight (paced by `rate`;
/// `--presettled` has no gRPC equivalent and is ignored).
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
    let per_producer_rate = args.rate as f64 / args.producers.max(1) as f64;
    let mut in_flight = tokio::task::JoinSet::new();
    for i in 0..count {
        if per_producer_rate > 0.0 {
            let due = started + std::time::Duration::from_secs_f64(i as f64 / per_producer_rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let m = QueueMessage {
            message_id: format!("{who}-{i}"),
            client_id: format!("amqp-bench-producer-{who}"),
            channel: channel.clone(),
            body: body(first + i, started, args.size).into(),
            ..Default::default()
        };
        let (g, t) = (grpc.clone(), tally.clone());
        tally.sent.fetch_add(1, Ordering::Relaxed);
        in_flight.spawn(async move {
            match g.send_queue(who as u64, vec![m]).await {
                Ok(r) if r.iter().all(|r| !r.is_error) => {
                    t.accepted.fetch_add(1, Ordering::Relaxed)
                }
                _ => t.failed.fetch_add(1, Ordering::Relaxed),
            };
        });
        while in_flight.len() >= args.pipeline.max(1) {
            in_flight.join_next().await;
        }
    }
    while in_flight.join_next().await.is_some() {}
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
