//! The ban list (Varnish's name for it): every purge and ban this node knows of, and the verdict
//! on an entry; with [`scope`] (what a ban covers and what an entry is) and [`tags`] (the tag
//! field). A purge is kept here as a ban on its URL. (Not the request rules, `crate::rules`,
//! which decide what is cached.)
//!
//! The storage's side of invalidation: the tiers judge entries by it. Carrying out a purge or
//! ban, and reaching the other nodes, is `crate::invalidation`'s.
//!
//! A ban says "entries under this scope validated before this time are invalid" (a purge or a
//! ban) or "... are stale" (a soft one); an entry is validated when it is fetched, and again
//! when a 304 confirms it (`StoredMeta::validated`). Bans are idempotent and commutative: a scope
//! keeps the latest time of each kind, so learning a ban twice, or from two memcached servers, or
//! out of order, changes nothing. They are kept for `retention`, and an entry read from memcached
//! that is older than that is not trusted at all ([`BanList::beyond_horizon`]), since a ban that
//! applied to it may have been forgotten. A purge of a URL whose memcached entry was deleted
//! covers nothing left in memcached: its ban only has to outlive memory copies and fills in
//! flight, and is kept for [`SHORT_RETENTION`] instead, so that purging many URLs does not grow
//! the list for a day; unless it found the URL's fill lease (a fill in flight, which may be
//! written after the delete by a node that may die before it judges it): then it is kept for the
//! whole retention from its issue (`invalidation::Invalidator::carry_out`). (A fill in flight
//! that no lease announced can still be written after the delete; its writer judges the entry
//! again once the purge has reached it and deletes it: `TieredStorage::judge_written`, which
//! waits with [`BanList::wait_log_read_from`], and, when the log could not be read meanwhile,
//! judges it only after a later read that could, [`BanList::log_read_since`]; or keeps the
//! purge when it cannot delete it, [`BanList::keep_url_purge`].)
//!
//! A purge by an unsafe method (a POST's) of a URL with nothing stored is not kept as a ban but
//! as a mark in a fixed table ([`BanList::mark_unsafe_purge`]), consulted only for what this node
//! fetches itself ([`BanList::judge_fetched`]): a ban per such POST grew the list with every new
//! URL a client chose.
//!
//! Who consults it: the memory tier, when it stores an object (an in-flight fill that started
//! before a ban finishes after it), and the tiered store, when it reads an entry from memcached
//! (the entry may predate a purge whose delete did not reach its server). A hit from the memory
//! tier never does: bans are applied to the memory tier when they arrive
//! ([`crate::storage::memory::MemoryTier::invalidate`]), so its hit path is unchanged.

pub mod scope;
pub mod tags;

use crate::storage::shared_counters::BackgroundTask;
use parking_lot::RwLock;
use pingora_http::ResponseHeader;
use scope::{prefix_covers, EntryScopes, Scope};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tags::TagField;
use tokio::sync::Notify;

/// How long a ban is kept whose entries were deleted from memcached (see the module docs):
/// far longer than a fill or a memory copy (`local_ttl`) lasts.
pub const SHORT_RETENTION: Duration = Duration::from_secs(300);

/// What a stored entry is worth under the bans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No ban applies.
    Valid,
    /// A soft purge or ban applies: the entry is stale from this time on (it may still be served
    /// stale where grace or `stale-while-revalidate` allow, and revalidated).
    StaleSince(SystemTime),
    /// A purge or ban applies: the entry must not be served.
    Invalid,
}

/// The latest ban of each kind on one scope, in milliseconds since the Unix epoch (0: none),
/// and until when the scope's bans are kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Stamp {
    hard_ms: u64,
    soft_ms: u64,
    keep_until_ms: u64,
}

impl Stamp {
    /// Records a ban at `ms`, kept until `keep_until_ms`; returns whether it told something new.
    fn raise(&mut self, ms: u64, soft: bool, keep_until_ms: u64) -> bool {
        let slot = if soft {
            &mut self.soft_ms
        } else {
            &mut self.hard_ms
        };
        let raised = ms > *slot;
        *slot = (*slot).max(ms);
        self.keep_until_ms = self.keep_until_ms.max(keep_until_ms);
        raised
    }

    /// This stamp's verdict on an entry created at `created`, folded into `verdict`.
    fn judge(&self, created: SystemTime, verdict: &mut Verdict) {
        if created < at(self.hard_ms) {
            *verdict = Verdict::Invalid;
        } else if created < at(self.soft_ms) {
            let since = at(self.soft_ms);
            *verdict = match *verdict {
                Verdict::Invalid => Verdict::Invalid,
                Verdict::StaleSince(t) => Verdict::StaleSince(t.min(since)),
                Verdict::Valid => Verdict::StaleSince(since),
            };
        }
    }
}

/// A time in milliseconds since the Unix epoch.
pub fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// `time` in milliseconds since the Unix epoch, rounded up: a ban stamped with it covers every
/// entry created before `time`, to the nanosecond.
pub fn ms_after(time: SystemTime) -> u64 {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    since.as_millis() as u64 + u64::from(!since.subsec_nanos().is_multiple_of(1_000_000))
}

/// Waits until the clock has passed `issued_ms`, the millisecond an invalidation is stamped with
/// (rounded up, [`ms_after`]), before the invalidation is answered. Bans and marks cover what
/// was fetched before their stamp, so a request sent in the same millisecond after the purge
/// would count as sent before it: a client that asks for the page again as soon as its POST or
/// PURGE is answered had its refill refused, stored nowhere, not joined, and fetched once more
/// by the next request (`tests/purged_fill_attacks.rs` failed about one run in two with four
/// tests at a time on a fast machine). Holding the answer until then makes every request sent
/// after it later than the stamp (`Invalidator`, when the invalidation entered a ban, as a PURGE
/// or a ban through the admin API always does and an unsafe method's when something of the URL
/// was stored or being filled, or let go of a fill in flight). A POST's answer kept for reuse is
/// stored only after it too (`proxy/post_reuse.rs`). At most a millisecond (the timer's tick
/// may add one), so a clock stepped back holds nothing longer.
pub async fn past_the_stamp(issued_ms: u64) {
    if let Ok(left) = at(issued_ms).duration_since(SystemTime::now()) {
        if !left.is_zero() {
            tokio::time::sleep(left.min(Duration::from_millis(1))).await;
        }
    }
}

#[derive(Default)]
struct Bans {
    urls: HashMap<u128, Stamp>,
    tags: HashMap<u64, Stamp>,
    hosts: HashMap<u64, Stamp>,
    /// Few, so a list: (host or every host, prefix) and its stamp.
    prefixes: Vec<(Option<u64>, String, Stamp)>,
}

impl Bans {
    fn stamp_mut(&mut self, scope: &Scope) -> &mut Stamp {
        match scope {
            Scope::Url(primary) => self.urls.entry(*primary).or_default(),
            Scope::Tag(tag) => self.tags.entry(*tag).or_default(),
            Scope::Host(host) => self.hosts.entry(*host).or_default(),
            Scope::Prefix { host, prefix } => {
                let found = self
                    .prefixes
                    .iter()
                    .position(|(h, p, _)| h == host && p == prefix);
                let index = found.unwrap_or_else(|| {
                    self.prefixes
                        .push((*host, prefix.clone(), Stamp::default()));
                    self.prefixes.len() - 1
                });
                &mut self.prefixes[index].2
            }
        }
    }

    fn len(&self) -> usize {
        self.urls.len() + self.tags.len() + self.hosts.len() + self.prefixes.len()
    }
}

/// Every ban this node knows of.
pub struct BanList {
    bans: RwLock<Bans>,
    /// How many scopes have a ban, read without the lock: with none, judging costs nothing.
    count: AtomicUsize,
    /// Bumped whenever a ban tells something new, so a store that judged an entry can tell
    /// whether a ban arrived meanwhile.
    generation: AtomicU64,
    retention: Duration,
    tag_field: Option<TagField>,
    /// Whether the cluster's log has been read once since start (see [`BanList::wait_ready`]).
    ready: AtomicBool,
    became_ready: Notify,
    /// How often the cluster's log is read, in ms (0: bans come from this node only).
    log_poll_ms: AtomicU64,
    /// When (ms since the epoch) the latest read of the log that got an answer began: every
    /// ban published before then is in the list (see [`BanList::wait_log_read_from`]).
    log_read_from: AtomicU64,
    log_read: Notify,
    /// URL purges kept for the whole retention by [`BanList::keep_url_purge`], waiting for the
    /// invalidation service to publish them so (see [`BanList::take_kept_purges`]).
    kept_purges: parking_lot::Mutex<Vec<KeptPurge>>,
    /// Woken when a purge is added to `kept_purges` ([`BanList::purge_kept`]).
    purge_kept: Notify,
    /// The purges an unsafe method's answer made of URLs with nothing stored and nothing being
    /// filled ([`BanList::mark_unsafe_purge`]): the latest one's time (ms) in the slot of the
    /// URL's primary hash, a fixed [`UNSAFE_MARK_SLOTS`] of them. Such a purge only has to stop
    /// a fetch begun before it from storing its answer, so it is not a ban: kept as one per URL,
    /// every POST to a new URL (a query string an attacker picks) grew the list by about
    /// 100 bytes for [`SHORT_RETENTION`].
    unsafe_marks: Box<[AtomicU64]>,
}

/// How many slots [`BanList::mark_unsafe_purge`] spreads URLs over (512 KiB): a URL sharing a
/// slot with one just purged loses one storing, and only when its fetch was in flight then.
pub const UNSAFE_MARK_SLOTS: usize = 1 << 16;

fn unsafe_mark_slot(primary: u128) -> usize {
    primary as usize & (UNSAFE_MARK_SLOTS - 1)
}

/// The most kept purges waiting for publication; beyond it the oldest is published no more (it
/// is still kept here).
const MAX_KEPT_PURGES: usize = 10_000;

/// A purge of one URL that this node keeps for the whole retention instead of
/// [`SHORT_RETENTION`], and that the other nodes must keep as long: see
/// [`BanList::keep_url_purge`].
pub struct KeptPurge {
    /// The purged entry's primary key text (host, with `https://` for an `https` key, and path).
    pub primary_text: String,
    /// When the purge was issued (ms since the Unix epoch): what it covers.
    pub issued_ms: u64,
    /// Held until the purge is published (dropped with it), so that a draining node does not
    /// exit before.
    pub publication: Option<BackgroundTask>,
}

impl KeptPurge {
    /// The key text split into the host as a URL purge names it (`https://` kept, so that the
    /// purge's scope is the same key's) and the path with its query.
    pub fn host_and_path(&self) -> (&str, &str) {
        let text = &self.primary_text;
        let host_from = text
            .strip_prefix(crate::proxy::cache_key::HTTPS_PREFIX)
            .map_or(0, |rest| text.len() - rest.len());
        text.split_at(
            text[host_from..]
                .find('/')
                .map_or(text.len(), |at| host_from + at),
        )
    }
}

impl BanList {
    /// An empty list keeping bans for `retention`; entries' tags are read from `tag_field`.
    /// Ready at once: a node with a shared log calls [`BanList::expect_catch_up`] first.
    pub fn new(retention: Duration, tag_field: Option<TagField>) -> BanList {
        BanList {
            bans: RwLock::default(),
            count: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            retention,
            tag_field,
            ready: AtomicBool::new(true),
            became_ready: Notify::new(),
            log_poll_ms: AtomicU64::new(0),
            log_read_from: AtomicU64::new(0),
            log_read: Notify::new(),
            kept_purges: parking_lot::Mutex::new(Vec::new()),
            purge_kept: Notify::new(),
            unsafe_marks: (0..UNSAFE_MARK_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A leaked, `'static` list, shared by the storage tiers and the invalidation service.
    pub fn leak(self) -> &'static BanList {
        Box::leak(Box::new(self))
    }

    /// How long bans are kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The field tags are read from, if any.
    pub fn tag_field(&self) -> Option<&TagField> {
        self.tag_field.as_ref()
    }

    /// Records a ban on `scope` at `ms` (soft or not; short-lived, see [`SHORT_RETENTION`]);
    /// returns whether it told something new.
    pub fn add(&self, scope: &Scope, ms: u64, soft: bool, short_lived: bool) -> bool {
        let lifetime = if short_lived {
            SHORT_RETENTION.min(self.retention)
        } else {
            self.retention
        };
        let keep_until = ms.saturating_add(lifetime.as_millis() as u64);
        let mut bans = self.bans.write();
        let raised = bans.stamp_mut(scope).raise(ms, soft, keep_until);
        self.count.store(bans.len(), Ordering::Release);
        if raised {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        raised
    }

    /// Keeps the purge of the URL whose primary hash is `primary` (key text `primary_text`) for
    /// the whole retention, when it was short-lived: an entry it covers was written to memcached
    /// after it (a fill in flight), and the writer could not delete it (its server frozen or
    /// ejected), so the entry may outlive [`SHORT_RETENTION`] there, and so must the purge, here
    /// and, once the invalidation service has published it again
    /// ([`BanList::take_kept_purges`]), on every node. Returns whether such a purge was found.
    ///
    /// `publication` is held until the purge is published; on a node that reads no log (nobody
    /// would publish it) the purge is kept here only.
    pub fn keep_url_purge(
        &self,
        primary: u128,
        primary_text: &str,
        publication: Option<BackgroundTask>,
    ) -> bool {
        let mut bans = self.bans.write();
        let Some(stamp) = bans.urls.get_mut(&primary) else {
            return false;
        };
        let keep_until = stamp
            .hard_ms
            .saturating_add(self.retention.as_millis() as u64);
        if stamp.hard_ms == 0 || stamp.keep_until_ms >= keep_until {
            // soft only (not the writer's to act on), or kept that long already
            return false;
        }
        stamp.keep_until_ms = keep_until;
        let issued_ms = stamp.hard_ms;
        drop(bans);
        if self.log_poll_ms.load(Ordering::Acquire) == 0 {
            return true;
        }
        let mut kept = self.kept_purges.lock();
        if kept.len() >= MAX_KEPT_PURGES {
            let dropped = kept.remove(0);
            log::warn!(
                "invalidation: more than {MAX_KEPT_PURGES} kept purges wait for publication; \
                 {} is kept on this node only",
                dropped.primary_text
            );
        }
        kept.push(KeptPurge {
            primary_text: primary_text.to_string(),
            issued_ms,
            publication,
        });
        drop(kept);
        self.purge_kept.notify_one();
        true
    }

    /// Returns once [`BanList::keep_url_purge`] has kept a purge for publication (at once when
    /// one was kept since the last wait ended): the invalidation service publishes it then,
    /// rather than at its next read of the log, so that a node dying in between loses it less
    /// often. (Purges found covering a fill in flight are long-lived from their issue, and need
    /// no writer to keep them: `invalidation::Invalidator::carry_out`.)
    pub async fn purge_kept(&self) {
        self.purge_kept.notified().await;
    }

    /// The purges [`BanList::keep_url_purge`] kept since the last call, for publication.
    pub fn take_kept_purges(&self) -> Vec<KeptPurge> {
        std::mem::take(&mut *self.kept_purges.lock())
    }

    /// Changes whenever a ban tells something new.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// How many scopes have a ban.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Whether no scope has a ban.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The scopes of an entry whose key text is `primary_text`, primary hash `primary` and
    /// stored head `header`.
    pub fn scopes_of(
        &self,
        primary_text: &str,
        primary: u128,
        header: &ResponseHeader,
    ) -> EntryScopes {
        let tags = self
            .tag_field
            .as_ref()
            .map(|field| field.hashes(header))
            .unwrap_or_default();
        EntryScopes::new(primary_text, primary, tags)
    }

    /// The verdict on an entry that is `entry`, validated at `created`.
    pub fn judge(&self, entry: &EntryScopes, created: SystemTime) -> Verdict {
        let mut verdict = Verdict::Valid;
        if self.is_empty() {
            return verdict;
        }
        let bans = self.bans.read();
        if let Some(stamp) = bans.urls.get(&entry.primary) {
            stamp.judge(created, &mut verdict);
        }
        if let Some(stamp) = bans.hosts.get(&entry.host) {
            stamp.judge(created, &mut verdict);
        }
        if !bans.tags.is_empty() {
            for tag in entry.tags.iter() {
                if let Some(stamp) = bans.tags.get(tag) {
                    stamp.judge(created, &mut verdict);
                }
            }
        }
        for (host, prefix, stamp) in &bans.prefixes {
            if prefix_covers(*host, prefix, entry) {
                stamp.judge(created, &mut verdict);
            }
        }
        verdict
    }

    /// [`Self::judge`] for an object this node fetched from the origin itself (a fill, a part
    /// of a representation) and is about to store or let requests join, validated at `created`
    /// (when its request was sent): also invalid when an unsafe method's answer purged its URL
    /// since, while nothing of it was stored ([`Self::mark_unsafe_purge`]). Not for entries
    /// read from memcached or promoted from it: those were stored before, and the mark, shared
    /// by every URL of its slot, would refuse a slot's worth of them after every such purge.
    pub fn judge_fetched(&self, entry: &EntryScopes, created: SystemTime) -> Verdict {
        let mark = self.unsafe_marks[unsafe_mark_slot(entry.primary)].load(Ordering::Acquire);
        if mark != 0 && created < at(mark) {
            return Verdict::Invalid;
        }
        self.judge(entry, created)
    }

    /// Records that an unsafe method's answer (a POST's, say) purged the URL whose primary hash
    /// is `primary` at `ms` while this node had nothing of it stored or being filled: a fetch of
    /// it sent before then must not store its answer ([`Self::judge_fetched`]), which is all a
    /// ban would have done. Kept in a fixed slot instead of the list (see `unsafe_marks`), and
    /// counted as a new ban ([`Self::generation`]), so that a store judged just before it is
    /// judged again.
    pub fn mark_unsafe_purge(&self, primary: u128, ms: u64) {
        self.unsafe_marks[unsafe_mark_slot(primary)].fetch_max(ms, Ordering::AcqRel);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether an entry validated at `created` is too old to be judged: bans that applied to it
    /// may have been forgotten, so it must not be trusted.
    pub fn beyond_horizon(&self, created: SystemTime, now: SystemTime) -> bool {
        now.duration_since(created)
            .is_ok_and(|age| age > self.retention)
    }

    /// Forgets the bans whose time is up.
    pub fn prune(&self, now: SystemTime) {
        let now = ms_after(now);
        let mut bans = self.bans.write();
        bans.urls.retain(|_, s| s.keep_until_ms >= now);
        bans.tags.retain(|_, s| s.keep_until_ms >= now);
        bans.hosts.retain(|_, s| s.keep_until_ms >= now);
        bans.prefixes.retain(|(_, _, s)| s.keep_until_ms >= now);
        self.count.store(bans.len(), Ordering::Release);
    }

    /// Marks the list as not yet complete: memcached entries are not judged (readers wait, see
    /// [`BanList::wait_ready`]) until the cluster's log, read every `poll_interval`, has been
    /// read once.
    pub fn expect_catch_up(&self, poll_interval: Duration) {
        self.log_poll_ms
            .store(poll_interval.as_millis() as u64, Ordering::Release);
        self.ready.store(false, Ordering::Release);
    }

    /// A read of the cluster's log that began at `began_ms` (ms since the epoch, this node's
    /// clock) got an answer, and what it found has been added.
    pub fn log_read(&self, began_ms: u64) {
        self.log_read_from.fetch_max(began_ms, Ordering::AcqRel);
        self.log_read.notify_waiters();
    }

    /// Waits until a read of the cluster's log that began at or after `from_ms` has been
    /// applied, so that every ban published before then is known here; returns whether it was.
    /// Gives up after `extra` plus three of the log's poll intervals (the log could not be
    /// read: `false`, and the list may lack bans published before `from_ms`); returns `true` at
    /// once on a node that reads no log (its list is all there is).
    pub async fn wait_log_read_from(&self, from_ms: u64, extra: Duration) -> bool {
        let poll_ms = self.log_poll_ms.load(Ordering::Acquire);
        if poll_ms == 0 {
            return true;
        }
        let deadline =
            tokio::time::Instant::now() + extra + Duration::from_millis(poll_ms.saturating_mul(3));
        loop {
            let read = self.log_read.notified();
            if self.log_read_from.load(Ordering::Acquire) >= from_ms {
                return true;
            }
            if tokio::time::timeout_at(deadline, read).await.is_err() {
                return false;
            }
        }
    }

    /// Waits, without a bound, until a read of the cluster's log that began at or after
    /// `from_ms` has been applied, and returns when the latest applied read began (ms since the
    /// epoch; `u64::MAX` on a node that reads no log, whose list is always complete). Exists for
    /// writes [`BanList::wait_log_read_from`] gave up on: they may not be judged until the bans
    /// published before they landed are known (`TieredStorage`'s unjudged writes).
    pub async fn log_read_since(&self, from_ms: u64) -> u64 {
        if self.log_poll_ms.load(Ordering::Acquire) == 0 {
            return u64::MAX;
        }
        loop {
            let read = self.log_read.notified();
            let read_from = self.log_read_from.load(Ordering::Acquire);
            if read_from >= from_ms {
                return read_from;
            }
            read.await;
        }
    }

    /// The cluster's log has been read (or could not be): memcached entries may be judged.
    pub fn caught_up(&self) {
        self.ready.store(true, Ordering::Release);
        self.became_ready.notify_waiters();
    }

    /// Waits (at most `patience`) until the list holds the cluster's bans, so that a node that
    /// just started does not serve an entry a ban it has not read yet would reject. Returns at
    /// once afterwards.
    pub async fn wait_ready(&self, patience: Duration) {
        if self.ready.load(Ordering::Acquire) {
            return;
        }
        let notified = self.became_ready.notified();
        if self.ready.load(Ordering::Acquire) {
            return;
        }
        let _ = tokio::time::timeout(patience, notified).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scope::scope_hash;

    #[tokio::test]
    async fn a_wait_for_a_log_read_ends_with_a_read_begun_late_enough_or_at_once_without_a_log() {
        let list = BanList::new(Duration::from_secs(60), None).leak();
        let long = Duration::from_secs(3600);
        // no log: nothing to wait for
        let judged = tokio::time::timeout(
            Duration::from_secs(5),
            list.wait_log_read_from(10_000, long),
        )
        .await
        .expect("waited on a node that reads no log");
        assert!(judged, "a node that reads no log has every ban it will get");
        list.expect_catch_up(Duration::from_secs(3600));
        let waiting = tokio::spawn(list.wait_log_read_from(10_000, long));
        tokio::task::yield_now().await;
        list.log_read(9_999);
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "a read begun before the write ended the wait"
        );
        list.log_read(10_000);
        let read = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("a read begun after the write did not end the wait")
            .unwrap();
        assert!(read, "the read that ended the wait is reported");
        // a log that cannot be read: given up after the patience
        tokio::time::timeout(
            Duration::from_millis(100),
            list.wait_log_read_from(20_000, Duration::from_millis(10)),
        )
        .await
        .expect_err("three poll intervals (an hour here) not waited for");
    }

    #[tokio::test]
    async fn a_wait_that_gives_up_says_so_and_the_unbounded_wait_ends_only_with_a_late_enough_read()
    {
        let list = BanList::new(Duration::from_secs(60), None).leak();
        // no log: the list is complete at once
        assert_eq!(list.log_read_since(10_000).await, u64::MAX);
        list.expect_catch_up(Duration::from_millis(1));
        list.log_read(5_000);
        // three poll intervals and the patience pass without a late enough read
        assert!(
            !list
                .wait_log_read_from(10_000, Duration::from_millis(10))
                .await
        );
        let waiting = tokio::spawn(list.log_read_since(10_000));
        // far longer than the bounded wait's patience (13 ms)
        tokio::time::sleep(Duration::from_millis(200)).await;
        list.log_read(9_999);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a read begun too early ended it");
        list.log_read(12_000);
        assert_eq!(waiting.await.unwrap(), 12_000, "when the read began");
        // a read already applied ends it at once
        assert_eq!(list.log_read_since(11_000).await, 12_000);
    }

    /// The page `url` (host + path), whose primary hash is `7`, tagged `tags`.
    fn entry(url: &str, tags: &[&str]) -> EntryScopes {
        EntryScopes::new(url, 7, tags.iter().map(|t| scope_hash(t)).collect())
    }

    #[test]
    fn a_ban_covers_entries_created_before_it_only() {
        let list = BanList::new(Duration::from_secs(3600), None);
        let page = entry("a.test/p", &["t1"]);
        let t = at(1_000_000);
        assert_eq!(list.judge(&page, t), Verdict::Valid);
        assert!(list.add(&Scope::Tag(scope_hash("t1")), 1_000_000, false, false));
        assert!(!list.add(&Scope::Tag(scope_hash("t1")), 999_000, false, false));
        assert_eq!(list.judge(&page, at(999_999)), Verdict::Invalid);
        assert_eq!(list.judge(&page, t), Verdict::Valid, "created at the ban");
        assert_eq!(
            list.judge(&entry("a.test/q", &["t2"]), at(1)),
            Verdict::Valid
        );
    }

    #[test]
    fn an_unsafe_purge_mark_refuses_fetches_sent_before_it_and_judges_nothing_else() {
        let list = BanList::new(Duration::from_secs(3600), None);
        let page = entry("a.test/p", &[]);
        let generation = list.generation();
        list.mark_unsafe_purge(7, 5_000);
        assert!(
            list.generation() > generation,
            "a store judged before it judges again"
        );
        assert!(list.is_empty(), "no ban");
        assert_eq!(list.judge_fetched(&page, at(4_999)), Verdict::Invalid);
        assert_eq!(list.judge_fetched(&page, at(5_000)), Verdict::Valid);
        // what was stored before (a copy read from memcached) is not the mark's to judge
        assert_eq!(list.judge(&page, at(4_999)), Verdict::Valid);
        // an earlier mark in the same slot changes nothing; a URL sharing the slot is refused a
        // fetch that straddled it, one of another slot is not
        list.mark_unsafe_purge(7 + UNSAFE_MARK_SLOTS as u128, 3_000);
        assert_eq!(list.judge_fetched(&page, at(4_000)), Verdict::Invalid);
        let neighbour = EntryScopes::new("a.test/q", 7 + (1 << 64), Box::new([]));
        assert_eq!(list.judge_fetched(&neighbour, at(4_000)), Verdict::Invalid);
        let elsewhere = EntryScopes::new("a.test/r", 8, Box::new([]));
        assert_eq!(list.judge_fetched(&elsewhere, at(4_000)), Verdict::Valid);
    }

    #[test]
    fn soft_bans_make_stale_and_hard_ones_win() {
        let list = BanList::new(Duration::from_secs(3600), None);
        let page = entry("a.test/p", &[]);
        let host = Scope::Host(scope_hash("a.test"));
        list.add(&host, 2_000, true, false);
        assert_eq!(list.judge(&page, at(1_500)), Verdict::StaleSince(at(2_000)));
        let url = Scope::Url(7);
        list.add(&url, 1_800, true, false);
        assert_eq!(list.judge(&page, at(1_500)), Verdict::StaleSince(at(1_800)));
        list.add(&url, 1_600, false, false);
        assert_eq!(list.judge(&page, at(1_500)), Verdict::Invalid);
        assert_eq!(list.judge(&page, at(1_700)), Verdict::StaleSince(at(1_800)));
    }

    #[test]
    fn bans_are_forgotten_after_retention_and_older_entries_are_beyond_the_horizon() {
        let list = BanList::new(Duration::from_secs(10), None);
        let prefix = Scope::Prefix {
            host: None,
            prefix: "/p".into(),
        };
        list.add(&prefix, 5_000, false, false);
        assert_eq!(list.len(), 1);
        list.prune(at(14_000));
        assert_eq!(list.len(), 1);
        list.prune(at(16_000));
        assert!(list.is_empty());
        // a purge whose entry was deleted is kept for minutes even with a day's retention
        let long = BanList::new(Duration::from_secs(86_400), None);
        long.add(&Scope::Url(7), 5_000, false, true);
        long.add(&Scope::Tag(scope_hash("t")), 5_000, false, false);
        long.prune(at(5_000) + SHORT_RETENTION + Duration::from_secs(1));
        assert_eq!(long.len(), 1, "the tag ban stays");
        assert!(list.beyond_horizon(at(5_000), at(15_001)));
        assert!(!list.beyond_horizon(at(5_000), at(15_000)));
        assert!(!list.beyond_horizon(at(20_000), at(15_000)), "clock skew");
    }

    #[test]
    fn a_short_lived_url_purge_its_writer_could_not_act_on_is_kept_for_the_retention() {
        let list = BanList::new(Duration::from_secs(86_400), None);
        let (primary, https) = (Scope::Url(7), Scope::Url(8));
        list.add(&primary, 5_000, false, true);
        list.add(&https, 6_000, false, true);
        list.expect_catch_up(Duration::from_secs(1));
        assert!(list.keep_url_purge(7, "shop.example/a?b=/c", None));
        assert!(list.keep_url_purge(8, "https://shop.example:8443/d", None));
        // once only, and never for what has no hard purge of that URL
        assert!(!list.keep_url_purge(7, "shop.example/a?b=/c", None));
        assert!(!list.keep_url_purge(9, "shop.example/none", None));
        list.add(&Scope::Url(10), 5_000, true, true);
        assert!(!list.keep_url_purge(10, "shop.example/soft", None));
        let kept = list.take_kept_purges();
        assert_eq!(
            kept.iter()
                .map(|k| (k.host_and_path(), k.issued_ms))
                .collect::<Vec<_>>(),
            [
                (("shop.example", "/a?b=/c"), 5_000),
                (("https://shop.example:8443", "/d"), 6_000)
            ]
        );
        assert!(list.take_kept_purges().is_empty(), "taken once");
        list.prune(at(6_000) + SHORT_RETENTION + Duration::from_secs(1));
        assert_eq!(list.len(), 2, "both kept past the short retention");
        let page = entry("shop.example/a?b=/c", &[]);
        assert_eq!(list.judge(&page, at(4_000)), Verdict::Invalid);
        list.prune(at(6_000) + Duration::from_secs(86_401));
        assert!(list.is_empty(), "and forgotten after the retention");
    }

    #[tokio::test]
    async fn a_kept_purge_wakes_its_publisher_at_once() {
        let list = BanList::new(Duration::from_secs(86_400), None);
        list.add(&Scope::Url(7), 5_000, false, true);
        list.expect_catch_up(Duration::from_secs(3600));
        let early = tokio::time::timeout(Duration::from_millis(50), list.purge_kept()).await;
        assert!(early.is_err(), "woken with nothing kept");
        assert!(list.keep_url_purge(7, "shop.example/a", None));
        tokio::time::timeout(Duration::from_secs(5), list.purge_kept())
            .await
            .expect(
                "a kept purge did not wake its publisher (the next log read would be an hour away)",
            );
        assert_eq!(list.take_kept_purges().len(), 1);
    }

    #[test]
    fn ban_times_round_up_to_the_millisecond() {
        let time = at(1_000) + Duration::from_nanos(1);
        assert_eq!(ms_after(time), 1_001);
        assert_eq!(ms_after(at(1_000)), 1_000);
        assert!(time < at(ms_after(time)));
    }
}
