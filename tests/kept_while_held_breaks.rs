//! Attacks on the fetch under another claim's lease by a request whose waits are used up
//! (`AfterSharedMiss::UnderAnotherClaim`, written by a breaker helper, 2026-12-07): a request
//! that waited two leases for another node's slow fill, and whose last claim still finds that
//! claim's lease, fetches under it, and its fill is kept only if the lease still names the same
//! holder when the fill finishes (`FetchedUnderAnotherClaim::KeptWhileHeldBy`,
//! `FillLeases::still_held_by`). A stray lease on a memcached run without CAS tokens (`-C`) is
//! followed the same way.
//!
//! What is attacked: a crowd on the node behind such a fetch when the other claim's fill ends
//! (stored, or failed) while the fetch is out; a POST while the other claim's lease stands; the
//! other claim's lease replaced by a new claim; the lease's server frozen when the fill ends; a
//! crowd under a stray lease on a `-C` server; a late renewal on a `-C` server; a live lease of
//! an earlier version; a drain (SIGTERM) cutting such a fetch; a published POST while such a
//! fetch streams; such a fill kept, and the other claim's lease and fill after it.
//!
//! Found and fixed: a request queued on the node's cache lock behind such a fetch, whose fill
//! was refused (the other claim's lease gone), went to the origin still marked as fetched
//! under that gone lease, with no claim of its own, and was refused in turn, though the URL was
//! free to claim (`a_request_queued_behind_a_refused_fetch_under_a_gone_lease_claims_the_url`).
//! And such a fill, kept while the other claim's lease stood, deleted that lease after its
//! write, costing that claim its fill and its node one more fetch
//! (`a_fill_kept_under_another_claims_lease_leaves_that_lease_to_its_claim`).
//! KNOWN and ignored: under a live lease of an earlier version (naming no holder) no such fill
//! is kept, and a crowd on a node stampedes
//! (`a_crowd_under_a_live_lease_of_an_earlier_version_fetches_once`); on a `-C` server, a
//! renewal's `replace` landing late brings the other claim's holder back over a newer claim's
//! lease, and the fetch from before an unpublished POST is kept
//! (`a_late_renewal_on_a_server_without_cas_does_not_keep_a_fetch_from_before_a_post`).
//! The rest hold and are kept as coverage.

use lacquer_test_support as support;

use std::time::Instant;
use support::lease_rig::*;
use support::*;

/// A claims `/stored` and its fill is slow (held at the origin, its lease renewed). Eight plain
/// GETs reach B at once; each waits for A's fill two leases, finds A's lease still and fetches
/// under it, coalesced on B's cache lock behind the first. While that first fetch is at the
/// origin, A's fill comes in: A writes its entry and releases its lease. B's fetch then answers
/// at once: refused (A's lease gone), as it should be. But A's entry is in memcached: the seven
/// requests behind B's refused fill should be served, from A's entry or one fetch of B's, not go
/// to the origin once each. (Holds: kept as coverage; one fetch of B's in every run seen.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_behind_a_fetch_under_a_lease_whose_fill_then_landed_fetches_once() {
    let server = MemcachedProcess::start();
    let path = "/stored";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
    );
    origin.close(path, 1);
    origin.close(path, 2);
    // the other seven end their waits too and queue behind B's fetch on its cache lock
    let (a_fill, crowd) = b_crowd_fetching_after_two_waits(&origin, &a, &b, path).await;
    let a_holder = lease_holder(&server, path).expect("A's lease");
    // A's fill lands: its entry written, its lease released
    origin.open(path, 1);
    assert_eq!(&a_fill.await.expect("A's request").body[..], b"body-1");
    writes_settled(&a).await;
    assert!(
        entry_holds(&server, path, b"body-1"),
        "A's fill was not kept"
    );
    // (B's crowd may claim the URL as soon as it is free: see the next test)
    lease_left(&server, path, &a_holder, "A's stored fill left its lease").await;
    origin.open(path, 2);
    for answer in crowd.await.expect("B's crowd") {
        assert_eq!(answer.status, 200);
    }
    writes_settled(&b).await;
    let b_fetches = origin.hits_for(path) - 1;
    assert!(
        b_fetches <= 2,
        "B's eight requests went to the origin {b_fetches} times, A's entry in memcached \
         (fills under another claim: {})",
        admin_stat(b.admin, "fills_under_another_claim").await
    );
}

/// A claims the URL and its fill is slow; eight plain GETs reach B at once, wait two leases,
/// and the first fetches under A's lease (the direct path), the seven others queued behind it
/// on B's cache lock. A's fetch then fails (a 502) and A releases its lease. B's fetch answers:
/// refused, as A's lease is gone. The URL is free now: a request queued behind that refused
/// fill that goes to the origin itself (those that look after it ended: a race with the fill's
/// end) must claim it and keep its fill. Before the fix it went marked as fetched under A's
/// lease, long gone, with no claim of its own, and was refused too: two origin fetches, nothing
/// kept, the next request fetching once more (failed 3 of 5 runs: "went to the origin 2 times,
/// 2 of them refused"; 0 of 5 since). Now a request fetching under another claim's lease claims
/// the URL again as it goes to the origin (`LacquerProxy::claim_unsettled_lease`). Three
/// rounds, as the race is lost only about half the time.
///
/// KNOWN, flaky: in the clean-clone CI of `6b08475` one round went "3 times, 2 of them refused".
/// Debug logs of B over 16 runs four at a time (2026-12-07, later stop) showed two causes:
/// - The test's own: it waited for no lease at all before letting B's fetch answer, but one of
///   B's crowd may claim the URL the moment A's lease goes, and then waits behind that fetch: B's
///   fetch stayed at the origin until B's cache lock timed out (10 s, `cache.lock_timeout`) and
///   the waiters competed again (3-4 fetches). It now waits until the lease no longer names A's
///   claim ([`lease_left`]); since then no run took the 10 s.
/// - Left, not pinned down: 3 to 6 fetches with only B's first refused, in 1 run of 12 and 2 of
///   16, none taking the 10 s. In the logs only three of the seven were queued on B's cache lock
///   when B's fetch answered (the setup counts the waits begun, not ended); the others came to
///   the URL after its refused fill, and more than one of them went to the origin on the standard
///   path, one after another's fill had started.
#[ignore = "KNOWN, flaky under load: requests of B's crowd still waiting when B's refused fill ends fetch again (see the doc comment)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_queued_behind_a_refused_fetch_under_a_gone_lease_claims_the_url() {
    let server = MemcachedProcess::start();
    let origin = GatedOrigin::answering(|_, n| match n {
        1 => OriginResponse::ok("origin failed").status(502),
        n => nth_page(n),
    });
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
    );
    let mut failures = Vec::new();
    for round in 0..3u64 {
        let path = &format!("/failed-{round}");
        origin.close(path, 1);
        origin.close(path, 2);
        // the other seven end their waits too and queue behind B's fetch
        let (a_fill, crowd) = b_crowd_fetching_after_two_waits(&origin, &a, &b, path).await;
        let a_holder = lease_holder(&server, path).expect("A's lease");
        let refused_before = admin_stat(b.admin, "fills_under_another_claim").await;
        origin.open(path, 1);
        assert_eq!(a_fill.await.expect("A's request").status, 502);
        // (one of B's crowd may claim the URL as soon as A's lease goes: it then waits behind
        // B's fetch, and waiting for no lease at all held that fetch at the origin until B's
        // cache lock timed out, 10 s, and the crowd fetched again)
        lease_left(&server, path, &a_holder, "A's failed fill left its lease").await;
        origin.open(path, 2);
        for answer in crowd.await.expect("B's crowd") {
            assert_eq!(answer.status, 200, "{path}");
        }
        writes_settled(&b).await;
        // A's GET, and B's
        let b_fetches = origin.hits_for(path) - 1;
        let refused = admin_stat(b.admin, "fills_under_another_claim").await - refused_before;
        if refused > 1 || b_fetches > 2 {
            failures.push(format!(
                "{path}: B's eight requests went to the origin {b_fetches} times, {refused} \
                 of them refused as fetched under A's lease, gone"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A claims `/posted`, its fill slow (renewed); eight plain GETs reach B, wait two leases and
/// fetch under A's lease (one fetch, the rest queued behind it). A's fetch fails and releases
/// its lease; a POST through C then finds nothing. B's fetch answers: nothing from before the
/// POST is kept in memcached or served by any node afterwards. (Holds: kept as coverage. The
/// number of B's fetches is not judged here: the POST, applied on B, refuses B's fill from
/// before it, and the requests queued behind a fill a purge refused fetch for themselves, as
/// after any purge mid-fill.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_under_a_failed_claims_lease_keeps_nothing_from_before_a_post() {
    let server = MemcachedProcess::start();
    let path = "/posted";
    let origin = GatedOrigin::answering(|_, n| match n {
        1 => OriginResponse::ok("origin failed").status(502),
        n => nth_page(n),
    });
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b, c) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
        nodes.start("C", server.addr()),
    );
    origin.close(path, 1);
    origin.close(path, 2);
    let (a_fill, crowd) = b_crowd_fetching_after_two_waits(&origin, &a, &b, path).await;
    origin.open(path, 1);
    assert_eq!(a_fill.await.expect("A's request").status, 502);
    lease_released(&server, path, "A's failed fill left its lease").await;
    let posted = post(&c.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    origin.open(path, 2);
    for answer in crowd.await.expect("B's crowd") {
        assert_eq!(answer.status, 200);
    }
    writes_settled(&b).await;
    assert_neither_kept_nor_served(
        &server,
        &[&c, &a, &b],
        path,
        b"body-2",
        "the page as it was before the POST",
    )
    .await;
}

/// A claims `/standing`, its fill slow (renewed); B waits two leases and fetches under A's
/// lease. While A's lease still stands, a POST through C finds it, deletes it and publishes
/// itself. Then B's fetch answers, and A's: both are from before the POST, and neither may be
/// kept in memcached or served by any node afterwards (B's: A's lease is gone when it finishes;
/// A's: its lease lost). (Holds: kept as coverage.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_while_the_other_claims_lease_stands_refuses_the_fetch_under_it() {
    let server = MemcachedProcess::start();
    let path = "/standing";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b, c) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
        nodes.start("C", server.addr()),
    );
    origin.close(path, 1);
    origin.close(path, 2);
    let (a_fill, b_fill) = b_fetching_after_two_waits(&origin, &a, &b, path).await;
    assert!(lease_present(&server, path), "A's lease is gone");
    let posted = post(&c.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    origin.open(path, 2);
    assert_eq!(&b_fill.await.expect("B's request").body[..], b"body-2");
    origin.open(path, 1);
    assert_eq!(&a_fill.await.expect("A's request").body[..], b"body-1");
    writes_settled(&b).await;
    writes_settled(&a).await;
    for before in [&b"body-1"[..], b"body-2"] {
        assert_neither_kept_nor_served(
            &server,
            &[&c, &a, &b],
            path,
            before,
            &format!("{}, from before the POST,", String::from_utf8_lossy(before)),
        )
        .await;
    }
}

/// A claims `/replaced`, its fill slow (renewed); B waits two leases and fetches under A's
/// lease. While B is at the origin, A's lease is replaced by another claim's (as when memcached
/// evicted it and another node claimed the URL: a POST between the two found nothing). B's fill
/// must not be kept: the lease no longer names A's claim. And the other claim's lease is left to
/// it. (Holds: kept as coverage.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fetch_under_a_lease_replaced_by_another_claim_is_not_kept() {
    let server = MemcachedProcess::start();
    let path = "/replaced";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
    );
    origin.close(path, 1);
    origin.close(path, 2);
    let (a_fill, b_fill) = b_fetching_after_two_waits(&origin, &a, &b, path).await;
    let other = lease_naming(0x0123_4567_89ab_cdef);
    server.set_raw(&lease_key(path), &other, 60);
    origin.open(path, 2);
    assert_eq!(&b_fill.await.expect("B's request").body[..], b"body-2");
    writes_settled(&b).await;
    assert_eq!(admin_stat(b.admin, "fills_under_another_claim").await, 1);
    assert!(
        !entry_holds(&server, path, b"body-2"),
        "B's fill under A's lease, replaced by another claim's, was written to memcached"
    );
    assert_eq!(
        server.get_raw(&lease_key(path)).as_deref(),
        Some(&other[..]),
        "the other claim's lease was touched"
    );
    origin.open(path, 1);
    assert_eq!(&a_fill.await.expect("A's request").body[..], b"body-1");
}

/// A claims `/frozen`, its fill slow; B waits two leases and fetches under A's lease. When B's
/// fetch answers, the memcached server is frozen (SIGSTOP): the read of the lease that would
/// keep B's fill is not answered. B's client is answered all the same (200, the page), and B's
/// fill is not kept: not written once the server thaws, not served from B's memory as a hit.
/// (Holds: kept as coverage.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fetch_under_a_lease_whose_server_is_frozen_when_it_ends_is_answered_and_not_kept() {
    let server = MemcachedProcess::start();
    let path = "/frozen";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
    );
    origin.close(path, 1);
    origin.close(path, 2);
    let (a_fill, b_fill) = b_fetching_after_two_waits(&origin, &a, &b, path).await;
    server.freeze();
    origin.open(path, 2);
    let answered = tokio::time::timeout(Duration::from_secs(10), b_fill)
        .await
        .expect("B's client was held behind the frozen server")
        .expect("B's request");
    server.thaw();
    assert_eq!(answered.status, 200);
    assert_eq!(&answered.body[..], b"body-2");
    writes_settled(&b).await;
    assert_eq!(admin_stat(b.admin, "fills_under_another_claim").await, 1);
    assert!(
        !entry_holds(&server, path, b"body-2"),
        "B's fill, its lease unconfirmed, was written to memcached"
    );
    origin.open(path, 1);
    assert_eq!(&a_fill.await.expect("A's request").body[..], b"body-1");
    writes_settled(&a).await;
    let again = get(&b.proxy.url(path), &SITE).await;
    assert_ne!(
        &again.body[..],
        b"body-2",
        "B kept its fill, unconfirmed ({:?})",
        again.cache_status()
    );
}

/// On a memcached run without CAS tokens (`-C`), a stray lease of `/no-cas-crowd` (naming a
/// holder nobody has, with a long TTL) cannot be taken over: eight plain GETs on B follow it,
/// wait two leases, and fetch under it. One origin fetch, kept (the stray lease still stands
/// when it finishes), and served to all eight. (Holds: kept as coverage.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_under_a_stray_lease_on_a_server_without_cas_fetches_once_and_keeps_it() {
    let server = MemcachedProcess::start_with(&["-C"]);
    let path = "/no-cas-crowd";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let b = nodes.start("B", server.addr());
    server.set_raw(&lease_key(path), &lease_naming(0xdead_beef), 60);
    let answers = gets_at_once((0..8).map(|_| b.proxy.url(path)), &SITE).await;
    for answer in &answers {
        assert_eq!(&answer.body[..], b"body-1");
    }
    writes_settled(&b).await;
    assert_eq!(origin.hits_for(path), 1, "B's crowd fetched more than once");
    assert!(
        entry_holds(&server, path, b"body-1"),
        "B's fill under the stray lease, still standing, was not kept"
    );
}

/// On a memcached run without CAS tokens (`-C`), A claims `/resurrected` and its fill is slow:
/// its lease is renewed by a `replace` once read as A's (a `cas` is refused there). B waits two
/// leases and fetches under A's lease (`KeptWhileHeldBy` A's holder). One of A's renewals is
/// slow on its way to memcached (the relay holds its `replace` 1.5 s). Meanwhile A's fetch fails
/// and A releases its lease; a POST through C finds nothing and is published to no one; D
/// claims the URL anew and fetches. Then A's late `replace` lands: it overwrites D's claim with
/// A's holder. B's fetch answers: the lease names A's holder again, so B's fill, from before the
/// POST, is kept, written to memcached and served by every node (D's fill, its lease found
/// naming another holder, is lost and refused).
///
/// KNOWN, fails (3 of 3 runs: "served by [\"C\", \"B\"], kept in memcached: true"):
/// `FillLeases::still_held_by` takes a lease naming the same holder for the lease that stood all
/// along, but on a `-C` server a renewal's unconditional `replace` (`FillLeases::renew_claim`)
/// brings a holder back over another claim's lease. The module doc counts that overwrite as
/// costing the other claim its fill; here it also keeps a fill from before an unpublished POST.
/// Not a small fix: on such a server a lease naming the same holder does not prove it never
/// went, and nothing in the value can (the late `replace` carries A's holder and a time of its
/// own, later than what B read). Refusing every `KeptWhileHeldBy` fill on a server without CAS
/// tokens (`still_held_by` reading with `gets` and finding no usable token) would close it, at
/// the cost of the crowd that `a_crowd_under_a_stray_lease_on_a_server_without_cas_...` keeps
/// and of every slow fill's waiters on such a server; that trade is the maintainers' to make.
#[ignore = "KNOWN: on a -C server a late renewal's replace brings the holder back over a newer claim, and a fill from before an unpublished POST is kept"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_renewal_on_a_server_without_cas_does_not_keep_a_fetch_from_before_a_post() {
    let server = MemcachedProcess::start_with(&["-C"]);
    let path = "/resurrected";
    let origin = GatedOrigin::answering(|_, n| match n {
        1 => OriginResponse::ok("origin failed").status(502),
        n => nth_page(n),
    });
    let relay = Relay::start(server.addr()).await;
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b, c, d) = (
        nodes.start("A", relay.addr),
        nodes.start("B", server.addr()),
        nodes.start("C", server.addr()),
        nodes.start("D", server.addr()),
    );
    origin.close(path, 1);
    origin.close(path, 2);
    origin.close(path, 3);
    let (a_fill, b_fill) = b_fetching_after_two_waits(&origin, &a, &b, path).await;
    // A's next renewal is slow on its way to memcached
    let lease = lease_key(path);
    relay.on(
        move |line: &str| line.starts_with(&format!("ms {lease} ")) && line.ends_with(" MR"),
        Tamper::Delay(Duration::from_millis(1500)),
    );
    assert!(
        poll_until_async(SETTLE, || relay.rules_used()).await,
        "A sent no renewal"
    );
    // A's fetch fails: its lease is released
    origin.open(path, 1);
    assert_eq!(a_fill.await.expect("A's request").status, 502);
    lease_released(&server, path, "A's failed fill left its lease").await;
    let posted = post(&c.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    let d_fill = get_in_background(&d, path);
    // A's GET, B's, C's POST and D's GET
    assert!(origin.reached(path, 4).await, "D did not reach the origin");
    let d_holder = lease_holder(&server, path);
    assert!(d_holder.is_some(), "D claimed no lease");
    assert!(
        poll_until_async(Duration::from_secs(3), || lease_holder(&server, path)
            .is_some_and(|now| Some(now) != d_holder))
        .await,
        "A's late renewal did not overwrite D's claim (it landed before D claimed)"
    );
    origin.open(path, 2);
    assert_eq!(&b_fill.await.expect("B's request").body[..], b"body-2");
    writes_settled(&b).await;
    origin.open(path, 3);
    assert_eq!(&d_fill.await.expect("D's request").body[..], b"body-3");
    writes_settled(&d).await;
    assert_neither_kept_nor_served(
        &server,
        &[&c, &d, &b],
        path,
        b"body-2",
        "the page as it was before the POST",
    )
    .await;
}

/// Sets `key` to `value` on the memcached server at `addr` (a plain `set`, its own connection):
/// for a thread that rewrites a lease as another version's node renews it.
fn set_on(addr: std::net::SocketAddr, key: &str, value: &str) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).expect("memcached");
    write!(conn, "set {key} 0 4 {}\r\n{value}\r\n", value.len()).expect("set");
    let mut reply = [0u8; 64];
    let _ = conn.read(&mut reply);
}

/// A lease of an earlier version (its time alone, `{ms}`, naming no holder) stands on `/old`,
/// rewritten every 200 ms as that version's node renews it during a fill slower than two
/// leases (a rolling upgrade). Eight plain GETs reach B at once: each waits two leases and
/// fetches under it. Its fill was never kept (a lease naming no holder was read as holder 0,
/// which no lease names): the first fill was refused as it ended, before most of the requests
/// queued behind it on B's cache lock looked it up, and they went to the origin in turn (6, 4, 2
/// and 4 origin fetches for the crowd in four runs), and a request after it waited two leases
/// again and fetched once more. Now such a fill is kept while a lease naming no holder stands
/// (`LeaseHolder::Unnamed`), as every such fill was before 590e4f2: one fetch for the crowd.
/// (Whose that lease is, no one can tell: an earlier version's node claiming anew after a POST
/// that found nothing is not told apart, as before 590e4f2; mixed clusters only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_under_a_live_lease_of_an_earlier_version_fetches_once() {
    let server = MemcachedProcess::start();
    let path = "/old";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let b = nodes.start("B", server.addr());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewing = {
        let stop = stop.clone();
        let (key, addr) = (lease_key(path), server.addr());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis();
                set_on(addr, &key, &now_ms.to_string());
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let answers = gets_at_once((0..8).map(|_| b.proxy.url(path)), &SITE).await;
    let crowd_fetches = origin.hits_for(path);
    let again = get(&b.proxy.url(path), &SITE).await;
    let after = origin.hits_for(path);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    renewing.join().expect("the renewing thread");
    for answer in &answers {
        assert_eq!(answer.status, 200);
        assert!(answer.body.starts_with(b"body-"), "{:?}", answer.body);
    }
    assert!(
        crowd_fetches <= 1 && after == crowd_fetches,
        "under a live lease of an earlier version, B's crowd of eight went to the origin \
         {crowd_fetches} times, and a request after it {} more ({:?})",
        after - crowd_fetches,
        again.cache_status()
    );
}

/// A claims `/drained`, its fill slow (renewed); B waits two leases and fetches under A's
/// lease, held at the origin; B is sent SIGTERM and its drain (`shutdown_timeout = "1s"`) cuts
/// that fetch. B exits without touching A's lease (it held none: `FillLeases::release_held`
/// releases only this node's claims), and A's fill, landing afterwards, is kept and released as
/// usual. (Holds: kept as coverage.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_cutting_a_fetch_under_another_claims_lease_leaves_that_lease_alone() {
    let server = MemcachedProcess::start();
    let path = "/drained";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let a = nodes.start("A", server.addr());
    let mut b = nodes.start_with("B", server.addr(), "shutdown_timeout = \"1s\"\n");
    origin.close(path, 1);
    origin.close(path, 2);
    let a_fill = get_in_background(&a, path);
    assert!(origin.reached(path, 1).await, "A did not reach the origin");
    let url = b.proxy.url(path);
    let b_fill = tokio::spawn(async move { get_maybe(&url).await });
    b_fetched_under_as_lease(&origin, path).await;
    let a_holder = lease_holder(&server, path);
    assert!(a_holder.is_some(), "A's lease");
    assert!(b.proxy.signal("TERM"));
    let status = b.proxy.wait_exit(Duration::from_secs(8));
    assert!(
        status.is_some_and(|s| s.success()),
        "B: {status:?}; stderr:\n{}",
        b.proxy.stderr_log()
    );
    let _ = b_fill.await;
    assert_eq!(
        lease_holder(&server, path),
        a_holder,
        "B's exit touched A's lease"
    );
    origin.open(path, 2);
    origin.open(path, 1);
    assert_eq!(&a_fill.await.expect("A's request").body[..], b"body-1");
    writes_settled(&a).await;
    assert!(
        entry_holds(&server, path, b"body-1"),
        "A's fill was not kept"
    );
    lease_released(&server, path, "A's stored fill left its lease").await;
}

/// `GET url` (with [`SITE`]) whose failure (a connection cut by a drain) is not a panic.
async fn get_maybe(url: &str) -> Option<u16> {
    reqwest::Client::new()
        .get(url)
        .header("host", HOST)
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

/// A claims `/streaming`, its fill slow (renewed); B waits two leases and fetches under A's
/// lease, and B's answer streams slowly. While it streams and A's lease stands, a POST through
/// C finds the lease, deletes it and publishes itself; B learns it. A GET through B after that
/// must not be answered from B's fill still streaming, from before the POST. (The published
/// counterpart of `takeover_breaks::a_request_after_a_post_is_not_served_a_fill_under_another_
/// claim_still_streaming`, KNOWN for an unpublished POST. Holds: kept as coverage.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_after_a_published_post_is_not_served_the_fetch_under_the_lease_streaming() {
    let server = MemcachedProcess::start();
    let path = "/streaming";
    let origin = GatedOrigin::answering(|_, n| match n {
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
    assert!(lease_present(&server, path), "A's lease is gone");
    let posted = post(&c.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    assert!(
        wait_for_stat(b.admin, "learned", 1, SETTLE).await >= 1,
        "B never learned the POST"
    );
    assert!(
        !b_fill.is_finished(),
        "B's fill ended before the POST was learned"
    );
    let after = get(&b.proxy.url(path), &SITE).await;
    let before = b_fill.await.expect("B's first request");
    assert_eq!(&before.body[..], b"body-2");
    assert_ne!(
        &after.body[..],
        b"body-2",
        "a GET through B after the published POST was served B's fill from before it ({:?})",
        after.cache_status()
    );
    origin.open(path, 1);
    assert_eq!(&a_fill.await.expect("A's request").body[..], b"body-1");
}

/// A claims `/kept`, its fill slow (renewed); B waits two leases and fetches under A's lease,
/// and B's fill, A's lease still standing when it ends, is kept and written to memcached. A's
/// lease is A's: B must leave it alone, and A's fill, landing later, be kept. Before the fix B's
/// write deleted "whatever lease is there" (the rule for a fill written with no claim): A's next
/// renewal found its lease gone, A's fill was taken for lost and refused, and A, having marked
/// the URL purged on its node as of then, refused B's entry and fetched once more: three origin
/// fetches where two do ("fill_leases_lost" 1 on A).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_kept_under_another_claims_lease_leaves_that_lease_to_its_claim() {
    let server = MemcachedProcess::start();
    let path = "/kept";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b, c) = (
        nodes.start("A", server.addr()),
        nodes.start("B", server.addr()),
        nodes.start("C", server.addr()),
    );
    origin.close(path, 1);
    let a_fill = get_in_background(&a, path);
    assert!(origin.reached(path, 1).await, "A did not reach the origin");
    assert_eq!(&get(&b.proxy.url(path), &SITE).await.body[..], b"body-2");
    writes_settled(&b).await;
    assert!(
        entry_holds(&server, path, b"body-2"),
        "B's fill, A's lease standing when it ended, was not kept"
    );
    let b_deleted_it = !lease_present(&server, path);
    origin.open(path, 1);
    assert_eq!(&a_fill.await.expect("A's request").body[..], b"body-1");
    writes_settled(&a).await;
    let lost = admin_stat(a.admin, "fill_leases_lost").await;
    for node in [&a, &b, &c] {
        assert_eq!(get(&node.proxy.url(path), &SITE).await.status, 200);
    }
    assert!(
        !b_deleted_it && lost == 0 && origin.hits_for(path) == 2,
        "B's write deleted A's lease: {b_deleted_it}; A's fill lost: {lost}; origin fetches: {}",
        origin.hits_for(path)
    );
    lease_released(&server, path, "A's stored fill left its lease").await;
}

/// A claims `/write-failed`, its fill slow (renewed); B (its memcached through a relay) waits
/// two leases and fetches under A's lease; A's lease still standing when B's fill ends, B keeps
/// it in its memory, and its write to memcached is held by the relay until it fails. A POST
/// through C after that must reach B: no GET through B may be served B's copy, from before the
/// POST, once B could have learned it (5 s). Had B's failed write deleted A's lease (the rule
/// for a fill written with no claim), the POST would have found neither entry nor lease and
/// been published to no one. (Holds: kept as coverage. The failed write counts its server
/// failing, and `FillLeases::on_write_failed` deletes nothing then.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_kept_under_another_claims_lease_whose_write_failed_is_not_kept_over_a_post() {
    let server = MemcachedProcess::start();
    let path = "/write-failed";
    let origin = GatedOrigin::answering(|_, n| nth_page(n));
    let entry = entry_key(path);
    let relay = Relay::with(
        server.addr(),
        move |line: &str| line.starts_with(&format!("ms {entry} ")),
        Tamper::Delay(Duration::from_secs(30)),
    )
    .await;
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let (a, b, c) = (
        nodes.start("A", server.addr()),
        nodes.start("B", relay.addr),
        nodes.start("C", server.addr()),
    );
    origin.close(path, 1);
    let a_fill = get_in_background(&a, path);
    assert!(origin.reached(path, 1).await, "A did not reach the origin");
    assert_eq!(&get(&b.proxy.url(path), &SITE).await.body[..], b"body-2");
    // (the write goes out after the fill ends, which may be after the client has it all)
    assert!(
        poll_until_async(SETTLE, || relay.rules_used()).await,
        "B wrote nothing to memcached"
    );
    assert!(
        wait_for_stat(b.admin, "write_failures", 1, SETTLE).await >= 1,
        "B's held write never failed"
    );
    writes_settled(&b).await;
    let posted = post(&c.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut still = true;
    while Instant::now() < deadline {
        if get(&b.proxy.url(path), &SITE).await.body[..] != b"body-2"[..] {
            still = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !still,
        "B still serves its copy from before the POST 5 s after it (B learned {} POSTs)",
        admin_stat(b.admin, "learned").await
    );
    origin.open(path, 1);
    let _ = a_fill.await;
}
