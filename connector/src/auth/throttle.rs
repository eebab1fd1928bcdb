//! Failed logins, counted per source address (AUD-5): a source that fails more than
//! [`FREE_FAILURES`] times in [`WINDOW`] waits [`PENALTY`] for each further failure's SASL
//! outcome, and its failures are then written to the audit log as one line a second with a count
//! instead of one line each. Guessing tokens gets slow, and a flood of bad logins cannot flood
//! the log.

use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;

/// Failures a source may have in a window before it is slowed down.
pub const FREE_FAILURES: u32 = 5;
/// How long failures are remembered.
pub const WINDOW: Duration = Duration::from_secs(10);
/// How long a slowed-down source waits for each failure's outcome.
pub const PENALTY: Duration = Duration::from_secs(1);
/// Sources remembered at once; the least recent is forgotten past it.
const SOURCES: usize = 4096;
/// How often a slowed-down source's failures are summed up in the audit log.
const SUMMARY_EVERY: Duration = Duration::from_secs(1);

/// What to do with one failed login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// How long to hold the outcome back.
    pub delay: Duration,
    /// Whether to write this failure's own audit line.
    pub logged: bool,
    /// Failures of this source not written since the last line, to write now as a summary.
    pub summary: Option<u64>,
}

/// One source's recent failures.
#[derive(Debug)]
struct Source {
    window_start: Instant,
    failures: u32,
    unlogged: u64,
    last_summary: Option<Instant>,
}

/// Failed logins by source address, shared by every connection.
#[derive(Debug)]
pub struct LoginThrottle {
    sources: Mutex<LruCache<IpAddr, Source>>,
}

impl Default for LoginThrottle {
    fn default() -> Self {
        LoginThrottle {
            sources: Mutex::new(LruCache::new(
                NonZeroUsize::new(SOURCES).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }
}

impl LoginThrottle {
    /// Records a failed login from `source` at `now` and says how to answer it.
    pub fn failed(&self, source: IpAddr, now: Instant) -> Verdict {
        let mut sources = self
            .sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let s = sources.get_or_insert_mut(source, || Source {
            window_start: now,
            failures: 0,
            unlogged: 0,
            last_summary: None,
        });
        if now.duration_since(s.window_start) >= WINDOW {
            s.window_start = now;
            s.failures = 0;
        }
        s.failures = s.failures.saturating_add(1);
        if s.failures <= FREE_FAILURES {
            return Verdict {
                delay: Duration::ZERO,
                logged: true,
                summary: None,
            };
        }
        s.unlogged += 1;
        let due = s
            .last_summary
            .is_none_or(|at| now.duration_since(at) >= SUMMARY_EVERY);
        let summary = due.then(|| {
            s.last_summary = Some(now);
            std::mem::take(&mut s.unlogged)
        });
        Verdict {
            delay: PENALTY,
            logged: false,
            summary,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AUD-5: five failures in a window go through at once, each logged; the sixth on waits a
    /// second, and those are summed up in one line a second; another source is not affected;
    /// after the window a source starts afresh.
    #[test]
    fn aud_5_failures_past_five_are_slowed_and_summed_up() {
        let t = LoginThrottle::default();
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let now = Instant::now();
        for _ in 0..FREE_FAILURES {
            let v = t.failed(a, now);
            assert_eq!((v.delay, v.logged, v.summary), (Duration::ZERO, true, None));
        }
        let sixth = t.failed(a, now);
        assert_eq!(
            (sixth.delay, sixth.logged, sixth.summary),
            (PENALTY, false, Some(1))
        );
        for _ in 0..10 {
            assert_eq!(t.failed(a, now).summary, None, "at most one line a second");
        }
        let later = now + Duration::from_millis(1500);
        assert_eq!(t.failed(a, later).summary, Some(11));
        assert!(t.failed(b, later).logged, "another source is not slowed");
        let next_window = now + WINDOW + Duration::from_secs(1);
        let v = t.failed(a, next_window);
        assert_eq!((v.delay, v.logged), (Duration::ZERO, true));
    }
}
