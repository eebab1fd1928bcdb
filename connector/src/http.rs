//! The connector's HTTP endpoint: `/metrics` (Prometheus text), `/livez` (the process runs) and
//! `/readyz` (the AMQP listener is bound and the backend reachable), for Kubernetes probes and
//! scrapers.

use std::convert::Infallible;
use std::sync::Arc;

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

/// Serves the endpoint on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, health: Health) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = respond(&health, req.uri().path());
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
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
