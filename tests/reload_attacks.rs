//! Attacks on live reload (SIGHUP, `POST /reload`) and the hand-over: requests of every kind in
//! flight across a reload, reloads that change what requests read between two of their phases,
//! restart-only keys, hostile and broken files, signal storms, and signals during a hand-over or
//! a drain. The property: the operator can reload without losing the cache, and a reload never
//! fails a client request or leaves the proxy half-applied.
//!
//! Seven of these failed when written (each says what was wrong); the fixes are in
//! src/lifecycle/ (a request keeps its settings, SIGHUP held from `main`, reloads on a thread of
//! their own, rules checked against the running backends).

use lacquer_test_support as support;

use std::sync::{Arc, Condvar, Mutex};
use support::*;

/// How long a test waits for anything that should happen at once (a reload, a request reaching
/// the origin): generous, only a hang reaches it.
const BOUND: Duration = Duration::from_secs(20);

/// A gate an origin handler waits on (on its blocking thread) until the test opens it; never
/// longer than [`BOUND`], so a test that fails does not hang the origin.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, cv) = &*self.0;
        let guard = open.lock().unwrap();
        let _ = cv.wait_timeout_while(guard, BOUND, |open| !*open).unwrap();
    }

    fn open(&self) {
        let (open, cv) = &*self.0;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
}

/// How many reload outcomes (applied or refused) the node has logged.
fn reload_outcomes(node: &LacquerProcess) -> usize {
    let log = node.stderr_log();
    log.matches("configuration reloaded").count() + log.matches("reload refused").count()
}

/// Writes `config`, sends SIGHUP and waits until the node logged one more reload outcome;
/// returns whether that outcome was "applied".
fn sighup_with(node: &LacquerProcess, config: &str) -> bool {
    node.write_config(config);
    sighup(node)
}

/// Sends SIGHUP and waits for one more reload outcome; returns whether it was "applied".
fn sighup(node: &LacquerProcess) -> bool {
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

fn via(resp: &Resp) -> String {
    resp.header("via").unwrap_or_default()
}

/// A node's config: listen, one origin, 2 threads, no access log, `via_name`, then `extra`.
fn node_config(port: u16, origin: std::net::SocketAddr, via_name: &str, extra: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\nupstream = \"{origin}\"\nthreads = 2\n\
         [log]\naccess = \"off\"\n[proxy]\nvia_name = \"{via_name}\"\n{extra}\n"
    )
}

// ---------------------------------------------------------------------------------------------
// A request's phases across a reload
// ---------------------------------------------------------------------------------------------

/// A request's rule verdict (indices into the rule list) is computed in `request_filter` and
/// applied to the answer's head in `response_filter`; a reload in between must not have the
/// second read another rule list (before the fix it did, and a reload that shortened the list
/// indexed past its end: a panic, the client's answer cut). A request keeps the settings it
/// started with for all its phases.
///
/// Here: a stale entry revalidated (the standard path) while the origin holds the revalidation;
/// the reload removes the only rule; the origin then answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revalidation_in_flight_across_a_reload_that_removes_its_rule_is_answered_whole() {
    let gate = Gate::default();
    let origin = {
        let gate = gate.clone();
        let served = std::sync::atomic::AtomicUsize::new(0);
        TestOrigin::start(move |_| {
            let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n > 0 {
                gate.wait();
            }
            OriginResponse::ok(format!("version {n}\n")).header("cache-control", "max-age=1")
        })
    };
    let rule = "[[rules]]\npath = \"/\"\nset_response_headers = { \"X-Rule\" = \"old\" }\n";
    let addr = origin.addr();
    let node = LacquerProcess::start_on_free_port(|port| node_config(port, addr, "a", rule));
    let url = node.url("/page");
    let first = get(&url, &[]).await;
    assert_eq!(
        (first.status, first.text()),
        (200, "version 0\n".to_string())
    );
    assert!(first.is_stored(), "{:?}", first.cache_status());
    // stale after a second: the next request revalidates through the standard path
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let in_flight = tokio::spawn({
        let url = url.clone();
        async move { try_get(&url, &[]).await }
    });
    assert!(
        origin.wait_for_hits_async(2, BOUND).await,
        "the revalidation never reached the origin"
    );
    assert!(sighup_with(&node, &node_config(node.port(), addr, "b", "")));
    gate.open();
    let answer = within(BOUND, "the revalidation's answer", in_flight)
        .await
        .unwrap();
    let answer = answer.unwrap_or_else(|e| {
        panic!(
            "the request in flight across the reload failed: {e:?}; stderr:\n{}",
            node.stderr_log()
        )
    });
    assert_eq!(answer.status, 200, "{}", node.stderr_log());
    assert_eq!(answer.text(), "version 1\n");
    node.assert_no_panic();
}

/// Same cause as above: coalesced waiters (Pingora's cache lock, the standard path) compute
/// their verdict under the old rules and must get those rules' edits, not those of whatever
/// rule has the same index in the new list (a rule they never matched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_waiters_across_a_reload_get_only_the_edits_of_rules_they_matched() {
    let gate = Gate::default();
    let origin = {
        let gate = gate.clone();
        TestOrigin::start(move |req| {
            if req.path.starts_with("/a/") {
                gate.wait();
            }
            OriginResponse::ok(format!("page {}\n", req.path))
                .header("cache-control", "max-age=300")
        })
    };
    let old_rules = "[[rules]]\npath = \"/a/\"\nset_response_headers = { \"X-Rule\" = \"a\" }\n";
    let new_rules = "[[rules]]\npath = \"/b/\"\nset_response_headers = { \"X-Rule\" = \"b\" }\n";
    let addr = origin.addr();
    let node = LacquerProcess::start_on_free_port(|port| node_config(port, addr, "a", old_rules));
    let url = node.url("/a/hot");
    let client = http_client();
    let requests: Vec<_> = (0..6)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { send(&client, "GET", &url, &[], None).await })
        })
        .collect();
    assert!(origin.wait_for_hits_for_async("/a/hot", 1, BOUND).await);
    // (only lets the other five reach the cache lock; nothing is asserted on time)
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(sighup_with(
        &node,
        &node_config(node.port(), addr, "b", new_rules)
    ));
    gate.open();
    let mut rules_seen = Vec::new();
    for request in requests {
        let answer = within(BOUND, "a coalesced answer", request).await.unwrap();
        let answer = answer.unwrap_or_else(|e| {
            panic!(
                "a request in flight across the reload failed: {e:?}; stderr:\n{}",
                node.stderr_log()
            )
        });
        assert_eq!(
            (answer.status, answer.text()),
            (200, "page /a/hot\n".to_string())
        );
        rules_seen.push(answer.header("x-rule"));
    }
    assert_eq!(
        origin.hits_for("/a/hot"),
        1,
        "the waiters were not coalesced"
    );
    assert!(
        !rules_seen.iter().any(|r| r.as_deref() == Some("b")),
        "a request for /a/ got the edit of the rule for /b/: {rules_seen:?}"
    );
    node.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Half-applied: rules applied, the backends they name kept
// ---------------------------------------------------------------------------------------------

/// `[[upstreams]]` is restart-only, `[[rules]]` reloadable. A file that adds a grouped backend
/// and a rule sending requests to its group is valid as a whole (the group exists in the file),
/// but a reload keeps the running backends: applied, the rule would name a group no running
/// backend has, and every request it matches would be a 502 ("no backend configured") after a
/// reload reported as successful. Such a reload is refused, naming the rule's key, and the
/// running configuration keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_never_applies_a_rule_whose_backend_group_the_running_backends_lack() {
    let main = TestOrigin::start(|req| OriginResponse::ok(format!("main {}\n", req.path)));
    let media = TestOrigin::start(|req| OriginResponse::ok(format!("media {}\n", req.path)));
    let main_addr = main.addr();
    let config = move |port: u16, extra: &str| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 2\n[log]\naccess = \"off\"\n\
             [[upstreams]]\naddress = \"{main_addr}\"\n{extra}"
        )
    };
    let node = LacquerProcess::start_on_free_port(|port| config(port, ""));
    let before = get(&node.url("/media/a.png"), &[]).await;
    assert_eq!(
        (before.status, before.text()),
        (200, "main /media/a.png\n".into())
    );
    let grown = format!(
        "[[upstreams]]\naddress = \"{}\"\ngroup = \"media\"\n\
         [[rules]]\npath = \"/media/\"\nbackend_group = \"media\"\npass = true\n",
        media.addr()
    );
    let applied = sighup_with(&node, &config(node.port(), &grown));
    assert!(
        !applied
            && node
                .stderr_log()
                .contains("rules[0].backend_group: no running backend has group = \"media\""),
        "the reload must be refused, naming the rule; stderr:\n{}",
        node.stderr_log()
    );
    let after = get(&node.url("/media/b.png"), &[]).await;
    // refused: the main origin still serves it; applied (with the backend list kept): it must
    // still be served by a running backend, not failed
    assert_eq!(
        after.status,
        200,
        "reload {}; /media/b.png answered {} {:?}; stderr:\n{}",
        if applied { "applied" } else { "refused" },
        after.status,
        after.text(),
        node.stderr_log()
    );
}

/// Same cause, on the direct pass path (`forward_pass`'s answer's head goes through
/// `finish_forwarded_head`, which loaded the settings again before the fix): a slow POST in
/// flight when a reload removes the rule that edits its answer's head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_post_in_flight_across_a_reload_that_removes_its_rule_is_answered_whole() {
    let gate = Gate::default();
    let origin = {
        let gate = gate.clone();
        TestOrigin::start(move |req| {
            gate.wait();
            OriginResponse::ok(format!("posted {} bytes\n", req.body.len()))
                .header("cache-control", "no-store")
        })
    };
    let rule = "[[rules]]\npath = \"/\"\nset_response_headers = { \"X-Rule\" = \"old\" }\n";
    let addr = origin.addr();
    let node = LacquerProcess::start_on_free_port(|port| node_config(port, addr, "a", rule));
    let in_flight = tokio::spawn({
        let url = node.url("/submit");
        async move {
            send(
                &http_client(),
                "POST",
                &url,
                &[],
                Some(Bytes::from("x".repeat(100))),
            )
            .await
        }
    });
    assert!(origin.wait_for_hits_async(1, BOUND).await);
    assert!(sighup_with(&node, &node_config(node.port(), addr, "b", "")));
    gate.open();
    let answer = within(BOUND, "the POST's answer", in_flight).await.unwrap();
    let answer = answer.unwrap_or_else(|e| {
        panic!(
            "the POST in flight across the reload failed: {e:?}; stderr:\n{}",
            node.stderr_log()
        )
    });
    assert_eq!(
        (answer.status, answer.text()),
        (200, "posted 100 bytes\n".to_string())
    );
    node.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Every kind of request in flight across a reload (no rule involved)
// ---------------------------------------------------------------------------------------------

const BIG_CHUNKS: usize = 48;
const BIG_CHUNK: usize = 32 * 1024;

fn big_body() -> Vec<Bytes> {
    (0..BIG_CHUNKS)
        .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; BIG_CHUNK]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_request_in_flight_across_a_reload_completes_and_nothing_stored_is_lost() {
    let gate = Gate::default();
    let swr_served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let origin = {
        let (gate, swr_served) = (gate.clone(), swr_served.clone());
        TestOrigin::start(move |req| match req.path.as_str() {
            "/submit" => {
                gate.wait();
                OriginResponse::ok(format!("posted {} bytes\n", req.body.len()))
                    .header("cache-control", "no-store")
            }
            "/hot" => {
                gate.wait();
                OriginResponse::ok("hot\n").header("cache-control", "max-age=300")
            }
            "/big" | "/h2big" => OriginResponse::ok(Body::Paced {
                chunks: big_body(),
                interval: Duration::from_millis(40),
            })
            .header("cache-control", "max-age=300"),
            "/swr" => {
                let n = swr_served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if n > 0 {
                    gate.wait();
                }
                OriginResponse::ok(format!("swr {n}\n"))
                    .header("cache-control", "max-age=1, stale-while-revalidate=600")
            }
            path => {
                OriginResponse::ok(format!("page {path}\n")).header("cache-control", "max-age=300")
            }
        })
    };
    let addr = origin.addr();
    let node = LacquerProcess::start_on_free_port(|port| node_config(port, addr, "before", ""));
    let port = node.port();
    // stored before the reload: must all still be hits after it
    for i in 0..4 {
        let resp = get(&node.url(&format!("/kept/{i}")), &[]).await;
        assert!(resp.is_stored(), "{:?}", resp.cache_status());
    }
    assert!(get(&node.url("/swr"), &[]).await.is_stored());
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // stale-while-revalidate: served stale at once, the background refresh held at the origin
    let stale = get(&node.url("/swr"), &[]).await;
    assert_eq!((stale.status, stale.text()), (200, "swr 0\n".to_string()));
    assert!(origin.wait_for_hits_for_async("/swr", 2, BOUND).await);

    let post = tokio::spawn({
        let url = node.url("/submit");
        async move {
            send(
                &http_client(),
                "POST",
                &url,
                &[],
                Some(Bytes::from("y".repeat(64))),
            )
            .await
        }
    });
    let hot: Vec<_> = (0..4)
        .map(|_| {
            let url = node.url("/hot");
            tokio::spawn(async move { try_get(&url, &[]).await })
        })
        .collect();
    let big = tokio::spawn({
        let url = node.url("/big");
        async move { try_get(&url, &[]).await }
    });
    let h2big = tokio::spawn({
        let url = node.url("/h2big");
        async move { send(&h2c_client(), "GET", &url, &[], None).await }
    });
    for path in ["/submit", "/hot", "/big", "/h2big"] {
        assert!(
            origin.wait_for_hits_for_async(path, 1, BOUND).await,
            "{path} never reached the origin"
        );
    }
    // a reload changing reloadable keys only, while all of the above are in flight
    let reloaded = node_config(
        port,
        addr,
        "after",
        "[cache]\ndefault_ttl = \"30s\"\nlock_timeout = \"20s\"\n",
    );
    assert!(sighup_with(&node, &reloaded));
    gate.open();

    let whole: Vec<u8> = big_body().concat();
    let post = within(BOUND, "the POST", post)
        .await
        .unwrap()
        .expect("POST");
    assert_eq!(
        (post.status, post.text()),
        (200, "posted 64 bytes\n".to_string())
    );
    for request in hot {
        let resp = within(BOUND, "a coalesced /hot", request)
            .await
            .unwrap()
            .expect("/hot");
        assert_eq!((resp.status, resp.text()), (200, "hot\n".to_string()));
    }
    for (what, request) in [("/big", big), ("/h2big over h2c", h2big)] {
        let resp = within(Duration::from_secs(60), what, request)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        assert_eq!(resp.status, 200, "{what}");
        assert!(
            resp.body[..] == whole[..],
            "{what}: {} bytes",
            resp.body.len()
        );
    }
    assert_eq!(
        origin.hits_for("/hot"),
        1,
        "the /hot waiters were not coalesced"
    );
    // the background refresh stored its answer
    let refreshed = poll_until_async(BOUND, || {
        swr_served.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    assert!(refreshed);
    let mut swr_now = String::new();
    for _ in 0..200 {
        swr_now = get(&node.url("/swr"), &[]).await.text();
        if swr_now == "swr 1\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(swr_now, "swr 1\n", "the refresh across the reload was lost");
    // nothing stored was lost, and what was filled across the reload is stored
    for path in [
        "/kept/0", "/kept/1", "/kept/2", "/kept/3", "/hot", "/big", "/h2big",
    ] {
        let resp = get(&node.url(path), &[]).await;
        assert!(resp.is_hit(), "{path}: {:?}", resp.cache_status());
        assert!(via(&resp).contains("after"), "{path}: {}", via(&resp));
    }
    for path in ["/kept/0", "/big", "/h2big"] {
        assert_eq!(origin.hits_for(path), 1, "{path} refetched");
    }
    node.assert_no_panic();
}

/// A WebSocket origin echoing every data frame (as tests/upgrade_tunnels.rs's).
async fn websocket_echo_origin() -> std::net::SocketAddr {
    use futures_util::{SinkExt, StreamExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(msg)) = ws.next().await {
                    if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_tunnel_open_across_reloads_keeps_echoing_and_closes_normally() {
    let origin = websocket_echo_origin().await;
    let node = LacquerProcess::start_on_free_port(|port| node_config(port, origin, "a", ""));
    let url = format!("ws://127.0.0.1:{}/chat", node.port());
    let (mut ws, response) = tokio_tungstenite::connect_async(&url).await.unwrap();
    assert_eq!(response.status(), 101);
    assert_echoes(&mut ws, "before").await;
    for (i, extra) in [
        "[proxy.x]\n",                             // refused (unknown key)
        "[fairness]\nmax_in_flight = 1\n",         // applied
        "[proxy]\ntunnel_idle_timeout = \"1s\"\n", // refused (a second [proxy])
        "",                                        // applied
    ]
    .iter()
    .enumerate()
    {
        sighup_with(
            &node,
            &node_config(node.port(), origin, &format!("v{i}"), extra),
        );
        assert_echoes(&mut ws, &format!("after reload {i}")).await;
    }
    assert_closes_normally(ws).await;
    node.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Hostile and broken files
// ---------------------------------------------------------------------------------------------

/// Eight cacheable pages through the proxy at `port`, with their bodies.
fn pages(port: u16) -> Vec<(String, String)> {
    (0..8)
        .map(|i| {
            let path = format!("/page/{i}");
            (
                format!("http://127.0.0.1:{port}{path}"),
                format!("the page at {path}\n"),
            )
        })
        .collect()
}

fn page_origin() -> TestOrigin {
    TestOrigin::start(|req| {
        OriginResponse::ok(format!("the page at {}\n", req.path))
            .header("cache-control", "public, max-age=300")
    })
}

async fn prime(targets: &[(String, String)]) {
    for (url, body) in targets {
        let resp = get(url, &[]).await;
        assert_eq!((resp.status, resp.text()), (200, body.clone()), "{url}");
    }
    for (url, _) in targets {
        assert!(get(url, &[]).await.is_hit(), "{url} was not stored");
    }
}

/// Breaks the config file in one way.
type Breaker<'a> = Box<dyn Fn() + 'a>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_broken_file_at_sighup_is_refused_whole_and_the_running_config_keeps_serving() {
    let origin = page_origin();
    let addr = origin.addr();
    let node = LacquerProcess::start_on_free_port(|port| node_config(port, addr, "good", ""));
    let port = node.port();
    let good = node_config(port, addr, "good", "");
    let path = node.config_path().unwrap().to_path_buf();
    let targets = pages(port);
    prime(&targets).await;
    let load = SteadyLoad::start(4, targets.clone());
    assert!(load.wait_for(50, BOUND).await);

    let half = {
        let full = node_config(port, addr, "half", "[cache]\ndefault_ttl = \"30s\"\n");
        // cut inside the last key's value: not TOML
        full[..full.len() - 6].to_string()
    };
    let cases: Vec<(&str, Breaker)> = vec![
        (
            "invalid TOML",
            Box::new({
                let node = &node;
                move || node.write_config("listen = [\"127.0.0.1:1\"\n[cache\n")
            }),
        ),
        (
            "a bad value",
            Box::new({
                let (node, c) = (
                    &node,
                    node_config(port, addr, "bad", "[cache]\nmemory_size = \"12XB\"\n"),
                );
                move || node.write_config(&c)
            }),
        ),
        (
            "an unknown key",
            Box::new({
                let (node, c) = (
                    &node,
                    node_config(port, addr, "typo", "[cache]\nmemry_size = \"1MiB\"\n"),
                );
                move || node.write_config(&c)
            }),
        ),
        (
            "a half-written file",
            Box::new({
                let node = &node;
                let half = half.clone();
                move || node.write_config(&half)
            }),
        ),
        (
            "an empty file",
            Box::new({
                let node = &node;
                move || node.write_config("")
            }),
        ),
        (
            "bytes that are not UTF-8",
            Box::new({
                let path = path.clone();
                move || std::fs::write(&path, b"listen = [\"\xff\xfe\"]\n").unwrap()
            }),
        ),
        (
            "a deleted file",
            Box::new({
                let path = path.clone();
                move || std::fs::remove_file(&path).unwrap()
            }),
        ),
        (
            "a directory in its place",
            Box::new({
                let path = path.clone();
                move || {
                    std::fs::remove_file(&path).unwrap();
                    std::fs::create_dir(&path).unwrap()
                }
            }),
        ),
        (
            "an unknown upstream host name",
            Box::new({
                let (node, c) = (
                    &node,
                    node_config(port, addr, "unresolvable", "")
                        .replace(&addr.to_string(), "no-such-host.invalid:80"),
                );
                move || node.write_config(&c)
            }),
        ),
    ];
    for (what, break_it) in &cases {
        break_it();
        let applied = sighup(&node);
        assert!(
            !applied,
            "{what} was applied; stderr:\n{}",
            node.stderr_log()
        );
        let resp = get(&targets[0].0, &[]).await;
        assert!(resp.is_hit(), "after {what}: {:?}", resp.cache_status());
        assert!(
            via(&resp).contains("good"),
            "after {what}: via {}",
            via(&resp)
        );
        assert!(
            load.wait_for(20, BOUND).await,
            "the load stalled after {what}"
        );
        // put the path back as a file for the next case
        if path.is_dir() {
            std::fs::remove_dir(&path).unwrap();
        }
        std::fs::write(&path, &good).unwrap();
    }
    // and a good file still applies afterwards
    assert!(sighup_with(&node, &node_config(port, addr, "fixed", "")));
    assert!(via(&get(&targets[0].0, &[]).await).contains("fixed"));
    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.retried, 0);
    assert_eq!(origin.hits(), 8, "a refused reload lost stored pages");
    node.assert_no_panic();
}

/// A config file that blocks its reader at SIGHUP time (here a FIFO nobody writes; in the field
/// a hung network mount) delays only that reload: SIGTERM still drains and ends the process.
/// Before the fix the reload ran inline in the signal watcher, and while it blocked no other
/// signal was handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_that_blocks_on_read_at_sighup_does_not_stop_sigterm_from_draining() {
    let origin = page_origin();
    let addr = origin.addr();
    let mut node = LacquerProcess::start_on_free_port(|port| node_config(port, addr, "good", ""));
    let path = node.config_path().unwrap().to_path_buf();
    std::fs::remove_file(&path).unwrap();
    let fifo = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a plain mkfifo(3) on a path we own
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    assert!(node.signal("HUP"));
    assert!(wait_for_log(&node, "SIGHUP received", BOUND));
    // still serving
    let resp = get(&node.url("/page/x"), &[]).await;
    assert_eq!(resp.status, 200);
    assert!(node.signal("TERM"));
    let status = node.wait_exit(BOUND);
    // unblock the reader whatever happened, so the process can go
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags_nonblocking()
        .open(&path);
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM was not handled while a reload blocked on the file: {status:?}; stderr:\n{}",
        node.stderr_log()
    );
}

/// `POST /reload` with a config file that blocks its reader: the request waits for its reload,
/// but on a thread of the reload's own, not on the admin listener's runtime. Before the fix the
/// reload ran on that runtime (two threads here): two such requests held both, and a purge sent
/// then was never answered. Now purges, `/stats` and the proxy are answered meanwhile, a third
/// reload is answered 409 at once (the one waiting covers it), and once the file is written both
/// reloads apply it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_reload_blocked_on_the_config_file_holds_up_no_purge() {
    let origin = page_origin();
    let addr = origin.addr();
    let dir = TempDir::new("reload-attacks-admin-fifo");
    let token = "reload-attacks-admin-token-0123456789";
    let token_file = dir.write("token", token);
    let admin = free_port();
    let config = move |port: u16, via_name: &str| {
        node_config(
            port,
            addr,
            via_name,
            &format!(
                "[admin]\nlisten = \"127.0.0.1:{admin}\"\ntoken_file = \"{}\"\n",
                token_file.display()
            ),
        )
    };
    let node = LacquerProcess::start_on_free_port(|port| config(port, "before"));
    let port = node.port();
    assert!(poll_until(BOUND, || process_listens_on(node.pid(), admin)));
    let page = node.url("/page/purged");
    assert_eq!(get(&page, &[]).await.status, 200);
    assert!(get(&page, &[]).await.is_hit());

    let path = node.config_path().unwrap().to_path_buf();
    std::fs::remove_file(&path).unwrap();
    let fifo = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a plain mkfifo(3) on a path we own
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let blocked: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { admin_post(admin, "/reload", Some(token), "").await }))
        .collect();
    // both reach the process (one reading the FIFO, one waiting for its turn)
    assert!(poll_until(BOUND, || node
        .stderr_log()
        .matches("admin: reload asked")
        .count()
        >= 2));

    let third = tokio::time::timeout(BOUND, admin_post(admin, "/reload", Some(token), ""))
        .await
        .expect("a third reload answered at once");
    assert_eq!(third.status, 409, "{}", third.text());
    let purge = format!(r#"{{"host": "127.0.0.1:{port}", "path": "/page/purged"}}"#);
    let purged = tokio::time::timeout(BOUND, admin_post(admin, "/purge", Some(token), &purge))
        .await
        .expect("a purge answered while two reloads wait on the file");
    assert_eq!(purged.status, 200, "{}", purged.text());
    assert!(!get(&page, &[]).await.is_hit(), "purged");
    let stats = tokio::time::timeout(BOUND, admin_stat(admin, "limit")).await;
    assert!(stats.is_ok_and(|limit| limit > 0));
    for blocked in &blocked {
        assert!(
            !blocked.is_finished(),
            "a reload answered before its file was read"
        );
    }

    // the file written for one reader, then for the other once the first has applied it (a
    // FIFO gives a second writer's bytes to whichever reader has it open): both apply it
    let write_file = || {
        let written = std::fs::OpenOptions::new().write(true).open(&path);
        std::io::Write::write_all(&mut written.unwrap(), config(port, "after").as_bytes()).unwrap();
    };
    write_file();
    assert!(poll_until(BOUND, || blocked
        .iter()
        .any(|b| b.is_finished())));
    write_file();
    for blocked in blocked {
        let answer = tokio::time::timeout(BOUND, blocked).await.unwrap().unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert!(via(&get(&node.url("/page/y"), &[]).await).contains("after"));
    node.assert_no_panic();
}

trait NonBlocking {
    fn custom_flags_nonblocking(&mut self) -> &mut Self;
}

impl NonBlocking for std::fs::OpenOptions {
    fn custom_flags_nonblocking(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

// ---------------------------------------------------------------------------------------------
// Signal storms
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sighups_in_quick_succession_under_load_fail_nothing_and_the_last_file_wins() {
    let origin = page_origin();
    let addr = origin.addr();
    let node = LacquerProcess::start_on_free_port(|port| node_config(port, addr, "start", ""));
    let port = node.port();
    let targets = pages(port);
    prime(&targets).await;
    let load = SteadyLoad::start(4, targets.clone());
    assert!(load.wait_for(100, BOUND).await);
    for i in 0..20 {
        // alternating fairness (new slots each time), TTLs and via names; each file written
        // while the previous reloads may still be reading
        let extra = if i % 2 == 0 {
            "[fairness]\nmax_in_flight = 3\n[cache]\ndefault_ttl = \"5s\"\n"
        } else {
            "[balancer]\nalgorithm = \"least_loaded\"\n"
        };
        node.write_config(&node_config(port, addr, &format!("storm{i}"), extra));
        assert!(node.signal("HUP"));
    }
    node.write_config(&node_config(port, addr, "last", ""));
    assert!(node.signal("HUP"));
    assert!(
        via_becomes(&targets[0].0, "last").await,
        "the last file never applied; stderr:\n{}",
        node.stderr_log()
    );
    assert!(load.wait_for(100, BOUND).await);
    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        report.retried, 0,
        "a reload closed a connection under a request"
    );
    assert_eq!(origin.hits(), 8, "the storm lost stored pages");
    for (url, _) in &targets {
        assert!(get(url, &[]).await.is_hit(), "{url}");
    }
    node.assert_no_panic();
}

/// From the moment a starting process claims SIGHUP (first thing in `main`, before the config
/// is loaded, which may wait on DNS), a SIGHUP neither ends it nor keeps it from starting. Before
/// the fix SIGHUP was only ignored from the top of `server::serve`, after the config was loaded,
/// and a storm ended the process after 2 to 190 signals. (The moments before `main`, while the
/// dynamic loader runs, are every program's: the storm starts when `/proc` shows the claim.) An
/// operator's `systemctl reload` (or a logrotate postrotate) racing a start or a hand-over's
/// `lacquer --upgrade` hits this window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_storm_from_the_moment_a_starting_process_catches_it_does_not_end_it() {
    let origin = page_origin();
    let dir = TempDir::new("reload-attacks-early-hup");
    let mut died = Vec::new();
    for attempt in 0..10 {
        let port = free_port();
        let config = dir.write(
            &format!("lacquer-{attempt}.toml"),
            node_config(port, origin.addr(), "early", ""),
        );
        let mut child = std::process::Command::new(lacquer_bin())
            .args(["--config", config.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        let claimed = poll_until(BOUND, || hangup_caught(pid) || child_gone(&mut child));
        assert!(
            claimed,
            "attempt {attempt}: SIGHUP never caught by the starting process"
        );
        // from the moment the process caught SIGHUP until the port accepts
        let mut sent = 0;
        while !port_accepts(port) && sent < 20_000 {
            // SAFETY: signals our own child
            unsafe { libc::kill(pid, libc::SIGHUP) };
            sent += 1;
            if child.try_wait().unwrap().is_some() {
                break;
            }
        }
        let status = child.try_wait().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        if let Some(status) = status {
            died.push(format!(
                "attempt {attempt}: {status:?} after {sent} SIGHUPs"
            ));
        }
    }
    assert!(died.is_empty(), "SIGHUP ended a starting process: {died:?}");
}

/// Whether process `pid` catches SIGHUP: bit 0 of `SigCgt` in its `/proc` status.
fn hangup_caught(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| mask & 1 != 0)
}

fn child_gone(child: &mut std::process::Child) -> bool {
    child.try_wait().unwrap().is_some()
}

// ---------------------------------------------------------------------------------------------
// Signals during a drain and a hand-over
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighups_during_a_sigterm_drain_neither_cut_the_download_nor_stop_the_exit() {
    let pieces: Vec<Bytes> = (0..30)
        .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; 1024]))
        .collect();
    let whole = pieces.concat();
    let origin = TestOrigin::start(move |_| {
        OriginResponse::ok(Body::Paced {
            chunks: pieces.clone(),
            interval: Duration::from_millis(100),
        })
    });
    let addr = origin.addr();
    let mut node = LacquerProcess::start_on_free_port(|port| {
        node_config(port, addr, "a", "")
            .replace("threads = 2\n", "threads = 2\nshutdown_timeout = \"30s\"\n")
    });
    let mut response = http_client()
        .get(node.url("/download"))
        .send()
        .await
        .unwrap();
    let mut body = response.chunk().await.unwrap().unwrap().to_vec();
    assert!(node.signal("TERM"));
    // a reload asked for during the drain, with a file that changes things and one that is bad
    for (i, extra) in [
        "[cache]\ndefault_ttl = \"9s\"\n",
        "[cache]\nmemory_size = \"1XB\"\n",
        "",
    ]
    .iter()
    .enumerate()
    {
        node.write_config(&node_config(node.port(), addr, &format!("drain{i}"), extra));
        assert!(node.signal("HUP"));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            node.is_running(),
            "SIGHUP during the drain ended the process"
        );
    }
    loop {
        match within(BOUND, "the download's next piece", response.chunk()).await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => panic!(
                "cut after {} bytes: {e:?}; stderr:\n{}",
                body.len(),
                node.stderr_log()
            ),
        }
    }
    assert_eq!(body.len(), whole.len());
    assert!(body == whole);
    let status = node.wait_exit(BOUND);
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; stderr:\n{}",
        node.stderr_log()
    );
}

/// A node with a memcached tier and an upgrade socket, for hand-overs; `via_name` varies.
fn hand_over_config(
    upgrade_sock: &std::path::Path,
    memcached: &MemcachedProcess,
    addr: std::net::SocketAddr,
) -> impl Fn(u16, &str) -> String {
    let sock = upgrade_sock.display().to_string();
    let mc = memcached.addr_string();
    move |port: u16, via_name: &str| {
        node_config(
            port,
            addr,
            via_name,
            &format!(
                "[server]\nupgrade_sock = \"{sock}\"\n[cache.memcached]\nservers = [\"{mc}\"]\n"
            ),
        )
        .replace("threads = 2\n", "threads = 2\nshutdown_timeout = \"5s\"\n")
    }
}

/// Polls (GETs of `url`) until the `Via` names `via_name`; whether it did within [`BOUND`].
async fn via_becomes(url: &str, via_name: &str) -> bool {
    let deadline = std::time::Instant::now() + BOUND;
    while std::time::Instant::now() < deadline {
        if via(&get(url, &[]).await).contains(via_name) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighups_to_the_old_process_all_through_a_hand_over_fail_no_request() {
    let origin = page_origin();
    let memcached = MemcachedProcess::start();
    let dir = TempDir::new("reload-attacks-upgrade");
    let upgrade_sock = dir.path().join("upgrade.sock");
    let config = hand_over_config(&upgrade_sock, &memcached, origin.addr());
    let node = LacquerProcess::start_on_free_port(|port| config(port, "old"));
    let targets = pages(node.port());
    prime(&targets).await;
    assert!(poll_until(BOUND, || memcached.item_count() >= 8));
    let load = SteadyLoad::start(4, targets.clone());
    assert!(load.wait_for(100, BOUND).await);

    let old_pid = node.pid();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hupper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                send_signal(old_pid, "HUP");
                sent += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            sent
        })
    };
    let mut old = node;
    let successor = tokio::task::block_in_place(|| old.hand_over(&upgrade_sock));
    let status = tokio::task::block_in_place(|| old.wait_exit(Duration::from_secs(30)));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(hupper.join().unwrap() > 0);
    assert!(
        status.is_some_and(|s| s.success()),
        "old process: {status:?}; stderr:\n{}",
        old.stderr_log()
    );
    assert!(load.wait_for(100, BOUND).await);
    let report = load.stop().await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        origin.hits(),
        8,
        "the successor refetched instead of reading memcached"
    );
    successor.assert_no_panic();
}

/// A successor that already holds the listeners (and serves) does not lose a SIGHUP sent before
/// its signal watcher runs: it is held from the start of `main` and the watcher reloads once for
/// it. Before the fix SIGHUP was ignored there (`SIG_IGN` until Pingora's main loop called the
/// watcher, after the services started), silently: the operator's reload never happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_to_a_successor_that_holds_the_listeners_is_not_lost() {
    let origin = page_origin();
    let memcached = MemcachedProcess::start();
    let dir = TempDir::new("reload-attacks-upgrade-hup");
    let upgrade_sock = dir.path().join("upgrade.sock");
    let config = hand_over_config(&upgrade_sock, &memcached, origin.addr());
    let node = LacquerProcess::start_on_free_port(|port| config(port, "old"));
    let port = node.port();
    let url = node.url("/page/0");
    assert_eq!(get(&url, &[]).await.status, 200);
    let successor = tokio::task::block_in_place(|| node.hand_over(&upgrade_sock));
    // the successor holds the listening socket: the operator's reload
    successor.write_config(&config(port, "reloaded"));
    assert!(successor.signal("HUP"));
    assert!(
        via_becomes(&url, "reloaded").await,
        "the SIGHUP sent to the successor was lost; its stderr:\n{}",
        successor.stderr_log()
    );
}

/// As above, for a fresh start. Passes here: the harness returns a started node only after its
/// own checks (a 20 ms pause, the socket's owner looked up), which leaves the watcher time to
/// install its handler; the window the successor test shows exists here too, narrower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_sent_as_soon_as_a_fresh_process_accepts_is_not_lost() {
    let origin = page_origin();
    let addr = origin.addr();
    let node = LacquerProcess::start_on_free_port(|port| node_config(port, addr, "first", ""));
    node.write_config(&node_config(node.port(), addr, "second", ""));
    assert!(node.signal("HUP"));
    assert!(
        via_becomes(&node.url("/page/0"), "second").await,
        "the SIGHUP sent once the port accepted was lost; stderr:\n{}",
        node.stderr_log()
    );
}

// ---------------------------------------------------------------------------------------------
// Restart-only keys: named, and really kept (never half-applied)
// ---------------------------------------------------------------------------------------------

/// An object larger than the memory tier a reload asks for.
const LARGE: usize = 3 << 19;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_only_keys_changed_by_a_reload_are_named_and_their_running_values_kept() {
    let origin = TestOrigin::start(|req| {
        let resp = if req.path == "/large" {
            OriginResponse::generated(LARGE, 7)
        } else {
            OriginResponse::ok(format!("the page at {}\n", req.path))
        };
        resp.header("cache-control", "public, max-age=300")
    });
    let other_origin = TestOrigin::start(|_| OriginResponse::ok("the wrong origin\n"));
    let kept_mc = MemcachedProcess::start();
    let new_mc = MemcachedProcess::start();
    let dir = TempDir::new("reload-attacks-restart-keys");
    let token = "reload-attacks-admin-token-0123456789";
    let token_file = dir.write("token", token);
    let admin = free_port();
    let config = |port: u16, upstream: std::net::SocketAddr, via_name: &str, cache: &str| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nupstream = \"{upstream}\"\nthreads = 2\n\
             [log]\naccess = \"off\"\n[proxy]\nvia_name = \"{via_name}\"\n\
             [admin]\nlisten = \"127.0.0.1:{admin}\"\ntoken_file = \"{}\"\n{cache}\n",
            token_file.display()
        )
    };
    let running_cache = format!(
        "[cache]\nmemory_size = \"64MiB\"\n[cache.memcached]\nservers = [\"{}\"]\n",
        kept_mc.addr_string()
    );
    let (oaddr, other) = (origin.addr(), other_origin.addr());
    let node =
        LacquerProcess::start_on_free_port(|port| config(port, oaddr, "before", &running_cache));
    let port = node.port();
    assert!(poll_until(BOUND, || process_listens_on(node.pid(), admin)));
    let targets = pages(port);
    prime(&targets).await;
    assert!(poll_until(BOUND, || kept_mc.item_count() >= 8));
    // more than the shrunk memory tier below could hold
    let large = get(&node.url("/large"), &[]).await;
    assert_eq!(large.body.len(), LARGE);
    assert!(get(&node.url("/large"), &[]).await.is_hit());
    let limit = admin_stat(admin, "limit").await;

    // another origin, the memory tier shrunk below what is stored, the cache disabled, the
    // memcached list replaced: all restart-only; via_name reloadable
    let changed = format!(
        "[cache]\nenabled = false\nmemory_size = \"1MiB\"\nmax_object_size = \"512KiB\"\n[cache.memcached]\nservers = [\"{}\"]\n",
        new_mc.addr_string()
    );
    node.write_config(&config(port, other, "after", &changed));
    let bearer = format!("Bearer {token}");
    let answer = request(
        "POST",
        &format!("http://127.0.0.1:{admin}/reload"),
        &[("authorization", bearer.as_str())],
        None,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    for key in [
        "upstream",
        "cache.enabled",
        "cache.memory_size",
        "cache.memcached",
    ] {
        assert!(
            answer.text().contains(&format!("\"{key}\"")),
            "{key} not named: {}",
            answer.text()
        );
    }
    // the reloadable key applied, the others kept: still cached, from the same memory tier,
    // the same origin and the same memcached ring
    let resp = get(&targets[0].0, &[]).await;
    assert!(via(&resp).contains("after"), "via {}", via(&resp));
    for (url, body) in &targets {
        let resp = get(url, &[]).await;
        assert!(resp.is_hit(), "{url}: {:?}", resp.cache_status());
        assert_eq!(&resp.text(), body);
    }
    assert_eq!(
        admin_stat(admin, "limit").await,
        limit,
        "memory_size applied by a reload"
    );
    let large_again = get(&node.url("/large"), &[]).await;
    assert!(large_again.is_hit(), "{:?}", large_again.cache_status());
    assert_eq!(large_again.body, large.body);
    let fresh = node.url("/page/new");
    let first = get(&fresh, &[]).await;
    assert_eq!(
        first.text(),
        "the page at /page/new\n",
        "the upstream changed by a reload"
    );
    assert!(
        first.is_stored(),
        "the cache was disabled by a reload: {:?}",
        first.cache_status()
    );
    assert!(get(&fresh, &[]).await.is_hit());
    assert!(
        poll_until(BOUND, || kept_mc.item_count() >= 10),
        "the kept ring was not written"
    );
    assert_eq!(
        new_mc.item_count(),
        0,
        "the memcached list applied by a reload"
    );
    assert_eq!(other_origin.hits(), 0);
    node.assert_no_panic();
}
