//! The cluster's invalidation log, kept in memcached: how a purge or ban made on one node reaches
//! every other node, and how a node that starts learns what was purged before it.
//!
//! * **Buckets.** A record is appended (memcached `append`, atomic) to the value of the 10-second
//!   bucket it is published in, `{namespace}:inval:{bucket}`, on **every** server: each server
//!   keeps a copy of the whole log, so the loss, freeze or ejection of any of them loses nothing
//!   as long as one copy was written. Buckets expire after the retention; short-lived records
//!   (purges whose entry was deleted and that found no fill lease, see
//!   [`crate::storage::ban_list::SHORT_RETENTION`]) go to buckets of
//!   their own, `{namespace}:inval:s:{bucket}`, that expire after minutes, so that purging many
//!   URLs does not fill memcached with a day of log. A bucket's value that takes no more
//!   (memcached refuses an append past its item size limit, 1 MiB by default: about ten thousand
//!   records; or a co-tenant filled the key with junk) goes on in overflow parts of its own,
//!   `{bucket key}.1`, `.2`, ... up to [`PARTS`] in all.
//! * **Reading.** Every node reads, every `poll_interval`, the buckets from the one before its
//!   last successful read of a server to the one after now (normally three keys, one pipelined
//!   round trip per server, each bucket's first overflow part asked with it, and one more round
//!   trip for each further part found), from every server it can reach, and keeps how far it has parsed
//!   each value (and a checksum of those bytes, so a value begun again after a restart is read
//!   from its start), so only what was appended since is decoded. At start the range is the whole
//!   retention (catch-up). Records are idempotent (see [`crate::storage::ban_list`]), so reading one twice,
//!   or from several servers, is harmless.
//! * **Presence.** Each node lists itself in `{namespace}:inval:nodes` (checked in every
//!   read, and added again to a server whose list lost it in a restart) and, after every
//!   read, writes a heartbeat `{namespace}:inval:node:{instance}` (its name and, per issuing
//!   node, the newest record it has applied) that expires a few polls later: a node issuing a
//!   purge reads them to report which nodes have it.
//!
//! Nothing here knows what a record means: the invalidation service decides.

use super::record::{decode_from, Record};
use crate::storage::ban_list::SHORT_RETENTION;
use bytes::Bytes;
use lacquer_memcached::{Appended, Cluster};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// The span of one bucket, in milliseconds.
const BUCKET_MS: u64 = 10_000;
/// The most bucket keys asked for in one round trip (a catch-up asks for thousands).
const KEYS_PER_READ: usize = 128;
/// How many values one bucket may take on each server: its key, then overflow parts. Until
/// 2026-12-08 a bucket was one value, and once full (memcached's item size limit, or a
/// co-tenant's junk) every append failed: purges answered 503 and reached no node until the next
/// bucket began (`log_and_reload_attacks::log_buckets_filled_to_the_item_limit_...`).
pub const PARTS: u32 = 16;

/// What a node's heartbeat says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heartbeat {
    /// The node's configured name.
    pub name: String,
    /// Per issuing node (instance id), the newest record sequence this node has applied.
    pub applied: HashMap<u64, u64>,
}

impl Heartbeat {
    fn encode(&self) -> Bytes {
        let mut text = self.name.replace(['\n', '\r'], " ");
        text.push('\n');
        for (issuer, seq) in &self.applied {
            text.push_str(&format!("{issuer:016x} {seq}\n"));
        }
        Bytes::from(text)
    }

    fn decode(value: &[u8]) -> Option<Heartbeat> {
        let text = std::str::from_utf8(value).ok()?;
        let mut lines = text.lines();
        let name = lines.next()?.to_string();
        let applied = lines
            .filter_map(|line| {
                let (issuer, seq) = line.split_once(' ')?;
                Some((u64::from_str_radix(issuer, 16).ok()?, seq.parse().ok()?))
            })
            .collect();
        Some(Heartbeat { name, applied })
    }

    /// Folds `other` (the same node's heartbeat read from another server) into this one.
    fn merge(&mut self, other: Heartbeat) {
        for (issuer, seq) in other.applied {
            let known = self.applied.entry(issuer).or_default();
            *known = (*known).max(seq);
        }
    }
}

/// The log, as one node reads and writes it.
pub struct SharedLog {
    cluster: Arc<Cluster>,
    /// `{namespace}:inval`.
    prefix: String,
    retention: Duration,
    /// Per server: the time (ms) of its last successful read, where the next read starts.
    read_since: Mutex<Vec<Option<u64>>>,
    /// Per (server, bucket key or part's key): how far the value has been parsed.
    parsed: Mutex<HashMap<(usize, Vec<u8>), Parsed>>,
    /// Per (server, bucket key): the part of the current buckets this node last appended to
    /// ([`PARTS`]: every part was full), where its next append goes if the part is still there
    /// ([`SharedLog::publish`]); none: the first.
    open_part: Mutex<HashMap<(usize, Vec<u8>), u32>>,
}

impl SharedLog {
    /// The log in `cluster` under `namespace`, whose records are kept for `retention`.
    pub fn new(cluster: Arc<Cluster>, namespace: &str, retention: Duration) -> SharedLog {
        let servers = cluster.server_count();
        SharedLog {
            cluster,
            prefix: format!("{namespace}:inval"),
            retention,
            read_since: Mutex::new(vec![None; servers]),
            parsed: Mutex::default(),
            open_part: Mutex::default(),
        }
    }

    /// How many servers keep a copy.
    pub fn server_count(&self) -> usize {
        self.cluster.server_count()
    }

    /// Server `index`'s name.
    pub fn server_name(&self, index: usize) -> &str {
        self.cluster.server_name(index)
    }

    /// Whether server `index` may be asked now (not ejected).
    pub fn is_usable(&self, index: usize) -> bool {
        self.cluster.is_usable(index)
    }

    fn bucket_key(&self, bucket: u64, short_lived: bool) -> Vec<u8> {
        let class = if short_lived { "s:" } else { "" };
        format!("{}:{class}{bucket}", self.prefix).into_bytes()
    }

    /// The key of part `part` of the bucket whose key is `bucket_key` (part 0: that key).
    fn part_key(bucket_key: &[u8], part: u32) -> Vec<u8> {
        match part {
            0 => bucket_key.to_vec(),
            _ => [bucket_key, format!(".{part}").as_bytes()].concat(),
        }
    }

    /// How long records of each kind matter.
    fn lifetime(&self, short_lived: bool) -> Duration {
        if short_lived {
            SHORT_RETENTION.min(self.retention)
        } else {
            self.retention
        }
    }

    fn nodes_key(&self) -> Vec<u8> {
        format!("{}:nodes", self.prefix).into_bytes()
    }

    fn heartbeat_key(&self, instance: u64) -> Vec<u8> {
        format!("{}:node:{instance:016x}", self.prefix).into_bytes()
    }

    /// A little longer than records of the kind matter, so a reader never finds half a bucket
    /// gone.
    fn ttl(&self, short_lived: bool) -> u32 {
        (self.lifetime(short_lived).as_secs() + 60).min(30 * 24 * 3600) as u32
    }

    /// Appends `record` (as [`Record::encode`] made it; short-lived or not) to the bucket of
    /// `now_ms` on each of `servers` at once; returns the servers that stored it.
    ///
    /// A bucket's parts are filled in order, so that a reader, which asks for part `p + 1` only
    /// once it found part `p`, finds every record: a server's part that refuses the record
    /// (full) passes it to the next, up to [`PARTS`]. The part a server last took records in is
    /// remembered for the bucket, and appended to only if it is still there: gone (the server
    /// restarted, and forgot the parts before it too), the record goes through the parts from the
    /// first again. Until 2026-12-08 it was appended to that part, created anew, where no reader
    /// looked: the purge answered `complete` and reached no node
    /// (`log_overflow_attacks::a_purge_after_a_restart_mid_overflow_reaches_b`). A server found
    /// with every part full is not asked again for the bucket (each try cost four round trips a
    /// part, and retried publications, one after another, held the node's log reads back for
    /// seconds: `purges_pending_for_a_server_whose_parts_are_all_full_...`).
    pub async fn publish(
        &self,
        record: &Bytes,
        short_lived: bool,
        servers: &[usize],
        now_ms: u64,
    ) -> Vec<usize> {
        let key = self.bucket_key(now_ms / BUCKET_MS, short_lived);
        let ttl = self.ttl(short_lived);
        let last_parts: Vec<u32> = {
            let mut open = self.open_part.lock();
            // a bucket of the past takes no more appends from this node
            let current = [
                self.bucket_key(now_ms / BUCKET_MS, false),
                self.bucket_key(now_ms / BUCKET_MS, true),
            ];
            open.retain(|(_, bucket), _| current.contains(bucket));
            servers
                .iter()
                .map(|&index| open.get(&(index, key.clone())).copied().unwrap_or_default())
                .collect()
        };
        let mut appends = JoinSet::new();
        for (&index, last) in servers.iter().zip(last_parts) {
            let (cluster, key, record) = (self.cluster.clone(), key.clone(), record.clone());
            appends.spawn(async move {
                let taken = SharedLog::append_in_order(&cluster, index, &key, record, ttl, last);
                (index, taken.await)
            });
        }
        let mut stored = Vec::new();
        while let Some(done) = appends.join_next().await {
            let Ok((index, taken)) = done else { continue };
            let mut open = self.open_part.lock();
            match taken {
                PartTaken::In(part) => {
                    stored.push(index);
                    match part {
                        0 => open.remove(&(index, key.clone())),
                        _ => open.insert((index, key.clone()), part),
                    };
                }
                PartTaken::AllFull => {
                    open.insert((index, key.clone()), PARTS);
                }
                PartTaken::Unanswered => {}
            }
        }
        stored.sort_unstable();
        stored
    }

    /// One server's part of [`Self::publish`]: `record` appended to the part of `bucket` this
    /// node last appended to (`last`; [`PARTS`]: every part was full), if it is still there, else
    /// to the first of its parts, in order, that takes it.
    async fn append_in_order(
        cluster: &Cluster,
        index: usize,
        bucket: &[u8],
        record: Bytes,
        ttl: u32,
        last: u32,
    ) -> PartTaken {
        if last >= PARTS {
            return PartTaken::AllFull;
        }
        if last > 0 {
            let part_key = SharedLog::part_key(bucket, last);
            match cluster
                .append_if_present_on(index, &part_key, record.clone())
                .await
            {
                Appended::Stored => return PartTaken::In(last),
                Appended::Unanswered => return PartTaken::Unanswered,
                // full, or gone: the parts are gone through from the first
                Appended::Refused => {}
            }
        }
        for part in 0..PARTS {
            let part_key = SharedLog::part_key(bucket, part);
            match cluster
                .append_on(index, &part_key, record.clone(), ttl)
                .await
            {
                Appended::Stored => return PartTaken::In(part),
                Appended::Refused => {}
                Appended::Unanswered => return PartTaken::Unanswered,
            }
        }
        log::warn!(
            "invalidation: memcached {} took no record in any of the {PARTS} parts of log \
             bucket {}",
            cluster.server_name(index),
            String::from_utf8_lossy(bucket)
        );
        PartTaken::AllFull
    }

    /// Reads what every reachable server's copy gained since this node last read it (at start:
    /// everything within the retention), and lists `member` (this node's instance id) in the
    /// members list of every server whose copy lacks it. Returns the records and the servers that
    /// answered.
    ///
    /// The list is read in the same round trip as the buckets: it is checked on every read, not
    /// only at start, because a server restarted (or one that evicted the list) forgets its
    /// members, and a waiting purge reads the heartbeats of listed nodes only, so until this node
    /// is listed again it would answer "complete" without it (`tests/log_and_reload_attacks.rs`).
    /// (Until 2026-12-08 that was a `get` of its own per server before each read, one server
    /// after the other: a frozen server that was not yet ejected cost each poll its `op_timeout`
    /// twice.)
    pub async fn read_new(&self, now_ms: u64, member: u64) -> (Vec<Record>, Vec<usize>) {
        let keys_to_read = |since: Option<u64>, short_lived: bool| {
            let oldest = now_ms.saturating_sub(self.lifetime(short_lived).as_millis() as u64);
            let from = since.unwrap_or(oldest).max(oldest) / BUCKET_MS;
            (from.saturating_sub(1)..=now_ms / BUCKET_MS + 1)
                .map(move |bucket| self.bucket_key(bucket, short_lived))
        };
        let ranges: Vec<(usize, Vec<Vec<u8>>)> = {
            let since = self.read_since.lock();
            (0..self.server_count())
                .filter(|&i| self.cluster.is_usable(i))
                .map(|i| {
                    let keys = keys_to_read(since[i], false)
                        .chain(keys_to_read(since[i], true))
                        .collect();
                    (i, keys)
                })
                .collect()
        };
        let listing = format!("{member:016x}");
        let members_ttl = self.ttl(false);
        let mut reads = JoinSet::new();
        for (index, buckets) in ranges {
            let (cluster, nodes_key, listing) =
                (self.cluster.clone(), self.nodes_key(), listing.clone());
            reads.spawn(async move {
                // the members list, then each bucket with its first overflow part; a further
                // part only after the one before it was found
                let mut keys: Vec<Vec<u8>> = std::iter::once(nodes_key.clone())
                    .chain(
                        buckets
                            .iter()
                            .flat_map(|bucket| [bucket.clone(), SharedLog::part_key(bucket, 1)]),
                    )
                    .collect();
                let mut values = Vec::with_capacity(keys.len());
                for batch in keys.chunks(KEYS_PER_READ) {
                    match cluster.get_multi_on(index, batch).await {
                        Some(found) => values.extend(found),
                        None => return (index, keys, None),
                    }
                }
                keys.remove(0);
                let members = values.remove(0);
                let listed = members.as_deref().is_some_and(|list| {
                    String::from_utf8_lossy(list).lines().any(|l| l == listing)
                });
                if !listed {
                    let line = Bytes::from(format!("{listing}\n"));
                    cluster
                        .append_on(index, &nodes_key, line, members_ttl)
                        .await;
                }
                let mut asked: Vec<(usize, u32)> = (0..buckets.len())
                    .filter(|b| values[2 * b + 1].is_some())
                    .map(|b| (b, 2))
                    .collect();
                while !asked.is_empty() {
                    asked.retain(|&(_, part)| part < PARTS);
                    let batch: Vec<Vec<u8>> = asked
                        .iter()
                        .map(|&(b, part)| SharedLog::part_key(&buckets[b], part))
                        .collect();
                    if batch.is_empty() {
                        break;
                    }
                    let mut found = Vec::with_capacity(batch.len());
                    for chunk in batch.chunks(KEYS_PER_READ) {
                        match cluster.get_multi_on(index, chunk).await {
                            Some(values) => found.extend(values),
                            None => return (index, keys, None),
                        }
                    }
                    let mut next = Vec::new();
                    for ((b, part), (key, value)) in asked.iter().zip(batch.into_iter().zip(found))
                    {
                        if value.is_some() {
                            next.push((*b, part + 1));
                        }
                        keys.push(key);
                        values.push(value);
                    }
                    asked = next;
                }
                (index, keys, Some(values))
            });
        }
        let mut records = Vec::new();
        let mut answered = Vec::new();
        while let Some(done) = reads.join_next().await {
            let Ok((index, keys, Some(values))) = done else {
                continue;
            };
            let mut parsed = self.parsed.lock();
            for (key, value) in keys.into_iter().zip(values) {
                let Some(value) = value else { continue };
                let parsed = parsed.entry((index, key)).or_default();
                let from = parsed.resume_in(&value);
                let (found, end) = decode_from(&value, from);
                *parsed = Parsed::up_to(&value, end);
                records.extend(found);
            }
            self.read_since.lock()[index] = Some(now_ms);
            answered.push(index);
        }
        // forget values of buckets no read will ask for again unless a server was unreachable
        // (then they are read whole, which is harmless)
        let current = now_ms / BUCKET_MS;
        let recent: Vec<Vec<u8>> = (current.saturating_sub(2)..=current + 1)
            .flat_map(|bucket| {
                [
                    self.bucket_key(bucket, false),
                    self.bucket_key(bucket, true),
                ]
            })
            .collect();
        let of_recent = |key: &[u8]| {
            recent.iter().any(|bucket| {
                key.strip_prefix(bucket.as_slice())
                    .is_some_and(|rest| rest.is_empty() || rest[0] == b'.')
            })
        };
        self.parsed.lock().retain(|(_, key), _| of_recent(key));
        answered.sort_unstable();
        (records, answered)
    }

    /// Writes this node's heartbeat to every server it can reach, expiring after `ttl`.
    pub async fn heartbeat(&self, instance: u64, beat: &Heartbeat, ttl: Duration) {
        let key = self.heartbeat_key(instance);
        let value = beat.encode();
        let ttl = ttl.as_secs().max(1) as u32;
        let mut writes = JoinSet::new();
        for index in (0..self.server_count()).filter(|&i| self.cluster.is_usable(i)) {
            let (cluster, key, value) = (self.cluster.clone(), key.clone(), value.clone());
            writes.spawn(async move { cluster.set_on(index, &key, value, ttl).await });
        }
        while writes.join_next().await.is_some() {}
    }

    /// The heartbeats of every listed node that has one now (a node without one has stopped),
    /// by instance id, merged across servers.
    pub async fn heartbeats(&self) -> HashMap<u64, Heartbeat> {
        let mut instances: Vec<u64> = Vec::new();
        for index in (0..self.server_count()).filter(|&i| self.cluster.is_usable(i)) {
            if let Some(values) = self.cluster.get_multi_on(index, &[self.nodes_key()]).await {
                let listed = values[0].as_deref().unwrap_or_default();
                for line in String::from_utf8_lossy(listed).lines() {
                    if let Ok(id) = u64::from_str_radix(line.trim(), 16) {
                        if !instances.contains(&id) {
                            instances.push(id);
                        }
                    }
                }
            }
        }
        let keys: Vec<Vec<u8>> = instances.iter().map(|i| self.heartbeat_key(*i)).collect();
        let mut beats: HashMap<u64, Heartbeat> = HashMap::new();
        for index in (0..self.server_count()).filter(|&i| self.cluster.is_usable(i)) {
            for batch in (0..keys.len()).step_by(KEYS_PER_READ) {
                let end = (batch + KEYS_PER_READ).min(keys.len());
                let Some(values) = self.cluster.get_multi_on(index, &keys[batch..end]).await else {
                    break;
                };
                for (offset, value) in values.into_iter().enumerate() {
                    let Some(beat) = value.as_deref().and_then(Heartbeat::decode) else {
                        continue;
                    };
                    match beats.get_mut(&instances[batch + offset]) {
                        Some(known) => known.merge(beat),
                        None => {
                            beats.insert(instances[batch + offset], beat);
                        }
                    }
                }
            }
        }
        beats
    }
}

/// Where one server took a record ([`SharedLog::append_in_order`]).
enum PartTaken {
    /// In this part of the bucket.
    In(u32),
    /// Nowhere: every part refused it.
    AllFull,
    /// The server did not answer.
    Unanswered,
}

/// How much of one log value a node has parsed: the length, and a checksum of those bytes.
#[derive(Default)]
struct Parsed {
    len: usize,
    crc: u32,
}

impl Parsed {
    fn up_to(value: &[u8], len: usize) -> Self {
        Parsed {
            len,
            crc: crc32fast::hash(&value[..len]),
        }
    }

    /// Where to go on parsing `value`: where the last read stopped, when `value` still starts
    /// with what was parsed; else from its start. A value replaced since (its server restarted,
    /// or it expired, and appends began it again) is read whole: not only when it is now
    /// shorter, as before, but also when it has already grown past the old length, where
    /// resuming parsed from inside a record (that record and every later one of the bucket
    /// lost on this node: a ban never applied here).
    fn resume_in(&self, value: &[u8]) -> usize {
        match value.get(..self.len) {
            Some(prefix) if crc32fast::hash(prefix) == self.crc => self.len,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_begun_again_is_parsed_from_its_start_even_when_longer() {
        let old = b"first record|second".to_vec();
        let parsed = Parsed::up_to(&old, old.len());
        // grown by appends: resumed where the last read stopped
        let grown = [old.as_slice(), b"|third"].concat();
        assert_eq!(parsed.resume_in(&grown), old.len());
        // replaced by a longer value (the server restarted, appends began it again)
        let replaced = b"another record, longer than the first two".to_vec();
        assert!(replaced.len() > old.len());
        assert_eq!(parsed.resume_in(&replaced), 0);
        // and by a shorter one
        assert_eq!(parsed.resume_in(b"short"), 0);
        assert_eq!(Parsed::default().resume_in(b"anything"), 0);
    }

    #[test]
    fn heartbeats_round_trip_and_merge() {
        let beat = Heartbeat {
            name: "node\na".into(),
            applied: HashMap::from([(0xabc, 7), (1, 2)]),
        };
        let mut read = Heartbeat::decode(&beat.encode()).unwrap();
        assert_eq!(read.name, "node a");
        assert_eq!(read.applied, beat.applied);
        read.merge(Heartbeat {
            name: "node a".into(),
            applied: HashMap::from([(0xabc, 5), (1, 9), (3, 1)]),
        });
        assert_eq!(read.applied, HashMap::from([(0xabc, 7), (1, 9), (3, 1)]));
    }
}
