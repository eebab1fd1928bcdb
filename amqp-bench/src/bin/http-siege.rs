//! http-siege: hostile sockets on an HTTP endpoint, and how long a probe waits meanwhile. Each
//! hostile socket either says nothing (`silent`) or sends a request one byte a second (`trickle`),
//! and is opened again as soon as the server closes it; once they are in place, `/livez` is asked
//! PROBES times, one after another, and the latency of each answer is reported as percentiles.
//!
//! Usage: `http-siege ADDR HOSTILE silent|trickle PROBES`, e.g.
//! `http-siege 127.0.0.1:9090 1000 silent 200`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a hostile socket does once connected.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hostility {
    Silent,
    Trickle,
}

const REQUEST: &[u8] = b"GET /livez HTTP/1.1\r\nHost: siege\r\nConnection: close\r\n\r\n";

/// One hostile client: connects, misbehaves until closed, and does it again.
async fn hostile(addr: SocketAddr, how: Hostility, reopened: Arc<AtomicU64>) {
    loop {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut buf = [0u8; 512];
        match how {
            Hostility::Silent => while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {},
            Hostility::Trickle => {
                for byte in REQUEST.iter().cycle() {
                    if s.write_all(&[*byte]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        reopened.fetch_add(1, Ordering::Relaxed);
    }
}

/// One probe: connect, ask `/livez`, read the whole answer; its latency, or `None` on failure.
async fn probe(addr: SocketAddr) -> Option<Duration> {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(REQUEST).await.ok()?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.ok()?;
    answer
        .starts_with(b"HTTP/1.1 200")
        .then(|| started.elapsed())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match &args[..] {
        [addr, n, how, probes] => (|| {
            let how = match how.as_str() {
                "silent" => Hostility::Silent,
                "trickle" => Hostility::Trickle,
                _ => return None,
            };
            Some((
                addr.parse::<SocketAddr>().ok()?,
                n.parse::<usize>().ok()?,
                how,
                probes.parse::<usize>().ok()?,
            ))
        })(),
        _ => None,
    };
    let Some((addr, n, how, probes)) = parsed else {
        eprintln!("usage: http-siege ADDR HOSTILE silent|trickle PROBES");
        std::process::exit(2);
    };
    let reopened = Arc::new(AtomicU64::new(0));
    for _ in 0..n {
        tokio::spawn(hostile(addr, how, reopened.clone()));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut took = Vec::with_capacity(probes);
    let mut failed = 0;
    for _ in 0..probes {
        match tokio::time::timeout(Duration::from_secs(10), probe(addr)).await {
            Ok(Some(d)) => took.push(d),
            _ => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    took.sort();
    let at = |q: f64| {
        let i = ((took.len() as f64 - 1.0) * q).round() as usize;
        took.get(i)
            .map(|d| format!("{:.1} ms", d.as_secs_f64() * 1e3))
            .unwrap_or_else(|| "-".into())
    };
    println!(
        "{n} {} sockets, {probes} probes: p50 {} p99 {} max {}, {failed} failed, hostile sockets reopened {} times",
        if how == Hostility::Silent { "silent" } else { "trickling" },
        at(0.5),
        at(0.99),
        at(1.0),
        reopened.load(Ordering::Relaxed)
    );
}
