//! The HTTP endpoint for Kubernetes probes and Prometheus: a handful of paths answered from
//! memory, for clients that are few and quick. Bounded so that clients that connect and say
//! nothing can neither take the process's file descriptors nor keep a probe out: every socket is
//! accepted at once into a set of `Limits::connections` places, and when the set is full the
//! socket that has been quiet the longest is closed to make room (so a probe always gets in, and
//! a scraper's kept-alive connection outlives silent ones); a deadline for the request's headers
//! and for the whole connection, and a growing pause after a failed accept.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::accept::AcceptBackoff;
use crate::held::Held;

/// The Prometheus text format's Content-Type; Prometheus 3 refuses a scrape without one.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The Content-Type of JSON answers.
pub const JSON_CONTENT_TYPE: &str = "application/json";
/// The Content-Type of every other answer.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// What a path is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status code.
    pub status: u16,
    /// Its Content-Type.
    pub content_type: &'static str,
    /// Its body.
    pub body: String,
}

impl Answer {
    /// A `text/plain` answer.
    pub fn text(status: u16, body: impl Into<String>) -> Answer {
        Answer {
            status,
            content_type: TEXT_CONTENT_TYPE,
            body: body.into(),
        }
    }

    /// A Prometheus scrape.
    pub fn metrics(body: String) -> Answer {
        Answer {
            status: 200,
            content_type: METRICS_CONTENT_TYPE,
            body,
        }
    }

    /// A JSON document.
    pub fn json(body: String) -> Answer {
        Answer {
            status: 200,
            content_type: JSON_CONTENT_TYPE,
            body,
        }
    }

    /// 404 for a path the endpoint does not serve.
    pub fn not_found() -> Answer {
        Answer::text(404, "not found\n")
    }
}

/// The answer to one of the paths every binary of the project serves: `/livez` (the process
/// runs), `/readyz` (`ready()` says whether it can do its work) and `/metrics` (the Prometheus
/// text `metrics()` encodes); anything else is not found.
pub fn probe(path: &str, ready: impl FnOnce() -> bool, metrics: impl FnOnce() -> String) -> Answer {
    match path {
        "/livez" => Answer::text(200, "ok\n"),
        "/readyz" if ready() => Answer::text(200, "ready\n"),
        "/readyz" => Answer::text(503, "not ready\n"),
        "/metrics" => Answer::metrics(metrics()),
        _ => Answer::not_found(),
    }
}

/// What one client of the endpoint may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections held at once; a newcomer past it closes the quietest.
    pub connections: usize,
    /// Time to send a request's headers.
    pub header_read: Duration,
    /// Longest life of one connection.
    pub life: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 1024,
            header_read: Duration::from_secs(5),
            life: Duration::from_secs(60),
        }
    }
}

/// Serves `answer(path)` for every GET on `listener` within `limits`, until the task is dropped.
pub async fn serve<A, F>(listener: tokio::net::TcpListener, limits: Limits, answer: A)
where
    A: Fn(String) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Answer> + Send + 'static,
{
    let held = Held::new(limits.connections);
    let mut backoff = AcceptBackoff::new("HTTP");
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff.succeeded();
                accepted
            }
            Err(e) => {
                backoff.failed(&e).await;
                continue;
            }
        };
        let admitted = held.admit(peer.ip());
        let hold = Arc::new(admitted.hold);
        let mut evicted = admitted.evicted;
        let answer = answer.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                hold.active();
                let answered = answer(req.uri().path().to_string());
                async move { Ok::<_, Infallible>(response(answered.await)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = tokio::time::timeout(limits.life, connection) => {}
                Ok(()) = &mut evicted => {}
            }
        });
        // A flood of connects must not keep the accept loop from the connections' own tasks.
        tokio::task::yield_now().await;
    }
}

fn response(a: Answer) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(a.body)));
    *r.status_mut() = StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(a.content_type),
    );
    r
}
