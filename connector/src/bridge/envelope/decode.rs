//! The header's and properties' fields read by hand in the encodings clients send (null, boolean,
//! the integers, timestamp, uuid, binary, string, symbol), because ingress reads them on every
//! message and serde_amqp's generic decoder cost more than the rest of ingress. Anything else
//! returns `None` and goes through serde_amqp, which stays the reference (a test holds both to
//! the same values). The section has passed the structural validator, so sizes match the
//! bytes; every read is still bounds-checked.

use serde_amqp::primitives::{Symbol, Timestamp};
use serde_amqp::Value;
use serde_bytes::ByteBuf;

/// The fields of a described list section (`0x00 0x53 <code>` then the list).
pub(super) fn list_section(section: &[u8]) -> Option<Vec<Value>> {
    let mut r = Reader {
        buf: section.get(3..)?,
        pos: 0,
    };
    if section.first() != Some(&0x00) || section.get(1) != Some(&0x53) {
        return None;
    }
    let count = match r.byte()? {
        0x45 => 0,
        0xc0 => {
            r.take(1)?;
            usize::from(r.byte()?)
        }
        0xd0 => {
            r.take(4)?;
            r.u32()? as usize
        }
        _ => return None,
    };
    // Each field takes at least a byte: a count beyond the bytes is not a list we read.
    if count > r.buf.len() {
        return None;
    }
    let mut fields = Vec::with_capacity(count);
    for _ in 0..count {
        fields.push(r.scalar()?);
    }
    Some(fields)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(bytes)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_be_bytes)
    }

    fn text(&mut self, wide: bool) -> Option<&'a [u8]> {
        let n = if wide {
            self.u32()? as usize
        } else {
            usize::from(self.byte()?)
        };
        self.take(n)
    }

    /// One scalar in an encoding this reader knows.
    fn scalar(&mut self) -> Option<Value> {
        Some(match self.byte()? {
            0x40 => Value::Null,
            0x41 => Value::Bool(true),
            0x42 => Value::Bool(false),
            0x56 => Value::Bool(self.byte()? != 0),
            0x50 => Value::Ubyte(self.byte()?),
            0x51 => Value::Byte(i8::from_be_bytes(self.array()?)),
            0x60 => Value::Ushort(u16::from_be_bytes(self.array()?)),
            0x61 => Value::Short(i16::from_be_bytes(self.array()?)),
            0x43 => Value::Uint(0),
            0x52 => Value::Uint(u32::from(self.byte()?)),
            0x70 => Value::Uint(self.u32()?),
            0x54 => Value::Int(i32::from(i8::from_be_bytes(self.array()?))),
            0x71 => Value::Int(i32::from_be_bytes(self.array()?)),
            0x44 => Value::Ulong(0),
            0x53 => Value::Ulong(u64::from(self.byte()?)),
            0x80 => Value::Ulong(u64::from_be_bytes(self.array()?)),
            0x55 => Value::Long(i64::from(i8::from_be_bytes(self.array()?))),
            0x81 => Value::Long(i64::from_be_bytes(self.array()?)),
            0x83 => Value::Timestamp(Timestamp::from_milliseconds(i64::from_be_bytes(
                self.array()?,
            ))),
            0x98 => Value::Uuid(self.array::<16>()?.into()),
            code @ (0xa0 | 0xb0) => Value::Binary(ByteBuf::from(self.text(code == 0xb0)?)),
            code @ (0xa1 | 0xb1) => Value::String(
                std::str::from_utf8(self.text(code == 0xb1)?)
                    .ok()?
                    .to_string(),
            ),
            code @ (0xa3 | 0xb3) => {
                let s = std::str::from_utf8(self.text(code == 0xb3)?).ok()?;
                Value::Symbol(Symbol::from(s))
            }
            _ => return None,
        })
    }
}
