//! Traces that follow a message from its producer through the connector and the broker to its
//! consumer, on every backend (the real KubeMQ included where its binary is found): the test's
//! producer and consumer are traced with the OpenTelemetry SDK, as two services, and put the
//! producer's span in the message's `traceparent` as any instrumented client does; the connector
//! exports its own spans over OTLP/gRPC. All three send to a real Jaeger (built from its Go module
//! by tests/jaeger/build.sh), and the test reads each trace back from Jaeger's query API.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use connector::config::Settings;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Body, Message, MessageId, Outcome, Properties,
};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use interop_tests::TestConnector;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    Span as _, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::Value as Json;

/// Jaeger's configuration, its addresses taken from its environment.
const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/jaeger/config.yaml");
/// The connector's service name in the traces.
const CONNECTOR: &str = "kubemq-amqp-connector";

/// A Jaeger with in-memory storage, its OTLP/gRPC receiver and query API on loopback ports of
/// its own; killed when dropped.
struct Jaeger {
    child: Child,
    otlp: SocketAddr,
    query: SocketAddr,
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Jaeger {
    fn start() -> Jaeger {
        let binary = std::env::var_os("JAEGER")
            .expect("JAEGER names the Jaeger binary (tests/run.sh builds it)");
        let port = |_| -> SocketAddr {
            format!("127.0.0.1:{}", testkit::free_port())
                .parse()
                .unwrap()
        };
        let [otlp, query, query_grpc, metrics] = [0, 1, 2, 3].map(port);
        let (_, log) = testkit::logs::file("jaeger");
        let child = Command::new(binary)
            .arg(format!("--config={CONFIG}"))
            .env("JAEGER_OTLP", otlp.to_string())
            .env("JAEGER_QUERY", query.to_string())
            .env("JAEGER_QUERY_GRPC", query_grpc.to_string())
            .env("JAEGER_METRICS_PORT", metrics.port().to_string())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let jaeger = Jaeger { child, otlp, query };
        testkit::eventually("Jaeger answers", Duration::from_secs(60), || {
            jaeger.get("/api/services").is_some()
        });
        jaeger
    }

    /// The OTLP/gRPC endpoint, as `OTEL_EXPORTER_OTLP_ENDPOINT` names it.
    fn endpoint(&self) -> String {
        format!("http://{}", self.otlp)
    }

    /// A query API path's JSON, when it answers 200.
    fn get(&self, path: &str) -> Option<Json> {
        let reply = testkit::http_get(self.query, path)?;
        (reply.status == 200).then(|| serde_json::from_str(&reply.body).ok())?
    }

    /// The spans of trace `id`, once it holds `count` of them (within 30 s).
    fn spans(&self, id: &str, count: usize) -> Vec<Recorded> {
        let path = format!("/api/traces/{id}");
        let mut last = Vec::new();
        for _ in 0..300 {
            if let Some(json) = self.get(&path) {
                last = recorded(&json);
                if last.len() >= count {
                    return last;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let reply = testkit::http_get(self.query, &path);
        panic!("trace {id} never held {count} spans; it holds {last:#?}; {path}: {reply:?}");
    }
}

/// A span as Jaeger gives it back.
#[derive(Debug, Clone)]
struct Recorded {
    service: String,
    name: String,
    id: String,
    trace: String,
    /// The span it is a child of.
    parent: Option<String>,
    kind: String,
    tags: HashMap<String, String>,
}

/// The spans of a `/api/traces/<id>` answer.
fn recorded(json: &Json) -> Vec<Recorded> {
    let mut out = Vec::new();
    for trace in json["data"].as_array().into_iter().flatten() {
        let services: HashMap<&str, &str> = trace["processes"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, p)| (k.as_str(), p["serviceName"].as_str().unwrap_or("")))
            .collect();
        for s in trace["spans"].as_array().into_iter().flatten() {
            let tags: HashMap<String, String> = s["tags"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    let v = match &t["value"] {
                        Json::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (t["key"].as_str().unwrap_or("").to_string(), v)
                })
                .collect();
            let parent = s["references"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["refType"] == "CHILD_OF")
                .and_then(|r| r["spanID"].as_str())
                .map(str::to_string);
            out.push(Recorded {
                service: services
                    .get(s["processID"].as_str().unwrap_or(""))
                    .copied()
                    .unwrap_or("")
                    .to_string(),
                name: s["operationName"].as_str().unwrap_or("").to_string(),
                id: s["spanID"].as_str().unwrap_or("").to_string(),
                trace: s["traceID"].as_str().unwrap_or("").to_string(),
                parent,
                kind: tags.get("span.kind").cloned().unwrap_or_default(),
                tags,
            });
        }
    }
    out
}

/// The one span named `name` of `service`.
fn one<'a>(spans: &'a [Recorded], service: &str, name: &str) -> &'a Recorded {
    let found: Vec<&Recorded> = spans
        .iter()
        .filter(|s| s.service == service && s.name == name)
        .collect();
    assert_eq!(found.len(), 1, "one {service} span {name:?} in {spans:#?}");
    found[0]
}

/// Checks one of the connector's spans: its parent, its kind and its messaging attributes.
fn connector_span<'a>(
    spans: &'a [Recorded],
    (step, destination, pattern): (&str, &str, &str),
    parent: &Recorded,
    kind: &str,
) -> &'a Recorded {
    let s = one(spans, CONNECTOR, &format!("{step} {destination}"));
    assert_eq!(s.parent.as_deref(), Some(parent.id.as_str()), "{s:#?}");
    assert_eq!(s.kind, kind, "{s:#?}");
    let want = [
        ("messaging.system", "kubemq"),
        ("messaging.operation.name", step),
        ("messaging.destination.name", destination),
        ("messaging.kubemq.pattern", pattern),
        ("network.protocol.name", "amqp"),
        ("network.protocol.version", "1.0"),
    ];
    for (k, v) in want {
        assert_eq!(s.tags.get(k).map(String::as_str), Some(v), "{k} of {s:#?}");
    }
    s
}

/// A tracer provider of `service`, exporting to `endpoint` in batches.
fn provider(service: &str, endpoint: &str) -> SdkTracerProvider {
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .unwrap();
    SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder_empty()
                .with_service_name(service.to_string())
                .build(),
        )
        .build()
}

/// The test's traced clients.
struct Clients {
    producer: SdkTracerProvider,
    consumer: SdkTracerProvider,
}

impl Clients {
    /// A producer span started now, its context, and the application properties that carry it.
    fn send_span(&self, name: String) -> (Context, ApplicationProperties) {
        let tracer = self.producer.tracer("producer");
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Producer)
            .start(&tracer);
        let cx = Context::new().with_span(span);
        let mut carrier = HashMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        let mut app = ApplicationProperties::builder();
        for (k, v) in carrier {
            app = app.insert(k, v);
        }
        (cx, app.build())
    }

    /// The consumer's span of a received message, a child of the span its properties name.
    fn process_span(&self, name: String, app: Option<&ApplicationProperties>) {
        let carrier: HashMap<String, String> = app
            .into_iter()
            .flat_map(|a| a.0.iter())
            .filter_map(|(k, v)| match v {
                SimpleValue::String(s) => Some((k.clone(), s.clone())),
                _ => None,
            })
            .collect();
        let parent = TraceContextPropagator::new().extract(&carrier);
        assert!(
            parent.span().span_context().is_valid(),
            "the consumer got the producer's traceparent: {carrier:?}"
        );
        let tracer = self.consumer.tracer("consumer");
        tracer
            .span_builder(name)
            .with_kind(SpanKind::Consumer)
            .start_with_context(&tracer, &parent)
            .end();
    }

    fn flush(&self) {
        self.producer.force_flush().unwrap();
        self.consumer.force_flush().unwrap();
    }
}

fn trace_id(cx: &Context) -> String {
    cx.span().span_context().trace_id().to_string()
}

/// A queue message: the producer's span, then the connector's publish (with the store within
/// it), deliver and settle spans, then the consumer's, all in the producer's trace; the
/// connector's spans are children of the producer's span, the consumer's too (it got the
/// `traceparent` unchanged).
async fn queue_message(c: &TestConnector, clients: &Clients, channel: &str) -> String {
    let mut conn = Connection::open("traced-queue", c.url().as_str())
        .await
        .unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let address = format!("queues/{channel}");
    let mut sender = Sender::attach(&mut session, "tx", address.as_str())
        .await
        .unwrap();
    let (cx, app) = clients.send_span(format!("send {address}"));
    let message = Message::builder()
        .application_properties(app)
        .value("traced")
        .build();
    let outcome = sender.send(message).await.unwrap();
    assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
    cx.span().end();
    let mut receiver = Receiver::builder()
        .name("rx")
        .source(address.as_str())
        .credit_mode(CreditMode::Auto(1))
        .attach(&mut session)
        .await
        .unwrap();
    let d = receiver.recv::<Body<Value>>().await.unwrap();
    clients.process_span(
        format!("process {address}"),
        d.message().application_properties.as_ref(),
    );
    receiver.accept(&d).await.unwrap();
    receiver.close().await.unwrap();
    sender.close().await.unwrap();
    conn.close().await.unwrap();
    trace_id(&cx)
}

/// An event: the producer's span, the connector's publish and deliver spans, the consumer's.
async fn event(c: &TestConnector, clients: &Clients, channel: &str) -> String {
    let mut conn = Connection::open("traced-event", c.url().as_str())
        .await
        .unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let address = format!("events/{channel}");
    let mut receiver = Receiver::builder()
        .name("rx")
        .source(address.as_str())
        .credit_mode(CreditMode::Auto(10))
        .attach(&mut session)
        .await
        .unwrap();
    let mut sender = Sender::attach(&mut session, "tx", address.as_str())
        .await
        .unwrap();
    // The subscription is live once an event sent now arrives: untraced ones until then.
    let (cx, app) = clients.send_span(format!("send {address}"));
    let traced = Message::builder()
        .application_properties(app)
        .value("traced")
        .build();
    let mut sent = false;
    for _ in 0..50 {
        sender.send(Message::from("probe")).await.unwrap();
        if tokio::time::timeout(Duration::from_millis(200), receiver.recv::<Body<Value>>())
            .await
            .is_ok()
        {
            sent = true;
            break;
        }
    }
    assert!(sent, "the subscription never got an event");
    let outcome = sender.send(traced).await.unwrap();
    assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
    cx.span().end();
    let d = loop {
        let d = tokio::time::timeout(Duration::from_secs(10), receiver.recv::<Body<Value>>())
            .await
            .expect("the traced event")
            .unwrap();
        if d.message().application_properties.is_some() {
            break d;
        }
    };
    clients.process_span(
        format!("process {address}"),
        d.message().application_properties.as_ref(),
    );
    receiver.close().await.unwrap();
    sender.close().await.unwrap();
    conn.close().await.unwrap();
    trace_id(&cx)
}

/// A command: the requester's span, the connector's request span (until KubeMQ's response),
/// its deliver span to the responder, the responder's span, and the connector's reply span,
/// all in the requester's trace.
async fn command(c: &TestConnector, clients: &Clients, channel: &str) -> String {
    let mut conn = Connection::open("traced-rpc", c.url().as_str())
        .await
        .unwrap();
    let mut session = Session::begin(&mut conn).await.unwrap();
    let address = format!("commands/{channel}");
    let mut responder = Receiver::builder()
        .name("responder")
        .source(address.as_str())
        .credit_mode(CreditMode::Auto(10))
        .attach(&mut session)
        .await
        .unwrap();
    let mut replies = interop_tests::relay_sender(&mut session, "responder-replies").await;
    let (mut answers, reply_to) = interop_tests::reply_node(&mut session, 10).await;
    let mut requester = Sender::attach(&mut session, "requester", address.as_str())
        .await
        .unwrap();
    let (cx, app) = clients.send_span(format!("send {address}"));
    let request = Message::builder()
        .properties(
            Properties::builder()
                .reply_to(reply_to)
                .correlation_id(MessageId::String("c1".into()))
                .build(),
        )
        .application_properties(app)
        .value("reboot")
        .build();
    let outcome = requester.send(request).await.unwrap();
    assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
    let d = tokio::time::timeout(Duration::from_secs(20), responder.recv::<Body<Value>>())
        .await
        .expect("the request")
        .unwrap();
    responder.accept(&d).await.unwrap();
    clients.process_span(
        format!("process {address}"),
        d.message().application_properties.as_ref(),
    );
    let props = d.message().properties.clone().expect("properties");
    let reply = Message::builder()
        .properties(
            Properties::builder()
                .to(props.reply_to.clone().expect("reply-to"))
                .correlation_id(props.correlation_id.clone().expect("correlation-id"))
                .build(),
        )
        .application_properties(
            ApplicationProperties::builder()
                .insert("x-opt-kubemq-executed", true)
                .build(),
        )
        .body(Body::<Value>::Empty)
        .build();
    let outcome = replies.send(reply).await.unwrap();
    assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
    let answer = answers.recv::<Body<Value>>().await.unwrap();
    answers.accept(&answer).await.unwrap();
    cx.span().end();
    conn.close().await.unwrap();
    trace_id(&cx)
}

/// A queue message, an event and a command each make one trace: the producer's span, the
/// connector's spans as its children (publish with store within it, deliver, settle; publish and
/// deliver for an event; request, deliver and reply for a command), and the consumer's span, on
/// every backend. The connector exports only because its OTLP endpoint is set (here through the
/// same settings lookup its binary gives the environment).
#[test]
#[cfg_attr(
    not(feature = "external-tools"),
    ignore = "runs Jaeger, built from its Go module: tests/run.sh"
)]
fn a_message_is_one_trace_from_producer_through_the_connector_to_consumer() {
    let jaeger = Jaeger::start();
    let rt = interop_tests::runtime();
    let endpoint = jaeger.endpoint();
    let _in_runtime = rt.enter();
    let export = connector::spans::start(|k| {
        (k == connector::spans::ENDPOINT_VAR).then(|| endpoint.clone())
    })
    .unwrap();
    assert!(export.is_on());
    let clients = Clients {
        producer: provider("traced-producer", &endpoint),
        consumer: provider("traced-consumer", &endpoint),
    };
    TestConnector::each_backend(Settings::default(), |c| {
        let channel = format!("traced.{}", connector::kubemq::new_id());
        let (queue, event, command) = rt.block_on(async {
            (
                queue_message(c, &clients, &channel).await,
                event(c, &clients, &channel).await,
                command(c, &clients, &channel).await,
            )
        });
        clients.flush();
        export.flush();

        let spans = jaeger.spans(&queue, 6);
        assert!(spans.iter().all(|s| s.trace == queue), "{spans:#?}");
        let address = format!("queues/{channel}");
        let producer = one(&spans, "traced-producer", &format!("send {address}"));
        let id = (channel.as_str(), "queues");
        let publish = connector_span(&spans, ("publish", id.0, id.1), producer, "producer");
        connector_span(&spans, ("store", id.0, id.1), publish, "client");
        connector_span(&spans, ("deliver", id.0, id.1), producer, "consumer");
        let settle = connector_span(&spans, ("settle", id.0, id.1), producer, "client");
        assert_eq!(
            settle
                .tags
                .get("messaging.kubemq.settlement")
                .map(String::as_str),
            Some("ack")
        );
        let consumer = one(&spans, "traced-consumer", &format!("process {address}"));
        assert_eq!(consumer.parent.as_deref(), Some(producer.id.as_str()));

        let spans = jaeger.spans(&event, 4);
        let address = format!("events/{channel}");
        let producer = one(&spans, "traced-producer", &format!("send {address}"));
        let id = (channel.as_str(), "events");
        connector_span(&spans, ("publish", id.0, id.1), producer, "producer");
        connector_span(&spans, ("deliver", id.0, id.1), producer, "consumer");
        one(&spans, "traced-consumer", &format!("process {address}"));

        let spans = jaeger.spans(&command, 5);
        let address = format!("commands/{channel}");
        let producer = one(&spans, "traced-producer", &format!("send {address}"));
        let id = (channel.as_str(), "commands");
        connector_span(&spans, ("request", id.0, id.1), producer, "client");
        connector_span(&spans, ("deliver", id.0, id.1), producer, "consumer");
        connector_span(&spans, ("reply", id.0, id.1), producer, "producer");
        one(&spans, "traced-consumer", &format!("process {address}"));
        assert_eq!(spans.len(), 5, "{spans:#?}");
    });
    drop(_in_runtime);
    rt.block_on(export.finish());
}
