//! The cache key: the host (lowercased) followed by the path and query, built and hashed once per
//! request; a request that came over HTTPS has `https://` in front, so the `http://` and
//! `https://` pages of one host are two entries (an `http` key is what it always was).
//!
//! The key is the concatenation of its [`KeyParts`], and no two different requests may share
//! one: the host is an RFC 3986 authority, which `request_filter` checks before anything builds
//! a key (`super::request_head`), so it never contains `/`, and the path always starts with `/`
//! (the same check). The first `/` of a key therefore ends its host: `Host: shop.example/assets`
//! with `/v/app.js` is refused rather than keyed as `shop.example/assets/v/app.js`. The hash
//! and the text are both written from the same parts, in one place, so they cannot disagree.
//!
//! One request needs its key in many places: the fast path's memory and memcached lookups and the
//! variant lookups derived from them, the identity of a decoded copy, the cluster's fill lease,
//! Pingora's `cache_key_callback`, and the balancer's consistent hashing. [`RequestKey`] keeps it
//! in the request context, built when the first of them asks. A hit from the memory tier needs
//! only the primary hash, so the hash is computed on its own, straight from the request, without
//! building the key string (an allocation per hit); when something needs the key itself, it is
//! built once and carries that same hash, so no later user hashes the URL again. Invalidation
//! builds the keys of other URLs of the same host with [`of_url`].

use pingora_cache::key::{CacheHashKey, HashBinary};
use pingora_cache::CacheKey;
use pingora_http::RequestHeader;

/// The length of Pingora's key hash (`pingora_cache::key`'s `Blake2b128`: Blake2b with a
/// 16-byte output, no key, no salt), which [`KeyParts::hash`] computes with `blake2b_simd`.
const HASH_LEN: usize = 16;

/// A request's cache key, kept in the request context: the primary hash and the key, each
/// computed on first use and then kept.
#[derive(Debug, Default)]
pub struct RequestKey {
    primary: Option<HashBinary>,
    key: Option<CacheKey>,
    /// The request came over HTTPS (set by `request_filter` before the key is first used).
    https: bool,
}

impl RequestKey {
    /// Marks the request as one that came over HTTPS (directly or through a trusted proxy): its
    /// key gets the `https://` prefix. Call before the first use of the key.
    #[inline]
    pub fn set_https(&mut self) {
        debug_assert!(self.primary.is_none() && self.key.is_none());
        self.https = true;
    }

    /// Whether the key is the `https://` one.
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// The primary hash of `req` (the request this context belongs to): what the memory tier
    /// indexes objects by, and the base of every variant's hash.
    #[inline]
    pub fn primary_bin(&mut self, req: &RequestHeader) -> HashBinary {
        let https = self.https;
        *self.primary.get_or_insert_with(|| primary_hash(https, req))
    }

    /// The key of `req` (the request this context belongs to), built on the first call, with its
    /// primary hash.
    pub fn get(&mut self, req: &RequestHeader) -> &CacheKey {
        let primary = self.primary_bin(req);
        let key = self.built(req);
        key.set_primary_bin_override(primary);
        key
    }

    /// The key's text, host + path + query, for the balancer's `consistent` hashing: built on the
    /// first call like [`Self::get`], but not hashed for a request that does not use the cache.
    pub fn text(&mut self, req: &RequestHeader) -> &[u8] {
        self.built(req).primary_key()
    }

    fn built(&mut self, req: &RequestHeader) -> &mut CacheKey {
        let https = self.https;
        self.key
            .get_or_insert_with(|| CacheKey::new(KeyParts::of(https, req).text(), ""))
    }
}

/// The parts of a primary key, in the order they are written (and hashed). Each part must not
/// contain the character the next one starts with, which makes the concatenation unambiguous:
/// the host (lowercased here: hosts are case-insensitive) holds no `/`, and the path and query
/// (case-sensitive) start with `/`. The scheme goes before the host for `https` only, with a
/// separator the scheme cannot contain (`https://shop.example/...`; an `http` key is what it was
/// before the scheme was keyed); this and `docs/entry-format.md` are the places to change.
#[derive(Debug, Clone, Copy)]
struct KeyParts<'a> {
    https: bool,
    /// The host as [`key_host`] gives it, in two pieces (the second usually empty).
    host: &'a str,
    port: &'a str,
    path_and_query: &'a str,
}

impl<'a> KeyParts<'a> {
    fn of(https: bool, req: &'a RequestHeader) -> Self {
        let (host, port) = key_host(request_host(req));
        KeyParts {
            https,
            host,
            port,
            path_and_query: path(req),
        }
    }

    /// The parts of [`of_url`]'s key: the scheme from the host's prefix, if any.
    fn of_url(host: &'a str, path_and_query: &'a str) -> Self {
        let (https, host) = match host.strip_prefix(HTTPS_PREFIX) {
            Some(host) => (true, host),
            None => (false, host),
        };
        let (host, port) = key_host(host);
        KeyParts {
            https,
            host,
            port,
            path_and_query,
        }
    }

    /// Feeds the key's bytes to `write`, in order; `true` marks bytes to lowercase.
    #[inline]
    fn write(&self, mut write: impl FnMut(&[u8], bool)) {
        debug_assert!(!self.host.contains('/'), "a host with '/' reached the key");
        if self.https {
            write(HTTPS_PREFIX.as_bytes(), false);
        }
        write(self.host.as_bytes(), true);
        if !self.port.is_empty() {
            write(self.port.as_bytes(), true);
        }
        if !self.path_and_query.starts_with('/') {
            // `?q` of `http://a.example?q`: its path is empty, which means `/`
            write(b"/", false);
        }
        write(self.path_and_query.as_bytes(), false);
    }

    /// The key's text, in one allocation.
    fn text(&self) -> String {
        let mut text = Vec::with_capacity(
            HTTPS_PREFIX.len() + self.host.len() + self.port.len() + self.path_and_query.len() + 1,
        );
        self.write(|bytes, lowercase| {
            let start = text.len();
            text.extend_from_slice(bytes);
            if lowercase {
                text[start..].make_ascii_lowercase();
            }
        });
        // the parts are `&str`, and lowercasing ASCII keeps UTF-8 valid
        String::from_utf8(text).expect("key parts are UTF-8")
    }

    /// The hash of [`Self::text`], without building it: bytes to lowercase go through a small
    /// buffer on the stack, and feeding the hasher piece by piece gives the hash of the
    /// concatenation, as Pingora computes it from the key. The digest is Pingora's (the tests
    /// compare them); `blake2b_simd` computes it with AVX2 where the CPU has it.
    #[inline]
    fn hash(&self) -> HashBinary {
        let mut hasher = blake2b_simd::Params::new().hash_length(HASH_LEN).to_state();
        let mut lowered = [0u8; 64];
        self.write(|bytes, lowercase| {
            if !lowercase {
                hasher.update(bytes);
                return;
            }
            for piece in bytes.chunks(lowered.len()) {
                let lowered = &mut lowered[..piece.len()];
                lowered.copy_from_slice(piece);
                lowered.make_ascii_lowercase();
                hasher.update(&*lowered);
            }
        });
        let digest = hasher.finalize();
        let mut hash = [0; HASH_LEN];
        hash.copy_from_slice(digest.as_bytes());
        hash
    }
}

/// The host part of the key as sent (not yet lowercased): the `Host` header, or the URI authority
/// for HTTP/2.
pub fn request_host(req: &RequestHeader) -> &str {
    req.headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri.authority().map(|a| a.as_str()))
        .unwrap_or("")
}

/// `host` without an empty port (`shop.example:` is `shop.example`, RFC 3986 §6.2.3). Kept, the
/// colon would let an `http` key spell an `https` one: `Host: https:` (a valid authority) with the
/// target `//shop.example/x` is the text `https://shop.example/x`, the `https` page of another
/// host, stored by a plain-http client.
pub fn without_empty_port(host: &str) -> &str {
    host.trim_end_matches(':')
}

/// `host` as keys spell it, in two pieces to write one after the other: without an empty port
/// (see [`without_empty_port`]) and without the final dot of a fully qualified name
/// (`shop.example.` names `shop.example`, as nginx and the rules read it). The second piece is
/// empty unless a dot came out before a port (`shop.example.:8080` is `shop.example` and
/// `:8080`), so a key is usually fed in one piece. Kept, the dot would give one page two keys: a
/// purge or ban of `shop.example` would leave the copy stored through `Host: shop.example.`,
/// which a client could then still be served. Not lowercased here.
pub fn key_host(host: &str) -> (&str, &str) {
    if host.as_bytes().last().is_some_and(u8::is_ascii_alphabetic) {
        // a name without a port or a final dot, as most are: nothing to take out
        return (host, "");
    }
    let host = without_empty_port(host);
    // the port is the digits after the last `:` (read from the end: a host without a port
    // ends in a letter or `]`, and is known at its last byte)
    let bytes = host.as_bytes();
    let digits = bytes
        .iter()
        .rev()
        .take_while(|b| b.is_ascii_digit())
        .count();
    let colon = bytes.len() - digits;
    let (name, port) = if digits > 0
        && colon > 0
        && bytes[colon - 1] == b':'
        // an IPv6 literal keeps its colons inside brackets: its port follows `]`
        && !host[..colon - 1].ends_with(':')
    {
        host.split_at(colon - 1)
    } else {
        (host, "")
    };
    match name.strip_suffix('.') {
        Some(bare) if !bare.is_empty() => (bare, port),
        _ => (host, ""),
    }
}

/// `host` as keys spell it, lowercased, in one string: what host-scoped purges and bans match.
pub fn keyed_host_text(host: &str) -> String {
    let (name, port) = key_host(host);
    let mut text = String::with_capacity(name.len() + port.len());
    text.push_str(name);
    text.push_str(port);
    text.make_ascii_lowercase();
    text
}

/// The path and query part of the key: the target's; `/` when it has none (absolute-form
/// `http://a.example`). An absolute-form target with an empty path and a query
/// (`http://a.example?q`) is written with a `/` before it, by [`KeyParts::write`].
fn path(req: &RequestHeader) -> &str {
    req.uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/")
}

/// What an `https` key starts with (an `http` key has no prefix: keys stored before the scheme
/// was part of the key stay valid).
pub const HTTPS_PREFIX: &str = "https://";

/// The primary cache key for a host (a checked authority, as the request sent it; with
/// [`HTTPS_PREFIX`] in front for the `https` page, as `invalidation::target::Target::page`
/// writes it) and a path with its query
/// (starting with `/`), with its primary hash computed.
pub fn of_url(host: &str, path_and_query: &str) -> CacheKey {
    let parts = KeyParts::of_url(host, path_and_query);
    let mut key = CacheKey::new(parts.text(), "");
    key.set_primary_bin_override(parts.hash());
    key
}

/// The primary hash of [`of_url`]`(host, path_and_query)`, without building the key's text: an
/// invalidation by an unsafe method needs only the hash of each URL it covers (two per POST).
pub fn url_hash(host: &str, path_and_query: &str) -> HashBinary {
    KeyParts::of_url(host, path_and_query).hash()
}

/// The primary hash of the request: see [`KeyParts::hash`].
fn primary_hash(https: bool, req: &RequestHeader) -> HashBinary {
    KeyParts::of(https, req).hash()
}

/// The hash a variant of a URL is stored under (Pingora's combined hash of the primary hash and
/// the variance), without building a key for it: the fast path asks for it on every variant hit.
pub fn variant_bin(primary: HashBinary, variance: HashBinary) -> HashBinary {
    struct Variant(HashBinary, HashBinary);
    impl CacheHashKey for Variant {
        fn primary_bin(&self) -> HashBinary {
            self.0
        }
        fn variance_bin(&self) -> Option<HashBinary> {
            Some(self.1)
        }
        fn user_tag(&self) -> &str {
            ""
        }
    }
    Variant(primary, variance).combined_bin()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(host: &str, path: &[u8]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", path, None).unwrap();
        req.insert_header("host", host).unwrap();
        req
    }

    #[test]
    fn the_key_is_the_lowercased_host_then_path_and_query_hashed_as_pingora_does() {
        let req = request("Example.TEST:8080", b"/A/b?Q=1");
        let mut kept = RequestKey::default();
        let key = kept.get(&req);
        assert_eq!(key.primary_key(), b"example.test:8080/A/b?Q=1");
        let unhashed = CacheKey::new("example.test:8080/A/b?Q=1", "");
        assert_eq!(key.primary_bin(), unhashed.primary_bin());
        assert_eq!(key.combined_bin(), unhashed.combined_bin());
        let same_url = of_url(request_host(&req), "/A/b?Q=1");
        assert_eq!(same_url.primary_key(), key.primary_key());
        assert_eq!(same_url.primary_bin(), key.primary_bin());
    }

    #[test]
    fn an_empty_port_is_keyed_as_none_and_cannot_spell_the_https_prefix() {
        let mut hostile = RequestKey::default();
        let hostile_req = request("https:", b"//shop.example/x");
        assert_eq!(
            hostile.get(&hostile_req).primary_key(),
            b"https//shop.example/x"
        );
        let https = of_url("https://shop.example", "/x");
        assert_eq!(https.primary_key(), b"https://shop.example/x");
        assert_ne!(hostile.primary_bin(&hostile_req), https.primary_bin());
        let mut plain = RequestKey::default();
        let mut empty_port = RequestKey::default();
        assert_eq!(
            plain.primary_bin(&request("shop.example", b"/y")),
            empty_port.primary_bin(&request("Shop.Example:", b"/y"))
        );
        assert_eq!(
            of_url("shop.example:", "/y").primary_bin(),
            of_url("shop.example", "/y").primary_bin()
        );
    }

    #[test]
    fn a_fully_qualified_hosts_final_dot_is_keyed_as_none() {
        for (sent, keyed) in [
            ("Shop.Example.", "shop.example/y"),
            ("shop.example.:8080", "shop.example:8080/y"),
            ("shop.example.:", "shop.example/y"),
            ("https://shop.example.", "https://shop.example/y"),
            // one dot only, and never the whole name
            ("shop.example..", "shop.example./y"),
            (".", "./y"),
            // IPv6 literals keep their colons, with a port or without
            ("[::1]:8080", "[::1]:8080/y"),
            ("[::1]", "[::1]/y"),
            ("[fe80::1].", "[fe80::1]/y"),
        ] {
            let key = of_url(sent, "/y");
            assert_eq!(key.primary_key(), keyed.as_bytes(), "{sent}");
            assert_eq!(url_hash(sent, "/y"), key.primary_bin(), "{sent}");
            if !sent.starts_with("https") {
                let mut from_request = RequestKey::default();
                assert_eq!(
                    from_request.primary_bin(&request(sent, b"/y")),
                    key.primary_bin(),
                    "{sent}"
                );
            }
        }
        assert_eq!(keyed_host_text("Shop.Example.:8080"), "shop.example:8080");
        assert_eq!(keyed_host_text("SHOP.example."), "shop.example");
    }

    #[test]
    fn the_hash_computed_without_the_key_is_the_keys_hash() {
        // hosts shorter and longer than the lowering buffer, and one that is not lowercase
        let long_host = format!("{}.Example.test", "Sub".repeat(40));
        for host in ["a.test", "MiXeD.Example.TEST:81", long_host.as_str()] {
            let req = request(host, b"/Path?q=A");
            let unhashed = CacheKey::new(format!("{}/Path?q=A", host.to_ascii_lowercase()), "");
            let mut kept = RequestKey::default();
            assert_eq!(kept.primary_bin(&req), unhashed.primary_bin(), "{host}");
            assert_eq!(
                kept.get(&req).primary_key(),
                unhashed.primary_key(),
                "{host}"
            );
            assert_eq!(
                kept.get(&req).primary_bin(),
                unhashed.primary_bin(),
                "{host}"
            );
        }
    }

    #[test]
    fn the_hash_is_pingoras_for_keys_of_every_length_around_the_block_sizes() {
        // Blake2b works in 128-byte blocks and the lowering buffer is 64 bytes: keys from empty
        // paths to several blocks, hosts across the buffer's edges, both schemes
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~%";
        for host_len in [1, 63, 64, 65, 127, 128, 129, 200] {
            for path_len in [0, 1, 62, 63, 64, 126, 127, 128, 129, 255, 256, 257, 600] {
                let host: String = (0..host_len)
                    .map(|_| CHARS[next() as usize % CHARS.len()] as char)
                    .collect();
                let path: String = std::iter::once('/')
                    .chain((0..path_len).map(|_| CHARS[next() as usize % CHARS.len()] as char))
                    .collect();
                for https in [false, true] {
                    let req = request(&host, path.as_bytes());
                    let mut kept = RequestKey::default();
                    if https {
                        kept.set_https();
                    }
                    let text = format!(
                        "{}{}{path}",
                        if https { HTTPS_PREFIX } else { "" },
                        // (a host the generator ended with `.` is keyed without it)
                        keyed_host_text(&host)
                    );
                    let pingora = CacheKey::new(text, "").primary_bin();
                    assert_eq!(
                        kept.primary_bin(&req),
                        pingora,
                        "{host_len} {path_len} {https}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_urls_hash_alone_is_its_keys_hash() {
        for (host, path) in [
            ("Shop.Example:8080", "/a/b?c=/d"),
            ("https://Shop.Example", "/"),
            ("a.test", "?q"),
        ] {
            assert_eq!(
                url_hash(host, path),
                of_url(host, path).primary_bin(),
                "{host}{path}"
            );
        }
    }

    #[test]
    fn a_variant_hash_is_the_combined_hash_of_the_key_with_that_variance() {
        let mut key = of_url("a.test", "/page");
        let variance = [7u8; 16];
        let primary = key.primary_bin();
        key.set_variance_key(variance);
        assert_eq!(variant_bin(primary, variance), key.combined_bin());
    }

    #[test]
    fn the_request_key_is_computed_once() {
        // the context belongs to one request: later calls return what the first ones computed,
        // which shows they are not computed again (a real request does not change in between)
        let mut kept = RequestKey::default();
        let first = kept.primary_bin(&request("a.test", b"/first"));
        assert_eq!(first, of_url("a.test", "/first").primary_bin());
        assert_eq!(kept.primary_bin(&request("a.test", b"/other")), first);
        assert_eq!(kept.get(&request("a.test", b"/other")).primary_bin(), first);
        assert_eq!(
            kept.get(&request("a.test", b"/more")).primary_key(),
            b"a.test/other"
        );
        assert_eq!(kept.text(&request("a.test", b"/more")), b"a.test/other");
    }

    #[test]
    fn the_first_slash_of_a_key_ends_its_host_so_keys_do_not_collide() {
        // hosts as request_head admits them (no `/`), paths starting with `/`: every key splits
        // back into the parts it was built from, so two different requests never share one
        let requests = [
            ("shop.example", "/assets/v/app.js"),
            ("shop.example:8080", "/assets/v/app.js"),
            ("[::1]:80", "/a?b=/c"),
            ("", "/shop.example/x"),
            ("a.example", "/"),
        ];
        for (host, path) in requests {
            let key = of_url(host, path);
            let text = std::str::from_utf8(key.primary_key()).unwrap();
            let slash = text.find('/').unwrap();
            assert_eq!((&text[..slash], &text[slash..]), (host, path));
        }
    }

    #[test]
    fn an_absolute_target_with_an_empty_path_is_keyed_with_a_slash() {
        let mut req = RequestHeader::build("GET", b"http://a.example?q=1", None).unwrap();
        req.insert_header("host", "a.example").unwrap();
        let mut kept = RequestKey::default();
        assert_eq!(kept.get(&req).primary_key(), b"a.example/?q=1");
        assert_eq!(
            kept.primary_bin(&req),
            of_url("a.example", "/?q=1").primary_bin()
        );
    }

    #[test]
    fn the_text_needs_no_hash_and_the_key_built_for_it_gets_the_hash_later() {
        let req = request("A.test", b"/x?y");
        let mut kept = RequestKey::default();
        assert_eq!(kept.text(&req), b"a.test/x?y");
        assert!(
            kept.primary.is_none(),
            "the text alone must not hash the URL"
        );
        assert_eq!(
            kept.get(&req).primary_bin(),
            of_url("a.test", "/x?y").primary_bin()
        );
    }

    #[test]
    fn an_https_request_has_its_own_key_with_the_same_hash_either_way() {
        let req = request("A.test", b"/x?y");
        let mut http = RequestKey::default();
        let mut https = RequestKey::default();
        https.set_https();
        assert_eq!(https.text(&req), b"https://a.test/x?y");
        assert_eq!(http.text(&req), b"a.test/x?y", "http keys are unchanged");
        let unhashed = CacheKey::new("https://a.test/x?y", "");
        let mut hashed_first = RequestKey::default();
        hashed_first.set_https();
        assert_eq!(hashed_first.primary_bin(&req), unhashed.primary_bin());
        assert_ne!(http.primary_bin(&req), unhashed.primary_bin());
        assert_eq!(
            of_url(&format!("{HTTPS_PREFIX}a.test"), "/x?y").primary_bin(),
            unhashed.primary_bin()
        );
    }
}
