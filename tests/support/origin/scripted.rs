//! The scripted origin: one origin whose every answer is written in the query string of the
//! request, so each test states what the origin does right in the URL it requests.

use super::{query_param, query_params, Body, OriginResponse, TestOrigin};
use crate::coding::{encode, lists_coding};
use crate::generated::generated_bytes;
use crate::http_date::http_date_offset;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Percent-encodes a query value for the scripted origin (`q("max-age=60, public")`).
pub fn q(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 2);
    for c in value.chars() {
        match c {
            ' ' | '"' | ',' | '=' | '%' | '&' | '#' | '+' | '/' | '*' | ';' => {
                out.push_str(&format!("%{:02X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// An origin whose responses are scripted by the request's query string, so each test states
/// what the origin does right in the URL it requests:
/// * `cc=` Cache-Control; `expires=` seconds from now, or a literal (`invalid`);
/// * `lm=` Last-Modified as seconds from now (negative = past); `age=` Age; `etag=` ETag;
/// * `vary=` Vary; `status=` status code (`unsafe_status=` for methods other than GET/HEAD); `cookie=1` adds Set-Cookie; `hdr=name:value` any header;
/// * `sleep=` milliseconds before answering; `len=` a generated body of that many bytes;
/// * `hdr=` may repeat; `date=` Date as seconds from now (or a literal);
/// * `r304=1`: a request carrying `If-None-Match` or `If-Modified-Since` is answered `304` with
///   the scripted fields (no body), plus each `hdr304=name:value`, and `cc304=` instead of `cc=`;
/// * `fail_after=N`: every request after the N-th for this exact target is answered with
///   `fail_status` (default 503) and no scripted fields, as a failing origin would;
/// * `sleep_after=N:ms`: requests after the N-th for this target wait `ms` before answering.
/// * `close_after=N`: requests after the N-th for this target get no answer: the origin closes
///   the connection once it has read them.
/// * `repeat=` repeats the default body that many times (compressible text);
/// * `ct=` Content-Type; `gzip=1` gzip-codes the body (with `Vary: Accept-Encoding`) when the
///   request accepts gzip, `gzip=always` whatever it accepts; `br=1` labels the body
///   `Content-Encoding: br` unless the request asks for `identity` only (an origin that ignores
///   `Accept-Encoding: gzip`).
/// * `coding=br` (or `zstd`, `gzip`) codes the body in that coding (with `Vary: Accept-Encoding`)
///   when the request lists it, `coding_always=` whatever it accepts; `ce=token` labels the body
///   `Content-Encoding: token` as it is, whatever the request accepts (a coding the origin
///   chose, which the proxy need not know).
///
/// The default body is `"<path> #<n>"`, n counting requests to the origin, so a refetch is visible.
pub fn scripted_origin() -> TestOrigin {
    let counter = AtomicUsize::new(0);
    let per_target = Mutex::new(HashMap::<String, usize>::new());
    TestOrigin::start(move |req| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        let nth_for_target = {
            let mut seen = per_target.lock().unwrap();
            let count = seen.entry(req.path.clone()).or_insert(0);
            *count += 1;
            *count
        };
        if let Some(limit) = query_param(req, "fail_after").and_then(|v| v.parse::<usize>().ok()) {
            if nth_for_target > limit {
                let status = query_param(req, "fail_status")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(503);
                return OriginResponse::ok(format!("failure #{n}"))
                    .status(status)
                    .header("x-origin-count", n.to_string());
            }
        }
        if query_param(req, "close_after")
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|limit| nth_for_target > limit)
        {
            return OriginResponse::close_without_answer();
        }
        let safe = req.method == "GET" || req.method == "HEAD";
        let status: u16 = query_param(req, if safe { "status" } else { "unsafe_status" })
            .or_else(|| query_param(req, "status"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(200);
        let mut resp = match query_param(req, "len").and_then(|l| l.parse::<usize>().ok()) {
            Some(len) => OriginResponse::generated(len, 7).status(status),
            None => {
                let repeat = query_param(req, "repeat").and_then(|r| r.parse::<usize>().ok());
                let body = format!("{} #{n}", req.path).repeat(repeat.unwrap_or(1));
                OriginResponse::ok(body).status(status)
            }
        };
        resp = resp.header("x-origin-count", n.to_string());
        if let Some(ct) = query_param(req, "ct") {
            resp = resp.header("Content-Type", ct);
        }
        let accepts_gzip = req
            .header("accept-encoding")
            .is_some_and(|ae| ae.to_ascii_lowercase().contains("gzip"));
        match query_param(req, "gzip").as_deref() {
            Some("always") => resp = gzip_coded(resp),
            Some(_) if accepts_gzip => resp = gzip_coded(resp).header("Vary", "Accept-Encoding"),
            Some(_) => resp = resp.header("Vary", "Accept-Encoding"),
            None => {}
        }
        if query_param(req, "br").is_some() && req.header("accept-encoding") != Some("identity") {
            resp = resp.header("Content-Encoding", "br");
        }
        let accept_encoding = req.header("accept-encoding").unwrap_or("");
        if let Some(coding) = query_param(req, "coding") {
            resp = match lists_coding(accept_encoding, &coding) {
                true => coded(resp, &coding),
                false => resp,
            }
            .header("Vary", "Accept-Encoding");
        }
        if let Some(coding) = query_param(req, "coding_always") {
            resp = coded(resp, &coding);
        }
        if let Some(token) = query_param(req, "ce") {
            resp = resp.header("Content-Encoding", token);
        }
        if let Some(e) = query_param(req, "expires") {
            let value = match e.parse::<i64>() {
                Ok(secs) => http_date_offset(secs),
                Err(_) => e,
            };
            resp = resp.header("Expires", value);
        }
        if let Some(lm) = query_param(req, "lm").and_then(|v| v.parse::<i64>().ok()) {
            resp = resp.header("Last-Modified", http_date_offset(lm));
        }
        if let Some(age) = query_param(req, "age") {
            resp = resp.header("Age", age);
        }
        if let Some(etag) = query_param(req, "etag") {
            resp = resp.header("ETag", etag);
        }
        if let Some(vary) = query_param(req, "vary") {
            resp = resp.header("Vary", vary);
        }
        if query_param(req, "cookie").is_some() {
            resp = resp.header("Set-Cookie", "session=secret");
        }
        for h in query_params(req, "hdr") {
            if let Some((k, v)) = h.split_once(':') {
                resp = resp.header(k.to_string(), v.to_string());
            }
        }
        if let Some(d) = query_param(req, "date") {
            let value = match d.parse::<i64>() {
                Ok(secs) => http_date_offset(secs),
                Err(_) => d,
            };
            resp = resp.header("Date", value);
        }
        if let Some(ms) = query_param(req, "sleep").and_then(|v| v.parse::<u64>().ok()) {
            resp = resp.delay(Duration::from_millis(ms));
        }
        if let Some((after, ms)) = query_param(req, "sleep_after").and_then(|v| {
            let (a, m) = v.split_once(':')?;
            Some((a.parse::<usize>().ok()?, m.parse::<u64>().ok()?))
        }) {
            if nth_for_target > after {
                resp = resp.delay(Duration::from_millis(ms));
            }
        }
        let conditional =
            req.header("if-none-match").is_some() || req.header("if-modified-since").is_some();
        let not_modified = conditional && query_param(req, "r304").is_some();
        let cc = match not_modified {
            true => query_param(req, "cc304").or_else(|| query_param(req, "cc")),
            false => query_param(req, "cc"),
        };
        if let Some(cc) = cc {
            resp = resp.header("Cache-Control", cc);
        }
        if not_modified {
            resp = resp.status(304).body(Vec::new());
            for h in query_params(req, "hdr304") {
                if let Some((k, v)) = h.split_once(':') {
                    resp = resp.header(k.to_string(), v.to_string());
                }
            }
        }
        resp
    })
}

/// Replaces a response's body by its gzip coding and labels it `Content-Encoding: gzip`.
fn gzip_coded(resp: OriginResponse) -> OriginResponse {
    coded(resp, "gzip")
}

/// Replaces a response's body by its coding in `coding` and labels it so.
fn coded(resp: OriginResponse, coding: &str) -> OriginResponse {
    let plain = match &resp.body {
        Body::Bytes(b) => b.to_vec(),
        Body::Generated { len, seed } => generated_bytes(*len, *seed),
        other => panic!("{coding} coding needs a fixed or generated body, not {other:?}"),
    };
    resp.body(encode(coding, &plain))
        .header("Content-Encoding", coding)
}

/// Nanoseconds since the epoch, for building paths no earlier run has used.
pub fn unique() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}
