//! A real application in the suite (issue 13 item 3): the Django site of `tests/django_site/`,
//! its pages under gunicorn and its WebSocket endpoint (Django Channels) under uvicorn, with
//! Lacquer in front configured by `tests/django_site/lacquer.toml` (the config README.md gives).
//! Anonymous pages are cached and served without the app, logged-in pages never are and never
//! leak between two users, form posts work, the WebSocket endpoint echoes and knows each
//! visitor's session, and behind Lacquer's TLS listener `SECURE_PROXY_SSL_HEADER` sees https, so
//! there is no redirect loop.
//!
//! Needs Django, gunicorn, Channels and uvicorn in the project's `.venv`, made by
//! `scripts/setup.sh` (which CI runs through `scripts/test.sh`); without them each test says so
//! and does nothing.

use lacquer_test_support as support;

use futures_util::{SinkExt, StreamExt};
use std::process::Command;
use support::*;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

const SITE_RULES: &str = include_str!("django_site/lacquer.toml");

/// The site, or `None` (with the reason printed) when its virtualenv is missing.
fn site(env: &[(&str, &str)]) -> Option<DjangoSite> {
    if DjangoSite::venv().is_none() {
        eprintln!(
            "SKIPPED: no gunicorn or uvicorn in .venv; run scripts/setup.sh to install the \
             Django site's requirements there"
        );
        return None;
    }
    Some(DjangoSite::start(env))
}

/// Lacquer with the site's rules in front of its two servers: gunicorn, and uvicorn as the
/// backend group `sockets` the WebSocket rule sends `/ws/` to.
fn lacquer_in_front(site: &DjangoSite, extra: &str) -> LacquerProcess {
    let (pages, sockets) = (site.addr(), site.sockets_addr());
    LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 2\n[log]\naccess = \"off\"\n{extra}\n\
             [[upstreams]]\naddress = \"{pages}\"\n\
             [[upstreams]]\naddress = \"{sockets}\"\ngroup = \"sockets\"\n{SITE_RULES}"
        )
    })
}

/// The `name=value` of the cookie `name` a response sets.
fn set_cookie(resp: &Resp, name: &str) -> Option<String> {
    resp.header_all("set-cookie")
        .iter()
        .filter_map(|c| c.split(';').next())
        .find(|pair| pair.starts_with(&format!("{name}=")))
        .map(str::to_string)
}

/// The CSRF token of the form in a page.
fn form_token(page: &Resp) -> String {
    let text = page.text();
    let marker = "name=\"csrfmiddlewaretoken\" value=\"";
    let start = text.find(marker).expect("a CSRF-protected form") + marker.len();
    text[start..].split('"').next().unwrap().to_string()
}

/// A signed-in visitor: the cookies the site gave them.
struct Visitor {
    cookies: String,
}

impl Visitor {
    async fn sign_in(lacquer: &LacquerProcess, name: &str, password: &str) -> Visitor {
        let form = get(&lacquer.url("/login/"), &[]).await;
        assert_eq!(form.status, 200);
        assert!(
            !form.is_hit(),
            "a page that sets the CSRF cookie is never stored"
        );
        let csrf = set_cookie(&form, "csrftoken").expect("the login page sets the CSRF cookie");
        let body = format!(
            "username={name}&password={password}&csrfmiddlewaretoken={}",
            form_token(&form)
        );
        let signed_in = post(
            &lacquer.url("/login/"),
            &[
                ("cookie", &csrf),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            body,
        )
        .await;
        assert_eq!(signed_in.status, 302, "{}", signed_in.text());
        assert_eq!(signed_in.header("location").as_deref(), Some("/account/"));
        let session = set_cookie(&signed_in, "sessionid").expect("a session cookie");
        // Django rotates the CSRF token at login
        let csrf = set_cookie(&signed_in, "csrftoken").unwrap_or(csrf);
        Visitor {
            cookies: format!("{csrf}; {session}"),
        }
    }

    async fn get(&self, lacquer: &LacquerProcess, path: &str) -> Resp {
        get(&lacquer.url(path), &[("cookie", &self.cookies)]).await
    }
}

#[tokio::test]
async fn anonymous_pages_are_cached_and_served_without_the_app() {
    let Some(site) = site(&[]) else { return };
    let lacquer = lacquer_in_front(&site, "");
    // visitors with different CSRF cookies (and tracking parameters) share one stored page
    let first = get(&lacquer.url("/articles/7/"), &[("cookie", "csrftoken=a1")]).await;
    assert_eq!(first.status, 200);
    assert!(first.text().contains("Article 7"));
    for (path, cookie) in [
        ("/articles/7/", "csrftoken=b2"),
        (
            "/articles/7/?utm_source=newsletter&fbclid=x",
            "csrftoken=c3; theme=dark",
        ),
        ("/articles/7/", ""),
    ] {
        let again = get(&lacquer.url(path), &[("cookie", cookie)]).await;
        assert!(
            again.is_hit(),
            "{path} {cookie}: {:?}",
            again.cache_status()
        );
        assert_eq!(again.body, first.body);
    }
    assert_eq!(site.hits("GET", "/articles/7/"), 1, "{:?}", site.requests());
    assert!(
        !site.requests().iter().any(|r| r.contains("utm_")),
        "tracking parameters are not fetched"
    );

    // the home page reads the session (Vary: Cookie): anonymous visitors still share it
    get(&lacquer.url("/"), &[("cookie", "csrftoken=a1")]).await;
    let home = get(&lacquer.url("/"), &[("cookie", "csrftoken=zz")]).await;
    assert!(home.is_hit(), "{:?}", home.cache_status());
    assert!(home.text().contains("Hello, visitor"));
    assert_eq!(site.hits("GET", "/"), 1);

    // static files: cached for an hour whatever cookies come with them
    let css = "/static/site.css";
    get(&lacquer.url(css), &[("cookie", "sessionid=whatever")]).await;
    let hit = get(&lacquer.url(css), &[("cookie", "sessionid=other")]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert!(hit.cache_ttl().unwrap() > 3000);
    assert!(hit.text().contains("font-family"));
    assert_eq!(site.hits("GET", css), 1);
}

#[tokio::test]
async fn signed_in_pages_are_never_cached_nor_leaked_and_forms_post() {
    let Some(site) = site(&[]) else { return };
    let lacquer = lacquer_in_front(&site, "");
    // an anonymous home page is stored first: it must not be shown to the signed in
    let anonymous = get(&lacquer.url("/"), &[]).await;
    assert!(anonymous.text().contains("Hello, visitor"));

    let alice = Visitor::sign_in(&lacquer, "alice", "wonderland").await;
    let bob = Visitor::sign_in(&lacquer, "bob", "builder").await;
    // the app says max-age=60 on every page; each user still sees their own, every time
    for _ in 0..2 {
        for (visitor, name) in [(&alice, "Alice"), (&bob, "Bob")] {
            for path in ["/account/", "/"] {
                let page = visitor.get(&lacquer, path).await;
                assert_eq!(page.status, 200, "{path}");
                assert!(
                    page.text().contains(&format!("Signed in as {name}")),
                    "{name} {path}: {}",
                    page.text()
                );
                assert_eq!(page.cache_fwd().as_deref(), Some("bypass"));
            }
        }
    }
    assert_eq!(
        site.hits("GET", "/account/"),
        4,
        "every signed-in page from the app"
    );
    assert_eq!(site.hits("GET", "/"), 5);
    // and nothing of theirs was stored for anonymous visitors
    let later = get(&lacquer.url("/"), &[]).await;
    assert!(later.is_hit());
    assert!(later.text().contains("Hello, visitor"));

    // a CSRF-protected form posts through the proxy
    let form = alice.get(&lacquer, "/comment/").await;
    let token = form_token(&form);
    let posted = post(
        &lacquer.url("/comment/"),
        &[
            ("cookie", &alice.cookies),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
        format!("text=first+post&csrfmiddlewaretoken={token}"),
    )
    .await;
    assert_eq!(posted.status, 200, "{}", posted.text());
    assert!(posted
        .text()
        .contains("<li class=\"comment\">first post</li>"));
    // without the token Django refuses it: the check really runs behind the proxy
    let forged = post(
        &lacquer.url("/comment/"),
        &[
            ("cookie", &alice.cookies),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
        "text=forged",
    )
    .await;
    assert_eq!(forged.status, 403);
    assert_eq!(site.hits("POST", "/comment/"), 2);
}

/// Opens the site's WebSocket through Lacquer, with `cookies` when given; checks the `101`.
async fn open_echo_socket(
    lacquer: &LacquerProcess,
    cookies: Option<&str>,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let mut request = format!("ws://127.0.0.1:{}/ws/echo/", lacquer.port())
        .into_client_request()
        .unwrap();
    if let Some(cookies) = cookies {
        request
            .headers_mut()
            .insert("cookie", cookies.parse().unwrap());
    }
    let (ws, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("the WebSocket handshake through Lacquer");
    assert_eq!(response.status(), 101);
    ws
}

#[tokio::test]
async fn the_websocket_endpoint_echoes_and_knows_each_visitor_while_its_page_stays_cached() {
    let Some(site) = site(&[]) else { return };
    let lacquer = lacquer_in_front(&site, "");
    // the page that opens the socket is an anonymous page like the others: cached
    let page = get(&lacquer.url("/echo/"), &[("cookie", "csrftoken=a1")]).await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("/ws/echo/"), "{}", page.text());

    let alice = Visitor::sign_in(&lacquer, "alice", "wonderland").await;
    let bob = Visitor::sign_in(&lacquer, "bob", "builder").await;
    // each connection greets the session's user: the cookie reached the endpoint, and no
    // greeting is ever another visitor's
    let visitors = [
        (Some(alice.cookies.as_str()), "Alice"),
        (None, "visitor"),
        (Some(bob.cookies.as_str()), "Bob"),
        (Some("csrftoken=zz"), "visitor"),
        (Some(alice.cookies.as_str()), "Alice"),
    ];
    for (connection, (cookies, name)) in visitors.into_iter().enumerate() {
        let mut ws = open_echo_socket(&lacquer, cookies).await;
        let greeting = ws.next().await.unwrap().unwrap();
        assert_eq!(greeting, Message::text(format!("Hello, {name}")));

        assert_echoes(&mut ws, &format!("text from {name}")).await;
        // the endpoint's answering Close comes back through the tunnel, then the stream ends
        assert_closes_normally(ws).await;
        // every connection reached the app: nothing answered it from a cache
        assert_eq!(site.hits("WEBSOCKET", "/ws/echo/"), connection + 1);
    }

    // the endpoint closes first: its Close reaches the client, which answers it
    let mut ws = open_echo_socket(&lacquer, None).await;
    ws.next().await.unwrap().unwrap();
    ws.send(Message::text("bye")).await.unwrap();
    let mut closed_with = None;
    while let Some(msg) = ws.next().await {
        if let Message::Close(frame) = msg.unwrap() {
            closed_with = frame;
        }
    }
    assert_eq!(closed_with.map(|f| f.code), Some(CloseCode::from(4000)));

    // the page stayed cached for anonymous visitors throughout
    let again = get(&lacquer.url("/echo/"), &[("cookie", "csrftoken=b2")]).await;
    assert!(again.is_hit(), "{:?}", again.cache_status());
    assert_eq!(again.body, page.body);
    assert_eq!(site.hits("GET", "/echo/"), 1, "{:?}", site.requests());
    // and no socket went to gunicorn (whose Django would have logged it as a GET)
    assert!(
        !site.requests().iter().any(|r| r.starts_with("GET /ws/")),
        "{:?}",
        site.requests()
    );
}

#[test]
fn behind_the_tls_listener_secure_proxy_ssl_header_sees_https_without_a_redirect_loop() {
    // the site redirects every plain-http request to https (SECURE_SSL_REDIRECT), trusting
    // X-Forwarded-Proto, which Lacquer sets from the listener the client used
    let Some(site) = site(&[("DJANGO_SSL_REDIRECT", "1")]) else {
        return;
    };
    let dir = TempDir::new("django-tls");
    let tls = self_signed_cert(dir.path());
    let tls_port = free_port();
    let lacquer = lacquer_in_front(&site, &tls.tls_toml(&format!("127.0.0.1:{tls_port}")));
    let curl = |url: &str| {
        let out = Command::new("curl")
            .args([
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{redirect_url}",
            ])
            .arg(url)
            .output()
            .expect("curl is installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let https = format!("https://127.0.0.1:{tls_port}/articles/1/");
    assert_eq!(curl(&https), "200 ", "no redirect over TLS");
    assert_eq!(curl(&https), "200 ");
    // plain http is sent to https, once
    let plain = curl(&lacquer.url("/articles/1/"));
    assert!(plain.starts_with("301 https://"), "{plain}");
}

#[test]
fn the_readme_gives_the_config_the_suite_uses() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let rules = SITE_RULES
        .split_once("\n\n")
        .map(|(_header, rules)| rules)
        .unwrap();
    assert!(
        readme.contains(rules),
        "README.md's \"Deploying in front of Rails or Django\" must show tests/django_site/lacquer.toml's rules"
    );
}
