//! The allocator the `lacquer` binary uses, and when memory the process has freed goes back to
//! the system.
//!
//! [`Mimalloc`] is mimalloc behind Rust's `GlobalAlloc`, asking for alignment only when a type
//! needs more than mimalloc gives every block. The `mimalloc` crate's own `MiMalloc` calls
//! `mi_malloc_aligned` for every allocation, whose fast path covers only blocks up to 1 KiB that
//! happen to be free at the right alignment; every larger one (request and response heads,
//! write buffers, boxed futures) took the generic aligned path: about 2,000 instructions of a
//! 33,000-instruction hit (`bench/hit_instructions.sh`, docs/benchmarks.md). Rust's own `System`
//! allocator makes the same choice between `malloc` and `posix_memalign`.
//!
//! The `lacquer` binary allocates with mimalloc (`src/main.rs`). mimalloc keeps a freed page for
//! its purge delay, in case it is wanted again, and hands it back to the system (`madvise`) only
//! when some thread next passes through the allocator's slow path after the delay. On a node
//! that goes quiet, nothing does: when 2,000 idle client connections closed, the worker threads
//! went back to sleep and the ~200 MB the connections had freed stayed resident for good
//! (`bench/idle_connections.sh`, docs/benchmarks.md "Memory").
//!
//! [`return_freed_memory`] sets mimalloc's purge delay from `server.memory_return_delay` and
//! starts one thread that, once per delay, asks mimalloc to purge what has stayed free that long.
//! Nothing on the request path changes: a busy node purges on its own, as before, and the
//! thread only finds work when the workers have stopped allocating. A zero delay purges every
//! page as it is freed, with no thread (more `madvise` calls and page faults under churn).
//!
//! What it cannot reach: a block freed by one worker thread on a page another worker owns goes
//! on the owner's list of remote frees, which only the owner processes, when it next allocates.
//! A worker that stays asleep keeps those pages resident until it runs again (any request does).
//! With 1,000 closed connections on two workers, 41 % to all of their memory came back; on one
//! worker, where no free is remote, all of it does (`tests/memory_return.rs`).

use libmimalloc_sys::{
    mi_collect, mi_free, mi_malloc, mi_malloc_aligned, mi_option_set, mi_option_t, mi_realloc,
    mi_realloc_aligned, mi_thread_init, mi_zalloc, mi_zalloc_aligned,
};
use std::alloc::{GlobalAlloc, Layout};
use std::os::raw::c_void;
use std::time::Duration;

/// The alignment every mimalloc block of at least this size has (`MI_MAX_ALIGN_SIZE`, 16 on
/// 64-bit targets; a smaller block is aligned to its size class, a multiple of 8).
const MI_MAX_ALIGN_SIZE: usize = 16;

/// mimalloc as the global allocator, with plain `mi_malloc` when the layout asks for no more
/// alignment than every block has (see the module doc for why this is not `mimalloc::MiMalloc`).
pub struct Mimalloc;

/// Whether a block of `size` bytes from plain `mi_malloc` is aligned enough for `align`: the
/// same rule as Rust's `System` allocator uses for `malloc`.
#[inline]
fn plain_is_aligned(size: usize, align: usize) -> bool {
    align <= MI_MAX_ALIGN_SIZE && align <= size
}

// SAFETY: every function forwards to mimalloc, which returns blocks of at least the requested
// size (or null), aligned as `plain_is_aligned` says or as the aligned call was asked; `mi_free`
// and the reallocations take any block mimalloc returned, aligned or not.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain_is_aligned(layout.size(), layout.align()) {
            mi_malloc(layout.size()) as *mut u8
        } else {
            mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain_is_aligned(layout.size(), layout.align()) {
            mi_zalloc(layout.size()) as *mut u8
        } else {
            mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi_free(ptr as *mut c_void)
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if plain_is_aligned(new_size, layout.align()) {
            mi_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
        }
    }
}

/// mimalloc's `mi_option_purge_delay` (milliseconds; `mimalloc.h`, the same number in mimalloc
/// 2 and 3), which libmimalloc-sys does not name.
const MI_OPTION_PURGE_DELAY: mi_option_t = 15;

/// Hands memory freed by the process back to the system once it has stayed free for `delay`
/// (at most about twice `delay` after it was freed, however quiet the process is).
///
/// Only meaningful when mimalloc is the global allocator, as in the `lacquer` binary; an
/// embedder with another allocator should not call it. Call it once, at start.
pub fn return_freed_memory(delay: Duration) {
    let millis = delay.as_millis().min(i32::MAX as u128) as std::os::raw::c_long;
    // SAFETY: setting an option is allowed at any time (mimalloc reads it on each use).
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, millis) };
    if delay.is_zero() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("memory-return".into())
        .spawn(move || {
            // SAFETY: initialises this thread's mimalloc heap, so that collecting it below
            // reaches the process-wide purge (an uninitialised heap is skipped).
            unsafe { mi_thread_init() };
            loop {
                std::thread::sleep(delay);
                // SAFETY: a non-forced collection of this thread's heap, which also purges the
                // pages every thread freed more than `delay` ago; safe from any thread.
                unsafe { mi_collect(false) };
            }
        });
    if let Err(e) = spawned {
        log::warn!("memory-return thread not started ({e}): freed memory returns only under load");
    }
}
