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
                let mut r = Response::new(Full::new(Bytes::from(body)));
                *r.status_mut() = status;
                async move { Ok::<_, Infallible>(r) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}
