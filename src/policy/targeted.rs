//! Targeted cache-control fields (RFC 9213): directives meant for this cache only.
//!
//! An origin can say `Lacquer-Cache-Control: max-age=3600` (the name is configurable) or
//! `CDN-Cache-Control: ...` to give Lacquer a policy different from what browsers get in
//! `Cache-Control`. The first field of the target list that is present and valid replaces
//! `Cache-Control` *and* `Expires` for this cache.
//!
//! A targeted field is a Structured Field Dictionary (RFC 9213 §2.1, RFC 8941 §3.2): a value that
//! does not parse as one (`max-age=10000, &&&&&`, `MAX-AGE=10`) is ignored as a whole, never in
//! part, and the next field of the list (in the end `Cache-Control`) governs. It is parsed with
//! the `sfv` crate (already in the tree through Pingora), and only when a targeted field is
//! present, so responses without one pay one field lookup per name.
//!
//! Which fields are removed from responses to clients is configured apart from which are obeyed
//! (`cache.strip_targeted_fields`): by default only our own field, since `CDN-Cache-Control`
//! targets every CDN on the path, including one in front of Lacquer (issue 17).

use super::cache_control::ResponseDirectives;
use http::HeaderName;
use pingora_http::ResponseHeader;
use sfv::{ParseMore, Parser};

/// The target list, most specific first. (Which of them are removed from responses to clients is
/// `cache.strip_targeted_fields`, applied with the other fields meant for this cache only by
/// `proxy::headers::ForUsOnly`.)
#[derive(Debug, Clone)]
pub struct TargetedFields {
    /// Parsed once: a name given as text is parsed again on every lookup (two lookups per name
    /// on every answer the policy decides on, about 1,300 instructions per miss).
    names: Vec<HeaderName>,
}

/// `Cache-Control`, the field that governs when no targeted field does (a static, so that
/// [`TargetedFields::governing_field`] can lend it like a name of the list).
static CACHE_CONTROL: HeaderName = http::header::CACHE_CONTROL;

impl TargetedFields {
    /// Our own field first, then `CDN-Cache-Control`. A name that is not a valid field name
    /// (the configuration refuses one) is left out.
    pub fn new(own_field: &str) -> Self {
        let cdn = HeaderName::from_static("cdn-cache-control");
        let mut names: Vec<HeaderName> = HeaderName::from_bytes(own_field.as_bytes())
            .into_iter()
            .collect();
        if !names.contains(&cdn) {
            names.push(cdn);
        }
        TargetedFields { names }
    }

    /// The field names of the target list, most specific first.
    pub fn names(&self) -> &[HeaderName] {
        &self.names
    }

    /// The targeted field that governs this cache for `resp`: the first of the list that is
    /// present and parses as a Structured Field Dictionary. `None`: `Cache-Control` governs.
    pub fn governing<'a>(&'a self, resp: &ResponseHeader) -> Option<&'a HeaderName> {
        self.names.iter().find(|name| is_dictionary(resp, name))
    }

    /// The cache directives that govern this cache for `resp`, the field they came from, and
    /// whether that is a targeted field (in which case `Expires` must be ignored too). One look
    /// at the target list for all three: each look is a lookup per name.
    pub fn cache_control<'r, 's>(
        &'s self,
        resp: &'r ResponseHeader,
    ) -> (ResponseDirectives<'r>, &'s HeaderName, bool) {
        let (field, targeted) = self.governing_field(resp);
        (ResponseDirectives::of(resp, field), field, targeted)
    }

    /// The name of the field whose directives govern this cache for `resp` (the
    /// [`governing`](Self::governing) targeted field, else `cache-control`), and whether it is a
    /// targeted field.
    pub fn governing_field<'a>(&'a self, resp: &ResponseHeader) -> (&'a HeaderName, bool) {
        match self.governing(resp) {
            Some(name) => (name, true),
            None => (&CACHE_CONTROL, false),
        }
    }
}

/// Whether field `name` is present in `resp` and its lines, combined, are a Structured Field
/// Dictionary (RFC 8941 §4.2: each line parsed and merged, as if joined with commas).
fn is_dictionary(resp: &ResponseHeader, name: &HeaderName) -> bool {
    let mut lines = resp.headers.get_all(name).iter();
    let Some(first) = lines.next() else {
        return false;
    };
    let Ok(mut dictionary) = Parser::parse_dictionary(first.as_bytes()) else {
        return false;
    };
    lines.all(|line| dictionary.parse_more(line.as_bytes()).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::policy::delta_seconds::{first_directives, DeltaSeconds};
    use crate::policy::test_headers::response as resp;

    /// The `max-age` the freshness computation reads for `r`: from the governing field.
    fn max_age_read(fields: &TargetedFields, r: &ResponseHeader) -> Option<DeltaSeconds> {
        let [found] = first_directives(r, fields.governing_field(r).0, ["max-age"]);
        found
    }

    #[test]
    fn most_specific_field_wins() {
        let fields = TargetedFields::new("Lacquer-Cache-Control");
        let r = resp(&[
            ("cache-control", "no-store"),
            ("cdn-cache-control", "max-age=10"),
            ("lacquer-cache-control", "max-age=20"),
        ]);
        let (cc, _, targeted) = fields.cache_control(&r);
        assert!(targeted);
        assert!(!cc.no_store(), "Cache-Control's no-store does not govern");
        assert_eq!(max_age_read(&fields, &r), Some(DeltaSeconds::Seconds(20)));
        let r = resp(&[("cache-control", "max-age=5, no-store")]);
        let (cc, _, targeted) = fields.cache_control(&r);
        assert!(!targeted);
        assert!(cc.no_store());
        assert_eq!(max_age_read(&fields, &r), Some(DeltaSeconds::Seconds(5)));
    }

    #[test]
    fn an_invalid_dictionary_is_ignored_as_a_whole() {
        let fields = TargetedFields::new("lacquer-cache-control");
        for invalid in [
            "max-age=10000, &&&&&",
            "MAX-AGE=10",
            "max-age=10,",
            "max-age=\"1",
        ] {
            let r = resp(&[
                ("cache-control", "max-age=5"),
                ("cdn-cache-control", invalid),
            ]);
            assert_eq!(fields.governing(&r), None, "{invalid}");
            let (_, _, targeted) = fields.cache_control(&r);
            assert!(!targeted, "{invalid}");
            assert_eq!(
                max_age_read(&fields, &r),
                Some(DeltaSeconds::Seconds(5)),
                "{invalid}"
            );
        }
        // our own field invalid: CDN-Cache-Control, the next of the list, governs
        let r = resp(&[
            ("lacquer-cache-control", "max-age=1, !"),
            ("cdn-cache-control", "max-age=20"),
        ]);
        assert_eq!(
            fields.governing(&r).map(HeaderName::as_str),
            Some("cdn-cache-control")
        );
        // every line counts: one invalid line spoils the field
        let r = resp(&[
            ("cdn-cache-control", "max-age=20"),
            ("cdn-cache-control", "&"),
        ]);
        assert_eq!(fields.governing(&r), None);
        let r = resp(&[
            ("cdn-cache-control", "max-age=20"),
            ("cdn-cache-control", "public"),
        ]);
        assert_eq!(
            fields.governing(&r).map(HeaderName::as_str),
            Some("cdn-cache-control")
        );
    }
}
