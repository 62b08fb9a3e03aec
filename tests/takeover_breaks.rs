//! Attacks on the take-over of a stray fill lease by swap (`FillLeases::take_over`: a request
//! that waited out a lease whole and finds the very same lease again swaps it in place for its
//! own claim by the CAS token read with it) and on the last claim of a request whose waits are
//! used up (written by a breaker helper, 2026-12-07). That last claim, finding another claim's
//! lease still, fetches under it and keeps its fill only if the lease still names the same
//! holder when the fill finishes (`AfterSharedMiss::UnderAnotherClaim`): refusing such a fill
//! outright, tried and reverted the same day, made a crowd on a node fetch once per request (the
//! crowd test here). Until that fill finishes, later requests join it only while that lease
//! stands (`storage::guarded_fills`; the last test).
//!
//! Each test plants a stray lease (a value naming a claim nobody holds, as a claim landing
//! after its fill ended leaves) straight into memcached, then sends a GET through a node that
//! waits it out and takes it over.

use lacquer_test_support as support;

use std::time::Instant;
use support::lease_rig::*;
use support::*;

/// A lease naming a holder nobody has, claimed now (a stray lease, as a claim landing after its
/// fill ended leaves).
fn stray_lease() -> Vec<u8> {
    lease_naming(0xdead_beef)
}

/// A stray lease of `/cut` (planted, naming a holder nobody has) is waited out by B, found again
/// and taken over: B reads it with its token and swaps it for its own claim (`cas`). The relay
/// carries the swap out but cuts B's connection before the reply: B's memcached client retries
/// the swap on a fresh connection (a `cas` is retried as a set is), which answers "changed"
/// (the swap landed, or the token is not sent over a connection opened after it was read). B
/// reads the lease again and finds its own claim's value there: it is B's lease. Before the fix
/// B took it for another claim's, waited on it a whole lease more (as did every other node),
/// then, finding it still there, fetched "under another claim" and refused its own fill: a
/// lease B held, renewed by no one, guarded a fill nobody kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_take_over_whose_swap_reply_is_lost_holds_the_lease_it_swapped_in() {
    let server = MemcachedProcess::start();
    let path = "/cut";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let relay = Relay::with(server.addr(), renewal_of(path), Tamper::Cut).await;
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let b = nodes.start("B", relay.addr);
    // warm B's pool so the swap goes over a pooled connection, as it does in service
    assert_eq!(get(&b.proxy.url("/warm"), &SITE).await.status, 200);
    server.set_raw(&lease_key(path), &stray_lease(), 60);
    let answered = get(&b.proxy.url(path), &SITE).await;
    assert_eq!(&answered.body[..], b"body-1");
    assert!(relay.rules_used(), "B's take-over sent no swap");
    writes_settled(&b).await;
    assert_eq!(origin.hits_for(path), 1);
    assert_eq!(
        admin_stat(b.admin, "fills_under_another_claim").await,
        0,
        "B refused its own fill as fetched under another claim (its own swapped-in lease): {:?}",
        answered.cache_status()
    );
    assert!(
        entry_holds(&server, path, b"body-1"),
        "B's fill under the lease it took over was not written to memcached"
    );
    lease_released(&server, path, "B's taken-over lease was left behind").await;
}

/// The same stray lease on a memcached run without CAS tokens (`-C`): the take-over cannot swap
/// it conditionally. B fetched uncoordinated, guarded only by the stray lease until memcached
/// expired it (its TTL: a third of `fill_lease` and a second past its time). A POST through C
/// after it expired, while B is still at the origin, finds neither entry nor lease and is
/// published to no one; B's answer, from before the POST, must not be kept and served by every
/// node. Now the stray lease is followed as another claim's, and B's last claim, finding it
/// still there, fetches under it: B's fill is kept only if that lease still stands when it
/// finishes, and it is gone (failed before 2026-12-07: kept in memcached, served by every
/// node).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stray_lease_on_a_server_without_cas_is_not_fetched_past_unguarded() {
    let server = MemcachedProcess::start_with(&["-C"]);
    let path = "/no-cas";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"2s\"");
    let (a, b, c) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
        nodes.start("C", server.addr()),
    );
    origin.close(path, 1);
    // the TTL a 2 s lease is given: 2 s and a third, rounded up, and a second
    server.set_raw(&lease_key(path), &stray_lease(), 4);
    let b_fill = get_in_background(&b, path);
    assert!(
        origin
            .origin
            .wait_for_hits_for_async(path, 1, Duration::from_secs(15))
            .await,
        "B never fetched"
    );
    lease_released(&server, path, "the stray lease outlived its TTL").await;
    let posted = post(&c.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    origin.open(path, 1);
    assert_eq!(&b_fill.await.expect("B's request").body[..], b"body-1");
    writes_settled(&b).await;
    // B's GET and C's POST
    assert_eq!(origin.hits_for(path), 2);
    assert_neither_kept_nor_served(
        &server,
        &[&c, &a, &b],
        path,
        b"body-1",
        "B's fetch past a stray lease it could not take over (no CAS): the page as it was \
         before the POST",
    )
    .await;
}

/// Sum of `stat` over `nodes`.
async fn stat_sum(nodes: &[&Node], stat: &str) -> u64 {
    let mut sum = 0;
    for node in nodes {
        sum += admin_stat(node.admin, stat).await;
    }
    sum
}

/// Three nodes wait out the same stray lease of `/three` at once, and all three find it again
/// and try to take it over. Exactly one swap lands; the other two read the winner's claim since
/// and wait for its fill, and are served by it: one origin fetch for the cluster, the fill kept
/// and its lease released, none fetched under another claim. (Holds: kept as coverage.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_finding_the_same_stray_lease_again_fetch_it_once() {
    let server = MemcachedProcess::start();
    let path = "/three";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b, c) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
        nodes.start("C", server.addr()),
    );
    origin.close(path, 1);
    server.set_raw(&lease_key(path), &stray_lease(), 60);
    let fills: Vec<_> = [&a, &b, &c]
        .iter()
        .map(|node| get_in_background(node, path))
        .collect();
    assert!(
        origin
            .origin
            .wait_for_hits_for_async(path, 1, Duration::from_secs(10))
            .await,
        "nobody took the stray lease over"
    );
    // the winner waited once (the stray lease), each loser twice (the stray lease, then the
    // winner's claim): five waits in all
    let deadline = Instant::now() + SETTLE;
    while stat_sum(&[&a, &b, &c], "fill_waits").await < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        stat_sum(&[&a, &b, &c], "fill_waits").await,
        5,
        "the losers did not wait for the winner's fill"
    );
    origin.open(path, 1);
    for fill in fills {
        assert_eq!(&fill.await.expect("a request").body[..], b"body-1");
    }
    for node in [&a, &b, &c] {
        writes_settled(node).await;
    }
    assert_eq!(origin.hits_for(path), 1, "the stray lease was fetched past");
    assert_eq!(stat_sum(&[&a, &b, &c], "fills_claimed").await, 1);
    assert_eq!(stat_sum(&[&a, &b, &c], "fills_awaited").await, 2);
    assert_eq!(
        stat_sum(&[&a, &b, &c], "fills_under_another_claim").await,
        0
    );
    assert!(
        entry_holds(&server, path, b"body-1"),
        "the fill was not kept"
    );
    lease_released(&server, path, "the winner's lease was left behind").await;
}

/// B takes a stray lease of `/inflight` over, and the relay holds its swap (`cas`) 700 ms, past
/// `op_timeout`. While it is held, a POST through C finds the stray lease, deletes it and
/// publishes itself. B, its swap unanswered, fetches by a claim marked unanswered; the swap lands
/// after the POST deleted the lease and stores nothing. B's answer, from before the POST, is not
/// kept nor served by any node, and no lease is left behind. (Holds: kept as coverage.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_while_a_take_over_swap_is_in_flight_is_not_undone() {
    let server = MemcachedProcess::start();
    let path = "/inflight";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let relay = Relay::with(
        server.addr(),
        renewal_of(path),
        Tamper::Delay(Duration::from_millis(700)),
    )
    .await;
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b, c) = (
        nodes.start("A", server.addr()),
        nodes.start("B", relay.addr),
        nodes.start("C", server.addr()),
    );
    origin.close(path, 1);
    server.set_raw(&lease_key(path), &stray_lease(), 60);
    let b_fill = get_in_background(&b, path);
    let swap = format!("ms {} ", lease_key(path));
    assert!(
        poll_until_async(SETTLE, || relay
            .lines_starting(&swap)
            .iter()
            .any(|line| line.contains(" C")))
        .await,
        "B sent no swap"
    );
    let posted = post(&c.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    assert!(
        origin
            .origin
            .wait_for_hits_for_async(path, 1, Duration::from_secs(10))
            .await,
        "B never fetched"
    );
    origin.open(path, 1);
    assert_eq!(&b_fill.await.expect("B's request").body[..], b"body-1");
    writes_settled(&b).await;
    lease_released(&server, path, "a lease was left behind").await;
    assert_neither_kept_nor_served(
        &server,
        &[&c, &a, &b],
        path,
        b"body-1",
        "B's fetch from before the POST",
    )
    .await;
}

/// A claims `/crowd` and its fill is slow (renewed). Eight plain GETs reach B at once: each
/// waits for A's fill as long as it may (two leases), then claims once more, finds A's lease
/// still and fetches uncoordinated, on the standard path where B's cache lock coalesces them. At
/// most one origin fetch for B, not one per request.
///
/// When such a fetch was refused (`AfterSharedMiss::UnderAnotherClaim`, ff2b9ee, reverted the
/// same day) this made eight fetches, each refused: the origin answers B at once, so the first
/// fetch's fill was over before the requests queued behind it on the cache lock looked it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_on_one_node_after_waiting_two_leases_fetches_once() {
    let server = MemcachedProcess::start();
    let path = "/crowd";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
    );
    origin.close(path, 1);
    let a_fill = get_in_background(&a, path);
    assert!(origin.reached(path, 1).await, "A did not reach the origin");
    let answers = gets_at_once((0..8).map(|_| b.proxy.url(path)), &SITE).await;
    for answer in &answers {
        assert_eq!(answer.status, 200);
    }
    let b_fetches = origin.hits_for(path) - 1;
    origin.open(path, 1);
    assert_eq!(&a_fill.await.expect("A's request").body[..], b"body-1");
    assert!(
        b_fetches <= 1,
        "B's eight requests, after waiting out A's slow fill, went to the origin {b_fetches} \
         times (fills under another claim: {})",
        admin_stat(b.admin, "fills_under_another_claim").await
    );
}

/// A claims `/failing` and its fetch is held at the origin; eight plain GETs reach B at once and
/// wait for A's fill. A's fetch fails (a 502, stored nowhere) and A releases its lease: B's
/// waiters claim once more, one of them takes the lease and the seven others follow it on B
/// (`AfterSharedMiss::BehindThisNode`, and on the standard path a lease held by another request
/// here is not refused, `MissClaim::Unclaimed`). One origin fetch on B, kept; none fetched
/// under another claim. (Holds: kept as coverage of the regression change 3 guards against.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_on_one_node_after_another_nodes_fill_failed_fetches_once() {
    let server = MemcachedProcess::start();
    let path = "/failing";
    let origin = GatedOrigin::answering(|_, n| match n {
        1 => OriginResponse::ok("origin failed").status(502),
        n => nth_page(n),
    });
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"10s\"");
    let (a, b) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
    );
    origin.close(path, 1);
    let a_fill = get_in_background(&a, path);
    assert!(origin.reached(path, 1).await, "A did not reach the origin");
    let url = b.proxy.url(path);
    let crowd = tokio::spawn(async move { gets_at_once((0..8).map(|_| url.clone()), &SITE).await });
    assert_eq!(
        stat_reaches(&b, "fill_waits", 8).await,
        8,
        "B's crowd did not wait"
    );
    origin.open(path, 1);
    assert_eq!(a_fill.await.expect("A's request").status, 502);
    for answer in crowd.await.expect("B's crowd") {
        assert_eq!(&answer.body[..], b"body-2");
    }
    writes_settled(&b).await;
    assert_eq!(origin.hits_for(path), 2, "B's crowd fetched more than once");
    assert_eq!(admin_stat(b.admin, "fills_under_another_claim").await, 0);
    assert!(
        entry_holds(&server, path, b"body-2"),
        "B's fill was not kept"
    );
    lease_released(&server, path, "B's lease was left behind").await;
}

/// A claims `/joined` and its fill is slow (renewed). B waits for it as long as it may (two
/// leases), claims once more, finds A's lease and fetches anyway; B's
/// answer streams slowly. A's fetch then fails and A releases its lease; a POST through C finds
/// nothing stored and no lease, and is published to no one. A GET through B after the POST must
/// not be answered from B's fill in flight, fetched before the POST. (Since the refusal was
/// reverted, B's fill is also kept: `guarded_elsewhere_attacks::a_fetch_after_waiting_two_...`.)
///
/// Failed before 2026-12-07: the GET after the POST found B's fill in flight in B's memory tier
/// (the fast path declines it, `NoCompleteObject::Filling`, before any claim) and joined it on
/// the standard path (`Cache-Status: hit`, `body-2`, no fetch of its own). Now a lookup that may
/// join a fill fetched under another claim's lease reads that lease first, and gone, the node
/// lets go of the fill as a purge does (`storage::guarded_fills`); the GET fetches under a claim
/// of its own. (`guarded_elsewhere_attacks` has the same for a miss the fast path declined.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_after_a_post_is_not_served_a_fill_under_another_claim_still_streaming() {
    let server = MemcachedProcess::start();
    let path = "/joined";
    let origin = GatedOrigin::answering(|_, n| match n {
        1 => OriginResponse::ok("origin failed").status(502),
        2 => OriginResponse::ok(Body::Paced {
            chunks: vec!["bo".into(), "dy".into(), "-".into(), "2".into()],
            interval: Duration::from_millis(1500),
        })
        .header("cache-control", "max-age=3600"),
        n => nth_page(n),
    });
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b, c) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
        nodes.start("C", server.addr()),
    );
    origin.close(path, 1);
    let (a_fill, b_fill) = b_fetching_after_two_waits(&origin, &a, &b, path).await;
    origin.open(path, 1);
    assert_eq!(a_fill.await.expect("A's request").status, 502);
    lease_released(&server, path, "A's failed fill left its lease").await;
    let posted = post(&c.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    // B's fill (from before the POST) is still streaming
    let after = get(&b.proxy.url(path), &SITE).await;
    let before = b_fill.await.expect("B's first request");
    assert_eq!(&before.body[..], b"body-2");
    assert_ne!(
        &after.body[..],
        b"body-2",
        "a GET through B after the POST was served B's fill from before it ({:?}; origin hits {})",
        after.cache_status(),
        origin.hits_for(path)
    );
}
