//! Whether a rule's conditions hold for a request: host, path prefix or regex, method, and a
//! cookie, header or query parameter present or with a value.
//!
//! Every regex of every rule is compiled at load into one set per kind (paths, hosts), so a
//! request is run through each set once, however many rules use regexes, and only when a rule
//! whose cheaper conditions hold asks for the answer. The cheap conditions are tested first.

use super::fields::{cookies, query_pairs};
use crate::config::rules::{Conditions, FieldMatch};
use crate::proxy::cache_key::request_host;
use pingora_http::RequestHeader;
use regex::RegexSet;

/// The path and host regexes of all rules, each compiled into one set.
#[derive(Debug)]
pub struct RegexSets {
    paths: Option<RegexSet>,
    hosts: Option<RegexSet>,
}

impl RegexSets {
    /// The sets of `conditions`' regexes (already compiled one by one when the config was
    /// checked, so building the sets cannot fail); for each rule, its index in each set.
    pub fn new(conditions: &[&Conditions]) -> (RegexSets, Vec<RegexSlots>) {
        let mut paths = Vec::new();
        let mut hosts = Vec::new();
        let mut slots = Vec::with_capacity(conditions.len());
        for when in conditions {
            let mut slot = RegexSlots::default();
            if let Some(regex) = &when.path_regex {
                slot.path = Some(paths.len());
                paths.push(regex.as_str());
            }
            if let Some(regex) = &when.host_regex {
                slot.host = Some(hosts.len());
                hosts.push(regex.as_str());
            }
            slots.push(slot);
        }
        let set = |patterns: Vec<&str>| {
            (!patterns.is_empty())
                .then(|| RegexSet::new(patterns).expect("each regex was compiled at load"))
        };
        (
            RegexSets {
                paths: set(paths),
                hosts: set(hosts),
            },
            slots,
        )
    }
}

/// Where a rule's regexes sit in the [`RegexSets`].
#[derive(Debug, Default, Clone, Copy)]
pub struct RegexSlots {
    path: Option<usize>,
    host: Option<usize>,
}

/// The request seen by the rules: its host without port, and each regex set's matches,
/// computed on first need and then kept for the following rules.
pub struct Subject<'a> {
    sets: &'a RegexSets,
    host: Option<String>,
    path_matches: Option<regex::SetMatches>,
    host_matches: Option<regex::SetMatches>,
}

impl<'a> Subject<'a> {
    /// Nothing computed yet.
    pub fn new(sets: &'a RegexSets) -> Self {
        Subject {
            sets,
            host: None,
            path_matches: None,
            host_matches: None,
        }
    }

    fn host(&mut self, req: &RequestHeader) -> &str {
        self.host.get_or_insert_with(|| {
            let host = request_host(req);
            let without_port = match host.rsplit_once(':') {
                // an IPv6 literal keeps its colons inside brackets
                Some((name, port))
                    if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    name
                }
                _ => host,
            };
            // a fully qualified name's final dot names the same host (as nginx reads it): a
            // rule on `shop.example` is not escaped by asking for `shop.example.`
            let name = without_port.strip_suffix('.').unwrap_or(without_port);
            name.to_ascii_lowercase()
        })
    }

    fn path_matches(&mut self, req: &RequestHeader, slot: usize) -> bool {
        let sets = self.sets;
        self.path_matches
            .get_or_insert_with(|| sets.paths.as_ref().expect("a slot").matches(req.uri.path()))
            .matched(slot)
    }

    fn host_matches(&mut self, req: &RequestHeader, slot: usize) -> bool {
        let sets = self.sets;
        if self.host_matches.is_none() {
            let host = self.host(req).to_string();
            self.host_matches = Some(sets.hosts.as_ref().expect("a slot").matches(&host));
        }
        self.host_matches.as_ref().is_some_and(|m| m.matched(slot))
    }

    /// Whether every condition of `when` holds for `req`.
    pub fn matches(&mut self, req: &RequestHeader, when: &Conditions, slots: RegexSlots) -> bool {
        if !when.methods.is_empty() && !when.methods.contains(&req.method) {
            return false;
        }
        if let Some(prefix) = &when.path_prefix {
            if !req.uri.path().starts_with(prefix.as_str()) {
                return false;
            }
        }
        if let Some(host) = &when.host {
            if self.host(req) != host {
                return false;
            }
        }
        if let Some(slot) = slots.path {
            if !self.path_matches(req, slot) {
                return false;
            }
        }
        if let Some(slot) = slots.host {
            if !self.host_matches(req, slot) {
                return false;
            }
        }
        let cookie = |m: &FieldMatch| field_holds(cookies(req), m);
        let header = |m: &FieldMatch| {
            req.headers.get_all(m.name.as_str()).iter().any(|v| {
                m.value
                    .as_ref()
                    .is_none_or(|want| v.as_bytes() == want.as_bytes())
            })
        };
        let query = |m: &FieldMatch| field_holds(query_pairs(req.uri.query().unwrap_or("")), m);
        when.cookie.as_ref().is_none_or(cookie)
            && when.header.as_ref().is_none_or(header)
            && when.query.as_ref().is_none_or(query)
    }
}

fn field_holds<'r>(mut pairs: impl Iterator<Item = (&'r str, &'r str)>, m: &FieldMatch) -> bool {
    pairs.any(|(name, value)| name == m.name && m.value.as_ref().is_none_or(|want| value == want))
}
