//! One `Content-Length` for the origin.
//!
//! RFC 9110 §8.6 lets a recipient of `Content-Length: 5, 5` (or of two `Content-Length: 5`
//! lines) either refuse the message or replace the field with the single value. Pingora accepts
//! such a request when all values agree (and refuses it with 400 when they do not), frames the
//! body by the one value, but forwards the field as it came. An origin that reads only a single
//! number then frames the body differently from us, and a body it does not count as one becomes
//! the start of the next request on the pooled connection. The field is therefore replaced by
//! its single value before the request goes anywhere; a single, plain value is left untouched.
//!
//! Replacing rather than refusing keeps what RFC 9110 allows and what Pingora (like hyper and
//! HAProxy) already accepts, for the clients or intermediaries that fold repeated fields into a
//! list; the framing is the same either way, and the origin sees exactly one value.

/// A `Content-Length` that is not one decimal number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotOneNumber;

/// The `Content-Length` lines of one request, gathered one by one.
#[derive(Debug, Default)]
pub struct ContentLengths<'a> {
    lines: usize,
    first: Option<&'a [u8]>,
    listed: bool,
}

impl<'a> ContentLengths<'a> {
    /// One `Content-Length` field line's value.
    pub fn add(&mut self, value: &'a [u8]) {
        self.lines += 1;
        self.first.get_or_insert(value);
        self.listed |= value.contains(&b',');
    }

    /// `Ok(Some(n))`: the field came as several lines or a list, and `n` is what to send instead;
    /// `Ok(None)`: nothing to rewrite. `Err`: not one number. (Pingora refuses lists whose values
    /// differ before the proxy sees them, so the first value stands for all.)
    pub fn to_rewrite(&self) -> Result<Option<u64>, NotOneNumber> {
        if self.lines <= 1 && !self.listed {
            return Ok(None);
        }
        let first = self.first.unwrap_or_default();
        let value = first.split(|&b| b == b',').next().unwrap_or_default();
        let digits = value.trim_ascii();
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(NotOneNumber);
        }
        std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse().ok())
            .map(Some)
            .ok_or(NotOneNumber)
    }
}

#[cfg(test)]
mod tests {
    use super::{ContentLengths, NotOneNumber};

    fn rewrite(lines: &[&str]) -> Result<Option<u64>, NotOneNumber> {
        let mut lengths = ContentLengths::default();
        for line in lines {
            lengths.add(line.as_bytes());
        }
        lengths.to_rewrite()
    }

    #[test]
    fn one_plain_value_is_left_alone() {
        assert_eq!(rewrite(&[]), Ok(None));
        assert_eq!(rewrite(&["5"]), Ok(None));
    }

    #[test]
    fn lists_and_repeated_lines_become_one_value() {
        assert_eq!(rewrite(&["5, 5"]), Ok(Some(5)));
        assert_eq!(rewrite(&["5,5"]), Ok(Some(5)));
        assert_eq!(rewrite(&["5", "5"]), Ok(Some(5)));
        assert_eq!(rewrite(&[" 12 ", "12, 12"]), Ok(Some(12)));
    }

    #[test]
    fn what_is_not_a_number_is_refused() {
        assert_eq!(rewrite(&[", 5"]), Err(NotOneNumber));
        assert_eq!(rewrite(&["+5", "5"]), Err(NotOneNumber));
        assert_eq!(
            rewrite(&["99999999999999999999999", "1"]),
            Err(NotOneNumber)
        );
    }
}
