//! Hand decoding of TRANSFER and DISPOSITION in the encodings clients send, because these two
//! performatives are on every message's path and fe2o3's serde decoder cost more than the rest of
//! their handling (about a tenth of the connector's CPU per message); and, for the same reason,
//! of a message's header and properties sections when every field is a scalar.
//!
//! Only the plain cases are decoded here: the numeric descriptor, fields in their usual
//! encodings, and for DISPOSITION no state or an empty `accepted` / `released`. Anything else
//! returns `None` and goes through the serde decoder, which stays the reference for what is
//! accepted and how it is refused (differential tests pin that both agree). TRANSFER and
//! DISPOSITION are read before the structural validator runs: every read is bounds-checked and
//! a performative is taken only when its fields fill its list's size exactly, so what is read
//! here is what the validator would pass (a differential test pins that too); sections are read
//! after it.

use fe2o3_amqp_types::definitions::{Handle, ReceiverSettleMode, Role};
use fe2o3_amqp_types::performatives::Transfer;
use serde_amqp::primitives::{Symbol, Timestamp};
use serde_amqp::Value;
use serde_bytes::ByteBuf;

use super::outcome::{DeliveryOutcome, DispositionFrame};

/// The fields of a described list, read one by one; a field past the list's count is absent.
struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
    left: u32,
    /// Where the list's size says it ends, in `buf`.
    end: usize,
}

/// `None`: not an encoding this module reads. `Some(None)`: null or absent.
type Field<T> = Option<Option<T>>;

/// A fixed-width scalar as read, before it becomes a [`Value`] (which has a destructor to run).
#[derive(Debug, Clone, Copy)]
enum Fixed {
    Null,
    Bool(bool),
    Ubyte(u8),
    Byte(i8),
    Ushort(u16),
    Short(i16),
    Uint(u32),
    Int(i32),
    Ulong(u64),
    Long(i64),
    /// Milliseconds since the epoch.
    Timestamp(i64),
    Uuid([u8; 16]),
}

impl From<Fixed> for Value {
    fn from(f: Fixed) -> Value {
        match f {
            Fixed::Null => Value::Null,
            Fixed::Bool(b) => Value::Bool(b),
            Fixed::Ubyte(n) => Value::Ubyte(n),
            Fixed::Byte(n) => Value::Byte(n),
            Fixed::Ushort(n) => Value::Ushort(n),
            Fixed::Short(n) => Value::Short(n),
            Fixed::Uint(n) => Value::Uint(n),
            Fixed::Int(n) => Value::Int(n),
            Fixed::Ulong(n) => Value::Ulong(n),
            Fixed::Long(n) => Value::Long(n),
            Fixed::Timestamp(ms) => Value::Timestamp(Timestamp::from_milliseconds(ms)),
            Fixed::Uuid(u) => Value::Uuid(u.into()),
        }
    }
}

impl<'a> Fields<'a> {
    /// The list of a performative with the small-ulong descriptor `code`.
    fn of(perf: &'a [u8], code: u8) -> Option<Self> {
        if perf.get(..3)? != [0x00, 0x53, code] {
            return None;
        }
        let list = perf.get(3..)?;
        let (pos, left, end) = match *list.first()? {
            0x45 => (1, 0, 1),
            0xc0 => (3, u32::from(*list.get(2)?), 2 + usize::from(*list.get(1)?)),
            0xd0 => (
                9,
                u32::from_be_bytes(list.get(5..9)?.try_into().ok()?),
                5usize.checked_add(u32::from_be_bytes(list.get(1..5)?.try_into().ok()?) as usize)?,
            ),
            _ => return None,
        };
        Some(Fields {
            buf: list,
            pos,
            left,
            end,
        })
    }

    /// The next field's constructor byte: `Some(None)` once the list has no more fields, `None`
    /// if the bytes run out.
    fn next(&mut self) -> Option<Option<u8>> {
        if self.left == 0 {
            return Some(None);
        }
        self.left -= 1;
        let c = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(Some(c))
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(bytes)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }

    /// The next field as `read` reads it after its constructor, kept when `pick` takes its
    /// value; null or absent is `Some(None)`.
    fn field<V, T>(
        &mut self,
        read: impl FnOnce(&mut Self, u8) -> Option<V>,
        pick: impl FnOnce(V) -> Option<T>,
    ) -> Field<T> {
        match self.next()? {
            None | Some(0x40) => Some(None),
            Some(code) => pick(read(self, code)?).map(Some),
        }
    }

    fn uint(&mut self) -> Field<u32> {
        self.field(Self::fixed, |v| match v {
            Fixed::Uint(n) => Some(n),
            _ => None,
        })
    }

    fn boolean(&mut self) -> Field<bool> {
        self.field(Self::fixed, |v| match v {
            Fixed::Bool(b) => Some(b),
            _ => None,
        })
    }

    fn binary(&mut self) -> Field<ByteBuf> {
        self.field(Self::scalar, |v| match v {
            Value::Binary(b) => Some(b),
            _ => None,
        })
    }

    fn settle_mode(&mut self) -> Field<ReceiverSettleMode> {
        self.field(Self::fixed, |v| match v {
            Fixed::Ubyte(0) => Some(ReceiverSettleMode::First),
            Fixed::Ubyte(1) => Some(ReceiverSettleMode::Second),
            _ => None,
        })
    }

    /// A delivery state: only none, or `accepted` / `released` with an empty list.
    fn outcome(&mut self) -> Field<DeliveryOutcome> {
        Some(match self.next()? {
            None | Some(0x40) => None,
            Some(0x00) => {
                let &[0x53, code, list] = self.take(3)? else {
                    return None;
                };
                match list {
                    0x45 => {}
                    0xc0 if self.take(2)? == [0x01, 0x00] => {}
                    _ => return None,
                }
                match code {
                    0x24 => Some(DeliveryOutcome::Accepted),
                    0x26 => Some(DeliveryOutcome::Released),
                    _ => return None,
                }
            }
            Some(_) => return None,
        })
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// Binary, string or symbol bytes after constructor `code` (8- or 32-bit length).
    fn variable(&mut self, code: u8) -> Option<&'a [u8]> {
        let n = match code {
            0xa0 | 0xa1 | 0xa3 => usize::from(self.byte()?),
            _ => u32::from_be_bytes(self.array()?) as usize,
        };
        self.take(n)
    }

    /// The scalar after constructor `code`, as serde_amqp's generic `Value` reads it.
    fn scalar(&mut self, code: u8) -> Option<Value> {
        Some(match code {
            0xa0 | 0xb0 => Value::Binary(ByteBuf::from(self.variable(code)?)),
            0xa1 | 0xb1 => Value::String(std::str::from_utf8(self.variable(code)?).ok()?.into()),
            0xa3 | 0xb3 => Value::Symbol(Symbol::from(
                std::str::from_utf8(self.variable(code)?).ok()?,
            )),
            _ => self.fixed(code)?.into(),
        })
    }

    /// The fixed-width scalar after constructor `code`.
    fn fixed(&mut self, code: u8) -> Option<Fixed> {
        Some(match code {
            0x40 => Fixed::Null,
            0x41 => Fixed::Bool(true),
            0x42 => Fixed::Bool(false),
            0x56 => match self.byte()? {
                0 => Fixed::Bool(false),
                1 => Fixed::Bool(true),
                _ => return None,
            },
            0x50 => Fixed::Ubyte(self.byte()?),
            0x51 => Fixed::Byte(i8::from_be_bytes(self.array()?)),
            0x60 => Fixed::Ushort(u16::from_be_bytes(self.array()?)),
            0x61 => Fixed::Short(i16::from_be_bytes(self.array()?)),
            0x43 => Fixed::Uint(0),
            0x52 => Fixed::Uint(u32::from(self.byte()?)),
            0x70 => Fixed::Uint(u32::from_be_bytes(self.array()?)),
            0x54 => Fixed::Int(i32::from(i8::from_be_bytes(self.array()?))),
            0x71 => Fixed::Int(i32::from_be_bytes(self.array()?)),
            0x44 => Fixed::Ulong(0),
            0x53 => Fixed::Ulong(u64::from(self.byte()?)),
            0x80 => Fixed::Ulong(u64::from_be_bytes(self.array()?)),
            0x55 => Fixed::Long(i64::from(i8::from_be_bytes(self.array()?))),
            0x81 => Fixed::Long(i64::from_be_bytes(self.array()?)),
            0x83 => Fixed::Timestamp(i64::from_be_bytes(self.array()?)),
            0x98 => Fixed::Uuid(self.array::<16>()?),
            _ => return None,
        })
    }

    /// Whether every field was read and they fill the list's size exactly (a longer list, or
    /// sizes that disagree, go to the validator and serde, which decide).
    fn done(&self) -> bool {
        self.left == 0 && self.pos == self.end
    }

    /// The performative's length: descriptor, then the list.
    fn performative_len(&self) -> usize {
        3 + self.end
    }
}

/// The fields of a message section that is a described list with a small-ulong descriptor (the
/// header, the properties), when every field is a scalar in an encoding [`Fields::scalar`]
/// reads; `None` otherwise, for serde_amqp to read.
pub fn section_fields(section: &[u8]) -> Option<Vec<Value>> {
    let mut f = Fields::of(section, *section.get(2)?)?;
    // Each field takes at least a byte: a count beyond the bytes is not a list read here.
    let mut fields = Vec::with_capacity(usize::try_from(f.left).ok()?.min(section.len()));
    while let Some(code) = f.next()? {
        fields.push(f.scalar(code)?);
    }
    Some(fields)
}

/// A TRANSFER performative in its plain encodings (no delivery state) at the start of a frame
/// body, and its length (the payload follows). Every size and field is checked here, so a
/// transfer read here needs no structural walk first.
pub(super) fn transfer(body: &[u8]) -> Option<(Transfer, usize)> {
    let mut f = Fields::of(body, 0x14)?;
    let handle = f.uint()??;
    let delivery_id = f.uint()?;
    let delivery_tag = f.binary()?;
    let message_format = f.uint()?;
    let settled = f.boolean()?;
    let more = f.boolean()?.unwrap_or(false);
    let rcv_settle_mode = f.settle_mode()?;
    // A state on a transfer (resuming or transactional) is rare: serde reads it.
    if f.next()?.is_some_and(|c| c != 0x40) {
        return None;
    }
    let resume = f.boolean()?.unwrap_or(false);
    let aborted = f.boolean()?.unwrap_or(false);
    let batchable = f.boolean()?.unwrap_or(false);
    f.done().then_some((
        Transfer {
            handle: Handle(handle),
            delivery_id,
            delivery_tag,
            message_format,
            settled,
            more,
            rcv_settle_mode,
            state: None,
            resume,
            aborted,
            batchable,
        },
        f.performative_len(),
    ))
}

/// A DISPOSITION performative in its plain encodings, filling the frame body exactly. Checked as
/// [`transfer`] is.
pub(super) fn disposition(perf: &[u8]) -> Option<DispositionFrame> {
    let mut f = Fields::of(perf, 0x15)?;
    let role = if f.boolean()?? {
        Role::Receiver
    } else {
        Role::Sender
    };
    let first = f.uint()??;
    let last = f.uint()?.unwrap_or(first);
    let settled = f.boolean()?.unwrap_or(false);
    let state = f.outcome()?;
    let _batchable = f.boolean()?;
    (f.done() && f.performative_len() == perf.len()).then_some(DispositionFrame {
        role,
        first,
        last,
        settled,
        state,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::codec::{from, serde_disposition};
    use super::super::validate::value_len;
    use super::*;

    /// A section list of scalars is read; a boolean byte other than 0 or 1, a compound field or
    /// another descriptor form is left to serde_amqp.
    #[test]
    fn section_fields_leave_odd_encodings_to_serde() {
        let props = [
            0x00, 0x53, 0x73, 0xc0, 0x06, 0x03, 0xa1, 0x01, b'x', 0x40, 0x43,
        ];
        assert_eq!(
            section_fields(&props),
            Some(vec![Value::String("x".into()), Value::Null, Value::Uint(0)])
        );
        assert_eq!(section_fields(&[0x00, 0x53, 0x70, 0x45]), Some(vec![]));
        let odd_bool = [0x00, 0x53, 0x70, 0xc0, 0x03, 0x01, 0x56, 0x02];
        assert_eq!(section_fields(&odd_bool), None);
        let list_field = [0x00, 0x53, 0x73, 0xc0, 0x02, 0x01, 0x45];
        assert_eq!(section_fields(&list_field), None);
        let ulong_descriptor = [0x00, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x73, 0x45];
        assert_eq!(section_fields(&ulong_descriptor), None);
    }

    fn uint() -> BoxedStrategy<Vec<u8>> {
        prop_oneof![
            Just(vec![0x40]),
            Just(vec![0x43]),
            any::<u8>().prop_map(|b| vec![0x52, b]),
            any::<u32>().prop_map(|n| [&[0x70][..], &n.to_be_bytes()].concat()),
        ]
        .boxed()
    }

    fn boolean() -> BoxedStrategy<Vec<u8>> {
        prop_oneof![
            Just(vec![0x40]),
            Just(vec![0x41]),
            Just(vec![0x42]),
            (0u8..3).prop_map(|b| vec![0x56, b]),
        ]
        .boxed()
    }

    fn binary() -> BoxedStrategy<Vec<u8>> {
        prop_oneof![
            Just(vec![0x40]),
            proptest::collection::vec(any::<u8>(), 0..6).prop_map(|t| [
                &[0xa0, t.len() as u8][..],
                &t
            ]
            .concat()),
            proptest::collection::vec(any::<u8>(), 0..6).prop_map(|t| [
                &[0xb0][..],
                &(t.len() as u32).to_be_bytes(),
                &t
            ]
            .concat()),
        ]
        .boxed()
    }

    fn mode() -> BoxedStrategy<Vec<u8>> {
        prop_oneof![Just(vec![0x40]), (0u8..3).prop_map(|b| vec![0x50, b])].boxed()
    }

    /// Delivery states: accepted and released in both empty-list forms, others, and a
    /// described value that is no state.
    fn state() -> BoxedStrategy<Vec<u8>> {
        prop_oneof![
            Just(vec![0x40]),
            Just(vec![0x00, 0x53, 0x24, 0x45]),
            Just(vec![0x00, 0x53, 0x24, 0xc0, 0x01, 0x00]),
            Just(vec![0x00, 0x53, 0x26, 0x45]),
            Just(vec![0x00, 0x53, 0x26, 0xc0, 0x01, 0x00]),
            Just(vec![0x00, 0x53, 0x25, 0x45]),
            Just(vec![0x00, 0x53, 0x27, 0xc0, 0x02, 0x01, 0x41]),
            Just(vec![0x00, 0x53, 0x23, 0xc0, 0x03, 0x02, 0x43, 0x43]),
            Just(vec![0x00, 0x53, 0x99, 0x45]),
        ]
        .boxed()
    }

    /// Any field at all: the right type for another position, or one no field has.
    fn any_field() -> BoxedStrategy<Vec<u8>> {
        prop_oneof![
            uint(),
            boolean(),
            binary(),
            mode(),
            state(),
            Just(vec![0x44]),
            Just(vec![0x80, 0, 0, 0, 0, 0, 0, 0, 7]),
            Just(vec![0xa1, 1, b'x']),
        ]
        .boxed()
    }

    /// Fields of the given types, each one now and then replaced by any field, cut to a random
    /// length and sometimes extended past the performative's last field.
    fn fields(types: Vec<fn() -> BoxedStrategy<Vec<u8>>>) -> BoxedStrategy<Vec<Vec<u8>>> {
        let each: Vec<BoxedStrategy<Vec<u8>>> = types
            .into_iter()
            .map(|t| prop_oneof![9 => t(), 1 => any_field()].boxed())
            .collect();
        let n = each.len();
        (each, 0..=n + 1, any_field())
            .prop_map(|(mut f, len, extra)| {
                f.push(extra);
                f.truncate(len);
                f
            })
            .boxed()
    }

    /// A performative: descriptor (usually the small ulong), then the fields as list0, list8 or
    /// list32.
    fn performative(
        code: u8,
        types: Vec<fn() -> BoxedStrategy<Vec<u8>>>,
    ) -> BoxedStrategy<Vec<u8>> {
        (
            fields(types),
            0u8..3,
            prop_oneof![9 => Just(true), 1 => Just(false)],
        )
            .prop_map(move |(fields, form, small)| {
                let mut v = if small {
                    vec![0x00, 0x53, code]
                } else {
                    vec![0x00, 0x80, 0, 0, 0, 0, 0, 0, 0, code]
                };
                let body: Vec<u8> = fields.concat();
                match (form, fields.len()) {
                    (0, 0) => v.push(0x45),
                    (0 | 1, n) => {
                        v.extend([0xc0, (body.len() + 1) as u8, n as u8]);
                        v.extend(&body);
                    }
                    (_, n) => {
                        v.push(0xd0);
                        v.extend(((body.len() + 4) as u32).to_be_bytes());
                        v.extend((n as u32).to_be_bytes());
                        v.extend(&body);
                    }
                }
                v
            })
            .boxed()
    }

    fn transfer_frames() -> BoxedStrategy<Vec<u8>> {
        performative(
            0x14,
            vec![
                uint, uint, binary, uint, boolean, boolean, mode, state, boolean, boolean, boolean,
            ],
        )
    }

    fn disposition_frames() -> BoxedStrategy<Vec<u8>> {
        performative(0x15, vec![boolean, uint, uint, boolean, state, boolean])
    }

    /// A frame body made from `perf`: a payload after it, then now and then one byte changed
    /// and the end cut off, so that sizes and counts disagree with the bytes.
    fn frame_body(perf: BoxedStrategy<Vec<u8>>) -> BoxedStrategy<Vec<u8>> {
        (
            perf,
            proptest::collection::vec(any::<u8>(), 0..8),
            proptest::option::weighted(0.3, (any::<prop::sample::Index>(), any::<u8>())),
            proptest::option::weighted(0.2, any::<prop::sample::Index>()),
        )
            .prop_map(|(mut body, payload, flip, cut)| {
                body.extend(payload);
                if let Some((at, b)) = flip {
                    let i = at.index(body.len());
                    body[i] = b;
                }
                if let Some(at) = cut {
                    body.truncate(at.index(body.len() + 1));
                }
                body
            })
            .boxed()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// Whatever the quick decoder reads, the validator passes with the same length and serde
        /// reads the same; what either refuses, the quick decoder leaves alone.
        #[test]
        fn transfer_agrees_with_validator_and_serde(body in frame_body(transfer_frames())) {
            if let Some((quick, len)) = transfer(&body) {
                prop_assert_eq!(value_len(&body), Ok(len));
                let slow: Result<Transfer, _> = from(&body[..len], "transfer");
                prop_assert_eq!(Ok(quick), slow);
            }
        }

        #[test]
        fn disposition_agrees_with_validator_and_serde(body in frame_body(disposition_frames())) {
            if let Some(quick) = disposition(&body) {
                prop_assert_eq!(value_len(&body), Ok(body.len()));
                prop_assert_eq!(Ok(quick), serde_disposition(&body));
            }
        }
    }

    /// The generators reach the quick path often, so the agreement above is not vacuous.
    #[test]
    fn generators_reach_the_quick_path() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut t, mut d) = (0, 0);
        for _ in 0..1000 {
            let tree = transfer_frames().new_tree(&mut runner).expect("value");
            t += usize::from(transfer(&tree.current()).is_some());
            let tree = disposition_frames().new_tree(&mut runner).expect("value");
            d += usize::from(disposition(&tree.current()).is_some());
        }
        assert!(
            t > 100 && d > 100,
            "quick transfers {t}, dispositions {d} of 1000"
        );
    }

    /// What clients send is read here, not by serde: fe2o3's own encodings of a pipelined
    /// transfer and of an accepted range.
    #[test]
    fn common_frames_take_the_quick_path() {
        let t = Transfer {
            handle: Handle(1),
            delivery_id: Some(70_000),
            delivery_tag: Some(ByteBuf::from(vec![1, 2, 3, 4])),
            message_format: Some(0),
            settled: Some(false),
            more: false,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: true,
        };
        let bytes = serde_amqp::to_vec(&t).expect("encode");
        assert_eq!(transfer(&bytes), Some((t, bytes.len())));
        let d = fe2o3_amqp_types::performatives::Disposition {
            role: Role::Receiver,
            first: 5,
            last: Some(9),
            settled: true,
            state: Some(fe2o3_amqp_types::messaging::DeliveryState::Accepted(
                fe2o3_amqp_types::messaging::Accepted {},
            )),
            batchable: false,
        };
        let bytes = serde_amqp::to_vec(&d).expect("encode");
        assert_eq!(
            disposition(&bytes),
            Some(DispositionFrame {
                role: Role::Receiver,
                first: 5,
                last: 9,
                settled: true,
                state: Some(DeliveryOutcome::Accepted),
            })
        );
    }
}
