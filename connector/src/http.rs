//! The connector's HTTP endpoint: `/metrics` (Prometheus text, MET-0's families),
//! `/metrics/operations` (the process's own gauges, `operations`), `/livez` (the process runs)
//! and `/readyz` (the AMQP listener is bound and the backend reachable), for Kubernetes probes
//! and scrapers; the detail endpoints `/api/amqp10/connections` and `/api/amqp10/links` (OBS-1), for
//! people; and `/api/amqp10/stages`, where queue messages' time goes (`stages`), for the load tool.

use std::sync::Arc;

use ops::http::Limits;

use ops::http::Answer;

use crate::detail::Registry;
use crate::metrics::Metrics;
use crate::operations::Operations;

/// What the endpoint reports.
#[derive(Clone)]
pub struct Health {
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
    /// Whether the connector is ready to serve clients.
    pub ready: tokio::sync::watch::Receiver<bool>,
    /// The open connections, for the detail endpoints.
    pub registry: Arc<Registry>,
    /// The process's own gauges.
    pub operations: Operations,
}

/// Serves the endpoint on `listener`, within the default [`Limits`], until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, health: Health) {
    ops::http::serve(listener, Limits::default(), move |path: String| {
        let health = health.clone();
        async move {
            // OBS-4: answered from start-up on, whatever the connector's readiness.
            match path.as_str() {
                "/api/amqp10/connections" => Answer::json(health.registry.connections_json().await),
                "/api/amqp10/links" => Answer::json(health.registry.links_json().await),
                "/api/amqp10/stages" => Answer::json(health.metrics.stages.json()),
                "/metrics/operations" => {
                    let ready = *health.ready.borrow();
                    Answer::metrics(health.operations.encode(ready, &health.metrics))
                }
                _ => ops::http::probe(&path, || *health.ready.borrow(), || health.metrics.encode()),
            }
        }
    })
    .await
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

    /// /livez always, /readyz only when ready, /metrics with the families, the operational
    /// gauges on a page of their own.
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
                registry: Arc::default(),
                operations: Operations {
                    budget: crate::engine::ProcessBudget::new(1 << 20),
                    max_connections: 0,
                    tls: None,
                },
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
            let o = get(addr, "/metrics/operations").await;
            assert!(
                o.contains("\nkubemq_amqp_connector_broker_ready 1\n"),
                "{o}"
            );
            assert!(
                !o.contains("kubemq_amqp10_"),
                "MET-0's families stay on /metrics: {o}"
            );
            assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
            ready.send_replace(false);
            // OBS-4: the detail endpoints answer empty lists whatever the readiness.
            let c = get(addr, "/api/amqp10/connections").await;
            assert!(c.starts_with("HTTP/1.1 200"), "{c}");
            assert!(c.ends_with(r#"{"connections":[],"total":0}"#), "{c}");
            assert!(
                c.to_ascii_lowercase()
                    .contains("content-type: application/json\r\n"),
                "{c}"
            );
            let l = get(addr, "/api/amqp10/links").await;
            assert!(l.ends_with(r#"{"links":[],"total":0}"#), "{l}");
        });
    }
}
