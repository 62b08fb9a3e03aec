//! The stored head's HTTP/1.1 wire form, kept with the stored metadata for the proxy's fast path
//! (`proxy::fast_hit::pre_serialised` builds and sends it).
//!
//! Every fast hit of an object sends the same head but for `Age`, `Cache-Status` and `Via`.
//! Serialised once, on the object's first fast hit, it spares each later hit a header-map clone,
//! its edits, Pingora's serialisation and the drop. Objects never hit that way keep an empty
//! cell: one pointer. What a built one occupies is charged to the memory budget when its object
//! is stored ([`WireHead::charge_for`]).

use once_cell::race::OnceBox;

/// A head's wire form: the status line and the fields, each line ending in CRLF, without the
/// blank line, the per-answer fields, or `Connection` (Pingora's session adds it).
#[derive(Debug)]
pub struct WireHead {
    /// The settings it was built under (`proxy::fast_hit::pre_serialised`): built under others,
    /// it is not used.
    pub made_for: u64,
    /// Whether the fields include `Date` (when not, the session adds the current one).
    pub has_date: bool,
    /// The bytes.
    pub bytes: Box<[u8]>,
}

impl WireHead {
    /// What the wire head built from `header` occupies at most, charged to the memory budget
    /// with the object when it is stored, whether or not a fast hit ever builds it: the budget
    /// then stays a bound on what the tier holds. Every field as `name: value` CRLF, the status
    /// line, the `Content-Length` a hit adds when the origin sent none, the [`WireHead`] itself,
    /// and the allocator's rounding of both blocks (mimalloc's size classes: at most 1/8).
    pub fn charge_for(header: &pingora_http::ResponseHeader) -> usize {
        let fields: usize = header
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum();
        let reason = header.get_reason_phrase().map_or(0, str::len);
        let line = "HTTP/1.1 200 \r\n".len() + reason;
        let content_length = "content-length: 18446744073709551615\r\n".len();
        let bytes = fields + line + content_length;
        let block = std::mem::size_of::<WireHead>();
        bytes + bytes / 8 + block + block / 8 + 16
    }
}

/// A [`WireHead`] built on first use and kept with the metadata it was built from: a
/// revalidation's new metadata starts without one, and so does a copy (its head may then be
/// edited).
#[derive(Default)]
pub struct KeptWireHead(OnceBox<WireHead>);

impl KeptWireHead {
    /// The kept wire form, or `build`'s (kept when it is the first).
    pub fn get_or_init(&self, build: impl FnOnce() -> Option<WireHead>) -> Option<&WireHead> {
        if let Some(kept) = self.0.get() {
            return Some(kept);
        }
        let built = Box::new(build()?);
        Some(self.0.get_or_init(|| built))
    }

    /// The kept wire form, if built.
    pub fn get(&self) -> Option<&WireHead> {
        self.0.get()
    }
}

impl Clone for KeptWireHead {
    fn clone(&self) -> Self {
        KeptWireHead::default()
    }
}

impl std::fmt::Debug for KeptWireHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeptWireHead").field(&self.0.get()).finish()
    }
}
