//! The message section walker: splits an encoded message into its sections without decoding the
//! body, and enforces what fe2o3 does not: section order, no duplicates, and one body kind
//! (fe2o3's decoder silently drops a Data section followed by an AmqpValue).
//!
//! Every section is structure-checked by the validator on the way, so the ranges it returns are
//! safe to decode with fe2o3 types. It allocates nothing.

use std::ops::Range;

use super::validate::{value_len, ValidateError};

pub use super::quick_decode::section_fields;

/// Section descriptor codes (AMQP 1.0 part 3).
mod code {
    pub const HEADER: u64 = 0x70;
    pub const DELIVERY_ANNOTATIONS: u64 = 0x71;
    pub const MESSAGE_ANNOTATIONS: u64 = 0x72;
    pub const PROPERTIES: u64 = 0x73;
    pub const APPLICATION_PROPERTIES: u64 = 0x74;
    pub const DATA: u64 = 0x75;
    pub const SEQUENCE: u64 = 0x76;
    pub const VALUE: u64 = 0x77;
    pub const FOOTER: u64 = 0x78;
}

/// What the body of a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body section.
    Empty,
    /// One or more Data sections (to be concatenated).
    Data {
        /// How many.
        sections: usize,
    },
    /// One or more AmqpSequence sections.
    Sequence,
    /// Exactly one AmqpValue section.
    Value,
}

/// Where each section of a message lies within its encoding (byte ranges of whole sections).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The header section.
    pub header: Option<Range<usize>>,
    /// The delivery-annotations section.
    pub delivery_annotations: Option<Range<usize>>,
    /// The message-annotations section.
    pub message_annotations: Option<Range<usize>>,
    /// The properties section.
    pub properties: Option<Range<usize>>,
    /// The application-properties section.
    pub application_properties: Option<Range<usize>>,
    /// All body sections, back to back.
    pub body: Range<usize>,
    /// The body's kind.
    pub body_kind: BodyKind,
    /// The footer section.
    pub footer: Option<Range<usize>>,
}

/// Why a message cannot be accepted as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// A section failed structural validation.
    #[error("malformed section: {0}")]
    Malformed(#[from] ValidateError),
    /// Something other than a described section, or a descriptor we do not know.
    #[error("unknown section at offset {0}")]
    UnknownSection(usize),
    /// A section out of the order AMQP fixes, or a second copy of a single section.
    #[error("section 0x{0:x} out of order or repeated")]
    OutOfOrder(u64),
    /// Body sections of different kinds, or more than one AmqpValue.
    #[error("body mixes section kinds or repeats amqp-value")]
    MixedBody,
}

/// The descriptor code of the section starting at `buf[0]`.
fn section_code(buf: &[u8]) -> Option<u64> {
    if buf.first() != Some(&0x00) {
        return None;
    }
    match *buf.get(1)? {
        0x53 => buf.get(2).map(|b| u64::from(*b)),
        0x80 => Some(u64::from_be_bytes(buf.get(2..10)?.try_into().ok()?)),
        0xa3 => {
            let n = usize::from(*buf.get(2)?);
            symbolic(buf.get(3..3 + n)?)
        }
        _ => None,
    }
}

fn symbolic(name: &[u8]) -> Option<u64> {
    const NAMES: [(&[u8], u64); 9] = [
        (b"amqp:header:list", code::HEADER),
        (b"amqp:delivery-annotations:map", code::DELIVERY_ANNOTATIONS),
        (b"amqp:message-annotations:map", code::MESSAGE_ANNOTATIONS),
        (b"amqp:properties:list", code::PROPERTIES),
        (
            b"amqp:application-properties:map",
            code::APPLICATION_PROPERTIES,
        ),
        (b"amqp:data:binary", code::DATA),
        (b"amqp:amqp-sequence:list", code::SEQUENCE),
        (b"amqp:amqp-value:*", code::VALUE),
        (b"amqp:footer:map", code::FOOTER),
    ];
    NAMES.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
}

/// Rank of a section in the fixed order; body sections share one rank.
fn rank(code: u64) -> u8 {
    match code {
        code::HEADER => 0,
        code::DELIVERY_ANNOTATIONS => 1,
        code::MESSAGE_ANNOTATIONS => 2,
        code::PROPERTIES => 3,
        code::APPLICATION_PROPERTIES => 4,
        code::DATA | code::SEQUENCE | code::VALUE => 5,
        _ => 6,
    }
}

/// Walks an encoded message.
pub fn walk(msg: &[u8]) -> Result<Layout, MessageError> {
    let mut layout = Layout {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: None,
        application_properties: None,
        body: 0..0,
        body_kind: BodyKind::Empty,
        footer: None,
    };
    let mut pos = 0;
    let mut last_rank: Option<u8> = None;
    while pos < msg.len() {
        let rest = msg.get(pos..).unwrap_or_default();
        let code = section_code(rest).ok_or(MessageError::UnknownSection(pos))?;
        if !(code::HEADER..=code::FOOTER).contains(&code) {
            return Err(MessageError::UnknownSection(pos));
        }
        let len = value_len(rest)?;
        let range = pos..pos + len;
        let r = rank(code);
        let repeat_ok = r == 5 && last_rank == Some(5);
        if last_rank.is_some_and(|l| l > r || (l == r && !repeat_ok)) {
            return Err(MessageError::OutOfOrder(code));
        }
        match code {
            code::HEADER => layout.header = Some(range),
            code::DELIVERY_ANNOTATIONS => layout.delivery_annotations = Some(range),
            code::MESSAGE_ANNOTATIONS => layout.message_annotations = Some(range),
            code::PROPERTIES => layout.properties = Some(range),
            code::APPLICATION_PROPERTIES => layout.application_properties = Some(range),
            code::FOOTER => layout.footer = Some(range),
            body => {
                layout.body_kind = match (layout.body_kind, body) {
                    (BodyKind::Empty, code::DATA) => BodyKind::Data { sections: 1 },
                    (BodyKind::Data { sections }, code::DATA) => BodyKind::Data {
                        sections: sections + 1,
                    },
                    (BodyKind::Empty | BodyKind::Sequence, code::SEQUENCE) => BodyKind::Sequence,
                    (BodyKind::Empty, code::VALUE) => BodyKind::Value,
                    _ => return Err(MessageError::MixedBody),
                };
                if layout.body.is_empty() {
                    layout.body = range;
                } else {
                    layout.body.end = range.end;
                }
            }
        }
        last_rank = Some(r);
        pos += len;
    }
    Ok(layout)
}

/// The binary contents of each Data section in `body` (a range from [`walk`]).
pub fn data_sections(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        let rest = body.get(pos..).filter(|r| !r.is_empty())?;
        let len = value_len(rest).ok()?;
        // A Data section is 0x00 0x53 0x75 then vbin8 (0xa0 len) or vbin32 (0xb0 len32).
        let (start, n) = match rest.get(3)? {
            0xa0 => (5, usize::from(*rest.get(4)?)),
            0xb0 => (
                8,
                u32::from_be_bytes(rest.get(4..8)?.try_into().ok()?) as usize,
            ),
            _ => return None,
        };
        pos += len;
        rest.get(start..start + n)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::messaging::{AmqpValue, ApplicationProperties, Data, Header, Properties};
    use serde_bytes::ByteBuf;

    fn enc<T: serde::Serialize>(v: &T) -> Vec<u8> {
        serde_amqp::to_vec(v).unwrap()
    }

    fn data(b: &[u8]) -> Vec<u8> {
        enc(&Data(ByteBuf::from(b.to_vec())))
    }

    #[test]
    fn full_message_layout() {
        let header = enc(&Header {
            durable: true,
            ..Default::default()
        });
        let props = enc(&Properties {
            message_id: Some(String::from("m1").into()),
            ..Default::default()
        });
        let app = enc(&ApplicationProperties::builder().insert("k", 1i32).build());
        let mut msg = [
            header.clone(),
            props.clone(),
            app.clone(),
            data(b"ab"),
            data(b"cd"),
        ]
        .concat();
        let l = walk(&msg).unwrap();
        assert_eq!(l.header, Some(0..header.len()));
        assert_eq!(l.properties.as_ref().map(|r| r.len()), Some(props.len()));
        assert_eq!(l.body_kind, BodyKind::Data { sections: 2 });
        let joined: Vec<u8> = data_sections(&msg[l.body.clone()])
            .flatten()
            .copied()
            .collect();
        assert_eq!(joined, b"abcd");
        msg.extend(enc(&fe2o3_amqp_types::messaging::Footer::default()));
        assert!(walk(&msg).unwrap().footer.is_some());
    }

    /// Data then AmqpValue is a mixed body, not a silently dropped Data (as fe2o3 would have it).
    #[test]
    fn mixed_body_refused() {
        let msg = [data(b"x"), enc(&AmqpValue("v".to_string()))].concat();
        assert_eq!(walk(&msg), Err(MessageError::MixedBody));
        let two_values = [enc(&AmqpValue(1i32)), enc(&AmqpValue(2i32))].concat();
        assert_eq!(walk(&two_values), Err(MessageError::MixedBody));
    }

    #[test]
    fn order_and_duplicates() {
        let header = enc(&Header::default());
        let props = enc(&Properties::default());
        assert!(matches!(
            walk(&[props.clone(), header.clone()].concat()),
            Err(MessageError::OutOfOrder(0x70))
        ));
        assert!(matches!(
            walk(&[header.clone(), header.clone()].concat()),
            Err(MessageError::OutOfOrder(0x70))
        ));
        assert!(matches!(
            walk(&[data(b"x"), props].concat()),
            Err(MessageError::OutOfOrder(0x73))
        ));
        assert_eq!(walk(&[]).unwrap().body_kind, BodyKind::Empty);
        assert!(matches!(
            walk(&[0x00, 0x53, 0x79, 0x40]),
            Err(MessageError::UnknownSection(0))
        ));
        assert!(matches!(
            walk(&[0x40]),
            Err(MessageError::UnknownSection(0))
        ));
        assert!(matches!(
            walk(&[0x00, 0x53, 0x75, 0xb0, 0xff, 0xff, 0xff, 0xff]),
            Err(MessageError::Malformed(_))
        ));
    }

    #[test]
    fn sequence_body() {
        let seq = enc(&fe2o3_amqp_types::messaging::AmqpSequence(vec![1i32, 2]));
        assert_eq!(
            walk(&[seq.clone(), seq].concat()).unwrap().body_kind,
            BodyKind::Sequence
        );
    }
}
