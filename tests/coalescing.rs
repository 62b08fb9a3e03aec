//! Request coalescing: concurrent misses for one key cause one origin fetch (Pingora's cache lock),
//! waiters are released at once when the response turns out uncacheable, and a lock timeout lets
//! waiters go to the origin themselves.

mod support;

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
