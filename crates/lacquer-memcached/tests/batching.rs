//! Concurrent gets to one server, batched into pipelined multi-gets, over real memcached
//! processes: every caller gets its own key's bytes exactly (values of every size, some larger
//! than the client's read buffer, some missing), and a server frozen mid-batch costs only its own
//! keys a miss, within the operation timeout.

mod support;

use bytes::Bytes;
use lacquer_memcached::ketama::KetamaRing;
use lacquer_memcached::{Cluster, ClusterConfig};
use std::sync::Arc;
use std::time::Duration;
use support::*;

fn cluster(servers: &[&Memcached], pool_size: usize) -> Cluster {
    Cluster::new(&ClusterConfig {
        servers: servers_at(servers.iter().map(|m| m.addr())),
        pool_size,
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_millis(1000),
        failure_limit: 100,
        retry_after: Duration::from_secs(60),
        rehash_on_eject: false,
    })
}

/// The value stored under key `i`: sizes from empty to 100 KB, every byte value, protocol
/// look-alikes inside.
fn value_of(i: usize) -> Bytes {
    let len = match i % 5 {
        0 => 0,
        1 => 13,
        2 => 1_000,
        3 => 9_000,
        _ => 100_000 + i,
    };
    let mut value = binary_value(len).to_vec();
    value.extend_from_slice(format!("VA 3 O{i}\r\nMN\r\nkey-{i}").as_bytes());
    Bytes::from(value)
}

/// How many multi-gets (batches and single gets) server `index` was sent, and their keys.
fn batches_sent(cluster: &Cluster, index: usize) -> (u64, u64) {
    let stats = &cluster.server_reports()[index].stats.batch_keys;
    (stats.counts.iter().sum(), stats.sum)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_gets_to_one_server_each_get_their_own_bytes() {
    let server = Memcached::start();
    let cluster = Arc::new(cluster(&[&server], 2));
    const STORED: usize = 150;
    for i in 0..STORED {
        let key = format!("key-{i}");
        assert!(within(cluster.set_with(key.as_bytes(), key.as_bytes(), value_of(i), 60)).await);
    }
    // every stored key asked for twice at once, and keys never stored
    let mut gets = Vec::new();
    for round in 0..2 {
        for i in 0..STORED + 50 {
            let cluster = cluster.clone();
            gets.push(tokio::spawn(async move {
                let key = format!("key-{i}");
                (round, i, cluster.get(key.as_bytes()).await)
            }));
        }
    }
    let asked = gets.len() as u64;
    for get in gets {
        let (round, i, got) = within(get).await.unwrap();
        let expected = (i < STORED).then(|| value_of(i));
        assert!(got == expected, "key-{i} (round {round}): wrong bytes");
    }
    let (batches, keys) = batches_sent(&cluster, 0);
    assert!(
        batches < asked,
        "{asked} concurrent gets went out in {batches} multi-gets: none was batched"
    );
    assert!(keys <= asked, "{keys} keys sent for {asked} gets");
    assert_eq!(cluster.server_reports()[0].stats.errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_frozen_during_batches_costs_only_its_own_keys_a_miss() {
    let (a, b) = (Memcached::start(), Memcached::start());
    let servers = [&a, &b];
    let cluster = Arc::new(cluster(&servers, 2));
    let ring = KetamaRing::new(&[(a.addr().to_string(), 1), (b.addr().to_string(), 1)]);
    let keys: Vec<(String, usize)> = (0..120)
        .map(|i| {
            let key = format!("key-{i}");
            let server = ring.server_for(key.as_bytes()).unwrap();
            (key, server)
        })
        .collect();
    assert!(keys.iter().any(|(_, s)| *s == 0) && keys.iter().any(|(_, s)| *s == 1));
    for (i, (key, _)) in keys.iter().enumerate() {
        assert!(within(cluster.set_with(key.as_bytes(), key.as_bytes(), value_of(i), 60)).await);
    }
    b.signal("-STOP");
    let mut gets = Vec::new();
    for (i, (key, server)) in keys.iter().cloned().enumerate() {
        let cluster = cluster.clone();
        gets.push(tokio::spawn(async move {
            (i, server, cluster.get(key.as_bytes()).await)
        }));
    }
    for get in gets {
        // every get ends (the bound here is the test's patience, five op_timeouts)
        let (i, server, got) = within(get).await.unwrap();
        if server == 0 {
            assert!(
                got == Some(value_of(i)),
                "key-{i} on the live server: wrong bytes"
            );
        } else {
            assert_eq!(got, None, "key-{i} on the frozen server");
        }
    }
    let frozen = &cluster.server_reports()[1].stats;
    assert!(frozen.timeouts > 0, "the frozen server's batches timed out");
    assert_eq!(cluster.server_reports()[0].stats.errors, 0);
    b.signal("-CONT");
    // thawed, it answers again (its connections that timed out were not reused)
    let (key, _) = keys.iter().find(|(_, s)| *s == 1).unwrap();
    let i = keys.iter().position(|(k, _)| k == key).unwrap();
    assert!(within(cluster.get(key.as_bytes())).await == Some(value_of(i)));
}
