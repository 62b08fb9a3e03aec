//! HTTP dates relative to now, for the `Date`, `Expires`, `Last-Modified` and `If-*-Since` fields
//! the tests send and script, in each of the three formats of RFC 9110 §5.6.7.

use std::time::{Duration, SystemTime};

/// Formats `t` as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

/// [`http_date`] of now plus `offset_secs` (negative for the past), e.g. for `Expires` or
/// `Last-Modified` values.
pub fn http_date_offset(offset_secs: i64) -> String {
    let now = SystemTime::now();
    let t = if offset_secs >= 0 {
        now + Duration::from_secs(offset_secs as u64)
    } else {
        now - Duration::from_secs(offset_secs.unsigned_abs())
    };
    http_date(t)
}

/// `t` in the obsolete RFC 850 format (`Sunday, 06-Nov-94 08:49:37 GMT`).
pub fn rfc850_date(t: SystemTime) -> String {
    let imf = http_date(t);
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let day = match &imf[..3] {
        "Mon" => "Monday",
        "Tue" => "Tuesday",
        "Wed" => "Wednesday",
        "Thu" => "Thursday",
        "Fri" => "Friday",
        "Sat" => "Saturday",
        _ => "Sunday",
    };
    format!(
        "{day}, {}-{}-{} {} GMT",
        &imf[5..7],
        &imf[8..11],
        &imf[14..16],
        &imf[17..25]
    )
}

/// `t` in the asctime format (`Sun Nov  6 08:49:37 1994`).
pub fn asctime_date(t: SystemTime) -> String {
    let imf = http_date(t);
    let day = imf[5..7].trim_start_matches('0');
    format!(
        "{} {} {day:>2} {} {}",
        &imf[..3],
        &imf[8..11],
        &imf[17..25],
        &imf[12..16]
    )
}

/// `now + offset_secs` (negative for the past) in the three formats: IMF-fixdate, RFC 850 and
/// asctime.
pub fn http_date_formats(offset_secs: i64) -> [String; 3] {
    let now = SystemTime::now();
    let t = if offset_secs >= 0 {
        now + Duration::from_secs(offset_secs as u64)
    } else {
        now - Duration::from_secs(offset_secs.unsigned_abs())
    };
    [http_date(t), rfc850_date(t), asctime_date(t)]
}
