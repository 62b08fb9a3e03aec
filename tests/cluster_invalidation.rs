//! One invalidation for the whole cluster: two nodes over three real memcached servers.
//!
//! A purge or ban through one node reaches the other through the invalidation log every
//! memcached server keeps a copy of (not by the other node's `local_ttl` running out: it is 30 s
//! here); a purge made while the server holding the entry is frozen is not undone when the
//! server comes back with its old data; tag bans reach every entry on every node and in
//! memcached, and a node started afterwards reads them; a soft purge serves stale then refreshes.

use lacquer_test_support as support;

use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use support::*;

/// How long a `/stats` counter is waited for.
const STAT_WAIT: Duration = Duration::from_secs(5);

/// The site both nodes serve, as a load balancer in front of them would pass it on.
const HOST: &str = "shop.example";
const SITE: [(&str, &str); 1] = [("host", HOST)];
/// Local copies are trusted for 30 s: anything the other node stops serving sooner than that,
/// it stopped serving because the purge reached it.
const NODE: &str = "local_ttl = \"30s\"";

fn json(resp: &Resp) -> Value {
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", resp.status, resp.text()))
}

/// Waits (bounded) until the entry of `path` is in memcached.
async fn wait_for_entry(cluster: &MemcachedCluster, path: &str) {
    let key = MemcachedCluster::key_of(HOST, path);
    let server = &cluster.servers[cluster.server_for(&key)];
    let written = poll_until_async(Duration::from_secs(5), || server.get_raw(&key).is_some()).await;
    assert!(written, "{path} was not written to memcached");
}

/// Whether memcached's entry for `path` holds `bytes` (part of a body) right now.
fn entry_holds(cluster: &MemcachedCluster, path: &str, bytes: &[u8]) -> bool {
    let key = MemcachedCluster::key_of(HOST, path);
    cluster.servers[cluster.server_for(&key)]
        .get_raw(&key)
        .is_some_and(|raw| raw.windows(bytes.len()).any(|w| w == bytes))
}

/// An origin's `200` whose head goes at once and whose body, `first` then `late`, takes two
/// seconds: long enough for a purge or ban to arrive between the two.
fn paced(first: impl Into<Bytes>) -> OriginResponse {
    OriginResponse::ok(Body::Paced {
        chunks: vec![first.into(), Bytes::from_static(b"late")],
        interval: Duration::from_secs(1),
    })
}

/// A GET of `path` through `node` whose `200` head has arrived; its body is the caller's to read.
async fn head_through(node: &Node, path: &str) -> reqwest::Response {
    let response = http_client()
        .get(node.proxy.url(path))
        .header("host", HOST)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path} through {}: {e}", node.name));
    assert_eq!(response.status(), 200);
    response
}

/// The admin API's body for a purge of `path` that does not wait for the other nodes.
fn purge_of(path: &str) -> String {
    format!(r#"{{"url": "http://{HOST}{path}", "by": "test", "wait": false}}"#)
}

/// Stores `path` through `a` (written to memcached) and makes `b` hold a copy of it; returns the
/// body every node now serves.
async fn stored_on_both(cluster: &MemcachedCluster, a: &Node, b: &Node, path: &str) -> Bytes {
    let first = get(&a.proxy.url(path), &SITE).await;
    assert!(first.is_stored(), "{path}: {:?}", first.cache_status());
    wait_for_entry(cluster, path).await;
    let from_b = get(&b.proxy.url(path), &SITE).await;
    assert!(from_b.is_hit(), "{path} on B: {:?}", from_b.cache_status());
    assert_eq!(from_b.body, first.body);
    first.body
}

/// Requests to both nodes on other URLs until stopped, so what is measured is measured under
/// load; returns the number of requests and the failures.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<(usize, Vec<String>)>>,
}

impl Load {
    fn start(urls: Vec<String>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..4)
            .map(|t| {
                let (stop, urls) = (stop.clone(), urls.clone());
                tokio::spawn(async move {
                    let client = http_client();
                    let (mut done, mut failed) = (0, Vec::new());
                    for n in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let path = format!("/load/{}?cc=max-age%3D300", (n * 7 + t) % 50);
                        let url = format!("{}{path}", urls[n % urls.len()].trim_end_matches('/'));
                        match send(&client, "GET", &url, &SITE, None).await {
                            Ok(r) if r.status == 200 => done += 1,
                            Ok(r) => failed.push(format!("{path}: {}", r.status)),
                            Err(e) => failed.push(format!("{path}: {e}")),
                        }
                    }
                    (done, failed)
                })
            })
            .collect();
        Load { stop, tasks }
    }

    async fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = 0;
        for task in self.tasks {
            let (done, failed) = task.await.unwrap();
            assert!(failed.is_empty(), "requests failed under load: {failed:?}");
            total += done;
        }
        total
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_through_one_node_stops_the_other_serving_it_within_the_poll_interval() {
    let cluster = MemcachedCluster::start(3);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let load = Load::start(vec![a.proxy.url(""), b.proxy.url("")]);

    // PURGE through A, which does not wait for B: B stops serving its copy once it reads the log
    let path = "/news?cc=max-age%3D300";
    let old = stored_on_both(&cluster, &a, &b, path).await;
    let started = Instant::now();
    let purged = request("PURGE", &a.proxy.url(path), &SITE, None).await;
    assert_eq!(purged.status, 200);
    let summary = purged.header("lacquer-purge").unwrap_or_default();
    assert!(
        summary.contains("here=1+0")
            && summary.contains("memcached=deleted")
            && summary.contains("published=3/3"),
        "{summary}"
    );
    let mut old_answers = 0;
    loop {
        let from_b = get(&b.proxy.url(path), &SITE).await;
        if from_b.body != old {
            break;
        }
        old_answers += 1;
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "B still serves the purged copy after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!(
        "PURGE through A reached B after {:?} ({old_answers} old answers from B before)",
        started.elapsed()
    );
    assert_eq!(origin.hits_for(path), 2, "B fetched it again, once");

    // through the admin API, which waits for B to confirm: once it has, B never serves it
    let path = "/offers?cc=max-age%3D300";
    let old = stored_on_both(&cluster, &a, &b, path).await;
    let started = Instant::now();
    let body = format!(r#"{{"url": "http://{HOST}{path}", "by": "test"}}"#);
    let answer = admin_post(a.admin, "/purge", Some(ADMIN_TOKEN), &body).await;
    let confirmed = started.elapsed();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let report = json(&answer);
    assert_eq!(report["action"], "purge");
    assert_eq!(report["this_node"]["objects"], 1);
    assert_eq!(report["memcached"]["delete"]["outcome"], "deleted");
    assert_eq!(
        report["memcached"]["published_to"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(report["nodes"]["reached"], serde_json::json!(["B"]));
    assert_eq!(report["complete"], true);
    assert_eq!(report["asked_by"], "127.0.0.1 (admin API, test)");
    let from_b = get(&b.proxy.url(path), &SITE).await;
    assert_ne!(
        from_b.body, old,
        "B confirmed the purge and still served the old copy"
    );
    eprintln!("admin purge through A confirmed by B after {confirmed:?}");

    let requests = load.stop().await;
    assert!(requests > 20, "the load ran ({requests} requests)");
    assert!(
        a.proxy.stderr_log().contains("asked by 127.0.0.1 (PURGE)"),
        "the purge is logged with who asked: {}",
        a.proxy.stderr_log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_while_the_owning_server_is_frozen_is_not_undone_when_it_comes_back() {
    let cluster = MemcachedCluster::start(3);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let path = "/frozen?cc=max-age%3D300";
    let key = MemcachedCluster::key_of(HOST, path);
    let owner = cluster.server_for(&key);
    let old = stored_on_both(&cluster, &a, &b, path).await;
    let old_entry = cluster.servers[owner]
        .get_raw(&key)
        .expect("the entry is in memcached");

    cluster.servers[owner].freeze();
    // A serves a few misses placed on the frozen server: their reads time out and A ejects it
    let on_owner: Vec<String> = (0..1000)
        .map(|i| format!("/elsewhere/{i}?cc=max-age%3D300"))
        .filter(|p| cluster.server_for(&MemcachedCluster::key_of(HOST, p)) == owner)
        .take(3)
        .collect();
    for p in &on_owner {
        assert_eq!(get(&a.proxy.url(p), &SITE).await.status, 200);
    }
    assert!(
        wait_for_stat(a.admin, "ejections", 1, STAT_WAIT).await >= 1,
        "A ejected the frozen server"
    );

    let body = format!(r#"{{"url": "http://{HOST}{path}"}}"#);
    let answer = admin_post(a.admin, "/purge", Some(ADMIN_TOKEN), &body).await;
    let report = json(&answer);
    assert_eq!(answer.status, 202, "{report}");
    let frozen = cluster.names()[owner].clone();
    assert_eq!(report["memcached"]["delete"]["server"], frozen.as_str());
    // skipped while A holds it ejected (or failed, when its probe came due meanwhile)
    let outcome = report["memcached"]["delete"]["outcome"].as_str().unwrap();
    assert!(matches!(outcome, "skipped_ejected" | "failed"), "{outcome}");
    assert_eq!(
        report["memcached"]["not_published_to"],
        serde_json::json!([frozen])
    );
    assert_eq!(
        report["memcached"]["published_to"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(report["nodes"]["reached"], serde_json::json!(["B"]));
    assert_eq!(report["complete"], false);
    let pending: Vec<String> = serde_json::from_value(report["pending"].clone()).unwrap();
    assert!(
        pending.contains(&format!("delete on {frozen}")),
        "{pending:?}"
    );

    cluster.servers[owner].thaw();
    // whatever the order of A's retried delete and the nodes' next reads of the thawed server,
    // the purged entry is never served again
    let never_old = |resp: &Resp, node: &str| {
        assert_ne!(
            resp.body, old,
            "{node} served the purged entry after the server came back"
        );
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        never_old(&get(&a.proxy.url(path), &SITE).await, "A");
        never_old(&get(&b.proxy.url(path), &SITE).await, "B");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        wait_for_stat(a.admin, "pending_deletes", 0, STAT_WAIT).await,
        0
    );

    // the trap itself, made certain: the server holds the old entry again (as if A's delete had
    // never reached it) and both nodes must find it there, and refuse it
    cluster.servers[owner].set_raw(&key, &old_entry, 300);
    let purge_b = format!(r#"{{"host": "{HOST}", "path": "/unrelated", "wait": false}}"#);
    // (B's copy of the refetched page would answer without reading memcached: drop it first)
    let dropped = admin_post(b.admin, "/purge", Some(ADMIN_TOKEN), &purge_b).await;
    assert!(
        dropped.status == 200 || dropped.status == 202,
        "{}",
        dropped.text()
    );
    let c = cluster.node(&origin, "C", NODE);
    let from_c = get(&c.proxy.url(path), &SITE).await;
    never_old(&from_c, "C (started after the purge)");
    assert_eq!(
        admin_stat(c.admin, "invalidated").await,
        1,
        "C read the old entry from memcached and refused it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tag_ban_reaches_every_tagged_entry_on_both_nodes_and_in_memcached() {
    let cluster = MemcachedCluster::start(3);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let tagged =
        |name: &str, tags: &str| format!("/{name}?cc=max-age%3D300&hdr=Surrogate-Key:{}", q(tags));
    let red1 = tagged("red1", "red shoes");
    let red2 = tagged("red2", "catalog red");
    let blue = tagged("blue", "blue catalog");
    let red_on_b = tagged("red-b", "red");
    let mut old = std::collections::HashMap::new();
    for path in [&red1, &red2, &blue] {
        old.insert(path.clone(), stored_on_both(&cluster, &a, &b, path).await);
    }
    // one red entry only B stored (and wrote to memcached)
    let from_b = get(&b.proxy.url(&red_on_b), &SITE).await;
    assert!(from_b.is_stored());
    wait_for_entry(&cluster, &red_on_b).await;
    assert!(
        !from_b.has_header("surrogate-key"),
        "the tag field is for the cache, not the client"
    );
    old.insert(red_on_b.clone(), from_b.body);
    // each writer is done with its entries (it judges each once more after writing it, and
    // would delete one a ban it learned of then covers), so the ban leaves them in memcached
    for node in [&a, &b] {
        assert_eq!(
            wait_for_stat_at_most(node.admin, "background_writes", 0, STAT_WAIT).await,
            0,
            "{}: writes still in flight",
            node.name
        );
    }

    let answer = admin_post(a.admin, "/ban", Some(ADMIN_TOKEN), r#"{"tag": "red"}"#).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let report = json(&answer);
    assert_eq!(report["action"], "ban");
    assert_eq!(report["target"], serde_json::json!({"tag": "red"}));
    assert_eq!(report["this_node"]["objects"], 2, "A held red1 and red2");
    assert_eq!(report["nodes"]["reached"], serde_json::json!(["B"]));

    // a node started after the ban reads it from the log before it serves from memcached,
    // where every red entry still sits (a ban scans nothing and deletes nothing there)
    let c = cluster.node(&origin, "C", NODE);
    for path in [&red1, &red2, &red_on_b] {
        for node in [&c, &a, &b] {
            let resp = get(&node.proxy.url(path), &SITE).await;
            assert_ne!(
                resp.body, old[path],
                "{} served {path}, banned by its tag",
                node.name
            );
        }
    }
    for node in [&a, &b, &c] {
        let resp = get(&node.proxy.url(&blue), &SITE).await;
        assert!(resp.is_hit(), "{} lost an entry not tagged red", node.name);
        assert_eq!(resp.body, old[&blue]);
    }
    assert_eq!(origin.hits_for(&blue), 1);
    assert!(admin_stat(c.admin, "invalidated").await >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_soft_purge_serves_stale_then_refreshes_on_both_nodes() {
    let cluster = MemcachedCluster::start(3);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    // revalidated with its validator: the origin answers 304 with a new hour of freshness
    let path = format!(
        "/soft?cc={}&cc304={}&etag={}&r304=1",
        q("max-age=300, stale-while-revalidate=600"),
        q("max-age=3600"),
        q("\"v1\"")
    );
    let old = stored_on_both(&cluster, &a, &b, &path).await;
    let body = format!(r#"{{"url": "http://{HOST}{path}", "soft": true}}"#);
    let answer = admin_post(a.admin, "/purge", Some(ADMIN_TOKEN), &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let report = json(&answer);
    assert_eq!(report["soft"], true);
    assert_eq!(
        report["memcached"]["delete"],
        Value::Null,
        "a soft purge deletes nothing"
    );
    assert_eq!(report["nodes"]["reached"], serde_json::json!(["B"]));

    for (node, revalidations) in [(&a, 2), (&b, 3)] {
        // served stale (stale-while-revalidate: a hit past its freshness), while one background
        // request revalidates
        let stale = get(&node.proxy.url(&path), &SITE).await;
        assert_eq!(stale.body, old, "{}: the stale copy is served", node.name);
        assert!(
            stale.is_hit() && stale.cache_ttl().is_some_and(|ttl| ttl <= 0),
            "{}: {:?}",
            node.name,
            stale.cache_status()
        );
        assert!(
            origin
                .wait_for_hits_for_async(&path, revalidations, Duration::from_secs(20))
                .await,
            "{} did not revalidate",
            node.name
        );
        let revalidation = &origin.requests_for(&path)[revalidations - 1];
        assert_eq!(revalidation.header("if-none-match"), Some("\"v1\""));
        // then fresh again (the refresh lands shortly after the origin's answer)
        let mut fresh = get(&node.proxy.url(&path), &SITE).await;
        for _ in 0..100 {
            if fresh.is_hit() && fresh.cache_ttl().is_some_and(|ttl| ttl > 300) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            fresh = get(&node.proxy.url(&path), &SITE).await;
        }
        assert!(fresh.is_hit(), "{}: {:?}", node.name, fresh.cache_status());
        assert!(
            fresh.cache_ttl().is_some_and(|ttl| ttl > 300),
            "{}: refreshed by the 304: {:?}",
            node.name,
            fresh.cache_status()
        );
        assert_eq!(fresh.body, old, "a 304 keeps the stored body");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_ban_and_a_prefix_ban_cover_their_urls_only() {
    let cluster = MemcachedCluster::start(3);
    let origin = scripted_origin();
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let img = "/img/logo?cc=max-age%3D300";
    let page = "/page?cc=max-age%3D300";
    let old_img = stored_on_both(&cluster, &a, &b, img).await;
    let old_page = stored_on_both(&cluster, &a, &b, page).await;
    let other_site = [("host", "other.example")];
    let other = get(&a.proxy.url(img), &other_site).await;
    assert!(other.is_stored());

    let ban = format!(r#"{{"host": "{HOST}", "prefix": "/img/"}}"#);
    let answer = admin_post(a.admin, "/ban", Some(ADMIN_TOKEN), &ban).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(json(&answer)["this_node"]["objects"], 1);
    for node in [&a, &b] {
        assert_ne!(get(&node.proxy.url(img), &SITE).await.body, old_img);
        assert_eq!(get(&node.proxy.url(page), &SITE).await.body, old_page);
    }
    assert!(
        get(&a.proxy.url(img), &other_site).await.is_hit(),
        "another host's /img/"
    );

    let ban = format!(r#"{{"host": "{HOST}"}}"#);
    let answer = admin_post(b.admin, "/ban", Some(ADMIN_TOKEN), &ban).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(json(&answer)["nodes"]["reached"], serde_json::json!(["A"]));
    for node in [&a, &b] {
        assert_ne!(get(&node.proxy.url(page), &SITE).await.body, old_page);
    }
    assert!(get(&a.proxy.url(img), &other_site).await.is_hit());
}

/// A fill that a ban refuses when it is stored writes nothing to memcached: not even the older
/// copy this node still holds under the URL, which would land over the newer answer another node
/// wrote there (before, the write took whatever the memory tier held under the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_a_ban_refuses_leaves_the_newer_answer_in_memcached() {
    let cluster = MemcachedCluster::start(3);
    let path = "/refused";
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let origin = TestOrigin::start({
        let served = served.clone();
        move |_req| match served.fetch_add(1, Ordering::SeqCst) + 1 {
            // A's first copy, stale a second later
            1 => OriginResponse::ok("body-v1")
                .header("cache-control", "max-age=1")
                .header("surrogate-key", "old"),
            // B's refresh of it, written over it in memcached
            2 => OriginResponse::ok("body-v2")
                .header("cache-control", "max-age=300")
                .header("surrogate-key", "other"),
            // A's refresh: its head at once, its body over two seconds, tagged for the ban
            3 => paced("body-v3-")
                .header("cache-control", "max-age=300")
                .header("surrogate-key", "new"),
            _ => OriginResponse::ok("body-later").header("cache-control", "max-age=300"),
        }
    });
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let holds = |body: &[u8]| entry_holds(&cluster, path, body);
    assert!(get(&a.proxy.url(path), &SITE).await.is_stored());
    wait_for_entry(&cluster, path).await;
    assert!(holds(b"body-v1"));
    // v1 goes stale (max-age=1); B refreshes it and writes v2 over it
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let from_b = get(&b.proxy.url(path), &SITE).await;
    assert_eq!(from_b.text(), "body-v2");
    assert!(
        poll_until_async(STAT_WAIT, || holds(b"body-v2")).await,
        "B's refresh never reached memcached"
    );
    let writes_before = admin_stat(a.admin, "writes").await;
    // A still trusts its own stale v1 (local_ttl 30 s) and refreshes it: v3, banned by its tag
    // between its head and the end of its body, so the fill is refused when it is stored
    let response = head_through(&a, path).await;
    let ban = admin_post(a.admin, "/ban", Some(ADMIN_TOKEN), r#"{"tag": "new"}"#).await;
    assert_eq!(ban.status, 200, "{}", ban.text());
    let body = response.bytes().await.expect("A's refreshed body");
    assert_eq!(&body[..], b"body-v3-late");
    assert_eq!(served.load(Ordering::SeqCst), 3);
    // nothing A holds replaces v2 in memcached
    let overwritten = poll_until_async(Duration::from_secs(2), || !holds(b"body-v2")).await;
    assert!(!overwritten, "A wrote over B's newer answer");
    assert_eq!(
        admin_stat(a.admin, "writes").await,
        writes_before,
        "A wrote something for a fill the ban refused"
    );
}

/// A fill that began before a purge and is written to memcached after the purge's delete (here
/// on the other node, which has not read the purge yet) does not stay there. The purge's ban is
/// kept for five minutes only when its delete was answered (`SHORT_RETENTION`): an entry left
/// behind would be judged banned until then, and served again afterwards, on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fill_written_after_a_purge_through_another_node_does_not_outlive_the_purge() {
    // A's fill has its head (validated then) when the purge goes through B
    let mut t = PurgedMidFill::start("/purged-mid-fill", "").await;
    t.fill_written().await;
    // once A has read the purge from the log (within 4 s), its entry is gone from memcached
    assert!(
        poll_until_async(Duration::from_secs(15), || {
            !entry_holds(&t.cluster, t.path, b"body-1-")
        })
        .await,
        "the purged page stays in memcached, to be served again when the purge's ban is forgotten"
    );
    assert!(admin_stat(t.a.admin, "written_then_banned").await >= 1);
    // and no node serves it meanwhile
    none_serves(&[&t.a, &t.b], t.path, "the purged page").await;
}

/// A soft ban right after a page was written leaves its entry in memcached, to be served stale:
/// a soft ban is kept for the whole retention, so the writer's second look at what it wrote
/// deletes only what a hard purge or ban covers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_soft_ban_just_after_a_write_leaves_the_entry_in_memcached() {
    let cluster = MemcachedCluster::start(3);
    let origin = scripted_origin();
    // A reads the log every 2 s: its second look at the write waits for the read after the ban
    let a = cluster.node_with_invalidation(&origin, "A", "poll_interval = \"2s\"", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let path = format!(
        "/soft-after-write?cc={}&hdr=Surrogate-Key:{}",
        q("max-age=3600, stale-while-revalidate=600"),
        q("red")
    );
    assert!(get(&a.proxy.url(&path), &SITE).await.is_stored());
    let ban = r#"{"tag": "red", "soft": true, "wait": false}"#;
    let answer = admin_post(b.admin, "/ban", Some(ADMIN_TOKEN), ban).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    wait_for_entry(&cluster, &path).await;
    assert_eq!(
        wait_for_stat_at_most(a.admin, "background_writes", 0, Duration::from_secs(15)).await,
        0
    );
    assert_eq!(admin_stat(a.admin, "written_then_banned").await, 0);
    assert!(
        entry_holds(&cluster, &path, b"/soft-after-write"),
        "a softly banned entry was deleted"
    );
}

/// A node draining after SIGTERM keeps reading the log: a fill that completes during the drain
/// and is written after a purge of its URL through another node is judged by that purge and
/// deleted before the node exits (when the log stopped at SIGTERM, it stayed in memcached).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_node_still_applies_purges_to_what_it_writes() {
    let cluster = MemcachedCluster::start(3);
    let path = "/purged-while-draining";
    let origin = TestOrigin::start(|_req| paced("body-1-").header("cache-control", "max-age=3600"));
    // A reads the log at start and then every 6 s: it learns of the purge only after its fill
    // is written, and before its drain (shutdown_timeout, 10 s) ends
    let mut a = cluster.node_with_invalidation(&origin, "A", "poll_interval = \"6s\"", NODE);
    let b = cluster.node(&origin, "B", NODE);
    let response = head_through(&a, path).await;
    assert!(a.proxy.signal("TERM"));
    let answer = admin_post(b.admin, "/purge", Some(ADMIN_TOKEN), &purge_of(path)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let body = response
        .bytes()
        .await
        .expect("A's body, sent while it drains");
    assert_eq!(&body[..], b"body-1-late");
    let status = a
        .proxy
        .wait_exit(Duration::from_secs(30))
        .expect("A never exited");
    assert!(status.success(), "{status:?}");
    assert!(
        !entry_holds(&cluster, path, b"body-1-"),
        "the page purged while A drained was left in memcached by A"
    );
}

/// [`none_serves_the_first_answer`] for this file's site.
async fn none_serves(nodes: &[&Node], path: &str, what: &str) {
    none_serves_the_first_answer(nodes, path, &SITE, what).await;
}

/// After a POST through `a` reached B's fill in flight (`response`, its head arrived): B's
/// answer is still the page as it was, which once B has read the log (every second) is neither
/// kept in memcached nor served by either node.
async fn the_pre_post_fill_is_neither_kept_nor_served(
    cluster: &MemcachedCluster,
    response: reqwest::Response,
    a: &Node,
    b: &Node,
    path: &str,
) {
    assert_eq!(
        &response.bytes().await.expect("B's body")[..],
        b"body-1-late"
    );
    let gone = poll_until_async(Duration::from_secs(10), || {
        !entry_holds(cluster, path, b"body-1-")
    })
    .await;
    assert!(gone, "B's pre-POST page stays in memcached");
    tokio::time::sleep(Duration::from_secs(2)).await;
    none_serves(&[a, b], path, "the page as it was before the POST").await;
}

/// A node A whose fill of `path` began before a purge of it through node B, and which reads the
/// cluster's log only every 4 s (so it learns of the purge only after its write): the fill's head
/// has arrived and the purge was published short-lived (its delete was answered). A fills
/// without a fill lease (`fill_lease = "0"`): a purge that finds a fill's lease deletes it, so
/// that fill is not kept (`storage::fill_lease`, **Loss**), and is long-lived from its issue;
/// these tests are of the fills no lease announces, which only their writer can judge. A is
/// configured with `a_extra` in its memcached section too; the origin counts its answers, so a
/// refetch is told from the purged page (`body-1-late`).
struct PurgedMidFill {
    cluster: MemcachedCluster,
    origin: TestOrigin,
    a: Node,
    b: Node,
    path: &'static str,
    /// The entry's memcached server, and one other.
    owner: usize,
    other: usize,
    writes_before: u64,
    /// A's answer, its body still to come.
    response: Option<reqwest::Response>,
}

impl PurgedMidFill {
    async fn start(path: &'static str, a_extra: &str) -> PurgedMidFill {
        let cluster = MemcachedCluster::start(3);
        let origin = counting_origin(Duration::from_secs(1), "max-age=3600");
        let a = cluster.node_with_invalidation(
            &origin,
            "A",
            "poll_interval = \"4s\"",
            &format!("{NODE}\nfill_lease = \"0\"\n{a_extra}"),
        );
        let b = cluster.node(&origin, "B", NODE);
        let owner = cluster.server_for(&MemcachedCluster::key_of(HOST, path));
        let other = (owner + 1) % 3;
        let writes_before = admin_stat(a.admin, "writes").await;
        let response = head_through(&a, path).await;
        let answer = admin_post(b.admin, "/purge", Some(ADMIN_TOKEN), &purge_of(path)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert!(
            cluster.log_names(other, path, true),
            "B's purge is published short-lived (its delete was answered)"
        );
        PurgedMidFill {
            cluster,
            origin,
            a,
            b,
            path,
            owner,
            other,
            writes_before,
            response: Some(response),
        }
    }

    /// Reads the rest of A's answer: the purged page.
    async fn read_fill(&mut self) {
        let response = self.response.take().expect("read once");
        assert_eq!(
            &response.bytes().await.expect("A's body")[..],
            b"body-1-late"
        );
    }

    /// Reads the rest of A's fill; returns once A has written it to memcached.
    async fn fill_written(&mut self) {
        self.read_fill().await;
        assert_eq!(
            wait_for_stat(self.a.admin, "writes", self.writes_before + 1, STAT_WAIT).await,
            self.writes_before + 1,
            "A's fill was not written"
        );
    }

    /// Whether the purge has been published long-lived (waits up to 10 s for it).
    async fn kept_in_the_log(&self) -> bool {
        poll_until_async(Duration::from_secs(10), || {
            self.cluster.log_names(self.other, self.path, false)
        })
        .await
    }

    /// After the owner thaws with the purged page: no node serves it, neither A, B nor one
    /// started now.
    async fn nobody_serves_the_purged_page(&self, nodes: &[&Node]) {
        self.cluster.servers[self.owner].thaw();
        assert!(
            poll_until_async(Duration::from_secs(5), || entry_holds(
                &self.cluster,
                self.path,
                b"body-1-"
            ))
            .await,
            "the purged page is in memcached, as the freeze left it"
        );
        let c = self.cluster.node(&self.origin, "C", NODE);
        let all: Vec<&Node> = nodes.iter().copied().chain([&c]).collect();
        none_serves(&all, self.path, "the purged page").await;
    }
}

/// A fill written after a purge of its URL whose server freezes before its writer can delete it
/// stays in memcached: the purge, short-lived since its own delete was answered, is then kept for
/// the whole retention and published again as such, so no node forgets it while the entry may
/// still be there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_whose_late_entry_cannot_be_deleted_is_kept_for_the_whole_retention() {
    let mut t = PurgedMidFill::start("/purged-then-frozen", "").await;
    t.fill_written().await;
    // the entry's server freezes before A has read the purge from the log
    t.cluster.servers[t.owner].freeze();
    assert_eq!(
        wait_for_stat(t.a.admin, "purges_kept", 1, Duration::from_secs(20)).await,
        1,
        "A did not keep the purge it could not act on"
    );
    assert_eq!(admin_stat(t.a.admin, "written_then_banned").await, 0);
    assert!(
        t.kept_in_the_log().await,
        "the purge was not published again as long-lived"
    );
    t.nobody_serves_the_purged_page(&[&t.a, &t.b]).await;
}

/// The same with `rehash_on_eject`: while A holds the frozen owner ejected, the server standing in
/// for it answers that it has no such entry, which says nothing of what the owner holds (found
/// by review: the purge was not kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stand_in_for_an_ejected_owner_does_not_answer_for_the_purged_entry() {
    let mut t = PurgedMidFill::start(
        "/purged-then-ejected",
        "rehash_on_eject = true\nfailure_limit = 1",
    )
    .await;
    t.fill_written().await;
    t.cluster.servers[t.owner].freeze();
    assert_eq!(
        wait_for_stat(t.a.admin, "purges_kept", 1, Duration::from_secs(20)).await,
        1,
        "A took the stand-in's answer for the owner's"
    );
    assert!(t.kept_in_the_log().await);
    t.nobody_serves_the_purged_page(&[&t.a, &t.b]).await;
}

/// A write to a server that froze fails after `op_timeout`, but the server carries it out when it
/// thaws: a purge covering it is kept as for an entry that could not be deleted (found by
/// review: only a write that was answered was judged).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purged_fill_whose_write_timed_out_keeps_the_purge() {
    let mut t = PurgedMidFill::start("/purged-write-timed-out", "").await;
    // the owner freezes before A's body is complete: its write times out
    t.cluster.servers[t.owner].freeze();
    t.read_fill().await;
    assert!(wait_for_stat(t.a.admin, "write_failures", 1, STAT_WAIT).await >= 1);
    assert_eq!(
        wait_for_stat(t.a.admin, "purges_kept", 1, Duration::from_secs(20)).await,
        1,
        "A did not keep the purge over the write it could not confirm"
    );
    assert!(t.kept_in_the_log().await);
    t.nobody_serves_the_purged_page(&[&t.a, &t.b]).await;
}

/// A node draining after SIGTERM that keeps a purge publishes it before it exits (found by
/// review: the publication waited for the next poll, and the drain did not wait for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_node_publishes_the_purge_it_kept_before_it_exits() {
    let mut t = PurgedMidFill::start("/purged-then-drained", "").await;
    t.fill_written().await;
    t.cluster.servers[t.owner].freeze();
    assert!(t.a.proxy.signal("TERM"));
    let status =
        t.a.proxy
            .wait_exit(Duration::from_secs(30))
            .expect("A never exited");
    assert!(status.success(), "{status:?}");
    assert!(
        (0..3)
            .filter(|&s| s != t.owner)
            .all(|s| t.cluster.log_names(s, t.path, false)),
        "A exited before it published the purge it kept"
    );
    t.nobody_serves_the_purged_page(&[&t.b]).await;
}

/// What the writer reads back before deleting a purged entry may be anything: here garbage put
/// under the entry's key after the write. It is no newer answer to keep, so it is deleted, and the
/// node goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_under_a_purged_entry_at_the_writers_second_look_is_deleted() {
    let mut t = PurgedMidFill::start("/purged-then-garbage", "").await;
    t.fill_written().await;
    let key = MemcachedCluster::key_of(HOST, t.path);
    let garbage = [&b"\x00\xffLQ-not-an-entry"[..], &[0x5a; 3000]].concat();
    t.cluster.servers[t.owner].set_raw(&key, &garbage, 300);
    assert_eq!(
        wait_for_stat(t.a.admin, "written_then_banned", 1, Duration::from_secs(20)).await,
        1,
        "A left what it found under the purged entry's key"
    );
    assert!(t.cluster.servers[t.owner].get_raw(&key).is_none());
    assert_eq!(admin_stat(t.a.admin, "purges_kept").await, 0);
    let after = get(&t.a.proxy.url("/after?cc=max-age%3D60"), &SITE).await;
    assert_eq!(after.status, 200, "A serves on");
}

/// A POST through one node invalidates its URL on every node even when nothing of it is stored
/// yet anywhere, if a fill of it is in flight on another node (its fill lease says so): that
/// fill holds what the URL was before the POST, and must not be kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_invalidates_a_fill_in_flight_on_another_node() {
    let cluster = MemcachedCluster::start(3);
    let path = "/posted-mid-fill";
    let origin = counting_origin(Duration::from_secs(1), "max-age=3600");
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node_with_invalidation(&origin, "B", "poll_interval = \"1s\"", NODE);
    let response = head_through(&b, path).await;
    // B's fill is in flight (it holds the URL's fill lease); the POST goes through A, which has
    // nothing of the URL, nor has memcached
    let posted = post(&a.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    the_pre_post_fill_is_neither_kept_nor_served(&cluster, response, &a, &b, path).await;
}

/// The same when the fill is slower than its lease (`fill_lease = "1s"`, a body that takes 8 s):
/// the filling node keeps its lease alive while the fill lasts, so a POST in the fill's third
/// second still finds it and is published. (Without the renewal the lease had expired, the POST
/// reached no one, and B stored and served the page as it was before the POST.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_invalidates_a_fill_slower_than_its_lease() {
    let cluster = MemcachedCluster::start(3);
    let path = "/posted-mid-slow-fill";
    let origin = counting_origin(Duration::from_secs(4), "max-age=3600");
    let a = cluster.node(&origin, "A", NODE);
    let b = cluster.node_with_invalidation(
        &origin,
        "B",
        "poll_interval = \"1s\"",
        &format!("{NODE}\nfill_lease = \"1s\""),
    );
    let response = head_through(&b, path).await;
    // well past the lease's own second (memcached's whole-second expiry: at most two)
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let renewed = admin_stat(b.admin, "fill_leases_renewed").await;
    assert!(
        renewed >= 2,
        "B did not keep its fill's lease alive: {renewed} renewals, lost {}",
        admin_stat(b.admin, "fill_leases_lost").await
    );
    let posted = post(&a.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    // (long-lived: a purge that finds a fill lease is kept for the whole retention)
    let published = poll_until_async(Duration::from_secs(5), || {
        (0..3).any(|server| cluster.log_names(server, path, false))
    })
    .await;
    assert!(
        published,
        "the POST in a slow fill's third second was not published"
    );
    the_pre_post_fill_is_neither_kept_nor_served(&cluster, response, &a, &b, path).await;
}

/// A POST naming a URL nobody stored and nobody is filling is not published to the cluster: most
/// POSTs are, and publishing each would fill the log (found by review: a first version took a
/// lease delete the server answered for a lease found).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_to_a_url_nobody_stored_or_fills_is_not_published() {
    let cluster = MemcachedCluster::start(3);
    let origin = TestOrigin::start(|req| {
        if req.method == "POST" {
            return OriginResponse::ok("changed");
        }
        OriginResponse::ok("page").header("cache-control", "max-age=3600")
    });
    let a = cluster.node(&origin, "A", NODE);
    assert_eq!(get(&a.proxy.url("/warm"), &SITE).await.status, 200);
    let path = "/never-stored-never-filled";
    let posted = post(&a.proxy.url(path), &SITE, "x=1").await;
    assert_eq!(posted.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for server in 0..3 {
        for short in [true, false] {
            assert!(
                !cluster.log_names(server, path, short),
                "a POST naming a URL nobody stored or filled was published to the cluster's log"
            );
        }
    }
}
