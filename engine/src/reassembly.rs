//! The body of a delivery arriving in several frames (XFER-2), charged to its link's budget
//! before it grows so that what the budget counts is what the process holds.
//!
//! A buffer that doubles frees its predecessor, and an allocator keeps freed memory for a while
//! before it returns it to the system (mimalloc: a second), so clients streaming messages that
//! never end would have the process hold about twice what the budget counts. Once an eighth of
//! the process budget is in use, a buffer of [`MAP_FROM`] bytes or more is therefore an anonymous
//! memory map, returned to the system the moment it is dropped (below that, the allocator's is
//! cheaper: mapping costs a 1 MiB message about half again as much CPU). While a buffer is
//! copied into its successor, both are charged.

use bytes::{Bytes, BytesMut};
use memmap2::MmapMut;

use super::budget::{BudgetExceeded, Charge};
use super::error::{AmqpError, Condition};

/// Buffers of at least this many bytes are mapped from the system rather than allocated, while
/// an eighth of the process budget or more is in use.
pub const MAP_FROM: usize = 256 * 1024;

/// Granularity of a mapping; what it costs is rounded up to it.
const PAGE: usize = 4096;

/// A mapped buffer and how much of it is filled.
struct Mapped {
    map: MmapMut,
    len: usize,
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        self.map.get(..self.len).unwrap_or_default()
    }
}

/// Where the bytes received so far are.
enum Held {
    Nothing,
    /// A single frame's payload, kept as it came (no copy).
    One(Bytes),
    /// Below [`MAP_FROM`].
    Heap(BytesMut),
    /// From [`MAP_FROM`] up.
    Mapped(Mapped),
}

/// The body of a multi-frame delivery being received, and the bytes it holds in its link's
/// charge.
pub(super) struct Reassembly {
    held: Held,
    /// The bytes held (every buffer's whole capacity), in the link's charge.
    charged: u64,
}

impl std::fmt::Debug for Reassembly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reassembly")
            .field("len", &self.len())
            .field("charged", &self.charged)
            .finish()
    }
}

impl Reassembly {
    /// Nothing received yet.
    pub(super) fn new() -> Self {
        Reassembly {
            held: Held::Nothing,
            charged: 0,
        }
    }

    /// The body's bytes so far.
    pub(super) fn len(&self) -> usize {
        match &self.held {
            Held::Nothing => 0,
            Held::One(b) => b.len(),
            Held::Heap(b) => b.len(),
            Held::Mapped(m) => m.len,
        }
    }

    /// The bytes it holds in the link's charge.
    pub(super) fn charged(&self) -> u64 {
        self.charged
    }

    fn capacity(&self) -> usize {
        match &self.held {
            Held::Nothing | Held::One(_) => 0,
            Held::Heap(b) => b.capacity(),
            Held::Mapped(m) => m.map.len(),
        }
    }

    /// Appends one frame's payload, charging `charge` first: a buffer that must grow doubles
    /// (capped at `max`, the largest message), and its successor is charged while the old one
    /// is still held. Refused with `amqp:resource-limit-exceeded` when the charge does not fit
    /// or the system has no memory to map; the body is then unchanged.
    pub(super) fn append(
        &mut self,
        payload: Bytes,
        max: u64,
        charge: &mut Charge,
    ) -> Result<(), AmqpError> {
        if let Held::Nothing = self.held {
            charge
                .grow(payload.len() as u64)
                .map_err(BudgetExceeded::to_error)?;
            self.charged = payload.len() as u64;
            self.held = Held::One(payload);
            return Ok(());
        }
        let len = self.len();
        let needed = len + payload.len();
        if needed > self.capacity() {
            let cap = usize::try_from(max).unwrap_or(usize::MAX);
            let target = needed.max(len.saturating_mul(2).min(cap));
            self.grow_to(target, charge)?;
        }
        match &mut self.held {
            Held::Heap(b) => b.extend_from_slice(&payload),
            Held::Mapped(m) => {
                let end = m.len + payload.len();
                let room = m.map.get_mut(m.len..end).ok_or_else(|| {
                    AmqpError::new(Condition::InternalError, "reassembly buffer too small")
                })?;
                room.copy_from_slice(&payload);
                m.len = end;
            }
            Held::Nothing | Held::One(_) => {}
        }
        Ok(())
    }

    /// Moves what is held into a buffer of at least `target` bytes.
    fn grow_to(&mut self, target: usize, charge: &mut Charge) -> Result<(), AmqpError> {
        let mapped = target >= MAP_FROM && charge.process_pressed();
        let cost = if mapped {
            target.div_ceil(PAGE) * PAGE
        } else {
            target
        };
        // Both buffers exist while one is copied into the other.
        charge.grow(cost as u64).map_err(BudgetExceeded::to_error)?;
        let old: &[u8] = match &self.held {
            Held::Nothing => &[],
            Held::One(b) => b,
            Held::Heap(b) => b,
            Held::Mapped(m) => m.as_ref(),
        };
        let (grown, real) = if mapped {
            let Ok(mut map) = MmapMut::map_anon(cost) else {
                charge.shrink(cost as u64);
                return Err(AmqpError::new(
                    Condition::ResourceLimitExceeded,
                    "no memory for the message being received",
                ));
            };
            if let Some(to) = map.get_mut(..old.len()) {
                to.copy_from_slice(old);
            }
            let len = old.len();
            (Held::Mapped(Mapped { map, len }), cost)
        } else {
            let mut b = BytesMut::with_capacity(target);
            b.extend_from_slice(old);
            let real = b.capacity();
            (Held::Heap(b), real)
        };
        if real > cost {
            charge.grow_anyway((real - cost) as u64);
        }
        // The old buffer goes now (a mapped one straight back to the system).
        self.held = grown;
        charge.shrink(self.charged);
        self.charged = real as u64;
        Ok(())
    }

    /// The whole body, and the bytes it keeps charged until the delivery is settled.
    pub(super) fn finish(self) -> (Bytes, u64) {
        let body = match self.held {
            Held::Nothing => Bytes::new(),
            Held::One(b) => b,
            Held::Heap(b) => b.freeze(),
            Held::Mapped(m) => Bytes::from_owner(m),
        };
        (body, self.charged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{ConnectionBudget, ProcessBudget};

    fn budget(limit: u64) -> ConnectionBudget {
        ConnectionBudget::new(limit, ProcessBudget::new(limit))
    }

    /// Below an eighth of the process budget in use, large buffers come from the allocator; from
    /// there up, from the system.
    #[test]
    fn large_buffers_are_mapped_only_under_pressure() {
        let process = ProcessBudget::new(8 << 20);
        let b = ConnectionBudget::new(64 << 20, process.clone());
        let mut charge = b.empty();
        let frame = Bytes::from(vec![1u8; 200 * 1024]);
        let mut r = Reassembly::new();
        r.append(frame.clone(), 100 << 20, &mut charge)
            .expect("fits");
        r.append(frame.clone(), 100 << 20, &mut charge)
            .expect("fits");
        assert!(
            matches!(r.held, Held::Heap(_)),
            "little used: the allocator's"
        );
        let _held = process.reserve(1 << 20).expect("an eighth of the budget");
        r.append(frame.clone(), 100 << 20, &mut charge)
            .expect("fits");
        assert!(matches!(r.held, Held::Mapped(_)), "an eighth used: mapped");
    }

    /// XFER-2: frames come back as one body whichever buffer held them, and the charge follows
    /// every buffer: the whole capacity while receiving, the old and the new while copying.
    #[test]
    fn xfer_2_bodies_are_whole_and_charged() {
        for pressed in [false, true] {
            let process = ProcessBudget::new(64 << 20);
            let _used = pressed.then(|| process.reserve(8 << 20).expect("an eighth"));
            let b = ConnectionBudget::new(64 << 20, process);
            let mut charge = b.empty();
            let mut r = Reassembly::new();
            let mut expected = Vec::new();
            for i in 0..40u8 {
                let frame = vec![i; 32 * 1024 + usize::from(i)];
                expected.extend_from_slice(&frame);
                r.append(Bytes::from(frame), 100 << 20, &mut charge)
                    .expect("fits");
                assert_eq!(r.len(), expected.len());
                assert_eq!(charge.bytes(), r.charged());
                assert!(r.charged() >= r.len() as u64);
            }
            assert_eq!(matches!(r.held, Held::Mapped(_)), pressed);
            let (body, kept) = r.finish();
            assert_eq!(&body[..], &expected[..]);
            assert_eq!(kept, charge.bytes());
        }
    }

    /// A buffer that does not fit leaves the body as it was and the charge unchanged, also when
    /// only the copy (old and new together) does not fit.
    #[test]
    fn a_growth_that_does_not_fit_changes_nothing() {
        let b = budget(1024 * 1024);
        let mut charge = b.empty();
        let mut r = Reassembly::new();
        let frame = Bytes::from(vec![7u8; 300 * 1024]);
        r.append(frame.clone(), 100 << 20, &mut charge)
            .expect("one frame fits");
        r.append(frame.clone(), 100 << 20, &mut charge)
            .expect("the mapped copy of two fits");
        let (len, before) = (r.len(), charge.bytes());
        let refused = r
            .append(frame, 100 << 20, &mut charge)
            .expect_err("old and new together pass the budget");
        assert_eq!(refused.condition, Condition::ResourceLimitExceeded);
        assert_eq!((r.len(), charge.bytes()), (len, before));
    }
}
