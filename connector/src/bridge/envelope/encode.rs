//! AMQP values encoded by hand for the sections egress writes. serde_amqp's encoder panics on
//! some values (a timestamp as a map key, followed by binary or text), and the envelope may hold
//! any value a KubeMQ client wrote; it also costs more than the rest of egress. The encodings are
//! the shortest AMQP allows, as serde_amqp chooses them (a test holds the two to the same bytes).

use serde_amqp::descriptor::Descriptor;
use serde_amqp::Value;

/// A described section: `0x00`, the small-ulong descriptor `code`, its value.
pub(super) fn section(out: &mut Vec<u8>, code: u8, value: &Value) {
    out.extend_from_slice(&[0x00, 0x53, code]);
    self::value(out, value);
}

/// A described section holding a map of `entries`, whose keys are distinct.
pub(super) fn map_section(out: &mut Vec<u8>, code: u8, entries: &[(Value, Value)]) {
    out.extend_from_slice(&[0x00, 0x53, code]);
    map(out, entries.iter().map(|(k, v)| (k, v)), entries.len());
}

fn map<'a>(out: &mut Vec<u8>, entries: impl Iterator<Item = (&'a Value, &'a Value)>, n: usize) {
    compound(out, [0xc1, 0xd1], n * 2, |out| {
        for (k, v) in entries {
            value(out, k);
            value(out, v);
        }
    });
}

/// One value with its constructor.
pub(super) fn value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.push(0x40),
        Value::Bool(b) => out.push(if *b { 0x41 } else { 0x42 }),
        Value::Ubyte(n) => out.extend_from_slice(&[0x50, *n]),
        Value::Ushort(n) => {
            out.push(0x60);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Value::Uint(0) => out.push(0x43),
        Value::Uint(n @ 1..=255) => out.extend_from_slice(&[0x52, *n as u8]),
        Value::Ulong(0) => out.push(0x44),
        Value::Ulong(n @ 1..=255) => out.extend_from_slice(&[0x53, *n as u8]),
        Value::Byte(n) => out.extend_from_slice(&[0x51, n.to_be_bytes()[0]]),
        Value::Short(n) => {
            out.push(0x61);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Value::Int(n @ -128..=127) => out.extend_from_slice(&[0x54, (*n as i8).to_be_bytes()[0]]),
        Value::Long(n @ -128..=127) => out.extend_from_slice(&[0x55, (*n as i8).to_be_bytes()[0]]),
        Value::Binary(b) => variable(out, [0xa0, 0xb0], b),
        Value::String(s) => variable(out, [0xa1, 0xb1], s.as_bytes()),
        Value::Symbol(s) => variable(out, [0xa3, 0xb3], s.as_str().as_bytes()),
        Value::List(items) => list(out, items),
        Value::Map(m) => map(out, m.iter(), m.len()),
        Value::Array(a) => array(out, &a.0),
        Value::Described(d) => {
            out.push(0x00);
            match &d.descriptor {
                Descriptor::Code(c) => value(out, &Value::Ulong(*c)),
                Descriptor::Name(n) => variable(out, [0xa3, 0xb3], n.as_str().as_bytes()),
            }
            value(out, &d.value);
        }
        other => {
            if let Some(c) = wide_constructor(other) {
                out.push(c);
                data(out, other);
            }
        }
    }
}

fn list(out: &mut Vec<u8>, items: &[Value]) {
    if items.is_empty() {
        out.push(0x45);
        return;
    }
    compound(out, [0xc0, 0xd0], items.len(), |out| {
        for v in items {
            value(out, v);
        }
    });
}

/// A list or map whose `count` items `items` writes: 8-bit size and count while the items take
/// under 255 bytes. The items are written in place behind room for the wide header, which
/// shrinks to the short one when they turn out small.
fn compound(
    out: &mut Vec<u8>,
    [small, large]: [u8; 2],
    count: usize,
    items: impl FnOnce(&mut Vec<u8>),
) {
    let header = out.len();
    out.extend_from_slice(&[large, 0, 0, 0, 0, 0, 0, 0, 0]);
    items(out);
    let len = out.len() - header - 9;
    match u8::try_from(len + 1) {
        Ok(size) if len < 255 => {
            out.splice(header..header + 9, [small, size, count as u8]);
        }
        _ => {
            let [a, b, c, d] = ((len + 4) as u32).to_be_bytes();
            let [e, f, g, h] = (count as u32).to_be_bytes();
            out.splice(header..header + 9, [large, a, b, c, d, e, f, g, h]);
        }
    }
}

/// Binary, string or symbol: 8-bit length while under 255 bytes.
fn variable(out: &mut Vec<u8>, [small, large]: [u8; 2], bytes: &[u8]) {
    match u8::try_from(bytes.len()) {
        Ok(n) if n < 255 => out.extend_from_slice(&[small, n]),
        _ => {
            out.push(large);
            out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        }
    }
    out.extend_from_slice(bytes);
}

/// The one constructor of a primitive that every element of an array can share (the fixed-width
/// and 32-bit-length forms); `None` for compound values.
fn wide_constructor(v: &Value) -> Option<u8> {
    Some(match v {
        Value::Null => 0x40,
        Value::Bool(_) => 0x56,
        Value::Ubyte(_) => 0x50,
        Value::Ushort(_) => 0x60,
        Value::Uint(_) => 0x70,
        Value::Ulong(_) => 0x80,
        Value::Byte(_) => 0x51,
        Value::Short(_) => 0x61,
        Value::Int(_) => 0x71,
        Value::Long(_) => 0x81,
        Value::Float(_) => 0x72,
        Value::Double(_) => 0x82,
        Value::Decimal32(_) => 0x74,
        Value::Decimal64(_) => 0x84,
        Value::Decimal128(_) => 0x94,
        Value::Char(_) => 0x73,
        Value::Timestamp(_) => 0x83,
        Value::Uuid(_) => 0x98,
        Value::Binary(_) => 0xb0,
        Value::String(_) => 0xb1,
        Value::Symbol(_) => 0xb3,
        Value::List(_) | Value::Map(_) | Value::Array(_) | Value::Described(_) => return None,
    })
}

/// What follows [`wide_constructor`] for `v`.
fn data(out: &mut Vec<u8>, v: &Value) {
    let wide = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(bytes);
    };
    match v {
        Value::Bool(b) => out.push(u8::from(*b)),
        Value::Ubyte(n) => out.push(*n),
        Value::Ushort(n) => out.extend_from_slice(&n.to_be_bytes()),
        Value::Uint(n) => out.extend_from_slice(&n.to_be_bytes()),
        Value::Ulong(n) => out.extend_from_slice(&n.to_be_bytes()),
        Value::Byte(n) => out.extend_from_slice(&n.to_be_bytes()),
        Value::Short(n) => out.extend_from_slice(&n.to_be_bytes()),
        Value::Int(n) => out.extend_from_slice(&n.to_be_bytes()),
        Value::Long(n) => out.extend_from_slice(&n.to_be_bytes()),
        Value::Float(f) => out.extend_from_slice(&f.into_inner().to_be_bytes()),
        Value::Double(f) => out.extend_from_slice(&f.into_inner().to_be_bytes()),
        Value::Decimal32(d) => out.extend_from_slice(d.as_inner()),
        Value::Decimal64(d) => out.extend_from_slice(d.as_inner()),
        Value::Decimal128(d) => out.extend_from_slice(d.as_inner()),
        Value::Char(c) => out.extend_from_slice(&u32::from(*c).to_be_bytes()),
        Value::Timestamp(t) => out.extend_from_slice(&t.milliseconds().to_be_bytes()),
        Value::Uuid(u) => out.extend_from_slice(u.as_inner()),
        Value::Binary(b) => wide(out, b),
        Value::String(s) => wide(out, s.as_bytes()),
        Value::Symbol(s) => wide(out, s.as_str().as_bytes()),
        _ => {}
    }
}

/// An array: one constructor shared by its elements. Elements that cannot share one (mixed
/// types, or compound values, which the envelope's `$array` marker never writes for a message
/// that came through AMQP) are delivered as a list of the same values; an empty array has null
/// elements.
fn array(out: &mut Vec<u8>, items: &[Value]) {
    let constructor = match items.first() {
        None => Some(0x40),
        Some(first) => wide_constructor(first).filter(|_| {
            items
                .iter()
                .all(|v| std::mem::discriminant(v) == std::mem::discriminant(first))
        }),
    };
    let Some(constructor) = constructor else {
        return list(out, items);
    };
    let mut body = vec![constructor];
    for v in items {
        data(&mut body, v);
    }
    match u8::try_from(body.len() + 1) {
        Ok(size) if body.len() < 255 => {
            out.extend_from_slice(&[0xe0, size, items.len() as u8]);
        }
        _ => {
            out.push(0xf0);
            out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
            out.extend_from_slice(&(items.len() as u32).to_be_bytes());
        }
    }
    out.extend_from_slice(&body);
}
