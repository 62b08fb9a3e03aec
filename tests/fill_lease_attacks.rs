//! Attacks on the cross-node fill leases (`storage::fill_lease`: a claim by `ms <key> <len> ME c`,
//! renewals by `gets` and `cas`, releases by `md <key> C<token>` falling back to a read) over real
//! sockets and real memcached processes:
//!
//! * values under a lease key that this version did not write (garbage, an earlier version's
//!   time alone, a time far in the future, bytes that are not text, a value of half a MiB): no
//!   node crashes, a request waits for such a lease at most `fill_lease`, and the fill that
//!   follows deletes it;
//! * a claim's `add` that memcached carries out only after its sender gave up on it (a
//!   [`Relay`] holds it past `op_timeout`): a POST through another node while that claim is
//!   held, before it lands and while the fill is at the origin, finds nothing and is not
//!   published, so the fill, unguarded, is not kept (it was, and served by every node, until
//!   2026-12-06); the nodes that found the late lease and wait on it fetch for themselves once
//!   the fill ends and its node releases the lease;
//! * a renewal's `cas` whose reply is lost after memcached carried it out (the [`Relay`] cuts
//!   the connection; the client retries it on a fresh one and reads `EX`): the lease is not taken
//!   for lost;
//! * a release's `md ... C<token>` whose reply is lost the same way: its retry reads `NF`, which
//!   the node cannot tell from a lease purged meanwhile, so it does not keep its fill (one more
//!   origin fetch, no answer served that should not be); so does one held past `op_timeout`,
//!   whose late delete still takes the lease out;
//! * a renewal's `cas` held past `op_timeout` while a POST through another node deletes the
//!   lease: the late `cas` does not bring the lease back, and the fill is not kept;
//! * memcached run without CAS tokens (`-C`): every token is 0, so a release by token deleted
//!   whatever lease was there, another claim's too, and every renewal's `cas` was refused (yet
//!   counted renewed), the lease keeping its claim's time;
//! * memcached restarted empty between a claim and its release, its CAS tokens counted from 1
//!   again up to the very token the claim was given, which another node's claim is given: the
//!   release by token deleted the other claim's lease and the fill from before a POST was kept
//!   and served (a token is now never sent to a run of the server other than the one that
//!   gave it).

use lacquer_test_support as support;

use std::io::{Read, Write};
use std::time::Instant;
use support::lease_rig::*;
use support::*;

/// The CAS token memcached gave `key`'s value (`mg <key> c`), if it holds one.
fn cas_of(server: &MemcachedProcess, key: &str) -> Option<u64> {
    let reply = server.command(&format!("mg {key} c\r\nversion"), None);
    let line = reply.lines().next()?;
    if !(line.starts_with("HD") || line.starts_with("VA")) {
        return None;
    }
    line.split(' ')
        .find_map(|f| f.strip_prefix('c'))
        .and_then(|t| t.parse().ok())
}

/// Stores `n` throwaway values (each takes the server's next CAS token), in one connection.
fn spend_cas_tokens(server: &MemcachedProcess, n: u64) {
    if n == 0 {
        return;
    }
    let mut s = std::net::TcpStream::connect(server.addr()).expect("connect to memcached");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut out = Vec::new();
    for i in 0..n {
        out.extend_from_slice(format!("set spent:{i} 0 60 1 noreply\r\nx\r\n").as_bytes());
    }
    out.extend_from_slice(b"version\r\n");
    s.write_all(&out).expect("write to memcached");
    let mut reply = Vec::new();
    let mut buf = [0u8; 1024];
    while !reply.ends_with(b"\r\n") || !reply.starts_with(b"VERSION") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => panic!("memcached did not answer: {reply:?}"),
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
}

/// The CAS token the server's next store will be given.
fn next_cas(server: &MemcachedProcess) -> u64 {
    server.set_raw("probe", b"x", 60);
    cas_of(server, "probe").expect("the probe's token") + 1
}

// ---------------------------------------------------------------------------------------------
// Values under a lease key that this version did not write
// ---------------------------------------------------------------------------------------------

/// Lease values this version never writes, planted under the lease keys of six pages (for a
/// minute): garbage, nothing, an earlier version's value (its time alone, now), a time far in
/// the future, bytes that are not UTF-8, and half a MiB of `x`. A node asked for each page at
/// once (`fill_lease = "2s"`) cannot claim them (the `add` finds a lease), waits for a fill
/// nobody makes, for at most the lease (trusting a lease of unknown time for its whole length),
/// then, finding the same lease again, takes it over (deletes it by its token) and claims the
/// page, so that its fetch is guarded by a lease of its own: every answer is the origin's,
/// within the lease and a generous margin, one origin fetch per page. Each fill, written,
/// releases its lease, so the page is then a hit. No panic. (Until 2026-12-06 the fetch went
/// out beside the planted lease, claimed by no one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_this_version_did_not_write_hold_a_request_up_at_most_the_lease() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let origin = GatedOrigin::start();
    let a = cluster.node(&origin.origin, "A", "fill_lease = \"2s\"");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let planted: Vec<(&str, Vec<u8>)> = vec![
        ("/garbage", b"not a lease at all".to_vec()),
        ("/empty", Vec::new()),
        ("/old-format", now_ms.to_string().into_bytes()),
        ("/future", b"18446744073709551615 ffffffffffffffff".to_vec()),
        (
            "/not-text",
            vec![0xff, 0xfe, b' ', 0x80, 0x00, b'\r', b'\n'],
        ),
        ("/huge", vec![b'x'; 512 * 1024]),
    ];
    for (path, value) in &planted {
        server.set_raw(&lease_key(path), value, 60);
        assert!(lease_present(server, path), "{path}: not planted");
    }
    let started = Instant::now();
    let answers = gets_at_once(planted.iter().map(|(path, _)| a.proxy.url(path)), &SITE).await;
    let took = started.elapsed();
    for ((path, _), answer) in planted.iter().zip(&answers) {
        assert_eq!(answer.status, 200, "{path}");
        assert_eq!(&answer.body[..], b"body-1-late", "{path}");
        assert_eq!(origin.origin.hits_for(path), 1, "{path}");
    }
    assert!(
        took < Duration::from_secs(5),
        "the requests were held {took:?} by leases of a 2 s fill_lease"
    );
    assert_eq!(admin_stat(a.admin, "fills_claimed").await, 6);
    assert_eq!(admin_stat(a.admin, "fill_waits").await, 6);
    assert_eq!(admin_stat(a.admin, "fills_awaited").await, 0);
    writes_settled(&a).await;
    for (path, _) in &planted {
        assert!(
            !lease_present(server, path),
            "{path}: the planted lease outlived the fill"
        );
        let again = get(&a.proxy.url(path), &SITE).await;
        assert!(again.is_hit(), "{path}: not a hit after the fill");
        assert_eq!(&again.body[..], b"body-1-late", "{path}");
    }
    assert_eq!(admin_stat(a.admin, "fill_leases_lost").await, 0);
    a.proxy.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Commands carried out late, or whose replies are lost
// ---------------------------------------------------------------------------------------------

/// A's claim of a page's lease (`ms <lease> ... ME c`) is held by the relay 700 ms, past
/// `op_timeout` (200 ms): A, unanswered, fetches the page unguarded (`fills_unguarded`; a page
/// of 2 s), and memcached then stores the lease, naming A's claim (`fill_lease = "5s"`). B,
/// asking 0.3 s after the lease appeared, finds that lease and waits. A's fill went to the origin
/// before its lease was there to guard it (see the next test), so it is not kept: not stored,
/// not written to memcached; and A releases the lease by the holder it names when the fill
/// ends, so B stops waiting then and fetches for itself, well before the lease would run out.
/// No lease is left behind. (Until 2026-12-06 A's fill was kept and B served it: one origin
/// fetch, and a POST while the claim was in flight undone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_memcached_carries_out_after_its_sender_gave_up_holds_no_one_past_the_fill() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/claimed-late";
    let origin = counting_origin(Duration::from_millis(1000), "max-age=3600");
    let relay = Relay::holding_claim(server.addr(), path, Duration::from_millis(700)).await;
    let nodes = Nodes::new(&origin, "local_ttl = \"30s\"\nfill_lease = \"5s\"");
    let a = nodes.start("A", relay.addr);
    let b = nodes.start("B", server.addr());
    let a_fill = get_in_background(&a, path);
    held_claim_landed(server, path).await;
    assert!(relay.rules_used());
    assert_eq!(admin_stat(a.admin, "fills_claimed").await, 0);
    assert_eq!(admin_stat(a.admin, "fills_unguarded").await, 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    let b_answer = get(&b.proxy.url(path), &SITE).await;
    let b_took = asked.elapsed();
    let a_answer = a_fill.await.expect("A's request");
    assert_eq!(
        &a_answer.body[..],
        b"body-1-late",
        "A's own client got its answer"
    );
    assert_eq!(b_answer.status, 200);
    assert_eq!(
        &b_answer.body[..],
        b"body-2-late",
        "B was served the fill of a claim that went unanswered"
    );
    assert_eq!(origin.hits_for(path), 2);
    assert_eq!(admin_stat(b.admin, "fill_waits").await, 1);
    assert_eq!(admin_stat(b.admin, "fills_awaited").await, 0);
    // B waited for A's fill to end (about 1.2 s), then fetched (2 s): not for the lease's 5 s
    assert!(
        b_took < Duration::from_millis(4_900),
        "B waited out the lease ({b_took:?}): A did not release it"
    );
    writes_settled(&a).await;
    assert_eq!(admin_stat(a.admin, "writes").await, 0, "A wrote its fill");
    lease_released(server, path, "the lease was left").await;
    assert_eq!(admin_stat(a.admin, "fill_leases_lost").await, 0);
    // and A serves the page as B fetched it (once B's write landed), not its own unguarded fill
    assert_eq!(wait_for_stat(b.admin, "writes", 1, SETTLE).await, 1);
    assert_eq!(
        &get(&a.proxy.url(path), &SITE).await.body[..],
        b"body-2-late"
    );
}

/// As above, but a POST through B comes while A's fetch is at the origin and A's claim is still
/// held by the relay: B finds nothing stored and no lease (it is not in memcached yet), so its
/// invalidation is not published. A's fill, from before the POST, was unguarded (its claim went
/// unanswered), and nothing judges it by the POST: it must not be kept and served.
///
/// Until 2026-12-06 it was: A kept it, wrote it to memcached, and A and C served the page as it
/// was before the POST for its hour. A fill whose claim went unanswered is now refused when it
/// finishes (`FillLeases::on_unguarded_fill`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_while_a_claim_is_held_in_flight_leaves_no_fill_from_before_it() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/posted-while-claimed-late";
    let origin = counting_origin(Duration::from_millis(1000), "max-age=3600");
    let relay = Relay::holding_claim(server.addr(), path, Duration::from_millis(900)).await;
    let nodes = Nodes::new(&origin, "local_ttl = \"30s\"\nfill_lease = \"5s\"");
    let a = nodes.start("A", relay.addr);
    let b = nodes.start("B", server.addr());
    let c = nodes.start("C", server.addr());
    let a_fill = get_in_background(&a, path);
    assert!(
        poll_until_async(Duration::from_secs(3), || origin.hits_for(path) == 1).await,
        "A's fetch never reached the origin"
    );
    assert!(
        !lease_present(server, path),
        "the held claim landed too soon"
    );
    let posted = post(&b.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    assert!(
        !lease_present(server, path),
        "the held claim landed before the POST"
    );
    let a_answer = a_fill.await.expect("A's request");
    assert_eq!(&a_answer.body[..], b"body-1-late");
    assert_eq!(admin_stat(a.admin, "fills_unguarded").await, 1);
    writes_settled(&a).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_neither_kept_nor_served(
        server,
        &[&c, &a, &b],
        path,
        b"body-1-late",
        "the page as it was before the POST",
    )
    .await;
}

/// A slow fill's first renewal: its `cas` reaches memcached and is carried out, and the relay
/// closes A's connection instead of passing the reply on. The client's retry on a fresh
/// connection is answered "changed" without being sent (a connection opened after the token was
/// read may reach another run of the server: `lacquer_memcached::cas_token`; before, the retry
/// was sent and read `EX`, its own first attempt having changed the lease); a second read finds
/// the lease still A's claim's: renewed, not lost. The fill is kept and written, and B
/// is then served it from memcached: one origin fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_whose_reply_was_lost_after_it_landed_is_not_taken_for_a_lost_lease() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/renewal-reply-lost";
    let origin = counting_origin(Duration::from_millis(1600), "max-age=3600");
    let relay = Relay::with(server.addr(), renewal_of(path), Tamper::Cut).await;
    let nodes = Nodes::new(&origin, "local_ttl = \"30s\"\nfill_lease = \"3s\"");
    let a = nodes.start("A", relay.addr);
    let b = nodes.start("B", server.addr());
    let answer = get(&a.proxy.url(path), &SITE).await;
    assert_eq!(&answer.body[..], b"body-1-late");
    let swaps = relay.lines_starting(&format!("ms {} ", lease_key(path)));
    let swaps: Vec<&String> = swaps.iter().filter(|l| l.contains(" C")).collect();
    assert!(!swaps.is_empty(), "no renewal reached the relay");
    assert!(admin_stat(a.admin, "fill_leases_renewed").await >= 1);
    writes_settled(&a).await;
    assert_eq!(admin_stat(a.admin, "fill_leases_lost").await, 0);
    assert!(!lease_present(server, path), "the lease outlived the fill");
    assert!(
        entry_holds(server, path, b"body-1-late"),
        "A's fill was not kept"
    );
    let from_b = get(&b.proxy.url(path), &SITE).await;
    assert!(from_b.is_hit());
    assert_eq!(&from_b.body[..], b"body-1-late");
    assert_eq!(origin.hits_for(path), 1);
}

/// The delete that releases a fill's lease after its write (`md <lease> C<token>`) reaches
/// memcached and is carried out, and the relay closes A's connection instead of passing the
/// reply (`HD`) on. The client's retry on a fresh connection is answered "changed" without
/// being sent (see the renewal's test above), and A reads the lease: gone. To A, the lease was
/// gone before its release, as if a purge had deleted it, and A cannot tell the two
/// apart, so it does not keep its fill (`fill_leases_lost`): the entry it wrote is deleted and
/// the next request fetches the page again. One origin fetch more; no answer is served that
/// should not be, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_whose_reply_was_lost_after_it_landed_costs_the_fill_and_nothing_else() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/release-reply-lost";
    let origin = counting_origin(Duration::from_millis(300), "max-age=3600");
    let prefix = release_prefix(path);
    let matches = prefix.clone();
    let relay = Relay::with(
        server.addr(),
        move |line| line.starts_with(&matches),
        Tamper::Cut,
    )
    .await;
    let nodes = Nodes::new(&origin, "local_ttl = \"30s\"\nfill_lease = \"30s\"");
    let a = nodes.start("A", relay.addr);
    let answer = get(&a.proxy.url(path), &SITE).await;
    assert_eq!(&answer.body[..], b"body-1-late");
    writes_settled(&a).await;
    let deletes = relay.lines_starting(&prefix);
    assert_eq!(
        deletes.len(),
        1,
        "the cut delete was sent again over a connection opened after its token was read: \
         {deletes:?}"
    );
    assert!(!lease_present(server, path), "the lease outlived the fill");
    assert_eq!(admin_stat(a.admin, "fill_leases_lost").await, 1);
    assert!(
        !entry_holds(server, path, b"body-1-late"),
        "memcached keeps a fill its node counted lost"
    );
    let again = get(&a.proxy.url(path), &SITE).await;
    assert_eq!(&again.body[..], b"body-2-late");
    assert_eq!(origin.hits_for(path), 2);
}

/// As above, but the release's `md <lease> C<token>` is held by the relay 700 ms, past
/// `op_timeout`, and carried out late: unanswered, it cannot confirm the lease was A's all along,
/// so A does not keep its fill (`fill_leases_lost`; one more origin fetch), and the late delete
/// still takes A's lease out: nothing is left to hold anyone up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_memcached_carries_out_late_costs_the_fill_and_leaves_no_lease() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/release-held";
    let origin = counting_origin(Duration::from_millis(300), "max-age=3600");
    let prefix = release_prefix(path);
    let matches = prefix.clone();
    let relay = Relay::with(
        server.addr(),
        move |line| line.starts_with(&matches),
        Tamper::Delay(Duration::from_millis(700)),
    )
    .await;
    let nodes = Nodes::new(&origin, "local_ttl = \"30s\"\nfill_lease = \"30s\"");
    let a = nodes.start("A", relay.addr);
    let answer = get(&a.proxy.url(path), &SITE).await;
    assert_eq!(&answer.body[..], b"body-1-late");
    assert_eq!(
        wait_for_stat(a.admin, "fill_leases_lost", 1, Duration::from_secs(5)).await,
        1
    );
    writes_settled(&a).await;
    assert_eq!(
        relay.lines_starting(&prefix).len(),
        1,
        "the delete was retried"
    );
    assert!(
        poll_until_async(Duration::from_secs(3), || !lease_present(server, path)).await,
        "the late delete left the lease"
    );
    assert!(!entry_holds(server, path, b"body-1-late"));
    let again = get(&a.proxy.url(path), &SITE).await;
    assert_eq!(&again.body[..], b"body-2-late");
    assert_eq!(origin.hits_for(path), 2);
}

/// A slow fill's renewal: its `cas` is held by the relay 900 ms (past `op_timeout`), and
/// meanwhile a POST through B deletes the lease and, having found it, is published. The late
/// `cas` finds no lease and does not bring it back; A's next renewal finds it gone (lost), so A
/// does not keep its fill, from before the POST; after the fill no node serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_landing_after_a_purge_deleted_the_lease_does_not_bring_it_back() {
    let cluster = MemcachedCluster::start(1);
    let server = &cluster.servers[0];
    let path = "/renewed-across-a-post";
    let origin = counting_origin(Duration::from_millis(2000), "max-age=3600");
    let relay = Relay::with(
        server.addr(),
        renewal_of(path),
        Tamper::Delay(Duration::from_millis(900)),
    )
    .await;
    let nodes = Nodes::new(&origin, "local_ttl = \"30s\"\nfill_lease = \"3s\"");
    let a = nodes.start("A", relay.addr);
    let b = nodes.start("B", server.addr());
    let a_fill = get_in_background(&a, path);
    // the first renewal goes about 1 s in; its cas lands about 0.9 s later
    assert_eq!(
        wait_for_stat(a.admin, "fills_claimed", 1, Duration::from_secs(5)).await,
        1
    );
    assert!(
        poll_until_async(Duration::from_secs(3), || relay.rules_used()).await,
        "no renewal was sent: {:?}",
        relay.lines_starting("m")
    );
    let posted = post(&b.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        !lease_present(server, path),
        "the late renewal brought back the lease the POST deleted"
    );
    assert_eq!(
        wait_for_stat(a.admin, "fill_leases_lost", 1, Duration::from_secs(3)).await,
        1,
        "A's renewals did not find the lease gone"
    );
    let a_answer = a_fill.await.expect("A's request");
    assert_eq!(&a_answer.body[..], b"body-1-late");
    for node in [&a, &b] {
        writes_settled(node).await;
    }
    assert!(!lease_present(server, path));
    assert!(!entry_holds(server, path, b"body-1-late"));
    none_serves_the_first_answer(&[&a, &b], path, &SITE, "the page as it was before the POST")
        .await;
}

// ---------------------------------------------------------------------------------------------
// A server restarted empty between a claim and its release
// ---------------------------------------------------------------------------------------------

/// A claims a page (its lease given CAS token `t`, past 500 here) and waits at the origin. The
/// lease's server restarts empty; C and B start; a POST through C finds nothing stored and no
/// lease, and is not published. The restarted server counts CAS tokens from 1 again, and
/// reaches `t - 1` (other writes; spent here on purpose), so B's claim of the page is given `t`
/// too. A's fill ends (the answer from before the POST). Its release must not delete B's lease
/// by `t`: A must find its lease lost, not keep its fill or leave it in memcached, and serve
/// B's answer. (Until 2026-12-06 the release deleted by `t`, which memcached found on B's
/// lease: B's lease was deleted as if it were A's, A took its own for intact, kept its fill and
/// served it, and memcached held it for every node. A token now carries the run of the server
/// that gave it, and is not sent to another: `lacquer_memcached::cas_token`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_by_a_token_the_restarted_server_gave_again_keeps_a_fill_from_before_a_post() {
    let mut cluster = MemcachedCluster::start(1);
    let path = "/token-given-again";
    let origin = GatedOrigin::start();
    origin.close(path, 1);
    origin.close(path, 2);
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"30s\"")
        .invalidation("poll_interval = \"5s\"");
    let addr = cluster.servers[0].addr();
    let a = nodes.start("A", addr);
    spend_cas_tokens(&cluster.servers[0], 500);
    let a_fill = get_in_background(&a, path);
    assert_eq!(
        wait_for_stat(a.admin, "fills_claimed", 1, Duration::from_secs(3)).await,
        1
    );
    let claimed = cas_of(&cluster.servers[0], &lease_key(path)).expect("A's lease");
    cluster.servers[0].restart();
    let server = &cluster.servers[0];
    // A's pooled connections to the restarted server fail once: it writes other pages until
    // one lands, so that its fill's write and release do too
    write_until_reconnected(&a, server, b"body-1-late").await;
    let c = nodes.start("C", addr);
    let b = nodes.start("B", addr);
    let posted = post(&c.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    // the nodes' writes and registrations done: nothing else stores on the server meanwhile
    // (each node writes a heartbeat after every read of the cluster's log: read every 5 s here,
    // not every 250 ms, or one landed between the probe and B's claim and took B's token, 1 run
    // in 4 beside a CI run)
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let next = next_cas(server);
    assert!(
        next < claimed,
        "the restarted server is past {claimed}: {next}"
    );
    spend_cas_tokens(server, claimed - next);
    let b_fill = get_in_background(&b, path);
    assert_eq!(
        wait_for_stat(b.admin, "fills_claimed", 1, Duration::from_secs(3)).await,
        1
    );
    let b_token = cas_of(server, &lease_key(path)).expect("B's lease");
    assert_eq!(
        b_token, claimed,
        "B's claim was not given A's token (setup)"
    );
    origin.open(path, 1);
    let a_answer = a_fill.await.expect("A's request");
    assert_eq!(&a_answer.body[..], b"body-1-late");
    writes_settled(&a).await;
    let b_lease_kept = lease_present(server, path);
    let a_lost = admin_stat(a.admin, "fill_leases_lost").await;
    let kept_in_memcached = entry_holds(server, path, b"body-1-late");
    origin.open(path, 2);
    let b_answer = b_fill.await.expect("B's request");
    assert_eq!(&b_answer.body[..], b"body-2-late");
    // asked after B's fill: a request of A's while B's lease stands waits for B's fill
    let a_serves = get(&a.proxy.url(path), &SITE).await.body.clone();
    assert!(
        b_lease_kept && a_lost == 1 && !kept_in_memcached && &a_serves[..] != b"body-1-late",
        "A's release by token {claimed} deleted B's lease (B's lease kept: {b_lease_kept}); A \
         counted its lease lost {a_lost} times; memcached holds the answer from before the POST: \
         {kept_in_memcached}; A serves {:?}",
        String::from_utf8_lossy(&a_serves)
    );
}

// ---------------------------------------------------------------------------------------------
// memcached without CAS tokens
// ---------------------------------------------------------------------------------------------

/// memcached run with `-C` (no CAS tokens, 8 bytes saved per item) gives every value the token
/// 0: a claim's `add` returns `c0`, and `md <lease> C0` deletes whatever lease is there. A claims
/// a page and waits at the origin; its lease is deleted (as an eviction or a restart would), and
/// B claims the page anew. A's fill ends: its release must leave B's lease alone (it names
/// another holder), count A's lease lost and not keep A's fill; B's fill is kept. (Before, A's
/// release by the token 0 deleted B's lease, and A kept and served its fill.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_cas_tokens_a_release_leaves_another_claims_lease_and_keeps_no_fill() {
    let server = MemcachedProcess::start_with(&["-C"]);
    let path = "/no-cas-tokens";
    let origin = GatedOrigin::start();
    origin.close(path, 1);
    origin.close(path, 2);
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"30s\"");
    let a = nodes.start("A", server.addr());
    let b = nodes.start("B", server.addr());
    let a_fill = get_in_background(&a, path);
    assert_eq!(
        wait_for_stat(a.admin, "fills_claimed", 1, Duration::from_secs(3)).await,
        1
    );
    assert_eq!(
        cas_of(&server, &lease_key(path)),
        Some(0),
        "not run with -C"
    );
    let reply = server.command(&format!("delete {}", lease_key(path)), None);
    assert!(reply.starts_with("DELETED"), "{reply}");
    let b_fill = get_in_background(&b, path);
    assert_eq!(
        wait_for_stat(b.admin, "fills_claimed", 1, Duration::from_secs(3)).await,
        1
    );
    let b_lease = server.get_raw(&lease_key(path)).expect("B's lease");
    origin.open(path, 1);
    let a_answer = a_fill.await.expect("A's request");
    assert_eq!(&a_answer.body[..], b"body-1-late");
    writes_settled(&a).await;
    assert_eq!(
        server.get_raw(&lease_key(path)).as_deref(),
        Some(&b_lease[..]),
        "A's release took B's lease"
    );
    assert_eq!(admin_stat(a.admin, "fill_leases_lost").await, 1);
    assert!(
        !entry_holds(&server, path, b"body-1-late"),
        "memcached keeps A's fill, whose lease was lost"
    );
    origin.open(path, 2);
    let b_answer = b_fill.await.expect("B's request");
    assert_eq!(&b_answer.body[..], b"body-2-late");
    writes_settled(&b).await;
    assert_eq!(admin_stat(b.admin, "fill_leases_lost").await, 0);
    let from_b = get(&b.proxy.url(path), &SITE).await;
    assert_eq!(&from_b.body[..], b"body-2-late", "B did not keep its fill");
    // A purged the URL on itself as of its loss, which covers B's fill too (fetched before):
    // A fetches the page once more, and does not serve its own fill
    let from_a = get(&a.proxy.url(path), &SITE).await;
    assert_eq!(&from_a.body[..], b"body-3-late");
    assert_eq!(origin.origin.hits_for(path), 3);
}

/// memcached run with `-C` refuses every compare-and-swap (`ms <key> ... C0` answers `EX`: no
/// value is ever a token's). A fill slower than its lease (`fill_lease = "2s"`, a page that takes
/// 2.8 s) must still have its lease renewed: B, asking 2.3 s in, waits for A's fill (one origin
/// fetch for the two nodes), and A keeps its fill. (Before, each renewal's `cas` was refused, a
/// second read found the lease still A's and counted it renewed, but its time stayed the
/// claim's: B found the lease run out and fetched for itself; a fill slower than the lease's
/// expiry, a third past `fill_lease` and a second, was lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_cas_tokens_a_slow_fills_lease_is_still_renewed() {
    let server = MemcachedProcess::start_with(&["-C"]);
    let path = "/no-cas-tokens-slow";
    let origin = counting_origin(Duration::from_millis(1400), "max-age=3600");
    let nodes = Nodes::new(&origin, "local_ttl = \"30s\"\nfill_lease = \"2s\"");
    let a = nodes.start("A", server.addr());
    let b = nodes.start("B", server.addr());
    let started = Instant::now();
    let a_fill = get_in_background(&a, path);
    tokio::time::sleep(Duration::from_millis(2300).saturating_sub(started.elapsed())).await;
    let b_answer = get(&b.proxy.url(path), &SITE).await;
    let a_answer = a_fill.await.expect("A's request");
    assert_eq!(&a_answer.body[..], b"body-1-late");
    writes_settled(&a).await;
    let (renewed, lost) = (
        admin_stat(a.admin, "fill_leases_renewed").await,
        admin_stat(a.admin, "fill_leases_lost").await,
    );
    assert!(
        &b_answer.body[..] == b"body-1-late" && lost == 0,
        "B served {:?} (origin fetches: {}); A: fill_leases_renewed {renewed}, \
         fill_leases_lost {lost}",
        b_answer.text(),
        origin.hits_for(path)
    );
    assert_eq!(origin.hits_for(path), 1);
    assert!(entry_holds(&server, path, b"body-1-late"));
}
