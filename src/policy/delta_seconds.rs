//! Delta-seconds directives (`max-age`, `s-maxage`) read the way RFC 9111 asks, from the raw field.
//!
//! Pingora's parsed `CacheControl` keeps the *last* occurrence of a duplicated directive and
//! accepts the quoted form (`max-age="60"`). RFC 9111 says otherwise, so the freshness lifetime
//! is read here instead:
//! * the first occurrence counts (§4.2.1: "either the first occurrence should be used or the
//!   response should be considered stale");
//! * the value is `1*DIGIT` in token form (§1.2.2, §5.2.2.1); anything else (quoted, negative,
//!   fractional, missing) is invalid, and invalid freshness means stale (§4.2.1);
//! * values beyond 2^31 clamp to 2^31 (§1.2.2).
//!
//! Directive names are matched case-insensitively (§5.2).

use http::HeaderName;
use pingora_http::ResponseHeader;

/// The largest delta-seconds value kept; larger ones clamp to it (RFC 9111 §1.2.2).
pub const DELTA_SECONDS_MAX: u64 = 1 << 31;

/// A delta-seconds directive as found in a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaSeconds {
    /// A valid value, clamped to [`DELTA_SECONDS_MAX`].
    Seconds(u64),
    /// Present but not `1*DIGIT` in token form: the response is to be treated as stale.
    Invalid,
}

/// The first occurrence of each directive of `names` (lowercase) in the field `field` of
/// `resp`, read in one pass over the field: a stored answer's freshness asks for `s-maxage`
/// and `max-age` together, and each pass cost about 1,100 instructions per miss.
pub fn first_directives<const N: usize>(
    resp: &ResponseHeader,
    field: &HeaderName,
    names: [&str; N],
) -> [Option<DeltaSeconds>; N] {
    let mut found = [None; N];
    let mut missing = N;
    for line in resp.headers.get_all(field) {
        // visible ASCII, spaces and tabs only: the ASCII trims below are `str::trim`
        let Ok(line) = line.to_str() else { continue };
        for directive in split_directives(line) {
            let (key, value) = match directive.split_once('=') {
                Some((k, v)) => (k.trim_ascii(), Some(v.trim_ascii())),
                None => (directive.trim_ascii(), None),
            };
            for (slot, name) in found.iter_mut().zip(names) {
                if slot.is_none() && key.eq_ignore_ascii_case(name) {
                    *slot = Some(parse(value));
                    missing -= 1;
                    if missing == 0 {
                        return found;
                    }
                }
            }
        }
    }
    found
}

fn parse(value: Option<&str>) -> DeltaSeconds {
    match value {
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
            // all digits: only overflow can fail, and overflow clamps
            let seconds = v.parse::<u64>().unwrap_or(u64::MAX);
            DeltaSeconds::Seconds(seconds.min(DELTA_SECONDS_MAX))
        }
        _ => DeltaSeconds::Invalid,
    }
}

/// Splits a field value at commas that are not inside a quoted string (read as it is split: no
/// list is built, and the search stops at the directive asked for).
fn split_directives(line: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(line);
    std::iter::from_fn(move || {
        let text = rest?;
        let (mut quoted, mut escaped) = (false, false);
        for (i, b) in text.bytes().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if quoted => escaped = true,
                b'"' => quoted = !quoted,
                b',' if !quoted => {
                    rest = Some(&text[i + 1..]);
                    return Some(&text[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_headers::response as resp;

    fn max_age(lines: &[&str]) -> Option<DeltaSeconds> {
        let headers: Vec<_> = lines.iter().map(|l| ("cache-control", *l)).collect();
        let [found] = first_directives(&resp(&headers), &http::header::CACHE_CONTROL, ["max-age"]);
        found
    }

    #[test]
    fn token_form_only() {
        assert_eq!(max_age(&["max-age=60"]), Some(DeltaSeconds::Seconds(60)));
        assert_eq!(max_age(&["MAX-AGE = 60"]), Some(DeltaSeconds::Seconds(60)));
        for invalid in [
            "max-age=\"60\"",
            "max-age=-1",
            "max-age=1.5",
            "max-age",
            "max-age=x",
        ] {
            assert_eq!(
                max_age(&[invalid]),
                Some(DeltaSeconds::Invalid),
                "{invalid}"
            );
        }
        assert_eq!(max_age(&["public"]), None);
    }

    #[test]
    fn first_occurrence_wins_and_huge_values_clamp() {
        assert_eq!(
            max_age(&["max-age=1, max-age=2"]),
            Some(DeltaSeconds::Seconds(1))
        );
        assert_eq!(
            max_age(&["no-cache", "max-age=3", "max-age=4"]),
            Some(DeltaSeconds::Seconds(3))
        );
        assert_eq!(
            max_age(&["max-age=99999999999999999999999"]),
            Some(DeltaSeconds::Seconds(DELTA_SECONDS_MAX))
        );
    }

    #[test]
    fn commas_inside_quotes_do_not_split() {
        assert_eq!(
            max_age(&["private=\"a, max-age=1\", max-age=9"]),
            Some(DeltaSeconds::Seconds(9))
        );
    }
}
