//! The shared tier: two Lacquer nodes over three real memcached servers form one cache.

use lacquer_test_support as support;

use lacquer::storage::tiered::memcached_key;
use lacquer_memcached::ketama::KetamaRing;
use support::*;

/// How long a `/stats` counter is waited for.
const STAT_WAIT: Duration = Duration::from_secs(5);

struct Cluster {
    servers: Vec<MemcachedProcess>,
}

impl Cluster {
    fn start() -> Cluster {
        Cluster {
            servers: (0..3).map(|_| MemcachedProcess::start()).collect(),
        }
    }

    fn names(&self) -> Vec<String> {
        self.servers.iter().map(|m| m.addr().to_string()).collect()
    }

    /// The server ketama places `key` on, computed independently of the proxy's own placement.
    fn server_for(&self, key: &str) -> usize {
        let ring = KetamaRing::new(&self.names().into_iter().map(|n| (n, 1)).collect::<Vec<_>>());
        ring.server_for(key.as_bytes()).unwrap()
    }

    fn node(&self, origin: &TestOrigin) -> (LacquerProcess, u16) {
        self.node_with_local_ttl(origin, "2s")
    }

    /// A node of the cluster. Its memcached timeouts are generous: these tests are about what
    /// the cluster shares, not about failing servers (`shared_tier_faults.rs` freezes those).
    /// With 200 ms, a loaded 2-core machine rendered a page twice now and then (once in CI, once
    /// in ~155 runs under CPU hogs): the filling node saw no error, and an operation of the
    /// other node timing out (it then fills unguarded, by design) is the path that explains it. The coalescing test prints both nodes' stats when
    /// it fails, to tell.
    fn node_with_local_ttl(&self, origin: &TestOrigin, local_ttl: &str) -> (LacquerProcess, u16) {
        let admin = free_port();
        let servers: Vec<String> = self.names().iter().map(|n| format!("\"{n}\"")).collect();
        let extra = format!(
            "[log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [cache.memcached]\nservers = [{}]\nretry_after = \"1s\"\nlocal_ttl = \"{local_ttl}\"\n\
             op_timeout = \"1s\"\nconnect_timeout = \"500ms\"",
            servers.join(", ")
        );
        (LacquerProcess::start_simple(origin.addr(), &extra), admin)
    }
}

/// The site both nodes serve, as a load balancer in front of them would pass it on.
const SITE: [(&str, &str); 1] = [("host", "shop.example")];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_fetched_through_one_node_is_a_hit_on_the_other() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let (a, admin_a) = cluster.node(&origin);
    let (b, admin_b) = cluster.node(&origin);
    let path = "/shared?cc=max-age%3D300";

    let first = get(&a.url(path), &SITE).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        wait_for_stat(admin_a, "writes", 1, STAT_WAIT).await,
        1,
        "A wrote the entry to memcached"
    );

    let from_b = get(&b.url(path), &SITE).await;
    assert!(from_b.is_hit(), "{:?}", from_b.cache_status());
    assert_eq!(from_b.body, first.body);
    assert_eq!(
        admin_stat(admin_b, "hits").await,
        1,
        "B's hit came from memcached"
    );
    assert_eq!(origin.hits_for(path), 1, "no second origin request");
    // promoted: B now answers from its own memory tier
    assert!(get(&b.url(path), &SITE).await.is_hit());
    assert_eq!(admin_stat(admin_b, "hits").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_promotion_every_hit_reads_memcached_and_a_miss_asks_it_once() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let (a, admin) = cluster.node_with_local_ttl(&origin, "0s");
    let path = "/lang?cc=max-age%3D300&vary=Accept-Language";
    let en = [("host", "shop.example"), ("accept-language", "en")];
    let fr = [("host", "shop.example"), ("accept-language", "fr")];

    let first = get(&a.url(path), &en).await;
    assert_eq!(first.cache_fwd().as_deref(), Some("uri-miss"));
    assert_eq!(
        admin_stat(admin, "misses").await,
        1,
        "one memcached read for a miss, not one per lookup phase"
    );
    assert_eq!(wait_for_stat(admin, "writes", 1, STAT_WAIT).await, 1);

    // the memory tier keeps nothing: each hit is a verified memcached read
    for n in 1..=3 {
        let hit = get(&a.url(path), &en).await;
        assert!(hit.is_hit(), "{:?}", hit.cache_status());
        assert_eq!(hit.body, first.body);
        assert_eq!(admin_stat(admin, "hits").await, n);
    }

    // another variant: found missing among the stored variants, fetched once, then a hit
    let fr_first = get(&a.url(path), &fr).await;
    assert_eq!(fr_first.cache_fwd().as_deref(), Some("vary-miss"));
    assert_ne!(fr_first.body, first.body);
    assert_eq!(wait_for_stat(admin, "writes", 2, STAT_WAIT).await, 2);
    let fr_hit = get(&a.url(path), &fr).await;
    assert!(fr_hit.is_hit(), "{:?}", fr_hit.cache_status());
    assert_eq!(fr_hit.body, fr_first.body);
    let en_hit = get(&a.url(path), &en).await;
    assert_eq!(en_hit.body, first.body);
    assert_eq!(origin.hits_for(path), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purging_a_url_retires_every_variant_in_memcached() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    // no promotion, so every lookup below reads memcached, where only the primary slot is deleted
    let (a, admin) = cluster.node_with_local_ttl(&origin, "0s");
    let path = "/purge-variants?cc=max-age%3D300&vary=Accept-Language";
    let en = [("host", "shop.example"), ("accept-language", "en")];
    let fr = [("host", "shop.example"), ("accept-language", "fr")];
    // each write reaches memcached before the next request, or fr could find no primary there
    // and take the primary slot itself
    get(&a.url(path), &en).await;
    assert_eq!(wait_for_stat(admin, "writes", 1, STAT_WAIT).await, 1);
    get(&a.url(path), &fr).await;
    assert_eq!(wait_for_stat(admin, "writes", 2, STAT_WAIT).await, 2);
    assert!(get(&a.url(path), &en).await.is_hit());
    assert!(get(&a.url(path), &fr).await.is_hit());

    let purged = request("PURGE", &a.url(path), &SITE, None).await;
    assert_eq!(purged.status, 200);
    // en (first stored, so in the primary slot) is fetched again and takes the primary slot; the
    // fr variant still sits in memcached under its own key, older than the new primary, so it is
    // a miss and fetched again too: a purge of the URL purges every representation
    let en_again = get(&a.url(path), &en).await;
    assert!(!en_again.is_hit(), "{:?}", en_again.cache_status());
    assert_eq!(wait_for_stat(admin, "writes", 3, STAT_WAIT).await, 3);
    let fr_again = get(&a.url(path), &fr).await;
    assert!(
        !fr_again.is_hit(),
        "purged variant served: {:?}",
        fr_again.cache_status()
    );
    assert!(fr_again.text().ends_with("#4"), "{}", fr_again.text());
    assert_eq!(origin.hits_for(path), 4);
}

/// A generated page of `len` bytes fetched through `node` (whose admin listener is `admin`) and
/// written to memcached: its path and the answer.
async fn filled_through(node: &LacquerProcess, admin: u16, len: usize) -> (String, Resp) {
    let path = format!("/big?cc=max-age%3D300&len={len}");
    let first = get(&node.url(&path), &SITE).await;
    assert_eq!(first.body.len(), len);
    assert_eq!(wait_for_stat(admin, "writes", 1, STAT_WAIT).await, 1);
    (path, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_five_megabyte_object_round_trips_through_chunks() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let (a, admin_a) = cluster.node(&origin);
    let (b, _admin_b) = cluster.node(&origin);
    let len = 5 * 1024 * 1024 + 3;
    let (path, _) = filled_through(&a, admin_a, len).await;
    let from_b = get(&b.url(&path), &SITE).await;
    assert!(from_b.is_hit(), "{:?}", from_b.cache_status());
    assert_eq!(from_b.body.len(), len);
    assert!(
        verify_generated(&from_b.body, 7, 0),
        "reassembled body differs"
    );
    assert_eq!(origin.hits_for(&path), 1);
    let items: u64 = cluster
        .servers
        .iter()
        .map(|m| m.stat("curr_items").unwrap_or(0))
        .sum();
    assert!(
        items >= 6,
        "5 MB in 1 MiB items needs a manifest and at least 5 chunks ({items})"
    );
}

/// A body promoted from memcached into a node's memory tier is copied out of the read buffers
/// into one block of its own (a memory mapping, at this size: `storage/memory/mapped.rs`); what
/// that node serves from it afterwards, with memcached gone, is the object, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_object_promoted_from_memcached_is_served_whole_from_memory() {
    let mut cluster = Cluster::start();
    let origin = scripted_origin();
    let (a, admin_a) = cluster.node(&origin);
    let (b, admin_b) = cluster.node_with_local_ttl(&origin, "1h");
    // more than one memcached item (1 MiB): stored as a manifest and chunks, read back as pieces
    let (path, first) = filled_through(&a, admin_a, 2 * 1024 * 1024 + 4099).await;

    let from_b = get(&b.url(&path), &SITE).await;
    assert!(from_b.is_hit(), "{:?}", from_b.cache_status());
    assert_eq!(from_b.body, first.body);
    assert_eq!(admin_stat(admin_b, "hits").await, 1, "read from memcached");

    for server in &mut cluster.servers {
        server.kill();
    }
    for range in [None, Some("bytes=1048570-1048590")] {
        let headers: Vec<(&str, &str)> = SITE
            .iter()
            .copied()
            .chain(range.map(|r| ("range", r)))
            .collect();
        let again = get(&b.url(&path), &headers).await;
        assert!(again.is_hit(), "{:?}", again.cache_status());
        match range {
            None => assert!(again.body == first.body, "the promoted copy differs"),
            Some(_) => assert_eq!(again.body[..], first.body[1048570..=1048590]),
        }
    }
    assert_eq!(
        admin_stat(admin_b, "hits").await,
        1,
        "served from B's memory"
    );
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_and_truncated_values_are_misses_and_counted() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let (node, admin) = cluster.node(&origin);
    let host = SITE[0].1;
    for (i, bad) in [
        b"not a lacquer entry at all".to_vec(),
        b"LQ\x01\x01\x00\x00\x05hello-truncated".to_vec(),
    ]
    .into_iter()
    .enumerate()
    {
        let path = format!("/planted/{i}?cc=max-age%3D300");
        let key = memcached_key("lq", &lacquer::proxy::cache_key::of_url(host, &path));
        let server = &cluster.servers[cluster.server_for(&key)];
        let reply = server.command(&format!("set {key} 0 300 {}", bad.len()), Some(&bad));
        assert!(reply.starts_with("STORED"), "{reply}");
        let resp = get(&node.url(&path), &SITE).await;
        assert_eq!(resp.status, 200);
        assert!(
            resp.text().starts_with(&format!("{path} #")),
            "{}",
            resp.text()
        );
        assert!(!resp.is_hit());
        assert_eq!(
            origin.hits_for(&path),
            1,
            "a planted value must never be served"
        );
    }
    assert_eq!(admin_stat(admin, "rejected").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_memcached_costs_misses_not_errors_and_is_used_again_after_restart() {
    let mut cluster = Cluster::start();
    let origin = scripted_origin();
    let (a, admin_a) = cluster.node(&origin);
    let (b, _admin_b) = cluster.node(&origin);
    let urls = [a.url(""), b.url("")];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..4usize {
        let urls = urls.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let client = http_client();
            let (mut ok, mut failed) = (0usize, Vec::new());
            for n in 0..100_000usize {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                // a mix: 40 hot paths (hits after the first) and a unique miss every 5th request
                let path = if n % 5 == 0 {
                    format!("/miss/{t}/{n}?cc=max-age%3D300")
                } else {
                    format!("/hot/{}?cc=max-age%3D300", n % 40)
                };
                let url = format!("{}{}", urls[n % 2].trim_end_matches('/'), path);
                match send(&client, "GET", &url, &SITE, None).await {
                    Ok(r) if r.status == 200 && r.text().starts_with(&format!("{path} #")) => {
                        ok += 1
                    }
                    Ok(r) => failed.push(format!("{path}: {} {}", r.status, r.text())),
                    Err(e) => failed.push(format!("{path}: {e}")),
                }
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.servers[1].kill();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        wait_for_stat(admin_a, "ejections", 1, STAT_WAIT).await >= 1,
        "the dead server should have been ejected"
    );
    cluster.servers[1].restart();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for t in tasks {
        let (ok, failed) = t.await.unwrap();
        assert!(
            failed.is_empty(),
            "client-visible failures: {:?}",
            &failed[..failed.len().min(5)]
        );
        total += ok;
    }
    assert!(total > 100, "the load ran ({total} requests)");

    // after retry_after the restarted server is probed and used again: a new object placed on it
    // is written by A and found by B
    let path = (0..500)
        .map(|i| format!("/after/{i}?cc=max-age%3D300"))
        .find(|p| {
            let key = memcached_key("lq", &lacquer::proxy::cache_key::of_url(SITE[0].1, p));
            cluster.server_for(&key) == 1
        })
        .unwrap();
    let mut used_again = false;
    for _ in 0..20 {
        let _ = get(&a.url(&path), &SITE).await;
        if cluster.servers[1].stat("curr_items").unwrap_or(0) > 0 {
            used_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(used_again, "the restarted memcached never received a write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_through_one_node_reaches_the_other_within_local_ttl() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let (a, admin_a) = cluster.node(&origin);
    let (b, _admin_b) = cluster.node(&origin);
    let path = "/purged?cc=max-age%3D300";
    get(&a.url(path), &SITE).await;
    assert_eq!(wait_for_stat(admin_a, "writes", 1, STAT_WAIT).await, 1);
    assert!(get(&b.url(path), &SITE).await.is_hit(), "B holds a copy");

    let purged = request("PURGE", &a.url(path), &SITE, None).await;
    assert_eq!(purged.status, 200);
    assert!(
        !get(&a.url(path), &SITE).await.is_hit(),
        "A refetches at once"
    );
    // B trusts its copy for local_ttl (2 s here), then asks memcached again: the entry that A's
    // refetch wrote is the new one, so B serves the refetched body
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let from_b = get(&b.url(path), &SITE).await;
    assert!(
        from_b.text().ends_with("#2"),
        "B still serves the purged copy: {}",
        from_b.text()
    );
    assert_eq!(origin.hits_for(path), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_page_missing_everywhere_is_fetched_once_for_the_whole_cluster() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let (a, admin_a) = cluster.node(&origin);
    let (b, admin_b) = cluster.node(&origin);
    // a slow render, so that every request below arrives while the first fill is in flight
    let path = "/render-once?cc=max-age%3D300&sleep=600";
    let mut requests = Vec::new();
    for i in 0..16 {
        let url = if i % 2 == 0 { a.url(path) } else { b.url(path) };
        requests.push(tokio::spawn(async move { get(&url, &SITE).await }));
    }
    let mut bodies = Vec::new();
    for request in requests {
        let resp = request.await.unwrap();
        assert_eq!(resp.status, 200);
        bodies.push(resp.body);
    }
    if origin.hits_for(path) != 1 || bodies.iter().any(|b| *b != bodies[0]) {
        let stats_a = get(&format!("http://127.0.0.1:{admin_a}/stats"), &[]).await;
        let stats_b = get(&format!("http://127.0.0.1:{admin_b}/stats"), &[]).await;
        panic!(
            "{} renderings for the cluster\nA: {}\nB: {}",
            origin.hits_for(path),
            stats_a.text(),
            stats_b.text()
        );
    }
    let claimed =
        admin_stat(admin_a, "fills_claimed").await + admin_stat(admin_b, "fills_claimed").await;
    assert_eq!(claimed, 1);
    // the node that did not fill served its clients from the other node's fill
    let awaited =
        admin_stat(admin_a, "fills_awaited").await + admin_stat(admin_b, "fills_awaited").await;
    assert!(awaited >= 1, "no request waited for the other node's fill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_that_stores_nothing_releases_the_other_nodes_at_once() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    // a lease far longer than the client's patience: only an early release lets B finish in time
    let (admin_a, admin_b) = (free_port(), free_port());
    let servers: Vec<String> = cluster.names().iter().map(|n| format!("\"{n}\"")).collect();
    let config = |admin: u16| {
        format!(
            "[log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [cache.memcached]\nservers = [{}]\nfill_lease = \"60s\"",
            servers.join(", ")
        )
    };
    let a = LacquerProcess::start_simple(origin.addr(), &config(admin_a));
    let b = LacquerProcess::start_simple(origin.addr(), &config(admin_b));
    let path = "/not-stored?cc=no-store&sleep=1000";
    let first = tokio::spawn({
        let url = a.url(path);
        async move { get(&url, &SITE).await }
    });
    // A claims the cluster's lease before it asks the origin, which then takes a second to answer
    assert!(
        origin
            .wait_for_hits_for_async(path, 1, Duration::from_secs(20))
            .await,
        "A never reached the origin"
    );
    assert_eq!(admin_stat(admin_a, "fills_claimed").await, 1);
    // B finds A's lease and waits; A's response is not stored, so A releases the lease
    let second = tokio::time::timeout(Duration::from_secs(20), get(&b.url(path), &SITE))
        .await
        .expect("B waited for the whole 60 s lease instead of being released");
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.status, 200);
    assert_eq!(
        origin.hits_for(path),
        2,
        "B fetched for itself once released"
    );
    // B found A's lease and was released from it, then fetched under a claim of its own (a wait
    // that ends without the fill claims the URL once more, so that a POST elsewhere meanwhile
    // finds a lease)
    assert_eq!(admin_stat(admin_b, "fill_waits").await, 1);
    assert_eq!(admin_stat(admin_b, "fills_claimed").await, 1);
    assert_eq!(admin_stat(admin_b, "fills_awaited").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_filling_node_waiters_queue_on_the_local_cache_lock() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let (a, admin_a) = cluster.node(&origin);
    let path = "/local-waiters?cc=max-age%3D300&sleep=400";
    let mut requests = Vec::new();
    for _ in 0..8 {
        let url = a.url(path);
        requests.push(tokio::spawn(async move { get(&url, &SITE).await }));
    }
    for request in requests {
        assert_eq!(request.await.unwrap().status, 200);
    }
    assert_eq!(origin.hits_for(path), 1);
    assert_eq!(admin_stat(admin_a, "fills_claimed").await, 1);
    // none of them polled for the fill: Pingora's lock woke them as it landed
    assert_eq!(admin_stat(admin_a, "fills_awaited").await, 0);
}

/// A node reading only memcached (`local_ttl = "0s"`), whose memcached operations wait far
/// beyond a freeze (no queued read gives up and fetches for itself), with an admin listener
/// whose invalidation API takes [`ADMIN_TOKEN`] (the token file is in `dir`).
fn reading_only_memcached(
    cluster: &Cluster,
    origin: &TestOrigin,
    dir: &TempDir,
) -> (LacquerProcess, u16) {
    reading_only_memcached_named(cluster, origin, dir, "A")
}

/// [`reading_only_memcached`], named `name` in the cluster's invalidation reports.
fn reading_only_memcached_named(
    cluster: &Cluster,
    origin: &TestOrigin,
    dir: &TempDir,
    name: &str,
) -> (LacquerProcess, u16) {
    let admin = free_port();
    dir.write("admin.token", format!("{ADMIN_TOKEN}\n"));
    let servers: Vec<String> = cluster.names().iter().map(|n| format!("\"{n}\"")).collect();
    let extra = format!(
        "[log]\naccess = \"off\"\n{}\
         [cache.memcached]\nservers = [{}]\nlocal_ttl = \"0s\"\nop_timeout = \"10s\"",
        admin_toml(admin, &dir.path().join("admin.token"), name),
        servers.join(", ")
    );
    (LacquerProcess::start_simple(origin.addr(), &extra), admin)
}

/// `CLIENTS` requests for `path`, queued behind `owner` (frozen while they reach the proxy, then
/// thawed); their answers.
async fn queued_behind(owner: &MemcachedProcess, url: &str) -> Vec<Resp> {
    const CLIENTS: usize = 24;
    owner.freeze();
    let clients = tokio::spawn(gets_at_once(vec![url.to_string(); CLIENTS], &SITE));
    // they reach the proxy and queue behind the two reads in flight
    tokio::time::sleep(Duration::from_millis(500)).await;
    owner.thaw();
    clients.await.unwrap()
}

/// The memcached server holding `path`'s entry.
fn owner_of<'a>(cluster: &'a Cluster, path: &str) -> &'a MemcachedProcess {
    let key = memcached_key("lq", &lacquer::proxy::cache_key::of_url(SITE[0].1, path));
    &cluster.servers[cluster.server_for(&key)]
}

/// Clients of one page queued behind a frozen memcached server (`local_ttl = "0s"`: every hit is
/// a memcached read) share one read of it, and the value that comes back is decoded once for
/// all of them (`decodes_shared`). Sharing goes by the value, never by the URL: after a purge and
/// a new render, clients queued the same way all get the new page, none the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_queued_for_one_memcached_value_share_its_decoding_and_never_an_older_one() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let dir = TempDir::new("decodings");
    let (node, admin) = reading_only_memcached(&cluster, &origin, &dir);
    let path = "/popular?cc=max-age%3D300";
    let owner = owner_of(&cluster, path);
    let all_hits_of = |answers: Vec<Resp>, expected: &Bytes| {
        for resp in answers {
            assert!(resp.is_hit(), "{:?}", resp.cache_status());
            assert_eq!(&resp.body, expected, "{}", resp.text());
        }
    };

    let first = get(&node.url(path), &SITE).await;
    assert_eq!(wait_for_stat(admin, "writes", 1, STAT_WAIT).await, 1);
    all_hits_of(queued_behind(owner, &node.url(path)).await, &first.body);
    assert_eq!(admin_stat(admin, "hits").await, 24);
    let shared = admin_stat(admin, "decodes_shared").await;
    assert!(
        (1..24).contains(&shared),
        "{shared} of 24 hits shared a decoding"
    );

    let purged = request("PURGE", &node.url(path), &SITE, None).await;
    assert_eq!(purged.status, 200);
    let second = get(&node.url(path), &SITE).await;
    assert_ne!(second.body, first.body, "purged: rendered again");
    assert_eq!(wait_for_stat(admin, "writes", 2, STAT_WAIT).await, 2);
    all_hits_of(queued_behind(owner, &node.url(path)).await, &second.body);
    assert_eq!(origin.hits_for(path), 2);
    assert!(admin_stat(admin, "decodes_shared").await > shared);
}

/// Readers of one page one after another (`local_ttl = "0s"`: every hit a memcached read, each
/// value in a buffer of its own) share one decoding too: a value with the bytes of one decoded
/// before is served as that one (`decodes_shared`). What is served is always what memcached
/// holds: when the entry is replaced by other bytes (here deleted and filled again, no purge
/// involved), the next reader decodes and serves the new page, and the old bytes put back are
/// the old page again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_one_after_another_share_a_decoding_of_the_bytes_memcached_holds() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let dir = TempDir::new("decodings-sequential");
    let (node, admin) = reading_only_memcached(&cluster, &origin, &dir);
    let path = "/read-again?cc=max-age%3D300";
    let key = memcached_key("lq", &lacquer::proxy::cache_key::of_url(SITE[0].1, path));
    let owner = owner_of(&cluster, path);
    let first = get(&node.url(path), &SITE).await;
    assert_eq!(wait_for_stat(admin, "writes", 1, STAT_WAIT).await, 1);
    // past the second in which this node trusts its own fill's copy
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let shared = admin_stat(admin, "decodes_shared").await;
    for _ in 0..10 {
        let resp = get(&node.url(path), &SITE).await;
        assert!(resp.is_hit(), "{:?}", resp.cache_status());
        assert_eq!(resp.body, first.body);
    }
    assert!(
        admin_stat(admin, "decodes_shared").await >= shared + 9,
        "readers one after another decoded the same bytes again"
    );
    let old_entry = owner.get_raw(&key).expect("the entry");

    // the entry replaced by other bytes: deleted (no purge, no ban) and filled again
    assert!(owner
        .command(&format!("delete {key}"), None)
        .starts_with("DELETED"));
    let second = get(&node.url(path), &SITE).await;
    assert_ne!(second.body, first.body, "rendered again");
    assert_eq!(wait_for_stat(admin, "writes", 2, STAT_WAIT).await, 2);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for _ in 0..3 {
        let resp = get(&node.url(path), &SITE).await;
        assert!(resp.is_hit(), "{:?}", resp.cache_status());
        assert_eq!(resp.body, second.body, "an older decoding was served");
    }
    owner.set_raw(&key, &old_entry, 300);
    for _ in 0..3 {
        let resp = get(&node.url(path), &SITE).await;
        assert!(resp.is_hit(), "{:?}", resp.cache_status());
        assert_eq!(
            resp.body, first.body,
            "the bytes memcached holds were not served"
        );
    }
    assert_eq!(origin.hits_for(path), 2);
}

/// The ban list judges every reader of a shared decoding (`local_ttl = "0s"`). With a ban of
/// another tag on the list, queued clients share a decoding and are served; after a ban of the
/// page's tag (which deletes nothing in memcached) clients queued the same way never get the
/// banned copy; after a soft ban of another page's tag, its copy is stale and fetched again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_reader_of_a_shared_memcached_decoding_is_judged_by_the_bans() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let dir = TempDir::new("decodings-bans");
    let (node, admin) = reading_only_memcached(&cluster, &origin, &dir);
    let red = "/red?cc=max-age%3D300&hdr=Surrogate-Key:red";
    let blue = "/blue?cc=max-age%3D300&hdr=Surrogate-Key:blue";
    let ban = |body: &'static str| async move {
        let answer = admin_post(admin, "/ban", Some(ADMIN_TOKEN), body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    };
    let old_red = get(&node.url(red), &SITE).await.body;
    let old_blue = get(&node.url(blue), &SITE).await.body;
    assert_eq!(wait_for_stat(admin, "writes", 2, STAT_WAIT).await, 2);

    // a ban that covers neither: the list is not empty, each reader is judged by it
    ban(r#"{"tag": "green"}"#).await;
    for resp in queued_behind(owner_of(&cluster, red), &node.url(red)).await {
        assert!(resp.is_hit(), "{:?}", resp.cache_status());
        assert_eq!(resp.body, old_red);
    }
    assert!(admin_stat(admin, "decodes_shared").await >= 1);

    // the page's own tag: its entry still sits in memcached, and no queued reader serves it
    ban(r#"{"tag": "red"}"#).await;
    let invalidated = admin_stat(admin, "invalidated").await;
    for resp in queued_behind(owner_of(&cluster, red), &node.url(red)).await {
        assert_eq!(resp.status, 200);
        assert_ne!(resp.body, old_red, "a reader served the banned copy");
    }
    assert!(admin_stat(admin, "invalidated").await > invalidated);
    // fetched again: once, or a few times when readers find the banned copy before the new
    // one's write to memcached lands (nothing is kept locally with `local_ttl = "0s"`)
    assert!(origin.hits_for(red) >= 2);

    // a soft ban: the copy in memcached is stale (no stale-while-revalidate here), so it is
    // fetched again
    ban(r#"{"tag": "blue", "soft": true}"#).await;
    let again = get(&node.url(blue), &SITE).await;
    assert_eq!(again.status, 200);
    assert_ne!(
        again.body, old_blue,
        "the softly banned copy was served as fresh"
    );
    assert_eq!(origin.hits_for(blue), 2);
}

/// A value that fails verification is never remembered for the readers queued behind it
/// (`local_ttl = "0s"`): each of them rejects it (a value planted in memcached under the page's
/// key, with the format's first bytes and nothing valid after), none is served it, and the page
/// is fetched from the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planted_value_is_rejected_by_every_reader_queued_behind_it() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let dir = TempDir::new("decodings-planted");
    let (node, admin) = reading_only_memcached(&cluster, &origin, &dir);
    // the origin takes 3 s: a reader that reaches the proxy only after the server thawed (a
    // loaded machine) still finds the planted value, not the origin's page written over it
    let path = "/planted-popular?cc=max-age%3D300&sleep=3000";
    let key = memcached_key("lq", &lacquer::proxy::cache_key::of_url(SITE[0].1, path));
    let owner = owner_of(&cluster, path);
    let planted = b"LQ\x01\x01not an entry, though it starts like one";
    let reply = owner.command(&format!("set {key} 0 300 {}", planted.len()), Some(planted));
    assert!(reply.starts_with("STORED"), "{reply}");

    for resp in queued_behind(owner, &node.url(path)).await {
        assert_eq!(resp.status, 200);
        assert!(
            resp.text().starts_with(&format!("{path} #")),
            "served something else than the origin's page: {}",
            resp.text()
        );
    }
    // each queued reader decoded it for itself (a remembered rejection would count once)
    let rejected = admin_stat(admin, "rejected").await;
    assert!(rejected >= 24, "rejected {rejected} times");
    assert!(origin.hits_for(path) >= 1);
}

/// Requests that waited for one fill are served by it when the node keeps no trusted copy of
/// its own (`local_ttl = "0s"`): the fill is trusted here until its write to memcached has
/// landed, and a waiter that wakes after that reads memcached rather than asking the origin.
/// Before, 16 concurrent misses of a slow page made 2 to 10 origin fetches. After a ban of the
/// page's tag (its entry stays in memcached, banned), the same: one more fetch, where there
/// were 11 to 16 more, and no request waits for the first fill's lease (before, left to run
/// out, it held them all for up to `fill_lease`). 96 requests: with 16, waiters that wake after
/// the write has landed were too rare to be seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_node_reading_only_memcached_concurrent_misses_make_one_origin_fetch() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let dir = TempDir::new("one-fetch");
    let (node, admin) = reading_only_memcached(&cluster, &origin, &dir);
    let path = "/one-fetch?cc=max-age%3D300&sleep=400&hdr=Surrogate-Key:red";

    let first = gets_at_once((0..96).map(|_| node.url(path)), &SITE).await;
    for resp in &first {
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body, first[0].body, "two renders were served");
    }
    assert_eq!(origin.hits_for(path), 1, "96 concurrent misses");
    assert_eq!(wait_for_stat(admin, "writes", 1, STAT_WAIT).await, 1);

    let answer = admin_post(admin, "/ban", Some(ADMIN_TOKEN), r#"{"tag": "red"}"#).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let after_ban = gets_at_once((0..96).map(|_| node.url(path)), &SITE).await;
    for resp in &after_ban {
        assert_eq!(resp.status, 200);
        assert_ne!(resp.body, first[0].body, "the banned copy was served");
        assert_eq!(resp.body, after_ban[0].body, "two renders were served");
    }
    assert_eq!(
        origin.hits_for(path),
        2,
        "96 concurrent requests after the ban"
    );
    // none waited for a lease: the first fill's was deleted when its entry was written
    assert_eq!(admin_stat(admin, "fill_waits").await, 0);
}

/// Right after a popular page is stored, a ban of its tag: both nodes (`local_ttl = "0s"`) get
/// requests for it at once, find the banned entry in memcached, and the page is rendered once
/// for the whole cluster. The first fill's lease is deleted when its entry is written, so the
/// node that claims the new fill's lease gets it, and the other waits for that fill instead
/// of waiting out the old lease and fetching for itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_tag_ban_a_popular_page_is_fetched_once_for_the_whole_cluster() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let (dir_a, dir_b) = (TempDir::new("ban-once-a"), TempDir::new("ban-once-b"));
    let (a, admin_a) = reading_only_memcached_named(&cluster, &origin, &dir_a, "A");
    let (b, admin_b) = reading_only_memcached_named(&cluster, &origin, &dir_b, "B");
    let path = "/ban-once?cc=max-age%3D300&sleep=300&hdr=Surrogate-Key:red";

    let stored = get(&a.url(path), &SITE).await;
    assert!(stored.is_stored(), "{:?}", stored.cache_status());
    assert_eq!(wait_for_stat(admin_a, "writes", 1, STAT_WAIT).await, 1);
    assert!(get(&b.url(path), &SITE).await.is_hit());

    let answer = admin_post(admin_a, "/ban", Some(ADMIN_TOKEN), r#"{"tag": "red"}"#).await;
    assert_eq!(
        answer.status,
        200,
        "the ban reached both nodes: {}",
        answer.text()
    );
    let urls = (0..16).map(|i| if i % 2 == 0 { a.url(path) } else { b.url(path) });
    let answers = gets_at_once(urls, &SITE).await;
    for resp in &answers {
        assert_eq!(resp.status, 200);
        assert_ne!(resp.body, stored.body, "the banned copy was served");
        assert_eq!(resp.body, answers[0].body, "two renders were served");
    }
    assert_eq!(
        origin.hits_for(path),
        2,
        "A: {} fills claimed, B: {} fills claimed, {} awaited",
        admin_stat(admin_a, "fills_claimed").await,
        admin_stat(admin_b, "fills_claimed").await,
        admin_stat(admin_b, "fills_awaited").await
    );
}

/// Writes to memcached add the entry and, when the key holds one, compare before they replace it
/// (a late fill does not replace a newer answer: `cluster_purge_attacks.rs`). What must still
/// replace does: the refetch of an expired page, a 304 that refreshed a stale copy (its entry,
/// whose time moved on, is written back over the one it refreshed) and an older entry or garbage
/// another writer put there. Each is then what the other node reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refetch_a_304_refresh_and_a_fill_over_garbage_replace_what_memcached_holds() {
    let cluster = Cluster::start();
    let origin = scripted_origin();
    let (a, admin_a) = cluster.node(&origin);
    let (b, _) = cluster.node(&origin);
    let holds = |path: &str, bytes: &str| {
        owner_of(&cluster, path)
            .get_raw(&memcached_key(
                "lq",
                &lacquer::proxy::cache_key::of_url(SITE[0].1, path),
            ))
            .is_some_and(|raw| raw.windows(bytes.len()).any(|w| w == bytes.as_bytes()))
    };
    let mut writes = 0;

    // a page fresh for a second, fetched again once stale
    let refetched = "/refetched?cc=max-age%3D1";
    let first = get(&a.url(refetched), &SITE).await.text();
    writes += 1;
    assert_eq!(
        wait_for_stat(admin_a, "writes", writes, STAT_WAIT).await,
        writes
    );
    assert!(holds(refetched, &first));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let second = get(&a.url(refetched), &SITE).await.text();
    assert_ne!(first, second, "fetched again");
    writes += 1;
    assert_eq!(
        wait_for_stat(admin_a, "writes", writes, STAT_WAIT).await,
        writes,
        "the refetch was written over the expired entry"
    );
    assert!(holds(refetched, &second));

    // a page revalidated with its ETag: the 304 makes it fresh for five minutes
    let refreshed = "/refreshed?cc=max-age%3D1&etag=%22v1%22&r304=1&cc304=max-age%3D300";
    let page = get(&a.url(refreshed), &SITE).await.text();
    writes += 1;
    assert_eq!(
        wait_for_stat(admin_a, "writes", writes, STAT_WAIT).await,
        writes
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let revalidated = get(&a.url(refreshed), &SITE).await;
    assert_eq!(revalidated.text(), page);
    assert_eq!(origin.hits_for(refreshed), 2, "one conditional request");
    writes += 1;
    assert_eq!(
        wait_for_stat(admin_a, "writes", writes, STAT_WAIT).await,
        writes,
        "the refreshed entry was written over the stale one"
    );
    // B reads the refreshed entry: fresh, no request to the origin
    let from_b = get(&b.url(refreshed), &SITE).await;
    assert!(from_b.is_hit(), "{:?}", from_b.cache_status());
    assert_eq!(from_b.text(), page);
    assert_eq!(
        origin.hits_for(refreshed),
        2,
        "B served the refreshed entry"
    );

    // garbage under a page's key: a fill replaces it
    let planted = "/planted-over?cc=max-age%3D300";
    let key = memcached_key("lq", &lacquer::proxy::cache_key::of_url(SITE[0].1, planted));
    let garbage = b"not an entry";
    let reply = owner_of(&cluster, planted)
        .command(&format!("set {key} 0 300 {}", garbage.len()), Some(garbage));
    assert!(reply.starts_with("STORED"), "{reply}");
    let filled = get(&a.url(planted), &SITE).await.text();
    writes += 1;
    assert_eq!(
        wait_for_stat(admin_a, "writes", writes, STAT_WAIT).await,
        writes,
        "the fill was written over the garbage"
    );
    assert!(holds(planted, &filled));
    assert_eq!(admin_stat(admin_a, "writes_superseded").await, 0);
    assert_eq!(admin_stat(admin_a, "write_failures").await, 0);
}
