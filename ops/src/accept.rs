//! What a listener does after a failed accept (out of file descriptors, say): pause, 10 ms at
//! first and twice as long with each failure in a row up to 1 s, and say so at most once a
//! second, so that the accept loop neither spins on the error nor floods the log.

use std::time::Duration;

use crate::logs::RateLimited;

/// Shortest pause after a failed accept.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause after failed accepts in a row.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The pause state of one accept loop.
#[derive(Debug)]
pub struct AcceptBackoff {
    /// What accepts, for the log line.
    listener: &'static str,
    pause: Duration,
    failures: RateLimited,
}

impl AcceptBackoff {
    /// No failure yet, for the listener named `listener` in the log.
    pub fn new(listener: &'static str) -> Self {
        AcceptBackoff {
            listener,
            pause: Duration::ZERO,
            failures: RateLimited::default(),
        }
    }

    /// An accept succeeded: the next failure pauses briefly again.
    pub fn succeeded(&mut self) {
        self.pause = Duration::ZERO;
    }

    /// An accept failed with `error`: logs it (rate-limited) and pauses.
    pub async fn failed(&mut self, error: &std::io::Error) {
        let pause = self.next_pause();
        let listener = self.listener;
        self.failures.note(|n| {
            tracing::warn!(listener, %error, failures = n, pause_ms = pause.as_millis() as u64, "accept failed; pausing");
        });
        tokio::time::sleep(pause).await;
    }

    fn next_pause(&mut self) -> Duration {
        self.pause = (self.pause * 2).clamp(FIRST_PAUSE, MAX_PAUSE);
        self.pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_to_a_second_and_reset_on_success() {
        let mut b = AcceptBackoff::new("test");
        let pauses: Vec<u64> = (0..10).map(|_| b.next_pause().as_millis() as u64).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.next_pause(), FIRST_PAUSE);
    }
}
