//! The connector's HTTP endpoint: `/metrics` (Prometheus text), `/livez` (the process runs) and
//! `/readyz` (the AMQP listener is bound and the backend reachable), for Kubernetes probes and
//! scrapers.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::metrics::Metrics;

/// What the endpoint reports.
#[derive(Clone)]
pub struct Health {
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
    /// Whether the connector is ready to serve clients.
    pub ready: tokio::sync::watch::Receiver<bool>,
}

/// The Prometheus text format's Content-Type; Prometheus 3 refuses a scrape without one.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn respond(health: &Health, path: &str) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => (
            StatusCode::OK,
            METRICS_CONTENT_TYPE,
            health.metrics.encode(),
        ),
        "/livez" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/readyz" if *health.ready.borrow() => {
            (StatusCode::OK, "text/plain", "ready\n".to_string())
        }
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// What one client of the endpoint may hold: it serves probes and scrapers, so a few
/// connections at a time, each short-lived, and none that never sends its request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; further ones wait in the listen backlog, holding no file
    /// descriptor of the process.
    pub connections: usize,
    /// Time to send a request's headers.
    pub header_read: Duration,
    /// Longest life of one connection.
    pub life: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 64,
            header_read: Duration::from_secs(5),
            life: Duration::from_secs(60),
        }
    }
}

/// Serves the endpoint on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, health: Health) {
    serve_with(listener, health, Limits::default()).await
}

/// Serves the endpoint on `listener` within `limits` until the task is dropped.
pub async fn serve_with(listener: tokio::net::TcpListener, health: Health, limits: Limits) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning on the error.
                tracing::warn!(error = %e, "HTTP accept failed; pausing");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let health = health.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = respond(&health, req.uri().path());
                async move { Ok::<_, Infallible>(r) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(limits.life, connection).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// /livez always, /readyz only when ready, /metrics with the families.
    #[test]
    fn endpoints() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (ready, readiness) = tokio::sync::watch::channel(false);
            let health = Health {
                metrics: Arc::new(Metrics::new()),
                ready: readiness,
            };
            tokio::spawn(serve(listener, health.clone()));
            assert!(get(addr, "/livez").await.starts_with("HTTP/1.1 200"));
            assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
            ready.send_replace(true);
            assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
            let m = get(addr, "/metrics").await;
            assert!(m.contains("# TYPE kubemq_amqp10_connections gauge"), "{m}");
            assert!(
                m.to_ascii_lowercase()
                    .contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
                "{m}"
            );
            assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        });
    }
}
