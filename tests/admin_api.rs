//! The admin invalidation API on one node: who may call it (a bearer token, an address
//! allow-list: anything else gets 401 or 403 and changes nothing), what it does without a shared
//! tier (purges and bans of this node's memory tier), and the tag field (configurable, removed
//! before the client unless forwarded).

use lacquer_test_support as support;

use serde_json::Value;
use support::*;

const TOKEN: &str = "admin-token-for-the-tests-0123";

struct Node {
    proxy: LacquerProcess,
    admin: u16,
    _dir: TempDir,
}

/// A memory-only node whose admin listener has `admin` (TOML lines of `[admin]`) and a token
/// file holding [`TOKEN`] when `with_token`.
fn node(origin: &TestOrigin, admin_lines: &str, with_token: bool, extra: &str) -> Node {
    let dir = TempDir::new("admin-api");
    let token_file = dir.write("token", format!("{TOKEN}\n"));
    let admin = free_port();
    let token = if with_token {
        format!("token_file = \"{}\"\n", token_file.display())
    } else {
        String::new()
    };
    let config = format!(
        "[log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n{token}{admin_lines}\n{extra}"
    );
    Node {
        proxy: LacquerProcess::start_simple(origin.addr(), &config),
        admin,
        _dir: dir,
    }
}

fn json(resp: &Resp) -> Value {
    serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", resp.status, resp.text()))
}

/// Stores `path` and checks it is then a hit.
async fn stored(node: &Node, path: &str) -> Resp {
    let first = get(&node.proxy.url(path), &[]).await;
    assert!(first.is_stored(), "{path}: {:?}", first.cache_status());
    assert!(get(&node.proxy.url(path), &[]).await.is_hit());
    first
}

#[tokio::test]
async fn unauthorised_admin_calls_change_nothing() {
    let origin = scripted_origin();
    let with_token = node(&origin, "", true, "");
    let path = "/kept?cc=max-age%3D300&hdr=Surrogate-Key:kept";
    stored(&with_token, path).await;
    let purge = format!(
        r#"{{"url": "{}"}}"#,
        with_token.proxy.url(path).replace("127.0.0.1", "localhost")
    );
    let purge_here = format!(
        r#"{{"host": "127.0.0.1:{}", "path": "{path}"}}"#,
        with_token.proxy.port()
    );
    let ban = r#"{"tag": "kept"}"#;
    let wrong = "admin-token-for-the-tests-0124";
    for (call, body, token, status) in [
        ("/purge", purge_here.as_str(), None, 401),
        ("/purge", purge_here.as_str(), Some(wrong), 401),
        ("/ban", ban, Some(wrong), 401),
        ("/ban", ban, Some(""), 401),
        (
            "/purge",
            purge.as_str(),
            Some(&TOKEN[..TOKEN.len() - 1]),
            401,
        ),
    ] {
        let answer = admin_post(with_token.admin, call, token, body).await;
        assert_eq!(answer.status, status, "{call} {token:?}: {}", answer.text());
        assert_eq!(
            answer.header("www-authenticate").as_deref(),
            Some("Bearer realm=\"lacquer admin\"")
        );
        assert!(json(&answer)["error"].is_string());
    }
    // credentials in another scheme are not a bearer token
    let basic = request(
        "POST",
        &format!("http://127.0.0.1:{}/ban", with_token.admin),
        &[("authorization", "Basic YWRtaW46cGFzc3dvcmQ=")],
        Some(ban.into()),
    )
    .await;
    assert_eq!(basic.status, 401);
    assert!(get(&with_token.proxy.url(path), &[]).await.is_hit());
    assert_eq!(admin_stat(with_token.admin, "issued").await, 0);

    // from an address not allowed, even the right token gets 403; /health stays open
    let elsewhere = node(&origin, "allow_from = [\"10.0.0.0/8\"]", true, "");
    stored(&elsewhere, path).await;
    let purge_there = format!(
        r#"{{"host": "127.0.0.1:{}", "path": "{path}"}}"#,
        elsewhere.proxy.port()
    );
    let answer = admin_post(elsewhere.admin, "/purge", Some(TOKEN), &purge_there).await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    assert!(!answer.has_header("www-authenticate"));
    let stats = get(&format!("http://127.0.0.1:{}/stats", elsewhere.admin), &[]).await;
    assert_eq!(stats.status, 403);
    let health = get(&format!("http://127.0.0.1:{}/health", elsewhere.admin), &[]).await;
    assert_eq!(health.status, 200);
    assert!(get(&elsewhere.proxy.url(path), &[]).await.is_hit());

    // without a configured token the API is off
    let off = node(&origin, "", false, "");
    stored(&off, path).await;
    let purge_off = format!(
        r#"{{"host": "127.0.0.1:{}", "path": "{path}"}}"#,
        off.proxy.port()
    );
    let answer = admin_post(off.admin, "/purge", Some(TOKEN), &purge_off).await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    assert!(get(&off.proxy.url(path), &[]).await.is_hit());
    assert_eq!(
        origin.hits_for(path),
        3,
        "one fill per node, nothing purged"
    );

    // the right token, for contrast, purges
    let answer = admin_post(with_token.admin, "/purge", Some(TOKEN), &purge_here).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(json(&answer)["this_node"]["objects"], 1);
    assert!(!get(&with_token.proxy.url(path), &[]).await.is_hit());

    for node in [&with_token, &elsewhere, &off] {
        let log = node.proxy.stderr_log();
        assert!(
            !log.contains(TOKEN) && !log.contains(wrong),
            "a token was logged: {log}"
        );
    }
    assert!(with_token
        .proxy
        .stderr_log()
        .contains("refused: wrong bearer token"));
}

#[tokio::test]
async fn bans_and_purges_work_on_a_node_without_a_shared_tier() {
    let origin = scripted_origin();
    let node = node(&origin, "", true, "");
    let host = format!("127.0.0.1:{}", node.proxy.port());
    let tagged =
        |name: &str, tags: &str| format!("/{name}?cc=max-age%3D300&hdr=Surrogate-Key:{}", q(tags));
    let (a, b, c) = (tagged("a", "x y"), tagged("b", "y"), tagged("c", "z"));
    for path in [&a, &b, &c] {
        let first = stored(&node, path).await;
        assert!(
            !first.has_header("surrogate-key"),
            "the tag field is removed"
        );
    }
    let answer = admin_post(
        node.admin,
        "/ban",
        Some(TOKEN),
        r#"{"tag": "y", "by": "ci"}"#,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let report = json(&answer);
    assert_eq!(report["this_node"]["objects"], 2);
    assert_eq!(report["memcached"], Value::Null);
    assert_eq!(report["nodes"], Value::Null);
    assert_eq!(report["complete"], true);
    assert!(!get(&node.proxy.url(&a), &[]).await.is_hit());
    assert!(!get(&node.proxy.url(&b), &[]).await.is_hit());
    assert!(get(&node.proxy.url(&c), &[]).await.is_hit());

    let prefix = format!(r#"{{"host": "{host}", "prefix": "/c"}}"#);
    let answer = admin_post(node.admin, "/ban", Some(TOKEN), &prefix).await;
    assert_eq!(json(&answer)["this_node"]["objects"], 1);
    assert!(!get(&node.proxy.url(&c), &[]).await.is_hit());

    // bad bodies are refused before anything is done
    for body in [
        r#"{"tag": "two words"}"#,
        r#"{"prefix": "no-slash"}"#,
        "not json",
        "{}",
    ] {
        let answer = admin_post(node.admin, "/ban", Some(TOKEN), body).await;
        assert_eq!(answer.status, 400, "{body}: {}", answer.text());
    }
    assert!(node
        .proxy
        .stderr_log()
        .contains("ban tag \"y\" asked by 127.0.0.1 (admin API, ci)"));
}

#[tokio::test]
async fn the_tag_field_is_configurable_and_may_be_forwarded() {
    let origin = scripted_origin();
    let node = node(
        &origin,
        "",
        true,
        "[invalidation]\ntag_header = \"xkey\"\nforward_tag_header = true",
    );
    let path = format!("/x?cc=max-age%3D300&hdr=xkey:{}", q("p1, p2"));
    let first = stored(&node, &path).await;
    assert_eq!(first.header("xkey").as_deref(), Some("p1, p2"));
    let answer = admin_post(node.admin, "/ban", Some(TOKEN), r#"{"tag": "p2"}"#).await;
    assert_eq!(json(&answer)["this_node"]["objects"], 1);
    assert!(!get(&node.proxy.url(&path), &[]).await.is_hit());
}

#[tokio::test]
async fn a_soft_purge_request_marks_stale_and_the_next_request_revalidates() {
    let origin = scripted_origin();
    let node = node(&origin, "", true, "");
    let path = format!(
        "/revalidate?cc={}&etag={}&r304=1",
        q("max-age=300"),
        q("\"v1\"")
    );
    let first = stored(&node, &path).await;
    let purged = request(
        "PURGE",
        &node.proxy.url(&path),
        &[("soft-purge", "1")],
        None,
    )
    .await;
    assert_eq!(purged.status, 200);
    assert!(purged
        .header("lacquer-purge")
        .is_some_and(|s| s.starts_with("here=1+0")));
    // no grace here: the next request revalidates with the stored validator, and a 304 keeps
    // the stored body
    let next = get(&node.proxy.url(&path), &[]).await;
    assert_eq!(
        next.cache_fwd().as_deref(),
        Some("stale"),
        "{:?}",
        next.cache_status()
    );
    assert_eq!(next.body, first.body);
    let revalidation = &origin.requests_for(&path)[1];
    assert_eq!(revalidation.header("if-none-match"), Some("\"v1\""));
    assert!(get(&node.proxy.url(&path), &[]).await.is_hit());
    assert_eq!(origin.hits_for(&path), 2);
}

/// Whether `path` over `https` (as the trusted proxy says) or plain http is a hit.
async fn hit_over(node: &Node, path: &str, https: bool) -> bool {
    let headers: &[(&str, &str)] = if https {
        &[("x-forwarded-proto", "https")]
    } else {
        &[]
    };
    get(&node.proxy.url(path), headers).await.is_hit()
}

#[tokio::test]
async fn a_purge_by_host_and_path_removes_the_page_of_both_schemes() {
    let origin = scripted_origin();
    // the trusted proxy (loopback here) says which requests came over https
    let node = node(
        &origin,
        "",
        true,
        "[proxy]\ntrusted_proxies = [\"127.0.0.0/8\"]\n",
    );
    let host = format!("127.0.0.1:{}", node.proxy.port());
    let path = "/both?cc=max-age%3D300";
    for https in [false, true] {
        assert!(!hit_over(&node, path, https).await);
        assert!(hit_over(&node, path, https).await);
    }
    assert_eq!(origin.hits_for(path), 2, "each scheme has its own entry");

    let body = format!(r#"{{"host": "{host}", "path": "{path}"}}"#);
    let answer = admin_post(node.admin, "/purge", Some(TOKEN), &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let report = json(&answer);
    assert_eq!(report["this_node"]["objects"], 1, "{report}");
    assert_eq!(
        report["other_scheme"]["this_node"]["objects"], 1,
        "{report}"
    );
    assert!(
        !hit_over(&node, path, false).await,
        "the http page was served after the purge"
    );
    assert!(
        !hit_over(&node, path, true).await,
        "the https page was served after the purge"
    );
    assert_eq!(origin.hits_for(path), 4);

    // "scheme" narrows it to one page
    assert!(hit_over(&node, path, false).await && hit_over(&node, path, true).await);
    let body = format!(r#"{{"host": "{host}", "path": "{path}", "scheme": "https"}}"#);
    let answer = admin_post(node.admin, "/purge", Some(TOKEN), &body).await;
    let report = json(&answer);
    assert_eq!(report["this_node"]["objects"], 1, "{report}");
    assert_eq!(report["other_scheme"], Value::Null);
    assert!(hit_over(&node, path, false).await, "the http page stays");
    assert!(!hit_over(&node, path, true).await);
    assert_eq!(origin.hits_for(path), 5);
}

/// Hosts in purge and ban bodies are checked as a request's `Host` is: a host that no key can
/// hold (`a/b`, a space, an empty one) is refused with a 400 that says why, and the node goes on
/// serving. (A host with `/` once reached the cache key's writer, where a debug build asserts.)
/// A URL's port is kept as written, as a request's `Host` is keyed: `:080` purges the page asked
/// for as `shop.example:080`, which `:80` does not name. Nothing a refused call names is
/// carried out, not even half of a page of both schemes.
#[tokio::test]
async fn purge_and_ban_hosts_are_checked_and_ports_kept_as_written() {
    let origin = scripted_origin();
    let node = node(&origin, "", true, "");
    for (call, body) in [
        ("/purge", r#"{"host": "a/b", "path": "/x"}"#),
        ("/purge", r#"{"host": "a b", "path": "/x"}"#),
        ("/purge", r#"{"host": "", "path": "/x"}"#),
        ("/ban", r#"{"host": "a/b"}"#),
        ("/ban", r#"{"host": "shop.example:8o"}"#),
        ("/ban", r#"{"host": "a/b", "prefix": "/x"}"#),
        // a port that is not digits is refused, not dropped (it would purge another page)
        ("/purge", r#"{"url": "http://shop.example:8o/x"}"#),
        // the scheme is "scheme"'s to say; and of a page's two schemes, neither is purged
        (
            "/purge",
            r#"{"host": "https://shop.example", "path": "/x"}"#,
        ),
    ] {
        let answer = admin_post(node.admin, call, Some(TOKEN), body).await;
        assert_eq!(answer.status, 400, "{call} {body}: {}", answer.text());
        let reason = json(&answer)["error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            reason.contains("not a host") || reason.contains("empty host"),
            "{call} {body}: {reason}"
        );
    }
    assert_eq!(
        admin_stat(node.admin, "issued").await,
        0,
        "a refused call did something"
    );
    let path = "/zero-port?cc=max-age%3D300";
    let as_sent = [("host", "shop.example:080")];
    assert!(get(&node.proxy.url(path), &as_sent).await.is_stored());
    assert!(get(&node.proxy.url(path), &as_sent).await.is_hit());
    let other_port = format!(r#"{{"url": "http://shop.example:80{path}"}}"#);
    let answer = admin_post(node.admin, "/purge", Some(TOKEN), &other_port).await;
    assert_eq!(
        json(&answer)["this_node"]["objects"],
        0,
        "{}",
        answer.text()
    );
    let written = format!(r#"{{"url": "http://shop.example:080{path}"}}"#);
    let answer = admin_post(node.admin, "/purge", Some(TOKEN), &written).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        json(&answer)["this_node"]["objects"],
        1,
        "{}",
        answer.text()
    );
    assert!(!get(&node.proxy.url(path), &as_sent).await.is_hit());
    assert_eq!(origin.hits_for(path), 2);
}
