//! `/livez` (the process runs), `/readyz` (the controller's caches are synced) and `/metrics`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ops::http::Limits;

use crate::metrics::Metrics;

/// Serves the three endpoints on `listener`, within the default [`Limits`] (a few connections at
/// a time, deadlines for a request and a connection), until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Metrics, ready: Arc<AtomicBool>) {
    ops::http::serve(listener, Limits::default(), move |path: String| {
        let answer = ops::http::probe(&path, || ready.load(Ordering::Acquire), || metrics.encode());
        async move { answer }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Every answer says what it is; `/metrics` in the Prometheus text format's type, which
    /// Prometheus 3 requires of a scrape.
    #[tokio::test]
    async fn answers_carry_their_content_type() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Metrics::default(), Arc::default()));
        for (path, want) in [
            ("/metrics", "text/plain; version=0.0.4; charset=utf-8"),
            ("/livez", "text/plain; charset=utf-8"),
        ] {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            assert!(
                out.to_ascii_lowercase()
                    .contains(&format!("content-type: {want}\r\n")),
                "{path}: {out}"
            );
        }
    }
}
