//! Performative decoding and encoding.
//!
//! Every frame body has already passed [`validate`](super::validate) when it gets here, so serde
//! sees only encodings whose lengths are true and whose nesting is shallow. fe2o3's types are used
//! wherever they are right; where they are too strict (an unknown delivery state fails a whole
//! DISPOSITION, a coordinator target or unknown distribution mode fails a whole ATTACH) a lenient
//! local struct recovers what the engine needs to answer precisely.

use bytes::{BufMut, Bytes, BytesMut};
use fe2o3_amqp_types::definitions::{Handle, Role};
use fe2o3_amqp_types::performatives::{
    Attach, Begin, Close, Detach, Disposition, End, Flow, Open, Transfer,
};
use fe2o3_amqp_types::sasl::{SaslInit, SaslMechanisms, SaslOutcome};
use serde_amqp::descriptor::Descriptor;
use serde_amqp::macros::DeserializeComposite;
use serde_amqp::Value;

use super::frame::{write_frame, TYPE_AMQP, TYPE_SASL};
use super::outcome::{DeliveryOutcome, DispositionFrame};
use super::quick_decode;
use super::validate::{value_len, ValidateError};

/// A decoded AMQP performative, with a TRANSFER's payload split off.
#[derive(Debug)]
pub enum Performative {
    /// OPEN.
    Open(Box<Open>),
    /// BEGIN.
    Begin(Begin),
    /// ATTACH, or the head of one fe2o3 could not decode in full.
    Attach(AttachFrame),
    /// FLOW.
    Flow(Flow),
    /// TRANSFER and the bytes after the performative.
    Transfer(Transfer, Bytes),
    /// DISPOSITION, with its state read leniently.
    Disposition(DispositionFrame),
    /// DETACH.
    Detach(Detach),
    /// END.
    End(End),
    /// CLOSE.
    Close(Close),
}

/// An ATTACH: fully decoded, or only its head plus the refusal it earns.
#[derive(Debug)]
pub enum AttachFrame {
    /// Every field decoded.
    Full(Box<Attach>),
    /// Name, handle and role decoded; the rest is something we refuse.
    Head {
        /// Link name.
        name: String,
        /// Peer's handle.
        handle: u32,
        /// Peer's role.
        role: Role,
        /// Whether the target is a transaction coordinator (NG-1).
        coordinator: bool,
    },
}

/// The head fields of ATTACH that every client sends correctly, decoded without the strict types.
#[derive(Debug, DeserializeComposite)]
#[amqp_contract(
    name = "amqp:attach:list",
    code = "0x0000_0000:0x0000_0012",
    encoding = "list",
    rename_all = "kebab-case"
)]
struct AttachHead {
    name: String,
    handle: Handle,
    role: Role,
    snd_settle_mode: Option<Value>,
    rcv_settle_mode: Option<Value>,
    source: Option<Value>,
    target: Option<Value>,
}

/// DISPOSITION with the state kept as a raw value, so an unknown state is not a decode failure.
#[derive(Debug, DeserializeComposite)]
#[amqp_contract(
    name = "amqp:disposition:list",
    code = "0x0000_0000:0x0000_0015",
    encoding = "list",
    rename_all = "kebab-case"
)]
struct LenientDisposition {
    role: Role,
    first: u32,
    last: Option<u32>,
    #[amqp_contract(default)]
    settled: bool,
    state: Option<Value>,
    #[amqp_contract(default)]
    batchable: bool,
}

/// Why a frame body could not be turned into a performative.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The structural pre-validator refused it.
    #[error("malformed encoding: {0}")]
    Structure(#[from] ValidateError),
    /// Not a described performative we know.
    #[error("unknown performative")]
    UnknownPerformative,
    /// Structurally sound but not a valid performative of its kind.
    #[error("invalid {0} performative")]
    Invalid(&'static str),
}

/// Reads the descriptor code of a described value without decoding it.
fn descriptor_code(body: &[u8]) -> Option<u64> {
    if body.first() != Some(&0x00) {
        return None;
    }
    match *body.get(1)? {
        0x53 => body.get(2).map(|b| u64::from(*b)),
        0x80 => {
            let s = body.get(2..10)?;
            Some(u64::from_be_bytes(s.try_into().ok()?))
        }
        0xa3 => {
            let n = usize::from(*body.get(2)?);
            let name = body.get(3..3 + n)?;
            symbolic_code(name)
        }
        0xb3 => {
            let n = u32::from_be_bytes(body.get(2..6)?.try_into().ok()?) as usize;
            let name = body.get(6..6usize.checked_add(n)?)?;
            symbolic_code(name)
        }
        _ => None,
    }
}

fn symbolic_code(name: &[u8]) -> Option<u64> {
    const NAMES: [(&[u8], u64); 14] = [
        (b"amqp:open:list", 0x10),
        (b"amqp:begin:list", 0x11),
        (b"amqp:attach:list", 0x12),
        (b"amqp:flow:list", 0x13),
        (b"amqp:transfer:list", 0x14),
        (b"amqp:disposition:list", 0x15),
        (b"amqp:detach:list", 0x16),
        (b"amqp:end:list", 0x17),
        (b"amqp:close:list", 0x18),
        (b"amqp:sasl-mechanisms:list", 0x40),
        (b"amqp:sasl-init:list", 0x41),
        (b"amqp:sasl-challenge:list", 0x42),
        (b"amqp:sasl-response:list", 0x43),
        (b"amqp:sasl-outcome:list", 0x44),
    ];
    NAMES.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
}

pub(super) fn from<'a, T: serde::Deserialize<'a>>(
    bytes: &'a [u8],
    what: &'static str,
) -> Result<T, DecodeError> {
    serde_amqp::from_slice(bytes).map_err(|_| DecodeError::Invalid(what))
}

/// Decodes one AMQP frame body (non-empty) into a performative.
pub fn decode_performative(body: &Bytes) -> Result<Performative, DecodeError> {
    // The two performatives on every message's path, in their plain encodings, are checked as
    // they are read; anything else is walked by the validator first.
    if let Some((transfer, len)) = quick_decode::transfer(body) {
        return Ok(Performative::Transfer(transfer, body.slice(len..)));
    }
    if let Some(disposition) = quick_decode::disposition(body) {
        return Ok(Performative::Disposition(disposition));
    }
    let len = value_len(body)?;
    let perf = body
        .get(..len)
        .ok_or(DecodeError::Invalid("performative"))?;
    let code = descriptor_code(perf).ok_or(DecodeError::UnknownPerformative)?;
    if code != 0x14 && len != body.len() {
        // Only TRANSFER carries a payload after its performative.
        return Err(DecodeError::Invalid("trailing bytes after"));
    }
    Ok(match code {
        0x10 => Performative::Open(Box::new(from(perf, "open")?)),
        0x11 => Performative::Begin(from(perf, "begin")?),
        0x12 => Performative::Attach(decode_attach(perf)?),
        0x13 => Performative::Flow(from(perf, "flow")?),
        0x14 => Performative::Transfer(from(perf, "transfer")?, body.slice(len..)),
        0x15 => Performative::Disposition(serde_disposition(perf)?),
        0x16 => Performative::Detach(from(perf, "detach")?),
        0x17 => Performative::End(from(perf, "end")?),
        0x18 => Performative::Close(from(perf, "close")?),
        _ => return Err(DecodeError::UnknownPerformative),
    })
}

fn decode_attach(perf: &[u8]) -> Result<AttachFrame, DecodeError> {
    if let Ok(a) = serde_amqp::from_slice::<Attach>(perf) {
        return Ok(AttachFrame::Full(Box::new(a)));
    }
    let head: AttachHead = from(perf, "attach")?;
    let coordinator = match &head.target {
        Some(Value::Described(d)) => match &d.descriptor {
            Descriptor::Code(c) => *c == 0x30,
            Descriptor::Name(n) => n.as_str() == "amqp:coordinator:list",
        },
        _ => false,
    };
    let _ = (&head.snd_settle_mode, &head.rcv_settle_mode, &head.source);
    Ok(AttachFrame::Head {
        name: head.name,
        handle: head.handle.0,
        role: head.role,
        coordinator,
    })
}

/// DISPOSITION through serde: strictly first, then leniently for states fe2o3 refuses.
pub(super) fn serde_disposition(perf: &[u8]) -> Result<DispositionFrame, DecodeError> {
    if let Ok(d) = serde_amqp::from_slice::<Disposition>(perf) {
        return Ok(DispositionFrame {
            role: d.role,
            first: d.first,
            last: d.last.unwrap_or(d.first),
            settled: d.settled,
            state: d.state.map(DeliveryOutcome::from_state),
        });
    }
    let d: LenientDisposition = from(perf, "disposition")?;
    let _ = d.batchable;
    Ok(DispositionFrame {
        role: d.role,
        first: d.first,
        last: d.last.unwrap_or(d.first),
        settled: d.settled,
        state: d.state.map(DeliveryOutcome::from_value),
    })
}

/// A decoded SASL frame from the client.
#[derive(Debug)]
pub enum SaslFrame {
    /// SASL-INIT.
    Init(SaslInit),
    /// Any other SASL performative (a response to a challenge we never send, or garbage).
    Other(u64),
}

/// Decodes one SASL frame body.
pub fn decode_sasl(body: &Bytes) -> Result<SaslFrame, DecodeError> {
    let len = value_len(body)?;
    if len != body.len() {
        return Err(DecodeError::Invalid("trailing bytes after sasl"));
    }
    match descriptor_code(body).ok_or(DecodeError::UnknownPerformative)? {
        0x41 => Ok(SaslFrame::Init(from(body, "sasl-init")?)),
        other => Ok(SaslFrame::Other(other)),
    }
}

/// Appends `value`'s AMQP encoding to `out`.
pub fn encode_into<T: serde::Serialize>(out: &mut BytesMut, value: &T) {
    let mut ser = serde_amqp::ser::Serializer::new(out.writer());
    // Our own performatives always serialize: the writer is infallible and the types are sound.
    if let Err(e) = value.serialize(&mut ser) {
        tracing::error!(error = %e, "encoding an outgoing performative failed");
    }
}

/// Appends one AMQP frame carrying `perf` (and an optional payload) to `out`.
pub fn write_amqp<T: serde::Serialize>(out: &mut BytesMut, channel: u16, perf: &T, payload: &[u8]) {
    write_frame(out, TYPE_AMQP, channel, |b| {
        encode_into(b, perf);
        b.extend_from_slice(payload);
    });
}

/// Appends a SASL-MECHANISMS frame.
pub fn write_sasl_mechanisms(out: &mut BytesMut, m: &SaslMechanisms) {
    write_frame(out, TYPE_SASL, 0, |b| encode_into(b, m));
}

/// Appends a SASL-OUTCOME frame.
pub fn write_sasl_outcome(out: &mut BytesMut, o: &SaslOutcome) {
    write_frame(out, TYPE_SASL, 0, |b| encode_into(b, o));
}

/// The TRANSFER fields the server sends; everything after `more` stays at its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferHead<'a> {
    /// Our handle.
    pub handle: u32,
    /// Delivery-id, on the first frame of a delivery only.
    pub delivery_id: Option<u32>,
    /// Delivery tag, on the first frame only.
    pub tag: Option<&'a [u8]>,
    /// Message format (0), on the first frame only.
    pub message_format: Option<u32>,
    /// Pre-settled flag, on the first frame only.
    pub settled: Option<bool>,
    /// More frames follow.
    pub more: bool,
}

fn put_uint(out: &mut BytesMut, v: u32) {
    match v {
        0 => out.put_u8(0x43),
        1..=255 => {
            out.put_u8(0x52);
            out.put_u8(v as u8);
        }
        _ => {
            out.put_u8(0x70);
            out.put_u32(v);
        }
    }
}

/// Appends the encoding of an outgoing TRANSFER performative, byte-identical to fe2o3's (trailing
/// absent or default fields omitted), without its ~10 allocations: this is the hot outbound path.
pub fn encode_transfer(out: &mut BytesMut, t: &TransferHead<'_>) {
    // Fields up to the last one that is not absent or default.
    let count: u8 = if t.more {
        6
    } else if t.settled.is_some() {
        5
    } else if t.message_format.is_some() {
        4
    } else if t.tag.is_some() {
        3
    } else if t.delivery_id.is_some() {
        2
    } else {
        1
    };
    let start = out.len();
    out.extend_from_slice(&[0x00, 0x53, 0x14, 0xd0, 0, 0, 0, 0, 0, 0, 0, count]);
    let body_start = out.len();
    put_uint(out, t.handle);
    if count >= 2 {
        match t.delivery_id {
            Some(id) => put_uint(out, id),
            None => out.put_u8(0x40),
        }
    }
    if count >= 3 {
        match t.tag {
            Some(tag) if tag.len() < 256 => {
                out.put_u8(0xa0);
                out.put_u8(tag.len() as u8);
                out.extend_from_slice(tag);
            }
            Some(tag) => {
                out.put_u8(0xb0);
                out.put_u32(tag.len() as u32);
                out.extend_from_slice(tag);
            }
            None => out.put_u8(0x40),
        }
    }
    if count >= 4 {
        match t.message_format {
            Some(f) => put_uint(out, f),
            None => out.put_u8(0x40),
        }
    }
    if count >= 5 {
        match t.settled {
            Some(true) => out.put_u8(0x41),
            Some(false) => out.put_u8(0x42),
            None => out.put_u8(0x40),
        }
    }
    if count >= 6 {
        out.put_u8(0x41);
    }
    let fields = out.len() - body_start;
    if fields + 1 < 256 {
        // Shrink to list8, as fe2o3 does for small lists: the fields move 6 bytes to the front,
        // in place, behind the list8 constructor, size and count.
        out.copy_within(body_start.., start + 6);
        out.truncate(start + 6 + fields);
        if let Some(list8) = out.get_mut(start + 3..start + 6) {
            list8.copy_from_slice(&[0xc0, (fields + 1) as u8, count]);
        }
    } else if let Some(size_field) = out.get_mut(start + 4..start + 8) {
        size_field.copy_from_slice(&((fields + 4) as u32).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written TRANSFER encoder agrees byte for byte with fe2o3's serializer.
    #[test]
    fn fast_transfer_encoding_matches_fe2o3() {
        let tags: [&[u8]; 3] = [b"", b"tag-1", &[7u8; 32]];
        for handle in [0u32, 1, 255, 256, u32::MAX] {
            for id in [None, Some(0u32), Some(300)] {
                for tag in [None, Some(tags[0]), Some(tags[1]), Some(tags[2])] {
                    for settled in [None, Some(false), Some(true)] {
                        for more in [false, true] {
                            let format = id.map(|_| 0u32);
                            let head = TransferHead {
                                handle,
                                delivery_id: id,
                                tag,
                                message_format: format,
                                settled,
                                more,
                            };
                            let fe = Transfer {
                                handle: handle.into(),
                                delivery_id: id,
                                delivery_tag: tag.map(|t| serde_bytes::ByteBuf::from(t.to_vec())),
                                message_format: format,
                                settled,
                                more,
                                rcv_settle_mode: None,
                                state: None,
                                resume: false,
                                aborted: false,
                                batchable: false,
                            };
                            let mut ours = BytesMut::new();
                            encode_transfer(&mut ours, &head);
                            // The same behind frames already in the buffer.
                            let mut behind = BytesMut::from(&b"earlier frames"[..]);
                            encode_transfer(&mut behind, &head);
                            assert_eq!(&behind[14..], &ours[..], "{head:?}");
                            assert_eq!(
                                &ours[..],
                                &serde_amqp::to_vec(&fe).unwrap()[..],
                                "{head:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn descriptor_forms() {
        assert_eq!(descriptor_code(&[0x00, 0x53, 0x10]), Some(0x10));
        let mut ulong = vec![0x00, 0x80];
        ulong.extend_from_slice(&0x15u64.to_be_bytes());
        assert_eq!(descriptor_code(&ulong), Some(0x15));
        let mut sym = vec![0x00, 0xa3, 14];
        sym.extend_from_slice(b"amqp:open:list");
        assert_eq!(descriptor_code(&sym), Some(0x10));
        assert_eq!(descriptor_code(&[0x40]), None);
    }

    /// A `rejected` state whose error fe2o3 refuses (rhea sends an empty error map) is still
    /// `rejected`, not an unknown state: Q-21 acks it instead of requeueing it.
    #[test]
    fn lenient_known_states() {
        // disposition(role=receiver, first=1, settled=true, state=rejected(error = {} map))
        let described = |code: u64, fields: Vec<Value>| {
            Value::Described(Box::new(serde_amqp::described::Described {
                descriptor: Descriptor::Code(code),
                value: Value::List(fields),
            }))
        };
        let state = described(0x25, vec![Value::Map(Default::default())]);
        let disp = described(
            0x15,
            vec![
                Value::Bool(true),
                Value::Uint(1),
                Value::Null,
                Value::Bool(true),
                state,
            ],
        );
        let body = serde_amqp::to_vec(&disp).unwrap();
        let p = decode_performative(&Bytes::from(body)).unwrap();
        let Performative::Disposition(d) = p else {
            panic!("not a disposition")
        };
        assert_eq!(d.state, Some(DeliveryOutcome::Rejected(None)));
        let modified = Value::Described(Box::new(serde_amqp::described::Described {
            descriptor: Descriptor::Name("amqp:modified:list".into()),
            value: Value::List(vec![Value::Bool(true), Value::Null]),
        }));
        assert_eq!(
            DeliveryOutcome::from_value(modified),
            DeliveryOutcome::Modified {
                delivery_failed: true,
                undeliverable_here: false
            }
        );
    }

    /// A DISPOSITION with an unknown state decodes; the state is kept as Unknown.
    #[test]
    fn unknown_delivery_state_decodes() {
        // disposition(role=receiver, first=3, last=5, settled=true, state=0x1234:0x77 described list0)
        let mut body = vec![0x00, 0x53, 0x15, 0xc0];
        let fields: Vec<u8> = vec![
            0x41, 0x52, 3, 0x52, 5, 0x41, 0x00, 0x80, 0, 0, 0x12, 0x34, 0, 0, 0, 0x77, 0x45,
        ];
        body.push((fields.len() + 1) as u8);
        body.push(5);
        body.extend_from_slice(&fields);
        let p = decode_performative(&Bytes::from(body)).unwrap();
        let Performative::Disposition(d) = p else {
            panic!("not a disposition")
        };
        assert_eq!((d.first, d.last, d.settled), (3, 5, true));
        assert!(matches!(d.state, Some(DeliveryOutcome::Unknown(_))));
    }
}
