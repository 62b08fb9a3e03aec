//! The fields this proxy adds to every answer: `Cache-Status` (RFC 9211, as `cache.announce`
//! says) and our `Via` entry (RFC 9110 §7.6.3, when `proxy.via`). They go into a head
//! ([`add_to_head`]) or, after a head serialised ahead of time, out as wire lines
//! ([`write_lines`]): the same names, in the same case, with the same values either way.

use super::cache_status::CacheStatus;
use super::headers;
use crate::config::cache::Announce;
use crate::lifecycle::live::LiveSettings;
use pingora_error::Result;
use pingora_http::ResponseHeader;

/// Whether `Cache-Status` is announced, and if so whether a hit names its tier.
pub fn announced(live: &LiveSettings) -> Option<bool> {
    match live.config.cache.announce {
        Announce::Off => None,
        announce => Some(announce == Announce::Tier),
    }
}

/// Puts the fields into `head`: `Cache-Status` replaces one the head carries, our `Via` entry
/// follows the others.
pub fn add_to_head(
    live: &LiveSettings,
    status: &CacheStatus,
    version: http::Version,
    head: &mut ResponseHeader,
) -> Result<()> {
    if let Some(with_tier) = announced(live) {
        let value = status.header_value(&live.config.cache.status_name, with_tier);
        head.insert_header(headers::CACHE_STATUS, value)?;
    }
    if live.config.proxy.via {
        head.append_header(headers::VIA, live.via.for_version(version))?;
    }
    Ok(())
}

/// Appends the fields to `out` as wire lines (each ending in CRLF), as [`add_to_head`] would put
/// them into a head Pingora then serialises (which titles only a few standard names, not `Via`).
/// The head before them must carry no `Cache-Status` when it is announced.
pub fn write_lines(
    live: &LiveSettings,
    status: &CacheStatus,
    version: http::Version,
    out: &mut String,
) {
    if let Some(with_tier) = announced(live) {
        out.push_str(headers::CACHE_STATUS.1);
        out.push_str(": ");
        status.write_header_value(&live.config.cache.status_name, with_tier, out);
        out.push_str("\r\n");
    }
    if live.config.proxy.via {
        out.push_str(headers::VIA.1);
        out.push_str(": ");
        // rendered from `proxy.via_name`, checked to be an HTTP token at load: ASCII
        out.push_str(
            live.via
                .borrowed_for_version(version)
                .to_str()
                .unwrap_or_default(),
        );
        out.push_str("\r\n");
    }
}
