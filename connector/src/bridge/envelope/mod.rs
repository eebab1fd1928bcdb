//! The `amqp10` metadata envelope (ENV-*): the AMQP message context kept as JSON in a KubeMQ
//! message's `Metadata`, so that a message crosses AMQP → KubeMQ → AMQP without losing a section
//! or a type.
//!
//! Sections are read as generic AMQP values (not fe2o3's typed structs), so nothing a client may
//! legally send is refused for being unusual. Values are written as JSON with `$` type markers
//! where JSON alone would lose the AMQP type (ENV-10, ENV-11); the choices the specification
//! leaves open are in docs/decisions.md.
//!
//! A message's way through: [`ingress`] walks the received sections (the engine's
//! `section_fields` reads the header and properties fields by hand) and writes the envelope's
//! text straight from them (`write`); [`egress`] reads that text straight into AMQP values
//! (`read`, with `entries` for JSON objects' key order) and encodes the delivered sections
//! (`encode`). The generic conversions [`value_to_json`] and [`value_from_json`] are what the
//! direct ones are tested against.

use base64::Engine as _;
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;
use serde_amqp::primitives::{Array, Symbol, Timestamp};
use serde_amqp::Value;
use serde_json::{json, Map, Value as Json};

use crate::engine::message::{data_sections, section_fields, walk, BodyKind, MessageError};
use crate::engine::validate::value_len;

mod encode;
mod entries;
mod read;
mod write;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
/// Largest integer a JSON number carries exactly.
const JSON_SAFE: i64 = 1 << 53;

/// Names of the properties-section fields, by position.
const PROPS: [&str; 13] = [
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
];

/// A message split for KubeMQ: the envelope text and the body bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// `Metadata`: the JSON envelope.
    pub metadata: String,
    /// `Body`: the Data bytes, concatenated, or the AMQP encoding of an AmqpValue; a single
    /// Data section is shared with the received message, not copied.
    pub body: bytes::Bytes,
    /// The properties `to`, for routing messages of an anonymous link (ADDR-13).
    pub to: Option<String>,
    /// The properties `reply-to`, where a request's reply goes (RPC-1).
    pub reply_to: Option<String>,
    /// The header `ttl` in milliseconds, a request's timeout (RPC-3).
    pub ttl: Option<u32>,
    /// What a reply to this message is correlated by (RPC-6): its `correlation-id`, or its
    /// `message-id` when it has none.
    pub correlation: Option<Value>,
    /// The trace context among its application properties ([`TRACE_KEYS`] with string values),
    /// for the KubeMQ message's `Tags`, where KubeMQ's own clients and tools look for it.
    pub trace_tags: std::collections::HashMap<String, String>,
}

/// The application properties that carry a message's trace context: W3C Trace Context's
/// `traceparent` and `tracestate`, and the `Diagnostic-Id` Azure's AMQP SDKs set.
pub const TRACE_KEYS: [&str; 3] = ["traceparent", "tracestate", "Diagnostic-Id"];

/// Why a message cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngressError {
    /// The sections are malformed, out of order or mixed (ERR-9 `amqp:decode-error`).
    #[error("{0}")]
    Malformed(#[from] MessageError),
    /// A section could not be read as an AMQP value (`amqp:decode-error`).
    #[error("undecodable section: {0}")]
    Undecodable(&'static str),
    /// An AmqpSequence body (Q-9, ENV-9: `amqp:not-implemented`).
    #[error("amqp-sequence bodies are not supported")]
    SequenceBody,
}

fn section_value(
    msg: &[u8],
    range: &std::ops::Range<usize>,
    what: &'static str,
) -> Result<Value, IngressError> {
    let section = msg
        .get(range.clone())
        .ok_or(IngressError::Undecodable(what))?;
    match serde_amqp::from_slice::<Value>(section) {
        Ok(Value::Described(d)) => Ok(d.value),
        _ => Err(IngressError::Undecodable(what)),
    }
}

/// A header or properties section's value: read by hand when its fields are plain, by serde_amqp
/// otherwise.
fn list_section(
    msg: &[u8],
    range: &std::ops::Range<usize>,
    what: &'static str,
) -> Result<Value, IngressError> {
    match msg.get(range.clone()).and_then(section_fields) {
        Some(fields) => Ok(Value::List(fields)),
        None => section_value(msg, range, what),
    }
}

/// The envelope of a message with only an empty body.
const EMPTY_BODY_ENVELOPE: &str = r#"{"amqp10":{}}"#;
/// The envelope of a message with only Data sections.
const DATA_BODY_ENVELOPE: &str = r#"{"amqp10":{"body_section":"data"}}"#;
/// The envelope of a message with only an AmqpValue body.
const VALUE_BODY_ENVELOPE: &str = r#"{"amqp10":{"body_section":"value"}}"#;

/// Ingress (ENV-1 … ENV-9): an encoded AMQP message → envelope and body.
pub fn ingress(received: &bytes::Bytes) -> Result<Stored, IngressError> {
    let msg: &[u8] = received;
    let layout = walk(msg)?;
    // The envelope's text, written as it is read: `{"amqp10":{` then its sections.
    let mut text = Vec::with_capacity(256);
    text.extend_from_slice(br#"{"amqp10":{"#);
    let mut sections = 0;
    let mut next_section = |text: &mut Vec<u8>, name: &'static str| {
        if sections > 0 {
            text.push(b',');
        }
        sections += 1;
        write::name(text, name);
        text.push(b':');
    };
    let (mut to, mut reply_to, mut ttl, mut correlation) = (None, None, None, None);
    let mut trace_tags = std::collections::HashMap::new();
    let mut props_open = false;
    let mut prop = |text: &mut Vec<u8>, name: &'static str| {
        if props_open {
            text.push(b',');
        } else {
            next_section(text, "props");
            text.push(b'{');
            props_open = true;
        }
        write::name(text, name);
        text.push(b':');
    };
    if let Some(r) = &layout.properties {
        if let Value::List(mut fields) = list_section(msg, r, "properties")? {
            for (name, v) in PROPS.iter().zip(&fields) {
                if !matches!(v, Value::Null) {
                    prop(&mut text, name);
                    write_prop(&mut text, name, v);
                }
            }
            // Written: what the connector keeps beside the text is moved out of the fields.
            let mut field = |i: usize| fields.get_mut(i).map(std::mem::take);
            if let Some(Value::String(t)) = field(2) {
                to = Some(t);
            }
            if let Some(Value::String(t)) = field(4) {
                reply_to = Some(t);
            }
            // RPC-6: the correlation-id, or the message-id when there is none.
            correlation = [5, 0]
                .into_iter()
                .filter_map(&mut field)
                .find(|v| !matches!(v, Value::Null));
        }
    }
    if let Some(r) = &layout.header {
        // ENV-3: the header ttl is kept in props; the rest of the header is the connector's own.
        if let Value::List(fields) = list_section(msg, r, "header")? {
            if let Some(Value::Uint(t)) = fields.get(2) {
                prop(&mut text, "ttl");
                write::number(&mut text, *t);
                ttl = Some(*t);
            }
            // Kept for selectors (JMSPriority) and restored on delivery; never for ordering.
            if let Some(Value::Ubyte(priority)) = fields.get(1) {
                prop(&mut text, "priority");
                write::number(&mut text, *priority);
            }
        }
    }
    if props_open {
        text.push(b'}');
    }
    for (name, range, what) in [
        (
            "app",
            &layout.application_properties,
            "application-properties",
        ),
        (
            "annotations",
            &layout.message_annotations,
            "message-annotations",
        ),
        (
            "delivery_annotations",
            &layout.delivery_annotations,
            "delivery-annotations",
        ),
        ("footer", &layout.footer, "footer"),
    ] {
        if let Some(r) = range {
            if let Value::Map(m) = section_value(msg, r, what)? {
                next_section(&mut text, name);
                write::section_map(&mut text, &m);
                if name == "app" {
                    for (k, v) in m {
                        if let (Value::String(k), Value::String(v)) = (k, v) {
                            if TRACE_KEYS.contains(&k.as_str()) {
                                trace_tags.insert(k, v);
                            }
                        }
                    }
                }
            }
        }
    }
    // The walker's ranges lie inside the message.
    let body_bytes = msg.get(layout.body.clone()).unwrap_or_default();
    let (body, kind) = match layout.body_kind {
        BodyKind::Empty => (bytes::Bytes::new(), None),
        BodyKind::Data { sections: 1 } => {
            let part = data_sections(body_bytes).next().unwrap_or_default();
            (received.slice_ref(part), Some("data"))
        }
        BodyKind::Data { .. } => {
            let body = data_sections(body_bytes).fold(Vec::new(), |mut body, part| {
                body.extend_from_slice(part);
                body
            });
            (body.into(), Some("data"))
        }
        BodyKind::Value => (received.slice_ref(value_bytes(body_bytes)?), Some("value")),
        BodyKind::Sequence => return Err(IngressError::SequenceBody),
    };
    let metadata = match (kind, sections) {
        // A message with nothing but its body (the common case of a plain client) has one of
        // three envelopes.
        (None, 0) => EMPTY_BODY_ENVELOPE.to_string(),
        (Some("data"), 0) => DATA_BODY_ENVELOPE.to_string(),
        (Some(_), 0) => VALUE_BODY_ENVELOPE.to_string(),
        (kind, _) => {
            if let Some(kind) = kind {
                text.extend_from_slice(br#","body_section":"#);
                write::name(&mut text, kind);
            }
            text.extend_from_slice(b"}}");
            // Only JSON text was written: strings through serde_json, the rest ASCII.
            String::from_utf8(text).unwrap_or_default()
        }
    };
    Ok(Stored {
        metadata,
        body,
        to,
        reply_to,
        ttl,
        correlation,
        trace_tags,
    })
}

/// A properties field's JSON: fields with a fixed AMQP type are written plainly; the identifier
/// unions (message-id, correlation-id) keep their type with markers (ENV-3).
fn write_prop(out: &mut Vec<u8>, name: &str, v: &Value) {
    match (name, v) {
        ("content_type" | "content_encoding", Value::Symbol(s)) => write::string(out, s.as_str()),
        ("group_sequence", Value::Uint(n)) => write::number(out, *n),
        (_, v) => write::value(out, v),
    }
}

/// Egress of `metadata` with properties and application-properties set over what it holds
/// (replacing those of the same name): the message the connector delivers for a request (RPC-12)
/// and for a reply (RPC-6, RPC-7). Metadata that is not an `amqp10` envelope (a native KubeMQ
/// client's) is kept as the `x-opt-kubemq-metadata` annotation, as [`egress`] would deliver it
/// (OP-ENV-6). The envelope is read once and never printed: the delivered message is all that is
/// made of it.
pub fn stamped_egress(
    metadata: &str,
    stamps: Stamps<'_>,
    body: &[u8],
    tags: &std::collections::HashMap<String, String>,
    info: DeliveryInfo,
) -> Vec<u8> {
    let mut stamped = [""; PROPS.len()];
    for (slot, (name, _)) in stamped.iter_mut().zip(stamps.props.iter()) {
        *slot = name;
    }
    let stamped = stamped.get(..stamps.props.len()).unwrap_or(&stamped);
    let mut env = sections(metadata, stamped);
    for (name, v) in stamps.props.iter_mut() {
        env.props.set_value(name, std::mem::take(v));
    }
    if !stamps.app.is_empty() {
        let app = env.app.get_or_insert_with(Vec::new);
        for (k, v) in stamps.app.iter_mut() {
            let v = std::mem::take(v);
            match app.iter_mut().find(|(key, _)| is_key(key, k)) {
                Some(slot) => slot.1 = v,
                None => app.push((Value::String((*k).to_string()), v)),
            }
        }
    }
    // Written straight into the delivered message: this Metadata is read for one delivery only.
    let mut out = Vec::with_capacity(64 + metadata.len() + body.len());
    push_header(
        &mut out,
        env.props.ttl,
        env.props.priority,
        info.first_acquirer(),
        info.delivery_count(),
    );
    write_sections(&mut out, env, tags).finish(&mut out, body);
    out
}

/// What `metadata` records: its envelope's sections, or for Metadata that is not an envelope (a
/// native KubeMQ client's, OP-ENV-6) the `x-opt-kubemq-metadata` annotation holding it.
fn sections(metadata: &str, stamped: &[&str]) -> read::Sections {
    read::envelope(metadata, stamped).unwrap_or_else(|| read::Sections {
        annotations: (!metadata.is_empty()).then(|| {
            vec![(
                Value::Symbol(Symbol::from("x-opt-kubemq-metadata")),
                Value::String(metadata.to_string()),
            )]
        }),
        ..read::Sections::default()
    })
}

/// Whether an application-properties key is the string `k`.
fn is_key(key: &Value, k: &str) -> bool {
    matches!(key, Value::String(key) if key == k)
}

/// What [`stamped_egress`] sets over a message's envelope (the values are moved into it).
#[derive(Debug, Default)]
pub struct Stamps<'a> {
    /// Properties fields by the envelope's names (`reply_to`, `correlation_id`, ...; other
    /// names are not properties fields and are ignored).
    pub props: &'a mut [(&'static str, Value)],
    /// Application-properties.
    pub app: &'a mut [(&'static str, Value)],
}

/// The application-properties `keys` of a message stored by [`ingress`]; `None` for each it
/// does not have.
pub fn application_properties<const N: usize>(
    metadata: &str,
    keys: [&str; N],
) -> [Option<Value>; N] {
    // Ingress prints keys as they are (JSON escapes only quotes, backslashes and control
    // characters, which these keys never hold), so a key missing from the text is missing from
    // the envelope, and the common reply is answered without reading its envelope at all.
    if !keys.iter().any(|k| metadata.contains(k)) {
        return [const { None }; N];
    }
    let app = read::envelope(metadata, &[])
        .and_then(|e| e.app)
        .unwrap_or_default();
    keys.map(|k| {
        app.iter()
            .find(|(key, _)| is_key(key, k))
            .map(|(_, v)| v.clone())
    })
}

/// The encoded value inside an AmqpValue section (after its descriptor).
fn value_bytes(section: &[u8]) -> Result<&[u8], IngressError> {
    let descriptor = value_len(section.get(1..).unwrap_or(&[]))
        .map_err(|_| IngressError::Undecodable("amqp-value"))?;
    section
        .get(1 + descriptor..)
        .ok_or(IngressError::Undecodable("amqp-value"))
}

/// What the connector knows about a delivery that is not in the stored message.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryInfo {
    /// KubeMQ's ReceiveCount for this delivery (Q-17).
    pub receive_count: i32,
}

impl DeliveryInfo {
    /// The header's first-acquirer: no earlier delivery.
    fn first_acquirer(self) -> bool {
        self.receive_count <= 1
    }

    /// The header's delivery-count: the earlier deliveries.
    fn delivery_count(self) -> u32 {
        u32::try_from(self.receive_count.saturating_sub(1).max(0)).unwrap_or(0)
    }
}

/// Egress (ENV-12 … ENV-14): stored Metadata and body → an encoded AMQP message. Metadata that is
/// not an `amqp10` envelope (a plain gRPC producer, OP-ENV-6) is delivered as the
/// `x-opt-kubemq-metadata` message annotation, with a Data body.
pub fn egress(
    metadata: &str,
    body: &[u8],
    tags: &std::collections::HashMap<String, String>,
    info: DeliveryInfo,
) -> Vec<u8> {
    shape(metadata, tags).assemble(body, info)
}

/// Egress for one connection's deliveries: the shape of the last Metadata is kept, so a run of
/// messages with the same Metadata (a producer that sets no per-message property) reads it once
/// instead of parsing its JSON for every delivery. Gives exactly what [`egress`] gives.
#[derive(Default)]
pub struct Egress {
    last: Option<(String, Shape)>,
}

impl Egress {
    /// [`egress`], with the last shape reused when `metadata` is the same and there are no tags.
    pub fn message(
        &mut self,
        metadata: &str,
        body: &[u8],
        tags: &std::collections::HashMap<String, String>,
        info: DeliveryInfo,
    ) -> Vec<u8> {
        if !tags.is_empty() {
            return egress(metadata, body, tags, info);
        }
        match &self.last {
            Some((m, shape)) if m == metadata => shape.assemble(body, info),
            _ => {
                let shape = shape(metadata, tags);
                let out = shape.assemble(body, info);
                self.last = Some((metadata.to_string(), shape));
                out
            }
        }
    }
}

/// What a message's Metadata and tags make of each of its deliveries: all but the header's
/// delivery fields and the body.
#[derive(Debug)]
struct Shape {
    /// The header's ttl (ENV-3).
    ttl: Option<u32>,
    /// The header priority the producer set, if any.
    priority: Option<u8>,
    /// The encoded sections between the header and the body.
    before_body: Vec<u8>,
    /// What follows them.
    tail: Tail,
}

/// What follows a message's sections before the body: how the body is sent, and the footer.
#[derive(Debug)]
struct Tail {
    /// Whether the body was an AmqpValue.
    value_body: bool,
    /// The encoded footer, if any.
    footer: Vec<u8>,
}

fn shape(metadata: &str, tags: &std::collections::HashMap<String, String>) -> Shape {
    let env = sections(metadata, &[]);
    let (ttl, priority) = (env.props.ttl, env.props.priority);
    let mut before_body = Vec::with_capacity(128);
    let tail = write_sections(&mut before_body, env, tags);
    Shape {
        ttl,
        priority,
        before_body,
        tail,
    }
}

/// Writes the sections between the header and the body that `env` records (tags as
/// application-properties when it has none); returns what follows them.
fn write_sections(
    out: &mut Vec<u8>,
    env: read::Sections,
    tags: &std::collections::HashMap<String, String>,
) -> Tail {
    for (section, code) in [(env.delivery_annotations, 0x71), (env.annotations, 0x72)] {
        if let Some(m) = section {
            // Through a map: `$u64:7` and `$u64:07` name the same key.
            encode::section(out, code, &Value::Map(m.into_iter().collect()));
        }
    }
    let mut fields = env.props.fields;
    while matches!(fields.last(), Some(Value::Null)) {
        fields.pop();
    }
    if !fields.is_empty() {
        encode::section(out, 0x73, &Value::List(fields));
    }
    if let Some(app) = env.app {
        encode::map_section(out, 0x74, &app);
    } else if !tags.is_empty() {
        encode::section(out, 0x74, &tags_map(tags));
    }
    let mut footer = Vec::new();
    if let Some(m) = env.footer {
        encode::section(&mut footer, 0x78, &Value::Map(m.into_iter().collect()));
    }
    Tail {
        value_body: env.value_body,
        footer,
    }
}

impl Shape {
    /// One delivery: the header (made by the connector, ENV-14, Q-17), the sections, the body
    /// and the footer.
    fn assemble(&self, body: &[u8], info: DeliveryInfo) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(32 + self.before_body.len() + body.len() + self.tail.footer.len());
        push_header(
            &mut out,
            self.ttl,
            self.priority,
            info.first_acquirer(),
            info.delivery_count(),
        );
        out.extend_from_slice(&self.before_body);
        self.tail.finish(&mut out, body);
        out
    }
}

impl Tail {
    /// The body, then the footer.
    fn finish(&self, out: &mut Vec<u8>, body: &[u8]) {
        if self.value_body && value_len(body).map(|n| n == body.len()).unwrap_or(false) {
            out.extend_from_slice(&[0x00, 0x53, 0x77]);
            out.extend_from_slice(body);
        } else {
            push_data(out, body);
        }
        out.extend_from_slice(&self.footer);
    }
}

fn tags_map(tags: &std::collections::HashMap<String, String>) -> Value {
    let mut keys: Vec<&String> = tags.keys().collect();
    keys.sort();
    Value::Map(
        keys.into_iter()
            .map(|k| (Value::String(k.clone()), Value::String(tags[k].clone())))
            .collect(),
    )
}

/// The header section (durable, priority, ttl, first-acquirer, delivery-count), encoded by
/// hand: it is on every delivery, and the generic encoder costs more than the rest of it.
fn push_header(
    out: &mut Vec<u8>,
    ttl: Option<u32>,
    priority: Option<u8>,
    first_acquirer: bool,
    delivery_count: u32,
) {
    // list8: its size byte (count byte + fields) is set once the fields are written.
    out.extend_from_slice(&[0x00, 0x53, 0x70, 0xc0, 0, 5]);
    let size_at = out.len() - 2;
    out.push(0x41); // durable: true
    match priority {
        Some(p) => out.extend_from_slice(&[0x50, p]),
        None => out.push(0x40), // null: 4, the default
    }
    match ttl {
        Some(t) => encode::value(out, &Value::Uint(t)),
        None => out.push(0x40),
    }
    out.push(if first_acquirer { 0x41 } else { 0x42 });
    encode::value(out, &Value::Uint(delivery_count));
    // At most 1 + 2 + 5 + 1 + 5 bytes: the size fits a byte.
    let size = (out.len() - size_at - 1) as u8;
    if let Some(b) = out.get_mut(size_at) {
        *b = size;
    }
}

/// One Data section holding `body`, copied once.
fn push_data(out: &mut Vec<u8>, body: &[u8]) {
    out.extend_from_slice(&[0x00, 0x53, 0x75]);
    match u8::try_from(body.len()) {
        Ok(n) => out.extend_from_slice(&[0xa0, n]),
        Err(_) => {
            out.push(0xb0);
            out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        }
    }
    out.extend_from_slice(body);
}

fn prop_from_json(name: &str, v: &Json) -> Value {
    match (name, v) {
        // A symbol is ASCII: a client's non-ASCII text here was a string, and stays one.
        ("content_type" | "content_encoding", Json::String(s)) if s.is_ascii() => {
            Value::Symbol(Symbol::from(s.as_str()))
        }
        ("group_sequence", Json::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map_or(Value::Null, Value::Uint),
        (_, v) => value_from_json(v),
    }
}

fn marker(name: &str, v: Json) -> Json {
    let mut m = Map::new();
    m.insert(name.to_string(), v);
    Json::Object(m)
}

fn float_json(f: f64) -> Json {
    serde_json::Number::from_f64(f).map_or_else(|| json!(f.to_string()), Json::Number)
}

/// An AMQP value as JSON (ENV-10, ENV-11, and OP-ENV-3's decisions for the rest).
pub fn value_to_json(v: Value) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Bool(b) => json!(b),
        Value::String(s) => json!(s),
        Value::Long(n) if (-JSON_SAFE..=JSON_SAFE).contains(&n) => json!(n),
        Value::Long(n) => marker("$int64", json!(n.to_string())),
        Value::Ulong(n) => marker("$u64", json!(n.to_string())),
        Value::Ubyte(n) => marker("$u8", json!(n)),
        Value::Byte(n) => marker("$i8", json!(n)),
        Value::Short(n) => marker("$i16", json!(n)),
        Value::Ushort(n) => marker("$u16", json!(n)),
        Value::Int(n) => marker("$i32", json!(n)),
        Value::Uint(n) => marker("$u32", json!(n)),
        Value::Float(f) => marker("$f32", float_json(f64::from(f.into_inner()))),
        Value::Double(f) => marker("$f64", float_json(f.into_inner())),
        // Milliseconds are kept as the fraction, so restoration is exact (OP-ENV-4).
        Value::Timestamp(t) => marker("$ts", float_json(t.milliseconds() as f64 / 1000.0)),
        Value::Binary(b) => marker("$bin", json!(B64.encode(b.as_slice()))),
        Value::Uuid(u) => marker(
            "$uuid",
            json!(uuid::Uuid::from_bytes(u.into_inner()).to_string()),
        ),
        Value::Symbol(s) => marker("$sym", json!(s.0)),
        Value::Char(c) => marker("$char", json!(c.to_string())),
        Value::Decimal32(d) => marker("$dec32", json!(B64.encode(d.as_inner()))),
        Value::Decimal64(d) => marker("$dec64", json!(B64.encode(d.as_inner()))),
        Value::Decimal128(d) => marker("$dec128", json!(B64.encode(d.as_inner()))),
        Value::List(l) => Json::Array(l.into_iter().map(value_to_json).collect()),
        Value::Map(m) => marker(
            "$map",
            Json::Array(
                m.into_inner()
                    .into_iter()
                    .map(|(k, v)| json!([value_to_json(k), value_to_json(v)]))
                    .collect(),
            ),
        ),
        Value::Array(a) => marker(
            "$array",
            Json::Array(a.into_inner().into_iter().map(value_to_json).collect()),
        ),
        Value::Described(d) => {
            let descriptor = match d.descriptor {
                Descriptor::Code(c) => marker("$u64", json!(c.to_string())),
                Descriptor::Name(n) => marker("$sym", json!(n.0)),
            };
            marker("$described", json!([descriptor, value_to_json(d.value)]))
        }
    }
}

/// JSON back to the AMQP value it stood for; unmarked JSON that we never write (a fraction, an
/// object) is read leniently.
pub fn value_from_json(j: &Json) -> Value {
    match j {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::String(s) => Value::String(s.clone()),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Long(i),
            None => Value::Double(n.as_f64().unwrap_or(0.0).into()),
        },
        Json::Array(a) => Value::List(a.iter().map(value_from_json).collect()),
        Json::Object(m) if m.len() == 1 => {
            let (k, v) = m
                .iter()
                .next()
                .map(|(k, v)| (k.as_str(), v))
                .unwrap_or(("", &Json::Null));
            from_marker(k, Arg::of(v)).unwrap_or_else(|| {
                Value::Map(
                    m.iter()
                        .map(|(k, v)| (Value::String(k.clone()), value_from_json(v)))
                        .collect(),
                )
            })
        }
        Json::Object(m) => Value::Map(
            m.iter()
                .map(|(k, v)| (Value::String(k.clone()), value_from_json(v)))
                .collect(),
        ),
    }
}

fn num<T: TryFrom<i64>>(v: Arg<'_>) -> Option<T> {
    v.as_i64().and_then(|n| T::try_from(n).ok())
}

/// A marker's argument: JSON, or the string most markers hold, read without building JSON first.
#[derive(Clone, Copy)]
enum Arg<'a> {
    Str(&'a str),
    Json(&'a Json),
}

impl<'a> Arg<'a> {
    fn of(j: &'a Json) -> Self {
        match j {
            Json::String(s) => Arg::Str(s),
            j => Arg::Json(j),
        }
    }
    fn as_str(self) -> Option<&'a str> {
        match self {
            Arg::Str(s) => Some(s),
            Arg::Json(_) => None,
        }
    }
    fn as_f64(self) -> Option<f64> {
        match self {
            Arg::Str(_) => None,
            Arg::Json(j) => j.as_f64(),
        }
    }
    fn as_i64(self) -> Option<i64> {
        match self {
            Arg::Str(_) => None,
            Arg::Json(j) => j.as_i64(),
        }
    }
    fn as_array(self) -> Option<&'a Vec<Json>> {
        match self {
            Arg::Str(_) => None,
            Arg::Json(j) => j.as_array(),
        }
    }
}

fn from_marker(k: &str, v: Arg<'_>) -> Option<Value> {
    let f = || {
        v.as_f64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    };
    let bytes = || v.as_str().and_then(|s| B64.decode(s).ok());
    Some(match k {
        "$int64" => Value::Long(v.as_str()?.parse().ok()?),
        "$u64" => Value::Ulong(v.as_str()?.parse().ok()?),
        "$u8" => Value::Ubyte(num(v)?),
        "$i8" => Value::Byte(num(v)?),
        "$i16" => Value::Short(num(v)?),
        "$u16" => Value::Ushort(num(v)?),
        "$i32" => Value::Int(num(v)?),
        "$u32" => Value::Uint(num(v)?),
        "$f32" => Value::Float((f()? as f32).into()),
        "$f64" => Value::Double(f()?.into()),
        "$ts" => Value::Timestamp(Timestamp::from_milliseconds(
            (v.as_f64()? * 1000.0).round() as i64
        )),
        "$bin" => Value::Binary(serde_bytes::ByteBuf::from(bytes()?)),
        "$uuid" => Value::Uuid((*uuid::Uuid::parse_str(v.as_str()?).ok()?.as_bytes()).into()),
        "$sym" => Value::Symbol(Symbol::from(v.as_str()?)),
        "$char" => Value::Char(v.as_str()?.chars().next()?),
        "$dec32" => Value::Decimal32(bytes()?.as_slice().try_into().ok()?),
        "$dec64" => Value::Decimal64(bytes()?.as_slice().try_into().ok()?),
        "$dec128" => Value::Decimal128(bytes()?.as_slice().try_into().ok()?),
        "$map" => Value::Map(
            v.as_array()?
                .iter()
                .filter_map(|pair| {
                    Some((value_from_json(pair.get(0)?), value_from_json(pair.get(1)?)))
                })
                .collect(),
        ),
        "$array" => Value::Array(Array(v.as_array()?.iter().map(value_from_json).collect())),
        "$described" => {
            let pair = v.as_array()?;
            let descriptor = match value_from_json(pair.first()?) {
                Value::Ulong(c) => Descriptor::Code(c),
                Value::Symbol(s) => Descriptor::Name(s),
                _ => return None,
            };
            Value::Described(Box::new(Described {
                descriptor,
                value: value_from_json(pair.get(1)?),
            }))
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
