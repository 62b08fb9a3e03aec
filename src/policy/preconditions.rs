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
//! `If-Modified-Since` only to a stored 200, as in Pingora.

use http::header::{ETAG, IF_MATCH, IF_UNMODIFIED_SINCE, LAST_MODIFIED};
use http::HeaderValue;
use httpdate::HttpDate;
use pingora_core::protocols::http::conditional_filter::not_modified_filter;
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
    if !resp.status.is_success() {
        return Outcome::Proceed;
    }
    if req.headers.contains_key(IF_MATCH) {
        let current = resp.headers.get(ETAG);
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
    if not_modified_filter(req, resp) {
        Outcome::NotModified
    } else {
        Outcome::Proceed
    }
}

/// Turns the 304 that Pingora made of a response whose preconditions [`Outcome::Failed`] into
/// the 412 it must be: no body, no representation fields.
pub fn to_precondition_failed(resp: &mut ResponseHeader) {
    let _ = resp.set_status(http::StatusCode::PRECONDITION_FAILED);
    let _ = resp.insert_header(http::header::CONTENT_LENGTH, "0");
}

fn date(value: Option<&HeaderValue>) -> Option<SystemTime> {
    let parsed: HttpDate = value?.to_str().ok()?.trim().parse().ok()?;
    Some(parsed.into())
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
    fn non_success_responses_ignore_preconditions() {
        let mut not_found = response(&[("etag", "\"v1\"")]);
        not_found.set_status(404).unwrap();
        assert_eq!(
            evaluate(&request(&[("if-match", "\"v2\"")]), &not_found),
            Outcome::Proceed
        );
    }
}
