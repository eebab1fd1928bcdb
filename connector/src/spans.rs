//! OpenTelemetry spans of the connector's own work on a message, exported over OTLP/gRPC to the
//! endpoint `OTEL_EXPORTER_OTLP_ENDPOINT` names, as children of the producer's span (the W3C
//! `traceparent` among the message's application properties, or an Azure SDK's `Diagnostic-Id`
//! in the same form). A message without one gets no spans; neither does any message when the
//! variable is unset, and then the only cost on a message's path is one atomic load.
//!
//! Spans are recorded once their work is over, with the start and end times it took, so no
//! span object travels with a message: only its parent's context, and only when export is on.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Instant, SystemTime};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use opentelemetry_sdk::Resource;

use crate::backend::BackendError;
use crate::pattern::Pattern;

/// The variable that turns export on.
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The service name spans carry unless `OTEL_SERVICE_NAME` names another.
const SERVICE: &str = "kubemq-amqp-connector";

/// The tracer, set once at start when export is on.
static TRACER: OnceLock<Tracer> = OnceLock::new();

/// Why export could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` asks for a transport the connector does not speak.
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL={0} is not supported: the connector exports OTLP over gRPC only (grpc)")]
    Protocol(String),
    /// The endpoint is not a plain `http://` one.
    #[error("cannot export spans to {0:?}: the connector exports OTLP over plain gRPC, to an http:// endpoint (a collector beside it can forward over TLS)")]
    Scheme(String),
    /// The exporter could not be built (an endpoint that is not a URI, ...).
    #[error("cannot export spans to {endpoint}: {reason}")]
    Exporter {
        /// The endpoint asked for.
        endpoint: String,
        /// The exporter's own words.
        reason: String,
    },
}

/// The running export: flushes what is left at the end.
pub struct Export {
    provider: Option<SdkTracerProvider>,
}

impl Export {
    /// Export off: nothing to flush.
    pub fn off() -> Export {
        Export { provider: None }
    }

    /// Whether spans are exported.
    pub fn is_on(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends the spans recorded so far now, rather than with the next batch.
    pub fn flush(&self) {
        if let Some(p) = &self.provider {
            if let Err(e) = p.force_flush() {
                tracing::warn!(error = %e, "spans not exported");
            }
        }
    }

    /// Sends the spans still buffered and stops the exporter (at shutdown).
    pub async fn finish(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // The provider's shutdown blocks until its exporter thread has sent the last batch.
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = done {
            tracing::warn!(error = %e, "spans left unexported at shutdown");
        }
    }
}

/// Starts export when `var(OTEL_EXPORTER_OTLP_ENDPOINT)` is set (and `OTEL_SDK_DISABLED` is
/// not `true`), to that endpoint or to `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` where it is set too;
/// called once, within the runtime, before any connection is served. The SDK reads its other
/// settings (`OTEL_BSP_*`, `OTEL_TRACES_SAMPLER`, headers, timeout) from the environment itself.
pub fn start(var: impl Fn(&str) -> Option<String>) -> Result<Export, StartError> {
    let set = |k: &str| var(k).filter(|v| !v.is_empty());
    if set(ENDPOINT_VAR).is_none()
        || set("OTEL_SDK_DISABLED").is_some_and(|d| d.eq_ignore_ascii_case("true"))
    {
        return Ok(Export::off());
    }
    if let Some(p) = set("OTEL_EXPORTER_OTLP_PROTOCOL").filter(|p| p != "grpc") {
        return Err(StartError::Protocol(p));
    }
    let endpoint = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| set(ENDPOINT_VAR))
        .unwrap_or_default();
    if !endpoint.starts_with("http://") {
        return Err(StartError::Scheme(endpoint));
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
        .map_err(|e| StartError::Exporter {
            endpoint: endpoint.clone(),
            reason: e.to_string(),
        })?;
    let mut resource = Resource::builder();
    let named = set("OTEL_SERVICE_NAME").is_some()
        || set("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name(SERVICE);
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let _ = TRACER.set(provider.tracer(SERVICE));
    tracing::info!(%endpoint, "exporting spans over OTLP/gRPC");
    Ok(Export {
        provider: Some(provider),
    })
}

/// The producer's span a message names: where the connector's spans of it hang.
#[derive(Debug, Clone)]
pub struct Parent(SpanContext);

/// A message the connector records spans of: its producer's span and where it goes. Carried
/// with the message only while export is on and the message names a parent.
#[derive(Debug, Clone)]
pub struct Traced {
    parent: Parent,
    pattern: Pattern,
    channel: String,
}

/// The trace of a message of `pattern` on `channel` with `tags`: `Some` when export is on and
/// the tags name a parent span.
pub fn traced(
    tags: &HashMap<String, String>,
    pattern: Pattern,
    channel: &str,
) -> Option<Box<Traced>> {
    TRACER.get()?;
    Some(Box::new(Traced {
        parent: read_parent(tags)?,
        pattern,
        channel: channel.to_string(),
    }))
}

impl Traced {
    /// Records `step`, from `from` to `to`, as a child of the producer's span; returns it, the
    /// parent of the spans within it.
    pub fn record(
        &self,
        step: Step,
        (from, to): (Instant, Instant),
        extra: &[KeyValue],
    ) -> Option<Parent> {
        self.record_under(&self.parent, step, (from, to), extra)
    }

    /// Records `step` as a child of `within`, a span recorded before.
    pub fn record_under(
        &self,
        within: &Parent,
        step: Step,
        (from, to): (Instant, Instant),
        extra: &[KeyValue],
    ) -> Option<Parent> {
        record(
            within,
            Span {
                step,
                pattern: self.pattern,
                channel: &self.channel,
                from,
                to,
            },
            extra,
        )
    }
}

/// The span `traceparent` (and `tracestate`) name, else the one `Diagnostic-Id` names.
/// The span `traceparent` (with `tracestate`) names, else the one `Diagnostic-Id` names.
fn read_parent(tags: &HashMap<String, String>) -> Option<Parent> {
    let from = |tags: &HashMap<String, String>| {
        let cx = TraceContextPropagator::new().extract(tags);
        let span = cx.span().span_context().clone();
        span.is_valid().then_some(span)
    };
    let span = from(tags).or_else(|| {
        // Azure's AMQP SDKs put a W3C traceparent in Diagnostic-Id.
        let id = tags.get("Diagnostic-Id")?;
        from(&HashMap::from([("traceparent".to_string(), id.clone())]))
    })?;
    Some(Parent(span))
}

/// What the connector did with a message, as its span names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// From a producer's complete transfer to the backend's answer that it took the message.
    Publish,
    /// The backend call that stored it (a child of its publish span).
    Store,
    /// From taking it off the backend to its transfer to a consumer.
    Deliver,
    /// From its transfer to the consumer's settlement.
    Settle,
    /// From a requester's transfer to the response (or failure) KubeMQ gave back.
    Request,
    /// From a responder's reply transfer to KubeMQ's taking the response.
    Reply,
}

impl Step {
    /// The span's operation name (`messaging.operation.name`).
    pub fn name(self) -> &'static str {
        match self {
            Step::Publish => "publish",
            Step::Store => "store",
            Step::Deliver => "deliver",
            Step::Settle => "settle",
            Step::Request => "request",
            Step::Reply => "reply",
        }
    }

    /// `messaging.operation.type`, from the semantic conventions' list.
    fn operation_type(self) -> &'static str {
        match self {
            Step::Publish | Step::Store | Step::Request | Step::Reply => "send",
            Step::Deliver => "receive",
            Step::Settle => "settle",
        }
    }

    fn kind(self) -> SpanKind {
        match self {
            Step::Publish | Step::Reply => SpanKind::Producer,
            Step::Store | Step::Request | Step::Settle => SpanKind::Client,
            Step::Deliver => SpanKind::Consumer,
        }
    }
}

/// The `error.type` attribute of a step the backend failed.
pub fn failed(e: &BackendError) -> KeyValue {
    let kind = match e {
        BackendError::Unavailable(_) => "unavailable",
        BackendError::Unknown(_) => "unknown",
        BackendError::Invalid(_) => "invalid",
        BackendError::ClientIdInUse(_) => "client_id_in_use",
        BackendError::Rejected(_) => "rejected",
        BackendError::Unauthorized(_) => "unauthorized",
    };
    KeyValue::new("error.type", kind)
}

/// One span to record: a step on a message of `pattern` on `channel`, from `from` to `to`.
#[derive(Debug, Clone, Copy)]
struct Span<'a> {
    step: Step,
    pattern: Pattern,
    channel: &'a str,
    from: Instant,
    to: Instant,
}

/// The wall-clock time of `at`, an instant in the past or the present.
fn wall(at: Instant, now: (Instant, SystemTime)) -> SystemTime {
    let moved = match now.0.checked_duration_since(at) {
        Some(ago) => now.1.checked_sub(ago),
        None => now.1.checked_add(at.duration_since(now.0)),
    };
    moved.unwrap_or(now.1)
}

/// Records `span` under `parent` with `extra` attributes; returns the recorded span, a parent
/// for the spans within it. `None` when export is off.
fn record(parent: &Parent, span: Span<'_>, extra: &[KeyValue]) -> Option<Parent> {
    let tracer = TRACER.get()?;
    let now = (Instant::now(), SystemTime::now());
    let mut attributes = vec![
        KeyValue::new("messaging.system", "kubemq"),
        KeyValue::new("messaging.operation.name", span.step.name()),
        KeyValue::new("messaging.operation.type", span.step.operation_type()),
        KeyValue::new("messaging.destination.name", span.channel.to_string()),
        KeyValue::new("messaging.kubemq.pattern", span.pattern.name()),
        KeyValue::new("network.protocol.name", "amqp"),
        KeyValue::new("network.protocol.version", "1.0"),
    ];
    attributes.extend_from_slice(extra);
    let builder = tracer
        .span_builder(format!("{} {}", span.step.name(), span.channel))
        .with_kind(span.step.kind())
        .with_start_time(wall(span.from, now))
        .with_attributes(attributes);
    let cx = Context::new().with_remote_span_context(parent.0.clone());
    let mut recorded = tracer.build_with_context(builder, &cx);
    let context = recorded.span_context().clone();
    recorded.end_with_timestamp(wall(span.to, now));
    Some(Parent(context))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A moment before now maps to the same distance before the wall clock's now, and one
    /// after it (a step that ended after the clock was read) after it.
    #[test]
    fn instants_map_onto_the_wall_clock() {
        let base = Instant::now();
        let wall_now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let before = base.checked_sub(Duration::from_millis(250)).unwrap();
        assert_eq!(
            wall(before, (base, wall_now)),
            wall_now - Duration::from_millis(250)
        );
        let after = base + Duration::from_millis(5);
        assert_eq!(
            wall(after, (base, wall_now)),
            wall_now + Duration::from_millis(5)
        );
    }

    /// Export starts only with an endpoint, and refuses what it would not honour: another
    /// protocol, an endpoint that is not plain gRPC.
    #[test]
    fn export_is_off_without_an_endpoint_and_refuses_what_it_cannot_do() {
        let env = |pairs: &[(&'static str, &'static str)]| {
            let pairs = pairs.to_vec();
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(!start(env(&[])).unwrap().is_on());
        assert!(!start(env(&[(ENDPOINT_VAR, "")])).unwrap().is_on());
        let disabled = [
            (ENDPOINT_VAR, "http://c:4317"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ];
        assert!(!start(env(&disabled)).unwrap().is_on());
        let http = [
            (ENDPOINT_VAR, "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ];
        assert!(matches!(start(env(&http)), Err(StartError::Protocol(p)) if p == "http/protobuf"));
        let tls = [(ENDPOINT_VAR, "https://c:4317")];
        assert!(matches!(start(env(&tls)), Err(StartError::Scheme(e)) if e == "https://c:4317"));
        let traces = [
            (ENDPOINT_VAR, "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "c:4317"),
        ];
        assert!(matches!(start(env(&traces)), Err(StartError::Scheme(e)) if e == "c:4317"));
        assert!(TRACER.get().is_none(), "none of these started export");
    }

    /// With export off no parent is read, whatever the tags say, and nothing is recorded.
    #[test]
    fn off_means_no_parent() {
        let tags = HashMap::from([(
            "traceparent".to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string(),
        )]);
        assert!(TRACER.get().is_none());
        assert!(traced(&tags, Pattern::Queues, "q").is_none());
    }

    /// `traceparent` with its `tracestate`, else `Diagnostic-Id`; a malformed one names none.
    #[test]
    fn the_parent_is_read_from_traceparent_or_diagnostic_id() {
        let tags = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let w3c = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let azure = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let p = read_parent(&tags(&[("traceparent", w3c), ("tracestate", "k=v")])).unwrap();
        assert_eq!(
            p.0.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(p.0.span_id().to_string(), "00f067aa0ba902b7");
        assert!(p.0.is_sampled() && p.0.is_remote());
        assert_eq!(p.0.trace_state().get("k"), Some("v"));
        let p = read_parent(&tags(&[("Diagnostic-Id", azure)])).unwrap();
        assert_eq!(p.0.span_id().to_string(), "b7ad6b7169203331");
        // A valid traceparent wins over Diagnostic-Id.
        let p = read_parent(&tags(&[("traceparent", w3c), ("Diagnostic-Id", azure)])).unwrap();
        assert_eq!(p.0.span_id().to_string(), "00f067aa0ba902b7");
        for bad in [
            "",
            "00-0-0-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            assert!(
                read_parent(&tags(&[("traceparent", bad)])).is_none(),
                "{bad}"
            );
        }
        assert!(read_parent(&tags(&[("Diagnostic-Id", "|abc.1.")])).is_none());
    }
}
