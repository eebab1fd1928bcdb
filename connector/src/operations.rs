//! Gauges about the process itself, beside MET-0's families: what alerts and dashboards need to
//! know (whether the broker answers, the memory budget and its use, the connection limit, when
//! the TLS certificate expires). MET-0 fixes `/metrics` at exactly eleven families, so these are
//! served at `/metrics/operations` (docs/decisions.md, "Operational metrics").

use std::fmt::Write;
use std::sync::Arc;

use tokio::sync::watch;

use crate::driver::TlsSource;
use crate::engine::ProcessBudget;

/// Where the operational gauges are read from, at each scrape.
#[derive(Clone)]
pub struct Operations {
    /// Whether the broker answers its pings (the same state as `/readyz`).
    pub broker_ready: watch::Receiver<bool>,
    /// The process memory budget every connection draws on.
    pub budget: Arc<ProcessBudget>,
    /// `MaxConnections` (0 = unlimited).
    pub max_connections: u32,
    /// The TLS listener's certificate source, when TLS is on.
    pub tls: Option<Arc<TlsSource>>,
}

impl Operations {
    /// The text exposition of the gauges (Prometheus text format 0.0.4).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let ready = u64::from(*self.broker_ready.borrow());
        gauge(
            &mut out,
            "kubemq_amqp_connector_broker_ready",
            "1 while the broker answers its pings (the connector admits connections), else 0",
            ready,
        );
        gauge(
            &mut out,
            "kubemq_amqp_connector_memory_budget_bytes",
            "Bytes all connections together may hold beyond their guaranteed share (MaxProcessMemory)",
            self.budget.limit(),
        );
        gauge(
            &mut out,
            "kubemq_amqp_connector_memory_budget_used_bytes",
            "Bytes of the process memory budget held now",
            self.budget.used(),
        );
        gauge(
            &mut out,
            "kubemq_amqp_connector_max_connections",
            "Connections this process accepts at once (MaxConnections; 0 = unlimited)",
            u64::from(self.max_connections),
        );
        if let Some(not_after) = self.tls.as_ref().and_then(|t| t.not_after()) {
            gauge(
                &mut out,
                "kubemq_amqp_connector_tls_certificate_not_after_seconds",
                "When the TLS listener's server certificate expires (Unix seconds)",
                not_after,
            );
        }
        out
    }
}

/// Appends one gauge family with a single unlabelled sample.
fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TlsFiles;

    fn operations(tls: Option<Arc<TlsSource>>) -> (Operations, watch::Sender<bool>) {
        let (tx, rx) = watch::channel(true);
        let budget = ProcessBudget::new(64 * 1024 * 1024);
        let held = budget.reserve(4096).expect("fits");
        std::mem::forget(held);
        (
            Operations {
                broker_ready: rx,
                budget,
                max_connections: 500,
                tls,
            },
            tx,
        )
    }

    fn value(text: &str, name: &str) -> Option<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .map(str::to_string)
    }

    /// Each gauge reads its source at the scrape: readiness as 1/0, the budget and its use,
    /// the connection limit; without TLS there is no certificate gauge.
    #[test]
    fn gauges_read_their_sources() {
        let (ops, ready) = operations(None);
        let text = ops.encode();
        assert_eq!(
            value(&text, "kubemq_amqp_connector_broker_ready").as_deref(),
            Some("1")
        );
        assert_eq!(
            value(&text, "kubemq_amqp_connector_memory_budget_bytes").as_deref(),
            Some("67108864")
        );
        assert_eq!(
            value(&text, "kubemq_amqp_connector_memory_budget_used_bytes").as_deref(),
            Some("4096")
        );
        assert_eq!(
            value(&text, "kubemq_amqp_connector_max_connections").as_deref(),
            Some("500")
        );
        assert!(!text.contains("tls_certificate"), "{text}");
        assert_eq!(text.matches("# TYPE ").count(), 4, "{text}");
        ready.send(false).expect("send");
        assert_eq!(
            value(&ops.encode(), "kubemq_amqp_connector_broker_ready").as_deref(),
            Some("0")
        );
    }

    /// The certificate gauge is the loaded certificate's notAfter, and follows a rotation of
    /// the files without a connection having been made.
    #[test]
    fn the_certificate_gauge_follows_a_rotation() {
        let dir = tempfile::tempdir().expect("dir");
        let write = |not_after: i64| {
            let mut params =
                rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
            params.not_after =
                time::OffsetDateTime::from_unix_timestamp(not_after).expect("timestamp");
            let key = rcgen::KeyPair::generate().expect("key");
            let cert = params.self_signed(&key).expect("cert");
            // A rotation writes new files; a different length or time marks them changed.
            std::fs::write(dir.path().join("tls.crt"), cert.pem()).expect("write cert");
            std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).expect("write key");
        };
        write(4_102_444_800); // 2100-01-01
        let files = TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            client_ca: None,
        };
        let tls = Arc::new(TlsSource::load(files).expect("load"));
        let (ops, _ready) = operations(Some(tls));
        let name = "kubemq_amqp_connector_tls_certificate_not_after_seconds";
        assert_eq!(value(&ops.encode(), name).as_deref(), Some("4102444800"));
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(4_133_980_800); // 2101-01-01
        assert_eq!(value(&ops.encode(), name).as_deref(), Some("4133980800"));
    }
}
