//! The response's cache directives as the storing decision reads them, found by one hand-written
//! scan of the governing field (`Cache-Control`, or the targeted field of RFC 9213).
//!
//! This replaces Pingora's `pingora_cache::cache_control::CacheControl` on the miss path, which
//! runs a regex over each line and builds an `IndexMap` of owned directives: about 8,000
//! user-space instructions per stored response (`docs/benchmarks.md`, issue 18 item 1), for the
//! dozen directives the decision asks about. The scan reads the same grammar the same way: it
//! reproduces that regex's matches (leftmost-first, line by line) byte for byte, and the same
//! "last occurrence wins" of its map, so every answer is the one `CacheControl` gives; the unit
//! tests compare the two on hostile and random input. In short:
//! * `directive = token [ "=" ( token / quoted-string ) ]`; directives are separated by `,` or `;`
//!   with optional whitespace, and a line's first directive must start the line;
//! * anything between directives that does not fit is skipped up to the next separator followed
//!   by a token (so a stray quote outside a value protects no comma);
//! * a value that is neither a token nor a closed quoted string leaves the directive without one;
//! * names are case-insensitive; a name that is not UTF-8 is ignored, one with any non-ASCII byte
//!   is never a known directive;
//! * a repeated directive keeps its presence and takes the value of its last occurrence (so
//!   `private, private="x"` is the field-list form, not the whole-response one).
//!
//! Freshness (`max-age`, `s-maxage` as RFC 9111 reads them: first occurrence, token form only)
//! is `super::delta_seconds`; request directives keep Pingora's parser (`super::request_directives`).

use http::header::HeaderName;
use pingora_cache::cache_control::DELTA_SECONDS_OVERFLOW_VALUE;
use pingora_http::ResponseHeader;

/// The directives of one response the storing decision reads, borrowed from its field lines.
/// Empty when the field is absent.
#[derive(Debug, Default, Clone, Copy)]
pub struct ResponseDirectives<'a> {
    /// One bit per [`Known`] directive present.
    present: u16,
    /// The last value of `private` (`Some(None)`: the last occurrence had none).
    private: Option<Option<&'a [u8]>>,
    /// The last value of `no-cache`.
    no_cache: Option<Option<&'a [u8]>>,
    /// The last value of `stale-while-revalidate`.
    stale_while_revalidate: Option<Option<&'a [u8]>>,
    /// The last value of `stale-if-error`.
    stale_if_error: Option<Option<&'a [u8]>>,
}

/// The directives the decision asks about, as bits of [`ResponseDirectives::present`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    NoStore = 1,
    NoCache = 1 << 1,
    Private = 1 << 2,
    Public = 1 << 3,
    MustRevalidate = 1 << 4,
    ProxyRevalidate = 1 << 5,
    MustUnderstand = 1 << 6,
    SMaxAge = 1 << 7,
    StaleWhileRevalidate = 1 << 8,
    StaleIfError = 1 << 9,
}

impl Known {
    /// The directive named `name` (any case), if it is one the decision reads.
    fn from_name(name: &[u8]) -> Option<Known> {
        const NAMES: [(&[u8], Known); 10] = [
            (b"no-store", Known::NoStore),
            (b"no-cache", Known::NoCache),
            (b"private", Known::Private),
            (b"public", Known::Public),
            (b"must-revalidate", Known::MustRevalidate),
            (b"proxy-revalidate", Known::ProxyRevalidate),
            (b"must-understand", Known::MustUnderstand),
            (b"s-maxage", Known::SMaxAge),
            (b"stale-while-revalidate", Known::StaleWhileRevalidate),
            (b"stale-if-error", Known::StaleIfError),
        ];
        NAMES
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|&(_, known)| known)
    }
}

impl<'a> ResponseDirectives<'a> {
    /// The directives of field `name` (lowercase) in `resp`, every line in order.
    pub fn of(resp: &'a ResponseHeader, name: &http::HeaderName) -> Self {
        let mut directives = ResponseDirectives::default();
        for line in resp.headers.get_all(name) {
            directives.add_line(line.as_bytes());
        }
        directives
    }

    /// Adds the directives of one field line.
    fn add_line(&mut self, line: &'a [u8]) {
        for_each_directive(line, |name, value| {
            let Some(known) = Known::from_name(name) else {
                return;
            };
            self.present |= known as u16;
            let slot = match known {
                Known::Private => &mut self.private,
                Known::NoCache => &mut self.no_cache,
                Known::StaleWhileRevalidate => &mut self.stale_while_revalidate,
                Known::StaleIfError => &mut self.stale_if_error,
                _ => return,
            };
            *slot = Some(value);
        });
    }

    fn has(&self, known: Known) -> bool {
        self.present & known as u16 != 0
    }

    /// `no-store`, in any form.
    pub fn no_store(&self) -> bool {
        self.has(Known::NoStore)
    }

    /// `private` without a field list: the whole response is private.
    pub fn private(&self) -> bool {
        self.private == Some(None)
    }

    /// `no-cache` without a field list: store, but revalidate before every use.
    pub fn no_cache(&self) -> bool {
        self.no_cache == Some(None)
    }

    /// `public`, in any form.
    pub fn public(&self) -> bool {
        self.has(Known::Public)
    }

    /// `must-revalidate`, in any form.
    pub fn must_revalidate(&self) -> bool {
        self.has(Known::MustRevalidate)
    }

    /// `proxy-revalidate`, in any form.
    pub fn proxy_revalidate(&self) -> bool {
        self.has(Known::ProxyRevalidate)
    }

    /// `must-understand`, in any form.
    pub fn must_understand(&self) -> bool {
        self.has(Known::MustUnderstand)
    }

    /// `s-maxage`, whatever its value (its value is read by `super::delta_seconds`).
    pub fn has_s_maxage(&self) -> bool {
        self.has(Known::SMaxAge)
    }

    /// A response to a request with `Authorization` may be stored (RFC 9111 §3.5).
    pub fn allow_caching_authorized_req(&self) -> bool {
        self.must_revalidate() || self.public() || self.has_s_maxage()
    }

    /// `stale-while-revalidate` seconds: `Some(Ok(..))` when its value reads as delta-seconds
    /// (quotes allowed, clamped), `Some(Err(()))` when it does not, `None` when absent or
    /// without a value.
    pub fn stale_while_revalidate(&self) -> Option<Result<u32, ()>> {
        delta_seconds(self.stale_while_revalidate)
    }

    /// `stale-if-error` seconds, read as [`Self::stale_while_revalidate`].
    pub fn stale_if_error(&self) -> Option<Result<u32, ()>> {
        delta_seconds(self.stale_if_error)
    }

    /// Removes from `header` the fields named by `private="..."` and `no-cache="..."` (RFC 9111
    /// §5.2.2.6, §5.2.2.4: a shared cache must not store them).
    pub fn strip_private_headers(&self, header: &mut ResponseHeader) {
        for list in [self.private, self.no_cache]
            .into_iter()
            .flatten()
            .flatten()
        {
            for name in unquoted(list).split(|&b| b == b',') {
                if let Ok(name) = HeaderName::from_bytes(trim_ows(name)) {
                    header.remove_header(&name);
                }
            }
        }
    }
}

/// A present directive's value as delta-seconds, the way Pingora's `DirectiveValue` reads it:
/// quotes stripped, `u32` syntax (a leading `+` allowed), overflow clamped to 2^31 - 1.
fn delta_seconds(slot: Option<Option<&[u8]>>) -> Option<Result<u32, ()>> {
    // present without a value reads as absent, as in Pingora
    let value = slot??;
    let Ok(text) = std::str::from_utf8(unquoted(value)) else {
        return Some(Err(()));
    };
    Some(match text.parse::<u32>() {
        Ok(seconds) => Ok(seconds),
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => {
            Ok(DELTA_SECONDS_OVERFLOW_VALUE)
        }
        Err(_) => Err(()),
    })
}

/// A value without its surrounding quotes, if it has both.
fn unquoted(value: &[u8]) -> &[u8] {
    value
        .strip_prefix(b"\"")
        .and_then(|inner| inner.strip_suffix(b"\""))
        .unwrap_or(value)
}

/// Optional whitespace (space, tab) trimmed from both ends.
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let not_ows = |b: &u8| *b != b' ' && *b != b'\t';
    let Some(head) = bytes.iter().position(not_ows) else {
        return &[];
    };
    let tail = bytes
        .iter()
        .rposition(not_ows)
        .map_or(head, |tail| tail + 1);
    &bytes[head..tail]
}

/// A `token` byte in Pingora's grammar: anything but controls, space, DEL and the delimiters
/// (non-ASCII bytes included, as `obs-text`).
fn is_token(b: u8) -> bool {
    !matches!(
        b,
        0x00..=0x20
            | 0x7f
            | b'('
            | b')'
            | b'<'
            | b'>'
            | b'@'
            | b','
            | b';'
            | b':'
            | b'\\'
            | b'"'
            | b'/'
            | b'['
            | b']'
            | b'?'
            | b'='
            | b'{'
            | b'}'
    )
}

/// ASCII whitespace, the regex's `\s` without Unicode.
fn is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ')
}

/// Calls `f(name, value)` for each directive of `line`, in order: the matches of Pingora's
/// `(?:^|\s*[,;]\s*)(token)(?:=(token|quoted-string))?`, a name that is not UTF-8 left out.
/// A quoted value is passed with its quotes.
fn for_each_directive<'a>(line: &'a [u8], mut f: impl FnMut(&'a [u8], Option<&'a [u8]>)) {
    let token_end = |from: usize| {
        line[from..]
            .iter()
            .position(|&b| !is_token(b))
            .map_or(line.len(), |n| from + n)
    };
    let mut pos = 0;
    loop {
        // where the next name starts: the line's start, or after the first separator (from
        // `pos` on) that whitespace and a token follow
        let name_start = if pos == 0 && line.first().is_some_and(|&b| is_token(b)) {
            0
        } else {
            let mut found = None;
            let mut at = pos;
            while let Some(n) = line[at..].iter().position(|&b| b == b',' || b == b';') {
                let separator = at + n;
                let mut next = separator + 1;
                while next < line.len() && is_space(line[next]) {
                    next += 1;
                }
                if next < line.len() && is_token(line[next]) {
                    found = Some(next);
                    break;
                }
                at = separator + 1;
            }
            match found {
                Some(start) => start,
                None => return,
            }
        };
        let name_end = token_end(name_start);
        let name = &line[name_start..name_end];
        let mut end = name_end;
        let mut value = None;
        if line.get(name_end) == Some(&b'=') {
            let value_start = name_end + 1;
            match line.get(value_start) {
                Some(&b) if is_token(b) => {
                    end = token_end(value_start);
                    value = Some(&line[value_start..end]);
                }
                Some(b'"') => {
                    if let Some(close) = quoted_string_end(line, value_start) {
                        end = close;
                        value = Some(&line[value_start..end]);
                    }
                }
                _ => {}
            }
        }
        if name.is_ascii() || std::str::from_utf8(name).is_ok() {
            f(name, value);
        }
        pos = end;
    }
}

/// The end (past the closing quote) of the quoted string opening at `line[open]`, if it closes:
/// `"(?:[^"\\]|\\.)*"`, where `.` is any byte but LF. Also how `vary` finds the commas of a list
/// that are not inside one.
pub(super) fn quoted_string_end(line: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    while i < line.len() {
        match line[i] {
            b'"' => return Some(i + 1),
            b'\\' => {
                if line.get(i + 1).is_none_or(|&b| b == b'\n') {
                    return None;
                }
                i += 2;
            }
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_headers::response;
    use pingora_cache::cache_control::{CacheControl, InterpretCacheControl};

    /// Every answer of the scan against Pingora's parser, for one response.
    fn assert_same_as_pingora(resp: &ResponseHeader, what: &str) {
        let ours = ResponseDirectives::of(resp, &http::header::CACHE_CONTROL);
        let theirs = CacheControl::from_resp_headers(resp);
        let theirs = theirs.as_ref();
        let check = |name: &str, ours: bool, theirs: bool| {
            assert_eq!(ours, theirs, "{name} for {what}");
        };
        check(
            "no-store",
            ours.no_store(),
            theirs.is_some_and(|c| c.no_store()),
        );
        check(
            "private",
            ours.private(),
            theirs.is_some_and(|c| c.private()),
        );
        check(
            "no-cache",
            ours.no_cache(),
            theirs.is_some_and(|c| c.no_cache()),
        );
        check("public", ours.public(), theirs.is_some_and(|c| c.public()));
        check(
            "must-revalidate",
            ours.must_revalidate(),
            theirs.is_some_and(|c| c.must_revalidate()),
        );
        check(
            "proxy-revalidate",
            ours.proxy_revalidate(),
            theirs.is_some_and(|c| c.proxy_revalidate()),
        );
        check(
            "must-understand",
            ours.must_understand(),
            theirs.is_some_and(|c| c.has_key("must-understand")),
        );
        check(
            "s-maxage",
            ours.has_s_maxage(),
            theirs.is_some_and(|c| c.has_key("s-maxage")),
        );
        check(
            "authorized",
            ours.allow_caching_authorized_req(),
            theirs.is_some_and(|c| c.allow_caching_authorized_req()),
        );
        let seconds = |r: Option<pingora_error::Result<Option<u32>>>| match r {
            None | Some(Ok(None)) => None,
            Some(Ok(Some(s))) => Some(Ok(s)),
            Some(Err(_)) => Some(Err(())),
        };
        assert_eq!(
            ours.stale_while_revalidate(),
            seconds(theirs.map(|c| c.stale_while_revalidate())),
            "stale-while-revalidate for {what}"
        );
        assert_eq!(
            ours.stale_if_error(),
            seconds(theirs.map(|c| c.stale_if_error())),
            "stale-if-error for {what}"
        );
        let (mut stripped_ours, mut stripped_theirs) = (resp.clone(), resp.clone());
        ours.strip_private_headers(&mut stripped_ours);
        if let Some(c) = theirs {
            c.strip_private_headers(&mut stripped_theirs);
        }
        let names = |r: &ResponseHeader| {
            r.headers
                .keys()
                .map(|k| k.as_str().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(&stripped_ours),
            names(&stripped_theirs),
            "stripped fields for {what}"
        );
    }

    fn with_lines(lines: &[&[u8]]) -> ResponseHeader {
        let mut resp = response(&[("set-cookie", "a=b"), ("x-user", "1"), ("etag", "\"e\"")]);
        for line in lines {
            resp.append_header(
                "cache-control",
                http::HeaderValue::from_bytes(line).unwrap(),
            )
            .unwrap();
        }
        resp
    }

    #[test]
    fn the_usual_fields() {
        let r = with_lines(&[b"public, max-age=3600, stale-while-revalidate=30"]);
        let d = ResponseDirectives::of(&r, &http::header::CACHE_CONTROL);
        assert!(d.public() && !d.private() && !d.no_store());
        assert_eq!(d.stale_while_revalidate(), Some(Ok(30)));
        assert_eq!(d.stale_if_error(), None);
        let r = with_lines(&[b"No-Store"]);
        assert!(ResponseDirectives::of(&r, &http::header::CACHE_CONTROL).no_store());
        let d = ResponseDirectives::of(&r, &http::HeaderName::from_static("cdn-cache-control"));
        assert!(!d.no_store() && !d.public());
    }

    #[test]
    fn field_lists_and_last_occurrences() {
        let r = with_lines(&[b"private=\"set-cookie, x-user\", max-age=60"]);
        let d = ResponseDirectives::of(&r, &http::header::CACHE_CONTROL);
        assert!(!d.private());
        let mut stripped = r.clone();
        d.strip_private_headers(&mut stripped);
        assert!(!stripped.headers.contains_key("set-cookie"));
        assert!(!stripped.headers.contains_key("x-user"));
        assert!(stripped.headers.contains_key("etag"));
        // the last occurrence decides between the two forms
        let r = with_lines(&[b"private", b"private=x-user"]);
        assert!(!ResponseDirectives::of(&r, &http::header::CACHE_CONTROL).private());
        let r = with_lines(&[b"no-cache=x-user, no-cache"]);
        assert!(ResponseDirectives::of(&r, &http::header::CACHE_CONTROL).no_cache());
    }

    #[test]
    fn hostile_lines_read_as_pingora_reads_them() {
        let lines: &[&[u8]] = &[
            b"",
            b",",
            b" , ;; ,",
            b"max-age=60 no-store",
            b" no-store",
            b"\tno-store",
            b"no-store\t",
            b"x=\"a, no-store\", public",
            b"\"a, no-store\"",
            b"x=\"unterminated, no-store",
            b"x=\"esc\\\", no-store\", private",
            b"x=\"esc\\",
            b"private=\"set-cookie\" , no-cache=\"x-user,etag\"",
            b"private=\"\", no-cache=\" , \"",
            b"private=set-cookie=x, public",
            b"a=b=c, no-store",
            b"a=, no-store",
            b"a==, ;private",
            b"stale-if-error=\"10\", stale-while-revalidate=+5",
            b"stale-if-error=-1, stale-while-revalidate=1.5",
            b"stale-if-error=99999999999, stale-while-revalidate=4294967296",
            b"stale-if-error, stale-while-revalidate=\"",
            b"stale-if-error=\"\"",
            b"STALE-IF-ERROR=7;Must-Revalidate",
            b"public;;;max-age=1,,,private",
            b"no-store\xff, private",
            b"\xc3\xa9t\xc3\xa9=1, public",
            b"\xff\xfe, public",
            b"priv\xc3\xa9ate, s-maxage=1",
            b"must-understand, no-store",
            b"proxy-revalidate=\"x\"",
            b"(no-store), <public>",
            b"{a}=1,[b]=2; private",
            b"a=\"x\"y, private",
            b"a=\"x\"\"y\", no-cache",
        ];
        for line in lines {
            assert_same_as_pingora(&with_lines(&[line]), &String::from_utf8_lossy(line));
        }
        // several lines: each starts afresh, the last occurrence over all of them counts
        for pair in lines.chunks(2) {
            let what = format!(
                "{:?}",
                pair.iter()
                    .map(|l| String::from_utf8_lossy(l))
                    .collect::<Vec<_>>()
            );
            assert_same_as_pingora(&with_lines(pair), &what);
        }
    }

    #[test]
    fn random_lines_read_as_pingora_reads_them() {
        // pieces of directives, separators and quotes, in every order (a fixed-seed generator:
        // the same lines on every run)
        const PIECES: &[&[u8]] = &[
            b"no-store",
            b"NO-CACHE",
            b"no-cache",
            b"private",
            b"public",
            b"must-revalidate",
            b"proxy-revalidate",
            b"must-understand",
            b"s-maxage",
            b"stale-if-error",
            b"stale-while-revalidate",
            b"max-age",
            b"x",
            b"=",
            b"=",
            b"\"",
            b"\\",
            b",",
            b", ",
            b";",
            b" ",
            b"\t",
            b"1",
            b"42",
            b"-3",
            b"+7",
            b"set-cookie",
            b"x-user",
            b"\xc3\xa9",
            b"\xff",
            b"(",
            b"/",
            b"?",
            b"\"a,b\"",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |bound: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % bound as u64) as usize
        };
        for _ in 0..20_000 {
            let mut line = Vec::new();
            for _ in 0..1 + next(12) {
                line.extend_from_slice(PIECES[next(PIECES.len())]);
            }
            if http::HeaderValue::from_bytes(&line).is_err() {
                continue;
            }
            assert_same_as_pingora(&with_lines(&[&line]), &String::from_utf8_lossy(&line));
        }
    }
}
