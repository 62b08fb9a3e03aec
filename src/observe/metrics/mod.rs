//! Request metrics: what every finished request adds to the counters `/metrics` and the status
//! page read.
//!
//! One call per request, from the proxy's `logging` phase ([`RequestMetrics::on_request_end`]):
//! the request counted by cache outcome and the tier that served it, its body bytes, its latency
//! in the histogram of its outcome, and whether it waited on another request's fill (coalesced).
//! The counters are kept per thread ([`per_thread`]) and summed at scrape time, so the hit path
//! pays a thread-local lookup and a few plain adds (measured in `docs/benchmarks.md`). Everything
//! else `/metrics` reports (memory tier, memcached servers, backends, purges and bans) is read
//! from the component that already counts it, at scrape time (`crate::admin::prometheus`).

pub mod histogram;
pub mod per_thread;

use crate::storage::tier::Tier;
use histogram::{Histogram, BUCKETS};
use per_thread::PerThread;
use std::time::Duration;

/// How the cache handled a request, as the access log's `cache=` word says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Served from storage without asking the origin.
    Hit,
    /// Not stored: fetched from the origin.
    Miss,
    /// A stored response was stale: refetched, or served stale because the origin failed.
    Stale,
    /// A stale stored response the origin confirmed (304) and that was then served.
    Revalidated,
    /// The cache was not used for this request.
    Pass,
}

impl CacheOutcome {
    /// Every outcome, in the order of their counters.
    pub const ALL: [CacheOutcome; 5] = [
        CacheOutcome::Hit,
        CacheOutcome::Miss,
        CacheOutcome::Stale,
        CacheOutcome::Revalidated,
        CacheOutcome::Pass,
    ];

    /// The word in the log and in the `cache` label.
    pub fn label(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Miss => "miss",
            CacheOutcome::Stale => "stale",
            CacheOutcome::Revalidated => "revalidated",
            CacheOutcome::Pass => "pass",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Where a response's body came from, as the `tier` label says it: a storage tier, or the
/// origin (anything not read from storage).
pub const SOURCES: [&str; 3] = ["memory", "memcached", "origin"];

fn source_index(tier: Option<Tier>) -> usize {
    match tier {
        Some(Tier::Memory) => 0,
        Some(Tier::Memcached) => 1,
        None => 2,
    }
}

const OUTCOMES: usize = CacheOutcome::ALL.len();
// the layout of one thread's counters
const REQUESTS: usize = 0; // [outcome][source]
const BYTES: usize = REQUESTS + OUTCOMES * SOURCES.len(); // [outcome]
const LATENCY_SUM: usize = BYTES + OUTCOMES; // [outcome], nanoseconds
const LATENCY_BUCKETS: usize = LATENCY_SUM + OUTCOMES; // [outcome][bucket]
const COALESCED: usize = LATENCY_BUCKETS + OUTCOMES * BUCKETS;
const PURGED: usize = COALESCED + 1; // [found nothing, removed something]
const DIRECT: usize = PURGED + 2;
const DIRECT_MISS: usize = DIRECT + 1;
const CELLS: usize = DIRECT_MISS + 1;

/// One finished request, as the metrics see it.
#[derive(Debug, Clone, Copy)]
pub struct FinishedRequest {
    pub outcome: CacheOutcome,
    /// The tier a stored response was read from (`None`: the origin, or nothing stored).
    pub tier: Option<Tier>,
    /// Body bytes sent to the client.
    pub body_bytes: u64,
    /// From the request's arrival to the end of its response.
    pub duration: Duration,
    /// It waited on the cache lock for another request's fill of the same object.
    pub coalesced: bool,
    /// A pass forwarded over Lacquer's own HTTP/1 exchange (`crate::proxy::direct_pass`).
    pub direct: bool,
    /// A miss forwarded over that exchange and stored from there (`proxy.direct_misses`).
    pub direct_miss: bool,
}

/// The request counters of this process.
#[derive(Default)]
pub struct RequestMetrics {
    counters: PerThread<CELLS>,
}

/// The request counters as one scrape reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSnapshot {
    /// Requests by outcome ([`CacheOutcome::ALL`] order) and source ([`SOURCES`] order).
    pub requests: [[u64; SOURCES.len()]; OUTCOMES],
    /// Body bytes sent, by outcome.
    pub bytes: [u64; OUTCOMES],
    /// Latency by outcome.
    pub latency: [Histogram; OUTCOMES],
    /// Requests that waited on another request's fill (Pingora's cache lock).
    pub coalesced: u64,
    /// PURGE requests that found nothing stored.
    pub purges_absent: u64,
    /// PURGE requests that removed something.
    pub purges_removed: u64,
    /// Passes forwarded over Lacquer's own HTTP/1 exchange.
    pub direct_passes: u64,
    /// Misses forwarded over that exchange (whatever their answer turned out to be).
    pub direct_misses: u64,
}

impl RequestMetrics {
    /// A leaked instance, shared by the proxy (which counts) and the admin listener (which
    /// reads) for the life of the process.
    pub fn leak() -> &'static RequestMetrics {
        Box::leak(Box::default())
    }

    /// `logging`: counts one finished request.
    #[inline]
    pub fn on_request_end(&self, request: &FinishedRequest) {
        let shard = self.counters.local();
        let outcome = request.outcome.index();
        shard.add(
            REQUESTS + outcome * SOURCES.len() + source_index(request.tier),
            1,
        );
        shard.add(BYTES + outcome, request.body_bytes);
        let nanos = histogram::nanos(request.duration);
        shard.add(LATENCY_SUM + outcome, nanos);
        shard.add(
            LATENCY_BUCKETS + outcome * BUCKETS + histogram::bucket_of(nanos),
            1,
        );
        if request.coalesced {
            shard.add(COALESCED, 1);
        }
        if request.direct {
            shard.add(DIRECT, 1);
        }
        if request.direct_miss {
            shard.add(DIRECT_MISS, 1);
        }
    }

    /// `logging` of an allowed PURGE: whether it removed something.
    pub fn on_purge(&self, removed: bool) {
        self.counters.local().add(PURGED + usize::from(removed), 1);
    }

    /// Every counter, summed over the threads.
    pub fn snapshot(&self) -> RequestSnapshot {
        let cells = self.counters.sum();
        let mut snapshot = RequestSnapshot {
            requests: [[0; SOURCES.len()]; OUTCOMES],
            bytes: [0; OUTCOMES],
            latency: [Histogram::default(); OUTCOMES],
            coalesced: cells[COALESCED],
            purges_absent: cells[PURGED],
            purges_removed: cells[PURGED + 1],
            direct_passes: cells[DIRECT],
            direct_misses: cells[DIRECT_MISS],
        };
        for outcome in 0..OUTCOMES {
            for source in 0..SOURCES.len() {
                snapshot.requests[outcome][source] =
                    cells[REQUESTS + outcome * SOURCES.len() + source];
            }
            snapshot.bytes[outcome] = cells[BYTES + outcome];
            let latency = &mut snapshot.latency[outcome];
            latency.sum_nanos = cells[LATENCY_SUM + outcome];
            let first = LATENCY_BUCKETS + outcome * BUCKETS;
            latency
                .counts
                .copy_from_slice(&cells[first..first + BUCKETS]);
        }
        snapshot
    }
}

impl RequestSnapshot {
    /// Requests with `outcome` served from `source` (a [`SOURCES`] name).
    pub fn requests(&self, outcome: CacheOutcome, source: &str) -> u64 {
        SOURCES
            .iter()
            .position(|s| *s == source)
            .map_or(0, |i| self.requests[outcome.index()][i])
    }

    /// Latency of every request, whatever its outcome.
    pub fn all_latency(&self) -> Histogram {
        let mut all = Histogram::default();
        for latency in &self.latency {
            all.merge(latency);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_counted_by_outcome_source_bytes_and_latency() {
        let metrics = RequestMetrics::default();
        let hit = FinishedRequest {
            outcome: CacheOutcome::Hit,
            tier: Some(Tier::Memcached),
            body_bytes: 1024,
            duration: Duration::from_micros(300),
            coalesced: false,
            direct: false,
            direct_miss: false,
        };
        metrics.on_request_end(&hit);
        metrics.on_request_end(&FinishedRequest {
            outcome: CacheOutcome::Miss,
            tier: None,
            duration: Duration::from_secs(20),
            coalesced: true,
            direct: true,
            direct_miss: true,
            ..hit
        });
        metrics.on_purge(true);
        let s = metrics.snapshot();
        assert_eq!(s.requests(CacheOutcome::Hit, "memcached"), 1);
        assert_eq!(s.requests(CacheOutcome::Hit, "memory"), 0);
        assert_eq!(s.requests(CacheOutcome::Miss, "origin"), 1);
        assert_eq!(s.bytes, [1024, 1024, 0, 0, 0]);
        assert_eq!(s.latency[0].counts[3], 1);
        assert_eq!(s.latency[0].sum_nanos, 300_000);
        assert_eq!(s.latency[1].counts[BUCKETS - 1], 1);
        assert_eq!(s.all_latency().count(), 2);
        assert_eq!((s.coalesced, s.purges_removed, s.purges_absent), (1, 1, 0));
        assert_eq!((s.direct_passes, s.direct_misses), (1, 1));
    }
}
