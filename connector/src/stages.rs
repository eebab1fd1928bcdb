//! Where a queue message's time goes inside the connector, stage by stage: how long its store
//! took, how long it waited in the queue, how long its hand-out took to reach its link, and how
//! long the client took to settle it. Counted in histograms of fixed buckets (four per power of
//! two, so a bucket's bounds are within 19 % of each other) that cost a few atomic adds per
//! message, and shown at `/api/amqp10/stages`, which the load tool reads before and after a run,
//! and at `/metrics/operations` as Prometheus histograms with coarser buckets (each a power of two
//! of nanoseconds, which is a bound of the fine ones, so the counts are exact).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets per histogram: up to 2^37 ns (about 137 s); anything longer lands in the last.
const BUCKETS: usize = 37 * 4;

/// One stage of a queue message's way through the connector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// From the complete delivery to the backend's answer that it is stored.
    Stored,
    /// From the store's timestamp of the message to the Get loop's taking it.
    Waited,
    /// From the Get loop's taking it to its transfer on the consumer's link.
    HandedOut,
    /// From its transfer to the client's settlement.
    Settled,
}

impl Stage {
    /// Every stage, in a message's order.
    pub const ALL: [Stage; 4] = [
        Stage::Stored,
        Stage::Waited,
        Stage::HandedOut,
        Stage::Settled,
    ];

    /// As the endpoint names it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Stored => "stored",
            Stage::Waited => "waited",
            Stage::HandedOut => "handed_out",
            Stage::Settled => "settled",
        }
    }
}

/// The bucket of a duration of `ns` nanoseconds.
fn bucket(ns: u64) -> usize {
    let v = ns.max(1);
    let e = (63 - v.leading_zeros()) as usize;
    let sub = if e >= 2 {
        ((v >> (e - 2)) & 3) as usize
    } else {
        0
    };
    (e * 4 + sub).min(BUCKETS - 1)
}

/// The exclusive upper bound of bucket `i`, in nanoseconds.
pub fn upper_ns(i: usize) -> u64 {
    let (e, sub) = ((i / 4) as u32, (i % 4) as u64);
    if e >= 2 {
        (1u64 << e) + ((sub + 1) << (e - 2))
    } else {
        1u64 << (e + 1)
    }
}

/// The Prometheus buckets' bounds: 2^14 ns (16 µs) to 2^34 ns (17 s), one per power of two.
const PROMETHEUS_BOUNDS: std::ops::RangeInclusive<u32> = 14..=34;

/// One stage's counts.
struct Histogram {
    counts: [AtomicU64; BUCKETS],
    /// The total time counted, in nanoseconds.
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// One histogram per [`Stage`].
#[derive(Default)]
pub struct Stages {
    stored: Histogram,
    waited: Histogram,
    handed_out: Histogram,
    settled: Histogram,
}

/// One stage's histogram in the Prometheus buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct Coarse {
    /// Seconds counted in all.
    pub sum_seconds: f64,
    /// Durations counted.
    pub count: u64,
    /// `(le in seconds, durations above the previous bound and up to this one)`, the last
    /// bound `+Inf`: what the exposition encoder adds up into Prometheus's cumulative buckets.
    pub buckets: Vec<(f64, u64)>,
}

impl Stages {
    /// Counts one message's time in `stage`.
    pub fn record(&self, stage: Stage, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let h = self.histogram(stage);
        if let Some(c) = h.counts.get(bucket(ns)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        h.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn histogram(&self, stage: Stage) -> &Histogram {
        match stage {
            Stage::Stored => &self.stored,
            Stage::Waited => &self.waited,
            Stage::HandedOut => &self.handed_out,
            Stage::Settled => &self.settled,
        }
    }

    fn stage(&self, stage: Stage) -> &[AtomicU64; BUCKETS] {
        &self.histogram(stage).counts
    }

    /// `stage`'s histogram in the Prometheus buckets.
    pub fn coarse(&self, stage: Stage) -> Coarse {
        let counts: Vec<u64> = self
            .stage(stage)
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let mut buckets = Vec::new();
        let mut next = 0usize;
        for e in PROMETHEUS_BOUNDS {
            let le_ns = 1u64 << e;
            // Every fine bucket whose bound is at most 2^e lies wholly below it.
            let mut within = 0u64;
            while next < BUCKETS && upper_ns(next) <= le_ns {
                within += counts.get(next).copied().unwrap_or(0);
                next += 1;
            }
            buckets.push((le_ns as f64 / 1e9, within));
        }
        let rest = counts.iter().skip(next).sum();
        buckets.push((f64::INFINITY, rest));
        Coarse {
            sum_seconds: self.histogram(stage).sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            count: counts.iter().sum(),
            buckets,
        }
    }

    /// The endpoint's JSON: each stage's non-empty buckets as `[upper bound in ns, count]`.
    pub fn json(&self) -> String {
        let stages: Vec<String> = Stage::ALL
            .iter()
            .map(|&s| {
                let buckets: Vec<String> = self
                    .stage(s)
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (i, c.load(Ordering::Relaxed)))
                    .filter(|(_, n)| *n > 0)
                    .map(|(i, n)| format!("[{},{n}]", upper_ns(i)))
                    .collect();
                format!("\"{}\":[{}]", s.name(), buckets.join(","))
            })
            .collect();
        format!("{{{}}}", stages.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every duration lands in the bucket whose bounds hold it, and the buckets' bounds grow.
    #[test]
    fn buckets_hold_what_they_count() {
        for ns in (1..5000u64).chain([65_535, 1_000_000, 1_500_000, 999_999_999]) {
            let i = bucket(ns);
            assert!(
                ns < upper_ns(i),
                "{ns} below its bucket's bound {}",
                upper_ns(i)
            );
            if i > 0 {
                assert!(ns >= upper_ns(i - 1), "{ns} above the previous bound");
            }
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    /// The Prometheus view counts exactly what the fine buckets hold below each power of two,
    /// and sums the durations.
    #[test]
    fn cumulative_buckets_are_exact_at_powers_of_two() {
        let s = Stages::default();
        // 20 µs, 60 µs and 70 µs: the first two below 2^16 ns (65.5 µs), the third above.
        for us in [20, 60, 70] {
            s.record(Stage::Waited, Duration::from_micros(us));
        }
        let c = s.coarse(Stage::Waited);
        assert_eq!(c.count, 3);
        assert!((c.sum_seconds - 150e-6).abs() < 1e-12, "{}", c.sum_seconds);
        // As Prometheus shows them: durations up to each bound.
        let mut below = 0;
        let cumulative: Vec<(f64, u64)> = c
            .buckets
            .iter()
            .map(|&(le, n)| {
                below += n;
                (le, below)
            })
            .collect();
        let at = |le_ns: u64| {
            cumulative
                .iter()
                .find(|(le, _)| (*le - le_ns as f64 / 1e9).abs() < 1e-15)
                .map(|(_, n)| *n)
        };
        assert_eq!(at(1 << 14), Some(0));
        assert_eq!(at(1 << 15), Some(1), "20 µs is below 32.8 µs");
        assert_eq!(at(1 << 16), Some(2));
        assert_eq!(at(1 << 17), Some(3));
        assert_eq!(cumulative.last(), Some(&(f64::INFINITY, 3)));
        assert!(cumulative
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(s.coarse(Stage::Stored).count, 0);
    }

    /// The endpoint shows what was counted, by stage.
    #[test]
    fn json_shows_each_stage() {
        let s = Stages::default();
        s.record(Stage::Stored, Duration::from_micros(1500));
        s.record(Stage::Stored, Duration::from_micros(1500));
        s.record(Stage::Settled, Duration::from_nanos(3));
        let json: serde_json::Value = serde_json::from_str(&s.json()).expect("valid JSON");
        let stored = json["stored"].as_array().expect("stored");
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0][1], 2);
        assert!(stored[0][0].as_u64().expect("bound") > 1_500_000);
        assert_eq!(json["settled"][0], serde_json::json!([4, 1]));
        assert_eq!(json["waited"], serde_json::json!([]));
    }
}
