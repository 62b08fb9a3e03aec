//! A fill slower than its lease (`cache.memcached.fill_lease`): its node renews the lease while
//! the fill lasts (`storage::fill_lease`, a `cas` of the lease's time every third of a lease),
//! so the rest of the cluster still sees the fill in flight: requests arriving after the lease's
//! first length wait for it instead of fetching once per node, a renewal memcached did not answer
//! is tried again, and an answer that will not be stored gives its lease up at once. A fill
//! whose lease is lost (its server restarted empty) is not kept, whether its renewal or the
//! delete after its write finds the lease gone; nor is one whose lease another node claimed
//! after it was lost, whose renewal or delete finds that claim's holder in the lease and leaves
//! it be. (A POST in a slow fill is in
//! `tests/cluster_invalidation.rs`; one after the lease was lost, in
//! `tests/cluster_purge_attacks.rs`.) Real memcached processes, real origins.

use lacquer_test_support as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use support::lease_rig::*;
use support::*;

/// Whether the cluster's log (one memcached server) holds a record naming `path`, among the
/// short-lived or the long-lived ones of the last minute.
fn log_names(cluster: &MemcachedCluster, path: &str) -> bool {
    cluster.log_names(0, path, true) || cluster.log_names(0, path, false)
}

/// Four nodes, `fill_lease = "2s"`, a page that takes 2.8 s. A fetches it; B, C and D ask for it
/// 2.3 s later, past the lease's first length. Renewed, the lease still says A's fill is in
/// flight, so they wait for it: one origin fetch for the cluster. (Before the renewal the lease
/// had expired and one of them claimed it again: two fetches; with a renewal that only touched
/// the lease, its old time let none of them wait: four.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_after_the_lease_still_wait_for_a_slow_fill() {
    let cluster = MemcachedCluster::start(1);
    let path = "/slow-page";
    let origin = counting_origin(Duration::from_millis(1400), "max-age=3600");
    let nodes: Vec<Node> = ["A", "B", "C", "D"]
        .iter()
        .map(|name| cluster.node(&origin, name, "fill_lease = \"2s\""))
        .collect();
    let url = nodes[0].proxy.url(path);
    let first = tokio::spawn(async move { get(&url, &SITE).await });
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let rest = gets_at_once(nodes[1..].iter().map(|n| n.proxy.url(path)), &SITE).await;
    let first = first.await.expect("A's request");
    assert_eq!(&first.body[..], b"body-1-late");
    let others: Vec<&Node> = nodes[1..].iter().collect();
    all_served_the_first_answer(&others, &rest, &origin, path);
    assert!(admin_stat(nodes[0].admin, "fill_leases_renewed").await >= 2);
}

/// The memcached server holding a slow fill's lease freezes over its first renewal (longer than
/// `op_timeout`). The renewal is tried again, so the lease is still there in the fill's seventh
/// second and a POST through another node, finding it, is published to the cluster. (A renewal
/// that gave up at its first failure let the lease expire, a few seconds after the frozen server
/// applied that renewal late: the POST reached no one and B stored and served the page as it
/// was before it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_memcached_did_not_answer_is_tried_again() {
    let cluster = MemcachedCluster::start(1);
    let path = "/posted-while-frozen";
    let origin = counting_origin(Duration::from_secs(4), "max-age=3600");
    let a = cluster.node(&origin, "A", "local_ttl = \"30s\"\nfill_lease = \"3s\"");
    let b = cluster.node_with_invalidation(
        &origin,
        "B",
        "poll_interval = \"1s\"",
        "local_ttl = \"30s\"\nfill_lease = \"3s\"",
    );
    let started = Instant::now();
    let reader = get_in_background(&b, path);
    // the first renewal goes 1 s after the claim: memcached is frozen from 0.7 s to 1.9 s
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.servers[0].freeze();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    cluster.servers[0].thaw();
    tokio::time::sleep(Duration::from_millis(6500).saturating_sub(started.elapsed())).await;
    assert!(
        lease_in(&cluster, path),
        "the lease of B's fill was gone in its seventh second"
    );
    assert!(admin_stat(b.admin, "fill_leases_renewed").await >= 3);
    let posted = post(&a.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    assert!(
        poll_until_async(Duration::from_secs(3), || log_names(&cluster, path)).await,
        "the POST during the slow fill was not published"
    );
    let filled = reader.await.expect("B's request");
    assert_eq!(&filled.body[..], b"body-1-late");
    tokio::time::sleep(Duration::from_secs(2)).await;
    none_serves_the_first_answer(&[&a, &b], path, &SITE, "the page as it was before the POST")
        .await;
}

/// A `no-store` answer that streams for 8 s gives its lease up as soon as its head is judged,
/// not when it ends: no other node waits for a fill that will not come, and a POST to the URL
/// meanwhile is not published (a URL nobody stores or fills). (Renewed for as long as the
/// request lasted, the lease made every such POST a write to the cluster's log.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_that_will_not_be_stored_gives_its_lease_up_at_once() {
    let cluster = MemcachedCluster::start(1);
    let path = "/stream";
    let origin = counting_origin(Duration::from_secs(4), "no-store");
    let a = cluster.node(&origin, "A", "fill_lease = \"3s\"");
    let b = cluster.node(&origin, "B", "fill_lease = \"3s\"");
    let response = http_client()
        .get(a.proxy.url(path))
        .header("host", HOST)
        .send()
        .await
        .expect("the stream's head");
    assert_eq!(response.status(), 200);
    assert_eq!(admin_stat(a.admin, "fills_claimed").await, 1);
    let gone = poll_until_async(Duration::from_millis(1500), || !lease_in(&cluster, path)).await;
    assert!(
        gone,
        "the lease of an answer that will not be stored was kept"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!lease_in(&cluster, path), "the lease came back");
    let posted = post(&b.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !log_names(&cluster, path),
        "a POST to a URL nobody stores or fills was published"
    );
    assert_eq!(admin_stat(a.admin, "fill_leases_renewed").await, 0);
    drop(response);
}

/// A fill abandoned because its body outgrew `cache.max_object_size` (no length announced) gives
/// its lease up when it is abandoned, not when the client has taken the rest of the answer
/// (here 8 s later): nothing will be stored, and no other node should wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_abandoned_for_its_size_gives_its_lease_up() {
    let cluster = MemcachedCluster::start(1);
    let path = "/outgrown";
    let origin = TestOrigin::start(|_| {
        OriginResponse::ok(Body::Paced {
            chunks: vec![
                Bytes::from(vec![b'x'; 64 * 1024]),
                Bytes::from_static(b"end"),
            ],
            interval: Duration::from_secs(4),
        })
        .header("cache-control", "max-age=3600")
    });
    let a = cluster.node(
        &origin,
        "A",
        "fill_lease = \"3s\"\n[cache]\nmax_object_size = \"16KiB\"",
    );
    let response = http_client()
        .get(a.proxy.url(path))
        .header("host", HOST)
        .send()
        .await
        .expect("the head");
    assert_eq!(response.status(), 200);
    assert_eq!(admin_stat(a.admin, "fills_claimed").await, 1);
    let gone = poll_until_async(Duration::from_millis(2500), || !lease_in(&cluster, path)).await;
    assert!(gone, "the lease of an abandoned fill was kept");
    let body = response.bytes().await.expect("the body");
    assert_eq!(body.len(), 64 * 1024 + 3, "the client got the whole answer");
}

/// With `rehash_on_eject`, the server owning a slow fill's lease is ejected for a second (frozen:
/// a read of another page through the node times out) while a renewal is due. The renewal waits
/// for the owner instead of asking the stand-in, which has no lease and would answer "gone"
/// (review: the renewal then ended for good, and the lease expired mid-fill).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_waits_for_an_ejected_owner_instead_of_its_stand_in() {
    let cluster = MemcachedCluster::start(2);
    let path = "/slow-while-ejected";
    let entry = MemcachedCluster::key_of(HOST, path);
    let owner = cluster.server_for(&entry);
    let elsewhere_on_owner = (0..)
        .map(|i| format!("/other-{i}"))
        .find(|p| cluster.server_for(&MemcachedCluster::key_of(HOST, p)) == owner)
        .expect("a page on the same server");
    let origin = TestOrigin::start(|req| {
        if req.path.starts_with("/other-") {
            return OriginResponse::ok("other").header("cache-control", "max-age=3600");
        }
        OriginResponse::ok(Body::Paced {
            chunks: vec![Bytes::from_static(b"slow-"), Bytes::from_static(b"page")],
            interval: Duration::from_millis(4500),
        })
        .header("cache-control", "max-age=3600")
    });
    let b = cluster.node(
        &origin,
        "B",
        "fill_lease = \"6s\"\nfailure_limit = 1\nrehash_on_eject = true",
    );
    let started = Instant::now();
    let reader = get_in_background(&b, path);
    // renewals are due every 2 s; the owner is frozen from 1 s to 2.1 s, and ejected (until
    // about 2.2 s) by a read of another page that times out
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.servers[owner].freeze();
    let other = b.proxy.url(&elsewhere_on_owner);
    let _other = tokio::spawn(async move { get(&other, &SITE).await });
    tokio::time::sleep(Duration::from_millis(1100)).await;
    cluster.servers[owner].thaw();
    tokio::time::sleep(Duration::from_millis(7500).saturating_sub(started.elapsed())).await;
    assert!(
        admin_stat(b.admin, "fill_leases_renewed").await >= 1,
        "the renewal ended while the owner was ejected"
    );
    assert!(
        lease_in(&cluster, path),
        "the lease of B's fill was gone in its eighth second"
    );
    let filled = reader.await.expect("B's request");
    assert_eq!(&filled.body[..], b"slow-page");
}

/// After a fill whose lease was lost: `node`'s writes are done, memcached does not hold the
/// fill's answer (`body-1-late`), and `node` does not serve it again but fetches the page anew.
async fn the_fill_is_not_kept(cluster: &MemcachedCluster, node: &Node, path: &str) {
    writes_settled(node).await;
    assert!(
        !entry_holds(&cluster.servers[0], path, b"body-1-late"),
        "memcached keeps the fill whose lease was lost"
    );
    let again = get(&node.proxy.url(path), &SITE).await;
    assert_eq!(again.status, 200);
    assert_ne!(
        &again.body[..],
        b"body-1-late",
        "{} serves the fill whose lease was lost",
        node.name
    );
}

/// The memcached server holding a slow fill's lease restarts empty in the fill's first second:
/// the lease is gone, and with it the sign that a fill of the URL is in flight (a POST through
/// another node meanwhile would find nothing stored and no lease, and not be published). The
/// fill's renewal finds the lease gone: A does not recreate it (that would not undo the gap) and
/// does not keep its fill, in its memory or in memcached; its client still gets the answer.
/// (Before, the renewal stopped quietly and the fill was stored and written as any other.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_whose_renewal_finds_its_lease_lost_with_a_restarted_server_is_not_kept() {
    let mut cluster = MemcachedCluster::start(1);
    let path = "/lease-lost-at-renewal";
    let origin = counting_origin(Duration::from_secs(4), "max-age=3600");
    let a = cluster.node(&origin, "A", "local_ttl = \"30s\"\nfill_lease = \"3s\"");
    let filled = get_in_background(&a, path);
    claimed(&cluster, path, "A").await;
    cluster.servers[0].restart();
    // renewals are due every second
    assert_eq!(
        wait_for_stat(a.admin, "fill_leases_lost", 1, Duration::from_millis(2500)).await,
        1,
        "A's renewals did not find the lease gone"
    );
    assert!(!lease_in(&cluster, path), "the lost lease was recreated");
    let filled = filled.await.expect("A's request");
    assert_eq!(&filled.body[..], b"body-1-late");
    the_fill_is_not_kept(&cluster, &a, path).await;
}

/// As above, but the fill ends before any renewal is due (`fill_lease = "30s"`: every 10 s),
/// and after A's connections to the restarted server work again: the lease is found gone only
/// by the delete that follows the fill's write. A deletes what it wrote and drops its own copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_whose_lease_was_lost_before_any_renewal_is_not_kept_once_written() {
    let mut cluster = MemcachedCluster::start(1);
    let path = "/lease-lost-before-renewal";
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let origin = TestOrigin::start(move |req| {
        if req.path.starts_with("/other-") {
            return OriginResponse::ok("other").header("cache-control", "max-age=3600");
        }
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        OriginResponse::ok(Body::Paced {
            chunks: vec![
                Bytes::from(format!("body-{n}-")),
                Bytes::from_static(b"late"),
            ],
            interval: Duration::from_secs(6),
        })
        .header("cache-control", "max-age=3600")
    });
    let a = cluster.node(&origin, "A", "local_ttl = \"30s\"\nfill_lease = \"30s\"");
    let filled = get_in_background(&a, path);
    claimed(&cluster, path, "A").await;
    cluster.servers[0].restart();
    // A's pooled connections to the restarted server fail once: it writes other pages until
    // one lands, so that the fill's write does too
    write_until_reconnected(&a, &cluster.servers[0], b"other").await;
    let filled = filled.await.expect("A's request");
    assert_eq!(&filled.body[..], b"body-1-late");
    assert_eq!(
        wait_for_stat(a.admin, "fill_leases_lost", 1, Duration::from_secs(5)).await,
        1,
        "the delete after A's write did not find the lease gone"
    );
    assert_eq!(admin_stat(a.admin, "fill_leases_renewed").await, 0);
    the_fill_is_not_kept(&cluster, &a, path).await;
    assert_eq!(served.load(Ordering::SeqCst), 2);
}

/// The value of `path`'s lease, if it is in memcached (one server): its time, then the holder
/// of the claim that made it.
fn lease_value(cluster: &MemcachedCluster, path: &str) -> Option<String> {
    cluster.servers[0]
        .get_raw(&lease_key(path))
        .map(|raw| String::from_utf8_lossy(&raw).into_owned())
}

/// The holder a lease's value names (what follows its time).
fn holder_of(value: &str) -> &str {
    value.split_once(' ').map_or("", |(_, holder)| holder)
}

/// Asserts that `who`'s fill claims `path` (its lease appears in memcached) within 2 s: the
/// first step of the tests of a lost lease below, each of which waited for it alike.
async fn claimed(cluster: &MemcachedCluster, path: &str, who: &str) {
    assert!(
        poll_until_async(Duration::from_secs(2), || lease_in(cluster, path)).await,
        "{who} never claimed the fill"
    );
}

/// A's fill of `path` (sent now) claims it; its lease then vanishes (deleted here, as an
/// eviction or a server restarted empty would) and B, missing the URL (sent next), claims it
/// anew. The start the two tests of another claim in a lease share; returns A's and B's
/// requests and the value of B's lease.
async fn claimed_again_by_b(
    cluster: &MemcachedCluster,
    a: &Node,
    b: &Node,
    path: &str,
) -> (
    tokio::task::JoinHandle<Resp>,
    tokio::task::JoinHandle<Resp>,
    String,
) {
    let a_fill = get_in_background(a, path);
    claimed(cluster, path, "A").await;
    let reply = cluster.servers[0].command(&format!("delete {}", lease_key(path)), None);
    assert!(reply.starts_with("DELETED"), "{reply}");
    let b_fill = get_in_background(b, path);
    claimed(cluster, path, "B").await;
    let b_lease = lease_value(cluster, path).expect("B's lease");
    (a_fill, b_fill, b_lease)
}

/// An origin whose first answer to a GET takes `first` (`body-1-` then `late`), and every
/// later one `later` (`body-<n>-late`).
fn origin_slower_after_the_first(first: Duration, later: Duration) -> TestOrigin {
    let served = AtomicUsize::new(0);
    TestOrigin::start(move |_| {
        let n = served.fetch_add(1, Ordering::SeqCst) + 1;
        OriginResponse::ok(Body::Paced {
            chunks: vec![
                Bytes::from(format!("body-{n}-")),
                Bytes::from_static(b"late"),
            ],
            interval: if n == 1 { first } else { later },
        })
        .header("cache-control", "max-age=3600")
    })
}

/// A's fill is slow; its lease vanishes (deleted here, as an eviction or a server restarted
/// empty would) and B, missing the URL, claims it anew and fetches too. A's next renewal finds
/// B's claim in the lease: A counts its lease lost and does not keep its fill, and leaves B's
/// lease as it is, B's, through A's renewal and A's request's end, while B's fill lasts.
/// (Before, A's renewal was a `replace` of whatever lease was there: it overwrote B's lease
/// with A's time, A never learned its lease was lost, and kept and served its fill.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_that_finds_another_claim_in_its_lease_leaves_it_and_keeps_no_fill() {
    let cluster = MemcachedCluster::start(1);
    let path = "/lease-claimed-again-before-renewal";
    let origin = origin_slower_after_the_first(Duration::from_secs(4), Duration::from_secs(7));
    let config = "local_ttl = \"30s\"\nfill_lease = \"3s\"";
    let a = cluster.node(&origin, "A", config);
    let b = cluster.node(&origin, "B", config);
    let (a_fill, b_fill, b_lease) = claimed_again_by_b(&cluster, &a, &b, path).await;
    // A's renewals are due every second
    assert_eq!(
        wait_for_stat(a.admin, "fill_leases_lost", 1, Duration::from_secs(3)).await,
        1,
        "A's renewal did not find its lease claimed by B"
    );
    let after = lease_value(&cluster, path).expect("B's lease is gone after A's renewal");
    assert_eq!(
        holder_of(&after),
        holder_of(&b_lease),
        "A's renewal overwrote B's lease ({b_lease:?}, then {after:?})"
    );
    let a_fill = a_fill.await.expect("A's request");
    assert_eq!(&a_fill.body[..], b"body-1-late");
    writes_settled(&a).await;
    let after = lease_value(&cluster, path).expect("B's lease is gone after A's fill ended");
    assert_eq!(holder_of(&after), holder_of(&b_lease));
    assert!(
        !holder_of(&b_lease).is_empty(),
        "{b_lease:?} names no holder"
    );
    the_fill_is_not_kept(&cluster, &a, path).await;
    let b_fill = b_fill.await.expect("B's request");
    assert_eq!(&b_fill.body[..], b"body-2-late");
    assert_eq!(admin_stat(b.admin, "fill_leases_lost").await, 0);
    assert!(admin_stat(b.admin, "fill_leases_renewed").await >= 1);
    let again = get(&b.proxy.url(path), &SITE).await;
    assert_eq!(&again.body[..], b"body-2-late", "B did not keep its fill");
}

/// As above, but A's fill ends before any renewal is due (`fill_lease = "30s"`): the delete
/// that follows A's write is what finds B's claim in the lease. A deletes only a lease still
/// its own (by the CAS token its claim was given, then by the holder the lease names), so it
/// leaves B's lease in place, counts its own lost and does not keep its fill; B's fill is kept.
/// (Before, that delete took B's lease for A's: it deleted it, and A kept its fill.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_delete_after_a_write_leaves_another_claims_lease_and_keeps_no_fill() {
    let cluster = MemcachedCluster::start(1);
    let path = "/lease-claimed-again-before-the-write";
    let origin = origin_slower_after_the_first(Duration::from_secs(2), Duration::from_secs(5));
    let config = "local_ttl = \"30s\"\nfill_lease = \"30s\"";
    let a = cluster.node(&origin, "A", config);
    let b = cluster.node(&origin, "B", config);
    let (a_fill, b_fill, b_lease) = claimed_again_by_b(&cluster, &a, &b, path).await;
    let a_fill = a_fill.await.expect("A's request");
    assert_eq!(&a_fill.body[..], b"body-1-late");
    assert_eq!(
        wait_for_stat(a.admin, "fill_leases_lost", 1, Duration::from_secs(5)).await,
        1,
        "the delete after A's write did not find its lease claimed by B"
    );
    writes_settled(&a).await;
    assert_eq!(
        lease_value(&cluster, path).as_deref(),
        Some(&b_lease[..]),
        "A's release took B's lease"
    );
    assert_eq!(admin_stat(a.admin, "fill_leases_renewed").await, 0);
    the_fill_is_not_kept(&cluster, &a, path).await;
    let b_fill = b_fill.await.expect("B's request");
    assert_eq!(&b_fill.body[..], b"body-2-late");
    assert_eq!(admin_stat(b.admin, "fill_leases_lost").await, 0);
    let again = get(&b.proxy.url(path), &SITE).await;
    assert_eq!(&again.body[..], b"body-2-late", "B did not keep its fill");
}
