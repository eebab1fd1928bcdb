//! Structural pre-validation of AMQP-encoded values, run on every frame body before serde sees it.
//!
//! fe2o3's decoder trusts declared lengths (a 15-byte frame can make it allocate 4 GiB), recurses
//! without a bound (deep nesting overflows the stack) and overflows integers on odd sizes. This
//! walker checks every size and count against the bytes that are really there, requires even
//! map counts, and caps nesting, so whatever passes is safe to hand to serde.
//! Recursion is fine here because depth is capped at [`MAX_DEPTH`].

/// Deepest nesting of compound and described values accepted.
pub const MAX_DEPTH: usize = 32;

/// Why an encoding was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ValidateError {
    /// A length, count or fixed-width value runs past the available bytes.
    #[error("truncated or inconsistent encoding at offset {0}")]
    Truncated(usize),
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("values nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// A constructor byte that AMQP does not define.
    #[error("unknown type constructor 0x{0:02x}")]
    UnknownConstructor(u8),
    /// A map with an odd number of items.
    #[error("map with an odd item count")]
    OddMap,
    /// An encoding legal in AMQP that we do not accept (arrays of arrays).
    #[error("unsupported encoding 0x{0:02x} in an array")]
    Unsupported(u8),
    /// A string that is not UTF-8, or a symbol that is not ASCII (AMQP 1.0 part 1, 1.6.20 and
    /// 1.6.21): stored, it would be handed to every consumer, whose decoders refuse it.
    #[error("invalid {kind} at offset {at}")]
    BadText {
        /// String or symbol.
        kind: TextKind,
        /// Where its bytes start.
        at: usize,
    },
}

/// The kind of text a [`ValidateError::BadText`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    /// A string (UTF-8).
    String,
    /// A symbol (ASCII).
    Symbol,
}

impl std::fmt::Display for TextKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TextKind::String => "string",
            TextKind::Symbol => "symbol",
        })
    }
}

/// How the bytes after a constructor are laid out (widths in bytes).
#[derive(Clone, Copy)]
enum Layout {
    Fixed(u8),
    Var(u8),
    Compound(u8, bool),
    Array(u8),
    Unknown,
}

/// The layout of every constructor byte: one lookup per value, on every frame.
static LAYOUTS: [Layout; 256] = layouts();

/// The layout of constructor `code`.
fn layout(code: u8) -> Layout {
    // A byte always indexes the 256 entries.
    LAYOUTS
        .get(usize::from(code))
        .copied()
        .unwrap_or(Layout::Unknown)
}

// Evaluated at compile time, where an index out of bounds would fail the build.
#[allow(clippy::indexing_slicing)]
const fn layouts() -> [Layout; 256] {
    let mut table = [Layout::Unknown; 256];
    let mut code = 0;
    while code < 256 {
        table[code] = match code as u8 {
            0x40..=0x45 => Layout::Fixed(0),
            0x50..=0x56 => Layout::Fixed(1),
            0x60 | 0x61 => Layout::Fixed(2),
            0x70..=0x74 => Layout::Fixed(4),
            0x80..=0x84 => Layout::Fixed(8),
            0x94 | 0x98 => Layout::Fixed(16),
            0xa0 | 0xa1 | 0xa3 => Layout::Var(1),
            0xb0 | 0xb1 | 0xb3 => Layout::Var(4),
            0xc0 => Layout::Compound(1, false),
            0xc1 => Layout::Compound(1, true),
            0xd0 => Layout::Compound(4, false),
            0xd1 => Layout::Compound(4, true),
            0xe0 => Layout::Array(1),
            0xf0 => Layout::Array(4),
            _ => Layout::Unknown,
        };
        code += 1;
    }
    table
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// What each step of the walk returns.
type Walk = Result<(), ValidateError>;

impl Cursor<'_> {
    fn byte(&mut self) -> Result<u8, ValidateError> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or(ValidateError::Truncated(self.pos))?;
        self.pos += 1;
        Ok(b)
    }

    fn width(&mut self, w: u8) -> Result<usize, ValidateError> {
        if w == 1 {
            return Ok(usize::from(self.byte()?));
        }
        let at = self.pos;
        let s: [u8; 4] = self
            .take(4)?
            .try_into()
            .map_err(|_| ValidateError::Truncated(at))?;
        Ok(u32::from_be_bytes(s) as usize)
    }

    fn take(&mut self, n: usize) -> Result<&[u8], ValidateError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(ValidateError::Truncated(self.pos))?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(ValidateError::Truncated(self.pos))?;
        self.pos = end;
        Ok(s)
    }

    /// One complete value: constructor (possibly described) and its data. Scalars, most of
    /// every frame, are walked here without a further call.
    #[inline]
    fn value(&mut self, depth: usize) -> Walk {
        if depth > MAX_DEPTH {
            return Err(ValidateError::TooDeep);
        }
        let code = self.byte()?;
        if code == 0x00 {
            return self.described(depth);
        }
        self.data(code, depth)
    }

    /// A described value: its descriptor, then the value.
    #[inline(never)]
    fn described(&mut self, depth: usize) -> Walk {
        self.value(depth + 1)?;
        self.value(depth + 1)
    }

    /// The data that follows constructor `code`.
    #[inline]
    fn data(&mut self, code: u8, depth: usize) -> Walk {
        match layout(code) {
            Layout::Fixed(n) => self.take(usize::from(n)).map(|_| ()),
            Layout::Var(w) => self.text(code, w),
            Layout::Compound(w, is_map) => self.compound(w, is_map, depth),
            Layout::Array(w) => self.array(w, depth),
            Layout::Unknown => Err(ValidateError::UnknownConstructor(code)),
        }
    }

    /// Binary, string or symbol: strings must be UTF-8, symbols ASCII.
    #[inline(never)]
    fn text(&mut self, code: u8, w: u8) -> Walk {
        let n = self.width(w)?;
        let at = self.pos;
        let bytes = self.take(n)?;
        match code {
            0xa1 | 0xb1 if std::str::from_utf8(bytes).is_err() => Err(ValidateError::BadText {
                kind: TextKind::String,
                at,
            }),
            0xa3 | 0xb3 if !bytes.is_ascii() => Err(ValidateError::BadText {
                kind: TextKind::Symbol,
                at,
            }),
            _ => Ok(()),
        }
    }

    /// The size and count fields of a compound or array, each `w` bytes wide: the count, and
    /// where the items end. The cursor is left after the count.
    fn sized(&mut self, w: u8) -> Result<(usize, usize), ValidateError> {
        let size = self.width(w)?;
        let start = self.pos;
        let end = start.checked_add(size).filter(|e| *e <= self.buf.len());
        let end = end.ok_or(ValidateError::Truncated(start))?;
        if size < usize::from(w) {
            return Err(ValidateError::Truncated(start));
        }
        let count = self.width(w)?;
        Ok((count, end))
    }

    /// A list or map.
    #[inline(never)]
    fn compound(&mut self, w: u8, is_map: bool, depth: usize) -> Walk {
        let start = self.pos + usize::from(w);
        let (count, end) = self.sized(w)?;
        if is_map && count % 2 != 0 {
            return Err(ValidateError::OddMap);
        }
        // Each item takes at least one byte: a count beyond the size is a lie.
        if count > end - start {
            return Err(ValidateError::Truncated(start));
        }
        let mut inner = Cursor {
            buf: self.buf.get(..end).ok_or(ValidateError::Truncated(start))?,
            pos: self.pos,
        };
        for _ in 0..count {
            inner.value(depth + 1)?;
        }
        if inner.pos != end {
            return Err(ValidateError::Truncated(inner.pos));
        }
        self.pos = end;
        Ok(())
    }

    /// An array: one element constructor (possibly described), then `count` elements' data.
    #[inline(never)]
    fn array(&mut self, w: u8, depth: usize) -> Walk {
        let start = self.pos + usize::from(w);
        let (count, end) = self.sized(w)?;
        if count > end - start {
            return Err(ValidateError::Truncated(start));
        }
        let mut inner = Cursor {
            buf: self.buf.get(..end).ok_or(ValidateError::Truncated(start))?,
            pos: self.pos,
        };
        let mut elem = inner.byte()?;
        if elem == 0x00 {
            inner.value(depth + 1)?;
            elem = inner.byte()?;
        }
        match layout(elem) {
            Layout::Unknown => return Err(ValidateError::UnknownConstructor(elem)),
            Layout::Array(_) => return Err(ValidateError::Unsupported(elem)),
            _ => {}
        }
        for _ in 0..count {
            inner.data(elem, depth + 1)?;
        }
        if inner.pos != end {
            return Err(ValidateError::Truncated(inner.pos));
        }
        self.pos = end;
        Ok(())
    }
}

/// Validates the first value in `buf` and returns how many bytes it spans.
pub fn value_len(buf: &[u8]) -> Result<usize, ValidateError> {
    let mut c = Cursor { buf, pos: 0 };
    c.value(0)?;
    Ok(c.pos)
}

/// Validates that `buf` is a sequence of complete values with nothing left over.
pub fn validate_all(buf: &[u8]) -> Result<(), ValidateError> {
    let mut c = Cursor { buf, pos: 0 };
    while c.pos < buf.len() {
        c.value(0)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strings must be UTF-8 and symbols ASCII, alone, in compounds and in arrays; binary is
    /// anything.
    #[test]
    fn strings_are_utf8_and_symbols_ascii() {
        assert_eq!(value_len(&[0xa1, 2, b'o', b'k']), Ok(4));
        assert_eq!(value_len(&[0xa1, 2, 0xc3, 0xa9]), Ok(4), "é is UTF-8");
        assert_eq!(
            value_len(&[0xa1, 2, 0xc3, 0x28]),
            Err(ValidateError::BadText {
                kind: TextKind::String,
                at: 2
            })
        );
        assert_eq!(
            value_len(&[0xb1, 0, 0, 0, 1, 0xff]),
            Err(ValidateError::BadText {
                kind: TextKind::String,
                at: 5
            })
        );
        assert_eq!(
            value_len(&[0xa3, 1, 0xe9]),
            Err(ValidateError::BadText {
                kind: TextKind::Symbol,
                at: 2
            })
        );
        assert_eq!(value_len(&[0xa0, 2, 0xff, 0xfe]), Ok(4), "binary is opaque");
        // list8 of one bad string; array8 of str8 with a bad second element.
        assert!(matches!(
            value_len(&[0xc0, 4, 1, 0xa1, 1, 0xff]),
            Err(ValidateError::BadText { .. })
        ));
        assert!(matches!(
            value_len(&[0xe0, 6, 2, 0xa1, 1, b'a', 1, 0xff]),
            Err(ValidateError::BadText { .. })
        ));
    }

    #[test]
    fn accepts_real_encodings() {
        use fe2o3_amqp_types::performatives::{Flow, Open};
        let open = Open {
            container_id: "c".into(),
            hostname: Some("h".into()),
            max_frame_size: 512.into(),
            channel_max: 7.into(),
            idle_time_out: Some(5),
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        };
        let bytes = serde_amqp::to_vec(&open).unwrap();
        assert_eq!(value_len(&bytes), Ok(bytes.len()));
        let flow = Flow {
            next_incoming_id: Some(1),
            incoming_window: 2048,
            next_outgoing_id: 0,
            outgoing_window: 2048,
            handle: Some(0.into()),
            delivery_count: Some(0),
            link_credit: Some(10),
            available: None,
            drain: true,
            echo: false,
            properties: None,
        };
        let bytes = serde_amqp::to_vec(&flow).unwrap();
        assert_eq!(value_len(&bytes), Ok(bytes.len()));
    }

    /// The 15-byte DISPOSITION whose state is a vbin32 of length 0xffffffff.
    #[test]
    fn refuses_length_lies() {
        let evil = [
            0x00, 0x53, 0x15, 0xc0, 0x0a, 0x02, 0x41, 0x43, 0xb0, 0xff, 0xff, 0xff, 0xff, 0x00,
            0x00,
        ];
        assert!(matches!(value_len(&evil), Err(ValidateError::Truncated(_))));
        let sym = [0x00, 0xb3, 0x7f, 0xff, 0xff, 0xf0, 0x41];
        assert!(matches!(value_len(&sym), Err(ValidateError::Truncated(_))));
        let list_count_lie = [0xd0, 0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0x40];
        assert!(value_len(&list_count_lie).is_err());
        let odd_map = [0xc1, 0x02, 0x01, 0x40];
        assert_eq!(value_len(&odd_map), Err(ValidateError::OddMap));
        let size_below_count_width = [0xc0, 0x00];
        assert!(value_len(&size_below_count_width).is_err());
    }

    #[test]
    fn caps_nesting() {
        let mut deep = vec![0x00u8; 2_500 * 3];
        for chunk in deep.chunks_mut(3) {
            chunk.copy_from_slice(&[0x00, 0x53, 0x01]);
        }
        deep.push(0x40);
        assert_eq!(value_len(&deep), Err(ValidateError::TooDeep));
        let mut lists = Vec::new();
        for _ in 0..40 {
            lists.extend_from_slice(&[0xc0, 0x00, 0x01]);
        }
        assert!(value_len(&lists).is_err());
    }

    #[test]
    fn arrays() {
        // array8 of two sym8 "a", "bc"
        let arr = [0xe0, 0x07, 0x02, 0xa3, 0x01, b'a', 0x02, b'b', b'c'];
        assert_eq!(value_len(&arr), Ok(arr.len()));
        // fixed-width array whose count does not fill the size
        let bad = [0xe0, 0x04, 0x02, 0x52, 0x01];
        assert!(value_len(&bad).is_err());
        // array of arrays
        let nested = [0xe0, 0x04, 0x01, 0xe0, 0x01, 0x00];
        assert!(value_len(&nested).is_err());
    }
}
