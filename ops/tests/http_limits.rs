//! The HTTP endpoint against clients that connect and say nothing: at most `connections` are
//! held at once (a newcomer closes the quietest), each is closed when it has not sent its headers
//! in time, and a probe is answered while silent clients keep coming back. Its own test binary:
//! it counts the process's file descriptors.
// A test target: unwrap, expect, panic and indexing are how its checks fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use ops::http::{serve, Answer, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The tests take turns: one counts the process's descriptors, which the other's sockets would
/// disturb.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Sends a `/livez` probe to `addr` and returns the answer's status line.
async fn livez(addr: std::net::SocketAddr) -> String {
    let mut probe = tokio::net::TcpStream::connect(addr).await.unwrap();
    probe
        .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    probe.read_to_string(&mut answer).await.unwrap();
    answer.lines().next().unwrap_or_default().to_string()
}

/// [`livez`] from a blocking socket, answered within 10 s or not at all.
fn blocking_livez(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut probe = std::net::TcpStream::connect(addr).unwrap();
    probe
        .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    probe
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    let _ = probe.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_string()
}

#[test]
fn silent_sockets_are_bounded_and_dropped() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            connections: 4,
            header_read: Duration::from_millis(300),
            life: Duration::from_secs(5),
        };
        tokio::spawn(serve(listener, limits, |_| async {
            Answer::text(200, "ok\n")
        }));
        let before = open_descriptors();
        let mut silent = Vec::new();
        for _ in 0..20 {
            silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // 20 of the client's own, and at most 4 the server holds.
        let held = open_descriptors() - before;
        assert!(held <= 20 + 4, "{held} descriptors for 20 silent clients");
        // Each is closed by the server: the first 16 to make room, the last 4 when their header
        // time is up.
        for (i, mut s) in silent.into_iter().enumerate() {
            let mut buf = [0u8; 1];
            let closed = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await;
            assert!(matches!(closed, Ok(Ok(0))), "silent socket {i}: {closed:?}");
        }
        let answer = tokio::time::timeout(Duration::from_secs(5), livez(addr))
            .await
            .expect("the probe is answered");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    });
}

/// 100 silent clients that reconnect as soon as they are closed, against 32 places whose header
/// time (30 s) never runs out during the test: every probe is still answered, because each
/// newcomer closes the quietest socket.
#[test]
fn a_probe_is_answered_while_silent_clients_keep_reconnecting() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            connections: 32,
            header_read: Duration::from_secs(30),
            life: Duration::from_secs(60),
        };
        tokio::spawn(serve(listener, limits, |_| async {
            Answer::text(200, "ok\n")
        }));
        let reconnects = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut hostile = Vec::new();
        for _ in 0..100 {
            let reconnects = reconnects.clone();
            hostile.push(tokio::spawn(async move {
                loop {
                    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let mut buf = [0u8; 1];
                    let _ = s.read(&mut buf).await;
                    reconnects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        for i in 0..20 {
            // From a thread of its own, as a kubelet probes from another process: it sends its
            // request as soon as it is connected, whatever the silent clients keep this
            // runtime busy with.
            let answer = tokio::task::spawn_blocking(move || blocking_livez(addr))
                .await
                .unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "probe {i}: {answer}");
        }
        let reconnects = reconnects.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            reconnects >= 100,
            "the silent clients were closed to make room ({reconnects} reconnects)"
        );
        for h in hostile {
            h.abort();
        }
    });
}
