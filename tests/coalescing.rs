//! Request coalescing: concurrent misses for one key cause one origin fetch (Pingora's cache lock),
//! waiters are released at once when the response turns out uncacheable, and a lock timeout lets
//! waiters go to the origin themselves.

use lacquer_test_support as support;

use support::*;

async fn concurrent_gets(url: String, n: usize) -> Vec<Resp> {
    let client = http_client();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let client = client.clone();
            let url = url.clone();
            tokio::spawn(async move { send(&client, "GET", &url, &[], None).await.unwrap() })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundred_concurrent_misses_make_one_origin_request() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let path = "/hot?cc=max-age%3D60&sleep=500";
    let responses = concurrent_gets(lacquer.url(path), 100).await;
    assert_eq!(origin.hits_for(path), 1, "exactly one origin fetch");
    let body = &responses[0].body;
    for r in &responses {
        assert_eq!(r.status, 200);
        assert_eq!(&r.body, body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uncacheable_response_releases_waiters() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    // uncacheable and slow: waiters must not queue behind one fetch each (Varnish's trap)
    let path = "/private?cc=private&sleep=300";
    let responses = concurrent_gets(lacquer.url(path), 20).await;
    assert!(responses.iter().all(|r| r.status == 200));
    let fetches = origin.requests_for(path);
    assert_eq!(fetches.len(), 20, "every request needs its own fetch");
    // fetches one after another would reuse one pooled upstream connection; released waiters
    // fetch side by side, each on its own connection
    let mut connections: Vec<usize> = fetches.iter().map(|r| r.conn_id).collect();
    connections.sort();
    connections.dedup();
    assert!(
        connections.len() > 5,
        "waiters were serialised: {} connections",
        connections.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_timeout_lets_waiters_fetch_themselves() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[cache]\nlock_timeout = \"300ms\"",
    );
    // the first fetch takes 2 s, far beyond the 300 ms lock timeout
    let path = "/slow?cc=max-age%3D60&sleep=2000";
    let responses = concurrent_gets(lacquer.url(path), 5).await;
    assert!(responses.iter().all(|r| r.status == 200));
    assert!(
        origin.hits_for(path) >= 2,
        "waiters should have given up on the lock"
    );
}

/// Counts the requests an origin handler is answering at once: each arrival waits (on the
/// origin's blocking handler thread) until `expected` requests have arrived in this phase, or
/// `give_up` passes, so requests that reach the origin side by side are all counted in flight
/// together.
struct InFlight {
    /// In flight now, the most at once, arrivals: in this phase.
    state: std::sync::Mutex<(usize, usize, usize)>,
    arrived: std::sync::Condvar,
    expected: std::sync::atomic::AtomicUsize,
}

impl InFlight {
    fn new() -> std::sync::Arc<InFlight> {
        std::sync::Arc::new(InFlight {
            state: std::sync::Mutex::new((0, 0, 0)),
            arrived: std::sync::Condvar::new(),
            expected: std::sync::atomic::AtomicUsize::new(1),
        })
    }

    /// Called by the handler: in, wait for the others (or `give_up`), out.
    fn hold(&self, give_up: Duration) {
        let expected = self.expected.load(std::sync::atomic::Ordering::SeqCst);
        let mut state = self.state.lock().unwrap();
        state.0 += 1;
        state.1 = state.1.max(state.0);
        state.2 += 1;
        self.arrived.notify_all();
        let (mut state, _) = self
            .arrived
            .wait_timeout_while(state, give_up, |s| s.2 < expected)
            .unwrap();
        state.0 -= 1;
    }

    /// The most requests seen in flight at once; starts the next phase.
    fn take_max(&self) -> usize {
        let mut state = self.state.lock().unwrap();
        state.2 = 0;
        std::mem::take(&mut state.1)
    }
}

/// Hit-for-miss (`proxy::hit_for_miss`): once a URL answered `no-store`, concurrent requests for
/// it no longer queue behind the cache lock: all of them are at the origin at once (counted
/// there; behind the lock the first would be alone until its 10 s hold gave up).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_for_a_url_answered_no_store_reach_the_origin_together() {
    const N: usize = 6;
    let in_flight = InFlight::new();
    let held = in_flight.clone();
    let origin = TestOrigin::start(move |_| {
        held.hold(Duration::from_secs(10));
        OriginResponse::ok("dynamic").header("cache-control", "no-store")
    });
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let url = lacquer.url("/api/slow");
    assert_eq!(get(&url, &[]).await.status, 200);
    assert_eq!(in_flight.take_max(), 1);
    in_flight
        .expected
        .store(N, std::sync::atomic::Ordering::SeqCst);
    let responses = concurrent_gets(url, N).await;
    assert!(responses.iter().all(|r| r.status == 200 && !r.is_hit()));
    assert_eq!(origin.hits(), N + 1);
    assert_eq!(
        in_flight.take_max(),
        N,
        "every request was at the origin at once"
    );
}

/// The same across a cluster: two nodes share a memcached tier, where the fast path finds
/// nothing either. No node claims the cluster's fill lease for a URL last answered `no-store`
/// (nothing will fill it), so a node's requests for it do not wait for another node's: all are
/// at the origin at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn across_nodes_concurrent_requests_for_a_no_store_url_reach_the_origin_together() {
    const PER_NODE: usize = 3;
    let memcached = MemcachedProcess::start();
    let in_flight = InFlight::new();
    let held = in_flight.clone();
    let origin = TestOrigin::start(move |_| {
        held.hold(Duration::from_secs(10));
        OriginResponse::ok("dynamic").header("cache-control", "no-store")
    });
    let config = format!(
        "[log]\naccess = \"off\"\n[cache.memcached]\nservers = [\"{}\"]\nop_timeout = \"1s\"\n",
        memcached.addr_string()
    );
    let nodes = [
        LacquerProcess::start_simple(origin.addr(), &config),
        LacquerProcess::start_simple(origin.addr(), &config),
    ];
    let path = "/api/slow-shared";
    for node in &nodes {
        assert_eq!(get(&node.url(path), &[]).await.status, 200);
        assert_eq!(in_flight.take_max(), 1);
    }
    in_flight
        .expected
        .store(2 * PER_NODE, std::sync::atomic::Ordering::SeqCst);
    let (a, b) = tokio::join!(
        concurrent_gets(nodes[0].url(path), PER_NODE),
        concurrent_gets(nodes[1].url(path), PER_NODE)
    );
    assert!(a.iter().chain(&b).all(|r| r.status == 200 && !r.is_hit()));
    assert_eq!(origin.hits(), 2 * PER_NODE + 2);
    assert_eq!(
        in_flight.take_max(),
        2 * PER_NODE,
        "every request of both nodes was at the origin at once"
    );
}

/// A URL whose answers mix `private` and public: after a private answer marked it, the stale
/// public copy stored under it still coalesces its revalidation (the lookup finds the copy and
/// the lock goes back on): concurrent requests make one origin fetch, and the rest are served
/// the copy that fetch stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_url_mixing_private_and_public_answers_still_coalesces_on_its_stored_copy() {
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = answered.clone();
    let origin = TestOrigin::start(move |_| {
        match count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            // stored, and stale at once
            0 => OriginResponse::ok("public v1").header("cache-control", "public, max-age=0"),
            // one user's answer: not stored, marks the URL
            1 => OriginResponse::ok("mine").header("cache-control", "private"),
            _ => OriginResponse::ok("public v2")
                .header("cache-control", "public, max-age=60")
                .delay(Duration::from_millis(300)),
        }
    });
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let url = lacquer.url("/page");
    let stored = get(&url, &[]).await;
    assert_eq!(
        stored.cache_status().unwrap(),
        "lacquer; fwd=uri-miss; fwd-status=200; stored"
    );
    let private = get(&url, &[]).await;
    assert_eq!(&private.body[..], b"mine");
    let responses = concurrent_gets(url.clone(), 8).await;
    assert!(responses.iter().all(|r| &r.body[..] == b"public v2"));
    assert_eq!(origin.hits(), 3, "one fetch for the 8 concurrent requests");
    assert!(get(&url, &[]).await.is_hit());
}
