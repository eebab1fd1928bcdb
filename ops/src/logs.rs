//! Log output: one line per event on stdout, filtered by `RUST_LOG` (default `info`), as text or
//! as JSON objects for log collectors; colour codes only when stdout is a terminal, so a log file
//! or a pod's log stays plain.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("must be text or json, got {s:?}")),
        }
    }
}

/// Installs the process's log output; call once, first thing.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stdout().is_terminal()).init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}

/// A warning written at most once a second, saying how many times it happened since: a flood of
/// dropped sockets or failed accepts cannot flood the log.
#[derive(Debug)]
pub struct RateLimited {
    since: AtomicU64,
    /// Milliseconds since `epoch` of the last line written, plus one (0: none yet).
    last_ms: AtomicU64,
    epoch: Instant,
}

impl Default for RateLimited {
    fn default() -> Self {
        RateLimited {
            since: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl RateLimited {
    /// Counts one occurrence and calls `log` with the count since the last line when one is due.
    pub fn note(&self, log: impl FnOnce(u64)) {
        self.since.fetch_add(1, Ordering::Relaxed);
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= 1000;
        if due
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            log(self.since.swap(0, Ordering::Relaxed));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_writes_one_line_a_second_with_its_count() {
        let mut r = RateLimited::default();
        let mut lines = Vec::new();
        for _ in 0..1000 {
            r.note(|n| lines.push(n));
        }
        assert_eq!(lines, vec![1], "the first is written, the rest wait");
        r.epoch -= std::time::Duration::from_secs(2);
        r.note(|n| lines.push(n));
        assert_eq!(lines, vec![1, 1000], "the next line counts all since");
    }

    #[test]
    fn formats_by_name() {
        assert_eq!("JSON".parse(), Ok(LogFormat::Json));
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        assert!("xml".parse::<LogFormat>().is_err());
    }
}
