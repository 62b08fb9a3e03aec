//! Protocol handling: HTTP/2 (h2c and TLS with ALPN), malformed requests, upstream keep-alive,
//! and the access log.

use lacquer_test_support as support;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::*;

#[tokio::test]
async fn h2c_prior_knowledge_is_served_and_cached() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let client = h2c_client();
    let url = lacquer.url("/h2?cc=max-age%3D60");
    let first = send(&client, "GET", &url, &[], None).await.unwrap();
    let second = send(&client, "GET", &url, &[], None).await.unwrap();
    assert_eq!(first.version, http::Version::HTTP_2);
    assert!(second.is_hit());
    assert_eq!(first.body, second.body);
    assert!(second.header("via").unwrap().contains("2 lacquer"));
    assert_eq!(origin.hits_for("/h2?cc=max-age%3D60"), 1);
}

#[test]
fn tls_listener_negotiates_h2_with_alpn() {
    let origin = scripted_origin();
    let dir = TempDir::new("lacquer-tls");
    let tls = self_signed_cert(dir.path());
    let tls_port = free_port();
    let extra = format!(
        "[log]\naccess = \"off\"\n{}",
        tls.tls_toml(&format!("127.0.0.1:{tls_port}"))
    );
    let _lacquer = LacquerProcess::start_simple(origin.addr(), &extra);
    let url = format!("https://127.0.0.1:{tls_port}/tls?cc=max-age%3D60");
    let curl = |extra: &[&str]| {
        let out = Command::new("curl")
            .args([
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_version} %{http_code}",
            ])
            .args(extra)
            .arg(&url)
            .output()
            .expect("curl is installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(curl(&["--http2"]), "2 200");
    assert_eq!(curl(&["--http1.1"]), "1.1 200");
    assert_eq!(
        origin.hits_for("/tls?cc=max-age%3D60"),
        1,
        "second request was a hit"
    );
}

#[test]
fn malformed_requests_get_400_and_the_server_survives() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    for garbage in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a\r\nBad Header Without Colon\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    ] {
        let answer = raw_request(lacquer.addr(), garbage);
        let status = raw_status(&answer);
        assert!(
            status == Some(400) || answer.is_empty(),
            "{:?} got {:?}",
            String::from_utf8_lossy(garbage),
            String::from_utf8_lossy(&answer)
        );
    }
    assert_eq!(origin.hits(), 0, "nothing malformed reached the origin");
    let mut conn = RawConn::connect(lacquer.addr());
    let ok = conn.get("/after?cc=max-age%3D60", &[]);
    assert_eq!(ok.status, 200);
}

#[tokio::test]
async fn keep_alive_on_both_sides_reuses_upstream_connections() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let client = http_client();
    for i in 0..20 {
        let url = lacquer.url(&format!("/ka/{i}?cc=no-store"));
        let r = send(&client, "GET", &url, &[], None).await.unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(origin.hits(), 20);
    assert!(
        origin.connections() <= 2,
        "{} upstream connections for 20 sequential requests",
        origin.connections()
    );
}

/// An origin that answers one `no-store` request per connection, keep-alive (no `Connection:
/// close`), with the connection's number as the body; a moment later (so that the proxy has
/// usually put the connection back in its pool by then) it writes `after`, or, when `after` is
/// empty, closes its side; then it counts the connection in the returned counter and keeps it
/// open for `linger`. The pool is left holding a connection the origin has closed, or one with
/// unexpected bytes waiting on it.
fn one_answer_per_connection(
    after: &'static [u8],
    linger: Duration,
) -> (RawOrigin, Arc<AtomicUsize>) {
    let served = AtomicUsize::new(0);
    let spoiled = Arc::new(AtomicUsize::new(0));
    let counter = spoiled.clone();
    let origin = RawOrigin::answering(move |_head, stream| {
        use std::io::Write;
        let n = served.fetch_add(1, Ordering::SeqCst);
        let body = format!("connection {n}");
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes());
        let _ = stream.flush();
        std::thread::sleep(Duration::from_millis(50));
        if after.is_empty() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        } else {
            let _ = stream.write_all(after);
            let _ = stream.flush();
        }
        counter.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(linger);
    });
    (origin, spoiled)
}

/// Waits until `counter` reaches `n` (the origin has spoiled that many connections).
async fn wait_for_count(counter: &AtomicUsize, n: usize) {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while counter.load(Ordering::SeqCst) < n {
        assert!(
            std::time::Instant::now() < until,
            "the origin never got to {n}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_pooled_connection_the_origin_closed_does_not_fail_the_next_request() {
    // The origin closes each connection after its answer, while the proxy holds it idle in its
    // pool. The next request must not fail on it: the pool drops it (its idle watch sees the
    // close, or the check on reuse does), or the request is retried on a new connection.
    let (origin, closed) = one_answer_per_connection(b"", Duration::ZERO);
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    let client = http_client();
    for i in 0..4 {
        let url = lacquer.url(&format!("/closed/{i}"));
        let r = send(&client, "GET", &url, &[], None).await.unwrap();
        assert_eq!(r.status, 200, "request {i}");
        assert_eq!(&r.body[..], format!("connection {i}").as_bytes());
        wait_for_count(&closed, i + 1).await;
    }
    assert_eq!(origin.accepted(), 4, "one connection per request");
}

#[tokio::test]
async fn a_pooled_connection_with_unexpected_data_is_not_reused() {
    // While the proxy holds the connection idle in its pool, the origin sends a second,
    // unrequested response on it and keeps it open. Reusing that connection would hand the next
    // request this stray answer: the pool must close it instead, and the next request gets its
    // own answer from a new connection.
    let stray = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nCache-Control: no-store\r\n\r\nstray";
    let (origin, spoiled) = one_answer_per_connection(stray, Duration::from_secs(3));
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    let client = http_client();
    for i in 0..3 {
        let url = lacquer.url(&format!("/stray/{i}"));
        let r = send(&client, "GET", &url, &[], None).await.unwrap();
        assert_eq!(r.status, 200, "request {i}");
        assert_eq!(
            &r.body[..],
            format!("connection {i}").as_bytes(),
            "request {i} got another request's answer"
        );
        wait_for_count(&spoiled, i + 1).await;
    }
    assert_eq!(origin.accepted(), 3, "one connection per request");
}

#[tokio::test]
async fn access_log_records_cache_status_as_json() {
    let origin = scripted_origin();
    let dir = TempDir::new("lacquer-log");
    let log_path = dir.path().join("access.log");
    let extra = format!(
        "[log]\naccess = \"{}\"\nformat = \"json\"",
        log_path.display()
    );
    let lacquer = LacquerProcess::start_simple(origin.addr(), &extra);
    let url = lacquer.url("/logged?cc=max-age%3D60");
    get(&url, &[("user-agent", "lacquer-test")]).await;
    get(&url, &[("user-agent", "lacquer-test")]).await;
    let mut lines = Vec::new();
    for _ in 0..50 {
        lines = std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        if lines.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].contains("\"cache\":\"miss\"") && lines[0].contains("\"status\":200"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("\"cache\":\"hit\"") && lines[1].contains("lacquer-test"),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].contains("\"uri\":\"/logged?cc=max-age%3D60\""),
        "{}",
        lines[1]
    );
}

/// A client that keeps many h2 requests for a cached page in flight and closes its connections
/// mid-load (what h2load does when its time is up, and a cheap way to make a proxy work): none of
/// those requests may reach the origin. A stream ended by its connection's end loses the mark of
/// its END_STREAM (the h2 crate ends its receiving half with the connection's error), so such a
/// request looked like a GET whose body was still coming, which is forwarded uncached: each cost
/// the origin a fetch on a new connection (7 to 130 per h2load run before the fix).
#[test]
fn h2_requests_of_closed_connections_never_reach_the_origin() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let path = "/h2-closed?cc=max-age%3D600";
    let url = lacquer.url(path);
    let h2load = |args: &[&str]| {
        let out = Command::new("h2load")
            .args(args)
            .arg(&url)
            .output()
            .expect("h2load is installed (scripts/setup.sh installs nghttp2-client)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.contains(" succeeded, "), "h2load ran: {text}");
    };
    h2load(&["-n", "1"]);
    assert_eq!(origin.heads_for(path), 1);
    // 32 connections with 10 requests in flight each, closed when the second is up
    for _ in 0..3 {
        h2load(&["-c", "32", "-m", "10", "-t", "1", "-D", "1"]);
    }
    h2load(&["-n", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // (heads: such a request went out as a GET with a chunked body that never came)
    assert_eq!(
        origin.heads_for(path),
        1,
        "requests of closed h2 connections reached the origin"
    );
}

/// A client that gives up on its h2 streams (a reset right after each request, then a connection
/// dropped with requests in flight, as a load generator does when it stops) must not make the
/// proxy fetch a cached page again: a cancelled request costs the origin nothing. (The "rapid
/// reset" pattern would otherwise turn each reset into an origin request.)
#[tokio::test]
async fn cancelled_h2_requests_for_a_cached_page_never_reach_the_origin() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let path = "/h2-cancel?cc=max-age%3D600";
    let url = lacquer.url(path);
    let client = h2c_client();
    let first = send(&client, "GET", &url, &[], None).await.unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(origin.hits_for(path), 1);

    let request = || {
        http::Request::get(url.as_str())
            .body(())
            .expect("a valid request")
    };
    // streams reset by the client as soon as they are sent
    let tcp = tokio::net::TcpStream::connect(lacquer.addr())
        .await
        .unwrap();
    let (mut h2, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    for _ in 0..200 {
        h2 = h2.ready().await.unwrap();
        let (response, mut stream) = h2.send_request(request(), true).unwrap();
        stream.send_reset(h2::Reason::CANCEL);
        drop(response);
    }
    // a connection dropped with 50 requests in flight
    let tcp = tokio::net::TcpStream::connect(lacquer.addr())
        .await
        .unwrap();
    let (mut abandoned, connection) = h2::client::handshake(tcp).await.unwrap();
    let abandoned_driver = tokio::spawn(connection);
    let mut in_flight = Vec::new();
    for _ in 0..50 {
        abandoned = abandoned.ready().await.unwrap();
        in_flight.push(abandoned.send_request(request(), true).unwrap());
    }
    tokio::task::yield_now().await;
    abandoned_driver.abort();
    drop((abandoned, in_flight));

    // requests after them are still hits, and the origin saw none of the cancelled ones
    for _ in 0..3 {
        let later = send(&client, "GET", &url, &[], None).await.unwrap();
        assert!(later.is_hit(), "a later request is a hit");
    }
    drop(h2);
    driver.abort();
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(
        origin.heads_for(path),
        1,
        "a cancelled request for a cached page reached the origin"
    );
}

/// An origin for the HTTP/2 stream tests: a request for a path starting `/held` is answered only
/// once `release` is set, or not at all if the proxy closes the connection first (counted in
/// `abandoned`); every other request is answered at once with a `max-age=600` page naming its
/// path. `held` counts the held requests received.
struct HoldingOrigin {
    origin: RawOrigin,
    held: Arc<AtomicUsize>,
    abandoned: Arc<AtomicUsize>,
    release: Arc<std::sync::atomic::AtomicBool>,
}

fn holding_origin() -> HoldingOrigin {
    use std::io::{Read, Write};
    let held = Arc::new(AtomicUsize::new(0));
    let abandoned = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (h, a, r) = (held.clone(), abandoned.clone(), release.clone());
    let origin = RawOrigin::answering(move |head, stream| {
        let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
        if path.starts_with("/held") {
            h.fetch_add(1, Ordering::SeqCst);
            stream
                .set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            let until = std::time::Instant::now() + Duration::from_secs(30);
            let mut byte = [0u8; 1];
            loop {
                if r.load(Ordering::SeqCst) || std::time::Instant::now() > until {
                    break;
                }
                match stream.read(&mut byte) {
                    // the proxy closed the connection: the request was given up
                    Ok(0) => {
                        a.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    _ => continue,
                }
            }
        }
        let body = format!("page {path}");
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: max-age=600\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes());
        let _ = stream.flush();
    });
    HoldingOrigin {
        origin,
        held,
        abandoned,
        release,
    }
}

/// Waits (up to 20 s, else the test fails naming `what`) until `done` holds.
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    assert!(
        poll_until_async(Duration::from_secs(20), done).await,
        "never: {what}"
    );
}

/// The streams of one HTTP/2 connection are processed side by side in its task: one waiting on
/// a slow origin holds up none of the others, hits or misses, sent before or after it.
#[tokio::test]
async fn an_h2_stream_waiting_on_its_origin_holds_up_no_other_stream() {
    let origin = holding_origin();
    let lacquer = LacquerProcess::start_simple(origin.origin.addr, "[log]\naccess = \"off\"");
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let cached = lacquer.url("/cached");
    assert_eq!(h2_get_text(&sender, &cached).await.0, 200);

    // a request the origin holds, on the same connection as everything after it
    let held_url = lacquer.url("/held/1");
    let held_sender = sender.clone();
    let held = tokio::spawn(async move { h2_get_text(&held_sender, &held_url).await });
    wait_until("the origin got the held request", || {
        origin.held.load(Ordering::SeqCst) == 1
    })
    .await;

    // while it waits: a hit and two misses, all answered
    let waiting = async {
        let hit = h2_get_text(&sender, &cached).await;
        let miss = h2_get_text(&sender, &lacquer.url("/miss/1")).await;
        let other = h2_get_text(&sender, &lacquer.url("/miss/2")).await;
        (hit, miss, other)
    };
    let (hit, miss, other) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the other streams were held up by the one waiting on its origin");
    assert_eq!(hit, (200, "page /cached".to_string()));
    assert_eq!(miss, (200, "page /miss/1".to_string()));
    assert_eq!(other, (200, "page /miss/2".to_string()));
    assert!(!held.is_finished(), "the held request was answered early");

    origin.release.store(true, Ordering::SeqCst);
    let answer = tokio::time::timeout(Duration::from_secs(20), held)
        .await
        .expect("the held request was never answered")
        .unwrap();
    assert_eq!(answer, (200, "page /held/1".to_string()));
    driver.abort();
}

/// A client that drops its HTTP/2 connection while streams wait on the origin: each of them is
/// given up (the origin sees its connections closed, nothing waits for it), and the proxy goes on
/// serving other connections.
#[tokio::test]
async fn an_h2_connection_dropped_with_streams_waiting_gives_them_up() {
    let origin = holding_origin();
    let lacquer = LacquerProcess::start_simple(origin.origin.addr, "[log]\naccess = \"off\"");
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let mut in_flight = Vec::new();
    for i in 0..5 {
        let url = lacquer.url(&format!("/held/{i}"));
        let sender = sender.clone();
        in_flight.push(tokio::spawn(
            async move { h2_get_text(&sender, &url).await },
        ));
    }
    wait_until("the origin got the five held requests", || {
        origin.held.load(Ordering::SeqCst) == 5
    })
    .await;
    driver.abort();
    drop(sender);
    for request in in_flight {
        request.abort();
    }
    wait_until("the proxy gave up the five origin requests", || {
        origin.abandoned.load(Ordering::SeqCst) == 5
    })
    .await;

    let (other, other_driver) = h2_connect_default(lacquer.addr()).await;
    let answer = h2_get_text(&other, &lacquer.url("/after")).await;
    assert_eq!(answer, (200, "page /after".to_string()));
    other_driver.abort();
}

/// Fetches `pages` (each a path and the length of the generated body its `len=` asks for) on
/// `sender` all at once (one stream each), each within `within`, and checks each body is the
/// origin's generated body of that length.
async fn fetch_all_at_once(
    sender: &h2::client::SendRequest<bytes::Bytes>,
    base: &str,
    pages: &[(String, usize)],
    within: std::time::Duration,
    what: &str,
) {
    let fetches = pages.iter().map(|(path, len)| {
        let url = format!("{base}{path}");
        async move { (path, len, h2_get(sender, &url, within).await) }
    });
    for (path, &len, answer) in futures_util::future::join_all(fetches).await {
        assert_eq!(answer.status, 200, "{what}: {path}");
        assert_eq!(answer.body.len(), len, "{what}: {path}: length");
        assert_eq!(
            generated_mismatch(&answer.body, 7, 0),
            None,
            "{what}: {path}: the body differs from the origin's"
        );
    }
}

/// The answers of many streams on one HTTP/2 connection, over h2c and over TLS, all arrive whole,
/// and so does a lone answer: the vendored h2 crate (`vendor/patches/h2/0001`) hands the frames
/// of a batch to the connection's write buffer without flushing it and flushes once at the end
/// of the batch, so a batch whose end were never flushed would leave its last answers waiting
/// (here: until `h2_get`'s bound fails the test). Sizes span the crate's cases: under the
/// 256 bytes its encoder copies, a kilobyte held apart as one frame, several frames, and more
/// than a stream's 64 KiB window (window updates while other streams send).
#[tokio::test]
async fn answers_of_many_streams_on_one_connection_arrive_whole_over_h2c_and_tls() {
    let origin = scripted_origin();
    let dir = TempDir::new("lacquer-h2-batch");
    let ca = TestCa::new(dir.path(), "h2-batch");
    let server = ca.server_cert("lacquer");
    let tls_port = free_port();
    let extra = format!(
        "[log]\naccess = \"off\"\n{}",
        server.tls_toml(&format!("127.0.0.1:{tls_port}"))
    );
    let lacquer = LacquerProcess::start_simple(origin.addr(), &extra);
    let within = std::time::Duration::from_secs(10);
    let sizes = [100, 1_000, 1_024, 5_000, 40_000, 100_000];
    let pages: Vec<(String, usize)> = sizes
        .iter()
        .map(|&len| (format!("/h2-batch?len={len}&cc=max-age%3D600"), len))
        .collect();
    let batch: Vec<(String, usize)> = (0..60).map(|i| pages[i % pages.len()].clone()).collect();

    let h2c = lacquer.addr();
    let tls: std::net::SocketAddr = format!("127.0.0.1:{tls_port}").parse().unwrap();
    for (what, base, connect) in [
        ("h2c", format!("http://{h2c}"), None),
        (
            "h2 over TLS",
            format!("https://localhost:{tls_port}"),
            Some(tls),
        ),
    ] {
        let (sender, _driver) = match connect {
            None => h2_connect_default(h2c).await,
            Some(addr) => h2_connect_tls(addr, &ca.cert).await,
        };
        // one at a time: each a batch of one, its frames flushed alone
        for page in &pages {
            fetch_all_at_once(&sender, &base, std::slice::from_ref(page), within, what).await;
        }
        // sixty streams at once, three times over
        for _ in 0..3 {
            fetch_all_at_once(&sender, &base, &batch, within, what).await;
        }
    }
    for (path, _) in &pages {
        // once for `http` and once for `https` (keyed apart), every other answer a hit
        assert_eq!(origin.hits_for(path), 2, "{path}: fetched once per scheme");
    }
}
