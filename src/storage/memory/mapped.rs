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
//! that count ([`Budget::mappings`]); beyond it, bodies go to the heap as smaller ones do.
//!
//! A mapping is of a memory file (`memfd_create(2)`) when a descriptor is to be had, so that a
//! hit can hand the body to the client's socket with `sendfile(2)` ([`BodyFile`]): the kernel's
//! socket buffers then refer to the file's pages instead of a copy of the body made from user
//! memory for each client, the one cost of a large hit that was not Lacquer's own code
//! (docs/benchmarks.md, "Large hits on this machine": under 64 connections a 100 KB hit's
//! system time 25.2 -> 21.4 us at the median, a 1 MB hit's 228 -> 133 us, and no more runs at
//! twice the cost). The file's pages are the body's memory, charged as before; they go back to
//! the system when the mapping is unmapped and the descriptor closed, with the last reference
//! (a send in progress holds one: an object evicted while a client is sent it stays readable
//! until the send ends). Memory files may hold at most a quarter of the process's open-file
//! limit ([`Budget::files`]), so client connections keep the rest; beyond it a body gets an
//! anonymous mapping, sent by copy.

use crate::storage::object::Body;
use bytes::Bytes;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Declared body lengths from which a fill's body gets a mapping of its own. Smaller bodies share
/// the allocator's pages, where a mapping's page rounding and its two system calls would cost
/// more than the fragmentation they save.
const MAPPED_FROM: usize = 64 * 1024;

/// How many of a process-wide resource bodies may hold at once (memory areas, descriptors), so
/// that a cache of many large objects (or an origin sending them on purpose) cannot use them up.
pub(super) struct Budget {
    live: AtomicUsize,
    limit: usize,
}

impl Budget {
    const fn new(limit: usize) -> Self {
        Budget {
            live: AtomicUsize::new(0),
            limit,
        }
    }

    /// The mappings every fill shares: a quarter of `vm.max_map_count`.
    fn mappings() -> &'static Budget {
        static BUDGET: OnceLock<Budget> = OnceLock::new();
        BUDGET.get_or_init(|| {
            let max_map_count = std::fs::read_to_string("/proc/sys/vm/max_map_count")
                .ok()
                .and_then(|text| text.trim().parse::<usize>().ok())
                .unwrap_or(65_530);
            Budget::new(max_map_count / 4)
        })
    }

    /// The memory files every fill shares: a quarter of the soft open-file limit, as it was at
    /// the first large body.
    fn files() -> &'static Budget {
        static BUDGET: OnceLock<Budget> = OnceLock::new();
        BUDGET.get_or_init(|| {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `limit` is a valid out-parameter for the call
            let open_files = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
                0 => usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX),
                _ => 0,
            };
            Budget::new(open_files / 4)
        })
    }

    /// How many are held now.
    fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Takes one from the budget; `false` when none is left.
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

/// Memory files bodies hold now: for the operator's view (`/stats`).
pub fn memory_files() -> usize {
    Budget::files().live()
}

/// A mapping of a memory file, or an anonymous private one: unmapped on drop, and its file
/// closed. Shared by a mapped body's `Bytes` ([`SharedMapping`]) and its [`BodyFile`].
struct Mapping {
    budget: &'static Budget,
    start: NonNull<u8>,
    /// The bytes mapped and the body may use (its declared length; the kernel rounds the
    /// mapping up to whole pages, and `munmap` takes the same length).
    len: usize,
    /// The memory file mapped.
    file: Option<MemoryFile>,
}

/// A memory file's descriptor, closed and given back to the budget it was taken from on drop.
struct MemoryFile {
    fd: OwnedFd,
    budget: &'static Budget,
}

impl Drop for MemoryFile {
    fn drop(&mut self) {
        self.budget.give_back();
    }
}

// SAFETY: the mapping is plain memory owned by this value alone; the writer writes only bytes no
// `Bytes` slice covers yet, and every slice handed out is read-only from then on.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

/// The owner of a mapped body's `Bytes`: the mapping, shared with its [`BodyFile`].
struct SharedMapping(Arc<Mapping>);

impl AsRef<[u8]> for SharedMapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `start` points to `len` readable bytes (zero-filled by the kernel)
        // for as long as the mapping lives. `Bytes::from_owner` calls this once, before
        // anything is written, and keeps only the pointer.
        unsafe { std::slice::from_raw_parts(self.0.start.as_ptr(), self.0.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `start` and `len` are what `mmap` returned and was asked for; no `Bytes`
        // and no `BodyFile` refers to the mapping any more (this is dropped with the last).
        unsafe {
            libc::munmap(self.start.as_ptr().cast(), self.len);
        }
        self.budget.give_back();
    }
}

/// A stored body's memory file, whose bytes from its start are the whole body: a hit can send it
/// with `sendfile(2)` (`proxy::fast_hit::pre_serialised`). Holds the body's memory, as its
/// `Bytes` do.
#[derive(Clone)]
pub struct BodyFile(Arc<Mapping>);

impl BodyFile {
    /// The descriptor to send from.
    pub fn fd(&self) -> BorrowedFd<'_> {
        let file = self.0.file.as_ref().expect("a BodyFile maps a file");
        file.fd.as_fd()
    }

    /// The body's length (the file may be longer: never read past this).
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether the body is empty (never: empty bodies get no mapping).
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
}

impl std::fmt::Debug for BodyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyFile")
            .field("len", &self.0.len)
            .finish()
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
    /// The mapping, for the body's [`BodyFile`] when it maps a memory file.
    mapping: Arc<Mapping>,
    /// A copy did not fit: the body's chunks are not all the mapping's.
    overran: bool,
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

    /// Maps `len` bytes (its pages are faulted in as chunks are copied), of a memory file when
    /// one is to be had. `None` when `len` is 0, the budget of mappings is spent, or the kernel
    /// refuses.
    fn new(len: usize) -> Option<Self> {
        Self::within(Budget::mappings(), Budget::files(), len)
    }

    fn within(budget: &'static Budget, files: &'static Budget, len: usize) -> Option<Self> {
        if len == 0 || !budget.take() {
            return None;
        }
        let file = memory_file(files, len);
        let (flags, fd) = match &file {
            Some(file) => (libc::MAP_SHARED, file.fd.as_raw_fd()),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a new mapping at an address of the kernel's choosing, of this process's own
        // memory file or of nothing, touches no existing memory; the result is checked before use.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        let Some(start) = NonNull::new(start.cast::<u8>()).filter(|_| start != libc::MAP_FAILED)
        else {
            budget.give_back();
            return None;
        };
        let mapping = Arc::new(Mapping {
            budget,
            start,
            len,
            file,
        });
        let whole = Bytes::from_owner(SharedMapping(mapping.clone()));
        Some(MappedBody {
            whole,
            start,
            filled: 0,
            mapping,
            overran: false,
        })
    }

    /// A copy of `data` in the mapping, right after the previous one; `None` when it does not fit
    /// in what is left of the declared length.
    pub(super) fn copy(&mut self, data: &[u8]) -> Option<Bytes> {
        let end = self.filled.checked_add(data.len())?;
        if end > self.whole.len() {
            self.overran = true;
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

    /// The memory file whose bytes are the whole body, once every chunk written went into the
    /// mapping and filled it; `None` for an anonymous mapping.
    pub(super) fn file(&self) -> Option<BodyFile> {
        let whole = !self.overran && self.filled == self.whole.len();
        (whole && self.mapping.file.is_some()).then(|| BodyFile(self.mapping.clone()))
    }
}

/// A memory file of `len` bytes and its place in the `files` budget; `None` when the budget is
/// spent or the kernel refuses (the body is then mapped anonymously).
fn memory_file(files: &'static Budget, len: usize) -> Option<MemoryFile> {
    if !files.take() {
        return None;
    }
    // SAFETY: a valid C string and flags; the descriptor returned is this process's alone
    let fd = unsafe { libc::memfd_create(c"lacquer-body".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        files.give_back();
        return None;
    }
    let file = MemoryFile {
        // SAFETY: `fd` was just opened and nothing else owns it
        fd: unsafe { OwnedFd::from_raw_fd(fd) },
        budget: files,
    };
    // SAFETY: `file.fd` is a valid descriptor
    (unsafe { libc::ftruncate(file.fd.as_raw_fd(), len as libc::off_t) } == 0).then_some(file)
}

/// `chunks` copied into one block the memory tier can keep: a mapping of its own from
/// [`MAPPED_FROM`] bytes (with its memory file, when it has one), one heap allocation below.
/// Bodies the tier stores other than through a fill (promoted from the shared tier, assembled
/// from a partial object's pieces) are kept the way a fill's body is, so evicting them returns
/// their memory the same way, and hits send them the same way.
pub(crate) fn owned_body(chunks: &[Bytes]) -> Body {
    let len = chunks.iter().map(Bytes::len).sum();
    let Some(mut mapped) = MappedBody::for_body(len) else {
        return Body::from_chunks(vec![Bytes::from(chunks.concat())]);
    };
    for chunk in chunks {
        mapped
            .copy(chunk)
            .expect("the mapping has the chunks' length");
    }
    let file = mapped.file();
    Body::from_chunks(vec![mapped.into_written()]).with_file(file)
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
    use super::{owned_body, Budget, MappedBody, MAPPED_FROM};
    use bytes::Bytes;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;

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
        static BUDGET: Budget = Budget::new(2);
        static FILES: Budget = Budget::new(8);
        let mut first = MappedBody::within(&BUDGET, &FILES, 4096).unwrap();
        let second = MappedBody::within(&BUDGET, &FILES, 4096).unwrap();
        assert!(MappedBody::within(&BUDGET, &FILES, 4096).is_none());
        let chunk = first.copy(b"kept").unwrap();
        drop(first);
        assert!(
            MappedBody::within(&BUDGET, &FILES, 4096).is_none(),
            "a stored chunk still holds its mapping"
        );
        drop(chunk);
        let third = MappedBody::within(&BUDGET, &FILES, 4096).unwrap();
        drop((second, third));
        assert_eq!(BUDGET.live.load(Ordering::Relaxed), 0);
        assert_eq!(FILES.live.load(Ordering::Relaxed), 0, "their files closed");
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
            let body = owned_body(&chunks);
            assert_eq!(body.chunks().len(), 1);
            let block = body.chunks()[0].clone();
            assert_eq!(body.file().is_some(), len >= MAPPED_FROM);
            drop(body);
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

    /// `len` bytes of `file` from its start, read with `pread` (as `sendfile` reads them).
    fn file_bytes(file: &super::BodyFile, len: usize) -> Vec<u8> {
        let mut read = vec![0u8; len];
        // SAFETY: `read` has room for `len` bytes
        let n = unsafe { libc::pread(file.fd().as_raw_fd(), read.as_mut_ptr().cast(), len, 0) };
        assert_eq!(n, len as isize);
        read
    }

    #[test]
    fn a_body_filled_whole_has_a_file_holding_its_bytes_until_its_last_reference_goes() {
        static BUDGET: Budget = Budget::new(8);
        static FILES: Budget = Budget::new(8);
        let mut body = MappedBody::within(&BUDGET, &FILES, 10).unwrap();
        let a = body.copy(b"hello").unwrap();
        assert!(body.file().is_none(), "half written");
        let b = body.copy(b"world").unwrap();
        let file = body.file().expect("filled whole");
        assert_eq!(file.len(), 10);
        assert_eq!(file_bytes(&file, 10), b"helloworld");
        // the chunks are views of the file's pages
        assert_eq!((&a[..], &b[..]), (&b"hello"[..], &b"world"[..]));
        drop((body, a, b));
        assert_eq!(
            FILES.live.load(Ordering::Relaxed),
            1,
            "the file keeps it open"
        );
        assert_eq!(file_bytes(&file, 10), b"helloworld");
        drop(file);
        assert_eq!(FILES.live.load(Ordering::Relaxed), 0);
        assert_eq!(BUDGET.live.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_body_that_overran_or_stopped_short_has_no_file() {
        static BUDGET: Budget = Budget::new(8);
        static FILES: Budget = Budget::new(8);
        let mut short = MappedBody::within(&BUDGET, &FILES, 10).unwrap();
        short.copy(b"hello").unwrap();
        assert!(short.file().is_none());
        let mut over = MappedBody::within(&BUDGET, &FILES, 10).unwrap();
        over.copy(b"hello").unwrap();
        assert!(over.copy(b"world!").is_none(), "past the declared length");
        over.copy(b"world").unwrap();
        assert!(over.file().is_none(), "a chunk went elsewhere");
    }

    #[test]
    fn past_the_budget_of_files_bodies_are_mapped_without_one() {
        static BUDGET: Budget = Budget::new(8);
        static FILES: Budget = Budget::new(1);
        let mut first = MappedBody::within(&BUDGET, &FILES, 4).unwrap();
        let mut second = MappedBody::within(&BUDGET, &FILES, 4).unwrap();
        first.copy(b"abcd").unwrap();
        let kept = second.copy(b"efgh").unwrap();
        assert!(first.file().is_some());
        assert!(second.file().is_none(), "no descriptor left: anonymous");
        assert_eq!(&kept[..], b"efgh");
        drop(first);
        let mut third = MappedBody::within(&BUDGET, &FILES, 4).unwrap();
        third.copy(b"ijkl").unwrap();
        assert!(
            third.file().is_some(),
            "the first's descriptor was given back"
        );
    }
}
