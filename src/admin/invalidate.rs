//! The invalidation API: `POST /purge` and `POST /ban`, JSON in and out.
//!
//! ```text
//! POST /purge  {"url": "http://shop.example/products?id=7"}            one URL, every variant
//!              {"host": "shop.example", "path": "/products?id=7"}      that page of both schemes
//!              {"host": "...", "path": "...", "scheme": "https"}       ... of one scheme
//! POST /ban    {"tag": "product-7"}                                    every entry tagged so
//!              {"host": "shop.example"}                                every entry of a host
//!              {"host": "shop.example", "prefix": "/products/"}        a path prefix of a host
//!              {"prefix": "/static/"}                                  ... of every host
//! ```
//!
//! Every call may add `"soft": true` (mark stale instead of removing), `"wait": false` (answer
//! without waiting for the other nodes to confirm, which they do within a poll interval; a node
//! that does not is waited for up to 5 s, or three poll intervals when longer) and `"by": "deploy-bot"` (who is asking, for
//! the logs). The answer is the [`Report`](crate::invalidation::report::Report): 200 when
//! everything was reached, 202 when something is pending (retried in the background), 503 when
//! no memcached server took it; 400 for a body that names nothing valid. A purge by `host` and
//! `path` without a `scheme` removes the `http` and the `https` page (the scheme is part of the
//! cache key, `crate::proxy::cache_key`): the answer is the `http` page's report with the `https`
//! page's as its `other_scheme`, and the status of the less complete of the two. Authentication is
//! [`super::auth`]'s, checked before the body is read.

use crate::invalidation::target::Target;
use crate::invalidation::{check_target, Invalidator, Request};
use pingora_core::protocols::http::ServerSession;
use serde::Deserialize;
use std::net::IpAddr;

/// The largest request body read.
const MAX_BODY: usize = 64 * 1024;

/// `POST /purge` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    url: Option<String>,
    host: Option<String>,
    path: Option<String>,
    /// With `host` and `path`: `http` or `https` only (default both).
    scheme: Option<String>,
    #[serde(default)]
    soft: bool,
    wait: Option<bool>,
    by: Option<String>,
}

/// `POST /ban` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BanBody {
    tag: Option<String>,
    host: Option<String>,
    prefix: Option<String>,
    #[serde(default)]
    soft: bool,
    wait: Option<bool>,
    by: Option<String>,
}

/// What every call may add.
struct Options {
    soft: bool,
    wait: Option<bool>,
    by: Option<String>,
}

/// A call's body: what it targets and the options every call may add. (Two structs rather than
/// one flattened `Options`: serde's `flatten` cannot be combined with `deny_unknown_fields`, and a
/// misspelt key must be refused, not ignored.)
trait CallBody: serde::de::DeserializeOwned {
    /// What the call removes or marks: one target, or a page of both schemes.
    fn targets(&self) -> Result<Vec<Target>, String>;
    fn options(self) -> Options;
}

impl CallBody for PurgeBody {
    fn targets(&self) -> Result<Vec<Target>, String> {
        purge_targets(self)
    }
    fn options(self) -> Options {
        Options {
            soft: self.soft,
            wait: self.wait,
            by: self.by,
        }
    }
}

impl CallBody for BanBody {
    fn targets(&self) -> Result<Vec<Target>, String> {
        ban_target(self).map(|target| vec![target])
    }
    fn options(self) -> Options {
        Options {
            soft: self.soft,
            wait: self.wait,
            by: self.by,
        }
    }
}

/// A body of type `B` parsed: its targets and options, or why it names nothing valid.
fn parse<B: CallBody>(body: &[u8]) -> Result<(Vec<Target>, Options), String> {
    let body: B = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    Ok((body.targets()?, body.options()))
}

/// Which of the two calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Purge,
    Ban,
}

/// Answers one authenticated call: the status and the JSON body.
pub async fn on_request(
    session: &mut ServerSession,
    call: Call,
    invalidator: &'static Invalidator,
    client: Option<IpAddr>,
) -> (u16, String) {
    let body = match read_body(session).await {
        Ok(body) => body,
        Err(reason) => return error(400, &reason),
    };
    let client = client.map_or_else(|| "unknown".to_string(), |ip| ip.to_string());
    let request = match call {
        Call::Purge => parse::<PurgeBody>(&body),
        Call::Ban => parse::<BanBody>(&body),
    };
    let (targets, options) = match request {
        Ok(parsed) => parsed,
        Err(reason) => return error(400, &reason),
    };
    let asked_by = match options.by.as_deref().map(sanitize) {
        Some(by) => format!("{client} (admin API, {by})"),
        None => format!("{client} (admin API)"),
    };
    // every target checked before any is carried out: a page of both schemes is purged whole
    // or not at all
    if let Some(Err(refused)) = targets.iter().map(check_target).find(Result::is_err) {
        return error(400, &refused.0);
    }
    let mut reports = Vec::with_capacity(targets.len());
    for target in targets {
        let request = Request {
            target,
            soft: options.soft,
            asked_by: asked_by.clone(),
            wait: options.wait.unwrap_or(true),
            only_if_stored: false,
        };
        match invalidator.invalidate(request).await {
            Ok(report) => reports.push(report),
            Err(refused) => return error(400, &refused.0),
        }
    }
    match reports.as_slice() {
        [report] => (report.status(), report.to_json()),
        [http, https] => {
            let mut body = serde_json::to_value(http).expect("reports serialize to JSON");
            body["other_scheme"] = serde_json::to_value(https).expect("reports serialize");
            let mut body = body.to_string();
            body.push('\n');
            (least_complete(http.status(), https.status()), body)
        }
        _ => unreachable!("one target, or a page of both schemes"),
    }
}

/// Of two reports' statuses, the one that says less was done: 503 (no memcached server took
/// it) before 202 (something pending) before 200.
fn least_complete(a: u16, b: u16) -> u16 {
    let rank = |status| match status {
        503 => 2,
        202 => 1,
        _ => 0,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// The body, whole, up to [`MAX_BODY`].
async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_BODY {
                    return Err(format!("the body is larger than {MAX_BODY} bytes"));
                }
            }
            Ok(None) => return Ok(body),
            Err(e) => return Err(format!("the body could not be read: {e}")),
        }
    }
}

/// The page a purge names: a URL's (its scheme's page), or a host and path's (both schemes' pages,
/// `http` first, unless `scheme` names one).
fn purge_targets(body: &PurgeBody) -> Result<Vec<Target>, String> {
    if body.scheme.is_some() && body.url.is_some() {
        return Err("\"scheme\" goes with \"host\" and \"path\" (a URL has its own)".into());
    }
    match (&body.host, &body.path) {
        (Some(host), Some(path)) if body.url.is_none() => {
            // checked as given: a scheme is "scheme"'s to say, not the host's
            if let Some(problem) = crate::invalidation::target::host_problem(host) {
                return Err(problem);
            }
            let schemes: &[bool] = match body.scheme.as_deref() {
                None => &[false, true],
                Some("http") => &[false],
                Some("https") => &[true],
                Some(other) => return Err(format!("\"scheme\" \"{other}\" is not http or https")),
            };
            Ok(schemes
                .iter()
                .map(|&https| Target::page(https, host, path))
                .collect())
        }
        _ => purge_target(body).map(|target| vec![target]),
    }
}

fn purge_target(body: &PurgeBody) -> Result<Target, String> {
    match (&body.url, &body.host, &body.path) {
        (Some(url), None, None) => {
            let uri: http::Uri = url.parse().map_err(|_| format!("\"{url}\" is not a URL"))?;
            let authority = uri
                .authority()
                .filter(|_| matches!(uri.scheme_str(), Some("http" | "https")))
                .ok_or_else(|| format!("\"{url}\" is not an http(s) URL with a host"))?;
            // the host and port as written (keys hold them as the client sent them: `:080` is
            // not `:80`), less any userinfo; a port that is not digits is refused with the
            // target (`Target::host_problem`), not dropped
            let authority = authority.as_str();
            let host = authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host);
            // `http://a.example?q` is keyed as `/?q`, as a request for it is
            let path = match uri.path_and_query().map(|pq| pq.as_str()) {
                Some(path) if path.starts_with('/') => path.to_string(),
                Some(path) => format!("/{path}"),
                None => "/".to_string(),
            };
            // the cache key has the scheme: an https URL names the https page
            let https = uri.scheme_str() == Some("https");
            Ok(Target::page(https, host, &path))
        }
        _ => Err("give \"url\", or \"host\" and \"path\"".into()),
    }
}

fn ban_target(body: &BanBody) -> Result<Target, String> {
    match (&body.tag, &body.host, &body.prefix) {
        (Some(tag), None, None) => Ok(Target::Tag(tag.clone())),
        (None, Some(host), None) => Ok(Target::Host(host.to_ascii_lowercase())),
        (None, host, Some(prefix)) => Ok(Target::Prefix {
            host: host.as_deref().map(str::to_ascii_lowercase),
            prefix: prefix.clone(),
        }),
        _ => Err("give one of \"tag\", \"host\", or \"prefix\" (with or without \"host\")".into()),
    }
}

/// Who-is-asking text safe for a log line: printable ASCII, at most 64 characters.
fn sanitize(by: &str) -> String {
    by.chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(64)
        .collect()
}

fn error(status: u16, reason: &str) -> (u16, String) {
    let mut body = serde_json::json!({ "error": reason }).to_string();
    body.push('\n');
    (status, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn purge(json: &str) -> Result<Target, String> {
        let mut targets = purge_targets(&serde_json::from_str(json).map_err(|e| e.to_string())?)?;
        assert_eq!(targets.len(), 1, "{json}");
        Ok(targets.remove(0))
    }

    fn purge_pages(json: &str) -> Result<Vec<Target>, String> {
        purge_targets(&serde_json::from_str(json).map_err(|e| e.to_string())?)
    }

    fn ban(json: &str) -> Result<Target, String> {
        ban_target(&serde_json::from_str(json).map_err(|e| e.to_string())?)
    }

    #[test]
    fn purge_bodies_name_one_url_with_the_host_as_the_cache_key_has_it() {
        assert_eq!(
            purge(r#"{"url": "http://Shop.Example:8080/a?b=1", "soft": true}"#),
            Ok(Target::url("shop.example:8080", "/a?b=1"))
        );
        assert_eq!(
            purge(r#"{"url": "https://shop.example"}"#),
            // the key of an https page starts with the scheme (proxy::cache_key)
            Ok(Target::url("https://shop.example", "/"))
        );
        // a host and path name the page of both schemes, or of the one given
        assert_eq!(
            purge_pages(r#"{"host": "Shop.example", "path": "/x"}"#),
            Ok(vec![
                Target::url("shop.example", "/x"),
                Target::url("https://shop.example", "/x")
            ])
        );
        assert_eq!(
            purge(r#"{"host": "shop.example", "path": "/x", "scheme": "http"}"#),
            Ok(Target::url("shop.example", "/x"))
        );
        assert_eq!(
            purge(r#"{"host": "shop.example", "path": "/x", "scheme": "https"}"#),
            Ok(Target::url("https://shop.example", "/x"))
        );
        // the port and host as written, userinfo dropped; a query without a path is `/?q`
        assert_eq!(
            purge(r#"{"url": "http://u@Shop.example:080?q=1"}"#),
            Ok(Target::url("shop.example:080", "/?q=1"))
        );
        assert_eq!(
            purge(r#"{"url": "http://shop.example:8o/x"}"#),
            Ok(Target::url("shop.example:8o", "/x"))
        );
        assert!(Target::url("shop.example:8o", "/x")
            .host_problem()
            .is_some());
        for bad in [
            r#"{"host": "https://shop.example", "path": "/x"}"#,
            r#"{"host": "a/b", "path": "/x", "scheme": "http"}"#,
            r#"{}"#,
            r#"{"url": "/relative"}"#,
            r#"{"url": "ftp://h/x"}"#,
            r#"{"url": "http://h/x", "host": "h"}"#,
            r#"{"uri": "http://h/x"}"#,
            r#"{"host": "h", "path": "/x", "scheme": "ftp"}"#,
            r#"{"url": "http://h/x", "scheme": "http"}"#,
        ] {
            assert!(purge_pages(bad).is_err(), "{bad}");
        }
        assert_eq!(least_complete(200, 202), 202);
        assert_eq!(least_complete(503, 202), 503);
        assert_eq!(least_complete(200, 200), 200);
    }

    #[test]
    fn ban_bodies_name_a_tag_a_host_or_a_prefix() {
        assert_eq!(ban(r#"{"tag": "p-7"}"#), Ok(Target::Tag("p-7".into())));
        assert_eq!(
            ban(r#"{"host": "A.test"}"#),
            Ok(Target::Host("a.test".into()))
        );
        assert_eq!(
            ban(r#"{"host": "a.test", "prefix": "/img/", "wait": false, "by": "ci"}"#),
            Ok(Target::Prefix {
                host: Some("a.test".into()),
                prefix: "/img/".into()
            })
        );
        assert_eq!(
            ban(r#"{"prefix": "/img/"}"#),
            Ok(Target::Prefix {
                host: None,
                prefix: "/img/".into()
            })
        );
        for bad in [
            r#"{}"#,
            r#"{"tag": "a", "host": "b"}"#,
            r#"{"tags": ["a"]}"#,
        ] {
            assert!(ban(bad).is_err(), "{bad}");
        }
        assert_eq!(sanitize("ci\nbot\u{7}é"), "cibot");
    }
}
