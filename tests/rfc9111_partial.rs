//! Partial content (RFC 9111 §3.3-3.4) with `[cache.partial]` enabled, over real sockets: a `206`
//! from the origin is stored; a range inside it is answered from it; a range beyond it fetches
//! only the missing part and the two make a complete stored response; parts of different
//! representations are never combined, and a complete response is never served from a part.
//! (Without the section, a range request on a miss fetches the whole response:
//! `rfc9110_ranges::a_range_request_on_a_miss_fetches_and_stores_the_whole_response`.)

use lacquer_test_support as support;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use support::*;

const LEN: usize = 1000;

/// The representation's version: its `ETag` is `"r<version>"` and its bytes are generated with
/// the version as seed.
type Version = Arc<AtomicU8>;

/// An origin serving one 1000-byte representation per path, `max-age=600`, with a strong
/// `ETag` and the tag `media`; it answers a single byte range with a `206` (`If-Range` honoured: another validator
/// gets the whole `200`).
fn ranged_origin(version: Version) -> TestOrigin {
    TestOrigin::start(move |req| {
        let v = version.load(Ordering::SeqCst);
        let etag = format!("\"r{v}\"");
        let body = generated_bytes(LEN, v);
        let range = req
            .header("range")
            .filter(|_| req.header("if-range").is_none_or(|tag| tag == etag))
            .and_then(parse_single_range);
        let resp = match range {
            Some((start, end)) => OriginResponse::new(206)
                .body(body[start..end].to_vec())
                .header("Content-Range", format!("bytes {start}-{}/{LEN}", end - 1)),
            None => OriginResponse::ok(body),
        };
        resp.header("Cache-Control", "max-age=600")
            .header("ETag", etag)
            .header("Surrogate-Key", "media")
            .header("Content-Type", "application/octet-stream")
    })
}

/// `bytes=a-b`, `bytes=a-` or `bytes=-n` against [`LEN`], as `[start, end)`.
fn parse_single_range(value: &str) -> Option<(usize, usize)> {
    let (first, last) = value.strip_prefix("bytes=")?.split_once('-')?;
    let (start, end) = match (first.parse::<usize>(), last.parse::<usize>()) {
        (Ok(a), Ok(b)) => (a, b + 1),
        (Ok(a), Err(_)) => (a, LEN),
        (Err(_), Ok(n)) => (LEN - n, LEN),
        _ => return None,
    };
    (start < end.min(LEN)).then_some((start, end.min(LEN)))
}

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[cache.partial]\nenabled = true",
    )
}

/// Asserts a `206` of bytes `[start, end)` of representation `version`.
fn assert_part(resp: &Resp, start: usize, end: usize, version: u8) {
    assert_eq!(resp.status, 206, "{:?}", resp.headers);
    assert_eq!(
        resp.header("content-range").as_deref(),
        Some(format!("bytes {start}-{}/{LEN}", end - 1).as_str())
    );
    assert_eq!(resp.body.len(), end - start);
    assert_eq!(resp.content_length(), Some((end - start) as u64));
    assert!(
        verify_generated(&resp.body, version, start),
        "bytes {start}-{end} are not representation r{version}'s"
    );
}

/// A range request, for the one site every node serves (so two nodes share cache keys).
async fn ranged(lacquer: &LacquerProcess, path: &str, range: &str) -> Resp {
    get(&lacquer.url(path), &[SITE, ("range", range)]).await
}

/// The site both nodes serve, as a load balancer in front of them would pass it on.
const SITE: (&str, &str) = ("host", "media.example");

#[tokio::test]
async fn a_206_is_stored_and_ranges_inside_it_are_answered_from_it() {
    let origin = ranged_origin(Arc::new(AtomicU8::new(1)));
    let lacquer = proxy(&origin);
    let path = "/video";
    let first = ranged(&lacquer, path, "bytes=0-499").await;
    assert_part(&first, 0, 500, 1);
    assert!(first.is_stored(), "{:?}", first.cache_status());
    let forwarded = origin.last_request().unwrap();
    assert_eq!(
        forwarded.header("range"),
        Some("bytes=0-499"),
        "only the range is fetched"
    );
    assert_eq!(forwarded.header("accept-encoding"), Some("identity"));

    for (range, start, end) in [
        ("bytes=100-199", 100, 200),
        ("bytes=0-499", 0, 500),
        ("bytes=499-499", 499, 500),
    ] {
        let hit = ranged(&lacquer, path, range).await;
        assert!(hit.is_hit(), "{range}: {:?}", hit.cache_status());
        assert_part(&hit, start, end, 1);
        assert!(hit.age().is_some());
    }
    assert_eq!(origin.hits_for(path), 1);

    // a complete response is never served from a part: the whole is fetched and stored
    let whole = get(&lacquer.url(path), &[SITE]).await;
    assert_eq!(whole.status, 200);
    assert!(!whole.is_hit(), "{:?}", whole.cache_status());
    assert_eq!(whole.body.len(), LEN);
    assert!(verify_generated(&whole.body, 1, 0));
    assert_eq!(origin.hits_for(path), 2);
    let tail = ranged(&lacquer, path, "bytes=900-").await;
    assert!(tail.is_hit());
    assert_part(&tail, 900, 1000, 1);
    assert_eq!(origin.hits_for(path), 2);
}

#[tokio::test]
async fn a_range_beyond_the_part_fetches_only_the_missing_part_and_completes_it() {
    let origin = ranged_origin(Arc::new(AtomicU8::new(1)));
    let lacquer = proxy(&origin);
    let path = "/movie";
    assert_part(&ranged(&lacquer, path, "bytes=0-499").await, 0, 500, 1);

    // starts inside the stored part, ends after it: the client gets its range from both
    let beyond = ranged(&lacquer, path, "bytes=300-799").await;
    assert_part(&beyond, 300, 800, 1);
    assert_eq!(
        beyond.cache_fwd().as_deref(),
        Some("partial"),
        "{:?}",
        beyond.cache_status()
    );
    let fetched = origin.last_request().unwrap();
    assert_eq!(
        fetched.header("range"),
        Some("bytes=500-"),
        "only the missing part"
    );
    assert_eq!(fetched.header("if-range"), Some("\"r1\""));

    // the two parts made the complete response, stored as one
    let whole = get(&lacquer.url(path), &[SITE]).await;
    assert!(whole.is_hit(), "{:?}", whole.cache_status());
    assert_eq!(whole.status, 200);
    assert_eq!(whole.body.len(), LEN);
    assert!(verify_generated(&whole.body, 1, 0));
    assert_eq!(whole.header("etag").as_deref(), Some("\"r1\""));
    assert_part(&ranged(&lacquer, path, "bytes=-10").await, 990, 1000, 1);
    assert_eq!(origin.hits_for(path), 2);
}

#[tokio::test]
async fn a_range_after_a_gap_fetches_from_the_end_of_the_part() {
    let origin = ranged_origin(Arc::new(AtomicU8::new(1)));
    let lacquer = proxy(&origin);
    let path = "/gap";
    assert_part(&ranged(&lacquer, path, "bytes=0-99").await, 0, 100, 1);
    let after = ranged(&lacquer, path, "bytes=700-749").await;
    assert_part(&after, 700, 750, 1);
    assert_eq!(
        origin.last_request().unwrap().header("range"),
        Some("bytes=100-")
    );
    let whole = get(&lacquer.url(path), &[SITE]).await;
    assert!(whole.is_hit(), "{:?}", whole.cache_status());
    assert!(verify_generated(&whole.body, 1, 0) && whole.body.len() == LEN);
    assert_eq!(origin.hits_for(path), 2);
}

#[tokio::test]
async fn parts_of_different_representations_are_never_combined() {
    let version = Arc::new(AtomicU8::new(1));
    let origin = ranged_origin(version.clone());
    let lacquer = proxy(&origin);
    let path = "/changing";
    assert_part(&ranged(&lacquer, path, "bytes=500-999").await, 500, 1000, 1);

    // the representation changes: its first half does not join r1's second half
    version.store(2, Ordering::SeqCst);
    let head = ranged(&lacquer, path, "bytes=0-499").await;
    assert_part(&head, 0, 500, 2);
    // the r2 part replaced the r1 part: a range in r1's old part is fetched (as r2's tail,
    // which completes r2), never served from r1's bytes
    let tail = ranged(&lacquer, path, "bytes=600-699").await;
    assert_part(&tail, 600, 700, 2);
    let whole = get(&lacquer.url(path), &[SITE]).await;
    assert!(whole.is_hit(), "{:?}", whole.cache_status());
    assert!(verify_generated(&whole.body, 2, 0) && whole.body.len() == LEN);
    assert_eq!(origin.hits_for(path), 3);
}

#[tokio::test]
async fn a_changed_representation_answers_the_tail_fetch_with_the_whole_response() {
    let version = Arc::new(AtomicU8::new(1));
    let origin = ranged_origin(version.clone());
    let lacquer = proxy(&origin);
    let path = "/replaced";
    assert_part(&ranged(&lacquer, path, "bytes=0-99").await, 0, 100, 1);
    version.store(3, Ordering::SeqCst);
    // If-Range "r1" fails at the origin: the whole r3 comes back, is stored, and the client
    // gets its range of r3
    let beyond = ranged(&lacquer, path, "bytes=50-149").await;
    assert_part(&beyond, 50, 150, 3);
    assert_eq!(
        origin.last_request().unwrap().header("if-range"),
        Some("\"r1\"")
    );
    let whole = get(&lacquer.url(path), &[SITE]).await;
    assert!(whole.is_hit(), "{:?}", whole.cache_status());
    assert!(verify_generated(&whole.body, 3, 0) && whole.body.len() == LEN);
    // the r1 part is gone with it: a range inside it is r3's, from the complete object
    let old_part = ranged(&lacquer, path, "bytes=0-9").await;
    assert!(old_part.is_hit());
    assert_part(&old_part, 0, 10, 3);
    assert_eq!(origin.hits_for(path), 2);
}

#[tokio::test]
async fn purging_the_url_removes_its_part() {
    let origin = ranged_origin(Arc::new(AtomicU8::new(1)));
    let lacquer = proxy(&origin);
    let path = "/purged";
    assert_part(&ranged(&lacquer, path, "bytes=0-99").await, 0, 100, 1);
    assert!(ranged(&lacquer, path, "bytes=0-9").await.is_hit());
    let purged = request("PURGE", &lacquer.url(path), &[SITE], None).await;
    assert_eq!(purged.status, 200);
    let after = ranged(&lacquer, path, "bytes=0-9").await;
    assert!(!after.is_hit(), "{:?}", after.cache_status());
    assert_part(&after, 0, 10, 1);
    assert_eq!(origin.hits_for(path), 2);
}

#[tokio::test]
async fn a_ban_of_its_tag_removes_the_part() {
    let origin = ranged_origin(Arc::new(AtomicU8::new(1)));
    let dir = TempDir::new("partial-ban");
    let token = "partial-ban-token-0123456789abcdef";
    let token_file = dir.write("token", format!("{token}\n"));
    let admin = free_port();
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        &format!(
            "[log]\naccess = \"off\"\n[cache.partial]\nenabled = true\n{}",
            admin_toml(admin, &token_file, "n1")
        ),
    );
    let path = "/banned";
    let part = ranged(&lacquer, path, "bytes=0-99").await;
    assert_part(&part, 0, 100, 1);
    assert!(!part.has_header("surrogate-key"), "the tag field is ours");
    assert!(ranged(&lacquer, path, "bytes=0-9").await.is_hit());
    let ban = admin_post(admin, "/ban", Some(token), r#"{"tag": "media"}"#).await;
    assert_eq!(ban.status, 200, "{}", ban.text());
    let after = ranged(&lacquer, path, "bytes=0-9").await;
    assert!(!after.is_hit(), "{:?}", after.cache_status());
    assert_part(&after, 0, 10, 1);
    assert_eq!(origin.hits_for(path), 2);
}

/// A node with partial content over one memcached server; returns it and its admin port.
fn shared_node(origin: &TestOrigin, memcached: &MemcachedProcess) -> (LacquerProcess, u16) {
    let admin = free_port();
    let extra = format!(
        "[log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n[cache.partial]\n\
         enabled = true\n[cache.memcached]\nservers = [\"{}\"]\nlocal_ttl = \"30s\"",
        memcached.addr()
    );
    (LacquerProcess::start_simple(origin.addr(), &extra), admin)
}

#[tokio::test]
async fn parts_stay_on_their_node_and_the_completed_object_is_shared_through_memcached() {
    let memcached = MemcachedProcess::start();
    let origin = ranged_origin(Arc::new(AtomicU8::new(1)));
    let (a, admin_a) = shared_node(&origin, &memcached);
    let (b, _) = shared_node(&origin, &memcached);
    let path = "/shared";
    assert_part(&ranged(&a, path, "bytes=0-499").await, 0, 500, 1);
    assert_eq!(
        admin_stat(admin_a, "writes").await,
        0,
        "a part is not written to memcached"
    );
    // the other node has no part: it asks the origin
    let elsewhere = ranged(&b, path, "bytes=0-9").await;
    assert!(!elsewhere.is_hit(), "{:?}", elsewhere.cache_status());
    assert_part(&elsewhere, 0, 10, 1);
    assert_eq!(origin.hits_for(path), 2);

    // node a completes its part; the complete object goes to memcached like any fill
    assert_part(&ranged(&a, path, "bytes=500-999").await, 500, 1000, 1);
    let mut writes = 0;
    for _ in 0..100 {
        writes = admin_stat(admin_a, "writes").await;
        if writes >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(writes, 1);
    let whole = get(&b.url(path), &[SITE]).await;
    assert!(whole.is_hit(), "{:?}", whole.cache_status());
    assert!(verify_generated(&whole.body, 1, 0) && whole.body.len() == LEN);
    assert_eq!(origin.hits_for(path), 3);
}

#[tokio::test]
async fn parts_are_kept_as_long_as_a_rule_keeps_the_whole_response() {
    // the origin says max-age=600; a rule keeps /video an hour, whole or in parts
    let origin = ranged_origin(Arc::new(AtomicU8::new(1)));
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[cache.partial]\nenabled = true\n\n\
         [[rules]]\npath = \"/video\"\nttl = \"1h\"",
    );
    let in_the_hour = |resp: &Resp| {
        let ttl = resp.cache_ttl().expect("a ttl in Cache-Status");
        assert!(
            (3590..=3600).contains(&ttl),
            "ttl {ttl}, not the rule's hour"
        );
    };
    let first = ranged(&lacquer, "/video", "bytes=0-499").await;
    assert_part(&first, 0, 500, 1);
    assert!(first.is_stored(), "{:?}", first.cache_status());
    let hit = ranged(&lacquer, "/video", "bytes=100-199").await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_part(&hit, 100, 200, 1);
    in_the_hour(&hit);
    // the tail completes it: the complete object keeps the rule's freshness too
    let tail = ranged(&lacquer, "/video", "bytes=400-").await;
    assert_part(&tail, 400, LEN, 1);
    let whole = get(&lacquer.url("/video"), &[SITE]).await;
    assert_eq!(whole.status, 200);
    assert!(whole.is_hit(), "{:?}", whole.cache_status());
    in_the_hour(&whole);
    assert_eq!(origin.hits_for("/video"), 2);

    // outside the rule a part keeps the origin's ten minutes
    ranged(&lacquer, "/audio", "bytes=0-499").await;
    let other = ranged(&lacquer, "/audio", "bytes=0-99").await;
    assert!(other.is_hit(), "{:?}", other.cache_status());
    let ttl = other.cache_ttl().unwrap();
    assert!((590..=600).contains(&ttl), "ttl {ttl}");
}
