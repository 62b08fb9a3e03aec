//! What the shared tier has done, for `/stats`: counted by the tiered store (reads, writes) and
//! by the fill leases (claims, waits), read by the admin endpoint.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters of the shared tier since start.
#[derive(Debug, Default)]
pub struct SharedCounters {
    /// Verified memcached hits.
    pub hits: AtomicU64,
    /// Of `hits`, those served from a value another request had just decoded: concurrent gets
    /// of one key share one value, decoded once (see [`super::decoded_values`]).
    pub decodes_shared: AtomicU64,
    /// Keys memcached did not have.
    pub misses: AtomicU64,
    /// Values memcached returned that failed verification (format, checksum, key, a chunk, a
    /// date further ahead than clocks differ).
    pub rejected: AtomicU64,
    /// Verified entries not served because a purge or ban covers them, or because they are
    /// older than purges and bans are remembered (`invalidation.retention`).
    pub invalidated: AtomicU64,
    /// Entries written to memcached.
    pub writes: AtomicU64,
    /// Entries that could not be written.
    pub write_failures: AtomicU64,
    /// Entries not written because memcached already held a newer answer for their key (one
    /// validated later: fills land out of order), which stays (see
    /// `TieredStorage::store_unless_newer`).
    pub writes_superseded: AtomicU64,
    /// Entries deleted again right after they were written: a purge or ban this node learned
    /// of only then covers them (see `TieredStorage::judge_written`).
    pub written_then_banned: AtomicU64,
    /// Purges kept for the whole retention because an entry this node wrote after one could
    /// not be deleted (its server did not answer; see `TieredStorage::judge_written`), or was
    /// judged late (below).
    pub purges_kept: AtomicU64,
    /// Writes this node could not judge by the bans in time, because no read of the cluster's
    /// log got an answer for a while after they landed: each was kept and judged after the
    /// next read that did (see `TieredStorage::judge_later`), so that an entry a purge covers
    /// does not outlive it unjudged.
    pub writes_judged_late: AtomicU64,
    /// Fills this node claimed for the cluster (see [`super::fill_lease`]).
    pub fills_claimed: AtomicU64,
    /// Renewals that kept a claimed fill's lease alive: one per slow fill per third of
    /// `fill_lease` (see [`super::fill_lease`]'s renewal).
    pub fill_leases_renewed: AtomicU64,
    /// Fill leases found gone while their fill was in flight, not by this node's doing (a
    /// renewal found nothing to replace, or the delete after the fill's write found nothing):
    /// purged, or lost with their memcached server, so the fill was not kept (see
    /// [`super::fill_lease`], **Loss**).
    pub fill_leases_lost: AtomicU64,
    /// Requests that waited for another node's fill and were served by it (requests on the
    /// filling node wait on Pingora's cache lock instead, and are not counted).
    pub fills_awaited: AtomicU64,
    /// Misses filled without a lease because the URL's memcached server was ejected, had just
    /// failed, or did not answer the claim: nothing more is asked of a failing server.
    pub fills_unguarded: AtomicU64,
    /// Misses fetched while another claim held the URL's lease (a `Range` or validator miss,
    /// which waits for no one): served to their readers, then refused (see
    /// [`super::fill_lease::MissClaim::Elsewhere`]).
    pub fills_under_another_claim: AtomicU64,
    /// Waits for another node's fill begun (each ends served by that fill, cut short, or at the
    /// lease's end).
    pub fill_waits: AtomicU64,
    /// Waits for another node's fill cut short because the URL's memcached server failed.
    pub fill_waits_cut: AtomicU64,
    /// Not a count since start but a gauge: writes and lease deletes spawned for requests that
    /// may have ended, not done yet. A stopping process lets them finish, as it lets requests
    /// finish (`lifecycle::drain`): a fill's write cut by the exit would leave its lease to hold
    /// every other node's requests for the URL until it expires.
    pub background: AtomicU64,
}

impl SharedCounters {
    /// Counts one background task in [`SharedCounters::background`] until the returned guard
    /// is dropped; taken before the task is spawned, while its request is still counted.
    pub fn background_task(self: &Arc<Self>) -> BackgroundTask {
        self.background.fetch_add(1, Ordering::Relaxed);
        BackgroundTask(self.clone())
    }
}

/// One background write or delete of the shared tier, counted until it is dropped.
pub struct BackgroundTask(Arc<SharedCounters>);

impl Drop for BackgroundTask {
    fn drop(&mut self) {
        self.0.background.fetch_sub(1, Ordering::Release);
    }
}
