//! Counters kept per worker thread and summed when read.
//!
//! Every request adds to a handful of counters. One set of atomics shared by all threads would
//! make every request on every core write the same cache lines (and pay a locked add each); here
//! each thread writes only its own shard, with a plain load and store (it is the shard's only
//! writer), and a scrape, a few times a minute, adds the shards up. The `thread_local` crate
//! finds the calling thread's shard (and keeps every shard reachable for the scrape).

use std::sync::atomic::{AtomicU64, Ordering};
use thread_local::ThreadLocal;

/// One thread's counters, alone on its cache lines.
#[repr(align(128))]
pub struct Shard<const N: usize>([AtomicU64; N]);

impl<const N: usize> Shard<N> {
    fn new() -> Self {
        Shard([const { AtomicU64::new(0) }; N])
    }

    /// Adds `n` to counter `cell`. Only the owning thread writes a shard, so a load and a store
    /// suffice (no locked instruction); a scrape reading at the same moment sees the value before
    /// or after, never a torn one.
    #[inline]
    pub fn add(&self, cell: usize, n: u64) {
        let counter = &self.0[cell];
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
}

/// `N` counters, one shard of them per thread that has counted.
pub struct PerThread<const N: usize> {
    shards: ThreadLocal<Shard<N>>,
}

impl<const N: usize> Default for PerThread<N> {
    fn default() -> Self {
        PerThread {
            shards: ThreadLocal::new(),
        }
    }
}

impl<const N: usize> PerThread<N> {
    /// The calling thread's shard (created on its first use).
    #[inline]
    pub fn local(&self) -> &Shard<N> {
        self.shards.get_or(Shard::new)
    }

    /// Every counter summed over the threads.
    pub fn sum(&self) -> [u64; N] {
        let mut total = [0u64; N];
        for shard in self.shards.iter() {
            for (sum, counter) in total.iter_mut().zip(&shard.0) {
                *sum = sum.wrapping_add(counter.load(Ordering::Relaxed));
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counts_from_every_thread_are_summed() {
        let counters = Arc::new(PerThread::<3>::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let counters = counters.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        counters.local().add(0, 1);
                        counters.local().add(2, 5);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(counters.sum(), [4000, 0, 20_000]);
    }
}
