//! What the store writes: prost-encoded records, each framed as
//! `[length u32 LE][crc32 of the payload u32 LE][payload]`, so a torn or corrupt tail is detected
//! by its checksum and never read as data.

use bytes::{BufMut, BytesMut};
use prost::Message;

use crate::kubemq::QueueMessage;

/// Bytes of framing before each record's payload.
pub const FRAME_HEADER: usize = 8;
/// Largest record accepted on read: a 100 MiB message plus its envelope.
pub const MAX_RECORD: usize = 101 * 1024 * 1024;

/// One record of the log.
#[derive(Clone, PartialEq, Message)]
pub struct Record {
    /// The kind.
    #[prost(oneof = "Kind", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub kind: Option<Kind>,
}

/// The record kinds.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    /// A message stored in a queue, visible once durable.
    #[prost(message, tag = "1")]
    Enqueue(Enqueue),
    /// A stored copy removed for good (acked, NAck-moved, dead-lettered, dropped).
    #[prost(message, tag = "2")]
    Ack(Ack),
    /// A delayed message waiting for its due time.
    #[prost(message, tag = "3")]
    Delay(Delay),
    /// A delayed message released into its queue (its Enqueue is in the same write).
    #[prost(message, tag = "4")]
    Release(Release),
    /// First record of every segment: what must survive the deletion of older segments.
    #[prost(message, tag = "5")]
    Checkpoint(Checkpoint),
    /// An events-store event, with its channel, sequence and store time (the stream log).
    #[prost(message, tag = "6")]
    Stored(StoredEvent),
    /// Where an events-store subscription's cursor stands (the stream log).
    #[prost(message, tag = "7")]
    Cursor(Cursor),
}

/// An event kept by the events-store.
#[derive(Clone, PartialEq, Message)]
pub struct StoredEvent {
    /// The event as subscribers receive it: Channel, Sequence and Timestamp set.
    #[prost(message, optional, tag = "1")]
    pub event: Option<crate::kubemq::EventReceive>,
}

/// An events-store subscription cursor: keyed by (ClientID, channel) without a group, by
/// (channel, group) with one.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Cursor {
    /// The subscriber's ClientID (empty for a group's cursor).
    #[prost(string, tag = "1")]
    pub client_id: String,
    /// The channel.
    #[prost(string, tag = "2")]
    pub channel: String,
    /// The group (empty for a subscriber's own cursor).
    #[prost(string, tag = "3")]
    pub group: String,
    /// The next sequence to deliver.
    #[prost(uint64, tag = "4")]
    pub next: u64,
    /// Unix ns of the cursor's last use: cursors unused for the retention period are forgotten.
    #[prost(int64, tag = "5")]
    pub touched_ns: i64,
    /// The subscription was deleted: the cursor is gone.
    #[prost(bool, tag = "6")]
    pub removed: bool,
}

/// A stored queue message.
#[derive(Clone, PartialEq, Message)]
pub struct Enqueue {
    /// The message as stored: Channel, Attributes (Sequence, Timestamp, ExpirationAt, ReRouted...)
    /// and Policy with defaults applied; Attributes.ReceiveCount is the persisted count.
    #[prost(message, optional, tag = "1")]
    pub message: Option<QueueMessage>,
}

/// Removal of one stored copy.
#[derive(Clone, PartialEq, Message)]
pub struct Ack {
    /// Queue name.
    #[prost(string, tag = "1")]
    pub queue: String,
    /// Its sequence.
    #[prost(uint64, tag = "2")]
    pub sequence: u64,
}

/// A delayed message.
#[derive(Clone, PartialEq, Message)]
pub struct Delay {
    /// Store-wide id of the delayed message.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Unix ns when it becomes due.
    #[prost(int64, tag = "2")]
    pub due_ns: i64,
    /// The message as sent (validated, attributes computed).
    #[prost(message, optional, tag = "3")]
    pub message: Option<QueueMessage>,
}

/// Release of a delayed message.
#[derive(Clone, PartialEq, Message)]
pub struct Release {
    /// The delayed message's id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
}

/// Counters that must outlive the records that advanced them.
#[derive(Clone, PartialEq, Message)]
pub struct Checkpoint {
    /// Last sequence assigned, per queue.
    #[prost(map = "string, uint64", tag = "1")]
    pub last_sequence: std::collections::HashMap<String, u64>,
    /// Next delayed-message id.
    #[prost(uint64, tag = "2")]
    pub next_delay_id: u64,
    /// Every events-store cursor (the stream log).
    #[prost(message, repeated, tag = "3")]
    pub cursors: Vec<Cursor>,
}

/// Appends one framed record to `out`; returns the framed length.
pub fn frame(out: &mut BytesMut, kind: Kind) -> usize {
    let rec = Record { kind: Some(kind) };
    let len = rec.encoded_len();
    out.reserve(FRAME_HEADER + len);
    let start = out.len();
    out.put_u32_le(len as u32);
    out.put_u32_le(0);
    // Encoding into a BytesMut with reserved room cannot fail.
    let _ = rec.encode(out);
    let crc = crc32fast::hash(out.get(start + FRAME_HEADER..).unwrap_or_default());
    if let Some(field) = out.get_mut(start + 4..start + 8) {
        field.copy_from_slice(&crc.to_le_bytes());
    }
    out.len() - start
}

/// What reading a record at the front of a buffer found.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    /// A whole, intact record and its framed length.
    Record(Box<Record>, usize),
    /// Not enough bytes for the record its header announces (a torn tail).
    Incomplete,
    /// The checksum or the encoding is wrong, or the length is absurd.
    Corrupt,
}

/// Reads the record at the front of `buf`.
pub fn parse(buf: &[u8]) -> Parsed {
    match payload(buf) {
        Ok(p) => match buf.get(p.clone()) {
            Some(payload) => decoded(Record::decode(payload), p.end),
            None => Parsed::Corrupt,
        },
        Err(e) => e,
    }
}

/// [`parse`] for a shared buffer: message bodies in the record share `buf`'s memory instead of
/// being copied out of it.
pub fn parse_shared(buf: &bytes::Bytes) -> Parsed {
    match payload(buf) {
        Ok(p) => decoded(Record::decode(buf.slice(p.clone())), p.end),
        Err(e) => e,
    }
}

/// Where the checked payload of the record at the front of `buf` lies.
fn payload(buf: &[u8]) -> Result<std::ops::Range<usize>, Parsed> {
    let Some(&[l0, l1, l2, l3, c0, c1, c2, c3]) = buf.get(..FRAME_HEADER) else {
        return Err(Parsed::Incomplete);
    };
    let len = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
    let crc = u32::from_le_bytes([c0, c1, c2, c3]);
    if len > MAX_RECORD {
        return Err(Parsed::Corrupt);
    }
    let Some(payload) = buf.get(FRAME_HEADER..FRAME_HEADER + len) else {
        return Err(Parsed::Incomplete);
    };
    if crc32fast::hash(payload) != crc {
        return Err(Parsed::Corrupt);
    }
    Ok(FRAME_HEADER..FRAME_HEADER + len)
}

fn decoded(r: Result<Record, prost::DecodeError>, framed: usize) -> Parsed {
    match r {
        Ok(r) if r.kind.is_some() => Parsed::Record(Box::new(r), framed),
        _ => Parsed::Corrupt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_damage() {
        let mut out = BytesMut::new();
        let n = frame(
            &mut out,
            Kind::Ack(Ack {
                queue: "q".into(),
                sequence: 7,
            }),
        );
        assert_eq!(n, out.len());
        let Parsed::Record(r, len) = parse(&out) else {
            panic!()
        };
        assert_eq!(len, n);
        assert_eq!(
            r.kind,
            Some(Kind::Ack(Ack {
                queue: "q".into(),
                sequence: 7
            }))
        );
        assert_eq!(parse(&out[..n - 1]), Parsed::Incomplete);
        let mut bad = out.to_vec();
        bad[n - 1] ^= 0xff;
        assert_eq!(parse(&bad), Parsed::Corrupt);
        assert_eq!(
            parse(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]),
            Parsed::Corrupt
        );
        assert_eq!(
            parse(&[0, 0, 0, 0, 0, 0, 0, 0]),
            Parsed::Corrupt,
            "an all-zero header is not a record"
        );
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any bytes at all: parsing never panics and never accepts a record whose checksum
        /// does not match.
        #[test]
        fn parse_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Parsed::Record(_, len) = parse(&bytes) {
                prop_assert!(len <= bytes.len());
                let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
                prop_assert_eq!(crc32fast::hash(&bytes[FRAME_HEADER..len]), crc);
            }
        }

        /// A valid record with any byte changed is either still the same record or refused.
        #[test]
        fn parse_mutated_record(pos in any::<usize>(), byte in any::<u8>()) {
            let mut out = BytesMut::new();
            frame(&mut out, Kind::Ack(Ack { queue: "queue".into(), sequence: 42 }));
            let original = parse(&out);
            let mut bad = out.to_vec();
            let at = pos % bad.len();
            bad[at] = byte;
            match parse(&bad) {
                Parsed::Record(r, _) => prop_assert_eq!(Parsed::Record(r, out.len()), original),
                Parsed::Incomplete | Parsed::Corrupt => {}
            }
        }
    }
}
