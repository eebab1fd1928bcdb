//! Embedded store benchmark: this disk's sync rate, durable send throughput and latency with 64
//! concurrent senders (group commit), and Get + Ack throughput, 1 KiB messages.
//! Usage: store-bench [DIR] [MESSAGES]. DIR defaults to a new folder under target/.

use std::io::Write;
use std::time::{Duration, Instant};

use connector::backend::embedded::Embedded;
use connector::backend::grpc::{GrpcOptions, KubemqGrpc};
use connector::backend::{Backend, Downstream};
use connector::kubemq::QueueMessage;
use connector::store::Store;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let base = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "target/store-bench".into());
    let total: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let dir = std::path::PathBuf::from(&base).join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");

    // 1. The physical limit: fdatasync per second on 4 KiB appends in this folder.
    let path = dir.join("sync-probe");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("probe file");
    let block = [0u8; 4096];
    let t = Instant::now();
    let mut syncs = 0u64;
    while t.elapsed() < Duration::from_secs(2) {
        f.write_all(&block).expect("write");
        f.sync_data().expect("sync");
        syncs += 1;
    }
    let sync_rate = syncs as f64 / t.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&path);
    println!("fdatasync rate: {sync_rate:.0}/s (4 KiB appends)");

    let rt = interop_tests::runtime();
    let store_dir = dir.join("store");
    rt.block_on(async move {
        let (store, _) = Store::open(&store_dir).expect("store");
        run("in-process", &Embedded::new(store.clone()), total).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(connector::facade::serve(
            store.clone(),
            listener,
            None,
            std::future::pending(),
        ));
        let client =
            KubemqGrpc::connect(&addr.to_string(), GrpcOptions::default()).expect("client");
        run("gRPC façade, Rust client", &client, total).await;
        store.close();
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Durable sends from 64 concurrent senders (one message per call, each its own lane), then Get
/// + Ack in batches.
async fn run<B: Backend + Clone>(label: &str, backend: &B, total: usize) {
    let body = bytes::Bytes::from(vec![0x5a; 1024]);
    let senders = 64;
    let per = total / senders;
    let queue = format!("bench-{}", label.len());
    let t = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..senders {
        let (b, body, queue) = (backend.clone(), body.clone(), queue.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let m = QueueMessage {
                    message_id: format!("{s}-{i}"),
                    client_id: "bench".into(),
                    channel: queue.clone(),
                    body: body.clone(),
                    ..Default::default()
                };
                let t0 = Instant::now();
                let r = b.send_queue(s as u64, vec![m]).await.expect("send");
                assert!(!r[0].is_error, "{}", r[0].error);
                lat.push(t0.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::with_capacity(total);
    for t in tasks {
        lat.extend(t.await.expect("sender"));
    }
    let secs = t.elapsed().as_secs_f64();
    lat.sort_unstable();
    let sent = lat.len();
    println!(
        "[{label}] durable send, 64 concurrent senders, 1 KiB: {sent} msgs in {secs:.2}s = {:.0} msg/s; latency p50 {:?} p99 {:?}",
        sent as f64 / secs,
        percentile(&lat, 0.50),
        percentile(&lat, 0.99)
    );
    let mut ds = backend.open_downstream().await.expect("downstream");
    let t = Instant::now();
    let mut got_total = 0usize;
    while got_total < sent {
        // Ask for no more than is left, so no Get waits for a batch that cannot fill.
        let want = (sent - got_total).min(1000) as i32;
        let b = ds.get(&queue, "bench", want, 1000).await.expect("get");
        let seqs: Vec<u64> = b
            .messages
            .iter()
            .filter_map(|m| m.attributes.as_ref().map(|a| a.sequence))
            .collect();
        got_total += seqs.len();
        ds.ack(&b.transaction_id, &seqs).await.expect("ack");
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "[{label}] get + ack, batches of 1000, 1 KiB: {got_total} msgs in {secs:.2}s = {:.0} msg/s",
        got_total as f64 / secs
    );
}
