//! The process's life after start-up: reload, hand-over and drain.
//!
//! * [`live`]: the settings requests read ([`LiveSettings`](live::LiveSettings)), held behind an
//!   atomic pointer so a reload replaces them between two requests without a lock, a dropped
//!   connection or an emptied memory tier;
//! * [`reload`]: re-reads the config file, validates it, and swaps the new settings in, or
//!   refuses it and keeps the running ones ([`Reloader`](reload::Reloader)); SIGHUP and the admin
//!   endpoint both call it;
//! * [`restart_keys`]: the keys a reload cannot apply (listeners, the memory tier's size, the
//!   memcached cluster, ...), which need a hand-over;
//! * [`signals`]: SIGHUP (reload), SIGQUIT (hand-over), SIGTERM (drain) and SIGINT (stop), in
//!   place of Pingora's own watcher;
//! * [`upgrade`]: the hand-over itself, Pingora's graceful upgrade: `lacquer --upgrade` takes the
//!   listening sockets from the running process over `server.upgrade_sock`;
//! * [`drain`]: requests in flight are counted, so a stopping process waits for them, up to
//!   `shutdown_timeout`, and exits as soon as none is left.

pub mod drain;
pub mod live;
pub mod reload;
pub mod restart_keys;
pub mod signals;
pub mod upgrade;
