//! HTTP dates relative to now, for the `Date`, `Expires`, `Last-Modified` and `If-*-Since` fields
//! the tests send and script.

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
