//! The tests' HTTP clients: async `reqwest` helpers that never decompress or follow redirects
//! and read each response whole ([`Resp`], [`get`], [`send`]), so a test sees exactly what the
//! proxy sent, with accessors for the fields the cache tests check (`Cache-Status`, `Age`).
//!
//! [`raw`] speaks HTTP/1.x over a bare socket, for malformed requests, keep-alive and framing.
//! [`stalling`] is a raw HTTP/1 client that can stop reading or read at a pace, for what the
//! proxy does while a client holds its answer unread.

mod raw;
pub mod stalling;

pub use raw::*;
pub use stalling::{StallingAnswer, StallingClient};

use bytes::Bytes;
use reqwest::header::HeaderMap;
use std::time::Duration;

/// Per-request timeout of the clients built here.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A fully read response.
#[derive(Clone, Debug)]
pub struct Resp {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// The whole body, exactly as received (never decompressed).
    pub body: Bytes,
    /// HTTP version the response came over.
    pub version: reqwest::Version,
}

impl Resp {
    /// What a client sees of this answer, for comparing two nodes' answers: the status, the
    /// fields (names as `HeaderMap` gives them, lowercase) other than `skip`, sorted, and the
    /// body.
    pub fn seen_except(&self, skip: &[&str]) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let mut fields: Vec<(String, String)> = self
            .headers
            .iter()
            .filter(|(name, _)| !skip.contains(&name.as_str()))
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap_or("?").to_string()))
            .collect();
        fields.sort();
        (self.status, fields, self.body.to_vec())
    }

    /// First value of header `name` (case-insensitive), lossily as UTF-8.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }

    /// All values of header `name`, in order.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }

    /// Whether header `name` is present.
    pub fn has_header(&self, name: &str) -> bool {
        self.headers.contains_key(name)
    }

    /// The `Age` header as a number.
    pub fn age(&self) -> Option<u64> {
        self.header("age").and_then(|v| v.trim().parse().ok())
    }

    /// The `Content-Length` header as a number.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")
            .and_then(|v| v.trim().parse().ok())
    }

    /// The raw `Cache-Status` header (RFC 9211), all values joined with `", "`;
    /// falls back to `X-Cache` if there is no `Cache-Status`.
    pub fn cache_status(&self) -> Option<String> {
        let all = self.header_all("cache-status");
        if !all.is_empty() {
            return Some(all.join(", "));
        }
        self.header("x-cache")
    }

    /// A parameter of the last (closest to the client) `Cache-Status` entry:
    /// `Some("")` for a bare flag like `hit` or `stored`, `Some(value)` for `key=value`
    /// (quotes removed), `None` if absent. E.g. `cache_status_param("fwd")` → `"miss"`.
    pub fn cache_status_param(&self, name: &str) -> Option<String> {
        cache_status_param(&self.cache_status()?, name)
    }

    /// Whether the last `Cache-Status` entry says `stored`: this response was written to the
    /// cache. A test that relies on an entry being there checks this rather than assuming it.
    pub fn is_stored(&self) -> bool {
        self.cache_status_param("stored").is_some()
    }

    /// The `ttl` parameter of the last `Cache-Status` entry: the seconds of freshness left.
    pub fn cache_ttl(&self) -> Option<i64> {
        self.cache_status_param("ttl")?.parse().ok()
    }

    /// Whether the last `Cache-Status` entry says `hit` (or `X-Cache` starts with `HIT`).
    pub fn is_hit(&self) -> bool {
        if self.headers.contains_key("cache-status") {
            return self.cache_status_param("hit").is_some();
        }
        self.header("x-cache")
            .map(|v| v.trim().to_ascii_uppercase().starts_with("HIT"))
            .unwrap_or(false)
    }

    /// The `fwd` parameter of the last `Cache-Status` entry (`miss`, `stale`, `uri-miss`, ...).
    pub fn cache_fwd(&self) -> Option<String> {
        self.cache_status_param("fwd")
    }

    /// The body as (lossy) UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client builder with the test defaults: no redirects followed, no proxy from the
/// environment, no automatic decompression (no such features are compiled in), and a
/// 30 s timeout. HTTP/1.1 for `http://` URLs.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(CLIENT_TIMEOUT)
}

/// A fresh HTTP/1.1 client from [`client_builder`]. Reuse one client across requests
/// to reuse connections; create it inside the runtime that will use it.
pub fn http_client() -> reqwest::Client {
    client_builder().build().expect("build reqwest client")
}

/// A fresh client that speaks HTTP/2 with prior knowledge (h2c) to `http://` URLs.
pub fn h2c_client() -> reqwest::Client {
    client_builder()
        .http2_prior_knowledge()
        .build()
        .expect("build h2c reqwest client")
}

/// Sends one request with `client` and reads the whole response.
/// `headers` are added in order (repeated names give repeated fields).
pub async fn send(
    client: &reqwest::Client,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> Result<Resp, reqwest::Error> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("valid method");
    let mut rb = client.request(method, url);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    if let Some(b) = body {
        rb = rb.body(b);
    }
    let r = rb.send().await?;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let version = r.version();
    let body = r.bytes().await?;
    Ok(Resp {
        status,
        headers,
        body,
        version,
    })
}

/// `GET url` with the given extra headers on a fresh client; panics on transport errors.
pub async fn get(url: &str, headers: &[(&str, &str)]) -> Resp {
    request("GET", url, headers, None).await
}

/// A [`get`] of each of `urls` with `headers`, all sent at once (each on a task of its own);
/// their answers, in the order of `urls`.
pub async fn gets_at_once(
    urls: impl IntoIterator<Item = String>,
    headers: &[(&'static str, &'static str)],
) -> Vec<Resp> {
    let requests: Vec<_> = urls
        .into_iter()
        .map(|url| {
            let headers = headers.to_vec();
            tokio::spawn(async move { get(&url, &headers).await })
        })
        .collect();
    let mut answers = Vec::with_capacity(requests.len());
    for request in requests {
        answers.push(request.await.unwrap());
    }
    answers
}

/// Like [`get`] but returns transport errors (connection refused/reset, timeout, ...).
pub async fn try_get(url: &str, headers: &[(&str, &str)]) -> Result<Resp, reqwest::Error> {
    send(&http_client(), "GET", url, headers, None).await
}

/// `HEAD url` on a fresh client; panics on transport errors.
pub async fn head(url: &str, headers: &[(&str, &str)]) -> Resp {
    request("HEAD", url, headers, None).await
}

/// `POST url` with `body` on a fresh client; panics on transport errors.
pub async fn post(url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Resp {
    request("POST", url, headers, Some(body.into())).await
}

/// Any method on a fresh client; panics on transport errors.
pub async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> Resp {
    match send(&http_client(), method, url, headers, body).await {
        Ok(r) => r,
        Err(e) => panic!("{method} {url} failed: {e:?}"),
    }
}

/// A parameter of the last (closest to the client) entry of the `Cache-Status` value `cs`:
/// `Some("")` for a bare flag like `hit` or `stored`, `Some(value)` for `key=value` (quotes
/// removed), `None` if absent. For [`Resp::cache_status_param`] and the HTTP/2 answers' twin.
pub fn cache_status_param(cs: &str, name: &str) -> Option<String> {
    let last = cs.rsplit(',').next()?.trim();
    last.split(';').skip(1).find_map(|p| {
        let p = p.trim();
        let (k, v) = match p.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim().trim_matches('"')),
            None => (p, ""),
        };
        k.eq_ignore_ascii_case(name).then(|| v.to_string())
    })
}
