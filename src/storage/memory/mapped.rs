//! Large bodies in pages of their own: a fill whose declared length is at least
//! [`MAPPED_FROM`] is copied into an anonymous memory mapping of that length rather than into the
//! allocator's heap, and the stored body is slices of it. When the object is evicted and its last
//! reader is done, the mapping is unmapped and its pages go back to the system at once.
//!
//! Why: under churn of large objects the allocator's heap keeps what evicted bodies leave behind
//! in partly used spans of several size classes, freed in another order than they were allocated;
//! RSS stood about 1.17 times the bytes the tier held at the peak (docs/benchmarks.md, "Issue 18
//! item 6"). The C library's `malloc` does the same for blocks over its `M_MMAP_THRESHOLD`
//! (128 KiB by default) for the same reason. What it costs: an `mmap` and a `munmap` per large
//! object stored, on the miss path only, and pages that come zeroed from the kernel where the
//! heap would have reused written ones. They are faulted in chunk by chunk as the body arrives,
//! one `madvise` per chunk rather than one fault per page, and not at the `mmap`: an origin that
//! declares a large body and sends it slowly holds only what it has sent. A hit reads the same
//! `Bytes` as before.
//!
//! Each mapping is one of the process's memory areas, of which the kernel allows
//! `vm.max_map_count` (65,530 by default); running out would make every later `mmap` fail,
//! the allocator's and thread stacks' included. Mapped bodies may take at most a quarter of
//! that count ([`MappingBudget`]); beyond it, bodies go to the heap as smaller ones do.

use bytes::Bytes;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Declared body lengths from which a fill's body gets a mapping of its own. Smaller bodies share
/// the allocator's pages, where a mapping's page rounding and its two system calls would cost
/// more than the fragmentation they save.
const MAPPED_FROM: usize = 64 * 1024;

/// How many mappings bodies may hold at once, so that a cache of many large objects (or an
/// origin sending them on purpose) cannot use up the process's memory areas.
pub(super) struct MappingBudget {
    live: AtomicUsize,
    limit: usize,
}

impl MappingBudget {
    const fn new(limit: usize) -> Self {
        MappingBudget {
            live: AtomicUsize::new(0),
            limit,
        }
    }

    /// The budget every fill shares: a quarter of `vm.max_map_count`.
    fn process() -> &'static MappingBudget {
        static BUDGET: OnceLock<MappingBudget> = OnceLock::new();
        BUDGET.get_or_init(|| {
            let max_map_count = std::fs::read_to_string("/proc/sys/vm/max_map_count")
                .ok()
                .and_then(|text| text.trim().parse::<usize>().ok())
                .unwrap_or(65_530);
            MappingBudget::new(max_map_count / 4)
        })
    }

    /// Takes one mapping from the budget; `false` when none is left.
    fn take(&self) -> bool {
        if self.live.fetch_add(1, Ordering::Relaxed) < self.limit {
            true
        } else {
            self.live.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }

    fn give_back(&self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An anonymous private mapping, unmapped on drop: the owner of a mapped body's `Bytes`.
struct Mapping {
    budget: &'static MappingBudget,
    start: NonNull<u8>,
    /// The bytes mapped and the body may use (its declared length; the kernel rounds the
    /// mapping up to whole pages, and `munmap` takes the same length).
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value alone; the writer writes only bytes no
// `Bytes` slice covers yet, and every slice handed out is read-only from then on.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `start` points to `len` readable bytes (zero-filled by the kernel)
        // for as long as `self` lives. `Bytes::from_owner` calls this once, before anything is
        // written, and keeps only the pointer.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `start` and `len` are what `mmap` returned and was asked for; no `Bytes`
        // refers to the mapping any more (this owner is dropped with the last one).
        unsafe {
            libc::munmap(self.start.as_ptr().cast(), self.len);
        }
        self.budget.give_back();
    }
}

/// Writes a body into a mapping of its declared length and hands out each written chunk as a
/// `Bytes` slice of it.
pub(super) struct MappedBody {
    /// The whole mapping as one `Bytes`, never read: chunks are sliced from it.
    whole: Bytes,
    /// Where the mapping starts, for writing (derived from `mmap`'s pointer, not from `whole`).
    start: NonNull<u8>,
    filled: usize,
}

// SAFETY: `start` points into the mapping `whole` keeps alive; see `Mapping`.
unsafe impl Send for MappedBody {}
unsafe impl Sync for MappedBody {}

impl MappedBody {
    /// A mapping for a body of `len` bytes, when it is large enough to have one of its own (at
    /// least [`MAPPED_FROM`]); `None` (the caller keeps the body on the heap) below that, when
    /// the budget of mappings is spent, or when the kernel refuses.
    pub(super) fn for_body(len: usize) -> Option<Self> {
        if len < MAPPED_FROM {
            return None;
        }
        Self::new(len)
    }

    /// Maps `len` bytes (its pages are faulted in as chunks are copied). `None` when `len` is 0,
    /// the budget of mappings is spent, or the kernel refuses.
    fn new(len: usize) -> Option<Self> {
        Self::within(MappingBudget::process(), len)
    }

    fn within(budget: &'static MappingBudget, len: usize) -> Option<Self> {
        if len == 0 || !budget.take() {
            return None;
        }
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
        // existing memory; the result is checked before use.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        let Some(start) = NonNull::new(start.cast::<u8>()).filter(|_| start != libc::MAP_FAILED)
        else {
            budget.give_back();
            return None;
        };
        let whole = Bytes::from_owner(Mapping { budget, start, len });
        Some(MappedBody {
            whole,
            start,
            filled: 0,
        })
    }

    /// A copy of `data` in the mapping, right after the previous one; `None` when it does not fit
    /// in what is left of the declared length.
    pub(super) fn copy(&mut self, data: &[u8]) -> Option<Bytes> {
        let end = self.filled.checked_add(data.len())?;
        if end > self.whole.len() {
            return None;
        }
        // SAFETY: `filled..end` is inside the mapping and no slice handed out covers it (each
        // covers an earlier range); `data` cannot overlap the mapping's unwritten part, which
        // nothing outside this writer can name.
        unsafe {
            let to = self.start.as_ptr().add(self.filled);
            populate(to, data.len());
            std::ptr::copy_nonoverlapping(data.as_ptr(), to, data.len());
        }
        let chunk = self.whole.slice(self.filled..end);
        self.filled = end;
        Some(chunk)
    }

    /// Everything written so far, as one `Bytes`.
    fn into_written(self) -> Bytes {
        self.whole.slice(..self.filled)
    }

    /// Whether part of the declared length was never written.
    pub(super) fn has_unused_room(&self) -> bool {
        self.filled < self.whole.len()
    }
}

/// `chunks` copied into one block the memory tier can keep: a mapping of its own from
/// [`MAPPED_FROM`] bytes, one heap allocation below. Bodies the tier stores other than through a
/// fill (promoted from the shared tier, assembled from a partial object's pieces) are kept the
/// way a fill's body is, so evicting them returns their memory the same way.
pub(crate) fn owned_block(chunks: &[Bytes]) -> Bytes {
    let len = chunks.iter().map(Bytes::len).sum();
    let Some(mut mapped) = MappedBody::for_body(len) else {
        return Bytes::from(chunks.concat());
    };
    for chunk in chunks {
        mapped
            .copy(chunk)
            .expect("the mapping has the chunks' length");
    }
    mapped.into_written()
}

/// Faults in the pages under `len` bytes from `at` in one system call, before the copy writes
/// them, rather than one fault per page (`MADV_POPULATE_WRITE`, Linux 5.14; on an older kernel
/// the call fails and the copy faults them in as it goes).
///
/// # Safety
/// `at..at + len` must be inside a writable mapping this process owns.
unsafe fn populate(at: *mut u8, len: usize) {
    static PAGE: OnceLock<usize> = OnceLock::new();
    let page = *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        size if size > 0 => size as usize,
        _ => 4096,
    });
    let from = at as usize & !(page - 1);
    let to = (at as usize + len).div_ceil(page) * page;
    libc::madvise(
        from as *mut libc::c_void,
        to - from,
        libc::MADV_POPULATE_WRITE,
    );
}

#[cfg(test)]
mod tests {
    use super::{owned_block, MappedBody, MappingBudget, MAPPED_FROM};
    use bytes::Bytes;

    /// The resident KiB of the mapping that holds `address`, from /proc/self/smaps.
    fn resident_kib_of_mapping_at(address: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((from, to)) = first.split_once('-') {
                if let (Ok(from), Ok(to)) = (
                    usize::from_str_radix(from, 16),
                    usize::from_str_radix(to, 16),
                ) {
                    inside = (from..to).contains(&address);
                    continue;
                }
            }
            if inside && line.starts_with("Rss:") {
                return line.split_whitespace().nth(1).unwrap().parse().unwrap();
            }
        }
        panic!("no mapping holds {address:#x}");
    }

    /// Whether any page of `len` bytes from `address` is mapped (`mincore` fails with ENOMEM
    /// when none of the range is).
    fn is_mapped(address: usize, len: usize) -> bool {
        let mut pages = vec![0u8; len.div_ceil(4096)];
        // SAFETY: mincore only reads the page tables and writes one byte per page into `pages`.
        unsafe { libc::mincore(address as *mut _, len, pages.as_mut_ptr()) == 0 }
    }

    #[test]
    fn chunks_are_consecutive_slices_of_one_mapping() {
        let mut body = MappedBody::new(11).unwrap();
        let hello = body.copy(b"hello ").unwrap();
        assert!(body.has_unused_room());
        let world = body.copy(b"world").unwrap();
        assert_eq!((&hello[..], &world[..]), (&b"hello "[..], &b"world"[..]));
        assert_eq!(hello.as_ptr() as usize + 6, world.as_ptr() as usize);
        assert!(!body.has_unused_room());
        assert!(body.copy(b"!").is_none(), "past the declared length");
        // the chunks outlive the writer
        drop(body);
        assert_eq!(&hello[..], b"hello ");
        assert_eq!(&world[..], b"world");
    }

    #[test]
    fn a_mapping_is_resident_as_far_as_written_and_unmapped_with_its_last_chunk() {
        const LEN: usize = 64 << 20;
        let mut body = MappedBody::new(LEN).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let first = body.copy(&chunk).unwrap();
        let start = first.as_ptr() as usize;
        // a slow origin that declared 64 MiB and sent 1 MiB holds about 1 MiB (a transparent
        // huge page, where the kernel uses them, may round it up to 2 MiB)
        let resident = resident_kib_of_mapping_at(start);
        assert!(
            (1024..8 * 1024).contains(&resident),
            "1 MiB written: {resident} KiB resident"
        );
        let mut chunks = vec![first];
        chunks.extend((1..64).map(|_| body.copy(&chunk).unwrap()));
        drop(body);
        assert!(resident_kib_of_mapping_at(start) >= (LEN >> 10) as u64);
        let kept = chunks[63].clone();
        drop(chunks);
        assert!(is_mapped(start, LEN), "one chunk keeps the whole mapping");
        assert_eq!(kept[..], chunk[..]);
        drop(kept);
        assert!(!is_mapped(start, LEN), "unmapped with the last chunk");
    }

    #[test]
    fn past_the_budget_bodies_are_not_mapped_until_one_is_unmapped() {
        static BUDGET: MappingBudget = MappingBudget::new(2);
        let mut first = MappedBody::within(&BUDGET, 4096).unwrap();
        let second = MappedBody::within(&BUDGET, 4096).unwrap();
        assert!(MappedBody::within(&BUDGET, 4096).is_none());
        let chunk = first.copy(b"kept").unwrap();
        drop(first);
        assert!(
            MappedBody::within(&BUDGET, 4096).is_none(),
            "a stored chunk still holds its mapping"
        );
        drop(chunk);
        let third = MappedBody::within(&BUDGET, 4096).unwrap();
        drop((second, third));
        assert_eq!(BUDGET.live.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    #[test]
    fn an_owned_block_is_the_chunks_in_one_piece_of_memory_of_its_own() {
        let big = Bytes::from(vec![1u8; 3 * MAPPED_FROM]);
        for chunks in [
            vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cd")],
            vec![
                big.slice(..MAPPED_FROM / 2),
                big.slice(MAPPED_FROM..2 * MAPPED_FROM),
            ],
        ] {
            let len = chunks.iter().map(Bytes::len).sum::<usize>();
            let block = owned_block(&chunks);
            assert_eq!(block.len(), len);
            assert_eq!(block[..], chunks.concat()[..]);
            // not a view of the sources: they can be freed
            for chunk in &chunks {
                let source = chunk.as_ptr() as usize..chunk.as_ptr() as usize + chunk.len();
                assert!(!source.contains(&(block.as_ptr() as usize)));
            }
            if len >= MAPPED_FROM {
                let start = block.as_ptr() as usize;
                drop(block);
                assert!(
                    !is_mapped(start, len),
                    "a large block is a mapping of its own"
                );
            }
        }
    }
}
