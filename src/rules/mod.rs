//! Request rules (`[[rules]]`): what to cache, decided per request from the configuration, the
//! way Varnish users write VCL and nginx users `proxy_cache_bypass` and `map`.
//!
//! The rules are checked by `crate::config::rules` and compiled here once, at load
//! ([`RequestRules::new`]: the regexes into sets, see [`matching`]). The proxy calls them from its
//! phases, in the style of `compression`'s `on_*` functions:
//!
//! | Pingora phase              | here                                   |
//! |----------------------------|----------------------------------------|
//! | `request_filter`, before the fast path | [`RequestRules::on_request`]: match every rule in order and apply what the matching ones do to the request (cookies, query, headers) and to the [`Verdict`] |
//! | `request_cache_filter`     | [`Verdict::pass`]: no lookup, no store |
//! | `upstream_peer`            | the backend group (in `RequestUpstream`) |
//! | `upstream_response_filter` | [`on_upstream_response`]: `strip_set_cookie` |
//! | `response_cache_filter`    | [`Verdict::store_overrides`]: TTL, grace, no `Set-Cookie` |
//! | `response_filter` and fast-path answers | [`RequestRules::on_downstream_head`]: response headers |
//!
//! Rules apply in order and every matching rule applies: a later rule's TTL, grace or backend
//! group replaces an earlier one's, the rest add up. A rule's conditions see the request as the
//! earlier rules left it (a cookie one rule strips is gone for the next), except the path and
//! host regexes, which see the request as sent. `cache_anonymous_only` is decided after all
//! rules: a GET or HEAD carrying one of the named cookies bypasses the cache; one that does not
//! loses its `Cookie` field and may not store a response that sets a cookie. Other methods are
//! left alone (a login form's POST needs its CSRF cookie, and is never cached anyway).
//!
//! With no rules, [`RequestRules::on_request`] is one test of an empty list.

pub mod fields;
pub mod matching;
pub mod query;

use crate::config::rules::Rule;
use crate::policy::StoreOverrides;
use matching::{RegexSets, RegexSlots, Subject};
use pingora_http::{RequestHeader, ResponseHeader};
use std::sync::Arc;
use std::time::Duration;

/// The compiled rules.
#[derive(Debug)]
pub struct RequestRules {
    rules: Vec<Rule>,
    slots: Vec<RegexSlots>,
    sets: RegexSets,
}

/// What the rules decided for one request, kept in the request context.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Never cache: no lookup, no store (a `pass` rule, or a session cookie under
    /// `cache_anonymous_only`).
    pub pass: bool,
    /// The request's cookies were dropped for an anonymous-only rule: a response that sets a
    /// cookie must not be stored.
    refuse_set_cookie: bool,
    /// Drop the response's `Set-Cookie`.
    strip_set_cookie: bool,
    ttl: Option<Duration>,
    grace: Option<Duration>,
    /// The backend group chosen by the last matching rule that chooses one.
    pub backend_group: Option<Arc<str>>,
    /// The matching rules that edit response headers, in order.
    response_edits: Vec<u32>,
}

impl Verdict {
    /// Whether a matching rule edits the response head to the client (so a head serialised
    /// ahead of time cannot be sent as it is).
    pub fn edits_response_head(&self) -> bool {
        !self.response_edits.is_empty()
    }

    /// How the rules change the storing of this request's response.
    pub fn store_overrides(&self) -> StoreOverrides {
        StoreOverrides {
            ttl: self.ttl,
            grace: self.grace,
            refuse_set_cookie: self.refuse_set_cookie,
        }
    }
}

impl RequestRules {
    /// Compiles the checked rules (`Config::rules`).
    pub fn new(rules: &[Rule]) -> Self {
        let conditions: Vec<_> = rules.iter().map(|rule| &rule.when).collect();
        let (sets, slots) = RegexSets::new(&conditions);
        RequestRules {
            rules: rules.to_vec(),
            slots,
            sets,
        }
    }

    /// `request_filter`, before the fast path: every rule in order; the request is changed in
    /// place (cookies, query, headers) and the rest of the decision returned.
    pub fn on_request(&self, req: &mut RequestHeader) -> Verdict {
        let mut verdict = Verdict::default();
        if self.rules.is_empty() {
            return verdict;
        }
        let mut subject = Subject::new(&self.sets);
        // cache_anonymous_only: a named cookie seen / a rule asking for anonymous caching
        let (mut session, mut anonymous_only) = (false, false);
        for (i, (rule, slots)) in self.rules.iter().zip(&self.slots).enumerate() {
            if !subject.matches(req, &rule.when, *slots) {
                continue;
            }
            let then = &rule.then;
            verdict.pass |= then.pass;
            if !then.cache_anonymous_only.is_empty() {
                anonymous_only = true;
                session |= fields::cookies(req)
                    .any(|(name, _)| then.cache_anonymous_only.iter().any(|n| n == name));
            }
            if then.strip_cookies {
                req.remove_header(&http::header::COOKIE);
            }
            verdict.strip_set_cookie |= then.strip_set_cookie;
            if !then.drop_query.is_empty() || then.sort_query {
                query::rewrite(req, &then.drop_query, then.sort_query);
            }
            verdict.ttl = then.ttl.or(verdict.ttl);
            verdict.grace = then.grace.or(verdict.grace);
            for name in &then.remove_request_headers {
                req.remove_header(name);
            }
            for (name, value) in &then.set_request_headers {
                let _ = req.insert_header(name.clone(), value.clone());
            }
            if !then.set_response_headers.is_empty() || !then.remove_response_headers.is_empty() {
                verdict.response_edits.push(i as u32);
            }
            if then.backend_group.is_some() {
                verdict.backend_group.clone_from(&then.backend_group);
            }
        }
        let cacheable_method = req.method == http::Method::GET || req.method == http::Method::HEAD;
        if anonymous_only && cacheable_method {
            if session {
                verdict.pass = true;
            } else {
                req.remove_header(&http::header::COOKIE);
                verdict.refuse_set_cookie = true;
            }
        }
        verdict
    }

    /// `response_filter` and fast-path answers: the response header edits of the matching
    /// rules, in order.
    pub fn on_downstream_head(&self, verdict: &Verdict, head: &mut ResponseHeader) {
        for &i in &verdict.response_edits {
            let then = &self.rules[i as usize].then;
            for name in &then.remove_response_headers {
                head.remove_header(name);
            }
            for (name, value) in &then.set_response_headers {
                let _ = head.insert_header(name.clone(), value.clone());
            }
        }
    }

    /// The checked rules, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }
}

/// `upstream_response_filter`: `strip_set_cookie` drops the origin's `Set-Cookie` before the
/// response is judged for storing and sent.
pub fn on_upstream_response(verdict: &Verdict, resp: &mut ResponseHeader) {
    if verdict.strip_set_cookie {
        resp.remove_header(&http::header::SET_COOKIE);
    }
}
