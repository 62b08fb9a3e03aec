//! A successful unsafe request (a POST) purges its URL (RFC 9111 §4.4). When nothing of the URL
//! is stored or being filled, that purge leaves no ban: only a mark in a fixed table
//! (`BanList::mark_unsafe_purge`), which refuses what a fetch sent before the POST would store.
//! Before, every such POST left two bans (the URL's `http` and `https` keys) for five minutes:
//! a client POSTing to URLs of its choosing (a query string is enough) grew the list, about
//! 110 bytes a ban, with nothing to bound it.
//!
//! One node, memory tier only, an origin that can hold a GET's answer at a gate (the request
//! has reached it, its answer waits) while a POST goes through.

use lacquer_test_support as support;

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use support::*;

const BOUND: Duration = Duration::from_secs(20);

/// GETs of a path are answered `body-N.late` (the Nth GET), cacheable for an hour; the first GET
/// of a path under `/held/` waits at the gate until [`Gate::open`]; under `/paced/` its body's
/// `late` comes 1.5 s after the head (the fill has begun when the POST comes). A POST is
/// answered 200 `changed`.
#[derive(Default)]
struct Gate {
    state: Mutex<(HashMap<String, usize>, bool, bool)>,
    changed: Condvar,
}

impl Gate {
    fn origin(self: &Arc<Self>) -> TestOrigin {
        let gate = self.clone();
        TestOrigin::start(move |req| {
            if req.method == "POST" {
                return OriginResponse::ok("changed");
            }
            let mut state = gate.state.lock().unwrap();
            let n = {
                let count = state.0.entry(req.path.clone()).or_default();
                *count += 1;
                *count
            };
            if n == 1 && req.path.starts_with("/held/") {
                state.1 = true;
                gate.changed.notify_all();
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while !state.2 && std::time::Instant::now() < deadline {
                    state = gate
                        .changed
                        .wait_timeout(state, Duration::from_millis(50))
                        .unwrap()
                        .0;
                }
            }
            drop(state);
            let head = format!("body-{n}.");
            let resp = if n == 1 && req.path.starts_with("/paced/") {
                OriginResponse::ok(Body::Paced {
                    chunks: vec![Bytes::from(head), Bytes::from_static(b"late")],
                    interval: Duration::from_millis(1500),
                })
            } else {
                OriginResponse::ok(format!("{head}late"))
            };
            resp.header("cache-control", "max-age=3600")
        })
    }

    /// Whether a held GET waits at the gate.
    fn holds_one(&self) -> bool {
        self.state.lock().unwrap().1
    }

    fn open(&self) {
        self.state.lock().unwrap().2 = true;
        self.changed.notify_all();
    }
}

fn node(origin: &TestOrigin, direct_misses: bool) -> (LacquerProcess, u16) {
    LacquerProcess::start_simple_with_admin(
        origin.addr(),
        &format!("[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct_misses}\n"),
    )
}

/// Two hundred POSTs to URLs nothing was stored for leave the ban list empty; a POST to a
/// stored URL still purges it, with a ban (its `http` key's: the `https` one has nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_to_urls_with_nothing_stored_leave_no_ban() {
    let origin = Arc::new(Gate::default()).origin();
    let (lacquer, admin) = node(&origin, true);
    for i in 0..200 {
        let posted = post(&lacquer.url(&format!("/form?attempt={i}")), &[], "a=1").await;
        assert_eq!(posted.status, 200);
    }
    assert_eq!(admin_stat(admin, "issued").await, 400, "both keys of each");
    assert_eq!(admin_stat(admin, "rules").await, 0, "no ban kept");

    let stored = lacquer.url("/page");
    assert_eq!(get(&stored, &[]).await.text(), "body-1.late");
    assert!(get(&stored, &[]).await.is_hit());
    assert_eq!(post(&stored, &[], "a=1").await.status, 200);
    let after = get(&stored, &[]).await;
    assert!(!after.is_hit(), "{:?}", after.cache_status());
    assert_eq!(after.text(), "body-2.late");
    assert_eq!(admin_stat(admin, "rules").await, 1);
}

/// A GET whose request reached the origin before a POST to its URL (nothing stored yet), answered
/// after it: its client gets that answer, but it is not stored; the next GET fetches anew.
async fn a_fetch_sent_before_the_post_is_not_stored(path: &str, direct_misses: bool) {
    let gate = Arc::new(Gate::default());
    let origin = gate.origin();
    let (lacquer, admin) = node(&origin, direct_misses);
    let url = lacquer.url(path);
    let first = tokio::spawn({
        let url = url.clone();
        async move { get(&url, &[]).await }
    });
    if path.starts_with("/held/") {
        assert!(
            poll_until(BOUND, || gate.holds_one()),
            "the GET reached the origin"
        );
    } else {
        // the head and the body's first bytes are in: the fill has begun
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(post(&url, &[], "a=1").await.status, 200);
    gate.open();
    // whole, on both paths: the standard path streams its own client from the fill, which the
    // purge let go of but still relays to it
    let answer = first.await.unwrap();
    assert_eq!(answer.text(), "body-1.late");
    let next = get(&url, &[]).await;
    assert_eq!(
        next.text(),
        "body-2.late",
        "the answer fetched before the POST was stored and served after it ({:?})",
        next.cache_status()
    );
    assert!(
        get(&url, &[]).await.is_hit(),
        "the answer after the POST is stored"
    );
    assert_eq!(admin_stat(admin, "rules").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_miss_sent_before_a_post_does_not_store_its_answer() {
    a_fetch_sent_before_the_post_is_not_stored("/held/direct", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standard_miss_sent_before_a_post_does_not_store_its_answer() {
    a_fetch_sent_before_the_post_is_not_stored("/held/standard", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_under_way_at_a_post_does_not_store_its_answer() {
    a_fetch_sent_before_the_post_is_not_stored("/paced/direct", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standard_fill_under_way_at_a_post_does_not_store_its_answer() {
    a_fetch_sent_before_the_post_is_not_stored("/paced/standard", false).await;
}
