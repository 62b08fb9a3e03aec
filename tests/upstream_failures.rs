//! Origins that fail mid-response or never answer, over real sockets: a retry never meets the
//! cache write of the attempt that failed (no panic, nothing cut short is stored), a timeout is a
//! 504 and is never replayed to the backend that hung, and `balancer.timeouts.total` bounds the
//! whole request, retries included.

use lacquer_test_support as support;

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use support::*;

/// What a cacheable response cut short looks like: 1000 bytes promised, 100 sent, then closed.
fn truncated_cacheable(stream: &mut TcpStream) {
    let mut bytes =
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nCache-Control: max-age=3600\r\n\r\n".to_vec();
    bytes.extend_from_slice(&[b'x'; 100]);
    let _ = stream.write_all(&bytes);
    let _ = stream.flush();
}

/// A whole cacheable response of 1000 `y`s (`max-age` as given).
fn whole_cacheable(stream: &mut TcpStream, max_age: u32) {
    let mut bytes = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nCache-Control: max-age={max_age}\r\n\r\n"
    )
    .into_bytes();
    bytes.extend_from_slice(&[b'y'; 1000]);
    let _ = stream.write_all(&bytes);
    let _ = stream.flush();
}

/// The path of a request head (`GET /a HTTP/1.1` → `/a`).
const NO_PASSIVE: &str = "[balancer.passive]\nenabled = false\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_cacheable_response_is_never_stored_and_never_panics() {
    // `/cut/...` is cut short every time, anything else is whole
    let origin = RawOrigin::answering(|head, stream| {
        if path_of(head).starts_with("/cut/") {
            truncated_cacheable(stream)
        } else {
            whole_cacheable(stream, 3600)
        }
    });
    let lacquer = start_balancer(&[(origin.addr, 1)], NO_PASSIVE);
    for i in 0..20 {
        let url = lacquer.url(&format!("/cut/{i}"));
        // the client sees a 502 or a body cut short (when the head had already left), never the
        // promised 1000 bytes
        if let Ok(resp) = try_get(&url, &[]).await {
            assert!(
                resp.status == 502 || resp.body.len() < 1000,
                "{} with {} bytes",
                resp.status,
                resp.body.len()
            );
        }
        // nothing of it was stored: the same URL goes to the origin again
        let before = origin.accepted();
        let _ = try_get(&url, &[]).await;
        assert_eq!(
            origin.accepted(),
            before + 1,
            "a cut body was served from the cache"
        );
    }
    lacquer.assert_no_panic();
    // the only backend that cut responses short was not asked twice for any of them
    assert_eq!(origin.accepted(), 40);
    // and the proxy still works
    let whole = get(&lacquer.url("/whole"), &[]).await;
    assert_eq!(whole.status, 200);
    assert_eq!(whole.body.len(), 1000);
    assert!(get(&lacquer.url("/whole"), &[]).await.is_hit());
    lacquer.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_cacheable_response_is_retried_on_the_other_backend_without_panic() {
    let cutting = RawOrigin::answering(|_, stream| truncated_cacheable(stream));
    let whole = RawOrigin::answering(|_, stream| whole_cacheable(stream, 3600));
    // the standard path's race (a direct miss sends the head with the body's first bytes, so
    // it retries only a cut before any: the next test)
    let lacquer = start_balancer(
        &[(cutting.addr, 1), (whole.addr, 1)],
        &format!(
            "[balancer]\nalgorithm = \"round_robin\"\n{NO_PASSIVE}[proxy]\ndirect_misses = false\n"
        ),
    );
    let mut cut_then_retried = 0;
    // whether a cut response can be retried is a race between the cut and its head reaching the
    // client, which load decides per request: enough requests that some are retried on a busy
    // machine too
    for i in 0..40 {
        let before = cutting.accepted();
        match try_get(&lacquer.url(&format!("/r/{i}")), &[]).await {
            Ok(resp) if resp.status == 200 && resp.body.len() == 1000 => {
                assert!(
                    resp.body.iter().all(|b| *b == b'y'),
                    "bytes of the cut body"
                );
                if cutting.accepted() > before {
                    cut_then_retried += 1;
                }
            }
            // the head of the cut response had already reached the client: nothing to retry
            Ok(resp) => assert!(resp.body.len() < 1000),
            Err(_) => {}
        }
    }
    lacquer.assert_no_panic();
    assert!(
        cut_then_retried > 0,
        "no request went to the cutting backend and was then retried"
    );
    // nothing half-written was stored: what comes back whole is the other backend's body
    for i in 0..20 {
        if let Ok(again) = try_get(&lacquer.url(&format!("/r/{i}")), &[]).await {
            if again.body.len() == 1000 {
                assert!(again.body.iter().all(|b| *b == b'y'));
            }
        }
    }
    lacquer.assert_no_panic();
}

/// A direct miss reads the body's first bytes before the head goes to the client: an origin that
/// closes after its head and before any body byte is a failed attempt, retried on the other
/// backend every time; one that closes after some of the body leaves the client a truncated
/// answer, never stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_miss_cut_before_its_body_is_retried_and_one_cut_later_is_never_stored() {
    let head_only = RawOrigin::answering(|_, stream| {
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nCache-Control: max-age=3600\r\n\r\n",
        );
    });
    let whole = RawOrigin::answering(|_, stream| whole_cacheable(stream, 3600));
    let lacquer = start_balancer(
        &[(head_only.addr, 1), (whole.addr, 1)],
        &format!("[balancer]\nalgorithm = \"round_robin\"\n{NO_PASSIVE}"),
    );
    for i in 0..10 {
        let resp = get(&lacquer.url(&format!("/h/{i}")), &[]).await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body.len(), 1000);
        assert!(
            resp.body.iter().all(|b| *b == b'y'),
            "the whole backend's body"
        );
    }
    assert!(
        head_only.accepted() >= 5,
        "round robin met the cutting backend"
    );
    lacquer.assert_no_panic();

    let cutting = RawOrigin::answering(|_, stream| truncated_cacheable(stream));
    let lacquer = start_balancer(&[(cutting.addr, 1)], NO_PASSIVE);
    for i in 0..5 {
        let url = lacquer.url(&format!("/c/{i}"));
        if let Ok(resp) = try_get(&url, &[]).await {
            assert!(resp.body.len() < 1000, "a cut body never looks whole");
        }
        let before = cutting.accepted();
        let _ = try_get(&url, &[]).await;
        assert_eq!(cutting.accepted(), before + 1, "a cut body was stored");
    }
    lacquer.assert_no_panic();
}

/// A pooled connection the origin closed while it sat idle fails the request sent on it before
/// any of the response: the pool's race, not the backend's failure. The request goes again to
/// the same backend outside the retry budget, on either path. Here the other backend resets
/// every request, so the one retry `balancer.retries` allows is spent on it; a dead pooled
/// connection met after it must not make the request a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_pooled_connection_is_sent_again_outside_the_retry_budget() {
    use std::io::Read;
    use std::sync::atomic::{AtomicUsize, Ordering};
    for path in [
        "",
        "[proxy]\ndirect_passes = false\ndirect_misses = false\n",
    ] {
        // answers the first request of each connection and keeps it open; closes it unanswered
        // when a second request arrives on it
        let killed = Arc::new(AtomicUsize::new(0));
        let seen = killed.clone();
        let pooling = RawOrigin::answering(move |_, stream| {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nCache-Control: no-store\r\n\r\nok",
            );
            let _ = stream.flush();
            if matches!(stream.read(&mut [0; 512]), Ok(n) if n > 0) {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
        let resetting = RawOrigin::closing();
        let lacquer = start_balancer(
            &[(pooling.addr, 1), (resetting.addr, 1)],
            &format!(
                "[balancer]\nalgorithm = \"round_robin\"\n[balancer.retries]\nattempts = 1\n\
                 {NO_PASSIVE}{path}"
            ),
        );
        for i in 0..12 {
            let resp = get(&lacquer.url(&format!("/p/{i}")), &[]).await;
            assert_eq!(resp.status, 200, "request {i} ({path:?})");
            assert_eq!(&resp.body[..], b"ok");
        }
        assert!(
            killed.load(Ordering::SeqCst) > 0,
            "no request met a dead pooled connection ({path:?})"
        );
        lacquer.assert_no_panic();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revalidation_cut_short_is_retried_without_panic() {
    // each backend answers its first request for a path whole (fresh for 1 s), then cuts every
    // later one short: the stale entry's refetch meets a cut response on the backend the URL
    // hashes to, and is retried on the other
    let backend = || {
        let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        RawOrigin::answering(move |head, stream| {
            if seen.lock().unwrap().insert(path_of(head).to_string()) {
                whole_cacheable(stream, 1)
            } else {
                truncated_cacheable(stream)
            }
        })
    };
    let (a, b) = (backend(), backend());
    let lacquer = start_balancer(
        &[(a.addr, 1), (b.addr, 1)],
        &format!("[balancer]\nalgorithm = \"consistent\"\n{NO_PASSIVE}"),
    );
    // whether a refetch may be retried depends on whether the cut response's head reached the
    // client before the cut was seen (a race the machine's load decides per request): enough
    // paths that some are retried even on a busy machine
    let paths: Vec<String> = (0..24).map(|i| format!("/stale/{i}")).collect();
    for path in &paths {
        assert_eq!(get(&lacquer.url(path), &[]).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mut whole = 0;
    for path in &paths {
        if let Ok(resp) = try_get(&lacquer.url(path), &[]).await {
            if resp.status == 200 && resp.body.len() == 1000 {
                assert!(resp.body.iter().all(|b| *b == b'y'));
                whole += 1;
            }
        }
    }
    lacquer.assert_no_panic();
    assert!(
        whole > 0,
        "no stale refetch was retried to a whole response"
    );
    assert_eq!(get(&lacquer.url("/fresh"), &[]).await.status, 200);
    lacquer.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_origin_is_a_504_and_is_not_asked_again() {
    let hanging = RawOrigin::hanging();
    let lacquer = start_balancer(
        &[(hanging.addr, 1)],
        &format!(
            "[balancer.timeouts]\nfirst_byte = \"300ms\"\nidle = \"300ms\"\n\
             [balancer.retries]\nattempts = 2\n{NO_PASSIVE}"
        ),
    );
    let resp = get(&lacquer.url("/hang"), &[]).await;
    assert_eq!(
        resp.status, 504,
        "RFC 9110 §15.6.5: the origin did not answer in time"
    );
    assert_eq!(
        hanging.accepted(),
        1,
        "a request that hung was replayed to the backend that hung"
    );
    lacquer.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_is_retried_on_the_other_backend_only() {
    let hanging = RawOrigin::hanging();
    let good = Replica::start("good");
    let lacquer = start_balancer(
        &[(hanging.addr, 1), (good.addr(), 1)],
        &format!(
            "[balancer]\nalgorithm = \"round_robin\"\n\
             [balancer.timeouts]\nfirst_byte = \"300ms\"\nidle = \"300ms\"\n{NO_PASSIVE}"
        ),
    );
    for i in 0..6 {
        let resp = get(&lacquer.url(&format!("/h/{i}")), &[]).await;
        assert_eq!(resp.status, 200);
    }
    assert_eq!(
        good.served(),
        6,
        "every request ended on the backend that answers"
    );
    assert!(
        hanging.accepted() >= 1,
        "round robin never tried the hanging backend"
    );
    assert!(
        hanging.accepted() <= 6,
        "a request went to the hanging backend twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_total_deadline_bounds_the_request_across_attempts() {
    let (first, second) = (RawOrigin::hanging(), RawOrigin::hanging());
    // each attempt would wait 20 s for a first byte; the whole request may take 1 s
    let lacquer = start_balancer(
        &[(first.addr, 1), (second.addr, 1)],
        &format!(
            "[balancer.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"20s\"\nidle = \"20s\"\n\
             total = \"1s\"\n\
             [balancer.retries]\nattempts = 2\n{NO_PASSIVE}"
        ),
    );
    let resp = tokio::time::timeout(Duration::from_secs(10), get(&lacquer.url("/slow"), &[]))
        .await
        .expect(
            "the request outlived balancer.timeouts.total by far: a first-byte wait was not cut",
        );
    assert_eq!(resp.status, 504);
    assert_eq!(
        first.accepted() + second.accepted(),
        1,
        "no attempt may start once the total deadline has passed"
    );
    lacquer.assert_no_panic();
}

/// An origin's `Content-Length` in each form: one value, equal values listed or repeated, leading
/// zeros are one length and the answer is relayed whole; unequal values, a sign or a stray byte
/// frame the body ambiguously, and the answer is refused (502), never relayed or stored. For a
/// cacheable GET (the standard path's miss and the direct one) and a POST (a direct pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_s_content_length_is_read_in_every_form_the_rfc_allows_and_no_other() {
    const FORMS: [(&str, bool); 8] = [
        ("Content-Length: 5", true),
        ("Content-Length: 5, 5", true),
        ("Content-Length: 5\r\nContent-Length: 5", true),
        ("Content-Length: 005", true),
        ("Content-Length: 5\r\nContent-Length: 6", false),
        ("Content-Length: 5, 6", false),
        ("Content-Length: +5", false),
        ("Content-Length: 5x", false),
    ];
    let origin = RawOrigin::answering(|head, stream| {
        // `/cl/{i}/...`: the form numbered i
        let i: usize = path_of(head)
            .split('/')
            .nth(2)
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        let answer = format!(
            "HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\n{}\r\n\r\nhello",
            FORMS[i].0
        );
        let _ = stream.write_all(answer.as_bytes());
        let _ = stream.flush();
    });
    let config = format!("[log]\naccess = \"off\"\n{NO_PASSIVE}");
    let lacquer = LacquerProcess::start_simple(origin.addr, &config);
    for (i, (form, valid)) in FORMS.iter().enumerate() {
        let get_first = get(&lacquer.url(&format!("/cl/{i}/get")), &[]).await;
        let get_again = get(&lacquer.url(&format!("/cl/{i}/get")), &[]).await;
        let post = post(&lacquer.url(&format!("/cl/{i}/post")), &[], "q=1").await;
        for (what, resp) in [
            ("GET", &get_first),
            ("the GET again", &get_again),
            ("POST", &post),
        ] {
            if *valid {
                assert_eq!(resp.status, 200, "{form:?}, {what}");
                assert_eq!(resp.text(), "hello", "{form:?}, {what}");
            } else {
                assert_eq!(resp.status, 502, "{form:?}, {what}: {:?}", resp.text());
            }
        }
        if *valid {
            assert!(
                get_again.is_hit(),
                "{form:?}: {:?}",
                get_again.cache_status()
            );
        }
    }
}
