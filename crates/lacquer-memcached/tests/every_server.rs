//! Operations on one server by index, for data every server keeps a copy of: appends that create
//! the key when it is missing and never lose a concurrent writer's bytes, reads that skip an
//! ejected server, and deletes that report what they reached.

mod support;

use bytes::Bytes;
use lacquer_memcached::{Appended, Cluster, ClusterConfig, DeleteOutcome};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use support::*;

fn cluster(addrs: &[SocketAddr], failure_limit: u32) -> Cluster {
    Cluster::new(&ClusterConfig {
        servers: servers_at(addrs.iter().copied()),
        pool_size: 4,
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_millis(1000),
        failure_limit,
        retry_after: Duration::from_secs(60),
        rehash_on_eject: false,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_creates_the_key_and_keeps_every_concurrent_writers_bytes() {
    let mc = Memcached::start();
    let cluster = Arc::new(cluster(&[mc.addr()], 3));
    assert_eq!(
        within(cluster.append_on(0, b"log", Bytes::from_static(b"a;"), 60)).await,
        Appended::Stored
    );
    let writers: Vec<_> = (0..20)
        .map(|i| {
            let cluster = cluster.clone();
            tokio::spawn(async move {
                let record = Bytes::from(format!("w{i};"));
                within(cluster.append_on(0, b"log", record, 60)).await == Appended::Stored
            })
        })
        .collect();
    for writer in writers {
        assert!(writer.await.unwrap());
    }
    let values = within(cluster.get_multi_on(0, &[b"log".to_vec(), b"none".to_vec()]))
        .await
        .unwrap();
    assert_eq!(values[1], None);
    let log = String::from_utf8(values[0].clone().unwrap().to_vec()).unwrap();
    assert!(log.starts_with("a;"), "{log}");
    let mut records: Vec<&str> = log.trim_end_matches(';').split(';').skip(1).collect();
    records.sort();
    let mut expected: Vec<String> = (0..20).map(|i| format!("w{i}")).collect();
    expected.sort();
    assert_eq!(records, expected);

    // racing creators of a missing key: one creates it, the others append to it
    let creators: Vec<_> = (0..10)
        .map(|i| {
            let cluster = cluster.clone();
            tokio::spawn(async move {
                within(cluster.append_on(0, b"fresh", Bytes::from(format!("{i},")), 60)).await
                    == Appended::Stored
            })
        })
        .collect();
    for creator in creators {
        assert!(creator.await.unwrap());
    }
    let fresh = within(cluster.get_multi_on(0, &[b"fresh".to_vec()]))
        .await
        .unwrap();
    let fresh = String::from_utf8(fresh[0].clone().unwrap().to_vec()).unwrap();
    assert_eq!(fresh.matches(',').count(), 10, "{fresh}");
}

/// An append that would pass memcached's item size limit (1 MiB by default) is refused, told
/// apart from a server that does not answer: the invalidation log then writes to another key.
#[tokio::test]
async fn an_append_past_the_item_size_limit_is_refused_not_unanswered() {
    let mc = Memcached::start();
    let cluster = cluster(&[mc.addr()], 3);
    let nearly_full = Bytes::from(vec![b'#'; 1024 * 1024 - 512]);
    assert!(within(cluster.set_on(0, b"log", nearly_full, 60)).await);
    assert_eq!(
        within(cluster.append_on(0, b"log", Bytes::from(vec![b'x'; 4096]), 60)).await,
        Appended::Refused
    );
    // the server still answers, and takes what fits
    assert_eq!(
        within(cluster.append_on(0, b"log", Bytes::from_static(b"x"), 60)).await,
        Appended::Stored
    );
    assert!(cluster.is_usable(0));
}

#[tokio::test]
async fn a_delete_reports_deleted_not_found_failed_and_skipped() {
    let mut mc = Memcached::start();
    let cluster = cluster(&[mc.addr()], 2);
    assert_eq!(cluster.server_count(), 1);
    assert_eq!(cluster.server_name(0), mc.addr().to_string());
    assert!(within(cluster.set_on(0, b"k", Bytes::from_static(b"v"), 60)).await);
    assert_eq!(
        within(cluster.delete_reporting(b"k")).await,
        (Some(0), DeleteOutcome::Deleted)
    );
    assert_eq!(
        within(cluster.delete_reporting(b"k")).await,
        (Some(0), DeleteOutcome::NotFound)
    );
    mc.kill();
    assert_eq!(
        within(cluster.delete_reporting(b"k")).await,
        (Some(0), DeleteOutcome::Failed)
    );
    assert_eq!(
        within(cluster.delete_reporting(b"k")).await,
        (Some(0), DeleteOutcome::Failed)
    );
    // two consecutive failures eject the server: nothing is sent to it any more
    assert!(!cluster.is_usable(0));
    assert_eq!(
        within(cluster.delete_reporting(b"k")).await,
        (Some(0), DeleteOutcome::Skipped)
    );
    assert_eq!(cluster.owner(b"k"), Some(0));
    assert!(within(cluster.get_multi_on(0, &[b"k".to_vec()]))
        .await
        .is_none());
    assert_eq!(
        within(cluster.append_on(0, b"k", Bytes::from_static(b"x"), 60)).await,
        Appended::Unanswered
    );
    assert!(!within(cluster.set_on(0, b"k", Bytes::from_static(b"x"), 60)).await);
}
