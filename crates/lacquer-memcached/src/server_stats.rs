//! What one server's operations did, for an operator's metrics: how long completed exchanges
//! took, how many keys each multi-get carried, and how many operations failed or timed out.
//!
//! Counted by the server's pool (each completed exchange: latency, batch size) and by the
//! cluster (each failure, as it counts it towards ejection), read whole by [`ServerStats::read`].
//! Shared atomics: memcached operations are network round trips, a few relaxed adds are nothing
//! beside them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in microseconds (a round trip on a LAN is ~100 µs, an
/// operation is bounded by `op_timeout`, typically well under a second).
pub const LATENCY_BOUNDS_MICROS: [u64; 13] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// Upper bounds of the batch-size buckets, in keys per multi-get (batches carry at most 32 keys;
/// the chunks of one large object may be more).
pub const BATCH_BOUNDS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// A histogram of atomics: observations per bucket (the last one above every bound) and their
/// sum.
struct AtomicHistogram<const B: usize> {
    buckets: [AtomicU64; B],
    sum: AtomicU64,
}

impl<const B: usize> AtomicHistogram<B> {
    fn new() -> Self {
        AtomicHistogram {
            buckets: [const { AtomicU64::new(0) }; B],
            sum: AtomicU64::new(0),
        }
    }

    fn observe(&self, bounds: &[u64], value: u64) {
        let bucket = bounds
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(bounds.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    fn read(&self) -> HistogramCounts {
        HistogramCounts {
            counts: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// A histogram as read: observations per bucket (one more bucket than bounds) and their sum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramCounts {
    pub counts: Vec<u64>,
    pub sum: u64,
}

/// One server's operation counters.
pub struct ServerStats {
    latency: AtomicHistogram<{ LATENCY_BOUNDS_MICROS.len() + 1 }>,
    batches: AtomicHistogram<{ BATCH_BOUNDS.len() + 1 }>,
    errors: AtomicU64,
    timeouts: AtomicU64,
}

/// One server's counters as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStatsSnapshot {
    /// Completed exchanges by latency, in microseconds ([`LATENCY_BOUNDS_MICROS`]).
    pub latency_micros: HistogramCounts,
    /// Multi-gets by keys carried ([`BATCH_BOUNDS`]).
    pub batch_keys: HistogramCounts,
    /// Operations that failed, timeouts included.
    pub errors: u64,
    /// Operations that did not finish within `op_timeout`.
    pub timeouts: u64,
}

impl Default for ServerStats {
    fn default() -> Self {
        ServerStats {
            latency: AtomicHistogram::new(),
            batches: AtomicHistogram::new(),
            errors: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
        }
    }
}

impl ServerStats {
    /// A completed exchange that took `elapsed`.
    pub(crate) fn on_exchange(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.latency.observe(&LATENCY_BOUNDS_MICROS, micros);
    }

    /// A multi-get of `keys` keys sent.
    pub(crate) fn on_batch(&self, keys: usize) {
        self.batches.observe(&BATCH_BOUNDS, keys as u64);
    }

    /// A failed operation (`timeout`: it did not finish in time).
    pub(crate) fn on_failure(&self, timeout: bool) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if timeout {
            self.timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every counter.
    pub fn read(&self) -> ServerStatsSnapshot {
        ServerStatsSnapshot {
            latency_micros: self.latency.read(),
            batch_keys: self.batches.read(),
            errors: self.errors.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_not_below_them() {
        let stats = ServerStats::default();
        stats.on_exchange(Duration::from_micros(80));
        stats.on_exchange(Duration::from_secs(3));
        stats.on_batch(1);
        stats.on_batch(20);
        stats.on_failure(true);
        stats.on_failure(false);
        let read = stats.read();
        assert_eq!(read.latency_micros.counts[1], 1);
        assert_eq!(read.latency_micros.counts[LATENCY_BOUNDS_MICROS.len()], 1);
        assert_eq!(read.latency_micros.sum, 3_000_080);
        assert_eq!(read.batch_keys.counts[0], 1);
        assert_eq!(read.batch_keys.counts[5], 1);
        assert_eq!(read.batch_keys.sum, 21);
        assert_eq!((read.errors, read.timeouts), (2, 1));
    }
}
