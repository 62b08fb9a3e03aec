//! A real application in the suite (issue 13 item 3): the Django site of `tests/django_site/`
//! under gunicorn, with Lacquer in front configured by `tests/django_site/lacquer.toml` (the
//! config README.md gives). Anonymous pages are cached and served without the app, logged-in
//! pages never are and never leak between two users, form posts work, and behind Lacquer's TLS
//! listener `SECURE_PROXY_SSL_HEADER` sees https, so there is no redirect loop.
//!
//! Needs Django and gunicorn in the project's `.venv`, made by `scripts/setup.sh` (which CI runs
//! through `scripts/test.sh`); without them each test says so and does nothing.

mod support;

use std::process::Command;
use support::*;

const SITE_RULES: &str = include_str!("django_site/lacquer.toml");

/// The site, or `None` (with the reason printed) when its virtualenv is missing.
fn site(env: &[(&str, &str)]) -> Option<DjangoSite> {
    if DjangoSite::venv().is_none() {
        eprintln!(
            "SKIPPED: no gunicorn in .venv; run scripts/setup.sh to install Django and gunicorn \
             there"
        );
        return None;
    }
    Some(DjangoSite::start(env))
}

fn lacquer_in_front(site: &DjangoSite, extra: &str) -> LacquerProcess {
    LacquerProcess::start_simple(
        site.addr(),
        &format!("[log]\naccess = \"off\"\n{extra}\n{SITE_RULES}"),
    )
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

#[test]
fn behind_the_tls_listener_secure_proxy_ssl_header_sees_https_without_a_redirect_loop() {
    // the site redirects every plain-http request to https (SECURE_SSL_REDIRECT), trusting
    // X-Forwarded-Proto, which Lacquer sets from the listener the client used
    let Some(site) = site(&[("DJANGO_SSL_REDIRECT", "1")]) else {
        return;
    };
    let dir = TempDir::new("django-tls");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl is installed");
    assert!(made.status.success(), "{}", stderr_text(&made));
    let tls_port = free_port();
    let lacquer = lacquer_in_front(
        &site,
        &format!(
            "[tls]\nlisten = [\"127.0.0.1:{tls_port}\"]\ncert = \"{}\"\nkey = \"{}\"",
            cert.display(),
            key.display()
        ),
    );
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
