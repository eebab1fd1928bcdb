//! Embedded store benchmark: this disk's sync rate, durable send throughput and latency with 64
//! concurrent senders (group commit), and Get + Ack throughput, 1 KiB messages.
//! Usage: store-bench [DIR] [MESSAGES]. DIR defaults to a new folder under target/.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let store_dir = dir.join("store");
    rt.block_on(async move {
        let (store, _) = Store::open(&store_dir).expect("store");
        let body = vec![0x5a; 1024];

        // 2. Durable sends: 64 concurrent senders, one message per call, each waiting for its sync.
        let senders = 64;
        let per = total / senders;
        let t = Instant::now();
        let mut tasks = Vec::new();
        for s in 0..senders {
            let (store, body) = (store.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per);
                for i in 0..per {
                    let m = QueueMessage {
                        message_id: format!("{s}-{i}"),
                        client_id: "bench".into(),
                        channel: "bench".into(),
                        body: body.clone(),
                        ..Default::default()
                    };
                    let t0 = Instant::now();
                    let r = store.send(vec![m]).await;
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
            "durable send, 64 concurrent senders, 1 KiB: {sent} msgs in {secs:.2}s = {:.0} msg/s; latency p50 {:?} p99 {:?}",
            sent as f64 / secs,
            percentile(&lat, 0.50),
            percentile(&lat, 0.99)
        );

        // 3. Get + Ack: one consumer taking what is ready in batches of up to 1000 and acking.
        let t = Instant::now();
        let mut got_total = 0usize;
        while got_total < sent {
            let want = store.ready_count("bench").clamp(1, 1000);
            let got = store.get("bench", want, Duration::from_millis(1000)).await;
            let seqs: Vec<u64> = got.iter().map(|d| d.sequence).collect();
            got_total += seqs.len();
            store.ack("bench", &seqs);
        }
        let secs = t.elapsed().as_secs_f64();
        println!("get + ack, batches of 1000, 1 KiB: {got_total} msgs in {secs:.2}s = {:.0} msg/s", got_total as f64 / secs);
        let store: Arc<Store> = store;
        store.close();
    });
    let _ = std::fs::remove_dir_all(&dir);
}
