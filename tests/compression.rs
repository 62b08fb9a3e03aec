//! Compression done once: one stored copy (gzip or identity) serves every client correctly,
//! whatever it accepts. Real origin, the real binary, real clients; bodies compared byte for byte
//! after decoding.

mod common;
mod support;

use common::*;
use support::*;

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

fn compressing_proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[cache.compression]\nenabled = true\nmin_size = \"1KiB\"",
    )
}

/// The body the scripted origin sends for `path` on its `n`th request.
fn default_body(path: &str, n: usize) -> Vec<u8> {
    format!("{path} #{n}").into_bytes()
}

fn vary_lists_accept_encoding(resp: &Resp) -> bool {
    resp.header_all("vary")
        .iter()
        .flat_map(|v| {
            v.split(',')
                .map(|s| s.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .any(|name| name == "accept-encoding")
}

/// Asserts an identity response: no coding, the exact plain body, a consistent length.
fn assert_identity(resp: &Resp, plain: &[u8]) {
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-encoding"), None, "{:?}", resp.headers);
    assert_eq!(&resp.body[..], plain, "decoded body differs");
    if let Some(len) = resp.content_length() {
        assert_eq!(len as usize, plain.len());
    }
}

/// Asserts a gzip response whose decoding is exactly `plain`.
fn assert_gzip(resp: &Resp, plain: &[u8]) {
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-encoding").as_deref(), Some("gzip"));
    assert_eq!(gunzip(&resp.body), plain, "gunzipped body differs");
    if let Some(len) = resp.content_length() {
        assert_eq!(len as usize, resp.body.len());
    }
}

#[tokio::test]
async fn one_origin_fetch_serves_gzip_identity_and_gzip_refusing_clients() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/three?cc=max-age%3D60&gzip=1&ct=text/html&etag=%22v1%22";
    let plain = default_body(path, 1);

    // the identity client comes first: its miss still stores the gzip copy
    let identity = get(&lacquer.url(path), &[]).await;
    assert_identity(&identity, &plain);
    assert_eq!(identity.header("etag").as_deref(), Some("W/\"v1\""));
    assert!(vary_lists_accept_encoding(&identity));

    let gzip_client = get(
        &lacquer.url(path),
        &[("accept-encoding", "gzip, deflate, br")],
    )
    .await;
    assert!(gzip_client.is_hit(), "{:?}", gzip_client.cache_status());
    assert_gzip(&gzip_client, &plain);
    assert_eq!(gzip_client.header("etag").as_deref(), Some("\"v1\""));
    assert!(vary_lists_accept_encoding(&gzip_client));

    let refuses_gzip = get(
        &lacquer.url(path),
        &[("accept-encoding", "br;q=1, gzip;q=0")],
    )
    .await;
    assert!(refuses_gzip.is_hit(), "{:?}", refuses_gzip.cache_status());
    assert_identity(&refuses_gzip, &plain);
    assert_eq!(refuses_gzip.header("etag").as_deref(), Some("W/\"v1\""));
    assert!(vary_lists_accept_encoding(&refuses_gzip));

    let identity_hit = get(&lacquer.url(path), &[]).await;
    assert!(identity_hit.is_hit(), "{:?}", identity_hit.cache_status());
    assert_identity(&identity_hit, &plain);

    assert_eq!(origin.hits_for(path), 1, "one origin fetch for all clients");
    let forwarded = origin.requests_for(path);
    assert_eq!(forwarded[0].header("accept-encoding"), Some("gzip"));
}

#[tokio::test]
async fn decoded_responses_are_chunked_on_http11() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/chunked?cc=max-age%3D60&gzip=1&ct=text/plain&len=50000";
    let plain = generated_bytes(50000, 7);
    let mut conn = RawConn::connect(lacquer.addr());
    for round in 0..2 {
        // miss, then hit, on one keep-alive connection
        let resp = conn.get(path, &[]);
        assert_eq!(resp.status, 200, "round {round}");
        assert_eq!(resp.header("content-encoding"), None);
        assert_eq!(resp.header("content-length"), None);
        assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
        assert_eq!(resp.body, plain, "round {round}");
    }
    assert_eq!(origin.hits_for(path), 1);
}

#[tokio::test]
async fn h2_clients_get_the_decoded_body_too() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/h2?cc=max-age%3D60&gzip=1&ct=text/html&len=70000";
    let plain = generated_bytes(70000, 7);
    let client = h2c_client();
    let url = lacquer.url(path);
    let miss = send(&client, "GET", &url, &[], None).await.unwrap();
    assert_eq!(miss.version, http::Version::HTTP_2);
    assert_identity(&miss, &plain);
    let hit = send(&client, "GET", &url, &[], None).await.unwrap();
    assert!(hit.is_hit());
    assert_identity(&hit, &plain);
    let gzip_hit = send(&client, "GET", &url, &[("accept-encoding", "gzip")], None)
        .await
        .unwrap();
    assert_gzip(&gzip_hit, &plain);
    assert_eq!(origin.hits_for(path), 1);
}

#[tokio::test]
async fn head_requests_get_the_headers_of_their_representation() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/head?cc=max-age%3D60&gzip=1&ct=text/html&etag=%22h%22";
    get(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;

    let identity = head(&lacquer.url(path), &[]).await;
    assert_eq!(identity.status, 200);
    assert!(identity.body.is_empty());
    assert_eq!(identity.header("content-encoding"), None);
    assert_eq!(identity.header("content-length"), None);
    assert_eq!(identity.header("etag").as_deref(), Some("W/\"h\""));

    let gzip_client = head(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;
    assert_eq!(gzip_client.status, 200);
    assert_eq!(
        gzip_client.header("content-encoding").as_deref(),
        Some("gzip")
    );
    assert_eq!(gzip_client.header("etag").as_deref(), Some("\"h\""));
    assert_eq!(origin.hits_for(path), 1);
}

#[tokio::test]
async fn identity_q0_and_star_q0_are_honoured() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/q0?cc=max-age%3D60&gzip=1&ct=text/html";
    let plain = default_body(path, 1);
    get(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;

    let no_identity = get(
        &lacquer.url(path),
        &[("accept-encoding", "gzip, identity;q=0")],
    )
    .await;
    assert_gzip(&no_identity, &plain);
    let star_gzip = get(&lacquer.url(path), &[("accept-encoding", "*")]).await;
    assert_gzip(&star_gzip, &plain);
    // nothing acceptable: identity, the RFC 9110 §12.5.3 fallback, never gzip
    let nothing = get(&lacquer.url(path), &[("accept-encoding", "*;q=0")]).await;
    assert_identity(&nothing, &plain);
    let gzip_refused = get(
        &lacquer.url(path),
        &[("accept-encoding", "gzip;q=0, identity;q=0")],
    )
    .await;
    assert_identity(&gzip_refused, &plain);
    assert_eq!(origin.hits_for(path), 1);
}

#[tokio::test]
async fn a_range_on_a_decoded_response_gets_the_whole_body() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/range?cc=max-age%3D60&gzip=1&ct=text/html&len=10000";
    let plain = generated_bytes(10000, 7);
    get(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;
    let ranged = get(&lacquer.url(path), &[("range", "bytes=0-9")]).await;
    assert_eq!(ranged.status, 200);
    assert_identity(&ranged, &plain);
    // the gzip client ranges over the gzip bytes it would get whole
    let whole = get(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;
    let gz_range = get(
        &lacquer.url(path),
        &[("accept-encoding", "gzip"), ("range", "bytes=0-9")],
    )
    .await;
    assert_eq!(gz_range.status, 206);
    assert_eq!(&gz_range.body[..], &whole.body[..10]);
}

#[tokio::test]
async fn a_multi_megabyte_gzip_body_is_decoded_streaming_and_intact() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let len = 6 * 1024 * 1024 + 123;
    let path = format!("/big?cc=max-age%3D60&gzip=1&ct=application/octet-stream&len={len}");
    let plain = generated_bytes(len, 7);
    let miss = get(&lacquer.url(&path), &[]).await;
    assert_identity(&miss, &plain);
    let hit = get(&lacquer.url(&path), &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_identity(&hit, &plain);
    let gzip_hit = get(&lacquer.url(&path), &[("accept-encoding", "gzip")]).await;
    assert_gzip(&gzip_hit, &plain);
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn compress_on_store_for_listed_types_above_min_size() {
    let origin = scripted_origin();
    let lacquer = compressing_proxy(&origin);
    let path = "/store?cc=max-age%3D60&ct=text/html%3B%20charset%3Dutf-8&repeat=500&etag=%22s%22";
    let plain = default_body(path, 1).repeat(500);

    let identity = get(&lacquer.url(path), &[]).await;
    assert_identity(&identity, &plain);
    assert_eq!(identity.header("etag").as_deref(), Some("W/\"s\""));
    let gzip_hit = get(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;
    assert!(gzip_hit.is_hit(), "{:?}", gzip_hit.cache_status());
    assert_gzip(&gzip_hit, &plain);
    assert!(gzip_hit.body.len() < plain.len(), "stored copy is smaller");
    assert_eq!(gzip_hit.header("etag").as_deref(), Some("W/\"s\""));
    assert!(vary_lists_accept_encoding(&gzip_hit));
    let identity_hit = get(&lacquer.url(path), &[("accept-encoding", "identity")]).await;
    assert!(identity_hit.is_hit());
    assert_identity(&identity_hit, &plain);
    assert_eq!(origin.hits_for(path), 1);
}

#[tokio::test]
async fn the_memory_tier_holds_the_compressed_copy_once() {
    let origin = scripted_origin();
    let admin = free_port();
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        &format!(
            "[log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [cache.compression]\nenabled = true\nmin_size = \"1KiB\""
        ),
    );
    let path = "/mem?cc=max-age%3D60&ct=application/json&repeat=2000";
    let plain = default_body(path, 1).repeat(2000);
    for ae in ["gzip", "identity", "br;q=1, gzip;q=0", "gzip, deflate, br"] {
        let resp = get(&lacquer.url(path), &[("accept-encoding", ae)]).await;
        assert_eq!(resp.status, 200);
    }
    assert_eq!(admin_stat(admin, "objects").await, 1, "one stored copy");
    let held = admin_stat(admin, "bytes").await as usize;
    assert!(
        held < plain.len() / 4,
        "{held} bytes held for a {} byte body",
        plain.len()
    );
    assert_eq!(origin.hits_for(path), 1);
}

#[tokio::test]
async fn no_compression_on_store_for_other_types_tiny_bodies_or_no_transform() {
    let origin = scripted_origin();
    let lacquer = compressing_proxy(&origin);
    for path in [
        "/png?cc=max-age%3D60&ct=image/png&len=20000",
        "/tiny?cc=max-age%3D60&ct=text/html&len=1000",
        "/nt?cc=max-age%3D60%2C%20no-transform&ct=text/html&len=20000",
    ] {
        let len: usize = path.rsplit("len=").next().unwrap().parse().unwrap();
        let plain = generated_bytes(len, 7);
        get(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;
        let hit = get(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;
        assert!(hit.is_hit(), "{path}: {:?}", hit.cache_status());
        assert_identity(&hit, &plain);
    }
}

#[tokio::test]
async fn compression_on_store_is_off_by_default() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/off?cc=max-age%3D60&ct=text/html&len=20000";
    get(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;
    let hit = get(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;
    assert!(hit.is_hit());
    assert_identity(&hit, &generated_bytes(20000, 7));
}

#[tokio::test]
async fn gzip_from_an_origin_that_ignores_accept_encoding_is_decoded_on_pass_through() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // uncacheable, so the client's own (absent) Accept-Encoding is what the origin ignores
    let path = "/rude?cc=no-store&gzip=always&ct=text/html";
    let resp = get(&lacquer.url(path), &[]).await;
    assert_identity(&resp, &default_body(path, 1));
}

#[tokio::test]
async fn a_coding_the_client_refuses_is_refetched_as_identity_and_never_sent() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/br?cc=max-age%3D60&br=1&ct=text/html";

    let identity = get(&lacquer.url(path), &[("accept-encoding", "gzip")]).await;
    assert_eq!(identity.status, 200);
    assert_eq!(identity.header("content-encoding"), None);
    let forwarded = origin.requests_for(path);
    assert_eq!(
        forwarded.len(),
        2,
        "one refused br answer, one identity refetch"
    );
    assert_eq!(forwarded[1].header("accept-encoding"), Some("identity"));
    assert_eq!(&identity.body[..], &default_body(path, 2)[..]);
}

#[tokio::test]
async fn a_coding_we_cannot_decode_is_passed_to_a_client_that_takes_it_but_not_stored() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/brok?cc=max-age%3D60&br=1&ct=text/html";
    for n in 1..=2 {
        let resp = get(&lacquer.url(path), &[("accept-encoding", "br")]).await;
        assert_eq!(resp.header("content-encoding").as_deref(), Some("br"));
        assert!(!resp.is_hit());
        assert_eq!(&resp.body[..], &default_body(path, n)[..]);
    }
    assert_eq!(origin.hits_for(path), 2);
}

#[test]
fn bad_compression_values_name_the_key() {
    for (toml, key, reason) in [
        (
            "[cache.compression]\nlevel = 0",
            "cache.compression.level",
            "outside 1..=9",
        ),
        (
            "[cache.compression]\nlevel = 10",
            "cache.compression.level",
            "outside 1..=9",
        ),
        (
            "[cache.compression]\nmin_size = \"1XB\"",
            "cache.compression.min_size",
            "unit",
        ),
        (
            "[cache.compression]\ntypes = [\"html\"]",
            "cache.compression.types[0]",
            "not a media type",
        ),
        (
            "[cache.compression]\nenable = true",
            "unknown field `enable`",
            "line",
        ),
    ] {
        let out = check_config(&format!("upstream = \"127.0.0.1:1\"\n{toml}"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{toml} accepted");
        assert!(err.contains(key) && err.contains(reason), "{toml}: {err}");
    }
    let ok = check_config(
        "upstream = \"127.0.0.1:1\"\n[cache.compression]\nenabled = true\ntypes = [\"text/*\", \"application/json\"]\nmin_size = \"512\"\nlevel = 1",
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}
