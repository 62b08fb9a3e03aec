//! Shared integration-test harness for Lacquer.
//!
//! Use from an integration test with `mod support; use support::*;`.
//!
//! - [`origin`]: a real, scriptable HTTP/1.1 origin server ([`TestOrigin`]).
//! - [`process`]: the real `lacquer` binary ([`LacquerProcess`], [`run_lacquer`]) and a
//!   real memcached ([`MemcachedProcess`]) as child processes, killed on drop.
//! - [`client`]: async reqwest helpers ([`get`], [`Resp`]) and raw-socket helpers
//!   ([`raw_request`], [`RawConn`]).
//!
//! Everything binds or connects to 127.0.0.1 only.

// Each integration test binary uses only part of the harness.
#![allow(dead_code, unused_imports)]

pub mod client;
pub mod origin;
pub mod process;

pub use client::*;
pub use origin::*;
pub use process::*;

/// Re-exported so tests can write `support::Bytes` / `Duration` without extra imports.
pub use bytes::Bytes;
pub use std::time::Duration;
