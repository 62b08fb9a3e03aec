//! Draining: a stopping process lets the requests it has finish, then exits.
//!
//! Pingora's own sequence stops the listeners (SIGTERM, or a hand-over once the new process has
//! the sockets), sleeps a fixed grace period and then shuts its runtimes down, which drops every
//! task still running: a download in flight is cut the moment the sleep ends. Here every request
//! is counted while it lives ([`RequestInFlight`], held in the request context), and a watcher
//! thread ends the process as soon as, the listeners stopped, none is left, or when
//! `shutdown_timeout` has passed. Pingora's sleep is set just past `shutdown_timeout`, as a
//! backstop the watcher makes unreachable.

use pingora_core::server::ExecutionPhase;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// How often a draining process looks at the count.
const POLL: Duration = Duration::from_millis(20);

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

/// Starts the thread that ends the process once a shutdown has stopped the listeners and no
/// request is left (or `timeout` has passed since).
pub fn watch(
    mut phases: broadcast::Receiver<ExecutionPhase>,
    requests: &'static InFlightRequests,
    timeout: Duration,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("drain".into())
        .spawn(move || loop {
            match phases.blocking_recv() {
                Ok(ExecutionPhase::ShutdownGracePeriod) => drain(requests, timeout),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        })
        .map(|_| ())
}

fn drain(requests: &InFlightRequests, timeout: Duration) -> ! {
    let started = Instant::now();
    log::info!(
        "draining: {} requests in flight, waiting up to {timeout:?}",
        requests.count()
    );
    loop {
        let left = requests.count();
        if left == 0 {
            log::info!("drained after {:?}, exiting", started.elapsed());
            std::process::exit(0);
        }
        if started.elapsed() >= timeout {
            log::warn!(
                "shutdown_timeout {timeout:?} reached with {left} requests in flight, exiting"
            );
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
