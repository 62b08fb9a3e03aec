//! libmemcached-compatible ketama consistent hashing for the shared memcached tier.
//!
//! Every Lacquer node must send a given cache key to the same memcached server,
//! and so should any other client of the same pool (PHP, Python `pylibmc`, C
//! programs: all built on libmemcached).  `pingora-ketama` cannot be used for
//! that: it is the nginx-style CRC32 continuum and places keys differently from
//! libmemcached.  This module reproduces libmemcached's
//! `MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED` ring (the classic libketama algorithm):
//!
//! * Server `i` with weight `w` out of a total `W` over `n` servers gets
//!   `floor(float(w / W) * 160 / 4 * n)` MD5 digests, computed in 32-bit float
//!   exactly as libmemcached does (160 points per server with equal weights).
//! * Digest `j` hashes `"host:port-j"`, or `"host-j"` when the port is the
//!   default 11211 (a libmemcached quirk), and yields 4 points: the
//!   little-endian `u32`s at bytes `4h..4h+4`, `h` in `0..4`.
//! * A key goes to the first point `>=` the little-endian `u32` of the first 4
//!   bytes of its MD5, wrapping to the first point.
//! * A weight of 0 counts as 1, as libmemcached does.
//!
//! Verified by `tests/vectors/ketama_libmemcached.json` (the real libmemcached
//! 1.1.4 through ctypes) and `tests/vectors/ketama_uhashring.json` (the Python
//! `uhashring` package, `hash_fn="ketama"`); `gen_ketama_vectors.py` beside them
//! made both.  uhashring agrees exactly with equal weights on non-default
//! ports; it differs from libmemcached (and this module) on servers at port
//! 11211 (it hashes the name as given, like the original libketama), on weight
//! 0 (no points), and on rare weight combinations where it uses exact integer
//! arithmetic `(40 * n * w) / W` instead of libmemcached's float rounding.
//!
//! Ties (two points with the same value, ~1e-5 chance per ring) are broken by
//! server order; libmemcached's unstable `qsort` leaves them unspecified.

use md5::{Digest, Md5};

/// The default memcached port, which libmemcached leaves out of point labels.
const DEFAULT_PORT: u16 = 11211;
/// Points per server at equal weight in libmemcached's weighted ketama.
const POINTS_PER_SERVER: f32 = 160.0;
/// Each MD5 digest of a point label yields this many points.
const POINTS_PER_HASH: usize = 4;

/// A consistent-hash ring over memcached servers, placing keys exactly as
/// libmemcached's weighted ketama does, so that all Lacquer nodes (and other
/// libmemcached clients) agree on which server holds a key, and adding or
/// removing one of N servers only moves about 1/N of the keys.
#[derive(Debug, Clone)]
pub struct KetamaRing {
    /// `(point, server index)`, sorted by point then index.
    points: Vec<(u32, u32)>,
    servers: Vec<String>,
}

impl KetamaRing {
    /// Builds the ring from `(name, weight)` pairs, where `name` is `"host:port"`
    /// exactly as the operator configured it: the host text is hashed, not a
    /// resolved address, so every node must use the same spelling.
    pub fn new(servers: &[(String, u32)]) -> KetamaRing {
        let n = servers.len();
        let total: u64 = servers.iter().map(|(_, w)| u64::from((*w).max(1))).sum();
        let mut points = Vec::new();
        for (index, (name, weight)) in servers.iter().enumerate() {
            let label = label_prefix(name);
            for j in 0..hashes_for(*weight, total, n) {
                let digest = Md5::digest(format!("{label}-{j}").as_bytes());
                for h in 0..POINTS_PER_HASH {
                    let point = u32::from_le_bytes(digest[4 * h..4 * h + 4].try_into().unwrap());
                    points.push((point, index as u32));
                }
            }
        }
        points.sort_unstable();
        KetamaRing {
            points,
            servers: servers.iter().map(|(name, _)| name.clone()).collect(),
        }
    }

    /// The server names in configuration order, so callers can map the index
    /// returned by [`KetamaRing::server_for`] to their own per-server clients.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// The index (into [`KetamaRing::servers`]) of the server that owns `key`,
    /// or `None` when the ring has no servers.
    pub fn server_for(&self, key: &[u8]) -> Option<usize> {
        self.server_for_excluding(key, |_| true)
    }

    /// Like [`KetamaRing::server_for`], but walks clockwise past points of
    /// servers for which `is_usable` is false, for the optional "rehash when a
    /// server is ejected" mode.  Returns `None` when no server is usable.
    ///
    /// With equal weights this places keys exactly as a ring rebuilt without
    /// the unusable servers (libmemcached's auto-eject); with unequal weights
    /// a rebuild would also rescale the remaining servers' points, so the
    /// placement of keys that were not on an ejected server stays put here
    /// while libmemcached would move a few of them.
    pub fn server_for_excluding(
        &self,
        key: &[u8],
        is_usable: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        // one server holds every key: no hash to compute (an MD5 per operation)
        if self.servers.len() == 1 {
            return Some(0).filter(|&index| is_usable(index));
        }
        let hash = key_hash(key);
        let start = self.points.partition_point(|&(point, _)| point < hash);
        let (wrapped, clockwise) = self.points.split_at(start);
        clockwise
            .iter()
            .chain(wrapped)
            .map(|&(_, index)| index as usize)
            .find(|&index| is_usable(index))
    }
}

/// The key's position on the ring: the first 4 bytes of its MD5, little-endian.
fn key_hash(key: &[u8]) -> u32 {
    let digest = Md5::digest(key);
    u32::from_le_bytes(digest[..4].try_into().unwrap())
}

/// libmemcached labels points `"host-j"` on port 11211, `"host:port-j"` otherwise.
fn label_prefix(name: &str) -> &str {
    match name.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>() == Ok(DEFAULT_PORT) => host,
        _ => name,
    }
}

/// How many digests (of 4 points each) a server gets, in libmemcached's float
/// arithmetic: `floor((float)(pct * 160 / 4 * (float)n + 1e-10))`.
fn hashes_for(weight: u32, total_weight: u64, server_count: usize) -> usize {
    let pct = weight.max(1) as f32 / total_weight as f32;
    let scaled = pct * POINTS_PER_SERVER / POINTS_PER_HASH as f32 * server_count as f32;
    // libmemcached adds 1e-10 in double and converts back to float, which is a
    // no-op at these magnitudes; it is kept to mirror the C expression.
    ((f64::from(scaled) + 1e-10) as f32).floor() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal-weight ring of `n` servers named like a real deployment.
    fn equal_ring(names: &[String]) -> KetamaRing {
        let servers: Vec<(String, u32)> = names.iter().map(|n| (n.clone(), 1)).collect();
        KetamaRing::new(&servers)
    }

    fn names(range: std::ops::Range<usize>) -> Vec<String> {
        range.map(|i| format!("10.9.0.{i}:11211")).collect()
    }

    fn test_keys(count: usize) -> Vec<Vec<u8>> {
        (0..count)
            .map(|i| format!("lacquer:GET:http://example.com/obj/{i}").into_bytes())
            .collect()
    }

    fn points_of(ring: &KetamaRing, index: usize) -> usize {
        ring.points.iter().filter(|p| p.1 as usize == index).count()
    }

    #[test]
    fn uhashring_vectors_match() {
        let checked = check_vectors(include_str!("../tests/vectors/ketama_uhashring.json"));
        assert_eq!(checked, 3 * 200);
    }

    #[test]
    fn libmemcached_vectors_match() {
        let checked = check_vectors(include_str!("../tests/vectors/ketama_libmemcached.json"));
        // 200 shared keys per ring, plus one point-label key per server.
        assert_eq!(checked, 9 * 200 + 38);
    }

    #[test]
    fn a_key_hashing_onto_a_point_belongs_to_that_point() {
        // "host-j" hashes exactly onto the first point of digest j of that
        // server (port 11211 is left out of labels), so lookup must pick it.
        let all = names(0..10);
        let ring = equal_ring(&all);
        for (i, name) in all.iter().enumerate() {
            let host = name.strip_suffix(":11211").unwrap();
            for j in 0..40 {
                let key = format!("{host}-{j}");
                assert_eq!(ring.server_for(key.as_bytes()), Some(i), "{key}");
            }
        }
    }

    /// Asserts every placement in a vector file; returns how many were checked.
    fn check_vectors(text: &str) -> usize {
        let doc = json::parse(text);
        let mut checked = 0;
        for ring in doc.get("rings").array() {
            let id = ring.get("id").str();
            let servers: Vec<(String, u32)> = ring
                .get("servers")
                .array()
                .iter()
                .map(|s| (s.at(0).str().to_string(), s.at(1).num() as u32))
                .collect();
            let kr = KetamaRing::new(&servers);
            for case in ring.get("cases").array() {
                let key = case.at(0).str();
                let want = case.at(1).str();
                let got = kr
                    .server_for(key.as_bytes())
                    .map(|i| kr.servers()[i].as_str());
                assert_eq!(got, Some(want), "ring {id}, key {key:?}");
                checked += 1;
            }
        }
        checked
    }

    #[test]
    fn equal_weights_give_160_points_and_zero_weight_counts_as_one() {
        let ring = equal_ring(&names(0..7));
        for i in 0..7 {
            assert_eq!(points_of(&ring, i), 160);
        }
        let ring = KetamaRing::new(&[("a:1".to_string(), 0), ("b:1".to_string(), 1)]);
        assert_eq!((points_of(&ring, 0), points_of(&ring, 1)), (160, 160));
    }

    #[test]
    fn float_rounding_matches_libmemcached() {
        // 2/25 * 200 is 16 exactly but 15.99999 in f32: libmemcached gives 15.
        assert_eq!(hashes_for(2, 25, 5), 15);
        assert_eq!(hashes_for(1, 3, 3), 40);
        assert_eq!(hashes_for(5, 11, 4), 72);
    }

    #[test]
    fn label_omits_only_the_default_port() {
        assert_eq!(label_prefix("10.0.0.1:11211"), "10.0.0.1");
        assert_eq!(label_prefix("10.0.0.1:11212"), "10.0.0.1:11212");
        assert_eq!(label_prefix("cache"), "cache");
        assert_eq!(label_prefix("cache:x"), "cache:x");
    }

    #[test]
    fn empty_ring_has_no_server() {
        let ring = KetamaRing::new(&[]);
        assert_eq!(ring.server_for(b"k"), None);
        assert!(ring.servers().is_empty());
    }

    #[test]
    fn adding_a_server_moves_about_one_nth_all_to_it() {
        let keys = test_keys(100_000);
        for n in [4usize, 5, 10] {
            let before = equal_ring(&names(0..n));
            let after = equal_ring(&names(0..n + 1));
            let mut moved = 0;
            for key in &keys {
                let (a, b) = (before.server_for(key), after.server_for(key));
                if a != b {
                    assert_eq!(b, Some(n), "a moved key must move to the new server");
                    moved += 1;
                }
            }
            assert_moved_fraction(moved, keys.len(), n);
        }
    }

    #[test]
    fn removing_a_server_moves_only_its_keys() {
        let keys = test_keys(100_000);
        for n in [4usize, 5, 10] {
            let all = names(0..n);
            let removed = n / 2;
            let mut rest = all.clone();
            rest.remove(removed);
            let before = equal_ring(&all);
            let after = equal_ring(&rest);
            let mut moved = 0;
            for key in &keys {
                let a = before.server_for(key).unwrap();
                let b = &after.servers()[after.server_for(key).unwrap()];
                if &all[a] != b {
                    assert_eq!(a, removed, "only keys of the removed server may move");
                    moved += 1;
                }
            }
            assert_moved_fraction(moved, keys.len(), n);
        }
    }

    fn assert_moved_fraction(moved: usize, total: usize, n: usize) {
        let fraction = moved as f64 / total as f64;
        let (lo, hi) = (0.5 / n as f64, 1.6 / n as f64);
        assert!(
            (lo..=hi).contains(&fraction),
            "n={n}: moved {fraction:.4}, expected within {lo:.4}..{hi:.4}"
        );
    }

    #[test]
    fn excluding_equals_rebuilding_without_the_server_at_equal_weight() {
        let all = names(0..5);
        let ring = equal_ring(&all);
        let dead = 3;
        let mut rest = all.clone();
        rest.remove(dead);
        let rebuilt = equal_ring(&rest);
        for key in test_keys(20_000) {
            let walked = ring.server_for_excluding(&key, |i| i != dead).unwrap();
            let want = &rebuilt.servers()[rebuilt.server_for(&key).unwrap()];
            assert_eq!(&all[walked], want);
        }
        assert_eq!(ring.server_for_excluding(b"k", |_| false), None);
        assert_eq!(ring.server_for_excluding(b"k", |i| i == 4), Some(4));
    }

    /// Just enough JSON to read the vector files, so no serde_json dependency.
    mod json {
        use std::collections::BTreeMap;

        #[derive(Debug)]
        pub enum Value {
            Str(String),
            Num(f64),
            Arr(Vec<Value>),
            Obj(BTreeMap<String, Value>),
        }

        impl Value {
            pub fn get(&self, key: &str) -> &Value {
                match self {
                    Value::Obj(map) => map.get(key).unwrap_or_else(|| panic!("no field {key}")),
                    other => panic!("not an object: {other:?}"),
                }
            }
            pub fn array(&self) -> &[Value] {
                match self {
                    Value::Arr(items) => items,
                    other => panic!("not an array: {other:?}"),
                }
            }
            pub fn at(&self, i: usize) -> &Value {
                &self.array()[i]
            }
            pub fn str(&self) -> &str {
                match self {
                    Value::Str(s) => s,
                    other => panic!("not a string: {other:?}"),
                }
            }
            pub fn num(&self) -> f64 {
                match self {
                    Value::Num(n) => *n,
                    other => panic!("not a number: {other:?}"),
                }
            }
        }

        pub fn parse(text: &str) -> Value {
            let mut p = Parser {
                s: text.as_bytes(),
                i: 0,
            };
            let v = p.value();
            p.ws();
            assert_eq!(p.i, p.s.len(), "trailing data");
            v
        }

        struct Parser<'a> {
            s: &'a [u8],
            i: usize,
        }

        impl Parser<'_> {
            fn ws(&mut self) {
                while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
                    self.i += 1;
                }
            }
            fn eat(&mut self, c: u8) -> bool {
                self.ws();
                let hit = self.s.get(self.i) == Some(&c);
                self.i += usize::from(hit);
                hit
            }
            fn value(&mut self) -> Value {
                self.ws();
                match self.s[self.i] {
                    b'"' => Value::Str(self.string()),
                    b'[' => {
                        self.i += 1;
                        let mut items = Vec::new();
                        while !self.eat(b']') {
                            items.push(self.value());
                            self.eat(b',');
                        }
                        Value::Arr(items)
                    }
                    b'{' => {
                        self.i += 1;
                        let mut map = BTreeMap::new();
                        while !self.eat(b'}') {
                            self.ws();
                            let key = self.string();
                            assert!(self.eat(b':'), "expected ':' at {}", self.i);
                            map.insert(key, self.value());
                            self.eat(b',');
                        }
                        Value::Obj(map)
                    }
                    _ => {
                        let start = self.i;
                        while self.i < self.s.len() && b"+-.eE0123456789".contains(&self.s[self.i])
                        {
                            self.i += 1;
                        }
                        let text = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                        Value::Num(
                            text.parse()
                                .unwrap_or_else(|_| panic!("bad number {text:?}")),
                        )
                    }
                }
            }
            fn string(&mut self) -> String {
                assert_eq!(self.s[self.i], b'"', "expected string at {}", self.i);
                self.i += 1;
                let mut out = Vec::new();
                loop {
                    let c = self.s[self.i];
                    self.i += 1;
                    match c {
                        b'"' => return String::from_utf8(out).expect("UTF-8 string"),
                        b'\\' => {
                            let e = self.s[self.i];
                            self.i += 1;
                            let c = match e {
                                b'n' => '\n',
                                b't' => '\t',
                                b'r' => '\r',
                                b'u' => {
                                    let hex = std::str::from_utf8(&self.s[self.i..self.i + 4]);
                                    self.i += 4;
                                    let code = u32::from_str_radix(hex.unwrap(), 16).unwrap();
                                    char::from_u32(code).expect("no surrogate pairs in vectors")
                                }
                                other => other as char,
                            };
                            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                        }
                        _ => out.push(c),
                    }
                }
            }
        }
    }
}
