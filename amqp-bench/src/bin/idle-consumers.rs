//! idle-consumers: holds consumers on many queues, as a deployment's idle queues have them, while
//! a benchmark measures a busy queue beside them.
//!
//! Usage: `idle-consumers URL PREFIX COUNT [CREDIT]`, e.g.
//! `idle-consumers amqp://127.0.0.1:5672 idle 1000 10` attaches receivers to
//! `queues/idle.0` … `queues/idle.999`, 100 to a connection, each with a credit window of
//! CREDIT (10 unless given). It prints `attached COUNT` once every receiver is attached, accepts
//! whatever arrives, and on SIGTERM or SIGINT prints `received N` and detaches.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Connection, Receiver, Session};

/// Receivers per connection (one session each).
const PER_CONNECTION: usize = 100;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(prefix), Some(count)) = (args.first(), args.get(1), args.get(2)) else {
        eprintln!("usage: idle-consumers URL PREFIX COUNT [CREDIT]");
        std::process::exit(2);
    };
    let count: usize = count.parse()?;
    let credit: u32 = args.get(3).map_or(Ok(10), |c| c.parse())?;
    let received = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut holders = Vec::new();
    let mut attached = Vec::new();
    for (c, first) in (0..count).step_by(PER_CONNECTION).enumerate() {
        let last = (first + PER_CONNECTION).min(count);
        let mut conn = Connection::open(format!("idle-consumers-{c}"), url.as_str()).await?;
        let mut session = Session::begin(&mut conn).await?;
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        attached.push(ready);
        let mut receivers = Vec::new();
        for i in first..last {
            let r = Receiver::builder()
                .name(format!("idle-{i}"))
                .source(format!("queues/{prefix}.{i}"))
                .credit_mode(CreditMode::Auto(credit))
                .attach(&mut session)
                .await?;
            receivers.push(r);
        }
        let _ = ready_tx.send(());
        let (received, mut stop) = (received.clone(), stop.clone());
        holders.push(tokio::spawn(async move {
            let mut tasks = Vec::new();
            for mut r in receivers {
                let (received, mut stop) = (received.clone(), stop.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            d = r.recv::<Body<Value>>() => match d {
                                Ok(d) => {
                                    received.fetch_add(1, Ordering::Relaxed);
                                    let _ = r.accept(&d).await;
                                }
                                Err(_) => break,
                            },
                            _ = stop.changed() => break,
                        }
                    }
                    let _ = r.close().await;
                }));
            }
            let _ = stop.changed().await;
            for t in tasks {
                let _ = t.await;
            }
            let _ = session.end().await;
            let _ = conn.close().await;
        }));
    }
    for a in attached {
        let _ = a.await;
    }
    println!("attached {count}");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let _ = stop_tx.send(true);
    drop(stop);
    for h in holders {
        let _ = h.await;
    }
    println!("received {}", received.load(Ordering::Relaxed));
    Ok(())
}
