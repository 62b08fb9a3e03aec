//! Large bodies kept in a memory file (`memfd`), so that a hit hands them to the client's socket
//! with `sendfile(2)` instead of copying them through user space (issue 18 item 3: a 100 KB hit
//! spent 22 % of its CPU in the kernel copying the body in from the process). The file is mapped
//! read-only, and every chunk of the body is a [`Bytes`] over its part of the mapping, so the rest
//! of the code (ranges, the standard path, the shared tier) reads the body as before.
//!
//! The file's pages are the body's memory: an object is charged its body length whether the body
//! is on the heap or here, so `cache.memory_size` bounds both. Each file is one descriptor, so at
//! most a quarter of the process's open-file limit are open at once ([`BodyFile::create`] says
//! `None` past that, and the body stays on the heap): client connections keep the rest. A file is
//! closed when the last reference to its body goes: an object evicted while a client is still
//! being sent it stays readable until that send ends.

use bytes::Bytes;
use memmap2::Mmap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Memory files open now, against [`open_limit`].
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// How many memory files may be open at once: a quarter of the soft open-file limit, read once.
fn open_limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `limit` is a valid out-parameter for the call
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return 0;
        }
        usize::try_from(limit.rlim_cur / 4).unwrap_or(usize::MAX)
    })
}

/// Memory files open now (bodies held in them, by the tier or by sends still running).
pub fn open_files() -> usize {
    OPEN.load(Ordering::Relaxed)
}

/// A body's memory file: its descriptor (for `sendfile`) and its read-only mapping (for `Bytes`).
pub struct BodyFile {
    // the mapping is dropped before the file: field order
    map: Mmap,
    file: File,
}

impl BodyFile {
    /// A zero-filled memory file of `len` bytes, mapped; `None` when `len` is 0, when as many
    /// files as the open-file limit allows are open, or when the kernel refuses one.
    pub fn create(len: usize) -> Option<Arc<BodyFile>> {
        if len == 0 || OPEN.fetch_add(1, Ordering::Relaxed) >= open_limit() {
            if len != 0 {
                OPEN.fetch_sub(1, Ordering::Relaxed);
            }
            return None;
        }
        match Self::open(len) {
            Ok(file) => Some(Arc::new(file)),
            Err(_) => {
                OPEN.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }

    fn open(len: usize) -> io::Result<BodyFile> {
        // SAFETY: a valid C string and flags; the descriptor returned is ours alone
        let fd = unsafe { libc::memfd_create(c"lacquer-body".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64)?;
        // SAFETY: the file is this process's own memory file; its bytes change only through
        // `BodyFileWriter`, which writes each range before any `Bytes` over it exists
        let map = unsafe { Mmap::map(&file)? };
        Ok(BodyFile { map, file })
    }

    /// The body length (the file's size).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the file is empty (never: empty bodies get no file).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The descriptor to `sendfile` from.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl Drop for BodyFile {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A part of a body file, as the owner of a [`Bytes`].
struct FileRange {
    file: Arc<BodyFile>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for FileRange {
    fn as_ref(&self) -> &[u8] {
        &self.file.map[self.start..self.end]
    }
}

/// Fills a body file front to back, handing out each written part as a [`Bytes`] chunk.
pub struct BodyFileWriter {
    file: Arc<BodyFile>,
    filled: usize,
}

impl BodyFileWriter {
    /// A writer at the start of `file`.
    pub fn new(file: Arc<BodyFile>) -> Self {
        BodyFileWriter { file, filled: 0 }
    }

    /// Appends `data` and returns it as a chunk over the file; `None` (nothing written) when it
    /// would overrun the file or the write fails.
    pub fn append(&mut self, data: &[u8]) -> Option<Bytes> {
        let end = self.filled.checked_add(data.len())?;
        if end > self.file.len() {
            return None;
        }
        self.file.file.write_all_at(data, self.filled as u64).ok()?;
        let chunk = Bytes::from_owner(FileRange {
            file: self.file.clone(),
            start: self.filled,
            end,
        });
        self.filled = end;
        Some(chunk)
    }

    /// The file, once every byte of it is written.
    pub fn into_complete(self) -> Option<Arc<BodyFile>> {
        (self.filled == self.file.len()).then_some(self.file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_read_what_was_written_and_the_file_sends_it() {
        let file = BodyFile::create(10).expect("a memory file");
        let mut writer = BodyFileWriter::new(file);
        let a = writer.append(b"hello").unwrap();
        assert!(writer.append(b"too long!").is_none());
        let b = writer.append(b"world").unwrap();
        assert_eq!((&a[..], &b[..]), (&b"hello"[..], &b"world"[..]));
        let file = writer.into_complete().expect("complete");
        let mut read = vec![0; 10];
        file.file.read_exact_at(&mut read, 0).unwrap();
        assert_eq!(read, b"helloworld");
    }

    #[test]
    fn a_file_written_short_is_not_complete_and_closes_with_its_last_chunk() {
        let file = BodyFile::create(8).unwrap();
        let alive = Arc::downgrade(&file);
        let mut writer = BodyFileWriter::new(file);
        let chunk = writer.append(b"abc").unwrap();
        assert!(writer.into_complete().is_none());
        assert_eq!(&chunk[..], b"abc");
        assert!(alive.upgrade().is_some(), "the chunk keeps the file");
        drop(chunk);
        assert!(alive.upgrade().is_none(), "the last chunk closes the file");
    }
}
