//! Range requests answered from a stored full response (RFC 9110 §14, RFC 9111 §3.3-3.4), and
//! HEAD from a stored GET (RFC 9110 §9.3.2), over real sockets.
//!
//! Lacquer always fetches and stores the whole response (a client's `Range` is not forwarded on
//! a miss), then serves single, suffix, open-ended and multiple ranges, honours `If-Range`, and
//! answers unsatisfiable ranges with 416.

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

const LEN: usize = 1000;

/// Stores a generated 1000-byte body with an ETag and Last-Modified; returns its path.
async fn stored(lacquer: &LacquerProcess, origin: &TestOrigin, name: &str) -> String {
    let path = format!(
        "/{name}?cc={}&len={LEN}&etag={}&lm=-10000",
        q("max-age=600"),
        q("\"r1\"")
    );
    let full = get(&lacquer.url(&path), &[]).await;
    assert_eq!(full.body.len(), LEN);
    assert!(verify_generated(&full.body, 7, 0));
    assert_eq!(origin.hits_for(&path), 1);
    path
}

#[tokio::test]
async fn single_suffix_and_open_ranges() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = stored(&lacquer, &origin, "single").await;
    for (range, start, end) in [
        ("bytes=0-99", 0, 99),
        ("bytes=500-", 500, 999),
        ("bytes=-10", 990, 999),
        ("bytes=990-5000", 990, 999),
    ] {
        let resp = get(&lacquer.url(&path), &[("range", range)]).await;
        assert_eq!(resp.status, 206, "{range}");
        assert_eq!(
            resp.header("content-range").as_deref(),
            Some(format!("bytes {start}-{end}/{LEN}").as_str()),
            "{range}"
        );
        assert_eq!(resp.body.len(), end - start + 1, "{range}");
        assert!(
            verify_generated(&resp.body, 7, start),
            "{range}: wrong bytes"
        );
        assert!(resp.is_hit());
    }
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn multiple_ranges_are_served_as_multipart_byteranges() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = stored(&lacquer, &origin, "multi").await;
    let resp = get(&lacquer.url(&path), &[("range", "bytes=0-9,100-109")]).await;
    assert_eq!(resp.status, 206);
    let content_type = resp.header("content-type").unwrap();
    assert!(
        content_type.starts_with("multipart/byteranges; boundary="),
        "{content_type}"
    );
    let text = String::from_utf8_lossy(&resp.body).into_owned();
    assert!(
        text.contains(&format!("Content-Range: bytes 0-9/{LEN}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("Content-Range: bytes 100-109/{LEN}")),
        "{text}"
    );
    let first = generated_range(0, 10, 7);
    let second = generated_range(100, 10, 7);
    let body = &resp.body[..];
    let find = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    assert!(find(&first) && find(&second), "part bodies missing");
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn unsatisfiable_range_is_416() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = stored(&lacquer, &origin, "unsat").await;
    let resp = get(&lacquer.url(&path), &[("range", "bytes=5000-6000")]).await;
    assert_eq!(resp.status, 416);
    assert_eq!(
        resp.header("content-range").as_deref(),
        Some(format!("bytes */{LEN}").as_str())
    );
    assert!(resp.body.is_empty());
    // a syntactically invalid Range is ignored: the full response
    let ignored = get(&lacquer.url(&path), &[("range", "lines=1-2")]).await;
    assert_eq!(ignored.status, 200);
    assert_eq!(ignored.body.len(), LEN);
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn if_range_serves_the_range_only_for_the_current_representation() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = stored(&lacquer, &origin, "ifrange").await;
    let matching = get(
        &lacquer.url(&path),
        &[("range", "bytes=0-9"), ("if-range", "\"r1\"")],
    )
    .await;
    assert_eq!(matching.status, 206);
    assert_eq!(matching.body.len(), 10);
    let other = get(
        &lacquer.url(&path),
        &[("range", "bytes=0-9"), ("if-range", "\"r0\"")],
    )
    .await;
    assert_eq!(other.status, 200, "a changed representation: send it all");
    assert_eq!(other.body.len(), LEN);
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn a_range_request_on_a_miss_fetches_and_stores_the_whole_response() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/range-miss?cc={}&len={LEN}", q("max-age=600"));
    let first = get(&lacquer.url(&path), &[("range", "bytes=10-19")]).await;
    assert_eq!(first.status, 206);
    assert!(verify_generated(&first.body, 7, 10));
    assert!(
        origin.last_request().unwrap().header("range").is_none(),
        "the origin is asked for the whole response"
    );
    let full = get(&lacquer.url(&path), &[]).await;
    assert!(full.is_hit());
    assert_eq!(full.body.len(), LEN);
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn head_is_answered_from_a_stored_get_and_a_head_miss_fills_the_cache() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/head-first?cc={}&len={LEN}", q("max-age=600"));
    let head_miss = head(&lacquer.url(&path), &[]).await;
    assert_eq!(head_miss.status, 200);
    assert!(head_miss.body.is_empty());
    assert_eq!(origin.last_request().unwrap().method, "GET");
    let head_hit = head(&lacquer.url(&path), &[]).await;
    assert!(head_hit.is_hit());
    assert_eq!(head_hit.content_length(), Some(LEN as u64));
    let get_hit = get(&lacquer.url(&path), &[]).await;
    assert!(get_hit.is_hit());
    assert_eq!(get_hit.body.len(), LEN);
    assert_eq!(origin.hits_for(&path), 1);
}
