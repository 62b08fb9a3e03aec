//! Invalidation: one purge or ban, made through any node, reaching the whole cluster.
//!
//! The shared memcached tier makes the nodes one cache for reads; this module makes them one
//! cache for invalidation. A purge (a URL and all its variants) or a ban (a tag, a host, a path
//! prefix), hard or soft, asked through the admin API, a PURGE request, or an unsafe method's
//! success, is carried out by [`Invalidator::invalidate`]:
//!
//! 1. it is entered in this node's [`BanList`] (`crate::storage::ban_list`; a purge as a ban on
//!    its URL: "entries under this scope validated before now are invalid", or stale when soft)
//!    and is applied at once to the objects it covers in this node's memory tier (found through its indexes, see
//!    [`crate::storage::memory::MemoryTier::invalidate`]);
//! 2. a hard purge of a URL deletes the URL's entry in memcached;
//! 3. it is **published** to the cluster's invalidation log ([`cluster_log`]), a copy of which every
//!    memcached server keeps; every node reads the log every `poll_interval` and applies what
//!    it did not know, so a purge reaches every node within `poll_interval` plus one memcached
//!    round trip, and a node that starts reads the whole log first;
//! 4. the answer ([`report::Report`]) says what it touched and what it reached; it may wait for
//!    the other nodes to confirm.
//!
//! Why bans and not only deletes: an entry read from memcached is judged by the ban list
//! before it is served (in `storage::tiered`), so an entry a delete could not reach (its server
//! frozen or ejected during the purge, then back with its old data: the stale-on-return trap)
//! is never served, and a ban needs no scan of memcached. A hit from the memory tier consults
//! nothing: bans are applied to it when they arrive. What could not be done (a publication, a
//! delete on a server that did not answer) is retried every poll until it is.
//!
//! When memcached servers are down: a purge is published to the servers that answer, and every
//! node reads whichever it can reach; as long as one server took it, every node learns it. When
//! none did, the answer is 503: this node has applied it and keeps trying to publish it, other
//! nodes keep serving their memory copies for at most `local_ttl`, or, for a copy a node has
//! just filled, until its write to memcached ends (each item's write is bounded by
//! `op_timeout`), if that is later; then they look in memcached, which is down: a miss.

pub mod cluster_log;
pub mod record;
pub mod report;
pub mod target;

use crate::config::invalidation::InvalidationConfig;
use crate::storage::ban_list::scope::Scope;
use crate::storage::ban_list::{at, ms_after, past_the_stamp, BanList};
use crate::storage::memory::{MemoryTier, Touched};
use crate::storage::object::CLOCK_SKEW_ALLOWED;
use crate::storage::tiered::TieredStorage;
use bytes::Bytes;
use cluster_log::{Heartbeat, SharedLog};
use parking_lot::Mutex;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use record::{Record, RecordId, MAX_TARGET_TEXT};
use report::{DeleteReport, MemcachedReport, NodesReport, Report, ThisNode};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};
use target::Target;

/// How often the ban list is tidied.
const HOUSEKEEPING: Duration = Duration::from_secs(30);
/// The most publications and deletes kept for retrying; older ones are given up (and logged).
const MAX_PENDING: usize = 10_000;
/// How long, at least, a caller that waits for the other nodes to confirm waits for a node that
/// has not yet (a node reading the log every poll interval confirms within one; a slow or
/// dying one is given this long before the answer says so).
const MIN_WAIT: Duration = Duration::from_secs(5);

/// What carrying out one purge or ban did, for its report.
struct Done {
    record: Record,
    /// What it removed or marked stale in this node's memory tier.
    touched: Touched,
    memcached: Option<MemcachedReport>,
    nodes: Option<NodesReport>,
    /// What is left to retry, in words.
    pending: Vec<String>,
    /// Its line is already in the log (an unsafe method's invalidation that found nothing).
    logged: bool,
}

/// Logs the line of one purge or ban at `level` (info for those asked for; debug for the
/// invalidations of unsafe methods, whose line would otherwise be written on every POST).
fn log_report(level: log::Level, report: &Report) {
    if log::log_enabled!(level) {
        log::log!(
            level,
            "invalidation {}: {}{} {} asked by {}: {}",
            report.id,
            if report.soft { "soft " } else { "" },
            report.action,
            report.target.describe(),
            report.asked_by,
            report.summary()
        );
    }
}

/// One purge or ban to carry out.
#[derive(Debug, Clone)]
pub struct Request {
    pub target: Target,
    /// Mark stale instead of removing.
    pub soft: bool,
    /// Who asked (an address, and what they call themselves), for every node's log.
    pub asked_by: String,
    /// Wait (up to a few poll intervals) for the other nodes to confirm, and report them.
    pub wait: bool,
    /// Tell the other nodes only if this node or memcached had something under the target, or a
    /// node was filling it (its fill lease was there): the invalidation by unsafe methods, which
    /// mostly names URLs nobody stored; logged at debug level rather than info.
    pub only_if_stored: bool,
}

/// Why a request was refused before anything was done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// What this node's invalidation has done since start, for `/stats`.
#[derive(Debug, Default)]
pub struct InvalidationCounters {
    /// Purges and bans asked of this node.
    pub issued: AtomicU64,
    /// Of those, bans (a tag, a host, a prefix: every target but one URL).
    pub issued_bans: AtomicU64,
    /// Bans learned from other nodes through the log that told something new.
    pub learned: AtomicU64,
    /// Objects removed or marked stale in this node's memory tier by bans learned from others.
    pub swept: AtomicU64,
    /// Reads of the log (each reaching at least one server), and reads that reached none.
    pub polls: AtomicU64,
    pub failed_polls: AtomicU64,
}

/// The counters as `/stats` shows them.
#[derive(Debug, Serialize)]
pub struct InvalidationStats {
    /// Scopes in the ban list (`/stats` and `/metrics` keep their name for it, `rules`).
    pub rules: usize,
    pub issued: u64,
    pub issued_bans: u64,
    pub learned: u64,
    pub swept: u64,
    pub polls: u64,
    pub failed_polls: u64,
    pub pending_publications: usize,
    pub pending_deletes: usize,
}

/// A publication or a delete that did not reach its server yet.
struct Retry<T> {
    what: T,
    /// Servers still to reach (publications), by index.
    servers: Vec<usize>,
    /// After this, it no longer matters (the ban is forgotten).
    until: Instant,
}

#[derive(Default)]
struct Pending {
    /// Records (and whether they are short-lived) not yet on some servers.
    publications: VecDeque<Retry<(Bytes, bool)>>,
    /// Memcached keys of URL entries whose delete did not reach their server.
    deletes: VecDeque<Retry<String>>,
}

/// The invalidation service of one node (see the module docs).
pub struct Invalidator {
    bans: &'static BanList,
    memory: &'static MemoryTier,
    shared: Option<&'static TieredStorage>,
    log: Option<SharedLog>,
    /// This node's configured name, and its process's random instance id.
    name: String,
    instance: u64,
    next_seq: AtomicU64,
    poll_interval: Duration,
    /// The newest record applied, per issuing node (this one's included), for the heartbeat.
    applied: Mutex<HashMap<u64, u64>>,
    pending: Mutex<Pending>,
    pub counters: InvalidationCounters,
}

impl Invalidator {
    /// The service over this node's storage: `memory`, and `shared` when a memcached cluster is
    /// configured (whose log it then reads and writes). Until the first read of the log, the
    /// ban list holds memcached readers back (see [`BanList::wait_ready`]).
    pub fn new(
        config: &InvalidationConfig,
        bans: &'static BanList,
        memory: &'static MemoryTier,
        shared: Option<&'static TieredStorage>,
    ) -> Invalidator {
        let log = shared.map(|tier| {
            bans.expect_catch_up(config.poll_interval);
            SharedLog::new(tier.cluster_handle(), tier.namespace(), bans.retention())
        });
        Invalidator {
            bans,
            memory,
            shared,
            log,
            name: config.node_name.clone(),
            instance: RandomState::new().hash_one(std::process::id()),
            next_seq: AtomicU64::new(1),
            poll_interval: config.poll_interval,
            applied: Mutex::default(),
            pending: Mutex::default(),
            counters: InvalidationCounters::default(),
        }
    }

    /// A leaked, `'static` service, shared by the proxy, the admin API and its background loop.
    pub fn leak(self) -> &'static Invalidator {
        Box::leak(Box::new(self))
    }

    /// This node's name.
    pub fn node_name(&self) -> &str {
        &self.name
    }

    /// How long, at most, a purge takes to reach every node that reads the log: one poll
    /// interval and one read.
    pub fn bound(&self) -> Duration {
        self.poll_interval
            + self
                .shared
                .map_or(Duration::ZERO, |s| s.cluster().op_timeout())
    }

    /// Carries out one purge or ban (see the module docs) and reports on it.
    pub async fn invalidate(&'static self, request: Request) -> Result<Report, Refused> {
        let level = if request.only_if_stored {
            log::Level::Debug
        } else {
            log::Level::Info
        };
        let done = self.carry_out(request).await?;
        let logged = done.logged;
        let report = self.report(done);
        if !logged {
            log_report(level, &report);
        }
        Ok(report)
    }

    /// The invalidation a successful answer to an unsafe method asks for (RFC 9111 §4.4,
    /// `request.only_if_stored`): carried out as [`Self::invalidate`] does, without building a
    /// report no one reads (two per POST); its line is logged at debug level, when asked for.
    pub async fn invalidate_quietly(&'static self, request: Request) -> Result<(), Refused> {
        let done = self.carry_out(request).await?;
        if !done.logged && log::log_enabled!(log::Level::Debug) {
            log_report(log::Level::Debug, &self.report(done));
        }
        Ok(())
    }

    async fn carry_out(&'static self, request: Request) -> Result<Done, Refused> {
        check_target(&request.target)?;
        self.counters.issued.fetch_add(1, Ordering::Relaxed);
        if !matches!(request.target, Target::Url { .. }) {
            self.counters.issued_bans.fetch_add(1, Ordering::Relaxed);
        }
        let issued_ms = ms_after(SystemTime::now());
        let mut record = Record {
            id: self.next_id(),
            issued_ms,
            soft: request.soft,
            // what the delete does not reach stays in memcached: decided below
            short_lived: true,
            target: request.target,
            asked_by: request.asked_by,
        };
        let (touched, banned) = if request.only_if_stored {
            self.apply_if_stored(&record)
        } else {
            (self.apply(&record), true)
        };
        // whether a request sent after this invalidation's answer must not be taken for one
        // sent before it: a ban was entered, or something was being filled (`past_the_stamp`)
        let mut stamp_matters = banned || touched.fill_let_go;
        let mut pending = Vec::new();
        let memcached = match (&self.log, self.shared) {
            (Some(log), Some(shared)) => {
                let mut fill_in_flight = false;
                let delete = self
                    .delete_url_entry(shared, &record, &mut pending, &mut fill_in_flight)
                    .await;
                // (a fill in flight on another node would store what the URL was before: its
                // lease, just deleted, says there is one, and it must learn of this)
                let nothing_stored = touched.removed_nothing()
                    && delete.as_ref().is_some_and(|d| d.outcome == "not_found")
                    && !fill_in_flight;
                stamp_matters |= !nothing_stored;
                if !banned && !nothing_stored {
                    // something of the URL is in memcached, or being filled: banned here too
                    // (and the memory tier searched again, for a copy promoted meanwhile)
                    self.apply(&record);
                }
                if !delete.as_ref().is_some_and(DeleteReport::answered) || fill_in_flight {
                    // entries are left in memcached; or a fill of the URL is in flight on some
                    // node (its lease was there), whose answer, from before this purge, may be
                    // written to memcached after the delete, by a writer that may not live to
                    // judge it again or to publish the purge as kept (`BanList::keep_url_purge`)
                    self.keep_for_retention(&mut record);
                }
                if request.only_if_stored && nothing_stored {
                    log::debug!(
                        "invalidation of {} asked by {}: nothing stored",
                        record.target.describe(),
                        record.asked_by
                    );
                    return Ok(Done {
                        record,
                        touched,
                        memcached: None,
                        nodes: None,
                        pending,
                        logged: true,
                    });
                }
                let servers: Vec<usize> = (0..log.server_count()).collect();
                let bytes = record.encode();
                let published = log
                    .publish(&bytes, record.short_lived, &servers, issued_ms)
                    .await;
                let missed = not_in(&servers, &published);
                for &index in &missed {
                    pending.push(format!("publication to {}", log.server_name(index)));
                }
                if !missed.is_empty() {
                    let mut what = (bytes, record.short_lived);
                    let mut to = missed.clone();
                    if record.short_lived {
                        // Late, a short-lived ban could be learned after a fill begun before it
                        // was written back to memcached and judged valid by its writer
                        // (`TieredStorage::judge_written` waits only so long): kept for the
                        // whole retention instead, here and, republished, on every server.
                        self.keep_for_retention(&mut record);
                        what = (record.encode(), false);
                        to = servers.clone();
                    }
                    self.retry_later(|p| &mut p.publications, what, to);
                }
                let names = |list: &[usize]| -> Vec<String> {
                    list.iter()
                        .map(|i| log.server_name(*i).to_string())
                        .collect()
                };
                Some(MemcachedReport {
                    servers: servers.len(),
                    published_to: names(&published),
                    not_published_to: names(&missed),
                    delete,
                })
            }
            _ => None,
        };
        let nodes = match (&self.log, &memcached) {
            (Some(log), Some(m)) if request.wait && !m.published_to.is_empty() => {
                Some(self.await_nodes(log, record.id).await)
            }
            _ => None,
        };
        if stamp_matters {
            past_the_stamp(record.issued_ms).await;
        }
        Ok(Done {
            record,
            touched,
            memcached,
            nodes,
            pending,
            logged: false,
        })
    }

    fn report(&self, done: Done) -> Report {
        let Done {
            record,
            touched,
            memcached,
            nodes,
            pending,
            logged: _,
        } = done;
        let complete =
            pending.is_empty() && nodes.as_ref().is_none_or(|n| n.not_confirmed.is_empty());
        Report {
            id: format!("{:016x}-{}", record.id.issuer, record.id.seq),
            action: match record.target {
                Target::Url { .. } => "purge",
                _ => "ban",
            },
            soft: record.soft,
            target: record.target,
            asked_by: record.asked_by,
            this_node: ThisNode {
                name: self.name.clone(),
                objects: touched.objects,
                variants: touched.variants,
            },
            memcached,
            nodes,
            pending,
            complete,
        }
    }

    /// Records `record` in the ban list and applies it to this node's memory tier.
    fn apply(&self, record: &Record) -> Touched {
        let scope = record.target.scope();
        self.bans
            .add(&scope, record.issued_ms, record.soft, record.short_lived);
        self.note_applied(record.id);
        self.memory
            .invalidate(&scope, at(record.issued_ms), record.soft)
    }

    /// [`Self::apply`] for a purge only worth making if something is stored (an unsafe
    /// method's, `only_if_stored`): a hard purge of a URL with nothing of it stored here leaves
    /// no ban, only its mark ([`BanList::mark_unsafe_purge`]), which refuses what a fetch sent
    /// before it would store; every POST to a new URL kept a ban of ~100 bytes for five
    /// minutes. Marked before the memory tier is searched, so a fill that stores meanwhile is
    /// either found there or refused by the mark. Returns what was touched and whether it was
    /// banned.
    fn apply_if_stored(&self, record: &Record) -> (Touched, bool) {
        let scope = record.target.scope();
        let (Scope::Url(primary), false) = (&scope, record.soft) else {
            return (self.apply(record), true);
        };
        self.bans.mark_unsafe_purge(*primary, record.issued_ms);
        let touched = self.memory.invalidate(&scope, at(record.issued_ms), false);
        if touched.removed_nothing() {
            return (touched, false);
        }
        // banned, and searched again: a copy promoted from memcached between the search and
        // the ban was judged without either
        let again = self.apply(record);
        let touched = Touched {
            objects: touched.objects + again.objects,
            variants: touched.variants + again.variants,
            fill_let_go: touched.fill_let_go || again.fill_let_go,
        };
        (touched, true)
    }

    fn note_applied(&self, id: RecordId) {
        let mut applied = self.applied.lock();
        let seq = applied.entry(id.issuer).or_default();
        *seq = (*seq).max(id.seq);
    }

    /// A hard purge of a URL deletes its entry in memcached; a delete that did not reach the
    /// server is retried (the ban keeps the entry from being served meanwhile). The URL's fill
    /// lease is deleted too; `fill_in_flight` tells whether there was one.
    async fn delete_url_entry(
        &self,
        shared: &TieredStorage,
        record: &Record,
        pending: &mut Vec<String>,
        fill_in_flight: &mut bool,
    ) -> Option<DeleteReport> {
        let Target::Url { host, path } = &record.target else {
            return None;
        };
        if record.soft {
            return None;
        }
        let key = crate::proxy::cache_key::of_url(host, path);
        let mc_key = shared.memcached_key(&key);
        let ((server, outcome), lease_found) = tokio::join!(
            shared.delete_shared(&mc_key),
            shared.fill_leases().on_purge(&key)
        );
        *fill_in_flight = lease_found;
        let delete = DeleteReport::new(server, outcome);
        if !delete.answered() {
            pending.push(format!(
                "delete on {}",
                delete.server.as_deref().unwrap_or("its server")
            ));
            self.retry_later(|p| &mut p.deletes, mc_key, Vec::new());
        }
        Some(delete)
    }

    /// The id of the next record this node issues.
    fn next_id(&self) -> RecordId {
        RecordId {
            issuer: self.instance,
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// `record`'s ban is kept for the whole retention, not
    /// [`SHORT_RETENTION`](crate::storage::ban_list::SHORT_RETENTION): here at once,
    /// and on every node that reads it as published from now on.
    fn keep_for_retention(&self, record: &mut Record) {
        record.short_lived = false;
        self.bans
            .add(&record.target.scope(), record.issued_ms, record.soft, false);
    }

    fn retry_later<T>(
        &self,
        queue: impl FnOnce(&mut Pending) -> &mut VecDeque<Retry<T>>,
        what: T,
        servers: Vec<usize>,
    ) {
        let mut pending = self.pending.lock();
        let queue = queue(&mut pending);
        if queue.len() >= MAX_PENDING {
            queue.pop_front();
            log::warn!(
                "invalidation: more than {MAX_PENDING} retries pending, the oldest given up"
            );
        }
        queue.push_back(Retry {
            what,
            servers,
            until: Instant::now() + self.bans.retention(),
        });
    }

    /// Waits until every live node's heartbeat shows `id` applied (at most three bounds, and at
    /// least [`MIN_WAIT`]); reports who did and who did not. A heartbeat claiming a record of
    /// this node newer than any it issued confirms nothing (a planted record's sequence).
    async fn await_nodes(&self, log: &SharedLog, id: RecordId) -> NodesReport {
        let deadline = Instant::now() + (self.bound() * 3).max(MIN_WAIT);
        let mut warned = false;
        loop {
            let beats = log.heartbeats().await;
            let (mut reached, mut not_confirmed) = (Vec::new(), Vec::new());
            // the newest sequence this node has issued: a node claiming more applied a record
            // under this node's id that this node never wrote (anyone who can write to memcached
            // can plant one, and the CRC is no signature), so its claim confirms nothing
            let issued = self.next_seq.load(Ordering::Relaxed).saturating_sub(1);
            for (instance, beat) in &beats {
                if *instance == self.instance {
                    continue;
                }
                match beat.applied.get(&id.issuer) {
                    Some(&seq) if seq >= id.seq && seq <= issued => {
                        reached.push(beat.name.clone());
                    }
                    Some(&seq) if seq > issued => {
                        if !std::mem::replace(&mut warned, true) {
                            log::warn!(
                            "invalidation: node {} says it applied record {seq} of this node,                              which has issued {issued}: a record under this node's id was                              planted in the log; its confirmations are not taken",
                            beat.name
                            );
                        }
                        not_confirmed.push(beat.name.clone());
                    }
                    _ => not_confirmed.push(beat.name.clone()),
                }
            }
            if not_confirmed.is_empty() || Instant::now() >= deadline {
                reached.sort();
                not_confirmed.sort();
                return NodesReport {
                    reached,
                    not_confirmed,
                };
            }
            tokio::time::sleep((self.poll_interval / 4).max(Duration::from_millis(5))).await;
        }
    }

    /// One read of the log: applies what other nodes published since the last one.
    async fn poll(&self, log: &SharedLog) {
        let started = Instant::now();
        let began_ms = ms_after(SystemTime::now());
        // (which also lists this node again where a server lost it)
        let (records, answered) = log.read_new(began_ms, self.instance).await;
        log::trace!(
            "invalidation: log read in {:?}: {} records from {} servers",
            started.elapsed(),
            records.len(),
            answered.len()
        );
        let read = !answered.is_empty() || log.server_count() == 0;
        if read {
            self.counters.polls.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.failed_polls.fetch_add(1, Ordering::Relaxed);
        }
        let latest_trusted_ms = began_ms + CLOCK_SKEW_ALLOWED.as_millis() as u64;
        for record in records {
            if record.id.issuer == self.instance {
                continue;
            }
            if record.issued_ms > latest_trusted_ms {
                // dated ahead of every node's clock (planted by whoever else can write to
                // memcached): applied, it would refuse every fill until its date and be kept
                // until then, so the node would cache nothing; refused, as entries dated ahead are
                log::debug!(
                    "invalidation {:016x}-{}: dated {} ms ahead, refused",
                    record.id.issuer,
                    record.id.seq,
                    record.issued_ms - began_ms
                );
                continue;
            }
            let scope = record.target.scope();
            self.note_applied(record.id);
            if !self
                .bans
                .add(&scope, record.issued_ms, record.soft, record.short_lived)
            {
                continue;
            }
            self.counters.learned.fetch_add(1, Ordering::Relaxed);
            let touched = self
                .memory
                .invalidate(&scope, at(record.issued_ms), record.soft);
            let swept = touched.objects + touched.variants;
            self.counters
                .swept
                .fetch_add(swept as u64, Ordering::Relaxed);
            log::debug!(
                "invalidation {:016x}-{}: {}{} asked by {} applied here ({swept} objects)",
                record.id.issuer,
                record.id.seq,
                if record.soft { "soft " } else { "" },
                record.target.describe(),
                record.asked_by
            );
        }
        if read {
            // what a write that landed before this read began must be judged by is known now
            // (`TieredStorage` waits for it, see `storage::tiered`)
            self.bans.log_read(began_ms);
        }
    }

    /// Retries publications and deletes that did not reach their server; drops the ones that
    /// no longer matter.
    async fn retry_pending(&self, log: &SharedLog, shared: &TieredStorage) {
        let now = Instant::now();
        let (publications, deletes) = {
            let mut pending = self.pending.lock();
            pending.publications.retain(|r| r.until > now);
            pending.deletes.retain(|r| r.until > now);
            (
                std::mem::take(&mut pending.publications),
                std::mem::take(&mut pending.deletes),
            )
        };
        let now_ms = ms_after(SystemTime::now());
        let mut still = Pending::default();
        for mut retry in publications {
            let usable: Vec<usize> = retry
                .servers
                .iter()
                .copied()
                .filter(|i| log.is_usable(*i))
                .collect();
            if !usable.is_empty() {
                let (bytes, short_lived) = &retry.what;
                let stored = log.publish(bytes, *short_lived, &usable, now_ms).await;
                retry.servers.retain(|i| !stored.contains(i));
            }
            if !retry.servers.is_empty() {
                still.publications.push_back(retry);
            }
        }
        for retry in deletes {
            let (_, outcome) = shared.delete_shared(&retry.what).await;
            if !DeleteReport::new(None, outcome).answered() {
                still.deletes.push_back(retry);
            }
        }
        let mut pending = self.pending.lock();
        // anything queued while this ran stays too
        still.publications.extend(pending.publications.drain(..));
        still.deletes.extend(pending.deletes.drain(..));
        *pending = still;
    }

    /// Publishes again, kept for the whole retention, the purges this node's writes made it keep
    /// ([`BanList::keep_url_purge`]: an entry written after one could not be deleted), so that
    /// every node keeps them as long as the entry may stay in memcached; a server missed is
    /// retried as any publication. Called as soon as one is kept ([`BanList::purge_kept`]), not
    /// at the next log read: until it is published the keep lives in this node's memory only,
    /// and dies with it.
    async fn publish_kept_purges(&self, log: &SharedLog) {
        let kept = self.bans.take_kept_purges();
        if kept.is_empty() {
            return;
        }
        let servers: Vec<usize> = (0..log.server_count()).collect();
        for purge in kept {
            let (host, path) = purge.host_and_path();
            let record = Record {
                id: self.next_id(),
                issued_ms: purge.issued_ms,
                soft: false,
                short_lived: false,
                target: Target::Url {
                    host: host.to_string(),
                    path: path.to_string(),
                },
                asked_by: format!(
                    "{} (kept: an entry written after it could not be deleted)",
                    self.name
                ),
            };
            log::info!(
                "invalidation: the purge of {} is kept for the whole retention",
                record.target.describe()
            );
            let bytes = record.encode();
            let now_ms = ms_after(SystemTime::now());
            let published = log.publish(&bytes, false, &servers, now_ms).await;
            let missed = not_in(&servers, &published);
            if !missed.is_empty() {
                self.retry_later(|p| &mut p.publications, (bytes, false), missed);
            }
        }
    }

    /// What this node's invalidation holds and has done, for `/stats`.
    pub fn stats(&self) -> InvalidationStats {
        let pending = self.pending.lock();
        let c = &self.counters;
        InvalidationStats {
            rules: self.bans.len(),
            issued: c.issued.load(Ordering::Relaxed),
            issued_bans: c.issued_bans.load(Ordering::Relaxed),
            learned: c.learned.load(Ordering::Relaxed),
            swept: c.swept.load(Ordering::Relaxed),
            polls: c.polls.load(Ordering::Relaxed),
            failed_polls: c.failed_polls.load(Ordering::Relaxed),
            pending_publications: pending.publications.len(),
            pending_deletes: pending.deletes.len(),
        }
    }

    /// The background loop: read the log every `poll_interval` (the first read is the
    /// catch-up), retry what is pending, write the heartbeat; tidy up every 30 s. A shutdown
    /// does not stop it: a draining node keeps applying purges until the process exits (its
    /// fills in flight are judged by them when stored, and its writes once they land, see
    /// `TieredStorage::judge_written`), and the drain ends the process.
    async fn run(&'static self, _shutdown: ShutdownWatch) {
        let mut ticker = tokio::time::interval(self.poll_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tidied = Instant::now();
        let mut first = true;
        loop {
            // Not stopped by a shutdown: a draining node keeps applying purges (its fills in
            // flight are judged by them when stored, and its writes after they land, see
            // `TieredStorage::judge_written`) until the process exits.
            tokio::select! {
                _ = ticker.tick() => {}
                () = self.bans.purge_kept(), if self.log.is_some() => {
                    if let Some(log) = &self.log {
                        self.publish_kept_purges(log).await;
                    }
                    continue;
                }
            }
            if let (Some(log), Some(shared)) = (&self.log, self.shared) {
                let started = Instant::now();
                self.poll(log).await;
                if first {
                    self.bans.caught_up();
                    first = false;
                    log::info!(
                        "invalidation: read the cluster's log in {:?}: {} rules known",
                        started.elapsed(),
                        self.bans.len()
                    );
                }
                self.retry_pending(log, shared).await;
                self.publish_kept_purges(log).await;
                let beat = Heartbeat {
                    name: self.name.clone(),
                    applied: self.applied.lock().clone(),
                };
                let ttl = (self.poll_interval * 4).max(Duration::from_secs(2));
                log.heartbeat(self.instance, &beat, ttl).await;
            }
            if tidied.elapsed() >= HOUSEKEEPING {
                self.bans.prune(SystemTime::now());
                tidied = Instant::now();
            }
        }
    }
}

/// The servers of `servers` a publication did not reach (`published`).
fn not_in(servers: &[usize], published: &[usize]) -> Vec<usize> {
    servers
        .iter()
        .copied()
        .filter(|i| !published.contains(i))
        .collect()
}

/// Refuses targets the log cannot carry or that name nothing (`Invalidator::invalidate` checks
/// each; a caller with several checks them all first).
pub fn check_target(target: &Target) -> Result<(), Refused> {
    // the texts in an array, not a `Vec`: every POST checks two targets, and an allocation
    // each cost it about 100 instructions (`docs/benchmarks.md`, 2026-12-07)
    let texts: [&str; 2] = match target {
        Target::Url { host, path } => [host, path],
        Target::Tag(tag) => [tag, ""],
        Target::Host(host) => [host, ""],
        Target::Prefix { host, prefix } => [host.as_deref().unwrap_or(""), prefix],
    };
    if texts.iter().any(|t| t.len() > MAX_TARGET_TEXT) {
        return Err(Refused(format!(
            "a target longer than {MAX_TARGET_TEXT} bytes"
        )));
    }
    if let Some(problem) = target.host_problem() {
        return Err(Refused(problem));
    }
    match target {
        Target::Tag(tag)
            if tag.is_empty() || tag.contains(|c: char| c.is_ascii_whitespace() || c == ',') =>
        {
            Err(Refused(
                "a tag must be one non-empty word (no spaces or commas)".into(),
            ))
        }
        Target::Prefix { prefix, .. } if !prefix.starts_with('/') => {
            Err(Refused("a path prefix must start with '/'".into()))
        }
        Target::Url { path, .. } if !path.starts_with('/') => {
            Err(Refused("a URL's path must start with '/'".into()))
        }
        _ => Ok(()),
    }
}

/// The background loop as a Pingora service.
pub struct InvalidationService(pub &'static Invalidator);

#[async_trait::async_trait]
impl BackgroundService for InvalidationService {
    async fn start(&self, shutdown: ShutdownWatch) {
        self.0.run(shutdown).await;
    }
}
