//! The operations of one server's client against a real memcached: values round trip byte for
//! byte, alone and pipelined, and keys memcached cannot carry never leave the client.

mod support;

use bytes::Bytes;
use lacquer_memcached::protocol::MAX_KEY_LEN;
use lacquer_memcached::{CasOutcome, CasToken, McError, ServerClient, ServerConfig};
use std::time::{Duration, Instant};
use support::*;

#[tokio::test]
async fn set_get_delete_round_trip_binary() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 2);
    let value = Bytes::from_static(b"a\r\nb\0c\r\nEN\r\nVA 3\r\n\0");
    within(c.set(b"k1", value.clone(), 60)).await.unwrap();
    assert_eq!(within(c.get(b"k1")).await.unwrap(), Some(value));
    within(c.set(b"k1", Bytes::new(), 0)).await.unwrap();
    assert_eq!(within(c.get(b"k1")).await.unwrap(), Some(Bytes::new()));
    assert!(within(c.delete(b"k1")).await.unwrap());
    assert!(!within(c.delete(b"k1")).await.unwrap());
    assert_eq!(within(c.get(b"k1")).await.unwrap(), None);
    assert_eq!(within(c.get(b"never-set")).await.unwrap(), None);
    assert_eq!(
        c.open_connections(),
        1,
        "sequential calls reuse one connection"
    );
}

#[tokio::test]
async fn get_multi_keeps_request_order() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 2);
    for k in ["m1", "m3", "m4"] {
        let v = Bytes::from(format!("value of {k}\r\n"));
        within(c.set(k.as_bytes(), v, 60)).await.unwrap();
    }
    let keys = ["m0", "m1", "m2", "m3", "m1", "m4", "m5"];
    let got = within(c.get_multi(&keys)).await.unwrap();
    let want: Vec<Option<Bytes>> = keys
        .iter()
        .map(|k| {
            ["m1", "m3", "m4"]
                .contains(k)
                .then(|| Bytes::from(format!("value of {k}\r\n")))
        })
        .collect();
    assert_eq!(got, want);
    let none: [&str; 0] = [];
    assert!(within(c.get_multi(&none)).await.unwrap().is_empty());
    let misses = within(c.get_multi(&["x1", "x2"])).await.unwrap();
    assert_eq!(misses, vec![None, None]);
    // The connection stayed in sync: a plain get still works on it.
    assert!(within(c.get(b"m3")).await.unwrap().is_some());
    assert_eq!(c.open_connections(), 1);
}

#[tokio::test]
async fn large_values_round_trip_alone_and_in_batches() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 1);
    let big = binary_value(900 * 1024);
    within(c.set(b"big", big.clone(), 60)).await.unwrap();
    assert_eq!(within(c.get(b"big")).await.unwrap(), Some(big.clone()));
    // 40 x 900 KB in one pipelined batch: more than the socket buffers hold.
    let keys: Vec<String> = (0..40).map(|i| format!("big{}", i % 2)).collect();
    within(c.set(b"big0", big.clone(), 60)).await.unwrap();
    let got = within(c.get_multi(&keys)).await.unwrap();
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v.as_ref(), (i % 2 == 0).then_some(&big), "index {i}");
    }
}

#[tokio::test]
async fn pipelined_batch_larger_than_socket_buffers_both_ways() {
    let mc = Memcached::start();
    let c = ServerClient::new(ServerConfig {
        addr: mc.addr(),
        pool_size: 1,
        connect_timeout: Duration::from_secs(1),
        op_timeout: Duration::from_secs(20),
    });
    // 60,000 requests of ~270 bytes (16 MB up) for 1 KB hits (60 MB down):
    // writing all requests before reading any reply would deadlock.
    let key = "K".repeat(MAX_KEY_LEN - 1);
    let value = binary_value(1000);
    within(c.set(key.as_bytes(), value.clone(), 60))
        .await
        .unwrap();
    let keys = vec![key.as_str(); 60_000];
    let got = tokio::time::timeout(Duration::from_secs(30), c.get_multi(&keys))
        .await
        .expect("hung")
        .unwrap();
    assert_eq!(got.len(), keys.len());
    assert!(got.iter().all(|v| v.as_ref() == Some(&value)));
}

#[tokio::test]
async fn add_only_stores_absent_keys() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 2);
    assert!(within(c.add(b"lease", Bytes::from_static(b"a"), 60))
        .await
        .unwrap());
    assert!(!within(c.add(b"lease", Bytes::from_static(b"b"), 60))
        .await
        .unwrap());
    assert_eq!(
        within(c.get(b"lease")).await.unwrap(),
        Some(Bytes::from_static(b"a"))
    );
    assert!(within(c.delete(b"lease")).await.unwrap());
    assert!(within(c.add(b"lease", Bytes::from_static(b"c"), 60))
        .await
        .unwrap());
}

#[tokio::test]
async fn add_retried_only_stores_absent_keys() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 2);
    let value = binary_value(70_000);
    assert!(within(c.add_retried(b"entry", value.clone(), 60))
        .await
        .unwrap());
    assert!(
        !within(c.add_retried(b"entry", Bytes::from_static(b"b"), 60))
            .await
            .unwrap()
    );
    assert_eq!(within(c.get(b"entry")).await.unwrap(), Some(value));
}

#[tokio::test]
async fn a_cas_replaces_only_the_value_its_gets_read() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 2);
    assert_eq!(within(c.gets(b"entry")).await.unwrap(), None);
    let first = Bytes::from_static(b"v1\r\nEN\r\n\0");
    within(c.set(b"entry", first.clone(), 60)).await.unwrap();
    let (read, token) = within(c.gets(b"entry")).await.unwrap().unwrap();
    assert_eq!(read, first);
    // another writer replaces it meanwhile: the cas with the old token stores nothing
    within(c.set(b"entry", Bytes::from_static(b"v2"), 60))
        .await
        .unwrap();
    let lost = within(c.cas(b"entry", Bytes::from_static(b"v3"), 60, token)).await;
    assert_eq!(lost.unwrap(), CasOutcome::Changed);
    assert_eq!(
        within(c.get(b"entry")).await.unwrap(),
        Some(Bytes::from_static(b"v2"))
    );
    // read again, then replaced
    let (read, token) = within(c.gets(b"entry")).await.unwrap().unwrap();
    assert_eq!(read, Bytes::from_static(b"v2"));
    let big = binary_value(900 * 1024);
    let stored = within(c.cas(b"entry", big.clone(), 60, token)).await;
    assert_eq!(stored.unwrap(), CasOutcome::Stored);
    assert_eq!(within(c.get(b"entry")).await.unwrap(), Some(big.clone()));
    // the token is spent: the store changed the value
    let again = within(c.cas(b"entry", Bytes::from_static(b"v4"), 60, token)).await;
    assert_eq!(again.unwrap(), CasOutcome::Changed);
    // deleted since it was read: nothing comes back
    let (_, token) = within(c.gets(b"entry")).await.unwrap().unwrap();
    assert!(within(c.delete(b"entry")).await.unwrap());
    let gone = within(c.cas(b"entry", Bytes::from_static(b"v5"), 60, token)).await;
    assert_eq!(gone.unwrap(), CasOutcome::Gone);
    assert_eq!(within(c.get(b"entry")).await.unwrap(), None);
    // the TTL a cas gives is the one it carries
    within(c.set(b"short", Bytes::from_static(b"v"), 3600))
        .await
        .unwrap();
    let (_, token) = within(c.gets(b"short")).await.unwrap().unwrap();
    let stored = within(c.cas(b"short", Bytes::from_static(b"w"), 1, token)).await;
    assert_eq!(stored.unwrap(), CasOutcome::Stored);
    let deadline = Instant::now() + Duration::from_secs(5);
    while within(c.get(b"short")).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the cas's 1 s TTL did not apply");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(c.open_connections(), 1, "every reply read in step");
}

#[tokio::test]
async fn replace_only_stores_present_keys() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 2);
    assert!(!within(c.replace(b"lease", Bytes::from_static(b"a"), 60))
        .await
        .unwrap());
    assert_eq!(within(c.get(b"lease")).await.unwrap(), None);
    within(c.set(b"lease", Bytes::from_static(b"b"), 60))
        .await
        .unwrap();
    assert!(within(c.replace(b"lease", Bytes::from_static(b"c"), 60))
        .await
        .unwrap());
    assert_eq!(
        within(c.get(b"lease")).await.unwrap(),
        Some(Bytes::from_static(b"c"))
    );
    assert!(within(c.delete(b"lease")).await.unwrap());
    assert!(!within(c.replace(b"lease", Bytes::from_static(b"d"), 60))
        .await
        .unwrap());
    assert_eq!(within(c.get(b"lease")).await.unwrap(), None);
}

#[tokio::test]
async fn ttl_expires_and_touch_extends() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 1);
    within(c.set(b"short", Bytes::from_static(b"v"), 1))
        .await
        .unwrap();
    within(c.set(b"touched", Bytes::from_static(b"v"), 1))
        .await
        .unwrap();
    assert!(within(c.touch(b"touched", 3600)).await.unwrap());
    assert!(!within(c.touch(b"absent", 60)).await.unwrap());
    assert!(within(c.get(b"short")).await.unwrap().is_some());
    let deadline = Instant::now() + Duration::from_secs(5);
    while within(c.get(b"short")).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "a 1 s TTL did not expire");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(within(c.get(b"touched")).await.unwrap().is_some());
}

/// memcached numbers values from 1 and a server restarted empty counts from 1 again, so a token
/// read before the restart names, after it, whatever value was given the same number. A
/// compare-and-delete or compare-and-swap by such a token must act on nothing (it answers
/// `Changed`, and the value is read again), while tokens of the new run work as ever. (Before,
/// the stale token deleted or overwrote the new run's value: another node's fill lease.)
#[tokio::test]
async fn a_token_given_before_the_server_restarted_acts_on_nothing_after_it() {
    /// Through `c`: `lease` added (its token), then `entry` set and read back (its token).
    async fn lease_and_entry(
        c: &ServerClient,
        lease: &'static [u8],
        entry: &'static [u8],
    ) -> (CasToken, CasToken) {
        let added = within(c.add_token(b"lease", Bytes::from_static(lease), 60))
            .await
            .unwrap()
            .expect("stored");
        within(c.set(b"entry", Bytes::from_static(entry), 60))
            .await
            .unwrap();
        let (_, read) = within(c.gets(b"entry")).await.unwrap().unwrap();
        (added, read)
    }
    let mut mc = Memcached::start();
    let c = client(mc.addr(), 2);
    let (claimed, read) = lease_and_entry(&c, b"A", b"old").await;
    mc.kill();
    let _restarted = Memcached::start_on(mc.port);
    // another client stores the same keys on the new run, given the same numbers
    let other = client(mc.addr(), 1);
    let (theirs, their_read) = lease_and_entry(&other, b"B", b"new").await;
    assert_eq!(
        (theirs.value(), their_read.value()),
        (claimed.value(), read.value()),
        "the restarted server gave other numbers (setup)"
    );
    assert_ne!(theirs.instance(), claimed.instance());
    let deleted = within(c.delete_cas(b"lease", claimed)).await.unwrap();
    assert_eq!(deleted, CasOutcome::Changed);
    let swapped = within(c.cas(b"entry", Bytes::from_static(b"late"), 60, read)).await;
    assert_eq!(swapped.unwrap(), CasOutcome::Changed);
    assert_eq!(
        within(other.get(b"lease")).await.unwrap(),
        Some(Bytes::from_static(b"B"))
    );
    assert_eq!(
        within(other.get(b"entry")).await.unwrap(),
        Some(Bytes::from_static(b"new"))
    );
    // the new run's tokens, read by the same client, work
    let (_, now) = within(c.gets(b"lease")).await.unwrap().unwrap();
    assert_eq!(now, theirs);
    let deleted = within(c.delete_cas(b"lease", now)).await.unwrap();
    assert_eq!(deleted, CasOutcome::Stored);
    assert_eq!(within(other.get(b"lease")).await.unwrap(), None);
}

#[tokio::test]
async fn invalid_keys_are_rejected_before_sending() {
    // Nothing listens here: any attempt to send would yield Connect instead.
    let (_socket, addr) = refusing_addr();
    let c = client(addr, 1);
    // a token to send (only a server gives one)
    let mc = Memcached::start();
    let giver = client(mc.addr(), 1);
    within(giver.set(b"k", Bytes::new(), 0)).await.unwrap();
    let (_, token) = within(giver.gets(b"k")).await.unwrap().unwrap();
    let long = vec![b'k'; 251];
    let bad: [&[u8]; 5] = [b"", b"has space", b"tab\tkey", b"nl\n", &long];
    for key in bad {
        assert!(matches!(c.get(key).await, Err(McError::Protocol(_))));
        assert!(matches!(c.delete(key).await, Err(McError::Protocol(_))));
        let set = c.set(key, Bytes::new(), 0).await;
        assert!(matches!(set, Err(McError::Protocol(_))));
        assert!(matches!(c.gets(key).await, Err(McError::Protocol(_))));
        let cas = c.cas(key, Bytes::new(), 0, token).await;
        assert!(matches!(cas, Err(McError::Protocol(_))));
        let add = c.add_retried(key, Bytes::new(), 0).await;
        assert!(matches!(add, Err(McError::Protocol(_))));
    }
    let multi = c.get_multi(&[&b"ok"[..], &b"not ok"[..]]).await;
    assert!(matches!(multi, Err(McError::Protocol(_))));
    assert!(matches!(c.get(&long[..250]).await, Err(McError::Connect)));
}
