//! A stored message's sequence in its queue: its place in the queue's order and the handle its
//! consumer settles it by.

use std::fmt;

/// A sequence a queue gave one stored copy; a queue's sequences start at 1 and are never reused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Seq(u64);

impl Seq {
    /// Before a queue's first message: what a queue that never held one reports as its last.
    pub const NONE: Seq = Seq(0);

    /// The sequence numbered `n` (as records and KubeMQ's attributes carry it).
    pub const fn new(n: u64) -> Seq {
        Seq(n)
    }

    /// The number, for records, attributes and figures.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The number as KubeMQ's int64 fields carry it (a queue never counts past `i64::MAX`).
    pub fn to_wire(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    /// The sequence after this one.
    pub const fn next(self) -> Seq {
        Seq(self.0 + 1)
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl TryFrom<i64> for Seq {
    type Error = i64;

    /// A sequence as a client lists it (KubeMQ's int64); a negative number is none.
    fn try_from(n: i64) -> Result<Seq, i64> {
        u64::try_from(n).map(Seq).map_err(|_| n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_number_is_a_sequence_only_when_not_negative() {
        assert_eq!(Seq::try_from(7), Ok(Seq::new(7)));
        assert_eq!(Seq::try_from(0), Ok(Seq::NONE));
        assert_eq!(Seq::try_from(-1), Err(-1));
        assert_eq!(Seq::new(u64::MAX - 1).next().get(), u64::MAX);
        assert_eq!(Seq::new(7).to_wire(), 7);
        assert_eq!(Seq::new(u64::MAX).to_wire(), i64::MAX);
    }
}
