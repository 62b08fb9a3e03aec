//! Attacks on a claim of a URL's fill lease whose `add` memcached did not answer in time
//! (`Claim::unanswered` in `storage::fill_lease`): its fill is fetched, refused when it finishes
//! (`MemoryMiss::refuse` in `TieredMiss::finish`) and its lease, if it landed, released by its
//! holder. Over real sockets and real memcached processes, with a [`Relay`] between a node and
//! memcached that holds the claim's `ms <lease> ... ME c` past `op_timeout`:
//!
//! * the requests that follow the refused fill on the claiming node, while the claiming request
//!   still runs (its client reads slowly), and a POST through another node meanwhile;
//! * the claiming node's other requests for the URL (they coalesce behind the fill): whole
//!   answers, nothing stored, and the URL filled normally afterwards;
//! * the fill failing at the origin (502, a cut body), the answer uncacheable, a HEAD, a drain
//!   cut mid-fill, a large fill a slow reader joined, a claim that lands after its fill was
//!   released: whole answers, no stuck state, no lease left behind for longer than the lease;
//! * an unanswered claim's late lease released on a quiet node (its own timeout counted the
//!   server failing), so the nodes that found it are not held for the whole lease;
//! * a waiter whose lease was released claims the URL once more, and its fill is not kept over a
//!   POST through another node meanwhile (it fetched with no claim, and was);
//! * a miss the fast path declines (`Range`, validators) claims the lease on the standard path,
//!   and its fill is not kept over a POST through another node meanwhile (it claimed none, and
//!   was);
//! * a fetch started while the refused claim marks the URL, ending after the claiming request:
//!   it claims the URL anew, and is not kept over a POST through another node meanwhile (it
//!   followed the refused claim with no lease, and was).

use lacquer_test_support as support;

use std::time::Instant;
use support::lease_rig::*;
use support::*;

/// `body-{n}`, fresh for an hour.
fn small(n: usize) -> OriginResponse {
    OriginResponse::ok(format!("body-{n}")).header("cache-control", "max-age=3600")
}

/// The size of the page the slow client below does not read: far more than the socket buffers
/// between the node and a client whose receive buffer is 4 KiB.
const BIG: usize = 8 << 20;

/// Sections for a node whose clients may stall for minutes, and that stores pages of [`BIG`].
const PATIENT: &str = "[server]\nsend_timeout = \"10m\"\n[cache]\nmax_object_size = \"64MiB\"\n";

// ---------------------------------------------------------------------------------------------
// After the refused fill, while the claiming request still runs
// ---------------------------------------------------------------------------------------------

/// A's claim of `/big` is held by the relay 700 ms, past `op_timeout` (200 ms): A fetches the
/// page unguarded (the origin answers after 1 s, 8 MiB), and the claim lands at 0.7 s. A's client
/// reads none of it (a phone in a tunnel), so A's request lasts long after its fill: the fill
/// finishes, is refused (unguarded), and its late lease released. The URL stays marked on A (the
/// claiming request is not over).
///
/// A second request for `/big` on A then finds nothing stored anywhere and no lease, and fetches
/// (its answer held at the origin). It claims the URL anew (A's first claim's fill is over), so
/// a POST through B meanwhile finds its lease, deletes it and publishes itself; the second
/// fetch, from before the POST, must not be kept: a node serving it would serve the page as it
/// was before the POST, for its hour. (Before 2026-12-06 the second request followed A's first
/// claim, `ThisNode`, with no lease of its own, and the POST was published to no one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fetch_after_the_refused_fill_while_its_request_still_runs_is_not_kept_over_a_post() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/big";
    let origin = GatedOrigin::answering(|_, n| match n {
        1 => OriginResponse::generated(BIG, 1)
            .header("cache-control", "max-age=3600")
            .delay(Duration::from_millis(1000)),
        n => small(n),
    });
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(700)));
    let tokens = Tokens::new();
    let config = "local_ttl = \"30s\"\nfill_lease = \"5s\"";
    let a = node_with(&tokens, relay.addr, &origin.origin, "A", PATIENT, config);
    let b = node_with(&tokens, server.addr(), &origin.origin, "B", PATIENT, config);
    let c = node_with(&tokens, server.addr(), &origin.origin, "C", PATIENT, config);
    // A's client asks, and reads nothing
    let mut stalled = StallingClient::stalled(a.proxy.addr(), HOST, path).await;
    assert!(
        poll_until_async(Duration::from_secs(3), || lease_present(server, path)).await,
        "the claim held by the relay never reached memcached"
    );
    assert_eq!(admin_stat(a.admin, "fills_unguarded").await, 1);
    // the fill finishes (refused) and A releases the late lease
    assert!(
        poll_until_async(SETTLE, || !lease_present(server, path)).await,
        "A did not release its late lease when its fill ended"
    );
    assert_eq!(origin.hits_for(path), 1);
    assert!(!entry_holds(server, path, &generated_range(0, 64, 1)));
    // a second request on A, its answer held at the origin
    origin.close(path, 2);
    let url = a.proxy.url(path);
    let second = tokio::spawn(async move { get(&url, &SITE).await });
    assert!(
        origin
            .origin
            .wait_for_hits_for_async(path, 2, Duration::from_secs(5))
            .await,
        "the second request did not reach the origin"
    );
    // the second request claimed the URL anew (the first claim's fill is over): its fetch is
    // guarded by a lease of its own (before 2026-12-06 it had none, and its fill was refused only
    // while A's request lasted)
    assert!(
        lease_present(server, path),
        "the second fetch is guarded by no lease"
    );
    let posted = post(&b.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    origin.open(path, 2);
    let second = second.await.expect("the second request");
    assert_eq!(second.status, 200);
    assert_eq!(&second.body[..], b"body-2");
    assert_eq!(
        wait_for_stat_at_most(a.admin, "background_writes", 0, SETTLE).await,
        0
    );
    let kept = entry_holds(server, path, b"body-2");
    let mut served = Vec::new();
    for node in [&c, &b, &a] {
        if get(&node.proxy.url(path), &SITE).await.body[..] == b"body-2"[..] {
            served.push(node.name.clone());
        }
    }
    // A's own client is still there, and gets the whole first answer once it reads
    let answer = stalled.answer(false).await;
    assert_eq!(answer.status, 200);
    assert!(answer.complete, "A's own client's answer was cut");
    assert_generated_page(&answer.body, BIG, 1, "A's own client");
    assert!(
        served.is_empty() && !kept,
        "the page as it was before the POST is served by {served:?}, kept in memcached: {kept}"
    );
    a.proxy.assert_no_panic();
}

/// As above, but the second request's answer is held at the origin until after A's own client
/// has read its answer and A's request is over (the URL no longer marked on A), and the POST
/// through B comes between the two. The second fetch was sent while A held the URL by its
/// refused claim, with no claim of its own: no lease guarded it, and the POST, finding no lease
/// and no entry, was published to no one. It finishes once nothing on A marks the URL any more,
/// and is kept: the page as it was before the POST is served by every node for its hour.
///
/// (So it was until 2026-12-06: the refusal was decided when the fill finished, by the URL's
/// mark on this node. Now a request that finds a claim of this node whose fill is over, refused
/// here, claims the URL anew (`FillLeases::claim`), and the claiming request's end removes its
/// own mark only: the second fetch goes under a lease of its own, which the POST finds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fetch_started_while_the_refused_claim_marks_the_url_and_ending_after_is_not_kept() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/big-after";
    let origin = GatedOrigin::answering(|_, n| match n {
        1 => OriginResponse::generated(BIG, 1)
            .header("cache-control", "max-age=3600")
            .delay(Duration::from_millis(1000)),
        n => small(n),
    });
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(700)));
    let tokens = Tokens::new();
    let config = "local_ttl = \"30s\"\nfill_lease = \"5s\"";
    let a = node_with(&tokens, relay.addr, &origin.origin, "A", PATIENT, config);
    let b = node_with(&tokens, server.addr(), &origin.origin, "B", PATIENT, config);
    let c = node_with(&tokens, server.addr(), &origin.origin, "C", PATIENT, config);
    let mut stalled = StallingClient::stalled(a.proxy.addr(), HOST, path).await;
    assert!(
        poll_until_async(Duration::from_secs(3), || lease_present(server, path)).await,
        "the claim held by the relay never reached memcached"
    );
    assert!(
        poll_until_async(SETTLE, || !lease_present(server, path)).await,
        "A did not release its late lease when its fill ended"
    );
    origin.close(path, 2);
    let url = a.proxy.url(path);
    let second = tokio::spawn(async move { get(&url, &SITE).await });
    assert!(
        origin
            .origin
            .wait_for_hits_for_async(path, 2, Duration::from_secs(5))
            .await,
        "the second request did not reach the origin"
    );
    // A's own client reads its answer: A's request ends
    let answer = stalled.answer(false).await;
    assert!(answer.complete, "A's own client's answer was cut");
    assert_generated_page(&answer.body, BIG, 1, "A's own client");
    drop(stalled);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // the second fetch's own lease (claimed anew), not removed with A's first request
    assert!(
        lease_present(server, path),
        "the second fetch is guarded by no lease"
    );
    let posted = post(&b.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    origin.open(path, 2);
    let second = second.await.expect("the second request");
    assert_eq!(&second.body[..], b"body-2");
    assert_eq!(
        wait_for_stat_at_most(a.admin, "background_writes", 0, SETTLE).await,
        0
    );
    let kept = entry_holds(server, path, b"body-2");
    let mut served = Vec::new();
    for node in [&c, &b, &a] {
        if get(&node.proxy.url(path), &SITE).await.body[..] == b"body-2"[..] {
            served.push(node.name.clone());
        }
    }
    assert!(
        served.is_empty() && !kept,
        "the page as it was before the POST is served by {served:?}, kept in memcached: {kept}"
    );
}

// ---------------------------------------------------------------------------------------------
// The claiming node's other requests, and what is left after the fill
// ---------------------------------------------------------------------------------------------

/// `body-{n}-` then `late` after `pause` (so the body takes `pause`), fresh for an hour.
fn paced(n: usize, pause: Duration) -> OriginResponse {
    OriginResponse::ok(Body::Paced {
        chunks: vec![
            Bytes::from(format!("body-{n}-")),
            Bytes::from_static(b"late"),
        ],
        interval: pause,
    })
    .header("cache-control", "max-age=3600")
}

/// A's claim is held by the relay past `op_timeout`; while A's fill (1 s) is at the origin, two
/// more requests for the URL on A coalesce behind it. All three get the whole answer, from one
/// origin fetch, and nothing of it is stored or written. Once they are over, nothing is left
/// marked on A nor in memcached: the next request claims the URL, fetches it and stores it as
/// any miss (written to memcached, a hit after, and B is served it from memcached).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_behind_an_unanswered_claims_fill_get_it_whole_and_the_url_is_filled_after() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/coalesced";
    let origin = GatedOrigin::answering(|_, n| paced(n, Duration::from_millis(1000)));
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(700)));
    let tokens = Tokens::new();
    let config = "local_ttl = \"30s\"\nfill_lease = \"5s\"";
    let a = node_via(&tokens, relay.addr, &origin.origin, "A", config);
    let b = node_via(&tokens, server.addr(), &origin.origin, "B", config);
    let url = a.proxy.url(path);
    let first = tokio::spawn({
        let url = url.clone();
        async move { get(&url, &SITE).await }
    });
    assert!(
        origin
            .origin
            .wait_for_hits_for_async(path, 1, Duration::from_secs(3))
            .await
    );
    let others: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { get(&url, &SITE).await })
        })
        .collect();
    let mut answers = vec![first.await.unwrap()];
    for other in others {
        answers.push(other.await.unwrap());
    }
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.status, 200, "request {i}");
        assert_eq!(&answer.body[..], b"body-1-late", "request {i}");
    }
    assert_eq!(
        origin.hits_for(path),
        1,
        "the requests on A did not coalesce"
    );
    assert!(relay.rules_used());
    assert_eq!(admin_stat(a.admin, "fills_unguarded").await, 1);
    assert_eq!(
        wait_for_stat_at_most(a.admin, "background_writes", 0, SETTLE).await,
        0
    );
    assert_eq!(admin_stat(a.admin, "writes").await, 0, "A wrote its fill");
    assert!(
        poll_until_async(SETTLE, || !lease_present(server, path)).await,
        "the late lease was left"
    );
    // the next request is a miss like any: claimed, fetched, stored
    let next = get(&url, &SITE).await;
    assert_eq!(&next.body[..], b"body-2-late");
    assert_eq!(admin_stat(a.admin, "fills_claimed").await, 1);
    assert_eq!(wait_for_stat(a.admin, "writes", 1, SETTLE).await, 1);
    assert!(entry_holds(server, path, b"body-2-late"));
    assert!(
        poll_until_async(SETTLE, || !lease_present(server, path)).await,
        "the second fill's lease was left"
    );
    let again = get(&url, &SITE).await;
    assert!(again.is_hit());
    assert_eq!(&again.body[..], b"body-2-late");
    let from_b = get(&b.proxy.url(path), &SITE).await;
    assert_eq!(&from_b.body[..], b"body-2-late");
    assert_eq!(origin.hits_for(path), 2);
    assert_eq!(admin_stat(a.admin, "fill_leases_lost").await, 0);
    a.proxy.assert_no_panic();
}

/// A's claims of three pages are each held by the relay past `op_timeout`, and land while A's
/// fetch is at the origin (1 s); the origin then fails each differently: a `502`, a body cut
/// short, an answer not to be stored (`no-store`). No crash; each late lease is released (by
/// the request's end: nothing was stored), nothing is written, and nothing is left marked on
/// A: the next request for each page fetches it and stores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unanswered_claims_fill_that_fails_leaves_no_lease_and_no_stuck_url() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let paths = ["/fails-502", "/fails-cut", "/fails-no-store"];
    let origin = GatedOrigin::answering(|path, n| {
        let late = Duration::from_millis(1000);
        match (path, n) {
            ("/fails-502", 1) => OriginResponse::new(502).body("bad gateway").delay(late),
            ("/fails-cut", 1) => OriginResponse::ok(Body::Truncated {
                declared_len: 100_000,
                data: Bytes::from_static(b"body-1-cut"),
            })
            .header("cache-control", "max-age=3600")
            .delay(late),
            ("/fails-no-store", 1) => OriginResponse::ok("body-1-private")
                .header("cache-control", "no-store")
                .delay(late),
            (_, n) => small(n),
        }
    });
    let relay = Relay::start(server.addr()).await;
    for path in paths {
        relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(600)));
    }
    let tokens = Tokens::new();
    let a = node_via(
        &tokens,
        relay.addr,
        &origin.origin,
        "A",
        "local_ttl = \"30s\"\nfill_lease = \"10s\"",
    );
    for (i, path) in paths.into_iter().enumerate() {
        let mut client = StallingClient::eager(a.proxy.addr(), HOST, path).await;
        let answer = client.answer(false).await;
        match path {
            "/fails-502" => assert_eq!(answer.status, 502, "{path}"),
            "/fails-cut" => assert!(!answer.complete, "{path}: a cut body came whole"),
            _ => assert_eq!(&answer.body[..], b"body-1-private", "{path}"),
        }
        assert_eq!(
            admin_stat(a.admin, "fills_unguarded").await,
            i as u64 + 1,
            "{path}: the claim was answered"
        );
        assert!(
            poll_until_async(SETTLE, || !lease_present(server, path)).await,
            "{path}: the late lease was left behind the failed fill"
        );
    }
    assert!(relay.rules_used(), "a claim was not held");
    assert_eq!(
        wait_for_stat_at_most(a.admin, "background_writes", 0, SETTLE).await,
        0
    );
    assert_eq!(admin_stat(a.admin, "writes").await, 0);
    for path in paths {
        let next = get(&a.proxy.url(path), &SITE).await;
        assert_eq!(next.status, 200, "{path}");
        assert_eq!(&next.body[..], b"body-2", "{path}");
        assert!(
            poll_until_async(SETTLE, || entry_holds(server, path, b"body-2")).await,
            "{path}: the next fill was not stored"
        );
        let again = get(&a.proxy.url(path), &SITE).await;
        assert!(again.is_hit(), "{path}: not a hit after the next fill");
    }
    // (a page last answered uncacheable is filled without a claim: `hit_for_miss`)
    assert!(admin_stat(a.admin, "fills_claimed").await >= 1);
    a.proxy.assert_no_panic();
}

/// A's claim reaches memcached and is carried out, and the relay closes A's connection instead
/// of passing the reply on (a reset, not a slow server): the `add` is not retried, so A does not
/// know its claim landed. A fetches unguarded, and B, asking meanwhile, finds A's lease and
/// waits. A's fill is refused and its lease, which names A's claim, released by A when the fill
/// ends (the reset may leave A's client taking the server for failing: a release skipped then
/// would hold B for the whole lease): B fetches for itself, well before the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_whose_reply_is_cut_after_it_landed_holds_no_one_past_the_fill() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/claim-cut";
    let origin = GatedOrigin::answering(|_, n| paced(n, Duration::from_millis(1000)));
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Cut);
    let tokens = Tokens::new();
    let config = "local_ttl = \"30s\"\nfill_lease = \"8s\"";
    let a = node_via(&tokens, relay.addr, &origin.origin, "A", config);
    let b = node_via(&tokens, server.addr(), &origin.origin, "B", config);
    let url = a.proxy.url(path);
    let a_fill = tokio::spawn(async move { get(&url, &SITE).await });
    assert!(
        origin
            .origin
            .wait_for_hits_for_async(path, 1, Duration::from_secs(3))
            .await
    );
    assert!(lease_present(server, path), "the cut claim did not land");
    assert_eq!(
        relay
            .lines_starting(&format!("ms {} ", lease_key(path)))
            .len(),
        1
    );
    assert_eq!(admin_stat(a.admin, "fills_unguarded").await, 1);
    let asked = Instant::now();
    let b_answer = get(&b.proxy.url(path), &SITE).await;
    let b_took = asked.elapsed();
    let a_answer = a_fill.await.expect("A's request");
    assert_eq!(&a_answer.body[..], b"body-1-late");
    assert_eq!(&b_answer.body[..], b"body-2-late");
    assert!(
        b_took < Duration::from_millis(6_000),
        "B waited out the lease ({b_took:?}): A did not release it"
    );
    assert_eq!(
        wait_for_stat_at_most(a.admin, "background_writes", 0, SETTLE).await,
        0
    );
    assert_eq!(admin_stat(a.admin, "writes").await, 0, "A wrote its fill");
    assert!(
        poll_until_async(SETTLE, || !lease_present(server, path)).await,
        "the lease was left"
    );
    a.proxy.assert_no_panic();
}

/// A's claim of a page that varies by `X-Lang` is held by the relay past `op_timeout`; A's fill
/// of the `en` variant streams slowly (its head at once, its body over 1.5 s). Meanwhile a
/// request on A for the `fr` variant takes the URL as held here (`FillClaim::ThisNode`), fetches
/// its own variant and finishes first: it is refused, being unguarded too, and its end releases
/// the URL's lease. A's `en` fill, finishing after, must still be refused: its claim went
/// unanswered whatever ended first. (Before the `Refused` mark, the other variant's end marked
/// the URL released, and the `en` fill, no longer seen as the unanswered claim's, was kept and
/// written.) Every client gets its variant whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unanswered_claims_fill_stays_refused_when_another_variant_ends_first() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/varies";
    let origin = TestOrigin::start(|req| {
        if req.method == "POST" {
            return OriginResponse::ok("changed");
        }
        let lang = req.header("x-lang").unwrap_or("none").to_string();
        let response = match lang.as_str() {
            "en" => OriginResponse::ok(Body::Paced {
                chunks: vec![Bytes::from("en-"), Bytes::from_static(b"late")],
                interval: Duration::from_millis(1500),
            }),
            _ => OriginResponse::ok(format!("{lang}-quick")),
        };
        response
            .header("cache-control", "max-age=3600")
            .header("vary", "X-Lang")
    });
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(700)));
    let tokens = Tokens::new();
    let config = "local_ttl = \"30s\"\nfill_lease = \"5s\"";
    let a = node_via(&tokens, relay.addr, &origin, "A", config);
    let c = node_via(&tokens, server.addr(), &origin, "C", config);
    let url = a.proxy.url(path);
    let en = tokio::spawn({
        let url = url.clone();
        async move { get(&url, &[("host", HOST), ("x-lang", "en")]).await }
    });
    assert!(
        origin
            .wait_for_hits_for_async(path, 1, Duration::from_secs(3))
            .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fr = get(&url, &[("host", HOST), ("x-lang", "fr")]).await;
    assert_eq!(&fr.body[..], b"fr-quick");
    let en = en.await.expect("the en request");
    assert_eq!(&en.body[..], b"en-late");
    assert_eq!(admin_stat(a.admin, "fills_unguarded").await, 1);
    assert_eq!(
        wait_for_stat_at_most(a.admin, "background_writes", 0, SETTLE).await,
        0
    );
    assert_eq!(
        admin_stat(a.admin, "writes").await,
        0,
        "A wrote a fill of its unanswered claim"
    );
    let from_c = get(&c.proxy.url(path), &[("host", HOST), ("x-lang", "en")]).await;
    assert_eq!(&from_c.body[..], b"en-late");
    assert_eq!(
        origin.hits_for(path),
        3,
        "C was served the en fill of A's unanswered claim"
    );
    a.proxy.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Misses that never claim
// ---------------------------------------------------------------------------------------------

/// A request the fast path declines (here with a `Range`, or a validator, `If-None-Match`)
/// misses on the standard path, which asked for no lease: its fetch was guarded by no lease, as
/// an unanswered claim's was. A POST through B while it is at the origin finds
/// nothing stored and no lease, and is published to no one; the fill, from before the POST,
/// must not be kept and served by every node.
///
/// (Until 2026-12-06 the standard path's miss, after the fast path declined, claimed no lease
/// and its fill was kept and written. It now claims the lease before it goes to the origin,
/// `FillLeases::claim_for_miss`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_miss_the_fast_path_declines_is_not_kept_over_a_post_meanwhile() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let origin = GatedOrigin::answering(|_, n| small(n));
    let tokens = Tokens::new();
    let config = "local_ttl = \"30s\"\nfill_lease = \"5s\"";
    let a = node_via(&tokens, server.addr(), &origin.origin, "A", config);
    let b = node_via(&tokens, server.addr(), &origin.origin, "B", config);
    let c = node_via(&tokens, server.addr(), &origin.origin, "C", config);
    let mut failures = Vec::new();
    for (path, field) in [
        ("/ranged", ("range", "bytes=0-3")),
        ("/validated", ("if-none-match", "\"v0\"")),
    ] {
        origin.close(path, 1);
        let url = a.proxy.url(path);
        let first = tokio::spawn(async move { get(&url, &[("host", HOST), field]).await });
        assert!(
            origin
                .origin
                .wait_for_hits_for_async(path, 1, Duration::from_secs(5))
                .await,
            "{path}: the first request did not reach the origin"
        );
        let guarded = lease_present(server, path);
        let posted = post(&b.proxy.url(path), &SITE, "x=1").await;
        assert_eq!(posted.status, 200);
        origin.open(path, 1);
        let first = first.await.expect("the first request");
        assert!(first.status == 200 || first.status == 206, "{path}");
        assert_eq!(
            wait_for_stat_at_most(a.admin, "background_writes", 0, SETTLE).await,
            0
        );
        let kept = entry_holds(server, path, b"body-1");
        let mut served = Vec::new();
        for node in [&c, &b, &a] {
            if get(&node.proxy.url(path), &SITE).await.body[..] == b"body-1"[..] {
                served.push(node.name.clone());
            }
        }
        if kept || !served.is_empty() {
            failures.push(format!(
                "{path} (lease while at the origin: {guarded}): the page as it was before the \
                 POST is served by {served:?}, kept in memcached: {kept}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A's claim is held by the relay past `op_timeout` and lands while A's fill is at the origin;
/// B asks then, finds the lease and waits. A's fill ends, refused, and A releases the lease, so
/// B fetches for itself, as meant (`a_claim_memcached_carries_out_after_its_sender_gave_up_...`
/// in `tests/fill_lease_attacks.rs`). But B's fetch claimed no lease either (a waiter whose lease
/// was gone fetched with none): a POST through C while it is at the
/// origin finds nothing stored and no lease, and is published to no one, and B's fill, from
/// before the POST, was kept and served by every node. A waiter whose lease is gone now claims
/// the URL once more (`FillLeases::on_shared_miss`): B fetches under its own lease, which the
/// POST finds (and deletes, and publishes itself), and B's fill is not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_on_a_late_claims_lease_fetches_unguarded_and_is_kept_over_a_post() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/waited-late";
    let origin = GatedOrigin::answering(|_, n| match n {
        1 => paced(1, Duration::from_millis(1000)).delay(Duration::from_millis(500)),
        n => small(n),
    });
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(500)));
    let tokens = Tokens::new();
    let config = "local_ttl = \"30s\"\nfill_lease = \"8s\"";
    let a = node_via(&tokens, relay.addr, &origin.origin, "A", config);
    let b = node_via(&tokens, server.addr(), &origin.origin, "B", config);
    let c = node_via(&tokens, server.addr(), &origin.origin, "C", config);
    let url = a.proxy.url(path);
    let a_fill = tokio::spawn(async move { get(&url, &SITE).await });
    assert!(
        poll_until_async(Duration::from_secs(3), || lease_present(server, path)).await,
        "the claim held by the relay never reached memcached"
    );
    origin.close(path, 2);
    let url = b.proxy.url(path);
    let b_fill = tokio::spawn(async move { get(&url, &SITE).await });
    let a_answer = a_fill.await.expect("A's request");
    assert_eq!(&a_answer.body[..], b"body-1-late");
    assert!(
        origin.origin.wait_for_hits_for_async(path, 2, SETTLE).await,
        "B never fetched for itself"
    );
    assert_eq!(admin_stat(b.admin, "fill_waits").await, 1);
    let guarded = lease_present(server, path);
    let posted = post(&c.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    origin.open(path, 2);
    let b_answer = b_fill.await.expect("B's request");
    assert_eq!(&b_answer.body[..], b"body-2");
    assert_eq!(
        wait_for_stat_at_most(b.admin, "background_writes", 0, SETTLE).await,
        0
    );
    let kept = entry_holds(server, path, b"body-2");
    let mut served = Vec::new();
    for node in [&c, &a, &b] {
        if get(&node.proxy.url(path), &SITE).await.body[..] == b"body-2"[..] {
            served.push(node.name.clone());
        }
    }
    assert!(
        served.is_empty() && !kept,
        "(a lease while B fetched: {guarded}) the page as it was before the POST is served by \
         {served:?}, kept in memcached: {kept}"
    );
}

// ---------------------------------------------------------------------------------------------
// A drain cut in the middle of an unanswered claim's fill
// ---------------------------------------------------------------------------------------------

/// A's claim is held by the relay past `op_timeout` and lands while A's slow fill (3 s) is at
/// the origin; A is then sent SIGTERM and its drain cut at `shutdown_timeout` (1 s). The claim
/// is held here as an unanswered one, not renewed, but its lease is in memcached naming it:
/// A deletes it before it exits (`release_held`, by the holder it names), so B, asking right
/// after, claims the URL and fetches it at once instead of waiting for a fill that will never
/// come. Nothing of the cut fill is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_cut_in_an_unanswered_claims_fill_releases_its_late_lease() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/drained-late";
    let origin = GatedOrigin::answering(|_, n| match n {
        1 => paced(1, Duration::from_millis(3000)),
        n => small(n),
    });
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(500)));
    let tokens = Tokens::new();
    let config = "local_ttl = \"30s\"\nfill_lease = \"8s\"";
    let mut a = node_with(
        &tokens,
        relay.addr,
        &origin.origin,
        "A",
        "shutdown_timeout = \"1s\"\n",
        config,
    );
    let b = node_via(&tokens, server.addr(), &origin.origin, "B", config);
    let addr = a.proxy.addr();
    let a_fill = tokio::spawn(async move {
        StallingClient::eager(addr, HOST, path)
            .await
            .answer(false)
            .await
    });
    assert!(
        poll_until_async(Duration::from_secs(3), || lease_present(server, path)).await,
        "the claim held by the relay never reached memcached"
    );
    assert_eq!(admin_stat(a.admin, "fills_unguarded").await, 1);
    assert!(a.proxy.signal("TERM"));
    let status = a.proxy.wait_exit(Duration::from_secs(6));
    assert!(
        status.is_some_and(|s| s.success()),
        "A: {status:?}; stderr:\n{}",
        a.proxy.stderr_log()
    );
    let cut = a_fill.await.expect("A's client");
    assert!(!cut.complete, "the drain did not cut the fill");
    assert!(
        !lease_present(server, path),
        "A exited leaving its late lease in memcached"
    );
    assert!(
        server.get_raw(&entry_key(path)).is_none(),
        "the cut fill was stored"
    );
    let asked = Instant::now();
    let from_b = get(&b.proxy.url(path), &SITE).await;
    assert_eq!(&from_b.body[..], b"body-2");
    assert!(asked.elapsed() < Duration::from_secs(6));
    assert_eq!(admin_stat(b.admin, "fill_waits").await, 0, "B waited");
    assert_eq!(admin_stat(b.admin, "fills_claimed").await, 1);
}

/// A's claim is held by the relay past `op_timeout`; A's fill is a large page (8 MiB). A second
/// request on A joins the fill while it streams, and its client reads nothing until the fill has
/// ended, been refused (unguarded) and its late lease released. It then reads the whole page:
/// the refusal lets go of the fill as a purge does, not of its readers. One origin fetch for
/// both; nothing stored; the next request fetches and stores the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_reader_joined_to_an_unanswered_claims_large_fill_gets_it_whole() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/big-joined";
    let origin = GatedOrigin::answering(|_, n| {
        OriginResponse::generated(BIG, n as u8)
            .header("cache-control", "max-age=3600")
            .delay(Duration::from_millis(if n == 1 { 900 } else { 0 }))
    });
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(700)));
    let tokens = Tokens::new();
    let config = "local_ttl = \"30s\"\nfill_lease = \"5s\"";
    let a = node_with(&tokens, relay.addr, &origin.origin, "A", PATIENT, config);
    let first = tokio::spawn({
        let addr = a.proxy.addr();
        async move {
            StallingClient::eager(addr, HOST, path)
                .await
                .answer(false)
                .await
        }
    });
    assert!(
        origin
            .origin
            .wait_for_hits_for_async(path, 1, Duration::from_secs(3))
            .await
    );
    let mut joined = StallingClient::stalled(a.proxy.addr(), HOST, path).await;
    let first = first.await.expect("the first client");
    assert!(first.complete, "the first client's answer was cut");
    assert_generated_page(&first.body, BIG, 1, "the first client");
    assert!(relay.rules_used());
    assert_eq!(admin_stat(a.admin, "fills_unguarded").await, 1);
    assert!(
        poll_until_async(SETTLE, || !lease_present(server, path)).await,
        "the late lease was left"
    );
    let second = joined.answer(false).await;
    assert_eq!(second.status, 200);
    assert!(second.complete, "the joined client's answer was cut");
    assert_generated_page(&second.body, BIG, 1, "the joined client");
    assert_eq!(
        origin.hits_for(path),
        1,
        "the second request did not join the fill"
    );
    assert_eq!(
        wait_for_stat_at_most(a.admin, "background_writes", 0, SETTLE).await,
        0
    );
    assert_eq!(admin_stat(a.admin, "writes").await, 0);
    drop(joined);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = StallingClient::eager(a.proxy.addr(), HOST, path)
        .await
        .answer(false)
        .await;
    assert!(next.complete);
    assert_generated_page(&next.body, BIG, 2, "the next request");
    assert_eq!(wait_for_stat(a.admin, "writes", 1, SETTLE).await, 1);
    a.proxy.assert_no_panic();
}

/// A HEAD whose claim is held by the relay past `op_timeout` (the node asks the origin for the
/// whole answer, to store it): the client gets the head alone, nothing is stored, the late lease
/// is released, and a GET after it fetches the page and stores it; a HEAD after that is a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_head_whose_claim_went_unanswered_stores_nothing_and_leaves_nothing() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/headed";
    let origin = GatedOrigin::answering(|_, n| {
        small(n).delay(Duration::from_millis(if n == 1 { 900 } else { 0 }))
    });
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(600)));
    let tokens = Tokens::new();
    let a = node_via(
        &tokens,
        relay.addr,
        &origin.origin,
        "A",
        "local_ttl = \"30s\"\nfill_lease = \"5s\"",
    );
    let head = request("HEAD", &a.proxy.url(path), &SITE, None).await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty(), "a HEAD was answered a body");
    assert!(relay.rules_used(), "the claim was not held");
    assert_eq!(admin_stat(a.admin, "fills_unguarded").await, 1);
    assert!(
        poll_until_async(SETTLE, || !lease_present(server, path)).await,
        "the late lease was left"
    );
    assert_eq!(
        wait_for_stat_at_most(a.admin, "background_writes", 0, SETTLE).await,
        0
    );
    assert_eq!(admin_stat(a.admin, "writes").await, 0);
    let fetched = get(&a.proxy.url(path), &SITE).await;
    assert_eq!(&fetched.body[..], b"body-2");
    assert_eq!(wait_for_stat(a.admin, "writes", 1, SETTLE).await, 1);
    assert!(entry_holds(server, path, b"body-2"));
    let again = request("HEAD", &a.proxy.url(path), &SITE, None).await;
    assert!(again.is_hit(), "a HEAD after the fill is not a hit");
    assert_eq!(origin.hits_for(path), 2);
    a.proxy.assert_no_panic();
}

/// A's claim is held by the relay 1.5 s, and A's fill (answered at once) has ended, been refused
/// and had its release find no lease before the claim lands: the late lease then names a claim
/// nobody will release. Nodes that miss the URL meanwhile (B, and A itself: it does not know the
/// lease for its own) wait for it, but only until `fill_lease` (4 s) from the claim's time, which
/// the lease carries (so not for the lease's whole life from when it landed), then fetch; the
/// fill that follows deletes the stray lease. A cost of a claim that lands after its fill, not a
/// stuck URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_landing_after_its_refused_fill_was_released_holds_others_at_most_the_lease() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/landed-after";
    let origin = GatedOrigin::answering(|_, n| small(n));
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(1500)));
    let tokens = Tokens::new();
    let config = "local_ttl = \"30s\"\nfill_lease = \"4s\"";
    let a = node_via(&tokens, relay.addr, &origin.origin, "A", config);
    let b = node_via(&tokens, server.addr(), &origin.origin, "B", config);
    let claimed = Instant::now();
    let first = get(&a.proxy.url(path), &SITE).await;
    assert_eq!(&first.body[..], b"body-1");
    assert!(
        !lease_present(server, path),
        "the claim landed before the fill ended"
    );
    assert!(
        poll_until_async(Duration::from_secs(3), || lease_present(server, path)).await,
        "the claim held by the relay never reached memcached"
    );
    let (url_a, url_b) = (a.proxy.url(path), b.proxy.url(path));
    let (from_a, from_b) = tokio::join!(get(&url_a, &SITE), get(&url_b, &SITE));
    let waited = claimed.elapsed();
    assert_eq!(from_a.status, 200);
    assert_eq!(from_b.status, 200);
    assert!(
        waited < Duration::from_millis(4_000 + 2_000),
        "the stray lease held requests {waited:?}, past the 4 s lease from its claim"
    );
    // (a wait that ends without the fill claims the URL once more, which finds the same stray
    // lease still in memcached: it is not waited for twice)
    for (node, name) in [(&b, "B"), (&a, "A")] {
        let waits = admin_stat(node.admin, "fill_waits").await;
        assert_eq!(
            waits, 1,
            "{name} waited {waits} times: did not find the stray lease, or waited for it again"
        );
    }
    assert!(
        poll_until_async(SETTLE, || !lease_present(server, path)).await,
        "the stray lease outlived the fill after it"
    );
    assert!(
        poll_until_async(SETTLE, || entry_holds(server, path, b"body-")).await,
        "nothing was stored after the stray lease"
    );
    a.proxy.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// The release of a late lease on a quiet node
// ---------------------------------------------------------------------------------------------

/// A's claim is held by the relay past `op_timeout` (200 ms) and lands while A's fill (2 s) is
/// at the origin; B asks then and waits on the late lease (`fill_lease = "20s"`). A's claim
/// timing out left its server counted failing on A, and on a quiet node (no other request, no
/// read of the invalidation log for 10 s) nothing answered since. A's fill ends, refused: its
/// release of the late lease is tried all the same (a background task, bounded by `op_timeout`),
/// so B is released when A's fill ends and fetches for itself, instead of waiting out the 20 s
/// lease from A's claim. (Before, the release was skipped while the server counted failing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unanswered_claims_late_lease_is_released_on_a_quiet_node() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/released-quietly";
    let origin = GatedOrigin::answering(|_, n| match n {
        1 => paced(1, Duration::from_millis(1000)),
        n => small(n),
    });
    let relay = Relay::start(server.addr()).await;
    relay.on(claim_of(path), Tamper::Delay(Duration::from_millis(500)));
    let tokens = Tokens::new();
    let quiet = "poll_interval = \"10s\"\n";
    let config = "local_ttl = \"30s\"\nfill_lease = \"20s\"";
    let a = node_configured(&tokens, relay.addr, &origin.origin, "A", "", quiet, config);
    let b = node_configured(
        &tokens,
        server.addr(),
        &origin.origin,
        "B",
        "",
        quiet,
        config,
    );
    let url = a.proxy.url(path);
    let a_fill = tokio::spawn(async move { get(&url, &SITE).await });
    assert!(
        poll_until_async(Duration::from_secs(3), || lease_present(server, path)).await,
        "the claim held by the relay never reached memcached"
    );
    let asked = Instant::now();
    let b_answer = get(&b.proxy.url(path), &SITE).await;
    let b_took = asked.elapsed();
    let a_answer = a_fill.await.expect("A's request");
    assert_eq!(&a_answer.body[..], b"body-1-late");
    assert_eq!(
        &b_answer.body[..],
        b"body-2",
        "B was served A's refused fill"
    );
    assert_eq!(admin_stat(b.admin, "fill_waits").await, 1);
    assert!(
        b_took < Duration::from_secs(10),
        "B waited {b_took:?}: the late lease was not released when A's fill ended"
    );
}
