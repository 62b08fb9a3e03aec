//! Attacks on "a purge is never undone, cluster-wide": three nodes (A, B, C) over two or three
//! real memcached servers, a fill of a URL on A whose request waits at the origin (held there by
//! a gate the test opens), and a purge, a ban or a POST of the URL through B (or A) meanwhile.
//! The answer A then receives was produced before the purge: afterwards no node serves it, from
//! its memory tier or from memcached, and memcached does not keep it; faults (the entry's server
//! frozen, killed and restarted empty, every server frozen while the writer looks at the log)
//! do not change that.
//!
//! Eleven tests failed when written (each comment says how, with the analysis). Those marked
//! `FIXED` pass since: a fill in flight is judged by the bans before a lookup joins it, a
//! revalidation's 304 by the bans issued since its request, a log value begun again after a
//! restart is read from its start, and a write its node could not judge for want of a log read
//! is judged after the next one. Those marked `KNOWN` still fail and are `#[ignore]`d, each
//! naming the bug it shows (the team's notes on the issue list them); run them with
//! `--ignored`.

use lacquer_test_support as support;

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Instant, SystemTime};
use support::*;

/// The site every node serves.
const HOST: &str = "shop.example";
const SITE: [(&str, &str); 1] = [("host", HOST)];
/// Local copies are trusted for 30 s: a node that stops serving something sooner stopped because
/// an invalidation reached it.
const NODE: &str = "local_ttl = \"30s\"";
/// A node reading the cluster's log every 4 s: it learns of a purge through another node only
/// after its own fill in flight has been stored and written.
const SLOW_LOG: &str = "poll_interval = \"4s\"";
/// The bound of every wait for something in the background (a write, a delete, a log read).
const SETTLE: Duration = Duration::from_secs(20);
/// How long a `/stats` counter is waited for.
const STAT_WAIT: Duration = Duration::from_secs(5);
/// What the first answer for a URL starts with: the answer produced before the invalidation.
const OLD: &[u8] = b"body-1.";

/// What the gated origin knows: answers served per path, which ones are held, which are waiting
/// at the gate, and when each request arrived.
#[derive(Default)]
struct GateState {
    served: HashMap<String, usize>,
    held: HashSet<(String, usize)>,
    waiting: HashSet<(String, usize)>,
    received: HashMap<(String, usize), SystemTime>,
}

/// An origin that answers the Nth GET of a path `body-N.late` (`max-age=3600`; tagged `red`
/// when the path starts with `/red/`, varying by `Accept-Language` under `/vary/`; under
/// `/etag/`, fresh for a second with a validator, and a conditional GET answered 304 with an
/// hour), and can hold a given answer at a gate until the test
/// opens it: the request has reached the origin, and its answer waits. A POST is answered
/// `changed`.
struct GatedOrigin {
    origin: TestOrigin,
    state: Arc<(Mutex<GateState>, Condvar)>,
}

impl GatedOrigin {
    /// `pace`: the body's `late` comes that long after its head; `delay`: every head waits that
    /// long (after the gate, if any).
    fn start(pace: Option<Duration>, delay: Option<Duration>) -> GatedOrigin {
        let state: Arc<(Mutex<GateState>, Condvar)> = Arc::default();
        let shared = state.clone();
        let origin = TestOrigin::start(move |req| {
            if req.method == "POST" {
                return OriginResponse::ok("changed");
            }
            let path = req.path.clone();
            let (lock, gate) = &*shared;
            let mut s = lock.lock().unwrap();
            let n = {
                let count = s.served.entry(path.clone()).or_default();
                *count += 1;
                *count
            };
            s.received.insert((path.clone(), n), SystemTime::now());
            let id = (path.clone(), n);
            if s.held.contains(&id) {
                s.waiting.insert(id.clone());
                let deadline = Instant::now() + Duration::from_secs(60);
                while s.held.contains(&id) && Instant::now() < deadline {
                    s = gate.wait_timeout(s, Duration::from_millis(50)).unwrap().0;
                }
                s.waiting.remove(&id);
            }
            drop(s);
            if path.starts_with("/etag/") {
                // a validator, and a second of freshness: revalidated with a conditional GET,
                // which is answered 304 with an hour
                if req.header("if-none-match") == Some("\"v1\"") {
                    return OriginResponse::new(304)
                        .header("etag", "\"v1\"")
                        .header("cache-control", "max-age=3600");
                }
                return OriginResponse::ok(format!("body-{n}.late"))
                    .header("etag", "\"v1\"")
                    .header("cache-control", "max-age=1");
            }
            let first = format!("body-{n}.");
            let mut resp = match pace {
                Some(interval) => OriginResponse::ok(Body::Paced {
                    chunks: vec![Bytes::from(first), Bytes::from_static(b"late")],
                    interval,
                }),
                None => OriginResponse::ok(format!("{first}late")),
            }
            .header("cache-control", "max-age=3600");
            if path.starts_with("/red/") {
                resp = resp.header("surrogate-key", "red");
            }
            if path.starts_with("/vary/") {
                resp = resp.header("vary", "accept-language");
            }
            if let Some(d) = delay {
                resp = resp.delay(d);
            }
            resp
        });
        GatedOrigin { origin, state }
    }

    /// The `n`th GET of `path` will wait at the gate.
    fn hold(&self, path: &str, n: usize) {
        self.state
            .0
            .lock()
            .unwrap()
            .held
            .insert((path.to_string(), n));
    }

    /// Waits (bounded) until the `n`th GET of `path` has reached the origin and waits at the gate.
    async fn wait_held(&self, path: &str, n: usize) {
        let id = (path.to_string(), n);
        let arrived = poll_until_async(SETTLE, || {
            self.state.0.lock().unwrap().waiting.contains(&id)
        })
        .await;
        assert!(arrived, "GET {n} of {path} never reached the origin");
    }

    /// Opens the gate of the `n`th GET of `path`.
    fn release(&self, path: &str, n: usize) {
        let (lock, gate) = &*self.state;
        lock.lock().unwrap().held.remove(&(path.to_string(), n));
        gate.notify_all();
    }

    /// How many GETs of `path` reached the origin.
    fn served(&self, path: &str) -> usize {
        self.state
            .0
            .lock()
            .unwrap()
            .served
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// When the `n`th GET of `path` reached the origin.
    fn received(&self, path: &str, n: usize) -> Option<SystemTime> {
        self.state
            .0
            .lock()
            .unwrap()
            .received
            .get(&(path.to_string(), n))
            .copied()
    }
}

/// Three nodes over `servers` memcached servers, in front of one gated origin.
struct Three {
    cluster: MemcachedCluster,
    origin: GatedOrigin,
    a: Node,
    b: Node,
    c: Node,
}

impl Three {
    /// A reads the log as `a_invalidation` says (empty: the default, every 250 ms).
    fn start(servers: usize, a_invalidation: &str, origin: GatedOrigin) -> Three {
        Three::start_with(servers, "", a_invalidation, origin)
    }

    /// [`Three::start`] with `a_top` (TOML before A's sections, e.g. a `[proxy]` section).
    fn start_with(servers: usize, a_top: &str, a_invalidation: &str, origin: GatedOrigin) -> Three {
        Three::start_with_a_memcached(servers, a_top, a_invalidation, NODE, origin)
    }

    /// [`Three::start_with`] with A's own `[cache.memcached]` keys (`a_memcached`).
    fn start_with_a_memcached(
        servers: usize,
        a_top: &str,
        a_invalidation: &str,
        a_memcached: &str,
        origin: GatedOrigin,
    ) -> Three {
        let cluster = MemcachedCluster::start(servers);
        let a =
            cluster.node_with_top_level(&origin.origin, "A", a_top, a_invalidation, a_memcached);
        let b = cluster.node(&origin.origin, "B", NODE);
        let c = cluster.node(&origin.origin, "C", NODE);
        Three {
            cluster,
            origin,
            a,
            b,
            c,
        }
    }

    /// The memcached server `path`'s entry lives on.
    fn owner(&self, path: &str) -> usize {
        self.cluster
            .server_for(&MemcachedCluster::key_of(HOST, path))
    }

    /// Whether memcached's entry for `path` holds `bytes` right now (a frozen owner: no).
    fn holds(&self, path: &str, bytes: &[u8]) -> bool {
        let key = MemcachedCluster::key_of(HOST, path);
        self.cluster.servers[self.owner(path)]
            .get_raw(&key)
            .is_some_and(|raw| raw.windows(bytes.len()).any(|w| w == bytes))
    }

    /// A GET of `path` through A, sent now and answered when the origin answers.
    fn get_through_a(&self, path: &str) -> tokio::task::JoinHandle<Resp> {
        let url = self.a.proxy.url(path);
        tokio::spawn(async move { get(&url, &SITE).await })
    }

    /// Waits (bounded) until no node has a write to memcached in flight.
    async fn writes_done(&self, nodes: &[&Node]) {
        for node in nodes {
            assert_eq!(
                wait_for_stat_at_most(node.admin, "background_writes", 0, SETTLE).await,
                0,
                "{}: writes still in flight",
                node.name
            );
        }
    }

    /// Waits (bounded) until memcached no longer holds the old answer for `path`.
    async fn memcached_drops_the_old_answer(&self, path: &str, what: &str) {
        let gone = poll_until_async(SETTLE, || !self.holds(path, OLD)).await;
        assert!(
            gone,
            "memcached keeps {what} for {path}: every node serves it once the ban is forgotten"
        );
    }
}

/// Asserts that each of `nodes` answers a GET of `path` with a `200` other than the old answer.
async fn none_serves_the_old_answer(nodes: &[&Node], path: &str, what: &str) {
    for node in nodes {
        let resp = get(&node.proxy.url(path), &SITE).await;
        assert_eq!(resp.status, 200, "{}: {}", node.name, resp.text());
        assert!(
            !resp.body.starts_with(OLD),
            "{} served {what} for {path}: {:?}",
            node.name,
            resp.text()
        );
    }
}

/// [`none_serves_the_old_answer`] a few times over two seconds (a copy read again from memcached,
/// or promoted late, shows up only on a later read).
async fn none_serves_it_for_a_while(nodes: &[&Node], path: &str, what: &str) {
    for _ in 0..4 {
        none_serves_the_old_answer(nodes, path, what).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn json(resp: &Resp) -> Value {
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", resp.status, resp.text()))
}

/// A purge of `path` through `node`'s admin API (`wait`: for the other nodes to confirm);
/// returns its report. A purge whose delete or publication missed a server answers 202.
async fn purge_via(node: &Node, path: &str, wait: bool) -> Value {
    let body = format!(r#"{{"url": "http://{HOST}{path}", "by": "test", "wait": {wait}}}"#);
    let answer = admin_post(node.admin, "/purge", Some(ADMIN_TOKEN), &body).await;
    assert!(
        answer.status == 200 || answer.status == 202,
        "{}",
        answer.text()
    );
    json(&answer)
}

/// A ban (`body`, the admin API's JSON) through `node`; returns its report.
async fn ban_via(node: &Node, body: &str) -> Value {
    let answer = admin_post(node.admin, "/ban", Some(ADMIN_TOKEN), body).await;
    assert!(
        answer.status == 200 || answer.status == 202,
        "{}",
        answer.text()
    );
    json(&answer)
}

/// The body of a GET answered through `node`'s proxy.
async fn body_of(answer: tokio::task::JoinHandle<Resp>, who: &str) -> Bytes {
    let resp = within(SETTLE, who, answer).await.expect("the GET's task");
    assert_eq!(resp.status, 200, "{who}: {}", resp.text());
    resp.body
}

// ---------------------------------------------------------------------------------------------
// A purge through B while A's request waits at the origin
// ---------------------------------------------------------------------------------------------

/// The plain case on three nodes: A's request waits at the origin, the purge goes through B and
/// reaches every node before the origin answers; A's client gets the answer it asked for, which
/// is then neither kept in memcached nor served by any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_through_b_while_as_request_waits_at_the_origin_is_served_by_no_node() {
    let t = Three::start(3, "", GatedOrigin::start(None, None));
    let path = "/waiting";
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    let report = purge_via(&t.b, path, true).await;
    assert_eq!(report["complete"], true, "{report}");
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    t.writes_done(&[&t.a, &t.b, &t.c]).await;
    t.memcached_drops_the_old_answer(path, "the answer from before the purge")
        .await;
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c],
        path,
        "the answer from before the purge",
    )
    .await;
}

/// The same when A reads the log only every 4 s: it stores and writes its fill before it learns
/// of the purge, and must take the entry out of memcached once it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_written_before_its_node_learns_of_the_purge_is_taken_out_of_memcached() {
    let t = Three::start(3, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/waiting-slow-log";
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    let writes = admin_stat(t.a.admin, "writes").await;
    purge_via(&t.b, path, false).await;
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    assert_eq!(
        wait_for_stat(t.a.admin, "writes", writes + 1, SETTLE).await,
        writes + 1,
        "A wrote its fill (the scenario: it did not know of the purge yet)"
    );
    t.memcached_drops_the_old_answer(path, "the answer from before the purge")
        .await;
    // A has read the log by now (it deleted the entry after a read); B and C read it often
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c],
        path,
        "the answer from before the purge",
    )
    .await;
}

/// A GET that reaches A after the purge (through B, confirmed by every node, A included) while
/// A's earlier request still waits at the origin waits for that request's fill (Pingora's cache
/// lock), and is not served its answer, produced before the purge: the fill is refused when
/// stored, and the waiter then fetches for itself. (Checked: without the purge it is served the
/// first answer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_after_the_purge_is_not_served_the_fill_its_node_was_waiting_for() {
    let t = Three::start(3, "", GatedOrigin::start(None, None));
    let path = "/waited-for";
    t.origin.hold(path, 1);
    let first = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    // every node has written its first heartbeat (after its first read of the log), so B's
    // purge waits for each: on a loaded machine C's could come after the purge, and B would not
    // know of C (CI, 2026-12-06)
    for node in [&t.a, &t.c] {
        assert!(
            wait_for_stat(node.admin, "polls", 2, Duration::from_secs(20)).await >= 2,
            "{} never read the log twice",
            node.name
        );
    }
    let report = purge_via(&t.b, path, true).await;
    assert_eq!(
        report["nodes"]["reached"],
        serde_json::json!(["A", "C"]),
        "{report}"
    );
    // asked after the purge reached A: it finds A's fill of the URL in flight and waits for it
    let second = t.get_through_a(path);
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.origin.release(path, 1);
    assert!(body_of(first, "A's first GET").await.starts_with(OLD));
    let second = body_of(second, "A's GET after the purge").await;
    assert!(
        !second.starts_with(OLD),
        "a GET sent after the purge was served the answer from before it: {second:?} \
         (origin served {} GETs)",
        t.origin.served(path)
    );
}

/// The same with the purge through A itself (a PURGE request): the fill of the URL it aborts does
/// not exist yet, its request still waiting at the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_after_a_purge_through_the_filling_node_is_not_served_the_fill_in_flight() {
    let t = Three::start(2, "", GatedOrigin::start(None, None));
    let path = "/waited-for-here";
    t.origin.hold(path, 1);
    let first = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    // 404: nothing of it was stored (the purge is carried out all the same)
    let purged = request("PURGE", &t.a.proxy.url(path), &SITE, None).await;
    assert!(
        purged.status == 200 || purged.status == 404,
        "{}",
        purged.text()
    );
    let second = t.get_through_a(path);
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.origin.release(path, 1);
    assert!(body_of(first, "A's first GET").await.starts_with(OLD));
    let second = body_of(second, "A's GET after the purge").await;
    assert!(
        !second.starts_with(OLD),
        "a GET sent after the PURGE was served the answer from before it: {second:?}"
    );
    t.writes_done(&[&t.a]).await;
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c],
        path,
        "the answer from before the purge",
    )
    .await;
}

/// The control of the two above: once the fill's head has arrived, a purge aborts the fill in
/// flight, and a GET after it is not served from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_after_a_purge_mid_body_is_not_served_the_aborted_fill() {
    let t = Three::start(
        2,
        "",
        GatedOrigin::start(Some(Duration::from_secs(2)), None),
    );
    let path = "/mid-body";
    let first = head_of(&t.a, path).await;
    purge_via(&t.b, path, true).await;
    let second = get(&t.a.proxy.url(path), &SITE).await;
    assert!(
        !second.body.starts_with(OLD),
        "a GET after the purge was served the aborted fill: {:?}",
        second.text()
    );
    drop(first);
    t.writes_done(&[&t.a, &t.b]).await;
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c],
        path,
        "the answer from before the purge",
    )
    .await;
}

/// A GET of `path` through `node` whose `200` head has arrived; its body is the caller's to read.
async fn head_of(node: &Node, path: &str) -> reqwest::Response {
    let response = http_client()
        .get(node.proxy.url(path))
        .header("host", HOST)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path} through {}: {e}", node.name));
    assert_eq!(response.status(), 200);
    response
}

// ---------------------------------------------------------------------------------------------
// The same with memcached failing
// ---------------------------------------------------------------------------------------------

/// The entry's server is frozen for the purge and for A's write, and thaws after: A's write,
/// queued in the frozen server's socket, lands then, and the purge's delete is retried. Neither
/// A, B, C nor a node started afterwards serves the answer from before the purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_while_the_entrys_server_is_frozen_is_not_undone_by_the_write_that_lands_at_thaw() {
    let t = Three::start(3, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/frozen-owner";
    let owner = t.owner(path);
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    t.cluster.servers[owner].freeze();
    let report = purge_via(&t.b, path, false).await;
    assert_eq!(report["complete"], false, "{report}");
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    // A's write times out (the server is frozen), and may land when it thaws
    assert!(wait_for_stat(t.a.admin, "write_failures", 1, SETTLE).await >= 1);
    t.cluster.servers[owner].thaw();
    t.writes_done(&[&t.a, &t.b, &t.c]).await;
    assert_eq!(
        wait_for_stat_at_most(t.b.admin, "pending_deletes", 0, SETTLE).await,
        0
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let d = t.cluster.node(&t.origin.origin, "D", NODE);
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c, &d],
        path,
        "the answer from before the purge",
    )
    .await;
    // and if the thawed server holds it (whatever the order of the late write and the retried
    // delete), the purge is kept for the whole retention
    if t.holds(path, OLD) {
        assert!(
            (0..3).any(|s| t.cluster.log_names(s, path, false)),
            "the old answer is in memcached and its purge will be forgotten"
        );
    }
}

/// The entry's server is killed during the purge (its delete fails) and restarted empty before A's
/// answer arrives: A's write lands on the empty server, and stays there only with the purge kept
/// for the whole retention; no node serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_while_the_entrys_server_is_down_is_not_undone_when_it_restarts_empty() {
    let mut t = Three::start(3, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/killed-owner";
    let owner = t.owner(path);
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    t.cluster.servers[owner].kill();
    purge_via(&t.b, path, false).await;
    t.cluster.servers[owner].restart();
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    t.writes_done(&[&t.a, &t.b, &t.c]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    if t.holds(path, OLD) {
        assert!(
            (0..3)
                .filter(|&s| s != owner)
                .any(|s| t.cluster.log_names(s, path, false)),
            "the old answer is in memcached and its purge will be forgotten"
        );
    }
    let d = t.cluster.node(&t.origin.origin, "D", NODE);
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c, &d],
        path,
        "the answer from before the purge",
    )
    .await;
}

/// The purge's delete is answered (a short-lived purge), then the entry's server is killed and
/// restarted empty, losing its copy of the log, before A's answer arrives and is written there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_written_to_a_server_restarted_after_the_purge_does_not_outlive_the_purge() {
    let mut t = Three::start(3, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/restarted-after-purge";
    let owner = t.owner(path);
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    let report = purge_via(&t.b, path, false).await;
    assert_eq!(report["complete"], true, "{report}");
    t.cluster.servers[owner].restart();
    let writes = admin_stat(t.a.admin, "writes").await;
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    assert_eq!(
        wait_for_stat(t.a.admin, "writes", writes + 1, SETTLE).await,
        writes + 1,
        "A's fill landed on the restarted server"
    );
    t.memcached_drops_the_old_answer(path, "the answer from before the purge")
        .await;
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c],
        path,
        "the answer from before the purge",
    )
    .await;
}

/// The servers the log lives on, other than the entry's, are frozen for the purge: its
/// publication reaches the entry's server only, and the purge is kept for the whole retention
/// and published again when they thaw; no node serves the old answer, nor does one started then.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_published_to_one_server_only_still_reaches_every_node_and_holds() {
    let t = Three::start(3, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/log-frozen";
    let owner = t.owner(path);
    let others: Vec<usize> = (0..3).filter(|&s| s != owner).collect();
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    for &s in &others {
        t.cluster.servers[s].freeze();
    }
    let report = purge_via(&t.b, path, false).await;
    assert_eq!(
        report["memcached"]["published_to"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    for &s in &others {
        t.cluster.servers[s].thaw();
    }
    t.writes_done(&[&t.a, &t.b, &t.c]).await;
    t.memcached_drops_the_old_answer(path, "the answer from before the purge")
        .await;
    let d = t.cluster.node(&t.origin.origin, "D", NODE);
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c, &d],
        path,
        "the answer from before the purge",
    )
    .await;
}

/// Three nodes over three servers, A reading the log every 4 s and filling without a fill
/// lease (`fill_lease = "0"`): a purge then finds no lease, so it is short-lived and no node is
/// told a fill is in flight; A's own judging of its write (`TieredStorage::judge_written`) and
/// the comparison of what it writes are all that stand between its late answer and the
/// cluster. (With a lease, the purge is long-lived and the leased fill refused by its own node:
/// `FillLeases::lost`.)
fn unleased_a(origin: GatedOrigin) -> Three {
    Three::start_with_a_memcached(
        3,
        "",
        SLOW_LOG,
        &format!("{NODE}\nfill_lease = \"0\""),
        origin,
    )
}

/// Sets the scene of the log-frozen-after-the-write attack: A (reading the log every 4 s) fills
/// `path`, its request waiting at the origin while the purge goes through B (its delete answered:
/// short-lived); A stores and writes the answer before it reads the log, and every server then
/// freezes for longer than A waits for a log read to judge its write by (two `op_timeout`s and
/// three poll intervals), then thaws.
async fn written_then_log_frozen(t: &Three, path: &str) {
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    let report = purge_via(&t.b, path, false).await;
    assert_eq!(report["complete"], true, "{report}");
    assert!(
        (0..t.cluster.servers.len()).all(|s| t.cluster.log_names(s, path, true)),
        "the purge is published short-lived (its delete was answered)"
    );
    let writes = admin_stat(t.a.admin, "writes").await;
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    assert_eq!(
        wait_for_stat(t.a.admin, "writes", writes + 1, SETTLE).await,
        writes + 1,
        "A wrote its fill (the scenario: it did not know of the purge yet)"
    );
    for server in &t.cluster.servers {
        server.freeze();
    }
    // A gives up waiting for a log read after 2 x 200 ms + 3 x 4 s
    tokio::time::sleep(Duration::from_secs(14)).await;
    for server in &t.cluster.servers {
        server.thaw();
    }
    t.writes_done(&[&t.a]).await;
    // every node has read the log again since
    tokio::time::sleep(Duration::from_secs(6)).await;
}

/// FIXED (failed when written): A's fill from before the purge is written to memcached after
/// the purge's delete; A would judge it once it has read the log (`TieredStorage::judge_written`),
/// but every server freezes right after the write, longer than A waits for that read. A gave up,
/// judged by a ban list that did not know the purge yet, and left the entry. The purge, published
/// short-lived (its delete was answered), was forgotten by every node after `SHORT_RETENTION`
/// (5 min), while the entry stayed for its hour: then every node served the answer from before
/// the purge (see the `#[ignore]`d test below, which waits for it).
/// Cause: `judge_written`, after `wait_log_read_from` timed out (no log read since the write),
/// went on as if the list were complete. Now such a write is kept unjudged
/// (`TieredStorage::judge_later`, counted `writes_judged_late`) and judged after the next log
/// read that gets an answer: found banned, it is deleted and its purge kept for the whole
/// retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_its_node_could_not_judge_for_a_frozen_log_does_not_outlive_a_short_lived_purge() {
    let t = unleased_a(GatedOrigin::start(None, None));
    let path = "/log-frozen-after-write";
    written_then_log_frozen(&t, path).await;
    assert!(
        admin_stat(t.a.admin, "writes_judged_late").await >= 1,
        "A gave up waiting for a log read to judge its write by (the scenario)"
    );
    let kept = (0..3).any(|s| t.cluster.log_names(s, path, false));
    assert!(
        !t.holds(path, OLD) || kept,
        "the answer from before the purge stays in memcached (its hour), while the purge is kept \
         short-lived only (5 minutes): every node will serve it again (A's written_then_banned: \
         {}, purges_kept: {})",
        admin_stat(t.a.admin, "written_then_banned").await,
        admin_stat(t.a.admin, "purges_kept").await
    );
}

/// The consequence of the one above, waited for: five and a half minutes after the purge, B and
/// C (which never fetched the URL) served the answer from before it, from memcached (FIXED with
/// it: they now fetch a new one). Slow: run with `--ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "waits 6 minutes for the short-lived purge to be forgotten"]
async fn a_purge_is_not_undone_six_minutes_later_by_a_write_judged_without_the_log() {
    let t = unleased_a(GatedOrigin::start(None, None));
    let path = "/log-frozen-six-minutes";
    written_then_log_frozen(&t, path).await;
    // (nothing asks for the URL meanwhile: a miss would refetch it and write over the entry)
    tokio::time::sleep(Duration::from_secs(330)).await;
    none_serves_the_old_answer(&[&t.b, &t.c], path, "the answer from before the purge").await;
}

// ---------------------------------------------------------------------------------------------
// Fills landing out of order
// ---------------------------------------------------------------------------------------------

/// FIXED (failed when written): after the purge through B, C fetches the URL anew and writes
/// the new answer to memcached; then A's answer from before the purge arrives, and A (which has
/// not read the log yet) wrote it over C's with a plain `set`. A then deleted it once it read the
/// log, so no node served the old answer, but C's new one was gone from memcached: every other
/// node fetched the URL again. Now `TieredStorage::write_entry` adds, and when the key holds
/// something compares it: C's answer is validated after A's (its request was sent later), and
/// stays (A counts its write `writes_superseded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_fill_from_before_the_purge_does_not_replace_the_newer_answer_in_memcached() {
    let t = unleased_a(GatedOrigin::start(None, None));
    let path = "/out-of-order";
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    let learned = admin_stat(t.a.admin, "learned").await;
    purge_via(&t.b, path, false).await;
    // C has read the log (every 250 ms) once its purge count says so
    tokio::time::sleep(Duration::from_secs(1)).await;
    let new = get(&t.c.proxy.url(path), &SITE).await;
    assert!(new.body.starts_with(b"body-2."), "{:?}", new.text());
    assert!(
        poll_until_async(SETTLE, || t.holds(path, b"body-2.")).await,
        "C's new answer was written"
    );
    t.writes_done(&[&t.c]).await;
    let tried = writes_tried(&t.a).await;
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    let deadline = Instant::now() + SETTLE;
    while writes_tried(&t.a).await < tried + 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        writes_tried(&t.a).await,
        tried + 1,
        "A tried to write its fill (the scenario: it did not know of the purge yet)"
    );
    t.writes_done(&[&t.a]).await;
    t.memcached_drops_the_old_answer(path, "A's late answer from before the purge")
        .await;
    // A serves its own copy until it learns of the purge (within its 4 s poll interval)
    assert!(
        wait_for_stat(t.a.admin, "learned", learned + 1, SETTLE).await > learned,
        "A read the purge from the log"
    );
    // before any other node asks again (a miss would write a third answer)
    let newer_kept = t.holds(path, b"body-2.");
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c],
        path,
        "the answer from before the purge",
    )
    .await;
    let from_c = get(&t.c.proxy.url(path), &SITE).await;
    assert!(
        from_c.body.starts_with(b"body-2."),
        "C serves its new answer"
    );
    assert!(
        newer_kept,
        "A's late answer from before the purge replaced C's newer one in memcached (then A \
         deleted it: written_then_banned {}); the origin served {} GETs",
        admin_stat(t.a.admin, "written_then_banned").await,
        t.origin.served(path)
    );
}

/// The writes to memcached `node` has carried out or found superseded by a newer answer there
/// (a counter a build without it lacks counts none).
async fn writes_tried(node: &Node) -> u64 {
    let stats = get(&format!("http://127.0.0.1:{}/stats", node.admin), &[]).await;
    let text = stats.text();
    let count = |key: &str| {
        if text.contains(&format!("\"{key}\":")) {
            stat_in(&text, key)
        } else {
            0
        }
    };
    count("writes") + count("writes_superseded")
}

/// Purges sprayed around the moment fills' requests go out: GETs through A and purges of the
/// same URLs through B, thirty URLs, the origin taking 50 ms to answer. Every other purge is sent
/// 10 ms later than the one before after its GET (0 to 140 ms: before A has sent the request on,
/// around then, and while it waits at the origin); the others as soon as the origin has the
/// request (within ten milliseconds of it). For every URL whose first GET reached the origin before
/// its purge was even sent, that answer is from before the purge: afterwards no node serves it
/// and memcached does not keep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purges_sent_with_the_fills_requests_leave_no_older_answer_anywhere() {
    let t = Three::start(
        3,
        "",
        GatedOrigin::start(None, Some(Duration::from_millis(50))),
    );
    let origin = t.origin.state.clone();
    let paths: Vec<String> = (0..30).map(|i| format!("/spray/{i}")).collect();
    let mut tasks = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let url = t.a.proxy.url(path);
        let admin = t.b.admin;
        let purge = format!(r#"{{"url": "http://{HOST}{path}", "wait": false}}"#);
        let (origin, id) = (origin.clone(), (path.clone(), 1));
        let (after_receipt, lag) = match i % 2 {
            0 => (false, Duration::from_millis(i as u64 * 5)),
            _ => (true, Duration::from_micros((i as u64 % 5) * 300)),
        };
        tasks.push(tokio::spawn(async move {
            let fill = tokio::spawn(async move { get(&url, &SITE).await });
            if after_receipt {
                let received = poll_until_async(SETTLE, || {
                    origin.0.lock().unwrap().received.contains_key(&id)
                })
                .await;
                assert!(received, "A's GET never reached the origin");
            }
            tokio::time::sleep(lag).await;
            let sent = SystemTime::now();
            let purged = admin_post(admin, "/purge", Some(ADMIN_TOKEN), &purge).await;
            assert!(purged.status == 200 || purged.status == 202);
            let filled = fill.await.unwrap();
            assert_eq!(filled.status, 200);
            sent
        }));
    }
    let mut purge_sent = Vec::new();
    for task in tasks {
        purge_sent.push(within(SETTLE, "a GET and its purge", task).await.unwrap());
    }
    t.writes_done(&[&t.a, &t.b, &t.c]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut older = 0;
    for (path, sent) in paths.iter().zip(purge_sent) {
        let before = t.origin.received(path, 1).is_some_and(|at| at < sent);
        if !before {
            continue;
        }
        older += 1;
        assert!(
            !t.holds(path, OLD),
            "memcached keeps {path}'s answer from before its purge"
        );
        none_serves_the_old_answer(
            &[&t.a, &t.b, &t.c],
            path,
            "the answer from before the purge",
        )
        .await;
    }
    eprintln!("{older} of 30 fills reached the origin before their purge was sent");
    assert!(
        older > 0,
        "no fill reached the origin before its purge was sent: the scenario did not happen"
    );
}

// ---------------------------------------------------------------------------------------------
// A POST through B while A's GET fill is in flight
// ---------------------------------------------------------------------------------------------

/// A POST through B while A's request waits at the origin and the entry's server (which holds
/// A's fill lease) is frozen: B cannot tell whether a fill is in flight, and tells every node
/// all the same; A's answer from before the POST is not kept or served once it thaws.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_while_the_fill_leases_server_is_frozen_still_invalidates_the_fill_in_flight() {
    let t = Three::start(3, "", GatedOrigin::start(None, None));
    let path = "/posted-frozen";
    let owner = t.owner(path);
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    t.cluster.servers[owner].freeze();
    let posted = post(&t.b.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    t.cluster.servers[owner].thaw();
    t.writes_done(&[&t.a, &t.b, &t.c]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    t.memcached_drops_the_old_answer(path, "the page as it was before the POST")
        .await;
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c],
        path,
        "the page as it was before the POST",
    )
    .await;
}

/// FIXED (failed when written): the entry's server is killed and restarted empty while A's
/// request waits at the origin: A's fill lease is gone with it. A POST through B then finds
/// nothing stored and no lease, so its invalidation is not published
/// (`Request::only_if_stored`, `invalidation::Invalidator::carry_out`: `nothing_stored` from a
/// delete answered `not_found` and no lease found); A stored its answer from before the POST,
/// wrote it to memcached, and every node served it for its hour. Since, a fill whose lease is
/// found gone (by its renewal, or by the delete after its write) is not kept: A purges the URL
/// on itself alone (`storage::fill_lease`, **Loss**; `FillLeases::lost`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_after_the_entrys_server_restarted_empty_still_invalidates_the_fill_in_flight() {
    let mut t = Three::start(3, "", GatedOrigin::start(None, None));
    let path = "/posted-restarted";
    let owner = t.owner(path);
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    t.cluster.servers[owner].restart();
    let posted = post(&t.b.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    // A's pooled connections to the restarted server fail once: it writes to it again (another
    // page on that server) before its fill ends
    let on_owner: Vec<String> = (0..1000)
        .map(|i| format!("/elsewhere/{i}"))
        .filter(|p| t.owner(p) == owner)
        .take(20)
        .collect();
    let mut reconnected = false;
    for p in &on_owner {
        assert_eq!(get(&t.a.proxy.url(p), &SITE).await.status, 200);
        if poll_until_async(Duration::from_secs(2), || t.holds(p, b"body-1.")).await {
            reconnected = true;
            break;
        }
    }
    assert!(reconnected, "A never wrote to the restarted server");
    let writes = admin_stat(t.a.admin, "writes").await;
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    t.writes_done(&[&t.a, &t.b, &t.c]).await;
    eprintln!(
        "A: writes {} -> {}, write_failures {}, fill_leases_lost {}, memcached holds the old \
         page: {}",
        writes,
        admin_stat(t.a.admin, "writes").await,
        admin_stat(t.a.admin, "write_failures").await,
        admin_stat(t.a.admin, "fill_leases_lost").await,
        t.holds(path, OLD)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let published = (0..3).any(|s| t.cluster.log_names(s, path, true))
        || (0..3).any(|s| t.cluster.log_names(s, path, false));
    let kept = t.holds(path, OLD);
    // C first: B keeps the invalidation for itself (it refuses the entry, and its refetch would
    // replace it in memcached)
    let mut served = Vec::new();
    for node in [&t.c, &t.a, &t.b] {
        if get(&node.proxy.url(path), &SITE)
            .await
            .body
            .starts_with(OLD)
        {
            served.push(node.name.clone());
        }
    }
    assert!(
        served.is_empty() && !kept,
        "the page as it was before the POST is served by {served:?} and kept in memcached: \
         {kept} (the POST's invalidation published: {published})"
    );
}

// ---------------------------------------------------------------------------------------------
// Tag and prefix bans instead of URL purges
// ---------------------------------------------------------------------------------------------

/// A tag ban through B while A's request for a page with that tag waits at the origin (the tag
/// is known only from the answer's head): the page is judged when stored and when written, and
/// served by no node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tag_ban_while_as_request_waits_at_the_origin_covers_its_answer_everywhere() {
    let t = Three::start(3, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/red/waiting";
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    ban_via(&t.b, r#"{"tag": "red", "wait": false}"#).await;
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    t.writes_done(&[&t.a]).await;
    t.memcached_drops_the_old_answer(path, "the page from before the tag ban")
        .await;
    let d = t.cluster.node(&t.origin.origin, "D", NODE);
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c, &d],
        path,
        "the page from before the tag ban",
    )
    .await;
}

/// A prefix ban through B while A's request waits at the origin, with the entry's server frozen
/// until A's write has timed out (it lands at thaw): no node serves the page, nor one started
/// after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prefix_ban_while_the_entrys_server_is_frozen_covers_the_write_landing_at_thaw() {
    let t = Three::start(3, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/sale/waiting";
    let owner = t.owner(path);
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    t.cluster.servers[owner].freeze();
    ban_via(
        &t.b,
        &format!(r#"{{"host": "{HOST}", "prefix": "/sale/", "wait": false}}"#),
    )
    .await;
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    assert!(wait_for_stat(t.a.admin, "write_failures", 1, SETTLE).await >= 1);
    t.cluster.servers[owner].thaw();
    t.writes_done(&[&t.a, &t.b, &t.c]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let d = t.cluster.node(&t.origin.origin, "D", NODE);
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c, &d],
        path,
        "the page from before the prefix ban",
    )
    .await;
}

/// FIXED (failed when written): a tag ban through B, confirmed by every node, while A streams a tagged
/// page from the origin (its head arrived before the ban, its body still coming): a GET through
/// A after the ban joins that fill in flight and is served the page from before the ban. A URL
/// purge aborts the fills of its URL (`MemoryTier::invalidate`: `fills.abort`); a tag, host or
/// prefix ban does not (`src/storage/memory/mod.rs:367-369`, the abort only for `Scope::Url`),
/// and `MemoryTier::lookup_key` serves an in-flight fill without judging it by the ban list
/// (`src/storage/memory/mod.rs:478`). The fill is refused when it ends, so this lasts as long as
/// the origin takes to send the rest of the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_after_a_tag_ban_is_not_served_the_tagged_fill_in_flight() {
    let t = Three::start(
        2,
        "",
        GatedOrigin::start(Some(Duration::from_secs(3)), None),
    );
    let path = "/red/streaming";
    let first = head_of(&t.a, path).await;
    let report = ban_via(&t.b, r#"{"tag": "red"}"#).await;
    assert_eq!(
        report["nodes"]["reached"],
        serde_json::json!(["A", "C"]),
        "{report}"
    );
    let second = get(&t.a.proxy.url(path), &SITE).await;
    assert!(
        !second.body.starts_with(OLD),
        "a GET after the tag ban was served the page from before it, from the fill in flight: \
         {:?}",
        second.text()
    );
    drop(first);
}

/// FIXED (failed when written): the same with a prefix ban (same cause).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_after_a_prefix_ban_is_not_served_the_fill_in_flight_under_it() {
    let t = Three::start(
        2,
        "",
        GatedOrigin::start(Some(Duration::from_secs(3)), None),
    );
    let path = "/sale/streaming";
    let first = head_of(&t.a, path).await;
    ban_via(
        &t.b,
        &format!(r#"{{"host": "{HOST}", "prefix": "/sale/"}}"#),
    )
    .await;
    let second = get(&t.a.proxy.url(path), &SITE).await;
    assert!(
        !second.body.starts_with(OLD),
        "a GET after the prefix ban was served the page from before it, from the fill in \
         flight: {:?}",
        second.text()
    );
    drop(first);
}

// ---------------------------------------------------------------------------------------------
// Variants, and a soft purge during a revalidation
// ---------------------------------------------------------------------------------------------

/// A purge of a URL whose answer varies (`Vary: Accept-Language`), through B and confirmed by
/// every node, while A streams the French variant from the origin: a French GET through A after
/// the purge is not served the variant from before it (a URL purge aborts the fills of the URL,
/// and a variant's fill is one of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_after_a_purge_is_not_served_a_variant_fill_in_flight() {
    let t = Three::start(
        2,
        "",
        GatedOrigin::start(Some(Duration::from_secs(3)), None),
    );
    let path = "/vary/streaming";
    let french = [("host", HOST), ("accept-language", "fr")];
    let first = http_client()
        .get(t.a.proxy.url(path))
        .header("host", HOST)
        .header("accept-language", "fr")
        .send()
        .await
        .expect("A's first GET");
    assert_eq!(first.status(), 200);
    let report = purge_via(&t.b, path, true).await;
    assert_eq!(
        report["nodes"]["reached"],
        serde_json::json!(["A", "C"]),
        "{report}"
    );
    let second = get(&t.a.proxy.url(path), &french).await;
    assert!(
        !second.body.starts_with(OLD),
        "a GET after the purge was served the variant from before it, from the fill in flight: \
         {:?}",
        second.text()
    );
    let first = first.bytes().await.expect("A's first body");
    assert!(first.starts_with(OLD));
    t.writes_done(&[&t.a]).await;
    for node in [&t.a, &t.b, &t.c] {
        let resp = get(&node.proxy.url(path), &french).await;
        assert!(
            !resp.body.starts_with(OLD),
            "{} served the variant from before the purge",
            node.name
        );
    }
}

/// FIXED (failed when written): a soft purge through B (confirmed by every node) while A revalidates its
/// stale copy at the origin: the origin's 304 was produced before the soft purge, and must not
/// count as a revalidation after it. The next GET through each node is revalidated again (or
/// served stale while it is), never served fresh as if the soft purge had not happened. C, which
/// reads the entry A wrote back, judges it right (dated by the revalidation's request, before the
/// soft purge: stale); A serves it from its memory tier as a fresh hit (`ttl=3599`, no request
/// to the origin) until its copy's `local_ttl` runs out. Cause: `MemoryTier::update_meta`
/// (`src/storage/memory/mod.rs:588`, the `*object.meta.write() = updated` at :614, and the
/// re-insert path above it) replaces the softened meta with the 304's without judging it by the
/// ban list, as `insert` does for a fill; the memory tier's hits never consult the bans.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_304_to_a_revalidation_sent_before_a_soft_purge_does_not_make_the_entry_fresh_again() {
    let t = Three::start(3, "", GatedOrigin::start(None, None));
    let path = "/etag/page";
    let stored = get(&t.a.proxy.url(path), &SITE).await;
    assert!(stored.is_stored(), "{:?}", stored.cache_status());
    assert!(
        poll_until_async(SETTLE, || t.holds(path, OLD)).await,
        "the page was written to memcached"
    );
    // stale after its second; the revalidation A sends is held at the origin
    tokio::time::sleep(Duration::from_millis(1500)).await;
    t.origin.hold(path, 2);
    let revalidating = t.get_through_a(path);
    t.origin.wait_held(path, 2).await;
    let body = format!(r#"{{"url": "http://{HOST}{path}", "soft": true}}"#);
    let answer = admin_post(t.b.admin, "/purge", Some(ADMIN_TOKEN), &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        json(&answer)["nodes"]["reached"],
        serde_json::json!(["A", "C"])
    );
    t.origin.release(path, 2);
    let revalidated = within(SETTLE, "A's revalidation", revalidating)
        .await
        .unwrap();
    assert!(revalidated.body.starts_with(OLD));
    t.writes_done(&[&t.a]).await;
    // C first: it reads the entry A wrote back after the 304 (a node revalidating after the
    // soft purge would write a legitimately fresh one)
    let mut fresh = Vec::new();
    for node in [&t.c, &t.a] {
        let before = t.origin.served(path);
        let resp = get(&node.proxy.url(path), &SITE).await;
        assert!(resp.body.starts_with(OLD), "a 304 keeps the stored body");
        let fresh_hit = resp.is_hit() && resp.cache_ttl().is_some_and(|ttl| ttl > 0);
        if fresh_hit && t.origin.served(path) == before {
            fresh.push(format!("{}: {:?}", node.name, resp.cache_status()));
        }
    }
    assert!(
        fresh.is_empty(),
        "served the softly purged page as fresh, without revalidating it (the 304 answered a \
         revalidation sent before the soft purge): {fresh:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Later GETs during a fill a ban covers
// ---------------------------------------------------------------------------------------------

/// A tag ban through B (confirmed by every node) while A's request for a tagged page waits at
/// the origin (its tag is known only from the answer): a GET through A after the ban, which finds
/// A's fill of the URL under way, is not served that fill's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_after_a_tag_ban_is_not_served_the_tagged_fill_its_node_was_waiting_for() {
    let t = Three::start(2, "", GatedOrigin::start(None, None));
    let path = "/red/waited-for";
    t.origin.hold(path, 1);
    let first = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    let report = ban_via(&t.b, r#"{"tag": "red"}"#).await;
    assert_eq!(
        report["nodes"]["reached"],
        serde_json::json!(["A", "C"]),
        "{report}"
    );
    let second = t.get_through_a(path);
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.origin.release(path, 1);
    assert!(body_of(first, "A's first GET").await.starts_with(OLD));
    let second = body_of(second, "A's GET after the ban").await;
    assert!(
        !second.starts_with(OLD),
        "a GET sent after the tag ban was served the answer from before it: {second:?} (origin \
         served {} GETs)",
        t.origin.served(path)
    );
}

/// The same with a prefix ban.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_after_a_prefix_ban_is_not_served_the_fill_its_node_was_waiting_for() {
    let t = Three::start(2, "", GatedOrigin::start(None, None));
    let path = "/sale/waited-for";
    t.origin.hold(path, 1);
    let first = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    ban_via(
        &t.b,
        &format!(r#"{{"host": "{HOST}", "prefix": "/sale/"}}"#),
    )
    .await;
    let second = t.get_through_a(path);
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.origin.release(path, 1);
    assert!(body_of(first, "A's first GET").await.starts_with(OLD));
    let second = body_of(second, "A's GET after the ban").await;
    assert!(
        !second.starts_with(OLD),
        "a GET sent after the prefix ban was served the answer from before it: {second:?} \
         (origin served {} GETs)",
        t.origin.served(path)
    );
}

/// A GET through C after a purge through B (confirmed by every node), while A, which reads the
/// log only every 4 s, still fills the URL from before the purge and holds its fill lease: C does
/// not wait for A's fill and serve it; it is served an answer from after the purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_on_another_node_after_the_purge_is_not_served_the_fill_in_flight_on_a() {
    let t = Three::start(3, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/coalesced";
    t.origin.hold(path, 1);
    let first = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    purge_via(&t.b, path, false).await;
    // C has read the purge (every 250 ms); A has not
    tokio::time::sleep(Duration::from_secs(1)).await;
    let url = t.c.proxy.url(path);
    let from_c = tokio::spawn(async move { get(&url, &SITE).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.origin.release(path, 1);
    assert!(body_of(first, "A's GET").await.starts_with(OLD));
    let from_c = body_of(from_c, "C's GET after the purge").await;
    assert!(
        !from_c.starts_with(OLD),
        "C, asked after the purge, was served A's fill from before it: {from_c:?}"
    );
    t.writes_done(&[&t.a, &t.c]).await;
    t.memcached_drops_the_old_answer(path, "the answer from before the purge")
        .await;
}

// ---------------------------------------------------------------------------------------------
// The node that keeps a purge dies before it publishes it
// ---------------------------------------------------------------------------------------------

/// FIXED (found here; a node crash beside the frozen server; failed in 12 of 15 runs before
/// the fix, and in about 9 of 14 when written: it passed when A kept the purge in the same turn
/// of its log loop as the read that woke it, before `publish_kept_purges`, so that A published
/// it before the test could kill A): A's fill from before the purge is written while the
/// entry's server is frozen (the write times out, and lands when the server thaws). The purge
/// was short-lived (B's delete found no entry), so A was to keep it for the whole retention
/// (`BanList::keep_url_purge`, once it learned it at its next log read) and publish it so at its
/// next log tick (`Invalidator::run` -> `publish_kept_purges`); A is killed as soon as it has
/// learned the purge, before that. The server thawed with A's write in it: the entry stayed for
/// its hour, the purge was short-lived (five minutes) on every other node, and nothing else knew
/// to keep it longer. Since, a purge that finds a fill lease is long-lived from its issue (its
/// issuer knows a write may follow its delete), so nothing depends on the writer living; and a
/// purge a node keeps is published at once, not at its next log tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_kept_by_a_node_killed_before_it_published_it_is_not_forgotten() {
    let mut t = Three::start(3, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/kept-then-killed";
    let owner = t.owner(path);
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    let report = purge_via(&t.b, path, false).await;
    assert_eq!(report["complete"], true, "{report}");
    t.cluster.servers[owner].freeze();
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    assert!(wait_for_stat(t.a.admin, "write_failures", 1, SETTLE).await >= 1);
    // A learns the purge at its next log read (every 4 s), and judges its write by it then
    assert!(
        wait_for_stat(t.a.admin, "learned", 1, SETTLE).await >= 1,
        "A never learned the purge"
    );
    let a_kept = admin_stat(t.a.admin, "purges_kept").await;
    t.a.proxy.kill();
    t.cluster.servers[owner].thaw();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let landed = t.holds(path, OLD);
    let kept = (0..3).any(|s| t.cluster.log_names(s, path, false));
    eprintln!(
        "A's write landed at thaw: {landed}; the purge kept long-lived in the log: {kept} \
         (A had kept it: {a_kept})"
    );
    assert!(
        !landed || kept,
        "the answer from before the purge is in memcached for its hour, and its purge is kept \
         for five minutes only, on every node: the purge A kept died with A"
    );
    none_serves_it_for_a_while(&[&t.b, &t.c], path, "the answer from before the purge").await;
}

// ---------------------------------------------------------------------------------------------
// Through Pingora's cache phases (direct misses off), and revalidations answered 304
// ---------------------------------------------------------------------------------------------

/// A's misses go through Pingora's cache phases rather than Lacquer's direct exchange.
const STANDARD_MISSES: &str = "[proxy]\ndirect_misses = false\n";

/// [`a_purge_through_b_while_as_request_waits_at_the_origin_is_served_by_no_node`] with A's miss
/// through Pingora's cache phases, and A reading the log every 4 s (it stores and writes the fill
/// before it learns of the purge).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_during_a_standard_miss_at_the_origin_is_served_by_no_node() {
    let t = Three::start_with(3, STANDARD_MISSES, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/waiting-standard";
    t.origin.hold(path, 1);
    let answer = t.get_through_a(path);
    t.origin.wait_held(path, 1).await;
    purge_via(&t.b, path, false).await;
    t.origin.release(path, 1);
    assert!(body_of(answer, "A's fill").await.starts_with(OLD));
    t.writes_done(&[&t.a]).await;
    t.memcached_drops_the_old_answer(path, "the answer from before the purge")
        .await;
    none_serves_it_for_a_while(
        &[&t.a, &t.b, &t.c],
        path,
        "the answer from before the purge",
    )
    .await;
}

/// A revalidates its stale copy (its request held at the origin) while a purge goes through B,
/// confirmed by every node: the origin's 304, produced before the purge, brings nothing back,
/// neither on A nor in memcached.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_304_to_a_revalidation_sent_before_a_purge_brings_nothing_back() {
    let t = Three::start(3, "", GatedOrigin::start(None, None));
    let path = "/etag/purged";
    assert!(get(&t.a.proxy.url(path), &SITE).await.is_stored());
    assert!(poll_until_async(SETTLE, || t.holds(path, OLD)).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    t.origin.hold(path, 2);
    let revalidating = t.get_through_a(path);
    t.origin.wait_held(path, 2).await;
    purge_via(&t.b, path, true).await;
    t.origin.release(path, 2);
    let revalidated = within(SETTLE, "A's revalidation", revalidating)
        .await
        .unwrap();
    assert_eq!(revalidated.status, 200);
    t.writes_done(&[&t.a]).await;
    t.memcached_drops_the_old_answer(path, "the page from before the purge")
        .await;
    none_serves_it_for_a_while(&[&t.c, &t.b, &t.a], path, "the page from before the purge").await;
}

/// The same with A reading the log every 4 s: A takes the 304 as a revalidation of the copy it
/// still holds, and writes the copy back to memcached after the purge's delete; it is dated by
/// the revalidation's request, before the purge, and taken out again once A reads the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_304_written_back_after_a_purge_through_another_node_is_taken_out_of_memcached() {
    let t = Three::start(3, SLOW_LOG, GatedOrigin::start(None, None));
    let path = "/etag/written-back";
    assert!(get(&t.a.proxy.url(path), &SITE).await.is_stored());
    assert!(poll_until_async(SETTLE, || t.holds(path, OLD)).await);
    t.writes_done(&[&t.a]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    t.origin.hold(path, 2);
    let revalidating = t.get_through_a(path);
    t.origin.wait_held(path, 2).await;
    let writes = admin_stat(t.a.admin, "writes").await;
    purge_via(&t.b, path, false).await;
    t.origin.release(path, 2);
    let revalidated = within(SETTLE, "A's revalidation", revalidating)
        .await
        .unwrap();
    assert!(revalidated.body.starts_with(OLD));
    assert_eq!(
        wait_for_stat(t.a.admin, "writes", writes + 1, SETTLE).await,
        writes + 1,
        "A wrote the revalidated copy back (the scenario: it did not know of the purge yet)"
    );
    t.memcached_drops_the_old_answer(path, "the page revalidated by a 304 from before the purge")
        .await;
    none_serves_it_for_a_while(&[&t.c, &t.b, &t.a], path, "the page from before the purge").await;
}

/// FIXED (failed when written): [`a_get_after_a_tag_ban_is_not_served_the_tagged_fill_in_flight`] with
/// A's misses through Pingora's cache phases: the same (the in-flight fill is the memory tier's,
/// whichever path fills it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_after_a_tag_ban_is_not_served_a_standard_fill_in_flight() {
    let t = Three::start_with(
        2,
        STANDARD_MISSES,
        "",
        GatedOrigin::start(Some(Duration::from_secs(3)), None),
    );
    let path = "/red/streaming-standard";
    let first = head_of(&t.a, path).await;
    ban_via(&t.b, r#"{"tag": "red"}"#).await;
    let second = get(&t.a.proxy.url(path), &SITE).await;
    assert!(
        !second.body.starts_with(OLD),
        "a GET after the tag ban was served the page from before it, from the fill in flight: \
         {:?}",
        second.text()
    );
    drop(first);
}

// ---------------------------------------------------------------------------------------------
// Every memcached server restarted: the log begins again under the same bucket
// ---------------------------------------------------------------------------------------------

/// The current 10-second bucket of the cluster's log.
fn log_bucket() -> u64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        / 10_000
}

/// FIXED (failed when written): both memcached servers restart (empty) within one 10-second bucket of the
/// log, after A has read a ban from that bucket. A keeps, per server and bucket, how far it has
/// parsed the value, and starts again from zero only when the value is shorter than that
/// (`SharedLog::read_new`, `src/invalidation/cluster_log.rs`: `if *offset > value.len()`). The
/// first record appended after the restart is longer than A's offset: A reads it from the
/// middle, takes text for a record length past the end, and stops there at every read; it never
/// learns the ban (nor any record appended to that bucket after it). C, which had read the first
/// ban too, misses it the same way. B (the issuer) refuses the banned page; A serves it from
/// memcached as valid, for as long as the entry lives there (an hour here); C from its own copy.
/// A whole-fleet restart of memcached within ten seconds of a ban is enough; records are
/// self-delimiting but there is no resynchronisation, and no check that the value is the one
/// the offset was kept for (e.g. its first record's id).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tag_ban_published_after_every_server_restarted_reaches_every_node() {
    let mut t = Three::start(2, "", GatedOrigin::start(None, None));
    let path = "/red/after-restart";
    // the whole scene within one bucket of the log: begin at the start of one
    let aligned = poll_until_async(Duration::from_secs(11), || {
        SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 10_000
            < 300
    })
    .await;
    assert!(aligned);
    let bucket = log_bucket();
    // a ban A reads: its offset in this bucket's value moves past that record
    ban_via(&t.b, r#"{"tag": "warm", "by": "w", "wait": false}"#).await;
    assert!(
        wait_for_stat(t.a.admin, "learned", 1, STAT_WAIT).await >= 1,
        "A read the first ban"
    );
    for server in &mut t.cluster.servers {
        server.restart();
    }
    // every node uses both servers again (each may have ejected them for `retry_after`, 1 s)
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for i in 0..6 {
        for node in [&t.a, &t.b, &t.c] {
            let p = format!("/warm-up/{i}");
            assert_eq!(get(&node.proxy.url(&p), &SITE).await.status, 200);
        }
    }
    // the page is stored again, through C, after the restart; nobody else holds it
    assert!(get(&t.c.proxy.url(path), &SITE).await.is_stored());
    assert!(poll_until_async(SETTLE, || t.holds(path, OLD)).await);
    t.writes_done(&[&t.c]).await;
    let by = "x".repeat(200);
    let report = ban_via(
        &t.b,
        &format!(r#"{{"tag": "red", "by": "{by}", "wait": false}}"#),
    )
    .await;
    assert_eq!(
        report["memcached"]["published_to"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "{report}"
    );
    assert_eq!(
        log_bucket(),
        bucket,
        "the scene ran past its bucket of the log (a loaded machine): not the scenario"
    );
    // every node reads the log every 250 ms
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A first (it has never held the page: it reads memcached), then C (its own copy), then B
    // (which refetches the page and writes it over the banned entry)
    let learned = (
        admin_stat(t.a.admin, "learned").await,
        admin_stat(t.c.admin, "learned").await,
    );
    let mut served = Vec::new();
    for node in [&t.a, &t.c, &t.b] {
        if get(&node.proxy.url(path), &SITE)
            .await
            .body
            .starts_with(OLD)
        {
            served.push(node.name.clone());
        }
    }
    assert!(
        served.is_empty(),
        "the page banned by its tag is served by {served:?} (bans learned from the log: A {}, \
         C {})",
        learned.0,
        learned.1
    );
}
