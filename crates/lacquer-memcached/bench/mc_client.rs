//! Measures memcached client choices for the hit path: Lacquer's own pooled client, the same with
//! get batching, and Shopify's `async-memcached` 0.9 (no pool of its own: here a pool of the same
//! size around it). One runtime thread, like one Lacquer worker; `concurrency` tasks each loop
//! on gets of 1 KB values for `seconds`; reports gets per second.
//!
//! Run: `memcached -u nobody -l 127.0.0.1 -p 21411 -t 1 &` then
//! `cargo run --release -p lacquer-memcached --example mc_client -- 127.0.0.1:21411 64 5`
//! (the repository's `bench/mc_client.sh` does both, three rounds each, and prints medians).

use async_memcached::AsciiProtocol;
use bytes::Bytes;
use lacquer_memcached::batch::GetBatcher;
use lacquer_memcached::{ServerClient, ServerConfig};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEYS: usize = 1000;
const POOL: usize = 8;

fn key(i: usize) -> String {
    format!("mcbench:{i}")
}

/// A pool of `async-memcached` clients: it has none of its own.
struct AsyncMemcachedPool {
    clients: tokio::sync::Mutex<Vec<async_memcached::Client>>,
    permits: tokio::sync::Semaphore,
}

impl AsyncMemcachedPool {
    async fn get(&self, dsn: &str, k: &[u8]) -> Option<Vec<u8>> {
        let _permit = self.permits.acquire().await.unwrap();
        let pooled = self.clients.lock().await.pop();
        let mut client = match pooled {
            Some(c) => c,
            None => async_memcached::Client::new(dsn).await.unwrap(),
        };
        let value = client.get(k).await.unwrap().and_then(|v| v.data);
        self.clients.lock().await.push(client);
        value
    }

    /// One multi-get; values in key order.
    async fn get_multi(&self, dsn: &str, keys: &[Vec<u8>]) -> Option<Vec<Option<Bytes>>> {
        let _permit = self.permits.acquire().await.unwrap();
        let pooled = self.clients.lock().await.pop();
        let mut client = match pooled {
            Some(c) => c,
            None => async_memcached::Client::new(dsn).await.unwrap(),
        };
        let found = client.get_multi(keys).await.ok()?;
        self.clients.lock().await.push(client);
        Some(
            keys.iter()
                .map(|k| {
                    found
                        .iter()
                        .find(|v| v.key == *k)
                        .and_then(|v| v.data.clone().map(Bytes::from))
                })
                .collect(),
        )
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Ours,
    OursBatched,
    AsyncMemcached,
    AsyncMemcachedBatched,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr: SocketAddr = args
        .get(1)
        .map_or("127.0.0.1:21411", |s| s)
        .parse()
        .unwrap();
    let concurrency: usize = args.get(2).map_or(64, |s| s.parse().unwrap());
    let seconds: u64 = args.get(3).map_or(5, |s| s.parse().unwrap());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let config = || ServerConfig {
            addr,
            pool_size: POOL,
            connect_timeout: Duration::from_millis(100),
            op_timeout: Duration::from_millis(500),
        };
        let seed = ServerClient::new(config());
        let value = Bytes::from(vec![b'x'; 1024]);
        for i in 0..KEYS {
            seed.set(key(i).as_bytes(), value.clone(), 600)
                .await
                .unwrap();
        }
        for hot in [false, true] {
            for mode in [
                Mode::Ours,
                Mode::OursBatched,
                Mode::AsyncMemcached,
                Mode::AsyncMemcachedBatched,
            ] {
                let name = match mode {
                    Mode::Ours => "lacquer client, pool 8",
                    Mode::OursBatched => "lacquer client, pool 8, batched gets",
                    Mode::AsyncMemcached => "async-memcached 0.9, pool 8 around it",
                    Mode::AsyncMemcachedBatched => {
                        "async-memcached 0.9, pool 8 around it, batched gets"
                    }
                };
                let per_sec = run(mode, hot, config(), addr, concurrency, seconds).await;
                println!(
                    "{} | {} | {:.0} |",
                    if hot { "one hot key" } else { "1000 keys" },
                    name,
                    per_sec
                );
            }
        }
    });
}

async fn run(
    mode: Mode,
    hot: bool,
    config: ServerConfig,
    addr: SocketAddr,
    concurrency: usize,
    seconds: u64,
) -> f64 {
    let ours = Arc::new(ServerClient::new(config));
    let batcher = Arc::new(GetBatcher::new(POOL, 32));
    let theirs = Arc::new(AsyncMemcachedPool {
        clients: tokio::sync::Mutex::new(Vec::new()),
        permits: tokio::sync::Semaphore::new(POOL),
    });
    let dsn = format!("tcp://{addr}");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let (ours, batcher, theirs, dsn) =
            (ours.clone(), batcher.clone(), theirs.clone(), dsn.clone());
        let (stop, done) = (stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = t * 7919;
            while !stop.load(Ordering::Relaxed) {
                i = (i + 7919) % KEYS;
                let k = key(if hot { 0 } else { i });
                // the batcher's deadline for a queued get; each client bounds its own call
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
                let len = match mode {
                    Mode::Ours => ours.get(k.as_bytes()).await.unwrap().map(|v| v.len()),
                    Mode::OursBatched => batcher
                        .get(k.as_bytes(), deadline, |keys| {
                            let ours = ours.clone();
                            async move { ours.get_multi(&keys).await.ok() }
                        })
                        .await
                        .map(|v| v.len()),
                    Mode::AsyncMemcached => theirs.get(&dsn, k.as_bytes()).await.map(|v| v.len()),
                    Mode::AsyncMemcachedBatched => batcher
                        .get(k.as_bytes(), deadline, |keys| {
                            let (theirs, dsn) = (theirs.clone(), dsn.clone());
                            async move { theirs.get_multi(&dsn, &keys).await }
                        })
                        .await
                        .map(|v| v.len()),
                };
                assert_eq!(len, Some(1024));
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
