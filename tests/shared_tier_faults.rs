//! A dead, frozen or refusing memcached server costs a request at most `op_timeout`: two Lacquer
//! nodes over three real memcached processes, with the server that holds the URL's entry killed,
//! SIGSTOPped or refusing the write. The fill lease is long (60 s) in every test, so a request
//! that waited on it would still be waiting when the test's own bound (a few seconds) runs out;
//! nothing here asserts on a duration shorter than that.

use lacquer_test_support as support;

use lacquer::storage::tiered::memcached_key;
use lacquer_memcached::ketama::KetamaRing;
use pingora_cache::key::CacheHashKey;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::*;

/// Far longer than any wait a test below tolerates.
const LEASE: &str = "60s";
/// How long a request may take in these tests before it counts as held up by a lease.
const PATIENCE: Duration = Duration::from_secs(15);
const SITE: [(&str, &str); 1] = [("host", "shop.example")];

struct Cluster {
    servers: Vec<MemcachedProcess>,
}

impl Cluster {
    fn start() -> Cluster {
        Cluster {
            servers: (0..3).map(|_| MemcachedProcess::start()).collect(),
        }
    }

    fn ring(&self) -> KetamaRing {
        KetamaRing::new(
            &self
                .servers
                .iter()
                .map(|m| (m.addr().to_string(), 1))
                .collect::<Vec<_>>(),
        )
    }

    /// A node with a 60 s fill lease and a 200 ms operation timeout; `extra` is appended to
    /// `[cache.memcached]`.
    fn node(&self, origin: &TestOrigin, extra: &str) -> (LacquerProcess, u16) {
        self.node_tuned(origin, LEASE, "200ms", extra)
    }

    /// A node with the given fill lease and operation timeout.
    fn node_tuned(
        &self,
        origin: &TestOrigin,
        lease: &str,
        op_timeout: &str,
        extra: &str,
    ) -> (LacquerProcess, u16) {
        let admin = free_port();
        let servers: Vec<String> = self
            .servers
            .iter()
            .map(|m| format!("\"{}\"", m.addr()))
            .collect();
        let config = format!(
            "[log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [cache.memcached]\nservers = [{}]\nfill_lease = \"{lease}\"\n\
             op_timeout = \"{op_timeout}\"\nconnect_timeout = \"100ms\"\nretry_after = \"1s\"\n{extra}",
            servers.join(", ")
        );
        (LacquerProcess::start_simple(origin.addr(), &config), admin)
    }
}

/// A URL of the site, with the memcached key of its entry, its lease key, and the index of the
/// server holding both.
struct Url {
    path: String,
    entry: String,
    lease: String,
    server: usize,
}

impl Url {
    /// The first `/{prefix}/{i}` whose entry ketama places on server `wanted`.
    fn on(cluster: &Cluster, prefix: &str, wanted: usize) -> Url {
        let ring = cluster.ring();
        (0..1000)
            .map(|i| {
                let path = format!("/{prefix}/{i}");
                let key = lacquer::proxy::cache_key::of_url(SITE[0].1, &path);
                let entry = memcached_key("lq", &key);
                let server = ring.server_for(entry.as_bytes()).unwrap();
                let lease = format!("lq:fill:{}", key.primary());
                Url {
                    path,
                    entry,
                    lease,
                    server,
                }
            })
            .find(|u| u.server == wanted)
            .unwrap()
    }
}

/// An origin whose first answer for each path takes `first_delay`, and every later one none; the
/// body names the path and the origin's request count, so a refetch is visible.
fn origin_slow_at_first(first_delay: Duration, len: usize) -> TestOrigin {
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let count = AtomicUsize::new(0);
    TestOrigin::start(move |req| {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        let nth = {
            let mut seen = seen.lock().unwrap();
            let c = seen.entry(req.path.clone()).or_insert(0usize);
            *c += 1;
            *c
        };
        let mut body = format!("{} #{n}", req.path).into_bytes();
        body.resize(len.max(body.len()), b'.');
        let resp = OriginResponse::ok(body).header("cache-control", "max-age=300");
        if nth == 1 {
            resp.delay(first_delay)
        } else {
            resp
        }
    })
}

/// Fills `url` through `node` (an origin slow at first) and freezes the server of its entry once
/// the fill's lease is there, before the fill is written; returns the fill's `200` answer.
async fn fill_then_freeze(cluster: &Cluster, node: &LacquerProcess, url: &Url) -> Resp {
    let server = &cluster.servers[url.server];
    let filling = tokio::spawn(get_within_patience(node.url(&url.path)));
    // the lease is claimed as the fetch starts
    assert!(
        poll_until_async(PATIENCE, || server.holds(&url.lease)).await,
        "no lease while the page was fetched"
    );
    server.freeze();
    let filled = filling.await.unwrap();
    assert_eq!(filled.status, 200);
    filled
}

async fn get_within_patience(url: String) -> Resp {
    tokio::time::timeout(PATIENCE, get(&url, &SITE))
        .await
        .expect("the request was held up as if waiting out the fill lease")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fill_lease_lives_on_the_server_of_the_entry_it_guards() {
    let cluster = Cluster::start();
    // each first answer takes long enough for the lease to be looked at while the fill is out
    let origin = origin_slow_at_first(Duration::from_millis(600), 0);
    let (a, admin_a) = cluster.node(&origin, "");
    for wanted in 0..3 {
        let url = Url::on(&cluster, "placed", wanted);
        let filling = tokio::spawn(get_within_patience(a.url(&url.path)));
        let claimed = poll_until_async(PATIENCE, || {
            cluster
                .servers
                .iter()
                .any(|server| server.holds(&url.lease))
        })
        .await;
        assert!(claimed, "no lease for {} while it was filled", url.path);
        // the lease is on the entry's server only
        for (i, server) in cluster.servers.iter().enumerate() {
            assert_eq!(
                server.holds(&url.lease),
                i == url.server,
                "lease of {} on server {i}, entry on {}",
                url.path,
                url.server
            );
        }
        assert_eq!(filling.await.unwrap().status, 200);
        assert_eq!(
            admin_stat(admin_a, "fills_claimed").await,
            wanted as u64 + 1
        );
        // a fill written to memcached deletes its lease
        assert_eq!(
            wait_for_stat(admin_a, "writes", wanted as u64 + 1, PATIENCE).await,
            wanted as u64 + 1
        );
        assert!(
            !cluster.servers[url.server].holds(&url.lease),
            "the lease of {} outlived its written fill",
            url.path
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_server_means_no_lease_and_no_wait_on_either_node() {
    let mut cluster = Cluster::start();
    let origin = origin_slow_at_first(Duration::from_millis(500), 0);
    let (a, admin_a) = cluster.node(&origin, "");
    let (b, admin_b) = cluster.node(&origin, "");
    let url = Url::on(&cluster, "dead", 1);
    cluster.servers[1].kill();
    // both nodes miss at once; the first answer takes half a second
    let (from_a, from_b) = tokio::join!(
        get_within_patience(a.url(&url.path)),
        get_within_patience(b.url(&url.path))
    );
    assert_eq!((from_a.status, from_b.status), (200, 200));
    assert!(from_a.text().starts_with(&url.path) && from_b.text().starts_with(&url.path));
    // nobody could coordinate through a dead server, so nobody claimed or waited
    for admin in [admin_a, admin_b] {
        assert_eq!(admin_stat(admin, "fills_claimed").await, 0);
        assert_eq!(admin_stat(admin, "fills_awaited").await, 0);
        assert!(admin_stat(admin, "fills_unguarded").await >= 1);
    }
    assert_eq!(
        origin.hits_for(&url.path),
        2,
        "each node fetched for itself"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_stops_waiting_when_the_entry_server_freezes() {
    let cluster = Cluster::start();
    // A's fetch takes 20 s; everything after it is immediate
    let origin = origin_slow_at_first(Duration::from_secs(20), 0);
    let (a, admin_a) = cluster.node(&origin, "");
    let (b, admin_b) = cluster.node(&origin, "");
    let url = Url::on(&cluster, "frozen", 2);
    let filling = tokio::spawn({
        let url = a.url(&url.path);
        async move { get(&url, &SITE).await }
    });
    assert!(
        origin
            .wait_for_hits_for_async(&url.path, 1, Duration::from_secs(10))
            .await,
        "A never reached the origin"
    );
    assert_eq!(admin_stat(admin_a, "fills_claimed").await, 1);
    // B finds A's lease and waits for A's fill...
    let waiting = tokio::spawn({
        let url = b.url(&url.path);
        async move { get(&url, &SITE).await }
    });
    // (on a busy machine B may take a while to get there: its /stats says when it waits)
    let mut started = false;
    for _ in 0..500 {
        if admin_stat(admin_b, "fill_waits").await == 1 {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started, "B never began waiting for A's fill");
    assert!(!waiting.is_finished(), "B did not wait for A's fill");
    // ...until the server holding the entry (and the lease) stops answering
    cluster.servers[url.server].freeze();
    let from_b = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("B kept waiting on a lease whose server is frozen")
        .unwrap();
    assert_eq!(from_b.status, 200);
    assert!(from_b.text().starts_with(&format!("{} #", url.path)));
    assert!(
        !filling.is_finished(),
        "B was served before A's 20 s fetch ended: it did not wait for it"
    );
    assert_eq!(origin.hits_for(&url.path), 2, "B fetched for itself");
    assert_eq!(admin_stat(admin_b, "fills_awaited").await, 0);
    assert_eq!(admin_stat(admin_b, "fill_waits_cut").await, 1);
    cluster.servers[url.server].thaw();
    filling.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_server_costs_no_lease_after_the_miss_that_timed_out() {
    let cluster = Cluster::start();
    let origin = origin_slow_at_first(Duration::from_millis(300), 0);
    let (a, admin_a) = cluster.node(&origin, "");
    let (b, admin_b) = cluster.node(&origin, "");
    let url = Url::on(&cluster, "stopped", 0);
    cluster.servers[0].freeze();
    let (from_a, from_b) = tokio::join!(
        get_within_patience(a.url(&url.path)),
        get_within_patience(b.url(&url.path))
    );
    assert_eq!((from_a.status, from_b.status), (200, 200));
    for admin in [admin_a, admin_b] {
        assert_eq!(
            admin_stat(admin, "fills_claimed").await,
            0,
            "a lease was claimed on a server whose get had just timed out"
        );
        assert_eq!(admin_stat(admin, "fills_unguarded").await, 1);
    }
    cluster.servers[0].thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_older_than_its_length_holds_nobody_up() {
    let cluster = Cluster::start();
    let origin = origin_slow_at_first(Duration::ZERO, 0);
    let (b, admin_b) = cluster.node(&origin, "");
    let url = Url::on(&cluster, "thawed", 1);
    // what a frozen server leaves behind when it thaws: an `add` whose client gave up long ago,
    // applied now, its claim time two minutes old (memcached itself would keep it for 60 s)
    let claimed_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        - 120_000;
    let value = claimed_ms.to_string();
    let server = &cluster.servers[url.server];
    let reply = server.command(
        &format!("set {} 0 60 {}", url.lease, value.len()),
        Some(value.as_bytes()),
    );
    assert!(reply.starts_with("STORED"), "{reply}");
    let resp = get_within_patience(b.url(&url.path)).await;
    assert_eq!(resp.status, 200);
    assert_eq!(origin.hits_for(&url.path), 1);
    // found again once its time had run out, it is taken over (swapped for B's claim by its
    // token), so that B's fetch is guarded by a lease of its own (until 2026-12-06 B
    // fetched beside it, claimed by no one: `tests/guarded_elsewhere_attacks.rs`)
    assert_eq!(
        admin_stat(admin_b, "fills_claimed").await,
        1,
        "the stale lease was not taken over"
    );
    assert_eq!(admin_stat(admin_b, "fills_awaited").await, 0);
    // B's lease is released once its fill is written
    assert_eq!(wait_for_stat(admin_b, "writes", 1, PATIENCE).await, 1);
    assert!(
        !server.holds(&url.lease),
        "the lease outlived the fill written after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_whose_write_is_refused_releases_the_other_node() {
    let cluster = Cluster::start();
    // 2 MB bodies, written as one item (item_size 4 MiB) that memcached (1 MiB items) refuses
    let origin = origin_slow_at_first(Duration::from_millis(1500), 2 << 20);
    let extra = "item_size = \"4MiB\"";
    let (a, admin_a) = cluster.node(&origin, extra);
    let (b, admin_b) = cluster.node(&origin, extra);
    let url = Url::on(&cluster, "refused", 0);
    let filling = tokio::spawn({
        let url = a.url(&url.path);
        async move { get(&url, &SITE).await }
    });
    assert!(
        origin
            .wait_for_hits_for_async(&url.path, 1, Duration::from_secs(10))
            .await
    );
    let from_b = get_within_patience(b.url(&url.path)).await;
    let from_a = filling.await.unwrap();
    assert_eq!((from_a.status, from_b.status), (200, 200));
    assert_eq!(from_b.body.len(), 2 << 20);
    assert_eq!(admin_stat(admin_a, "fills_claimed").await, 1);
    assert!(admin_stat(admin_a, "write_failures").await >= 1);
    assert_eq!(
        admin_stat(admin_b, "fills_awaited").await,
        0,
        "B cannot have been served by a fill that never reached memcached"
    );
    assert_eq!(
        origin.hits_for(&url.path),
        2,
        "B fetched for itself once released"
    );
    assert!(
        admin_stat(admin_a, "ejections").await == 0,
        "a server that refuses a value answered: it is not ejected"
    );
    assert!(!cluster.servers[url.server].holds(&url.entry));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_written_to_a_frozen_server_is_trusted_here_only_until_the_write_times_out() {
    let cluster = Cluster::start();
    let origin = origin_slow_at_first(Duration::from_millis(600), 0);
    // local_ttl = 0s: this node trusts its memory tier for nothing of its own, only a fill
    // whose write to memcached is still in flight; the write is given 4 s before it fails
    let (a, admin_a) = cluster.node_tuned(&origin, LEASE, "4s", "local_ttl = \"0s\"");
    let url = Url::on(&cluster, "frozen-write", 1);
    let server = &cluster.servers[url.server];
    let filled = fill_then_freeze(&cluster, &a, &url).await;
    let first = format!("{} #1", url.path);
    assert_eq!(filled.text(), first);
    // while the write hangs, this node serves its fill: no origin fetch, no wait on memcached
    let during = gets_at_once(vec![a.url(&url.path); 8], &SITE).await;
    for resp in &during {
        assert_eq!((resp.status, resp.text()), (200, first.clone()));
    }
    assert_eq!(
        admin_stat(admin_a, "write_failures").await,
        0,
        "the write ended before the requests meant to run beside it"
    );
    assert_eq!(origin.hits_for(&url.path), 1);
    // once the write has timed out, the copy is not trusted: the next request fetches again
    assert_eq!(
        wait_for_stat(admin_a, "write_failures", 1, PATIENCE).await,
        1,
        "the write to a frozen server never failed"
    );
    let after = get_within_patience(a.url(&url.path)).await;
    assert_eq!(after.status, 200);
    assert_eq!(
        after.text(),
        format!("{} #2", url.path),
        "a copy whose write failed was still trusted with local_ttl = 0s"
    );
    server.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hostile_value_under_a_lease_key_holds_a_request_up_for_one_fill_lease_at_most() {
    let cluster = Cluster::start();
    let origin = origin_slow_at_first(Duration::ZERO, 0);
    // a 1 s lease: a wait bounded by anything the planted value says (an hour, forever) would
    // outlast PATIENCE
    let (a, admin_a) = cluster.node_tuned(&origin, "1s", "200ms", "");
    let hour_ahead_ms = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3_600_000)
        .to_string();
    let planted: Vec<Vec<u8>> = vec![
        b"not a time".to_vec(),
        hour_ahead_ms.into_bytes(),
        u64::MAX.to_string().into_bytes(),
        b"-5".to_vec(),
        Vec::new(),
        vec![b'9'; 64 << 10],
    ];
    for (i, value) in planted.iter().enumerate() {
        let url = Url::on(&cluster, &format!("planted{i}"), i % 3);
        let server = &cluster.servers[url.server];
        // stored with no expiry: only a fill written after it takes it away
        let reply = server.command(
            &format!("set {} 0 0 {}", url.lease, value.len()),
            Some(value),
        );
        assert!(reply.starts_with("STORED"), "{reply}");
        let resp = get_within_patience(a.url(&url.path)).await;
        assert_eq!(resp.status, 200, "lease value {i}");
        assert_eq!(resp.text(), format!("{} #{}", url.path, i + 1));
        assert_eq!(
            admin_stat(admin_a, "fill_waits").await,
            i as u64 + 1,
            "lease value {i} was not taken for another node's claim"
        );
        // waited out, found again and taken over: the URL is claimed (until 2026-12-06 it was
        // fetched beside the planted lease, claimed by no one)
        assert_eq!(admin_stat(admin_a, "fills_claimed").await, i as u64 + 1);
        // the fill written after the wait releases its lease: the planted one is gone
        assert_eq!(
            wait_for_stat(admin_a, "writes", i as u64 + 1, PATIENCE).await,
            i as u64 + 1
        );
        assert!(
            !server.holds(&url.lease),
            "lease value {i} outlived the fill written after it"
        );
    }
    assert_eq!(origin.hits(), planted.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_node_finishes_the_write_of_its_last_fill() {
    let cluster = Cluster::start();
    let origin = origin_slow_at_first(Duration::from_millis(600), 0);
    // the write may wait 5 s for a frozen server
    let (mut a, _admin) = cluster.node_tuned(&origin, LEASE, "5s", "");
    let url = Url::on(&cluster, "last-fill", 2);
    let server = &cluster.servers[url.server];
    // the fill's write hangs until the server thaws
    fill_then_freeze(&cluster, &a, &url).await;
    // SIGTERM with no request left, only the write: the node waits for it
    assert!(a.signal("TERM"));
    let exited_at_once = a.wait_exit(Duration::from_secs(1));
    server.thaw();
    assert!(
        exited_at_once.is_none(),
        "the node exited with its last fill's write in flight"
    );
    let status = a.wait_exit(PATIENCE).expect("the node never exited");
    assert!(status.success(), "{status:?}");
    assert!(
        server.holds(&url.entry),
        "the last fill never reached memcached"
    );
    assert!(
        !server.holds(&url.lease),
        "its lease was left to hold the other nodes up until it expires"
    );
}
