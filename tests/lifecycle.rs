//! The process's life cycle over real sockets, under a steady load through the node: a reload
//! with a good config (applied, connections kept, memory tier still warm), a reload with a bad
//! one (refused, the running config kept, the reason logged), the same through the admin
//! endpoint; a hand-over to a new process (zero failed requests, its memory tier warmed from
//! memcached rather than the origin); and SIGTERM letting a slow download finish, within
//! `shutdown_timeout` only.

use lacquer_test_support as support;

use support::*;

const TOKEN: &str = "lifecycle-admin-token-0123456789";

/// Eight cacheable pages: `(url, body)` through the proxy at `port`.
fn pages(port: u16) -> Vec<(String, String)> {
    (0..8)
        .map(|i| {
            let path = format!("/page/{i}");
            (format!("http://127.0.0.1:{port}{path}"), body_of(&path))
        })
        .collect()
}

fn body_of(path: &str) -> String {
    format!("the page at {path}\n")
}

/// An origin whose every page is fresh for five minutes; it counts what it serves.
fn page_origin() -> TestOrigin {
    TestOrigin::start(|req| {
        OriginResponse::ok(body_of(&req.path)).header("cache-control", "public, max-age=300")
    })
}

/// Fetches every page once (the origin serves each), then checks a second round is all hits.
async fn prime(targets: &[(String, String)]) {
    for (url, body) in targets {
        let resp = get(url, &[]).await;
        assert_eq!((resp.status, resp.text()), (200, body.clone()), "{url}");
    }
    for (url, _) in targets {
        assert!(get(url, &[]).await.is_hit(), "{url} was not stored");
    }
}

fn via(resp: &Resp) -> String {
    resp.header("via").unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_applies_a_good_config_refuses_a_bad_one_and_keeps_the_memory_tier() {
    let origin = page_origin();
    let dir = TempDir::new("lifecycle-reload");
    let token_file = dir.write("token", TOKEN);
    let admin = free_port();
    let origin_addr = origin.addr();
    let config = move |port: u16, via_name: &str, extra: &str| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nupstream = \"{}\"\nthreads = 2\n\
             [proxy]\nvia_name = \"{via_name}\"\n\
             [log]\naccess = \"off\"\n\
             [admin]\nlisten = \"127.0.0.1:{admin}\"\ntoken_file = \"{}\"\n{extra}",
            origin_addr,
            token_file.display()
        )
    };
    let node = LacquerProcess::start_on_free_port(|port| config(port, "before", ""));
    let port = node.port();
    let targets = pages(port);
    prime(&targets).await;
    assert_eq!(origin.hits(), 8);

    let load = SteadyLoad::start(4, targets.clone());
    assert!(load.wait_for(100, Duration::from_secs(30)).await);

    // a good config, by SIGHUP: applied while the load runs
    node.write_config(&config(port, "after", ""));
    assert!(node.signal("HUP"));
    let url = &targets[0].0;
    let mut applied = false;
    for _ in 0..500 {
        if via(&get(url, &[]).await).contains("after") {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        applied,
        "the new via_name never showed; stderr:\n{}",
        node.stderr_log()
    );
    assert!(load.wait_for(100, Duration::from_secs(30)).await);

    // a bad config, by SIGHUP: refused, logged, the running one kept
    node.write_config(&config(port, "bad", "[cache]\nmemory_size = \"12XB\"\n"));
    assert!(node.signal("HUP"));
    assert!(
        wait_for_log(&node, "reload refused", Duration::from_secs(10)),
        "no refusal logged; stderr:\n{}",
        node.stderr_log()
    );
    assert!(node.stderr_log().contains("cache.memory_size"));
    assert!(via(&get(url, &[]).await).contains("after"));
    assert!(load.wait_for(100, Duration::from_secs(30)).await);

    // the admin endpoint: the token is demanded, a bad file refused with the reason
    let reload_url = format!("http://127.0.0.1:{admin}/reload");
    let no_token = request("POST", &reload_url, &[], None).await;
    assert_eq!(no_token.status, 401);
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let refused = request("POST", &reload_url, &auth, None).await;
    assert_eq!(refused.status, 422, "{}", refused.text());
    assert!(
        refused.text().contains("cache.memory_size"),
        "{}",
        refused.text()
    );

    // a good file with a restart-only key changed: applied, the key named and kept
    node.write_config(&config(port, "admin", "[cache]\nmemory_size = \"64MiB\"\n"));
    let applied = request("POST", &reload_url, &auth, None).await;
    assert_eq!(applied.status, 200, "{}", applied.text());
    // (estimated_objects, derived from memory_size when not given, changes with it)
    assert!(
        applied
            .text()
            .contains("\"needs_restart\":[\"cache.memory_size\""),
        "{}",
        applied.text()
    );
    assert!(via(&get(url, &[]).await).contains("admin"));
    assert_eq!(admin_stat(admin, "limit").await, 256 << 20);
    assert!(load.wait_for(100, Duration::from_secs(30)).await);

    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        report.retried, 0,
        "a reload closed a connection under a request"
    );
    // the memory tier kept every page through three reloads: the origin saw no refetch
    assert_eq!(origin.hits(), 8);
    for (url, _) in &targets {
        assert!(get(url, &[]).await.is_hit(), "{url} is no longer a hit");
    }
    assert_eq!(
        node.stderr_log().matches("configuration reloaded").count(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_over_under_load_fails_no_request_and_the_successor_is_warmed_from_memcached() {
    let origin = page_origin();
    let memcached = MemcachedProcess::start();
    let dir = TempDir::new("lifecycle-upgrade");
    let upgrade_sock = dir.path().join("upgrade.sock");
    let node = LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nupstream = \"{}\"\nthreads = 2\n\
             shutdown_timeout = \"5s\"\n\
             [server]\nupgrade_sock = \"{}\"\n\
             [log]\naccess = \"off\"\n\
             [cache.memcached]\nservers = [\"{}\"]\n",
            origin.addr(),
            upgrade_sock.display(),
            memcached.addr_string()
        )
    });
    let targets = pages(node.port());
    prime(&targets).await;
    assert_eq!(origin.hits(), 8);
    // the fills reach memcached from a background task
    assert!(
        poll_until(Duration::from_secs(10), || memcached.item_count() >= 8),
        "memcached holds {} items",
        memcached.item_count()
    );

    let load = SteadyLoad::start(4, targets.clone());
    assert!(load.wait_for(100, Duration::from_secs(30)).await);
    let mut old = node;
    let successor = old.hand_over(&upgrade_sock);
    assert!(load.wait_for(100, Duration::from_secs(30)).await);
    // the old process serves beside the new one for a few seconds, then drains and exits
    let status = old.wait_exit(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "old process: {status:?}; stderr:\n{}",
        old.stderr_log()
    );
    assert!(load.wait_for(200, Duration::from_secs(30)).await);
    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    eprintln!(
        "hand-over: {} requests answered, {} resent after their connection closed",
        report.ok, report.retried
    );
    // the successor served from memory it filled from memcached: the origin saw no refetch
    assert_eq!(origin.hits(), 8);
    assert!(process_listens_on(successor.pid(), successor.port()));
    assert!(successor.stderr_log().contains("Bootstrap done"));
}

/// A response that trickles out: `chunks` pieces of 1 KiB, 100 ms apart.
fn slow_download(chunks: usize) -> (TestOrigin, Vec<u8>) {
    let pieces: Vec<Bytes> = (0..chunks)
        .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; 1024]))
        .collect();
    let whole = pieces.concat();
    let origin = TestOrigin::start(move |_| {
        OriginResponse::ok(Body::Paced {
            chunks: pieces.clone(),
            interval: Duration::from_millis(100),
        })
    });
    (origin, whole)
}

/// Starts the download through `node` with `client`, waits until its first bytes arrived, sends
/// SIGTERM, and returns what the client then received, whole or cut. With `while_in_flight`,
/// runs it once SIGTERM is sent, before reading the rest.
async fn download_across_sigterm(
    node: &mut LacquerProcess,
    client: reqwest::Client,
    while_in_flight: impl FnOnce(&mut LacquerProcess),
) -> Result<Vec<u8>, String> {
    let mut response = client
        .get(node.url("/download"))
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    let mut body = response
        .chunk()
        .await
        .map_err(|e| format!("{e:?}"))?
        .map(|b| b.to_vec())
        .unwrap_or_default();
    assert!(node.signal("TERM"));
    while_in_flight(node);
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => return Ok(body),
            Err(e) => return Err(format!("cut after {} bytes: {e:?}", body.len())),
        }
    }
}

/// A download of `chunks` KiB by `client` across SIGTERM, with a 30 s `shutdown_timeout`: runs
/// `while_in_flight` once SIGTERM is sent, checks that the client got the body whole and that the
/// process then exited cleanly, and returns the node (for its log).
async fn slow_download_finishes_across_sigterm(
    chunks: usize,
    client: reqwest::Client,
    while_in_flight: impl FnOnce(&mut LacquerProcess),
) -> LacquerProcess {
    let (origin, whole) = slow_download(chunks);
    let mut node = LacquerProcess::start_simple(
        origin.addr(),
        // grace_period, the fixed wait that used to bound the drain, no longer does
        "shutdown_timeout = \"30s\"\ngrace_period = \"1s\"\n[log]\naccess = \"off\"\n",
    );
    let received = download_across_sigterm(&mut node, client, |node| {
        while_in_flight(node);
        assert!(
            node.is_running(),
            "the process exited with a download in flight"
        );
    })
    .await;
    assert_eq!(received.map(|b| b.len()), Ok(whole.len()));
    let status = node.wait_exit(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; stderr:\n{}",
        node.stderr_log()
    );
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_and_lets_a_slow_download_finish() {
    // 4 s of body: the listener's closing is seen while it streams
    let node = slow_download_finishes_across_sigterm(40, http_client(), |node| {
        // the listener closes while the download goes on
        let port = node.port();
        assert!(
            poll_until(Duration::from_secs(10), || !port_accepts(port)),
            "the listener still accepts after SIGTERM"
        );
    })
    .await;
    assert!(node.stderr_log().contains("drained after"));
}

/// The same over HTTP/2, whose streams are processed in their connection's task: the stream
/// streaming its body goes on to the end after SIGTERM, and the process then exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_slow_h2_download_finish() {
    slow_download_finishes_across_sigterm(20, h2c_client(), |_| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cuts_what_is_still_running_at_shutdown_timeout() {
    // 6 s of body, 1 s allowed: the process does not wait for it
    let (origin, whole) = slow_download(60);
    let mut node = LacquerProcess::start_simple(
        origin.addr(),
        "shutdown_timeout = \"1s\"\n[log]\naccess = \"off\"\n",
    );
    let received = download_across_sigterm(&mut node, http_client(), |_| {}).await;
    let status = node.wait_exit(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(
        received.as_ref().map_or(true, |b| b.len() < whole.len()),
        "the download finished: shutdown_timeout was not enforced"
    );
    assert!(node.stderr_log().contains("shutdown_timeout"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reopens_the_access_log_for_logrotate() {
    let origin = page_origin();
    let dir = TempDir::new("lifecycle-logrotate");
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let node = LacquerProcess::start_simple(
        origin.addr(),
        &format!("[log]\naccess = \"{}\"\n", log.display()),
    );
    let before = node.url("/page/before");
    get(&before, &[]).await;
    assert!(poll_until(Duration::from_secs(10), || read_lossy(&log)
        .contains("/page/before")));
    // what logrotate does: rename, then SIGHUP
    std::fs::rename(&log, &rotated).unwrap();
    assert!(node.signal("HUP"));
    assert!(wait_for_log(
        &node,
        "configuration reloaded",
        Duration::from_secs(10)
    ));
    get(&node.url("/page/after"), &[]).await;
    assert!(
        poll_until(Duration::from_secs(10), || read_lossy(&log)
            .contains("/page/after")),
        "no line in the new file; stderr:\n{}",
        node.stderr_log()
    );
    assert!(!read_lossy(&rotated).contains("/page/after"));
}
