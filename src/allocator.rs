//! When memory the process has freed goes back to the system.
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
//! With 1,000 closed connections, 60 % to all of their memory came back (`tests/memory_return.rs`).

use libmimalloc_sys::{mi_collect, mi_option_set, mi_option_t, mi_thread_init};
use std::time::Duration;

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
