//! Request rules (`[[rules]]`, issue 13): one test per kind of action and of condition, against
//! the real binary and a scripted origin that records what it was sent.

use lacquer_test_support as support;

use support::*;

const QUIET: &str = "[log]\naccess = \"off\"\n";

fn with_rules(origin: &TestOrigin, rules: &str) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), &format!("{QUIET}{rules}"))
}

/// A page the scripted origin lets a shared cache keep for a minute.
const FRESH: &str = "cc=max-age%3D60";

#[tokio::test]
async fn pass_never_caches_what_it_matches() {
    let origin = scripted_origin();
    let lacquer = with_rules(
        &origin,
        "[[rules]]\nname = \"admin\"\npath_regex = \"^/admin(/|$)\"\npass = true",
    );
    let admin = format!("/admin/users?{FRESH}");
    for _ in 0..2 {
        let resp = get(&lacquer.url(&admin), &[]).await;
        assert_eq!(
            resp.cache_fwd().as_deref(),
            Some("bypass"),
            "{:?}",
            resp.cache_status()
        );
    }
    assert_eq!(
        origin.hits_for(&admin),
        2,
        "a passed request always goes to the origin"
    );
    // the same response on a path the rule does not match is cached
    let page = format!("/administrators?{FRESH}");
    get(&lacquer.url(&page), &[]).await;
    assert!(get(&lacquer.url(&page), &[]).await.is_hit());
    assert_eq!(origin.hits_for(&page), 1);
}

#[tokio::test]
async fn cache_anonymous_only_the_issues_example() {
    let origin = scripted_origin();
    // the example of issue 13, verbatim, with a store_set_cookie that it must override
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        &format!(
            "{QUIET}[cache]\nstore_set_cookie = true\n\n[[rules]]\npath = \"/\"                                  # a prefix; path_regex for a regex\ncache_anonymous_only = [\"sessionid\", \"_session_id\"]\ndrop_query = [\"utm_\", \"fbclid\", \"gclid\"]    # names or prefixes left out of the key and the fetch\n"
        ),
    );
    let page = format!("/news?{FRESH}");
    // anonymous visitors with different cookies share one stored page; the origin sees none
    let first = get(
        &lacquer.url(&page),
        &[("cookie", "csrftoken=aaa; theme=dark")],
    )
    .await;
    assert!(first.is_stored(), "{:?}", first.cache_status());
    assert!(!origin.last_request().unwrap().has_header("cookie"));
    let second = get(&lacquer.url(&page), &[("cookie", "csrftoken=bbb")]).await;
    assert!(second.is_hit(), "{:?}", second.cache_status());
    assert_eq!(second.body, first.body);

    // a visitor with a session cookie bypasses the cache, cookies and all
    let logged_in = get(
        &lacquer.url(&page),
        &[("cookie", "csrftoken=c; sessionid=s1")],
    )
    .await;
    assert_eq!(logged_in.cache_fwd().as_deref(), Some("bypass"));
    assert_eq!(
        origin.last_request().unwrap().header("cookie"),
        Some("csrftoken=c; sessionid=s1")
    );
    assert_ne!(
        logged_in.body, first.body,
        "the origin's own answer, not the stored page"
    );
    let rails = get(&lacquer.url(&page), &[("cookie", "_session_id=r1")]).await;
    assert_eq!(rails.cache_fwd().as_deref(), Some("bypass"));
    assert_eq!(origin.hits_for(&page), 3);
    // and what it got was not stored for the anonymous ones
    let anonymous = get(&lacquer.url(&page), &[]).await;
    assert!(anonymous.is_hit());
    assert_eq!(anonymous.body, first.body);

    // an anonymous response that sets a cookie is passed on, never stored (store_set_cookie
    // notwithstanding)
    let sets = format!("/welcome?{FRESH}&cookie=1");
    for _ in 0..2 {
        let resp = get(&lacquer.url(&sets), &[]).await;
        assert_eq!(resp.header("set-cookie").as_deref(), Some("session=secret"));
        assert!(!resp.is_hit());
    }
    assert_eq!(origin.hits_for(&sets), 2);

    // a form post keeps its cookies (the CSRF cookie), whatever the rule
    let form = post(
        &lacquer.url("/login"),
        &[("cookie", "csrftoken=t")],
        "user=a",
    )
    .await;
    assert_eq!(form.status, 200);
    let posted = origin.last_request().unwrap();
    assert_eq!(
        (posted.method.as_str(), posted.header("cookie")),
        ("POST", Some("csrftoken=t"))
    );

    // tracking parameters are left out of the key and the fetch
    let tracked = format!("/news?{FRESH}&utm_source=mail&fbclid=x1&gclid=y");
    let resp = get(&lacquer.url(&tracked), &[]).await;
    assert!(resp.is_hit(), "{:?}", resp.cache_status());
    assert_eq!(origin.hits_for(&page), 3);
}

#[tokio::test]
async fn drop_query_and_sort_query_rewrite_the_key_and_the_fetch() {
    let origin = scripted_origin();
    let lacquer = with_rules(
        &origin,
        "[[rules]]\npath = \"/search\"\ndrop_query = [\"utm_\", \"ref\"]\nsort_query = true",
    );
    let first = get(
        &lacquer.url(&format!("/search?q=x&utm_medium=a&{FRESH}&ref=z")),
        &[],
    )
    .await;
    assert!(first.is_stored());
    let fetched = origin.last_request().unwrap().path;
    assert_eq!(
        fetched,
        format!("/search?{FRESH}&q=x"),
        "dropped and sorted for the origin too"
    );
    // another order, other tracking values: the same key
    let again = get(
        &lacquer.url(&format!("/search?utm_source=b&q=x&{FRESH}")),
        &[],
    )
    .await;
    assert!(again.is_hit(), "{:?}", again.cache_status());
    // a parameter that matters still makes another page
    let other = get(&lacquer.url(&format!("/search?q=y&{FRESH}")), &[]).await;
    assert!(!other.is_hit());
    // outside the rule's path nothing is rewritten
    get(&lacquer.url(&format!("/other?utm_source=b&{FRESH}")), &[]).await;
    assert_eq!(
        origin.last_request().unwrap().path,
        format!("/other?utm_source=b&{FRESH}")
    );
}

#[tokio::test]
async fn a_purge_removes_the_page_a_get_of_its_url_stored_after_the_rules() {
    let origin = scripted_origin();
    let lacquer = with_rules(
        &origin,
        "[[rules]]\npath = \"/\"\ndrop_query = [\"utm_\"]\nsort_query = true",
    );
    let fetched = format!("/page?a=1&b=2&{FRESH}");
    let first = get(
        &lacquer.url(&format!("/page?utm_source=mail&b=2&a=1&{FRESH}")),
        &[],
    )
    .await;
    assert!(first.is_stored(), "{:?}", first.cache_status());
    assert!(get(&lacquer.url(&fetched), &[]).await.is_hit());
    // the URL as a reader clicked it, tracking parameters and all: it names the stored page
    let purged = request(
        "PURGE",
        &lacquer.url(&format!("/page?b=2&utm_campaign=x&a=1&{FRESH}")),
        &[],
        None,
    )
    .await;
    assert_eq!(
        purged.status,
        200,
        "the page was found: {:?}",
        purged.header("lacquer-purge")
    );
    let after = get(&lacquer.url(&fetched), &[]).await;
    assert!(!after.is_hit(), "{:?}", after.cache_status());
    assert_eq!(origin.hits_for(&fetched), 2, "refetched after the purge");
    // a URL the rules do not reduce to a stored page finds nothing
    let elsewhere = request(
        "PURGE",
        &lacquer.url(&format!("/page?a=2&utm_source=mail&{FRESH}")),
        &[],
        None,
    )
    .await;
    assert_eq!(elsewhere.status, 404);
    assert!(get(&lacquer.url(&fetched), &[]).await.is_hit());
}

#[tokio::test]
async fn strip_cookies_and_strip_set_cookie_make_static_files_cacheable() {
    let origin = scripted_origin();
    let lacquer = with_rules(
        &origin,
        "[[rules]]\npath = \"/static/\"\nstrip_cookies = true\nstrip_set_cookie = true",
    );
    let asset = format!("/static/app.css?{FRESH}&cookie=1");
    let first = get(&lacquer.url(&asset), &[("cookie", "sessionid=s")]).await;
    assert!(!first.has_header("set-cookie"));
    assert!(first.is_stored(), "{:?}", first.cache_status());
    assert!(!origin.last_request().unwrap().has_header("cookie"));
    assert!(get(&lacquer.url(&asset), &[("cookie", "sessionid=t")])
        .await
        .is_hit());
    // elsewhere the Set-Cookie stays, and keeps the response out of the cache
    let page = format!("/page?{FRESH}&cookie=1");
    let resp = get(&lacquer.url(&page), &[("cookie", "sessionid=s")]).await;
    assert_eq!(resp.header("set-cookie").as_deref(), Some("session=secret"));
    assert_eq!(
        origin.last_request().unwrap().header("cookie"),
        Some("sessionid=s")
    );
    assert!(!get(&lacquer.url(&page), &[]).await.is_hit());
}

#[tokio::test]
async fn ttl_and_grace_override_what_the_response_says() {
    let origin = scripted_origin();
    let lacquer = with_rules(
        &origin,
        "[[rules]]\npath = \"/assets/\"\nttl = \"1h\"\n\n[[rules]]\npath = \"/live/\"\ngrace = \"0s\"",
    );
    let asset = "/assets/a.js?cc=max-age%3D5";
    get(&lacquer.url(asset), &[]).await;
    let ttl = get(&lacquer.url(asset), &[]).await.cache_ttl().unwrap();
    assert!((3590..=3600).contains(&ttl), "ttl {ttl}");

    // max-age=1, then the origin fails: the default grace serves the stale copy, the rule's
    // zero grace lets the failure through
    let live = "/live/score?cc=max-age%3D1&fail_after=1";
    let other = "/score?cc=max-age%3D1&fail_after=1";
    for path in [live, other] {
        assert_eq!(get(&lacquer.url(path), &[]).await.status, 200);
    }
    // both copies stale (a wait, not a timing assertion: later is as good)
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let failing = get(&lacquer.url(live), &[]).await;
    assert_eq!(failing.status, 503, "{:?}", failing.cache_status());
    let graced = get(&lacquer.url(other), &[]).await;
    assert_eq!(graced.status, 200, "{:?}", graced.cache_status());
    assert!(graced
        .cache_status_param("detail")
        .is_some_and(|d| d.starts_with("origin-")));
}

#[tokio::test]
async fn request_and_response_headers_are_set_and_removed() {
    let origin = scripted_origin();
    let lacquer = with_rules(
        &origin,
        "[[rules]]\npath = \"/\"\nset_request_headers = { \"X-Site\" = \"blog\" }\n\
         remove_request_headers = [\"X-Debug\"]\n\
         set_response_headers = { \"X-Frame-Options\" = \"DENY\" }\n\
         remove_response_headers = [\"X-Origin-Count\"]",
    );
    let page = format!("/post/1?{FRESH}");
    let miss = get(&lacquer.url(&page), &[("x-debug", "1")]).await;
    let sent = origin.last_request().unwrap();
    assert_eq!(sent.header("x-site"), Some("blog"));
    assert!(!sent.has_header("x-debug"));
    let hit = get(&lacquer.url(&page), &[]).await;
    assert!(hit.is_hit());
    for resp in [&miss, &hit] {
        assert_eq!(resp.header("x-frame-options").as_deref(), Some("DENY"));
        assert!(!resp.has_header("x-origin-count"));
    }
}

#[tokio::test]
async fn each_condition_selects_its_requests() {
    let origin = scripted_origin();
    let lacquer = with_rules(
        &origin,
        "[[rules]]\nhost = \"Admin.Example.test\"\npass = true\n\n\
         [[rules]]\nhost_regex = \"^api[0-9]*\\\\.\"\npass = true\n\n\
         [[rules]]\nmethod = [\"HEAD\"]\nset_response_headers = { \"X-Head\" = \"1\" }\n\n\
         [[rules]]\ncookie = { name = \"preview\", value = \"on\" }\npass = true\n\n\
         [[rules]]\nheader = \"X-Draft\"\npass = true\n\n\
         [[rules]]\nquery = { name = \"nocache\", value = \"1\" }\npass = true",
    );
    let page = format!("/c?{FRESH}");
    get(&lacquer.url(&page), &[]).await;
    assert!(get(&lacquer.url(&page), &[]).await.is_hit());
    let bypassed = |resp: &Resp| resp.cache_fwd().as_deref() == Some("bypass");
    for (headers, passes) in [
        (vec![("host", "admin.example.test:80")], true),
        // the final dot of a fully qualified name does not escape the rule
        (vec![("host", "Admin.Example.test.")], true),
        (vec![("host", "admin.example.test.:8080")], true),
        (vec![("host", "admin.example.test..")], false),
        (vec![("host", "www.example.test")], false),
        (vec![("host", "api7.example.test")], true),
        (vec![("host", "www.api7.test")], false),
        (vec![("cookie", "preview=on")], true),
        (vec![("cookie", "preview=off")], false),
        (vec![("x-draft", "anything")], true),
        (vec![("x-drafts", "1")], false),
    ] {
        let resp = get(&lacquer.url(&page), &headers).await;
        assert_eq!(
            bypassed(&resp),
            passes,
            "{headers:?}: {:?}",
            resp.cache_status()
        );
    }
    assert!(bypassed(
        &get(&lacquer.url(&format!("{page}&nocache=1")), &[]).await
    ));
    assert!(!bypassed(
        &get(&lacquer.url(&format!("{page}&nocache=0")), &[]).await
    ));
    let head_resp = head(&lacquer.url(&page), &[]).await;
    assert_eq!(head_resp.header("x-head").as_deref(), Some("1"));
    assert!(!get(&lacquer.url(&page), &[]).await.has_header("x-head"));
}

#[tokio::test]
async fn backend_group_sends_matching_requests_to_its_backends() {
    let app = Replica::start("app");
    let media = Replica::start("media");
    let lacquer = LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 2\n{QUIET}\
             [[upstreams]]\naddress = \"{}\"\n\n[[upstreams]]\naddress = \"{}\"\ngroup = \"media\"\n\n\
             [[rules]]\npath = \"/media/\"\nbackend_group = \"media\"\n",
            app.addr(),
            media.addr()
        )
    });
    for i in 0..4 {
        let img = get(&lacquer.url(&format!("/media/{i}.jpg")), &[]).await;
        assert_eq!(img.header("x-backend").as_deref(), Some("media"));
        let page = get(&lacquer.url(&format!("/page/{i}")), &[]).await;
        assert_eq!(page.header("x-backend").as_deref(), Some("app"));
    }
    assert_eq!((app.served(), media.served()), (4, 4));
}

#[tokio::test]
async fn a_reload_applies_changed_rules() {
    let origin = scripted_origin();
    let rules = |path: &str| format!("[[rules]]\npath = \"{path}\"\npass = true\n");
    let lacquer = with_rules(&origin, &rules("/admin/"));
    let admin = format!("/admin/users?{FRESH}");
    let private = format!("/private/notes?{FRESH}");
    for _ in 0..2 {
        let resp = get(&lacquer.url(&admin), &[]).await;
        assert_eq!(resp.cache_fwd().as_deref(), Some("bypass"));
    }
    get(&lacquer.url(&private), &[]).await;
    assert!(get(&lacquer.url(&private), &[]).await.is_hit());

    // the rule now passes /private/ instead of /admin/
    lacquer.write_config(&simple_config(
        lacquer.port(),
        origin.addr(),
        &format!("{QUIET}{}", rules("/private/")),
    ));
    assert!(lacquer.signal("HUP"));
    assert!(
        wait_for_log(&lacquer, "configuration reloaded", Duration::from_secs(10)),
        "{}",
        lacquer.stderr_log()
    );
    let resp = get(&lacquer.url(&private), &[]).await;
    assert_eq!(
        resp.cache_fwd().as_deref(),
        Some("bypass"),
        "{:?}",
        resp.cache_status()
    );
    get(&lacquer.url(&admin), &[]).await;
    assert!(get(&lacquer.url(&admin), &[]).await.is_hit());
    assert_eq!(origin.hits_for(&admin), 3);
    assert_eq!(origin.hits_for(&private), 2);
}
