//! The HTTP endpoint against clients that connect and say nothing: at most `connections` are
//! served at once (the rest wait in the listen backlog, holding no descriptor of the process),
//! each is closed when it has not sent its headers in time, and a probe behind them is answered
//! once they are gone. Its own test binary: it counts the process's file descriptors.
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

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn silent_sockets_are_bounded_and_dropped() {
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
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let held = open_descriptors() - before;
        assert!(held <= 20 + 4, "{held} descriptors for 20 silent clients");
        // An accepted silent socket is closed by the server once its header time is up.
        let mut first = silent.remove(0);
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(3), first.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");
        drop(silent);
        let mut probe = tokio::net::TcpStream::connect(addr).await.unwrap();
        probe
            .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(5), probe.read_to_string(&mut answer))
            .await
            .expect("the probe is answered")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    });
}
