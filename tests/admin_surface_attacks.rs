//! Attacks on the operator's and the invalidation surface as an attacker sees it: the admin
//! listener (paths, methods and `Authorization` forms that must never run an action without the
//! token), admin paths sent to the proxy port, PURGE through the proxy port from clients
//! `cache.purge_from` does not list (request bodies behind a refused or allowed PURGE, a trusted
//! proxy's `X-Forwarded-For` carrying a byte a client chose), bans that would match everything,
//! oversized and non-UTF-8 ban bodies, records a hostile memcached co-tenant writes into the
//! cluster's invalidation log, and reloads and purges together.
//!
//! Findings (2026-12-07, a breaker session's attack on 57060ca; 7 passed, 3 failed), the three
//! faults fixed in the commit that added this file: forwarding fields are split as bytes and an
//! entry that cannot be read makes the client unknown, never the trusted proxy
//! (`forwarding::reported_client`); log records dated more than `CLOCK_SKEW_ALLOWED` ahead are
//! refused (`invalidation::poll`); bytes that frame no record are skipped a byte at a time
//! (`invalidation::record::decode_from`). As written:
//!
//! * (was) FAIL `a_trusted_proxys_forwarded_for_with_a_byte_past_ascii_does_not_make_the_proxy_the_client`:
//!   a proxy in `proxy.trusted_proxies` that appends the client to the `X-Forwarded-For` line it
//!   received (nginx's `$proxy_add_x_forwarded_for`) passes on whatever the client wrote before
//!   it. One byte >= 0x80 in the client's part makes `HeaderValue::to_str` fail for the whole
//!   line, `forwarding::reported_client` drops the line (the proxy's own entry with it) and falls
//!   back to `Forwarded: for=` (also the client's words) or to the peer, the proxy itself: with
//!   the proxy on loopback and the default `purge_from` (loopback), any client may PURGE.
//!   `src/proxy/forwarding.rs` (`reported_client`, `filter_map(|v| v.to_str().ok())`). High.
//! * (was) FAIL `a_log_record_dated_in_the_future_does_not_stop_a_node_caching`: a record in the
//!   cluster's log is applied with its own `issued_ms`, however far ahead of the reader's clock.
//!   One record (CRC-32 is no authentication: anyone who can write to memcached can make one)
//!   banning prefix `/` of every host, dated a year ahead, makes every node judge every fill
//!   invalid: nothing is cached cluster-wide, every request goes to the origin, and the ban is
//!   kept until its date plus the retention (never pruned). Entries dated ahead are refused
//!   (`StoredMeta::dated_ahead`, 60 s); records are not. `src/invalidation/mod.rs` (`poll`),
//!   `src/invalidation/record.rs` (`decode_one`), `src/storage/ban_list/mod.rs` (`add`).
//!   Medium (needs write access to memcached, which the docs treat as untrusted input). Aside:
//!   both refused fills answer `Cache-Status: ...; stored` though nothing was stored.
//! * (was) FAIL `bytes_planted_before_a_log_bucket_do_not_hide_the_records_appended_after_them`: a
//!   value in a log bucket that starts with a record length past its end (two bytes, `ff ff`) is
//!   read as a record still being appended (`record::decode_from` stops there), and every
//!   record appended after it, each node's purges and bans, is never read by any other node.
//!   `append` is atomic in memcached, so a record never is half there: the reader could skip to
//!   the next `LI` magic with a valid CRC. Planting the next buckets ahead silences the log for
//!   as long as the planted keys live. `src/invalidation/record.rs` (`decode_from`). Medium.
//! * PASS (guards): admin paths sent to the proxy port reach the origin, never the admin API;
//!   path tricks (`//purge`, `/purge/../reload`, `%70urge`, case, a final dot or slash,
//!   absolute-form, HTTP/1.0) never run an action without the token; `Authorization` in another
//!   scheme, a token in the query, a second field, a token with text after it are refused;
//!   a request body behind a PURGE (refused or allowed) is never read as a request of its own;
//!   bans on an empty, blank or listed tag are refused, a tag `*` matches only that tag, a tag
//!   over 8192 bytes and a non-UTF-8 body are refused; a reload neither undoes a purge nor
//!   rotates the token without saying it needs a restart; concurrent reloads and purges are all
//!   answered and nothing purged comes back.
//!
//! Read, not tested: the token is compared as Blake2s digests with `subtle::ConstantTimeEq`
//! (`config/admin.rs`), so neither its length nor a matching prefix shows in the timing. The
//! status page escapes every name it renders (`esc()` in `status_page.html`); the names come
//! from the configuration, not from requests. `/metrics` label values are escaped by
//! `prometheus-client` and none is request data.

use lacquer_test_support as support;

use bytes::Bytes;
use lacquer::invalidation::record::{Record, RecordId};
use lacquer::invalidation::target::Target;
use serde_json::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::*;

const TOKEN: &str = "surface-token-0123456789abcdef";

/// A memory-only node with an admin listener taking [`TOKEN`] (from a file the test may
/// rewrite), `extra` TOML appended.
struct AdminNode {
    proxy: LacquerProcess,
    admin: u16,
    dir: TempDir,
}

fn admin_node(origin: &TestOrigin, extra: &str) -> AdminNode {
    let dir = TempDir::new("admin-surface");
    let token_file = dir.write("token", format!("{TOKEN}\n"));
    let admin = free_port();
    let config = format!(
        "[log]\naccess = \"off\"\n{extra}\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
         token_file = \"{}\"\n",
        token_file.display()
    );
    AdminNode {
        proxy: LacquerProcess::start_simple(origin.addr(), &config),
        admin,
        dir,
    }
}

fn json(resp: &Resp) -> Value {
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", resp.status, resp.text()))
}

/// Stores `path` through `proxy` and checks the next request is a hit.
async fn stored(proxy: &LacquerProcess, path: &str) -> Resp {
    let first = get(&proxy.url(path), &[]).await;
    assert!(first.is_stored(), "{path}: {:?}", first.cache_status());
    assert!(get(&proxy.url(path), &[]).await.is_hit(), "{path}");
    first
}

/// Sends `bytes` on a fresh connection and parses every response read until the server closes
/// or goes quiet.
fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> Vec<RawResponse> {
    parse_responses(&raw_request(addr, bytes), false)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

// ---------------------------------------------------------------------------------------------
// The admin listener: routes and credentials
// ---------------------------------------------------------------------------------------------

/// The admin API's paths sent to the proxy port, with the right token, are ordinary requests
/// for the origin: nothing is purged, banned or reloaded, and no admin document is answered.
#[tokio::test]
async fn admin_paths_sent_to_the_proxy_port_never_reach_the_admin_api() {
    let origin = scripted_origin();
    let node = admin_node(&origin, "");
    let page = "/kept?cc=max-age%3D300&hdr=Surrogate-Key:kept";
    stored(&node.proxy, page).await;
    let bearer = format!("Bearer {TOKEN}");
    let auth = [
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
    ];
    for (method, path, body) in [
        ("POST", "/ban", r#"{"tag": "kept"}"#),
        ("POST", "/ban", r#"{"prefix": "/"}"#),
        ("POST", "/purge", r#"{"url": "http://127.0.0.1/kept"}"#),
        ("POST", "/reload", ""),
        ("GET", "/stats", ""),
        ("GET", "/metrics", ""),
        ("GET", "/status.json", ""),
    ] {
        let body = (!body.is_empty()).then(|| Bytes::from(body.to_string()));
        let answer = request(method, &node.proxy.url(path), &auth, body).await;
        assert!(
            !answer.text().contains("\"invalidation\"")
                && !answer.text().contains("lacquer_")
                && !answer.text().contains("\"reloaded\""),
            "{method} {path} through the proxy port answered as the admin API: {}",
            answer.text()
        );
        assert_eq!(
            origin.hits_for(path),
            1,
            "{method} {path} went to the origin"
        );
        origin.reset_counts();
    }
    assert!(get(&node.proxy.url(page), &[]).await.is_hit());
    // (the POSTs' answers invalidated their own URLs, as any unsafe method's do: `issued`
    // counts those; no ban was made)
    assert_eq!(admin_stat(node.admin, "issued_bans").await, 0);
    node.proxy.assert_no_panic();
}

/// Paths that are not the admin actions' exact spelling, methods other than POST, absolute-form
/// and HTTP/1.0 requests: none runs an action without the token, and none with the token runs
/// another action than the one its path names.
#[tokio::test]
async fn admin_path_tricks_never_run_an_action_without_the_token() {
    let origin = scripted_origin();
    let node = admin_node(&origin, "");
    let page = "/tricks?cc=max-age%3D300&hdr=Surrogate-Key:t";
    stored(&node.proxy, page).await;
    let addr = local_addr(node.admin);
    let body = r#"{"tag": "t"}"#;
    let targets = [
        "/ban".to_string(),
        "//ban".to_string(),
        "/ban/".to_string(),
        "/ban.".to_string(),
        "/BAN".to_string(),
        "/%62an".to_string(),
        "/ban%00".to_string(),
        "/health/../ban".to_string(),
        "/ban/../reload".to_string(),
        "/./ban".to_string(),
        "/ban?token=".to_string() + TOKEN,
        format!("http://127.0.0.1:{}/ban", node.admin),
        format!("http://evil.example/ban?access_token={TOKEN}"),
    ];
    for version in ["HTTP/1.1", "HTTP/1.0"] {
        for target in &targets {
            for method in ["POST", "PUT", "PATCH", "GET", "BAN", "PURGE"] {
                let text = format!(
                    "{method} {target} {version}\r\nHost: 127.0.0.1\r\n\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let answers = exchange(addr, text.as_bytes());
                for answer in &answers {
                    assert!(
                        answer.status >= 400,
                        "{method} {target} {version} without a token: {} {}",
                        answer.status,
                        answer.text()
                    );
                }
            }
        }
    }
    assert_eq!(admin_stat(node.admin, "issued").await, 0);
    assert!(get(&node.proxy.url(page), &[]).await.is_hit());

    // with the token, a path other than the action's exact one runs no action at all
    for target in [
        "//ban",
        "/ban/",
        "/ban.",
        "/BAN",
        "/%62an",
        "/ban/../reload",
    ] {
        let text = format!(
            "POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        let answers = exchange(addr, text.as_bytes());
        assert_eq!(answers.len(), 1, "{target}");
        assert!(
            answers[0].status == 404 || answers[0].status == 400,
            "{target}: {} {}",
            answers[0].status,
            answers[0].text()
        );
        assert!(
            !answers[0].text().contains("\"reloaded\""),
            "{target} reloaded"
        );
    }
    assert_eq!(admin_stat(node.admin, "issued").await, 0);
    assert!(get(&node.proxy.url(page), &[]).await.is_hit());
    node.proxy.assert_no_panic();
}

/// Credentials that are not exactly `Authorization: Bearer <token>` (once) are refused: another
/// scheme carrying the token, the token in the query or another field, text after it, a second
/// `Authorization` field behind a wrong one, an empty one.
#[tokio::test]
async fn authorization_in_any_other_form_is_refused() {
    let origin = scripted_origin();
    let node = admin_node(&origin, "");
    let page = "/creds?cc=max-age%3D300&hdr=Surrogate-Key:c";
    stored(&node.proxy, page).await;
    let addr = local_addr(node.admin);
    let body = r#"{"tag": "c"}"#;
    let basic = format!("Basic {TOKEN}");
    let cases: Vec<(String, Vec<String>)> = vec![
        ("/ban".into(), vec![]),
        ("/ban".into(), vec!["Authorization:".into()]),
        ("/ban".into(), vec!["Authorization: Bearer".into()]),
        ("/ban".into(), vec!["Authorization: Bearer ".into()]),
        ("/ban".into(), vec![format!("Authorization: {basic}")]),
        ("/ban".into(), vec![format!("Authorization: Token {TOKEN}")]),
        ("/ban".into(), vec![format!("Authorization: Bearer{TOKEN}")]),
        ("/ban".into(), vec![format!("Authorization: {TOKEN}")]),
        (
            "/ban".into(),
            vec![format!("Authorization: Bearer {TOKEN} x")],
        ),
        (
            "/ban".into(),
            vec![format!("Authorization: Bearer {TOKEN}x")],
        ),
        (
            "/ban".into(),
            vec![format!("Authorization: Bearer x{TOKEN}")],
        ),
        (
            "/ban".into(),
            vec![format!("Authorization: Bearer \"{TOKEN}\"")],
        ),
        (
            "/ban".into(),
            vec![format!("Proxy-Authorization: Bearer {TOKEN}")],
        ),
        ("/ban".into(), vec![format!("X-Auth-Token: {TOKEN}")]),
        (format!("/ban?token={TOKEN}"), vec![]),
        (format!("/ban?access_token={TOKEN}"), vec![]),
        (
            "/ban".into(),
            vec![
                "Authorization: Bearer wrong-token-0123456789".into(),
                format!("Authorization: Bearer {TOKEN}"),
            ],
        ),
        (
            "/ban".into(),
            vec![format!("Authorization: Bearer wrong, Bearer {TOKEN}")],
        ),
    ];
    for (target, fields) in &cases {
        let mut text = format!("POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        for field in fields {
            text.push_str(field);
            text.push_str("\r\n");
        }
        text.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        let answers = exchange(addr, text.as_bytes());
        assert_eq!(answers.len(), 1, "{target} {fields:?}");
        assert!(
            answers[0].status == 401 || answers[0].status == 400,
            "{target} {fields:?}: {} {}",
            answers[0].status,
            answers[0].text()
        );
    }
    assert_eq!(admin_stat(node.admin, "issued").await, 0);
    assert!(get(&node.proxy.url(page), &[]).await.is_hit());
    // the scheme's case is free (RFC 9110 §11.1), for contrast
    let lower = request(
        "POST",
        &format!("http://127.0.0.1:{}/ban", node.admin),
        &[("authorization", &format!("bEaReR {TOKEN}"))],
        Some(body.into()),
    )
    .await;
    assert_eq!(lower.status, 200, "{}", lower.text());
    assert!(!get(&node.proxy.url(page), &[]).await.is_hit());
    assert!(
        !node.proxy.stderr_log().contains(TOKEN),
        "the token was logged"
    );
}

// ---------------------------------------------------------------------------------------------
// PURGE through the proxy port
// ---------------------------------------------------------------------------------------------

/// A PURGE carrying a body, refused (the client is not in `purge_from`) or carried out, is
/// answered once: its body, which spells a request, is never read as one (a desync a front
/// proxy sharing its connections would turn into a request smuggled for another client).
#[tokio::test]
async fn a_request_spelt_in_a_purge_body_is_never_served() {
    let origin = scripted_origin();
    let refusing = LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[cache]\npurge_from = [\"192.0.2.0/24\"]",
    );
    let allowing = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    for (node, expected, smuggled) in [
        (&refusing, 405, "/smuggled-refused?cc=max-age%3D300"),
        (&allowing, 404, "/smuggled-allowed?cc=max-age%3D300"),
    ] {
        let inner = format!("GET {smuggled} HTTP/1.1\r\nHost: test\r\n\r\n");
        for framing in ["length", "chunked"] {
            let text = match framing {
                "length" => format!(
                    "PURGE /nothing-here HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n{inner}",
                    inner.len()
                ),
                _ => format!(
                    "PURGE /nothing-here HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n\
                     {:x}\r\n{inner}\r\n0\r\n\r\n",
                    inner.len()
                ),
            };
            let answers = exchange(node.addr(), text.as_bytes());
            assert!(!answers.is_empty(), "{framing}: the PURGE was not answered");
            assert_eq!(answers[0].status, expected, "{framing}");
            assert_eq!(
                answers.len(),
                1,
                "{framing}: the PURGE's body was answered as a request: {:?}",
                answers
                    .iter()
                    .map(|a| (a.status, a.text()))
                    .collect::<Vec<_>>()
            );
            assert_eq!(
                origin.hits_for(smuggled),
                0,
                "{framing}: the origin was asked for the request spelt in the PURGE's body"
            );
        }
        node.assert_no_panic();
    }
}

/// A load balancer in `proxy.trusted_proxies` that appends the client's address to the
/// `X-Forwarded-For` line the client sent (nginx's `$proxy_add_x_forwarded_for`) passes on
/// whatever the client wrote before it. A byte past ASCII there must not make Lacquer drop the
/// line, the balancer's own entry with it, and take the balancer (on loopback, in the default
/// `purge_from`) or the client's own `Forwarded` for the client.
#[tokio::test]
async fn a_trusted_proxys_forwarded_for_with_a_byte_past_ascii_does_not_make_the_proxy_the_client()
{
    let origin = scripted_origin();
    // the balancer is this test's client, on 127.0.0.1; purge_from stays loopback (the default)
    let node = LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[proxy]\ntrusted_proxies = [\"127.0.0.0/8\"]",
    );
    let page = "/lb-page?cc=max-age%3D300";
    let purge = |fields: &[u8]| -> u16 {
        let mut text = format!("PURGE {page} HTTP/1.1\r\nHost: test\r\n").into_bytes();
        text.extend_from_slice(fields);
        text.extend_from_slice(b"Connection: close\r\n\r\n");
        let answers = exchange(node.addr(), &text);
        assert_eq!(answers.len(), 1, "{}", String::from_utf8_lossy(fields));
        answers[0].status
    };
    let store = || async {
        let mut conn = RawConn::connect(node.addr());
        conn.get(page, &[]);
        assert!(conn.get(page, &[]).is_hit());
    };
    store().await;
    // the client 198.51.100.7 as the balancer reports it: refused, for contrast
    assert_eq!(
        purge(b"X-Forwarded-For: 203.0.113.5, 198.51.100.7\r\n"),
        405
    );
    let mut refused_all = Vec::new();
    for fields in [
        // the client's own XFF held one byte >= 0x80; the balancer appended the real client
        b"X-Forwarded-For: 203.0.113.5\x80, 198.51.100.7\r\n".to_vec(),
        b"X-Forwarded-For: \xff, 198.51.100.7\r\n".to_vec(),
        // ... and the client also sent a Forwarded naming loopback
        b"X-Forwarded-For: \xc3\xa9, 198.51.100.7\r\nForwarded: for=127.0.0.1\r\n".to_vec(),
    ] {
        store().await;
        let status = purge(&fields);
        if status != 405 {
            refused_all.push((String::from_utf8_lossy(&fields).into_owned(), status));
        }
    }
    assert!(
        refused_all.is_empty(),
        "PURGEs from 198.51.100.7 (not in purge_from) were carried out: {refused_all:?}"
    );
    node.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Bans that would match everything, oversized and malformed bodies
// ---------------------------------------------------------------------------------------------

/// Tag bans that could be read as "everything" are refused (empty, blank, a list) or match only
/// their own tag (`*`); a tag longer than the log can carry and a body that is not UTF-8 are
/// refused; the longest tag allowed works.
#[tokio::test]
async fn tag_bans_that_could_mean_everything_are_refused_or_mean_one_tag() {
    let origin = scripted_origin();
    let node = admin_node(&origin, "");
    let tagged =
        |name: &str, tag: &str| format!("/{name}?cc=max-age%3D300&hdr=Surrogate-Key:{}", q(tag));
    let plain = tagged("plain", "a b");
    let starred = tagged("star", "*");
    stored(&node.proxy, &plain).await;
    stored(&node.proxy, &starred).await;
    for body in [
        r#"{"tag": ""}"#.to_string(),
        r#"{"tag": " "}"#.to_string(),
        r#"{"tag": "\t"}"#.to_string(),
        r#"{"tag": "a,b"}"#.to_string(),
        r#"{"tag": "a b"}"#.to_string(),
        r#"{"tag": null}"#.to_string(),
        r#"{"tag": ["a"]}"#.to_string(),
        r#"{"prefix": ""}"#.to_string(),
        r#"{"prefix": "*"}"#.to_string(),
        r#"{"host": ""}"#.to_string(),
        r#"{"host": "a/b"}"#.to_string(),
        r#"{"tag": "a", "tag": "b"}"#.to_string(),
        format!(r#"{{"tag": "{}"}}"#, "x".repeat(8193)),
    ] {
        let answer = admin_post(node.admin, "/ban", Some(TOKEN), &body).await;
        assert_eq!(
            answer.status,
            400,
            "{}: {}",
            &body[..body.len().min(60)],
            answer.text()
        );
    }
    // not UTF-8
    let raw = request(
        "POST",
        &format!("http://127.0.0.1:{}/ban", node.admin),
        &[("authorization", &format!("Bearer {TOKEN}"))],
        Some(Bytes::from_static(b"{\"tag\": \"\xff\xfe\"}")),
    )
    .await;
    assert_eq!(raw.status, 400, "{}", raw.text());
    // a body past the limit
    let huge = format!(r#"{{"tag": "a", "by": "{}"}}"#, "y".repeat(70 * 1024));
    let answer = admin_post(node.admin, "/ban", Some(TOKEN), &huge).await;
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(admin_stat(node.admin, "issued").await, 0);
    assert!(get(&node.proxy.url(&plain), &[]).await.is_hit());
    assert!(get(&node.proxy.url(&starred), &[]).await.is_hit());

    // `*` is a tag like any other: only the page tagged `*` goes
    let star = admin_post(node.admin, "/ban", Some(TOKEN), r#"{"tag": "*"}"#).await;
    assert_eq!(star.status, 200, "{}", star.text());
    assert_eq!(json(&star)["this_node"]["objects"], 1, "{}", star.text());
    assert!(get(&node.proxy.url(&plain), &[]).await.is_hit());
    assert!(!get(&node.proxy.url(&starred), &[]).await.is_hit());
    // the longest tag the log carries is taken
    let longest = admin_post(
        node.admin,
        "/ban",
        Some(TOKEN),
        &format!(r#"{{"tag": "{}"}}"#, "x".repeat(8192)),
    )
    .await;
    assert_eq!(longest.status, 200, "{}", longest.text());
    assert!(get(&node.proxy.url(&plain), &[]).await.is_hit());
    node.proxy.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// The cluster's log written by a hostile memcached co-tenant
// ---------------------------------------------------------------------------------------------

/// A record planted in the log (CRC-32 is a checksum anyone computes) banning every path of
/// every host, dated a year ahead of the node's clock. Entries dated ahead are refused
/// (`StoredMeta::dated_ahead`); a record must be too, or taken as of now: otherwise every fill
/// on every node is judged older than the ban and nothing is cached until a year after the
/// record's date.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_record_dated_in_the_future_does_not_stop_a_node_caching() {
    let origin = scripted_origin();
    let cluster = MemcachedCluster::start(1);
    let node = cluster.node_with_invalidation(&origin, "a", "poll_interval = \"100ms\"\n", "");
    let before = "/before-plant?cc=max-age%3D300";
    stored(&node.proxy, before).await;
    let year_ms = 365 * 24 * 3600 * 1000;
    let record = Record {
        id: RecordId {
            issuer: 0x0bad_c0de,
            seq: 1,
        },
        issued_ms: now_ms() + year_ms,
        soft: false,
        short_lived: false,
        target: Target::Prefix {
            host: None,
            prefix: "/".into(),
        },
        asked_by: "co-tenant".into(),
    };
    let bucket = now_ms() / 10_000;
    cluster.servers[0].set_raw(&format!("lq:inval:{bucket}"), &record.encode(), 600);
    let learned = wait_for_stat(node.admin, "learned", 1, Duration::from_secs(5)).await;
    // (learned or not, the node must go on caching)
    let after = "/after-plant?cc=max-age%3D300";
    let first = get(&node.proxy.url(after), &[]).await;
    assert_eq!(first.status, 200);
    let second = get(&node.proxy.url(after), &[]).await;
    assert!(
        second.is_hit(),
        "a page fetched after the planted record is not cached ({:?}, {:?}; records learned: \
         {learned}, bans: {}): a record dated a year ahead disables caching",
        first.cache_status(),
        second.cache_status(),
        admin_stat(node.admin, "rules").await
    );
    node.proxy.assert_no_panic();
}

/// Two bytes planted at the start of the log's current buckets (a record length running past
/// the value's end) must not hide the records nodes append after them: `append` is atomic, so
/// a record is never half written, and the reader can find the next one. Here B bans a tag A
/// holds a page of; A must learn the ban and stop serving the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_planted_before_a_log_bucket_do_not_hide_the_records_appended_after_them() {
    let origin = scripted_origin();
    let cluster = MemcachedCluster::start(1);
    let a = cluster.node_with_invalidation(&origin, "a", "poll_interval = \"100ms\"\n", "");
    let b = cluster.node_with_invalidation(&origin, "b", "poll_interval = \"100ms\"\n", "");
    let page = "/planted?cc=max-age%3D300&hdr=Surrogate-Key:planted";
    stored(&a.proxy, page).await;
    // the buckets of the next half minute, both classes, begin with a length past their end
    let bucket = now_ms() / 10_000;
    for b in bucket..=bucket + 3 {
        for class in ["", "s:"] {
            cluster.servers[0].set_raw(&format!("lq:inval:{class}{b}"), b"\xff\xff", 600);
        }
    }
    let ban = admin_post(
        b.admin,
        "/ban",
        Some(ADMIN_TOKEN),
        r#"{"tag": "planted", "wait": false}"#,
    )
    .await;
    assert_eq!(ban.status, 200, "{}", ban.text());
    assert_eq!(
        json(&ban)["memcached"]["published_to"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "{}",
        ban.text()
    );
    let learned = wait_for_stat(a.admin, "learned", 1, Duration::from_secs(5)).await;
    let served = get(&a.proxy.url(page), &[]).await;
    assert!(
        learned >= 1 && !served.is_hit(),
        "A never read B's tag ban appended after the planted bytes (learned {learned}) and \
         serves the banned page: {:?}",
        served.cache_status()
    );
    a.proxy.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Reloads
// ---------------------------------------------------------------------------------------------

/// A purge is not undone by a reload, and a reload with a rotated token says the token needs a
/// restart, and keeps taking the running one (never neither, never both).
#[tokio::test]
async fn a_reload_neither_undoes_a_purge_nor_silently_rotates_the_token() {
    let origin = scripted_origin();
    let node = admin_node(&origin, "");
    let page = "/reload-purged?cc=max-age%3D300";
    let old = stored(&node.proxy, page).await.text();
    let purge = request("PURGE", &node.proxy.url(page), &[], None).await;
    assert_eq!(purge.status, 200);
    let reload = admin_post(node.admin, "/reload", Some(TOKEN), "").await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    let after = get(&node.proxy.url(page), &[]).await;
    assert_ne!(
        after.text(),
        old,
        "the purged answer came back after a reload"
    );

    // the token rotated in its file, then a reload
    let rotated = "rotated-token-0123456789abcdef";
    node.dir.write("token", format!("{rotated}\n"));
    let reload = admin_post(node.admin, "/reload", Some(TOKEN), "").await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    let needs = json(&reload)["needs_restart"].to_string();
    let old_works = admin_post(node.admin, "/ban", Some(TOKEN), r#"{"tag": "x"}"#)
        .await
        .status;
    let new_works = admin_post(node.admin, "/ban", Some(rotated), r#"{"tag": "x"}"#)
        .await
        .status;
    match (old_works, new_works) {
        (200, 401) => assert!(
            needs.contains("admin.token"),
            "the old token still works but the reload did not say so: {needs}"
        ),
        (401, 200) => {}
        other => panic!("old token, new token after the reload: {other:?} ({needs})"),
    }
    node.proxy.assert_no_panic();
}

/// Reloads asked for all at once, while PURGEs run, are each answered (applied, or refused as
/// busy), the node stays up, and every purged page stays purged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reloads_and_purges_are_all_answered_and_nothing_purged_comes_back() {
    let origin = scripted_origin();
    let node = admin_node(&origin, "");
    let pages: Vec<String> = (0..12)
        .map(|i| format!("/busy-{i}?cc=max-age%3D300"))
        .collect();
    let mut old = Vec::new();
    for page in &pages {
        old.push(stored(&node.proxy, page).await.text());
    }
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let admin = node.admin;
        tasks.spawn(async move {
            let answer = admin_post(admin, "/reload", Some(TOKEN), "").await;
            ("reload".to_string(), answer.status, answer.text())
        });
    }
    for page in &pages {
        let url = node.proxy.url(page);
        tasks.spawn(async move {
            let answer = request("PURGE", &url, &[], None).await;
            ("purge".to_string(), answer.status, answer.text())
        });
    }
    let done = within(Duration::from_secs(20), "reloads and purges", async {
        let mut done = Vec::new();
        while let Some(one) = tasks.join_next().await {
            done.push(one.unwrap());
        }
        done
    })
    .await;
    for (what, status, text) in &done {
        let fine = match what.as_str() {
            "reload" => [200, 409, 503].contains(status),
            _ => *status == 200,
        };
        assert!(fine, "{what}: {status} {text}");
    }
    for (page, old) in pages.iter().zip(&old) {
        let again = get(&node.proxy.url(page), &[]).await;
        assert_ne!(
            &again.text(),
            old,
            "{page}: the purged answer is served again"
        );
    }
    node.proxy.assert_no_panic();
}
