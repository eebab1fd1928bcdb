//! RFC 1982 serial-number arithmetic for AMQP's 32-bit transfer-ids, delivery-ids and
//! delivery-counts, which wrap around.

/// `a < b` in serial-number order.
pub fn lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000_0000
}

/// `a <= b` in serial-number order.
pub fn le(a: u32, b: u32) -> bool {
    a == b || lt(a, b)
}

/// Whether `x` lies in the inclusive range `first..=last` taken in serial order.
pub fn in_range(x: u32, first: u32, last: u32) -> bool {
    le(first, x) && le(x, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_around() {
        assert!(lt(u32::MAX, 0));
        assert!(lt(u32::MAX - 5, 3));
        assert!(!lt(3, u32::MAX - 5));
        assert!(le(7, 7));
        assert!(in_range(1, u32::MAX, 2));
        assert!(!in_range(3, u32::MAX, 2));
    }
}
