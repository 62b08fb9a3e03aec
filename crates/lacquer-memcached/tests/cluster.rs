//! The cluster over real memcached processes: values placed with another key land on that key's
//! server, and a dead or frozen server is known to be failing after one operation, so a caller
//! spends one `op_timeout` on it, not one per operation.

mod support;

use bytes::Bytes;
use lacquer_memcached::ketama::KetamaRing;
use lacquer_memcached::{CasOutcome, Cluster, ClusterConfig};
use std::time::Duration;
use support::*;

fn cluster(servers: &[&Memcached], failure_limit: u32) -> Cluster {
    cluster_rehashing(servers, failure_limit, false)
}

fn cluster_rehashing(servers: &[&Memcached], failure_limit: u32, rehash: bool) -> Cluster {
    Cluster::new(&ClusterConfig {
        servers: servers_at(servers.iter().map(|m| m.addr())),
        pool_size: 4,
        connect_timeout: Duration::from_millis(200),
        op_timeout: Duration::from_millis(300),
        failure_limit,
        retry_after: Duration::from_secs(60),
        rehash_on_eject: rehash,
    })
}

/// Index (into `servers`) of the server ketama places `key` on, computed apart from the cluster.
fn server_of(servers: &[&Memcached], key: &str) -> usize {
    let ring = KetamaRing::new(
        &servers
            .iter()
            .map(|m| (m.addr().to_string(), 1))
            .collect::<Vec<_>>(),
    );
    ring.server_for(key.as_bytes()).unwrap()
}

/// A key placed on server `wanted`, and another one placed elsewhere.
fn keys_on(servers: &[&Memcached], wanted: usize) -> (String, String) {
    let on = (0..1000)
        .map(|i| format!("object-{i}"))
        .find(|k| server_of(servers, k) == wanted)
        .unwrap();
    let off = (0..1000)
        .map(|i| format!("lease-{i}"))
        .find(|k| server_of(servers, k) != wanted)
        .unwrap();
    (on, off)
}

#[tokio::test]
async fn values_placed_with_another_key_live_on_that_keys_server() {
    let (a, b, c) = (Memcached::start(), Memcached::start(), Memcached::start());
    let servers = [&a, &b, &c];
    let cluster = cluster(&servers, 3);
    let (object, lease) = keys_on(&servers, 1);
    let added = within(cluster.add_with(
        object.as_bytes(),
        lease.as_bytes(),
        Bytes::from_static(b"1"),
        60,
    ))
    .await;
    assert_eq!(added, Some(true));
    // the lease is on the object's server (read there directly), not where its own name hashes
    let direct = client(servers[1].addr(), 1);
    assert_eq!(
        within(direct.get(lease.as_bytes())).await.unwrap(),
        Some(Bytes::from_static(b"1"))
    );
    let elsewhere = server_of(&servers, &lease);
    let other = client(servers[elsewhere].addr(), 1);
    assert_eq!(within(other.get(lease.as_bytes())).await.unwrap(), None);
    assert_eq!(
        within(cluster.get_with(object.as_bytes(), lease.as_bytes())).await,
        Some(Bytes::from_static(b"1"))
    );
    assert_eq!(
        within(cluster.delete_with(object.as_bytes(), lease.as_bytes())).await,
        Some(true)
    );
    assert_eq!(within(direct.get(lease.as_bytes())).await.unwrap(), None);
    assert_eq!(
        within(cluster.delete_with(object.as_bytes(), lease.as_bytes())).await,
        Some(false),
        "a delete of what is not there says so"
    );
}

#[tokio::test]
async fn a_frozen_server_is_failing_after_one_timed_out_get_and_is_ejected() {
    let (a, b, c) = (Memcached::start(), Memcached::start(), Memcached::start());
    let servers = [&a, &b, &c];
    let cluster = cluster(&servers, 3);
    let (object, _) = keys_on(&servers, 2);
    within(cluster.set_with(
        object.as_bytes(),
        object.as_bytes(),
        Bytes::from_static(b"v"),
        60,
    ))
    .await;
    assert!(!cluster.server_failing(object.as_bytes()));
    c.signal("-STOP");
    // a get the frozen server swallows is a miss, and marks the server failing
    assert_eq!(within(cluster.get(object.as_bytes())).await, None);
    assert!(
        cluster.server_failing(object.as_bytes()),
        "one timed-out get must mark the server failing"
    );
    // concurrent gets (one batch and its followers) and then more: every timeout counts until
    // the server is ejected, after which its keys are misses without asking it
    for _ in 0..3 {
        let key = object.as_bytes();
        let got = within(async {
            tokio::join!(
                cluster.get(key),
                cluster.get(key),
                cluster.get(key),
                cluster.get(key)
            )
        })
        .await;
        assert_eq!(got, (None, None, None, None));
        if !cluster.ejected().is_empty() {
            break;
        }
    }
    assert_eq!(cluster.ejected(), vec![c.addr().to_string()]);
    assert!(cluster.server_failing(object.as_bytes()));
    // an add to an ejected server is not attempted: the caller learns it cannot coordinate
    assert_eq!(
        cluster
            .add_with(object.as_bytes(), b"lease", Bytes::from_static(b"1"), 60)
            .await,
        None
    );
    c.signal("-CONT");
}

#[tokio::test]
async fn a_timed_out_add_counts_against_the_server() {
    let (a, b) = (Memcached::start(), Memcached::start());
    let servers = [&a, &b];
    let cluster = cluster(&servers, 1);
    let (object, lease) = keys_on(&servers, 0);
    a.signal("-STOP");
    let added = within(cluster.add_with(
        object.as_bytes(),
        lease.as_bytes(),
        Bytes::from_static(b"1"),
        60,
    ))
    .await;
    assert_eq!(added, None);
    assert!(cluster.server_failing(object.as_bytes()));
    assert_eq!(
        cluster.ejected(),
        vec![a.addr().to_string()],
        "failure_limit = 1: one timed-out add ejects"
    );
    a.signal("-CONT");
}

/// The operations of a writer that replaces an entry only after comparing it (add, then gets
/// and cas) go to the placement key's server, and a dead server is `None` for each of them.
#[tokio::test]
async fn an_add_gets_and_cas_placed_with_another_key_act_on_that_keys_server() {
    let (a, mut b) = (Memcached::start(), Memcached::start());
    let servers = [&a, &b];
    let cluster = cluster(&servers, 3);
    let (object, other_key) = keys_on(&servers, 1);
    let key = format!("{other_key}:chunk");
    let (place, key) = (object.as_bytes(), key.as_bytes());
    let added = cluster.add_retried_with(place, key, Bytes::from_static(b"old"), 60);
    assert_eq!(within(added).await, Some(true));
    let again = cluster.add_retried_with(place, key, Bytes::from_static(b"x"), 60);
    assert_eq!(within(again).await, Some(false));
    let direct = client(servers[1].addr(), 1);
    assert_eq!(
        within(direct.get(key)).await.unwrap(),
        Some(Bytes::from_static(b"old"))
    );
    let (value, token) = within(cluster.gets_with(place, key))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(value, Bytes::from_static(b"old"));
    let swapped = cluster.cas_with(place, key, Bytes::from_static(b"new"), 60, token);
    assert_eq!(within(swapped).await, Some(CasOutcome::Stored));
    let stale = cluster.cas_with(place, key, Bytes::from_static(b"late"), 60, token);
    assert_eq!(within(stale).await, Some(CasOutcome::Changed));
    assert_eq!(
        within(direct.get(key)).await.unwrap(),
        Some(Bytes::from_static(b"new"))
    );
    b.kill();
    assert_eq!(within(cluster.gets_with(place, key)).await, None);
    let cas = cluster.cas_with(place, key, Bytes::from_static(b"x"), 60, token);
    assert_eq!(within(cas).await, None);
    let add = cluster.add_retried_with(place, key, Bytes::from_static(b"x"), 60);
    assert_eq!(within(add).await, None);
}

/// A claimant's add returns the CAS token of what it stored, and its compare-and-delete removes
/// the value only while it is still that one: not one written over it since, and not another
/// claimant's added after it was deleted. On the placement key's server; `None` once it is dead.
#[tokio::test]
async fn an_add_returns_its_token_and_a_delete_by_token_spares_a_value_written_since() {
    let (a, mut b) = (Memcached::start(), Memcached::start());
    let servers = [&a, &b];
    let cluster = cluster(&servers, 3);
    let (object, other_key) = keys_on(&servers, 1);
    let key = format!("{other_key}:fill");
    let (place, key) = (object.as_bytes(), key.as_bytes());
    let first = within(cluster.add_token_with(place, key, Bytes::from_static(b"A"), 60))
        .await
        .unwrap()
        .expect("the first add stores");
    let again = cluster.add_token_with(place, key, Bytes::from_static(b"B"), 60);
    assert_eq!(within(again).await, Some(None));
    let (_, read) = within(cluster.gets_with(place, key))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, first, "the add's token is the value's");
    // deleted, then added by another claimant: the first one's token does not delete it
    assert_eq!(within(cluster.delete_with(place, key)).await, Some(true));
    let second = within(cluster.add_token_with(place, key, Bytes::from_static(b"B"), 60))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(second, first);
    let stale = cluster.delete_cas_with(place, key, first);
    assert_eq!(within(stale).await, Some(CasOutcome::Changed));
    let direct = client(servers[1].addr(), 1);
    assert_eq!(
        within(direct.get(key)).await.unwrap(),
        Some(Bytes::from_static(b"B"))
    );
    let own = cluster.delete_cas_with(place, key, second);
    assert_eq!(within(own).await, Some(CasOutcome::Stored));
    let gone = cluster.delete_cas_with(place, key, second);
    assert_eq!(within(gone).await, Some(CasOutcome::Gone));
    b.kill();
    let add = cluster.add_token_with(place, key, Bytes::from_static(b"x"), 60);
    assert_eq!(within(add).await, None);
    assert_eq!(
        within(cluster.delete_cas_with(place, key, second)).await,
        None
    );
}

#[tokio::test]
async fn a_dead_server_is_failing_and_a_healthy_one_is_not() {
    let (a, mut b) = (Memcached::start(), Memcached::start());
    let servers = [&a, &b];
    let cluster = cluster(&servers, 3);
    let (on_b, _) = keys_on(&servers, 1);
    let (on_a, _) = keys_on(&servers, 0);
    b.kill();
    assert_eq!(within(cluster.get(on_b.as_bytes())).await, None);
    assert!(cluster.server_failing(on_b.as_bytes()));
    assert_eq!(within(cluster.get(on_a.as_bytes())).await, None);
    assert!(
        !cluster.server_failing(on_a.as_bytes()),
        "a miss on a live server is a miss, not a failure"
    );
}

#[tokio::test]
async fn a_value_the_server_refuses_is_not_stored_and_does_not_count_against_it() {
    let a = Memcached::start();
    let servers = [&a];
    let cluster = cluster(&servers, 1);
    // memcached's default item limit is 1 MiB: it answers SERVER_ERROR
    let too_large = Bytes::from(vec![b'x'; 2 << 20]);
    assert!(!within(cluster.set_with(b"big", b"big", too_large, 60)).await);
    assert!(
        !cluster.server_failing(b"big"),
        "a server that answered is not failing"
    );
    assert!(
        cluster.ejected().is_empty(),
        "failure_limit = 1, yet not ejected"
    );
    assert!(within(cluster.set_with(b"small", b"small", Bytes::from_static(b"v"), 60)).await);
}

/// With `rehash_on_eject`, a delete while the key's server is ejected goes to the server standing
/// in for it, but is reported for the owner, as skipped: the owner may come back with its old
/// copy, so a purge must not count it gone (its ban would be short-lived, and the old copy
/// served again once the ban is forgotten).
#[tokio::test]
async fn a_delete_while_the_owner_is_ejected_is_reported_skipped_for_the_owner() {
    let (a, b) = (Memcached::start(), Memcached::start());
    let servers = [&a, &b];
    let cluster = cluster_rehashing(&servers, 1, true);
    let (on_b, _) = keys_on(&servers, 1);
    let key = on_b.as_bytes();
    assert!(within(cluster.set_with(key, key, Bytes::from_static(b"old"), 60)).await);
    b.signal("-STOP");
    assert_eq!(within(cluster.get(key)).await, None);
    assert_eq!(cluster.ejected(), vec![b.addr().to_string()]);
    let (server, outcome) = within(cluster.delete_reporting(key)).await;
    assert_eq!(server, Some(1), "reported for the owner, not the stand-in");
    assert_eq!(outcome, lacquer_memcached::DeleteOutcome::Skipped);
    b.signal("-CONT");
    // the owner still holds what the delete could not reach
    let owner = client(b.addr(), 1);
    assert_eq!(
        within(owner.get(key)).await.ok().flatten(),
        Some(Bytes::from_static(b"old"))
    );
}
