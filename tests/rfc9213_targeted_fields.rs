//! Targeted cache-control fields (RFC 9213), over real sockets: a targeted field that is not a
//! valid Structured Field Dictionary (RFC 8941) is ignored as a whole and `Cache-Control` governs;
//! `CDN-Cache-Control` is passed on to clients (a CDN in front of Lacquer needs it) while our own
//! field is stripped, and the stripped set is configurable. Precedence among the fields is in
//! `tests/rfc9211_cache_status.rs` (`our_targeted_field_beats_cdn_cache_control_beats_cache_control`).

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin, extra: &str) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), &format!("[log]\naccess = \"off\"\n{extra}"))
}

#[tokio::test]
async fn an_invalid_targeted_field_is_ignored_as_a_whole() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    // the valid part (max-age=10000) must not be used: Cache-Control's no-store governs
    for (name, field, value) in [
        ("cdn", "CDN-Cache-Control", "max-age=10000, &&&&&"),
        ("cdn-case", "CDN-Cache-Control", "MAX-AGE=10000"),
        ("cdn-trailing", "CDN-Cache-Control", "max-age=10000,"),
        ("ours", "Lacquer-Cache-Control", "max-age=10000, &&&&&"),
    ] {
        let path = format!(
            "/tf-invalid-{name}?cc=no-store&hdr={}",
            q(&format!("{field}:{value}"))
        );
        get(&lacquer.url(&path), &[]).await;
        let second = get(&lacquer.url(&path), &[]).await;
        assert!(
            !second.is_hit(),
            "{field}: {value}: {:?}",
            second.cache_status()
        );
        assert_eq!(
            origin.hits_for(&path),
            2,
            "{field}: {value}: the valid part was used"
        );
    }
    // our own field invalid, CDN-Cache-Control valid: the next field of the list governs
    let next = format!(
        "/tf-invalid-next?cc=no-store&hdr={}&hdr={}",
        q("Lacquer-Cache-Control:max-age=10000, !"),
        q("CDN-Cache-Control:max-age=600")
    );
    get(&lacquer.url(&next), &[]).await;
    let hit = get(&lacquer.url(&next), &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    let ttl = hit.cache_ttl().unwrap();
    assert!(
        (590..=600).contains(&ttl),
        "ttl {ttl}: CDN-Cache-Control governs"
    );
    // and an invalid targeted field does not hide Cache-Control's freshness
    let cc_governs = format!(
        "/tf-invalid-cc?cc={}&hdr={}",
        q("max-age=600"),
        q("CDN-Cache-Control:no-store, ???")
    );
    get(&lacquer.url(&cc_governs), &[]).await;
    let hit = get(&lacquer.url(&cc_governs), &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
}

#[tokio::test]
async fn cdn_cache_control_is_forwarded_and_our_field_stripped_by_default() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let path = format!(
        "/tf-default?hdr={}&hdr={}",
        q("CDN-Cache-Control:max-age=600"),
        q("Lacquer-Cache-Control:max-age=300")
    );
    let miss = get(&lacquer.url(&path), &[]).await;
    let hit = get(&lacquer.url(&path), &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    for resp in [&miss, &hit] {
        assert_eq!(
            resp.header("cdn-cache-control").as_deref(),
            Some("max-age=600")
        );
        assert!(!resp.has_header("lacquer-cache-control"));
    }
}

#[tokio::test]
async fn the_stripped_fields_are_configurable() {
    let origin = scripted_origin();
    let path = format!(
        "/tf-strip?hdr={}&hdr={}",
        q("CDN-Cache-Control:max-age=600"),
        q("Lacquer-Cache-Control:max-age=300")
    );
    let both = proxy(
        &origin,
        "[cache]\nstrip_targeted_fields = [\"Lacquer-Cache-Control\", \"CDN-Cache-Control\"]",
    );
    let resp = get(&both.url(&path), &[]).await;
    assert!(!resp.has_header("cdn-cache-control"));
    assert!(!resp.has_header("lacquer-cache-control"));
    drop(both);
    let none = proxy(&origin, "[cache]\nstrip_targeted_fields = []");
    let resp = get(&none.url(&path), &[]).await;
    assert_eq!(
        resp.header("cdn-cache-control").as_deref(),
        Some("max-age=600")
    );
    assert_eq!(
        resp.header("lacquer-cache-control").as_deref(),
        Some("max-age=300")
    );
}

#[test]
fn strip_targeted_fields_config_is_checked() {
    for (value, key, reason) in [
        (
            "[\"bad name\"]",
            "cache.strip_targeted_fields[0]",
            "not a valid header name",
        ),
        (
            "[\"x\", \"\"]",
            "cache.strip_targeted_fields[1]",
            "not a valid header name",
        ),
    ] {
        let out = check_config(&format!(
            "upstream = \"127.0.0.1:1\"\n[cache]\nstrip_targeted_fields = {value}"
        ));
        let err = stderr_text(&out);
        assert_eq!(out.status.code(), Some(2), "{value}: {err}");
        assert!(err.contains(key) && err.contains(reason), "{value}:\n{err}");
    }
    let both = check_config(
        "upstream = \"127.0.0.1:1\"\n[cache]\nforward_targeted_fields = true\nstrip_targeted_fields = [\"cdn-cache-control\"]",
    );
    let err = stderr_text(&both);
    assert_eq!(both.status.code(), Some(2), "{err}");
    assert!(err.contains("cache.strip_targeted_fields"), "{err}");
    let ok = check_config(
        "upstream = \"127.0.0.1:1\"\n[cache]\nstrip_targeted_fields = [\"Lacquer-Cache-Control\"]",
    );
    assert_eq!(ok.status.code(), Some(0), "{}", stderr_text(&ok));
}
