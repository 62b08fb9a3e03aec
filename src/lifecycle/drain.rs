//! Draining: a stopping process lets the requests it has finish, then exits.
//!
//! Pingora's own sequence stops the listeners (SIGTERM, or a hand-over once the new process has
//! the sockets), sleeps a fixed grace period and then shuts its runtimes down, which drops every
//! task still running: a download in flight is cut the moment the sleep ends. Here every request
//! is counted while it lives ([`RequestInFlight`], held in the request context), and a watcher
//! thread ends the process as soon as, the listeners stopped, none is left, or when
//! `shutdown_timeout` has passed. Pingora's sleep is set just past `shutdown_timeout`, as a
//! backstop the watcher makes unreachable.
//!
//! What requests leave behind counts too: a fill's write to the shared tier runs in a task of
//! its own after the response is sent, and so do the deletes of fill leases. Cut by the exit,
//! the write would be lost and its lease left to hold every other node's requests for the URL
//! until it expires; so the watcher also waits for the work the caller counts as background
//! (each write is bounded by memcached's `op_timeout` per item, its second look at the bans by
//! three of the log's poll intervals while the log can be read; a write whose look finds the log
//! unreadable (memcached frozen or down) is judged once it can be read again, and waited for
//! until then; all of it by `shutdown_timeout`). An exit at
//! `shutdown_timeout` cuts the fills still running, which will never be written: their leases
//! are deleted first (`OnCut`), so the other nodes do not wait for them. The invalidation
//! service keeps reading the log meanwhile, so what is written during the drain is judged by
//! the purges made during it.

use pingora_core::server::ExecutionPhase;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// How often a draining process looks at the count.
const POLL: Duration = Duration::from_millis(20);

/// How long, once no request and no background task is left, the process lets the client
/// connections still served finish: an HTTP/2 connection sends the last frames of streams that
/// are over for the proxy (their request is no longer counted) from its own buffers, and Pingora
/// closes idle connections as the shutdown reaches them.
const CONNECTIONS_PATIENCE: Duration = Duration::from_secs(2);

/// The number of requests being handled by this process.
#[derive(Debug, Default)]
pub struct InFlightRequests(AtomicUsize);

impl InFlightRequests {
    /// A counter for the process's life (the proxy and the watcher share it).
    pub fn leak() -> &'static InFlightRequests {
        Box::leak(Box::default())
    }

    /// Counts a request until the returned guard is dropped.
    pub fn start(&'static self) -> RequestInFlight {
        self.0.fetch_add(1, Ordering::Relaxed);
        RequestInFlight(self)
    }

    /// Requests being handled now.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// One request counted in flight; dropped with the request context, on every exit path.
#[derive(Debug)]
pub struct RequestInFlight(&'static InFlightRequests);

impl Drop for RequestInFlight {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Release);
    }
}

/// What the watcher does before an exit that cuts requests still running: give up the fill
/// leases they hold in the shared tier (a blocking call, bounded by memcached's `op_timeout`).
pub type OnCut = Box<dyn Fn() + Send>;

/// A count the watcher reads from elsewhere: the work requests leave behind (the shared tier's
/// writes and lease deletes, counted by whoever spawns them), the client connections served.
pub type Count = Box<dyn Fn() -> u64 + Send>;

/// Starts the thread that ends the process once a shutdown has stopped the listeners and no
/// request and no `background` task is left, and the client `connections` still served have
/// closed (for at most [`CONNECTIONS_PATIENCE`] more); or when `timeout` has passed since,
/// after `on_cut`.
pub fn watch(
    mut phases: broadcast::Receiver<ExecutionPhase>,
    requests: &'static InFlightRequests,
    background: Count,
    connections: Count,
    on_cut: OnCut,
    timeout: Duration,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("drain".into())
        .spawn(move || loop {
            match phases.blocking_recv() {
                Ok(ExecutionPhase::ShutdownGracePeriod) => {
                    drain(requests, &background, &connections, &on_cut, timeout)
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        })
        .map(|_| ())
}

fn drain(
    requests: &InFlightRequests,
    background: &Count,
    connections: &Count,
    on_cut: &OnCut,
    timeout: Duration,
) -> ! {
    let started = Instant::now();
    log::info!(
        "draining: {} requests in flight and {} shared-tier writes, waiting up to {timeout:?}",
        requests.count(),
        background()
    );
    loop {
        // requests first: a request ending spawns its write before it stops being counted
        let left = requests.count();
        let writes = background();
        if left == 0 && writes == 0 {
            let settled = Instant::now();
            while connections() > 0
                && settled.elapsed() < CONNECTIONS_PATIENCE
                && started.elapsed() < timeout
            {
                std::thread::sleep(POLL);
            }
            log::info!(
                "drained after {:?} ({} client connections still open), exiting",
                started.elapsed(),
                connections()
            );
            std::process::exit(0);
        }
        if started.elapsed() >= timeout {
            log::warn!(
                "shutdown_timeout {timeout:?} reached with {left} requests in flight and \
                 {writes} shared-tier writes, exiting"
            );
            on_cut();
            std::process::exit(0);
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_until_its_guard_is_dropped() {
        let requests = InFlightRequests::leak();
        let first = requests.start();
        let second = requests.start();
        assert_eq!(requests.count(), 2);
        drop(first);
        assert_eq!(requests.count(), 1);
        drop(second);
        assert_eq!(requests.count(), 0);
    }
}
