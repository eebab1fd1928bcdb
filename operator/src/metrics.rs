//! The operator's Prometheus metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Counters the reconcile loop updates.
#[derive(Clone)]
pub struct Metrics {
    /// Reconciles started.
    pub reconciles: Counter,
    /// Reconciles finished, their next run scheduled (after error_policy for failed ones):
    /// equal to `reconciles` when nothing is in progress.
    pub reconciles_done: Counter,
    /// Reconciles that scheduled their next run after a delay (the drift check, or a retry).
    pub timed_reruns: Counter,
    /// 1 while this replica reconciles (it holds the Lease, or runs without election).
    pub leading: Gauge,
    /// Reconciles that failed with an API error (retried with backoff).
    pub errors: Counter,
    /// Reconciles that found an invalid or unsupported spec (not retried).
    pub invalid_specs: Counter,
    registry: std::sync::Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        let (reconciles, reconciles_done, errors, invalid_specs) = (
            Counter::default(),
            Counter::default(),
            Counter::default(),
            Counter::default(),
        );
        let (leading, timed_reruns) = (Gauge::default(), Counter::default());
        let mut registry = Registry::with_prefix("amqp_connector_operator");
        registry.register("reconciles", "Reconciles started", reconciles.clone());
        registry.register(
            "reconciles_done",
            "Reconciles finished, their next run scheduled",
            reconciles_done.clone(),
        );
        registry.register(
            "timed_reruns",
            "Reconciles that scheduled their next run after a delay",
            timed_reruns.clone(),
        );
        registry.register(
            "leading",
            "1 while this replica reconciles (holds the Lease or runs without election)",
            leading.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles failed with an API error",
            errors.clone(),
        );
        registry.register(
            "invalid_specs",
            "Reconciles that found an invalid or unsupported spec",
            invalid_specs.clone(),
        );
        Metrics {
            reconciles,
            reconciles_done,
            timed_reruns,
            leading,
            errors,
            invalid_specs,
            registry: std::sync::Arc::new(registry),
        }
    }
}

impl Metrics {
    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
