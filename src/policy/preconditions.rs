//! Preconditions answered from a stored response (RFC 9110 §13.2, RFC 9111 §4.3.2).
//!
//! When a cache serves a request from a stored response, it evaluates the client's
//! preconditions against that response itself. Pingora's own check covers `If-None-Match` and
//! `If-Modified-Since` (304); `If-Match` and `If-Unmodified-Since` (412) are left as a TODO there,
//! so this module evaluates all four, in the order RFC 9110 §13.2.2 prescribes:
//!
//! 1. `If-Match` (strong comparison) false: 412;
//! 2. otherwise `If-Unmodified-Since` false: 412;
//! 3. `If-None-Match` (weak comparison) false: 304 for GET and HEAD;
//! 4. otherwise `If-Modified-Since` false: 304 for GET and HEAD.
//!
//! Preconditions apply only when the response would otherwise be a 2xx; `If-None-Match` and
//! `If-Modified-Since` only to a stored 200, as in Pingora. Dates are read with
//! [`super::http_date`] (all three formats, names in any case). A stored response without
//! `Last-Modified` is judged by its `Date` for `If-Modified-Since` (RFC 9111 §4.3.2; every stored
//! response has one, see `proxy::headers::add_date_if_missing`), which Pingora's check skips.

use http::header::{
    DATE, ETAG, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_UNMODIFIED_SINCE, LAST_MODIFIED,
};
use http::{HeaderName, HeaderValue, Method, StatusCode};
use pingora_core::protocols::http::conditional_filter::weak_validate_etag;
use pingora_http::{RequestHeader, ResponseHeader};
use std::time::SystemTime;

/// What the preconditions of a request make of a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Serve the response as it is.
    Proceed,
    /// Answer `304 Not Modified`.
    NotModified,
    /// Answer `412 Precondition Failed`.
    Failed,
}

/// Evaluates `req`'s preconditions against the stored `resp`.
pub fn evaluate(req: &RequestHeader, resp: &ResponseHeader) -> Outcome {
    evaluate_for(req, resp, false)
}

/// [`evaluate`], for a client that gets `resp` decoded when `decoded` (it does not take the
/// stored coding: `compression::needs_decoding`). Its representation is tagged weak (the decoded
/// bytes are not the stored ones), so an `If-Match` of the stored tag, a strong comparison,
/// matches nothing but `*` (RFC 9110 §13.1.1, §8.8.3.2); `If-None-Match` compares weakly, and
/// is the same either way.
pub fn evaluate_for(req: &RequestHeader, resp: &ResponseHeader, decoded: bool) -> Outcome {
    if !resp.status.is_success() {
        return Outcome::Proceed;
    }
    if req.headers.contains_key(IF_MATCH) {
        // (no current tag a strong comparison can match; `*` still matches)
        let current = resp.headers.get(ETAG).filter(|_| !decoded);
        let matched = req
            .headers
            .get_all(IF_MATCH)
            .iter()
            .any(|list| strong_match(list, current));
        if !matched {
            return Outcome::Failed;
        }
    } else if let Some(since) = date(req.headers.get(IF_UNMODIFIED_SINCE)) {
        if date(resp.headers.get(LAST_MODIFIED)).is_some_and(|modified| modified > since) {
            return Outcome::Failed;
        }
    }
    if not_modified(req, resp) {
        Outcome::NotModified
    } else {
        Outcome::Proceed
    }
}

/// Whether `If-None-Match` (weak comparison) or, without it, `If-Modified-Since` makes a stored
/// 200 a 304 (RFC 9110 §13.1.2, §13.1.3, §13.2.2 steps 3 and 4).
fn not_modified(req: &RequestHeader, resp: &ResponseHeader) -> bool {
    if resp.status != StatusCode::OK {
        return false;
    }
    if req.headers.contains_key(IF_NONE_MATCH) {
        let Some(current) = resp.headers.get(ETAG) else {
            return false;
        };
        return req
            .headers
            .get_all(IF_NONE_MATCH)
            .iter()
            .any(|list| weak_validate_etag(list.as_bytes(), current.as_bytes()));
    }
    if req.method != Method::GET && req.method != Method::HEAD {
        return false;
    }
    // a condition that is not one valid HTTP-date is ignored (RFC 9110 §13.1.3)
    let Some(since) = single_date(&req.headers, IF_MODIFIED_SINCE) else {
        return false;
    };
    // the stored Last-Modified, else the stored Date (RFC 9111 §4.3.2)
    let modified = match resp.headers.contains_key(LAST_MODIFIED) {
        true => single_date(&resp.headers, LAST_MODIFIED),
        false => single_date(&resp.headers, DATE),
    };
    modified.is_some_and(|modified| modified <= since)
}

/// The date of a field that occurs once and holds an HTTP-date.
fn single_date(headers: &http::HeaderMap, name: HeaderName) -> Option<SystemTime> {
    let mut lines = headers.get_all(name).iter();
    let first = lines.next()?;
    match lines.next() {
        Some(_) => None,
        None => date(Some(first)),
    }
}

/// Turns the 304 that Pingora made of a response whose preconditions [`Outcome::Failed`] into
/// the 412 it must be: no body, no representation fields.
pub fn to_precondition_failed(resp: &mut ResponseHeader) {
    let _ = resp.set_status(http::StatusCode::PRECONDITION_FAILED);
    let _ = resp.insert_header(http::header::CONTENT_LENGTH, "0");
}

fn date(value: Option<&HeaderValue>) -> Option<SystemTime> {
    super::http_date::parse_value(value?)
}

/// Whether the `If-Match` list matches the current entity tag with the strong comparison
/// (RFC 9110 §8.8.3.2): `*` matches any current representation; weak tags never match.
fn strong_match(list: &HeaderValue, current: Option<&HeaderValue>) -> bool {
    let Ok(list) = list.to_str() else {
        return false;
    };
    if list.trim() == "*" {
        return true;
    }
    let Some(current) = current.and_then(|c| c.to_str().ok()).map(str::trim) else {
        return false;
    };
    if current.starts_with("W/") {
        return false;
    }
    entity_tags(list).any(|tag| tag == current)
}

/// The entity tags of a list such as `"a", W/"b"`, commas inside quotes respected.
fn entity_tags(list: &str) -> impl Iterator<Item = &str> {
    let mut rest = list;
    std::iter::from_fn(move || loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return None;
        }
        let opaque_start = if rest.starts_with("W/") { 2 } else { 0 };
        let end = if rest[opaque_start..].starts_with('"') {
            rest[opaque_start + 1..]
                .find('"')
                .map(|i| opaque_start + i + 2)
                .unwrap_or(rest.len())
        } else {
            rest.find(',').unwrap_or(rest.len())
        };
        let (tag, tail) = rest.split_at(end);
        rest = tail;
        let tag = tag.trim();
        if !tag.is_empty() {
            return Some(tag);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_headers::{request, response};

    const LM: &str = "Sat, 01 Jan 2022 00:00:00 GMT";
    const BEFORE: &str = "Fri, 31 Dec 2021 00:00:00 GMT";
    const AFTER: &str = "Sun, 02 Jan 2022 00:00:00 GMT";

    #[test]
    fn if_match_of_the_stored_tag_fails_for_a_client_that_gets_it_decoded() {
        let stored = response(&[("etag", "\"v1\""), ("content-encoding", "gzip")]);
        let if_match = |tag: &str, decoded: bool| {
            evaluate_for(&request(&[("if-match", tag)]), &stored, decoded)
        };
        assert_eq!(if_match("\"v1\"", false), Outcome::Proceed);
        assert_eq!(if_match("\"v1\"", true), Outcome::Failed);
        assert_eq!(if_match("*", true), Outcome::Proceed);
        let inm = request(&[("if-none-match", "\"v1\"")]);
        assert_eq!(evaluate_for(&inm, &stored, true), Outcome::NotModified);
    }

    fn outcome(req: &[(&str, &str)]) -> Outcome {
        evaluate(
            &request(req),
            &response(&[("etag", "\"v1\""), ("last-modified", LM)]),
        )
    }

    #[test]
    fn if_match_uses_the_strong_comparison() {
        assert_eq!(outcome(&[("if-match", "\"v1\"")]), Outcome::Proceed);
        assert_eq!(
            outcome(&[("if-match", "\"a,b\", \"v1\"")]),
            Outcome::Proceed
        );
        assert_eq!(outcome(&[("if-match", "*")]), Outcome::Proceed);
        assert_eq!(outcome(&[("if-match", "W/\"v1\"")]), Outcome::Failed);
        assert_eq!(outcome(&[("if-match", "\"v2\"")]), Outcome::Failed);
        let weak = response(&[("etag", "W/\"v1\"")]);
        assert_eq!(
            evaluate(&request(&[("if-match", "W/\"v1\"")]), &weak),
            Outcome::Failed
        );
    }

    #[test]
    fn if_unmodified_since_only_without_if_match() {
        assert_eq!(outcome(&[("if-unmodified-since", AFTER)]), Outcome::Proceed);
        assert_eq!(outcome(&[("if-unmodified-since", LM)]), Outcome::Proceed);
        assert_eq!(outcome(&[("if-unmodified-since", BEFORE)]), Outcome::Failed);
        assert_eq!(
            outcome(&[("if-match", "\"v1\""), ("if-unmodified-since", BEFORE)]),
            Outcome::Proceed
        );
        assert_eq!(
            outcome(&[("if-unmodified-since", "garbage")]),
            Outcome::Proceed
        );
    }

    #[test]
    fn failure_beats_not_modified() {
        assert_eq!(
            outcome(&[("if-none-match", "\"v1\"")]),
            Outcome::NotModified
        );
        assert_eq!(
            outcome(&[("if-match", "\"v2\""), ("if-none-match", "\"v1\"")]),
            Outcome::Failed
        );
    }

    #[test]
    fn if_modified_since_uses_last_modified_else_the_stored_date() {
        assert_eq!(outcome(&[("if-modified-since", LM)]), Outcome::NotModified);
        assert_eq!(
            outcome(&[("if-modified-since", "saturday, 01-jan-22 00:00:00 gmt")]),
            Outcome::NotModified
        );
        assert_eq!(outcome(&[("if-modified-since", BEFORE)]), Outcome::Proceed);
        let dated = response(&[("date", LM)]);
        let ims = |since: &str| evaluate(&request(&[("if-modified-since", since)]), &dated);
        assert_eq!(ims(AFTER), Outcome::NotModified);
        assert_eq!(ims(LM), Outcome::NotModified);
        assert_eq!(ims(BEFORE), Outcome::Proceed);
        assert_eq!(ims("garbage"), Outcome::Proceed);
        // Last-Modified present but not a date: no modification date to compare with
        let broken = response(&[("date", LM), ("last-modified", "yesterday")]);
        assert_eq!(
            evaluate(&request(&[("if-modified-since", AFTER)]), &broken),
            Outcome::Proceed
        );
    }

    #[test]
    fn non_success_responses_ignore_preconditions() {
        let mut not_found = response(&[("etag", "\"v1\"")]);
        not_found.set_status(404).unwrap();
        assert_eq!(
            evaluate(&request(&[("if-match", "\"v2\"")]), &not_found),
            Outcome::Proceed
        );
    }
}
