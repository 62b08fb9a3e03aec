//! Attacks on the dead pooled connection rule (`src/upstream/attempts.rs`): a request that fails
//! over a reused origin connection before any byte of the answer came back goes again to the
//! same backend over a new connection, outside `balancer.retries` and unreported to passive
//! health, once per request, for idempotent methods only, within `balancer.timeouts.total`.
//!
//! The origins here are keep-alive HTTP/1.1 servers over real sockets that log every request
//! they read (its rank on its connection, method, path and body), so a test can
//! tell a reused connection from a fresh one and count what reached the origin. Each test runs on
//! the direct path (the default) and on the standard path (`STANDARD`).

use lacquer_test_support as support;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use support::*;

const NO_PASSIVE: &str = "[balancer.passive]\nenabled = false\n";
const STANDARD: &str = "[proxy]\ndirect_passes = false\ndirect_misses = false\n";
/// Both forwarding paths, named for the assertion messages.
const PATHS: [(&str, &str); 2] = [("direct", ""), ("standard", STANDARD)];
/// `DEAD_POOLED_RETRIES` in `src/upstream/attempts.rs`: the most dead pooled connections one
/// request may go on after (the attempt after one connects anew, so it meets no other).
const DEAD_POOLED_RETRIES: usize = 1;

/// A whole `200` with `body`, never stored, keep-alive.
fn answer_ok(stream: &mut TcpStream, body: &str) {
    let _ = stream.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    let _ = stream.flush();
}

/// The origin of the pool's race taken to the extreme: it answers the first request of every
/// connection and keeps the connection open, but closes it unanswered when a second request
/// arrives on it. Every pooled connection the proxy takes is dead, and nothing tells it so while
/// the connection sits idle.
fn reused_connections_die() -> KeepAliveOrigin {
    KeepAliveOrigin::start(|seen, stream| {
        if seen.nth > 1 {
            return Then::Close;
        }
        answer_ok(stream, "ok");
        Then::KeepAlive
    })
}

/// [`start_balancer`] with an admin listener; returns the process and its admin port.
fn start_balancer_with_admin(backends: &[(SocketAddr, u32)], extra: &str) -> (LacquerProcess, u16) {
    LacquerProcess::start_with_admin(|port, admin| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 2\n{}\n{extra}\n\
             [admin]\nlisten = \"127.0.0.1:{admin}\"\n",
            upstreams_toml(backends)
        )
    })
}

/// `(failures, ejections)` of the backend at `addr`, from the admin's `/stats`.
async fn backend_health(admin: u16, addr: SocketAddr) -> (u64, u64) {
    let text = get(&format!("http://127.0.0.1:{admin}/stats"), &[])
        .await
        .text();
    let at = text
        .find(&format!("\"address\":\"{addr}\""))
        .unwrap_or_else(|| panic!("{addr} not in /stats: {text}"));
    let object = &text[text[..at].rfind('{').expect("the backend's object")..at];
    (stat_in(object, "failures"), stat_in(object, "ejections"))
}

/// Sends `n` GETs for `/fill/{tag}/{i}` at once, each on a client (and so a client connection)
/// of its own. The origin must hold each first answer until all `n` requests arrived (see
/// [`barrier_then_die`]): the proxy then opens `n` origin connections, all left in its idle pool.
async fn fill_the_pool(lacquer: &LacquerProcess, tag: &str, n: usize) {
    let mut tasks = Vec::new();
    for i in 0..n {
        let url = lacquer.url(&format!("/fill/{tag}/{i}"));
        tasks.push(tokio::spawn(async move {
            send(&http_client(), "GET", &url, &[], None).await
        }));
    }
    for task in tasks {
        let resp = task.await.unwrap().expect("a fill request");
        assert_eq!(resp.status, 200, "a fill request");
    }
    settle().await;
}

/// Gives the proxy time to put back in its idle pool the origin connections of the answers just
/// read: Pingora (and the direct path) releases a connection once the client's answer is out,
/// so a client's next request could otherwise overtake the release.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// [`reused_connections_die`], except that a connection's first request for `/fill/...` is held
/// until `n` such requests arrived (5 s at most), so that [`fill_the_pool`] makes `n` origin
/// connections at once.
fn barrier_then_die(n: usize) -> KeepAliveOrigin {
    let arrived = Arc::new(AtomicUsize::new(0));
    KeepAliveOrigin::start(move |seen, stream| {
        if seen.nth > 1 {
            return Then::Close;
        }
        if seen.path.starts_with("/fill/") {
            arrived.fetch_add(1, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(5);
            while !arrived.load(Ordering::SeqCst).is_multiple_of(n) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        answer_ok(stream, "ok");
        Then::KeepAlive
    })
}

// --- 1. no retry storm, and every GET answered -------------------------------------------------

/// What [`hammer`] saw: the answers, and what reached the origin.
struct Hammered {
    total: usize,
    /// Client requests answered `200 ok`.
    answered: usize,
    /// The others' outcomes (status, or transport error).
    failed: Vec<String>,
    /// Requests the origin read.
    seen: usize,
    /// Connections the origin accepted.
    accepted: usize,
}

/// 8 clients, each with a kept-alive connection to the proxy, send 25 GETs each at once (no-store
/// answers, so each goes to the origin), in front of an origin on which every reused connection
/// is dead ([`reused_connections_die`]).
async fn hammer(name: &str, path: &str) -> Hammered {
    const CLIENTS: usize = 8;
    const EACH: usize = 25;
    let origin = reused_connections_die();
    let lacquer = start_balancer(&[(origin.addr, 1)], &format!("{NO_PASSIVE}{path}"));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let base = lacquer.url(&format!("/h/{c}"));
        tasks.push(tokio::spawn(async move {
            let client = http_client();
            let mut results = Vec::new();
            for i in 0..EACH {
                let resp = send(&client, "GET", &format!("{base}/{i}"), &[], None).await;
                results.push(resp.map(|r| (r.status, r.body)).map_err(|e| e.to_string()));
            }
            results
        }));
    }
    let mut hammered = Hammered {
        total: CLIENTS * EACH,
        answered: 0,
        failed: Vec::new(),
        seen: 0,
        accepted: 0,
    };
    for task in tasks {
        for result in within(Duration::from_secs(120), "the hammer's answers", task)
            .await
            .unwrap()
        {
            match result {
                Ok((200, body)) if &body[..] == b"ok" => hammered.answered += 1,
                Ok((status, _)) => hammered.failed.push(status.to_string()),
                Err(e) => hammered.failed.push(e),
            }
        }
    }
    hammered.seen = origin.seen().len();
    hammered.accepted = origin.accepted();
    lacquer.assert_no_panic();
    eprintln!(
        "{name}: {}/{} answered, failed: {:?}; {} requests at the origin over {} connections",
        hammered.answered, hammered.total, hammered.failed, hammered.seen, hammered.accepted
    );
    hammered
}

/// The hammer makes no retry storm: at most `1 + DEAD_POOLED_RETRIES` requests reach the origin
/// per client request, and no origin connection is opened for nothing (a fresh connection is
/// always answered, a reused one never: one fresh connection per 200 the clients got).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hammer_on_dead_pooled_connections_makes_no_retry_storm() {
    for (name, path) in PATHS {
        let h = hammer(name, path).await;
        let bound = h.total * (1 + DEAD_POOLED_RETRIES);
        assert!(
            h.seen <= bound,
            "{name}: {} requests reached the origin for {} client requests (a retry storm)",
            h.seen,
            h.total
        );
        assert_eq!(
            h.accepted, h.answered,
            "{name}: origin connections against answers"
        );
        assert!(
            h.answered * 2 >= h.total,
            "{name}: only {} of {} answered",
            h.answered,
            h.total
        );
    }
}

/// The same hammer: every client request is answered 200, as a fresh connection to the origin
/// always answers. (When the retry after a dead pooled connection took the pool's next
/// connection, a request meeting four dead ones was a 502: 3 to 5 of 200 here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hammer_on_dead_pooled_connections_answers_every_get() {
    let mut wrong = Vec::new();
    for (name, path) in PATHS {
        let h = hammer(name, path).await;
        if !h.failed.is_empty() {
            wrong.push(format!(
                "{name}: {} of {} GETs not answered 200: {:?}",
                h.failed.len(),
                h.total,
                h.failed
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The deterministic form: 6 origin connections left idle (6 GETs at once), all dead; then one
/// GET, answered over a new connection after the first dead one. (Before pingora-core 0024 the
/// proxy tried 3 pooled connections outside the budget, a 4th as an ordinary failure, and with
/// one backend answered 502.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_after_many_dead_idle_connections_is_answered_over_a_new_one() {
    const POOLED: usize = 6;
    let mut wrong = Vec::new();
    for (name, path) in PATHS {
        let origin = barrier_then_die(POOLED);
        let lacquer = start_balancer(&[(origin.addr, 1)], &format!("{NO_PASSIVE}{path}"));
        fill_the_pool(&lacquer, name, POOLED).await;
        assert_eq!(origin.accepted(), POOLED, "{name}: the fill's connections");
        let resp = within(
            Duration::from_secs(20),
            "the GET after the fill",
            try_get(&lacquer.url("/after"), &[]),
        )
        .await;
        let status = resp.map(|r| r.status).map_err(|e| e.to_string());
        let seen = origin.seen_for("/after");
        if status != Ok(200) {
            wrong.push(format!(
                "{name}: {status:?}; the origin read /after {} times, {} of them on reused \
                 connections",
                seen.len(),
                seen.iter().filter(|s| s.nth > 1).count()
            ));
        }
        lacquer.assert_no_panic();
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Up to the cap, a GET meeting dead idle connections is answered: `DEAD_POOLED_RETRIES` dead
/// connections in the pool, then one GET (`retries = 1`, one backend: no ordinary retry is
/// possible). The origin reads it on at least one dead connection, at most the cap, and once on
/// a fresh one, which answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_meeting_dead_idle_connections_up_to_the_cap_is_answered() {
    for (name, path) in PATHS {
        let origin = barrier_then_die(DEAD_POOLED_RETRIES);
        let lacquer = start_balancer(
            &[(origin.addr, 1)],
            &format!("{NO_PASSIVE}[balancer.retries]\nattempts = 1\n{path}"),
        );
        fill_the_pool(&lacquer, name, DEAD_POOLED_RETRIES).await;
        assert_eq!(origin.accepted(), DEAD_POOLED_RETRIES, "{name}: the fill");
        let resp = within(
            Duration::from_secs(20),
            "the GET after the fill",
            get(&lacquer.url("/after"), &[]),
        )
        .await;
        let seen = origin.seen_for("/after");
        assert_eq!(resp.status, 200, "{name}: {seen:?}");
        assert_eq!(&resp.body[..], b"ok", "{name}");
        let dead = seen.iter().filter(|s| s.nth > 1).count();
        assert!(
            (1..=DEAD_POOLED_RETRIES).contains(&dead),
            "{name}: /after on {dead} dead connections: {seen:?}"
        );
        assert_eq!(
            seen.iter().filter(|s| s.nth == 1).count(),
            1,
            "{name}: /after on a fresh connection: {seen:?}"
        );
        lacquer.assert_no_panic();
    }
}

// --- 2. non-idempotent requests are never sent again -------------------------------------------

/// A POST over a dead pooled connection must not go again: the origin might have acted on it.
/// The origin reads each POST's body once, the client gets the proxy's 502, and the next GET
/// still works. With a second, healthy backend and a retry budget, the POST is not failed over
/// either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_over_a_dead_pooled_connection_is_never_sent_again() {
    for (name, path) in PATHS {
        for backends in [1, 2] {
            let dying = reused_connections_die();
            let healthy = KeepAliveOrigin::start(|_, stream| {
                answer_ok(stream, "ok");
                Then::KeepAlive
            });
            let mut list = vec![(dying.addr, 1)];
            if backends == 2 {
                list.push((healthy.addr, 1));
            }
            let lacquer = start_balancer(
                &list,
                &format!(
                    "[balancer]\nalgorithm = \"round_robin\"\n[balancer.retries]\nattempts = 2\n\
                     {NO_PASSIVE}{path}"
                ),
            );
            let mut met_dead = 0;
            for i in 0..6 {
                // round robin: with two backends, every other request; the GETs until one
                // reaches the dying backend leave it a pooled connection
                let before = dying.seen().len();
                let mut j = 0;
                while dying.seen().len() == before {
                    let warm = get(&lacquer.url(&format!("/warm/{i}/{j}")), &[]).await;
                    assert_eq!(warm.status, 200, "{name}/{backends}: a GET");
                    j += 1;
                    assert!(
                        j < 10,
                        "{name}/{backends}: no GET reached the dying backend"
                    );
                }
                if backends == 2 {
                    // round robin's next turn is the healthy backend's: the POST gets the one
                    // after it
                    let other = get(&lacquer.url(&format!("/other/{i}")), &[]).await;
                    assert_eq!(other.status, 200, "{name}/{backends}: a GET");
                }
                settle().await;
                let body = format!("order-{i}");
                let resp = within(
                    Duration::from_secs(20),
                    "the POST's answer",
                    send(
                        &http_client(),
                        "POST",
                        &lacquer.url(&format!("/order/{i}")),
                        &[("content-type", "text/plain")],
                        Some(Bytes::from(body.clone())),
                    ),
                )
                .await;
                let copies: Vec<Seen> = dying
                    .seen()
                    .into_iter()
                    .chain(healthy.seen())
                    .filter(|s| s.body == body.as_bytes())
                    .collect();
                assert!(
                    copies.len() <= 1,
                    "{name}/{backends}: the POST reached the origins {} times: {copies:?}",
                    copies.len()
                );
                assert!(
                    copies.iter().all(|s| s.method == "POST"),
                    "{name}/{backends}: {copies:?}"
                );
                let on_dead = dying
                    .seen()
                    .iter()
                    .any(|s| s.body == body.as_bytes() && s.nth > 1);
                if on_dead {
                    met_dead += 1;
                    // nothing came back from the origin and nothing may be sent again: the
                    // proxy's own failure answer
                    let status = resp.as_ref().map(|r| r.status).map_err(|e| e.to_string());
                    assert_eq!(status, Ok(502), "{name}/{backends}: POST {i}");
                }
            }
            if backends == 1 {
                assert!(
                    met_dead >= 4,
                    "{name}: only {met_dead} of 6 POSTs went over the pooled connection the GET left"
                );
            }
            assert!(
                met_dead > 0,
                "{name}/{backends}: no POST met a dead connection"
            );
            // the proxy still answers
            assert_eq!(get(&lacquer.url("/after"), &[]).await.status, 200, "{name}");
            lacquer.assert_no_panic();
        }
    }
}

// --- 3. a head that came back is the origin's failure, not the pool's --------------------------

/// On a reused connection the origin sends the response head (a cacheable 200 promising 1000
/// bytes) and closes before the body, or after 100 bytes of it. That is not a dead pooled
/// connection: the request is not replayed on the same backend (the origin reads it once), the
/// client never sees a whole 200, and nothing cut short is stored: the next GET goes to the
/// origin and gets the whole body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_then_a_close_on_a_reused_connection_is_not_replayed() {
    for (name, path) in PATHS {
        for sent in [0usize, 100] {
            let origin = KeepAliveOrigin::start(move |seen, stream| {
                if !seen.path.starts_with("/victim/") {
                    answer_ok(stream, "ok");
                    return Then::KeepAlive;
                }
                let mut bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\
                      Cache-Control: max-age=3600\r\n\r\n"
                    .to_vec();
                if seen.nth > 1 {
                    bytes.extend_from_slice(&vec![b'x'; sent]);
                    let _ = stream.write_all(&bytes);
                    let _ = stream.flush();
                    return Then::Close;
                }
                bytes.extend_from_slice(&[b'y'; 1000]);
                let _ = stream.write_all(&bytes);
                let _ = stream.flush();
                Then::KeepAlive
            });
            let lacquer = start_balancer(&[(origin.addr, 1)], &format!("{NO_PASSIVE}{path}"));
            let case = format!("{name}, {sent} body bytes");
            let mut victims_on_reused = 0;
            for i in 0..8 {
                // leaves one idle connection; the victim takes it
                assert_eq!(
                    get(&lacquer.url(&format!("/warm/{i}")), &[]).await.status,
                    200
                );
                settle().await;
                let victim = format!("/victim/{i}");
                let url = lacquer.url(&victim);
                let first = within(
                    Duration::from_secs(20),
                    "the victim's answer",
                    try_get(&url, &[]),
                )
                .await;
                let seen = origin.seen_for(&victim);
                assert_eq!(
                    seen.len(),
                    1,
                    "{case}: a head then a close was sent again: {seen:?}"
                );
                if seen[0].nth == 1 {
                    // the warm GET's connection was not back in the pool yet: nothing to see
                    continue;
                }
                victims_on_reused += 1;
                if let Ok(resp) = &first {
                    assert!(
                        resp.status == 502 || resp.body.len() < 1000,
                        "{case}: {} with {} bytes after the origin cut its answer",
                        resp.status,
                        resp.body.len()
                    );
                }
                // nothing cut short was stored: the origin is asked again, whole this time
                let again = within(Duration::from_secs(20), "the second GET", get(&url, &[])).await;
                assert_eq!(
                    origin.seen_for(&victim).len(),
                    2,
                    "{case}: the cut answer was served from the cache"
                );
                assert_eq!(again.status, 200, "{case}");
                assert_eq!(again.body.len(), 1000, "{case}");
                assert!(again.body.iter().all(|b| *b == b'y'), "{case}: cut bytes");
            }
            assert!(
                victims_on_reused >= 4,
                "{case}: only {victims_on_reused} of 8 victims took the pooled connection"
            );
            lacquer.assert_no_panic();
        }
    }
}

// --- 4. passive health -------------------------------------------------------------------------

/// `[balancer.passive]` with `failures = 2`: a backend every reused connection of which is dead
/// meets a dead pooled connection on nearly every request round robin sends it, and must be
/// neither charged a failure nor ejected for it (it keeps getting its share of requests). Then
/// it fails for real (every connection closed unanswered, fresh ones too): it is charged and
/// ejected, and the requests go to the other backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_pooled_connections_alone_never_eject_a_backend() {
    for (name, path) in PATHS {
        let broken = Arc::new(AtomicBool::new(false));
        let flag = broken.clone();
        let dying = KeepAliveOrigin::start(move |seen, stream| {
            if seen.nth > 1 || flag.load(Ordering::SeqCst) {
                return Then::Close;
            }
            answer_ok(stream, "dying");
            Then::KeepAlive
        });
        let healthy = KeepAliveOrigin::start(|_, stream| {
            answer_ok(stream, "healthy");
            Then::KeepAlive
        });
        let (lacquer, admin) = start_balancer_with_admin(
            &[(dying.addr, 1), (healthy.addr, 1)],
            &format!(
                "[balancer]\nalgorithm = \"round_robin\"\n\
                 [balancer.passive]\nenabled = true\nfailures = 2\nwindow = \"60s\"\n\
                 cooldown = \"60s\"\ncount_5xx = true\n\
                 [balancer.retries]\nattempts = 1\n{path}"
            ),
        );
        let mut from_dying = 0;
        for i in 0..20 {
            let resp = get(&lacquer.url(&format!("/p/{i}")), &[]).await;
            assert_eq!(resp.status, 200, "{name}: request {i}");
            if &resp.body[..] == b"dying" {
                from_dying += 1;
            }
        }
        let dead = dying.seen().iter().filter(|s| s.nth > 1).count();
        assert!(
            dead >= 5,
            "{name}: only {dead} requests met a dead pooled connection"
        );
        assert!(
            from_dying >= 8,
            "{name}: the backend with dead pooled connections answered only {from_dying} of 20"
        );
        assert_eq!(
            backend_health(admin, dying.addr).await,
            (0, 0),
            "{name}: dead pooled connections were charged to the backend (failures, ejections)"
        );
        assert!(
            !lacquer.stderr_log().contains("ejected"),
            "{name}: {}",
            lacquer.stderr_log()
        );

        // now it fails for real: charged, ejected, and passed over
        broken.store(true, Ordering::SeqCst);
        for i in 0..10 {
            let resp = get(&lacquer.url(&format!("/q/{i}")), &[]).await;
            assert_eq!(resp.status, 200, "{name}: request {i} after the break");
            assert_eq!(&resp.body[..], b"healthy", "{name}");
        }
        let (failures, ejections) = backend_health(admin, dying.addr).await;
        assert!(
            failures >= 2 && ejections >= 1,
            "{name}: a backend resetting fresh connections: {failures} failures, {ejections} \
             ejections"
        );
        let before = dying.seen().len();
        for i in 0..10 {
            let resp = get(&lacquer.url(&format!("/r/{i}")), &[]).await;
            assert_eq!(&resp.body[..], b"healthy", "{name}");
        }
        assert_eq!(
            dying.seen().len(),
            before,
            "{name}: an ejected backend still got requests"
        );
        lacquer.assert_no_panic();
    }
}

/// The passive side: a backend with 4 dead connections idle in the pool (and a healthy one
/// beside it), `failures = 1`. The first GET round robin sends to it meets one dead connection
/// and goes again over a new one: nothing is charged to the backend, which no new connection
/// ever failed. (When the retries took pooled connections, the 4th dead one was an ordinary
/// failure, charged to passive health, and ejected the backend.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_of_dead_idle_connections_is_not_charged_to_the_backend() {
    const POOLED: usize = 4;
    let mut wrong = Vec::new();
    for (name, path) in PATHS {
        let dying = barrier_then_die(POOLED);
        let healthy = KeepAliveOrigin::start(|_, stream| {
            answer_ok(stream, "ok");
            Then::KeepAlive
        });
        let (lacquer, admin) = start_balancer_with_admin(
            &[(dying.addr, 1), (healthy.addr, 1)],
            &format!(
                "[balancer]\nalgorithm = \"round_robin\"\n\
                 [balancer.passive]\nenabled = true\nfailures = 1\nwindow = \"60s\"\n\
                 cooldown = \"60s\"\n{path}"
            ),
        );
        // round robin: half of them to each backend, all at once
        fill_the_pool(&lacquer, name, 2 * POOLED).await;
        assert_eq!(dying.accepted(), POOLED, "{name}: the fill");
        let mut i = 0;
        let reached = loop {
            let p = format!("/g/{i}");
            let resp = get(&lacquer.url(&p), &[]).await;
            assert_eq!(resp.status, 200, "{name}: {p}");
            let reached = dying.seen_for(&p);
            if !reached.is_empty() {
                break reached;
            }
            i += 1;
            assert!(i < 10, "{name}: no GET reached the backend");
        };
        let health = backend_health(admin, dying.addr).await;
        if health != (0, 0) {
            wrong.push(format!(
                "{name}: (failures, ejections) = {health:?}; the backend read the GET on \
                 connections of ranks {:?} (1: fresh)",
                reached.iter().map(|s| s.nth).collect::<Vec<_>>()
            ));
        }
        lacquer.assert_no_panic();
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

// --- 5. the total deadline ---------------------------------------------------------------------

/// An origin slow to fail `/slow` on any connection (it reads the request, waits 700 ms, closes
/// unanswered), four connections idle in the pool, `balancer.timeouts.total = 1s`. The first
/// attempt meets a dead pooled connection after 700 ms and goes again outside the budget; the
/// deadline still bounds it: the client gets a 504 well within a bound, and no more than two
/// attempts reach the origin (a third would start after 1.4 s). Without `total`, the dead pooled
/// retries alone would take 1.4 s (over a new connection) to 2.8 s (over pooled ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_total_deadline_bounds_slow_dead_pooled_connections() {
    const POOLED: usize = 4;
    for (name, path) in PATHS {
        let arrived = Arc::new(AtomicUsize::new(0));
        let origin = KeepAliveOrigin::start(move |seen, stream| {
            if seen.path == "/slow" {
                std::thread::sleep(Duration::from_millis(700));
                return Then::Close;
            }
            arrived.fetch_add(1, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(5);
            while arrived.load(Ordering::SeqCst) < POOLED && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(2));
            }
            answer_ok(stream, "ok");
            Then::KeepAlive
        });
        let lacquer = start_balancer(
            &[(origin.addr, 1)],
            &format!(
                "{NO_PASSIVE}[balancer.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"20s\"\n\
                 idle = \"20s\"\ntotal = \"1s\"\n{path}"
            ),
        );
        fill_the_pool(&lacquer, name, POOLED).await;
        assert_eq!(origin.accepted(), POOLED, "{name}: the fill");
        let resp = within(
            Duration::from_secs(10),
            "an answer within balancer.timeouts.total (1 s) by far",
            try_get(&lacquer.url("/slow"), &[]),
        )
        .await;
        let seen = origin.seen_for("/slow");
        assert!(
            seen.first().is_some_and(|s| s.nth > 1),
            "{name}: the first attempt did not take a pooled connection: {seen:?}"
        );
        assert!(
            seen.len() <= 2,
            "{name}: {} attempts within a 1 s total: {seen:?}",
            seen.len()
        );
        assert_eq!(
            resp.map(|r| r.status).map_err(|e| e.to_string()),
            Ok(504),
            "{name}: attempts {seen:?}"
        );
        lacquer.assert_no_panic();
    }
}

// --- 6. a dead pooled connection after another backend's cut answer ------------------------------

/// Backend A sends a cacheable head and closes before the body (every time); backend B closes
/// every reused connection unanswered. `retries = 1`, round robin, 40 GETs. Returns how many
/// requests A cut and B's dead pooled connection then met, and the answers other than 200.
async fn cut_head_then_dead_pooled(path: &str) -> (usize, Vec<String>) {
    let cutting = KeepAliveOrigin::start(|_, stream| {
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nCache-Control: max-age=3600\r\n\r\n",
        );
        let _ = stream.flush();
        Then::Close
    });
    let dying = reused_connections_die();
    let lacquer = start_balancer(
        &[(cutting.addr, 1), (dying.addr, 1)],
        &format!(
            "[balancer]\nalgorithm = \"round_robin\"\n[balancer.retries]\nattempts = 1\n\
             {NO_PASSIVE}{path}"
        ),
    );
    let (mut bad, mut retried) = (Vec::new(), 0);
    for i in 0..40 {
        let p = format!("/c/{i}");
        let resp = within(
            Duration::from_secs(20),
            "an answer",
            try_get(&lacquer.url(&p), &[]),
        )
        .await;
        let on_dying = dying.seen_for(&p);
        if !cutting.seen_for(&p).is_empty() && on_dying.iter().any(|s| s.nth > 1) {
            retried += 1;
        }
        // a transport error or a short body: A's head had reached the client, nothing to retry
        if let Ok(resp) = resp {
            if resp.status != 200 {
                bad.push(format!(
                    "{p}: {} (A read it {} times, B on connections of ranks {:?})",
                    resp.status,
                    cutting.seen_for(&p).len(),
                    on_dying.iter().map(|s| s.nth).collect::<Vec<_>>()
                ));
            }
        }
    }
    lacquer.assert_no_panic();
    (retried, bad)
}

/// A request cut by A before its head reached the client is retried on B; there it meets B's
/// dead pooled connection, which goes again to B outside the budget like any other (nothing came
/// back on that connection): the client gets B's 200, never a 502. The direct path reads the
/// body's first bytes before the head leaves, so A's cut is always retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_pooled_connection_met_by_a_retry_after_a_cut_head_goes_again_direct() {
    let (retried, bad) = cut_head_then_dead_pooled("").await;
    assert!(bad.is_empty(), "{} of 40: {bad:#?}", bad.len());
    assert!(
        retried > 0,
        "no request was cut by A, then met B's dead connection"
    );
}

/// The same on the standard path, where A's cut is retried when it wins the race against its
/// head reaching the client. (The status of A's head was once kept for the next attempt, so B's
/// dead pooled connection looked answered: counted against the budget spent on A, reported to
/// passive health, and 12 to 17 of 40 clients got a 502. Each attempt now starts with none.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_pooled_connection_met_by_a_retry_after_a_cut_head_goes_again_standard() {
    let (retried, bad) = cut_head_then_dead_pooled(STANDARD).await;
    assert!(
        bad.is_empty(),
        "{} of 40 ({retried} retried on B): {bad:#?}",
        bad.len()
    );
}
