//! Targeted cache-control fields (RFC 9213): directives meant for this cache only.
//!
//! An origin can say `Lacquer-Cache-Control: max-age=3600` (the name is configurable) or
//! `CDN-Cache-Control: ...` to give Lacquer a policy different from what browsers get in
//! `Cache-Control`. The first field of the target list that is present and parses replaces
//! `Cache-Control` *and* `Expires` for this cache; the targeted fields are removed from responses
//! to clients unless configured otherwise, since they were meant for us.

use pingora_cache::cache_control::CacheControl;
use pingora_http::ResponseHeader;

/// The target list, most specific first.
#[derive(Debug, Clone)]
pub struct TargetedFields {
    names: Vec<String>,
    /// The same names parsed once, for [`TargetedFields::strip`] on every response.
    header_names: Vec<http::header::HeaderName>,
}

impl TargetedFields {
    /// Our own field (lowercase) first, then `CDN-Cache-Control`.
    pub fn new(own_field: &str) -> Self {
        let mut names = vec![own_field.to_ascii_lowercase()];
        if names[0] != "cdn-cache-control" {
            names.push("cdn-cache-control".to_string());
        }
        // a name that is not a valid field name can never be present in a response
        let header_names = names
            .iter()
            .filter_map(|n| http::header::HeaderName::from_bytes(n.as_bytes()).ok())
            .collect();
        TargetedFields {
            names,
            header_names,
        }
    }

    /// The field names of the target list, most specific first.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The cache control that governs this cache for `resp`, and whether it came from a targeted
    /// field (in which case `Expires` must be ignored too).
    pub fn cache_control(&self, resp: &ResponseHeader) -> (Option<CacheControl>, bool) {
        for name in &self.names {
            if let Some(cc) = CacheControl::from_resp_headers_named(name, resp) {
                return (Some(cc), true);
            }
        }
        (CacheControl::from_resp_headers(resp), false)
    }

    /// The name of the field whose directives govern this cache for `resp`: the first targeted
    /// field present, else `cache-control`.
    pub fn governing_field<'a>(&'a self, resp: &ResponseHeader) -> &'a str {
        self.names
            .iter()
            .find(|name| resp.headers.contains_key(name.as_str()))
            .map(|name| name.as_str())
            .unwrap_or("cache-control")
    }

    /// Removes the targeted fields from a response going to a client.
    ///
    /// Runs on every response: the common case (no targeted field present) is one pass over the
    /// response's field names comparing lengths and bytes, without hashing the targeted names.
    pub fn strip(&self, resp: &mut ResponseHeader) {
        if !resp
            .headers
            .keys()
            .any(|name| self.header_names.contains(name))
        {
            return;
        }
        for name in &self.header_names {
            resp.remove_header(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::policy::test_headers::response as resp;

    #[test]
    fn most_specific_field_wins() {
        let fields = TargetedFields::new("Lacquer-Cache-Control");
        let r = resp(&[
            ("cache-control", "no-store"),
            ("cdn-cache-control", "max-age=10"),
            ("lacquer-cache-control", "max-age=20"),
        ]);
        let (cc, targeted) = fields.cache_control(&r);
        assert!(targeted);
        assert_eq!(cc.unwrap().max_age().unwrap(), Some(20));
        let (cc, targeted) = fields.cache_control(&resp(&[("cache-control", "max-age=5")]));
        assert!(!targeted);
        assert_eq!(cc.unwrap().max_age().unwrap(), Some(5));
    }

    #[test]
    fn strip_removes_only_targeted_fields() {
        let fields = TargetedFields::new("lacquer-cache-control");
        let mut r = resp(&[
            ("cache-control", "no-store"),
            ("cdn-cache-control", "max-age=10"),
            ("lacquer-cache-control", "max-age=20"),
        ]);
        fields.strip(&mut r);
        assert!(r.headers.get("cdn-cache-control").is_none());
        assert!(r.headers.get("lacquer-cache-control").is_none());
        assert!(r.headers.get("cache-control").is_some());
    }
}
