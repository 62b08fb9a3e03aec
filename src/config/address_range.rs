//! Client address ranges (`10.0.0.0/8`, `::1`), for access lists such as `cache.purge_from`.
//!
//! The prefix arithmetic is `ipnet`'s; this module adds what an access list needs on top: a
//! single address as a one-address range, errors that say which part is wrong, and IPv4
//! clients seen through a dual-stack listener matching IPv4 ranges.

use ipnet::IpNet;
use std::net::IpAddr;

/// An address and a prefix length: the addresses whose first `prefix` bits match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange(IpNet);

impl AddressRange {
    /// Parses `addr` (a single address) or `addr/prefix`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let not_an_address =
            || format!("\"{text}\" is not an IP address or range (e.g. 10.0.0.0/8)");
        let trimmed = text.trim();
        let Some((addr_text, prefix_text)) = trimmed.split_once('/') else {
            let addr: IpAddr = trimmed.parse().map_err(|_| not_an_address())?;
            return Ok(AddressRange(IpNet::from(addr)));
        };
        let addr: IpAddr = addr_text.parse().map_err(|_| not_an_address())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        prefix_text
            .parse::<u8>()
            .ok()
            .and_then(|prefix| IpNet::new(addr, prefix).ok())
            .map(AddressRange)
            .ok_or_else(|| format!("\"{text}\": the prefix length must be 0 to {max}"))
    }

    /// Whether `ip` is in the range. An IPv4 client seen as an IPv4-mapped IPv6 address (a
    /// dual-stack listener) matches IPv4 ranges.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.contains(&ip)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ranges_match_by_prefix() {
        let net = AddressRange::parse("10.1.0.0/16").unwrap();
        assert!(net.contains(ip("10.1.255.3")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(!net.contains(ip("::1")));
        let one = AddressRange::parse("127.0.0.1").unwrap();
        assert!(one.contains(ip("127.0.0.1")));
        assert!(!one.contains(ip("127.0.0.2")));
        assert!(one.contains(ip("::ffff:127.0.0.1")), "IPv4-mapped client");
        assert!(AddressRange::parse("0.0.0.0/0")
            .unwrap()
            .contains(ip("8.8.8.8")));
        let v6 = AddressRange::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12::1")));
        assert!(!v6.contains(ip("fe80::1")));
        assert!(AddressRange::parse("::1").unwrap().contains(ip("::1")));
    }

    #[test]
    fn bad_ranges_say_why() {
        assert!(AddressRange::parse("300.1.1.1")
            .unwrap_err()
            .contains("not an IP"));
        assert!(AddressRange::parse("10.0.0.0/33")
            .unwrap_err()
            .contains("0 to 32"));
        assert!(AddressRange::parse("::/129")
            .unwrap_err()
            .contains("0 to 128"));
        assert!(AddressRange::parse("localhost").is_err());
    }
}
