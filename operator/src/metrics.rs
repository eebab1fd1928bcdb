//! The operator's Prometheus metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Counters the reconcile loop updates.
#[derive(Clone)]
pub struct Metrics {
    /// Reconciles started.
    pub reconciles: Counter,
    /// Reconciles that failed with an API error (retried with backoff).
    pub errors: Counter,
    /// Reconciles that found an invalid or unsupported spec (not retried).
    pub invalid_specs: Counter,
    registry: std::sync::Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        let (reconciles, errors, invalid_specs) =
            (Counter::default(), Counter::default(), Counter::default());
        let mut registry = Registry::with_prefix("amqp_connector_operator");
        registry.register("reconciles", "Reconciles started", reconciles.clone());
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
