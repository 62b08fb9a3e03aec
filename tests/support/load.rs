//! A steady load through a proxy: a few clients asking for a fixed set of URLs in a loop, each
//! answer checked against the body it must have, until stopped. For tests that change something
//! under traffic (a reload, a hand-over) and then count what failed.
//!
//! Clients keep connections alive, as browsers do, and so meet the race every HTTP/1.1 client
//! meets when a server closes an idle connection (here: a process handing its listeners over)
//! just as a request leaves on it. Like browsers (RFC 9112 §9.3.1), a GET that got no response
//! at all on such a connection is sent once more, on a new one; that retry is counted apart, and
//! a request whose retry fails too, or that gets a wrong status or body, is a failure.

use super::client::client_builder;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Clients running [`SteadyLoad::start`]'s loop.
pub struct SteadyLoad {
    stop: Arc<AtomicBool>,
    counts: Arc<LoadCounts>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What the clients saw.
#[derive(Debug, Default)]
pub struct LoadCounts {
    /// Requests answered with the expected status and body.
    pub ok: AtomicUsize,
    /// Requests sent again after their connection closed without an answer.
    pub retried: AtomicUsize,
    /// Requests that failed (after the retry), with what went wrong.
    pub failures: Mutex<Vec<String>>,
}

/// The totals once the load stopped.
#[derive(Debug)]
pub struct LoadReport {
    pub ok: usize,
    pub retried: usize,
    pub failures: Vec<String>,
}

impl SteadyLoad {
    /// `clients` tasks, each asking for every `(url, expected body)` in turn, forever.
    pub fn start(clients: usize, targets: Vec<(String, String)>) -> SteadyLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(LoadCounts::default());
        let targets = Arc::new(targets);
        let tasks = (0..clients)
            .map(|offset| {
                let (stop, counts, targets) = (stop.clone(), counts.clone(), targets.clone());
                tokio::spawn(async move {
                    let client = client_builder().build().expect("reqwest client");
                    let mut i = offset;
                    while !stop.load(Ordering::Relaxed) {
                        let (url, expected) = &targets[i % targets.len()];
                        i += 1;
                        match get_checked(&client, url, expected, &counts).await {
                            Ok(()) => counts.ok.fetch_add(1, Ordering::Relaxed),
                            Err(why) => {
                                counts
                                    .failures
                                    .lock()
                                    .unwrap()
                                    .push(format!("{url}: {why}"));
                                continue;
                            }
                        };
                    }
                })
            })
            .collect();
        SteadyLoad {
            stop,
            counts,
            tasks,
        }
    }

    /// Requests answered correctly so far.
    pub fn ok(&self) -> usize {
        self.counts.ok.load(Ordering::Relaxed)
    }

    /// Waits until `more` further requests have been answered correctly (at most `timeout`);
    /// returns whether they were.
    pub async fn wait_for(&self, more: usize, timeout: Duration) -> bool {
        let target = self.ok() + more;
        let deadline = tokio::time::Instant::now() + timeout;
        while self.ok() < target {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Stops the clients (each finishes the request it is in) and reports.
    pub async fn stop(self) -> LoadReport {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("load client panicked");
        }
        LoadReport {
            ok: self.counts.ok.load(Ordering::Relaxed),
            retried: self.counts.retried.load(Ordering::Relaxed),
            failures: std::mem::take(&mut *self.counts.failures.lock().unwrap()),
        }
    }
}

async fn get_checked(
    client: &reqwest::Client,
    url: &str,
    expected: &str,
    counts: &LoadCounts,
) -> Result<(), String> {
    let response = match client.get(url).send().await {
        Ok(response) => response,
        Err(e) if no_response(&e) => {
            counts.retried.fetch_add(1, Ordering::Relaxed);
            // a new connection: the pooled ones may all be closing
            let fresh = client_builder().build().expect("reqwest client");
            fresh
                .get(url)
                .send()
                .await
                .map_err(|e| format!("retry failed: {e:?}"))?
        }
        Err(e) => return Err(format!("{e:?}")),
    };
    let status = response.status();
    let body = response.text().await.map_err(|e| format!("body: {e:?}"))?;
    if status != 200 || body != expected {
        return Err(format!("status {status}, body {body:?}"));
    }
    Ok(())
}

/// The request got no response: the connection closed or was reset under it, or could not be
/// opened (a listener closing as the connection arrived).
fn no_response(e: &reqwest::Error) -> bool {
    e.is_request() || e.is_connect()
}
