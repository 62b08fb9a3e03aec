//! The pool's rules against a real memcached that fails: bounded connections, bounded time,
//! no connection reused after a failed, timed-out or cancelled call, one retry on a stale one.

mod support;

use bytes::Bytes;
use lacquer_memcached::{McError, ServerClient, ServerConfig};
use std::sync::Arc;
use std::time::Duration;
use support::*;

#[tokio::test]
async fn server_error_is_reported_and_its_connection_discarded() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 1);
    // memcached's default item size limit is 1 MB.
    let too_big = binary_value(2 << 20);
    let set = within(c.set(b"huge", too_big, 60)).await;
    assert!(matches!(set, Err(McError::ServerError(_))), "{set:?}");
    assert_eq!(c.open_connections(), 0);
    assert_eq!(within(c.get(b"huge")).await.unwrap(), None);
    assert_eq!(c.open_connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_tasks_share_a_bounded_pool() {
    let mc = Memcached::start();
    // generous timeouts: 2,000 round trips through 4 connections on a loaded CI machine
    let c = Arc::new(ServerClient::new(ServerConfig {
        addr: mc.addr(),
        pool_size: 4,
        connect_timeout: Duration::from_secs(2),
        op_timeout: Duration::from_secs(4),
    }));
    let tasks: Vec<_> = (0..50)
        .map(|t| {
            let c = c.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    let key = format!("t{t}:{i}");
                    let value = Bytes::from(format!("{t}/{i}").repeat(i * 50 + 1));
                    c.set(key.as_bytes(), value.clone(), 60).await.unwrap();
                    assert!(c.open_connections() <= 4);
                    assert_eq!(c.get(key.as_bytes()).await.unwrap(), Some(value));
                }
                let keys: Vec<String> = (0..20).map(|i| format!("t{t}:{i}")).collect();
                let all = c.get_multi(&keys).await.unwrap();
                assert!(all.iter().all(Option::is_some));
            })
        })
        .collect();
    for task in tasks {
        within(task).await.unwrap();
    }
    let open = c.open_connections();
    assert!((1..=4).contains(&open), "{open} connections open");
}

#[tokio::test]
async fn unreachable_server_fails_fast() {
    let (_socket, addr) = refusing_addr();
    let c = client(addr, 2);
    // A refused connection is reported as such, not waited out as a timeout.
    assert!(matches!(within(c.get(b"k")).await, Err(McError::Connect)));
    let set = within(c.set(b"k", Bytes::from_static(b"v"), 1)).await;
    assert!(matches!(set, Err(McError::Connect)));
    assert_eq!(c.open_connections(), 0);
}

#[tokio::test]
async fn killed_server_errors_then_recovers_after_restart() {
    let mut mc = Memcached::start();
    let port = mc.port;
    let c = client(mc.addr(), 2);
    within(c.set(b"k", Bytes::from_static(b"v"), 60))
        .await
        .unwrap();
    mc.kill();
    // The pooled connection is dead and reconnecting is refused.
    assert!(within(c.get(b"k")).await.is_err());
    assert!(within(c.add(b"k", Bytes::from_static(b"v"), 60))
        .await
        .is_err());
    assert!(within(c.delete(b"k")).await.is_err());
    assert_eq!(c.open_connections(), 0);
    let _mc = Memcached::start_on(port);
    // A fresh server: the old value is gone, and the client works again.
    assert_eq!(within(c.get(b"k")).await.unwrap(), None);
    within(c.set(b"k", Bytes::from_static(b"v2"), 60))
        .await
        .unwrap();
    assert_eq!(
        within(c.get(b"k")).await.unwrap(),
        Some(Bytes::from_static(b"v2"))
    );
}

#[tokio::test]
async fn restart_between_calls_is_absorbed_by_one_retry() {
    let mut mc = Memcached::start();
    let port = mc.port;
    let c = client(mc.addr(), 1);
    within(c.set(b"k", Bytes::from_static(b"v"), 60))
        .await
        .unwrap();
    mc.kill();
    let _mc = Memcached::start_on(port);
    // The pooled connection is stale; the retry on a fresh one succeeds.
    assert_eq!(within(c.get(b"k")).await.unwrap(), None);
    within(c.set(b"k", Bytes::from_static(b"v2"), 60))
        .await
        .unwrap();
    assert_eq!(c.open_connections(), 1);
    // add is not idempotent, so it is not retried: it reports the failure.
    drop(_mc);
    let mut _mc = Memcached::start_on(port);
    let add = within(c.add(b"k", Bytes::from_static(b"v"), 60)).await;
    assert!(matches!(add, Err(McError::Io(_))), "{add:?}");
    assert!(within(c.add(b"k", Bytes::from_static(b"v"), 60))
        .await
        .unwrap());
    // an entry writer's add, gets and cas are retried: each restart costs them nothing
    for round in 0..3 {
        drop(_mc);
        _mc = Memcached::start_on(port);
        match round {
            0 => assert!(within(c.add_retried(b"k", Bytes::from_static(b"e"), 60))
                .await
                .unwrap()),
            1 => {
                within(c.set(b"k", Bytes::from_static(b"e"), 60))
                    .await
                    .unwrap();
                drop(_mc);
                _mc = Memcached::start_on(port);
                assert_eq!(within(c.gets(b"k")).await.unwrap(), None);
            }
            _ => {
                within(c.set(b"k", Bytes::from_static(b"e"), 60))
                    .await
                    .unwrap();
                let (_, token) = within(c.gets(b"k")).await.unwrap().unwrap();
                drop(_mc);
                _mc = Memcached::start_on(port);
                // retried, and not sent: the token is of the run before the restart, which may
                // have given its number to another value (`a_token_given_before_the_server_...`)
                let cas = within(c.cas(b"k", Bytes::from_static(b"f"), 60, token)).await;
                assert_eq!(cas.unwrap(), lacquer_memcached::CasOutcome::Changed);
                assert_eq!(within(c.get(b"k")).await.unwrap(), None);
            }
        }
    }
}

#[tokio::test]
async fn frozen_server_times_out_and_its_connection_is_discarded() {
    let mc = Memcached::start();
    let c = ServerClient::new(ServerConfig {
        addr: mc.addr(),
        pool_size: 2,
        connect_timeout: Duration::from_millis(1000),
        op_timeout: Duration::from_millis(1000),
    });
    within(c.set(b"k", Bytes::from_static(b"v"), 60))
        .await
        .unwrap();
    mc.signal("-STOP");
    let frozen = within(c.get(b"k")).await;
    assert!(matches!(frozen, Err(McError::Timeout)), "{frozen:?}");
    assert_eq!(
        c.open_connections(),
        0,
        "a timed-out connection is not pooled"
    );
    // A caller cancelling mid-flight also discards the connection.
    let cancelled = tokio::time::timeout(Duration::from_millis(100), c.get(b"k")).await;
    assert!(cancelled.is_err());
    assert_eq!(
        c.open_connections(),
        0,
        "a cancelled connection is not pooled"
    );
    mc.signal("-CONT");
    let got = within(c.get(b"k")).await.unwrap();
    assert_eq!(got, Some(Bytes::from_static(b"v")));
    assert_eq!(c.open_connections(), 1);
}

/// `c.get(b"k")` run by a task of `rt`.
fn get_on(rt: &tokio::runtime::Runtime, c: &ServerClient) -> Option<Bytes> {
    rt.block_on(async { within(c.get(b"k")).await.unwrap() })
}

#[test]
fn a_connection_is_used_again_only_by_the_runtime_that_opened_it() {
    let mc = Memcached::start();
    let c = Arc::new(client(mc.addr(), 2));
    let (proxy, background) = (runtime(), runtime());
    proxy.block_on(async {
        within(c.set(b"k", Bytes::from_static(b"v"), 60))
            .await
            .unwrap()
    });
    let accepted = connections_accepted(mc.addr());
    // the other runtime's task opens its own connection: the proxy's one, idle, is not lent
    assert_eq!(get_on(&background, &c), Some(Bytes::from_static(b"v")));
    assert_eq!(c.open_connections(), 2);
    // (each count also counts its own stats connection)
    assert_eq!(connections_accepted(mc.addr()), accepted + 2);
    // from now on each runtime's tasks use their own, whichever was idle last
    for _ in 0..3 {
        assert_eq!(get_on(&proxy, &c), Some(Bytes::from_static(b"v")));
        assert_eq!(get_on(&background, &c), Some(Bytes::from_static(b"v")));
    }
    assert_eq!(c.open_connections(), 2);
    assert_eq!(connections_accepted(mc.addr()), accepted + 3);
}

#[test]
fn with_no_room_a_runtime_closes_another_runtimes_idle_connection_for_its_own() {
    let mc = Memcached::start();
    let c = Arc::new(client(mc.addr(), 1));
    let (proxy, background) = (runtime(), runtime());
    assert_eq!(get_on(&proxy, &c), None);
    let accepted = connections_accepted(mc.addr());
    for round in 1..=3 {
        assert_eq!(get_on(&background, &c), None);
        assert_eq!(get_on(&proxy, &c), None);
        // the bound holds: one open, each side replacing the other's
        assert_eq!(c.open_connections(), 1);
        assert_eq!(
            connections_accepted(mc.addr()),
            accepted + 3 * round,
            "round {round}: two new connections and the stats one"
        );
    }
    // many tasks of both runtimes at once: never more than the pool's one connection
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let c = c.clone();
            let rt = if i % 2 == 0 { &proxy } else { &background };
            rt.spawn(async move {
                for _ in 0..20 {
                    assert_eq!(within(c.get(b"k")).await.unwrap(), None);
                    assert!(c.open_connections() <= 1);
                }
            })
        })
        .collect();
    for task in tasks {
        proxy.block_on(task).unwrap();
    }
    assert_eq!(c.open_connections(), 1);
}
