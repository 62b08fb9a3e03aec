//! `/metrics` after a scripted sequence: misses, memory hits, memcached hits on a second node,
//! a PURGE, a pass, a backend going down and a memcached server killed; each step moves exactly
//! the series it should. Also the tier of a hit in `Cache-Status` and the access log.

use lacquer_test_support as support;

use support::*;

const CHECKS: &str = "[balancer.health_check]\npath = \"/health\"\ninterval = \"100ms\"\n\
                      timeout = \"100ms\"\nrise = 1\nfall = 1\n";

fn memcached_toml(servers: &[&MemcachedProcess]) -> String {
    let names: Vec<String> = servers
        .iter()
        .map(|m| format!("\"{}\"", m.addr_string()))
        .collect();
    format!(
        "[cache.memcached]\nservers = [{}]\nop_timeout = \"200ms\"\nconnect_timeout = \"100ms\"\n\
         failure_limit = 2\nretry_after = \"60s\"\nlocal_ttl = \"60s\"\n",
        names.join(", ")
    )
}

/// The site both nodes serve (the cache key has the host, as a load balancer passes it on).
const SITE: [(&str, &str); 1] = [("host", "shop.example")];

/// Polls `/metrics` (bounded) until `series` has `value`; returns the last scrape.
async fn wait_for(admin: u16, series: &str, value: f64) -> Scrape {
    let mut last = scrape(admin).await;
    for _ in 0..200 {
        if last.get(series) == Some(value) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = scrape(admin).await;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_as_a_scripted_sequence_says() {
    let mc = [MemcachedProcess::start(), MemcachedProcess::start()];
    let r = [Replica::start("a"), Replica::start("b")];
    let (admin_a, admin_b) = (free_port(), free_port());
    let shared = memcached_toml(&[&mc[0], &mc[1]]);
    let logs = TempDir::new("metrics-log");
    let log_b = logs.path().join("b.log");
    let a = start_balancer(
        &[(r[0].addr(), 1), (r[1].addr(), 1)],
        &format!(
            "[admin]\nlisten = \"127.0.0.1:{admin_a}\"\n[balancer]\nalgorithm = \"round_robin\"\n\
             {CHECKS}{shared}"
        ),
    );
    let b = start_balancer(
        &[(r[0].addr(), 1)],
        &format!(
            "[admin]\nlisten = \"127.0.0.1:{admin_b}\"\n[log]\naccess = \"{}\"\n\
             [cache]\nannounce = \"tier\"\n{shared}",
            log_b.display()
        ),
    );
    let start = scrape(admin_a).await;
    assert_eq!(
        start.value(r#"lacquer_requests_total{cache="miss",tier="origin"}"#),
        0.0
    );
    let b_up = format!(
        "lacquer_backend_up{{backend=\"{0}\",address=\"{0}\"}}",
        r[1].addr()
    );
    assert_eq!(start.value(&b_up), 1.0);

    // four misses, then four hits from memory
    let mut body_bytes = 0;
    for i in 0..4 {
        let miss = get(&a.url(&format!("/cacheable/{i}")), &SITE).await;
        assert_eq!(miss.cache_fwd().as_deref(), Some("uri-miss"));
        body_bytes += miss.body.len();
    }
    for i in 0..4 {
        let hit = get(&a.url(&format!("/cacheable/{i}")), &SITE).await;
        assert!(hit.is_hit(), "{:?}", hit.cache_status());
        // node A keeps the default announce: no tier in Cache-Status
        assert_eq!(hit.cache_status_param("detail"), None);
    }
    // a request is counted as it ends, just after its response reached the client
    let m = wait_for(
        admin_a,
        r#"lacquer_requests_total{cache="hit",tier="memory"}"#,
        4.0,
    )
    .await;
    assert_eq!(
        m.value(r#"lacquer_requests_total{cache="miss",tier="origin"}"#),
        4.0
    );
    assert_eq!(
        m.value(r#"lacquer_requests_total{cache="hit",tier="memory"}"#),
        4.0
    );
    assert_eq!(
        m.value(r#"lacquer_requests_total{cache="hit",tier="memcached"}"#),
        0.0
    );
    assert_eq!(
        m.value(r#"lacquer_request_duration_seconds_count{cache="hit"}"#),
        4.0
    );
    assert_eq!(
        m.value(r#"lacquer_request_duration_seconds_count{cache="miss"}"#),
        4.0
    );
    assert_eq!(
        m.value(r#"lacquer_request_duration_seconds_bucket{le="+Inf",cache="hit"}"#),
        4.0
    );
    assert_eq!(
        m.value(r#"lacquer_response_body_bytes_total{cache="hit"}"#),
        body_bytes as f64
    );
    assert_eq!(
        m.value(r#"lacquer_response_body_bytes_total{cache="miss"}"#),
        body_bytes as f64
    );
    assert_eq!(m.value("lacquer_memory_objects"), 4.0);
    assert_eq!(m.value("lacquer_memcached_misses_total"), 4.0);
    let sent: f64 = r
        .iter()
        .map(|replica| {
            m.value(&format!(
                "lacquer_backend_requests_total{{backend=\"{0}\",address=\"{0}\"}}",
                replica.addr()
            ))
        })
        .sum();
    assert_eq!(sent, (r[0].served() + r[1].served()) as f64);

    // node B finds them in memcached once A's writes have landed
    wait_for(admin_a, "lacquer_memcached_writes_total", 4.0).await;
    for i in 0..4 {
        let hit = get(&b.url(&format!("/cacheable/{i}")), &SITE).await;
        assert!(hit.is_hit(), "{:?}", hit.cache_status());
        assert_eq!(
            hit.cache_status_param("detail").as_deref(),
            Some("memcached")
        );
    }
    let again = get(&b.url("/cacheable/0"), &SITE).await;
    assert_eq!(
        again.cache_status_param("detail").as_deref(),
        Some("memory")
    );
    wait_for(
        admin_b,
        r#"lacquer_requests_total{cache="hit",tier="memcached"}"#,
        4.0,
    )
    .await;
    let mb = wait_for(
        admin_b,
        r#"lacquer_requests_total{cache="hit",tier="memory"}"#,
        1.0,
    )
    .await;
    assert_eq!(
        mb.value(r#"lacquer_requests_total{cache="hit",tier="memcached"}"#),
        4.0
    );
    assert_eq!(
        mb.value(r#"lacquer_requests_total{cache="hit",tier="memory"}"#),
        1.0
    );
    assert_eq!(mb.value("lacquer_memcached_hits_total"), 4.0);
    let latency_ops: f64 = mc
        .iter()
        .map(|m| {
            mb.value(&format!(
                "lacquer_memcached_server_latency_seconds_count{{server=\"{}\"}}",
                m.addr_string()
            ))
        })
        .sum();
    assert!(latency_ops >= 4.0, "{}", mb.text);
    let batches: f64 = mc
        .iter()
        .map(|m| {
            mb.value(&format!(
                "lacquer_memcached_batch_keys_count{{server=\"{}\"}}",
                m.addr_string()
            ))
        })
        .sum();
    assert!(batches >= 4.0, "{}", mb.text);
    let log = poll_text(&log_b, "tier=memory");
    assert!(log.contains("cache=hit tier=memcached"), "{log}");

    // a PURGE on A, then a pass (POST)
    let purged = request("PURGE", &a.url("/cacheable/3"), &SITE, None).await;
    assert_eq!(purged.status, 200);
    let m = wait_for(
        admin_a,
        r#"lacquer_purge_requests_total{result="removed"}"#,
        1.0,
    )
    .await;
    assert_eq!(
        m.value(r#"lacquer_purge_requests_total{result="removed"}"#),
        1.0
    );
    // one purge per scheme the cache key may carry: at least one
    let purges = m.value(r#"lacquer_invalidations_total{kind="purge"}"#);
    assert!(purges >= 1.0, "{}", m.text);
    assert_eq!(m.value(r#"lacquer_invalidations_total{kind="ban"}"#), 0.0);
    let pass = post(&a.url("/cacheable/3"), &SITE, "x").await;
    assert_eq!(pass.cache_fwd().as_deref(), Some("method"));
    let m = wait_for(
        admin_a,
        r#"lacquer_requests_total{cache="pass",tier="origin"}"#,
        1.0,
    )
    .await;
    // a successful POST invalidates its URL (RFC 9111 4.4): a purge of its own
    assert!(m.value(r#"lacquer_invalidations_total{kind="purge"}"#) > purges);
    assert_eq!(
        m.value(r#"lacquer_requests_total{cache="pass",tier="origin"}"#),
        1.0
    );
    assert_eq!(
        m.value(r#"lacquer_requests_total{cache="miss",tier="origin"}"#),
        4.0
    );

    // backend b goes down: its health check fails and it is no longer offered traffic
    r[1].set_health(503);
    let down = format!(
        "lacquer_backend_up{{backend=\"{0}\",address=\"{0}\"}}",
        r[1].addr()
    );
    let m = wait_for(admin_a, &down, 0.0).await;
    assert_eq!(m.value(&down), 0.0);
    assert_eq!(
        m.value(&format!(
            "lacquer_backend_health_check_up{{backend=\"{0}\",address=\"{0}\"}}",
            r[1].addr()
        )),
        0.0
    );
    assert_eq!(
        m.value(&format!(
            "lacquer_backend_up{{backend=\"{0}\",address=\"{0}\"}}",
            r[0].addr()
        )),
        1.0
    );

    // a memcached server is killed: B's reads of its keys fail, and it is ejected
    let (killed, alive) = (mc[1].addr_string(), mc[0].addr_string());
    let mut mc = mc;
    mc[1].kill();
    let up = format!("lacquer_memcached_server_up{{server=\"{killed}\"}}");
    for i in 0..40 {
        get(&b.url(&format!("/cacheable/new/{i}")), &SITE).await;
        if scrape(admin_b).await.get(&up) == Some(0.0) {
            break;
        }
    }
    let mb = scrape(admin_b).await;
    assert_eq!(mb.value(&up), 0.0);
    assert_eq!(
        mb.value(&format!(
            "lacquer_memcached_server_up{{server=\"{alive}\"}}"
        )),
        1.0
    );
    assert!(
        mb.value(&format!(
            "lacquer_memcached_server_errors_total{{server=\"{killed}\"}}"
        )) >= 2.0
    );
    assert_eq!(
        mb.value(&format!(
            "lacquer_memcached_server_errors_total{{server=\"{alive}\"}}"
        )),
        0.0
    );
    assert!(mb.value("lacquer_memcached_ejections_total") >= 1.0);
    drop((a, b));
}

/// The file's text once it contains `needle` (the access log is written by a thread of its
/// own; bounded wait).
fn poll_text(path: &std::path::Path, needle: &str) -> String {
    let mut text = String::new();
    poll_until(Duration::from_secs(10), || {
        text = std::fs::read_to_string(path).unwrap_or_default();
        text.contains(needle)
    });
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announce_off_sends_no_cache_status_and_the_log_still_has_it() {
    let origin =
        TestOrigin::start(|_| OriginResponse::ok("page").header("cache-control", "max-age=60"));
    let logs = TempDir::new("announce-off");
    let log = logs.path().join("access.log");
    let node = LacquerProcess::start_simple(
        origin.addr(),
        &format!(
            "[log]\naccess = \"{}\"\n[cache]\nannounce = \"off\"\n",
            log.display()
        ),
    );
    let miss = get(&node.url("/p"), &[]).await;
    let hit = get(&node.url("/p"), &[]).await;
    assert_eq!(miss.header("cache-status"), None);
    assert_eq!(hit.header("cache-status"), None);
    assert_eq!(origin.hits(), 1);
    let text = poll_text(&log, "cache=hit");
    assert!(text.contains("cache=miss tier=- "), "{text}");
    assert!(text.contains("cache=hit tier=memory "), "{text}");
    assert!(text.contains("detail=memory"), "{text}");
}
