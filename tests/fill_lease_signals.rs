//! What a signal does to a fill whose lease is being renewed (`cache.memcached.fill_lease`,
//! `storage::fill_lease`): a reload (SIGHUP), a drain (SIGTERM) and a hand-over (`--upgrade`,
//! SIGQUIT) of the filling node while a page slower than its lease is fetched. In each, the
//! fill's client gets the whole answer, the fill is stored in memcached, the lease is renewed
//! for as long as the fill lasts (nodes asking after the lease's first length wait for it: one
//! origin fetch for the cluster), and it is deleted once the fill is written, so nothing waits
//! later for a fill that is over. A drain that `shutdown_timeout` cuts in the middle of a fill
//! deletes that fill's lease before the process exits, so nothing waits for a fill that will
//! never come. Real memcached processes, real origins, real signals.

use lacquer_test_support as support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use support::*;

const HOST: &str = "shop.example";
const SITE: [(&str, &str); 1] = [("host", HOST)];

/// The nodes' lease: shorter than the fills (the page of [`counting_origin`] with pauses of 1.4 s
/// takes 2.8 s).
const LEASE: &str = "fill_lease = \"2s\"";

/// When the other nodes ask, counted from the fill's start: past the lease's first length.
const AFTER_THE_FIRST_LEASE: Duration = Duration::from_millis(2300);

/// Whether the lease of `path` is in memcached (on the server of its entry).
fn lease_present(cluster: &MemcachedCluster, path: &str) -> bool {
    let entry = MemcachedCluster::key_of(HOST, path);
    let lease = entry.replacen("lq:", "lq:fill:", 1);
    cluster.servers[cluster.server_for(&entry)].holds(&lease)
}

/// Whether the entry of `path` is in memcached.
fn entry_present(cluster: &MemcachedCluster, path: &str) -> bool {
    let entry = MemcachedCluster::key_of(HOST, path);
    cluster.servers[cluster.server_for(&entry)].holds(&entry)
}

/// The answer to the GET that fills, whole or cut.
type Fill = tokio::task::JoinHandle<Result<Resp, reqwest::Error>>;

/// Starts a GET of `path` through `node`'s port (the fill) and returns it once `node` has
/// claimed the URL's lease, with the time it was sent.
async fn start_fill(node: &Node, path: &str) -> (Fill, Instant) {
    let url = node.proxy.url(path);
    let started = Instant::now();
    let fill = tokio::spawn(async move { try_get(&url, &SITE).await });
    assert_eq!(
        wait_for_stat(node.admin, "fills_claimed", 1, Duration::from_secs(2)).await,
        1,
        "{} did not claim the lease",
        node.name
    );
    (fill, started)
}

/// At [`AFTER_THE_FIRST_LEASE`] from `started`, the other `nodes` ask for `path` at once: each
/// waits for the fill in flight and is served it, and the origin has served the page once.
async fn the_others_wait_for_the_fill(
    nodes: &[&Node],
    origin: &TestOrigin,
    path: &str,
    started: Instant,
) {
    tokio::time::sleep(AFTER_THE_FIRST_LEASE.saturating_sub(started.elapsed())).await;
    let answers = gets_at_once(nodes.iter().map(|n| n.proxy.url(path)), &SITE).await;
    served_the_fill(nodes, &answers, origin, path).await;
}

/// Each of `nodes` answered with the fill it waited for, having waited for it, and the origin
/// served the page once.
async fn served_the_fill(nodes: &[&Node], answers: &[Resp], origin: &TestOrigin, path: &str) {
    all_served_the_first_answer(nodes, answers, origin, path);
    for node in nodes {
        assert_eq!(
            admin_stat(node.admin, "fills_awaited").await,
            1,
            "{} did not wait for the fill in flight",
            node.name
        );
    }
}

/// `proxy` exits, cleanly, within `timeout`, and leaves behind the fill of `path` in memcached
/// and no lease for it (the drain waited for the fill's write and the lease's delete).
fn exits_with_the_fill_stored(
    proxy: &mut LacquerProcess,
    cluster: &MemcachedCluster,
    path: &str,
    timeout: Duration,
) {
    let status = proxy.wait_exit(timeout);
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; stderr:\n{}",
        proxy.stderr_log()
    );
    assert!(
        !lease_present(cluster, path),
        "the node exited leaving its lease in memcached"
    );
    assert!(entry_present(cluster, path), "the fill is not in memcached");
}

/// A GET of `path` through `url`'s node, `who`, which did not fill it, is a hit on the fill
/// stored in memcached, and the origin served the page once.
async fn serves_the_stored_fill(url: String, who: &str, origin: &TestOrigin, path: &str) {
    let later = get(&url, &SITE).await;
    assert!(later.is_hit(), "{who} did not find the fill in memcached");
    assert_eq!(&later.body[..], b"body-1-late");
    assert_eq!(origin.hits_for(path), 1);
}

/// An origin like [`counting_origin`] (`body-N-late`, fresh for an hour) whose answers wait
/// until `gate` is open (for at most 20 s): a fill that lasts as long as the test says.
fn gated_origin(gate: Arc<AtomicBool>) -> TestOrigin {
    let served = AtomicUsize::new(0);
    TestOrigin::start(move |_| {
        let until = Instant::now() + Duration::from_secs(20);
        while !gate.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let n = served.fetch_add(1, Ordering::SeqCst) + 1;
        OriginResponse::ok(format!("body-{n}-late")).header("cache-control", "max-age=3600")
    })
}

/// Three nodes, `fill_lease = "2s"`, a page that takes 2.8 s. A fetches it and is reloaded
/// (SIGHUP) just after its claim, with a file that changes `proxy.via_name` (applied) and turns
/// `fill_lease` off (a restart-only key: its running value kept). A keeps renewing the lease
/// after the reload, so B and C, asking 2.3 s in, wait for A's fill: one origin fetch. The fill
/// is stored in memcached, the lease deleted once it is written, and A then serves the page from
/// memory under its new `Via`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_mid_fill_keeps_the_lease_renewed_and_the_fill_stored() {
    let cluster = MemcachedCluster::start(1);
    let path = "/reloaded-mid-fill";
    let origin = counting_origin(Duration::from_millis(1400), "max-age=3600");
    let nodes: Vec<Node> = ["A", "B", "C"]
        .iter()
        .map(|name| cluster.node(&origin, name, LEASE))
        .collect();
    let a = &nodes[0];
    let (fill, started) = start_fill(a, path).await;

    let config = std::fs::read_to_string(a.proxy.config_path().expect("A's config file"))
        .expect("A's config");
    assert!(config.contains(LEASE));
    a.proxy.write_config(&format!(
        "{}\n[proxy]\nvia_name = \"reloaded\"\n",
        config.replace(LEASE, "fill_lease = \"0s\"")
    ));
    assert!(a.proxy.signal("HUP"));
    assert!(
        wait_for_log(&a.proxy, "configuration reloaded", Duration::from_secs(2)),
        "A did not reload; stderr:\n{}",
        a.proxy.stderr_log()
    );
    assert!(
        a.proxy.stderr_log().contains("cache.memcached"),
        "the reload did not name [cache.memcached] as needing a restart; stderr:\n{}",
        a.proxy.stderr_log()
    );
    let renewed_at_reload = admin_stat(a.admin, "fill_leases_renewed").await;

    the_others_wait_for_the_fill(
        &nodes[1..].iter().collect::<Vec<_>>(),
        &origin,
        path,
        started,
    )
    .await;
    assert!(
        admin_stat(a.admin, "fill_leases_renewed").await >= renewed_at_reload + 2,
        "A stopped renewing its lease after the reload"
    );
    let filled = fill.await.unwrap().expect("A's answer");
    assert_eq!(&filled.body[..], b"body-1-late");
    assert!(
        poll_until_async(Duration::from_secs(2), || !lease_present(&cluster, path)).await,
        "the lease outlived the fill's write"
    );
    assert!(
        entry_present(&cluster, path),
        "the fill is not in memcached"
    );
    let again = get(&a.proxy.url(path), &SITE).await;
    assert!(again.is_hit(), "A did not keep its fill");
    assert_eq!(&again.body[..], b"body-1-late");
    assert!(
        again.header("via").unwrap_or_default().contains("reloaded"),
        "the reload was not applied: {:?}",
        again.header("via")
    );
    assert_eq!(origin.hits_for(path), 1);
}

/// A fetches the 2.8 s page and is sent SIGTERM just after its claim. Its listener closes, but
/// the fill goes on: A keeps renewing the lease while it drains, so B and C, asking 2.3 s in,
/// wait for A's fill; A's client gets the whole page; A exits once the fill is written to
/// memcached and its lease deleted (the drain waits for both), so the lease is gone the moment A
/// is; and a node started afterwards serves the page from memcached. One origin fetch in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_mid_fill_finishes_the_fill_and_leaves_no_lease() {
    let cluster = MemcachedCluster::start(1);
    let path = "/drained-mid-fill";
    let origin = counting_origin(Duration::from_millis(1400), "max-age=3600");
    let mut nodes: Vec<Node> = ["A", "B", "C"]
        .iter()
        .map(|name| cluster.node(&origin, name, LEASE))
        .collect();
    let (fill, started) = start_fill(&nodes[0], path).await;
    assert!(nodes[0].proxy.signal("TERM"));
    let port = nodes[0].proxy.port();
    assert!(
        poll_until_async(Duration::from_secs(2), || !port_accepts(port)).await,
        "A still accepts after SIGTERM"
    );
    assert!(
        nodes[0].proxy.is_running(),
        "A exited with a fill in flight"
    );

    the_others_wait_for_the_fill(
        &nodes[1..].iter().collect::<Vec<_>>(),
        &origin,
        path,
        started,
    )
    .await;
    let filled = fill.await.unwrap().expect("A's answer");
    assert_eq!(&filled.body[..], b"body-1-late");
    let a = &mut nodes[0].proxy;
    exits_with_the_fill_stored(a, &cluster, path, Duration::from_secs(10));
    assert!(
        a.stderr_log().contains("drained after"),
        "{}",
        a.stderr_log()
    );

    let d = cluster.node(&origin, "D", LEASE);
    serves_the_stored_fill(d.proxy.url(path), "D", &origin, path).await;
}

/// A fetches a page whose origin answers only when the test says, and hands its listeners over
/// to a new process (`--upgrade`, then SIGQUIT) just after its claim. The old process accepts
/// beside the new one for 5 s, then drains, with the fill still waiting on its origin: it keeps
/// the lease renewed throughout, so B and C, asking once the old process drains (seconds past
/// the lease's first length), wait for its fill, and are served it once the origin answers. The
/// fill's client gets the whole page; the old process exits once the fill is written and the
/// lease deleted; the new process, on the same port, serves the page from memcached. One origin
/// fetch in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hand_over_mid_fill_finishes_the_fill_and_leaves_no_lease() {
    let cluster = MemcachedCluster::start(1);
    let path = "/handed-over-mid-fill";
    let gate = Arc::new(AtomicBool::new(false));
    let origin = gated_origin(gate.clone());
    let dir = TempDir::new("fill-lease-upgrade");
    let upgrade_sock = dir.path().join("upgrade.sock");
    let mut a = cluster.node(
        &origin,
        "A",
        &format!(
            "{LEASE}\n[server]\nupgrade_sock = \"{}\"\n",
            upgrade_sock.display()
        ),
    );
    let others = [
        cluster.node(&origin, "B", LEASE),
        cluster.node(&origin, "C", LEASE),
    ];
    let others: Vec<&Node> = others.iter().collect();
    let (fill, started) = start_fill(&a, path).await;
    let successor = a.proxy.hand_over(&upgrade_sock);
    let draining = poll_until_async(Duration::from_secs(8), || {
        a.proxy.stderr_log().contains("draining")
    })
    .await;
    assert!(
        draining,
        "A did not drain; stderr:\n{}",
        a.proxy.stderr_log()
    );
    assert!(!fill.is_finished(), "the fill ended before A drained");
    assert!(started.elapsed() > Duration::from_secs(3));

    let open_once_all_wait = async {
        for node in &others {
            let waits = wait_for_stat(node.admin, "fill_waits", 1, Duration::from_secs(2)).await;
            assert_eq!(waits, 1, "{} did not wait for the fill", node.name);
        }
        gate.store(true, Ordering::SeqCst);
    };
    let (answers, ()) = tokio::join!(
        gets_at_once(others.iter().map(|n| n.proxy.url(path)), &SITE),
        open_once_all_wait
    );
    served_the_fill(&others, &answers, &origin, path).await;
    let filled = fill.await.unwrap().expect("A's answer");
    assert_eq!(&filled.body[..], b"body-1-late");
    exits_with_the_fill_stored(&mut a.proxy, &cluster, path, Duration::from_secs(5));
    serves_the_stored_fill(successor.url(path), "the successor", &origin, path).await;
}

/// Starts a fill of `path` through `a` and returns it once `a` has renewed the lease.
async fn a_renewed_fill(a: &Node, path: &str) -> Fill {
    let (fill, _) = start_fill(a, path).await;
    assert!(
        wait_for_stat(a.admin, "fill_leases_renewed", 1, Duration::from_secs(2)).await >= 1,
        "A did not renew its lease"
    );
    fill
}

/// A exited (with `status`) cleanly, its drain cut at `shutdown_timeout`, and `fill` with it.
async fn drain_cut_the_fill(a: &mut Node, status: Option<std::process::ExitStatus>, fill: Fill) {
    assert!(
        status.is_some_and(|s| s.success()),
        "A: {status:?}; stderr:\n{}",
        a.proxy.stderr_log()
    );
    assert!(
        a.proxy.stderr_log().contains("shutdown_timeout"),
        "A's drain was not cut; stderr:\n{}",
        a.proxy.stderr_log()
    );
    let cut = fill.await.unwrap();
    assert!(
        cut.as_ref().map_or(true, |r| &r.body[..] != b"body-1-late"),
        "the fill was not cut"
    );
}

/// A's drain is cut at `shutdown_timeout` (1 s) in the middle of the 2.8 s fill, after a renewal
/// of its lease: its client's answer is cut, nothing is stored, and A deletes the lease before it
/// exits, so B, asking right after, claims the URL and fetches it at once instead of waiting for
/// a fill that will never come. (The lease was left in memcached, renewed a moment before the
/// exit: B waited for it, about 1.6 s here and up to `fill_lease` in general, before it
/// fetched.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_that_cuts_a_fill_releases_its_lease() {
    let cluster = MemcachedCluster::start(1);
    let path = "/cut-mid-fill";
    let origin = counting_origin(Duration::from_millis(1400), "max-age=3600");
    let mut a = cluster.node_with_top_level(&origin, "A", "shutdown_timeout = \"1s\"", "", LEASE);
    let b = cluster.node(&origin, "B", LEASE);
    let fill = a_renewed_fill(&a, path).await;
    assert!(a.proxy.signal("TERM"));
    let status = a.proxy.wait_exit(Duration::from_secs(5));
    drain_cut_the_fill(&mut a, status, fill).await;
    assert!(
        !lease_present(&cluster, path),
        "A exited leaving the lease of the fill it cut in memcached"
    );
    assert!(!entry_present(&cluster, path), "the cut fill was stored");

    let resp = get(&b.proxy.url(path), &SITE).await;
    assert_eq!(resp.status, 200);
    assert_eq!(&resp.body[..], b"body-2-late");
    assert_eq!(
        admin_stat(b.admin, "fill_waits").await,
        0,
        "B waited for the fill A cut"
    );
    assert_eq!(admin_stat(b.admin, "fills_claimed").await, 1);
    assert_eq!(origin.hits_for(path), 2);
}

/// The same drain with the memcached server frozen (SIGSTOP) once the lease is renewed: the
/// deletes `release_held` sends at the cut cannot be answered, and each is bounded by
/// `op_timeout` (200 ms here), so the node still exits, cleanly, rather than hang in its drain;
/// the lease is then left to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_that_cuts_a_fill_exits_even_with_memcached_frozen() {
    let cluster = MemcachedCluster::start(1);
    let path = "/cut-mid-fill-frozen";
    let origin = counting_origin(Duration::from_millis(1400), "max-age=3600");
    let mut a = cluster.node_with_top_level(&origin, "A", "shutdown_timeout = \"1s\"", "", LEASE);
    let fill = a_renewed_fill(&a, path).await;
    cluster.servers[0].freeze();
    assert!(a.proxy.signal("TERM"));
    // far past shutdown_timeout plus a few op_timeouts: only a drain waiting on the frozen
    // server without a bound would take this long
    let status = a.proxy.wait_exit(Duration::from_secs(10));
    cluster.servers[0].thaw();
    drain_cut_the_fill(&mut a, status, fill).await;
    assert!(!entry_present(&cluster, path), "the cut fill was stored");
}
