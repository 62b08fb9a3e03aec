//! HTTP-date parsing (RFC 9110 §5.6.7) for every date field the cache reads: `Date`, `Expires`,
//! `Last-Modified`, `If-Modified-Since`, `If-Unmodified-Since`.
//!
//! The three formats a recipient must accept are IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`),
//! the obsolete RFC 850 form (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime
//! (`Sun Nov  6 08:49:37 1994`). The `httpdate` crate reads all three, but only with the exact
//! capitalisation of the grammar, and it maps RFC 850's two-digit years to 1970-2069. This module
//! adds what RFC 9110 asks beyond that:
//! * day, month and zone names in any case (`sun, 06 NOV 1994 08:49:37 gmt`): the grammar's
//!   names are case-sensitive, but origins send such variants and every major cache accepts them;
//! * a two-digit year is the one in the past 49 / next 50 years (RFC 9110 §5.6.7: a date that
//!   "appears to be more than 50 years in the future" is in the past century).
//!
//! Anything else (other zones such as `UTC`, one-digit hours, extra spaces, a weekday that does
//! not match the date) is not an HTTP-date: `None`, which each caller treats as the RFC says for
//! its field (an invalid `Expires` means already expired, an invalid condition is ignored).

use httpdate::HttpDate;
use std::cell::Cell;
use std::time::SystemTime;

/// The longest value [`LastParsed`] keeps (an IMF-fixdate is 29 bytes, asctime 24).
const CACHED_MAX: usize = 32;

/// The last value this thread parsed and what it named. An origin's `Date` changes once a
/// second, so nearly every answer's `Date` is the one the previous answer carried; parsing it
/// cost about 1,000 instructions per stored answer (`bench/miss_instructions.sh`), comparing
/// it costs a few dozen.
#[derive(Clone, Copy)]
struct LastParsed {
    bytes: [u8; CACHED_MAX],
    len: usize,
    time: Option<SystemTime>,
}

thread_local! {
    static LAST_PARSED: Cell<LastParsed> = const {
        Cell::new(LastParsed { bytes: [0; CACHED_MAX], len: usize::MAX, time: None })
    };
}

/// The time an HTTP-date names, or `None` when the value is not one.
pub fn parse(value: &str) -> Option<SystemTime> {
    let value = value.trim();
    if !value.is_ascii() {
        return None;
    }
    let cacheable = value.len() <= CACHED_MAX;
    if cacheable {
        let last = LAST_PARSED.get();
        if last.len == value.len() && &last.bytes[..last.len] == value.as_bytes() {
            return last.time;
        }
    }
    let time = parse_uncached(value);
    if cacheable {
        let mut bytes = [0; CACHED_MAX];
        bytes[..value.len()].copy_from_slice(value.as_bytes());
        LAST_PARSED.set(LastParsed {
            bytes,
            len: value.len(),
            time,
        });
    }
    time
}

/// [`parse`] without the per-thread memory of the last value.
fn parse_uncached(value: &str) -> Option<SystemTime> {
    if !is_rfc850(value) {
        if let Ok(date) = value.parse::<HttpDate>() {
            return Some(date.into());
        }
    }
    // rare: another capitalisation, or the RFC 850 form
    let canonical = canonical_case(value);
    let imf = match is_rfc850(&canonical) {
        true => rfc850_as_imf_fixdate(&canonical, SystemTime::now())?,
        false => canonical,
    };
    imf.parse::<HttpDate>().ok().map(SystemTime::from)
}

/// The time in a header value, for callers holding raw field bytes.
pub fn parse_value(value: &http::HeaderValue) -> Option<SystemTime> {
    parse(value.to_str().ok()?)
}

/// Each run of letters as the grammar spells it: `Sun`, `Sunday`, `Nov`, and `GMT`.
fn canonical_case(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut word_start = true;
    for c in value.chars() {
        if c.is_ascii_alphabetic() {
            out.push(match word_start {
                true => c.to_ascii_uppercase(),
                false => c.to_ascii_lowercase(),
            });
            word_start = false;
        } else {
            out.push(c);
            word_start = true;
        }
    }
    if out.ends_with(" Gmt") {
        out.replace_range(out.len() - 3.., "GMT");
    }
    out
}

/// Whether the value has the RFC 850 shape: a full day name, a comma, then `dd-Mon-yy`.
fn is_rfc850(value: &str) -> bool {
    value
        .split_once(", ")
        .is_some_and(|(day, rest)| day.len() > 3 && rest.as_bytes().get(2) == Some(&b'-'))
}

/// `Sunday, 06-Nov-94 08:49:37 GMT` as `Sun, 06 Nov 1994 08:49:37 GMT`, the two-digit year read
/// relative to `now` (RFC 9110 §5.6.7).
fn rfc850_as_imf_fixdate(value: &str, now: SystemTime) -> Option<String> {
    let (day_name, rest) = value.split_once(", ")?;
    // dd-Mon-yy hh:mm:ss GMT
    let (date, time) = rest.split_once(' ')?;
    let mut parts = date.split('-');
    let (day, month, yy) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || yy.len() != 2 || !yy.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let year = full_year(yy.parse().ok()?, current_year(now));
    Some(format!(
        "{}, {day} {month} {year} {time}",
        day_name.get(..3)?
    ))
}

/// The year ending in `yy` that is no more than 50 years after `current`.
fn full_year(yy: u32, current: u32) -> u32 {
    let century = current - current % 100;
    let candidate = century + yy;
    if candidate > current + 50 {
        candidate - 100
    } else if candidate + 50 <= current {
        candidate + 100
    } else {
        candidate
    }
}

fn current_year(now: SystemTime) -> u32 {
    // `Sun, 06 Nov 1994 08:49:37 GMT`: the year is at 12..16
    httpdate::fmt_http_date(now)
        .get(12..16)
        .and_then(|y| y.parse().ok())
        .unwrap_or(2025)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// Sun, 06 Nov 1994 08:49:37 GMT, the RFC's example.
    fn example() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(784_111_777)
    }

    #[test]
    fn the_last_value_remembered_is_never_taken_for_another() {
        let a = "Sun, 06 Nov 1994 08:49:37 GMT";
        let b = "Sun, 06 Nov 1994 08:49:38 GMT";
        let invalid = "Sun, 06 Nov 1994 08:49:37 UTC";
        for _ in 0..2 {
            assert_eq!(parse(a), Some(example()));
            assert_eq!(parse(a), Some(example()));
            assert_eq!(parse(b), Some(example() + Duration::from_secs(1)));
            assert_eq!(parse(invalid), None);
            assert_eq!(parse(invalid), None);
            // the same length and a common prefix: compared whole
            assert_eq!(parse(a), Some(example()));
        }
        // longer than what is remembered (an RFC 850 date on a Wednesday): parsed each time
        let long = "Wednesday, 09-Nov-94 08:49:37 GMT";
        assert!(long.len() > CACHED_MAX);
        for _ in 0..2 {
            assert_eq!(
                parse(long),
                Some(example() + Duration::from_secs(3 * 86_400))
            );
            assert_eq!(parse(a), Some(example()));
        }
    }

    #[test]
    fn the_three_formats() {
        for value in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "  Sun, 06 Nov 1994 08:49:37 GMT ",
        ] {
            assert_eq!(parse(value), Some(example()), "{value}");
        }
    }

    #[test]
    fn names_in_any_case() {
        for value in [
            "sun, 06 nov 1994 08:49:37 gmt",
            "SUN, 06 NOV 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 gmt",
            "sunday, 06-nov-94 08:49:37 GMT",
            "SUN NOV  6 08:49:37 1994",
        ] {
            assert_eq!(parse(value), Some(example()), "{value}");
        }
    }

    #[test]
    fn not_http_dates() {
        for value in [
            "",
            "0",
            "-1",
            "soon",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Nov 1994 08:49:37 AEST",
            "Sun, 06 Nov 1994 8:49:37 GMT",
            "Sun,  06 Nov 1994 08:49:37 GMT",
            "Sun 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 94 08:49:37 GMT",
            "Mon, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sün, 06 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse(value), None, "{value:?}");
        }
    }

    #[test]
    fn two_digit_years_are_within_fifty_years_ahead() {
        assert_eq!(full_year(94, 2025), 1994);
        assert_eq!(full_year(25, 2025), 2025);
        assert_eq!(full_year(75, 2025), 2075);
        assert_eq!(full_year(76, 2025), 1976);
        assert_eq!(full_year(10, 2090), 2110);
        assert_eq!(full_year(41, 2090), 2041);
    }
}
