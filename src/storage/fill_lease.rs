//! Fill coalescing across nodes: one origin fetch per URL for the whole cluster.
//!
//! Pingora's cache lock coalesces the misses of one process: the first request fetches, the others
//! wait and are woken as the fill lands. This module is its cross-node counterpart, through the
//! memcached cluster every node shares:
//!
//! * **Claim**: for a URL memcached does not have, the first node to `add` the URL's lease key
//!   (`{namespace}:fill:{primary hash}`) fetches it from the origin (`FillClaim::Ours`). The
//!   lease's value is its time (of the claim, then of the last renewal: ms since the Unix
//!   epoch) and its claim's holder, `{ms} {holder:016x}`: a number random per process and one
//!   more per claim, so a node tells its own claim's lease from one another claim made after
//!   its own was lost ([`Claim`]). The `add` also returns the CAS token memcached gave the
//!   lease (in the same round trip), for the release. (A lease of an earlier version carries
//!   its time alone: it is waited for as any, and never taken for this node's claim; such a
//!   version reads this one's leases as of unknown time, and waits for them their whole length.)
//!   Requests on the claiming node itself take the standard path, where Pingora's cache lock
//!   coalesces them (`FillClaim::ThisNode`); one claim per URL is out per node at a time. A miss
//!   the fast path declined (a `Range`, a validator) claims on the standard path, before it goes
//!   to the origin ([`FillLeases::claim_for_miss`]), and waits for no one; when another node's
//!   claim holds the lease, its fill serves the requests reading it and is refused when it
//!   finishes, as that claim's lease guards it only while it stands ([`MissClaim::Elsewhere`]).
//! * **Placement**: the lease lives on the server that holds the URL's entry (placed by the
//!   entry's key, not its own), so the lease is reachable exactly when the entry is: a dead
//!   server takes both with it, and nobody waits for a fill that could not be stored.
//! * **Wait**: requests on the other nodes look for the holder's fill every 10 ms, where the
//!   caller says (the fast path: this node's memory tier, then memcached), and are served by it
//!   ([`FillLeases::on_shared_miss`]). A wait that ends without the fill (the lease released by
//!   a fill that stored nothing, or run out) claims the URL once more, and the request fetches
//!   under that claim (or waits for the claim another node made first), not unguarded: a POST
//!   through another node while it fetched would find no lease and be published to no one. A
//!   lease found again after it was waited out whole (a claim that landed after its fill ended,
//!   a node that died mid-fill) is taken over: swapped in place for this request's claim, by
//!   the CAS token read with it ([`FillLeases::take_over`]), so the URL is never without a lease
//!   in between; fetching beside it, the request was guarded by nothing once memcached expired
//!   it. A request that has waited as long as it may (two leases) claims once more before it
//!   fetches; finding another claim's lease still (a fill slower than two leases, or a stray
//!   lease a server without CAS tokens could not swap), it fetches under that lease, and its
//!   fill is kept only if the lease still names the same holder when the fill finishes
//!   ([`AfterSharedMiss::UnderAnotherClaim`]): a POST while it stood found it and published
//!   itself, and one after it went (the other fill failed and released it, or memcached expired
//!   it) may have been published to no one. (A lease of an earlier version names no holder: the
//!   fill is kept while such a lease stands, [`LeaseHolder::Unnamed`].) Such a fill, and the
//!   refused one of a declined miss above, is joined by this node's later requests only while
//!   the lease it went out under stands (`storage::guarded_fills`); and once kept, its write
//!   leaves that lease to its claim.
//! * **Release**: a fill that stored nothing (uncacheable, or the fetch failed) deletes the lease
//!   when its request ends ([`HeldLease::on_request_end`]), and so does a fill whose write to
//!   memcached failed ([`FillLeases::on_write_failed`]), or that admission or a ban refused
//!   when it was stored (the same call, as nothing is written), so the waiters fetch for
//!   themselves at once instead of being held behind a fill they will never see. A stored fill deletes the
//!   lease once its entry is written ([`FillLeases::on_written`]); a waiter that finds the
//!   lease gone looks for the entry once more before it fetches for itself. Each of these, and
//!   the deletes of a draining node below, deletes the lease only if it is still its claim's: by the token the claim's `add` was
//!   given (`md <key> C<token>`, atomic in memcached and one round trip, as a plain delete
//!   was), and when that token is stale (the lease was renewed) or refused, by the token of a
//!   `gets` whose value names this claim ([`FillLeases::release`]). Another claim's lease is
//!   left alone. A server restarted empty counts its tokens from 1 again, so another claim's
//!   lease may carry the number this claim was given before the restart: a token carries the
//!   run of the server that gave it, and is never sent to another run
//!   ([`lacquer_memcached::cas_token`]; the release then reads the holder, as for a stale
//!   token). (Until 2026-12-06 it was sent, and deleted the other claim's lease; the fill from
//!   before a POST was kept.) A server run without CAS tokens
//!   (`-C`) gives every value the token 0, which names no value (`md <key> C0` deletes any):
//!   a claim given 0 is released by its holder, as a renewed one, and such a server's lease,
//!   whose `cas` it always refuses, is renewed by a `replace` once read as this claim's. A fill written by a node that
//!   held no claim for it (uncoordinated, or a waiter that fetched for itself) deletes whatever
//!   lease is there, as before, so that the nodes waiting on it look for the entry; but one
//!   fetched under another claim's lease and kept while it stood
//!   ([`FetchedUnderAnotherClaim::KeptWhileHeldBy`]) leaves that lease to its claim (deleting
//!   it cost that claim its fill, taken for lost at its next renewal).
//! * **Bounds**: memcached failing is never waited on. When the URL's server is ejected or its
//!   last operation failed (the miss that brought the request here may have been a timeout), no
//!   lease is claimed or waited for, and a wait ends as soon as one of its looks fails: a dead
//!   or frozen server costs a request at most one `op_timeout`. Every wait also ends when the
//!   lease would have expired, counted from the holder's claim (or renewal) time written in the lease (so
//!   an `add` that a frozen server applies only when it thaws holds nobody up), and the lease
//!   expires on its own after `fill_lease` (default 3 s), so a node that dies mid-fill holds
//!   the others up for at most that long. A node whose drain `shutdown_timeout` cuts holds
//!   nobody up: it deletes the leases of the fills it cuts before it exits
//!   ([`FillLeases::release_held`]).
//! * **Renewal**: while its fill lasts, the holder renews the lease every third of `fill_lease`
//!   (one task per process, [`FillLeases::keep_alive`], renews the leases held longer than
//!   that: a fill that ends sooner costs nothing more): it reads the lease with its CAS token
//!   (`gets`) and, if the lease names this claim as its holder, rewrites its time with a
//!   compare-and-swap (`cas`), two round trips per renewal.
//!   So a fill slower than `fill_lease` is still seen in flight: an unsafe method's
//!   invalidation on any node deletes the lease and, having found one, publishes itself to the
//!   cluster ([`FillLeases::on_purge`]); without the renewal a POST in the fourth second of a
//!   slow fill would reach no one, and the fill would store the page as it was before. And
//!   requests arriving after `fill_lease` still wait for that fill (each at most `fill_lease`
//!   from the renewal it read) instead of fetching once per node. A `cas` never brings back a
//!   lease a purge deleted, nor overwrites another claim's: a renewal that finds the lease gone
//!   or naming another holder, or whose `cas` finds it written since its read and a second read
//!   does not find it still this claim's, stops (the lease is lost, below); one whose server did
//!   not answer is tried again at the next tick, and the renewal ends with its request, or as
//!   soon as the answer is known not to be stored ([`HeldLease::on_not_stored`]). (It was a
//!   `replace` of whatever lease was there: a lease lost and claimed by another node before the
//!   next renewal was overwritten with this node's time, and the loss went unnoticed.)
//! * **Loss**: a lease can also go without a purge: its server restarted empty, evicted it, or
//!   it expired while its server did not answer the renewals. An unsafe method's invalidation
//!   that came meanwhile found neither an entry nor a lease, and was not published (see
//!   `invalidation::Invalidator::carry_out`), so nothing would ever judge the fill by it: its
//!   answer may be from before a POST that no node heard of; and another node may have claimed
//!   the URL since and be fetching it too. So a fill whose lease is found gone, or another
//!   claim's, by anything but this node's own release (a renewal, or the delete after its entry
//!   was written, found no lease, or one naming another holder; or that delete could not
//!   confirm it) is not kept: this node applies a purge of the URL to itself, unpublished, as of
//!   that moment ([`FillLeases::lost`]). The fill is refused when it is stored, a copy already
//!   stored is removed, and its write to memcached, judged after it lands, is deleted
//!   (`TieredStorage::judge_written`). The lease is not recreated (with an `add`): that would
//!   not undo the gap, and waiters would wait for a fill that will not be stored; the next miss
//!   anywhere claims it again. Nor is it deleted when the fill ends: it may be another node's
//!   claim by then, whose lease stays that claim's. (A purge that deleted the lease looks the
//!   same and costs the same: the fill is refused, as the purge, published, refuses it
//!   anyway.)
//!
//! * **An unanswered claim**: an `add` memcached does not answer within `op_timeout` (or whose
//!   connection fails) may still land later, naming this claim, or may never land. Either way
//!   the lease did not guard the fill from its start: an unsafe method's invalidation through
//!   another node before the `add` lands finds no lease and is published to no one. So the
//!   request fetches (its waiters have nowhere else to go), holding the URL here by a claim
//!   marked unanswered ([`Claim::unanswered`]): not renewed, its fill refused when it finishes
//!   ([`FillLeases::on_unguarded_fill`]: not stored here, not written to memcached), and its
//!   lease, if it landed, released by the holder it names, so the nodes that found it and wait
//!   fetch for themselves. (It was fetched uncoordinated and kept: a POST meanwhile was undone
//!   on every node, `tests/fill_lease_attacks.rs`.) Requests that coalesced behind the refused
//!   fill here and fill finishing while it is marked refused are refused too
//!   ([`FillLeases::unguarded`]); a request of the URL that comes once the fill is over claims
//!   the URL anew, as does one that coalesced behind it and then goes to the origin itself
//!   ([`AfterSharedMiss::BehindThisNode`], [`FillLeases::claim_for_miss`]): until 2026-12-06
//!   they fetched with no claim while the claiming request lasted (its client may read for
//!   minutes), and one finishing after it was kept over a POST through another node
//!   meanwhile, `tests/unanswered_claim_attacks.rs`. Counted
//!   `fills_unguarded`, as is a fill whose server was failing before any claim was asked, which
//!   is kept: a POST through another node that finds that server failing too publishes itself
//!   (one that reaches it while this node cannot, a partition, is not judged against this
//!   node's copy, which lasts `local_ttl`).
//!
//! `fill_lease = 0` switches coordination off (`FillClaim::Uncoordinated`); so does the URL's
//! server failing when the claim would be asked.

use super::ban_list::scope::Scope;
use super::ban_list::{at, ms_after, BanList};
use super::memory::MemoryTier;
use super::shared_counters::SharedCounters;
use super::tiered::namespaced_hex;
use bytes::Bytes;
use lacquer_memcached::{usable_cas_token, CasOutcome, CasToken, Cluster};
use parking_lot::Mutex;
use pingora_cache::key::{CacheHashKey, HashBinary};
use pingora_cache::CacheKey;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often a request waiting for another node's fill looks for it.
const FILL_POLL: Duration = Duration::from_millis(10);

/// Who fills a URL nobody has stored yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FillClaim {
    /// This node: it took the lease, with this claim.
    Ours(Claim),
    /// Another node holds the lease and is fetching it now.
    Theirs,
    /// Nobody coordinates: leases are off or memcached could not be asked. Fill here.
    Uncoordinated,
    /// A request on this node holds the lease: Pingora's cache lock coalesces the rest here, and
    /// wakes them the moment the fill lands.
    ThisNode,
}

/// What a waiting request saw when it looked for the fill (see [`FillLeases::on_shared_miss`]).
pub enum Sighting<T> {
    /// The fill is there and can be served.
    Arrived(T),
    /// Nothing is there yet.
    NotYet,
    /// Something is there that the caller cannot serve itself (stale, another variant, ...): the
    /// standard path must decide.
    Elsewhere,
}

/// What a request whose URL memcached does not have does next.
pub enum AfterSharedMiss<T> {
    /// Another node (or a request on this one) filled it while this request waited: serve it.
    Filled(T),
    /// Fetch it on the standard path. `lease`: this request holds the cluster's lease and must
    /// end it ([`HeldLease::on_request_end`]). `known_missing`: memcached still has nothing under
    /// the URL, so the standard path need not ask it again.
    FillHere {
        lease: Option<HeldLease>,
        known_missing: bool,
    },
    /// Another request on this node holds the cluster's lease: fetch on the standard path, where
    /// Pingora's cache lock coalesces this request behind that one's fill. Memcached still has
    /// nothing under the URL. Should this request go to the origin itself all the same (that
    /// fill stored nothing, or was refused), it claims the lease first
    /// ([`FillLeases::claim_for_miss`]): the other request's claim may guard nothing by then.
    BehindThisNode,
    /// This request waited as long as it may (two leases) and another claim's lease, naming
    /// `holder` (or, of an earlier version, no one), still holds the URL (a fill slower than two leases, or a stray lease that could
    /// not be taken over): fetch on the standard path, where Pingora's cache lock coalesces this
    /// node's other requests behind it, and keep the fill only if the lease still names `holder`
    /// when the fill finishes ([`FetchedUnderAnotherClaim::KeptWhileHeldBy`]). Memcached still
    /// has nothing under the URL. (Refusing such a fill outright, tried 2026-12-07, made a crowd
    /// on a node fetch once per request; keeping it always undid a POST made after that lease
    /// went, `tests/guarded_elsewhere_attacks.rs`.)
    UnderAnotherClaim { holder: LeaseHolder },
}

/// Whose claim a URL's fill lease names, as read by a request that fetches under it
/// ([`FetchedUnderAnotherClaim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseHolder {
    /// No lease: gone by the time it was read (or its server did not answer), or none was
    /// claimed (a URL remembered uncacheable). Holds nothing.
    Nobody,
    /// A lease of an earlier version, which carries its time alone. A fill under it is kept,
    /// and joined, while such a lease stands (before 2026-12-07 every fill under it was kept:
    /// refusing them all made a crowd on a node fetch again and again during a rolling upgrade,
    /// `kept_while_held_breaks::a_crowd_under_a_live_lease_of_an_earlier_version_...`); whose it
    /// is, no one can tell.
    Unnamed,
    /// The claim of this holder ([`Claim`]).
    Claim(u64),
}

impl<T> AfterSharedMiss<T> {
    fn fill_here(known_missing: bool) -> Self {
        AfterSharedMiss::FillHere {
            lease: None,
            known_missing,
        }
    }
}

/// How a wait for another node's fill ended ([`FillLeases::wait_for_theirs`]).
enum Waited<T> {
    /// With what the request does next: serve the fill, leave it to the standard path, or
    /// fetch for itself (the URL's server failing).
    Over(AfterSharedMiss<T>),
    /// Without the fill, the lease gone or run out and the server answering: the request may
    /// claim the URL itself. With the lease it waited on, as read when the wait began.
    Ended(Option<Bytes>),
    /// The lease an earlier wait of this request waited out whole was found again, as read
    /// here: the request takes it over ([`FillLeases::take_over`]).
    Stale(Bytes),
}

/// How a claim takes the URL's lease ([`FillLeases::claim_by`]).
#[derive(Clone, Copy)]
enum Taking<'a> {
    /// By `add`: the URL has no lease, as far as this request knows.
    Anew,
    /// Over this lease, which the request waited out whole and found again
    /// ([`FillLeases::take_over`]).
    Over(&'a Bytes),
}

/// What memcached said to a claim ([`FillLeases::claim_by`]).
enum Taken {
    /// The lease is this claim's, with the CAS token it was given (none after a swap: its
    /// release reads the lease first, as a renewed one's does).
    Claimed(Option<CasToken>),
    /// Another claim holds it (or a stray lease a server without CAS tokens cannot swap).
    Held,
    /// The `add` (or swap) went unanswered: it may land later ([`Claim::unanswered`]).
    Unanswered,
    /// The lease could not be taken over (its server did not answer the read, or it kept
    /// changing): the request fetches uncoordinated.
    GaveUp,
}

/// The cluster's fill leases, as seen from this node.
pub struct FillLeases {
    cluster: Arc<Cluster>,
    namespace: String,
    /// How long a lease lasts; zero means fills are not coordinated across nodes.
    lease: Duration,
    /// Primary keys whose lease a request on this node is claiming or holds, and (for a lease's
    /// length, until no write still to come can carry their claims) those whose claim's fill
    /// is stored and being written, or was: one entry per fill of the last `fill_lease`,
    /// swept by [`FillLeases::keep_alive`].
    local_fills: Mutex<HashMap<HashBinary, LocalFill>>,
    /// Primary keys with requests of this node fetching beside a claim another request here
    /// holds (how many: [`BesideThisNode`]).
    beside: Mutex<HashMap<HashBinary, usize>>,
    /// Whether the task that keeps held leases alive ([`FillLeases::keep_alive`]) is running.
    renewing: AtomicBool,
    /// The holder of this process's next claim ([`Claim`]): random at start, then one more per
    /// claim, so no two claims anywhere in the cluster are alike (but by a 64-bit chance).
    next_holder: AtomicU64,
    /// `fills_claimed` and `fills_awaited` are counted here.
    counters: Arc<SharedCounters>,
    /// Where a fill whose lease was lost is refused ([`FillLeases::lost`]): this node's bans,
    /// and its memory tier.
    bans: &'static BanList,
    memory: &'static MemoryTier,
}

/// The lease a request holds on its URL's fill, until its request ends. (Boxed: the request
/// context that carries it is built and moved for every request, and few hold one.)
pub struct HeldLease(Option<Box<Held>>);

/// A lease dropped without being ended (its request's task panicked, say) is ended as a fill
/// that stored nothing: otherwise its URL would stay marked held on this node, renewed for
/// ever, and every later request here would queue for a fill that is over.
impl Drop for HeldLease {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            (*held).end(false);
        }
    }
}

struct Held {
    leases: &'static FillLeases,
    primary: HashBinary,
    /// The claim as it was made (its renewals are in `local_fills`).
    claim: Claim,
    lease_key: String,
    /// The key of the URL's entry, by which the lease is placed.
    entry_key: String,
}

/// What a miss about to go to the origin got when it claimed the URL's lease
/// ([`FillLeases::claim_for_miss`]).
pub enum MissClaim {
    /// The request holds the lease: its fill is the lease's.
    Held(HeldLease),
    /// Another node's claim holds it: the fetch is guarded only while that claim stands, so its
    /// fill is served to the requests that read it and refused when it finishes
    /// ([`FetchedUnderAnotherClaim`]), and joined by later ones only while that lease stands
    /// (`storage::guarded_fills`). The caller that needs the claim's holder for that reads it
    /// ([`FillLeases::holder_now`]): a request already fetching under that claim does not.
    Elsewhere,
    /// Another request on this node holds the lease: the fetch follows that claim, and is kept
    /// unless the claim's fill stores nothing: the lease then goes while this fetch may be out,
    /// so the claim's end refuses fills of the URL sent before it ([`FillLeases::purged_here`]).
    /// Not refused outright (tried 2026-12-07): that cost a fetch to each request queued behind
    /// it on this node's cache lock, the lease's holder among them when it came second to the
    /// lock, and to a second variant of a `Vary` URL fetched beside another's fill. Held until
    /// the request ends.
    BesideThisNode(BesideThisNode),
    /// Nothing was claimed (leases off, or the URL's server failing): an uncoordinated fill,
    /// kept as any is.
    Unclaimed,
}

/// A request of this node fetching beside a claim another request here holds
/// ([`MissClaim::BesideThisNode`]), counted in [`FillLeases`] while it lasts: that claim's end,
/// when its fill stored nothing, then refuses the fills of the URL sent before it.
pub struct BesideThisNode {
    leases: &'static FillLeases,
    primary: HashBinary,
}

impl Drop for BesideThisNode {
    fn drop(&mut self) {
        let mut beside = self.leases.beside.lock();
        if let Some(count) = beside.get_mut(&self.primary) {
            *count -= 1;
            if *count == 0 {
                beside.remove(&self.primary);
            }
        }
    }
}

/// Marks, in a storable answer's `CacheMeta` extensions, a fill fetched while another claim held
/// the URL's lease: the tiered store refuses it when it finishes (not stored here, not written to
/// memcached, no lease touched), after every request reading it has been served, or, for
/// [`Self::KeptWhileHeldBy`], unless that claim's lease still stands. Refused at the end rather
/// than judged uncacheable at the start: an uncacheable answer releases the requests coalesced
/// behind it on this node to fetch for themselves (a stampede, tried and reverted 2026-12-06),
/// while a refused fill serves them.
///
/// Each carries the holder of the lease the fetch went out under: until the fill finishes,
/// later requests on this node join it only while that lease still names it
/// (`storage::guarded_fills`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchedUnderAnotherClaim {
    /// Refused when it finishes: a miss the fast path declined, which claimed and found another
    /// claim's lease ([`MissClaim::Elsewhere`]), or a fill of a URL remembered uncacheable,
    /// fetched with no lease at all ([`LeaseHolder::Nobody`]).
    Refused(LeaseHolder),
    /// Kept only if, when it finishes, the URL's lease still names this holder
    /// ([`FillLeases::still_held_by`]): a request that waited two leases for that claim's fill
    /// ([`AfterSharedMiss::UnderAnotherClaim`]). While the lease stood, a POST through any node
    /// found it and published itself, so the bans judge this fill; once it went, a POST may
    /// have found nothing. (A crowd on this node behind such a fetch is served by its fill,
    /// kept as long as the other claim's slow fill lasts.)
    KeptWhileHeldBy(LeaseHolder),
}

impl FetchedUnderAnotherClaim {
    /// The holder of the lease the fetch went out under.
    pub fn holder(self) -> LeaseHolder {
        match self {
            FetchedUnderAnotherClaim::Refused(holder)
            | FetchedUnderAnotherClaim::KeptWhileHeldBy(holder) => holder,
        }
    }
}

/// A URL's lease as this node's requests have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LocalFill {
    /// A request is claiming it (its `add` is out).
    Claiming,
    /// A request holds it, since it was claimed (or last renewed): kept alive while it is here.
    Held(Instant, Claim),
    /// The request that held it has ended (at the `Instant`) with its fill stored, and the
    /// fill's write to memcached, which deletes the lease, is not in yet: not renewed, but still
    /// the lease's claim on this node. A fill of the URL finishing meanwhile (another variant's,
    /// fetched beside it) is the lease's, as while it was held ([`FillLeases::holds`]). Before
    /// 2026-12-07 the mark went with the request: such a fill then deleted whatever lease was
    /// there, the claim's own write found its lease gone and took it for lost, and every copy
    /// of the URL was refused (`tests/elsewhere_breaks.rs`, about one run in twelve).
    Writing(Instant, Claim),
    /// A request held it, but it was found gone (purged, or lost with its server: see
    /// [`FillLeases::lost`]): not renewed, and not deleted when the request ends (it may be
    /// another node's claim by then).
    Lost(u64),
    /// The fill's entry was written to memcached (or its write failed), and this node deletes
    /// the lease itself (since the `Instant`): not renewed any more (a renewal would find it
    /// gone, and take it for lost), nor deleted again. Outlives the request that held the claim
    /// (for a lease's length: [`FillLeases::keep_alive`]): another fill that finished while the
    /// claim was held here carries it too, and its write, landing later, would otherwise find
    /// the lease gone and take it for lost.
    Released(u64, Instant),
    /// As `Released`, for a claim whose `add` went unanswered ([`Claim::unanswered`]): its fill
    /// was refused and its lease (if it landed) is being released. A fill of the URL finishing
    /// meanwhile on this node (one that coalesced behind the refused fill, say) is refused too
    /// ([`FillLeases::unguarded`]).
    ///
    /// In these three the claim's fill is over, and its lease gone or going: a request of the
    /// URL claims it anew rather than follow a claim that guards nothing
    /// ([`FillLeases::claim`]; each carries its claim's holder, so that the claiming request's
    /// end removes its own mark only, not a newer claim's).
    Refused(u64),
}

impl LocalFill {
    /// The holder of the claim this mark is (`None` while a claim is out).
    fn holder(&self) -> Option<u64> {
        match self {
            LocalFill::Claiming => None,
            LocalFill::Held(_, claim) | LocalFill::Writing(_, claim) => Some(claim.holder),
            LocalFill::Lost(holder)
            | LocalFill::Released(holder, _)
            | LocalFill::Refused(holder) => Some(*holder),
        }
    }
}

/// One claim of a URL's lease by this node: who holds it, written in the lease's value after its
/// time ([`lease_value`]), so that a renewal or a release tells this claim's lease from another
/// claim's (one made after this one's was lost); and the CAS token memcached gave the value the
/// claim stored, so that the release deletes it only if it is still that value, in the one round
/// trip the delete costs anyway ([`FillLeases::release`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    holder: u64,
    /// The lease's CAS token as claimed; `None` once a renewal has rewritten it, or when the
    /// server gave none (`Claim::claimed`).
    token: Option<CasToken>,
    /// Its `add` went unanswered (`Claim::unanswered`): its lease, if memcached carries the `add`
    /// out late, did not guard the fill from its start, and the fill is not kept.
    unanswered: bool,
}

impl Claim {
    /// The claim of `holder` whose `add` memcached answered with `token`. A claim given no
    /// usable token ([`usable_cas_token`]: 0 names no value, and `md <key> C0` deletes any) is released as a renewed one is, by the holder its lease
    /// names ([`FillLeases::release`]).
    fn claimed(holder: u64, token: Option<CasToken>) -> Claim {
        Claim {
            holder,
            token: token.and_then(usable_cas_token),
            unanswered: false,
        }
    }

    /// The claim of `holder` whose `add` memcached did not answer in time (or whose connection
    /// failed): the lease may be in memcached, or land later (a slow server carries the `add` out
    /// after its sender gave up), or never be. Until it lands, an unsafe method's invalidation
    /// on another node finds no lease and is not published, so nothing would judge the fill by
    /// it: the fill is refused when it finishes ([`FillLeases::on_unguarded_fill`]), and its lease,
    /// if there, released by the holder it names. Not renewed.
    fn unanswered(holder: u64) -> Claim {
        Claim {
            holder,
            token: None,
            unanswered: true,
        }
    }
}

/// What a renewal of a lease found ([`FillLeases::renew_claim`]).
enum Renewal {
    /// The lease was this claim's, and now carries the renewal's time.
    Renewed,
    /// The lease was gone, or another claim's: lost ([`FillLeases::lost`]).
    Lost,
    /// Its server did not answer: tried again at the next tick.
    Unanswered,
}

/// What releasing a claim's lease found ([`FillLeases::release`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Released {
    /// The lease was this claim's, and is deleted.
    Deleted,
    /// There was no lease.
    Gone,
    /// The lease is another claim's: left alone.
    Theirs,
    /// Its server did not answer (or the lease kept changing under the release).
    Unanswered,
}

/// Unmarks a URL as being claimed on this node when its claim fails or the claiming request is
/// dropped mid-`add`.
struct PendingClaim<'a> {
    fills: &'a Mutex<HashMap<HashBinary, LocalFill>>,
    primary: HashBinary,
}

impl Drop for PendingClaim<'_> {
    fn drop(&mut self) {
        self.fills.lock().remove(&self.primary);
    }
}

impl FillLeases {
    /// Leases of `lease` length (zero: off) in `cluster`, under `namespace`; a fill whose lease
    /// is lost is refused by `bans` and removed from `memory` ([`FillLeases::lost`]).
    pub fn new(
        cluster: Arc<Cluster>,
        namespace: &str,
        lease: Duration,
        counters: Arc<SharedCounters>,
        bans: &'static BanList,
        memory: &'static MemoryTier,
    ) -> Self {
        FillLeases {
            cluster,
            namespace: namespace.to_string(),
            lease,
            local_fills: Mutex::default(),
            beside: Mutex::default(),
            renewing: AtomicBool::new(false),
            next_holder: AtomicU64::new(
                RandomState::new().hash_one((std::process::id(), SystemTime::now())),
            ),
            counters,
            bans,
            memory,
        }
    }

    fn lease_key(&self, key: &CacheKey) -> String {
        self.lease_key_of(&key.primary_bin())
    }

    /// The memcached key of the lease of the URL whose primary hash is `primary`.
    fn lease_key_of(&self, primary: &HashBinary) -> String {
        namespaced_hex(&self.namespace, "fill:", primary)
    }

    /// The memcached key of the URL's primary entry (`tiered::memcached_key` of the key without
    /// variance), by which the lease is placed.
    fn entry_key(&self, key: &CacheKey) -> String {
        self.entry_key_of(&key.primary_bin())
    }

    /// [`Self::entry_key`] of the URL whose primary hash is `primary`.
    fn entry_key_of(&self, primary: &HashBinary) -> String {
        namespaced_hex(&self.namespace, "", primary)
    }

    /// Deletes a URL's lease (`lease_key`), placed by the key of its entry (`entry_key`);
    /// returns whether it was there (`false` also when its server did not answer).
    async fn delete(&self, entry_key: &str, lease_key: &str) -> bool {
        self.cluster
            .delete_with(entry_key.as_bytes(), lease_key.as_bytes())
            .await
            == Some(true)
    }

    /// Deletes the lease that `claim` made of a URL (`lease_key`, placed by `entry_key`) only
    /// if it is still that claim's: another node's claim, made after this one's lease was lost
    /// (its server restarted empty, evicted it, or it expired), is left alone.
    ///
    /// A claim not renewed since costs one round trip, as a plain delete did: memcached deletes
    /// the lease only if its CAS token is still the one the claim's `add` was given (`md <key>
    /// C<token>`, atomic on the server). A renewed claim (its token changed), or a delete that
    /// finds the token changed (a renewal landed meanwhile, or another claim's lease), reads the
    /// lease (`gets`) and deletes it by the token read if the holder it names is this claim's.
    /// Atomic too: the delete by token fails if anything wrote the lease after that read.
    /// A server restarted empty counts its CAS tokens from 1 again, so another claim's lease on
    /// it may carry the number this claim's `add` was given before the restart: the token is
    /// not sent to the new run (it answers "changed", [`lacquer_memcached::CasToken`]), and the
    /// holder is read as for a stale token. No round trip more on a release otherwise (but
    /// when the memcached pool opened a connection since the claim and sends the release over
    /// it, which may reach another run: [`lacquer_memcached::cas_token`]).
    async fn release(&self, entry_key: &str, lease_key: &str, claim: Claim) -> Released {
        let (place, key) = (entry_key.as_bytes(), lease_key.as_bytes());
        let mut token = claim.token;
        for _ in 0..3 {
            if let Some(token) = token {
                match self.cluster.delete_cas_with(place, key, token).await {
                    None => return Released::Unanswered,
                    Some(CasOutcome::Stored) => return Released::Deleted,
                    Some(CasOutcome::Gone) => return Released::Gone,
                    Some(CasOutcome::Changed) => {}
                }
            }
            match self.cluster.gets_with(place, key).await {
                None => return Released::Unanswered,
                Some(None) => return Released::Gone,
                Some(Some((value, _))) if lease_holder(&value) != Some(claim.holder) => {
                    return Released::Theirs
                }
                Some(Some((_, read))) => token = Some(read),
            }
        }
        // rewritten between each read and delete: a renewal of this claim still in flight
        // (its task frozen with its server); the lease is left to expire
        Released::Unanswered
    }

    /// Whether the server holding `key`'s entry is ejected or has just failed.
    pub(super) fn server_failing(&self, key: &CacheKey) -> bool {
        self.cluster.server_failing(self.entry_key(key).as_bytes())
    }

    /// After memcached had nothing for `key`: claims the fill for this request, or, when another
    /// node holds the lease, waits for that fill and returns it. `look` looks for the fill once
    /// (the caller knows where, and what of it may be served); it runs every 10 ms until the fill
    /// arrives, until what it finds is [`Sighting::Elsewhere`], or until the lease is released or
    /// expires (then this request fetches for itself). A page rendered once is then rendered
    /// once for the whole cluster, not once per node.
    pub async fn on_shared_miss<T, F, Fut>(
        &'static self,
        key: &CacheKey,
        mut look: F,
    ) -> AfterSharedMiss<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Sighting<T>>,
    {
        // a request whose wait ended without the fill (its lease released by a fill that stored
        // nothing, or run out) claims the URL once more rather than fetch unguarded: a POST
        // through another node while it fetched would find no lease and be published to no one
        // (`tests/unanswered_claim_attacks.rs`); once only, so a chain of failing fills holds it
        // for two leases at most
        let mut waited_on = None;
        let mut stale = None;
        for claims in 1..=3 {
            let claimed = match &stale {
                Some(stale) => self.claim_by(key, Taking::Over(stale)).await,
                None => self.claim(key).await,
            };
            if let Some(after) = self.after_claim(key, claimed) {
                return after;
            }
            match self
                .wait_for_theirs(key, &mut look, waited_on.as_ref())
                .await
            {
                Waited::Over(after) => return after,
                Waited::Ended(lease) if claims < 2 => waited_on = lease,
                // a lease found again after it was waited out is taken over (a third claim, once
                // only: an earlier wait ended, so `waited_on` was set in the first round)
                Waited::Stale(found) if claims < 3 => {
                    waited_on = None;
                    stale = Some(found);
                }
                Waited::Ended(_) | Waited::Stale(_) => break,
            }
        }
        // waited as long as it may: one more claim, so the fetch is guarded if the URL is free
        // now; under another claim's lease still, fetched under it (twice at most: a lease
        // gone between the claim and its read leaves the URL free to claim)
        for _ in 0..2 {
            let claimed = self.claim(key).await;
            if let Some(after) = self.after_claim(key, claimed) {
                return after;
            }
            match self.holder_now(key).await {
                LeaseHolder::Nobody => {}
                holder => return AfterSharedMiss::UnderAnotherClaim { holder },
            }
            if self.server_failing(key) {
                break;
            }
        }
        AfterSharedMiss::fill_here(true)
    }

    /// Whether the lease of `key`'s URL still names `holder` ([`AfterSharedMiss::UnderAnotherClaim`]):
    /// a fill fetched under that lease is kept only then. One memcached read, when such a fill
    /// finishes; not confirmed (the server did not answer), the fill is not kept.
    /// [`LeaseHolder::Nobody`] is never held.
    pub async fn still_held_by(&self, key: &CacheKey, holder: LeaseHolder) -> bool {
        holder != LeaseHolder::Nobody && self.holder_now(key).await == holder
    }

    /// Whose claim the lease of `key`'s URL names now ([`LeaseHolder::Nobody`] too when its
    /// server did not answer): one memcached read.
    pub async fn holder_now(&self, key: &CacheKey) -> LeaseHolder {
        match self.read_lease(key).await {
            None => LeaseHolder::Nobody,
            Some(value) => lease_holder(&value).map_or(LeaseHolder::Unnamed, LeaseHolder::Claim),
        }
    }

    /// What a request does after a claim on `key`'s URL (`None`: wait for the other claim).
    fn after_claim<T>(
        &'static self,
        key: &CacheKey,
        claimed: FillClaim,
    ) -> Option<AfterSharedMiss<T>> {
        match claimed {
            FillClaim::Ours(claim) => Some(AfterSharedMiss::FillHere {
                lease: Some(self.hold(key, claim)),
                known_missing: true,
            }),
            FillClaim::Uncoordinated => Some(AfterSharedMiss::fill_here(true)),
            FillClaim::ThisNode => Some(AfterSharedMiss::BehindThisNode),
            FillClaim::Theirs => None,
        }
    }

    /// The lease `claim` took on `key`'s URL, for its request to hold (and the renewal task
    /// started, at the process's first claim).
    fn hold(&'static self, key: &CacheKey, claim: Claim) -> HeldLease {
        if !self.renewing.swap(true, Ordering::Relaxed) {
            tokio::spawn(self.keep_alive());
        }
        HeldLease(Some(Box::new(Held {
            leases: self,
            primary: key.primary_bin(),
            claim,
            lease_key: self.lease_key(key),
            entry_key: self.entry_key(key),
        })))
    }

    /// A miss of the standard path that the fast path did not see through memcached (it
    /// declined the request: a `Range`, a validator, request directives) is about to go to the
    /// origin: it claims the URL's lease too, so that an unsafe method's invalidation through
    /// another node while it fetches finds the lease and publishes itself. One memcached `add`
    /// per such miss; before, it fetched unguarded and a POST meanwhile was published to no one
    /// (`tests/unanswered_claim_attacks.rs`). Another node's lease guards the fetch only while
    /// it stands: when that claim's fill fails, its lease is released while this fetch is still
    /// out, and a POST then finds nothing. So the fetch is served and its fill refused when it
    /// finishes ([`MissClaim::Elsewhere`], [`FetchedUnderAnotherClaim`]); the claim's own fill is
    /// the one kept (`tests/guarded_elsewhere_attacks.rs`). A lease another request here holds
    /// is followed ([`MissClaim::BesideThisNode`] says how).
    pub async fn claim_for_miss(&'static self, key: &CacheKey) -> MissClaim {
        match self.claim(key).await {
            FillClaim::Ours(claim) => MissClaim::Held(self.hold(key, claim)),
            FillClaim::Theirs => MissClaim::Elsewhere,
            FillClaim::ThisNode => {
                let primary = key.primary_bin();
                *self.beside.lock().entry(primary).or_default() += 1;
                MissClaim::BesideThisNode(BesideThisNode {
                    leases: self,
                    primary,
                })
            }
            FillClaim::Uncoordinated => MissClaim::Unclaimed,
        }
    }

    /// Waits for the fill of another node's claim on `key` (see [`Self::on_shared_miss`]).
    /// `waited_on`: the lease an earlier wait of this request waited out: found again (it ran
    /// out by the time it carries, or names no time and was trusted its whole length), it is not
    /// waited for twice but taken over ([`Self::take_over`]): [`Waited::Stale`].
    async fn wait_for_theirs<T, F, Fut>(
        &self,
        key: &CacheKey,
        look: &mut F,
        waited_on: Option<&Bytes>,
    ) -> Waited<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Sighting<T>>,
    {
        // the holder's claim (or renewal) time bounds the wait, whenever the lease came to be in memcached
        let lease = self.read_lease(key).await;
        if let Some(stale) = lease.as_ref().filter(|lease| Some(*lease) == waited_on) {
            return Waited::Stale(stale.clone());
        }
        self.counters.fill_waits.fetch_add(1, Ordering::Relaxed);
        let Some(remaining) = lease.as_deref().and_then(|value| self.remaining_of(value)) else {
            // a wait over as it begins: the lease went between the claim and this look
            return self.lease_gone(key, look, lease).await;
        };
        let deadline = Instant::now() + remaining;
        loop {
            tokio::time::sleep(FILL_POLL).await;
            match look().await {
                Sighting::Arrived(fill) => {
                    self.counters.fills_awaited.fetch_add(1, Ordering::Relaxed);
                    return Waited::Over(AfterSharedMiss::Filled(fill));
                }
                Sighting::Elsewhere => return Waited::Over(AfterSharedMiss::fill_here(false)),
                Sighting::NotYet => {}
            }
            if Instant::now() >= deadline || self.server_failing(key) {
                return self.wait_cut(key, lease);
            }
            if self.lease_remaining(key).await.is_none() {
                return self.lease_gone(key, look, lease).await;
            }
        }
    }

    /// The lease this request found taken is gone: released by a fill that stored nothing,
    /// expired, or deleted because its fill has been written ([`FillLeases::on_written`]). One
    /// more look tells the last from the others: the fill may have landed since the last look.
    async fn lease_gone<T, F, Fut>(
        &self,
        key: &CacheKey,
        look: &mut F,
        lease: Option<Bytes>,
    ) -> Waited<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Sighting<T>>,
    {
        if self.server_failing(key) {
            return self.wait_cut(key, lease);
        }
        match look().await {
            Sighting::Arrived(fill) => {
                self.counters.fills_awaited.fetch_add(1, Ordering::Relaxed);
                Waited::Over(AfterSharedMiss::Filled(fill))
            }
            Sighting::Elsewhere => Waited::Over(AfterSharedMiss::fill_here(false)),
            Sighting::NotYet => self.wait_cut(key, lease),
        }
    }

    /// A wait for another node's fill ends without it (released, expired, or the URL's server
    /// failed). Counted when it ended early for a failure: this request then fetches for itself,
    /// nothing more being asked of that server; otherwise the wait has [`Waited::Ended`] (`lease`:
    /// the one it waited on).
    fn wait_cut<T>(&self, key: &CacheKey, lease: Option<Bytes>) -> Waited<T> {
        if self.server_failing(key) {
            self.counters.fill_waits_cut.fetch_add(1, Ordering::Relaxed);
            return Waited::Over(AfterSharedMiss::fill_here(true));
        }
        Waited::Ended(lease)
    }

    /// The lease `stale`, which this request waited out whole (it ran out by the time it
    /// carries, or names no time and was trusted its whole length), is still in memcached: a
    /// claim that landed after its fill ended (an unanswered claim's), or a node that died
    /// mid-fill before memcached expired it. A fetch it does not guard would be guarded by
    /// nothing once memcached expires it (a POST meanwhile finding neither entry nor lease), so
    /// claim `holder` takes it over: the lease is read with its CAS token and, if it is still
    /// `stale`, swapped for this claim's by that token (`cas`), so the URL is never without a
    /// lease in between. Gone since, the URL is claimed by `add`; another claim's since, that
    /// claim holds it. A server that gives no CAS token (`-C`: the swap could not be
    /// conditional) leaves the stray lease held, as another claim's. Not taken when the server
    /// does not answer the read, or the lease changes under both of two reads: the request
    /// then fetches uncoordinated, as before. (Until 2026-12-06 it always
    /// fetched unguarded, `tests/guarded_elsewhere_attacks.rs`; until 2026-12-07 the stray lease
    /// was deleted and the URL claimed by `add`, and a waiter on another node that read the
    /// lease between the two found none and fetched unguarded,
    /// `unanswered_claim_attacks::a_claim_landing_after_its_refused_fill_...`.)
    async fn take_over(&self, key: &CacheKey, stale: &Bytes, holder: u64) -> Taken {
        let (entry_key, lease_key) = (self.entry_key(key), self.lease_key(key));
        let (place, lease) = (entry_key.as_bytes(), lease_key.as_bytes());
        // read twice at most: a swap answered "changed" (the lease written since, or the
        // token not sendable over the connection at hand) reads it again
        for _ in 0..2 {
            let token = match self.cluster.gets_with(place, lease).await {
                None => return Taken::GaveUp,
                Some(None) => return self.add_lease(key, holder).await,
                // this claim's own value: the swap landed, and its reply was lost to a retry
                // on a fresh connection that answered "changed" (before 2026-12-07 it was
                // taken for another claim's, waited on a whole lease by every node, and the
                // fill fetched under it refused: `tests/takeover_breaks.rs`)
                Some(Some((value, _))) if lease_holder(&value) == Some(holder) => {
                    return Taken::Claimed(None)
                }
                Some(Some((value, _))) if value != *stale => return Taken::Held,
                Some(Some((_, token))) => token,
            };
            let Some(token) = usable_cas_token(token) else {
                // a server without CAS tokens (`-C`) cannot swap it conditionally: it is
                // followed as another claim's lease, and a request whose waits are used up
                // fetches under it, kept only while it stands (until 2026-12-07 the request
                // fetched uncoordinated and was kept once memcached expired it:
                // `takeover_breaks::a_stray_lease_on_a_server_without_cas_...`)
                return Taken::Held;
            };
            let swapped = self
                .cluster
                .cas_with(place, lease, lease_value(holder), self.lease_ttl(), token)
                .await;
            match swapped {
                None => return Taken::Unanswered,
                Some(CasOutcome::Stored) => {
                    log::debug!("memcached: the fill lease {lease_key}, waited out, taken over");
                    return Taken::Claimed(None);
                }
                Some(CasOutcome::Gone) => return self.add_lease(key, holder).await,
                Some(CasOutcome::Changed) => {}
            }
        }
        Taken::GaveUp
    }

    /// Claims `key`'s URL for `holder` by `add`, with the CAS token memcached gave the lease.
    async fn add_lease(&self, key: &CacheKey, holder: u64) -> Taken {
        let added = self
            .cluster
            .add_token_with(
                self.entry_key(key).as_bytes(),
                self.lease_key(key).as_bytes(),
                lease_value(holder),
                self.lease_ttl(),
            )
            .await;
        match added {
            Some(Some(token)) => Taken::Claimed(Some(token)),
            Some(None) => Taken::Held,
            None => Taken::Unanswered,
        }
    }

    /// How much longer another node's lease on `key` may hold this request up: what is left of
    /// `fill_lease` since the claim (or renewal) time the lease carries (never more than `fill_lease`).
    /// `None` when the lease is gone or its server failed.
    async fn lease_remaining(&self, key: &CacheKey) -> Option<Duration> {
        let value = self.read_lease(key).await?;
        self.remaining_of(&value)
    }

    /// The lease on `key`'s URL as memcached holds it; `None` when it is gone or its server
    /// failed.
    async fn read_lease(&self, key: &CacheKey) -> Option<Bytes> {
        self.cluster
            .get_with(
                self.entry_key(key).as_bytes(),
                self.lease_key(key).as_bytes(),
            )
            .await
    }

    /// What is left of the lease `value` ([`Self::lease_remaining`]).
    fn remaining_of(&self, value: &[u8]) -> Option<Duration> {
        let claimed = lease_field(value, 0).map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
        let Some(claimed) = claimed else {
            // not written by this version: trust the lease for its whole length
            return Some(self.lease);
        };
        let held = SystemTime::now()
            .duration_since(claimed)
            .unwrap_or_default();
        Some(self.lease.saturating_sub(held)).filter(|left| !left.is_zero())
    }

    /// Whether a claim begun at `started` has waited on this node's own marks as long as it may
    /// (`op_timeout`, what one memcached operation, the `add` or delete it waits for, is given).
    fn waited_enough(&self, started: Instant) -> bool {
        started.elapsed() > self.cluster.op_timeout()
    }

    /// Claims the fill of `key` for this node, unless another node or another request here has.
    async fn claim(&self, key: &CacheKey) -> FillClaim {
        self.claim_by(key, Taking::Anew).await
    }

    /// [`Self::claim`], taking the lease as `taking` says: by `add`, or over a stale lease
    /// ([`Self::take_over`]).
    async fn claim_by(&self, key: &CacheKey, taking: Taking<'_>) -> FillClaim {
        if self.lease.is_zero() {
            return FillClaim::Uncoordinated;
        }
        if self.server_failing(key) {
            // the miss that brought us here was the server failing, not answering "not stored":
            // nothing more is asked of it for this request
            self.counters
                .fills_unguarded
                .fetch_add(1, Ordering::Relaxed);
            return FillClaim::Uncoordinated;
        }
        let primary = key.primary_bin();
        // one claim per URL per node: a request arriving while another local request's `add` is
        // out waits for its outcome (at most op_timeout), then follows it
        let started = Instant::now();
        // this node's own claim whose lease may still be in memcached though its fill is over:
        // found by the `add`, it is waited out, not taken for another claim's
        let mut own_lease = None;
        loop {
            {
                let mut fills = self.local_fills.lock();
                match fills.get(&primary) {
                    Some(LocalFill::Held(..)) => return FillClaim::ThisNode,
                    Some(LocalFill::Claiming) => {
                        if self.waited_enough(started) {
                            return FillClaim::Uncoordinated;
                        }
                    }
                    // a fill stored here whose write is not in yet: its lease is deleted when
                    // it is, so the write is waited for (as long as a claim is). Claimed over at
                    // once, the `add` found that lease, took it for another node's, and the
                    // request's fill (another variant of the URL) was refused as fetched
                    // elsewhere (`range_and_variant_attacks::back_to_back_variants_...`)
                    Some(LocalFill::Writing(_, claim)) if !self.waited_enough(started) => {
                        own_lease = Some(claim.holder);
                    }
                    // a claim of this node whose fill is over (stored, refused, or its lease
                    // lost): its lease guards nothing now, so this request claims anew (after
                    // a write that outlasted the wait, its lease is found and taken for
                    // another claim's, as before)
                    Some(
                        LocalFill::Writing(..)
                        | LocalFill::Lost(_)
                        | LocalFill::Released(..)
                        | LocalFill::Refused(_),
                    )
                    | None => {
                        if let Some(LocalFill::Released(holder, _)) = fills.get(&primary) {
                            own_lease = Some(*holder);
                        }
                        fills.insert(primary, LocalFill::Claiming);
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // unmarks the URL when the claim fails, and when this request is dropped mid-`add`
        let pending = PendingClaim {
            fills: &self.local_fills,
            primary,
        };
        let holder = self.next_holder.fetch_add(1, Ordering::Relaxed);
        let mut taken = match taking {
            Taking::Anew => self.add_lease(key, holder).await,
            Taking::Over(stale) => self.take_over(key, stale, holder).await,
        };
        // the lease found may be this node's own, its delete (after its fill's write) still out:
        // claimed again once it is gone
        if let (Taken::Held, Some(own)) = (&taken, own_lease) {
            let deleting = Instant::now();
            while !self.waited_enough(deleting) {
                match self.holder_now(key).await {
                    LeaseHolder::Claim(holder) if holder == own => {
                        tokio::time::sleep(Duration::from_millis(1)).await
                    }
                    // gone since the `add` found it
                    LeaseHolder::Nobody => {}
                    _ => break,
                }
                taken = self.add_lease(key, holder).await;
                if !matches!(taken, Taken::Held) {
                    break;
                }
            }
        }
        match taken {
            Taken::Claimed(token) => {
                std::mem::forget(pending);
                let claim = Claim::claimed(holder, token);
                self.local_fills
                    .lock()
                    .insert(primary, LocalFill::Held(Instant::now(), claim));
                self.counters.fills_claimed.fetch_add(1, Ordering::Relaxed);
                FillClaim::Ours(claim)
            }
            Taken::Held => FillClaim::Theirs,
            Taken::Unanswered => {
                // the `add` (or swap) may still land, naming this holder: the URL stays held
                // here (so this node's other requests coalesce behind this fill) by a claim
                // whose fill is refused when it finishes and whose lease is released by its
                // holder
                std::mem::forget(pending);
                let claim = Claim::unanswered(holder);
                self.local_fills
                    .lock()
                    .insert(primary, LocalFill::Held(Instant::now(), claim));
                self.counters
                    .fills_unguarded
                    .fetch_add(1, Ordering::Relaxed);
                FillClaim::Ours(claim)
            }
            Taken::GaveUp => {
                self.counters
                    .fills_unguarded
                    .fetch_add(1, Ordering::Relaxed);
                FillClaim::Uncoordinated
            }
        }
    }

    /// The memcached expiry of a lease, claimed or renewed: a third past `fill_lease`, and one
    /// second more. memcached counts expiry in whole seconds from a clock that ticks once a
    /// second, so a key given `n` seconds lasts between `n - 1` and `n`. Renewals go at the
    /// renewal task's ticks, a third of a lease apart, for leases held a sixth of one; so after
    /// two renewals in a row that do not land (one its frozen server never answered, the next
    /// skipped while that server is ejected) the third goes up to `fill_lease` and a sixth after
    /// the last renewal. Given one second past `fill_lease`, a lease could expire just before
    /// it (found gone: lost, and the fill refused, though nothing took it); given a third more,
    /// it waits for it. (Waiters are bounded by the time the lease carries, not by its expiry:
    /// a longer expiry only keeps a dead holder's lease from being claimed again a little
    /// longer, while its waiters fetch for themselves.)
    fn lease_ttl(&self) -> u32 {
        let ms = self.lease.as_millis() as u64;
        (ms + ms / 3).div_ceil(1000) as u32 + 1
    }

    /// The process's renewal task, started at its first claim: every third of `fill_lease`,
    /// renews each lease a request here has held for half that (since its claim or its last
    /// renewal), until its request ends (`HeldLease::on_request_end` takes it out of
    /// `local_fills`, or marks it `Writing`); and drops the marks of claims written a lease
    /// ago. A renewal rewrites the lease's time only if the lease still names its
    /// claim ([`Self::renew_claim`]), so it never brings back a lease that a purge deleted (or
    /// its server lost), nor overwrites another node's claim made since: one found gone or
    /// another claim's is not renewed again, and its fill is [lost](Self::lost), refused here.
    /// One whose server did not answer is tried again at the next tick; a lease lives a third
    /// past `fill_lease` from its last renewal ([`Self::lease_ttl`]), so two missed renewals
    /// lose nothing. Each renewal runs as a task of its own, so a frozen server delays no other
    /// lease's. Two memcached round trips (`gets`, `cas`) per slow fill per third of a lease,
    /// out of any request's path; fills shorter than that are never renewed.
    async fn keep_alive(&'static self) {
        let every = self.lease / 3;
        loop {
            tokio::time::sleep(every).await;
            // renewed at every tick once half a period old: a renewal's own time (taken when it
            // was sent) is a little after its tick, and must not make the next tick skip it
            let Some(due_since) = Instant::now().checked_sub(every / 2) else {
                continue;
            };
            let due: Vec<HashBinary> = {
                let mut fills = self.local_fills.lock();
                // the marks of claims whose requests have ended are kept a lease's length, for
                // the writes still to come (which land within `op_timeout`)
                fills.retain(|_, fill| match fill {
                    LocalFill::Writing(at, _) | LocalFill::Released(_, at) => {
                        at.elapsed() <= self.lease
                    }
                    _ => true,
                });
                fills
                    .iter()
                    .filter(|(_, fill)| {
                        // (an unanswered claim's fill is not kept: its lease, if it landed, is
                        // not kept alive for it)
                        matches!(fill, LocalFill::Held(since, claim)
                            if *since <= due_since && !claim.unanswered)
                    })
                    .map(|(primary, _)| *primary)
                    .collect()
            };
            for primary in due {
                tokio::spawn(self.renew(primary));
            }
        }
    }

    /// Renews the lease of `primary`, held here ([`Self::keep_alive`]). Only on the server
    /// that owns the URL: while it is ejected, a stand-in (`rehash_on_eject`) has no lease and
    /// would answer "gone", ending the renewal for good; the renewal waits for the owner.
    async fn renew(&'static self, primary: HashBinary) {
        let Some(LocalFill::Held(_, claim)) = self.local_fills.lock().get(&primary).copied() else {
            return;
        };
        let sent = Instant::now();
        let entry_key = self.entry_key_of(&primary);
        let owner_usable = self
            .cluster
            .owner(entry_key.as_bytes())
            .is_some_and(|owner| self.cluster.is_usable(owner));
        let renewal = match owner_usable {
            false => Renewal::Unanswered,
            true => {
                self.renew_claim(&entry_key, &self.lease_key_of(&primary), claim.holder)
                    .await
            }
        };
        {
            let mut fills = self.local_fills.lock();
            // still held here by this claim (its request may have ended meanwhile, or its entry
            // been written and the lease deleted by this node: `Released`)
            let Some(fill) = fills.get_mut(&primary) else {
                return;
            };
            if !matches!(fill, LocalFill::Held(_, held) if held.holder == claim.holder) {
                return;
            }
            match renewal {
                Renewal::Renewed => {
                    // its CAS token changed with it: a release reads the lease first
                    let renewed = Claim {
                        token: None,
                        ..claim
                    };
                    *fill = LocalFill::Held(sent, renewed);
                    self.counters
                        .fill_leases_renewed
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Renewal::Lost => *fill = LocalFill::Lost(claim.holder),
                Renewal::Unanswered => return,
            }
        }
        self.lost(&primary);
    }

    /// One renewal of the lease `lease_key` (placed by `entry_key`) of the claim `holder`: the
    /// lease is read with its CAS token (`gets`), and its time rewritten by a compare-and-swap
    /// only if the holder it names is this claim. Gone, or another claim's (made after this
    /// one's lease was lost: a `replace` would have overwritten it with this claim's time, and
    /// this node would have kept a fill whose lease was lost), it is lost. A swap refused
    /// because the lease was written since its read is lost too, unless a second read finds it
    /// still this claim's (this swap's own first attempt, landed before a retry on a fresh
    /// connection). A server that does not answer is asked again at the next tick. Two round
    /// trips per renewal, paid only by fills slower than a third of `fill_lease`.
    async fn renew_claim(&self, entry_key: &str, lease_key: &str, holder: u64) -> Renewal {
        let (place, key) = (entry_key.as_bytes(), lease_key.as_bytes());
        let read = match self.cluster.gets_with(place, key).await {
            None => return Renewal::Unanswered,
            Some(Some((value, token))) if lease_holder(&value) == Some(holder) => token,
            Some(_) => return Renewal::Lost,
        };
        let Some(token) = usable_cas_token(read) else {
            // a server run without CAS tokens (`-C`) refuses every `cas`: the lease, just read
            // as this claim's, is rewritten by a `replace`, which brings back no lease gone
            // since (only one claimed anew in between would be overwritten, as every renewal did
            // before `cas`)
            let replaced = self
                .cluster
                .replace_with(place, key, lease_value(holder), self.lease_ttl())
                .await;
            return match replaced {
                None => Renewal::Unanswered,
                Some(true) => Renewal::Renewed,
                Some(false) => Renewal::Lost,
            };
        };
        let swap = self
            .cluster
            .cas_with(place, key, lease_value(holder), self.lease_ttl(), token)
            .await;
        match swap {
            None => Renewal::Unanswered,
            Some(CasOutcome::Stored) => Renewal::Renewed,
            Some(CasOutcome::Gone) => Renewal::Lost,
            Some(CasOutcome::Changed) => match self.cluster.gets_with(place, key).await {
                None => Renewal::Unanswered,
                Some(Some((value, _))) if lease_holder(&value) == Some(holder) => Renewal::Renewed,
                Some(_) => Renewal::Lost,
            },
        }
    }

    /// The lease of the URL whose primary hash is `primary`, held by a fill of this node, is
    /// gone, and not by this node's doing (see the module docs, **Loss**): an invalidation of
    /// the URL may have come meanwhile and been published to no one. This node applies a purge
    /// of the URL to itself as of now, unpublished: the fill in flight (dated when its request
    /// was sent) is refused when it is stored, and no lookup joins it; a copy it already stored
    /// is removed; and its write to memcached, if any, is judged by it once it lands, and
    /// deleted (`TieredStorage::judge_written`; kept and published for the whole retention when
    /// it cannot be deleted, as for any purge). Short-lived: nothing it covers is meant to
    /// stay. Counted `fill_leases_lost`.
    fn lost(&self, primary: &HashBinary) {
        let ms = ms_after(SystemTime::now());
        let scope = Scope::Url(u128::from_be_bytes(*primary));
        self.bans.add(&scope, ms, false, true);
        self.memory.invalidate(&scope, at(ms), false);
        self.counters
            .fill_leases_lost
            .fetch_add(1, Ordering::Relaxed);
        log::warn!(
            "memcached: the fill lease {} was lost while its fill was in flight (its server \
             restarted, evicted it, or did not answer its renewals): the fill is not kept",
            self.lease_key_of(primary)
        );
    }

    /// The lease of the URL whose primary hash is `primary`, held here by a claim whose fill
    /// stored nothing, is about to be released. A request of this node that followed the claim
    /// and fetches beside it ([`MissClaim::BesideThisNode`]: a lock-timeout waiter, another
    /// variant, a miss the fast path declined) was guarded by that lease only while it stood; a
    /// POST through another node once it is gone finds nothing and is published to no one. So,
    /// while such a request is out, the URL is marked purged on this node as of now, unpublished,
    /// as a POST's purge of a URL with nothing stored is (`BanList::mark_unsafe_purge`: a fixed
    /// slot, no list entry): that fetch, sent before now, is refused when it is stored. (Before
    /// 2026-12-07 it was kept, `guarded_elsewhere_attacks::a_fetch_beside_this_nodes_failed_...`.)
    /// Only then: a mark for every claim that stored nothing (each new `no-store` URL's) would
    /// keep the slots marked, refusing slow fills of other URLs sharing them.
    fn purged_here(&self, primary: &HashBinary) {
        if !self.beside.lock().contains_key(primary) {
            return;
        }
        self.bans
            .mark_unsafe_purge(u128::from_be_bytes(*primary), ms_after(SystemTime::now()));
        log::debug!(
            "memcached: the fill lease {} goes unstored while a request here fetches beside it: \
             that fetch is not kept",
            self.lease_key_of(primary)
        );
    }

    /// `key`'s fill, held by a claim whose `add` went unanswered ([`Claim::unanswered`]), is
    /// finishing and is refused by the caller (not stored here, not written to memcached): its
    /// request went to the origin unguarded, and a POST through another node before the `add`
    /// landed found no lease and was published to no one, so the fill may hold the page as it
    /// was before it. Its lease, if it landed, is released when the fill reports nothing stored
    /// ([`Self::on_write_failed`]), by the holder it names, so the nodes waiting on it fetch for
    /// themselves. Costs the URL one more origin fetch, only when memcached failed to answer a
    /// claim in time. (Only this fill is refused: a purge of the URL on this node, as for a lost
    /// lease, would also refuse the answers other nodes fetch once the lease is released, since
    /// their requests may have come before it.)
    pub fn on_unguarded_fill(&self, key: &CacheKey) {
        log::info!(
            "memcached: the claim of the fill lease {} went unanswered, and its fill went to the \
             origin unguarded: the fill is not kept",
            self.lease_key(key)
        );
    }

    /// `key`'s fill, fetched while another claim held the URL's lease
    /// ([`MissClaim::Elsewhere`]), is finishing and is refused by the caller: its readers have
    /// it, and nothing is stored or written. The lease is left to the claim that holds it, whose
    /// own fill is the one kept.
    pub fn on_fill_under_another_claim(&self, key: &CacheKey) {
        self.counters
            .fills_under_another_claim
            .fetch_add(1, Ordering::Relaxed);
        log::debug!(
            "memcached: a fill of {} fetched while another claim held its lease is not kept",
            self.lease_key(key)
        );
    }

    /// Whether a fill of `key`'s URL finishing now went to the origin unguarded, held here by a
    /// claim whose `add` went unanswered ([`Claim::unanswered`]), or fetched after that claim's
    /// fill was refused while its request still runs (`LocalFill::Refused`: its client still
    /// reading, say): the fill is refused ([`Self::on_unguarded_fill`]). (Before 2026-12-06 a
    /// request of the URL on this node in that window fetched with no claim and was kept, and a
    /// POST through another node meanwhile, finding no lease and no entry, was undone on every
    /// node: `tests/unanswered_claim_attacks.rs`.)
    pub fn unguarded(&self, key: &CacheKey) -> bool {
        if self.lease.is_zero() {
            return false;
        }
        match self.local_fills.lock().get(&key.primary_bin()) {
            Some(LocalFill::Held(_, claim) | LocalFill::Writing(_, claim)) => claim.unanswered,
            Some(LocalFill::Refused(_)) => true,
            _ => false,
        }
    }

    /// The claim by which a request on this node holds the lease of `key`'s URL and keeps it
    /// alive, if one does (or did, its fill's write not in yet: `LocalFill::Writing`): a fill
    /// of it finishing now is the lease's, and [`Self::on_written`] confirms the lease after
    /// its write.
    pub fn holds(&self, key: &CacheKey) -> Option<Claim> {
        if self.lease.is_zero() {
            return None;
        }
        match self.local_fills.lock().get(&key.primary_bin()) {
            Some(LocalFill::Held(_, claim) | LocalFill::Writing(_, claim)) => Some(*claim),
            _ => None,
        }
    }

    /// This node is about to delete the lease of `primary` itself, after a write of its fill
    /// (or its failure): the claim that `leased` made (any claim held here, if `None`) is marked
    /// released, so that no renewal takes its lease for lost. Returns the claim whose lease to
    /// delete: the one held here (its token is the latest), or else `leased` (its request has
    /// ended); `Err` when it is not to be deleted (lost: it may be another node's claim by now;
    /// released: deleted already, by a write of another variant), `Ok(None)` when no claim of
    /// this node's is concerned.
    fn release_local(
        &self,
        primary: &HashBinary,
        leased: Option<Claim>,
    ) -> Result<Option<Claim>, ()> {
        let mut fills = self.local_fills.lock();
        let Some(fill) = fills.get_mut(primary) else {
            return Ok(leased);
        };
        match *fill {
            LocalFill::Lost(_) | LocalFill::Released(..) | LocalFill::Refused(_) => Err(()),
            LocalFill::Held(_, held) | LocalFill::Writing(_, held)
                if leased.is_none_or(|leased| leased.holder == held.holder) =>
            {
                *fill = match held.unanswered {
                    true => LocalFill::Refused(held.holder),
                    false => LocalFill::Released(held.holder, Instant::now()),
                };
                Ok(Some(held))
            }
            // being claimed again, or held by a later claim: not this write's to release
            LocalFill::Claiming | LocalFill::Held(..) | LocalFill::Writing(..) => Ok(leased),
        }
    }

    /// Deletes the lease of `key`'s URL after a write of its fill (or its failure): the lease of
    /// `claim` only if it is still that claim's ([`Self::release`]); without a claim of this
    /// node's, whatever lease is there (the fill was not the lease's: deleted all the same so
    /// that the nodes waiting for another node's fill look for this one). What the release
    /// found; `Deleted` without a claim.
    async fn release_after_write(&self, key: &CacheKey, claim: Option<Claim>) -> Released {
        let (entry_key, lease_key) = (self.entry_key(key), self.lease_key(key));
        match claim {
            Some(claim) => self.release(&entry_key, &lease_key, claim).await,
            None => {
                self.delete(&entry_key, &lease_key).await;
                Released::Deleted
            }
        }
    }

    /// The tiered store could not write `key`'s fill to memcached: the nodes waiting for it
    /// would never see it, so the URL's lease is deleted (in the background) and they fetch for
    /// themselves. `leased`: the claim the fill was the lease's ([`Self::holds`] when it
    /// finished), whose lease is deleted only if it is still that claim's; without one, whoever
    /// holds the lease, the worst this does is one more origin fetch. Without a claim of this
    /// node's, not attempted while the URL's server is failing (the waiters stop on their own
    /// then); nor when this node's lease was lost (it may be another node's claim by now).
    pub fn on_write_failed(&'static self, key: &CacheKey, leased: Option<Claim>) {
        if self.lease.is_zero() {
            return;
        }
        let Ok(claim) = self.release_local(&key.primary_bin(), leased) else {
            return;
        };
        // a claim of this node is released all the same when its server counts as failing (the
        // delete is bounded by `op_timeout`, out of any request's path): the failure may be this
        // write's own timeout (or an unanswered claim's), with nothing answered since on a quiet
        // node. Left, its lease held this node's next fills of the URL, which took it for another
        // node's, refused (`fill-elsewhere`) until memcached expired it, and the nodes that found
        // it waited it out (`fill_claim_wait_attacks::after_a_write_outlasting_op_timeout_...`).
        // Without a claim here, whoever holds the lease, the waiters stop on their own.
        if self.server_failing(key) && claim.is_none() {
            return;
        }
        let key = key.clone();
        let task = self.counters.background_task();
        tokio::spawn(async move {
            self.release_after_write(&key, claim).await;
            drop(task);
        });
    }

    /// `key`'s fill has been written to memcached: its lease, if any, is deleted. The nodes
    /// waiting on it look for the entry before they give up on a lease that is gone, so they are
    /// served it; and a lease left to run out would hold every node's requests for the URL back
    /// behind a fill that is over should the entry turn unusable before it expires (a ban of
    /// the URL's tag right after it was stored: the banned entry stays in memcached, and each
    /// node would wait out the lease, then fetch at once).
    ///
    /// `leased`: the claim whose lease the fill was ([`Self::holds`] when it finished). Its
    /// lease is deleted only if it is still that claim's ([`Self::release`]), which confirms it
    /// was there all along: found gone, or another claim's (this fill outlasted its lease, lost
    /// and claimed again by another node), or not confirmed (its server did not answer), and
    /// not released by another write of this node meanwhile (a variant's), it was
    /// [lost](Self::lost) while the fill was in flight, and the entry just written is not kept.
    /// Another claim's lease is left to that claim. A fill that was not the lease's deletes
    /// whatever lease is there, as before.
    pub async fn on_written(&self, key: &CacheKey, leased: Option<Claim>) {
        // (the server has just answered the write: not asked whether it is failing, which
        // costs a key's formatting and placement)
        if self.lease.is_zero() {
            return;
        }
        let primary = key.primary_bin();
        let Ok(claim) = self.release_local(&primary, leased) else {
            return;
        };
        let released = self.release_after_write(key, claim).await;
        if leased.is_some() && released != Released::Deleted {
            self.lost(&primary);
        }
    }

    /// The process is exiting with requests still running (`shutdown_timeout` cut its drain,
    /// `lifecycle::drain`): the leases they hold are deleted, as a fill that stored nothing
    /// gives its lease up, so the other nodes fetch those URLs at once instead of waiting, up to
    /// `fill_lease` from the last renewal, for fills that will never come. A lease whose renewal
    /// found it gone is left alone: it may be another node's claim by now; so is one that is
    /// another claim's ([`Self::release`]). Returns how many were deleted.
    pub async fn release_held(&'static self) -> usize {
        let held: Vec<(HashBinary, Claim)> = self
            .local_fills
            .lock()
            .iter()
            .filter_map(|(primary, fill)| match fill {
                LocalFill::Held(_, claim) => Some((*primary, *claim)),
                _ => None,
            })
            .collect();
        let mut deletes = tokio::task::JoinSet::new();
        for (primary, claim) in held {
            deletes.spawn(async move {
                let (entry_key, lease_key) =
                    (self.entry_key_of(&primary), self.lease_key_of(&primary));
                self.release(&entry_key, &lease_key, claim).await
            });
        }
        deletes
            .join_all()
            .await
            .into_iter()
            .filter(|released| *released == Released::Deleted)
            .count()
    }

    /// `key`'s URL was purged: a lease on it belongs to a fill from before the purge (or one
    /// that will find the URL purged), so it is deleted and the nodes that miss the URL now
    /// fetch it at once instead of waiting for the lease to expire. Returns whether there was
    /// one: a fill of the URL is then in flight on some node.
    pub async fn on_purge(&self, key: &CacheKey) -> bool {
        !self.lease.is_zero()
            && self
                .delete(&self.entry_key(key), &self.lease_key(key))
                .await
    }
}

/// A lease's value: the time of its claim or renewal, in ms since the Unix epoch, then its
/// claim's holder ([`Claim`]), as text: `{ms} {holder:016x}`.
/// (Written without `format!`, which cost every claim about 1,200 instructions more.)
fn lease_value(holder: u64) -> Bytes {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    let mut digits = itoa::Buffer::new();
    let ms = digits.format(ms).as_bytes();
    let mut hex = [0u8; 16];
    hex::encode_to_slice(holder.to_be_bytes(), &mut hex).expect("8 bytes are 16 hex digits");
    let mut value = Vec::with_capacity(ms.len() + 1 + hex.len());
    value.extend_from_slice(ms);
    value.push(b' ');
    value.extend_from_slice(&hex);
    Bytes::from(value)
}

/// Field `index` of a lease's value ([`lease_value`]): 0, its time (decimal), 1, its holder
/// (hexadecimal). `None` when the value has no such field (a lease of an older version has no
/// holder) or it is not a number.
fn lease_field(value: &[u8], index: usize) -> Option<u64> {
    let field = std::str::from_utf8(value).ok()?.split(' ').nth(index)?;
    match index {
        0 => field.parse().ok(),
        _ => u64::from_str_radix(field, 16).ok(),
    }
}

/// The holder a lease's value names ([`lease_value`]).
fn lease_holder(value: &[u8]) -> Option<u64> {
    lease_field(value, 1)
}

impl HeldLease {
    /// The answer will not be stored (judged uncacheable, or passed on unjudged): the lease is
    /// released now rather than when the request ends, so the nodes waiting for it fetch for
    /// themselves at once, and the lease of a long uncacheable answer (a stream) is not kept
    /// alive for as long as it lasts, where every POST to its URL would be published.
    pub fn on_not_stored(self) {
        self.on_request_end(false);
    }

    /// The request that holds the lease is over (`logging`). When its fill `stored` nothing
    /// (uncacheable, or the fetch failed: the proxy passes `false` for any request that ended in
    /// an error), the lease is deleted too: the nodes waiting for it then fetch for themselves at
    /// once instead of at the lease's expiry. A stored fill's lease is deleted when its write to
    /// memcached lands ([`FillLeases::on_written`]) or fails ([`FillLeases::on_write_failed`]).
    pub fn on_request_end(mut self, stored: bool) {
        if let Some(held) = self.0.take() {
            (*held).end(stored);
        }
    }
}

impl Held {
    /// See [`HeldLease::on_request_end`]. The delete is spawned on the runtime this runs in;
    /// outside one (a lease dropped as the process ends) it is left to expire.
    fn end(self, stored: bool) {
        let Held {
            leases,
            primary,
            claim,
            lease_key,
            entry_key,
        } = self;
        let was = {
            let mut fills = leases.local_fills.lock();
            match fills.get(&primary).copied() {
                // a newer claim's mark (this claim's fill over, a request claimed anew): left
                // to it, and nothing released (this claim's lease was lost, or released)
                Some(fill) if fill.holder() != Some(claim.holder) => return,
                // released by a write already: the mark stays for the writes still to come
                // that carry the claim (`LocalFill::Released`)
                Some(LocalFill::Released(..)) => return,
                // stored, its write not in: the claim stays this node's until it is
                // (`LocalFill::Writing`)
                Some(LocalFill::Held(_, held)) if stored && !held.unanswered => {
                    fills.insert(primary, LocalFill::Writing(Instant::now(), held));
                    return;
                }
                _ => fills.remove(&primary),
            }
        };
        let claim = match was {
            // (lost: it may be another node's claim by now)
            _ if stored => return,
            Some(
                LocalFill::Lost(_)
                | LocalFill::Released(..)
                | LocalFill::Refused(_)
                | LocalFill::Writing(..),
            ) => return,
            // renewed since it was claimed, maybe
            Some(LocalFill::Held(_, held)) if held.holder == claim.holder => held,
            _ => claim,
        };
        // the lease goes while another request of this node may be fetching the URL beside this
        // claim (one that followed it, `FillClaim::ThisNode`): a POST through another node from
        // now on finds nothing, so that fetch is refused when it is stored
        leases.purged_here(&primary);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let task = leases.counters.background_task();
        runtime.spawn(async move {
            leases.release(&entry_key, &lease_key, claim).await;
            drop(task);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leases_value_is_its_time_then_its_holder_and_reads_back() {
        let holder = 0x00ab_cdef_0123_4567;
        let value = lease_value(holder);
        let text = std::str::from_utf8(&value).unwrap();
        let (ms, hex) = text.split_once(' ').unwrap();
        assert_eq!(hex, "00abcdef01234567");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let ms: u64 = ms.parse().unwrap();
        assert!(ms <= now && now - ms < 60_000, "{text}");
        assert_eq!(lease_field(&value, 0), Some(ms));
        assert_eq!(lease_holder(&value), Some(holder));
        assert_eq!(lease_holder(&lease_value(u64::MAX)), Some(u64::MAX));
        // an earlier version's lease: its time, and no holder
        assert_eq!(lease_field(b"1700000000000", 0), Some(1_700_000_000_000));
        assert_eq!(lease_holder(b"1700000000000"), None);
        assert_eq!(lease_holder(b"1700000000000 xyz"), None);
        assert_eq!(lease_field(b"", 0), None);
    }
}
