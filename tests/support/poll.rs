//! Bounded waits for what happens in the background of a test (a request reaching the origin, a
//! line in the proxy's log): a condition polled until it holds or a deadline passes. The caller
//! asserts on the returned `bool`, so a wait that runs out fails the test with its own message.

use std::time::{Duration, Instant};

/// How often [`poll_until`] and [`poll_until_async`] look again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Blocks the thread, checking `done` every [`POLL_INTERVAL`], until it returns `true` (then
/// `true`) or `timeout` has passed (then `false`).
pub fn poll_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// [`poll_until`] for `#[tokio::test]`s: sleeps on tokio's timer, so the test's runtime keeps
/// running its other tasks meanwhile.
pub async fn poll_until_async(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Awaits `future` for `bound` at most; past it the test fails, naming `what` never happened.
/// For the attack files' waits on answers and fills, whose bounds are generous enough that only
/// a hang reaches them.
pub async fn within<T>(
    bound: Duration,
    what: &str,
    future: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(bound, future).await {
        Ok(output) => output,
        Err(_) => panic!("never happened within {bound:?}: {what}"),
    }
}
