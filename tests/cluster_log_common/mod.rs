//! What `log_and_reload_attacks` and `log_overflow_attacks` share: the site both serve, the
//! bounds they hold the cluster's invalidation log to, a page stored on two nodes, waits for a
//! node to stop serving it, the admin API, and a steady load. (Both files had a copy of each.)

use lacquer_test_support as support;

use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use support::*;

/// The site every node serves.
pub const HOST: &str = "shop.example";
pub const SITE: [(&str, &str); 1] = [("host", HOST)];
/// The nodes' `cache.memcached.op_timeout` ([`MemcachedCluster::node`] sets 200 ms).
pub const OP_TIMEOUT: Duration = Duration::from_millis(200);
/// What a request may take because of a frozen or dead memcached: `op_timeout` (once) plus a
/// generous margin for a busy 2-core machine.
pub const REQUEST_BOUND: Duration = Duration::from_millis(200 + 2_300);
/// How long a purge may take to reach the other node through a live server: `poll_interval`
/// (250 ms) plus one read, plus a frozen server's `op_timeout` in the same poll, generously.
pub const REACH_BOUND: Duration = Duration::from_secs(5);
/// A wait for anything that should happen at once; reached only by a hang.
pub const BOUND: Duration = Duration::from_secs(20);

pub fn json(resp: &Resp) -> Value {
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", resp.status, resp.text()))
}

/// The memcached key of `path` on the site.
pub fn key_of(path: &str) -> String {
    MemcachedCluster::key_of(HOST, path)
}

/// Waits (bounded) until the entry of `path` is in memcached.
pub async fn wait_for_entry(cluster: &MemcachedCluster, path: &str) {
    let key = key_of(path);
    let server = &cluster.servers[cluster.server_for(&key)];
    let written = poll_until_async(Duration::from_secs(5), || server.get_raw(&key).is_some()).await;
    assert!(written, "{} was not written to memcached", short(path));
}

/// `path` cut for messages.
pub fn short(path: &str) -> String {
    path.chars().take(60).collect()
}

/// Stores `path` through `a` (written to memcached) and makes `b` hold a copy; returns the body.
pub async fn stored_on_both(cluster: &MemcachedCluster, a: &Node, b: &Node, path: &str) -> Bytes {
    let first = get(&a.proxy.url(path), &SITE).await;
    assert!(
        first.is_stored(),
        "{}: {:?}",
        short(path),
        first.cache_status()
    );
    wait_for_entry(cluster, path).await;
    let from_b = get(&b.proxy.url(path), &SITE).await;
    assert!(
        from_b.is_hit(),
        "{} on B: {:?}",
        short(path),
        from_b.cache_status()
    );
    assert_eq!(from_b.body, first.body);
    let again = get(&b.proxy.url(path), &SITE).await;
    assert!(
        again.is_hit() && again.body == first.body,
        "{}",
        short(path)
    );
    first.body
}

/// Polls `node` for `path` until it serves something other than `old` (a 200); returns how
/// long that took, or fails after `bound` naming `what`.
pub async fn stops_serving(
    node: &Node,
    path: &str,
    old: &Bytes,
    bound: Duration,
    what: &str,
) -> Duration {
    let started = Instant::now();
    loop {
        let answer = get(&node.proxy.url(path), &SITE).await;
        assert_eq!(
            answer.status,
            200,
            "{what}: {} on {}",
            short(path),
            node.name
        );
        if answer.body != *old {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < bound,
            "{what}: {} still serves the old {} after {bound:?} ({:?})",
            node.name,
            short(path),
            answer.cache_status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts, over about two seconds of repeated reads, that none of `nodes` serves `old` for
/// `path`.
pub async fn none_serves_for_a_while(nodes: &[&Node], path: &str, old: &Bytes, what: &str) {
    for _ in 0..8 {
        for node in nodes {
            let answer = get(&node.proxy.url(path), &SITE).await;
            assert_eq!(
                answer.status,
                200,
                "{what}: {} on {}",
                short(path),
                node.name
            );
            assert_ne!(
                answer.body,
                *old,
                "{what}: {} served the old {} ({:?})",
                node.name,
                short(path),
                answer.cache_status()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An admin API call through `node`, bounded.
pub async fn admin(node: &Node, path: &str, body: &str) -> Resp {
    within(
        BOUND,
        &format!("admin {path} through {}", node.name),
        admin_post(node.admin, path, Some(ADMIN_TOKEN), body),
    )
    .await
}

/// The names in a report's `nodes.reached` (empty when absent).
pub fn reached(report: &Value) -> Vec<String> {
    report["nodes"]["reached"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Requests to a set of nodes on their own URLs (stored ones, each read through both nodes, and
/// misses), until stopped: every answer must be a 200 within [`REQUEST_BOUND`].
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    failures: Arc<Mutex<Vec<String>>>,
    slowest: Arc<Mutex<(Duration, String)>>,
    done: Arc<AtomicU64>,
}

impl Load {
    /// `tasks` clients, over `pages` stored URLs (and misses), each waiting `pause` between its
    /// requests.
    pub fn start(
        bases: Vec<String>,
        tag: &str,
        tasks: usize,
        pages: usize,
        pause: Duration,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let slowest = Arc::new(Mutex::new((Duration::ZERO, String::new())));
        let done = Arc::new(AtomicU64::new(0));
        let tasks = (0..tasks)
            .map(|t| {
                let (stop, bases, failures, slowest, done) = (
                    stop.clone(),
                    bases.clone(),
                    failures.clone(),
                    slowest.clone(),
                    done.clone(),
                );
                let tag = tag.to_string();
                tokio::spawn(async move {
                    let client = http_client();
                    for n in 0usize.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let path = if n % 4 == 3 {
                            format!("/{tag}/miss/{t}/{n}?cc=max-age%3D300")
                        } else {
                            format!("/{tag}/load/{}?cc=max-age%3D300", (n * 7 + t) % pages)
                        };
                        let url = format!(
                            "{}{path}",
                            bases[(n + t) % bases.len()].trim_end_matches('/')
                        );
                        let started = Instant::now();
                        let answer =
                            tokio::time::timeout(BOUND, send(&client, "GET", &url, &SITE, None))
                                .await;
                        let took = started.elapsed();
                        match answer {
                            Ok(Ok(r)) if r.status == 200 => {}
                            Ok(Ok(r)) => failures.lock().unwrap().push(format!(
                                "{url}: {} {:?}",
                                r.status,
                                r.cache_status()
                            )),
                            Ok(Err(e)) => failures.lock().unwrap().push(format!("{url}: {e}")),
                            Err(_) => failures.lock().unwrap().push(format!("{url}: hung")),
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                        {
                            let mut slow = slowest.lock().unwrap();
                            if took > slow.0 {
                                *slow = (took, url);
                            }
                        }
                        if !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            tasks,
            failures,
            slowest,
            done,
        }
    }

    /// Stops the load; fails on any failed or too slow request.
    pub async fn stop(self, what: &str) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        let failures = self.failures.lock().unwrap().clone();
        let (slowest, url) = self.slowest.lock().unwrap().clone();
        let done = self.done.load(Ordering::Relaxed);
        eprintln!("{what}: {done} requests, slowest {slowest:?} ({url})");
        assert!(done > 0, "{what}: the load sent nothing");
        assert!(failures.is_empty(), "{what}: requests failed: {failures:?}");
        assert!(
            slowest <= REQUEST_BOUND,
            "{what}: a request took {slowest:?} ({url}), more than op_timeout \
             ({OP_TIMEOUT:?}) plus a generous margin"
        );
    }
}
