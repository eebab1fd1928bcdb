//! The container's memory limit, which the default `MaxProcessMemory` follows: cgroup v2's
//! `memory.max`, else cgroup v1's `memory.limit_in_bytes`, as a container sees its own cgroup
//! mounted at `/sys/fs/cgroup`.

use std::path::Path;

/// Where cgroup v2 and v1 keep the limit, in that order.
const LIMIT_FILES: [&str; 2] = [
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
];

/// Limits at or above this are cgroup v1's way of saying "none" (it writes a page-rounded
/// `i64::MAX`).
const NO_LIMIT: u64 = 1 << 60;

/// The memory limit of the container this process runs in, if it has one.
pub fn memory_limit() -> Option<u64> {
    LIMIT_FILES
        .iter()
        .find_map(|f| std::fs::read_to_string(Path::new(f)).ok())
        .and_then(|text| parse_limit(&text))
}

/// The limit a cgroup file states: bytes, or `max` (v2) or a huge number (v1) for none.
pub fn parse_limit(text: &str) -> Option<u64> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0 && *n < NO_LIMIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_as_cgroups_write_them() {
        assert_eq!(parse_limit("536870912\n"), Some(512 << 20));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit(""), None);
    }
}
