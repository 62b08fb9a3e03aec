//! The integration-test harness for Lacquer: real processes on real loopback sockets, one module
//! per concept. A crate of its own (`lacquer-test-support`, a dev-dependency: its Cargo.toml says
//! why); use from an integration test with `use lacquer_test_support as support; use support::*;`.
//!
//! - [`load`]: a steady load of checked requests, for changes made under traffic ([`SteadyLoad`]).
//! - [`lacquer_process`]: the binary under test ([`LacquerProcess`], [`start_balancer`], [`run_lacquer`],
//!   [`check_config`], [`admin_stat`]).
//! - [`memcached`]: a real memcached for the shared tier ([`MemcachedProcess`]).
//! - [`metrics`]: a node's `/metrics`, scraped and read by series ([`scrape`]).
//! - [`cluster`]: several memcached servers and the nodes that share them ([`MemcachedCluster`]).
//! - [`origin`]: origins the proxy fetches from: the programmable [`TestOrigin`], the
//!   query-string [`scripted_origin`], balancer [`Replica`]s and socket-level [`RawOrigin`]s.
//! - [`client`]: what the tests send: reqwest helpers ([`get`], [`Resp`]), a raw-socket
//!   client ([`raw_request`], [`RawConn`]) and a raw HTTP/1 client that stops reading or reads
//!   at a pace, its answers read whole and checked for completeness ([`StallingClient`],
//!   [`StallingAnswer`]).
//! - [`h2`]: raw HTTP/2 clients on the `h2` crate, for windows, resets and unread streams
//!   ([`h2_connect_wide`], [`h2_request`], [`h2_read_answer`], [`H2Answer`]).
//! - [`django_site`]: the Django test site under gunicorn ([`DjangoSite`]), a real application.
//! - [`generated`]: deterministic bodies to stream and verify at any offset.
//! - [`large_bodies`]: large generated objects and clients that read them by hand at their own
//!   pace, for the tests of bodies kept in memory files (not glob-exported).
//! - [`gzip`](mod@gzip), [`coding`] (brotli, zstd), [`http_date`](mod@http_date): codings and dates the origin scripts and
//!   the tests check.
//! - [`child`], [`temp_dir`], [`net`], [`poll`]: child processes killed on drop, scratch
//!   directories, free ports, bounded waits.
//! - [`tls`]: certificates for TLS listeners.
//! - [`websocket`]: echo and close checks through the upgrade tunnel.
//! - [`fields`]: header lookup in `(name, value)` lists, shared by origin and raw client.
//! - [`assertions`]: checks against expectations computed apart from the response checked.
//!
//! Everything binds or connects to 127.0.0.1 only.
//!
//! Its docs link to private modules too: read them with `cargo doc --document-private-items`
//! (`.ci/run` builds them so, warnings refused).

#![allow(rustdoc::private_intra_doc_links)]

pub mod assertions;
pub mod child;
pub mod client;
pub mod cluster;
pub mod coding;
pub mod django_site;
pub mod fields;
pub mod generated;
pub mod gzip;
// Private, unlike the others: `use support::*` would otherwise bring a module named `h2` into
// the tests, shadowing the `h2` crate they use directly. Its items are re-exported below.
mod h2;
pub mod http_date;
pub mod lacquer_process;
pub mod large_bodies;
pub mod lease_rig;
pub mod load;
pub mod memcached;
pub mod metrics;
pub mod net;
pub mod origin;
pub mod poll;
pub mod raw_text;
pub mod temp_dir;
pub mod tls;
pub mod websocket;

pub use self::h2::*;
pub use assertions::*;
pub use child::{
    peak_rss, read_lossy, rss_bytes, run_with_timeout, send_signal, status_kb, stderr_text,
    OwnedChild,
};
pub use client::*;
pub use cluster::*;
pub use coding::{decode, encode, lists_coding};
pub use django_site::*;
pub use generated::*;
pub use gzip::*;
pub use http_date::*;
pub use lacquer_process::*;
pub use load::*;
pub use memcached::*;
pub use metrics::*;
pub use net::*;
pub use origin::*;
pub use poll::*;
pub use temp_dir::*;
pub use tls::*;
pub use websocket::{assert_closes_normally, assert_echoes, WebSocket};

/// Re-exported so tests can write `support::Bytes` / `Duration` without extra imports.
pub use bytes::Bytes;
pub use std::time::Duration;
