//! Attacks on two things a flaky network and a hostile operator environment do to a cluster:
//!
//! 1. The cluster's invalidation log (`src/invalidation/cluster_log.rs`) read while a memcached
//!    server is frozen (SIGSTOP), frozen and thawed over and over across a node's polls,
//!    restarted empty (its copy of the log lost) or killed for good, and with junk bytes and a
//!    record dated far ahead planted in the log's bucket keys. The promise (README "Purging and
//!    banning", `docs/architecture.md` `invalidation/`): a purge or ban through any node stops
//!    every node from serving what it covers within `poll_interval` plus one memcached read, as
//!    long as one server took it; an admin purge whose answer names a node as reached is never
//!    served by it afterwards; a frozen or dead server costs a request at most `op_timeout`,
//!    never an error; bytes that frame no record are skipped, and records dated more than 60 s
//!    ahead are refused.
//! 2. Config reload (SIGHUP, `POST /reload`) in the middle of traffic: `balancer.timeouts.total`
//!    and the per-read timeouts changed while a slow origin answers, the memcached server list
//!    changed (restart-only) while hits are read from memcached, and reloads refused for a bad
//!    value. The promise (`docs/lifecycle.md`): requests already running finish with the settings
//!    they started with, new ones get the new ones; a restart-only key keeps its running value
//!    and is named; an invalid file is refused whole, reported, and changes nothing; the memory
//!    tier (and the cache) survives every reload.

use lacquer_test_support as support;

use lacquer::invalidation::record::{Record, RecordId};
use lacquer::invalidation::target::Target;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use support::*;

mod cluster_log_common;
use cluster_log_common::*;

/// Local copies are trusted for 30 s: a node that stops serving a copy sooner stopped because
/// the purge or ban reached it.
const NODE: &str = "local_ttl = \"30s\"";

/// A `PURGE` of `path` through `node`'s proxy, timed: it is a client request too, bounded like
/// any other while a server is frozen.
async fn purge_request(node: &Node, path: &str) -> Resp {
    let started = Instant::now();
    let answer = request("PURGE", &node.proxy.url(path), &SITE, None).await;
    let took = started.elapsed();
    assert!(
        took <= REQUEST_BOUND * 2,
        "PURGE {path} through {} took {took:?}",
        node.name
    );
    answer
}

/// A path (with `query`) of the site whose memcached key the cluster places on `server`.
fn path_on(cluster: &MemcachedCluster, server: usize, stem: &str, query: &str) -> String {
    (0..1000)
        .map(|i| format!("{stem}/{i}?{query}"))
        .find(|p| cluster.server_for(&key_of(p)) == server)
        .expect("some path lands on every server")
}

// ---------------------------------------------------------------------------------------------
// 1. The invalidation log under a frozen, restarted or dead server, and junk in it
// ---------------------------------------------------------------------------------------------

/// Attack: two nodes over two memcached servers; the server holding a page's entry is frozen
/// (SIGSTOP) while node A purges that page (admin API, waiting for B) and bans another page's
/// tag, both of which B holds; then it thaws. Promise: the purge's answer says what it reached
/// (the frozen server's delete and publication pending, 202); if it names B as reached, B never
/// serves the page after it; either way B stops serving both pages within a poll of the live
/// server, and neither B, A nor a node started after the thaw serves them again (the old entry
/// comes back with the thawed server, and is judged banned). No request to either node fails or
/// waits more than `op_timeout` plus a margin meanwhile, the `PURGE` requests included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_and_a_ban_while_a_log_server_is_frozen_reach_the_other_node_and_hold_at_thaw() {
    let cluster = MemcachedCluster::start(2);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let purged = path_on(&cluster, 0, "/frozen/purged", "cc=max-age%3D300");
    let banned = path_on(
        &cluster,
        0,
        "/frozen/banned",
        "cc=max-age%3D300&hdr=surrogate-key:frozen-tag",
    );
    let by_request = path_on(&cluster, 0, "/frozen/by-request", "cc=max-age%3D300");
    let old_purged = stored_on_both(&cluster, &a, &b, &purged).await;
    let old_banned = stored_on_both(&cluster, &a, &b, &banned).await;
    let old_by_request = stored_on_both(&cluster, &a, &b, &by_request).await;
    let load = Load::start(
        vec![a.proxy.url(""), b.proxy.url("")],
        "frozen",
        4,
        40,
        Duration::ZERO,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    cluster.servers[0].freeze();
    // the admin purge, waiting for B's confirmation
    let body = format!(r#"{{"url": "http://{HOST}{purged}", "by": "breaker"}}"#);
    let answer = admin(&a, "/purge", &body).await;
    let report = json(&answer);
    assert!(
        answer.status == 202 || answer.status == 200,
        "{}: {report}",
        answer.status
    );
    assert!(
        !report["memcached"]["published_to"]
            .as_array()
            .unwrap()
            .is_empty(),
        "the live server took no publication: {report}"
    );
    if answer.status == 200 {
        assert_eq!(report["complete"], true, "{report}");
    } else {
        assert!(
            !report["pending"].as_array().unwrap().is_empty(),
            "a 202 that names nothing pending: {report}"
        );
    }
    if reached(&report).contains(&"B".to_string()) {
        let from_b = get(&b.proxy.url(&purged), &SITE).await;
        assert_ne!(
            from_b.body, old_purged,
            "the purge's answer says B has it, and B served the old page: {report}"
        );
    }
    let took = stops_serving(
        &b,
        &purged,
        &old_purged,
        REACH_BOUND,
        "admin purge, server frozen",
    )
    .await;
    eprintln!("admin purge reached B {took:?} after its answer: {report}");

    // a tag ban, not waiting
    let ban = admin(
        &a,
        "/ban",
        r#"{"tag": "frozen-tag", "by": "breaker", "wait": false}"#,
    )
    .await;
    assert!(ban.status == 200 || ban.status == 202, "{}", ban.text());
    stops_serving(
        &b,
        &banned,
        &old_banned,
        REACH_BOUND,
        "tag ban, server frozen",
    )
    .await;

    // a PURGE request through A's proxy, timed like any client request
    let purge = purge_request(&a, &by_request).await;
    assert!(
        purge.status == 202 || purge.status == 200,
        "PURGE while a server is frozen: {} {:?}",
        purge.status,
        purge.header("lacquer-purge")
    );
    stops_serving(
        &b,
        &by_request,
        &old_by_request,
        REACH_BOUND,
        "PURGE, server frozen",
    )
    .await;

    // still frozen for a while: nothing comes back
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.servers[0].thaw();
    none_serves_for_a_while(&[&a, &b], &purged, &old_purged, "after thaw").await;
    none_serves_for_a_while(&[&a, &b], &banned, &old_banned, "after thaw").await;
    none_serves_for_a_while(&[&a, &b], &by_request, &old_by_request, "after thaw").await;
    load.stop("frozen log server").await;

    // a node started now reads the whole log from both servers
    let c = cluster.node(&origin, "C", NODE);
    none_serves_for_a_while(&[&c], &purged, &old_purged, "a node started after the thaw").await;
    none_serves_for_a_while(&[&c], &banned, &old_banned, "a node started after the thaw").await;
    for node in [&a, &b, &c] {
        node.proxy.assert_no_panic();
    }
}

/// Attack: the two servers are frozen in turn, over and over (one frozen 400 ms, both live
/// 100 ms, the other frozen 400 ms...), for about eight seconds, so that B's polls of the log
/// start and end with a server frozen mid-read, while A purges a page B holds every second
/// (`wait: false`). Promise: every purge is published to a server that answers, at once or by
/// its retry at a later poll (a server that thawed may still be ejected for `retry_after`, 1 s,
/// while the other is frozen: the answer is then 503), so B stops serving each page within a
/// few seconds; nothing is lost once both are live again; no request fails or waits more than
/// `op_timeout` plus a margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purges_while_the_log_servers_freeze_in_turn_across_bs_polls_all_reach_b() {
    let cluster = Arc::new(MemcachedCluster::start(2));
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let pages: Vec<String> = (0..6)
        .map(|i| format!("/flapping/{i}?cc=max-age%3D300"))
        .collect();
    let mut old = Vec::new();
    for page in &pages {
        old.push(stored_on_both(&cluster, &a, &b, page).await);
    }
    let load = Load::start(
        vec![a.proxy.url(""), b.proxy.url("")],
        "flapping",
        4,
        40,
        Duration::ZERO,
    );

    let stop = Arc::new(AtomicBool::new(false));
    let flapper = {
        let (cluster, stop) = (cluster.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut turn = 0;
            while !stop.load(Ordering::Relaxed) {
                let server = &cluster.servers[turn % 2];
                server.freeze();
                std::thread::sleep(Duration::from_millis(400));
                server.thaw();
                std::thread::sleep(Duration::from_millis(100));
                turn += 1;
            }
        })
    };
    let mut times = Vec::new();
    let mut failure = None;
    for (page, old) in pages.iter().zip(&old) {
        let body = format!(r#"{{"url": "http://{HOST}{page}", "by": "breaker", "wait": false}}"#);
        let answer = admin(&a, "/purge", &body).await;
        // 503: no server took it at once (the one that thawed last may still be ejected for
        // `retry_after`, the other frozen); it is retried at every poll until one does
        if ![200, 202, 503].contains(&answer.status) {
            failure = Some(format!(
                "purge of {page}: {} {}",
                answer.status,
                answer.text()
            ));
            break;
        }
        let started = Instant::now();
        let mut served_old = true;
        while started.elapsed() < REACH_BOUND {
            let from_b = get(&b.proxy.url(page), &SITE).await;
            if from_b.body != *old {
                served_old = false;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if served_old {
            failure = Some(format!(
                "B still serves {page} {REACH_BOUND:?} after its purge (answer {}: {})",
                answer.status,
                answer.text()
            ));
            break;
        }
        times.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    stop.store(true, Ordering::Relaxed);
    flapper.join().unwrap();
    // whatever happened, both servers run again before anything is asserted
    eprintln!("purges reached B after {times:?}");
    if let Some(failure) = failure {
        panic!("{failure}");
    }
    for (page, old) in pages.iter().zip(&old) {
        none_serves_for_a_while(&[&a, &b], page, old, "after the servers stopped flapping").await;
    }
    load.stop("log servers frozen in turn").await;
    a.proxy.assert_no_panic();
    b.proxy.assert_no_panic();
}

/// Attack: a memcached server is restarted empty (its copy of the log and its entries lost)
/// while both nodes run, then A purges a page B holds; then the other server is killed for good
/// and A bans the tag of a page whose entry lives on the restarted server. Promise: each
/// reaches B through whichever server took it (the restarted one's log begins again and is read
/// from its start); a node started after both faults, which can read the restarted server
/// only, knows the ban and does not serve the banned entry still in memcached; no request fails
/// or waits more than `op_timeout` plus a margin (a dead server refuses at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_log_server_restarted_empty_and_another_killed_for_good_lose_no_purge_or_ban() {
    let mut cluster = MemcachedCluster::start(2);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let purged = "/restart/purged?cc=max-age%3D300".to_string();
    let old_purged = stored_on_both(&cluster, &a, &b, &purged).await;
    // a ban before the restart, which both nodes read: their offsets in the bucket move on
    let warm = admin(&a, "/ban", r#"{"tag": "warm-up", "wait": true}"#).await;
    assert_eq!(warm.status, 200, "{}", warm.text());
    assert_eq!(reached(&json(&warm)), vec!["B".to_string()]);
    let load = Load::start(
        vec![a.proxy.url(""), b.proxy.url("")],
        "restart",
        4,
        40,
        Duration::ZERO,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    cluster.servers[0].restart();
    // the nodes may have ejected it for `retry_after` (1 s): requests go on meanwhile
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let banned = path_on(
        &cluster,
        0,
        "/restart/banned",
        "cc=max-age%3D300&hdr=surrogate-key:restart-tag",
    );
    let old_banned = stored_on_both(&cluster, &a, &b, &banned).await;
    // a page of the same tag stored by a node that then dies: nobody holds it or asks for it
    // after the ban, and its entry stays in memcached
    let untouched = path_on(
        &cluster,
        0,
        "/restart/untouched",
        "cc=max-age%3D300&hdr=surrogate-key:restart-tag",
    );
    let old_untouched = {
        let d = cluster.node(&origin, "D", NODE);
        let first = get(&d.proxy.url(&untouched), &SITE).await;
        assert!(first.is_stored(), "{:?}", first.cache_status());
        wait_for_entry(&cluster, &untouched).await;
        first.body
    };
    let body = format!(r#"{{"url": "http://{HOST}{purged}", "by": "breaker"}}"#);
    let answer = admin(&a, "/purge", &body).await;
    let report = json(&answer);
    assert!(answer.status == 200 || answer.status == 202, "{report}");
    if reached(&report).contains(&"B".to_string()) {
        assert_ne!(
            get(&b.proxy.url(&purged), &SITE).await.body,
            old_purged,
            "B confirmed the purge and served the old page: {report}"
        );
    }
    stops_serving(
        &b,
        &purged,
        &old_purged,
        REACH_BOUND,
        "purge after a restart",
    )
    .await;

    cluster.servers[1].kill();
    let ban = admin(
        &a,
        "/ban",
        r#"{"tag": "restart-tag", "by": "breaker", "wait": false}"#,
    )
    .await;
    let ban_report = json(&ban);
    assert!(ban.status == 200 || ban.status == 202, "{ban_report}");
    assert!(
        ban_report["memcached"]["published_to"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s.as_str() == Some(&cluster.servers[0].addr_string())),
        "the restarted server did not take the ban: {ban_report}"
    );
    stops_serving(
        &b,
        &banned,
        &old_banned,
        REACH_BOUND,
        "ban, one server dead",
    )
    .await;
    none_serves_for_a_while(&[&a, &b], &banned, &old_banned, "one server dead").await;
    load.stop("a server restarted, another killed").await;

    // the untouched page's entry is still in memcached, on the restarted server
    let key = key_of(&untouched);
    let entry_kept = cluster.servers[0].get_raw(&key).is_some_and(|raw| {
        raw.windows(old_untouched.len())
            .any(|w| w == &old_untouched[..])
    });
    assert!(
        entry_kept,
        "the untouched page's entry left memcached: not the scenario"
    );
    let c = cluster.node(&origin, "C", NODE);
    none_serves_for_a_while(
        &[&c],
        &untouched,
        &old_untouched,
        "a node started after the faults",
    )
    .await;
    none_serves_for_a_while(
        &[&c],
        &banned,
        &old_banned,
        "a node started after the faults",
    )
    .await;
    none_serves_for_a_while(
        &[&c],
        &purged,
        &old_purged,
        "a node started after the faults",
    )
    .await;
    for node in [&a, &b, &c] {
        node.proxy.assert_no_panic();
    }
}

/// Attack: every memcached server is restarted empty (the log, the members list and the
/// heartbeats lost with them) while both nodes run; then node A purges a page B holds through
/// the admin API, waiting for the other nodes. Promise: the answer names every live node as
/// reached or not confirmed (B is running and polling: an answer that names no node reports a
/// purge complete that B may not have yet), and once it says B has it, B never serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_purge_after_every_log_server_restarted_still_accounts_for_the_other_node() {
    let mut cluster = MemcachedCluster::start(2);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    // both nodes listed and confirming before the restart (B's first read and heartbeat may
    // still be under way when it starts answering)
    let mut warm = admin(&a, "/ban", r#"{"tag": "warm-up"}"#).await;
    let until = Instant::now() + Duration::from_secs(10);
    while reached(&json(&warm)) != ["B"] && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        warm = admin(&a, "/ban", r#"{"tag": "warm-up"}"#).await;
    }
    assert_eq!(
        reached(&json(&warm)),
        vec!["B".to_string()],
        "{}",
        warm.text()
    );
    for server in &mut cluster.servers {
        server.restart();
    }
    // past `retry_after` (1 s), and several polls of the restarted servers
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let page = "/restarted-everywhere?cc=max-age%3D300".to_string();
    let old = stored_on_both(&cluster, &a, &b, &page).await;
    let body = format!(r#"{{"url": "http://{HOST}{page}", "by": "breaker"}}"#);
    let answer = admin(&a, "/purge", &body).await;
    let report = json(&answer);
    eprintln!(
        "purge after every server restarted: {} {report}",
        answer.status
    );
    let mut named = reached(&report);
    named.extend(
        report["nodes"]["not_confirmed"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|v| v.as_str().unwrap_or("").to_string())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default(),
    );
    if reached(&report).contains(&"B".to_string()) {
        assert_ne!(
            get(&b.proxy.url(&page), &SITE).await.body,
            old,
            "B confirmed the purge and served the old page: {report}"
        );
    }
    stops_serving(
        &b,
        &page,
        &old,
        REACH_BOUND,
        "purge after every server restarted",
    )
    .await;
    assert!(
        named.contains(&"B".to_string()),
        "the purge's answer ({}) accounts for no other node, though B runs and reads the log: \
         {report}",
        answer.status
    );
}

/// Attack: a tag ban is published to both servers, then one server is frozen and a node C is
/// started: its catch-up read of the whole log meets the frozen server. The banned page's entry
/// lives on the live server, stored by a node that has since died (nobody holds or refetches
/// it). Promise: C reads the live server's copy of the log before it serves from memcached
/// (reads wait for the catch-up, at most 2 s), so it never serves the banned entry; its first
/// requests wait at most that plus `op_timeout` and a margin; after the thaw it still does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_started_while_a_log_server_is_frozen_knows_the_bans_the_live_one_holds() {
    let cluster = MemcachedCluster::start(2);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let page = path_on(
        &cluster,
        1,
        "/catch-up/banned",
        "cc=max-age%3D300&hdr=surrogate-key:catch-up-tag",
    );
    let old = {
        let d = cluster.node(&origin, "D", NODE);
        let first = get(&d.proxy.url(&page), &SITE).await;
        assert!(first.is_stored(), "{:?}", first.cache_status());
        wait_for_entry(&cluster, &page).await;
        first.body
    };
    let ban = admin(&a, "/ban", r#"{"tag": "catch-up-tag", "wait": false}"#).await;
    assert_eq!(ban.status, 200, "{}", ban.text());
    assert!(
        cluster.servers[1].holds(&key_of(&page)),
        "the entry is gone: not the scenario"
    );
    cluster.servers[0].freeze();
    let c = cluster.node(&origin, "C", NODE);
    let started = Instant::now();
    let first = get(&c.proxy.url(&page), &SITE).await;
    let took = started.elapsed();
    cluster.servers[0].thaw();
    assert_eq!(first.status, 200);
    assert_ne!(
        first.body,
        old,
        "C, started while a log server was frozen, served the banned entry ({:?})",
        first.cache_status()
    );
    assert!(
        took <= REQUEST_BOUND + Duration::from_secs(2),
        "C's first request took {took:?}"
    );
    none_serves_for_a_while(&[&c, &a], &page, &old, "after the thaw").await;
    c.proxy.assert_no_panic();
}

/// The current 10-second bucket of the log.
fn log_bucket() -> u64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        / 10_000
}

/// Appends `bytes` to the log's bucket keys (both classes) of the current and next bucket on
/// every server, creating them when absent, as a memcached co-tenant could.
fn plant(cluster: &MemcachedCluster, bytes: &[u8]) {
    let bucket = log_bucket();
    for server in &cluster.servers {
        for b in [bucket, bucket + 1] {
            for class in ["", "s:"] {
                let key = format!("lq:inval:{class}{b}");
                let reply =
                    server.command(&format!("append {key} 0 0 {}", bytes.len()), Some(bytes));
                if !reply.starts_with("STORED") {
                    let reply =
                        server.command(&format!("add {key} 0 600 {}", bytes.len()), Some(bytes));
                    assert!(
                        reply.starts_with("STORED") || reply.starts_with("NOT_STORED"),
                        "{key}: {reply}"
                    );
                }
            }
        }
    }
}

/// A well-framed record of a purge of `path`, from an issuer no node is, dated `ahead_ms`
/// after now.
fn planted_record(path: &str, ahead_ms: u64) -> Bytes {
    let now_ms = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    Record {
        id: RecordId {
            issuer: 0x0bad_0bad_0bad_0bad,
            seq: 1,
        },
        issued_ms: now_ms + ahead_ms,
        soft: false,
        short_lived: false,
        target: Target::Url {
            host: HOST.to_string(),
            path: path.to_string(),
        },
        asked_by: "a co-tenant".to_string(),
    }
    .encode()
}

/// Attack: junk written straight into the log's bucket keys on every server between genuine
/// records: bytes that frame nothing, a length running past the end, a genuine record cut short,
/// a record's magic with a bad checksum, a well-framed purge dated ten minutes ahead, and finally
/// a bucket value replaced whole by junk. Promise: every genuine purge and ban A publishes after
/// each plant still reaches B within a poll; the record dated ahead is refused (B keeps serving
/// the page it names from its own copy, and stores it again when asked).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn junk_planted_in_the_log_between_records_does_not_stop_later_records_reaching_b() {
    let cluster = MemcachedCluster::start(2);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let pages: Vec<String> = (0..5)
        .map(|i| format!("/junk/{i}?cc=max-age%3D300&hdr=surrogate-key:junk-{i}"))
        .collect();
    let dated_ahead = "/junk/dated-ahead?cc=max-age%3D300".to_string();
    let mut old = Vec::new();
    for page in &pages {
        old.push(stored_on_both(&cluster, &a, &b, page).await);
    }
    let old_ahead = stored_on_both(&cluster, &a, &b, &dated_ahead).await;

    // a genuine purge first: B reads the buckets and keeps its offsets
    let purge = |i: usize| format!(r#"{{"url": "http://{HOST}{}", "wait": false}}"#, pages[i]);
    assert_eq!(admin(&a, "/purge", &purge(0)).await.status, 200);
    stops_serving(&b, &pages[0], &old[0], REACH_BOUND, "before any junk").await;

    // junk that frames nothing, a length past the end of what follows, a record's magic with
    // a bad checksum
    let mut junk = b"\x00\x00\xff\xff\x00\x07LI\x01garbage\x13\x37".to_vec();
    let mut bad_crc = planted_record("/junk/never", 0).to_vec();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0xff;
    junk.extend_from_slice(&bad_crc);
    plant(&cluster, &junk);
    assert_eq!(admin(&a, "/purge", &purge(1)).await.status, 200);
    stops_serving(&b, &pages[1], &old[1], REACH_BOUND, "after junk").await;

    // a genuine record cut short (its length says more than follows), then a tag ban
    let cut = planted_record("/junk/never", 0);
    plant(&cluster, &cut[..cut.len() / 2]);
    let ban = admin(&a, "/ban", r#"{"tag": "junk-2", "wait": false}"#).await;
    assert_eq!(ban.status, 200, "{}", ban.text());
    stops_serving(
        &b,
        &pages[2],
        &old[2],
        REACH_BOUND,
        "after a record cut short",
    )
    .await;

    // a well-framed purge dated ten minutes ahead: refused; then a genuine purge after it
    plant(&cluster, &planted_record(&dated_ahead, 600_000));
    assert_eq!(admin(&a, "/purge", &purge(3)).await.status, 200);
    stops_serving(
        &b,
        &pages[3],
        &old[3],
        REACH_BOUND,
        "after a record dated ahead",
    )
    .await;
    let from_b = get(&b.proxy.url(&dated_ahead), &SITE).await;
    assert!(
        from_b.is_hit() && from_b.body == old_ahead,
        "B applied a purge dated ten minutes ahead: {:?}",
        from_b.cache_status()
    );

    // a bucket value replaced whole by junk, longer than what B parsed of it
    let bucket = log_bucket();
    let filler = vec![b'#'; 4096];
    for server in &cluster.servers {
        for b in [bucket, bucket + 1] {
            for class in ["", "s:"] {
                server.set_raw(&format!("lq:inval:{class}{b}"), &filler, 600);
            }
        }
    }
    assert_eq!(admin(&a, "/purge", &purge(4)).await.status, 200);
    stops_serving(
        &b,
        &pages[4],
        &old[4],
        REACH_BOUND,
        "after a bucket replaced by junk",
    )
    .await;
    for (page, old) in pages.iter().zip(&old) {
        none_serves_for_a_while(&[&a, &b], page, old, "after all the junk").await;
    }
    a.proxy.assert_no_panic();
    b.proxy.assert_no_panic();
}

/// Attack: a memcached co-tenant fills the log's bucket keys of the next forty seconds (both
/// classes, every server) with junk up to memcached's item size limit, so that no record can be
/// appended to them; then node A purges a page B holds. Promise: junk in the log does not stop
/// later records from reaching the other nodes while every server is up and answering: the purge
/// is published and B stops serving the page within a poll. (Were the answer to say it reached
/// no server, B would keep its copy for `local_ttl`, 30 s here.)
/// (Found 2026-12-08: every append failed, the purge answered 503 and reached no node until a
/// later bucket took it; the log now goes on in overflow parts of each bucket.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn log_buckets_filled_to_the_item_limit_by_a_co_tenant_do_not_stop_a_purge_reaching_b() {
    let cluster = MemcachedCluster::start(2);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let page = "/bucket-full?cc=max-age%3D300".to_string();
    let old = stored_on_both(&cluster, &a, &b, &page).await;
    let bucket = log_bucket();
    let mut filled = 0;
    for server in &cluster.servers {
        for n in bucket..bucket + 4 {
            for class in ["", "s:"] {
                let key = format!("lq:inval:{class}{n}");
                // the largest value memcached takes under this key
                let stored = (0..64).map(|i| 1024 * 1024 - 16 * i).find(|size| {
                    let junk = vec![b'#'; *size];
                    server
                        .command(&format!("set {key} 0 600 {size}"), Some(&junk))
                        .starts_with("STORED")
                });
                assert!(stored.is_some(), "{key}: memcached took no large value");
                filled += 1;
            }
        }
    }
    assert_eq!(filled, 16);
    assert!(
        log_bucket() < bucket + 3,
        "planting took past the filled buckets: not the scenario"
    );
    let body = format!(r#"{{"url": "http://{HOST}{page}", "by": "breaker", "wait": false}}"#);
    let answer = admin(&a, "/purge", &body).await;
    let report = json(&answer);
    eprintln!(
        "purge with the log's buckets full: {} {report}",
        answer.status
    );
    stops_serving(&b, &page, &old, REACH_BOUND, "log buckets full").await;
    assert!(
        !report["memcached"]["published_to"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{report}"
    );
}

/// Flood: memcached servers whose item size limit is 4 KiB (`-I 4k`), so that a log bucket's
/// value takes a few dozen records, and node A purges 80 pages B holds as fast as it answers,
/// without waiting. Promise: the log is not capped by one value's size: every purge is
/// published, the records overflow into the bucket's further parts, and B stops serving every
/// page. (With the default 1 MiB limit the same cap was about ten thousand records per
/// 10-second bucket and kind.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purges_past_what_one_log_value_holds_all_reach_b() {
    let cluster = MemcachedCluster::start_with(2, &["-I", "4k", "-o", "slab_chunk_max=4096"]);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let pages: Vec<String> = (0..80)
        .map(|i| format!("/flooded-{i:02}?cc=max-age%3D300"))
        .collect();
    let mut old = Vec::new();
    for page in &pages {
        old.push(stored_on_both(&cluster, &a, &b, page).await);
    }
    let bucket = log_bucket();
    for page in &pages {
        let body = format!(r#"{{"url": "http://{HOST}{page}", "wait": false}}"#);
        let answer = admin(&a, "/purge", &body).await;
        let report = json(&answer);
        assert_eq!(answer.status, 200, "{page}: {report}");
        assert_eq!(
            report["memcached"]["published_to"].as_array().map(Vec::len),
            Some(2),
            "{page}: {report}"
        );
    }
    let overflowed = (bucket..=log_bucket()).any(|n| {
        ["", "s:"].iter().any(|class| {
            cluster.servers[0]
                .get_raw(&format!("lq:inval:{class}{n}.1"))
                .is_some()
        })
    });
    assert!(overflowed, "no bucket overflowed: not the scenario");
    for (page, old) in pages.iter().zip(&old) {
        stops_serving(&b, page, old, REACH_BOUND, "a flood of purges").await;
    }
    a.proxy.assert_no_panic();
    b.proxy.assert_no_panic();
}

/// Attack: a memcached co-tenant reads node A's instance id from the log's members list and
/// plants, in the log, a harmless well-framed record (a ban of a tag nothing carries, dated in
/// the past) that claims to be A's with a sequence number far past A's own. B applies it, and
/// its heartbeat then says it has applied every record A will ever issue. B reads the log every
/// 3 s. Then A purges a page B holds through the admin API, waiting for the other nodes.
/// Promise: an answer that names B as reached means B has the purge: B never serves the page
/// after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_planted_under_as_id_does_not_make_b_confirm_purges_it_has_not_read() {
    let cluster = MemcachedCluster::start(2);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node_with_invalidation(&origin, "B", "poll_interval = \"3s\"\n", NODE);
    let page = "/forged-confirmation?cc=max-age%3D300".to_string();
    let old = stored_on_both(&cluster, &a, &b, &page).await;
    // A's instance id, as anyone who can read memcached finds it
    let server = &cluster.servers[0];
    let mut a_id = None;
    let found = poll_until_async(Duration::from_secs(10), || {
        let listed = server.get_raw("lq:inval:nodes").unwrap_or_default();
        a_id = String::from_utf8_lossy(&listed).lines().find_map(|line| {
            let beat = server.get_raw(&format!("lq:inval:node:{}", line.trim()))?;
            String::from_utf8_lossy(&beat)
                .starts_with("A\n")
                .then(|| u64::from_str_radix(line.trim(), 16).ok())?
        });
        a_id.is_some()
    })
    .await;
    assert!(found, "A's heartbeat not found");
    let a_id = a_id.unwrap();
    let forged_seq = 1u64 << 40;
    let now_ms = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let forged = Record {
        id: RecordId {
            issuer: a_id,
            seq: forged_seq,
        },
        issued_ms: now_ms - 1_000,
        soft: false,
        short_lived: false,
        target: Target::Tag("nothing-carries-this".to_string()),
        asked_by: "a co-tenant".to_string(),
    }
    .encode();
    plant(&cluster, &forged);
    // B applies it at its next read (every 3 s)
    let needle = format!("{a_id:016x} {forged_seq}");
    let b_took_it = poll_until_async(Duration::from_secs(10), || {
        String::from_utf8_lossy(&server.get_raw("lq:inval:nodes").unwrap_or_default())
            .lines()
            .filter_map(|l| u64::from_str_radix(l.trim(), 16).ok())
            .any(|id| {
                server
                    .get_raw(&format!("lq:inval:node:{id:016x}"))
                    .is_some_and(|beat| {
                        let beat = String::from_utf8_lossy(&beat).into_owned();
                        beat.starts_with("B\n") && beat.contains(&needle)
                    })
            })
    })
    .await;
    assert!(
        b_took_it,
        "B never applied the planted record: not the scenario"
    );
    let body = format!(r#"{{"url": "http://{HOST}{page}", "by": "breaker"}}"#);
    let answer = admin(&a, "/purge", &body).await;
    let report = json(&answer);
    let from_b = get(&b.proxy.url(&page), &SITE).await;
    assert!(
        !(reached(&report).contains(&"B".to_string()) && from_b.body == old),
        "the purge's answer says B has it, and B served the old page ({:?}): {report}",
        from_b.cache_status()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Reloads in the middle of traffic
// ---------------------------------------------------------------------------------------------

/// How many reload outcomes (applied or refused) the node has logged.
fn reload_outcomes(node: &LacquerProcess) -> usize {
    let log = node.stderr_log();
    log.matches("configuration reloaded").count() + log.matches("reload refused").count()
}

/// Writes `config`, sends SIGHUP and waits for one more reload outcome; returns whether it was
/// "applied".
fn sighup_with(node: &LacquerProcess, config: &str) -> bool {
    node.write_config(config);
    let before_applied = node.stderr_log().matches("configuration reloaded").count();
    let before = reload_outcomes(node);
    assert!(node.signal("HUP"));
    assert!(
        poll_until(BOUND, || reload_outcomes(node) > before),
        "no reload outcome logged after SIGHUP; stderr:\n{}",
        node.stderr_log()
    );
    node.stderr_log().matches("configuration reloaded").count() > before_applied
}

/// A node's config: one origin, no access log, these `[balancer.timeouts]`.
fn timeouts_config(port: u16, origin: std::net::SocketAddr, timeouts: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\nupstream = \"{origin}\"\nthreads = 2\n\
         [log]\naccess = \"off\"\n[balancer.retries]\nattempts = 0\n\
         [balancer.timeouts]\nconnect = \"500ms\"\n{timeouts}\n"
    )
}

/// A request sent now on a task of its own, timed; answers `(status or error, body, time)`.
fn timed(
    method: &'static str,
    url: String,
) -> tokio::task::JoinHandle<(Result<u16, String>, Bytes, Duration)> {
    tokio::spawn(async move {
        let started = Instant::now();
        let answer =
            tokio::time::timeout(BOUND, send(&http_client(), method, &url, &[], None)).await;
        let took = started.elapsed();
        match answer {
            Ok(Ok(r)) => (Ok(r.status), r.body, took),
            Ok(Err(e)) => (Err(format!("{e}")), Bytes::new(), took),
            Err(_) => (Err("hung".into()), Bytes::new(), took),
        }
    })
}

/// Attack: a slow origin (its answer after 3 s) while a reload cuts `balancer.timeouts.total`
/// from 20 s to 1 s, then, with requests under a 3 s deadline in flight, raises it to 30 s.
/// Promise: requests keep the deadline they started with: the GET miss and the POST in flight
/// across the first reload are answered 200 in full, those sent after it 504 within about a
/// second; the requests in flight across the second reload are cut at their 3 s (504, not a
/// 200 at 6 s), those after it wait for the origin; nothing hangs past its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_of_the_total_deadline_applies_to_new_requests_and_not_to_those_in_flight() {
    let origin = scripted_origin();
    let node = LacquerProcess::start_on_free_port(|port| {
        timeouts_config(port, origin.addr(), "total = \"20s\"")
    });
    let port = node.port();
    let url = |p: &str| node.url(p);
    // in flight across a reload to 1 s
    let get_before = timed("GET", url("/total/get-before?sleep=3000&cc=no-store"));
    let post_before = timed("POST", url("/total/post-before?sleep=3000"));
    assert!(origin.wait_for_hits_async(2, BOUND).await);
    assert!(sighup_with(
        &node,
        &timeouts_config(port, origin.addr(), "total = \"1s\"")
    ));
    let get_after = timed("GET", url("/total/get-after?sleep=3000&cc=no-store"));
    let post_after = timed("POST", url("/total/post-after?sleep=3000"));
    for (what, task, expect) in [
        ("GET in flight across the reload", get_before, 200),
        ("POST in flight across the reload", post_before, 200),
        ("GET sent after the reload", get_after, 504),
        ("POST sent after the reload", post_after, 504),
    ] {
        let (status, body, took) = task.await.unwrap();
        eprintln!("{what}: {status:?} after {took:?}");
        assert_eq!(status, Ok(expect), "{what} (after {took:?}); body {body:?}");
        if expect == 200 {
            assert!(!body.is_empty(), "{what}: answered without its body");
        } else {
            assert!(
                took < Duration::from_millis(2_500),
                "{what}: a 1 s deadline answered after {took:?}"
            );
        }
    }

    // in flight under 3 s across a reload to 30 s
    assert!(sighup_with(
        &node,
        &timeouts_config(port, origin.addr(), "total = \"3s\"")
    ));
    origin.reset_counts();
    let get_before = timed("GET", url("/total/get-long?sleep=6000&cc=no-store"));
    let post_before = timed("POST", url("/total/post-long?sleep=6000"));
    assert!(origin.wait_for_hits_async(2, BOUND).await);
    assert!(sighup_with(
        &node,
        &timeouts_config(port, origin.addr(), "total = \"30s\"")
    ));
    let get_after = timed("GET", url("/total/get-later?sleep=4000&cc=no-store"));
    for (what, task, expect) in [
        ("GET in flight across the reload to 30 s", get_before, 504),
        ("POST in flight across the reload to 30 s", post_before, 504),
        ("GET sent after the reload to 30 s", get_after, 200),
    ] {
        let (status, _, took) = task.await.unwrap();
        eprintln!("{what}: {status:?} after {took:?}");
        assert_eq!(status, Ok(expect), "{what} (after {took:?})");
        if expect == 504 {
            assert!(
                took < Duration::from_millis(5_000),
                "{what}: its 3 s deadline answered after {took:?}"
            );
        }
    }
    node.assert_no_panic();
}

/// Attack: a GET queued on the cache lock behind another request's fetch of the same URL (the
/// origin takes 3 s, and answers `no-store`, so the queued request then fetches for itself,
/// another 3 s) while a reload cuts `balancer.timeouts.total` from 20 s to 1 s. Promise: the
/// queued request started before the reload and keeps its settings ("every phase of a request
/// reads the settings its first phase read"): its own fetch, begun after the reload, runs under
/// its 20 s, and it is answered 200, not 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_queued_behind_a_fetch_across_a_reload_keeps_its_total_deadline() {
    let origin = scripted_origin();
    let node = LacquerProcess::start_on_free_port(|port| {
        timeouts_config(port, origin.addr(), "total = \"20s\"")
    });
    let port = node.port();
    let path = "/queued?sleep=3000&cc=no-store";
    let first = timed("GET", node.url(path));
    assert!(origin.wait_for_hits_async(1, BOUND).await);
    let queued = timed("GET", node.url(path));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued_at_origin = origin.hits();
    assert!(sighup_with(
        &node,
        &timeouts_config(port, origin.addr(), "total = \"1s\"")
    ));
    let (status, _, took) = first.await.unwrap();
    assert_eq!(status, Ok(200), "the first request ({took:?})");
    let (status, _, took) = queued.await.unwrap();
    eprintln!(
        "queued request: {status:?} after {took:?} (origin requests when the reload came: \
         {queued_at_origin}, in all: {})",
        origin.hits()
    );
    assert_eq!(
        status,
        Ok(200),
        "a request queued before the reload, fetching after it, was cut by the new deadline \
         (after {took:?})"
    );
    node.assert_no_panic();
}

/// Attack: the per-read timeouts (`balancer.timeouts.first_byte` and `idle`, one timer in
/// Pingora) cut from 10 s to 1 s by a reload while the origin takes 3 s to send its head (one
/// request) or pauses 3 s in the middle of its body (another), then raised from 2 s to 10 s
/// while a request waits 5 s for its head. Promise: the requests in flight across the cut are
/// answered whole; those sent after it get 504 (head) or a cut body (mid-body pause) within
/// about a second; the one in flight across the raise is cut at its 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_of_the_per_read_timeouts_applies_to_new_requests_and_not_to_those_in_flight() {
    let origin = TestOrigin::start(|req| {
        if req.path.starts_with("/paused") {
            OriginResponse::ok(Body::Paced {
                chunks: vec![Bytes::from_static(b"first "), Bytes::from_static(b"last")],
                interval: Duration::from_secs(3),
            })
            .header("cache-control", "no-store")
        } else {
            let ms: u64 = query_param(req, "sleep")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            OriginResponse::ok("whole answer")
                .header("cache-control", "no-store")
                .delay(Duration::from_millis(ms))
        }
    });
    let reads = |t: &str| format!("total = \"60s\"\nfirst_byte = \"{t}\"\nidle = \"{t}\"");
    let node = LacquerProcess::start_on_free_port(|port| {
        timeouts_config(port, origin.addr(), &reads("10s"))
    });
    let port = node.port();
    let url = |p: &str| node.url(p);
    let head_before = timed("GET", url("/head/before?sleep=3000"));
    let paused_before = timed("GET", url("/paused/before"));
    assert!(origin.wait_for_hits_async(2, BOUND).await);
    assert!(sighup_with(
        &node,
        &timeouts_config(port, origin.addr(), &reads("1s"))
    ));
    let head_after = timed("GET", url("/head/after?sleep=3000"));
    let paused_after = timed("GET", url("/paused/after"));

    let (status, body, took) = head_before.await.unwrap();
    assert_eq!(
        (status, &body[..]),
        (Ok(200), &b"whole answer"[..]),
        "a request waiting for its head across the reload (after {took:?})"
    );
    let (status, body, took) = paused_before.await.unwrap();
    assert_eq!(
        (status, &body[..]),
        (Ok(200), &b"first last"[..]),
        "a request whose body paused across the reload (after {took:?})"
    );
    let (status, _, took) = head_after.await.unwrap();
    assert_eq!(
        status,
        Ok(504),
        "a head wait after the reload (after {took:?})"
    );
    assert!(
        took < Duration::from_millis(2_500),
        "a 1 s read timeout answered after {took:?}"
    );
    let (status, body, took) = paused_after.await.unwrap();
    assert!(
        status.is_err() || &body[..] != b"first last",
        "a body pausing 3 s after the reload to a 1 s idle timeout came whole ({status:?}, \
         after {took:?})"
    );
    assert!(took < Duration::from_millis(2_800), "cut after {took:?}");

    assert!(sighup_with(
        &node,
        &timeouts_config(port, origin.addr(), &reads("2s"))
    ));
    origin.reset_counts();
    let head_long = timed("GET", url("/head/long?sleep=5000"));
    assert!(origin.wait_for_hits_async(1, BOUND).await);
    assert!(sighup_with(
        &node,
        &timeouts_config(port, origin.addr(), &reads("10s"))
    ));
    let (status, _, took) = head_long.await.unwrap();
    assert_eq!(
        status,
        Ok(504),
        "a head wait under a 2 s timeout across a reload to 10 s (after {took:?})"
    );
    assert!(
        took < Duration::from_millis(4_000),
        "its 2 s timeout answered after {took:?}"
    );
    node.assert_no_panic();
}

/// Reads a node's config file.
fn config_of(node: &LacquerProcess) -> String {
    std::fs::read_to_string(node.config_path().unwrap()).unwrap()
}

/// Replaces the config's `servers = [...]` line with one listing `servers`.
fn with_servers(config: &str, servers: &[String]) -> String {
    let listed: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    config
        .lines()
        .map(|line| {
            if line.starts_with("servers = ") {
                format!("servers = [{}]", listed.join(", "))
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Attack: a node reading every hit from memcached (`local_ttl = "0s"`) under a steady load of
/// stored pages, reloaded (`POST /reload`, then SIGHUP) with a second memcached server added,
/// then with its server replaced by the other one, then with no server at all. Promise:
/// `[cache.memcached]` needs a restart: each reload is applied, names `cache.memcached` as kept,
/// and the node goes on with its running cluster: every stored page stays a hit from memcached,
/// the added server is never used, no request fails; a purge after the reloads still reaches
/// the running server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_that_add_or_remove_memcached_servers_keep_the_running_cluster_and_its_hits() {
    let cluster = MemcachedCluster::start(1);
    let other = MemcachedProcess::start();
    let origin = scripted_origin();
    let node = cluster.node_with_top_level(
        &origin,
        "A",
        "[cache]\nannounce = \"tier\"\n",
        "",
        "local_ttl = \"0s\"",
    );
    let host = format!("127.0.0.1:{}", node.proxy.port());
    let mut targets = Vec::new();
    for i in 0..12 {
        let path = format!("/servers/{i}?cc=max-age%3D300");
        let url = node.proxy.url(&path);
        let first = get(&url, &[]).await;
        assert!(first.is_stored(), "{url}: {:?}", first.cache_status());
        targets.push((url, first.text()));
        // in memcached before the load begins
        let key = MemcachedCluster::key_of(&host, &path);
        let written =
            poll_until_async(Duration::from_secs(5), || cluster.servers[0].holds(&key)).await;
        assert!(written, "{path} not written to memcached");
    }
    let hits_before = origin.hits();
    let load = SteadyLoad::start(4, targets.clone());
    assert!(load.wait_for(50, BOUND).await);

    let running = config_of(&node.proxy);
    let both = with_servers(
        &running,
        &[cluster.servers[0].addr_string(), other.addr_string()],
    );
    node.proxy.write_config(&both);
    let reload = admin_post(node.admin, "/reload", Some(ADMIN_TOKEN), "").await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    let needs = json(&reload)["needs_restart"].to_string();
    assert!(
        needs.contains("cache.memcached"),
        "a server added by a reload: {needs}"
    );
    assert!(
        load.wait_for(50, BOUND).await,
        "the load stalled after a reload"
    );

    let replaced = with_servers(&running, &[other.addr_string()]);
    assert!(
        sighup_with(&node.proxy, &replaced),
        "{}",
        node.proxy.stderr_log()
    );
    assert!(
        load.wait_for(50, BOUND).await,
        "the load stalled after a reload"
    );
    let none = with_servers(&running, &[]);
    node.proxy.write_config(&none);
    let reload = admin_post(node.admin, "/reload", Some(ADMIN_TOKEN), "").await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    assert!(
        json(&reload)["needs_restart"]
            .to_string()
            .contains("cache.memcached"),
        "{}",
        reload.text()
    );
    assert!(
        load.wait_for(50, BOUND).await,
        "the load stalled after a reload"
    );
    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);

    for (url, body) in &targets {
        let answer = get(url, &[]).await;
        assert!(
            answer.is_hit() && answer.text() == *body,
            "{url} after the reloads: {:?}",
            answer.cache_status()
        );
        assert_eq!(
            answer.cache_status_param("detail").as_deref(),
            Some("memcached"),
            "{url}: not read from the running memcached server: {:?}",
            answer.cache_status()
        );
    }
    assert_eq!(
        origin.hits(),
        hits_before,
        "a stored page was fetched again"
    );
    assert_eq!(
        other.stat("cmd_get").unwrap_or(0) + other.stat("cmd_set").unwrap_or(0),
        0,
        "the server a reload added was used without a restart"
    );
    // invalidation still runs on the running cluster
    let purge = request("PURGE", &targets[0].0, &[], None).await;
    assert_eq!(purge.status, 200, "{:?}", purge.header("lacquer-purge"));
    let summary = purge.header("lacquer-purge").unwrap_or_default();
    assert!(summary.contains("published=1/1"), "{summary}");
    node.proxy.assert_no_panic();
}

/// Attack: a reload raises `cache.memcached.op_timeout` and `connect_timeout` to 5 s (both
/// restart-only), then the node's only memcached server freezes while clients ask for pages
/// stored there (every hit reads memcached, `local_ttl = "0s"`). Promise: the reload names
/// `cache.memcached` as kept, and the running 200 ms still bounds what the frozen server costs:
/// every request is answered 200 within `op_timeout` plus a margin, not after 5 s; after the
/// thaw the pages are hits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reloaded_memcached_op_timeout_is_not_what_a_frozen_server_costs_a_request() {
    let cluster = MemcachedCluster::start(1);
    let origin = scripted_origin();
    let node = cluster.node(&origin, "A", "local_ttl = \"0s\"");
    let host = format!("127.0.0.1:{}", node.proxy.port());
    let mut pages = Vec::new();
    for i in 0..6 {
        let path = format!("/op-timeout/{i}?cc=max-age%3D300");
        let first = get(&node.proxy.url(&path), &[]).await;
        assert!(first.is_stored(), "{path}: {:?}", first.cache_status());
        let key = MemcachedCluster::key_of(&host, &path);
        assert!(
            poll_until_async(Duration::from_secs(5), || cluster.servers[0].holds(&key)).await,
            "{path} not written"
        );
        pages.push(path);
    }
    let running = config_of(&node.proxy);
    let slower = running
        .replace("op_timeout = \"200ms\"", "op_timeout = \"5s\"")
        .replace("connect_timeout = \"100ms\"", "connect_timeout = \"5s\"");
    assert_ne!(slower, running);
    node.proxy.write_config(&slower);
    let reload = admin_post(node.admin, "/reload", Some(ADMIN_TOKEN), "").await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    assert!(
        json(&reload)["needs_restart"]
            .to_string()
            .contains("cache.memcached"),
        "{}",
        reload.text()
    );
    cluster.servers[0].freeze();
    let mut slowest = Duration::ZERO;
    for round in 0..3 {
        for path in &pages {
            let started = Instant::now();
            let answer = get(&node.proxy.url(path), &[]).await;
            let took = started.elapsed();
            slowest = slowest.max(took);
            assert_eq!(answer.status, 200, "{path} round {round}");
            assert!(
                took <= REQUEST_BOUND,
                "{path} took {took:?} with the server frozen after a reload to a 5 s op_timeout"
            );
        }
    }
    cluster.servers[0].thaw();
    eprintln!("slowest request while frozen: {slowest:?}");
    // past `retry_after` (1 s): the server is used again
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = get(&node.proxy.url(&pages[0]), &[]).await;
    let again = if again.is_hit() {
        again
    } else {
        get(&node.proxy.url(&pages[0]), &[]).await
    };
    assert!(again.is_hit(), "{:?}", again.cache_status());
    node.proxy.assert_no_panic();
}

/// Attack: while a steady load reads stored pages and a slow request is at the origin, the
/// operator reloads four broken files in turn, each also changing `cache.status_name` and
/// shortening `balancer.timeouts.total` (applied, they would rename every answer's
/// `Cache-Status` and cut slow requests): a bad duration, a total shorter than the connect
/// timeout, a memcached server that is no address (a restart-only key), and an out-of-range
/// `invalidation.retention` (restart-only too). Promise: each is refused whole, `POST /reload`
/// answers 422 naming the key and SIGHUP logs the refusal; nothing changes (the name, the
/// deadline), the request in flight completes, every page stays a hit, no request fails; then a
/// valid file applies both changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_reloads_in_the_middle_of_traffic_change_nothing_and_say_why() {
    let cluster = MemcachedCluster::start(1);
    let origin = scripted_origin();
    let settings = |name: &str, total: &str| {
        format!(
            "[cache]\nstatus_name = \"{name}\"\n[balancer.timeouts]\nconnect = \"500ms\"\n\
             total = \"{total}\"\n"
        )
    };
    let node = cluster.node_with_top_level(&origin, "A", &settings("lacquer", "20s"), "", "");
    let running = config_of(&node.proxy);
    let mut targets = Vec::new();
    for i in 0..10 {
        let url = node.proxy.url(&format!("/refused/{i}?cc=max-age%3D300"));
        let first = get(&url, &[]).await;
        assert!(first.is_stored(), "{url}: {:?}", first.cache_status());
        targets.push((url, first.text()));
    }
    let hits_before = origin.hits();
    let load = SteadyLoad::start(4, targets.clone());
    assert!(load.wait_for(50, BOUND).await);
    let slow = timed(
        "GET",
        node.proxy.url("/refused/slow?sleep=3000&cc=no-store"),
    );
    assert!(origin.wait_for_hits_async(hits_before + 1, BOUND).await);

    let changed = running.replace(&settings("lacquer", "20s"), &settings("renamed", "1s"));
    assert_ne!(changed, running);
    let broken = [
        (
            "balancer.timeouts.total",
            changed.replace("total = \"1s\"", "total = \"banana\""),
        ),
        (
            "balancer.timeouts.total",
            changed.replace("connect = \"500ms\"", "connect = \"2s\""),
        ),
        (
            "cache.memcached.servers",
            with_servers(&changed, &["not an address".to_string()]),
        ),
        (
            "invalidation.retention",
            changed.replace("[invalidation]\n", "[invalidation]\nretention = \"1s\"\n"),
        ),
    ];
    for (i, (key, file)) in broken.iter().enumerate() {
        assert_ne!(file, &changed, "broken file {i} is not broken");
        node.proxy.write_config(file);
        let answer = admin_post(node.admin, "/reload", Some(ADMIN_TOKEN), "").await;
        assert_eq!(
            answer.status,
            422,
            "broken file {i} ({key}): {}",
            answer.text()
        );
        assert!(
            answer.text().contains(key),
            "the refusal does not name {key}: {}",
            answer.text()
        );
        assert!(
            !sighup_with(&node.proxy, file),
            "SIGHUP applied broken file {i} ({key})"
        );
        assert!(
            load.wait_for(20, BOUND).await,
            "the load stalled after refused reload {i}"
        );
        let hit = get(&targets[i].0, &[]).await;
        assert!(hit.is_hit(), "{:?}", hit.cache_status());
        assert!(
            hit.cache_status()
                .unwrap_or_default()
                .starts_with("lacquer"),
            "refused reload {i} ({key}) renamed the cache: {:?}",
            hit.cache_status()
        );
    }
    let (status, _, took) = slow.await.unwrap();
    assert_eq!(
        status,
        Ok(200),
        "the request in flight across refused reloads ({took:?})"
    );
    // the deadline is still 20 s
    let (status, _, took) = timed(
        "GET",
        node.proxy.url("/refused/slow-2?sleep=2000&cc=no-store"),
    )
    .await
    .unwrap();
    assert_eq!(
        status,
        Ok(200),
        "a refused reload cut the deadline ({took:?})"
    );
    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        origin.hits(),
        hits_before + 2,
        "a stored page was fetched again"
    );

    // the valid file applies both
    node.proxy.write_config(&changed);
    let answer = admin_post(node.admin, "/reload", Some(ADMIN_TOKEN), "").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let hit = get(&targets[0].0, &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert!(
        hit.cache_status()
            .unwrap_or_default()
            .starts_with("renamed"),
        "{:?}",
        hit.cache_status()
    );
    let (status, _, took) = timed(
        "GET",
        node.proxy.url("/refused/slow-3?sleep=3000&cc=no-store"),
    )
    .await
    .unwrap();
    assert_eq!(
        status,
        Ok(504),
        "the valid reload's 1 s deadline ({took:?})"
    );
    node.proxy.assert_no_panic();
}
