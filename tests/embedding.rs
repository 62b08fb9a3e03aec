//! Lacquer as a library (issue 13 item 2): `examples/device_rule.rs` embeds it with a phase hook
//! of its own, a custom rule; this builds that program and runs it in front of a real origin.

use lacquer_test_support as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::*;

const IPHONE: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Mobile/15E148";
const PIXEL: &str = "Mozilla/5.0 (Linux; Android 14; Pixel 8) Mobile Safari/537.36";
const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0";

#[tokio::test]
async fn an_embedding_program_adds_its_own_rule_to_the_request_path() {
    // an origin that renders per device and says so with Vary
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let origin = TestOrigin::start(move |req| {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        let device = req.header("x-device").unwrap_or("none").to_string();
        OriginResponse::ok(format!("{device} page #{n}"))
            .header("cache-control", "max-age=60")
            .header("vary", "X-Device")
    });
    let program = example_bin("device_rule");
    let proxy = LacquerProcess::start_program_on_free_port(&program, |port| {
        simple_config(
            port,
            origin.addr(),
            // the program keeps Lacquer's own rules working alongside its hook
            "[log]\naccess = \"off\"\n[[rules]]\npath = \"/\"\ndrop_query = [\"utm_\"]",
        )
    });
    let url = proxy.url("/home");

    // two different phones share the mobile variant: the hook ran before the lookup
    let first = get(&url, &[("user-agent", IPHONE)]).await;
    assert_eq!(first.text(), "mobile page #1");
    assert_eq!(first.header("x-device").as_deref(), Some("mobile"));
    let second = get(&proxy.url("/home?utm_source=x"), &[("user-agent", PIXEL)]).await;
    assert!(second.is_hit(), "{:?}", second.cache_status());
    assert_eq!(second.text(), "mobile page #1");
    assert_eq!(
        second.header("x-device").as_deref(),
        Some("mobile"),
        "on a hit too"
    );

    // a desktop browser gets its own variant, then hits it
    let desktop = get(&url, &[("user-agent", FIREFOX)]).await;
    assert_eq!(desktop.text(), "desktop page #2");
    assert!(get(&url, &[("user-agent", FIREFOX)]).await.is_hit());
    assert_eq!(served.load(Ordering::SeqCst), 2);

    // the hook's pass: an API client always reaches the origin
    for n in [3, 4] {
        let api = get(&url, &[("user-agent", FIREFOX), ("x-api-key", "k")]).await;
        assert_eq!(api.cache_fwd().as_deref(), Some("bypass"));
        assert_eq!(api.text(), format!("desktop page #{n}"));
    }
}
