//! RFC 3986 authority syntax (§3.2) for `Host` and `:authority`: `host [ ":" port ]`, where the
//! host is a reg-name (which covers IPv4 dotted quads) or a bracketed IP-literal, and the port is
//! digits. No userinfo: RFC 9110 §4.2 removed it from `http` URIs, and Pingora already refuses
//! an `@`.
//!
//! This runs on every request, so a reg-name is checked in one pass over its bytes with a
//! 256-entry class table (the fast path's whole budget is ~32k instructions per hit; this is a
//! few per byte). Only the rare IP-literal goes through the standard library's IPv6 parser.
//!
//! Why it matters here: the host is the first part of the cache key, glued to the path. A host
//! that may not contain `/`, `?` or `#` cannot push part of a path into the key's host part, so
//! no two different requests share a key (see [`crate::proxy::cache_key`]).

/// What a byte may be in a reg-name (outside an IP-literal).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Not allowed anywhere in an authority outside an IP-literal.
    Invalid,
    /// unreserved / sub-delims: `A-Z a-z 0-9 - . _ ~ ! $ & ' ( ) * + , ; =`.
    Name,
    /// `%`: starts a pct-encoded octet (two hex digits follow).
    Percent,
    /// `:`: ends the host; digits follow.
    Colon,
}

const CLASSES: [Class; 256] = {
    let mut table = [Class::Invalid; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_alphanumeric() {
            table[b] = Class::Name;
        }
        b += 1;
    }
    let others = b"-._~!$&'()*+,;=";
    let mut i = 0;
    while i < others.len() {
        table[others[i] as usize] = Class::Name;
        i += 1;
    }
    table[b'%' as usize] = Class::Percent;
    table[b':' as usize] = Class::Colon;
    table
};

/// Whether `authority` is `host [ ":" port ]` in RFC 3986 syntax. An empty authority is valid
/// (RFC 9112 §3.2: the `Host` of a request whose target has none).
#[inline]
pub fn is_valid(authority: &[u8]) -> bool {
    if authority.first() == Some(&b'[') {
        return ip_literal_with_port(authority);
    }
    let mut i = 0;
    while i < authority.len() {
        match CLASSES[authority[i] as usize] {
            Class::Name => i += 1,
            Class::Percent => {
                if !authority
                    .get(i + 1..i + 3)
                    .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
                {
                    return false;
                }
                i += 3;
            }
            Class::Colon => return is_port(&authority[i + 1..]),
            Class::Invalid => return false,
        }
    }
    true
}

/// Whether `authority` names a host: valid ([`is_valid`]) and not empty. What a purge or ban's
/// host, a rule's host and a `Host` a rule sets must be (an empty authority is valid only as the
/// `Host` of a request whose target has none, which no key is made of by name).
pub fn names_a_host(authority: &[u8]) -> bool {
    !authority.is_empty() && is_valid(authority)
}

/// `port = *DIGIT` (RFC 3986 §3.2.3: it may be empty).
fn is_port(port: &[u8]) -> bool {
    port.iter().all(u8::is_ascii_digit)
}

/// `"[" ( IPv6address / IPvFuture ) "]" [ ":" port ]`.
fn ip_literal_with_port(authority: &[u8]) -> bool {
    let Some(close) = authority.iter().position(|&b| b == b']') else {
        return false;
    };
    let port_ok = match &authority[close + 1..] {
        [] => true,
        [b':', port @ ..] => is_port(port),
        _ => false,
    };
    port_ok && ip_literal(&authority[1..close])
}

/// The inside of an IP-literal.
fn ip_literal(literal: &[u8]) -> bool {
    match literal.first() {
        Some(b'v' | b'V') => ip_future(&literal[1..]),
        _ => std::str::from_utf8(literal)
            .ok()
            .is_some_and(|text| text.parse::<std::net::Ipv6Addr>().is_ok()),
    }
}

/// `IPvFuture` after its `v`: `1*HEXDIG "." 1*( unreserved / sub-delims / ":" )`.
fn ip_future(rest: &[u8]) -> bool {
    let Some(dot) = rest.iter().position(|&b| b == b'.') else {
        return false;
    };
    let (version, tail) = (&rest[..dot], &rest[dot + 1..]);
    !version.is_empty()
        && version.iter().all(u8::is_ascii_hexdigit)
        && !tail.is_empty()
        && tail
            .iter()
            .all(|&b| b == b':' || CLASSES[b as usize] == Class::Name)
}

#[cfg(test)]
mod tests {
    use super::is_valid;

    #[test]
    fn host_names_addresses_and_ports_are_valid() {
        for ok in [
            "shop.example",
            "Shop.Example:8080",
            "a-b_c~d.example",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[2001:db8::7]:443",
            "[::ffff:192.0.2.1]",
            "[v7.fe80::a+b]",
            "xn--bcher-kva.example",
            "%41.example",
            "example.com:",
            "",
            "!$&'()*+,;=",
        ] {
            assert!(is_valid(ok.as_bytes()), "{ok:?} should be valid");
        }
    }

    #[test]
    fn anything_that_could_reach_into_the_path_or_confuse_a_parser_is_invalid() {
        for bad in [
            "shop.example/assets",
            "shop.example?x",
            "shop.example#x",
            "user@shop.example",
            "shop.example\\evil",
            "shop example",
            "shop.example\t",
            "shop.example:80:81",
            "shop.example:8o",
            "shop.example:80/",
            "%4",
            "%zz.example",
            "[::1",
            "[::1]x",
            "[::1]:8a",
            "[not-ipv6]",
            "[v.x]",
            "[v7.]",
            "[vg.x]",
            "[]",
            "]",
            "sh\"op",
            "shop<>",
            "caf\u{e9}.example",
            "a\u{0}b",
            "a\rb",
            "a{b}",
            "a|b",
            "a^b",
            "a`b",
        ] {
            assert!(!is_valid(bad.as_bytes()), "{bad:?} should be invalid");
        }
    }
}
