//! `/livez` (the process runs), `/readyz` (the controller's caches are synced) and `/metrics`.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};

use crate::metrics::Metrics;

/// Serves the three endpoints on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Metrics, ready: Arc<AtomicBool>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (metrics, ready) = (metrics.clone(), ready.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let (status, body) = match req.uri().path() {
                    "/livez" => (StatusCode::OK, "ok\n".to_string()),
                    "/readyz" if ready.load(Ordering::Acquire) => {
                        (StatusCode::OK, "ready\n".into())
                    }
                    "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into()),
                    "/metrics" => (StatusCode::OK, metrics.encode()),
                    _ => (StatusCode::NOT_FOUND, "not found\n".into()),
                };
                // Prometheus 3 refuses a scrape without a Content-Type.
                let content_type = if req.uri().path() == "/metrics" {
                    "text/plain; version=0.0.4; charset=utf-8"
                } else {
                    "text/plain; charset=utf-8"
                };
                let mut r = Response::new(Full::new(Bytes::from(body)));
                *r.status_mut() = status;
                r.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(content_type),
                );
                async move { Ok::<_, Infallible>(r) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
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
