//! RFC 9111 field parsing, over real sockets: `Cache-Control` directives (§5.2, §4.2.1),
//! `Age` (§5.1), `Expires` (§5.3), `Date` in the age calculation (§4.2.3) and `Pragma` (§5.4).
//!
//! Each test scripts the origin's response in the URL (see `scripted_origin`), requests it twice
//! through the real `lacquer` binary and asserts whether the second answer came from the cache
//! (origin request count, body, `Cache-Status`). See `docs/conformance.md` for the map to the
//! cache-tests suite.

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

/// Requests `path` twice; returns the second response and the origin's request count for it.
async fn twice(lacquer: &LacquerProcess, origin: &TestOrigin, path: &str) -> (Resp, usize) {
    let first = get(&lacquer.url(path), &[]).await;
    assert!(first.status < 500, "{path}: {}", first.status);
    let second = get(&lacquer.url(path), &[]).await;
    (second, origin.hits_for(path))
}

#[tokio::test]
async fn directive_names_are_case_insensitive() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let fresh = format!("/ci?cc={}", q("MAX-AGE=60"));
    let (hit, hits) = twice(&lacquer, &origin, &fresh).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(hits, 1);

    let no_store = format!("/ci-ns?cc={}", q("max-age=60, No-Store"));
    let (_, hits) = twice(&lacquer, &origin, &no_store).await;
    assert_eq!(hits, 2, "No-Store must be honoured in any case");
}

#[tokio::test]
async fn invalid_max_age_makes_the_response_stale() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // quoted (max-age uses the token form only), negative, non-numeric: invalid, so stale,
    // even where Last-Modified would otherwise grant heuristic freshness (RFC 9111 §4.2.1)
    for (name, cc) in [
        ("quoted", "max-age=\"3600\""),
        ("negative", "max-age=-1"),
        ("text", "max-age=soon"),
        ("float", "max-age=3600.5"),
        ("s-maxage-quoted", "s-maxage=\"3600\""),
    ] {
        let path = format!("/invalid-{name}?cc={}&lm=-100000", q(cc));
        let (second, hits) = twice(&lacquer, &origin, &path).await;
        assert_eq!(hits, 2, "{cc}: served from cache");
        assert!(!second.is_hit(), "{cc}: {:?}", second.cache_status());
    }
}

#[tokio::test]
async fn huge_max_age_clamps_instead_of_failing() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/huge?cc={}", q("max-age=99999999999999999999"));
    let (hit, hits) = twice(&lacquer, &origin, &path).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(hits, 1);
    let ttl: i64 = hit.cache_status_param("ttl").unwrap().parse().unwrap();
    assert!(ttl > 2_000_000_000, "ttl {ttl}");
}

#[tokio::test]
async fn duplicate_max_age_uses_the_first() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // on one line and on two lines: the first occurrence counts (RFC 9111 §4.2.1)
    let fresh_first = format!("/dup1?cc={}", q("max-age=3600, max-age=0"));
    let (hit, hits) = twice(&lacquer, &origin, &fresh_first).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(hits, 1);

    let stale_first = format!("/dup2?cc={}", q("max-age=0, max-age=3600"));
    let (_, hits) = twice(&lacquer, &origin, &stale_first).await;
    assert_eq!(hits, 2);

    let two_lines = format!(
        "/dup3?hdr={}&hdr={}",
        q("Cache-Control:max-age=0"),
        q("Cache-Control:max-age=3600")
    );
    let (_, hits) = twice(&lacquer, &origin, &two_lines).await;
    assert_eq!(hits, 2);
}

#[tokio::test]
async fn age_parsing() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // invalid Age values are ignored: the response is fresh and young
    for (name, age) in [("text", "abc"), ("negative", "-30"), ("float", "3.5")] {
        let path = format!("/age-{name}?cc={}&age={}", q("max-age=600"), q(age));
        let (hit, hits) = twice(&lacquer, &origin, &path).await;
        assert!(hit.is_hit(), "Age {age}: {:?}", hit.cache_status());
        assert_eq!(hits, 1, "Age {age}");
        assert!(
            hit.age().unwrap() < 30,
            "Age {age} counted: {:?}",
            hit.age()
        );
    }
    // a valid Age at or beyond the lifetime makes the response stale on arrival
    for (name, age) in [("over", "700"), ("huge", "99999999999999999999")] {
        let path = format!("/age-{name}?cc={}&age={age}", q("max-age=600"));
        let (second, hits) = twice(&lacquer, &origin, &path).await;
        assert_eq!(hits, 2, "Age {age}");
        assert!(!second.is_hit());
    }
}

/// RFC 9111 §5.1: of a list-based `Age` (`Age: 7200, 0`) the first member counts, so a response
/// already older than its lifetime is stale on arrival.
#[tokio::test]
async fn age_as_a_list_uses_the_first_member() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    for (name, age) in [("list", "7200, 0"), ("spaced", " 7200 ,0")] {
        let path = format!("/age-list-{name}?cc={}&age={}", q("max-age=3600"), q(age));
        let (second, hits) = twice(&lacquer, &origin, &path).await;
        assert_eq!(hits, 2, "Age: {age} served as fresh");
        assert!(!second.is_hit(), "Age: {age}: {:?}", second.cache_status());
    }
    let two_lines = format!(
        "/age-lines?cc={}&hdr={}&hdr={}",
        q("max-age=3600"),
        q("Age:7200"),
        q("Age:0")
    );
    let (_, hits) = twice(&lacquer, &origin, &two_lines).await;
    assert_eq!(hits, 2, "Age on two lines: the first counts");
    // the first member is young: fresh, and the Age served counts from it
    let young = format!(
        "/age-list-young?cc={}&age={}",
        q("max-age=600"),
        q("30, 7200")
    );
    let (hit, hits) = twice(&lacquer, &origin, &young).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(hits, 1);
    assert!((30..90).contains(&hit.age().unwrap()), "{:?}", hit.age());
}

#[tokio::test]
async fn expires_needs_a_valid_future_http_date() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let future = "/exp-future?expires=3600";
    let (hit, hits) = twice(&lacquer, &origin, future).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(hits, 1);
    // invalid dates, including "0", mean "already expired" (RFC 9111 §5.3); so does the past
    for value in ["invalid", "0", "-10"] {
        let path = format!("/exp?expires={}&lm=-100000", q(value));
        let (_, hits) = twice(&lacquer, &origin, &path).await;
        assert_eq!(hits, 2, "Expires {value}");
    }
    // max-age beats Expires
    let path = format!("/exp-ma?cc={}&expires=-10", q("max-age=600"));
    let (hit, hits) = twice(&lacquer, &origin, &path).await;
    assert!(hit.is_hit());
    assert_eq!(hits, 1);
}

#[tokio::test]
async fn expires_is_relative_to_the_origin_date() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // Date an hour ago, Expires 50 minutes ago: a 10-minute lifetime, an hour old: stale
    let old = "/date-old?date=-3600&expires=-3000";
    let (_, hits) = twice(&lacquer, &origin, old).await;
    assert_eq!(hits, 2);
    // Date 100 s ago, Expires in 3500 s: lifetime 3600 s, age ~100 s
    let young = "/date-young?date=-100&expires=3500";
    let (hit, hits) = twice(&lacquer, &origin, young).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(hits, 1);
    let age = hit.age().unwrap();
    assert!((100..=160).contains(&age), "apparent age from Date: {age}");
    // Both cases above hold even if the lifetime were taken from now rather than from Date
    // ((Expires - Date) - (now - Date) is Expires - now). A Date ahead of our clock tells them
    // apart: the lifetime is Expires - Date (600 s), not Expires - now (1600 s), and the negative
    // apparent age counts as zero.
    let skewed = "/date-ahead?date=1000&expires=1600";
    let (hit, hits) = twice(&lacquer, &origin, skewed).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(hits, 1);
    assert_ttl_is_lifetime_minus_age(&hit, 600);
    // an invalid Date is ignored: the age comes from the response delay alone
    let garbage = format!("/date-garbage?date=garbage&cc={}", q("max-age=600"));
    let (hit, hits) = twice(&lacquer, &origin, &garbage).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(hits, 1);
    assert!(hit.age().unwrap() < 60, "{:?}", hit.age());
}

/// RFC 9110 §5.6.7: the three HTTP-date formats (IMF-fixdate, RFC 850, asctime) and names in any
/// case, in `Expires`, `Last-Modified` and `Date`; anything else is no date, and an `Expires` that
/// is no date means already expired (RFC 9111 §5.3). `If-Modified-Since` is in
/// `rfc9111_validation::if_modified_since_reads_every_http_date_format`.
#[tokio::test]
async fn every_http_date_format_in_expires_last_modified_and_date() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let [imf, rfc850, asctime] = http_date_formats(3600);
    let expires_forms = [
        ("imf", imf.clone()),
        ("rfc850", rfc850.clone()),
        ("asctime", asctime.clone()),
        ("lower", imf.to_lowercase()),
        ("upper", imf.to_uppercase()),
        ("lower-zone", imf.replace("GMT", "gmt")),
        ("rfc850-lower", rfc850.to_lowercase()),
        ("asctime-upper", asctime.to_uppercase()),
    ];
    for (name, expires) in expires_forms {
        let path = format!("/date-fmt-exp-{name}?expires={}", q(&expires));
        let (hit, hits) = twice(&lacquer, &origin, &path).await;
        assert!(hit.is_hit(), "Expires: {expires}: {:?}", hit.cache_status());
        assert_eq!(hits, 1, "Expires: {expires}");
        let ttl = hit.cache_ttl().unwrap();
        assert!(
            (3000..=3600).contains(&ttl),
            "Expires: {expires}: ttl {ttl}"
        );
    }
    // not HTTP-dates: already expired, even with Last-Modified to grant heuristic freshness
    for (name, expires) in [
        ("utc", imf.replace("GMT", "UTC")),
        ("short-year", format!("{}{}", &imf[..12], &imf[14..])),
        ("no-comma", imf.replacen(',', "", 1)),
        ("two-spaces", imf.replacen(' ', "  ", 1)),
    ] {
        let path = format!("/date-fmt-bad-{name}?expires={}&lm=-100000", q(&expires));
        let (second, hits) = twice(&lacquer, &origin, &path).await;
        assert_eq!(hits, 2, "Expires: {expires} is no date, so expired");
        assert!(!second.is_hit());
    }
    // Last-Modified in any format gives heuristic freshness (10 % of 100000 s)
    let [lm_imf, lm_rfc850, lm_asctime] = http_date_formats(-100_000);
    for (name, lm) in [
        ("rfc850", lm_rfc850),
        ("asctime", lm_asctime),
        ("lower", lm_imf.to_lowercase()),
    ] {
        let path = format!(
            "/date-fmt-lm-{name}?hdr={}",
            q(&format!("Last-Modified:{lm}"))
        );
        let (hit, hits) = twice(&lacquer, &origin, &path).await;
        assert!(
            hit.is_hit(),
            "Last-Modified: {lm}: {:?}",
            hit.cache_status()
        );
        assert_eq!(hits, 1, "Last-Modified: {lm}");
    }
    // Date in any format gives the apparent age
    let [_, date_rfc850, date_asctime] = http_date_formats(-100);
    for (name, date) in [
        ("rfc850", date_rfc850),
        ("asctime", date_asctime.to_lowercase()),
    ] {
        let path = format!(
            "/date-fmt-date-{name}?cc={}&date={}",
            q("max-age=600"),
            q(&date)
        );
        let (hit, _) = twice(&lacquer, &origin, &path).await;
        assert!(hit.is_hit(), "Date: {date}: {:?}", hit.cache_status());
        let age = hit.age().unwrap();
        assert!((100..=160).contains(&age), "Date: {date}: age {age}");
    }
}

#[tokio::test]
async fn pragma_no_cache_only_without_cache_control() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/pragma?cc={}", q("max-age=600"));
    get(&lacquer.url(&path), &[]).await;
    // with Cache-Control present, a request's Pragma is ignored (RFC 9111 §5.4)
    let with_cc = get(
        &lacquer.url(&path),
        &[("pragma", "no-cache"), ("cache-control", "max-stale=10")],
    )
    .await;
    assert!(with_cc.is_hit(), "{:?}", with_cc.cache_status());
    assert_eq!(origin.hits_for(&path), 1);
    // alone, it means no-cache
    let alone = get(&lacquer.url(&path), &[("pragma", "no-cache")]).await;
    assert!(!alone.is_hit());
    assert_eq!(origin.hits_for(&path), 2);
    // a response's Pragma has no effect on storing
    let resp_pragma = format!(
        "/pragma-resp?cc={}&hdr={}",
        q("max-age=600"),
        q("Pragma:no-cache")
    );
    let (hit, hits) = twice(&lacquer, &origin, &resp_pragma).await;
    assert!(hit.is_hit());
    assert_eq!(hits, 1);
}
