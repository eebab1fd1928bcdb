//! The envelope's JSON text written straight from AMQP values: exactly what `serde_json` prints
//! for [`value_to_json`] (ENV-10, ENV-11), without building that tree first — ingress writes an
//! envelope for every message that has properties, and the tree cost more than the rest.

use base64::Engine as _;
use serde_amqp::descriptor::Descriptor;
use serde_amqp::primitives::OrderedMap;
use serde_amqp::Value;

use super::entries::Entries;
#[cfg(doc)]
use super::value_to_json;
use super::{B64, JSON_SAFE};

/// `s` as a JSON string.
pub(super) fn string(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s) {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        // Addresses and ids hold nothing JSON escapes: such a string is copied whole.
        quoted(out, s);
    }
}

/// One of the envelope's own names (a key, a marker, a body kind) as a JSON string: they hold
/// nothing JSON escapes, so only debug builds check them for it.
pub(super) fn name(out: &mut Vec<u8>, name: &'static str) {
    debug_assert!(!needs_escape(name));
    quoted(out, name);
}

/// Whether JSON escapes anything in `s`: quotes, backslashes and control characters. Checked
/// without a branch per byte.
fn needs_escape(s: &str) -> bool {
    s.bytes().fold(false, |esc, b| {
        esc | (b < 0x20) | (b == b'"') | (b == b'\\')
    })
}

/// `s` between quotes, as it is.
fn quoted(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

/// An integer as a JSON number.
pub(super) fn number(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// What `float_json` gives, printed: the number, or its text when JSON has no number for it.
fn float(out: &mut Vec<u8>, f: f64) {
    if f.is_finite() {
        let _ = serde_json::to_writer(&mut *out, &f);
    } else {
        string(out, &f.to_string());
    }
}

/// `{"<marker>":` — the caller writes the value and the closing brace.
fn open_marker(out: &mut Vec<u8>, marker: &'static str) {
    out.push(b'{');
    name(out, marker);
    out.push(b':');
}

/// A marker holding an integer: `{"$u8":7}`.
fn marked_number(out: &mut Vec<u8>, marker: &'static str, n: impl itoa::Integer) {
    open_marker(out, marker);
    number(out, n);
    out.push(b'}');
}

/// A marker holding text: `{"$u64":"7"}`.
fn marked_text(out: &mut Vec<u8>, marker: &'static str, text: &str) {
    open_marker(out, marker);
    string(out, text);
    out.push(b'}');
}

/// An AMQP value as [`value_to_json`] makes it, printed.
pub(super) fn value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::String(s) => string(out, s),
        Value::Long(n) if (-JSON_SAFE..=JSON_SAFE).contains(n) => number(out, *n),
        Value::Long(n) => marked_text(out, "$int64", itoa::Buffer::new().format(*n)),
        Value::Ulong(n) => marked_text(out, "$u64", itoa::Buffer::new().format(*n)),
        Value::Ubyte(n) => marked_number(out, "$u8", *n),
        Value::Byte(n) => marked_number(out, "$i8", *n),
        Value::Short(n) => marked_number(out, "$i16", *n),
        Value::Ushort(n) => marked_number(out, "$u16", *n),
        Value::Int(n) => marked_number(out, "$i32", *n),
        Value::Uint(n) => marked_number(out, "$u32", *n),
        Value::Float(f) => {
            open_marker(out, "$f32");
            float(out, f64::from(f.into_inner()));
            out.push(b'}');
        }
        Value::Double(f) => {
            open_marker(out, "$f64");
            float(out, f.into_inner());
            out.push(b'}');
        }
        Value::Timestamp(t) => {
            open_marker(out, "$ts");
            float(out, t.milliseconds() as f64 / 1000.0);
            out.push(b'}');
        }
        Value::Binary(b) => marked_text(out, "$bin", &B64.encode(b.as_slice())),
        Value::Uuid(u) => marked_text(
            out,
            "$uuid",
            uuid::Uuid::from_bytes(u.clone().into_inner())
                .hyphenated()
                .encode_lower(&mut uuid::Uuid::encode_buffer()),
        ),
        Value::Symbol(s) => marked_text(out, "$sym", &s.0),
        Value::Char(c) => marked_text(out, "$char", c.encode_utf8(&mut [0; 4])),
        Value::Decimal32(d) => marked_text(out, "$dec32", &B64.encode(d.as_inner())),
        Value::Decimal64(d) => marked_text(out, "$dec64", &B64.encode(d.as_inner())),
        Value::Decimal128(d) => marked_text(out, "$dec128", &B64.encode(d.as_inner())),
        Value::List(l) => list(out, l),
        Value::Map(m) => {
            open_marker(out, "$map");
            out.push(b'[');
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.push(b'[');
                value(out, k);
                out.push(b',');
                value(out, v);
                out.push(b']');
            }
            out.extend_from_slice(b"]}");
        }
        Value::Array(a) => {
            open_marker(out, "$array");
            list(out, &a.0);
            out.push(b'}');
        }
        Value::Described(d) => {
            open_marker(out, "$described");
            out.push(b'[');
            match &d.descriptor {
                Descriptor::Code(c) => marked_text(out, "$u64", itoa::Buffer::new().format(*c)),
                Descriptor::Name(n) => marked_text(out, "$sym", &n.0),
            }
            out.push(b',');
            value(out, &d.value);
            out.extend_from_slice(b"]}");
        }
    }
}

fn list(out: &mut Vec<u8>, items: &[Value]) {
    out.push(b'[');
    for (i, v) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        value(out, v);
    }
    out.push(b']');
}

/// A map key as the envelope names it: a symbol or string as its text, a ulong as `$u64:N`,
/// anything else as its JSON.
fn key_text(k: &Value) -> std::borrow::Cow<'_, str> {
    match k {
        Value::Symbol(s) => s.0.as_str().into(),
        Value::String(s) => s.as_str().into(),
        Value::Ulong(n) => format!("$u64:{n}").into(),
        other => {
            let mut text = Vec::new();
            value(&mut text, other);
            String::from_utf8_lossy(&text).into_owned().into()
        }
    }
}

/// A section's map (application-properties, annotations, footer) as a JSON object. Keys that
/// name alike (a symbol and a string of the same text) keep the first one's place and the last
/// one's value, as a JSON object built from them would.
pub(super) fn section_map(out: &mut Vec<u8>, m: &OrderedMap<Value, Value>) {
    let mut entries = Entries::with_capacity(m.len());
    for (k, v) in m.iter() {
        entries.insert(key_text(k), v);
    }
    out.push(b'{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, &k);
        out.push(b':');
        value(out, v);
    }
    out.push(b'}');
}
