//! A victim process for crash tests of the embedded store (tests/tests/store_crash.rs kills it
//! with SIGKILL). Modes:
//! - `send DIR`: sends messages `m-0`, `m-1`, ... to queue `crash` from 8 concurrent senders and
//!   prints `OK m-N` after each confirmed send, until killed.
//! - `hold DIR N`: takes N messages with a Get, prints `HELD <sequence>` for each, then waits to be
//!   killed without settling them.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use connector::kubemq::QueueMessage;
use connector::store::Store;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, dir) = (args[1].clone(), std::path::PathBuf::from(&args[2]));
    let rt = interop_tests::runtime();
    rt.block_on(async move {
        let (store, _) = Store::open(&dir).expect("store opens");
        match mode.as_str() {
            "send" => {
                let next = Arc::new(AtomicU64::new(0));
                let mut tasks = Vec::new();
                for _ in 0..8 {
                    let (store, next) = (store.clone(), next.clone());
                    tasks.push(tokio::spawn(async move {
                        loop {
                            let n = next.fetch_add(1, Ordering::Relaxed);
                            let id = format!("m-{n}");
                            let m = QueueMessage {
                                message_id: id.clone(),
                                client_id: "probe".into(),
                                channel: "crash".into(),
                                body: vec![b'x'; 512].into(),
                                ..Default::default()
                            };
                            let r = store.send(vec![m]).await;
                            if !r[0].is_error {
                                let mut out = std::io::stdout().lock();
                                let _ = writeln!(out, "OK {id}");
                                let _ = out.flush();
                            }
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            }
            "hold" => {
                let n: usize = args[3].parse().expect("count");
                let got = store.get("crash", n, Duration::from_secs(5)).await;
                let mut out = std::io::stdout().lock();
                for d in &got {
                    let _ = writeln!(out, "HELD {}", d.sequence);
                }
                let _ = writeln!(out, "READY");
                let _ = out.flush();
                drop(out);
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            other => panic!("unknown mode {other}"),
        }
    });
}
