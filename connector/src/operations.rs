//! Gauges about the process itself, beside MET-0's families: what alerts and dashboards need to
//! know (whether the broker answers, the memory budget and its use, the connection limit, when
//! the TLS certificate expires, failed TLS handshakes, logins and authorizations), where
//! queue messages' time goes (the stage histograms), and the messages of each channel.
//! MET-0 fixes `/metrics` at exactly eleven families, so these are served at
//! `/metrics/operations` (docs/decisions.md, "Operational metrics").

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::channel_traffic::{MAX_CHANNELS, OTHER};
use crate::driver::TlsSource;
use crate::engine::ProcessBudget;
use crate::failures::FAILURES;
use crate::metrics::{Direction, Metrics};
use crate::stages::{Coarse, Stage};

/// Where the operational gauges are read from, at each scrape.
#[derive(Clone)]
pub struct Operations {
    /// The process memory budget every connection draws on.
    pub budget: Arc<ProcessBudget>,
    /// `MaxConnections` (0 = unlimited).
    pub max_connections: u32,
    /// The TLS listener's certificate source, when TLS is on.
    pub tls: Option<Arc<TlsSource>>,
}

impl Operations {
    /// The text exposition of the gauges, with `broker_ready` the state `/readyz` answers, of
    /// the queue stage histograms and of the per-channel transfers counted in `metrics`.
    pub fn encode(&self, broker_ready: bool, metrics: &Metrics) -> String {
        let stages = &metrics.stages;
        let mut r = Registry::default();
        let mut gauge = |name: &str, help: &str, value: u64| {
            let g = Gauge::<i64>::default();
            g.set(i64::try_from(value).unwrap_or(i64::MAX));
            r.register(name, help, g);
        };
        gauge(
            "kubemq_amqp_connector_broker_ready",
            "1 while the broker answers its pings (the connector admits connections), else 0",
            u64::from(broker_ready),
        );
        gauge(
            "kubemq_amqp_connector_memory_budget_bytes",
            "Bytes all connections together may hold beyond their guaranteed share (MaxProcessMemory)",
            self.budget.limit(),
        );
        gauge(
            "kubemq_amqp_connector_memory_budget_used_bytes",
            "Bytes of the process memory budget held now",
            self.budget.used(),
        );
        gauge(
            "kubemq_amqp_connector_max_connections",
            "Connections this process accepts at once (MaxConnections; 0 = unlimited)",
            u64::from(self.max_connections),
        );
        if let Some(not_after) = self.tls.as_ref().and_then(|t| t.not_after()) {
            gauge(
                "kubemq_amqp_connector_tls_certificate_not_after_seconds",
                "When the TLS listener's server certificate expires (Unix seconds)",
                u64::try_from(not_after).unwrap_or(0),
            );
        }
        let mut counter = |name: &str, help: &str, value: u64| {
            let c = Counter::<u64>::default();
            c.inc_by(value);
            r.register(name, help, c);
        };
        counter(
            "kubemq_amqp_connector_tls_handshake_failures",
            "TLS handshakes that failed or did not finish in time",
            FAILURES.tls_handshakes(),
        );
        counter(
            "kubemq_amqp_connector_authentication_failures",
            "SASL exchanges that failed",
            FAILURES.authentications(),
        );
        counter(
            "kubemq_amqp_connector_authorization_denials",
            "Actions the authorization policy denied",
            FAILURES.authorizations(),
        );
        let channels = Family::<ChannelLabels, Counter<u64>>::default();
        for t in metrics.channels.snapshot() {
            channels
                .get_or_create(&ChannelLabels {
                    pattern: t.pattern.name().to_string(),
                    channel: t.channel,
                    direction: match t.direction {
                        Direction::In => "in",
                        Direction::Out => "out",
                    },
                })
                .inc_by(t.count);
        }
        r.register(
            "kubemq_amqp_connector_channel_transfers",
            format!(
                "Messages in (from producers and requesters) and out (to consumers and \
                 responders) per channel; each pattern's channels after its first {MAX_CHANNELS} \
                 together as channel=\"{OTHER}\""
            ),
            channels,
        );
        r.register_collector(Box::new(StageHistograms(
            Stage::ALL
                .iter()
                .map(|&s| (s.name(), stages.coarse(s)))
                .collect(),
        )));
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &r).is_err() {
            out.clear();
        }
        out
    }
}

/// Label set of a channel's transfers.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChannelLabels {
    pattern: String,
    channel: String,
    direction: &'static str,
}

/// Label set `stage`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: String,
}

/// The stage histograms at one scrape, as the family
/// `kubemq_amqp_connector_queue_stage_seconds{stage}`.
#[derive(Debug)]
struct StageHistograms(Vec<(&'static str, Coarse)>);

impl Collector for StageHistograms {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "kubemq_amqp_connector_queue_stage_seconds",
            "Where queue messages' time goes: stored (delivery to the backend's answer), waited \
             (in the queue until the Get loop took it), handed_out (to the consumer's link), \
             settled (transfer to the client's settlement)",
            None,
            MetricType::Histogram,
        )?;
        for (stage, h) in &self.0 {
            let label = StageLabel {
                stage: (*stage).to_string(),
            };
            family
                .encode_family(&label)?
                .encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &h.buckets, None)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TlsFiles;

    /// The gauges' sources, with 4 KiB of the budget held while the `Reserved` lives.
    fn operations(tls: Option<Arc<TlsSource>>) -> (Operations, crate::engine::Reserved) {
        let budget = ProcessBudget::new(64 * 1024 * 1024);
        let held = budget.reserve(4096).expect("fits");
        let ops = Operations {
            budget,
            max_connections: 500,
            tls,
        };
        (ops, held)
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
        let (ops, _held) = operations(None);
        let text = ops.encode(true, &Metrics::new());
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
        assert_eq!(text.matches("# TYPE ").count(), 8, "{text}");
        assert_eq!(
            value(
                &ops.encode(false, &Metrics::new()),
                "kubemq_amqp_connector_broker_ready"
            )
            .as_deref(),
            Some("0")
        );
    }

    /// The failure counters count what was reported, wherever it was.
    #[test]
    fn failure_counters_count() {
        let (ops, _held) = operations(None);
        let read = |name: &str| -> u64 {
            value(&ops.encode(true, &Metrics::new()), name)
                .and_then(|v| v.parse().ok())
                .expect("a counter")
        };
        let names = [
            "kubemq_amqp_connector_tls_handshake_failures_total",
            "kubemq_amqp_connector_authentication_failures_total",
            "kubemq_amqp_connector_authorization_denials_total",
        ];
        // Other tests of this process may count too: only growth is certain.
        let before: Vec<u64> = names.iter().map(|n| read(n)).collect();
        FAILURES.tls_handshake_failed();
        FAILURES.authentication_failed();
        FAILURES.authentication_failed();
        FAILURES.authorization_denied();
        let after: Vec<u64> = names.iter().map(|n| read(n)).collect();
        for ((name, b), (a, at_least)) in names
            .iter()
            .zip(before)
            .zip(after.into_iter().zip([1, 2, 1]))
        {
            assert!(a >= b + at_least, "{name}: {b} then {a}");
        }
    }

    /// Per-channel transfers are a counter family by pattern, channel and direction.
    #[test]
    fn channel_transfers_are_a_counter_family() {
        let (ops, _held) = operations(None);
        let metrics = Metrics::new();
        let queues = crate::pattern::Pattern::Queues;
        metrics.channels.count(queues, "orders", Direction::In);
        metrics.channels.count(queues, "orders", Direction::In);
        metrics.channels.count(queues, "orders", Direction::Out);
        let text = ops.encode(true, &metrics);
        let name = "kubemq_amqp_connector_channel_transfers_total";
        assert!(
            text.contains("# TYPE kubemq_amqp_connector_channel_transfers counter"),
            "{text}"
        );
        let series =
            |d: &str| format!("{name}{{pattern=\"queues\",channel=\"orders\",direction=\"{d}\"}}");
        assert_eq!(value(&text, &series("in")).as_deref(), Some("2"), "{text}");
        assert_eq!(value(&text, &series("out")).as_deref(), Some("1"), "{text}");
    }

    /// The stage histograms: one series set per stage, cumulative buckets ending at `+Inf`, sum
    /// and count as counted.
    #[test]
    fn stage_histograms_are_prometheus_histograms() {
        let (ops, _held) = operations(None);
        let metrics = Metrics::new();
        let stages = &metrics.stages;
        stages.record(Stage::Waited, std::time::Duration::from_micros(20));
        stages.record(Stage::Waited, std::time::Duration::from_micros(70));
        let text = ops.encode(true, &metrics);
        assert!(
            text.contains("# TYPE kubemq_amqp_connector_queue_stage_seconds histogram"),
            "{text}"
        );
        let name = "kubemq_amqp_connector_queue_stage_seconds";
        assert_eq!(
            value(&text, &format!("{name}_count{{stage=\"waited\"}}")).as_deref(),
            Some("2")
        );
        assert_eq!(
            value(
                &text,
                &format!("{name}_bucket{{le=\"+Inf\",stage=\"waited\"}}")
            )
            .or_else(|| value(
                &text,
                &format!("{name}_bucket{{stage=\"waited\",le=\"+Inf\"}}")
            ))
            .as_deref(),
            Some("2")
        );
        assert_eq!(
            value(&text, &format!("{name}_count{{stage=\"stored\"}}")).as_deref(),
            Some("0")
        );
        // Cumulative: the 20 µs one is in every bucket from 2^15 ns on, both from 2^17 ns on.
        let waited: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}_bucket")) && l.contains("\"waited\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert_eq!(waited.len(), 22, "{text}");
        assert!(waited.windows(2).all(|w| w[0] <= w[1]), "{waited:?}");
        assert_eq!(waited.first(), Some(&0));
        assert_eq!(waited.last(), Some(&2));
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
        let (ops, _held) = operations(Some(tls));
        let name = "kubemq_amqp_connector_tls_certificate_not_after_seconds";
        assert_eq!(
            value(&ops.encode(true, &Metrics::new()), name).as_deref(),
            Some("4102444800")
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(4_133_980_800); // 2101-01-01
        assert_eq!(
            value(&ops.encode(true, &Metrics::new()), name).as_deref(),
            Some("4133980800")
        );
    }
}
