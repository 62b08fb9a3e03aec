//! Lacquer: a distributed web accelerator, an HTTP caching reverse proxy on Pingora.
//!
//! The crate is laid out the way a request travels:
//! * [`config`]: the TOML file, CLI flags and validation;
//! * [`server`]: builds the Pingora server, listeners and services from a [`config::Config`];
//!   [`proxy_protocol`] reads the PROXY header on listeners that expect one;
//! * [`lifecycle`]: reload, hand-over to a new process, drain on shutdown;
//! * [`proxy`]: the request path as Pingora's phase-named callbacks;
//! * [`rules`]: the request rules (`[[rules]]`): what to cache, per request;
//! * [`policy`]: what may be stored and for how long (RFC 9111);
//! * [`storage`]: the cache tiers;
//! * [`compression`]: one stored gzip copy, served to every client as it accepts;
//! * [`upstream`]: where requests go when the cache cannot answer;
//! * [`observe`] and [`admin`]: what an operator sees;
//! * [`allocator`]: when memory the process freed goes back to the system.
//!
//! `docs/architecture.md` has the picture.
//!
//! These docs are for the people who work on Lacquer: most of the architecture lives in private
//! items, which the module docs link to. Read them with `cargo doc --document-private-items`
//! (`.ci/run` builds them so, warnings refused); without that flag the links to private items
//! would be flagged, so that lint is allowed here.

#![allow(rustdoc::private_intra_doc_links)]

pub mod admin;
pub mod allocator;
pub mod compression;
pub mod config;
pub mod invalidation;
pub mod lifecycle;
pub mod observe;
pub mod policy;
pub mod proxy;
pub mod proxy_protocol;
pub mod rules;
pub mod server;
pub mod storage;
pub mod upstream;
