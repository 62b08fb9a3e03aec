//! CAS tokens across memcached restarts, as a flaky network and odd servers would test them:
//! a server restarted twice, frozen or hostile while a connection opens and reads its `stats`;
//! and the cost of that `stats` on a hit path (one per connection, not one per call).

mod support;

use bytes::Bytes;
use lacquer_memcached::{CasOutcome, McError};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};
use support::*;

/// Two restarts in a row: a token of the first run, and one of the second, both act on nothing
/// on the third, though it numbers its values as both did; the third's own tokens work.
#[tokio::test]
async fn a_token_of_either_earlier_run_acts_on_nothing_after_two_restarts() {
    let mut mc = Memcached::start();
    let c = client(mc.addr(), 2);
    let first = within(c.add_token(b"k", Bytes::from_static(b"1"), 60))
        .await
        .unwrap()
        .unwrap();
    mc.kill();
    let mut mc = Memcached::start_on(mc.port);
    // an add is never retried, and the pooled connection broke with the first run: a get
    // (retried on a fresh connection) finds that out
    assert_eq!(within(c.get(b"k")).await.unwrap(), None);
    let second = within(c.add_token(b"k", Bytes::from_static(b"2"), 60))
        .await
        .unwrap()
        .unwrap();
    mc.kill();
    let mc = Memcached::start_on(mc.port);
    assert_eq!(within(c.get(b"k")).await.unwrap(), None);
    let other = client(mc.addr(), 1);
    let third = within(other.add_token(b"k", Bytes::from_static(b"3"), 60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.value(), second.value()),
        (third.value(), third.value())
    );
    for stale in [first, second] {
        let deleted = within(c.delete_cas(b"k", stale)).await.unwrap();
        assert_eq!(deleted, CasOutcome::Changed);
        let swapped = within(c.cas(b"k", Bytes::from_static(b"x"), 60, stale)).await;
        assert_eq!(swapped.unwrap(), CasOutcome::Changed);
    }
    assert_eq!(
        within(other.get(b"k")).await.unwrap(),
        Some(Bytes::from_static(b"3"))
    );
    let swapped = within(c.cas(b"k", Bytes::from_static(b"4"), 60, third)).await;
    assert_eq!(swapped.unwrap(), CasOutcome::Stored);
}

/// A server frozen when a connection opens (the kernel completes the TCP handshake, but no
/// `stats` reply comes): the call fails by one `op_timeout` (not `connect_timeout`, 2 s, nor
/// forever), the half-open connection is not kept, and the thawed server is used again.
#[tokio::test]
async fn a_server_frozen_while_a_connection_reads_its_stats_costs_one_op_timeout() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 2);
    mc.signal("-STOP");
    let started = Instant::now();
    let got = within(c.get(b"k")).await;
    let took = started.elapsed();
    mc.signal("-CONT");
    assert!(matches!(got, Err(McError::Timeout)), "{got:?}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert_eq!(
        c.open_connections(),
        0,
        "the unanswered connection was kept"
    );
    within(c.set(b"k", Bytes::from_static(b"v"), 60))
        .await
        .unwrap();
    assert_eq!(
        within(c.get(b"k")).await.unwrap(),
        Some(Bytes::from_static(b"v"))
    );
    assert_eq!(c.open_connections(), 1);
}

/// Something answering `stats` like no memcached: each reply must end the call with an error
/// or a run (never a panic, a hang, or a read without bound), and no connection that read a
/// broken one is kept. Served by a plain socket that answers `stats` with `reply`, then every
/// later command with `EN` (a miss).
#[tokio::test]
async fn odd_stats_replies_neither_panic_nor_hang() {
    let endless_line = format!("STAT {} 1\r\nEND\r\n", "x".repeat(64 << 10));
    let many_lines = "STAT x 1\r\n".repeat(100_000) + "END\r\n";
    let replies: Vec<(&str, Vec<u8>)> = vec![
        (
            "a start time below i64::MIN",
            b"STAT pid 1\r\nSTAT time -9223372036854775808\r\nSTAT uptime 1\r\nEND\r\n".to_vec(),
        ),
        (
            "a start time above i64::MAX",
            b"STAT pid 1\r\nSTAT time 9223372036854775807\r\nSTAT uptime -1\r\nEND\r\n".to_vec(),
        ),
        (
            "numbers that are not",
            b"STAT pid -1\r\nSTAT time 1e9\r\nSTAT uptime \r\nSTAT pid\r\nEND\r\n".to_vec(),
        ),
        ("a line without end", endless_line.into_bytes()),
        ("too many lines", many_lines.into_bytes()),
        ("not text", b"STAT pid \xff\xfe\r\nEND\r\n".to_vec()),
        ("an error", b"ERROR\r\n".to_vec()),
        ("bare LF", b"STAT pid 1\nEND\n".to_vec()),
        ("cut mid-way", b"STAT pid 1\r\nSTAT ti".to_vec()),
    ];
    for (what, reply) in replies {
        let addr = odd_server(reply);
        let c = client(addr, 1);
        let got = tokio::time::timeout(Duration::from_secs(5), c.get(b"k")).await;
        let got = got.unwrap_or_else(|_| panic!("{what}: hung"));
        match got {
            Ok(None) => assert_eq!(c.open_connections(), 1, "{what}"),
            Ok(Some(v)) => panic!("{what}: a value from nowhere: {v:?}"),
            Err(_) => assert_eq!(c.open_connections(), 0, "{what}: kept"),
        }
    }
}

/// A loopback server that answers a connection's first command (`stats`) with `reply`, then
/// each further line with `EN`, and closes when `reply` was cut (no `END`).
fn odd_server(reply: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let reply = reply.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                // the client may close once it has read enough
                if stream.write_all(&reply).is_err() || !reply.ends_with(b"END\r\n") {
                    return;
                }
                let mut rest = Vec::new();
                loop {
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => rest.extend_from_slice(b"EN\r\n"),
                    }
                    if stream.write_all(&rest).is_err() {
                        return;
                    }
                    rest.clear();
                }
            });
        }
    });
    addr
}

/// The `stats` round trip is paid once per connection: a hit path of many calls opens one
/// connection (memcached's `total_connections`), and sends memcached one `get` per hit.
#[tokio::test]
async fn a_hit_path_reads_the_servers_run_once() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 4);
    within(c.set(b"hit", Bytes::from_static(b"v"), 60))
        .await
        .unwrap();
    let accepted = connections_accepted(mc.addr());
    let gets = server_stat(mc.addr(), "cmd_get");
    for _ in 0..200 {
        assert!(within(c.get(b"hit")).await.unwrap().is_some());
    }
    // two more for the questions themselves (cmd_get, and this one)
    assert_eq!(connections_accepted(mc.addr()), accepted + 2);
    assert_eq!(server_stat(mc.addr(), "cmd_get"), gets + 200);
    assert_eq!(c.open_connections(), 1);
}
