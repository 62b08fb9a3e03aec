//! Latency histograms: the bucket bounds every request-latency family shares, which bucket a
//! duration falls in, and a histogram read at scrape time (for Prometheus and for the status
//! page's p50 / p99).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds (Prometheus's `le`): a hit from memory takes tens of
/// microseconds, a miss to a slow origin seconds, so the bounds run from 50 µs to 10 s.
pub const BOUNDS_SECONDS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// Buckets per histogram: one per bound, plus the one above the last bound (`+Inf`).
pub const BUCKETS: usize = BOUNDS_SECONDS.len() + 1;

/// [`BOUNDS_SECONDS`] in nanoseconds, so the hot path compares integers.
const BOUNDS_NANOS: [u64; BOUNDS_SECONDS.len()] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// The bucket `nanos` falls in. Bounds are scanned from the smallest, so a fast request (the
/// common case, a hit) costs two or three compares.
#[inline]
pub fn bucket_of(nanos: u64) -> usize {
    BOUNDS_NANOS
        .iter()
        .position(|bound| nanos <= *bound)
        .unwrap_or(BOUNDS_NANOS.len())
}

/// A duration as whole nanoseconds, saturating (a request does not last 584 years).
#[inline]
pub fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A histogram as read at one scrape: observations per bucket (not cumulative) and their sum.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Histogram {
    /// Observations per bucket, the last one above every bound.
    pub counts: [u64; BUCKETS],
    /// The sum of the observations, in nanoseconds.
    pub sum_nanos: u64,
}

impl Histogram {
    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The sum of the observations in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos as f64 / 1e9
    }

    /// Adds `other`'s observations to these.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts) {
            *mine += theirs;
        }
        self.sum_nanos += other.sum_nanos;
    }

    /// The buckets with their upper bounds in seconds: `(le, observations in this bucket)`,
    /// `+Inf` last (what `prometheus-client`'s encoder takes; it writes them cumulated).
    pub fn with_bounds(&self) -> Vec<(f64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .map(|(i, count)| {
                let le = BOUNDS_SECONDS.get(i).copied().unwrap_or(f64::INFINITY);
                (le, *count)
            })
            .collect()
    }
}

/// A latency histogram of shared atomics, for what is counted once per origin response rather
/// than once per request (a backend's response times): simpler than per-thread shards, and a
/// relaxed add is nothing beside an origin round trip.
pub struct SharedHistogram {
    counts: [AtomicU64; BUCKETS],
    sum_nanos: AtomicU64,
}

impl Default for SharedHistogram {
    fn default() -> Self {
        SharedHistogram {
            counts: [const { AtomicU64::new(0) }; BUCKETS],
            sum_nanos: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for SharedHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedHistogram")
            .field(&self.read())
            .finish()
    }
}

impl SharedHistogram {
    /// Counts one observation.
    pub fn observe(&self, duration: Duration) {
        let nanos = nanos(duration);
        self.counts[bucket_of(nanos)].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The observations so far.
    pub fn read(&self) -> Histogram {
        let mut read = Histogram {
            sum_nanos: self.sum_nanos.load(Ordering::Relaxed),
            ..Histogram::default()
        };
        for (count, cell) in read.counts.iter_mut().zip(&self.counts) {
            *count = cell.load(Ordering::Relaxed);
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fall_in_the_first_bucket_whose_bound_is_not_below_them() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(50_000), 0);
        assert_eq!(bucket_of(50_001), 1);
        assert_eq!(bucket_of(nanos(Duration::from_millis(3))), 6);
        assert_eq!(bucket_of(nanos(Duration::from_secs(10))), 16);
        assert_eq!(bucket_of(nanos(Duration::from_secs(11))), 17);
        for (bound, nanos) in BOUNDS_SECONDS.iter().zip(BOUNDS_NANOS) {
            assert_eq!((bound * 1e9).round() as u64, nanos);
        }
    }

    #[test]
    fn buckets_carry_their_bounds_and_the_last_is_infinity() {
        let mut h = Histogram::default();
        h.counts[0] = 2;
        h.counts[3] = 1;
        h.counts[BUCKETS - 1] = 4;
        let buckets = h.with_bounds();
        assert_eq!(buckets.len(), BUCKETS);
        assert_eq!(buckets[0], (0.00005, 2));
        assert_eq!(buckets[3], (0.0005, 1));
        assert_eq!(buckets[BUCKETS - 1], (f64::INFINITY, 4));
        assert_eq!(h.count(), 7);
    }
}
