//! `[[rules]]`: the request rules as written, and their checks. Each rule is a set of conditions
//! (all must hold) and the actions taken when they do; `crate::rules` compiles the checked list
//! and applies it to requests.
//!
//! `[[cache.ttl_overrides]]` (the per-prefix TTLs that came before rules) is read by
//! [`super::cache`] and folded in here: each override becomes a rule `path = PREFIX, ttl = TTL`,
//! placed before the `[[rules]]` and ordered from the shortest prefix to the longest, so the
//! longest matching prefix still decides, as it did.

use super::balancing::BackendConfig;
use super::cache::TtlOverride;
use super::{check, ConfigError};
use crate::proxy::request_head::authority;
use http::{HeaderName, HeaderValue, Method};
use regex::Regex;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// One `[[rules]]` entry as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleEntry {
    /// A name for errors, logs and the reader.
    pub name: Option<String>,
    /// Condition: the request's host (without port or final dot, any case), exactly.
    pub host: Option<String>,
    /// Condition: a regex the request's host (without port, lowercased) matches.
    pub host_regex: Option<String>,
    /// Condition: a prefix of the request's path.
    pub path: Option<String>,
    /// Condition: a regex the request's path matches (unanchored unless `^`/`$` say so).
    pub path_regex: Option<String>,
    /// Condition: one method or a list of them.
    pub method: Option<OneOrMany>,
    /// Condition: a cookie present (`"name"`) or with a value (`{ name, value }`).
    pub cookie: Option<FieldEntry>,
    /// Condition: a request header present or with a value.
    pub header: Option<FieldEntry>,
    /// Condition: a query parameter present or with a value.
    pub query: Option<FieldEntry>,

    /// Action: never cache (no lookup, no store).
    pub pass: Option<bool>,
    /// Action: for GET/HEAD, bypass the cache when any of these cookies is present; otherwise
    /// drop the request's cookies and store no response that sets one.
    pub cache_anonymous_only: Option<Vec<String>>,
    /// Action: drop the request's `Cookie` before lookup and fetch.
    pub strip_cookies: Option<bool>,
    /// Action: drop the response's `Set-Cookie` before it is stored and sent.
    pub strip_set_cookie: Option<bool>,
    /// Action: query parameters whose names start with one of these are left out of the key and
    /// the fetch.
    pub drop_query: Option<Vec<String>>,
    /// Action: sort the query parameters by name (key and fetch).
    pub sort_query: Option<bool>,
    /// Action: freshness for responses stored under this rule, whatever they say.
    pub ttl: Option<String>,
    /// Action: the stale-if-error grace for these responses (instead of
    /// `cache.stale_if_error_grace`).
    pub grace: Option<String>,
    /// Action: request headers set before lookup and fetch.
    pub set_request_headers: Option<BTreeMap<String, String>>,
    /// Action: request headers removed before lookup and fetch.
    pub remove_request_headers: Option<Vec<String>>,
    /// Action: response headers set on the way to the client.
    pub set_response_headers: Option<BTreeMap<String, String>>,
    /// Action: response headers removed on the way to the client.
    pub remove_response_headers: Option<Vec<String>>,
    /// Action: send the request to the `[[upstreams]]` of this `group`.
    pub backend_group: Option<String>,
}

/// A value that may be written as one string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A cookie, header or query condition as written: `"name"` (present) or
/// `{ name = "...", value = "..." }` (present with that value).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum FieldEntry {
    Present(String),
    Valued { name: String, value: String },
}

/// A checked cookie, header or query condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldMatch {
    /// The name (lowercased for headers, as sent for cookies and query parameters).
    pub name: String,
    /// The value it must have; any value when `None`.
    pub value: Option<String>,
}

/// What must hold for a rule to apply (every condition given; none means every request).
#[derive(Debug, Clone, Default)]
pub struct Conditions {
    pub host: Option<String>,
    pub host_regex: Option<Regex>,
    pub path_prefix: Option<String>,
    pub path_regex: Option<Regex>,
    /// Empty: any method.
    pub methods: Vec<Method>,
    pub cookie: Option<FieldMatch>,
    pub header: Option<FieldMatch>,
    pub query: Option<FieldMatch>,
}

/// What a rule does when its conditions hold.
#[derive(Debug, Clone, Default)]
pub struct Actions {
    pub pass: bool,
    /// Cookie names that make a GET/HEAD bypass the cache (empty: not an anonymous-only rule).
    pub cache_anonymous_only: Vec<String>,
    pub strip_cookies: bool,
    pub strip_set_cookie: bool,
    pub drop_query: Vec<String>,
    pub sort_query: bool,
    pub ttl: Option<Duration>,
    pub grace: Option<Duration>,
    pub set_request_headers: Vec<(HeaderName, HeaderValue)>,
    pub remove_request_headers: Vec<HeaderName>,
    pub set_response_headers: Vec<(HeaderName, HeaderValue)>,
    pub remove_response_headers: Vec<HeaderName>,
    /// A `group` of `[[upstreams]]` (checked to exist).
    pub backend_group: Option<Arc<str>>,
}

/// One checked rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// `rules[2] "admin"` (or `cache.ttl_overrides[0]`): how errors and docs refer to it.
    pub label: String,
    pub when: Conditions,
    pub then: Actions,
}

/// The stale-if-error grace is sent in delta-seconds, like `cache.stale_if_error_grace`.
const MAX_GRACE: Duration = Duration::from_secs(1 << 31);

/// Checks `[[rules]]`, after the folded `[[cache.ttl_overrides]]`; `groups` are the backend
/// groups `backend_group` may name.
pub fn validate(
    entries: &Option<Vec<RuleEntry>>,
    ttl_overrides: &[TtlOverride],
    groups: &[String],
) -> Result<Vec<Rule>, ConfigError> {
    let mut rules = from_ttl_overrides(ttl_overrides);
    for (i, entry) in entries.iter().flatten().enumerate() {
        rules.push(rule(i, entry, groups)?);
    }
    Ok(rules)
}

/// Checks that every rule's `backend_group` names a group of `backends`. A reload keeps the
/// running backends (changing `[[upstreams]]` needs a hand-over), so the rules of a reloaded
/// file, checked against the file's own backends, are checked again against the running ones:
/// a rule sending requests to a group that is not running would answer them 502.
pub fn check_groups_running(rules: &[Rule], backends: &[BackendConfig]) -> Result<(), ConfigError> {
    let groups = backend_groups(backends);
    for rule in rules {
        let Some(name) = &rule.then.backend_group else {
            continue;
        };
        if !groups.iter().any(|group| group.as_str() == &**name) {
            // the label starts with the rule's place: `rules[2] "media"`
            let place = rule.label.split(' ').next().unwrap_or("rules");
            return Err(ConfigError::new(
                format!("{place}.backend_group"),
                format!(
                    "no running backend has group = \"{name}\"; the file changes [[upstreams]], \
                     which needs a hand-over or restart (a reload keeps the running backends)"
                ),
            ));
        }
    }
    Ok(())
}

/// The backend groups named by `[[upstreams]]` `group`, in order of first appearance.
pub fn backend_groups(backends: &[BackendConfig]) -> Vec<String> {
    let mut groups: Vec<String> = Vec::new();
    for group in backends.iter().filter_map(|b| b.group.as_ref()) {
        if !groups.contains(group) {
            groups.push(group.clone());
        }
    }
    groups
}

/// `[[cache.ttl_overrides]]` as rules, shortest prefix first (the longest applies last, so it
/// wins, as before).
fn from_ttl_overrides(overrides: &[TtlOverride]) -> Vec<Rule> {
    let mut ordered: Vec<(usize, &TtlOverride)> = overrides.iter().enumerate().collect();
    ordered.sort_by_key(|(_, o)| o.prefix.len());
    ordered
        .into_iter()
        .map(|(i, o)| Rule {
            label: format!("cache.ttl_overrides[{i}]"),
            when: Conditions {
                path_prefix: Some(o.prefix.clone()),
                ..Conditions::default()
            },
            then: Actions {
                ttl: Some(o.ttl),
                ..Actions::default()
            },
        })
        .collect()
}

fn rule(i: usize, entry: &RuleEntry, groups: &[String]) -> Result<Rule, ConfigError> {
    let key = format!("rules[{i}]");
    // every error names the rule: its index, and its name when it has one
    let named = |reason: String| match &entry.name {
        Some(name) => format!("rule \"{name}\": {reason}"),
        None => reason,
    };
    let fail =
        |field: &str, reason: String| ConfigError::new(format!("{key}.{field}"), named(reason));
    let when = conditions(entry, &fail)?;
    let then = actions(entry, groups, &fail)?;
    if !then.does_something() {
        return Err(ConfigError::new(
            key,
            named("has no action (pass, cache_anonymous_only, ttl, ...)".into()),
        ));
    }
    let label = match &entry.name {
        Some(name) => format!("{key} \"{name}\""),
        None => key,
    };
    Ok(Rule { label, when, then })
}

impl Actions {
    fn does_something(&self) -> bool {
        self.pass
            || !self.cache_anonymous_only.is_empty()
            || self.strip_cookies
            || self.strip_set_cookie
            || !self.drop_query.is_empty()
            || self.sort_query
            || self.ttl.is_some()
            || self.grace.is_some()
            || !self.set_request_headers.is_empty()
            || !self.remove_request_headers.is_empty()
            || !self.set_response_headers.is_empty()
            || !self.remove_response_headers.is_empty()
            || self.backend_group.is_some()
    }
}

type Fail<'a> = dyn Fn(&str, String) -> ConfigError + 'a;

fn conditions(entry: &RuleEntry, fail: &Fail) -> Result<Conditions, ConfigError> {
    let regex = |field: &str, text: &Option<String>| {
        text.as_deref()
            .map(|text| Regex::new(text).map_err(|e| fail(field, format!("bad regex: {e}"))))
            .transpose()
    };
    if let Some(host) = &entry.host {
        // matched against the request's host without its port: a port here matches nothing
        let without_port = match host.starts_with('[') {
            true => host.ends_with(']'),
            false => !host.contains(':'),
        };
        if !authority::names_a_host(host.as_bytes()) || !without_port {
            return Err(fail(
                "host",
                format!("\"{host}\" is not a host name or IP address without a port"),
            ));
        }
        if host.ends_with('.') {
            // requests' hosts are matched without their final dot
            return Err(fail(
                "host",
                format!("\"{host}\": write the name without its final dot"),
            ));
        }
    }
    if let Some(path) = &entry.path {
        if !path.starts_with('/') {
            return Err(fail("path", format!("\"{path}\" must start with '/'")));
        }
    }
    let methods = match &entry.method {
        None => Vec::new(),
        Some(OneOrMany::One(one)) => vec![one.clone()],
        Some(OneOrMany::Many(many)) => many.clone(),
    };
    let methods = methods
        .iter()
        .map(|m| {
            check::http_token("method", m)
                .map_err(|_| fail("method", format!("\"{m}\" is not a method")))?;
            Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|_| fail("method", format!("\"{m}\" is not a method")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Conditions {
        host: entry.host.as_ref().map(|h| h.to_ascii_lowercase()),
        host_regex: regex("host_regex", &entry.host_regex)?,
        path_prefix: entry.path.clone(),
        path_regex: regex("path_regex", &entry.path_regex)?,
        methods,
        cookie: field_match(&entry.cookie, false, "cookie", fail)?,
        header: field_match(&entry.header, true, "header", fail)?,
        query: field_match(&entry.query, false, "query", fail)?,
    })
}

fn field_match(
    entry: &Option<FieldEntry>,
    is_header: bool,
    field: &str,
    fail: &Fail,
) -> Result<Option<FieldMatch>, ConfigError> {
    let Some(entry) = entry else {
        return Ok(None);
    };
    let (name, value) = match entry {
        FieldEntry::Present(name) => (name, None),
        FieldEntry::Valued { name, value } => (name, Some(value.clone())),
    };
    if name.is_empty() {
        return Err(fail(field, "needs a name".into()));
    }
    let name = if is_header {
        check::header_name(field, name).map_err(|e| fail(field, e.reason))?
    } else {
        name.clone()
    };
    Ok(Some(FieldMatch { name, value }))
}

fn actions(entry: &RuleEntry, groups: &[String], fail: &Fail) -> Result<Actions, ConfigError> {
    let names = |field: &str, list: &Option<Vec<String>>| -> Result<Vec<String>, ConfigError> {
        let list = list.clone().unwrap_or_default();
        if list.iter().any(|name| name.is_empty()) {
            return Err(fail(field, "an empty name matches nothing".into()));
        }
        Ok(list)
    };
    let ttl = entry
        .ttl
        .as_deref()
        .map(|ttl| check::duration_value("ttl", ttl).map_err(|e| fail("ttl", e.reason)))
        .transpose()?;
    let grace = entry
        .grace
        .is_some()
        .then(|| {
            check::whole_seconds(
                "grace",
                &entry.grace,
                Duration::ZERO,
                MAX_GRACE,
                "HTTP expresses it in delta-seconds",
            )
            .map_err(|e| fail("grace", e.reason))
        })
        .transpose()?;
    let backend_group = entry
        .backend_group
        .as_ref()
        .map(|name| match groups.iter().any(|g| g == name) {
            true => Ok(Arc::from(name.as_str())),
            false => Err(fail(
                "backend_group",
                format!("no [[upstreams]] entry has group = \"{name}\""),
            )),
        })
        .transpose()?;
    Ok(Actions {
        pass: entry.pass.unwrap_or(false),
        cache_anonymous_only: names("cache_anonymous_only", &entry.cache_anonymous_only)?,
        strip_cookies: entry.strip_cookies.unwrap_or(false),
        strip_set_cookie: entry.strip_set_cookie.unwrap_or(false),
        drop_query: names("drop_query", &entry.drop_query)?,
        sort_query: entry.sort_query.unwrap_or(false),
        ttl,
        grace,
        set_request_headers: request_header_pairs(&entry.set_request_headers, fail)?,
        remove_request_headers: removable_request_headers(&entry.remove_request_headers, fail)?,
        set_response_headers: header_pairs(
            "set_response_headers",
            &entry.set_response_headers,
            fail,
        )?,
        remove_response_headers: header_names(
            "remove_response_headers",
            &entry.remove_response_headers,
            fail,
        )?,
        backend_group,
    })
}

fn header_pairs(
    field: &str,
    map: &Option<BTreeMap<String, String>>,
    fail: &Fail,
) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
    map.iter()
        .flatten()
        .map(|(name, value)| {
            let name = header_name(field, name, fail)?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| fail(field, format!("\"{value}\" is not a valid header value")))?;
            Ok((name, value))
        })
        .collect()
}

/// `set_request_headers`: as [`header_pairs`], and a `Host` set is one a request could carry
/// (`host[:port]`, RFC 3986): the cache key is made of it, and a host holding `/` would push part
/// of the path into the key's host part, so that two hosts' pages share one entry.
fn request_header_pairs(
    map: &Option<BTreeMap<String, String>>,
    fail: &Fail,
) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
    let pairs = header_pairs("set_request_headers", map, fail)?;
    for (name, value) in &pairs {
        if name == http::header::HOST && !authority::names_a_host(value.as_bytes()) {
            return Err(fail(
                "set_request_headers",
                format!(
                    "host \"{}\" is not host or host:port",
                    value.to_str().unwrap_or("?")
                ),
            ));
        }
    }
    Ok(pairs)
}

/// `remove_request_headers`: as [`header_names`], but never `Host`: the cache key is made of it,
/// and without it every host's requests for a path would share one entry.
fn removable_request_headers(
    list: &Option<Vec<String>>,
    fail: &Fail,
) -> Result<Vec<HeaderName>, ConfigError> {
    let names = header_names("remove_request_headers", list, fail)?;
    if names.contains(&http::header::HOST) {
        return Err(fail(
            "remove_request_headers",
            "Host cannot be removed: the cache key is made of it (set it instead)".into(),
        ));
    }
    Ok(names)
}

fn header_names(
    field: &str,
    list: &Option<Vec<String>>,
    fail: &Fail,
) -> Result<Vec<HeaderName>, ConfigError> {
    list.iter()
        .flatten()
        .map(|name| header_name(field, name, fail))
        .collect()
}

fn header_name(field: &str, name: &str, fail: &Fail) -> Result<HeaderName, ConfigError> {
    let lower = check::header_name(field, name).map_err(|e| fail(field, e.reason))?;
    Ok(HeaderName::from_bytes(lower.as_bytes()).expect("checked to be a header name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<Rule>, ConfigError> {
        #[derive(Deserialize)]
        struct File {
            rules: Vec<RuleEntry>,
        }
        let file: File = toml::from_str(text).expect("valid TOML");
        validate(&Some(file.rules), &[], &["static".to_string()])
    }

    #[test]
    fn the_issues_example_is_a_valid_rule() {
        let rules = parse(
            "[[rules]]\npath = \"/\"\ncache_anonymous_only = [\"sessionid\", \"_session_id\"]\n\
             drop_query = [\"utm_\", \"fbclid\", \"gclid\"]",
        )
        .unwrap();
        assert_eq!(rules[0].when.path_prefix.as_deref(), Some("/"));
        assert_eq!(
            rules[0].then.cache_anonymous_only,
            ["sessionid", "_session_id"]
        );
        assert_eq!(rules[0].then.drop_query, ["utm_", "fbclid", "gclid"]);
    }

    #[test]
    fn a_bad_rule_is_refused_with_its_index_and_name() {
        let e = parse("[[rules]]\npass = true\n[[rules]]\nname = \"api\"\npath_regex = \"^/api/(\"\npass = true")
            .unwrap_err();
        assert_eq!(e.key, "rules[1].path_regex");
        assert!(e.reason.starts_with("rule \"api\": bad regex"), "{e}");

        let e = parse("[[rules]]\npath = \"/a\"").unwrap_err();
        assert_eq!(e.key, "rules[0]");
        assert!(e.reason.contains("no action"), "{e}");

        let e = parse("[[rules]]\nbackend_group = \"media\"").unwrap_err();
        assert_eq!(e.key, "rules[0].backend_group");

        let e = parse("[[rules]]\nname = \"h\"\nset_response_headers = { \"x y\" = \"1\" }")
            .unwrap_err();
        assert_eq!(e.key, "rules[0].set_response_headers");
        assert!(e.reason.starts_with("rule \"h\": "), "{e}");

        let e = parse("[[rules]]\npath = \"static\"\npass = true").unwrap_err();
        assert_eq!(e.key, "rules[0].path");

        let e = parse("[[rules]]\nmethod = \"G T\"\npass = true").unwrap_err();
        assert_eq!(e.key, "rules[0].method");

        let e = parse("[[rules]]\ngrace = \"1500ms\"").unwrap_err();
        assert_eq!(e.key, "rules[0].grace");
    }

    #[test]
    fn a_host_a_rule_sets_is_one_a_request_could_carry() {
        for good in ["b.example", "b.example:8080", "[::1]:80"] {
            let text = format!("[[rules]]\nset_request_headers = {{ host = \"{good}\" }}");
            assert_eq!(parse(&text).unwrap()[0].then.set_request_headers.len(), 1);
        }
        for bad in ["b.example/assets", "", "b example", "b.example:8o"] {
            let text = format!("[[rules]]\nset_request_headers = {{ Host = \"{bad}\" }}");
            let e = parse(&text).unwrap_err();
            assert_eq!(e.key, "rules[0].set_request_headers", "{bad:?}");
            assert!(e.reason.contains("is not host or host:port"), "{e}");
        }
    }

    #[test]
    fn a_rule_cannot_remove_the_host() {
        let e = parse("[[rules]]\nremove_request_headers = [\"X-A\", \"HOST\"]").unwrap_err();
        assert_eq!(e.key, "rules[0].remove_request_headers");
        assert!(e.reason.contains("Host cannot be removed"), "{e}");
        assert!(parse("[[rules]]\nremove_request_headers = [\"X-A\"]").is_ok());
    }

    #[test]
    fn a_rule_host_is_a_host_without_a_port() {
        for good in ["shop.example", "Shop.Example", "10.0.0.1", "[::1]"] {
            let rules = parse(&format!("[[rules]]\nhost = \"{good}\"\npass = true")).unwrap();
            assert_eq!(
                rules[0].when.host.as_deref(),
                Some(&*good.to_ascii_lowercase())
            );
        }
        for bad in [
            "",
            "shop.example:8080",
            "shop.example/x",
            "a b",
            "[::1]:80",
            "[::1",
        ] {
            let e = parse(&format!("[[rules]]\nhost = \"{bad}\"\npass = true")).unwrap_err();
            assert_eq!(e.key, "rules[0].host", "{bad:?}");
            assert!(e.reason.contains("without a port"), "{e}");
        }
        let e = parse("[[rules]]\nhost = \"shop.example.\"\npass = true").unwrap_err();
        assert!(e.reason.contains("without its final dot"), "{e}");
    }

    #[test]
    fn ttl_overrides_become_rules_with_the_longest_prefix_last() {
        let overrides = [
            TtlOverride {
                prefix: "/static/img/".into(),
                ttl: Duration::from_secs(60),
            },
            TtlOverride {
                prefix: "/static/".into(),
                ttl: Duration::from_secs(3600),
            },
        ];
        let rules = validate(&None, &overrides, &[]).unwrap();
        let prefixes: Vec<_> = rules
            .iter()
            .map(|r| r.when.path_prefix.clone().unwrap())
            .collect();
        assert_eq!(prefixes, ["/static/", "/static/img/"]);
        assert_eq!(rules[1].label, "cache.ttl_overrides[0]");
        assert_eq!(rules[1].then.ttl, Some(Duration::from_secs(60)));
    }
}
