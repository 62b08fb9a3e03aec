//! CAS tokens that name a value on one run of one server, not on any run.
//!
//! memcached numbers the values it stores from 1, and a server restarted empty counts from 1
//! again: a token read before the restart may name, after it, a value written by someone else.
//! A compare-and-swap or compare-and-delete sent with such a token (`ms ... C<token>`,
//! `md ... C<token>`) acts on that other value. Lacquer's fill leases are released by the token
//! their `add` was given, so a release after a restart could delete the lease of a claim another
//! node made since, and the fill from before a POST was kept (`tests/fill_lease_attacks.rs`).
//!
//! So a command carrying a token is sent only over a connection known to reach the run that
//! gave it; over any other the pool answers [`crate::CasOutcome::Changed`] without sending it,
//! which is true when the run is another (the value the token named is gone with its run) and
//! which every caller already handles by reading the value again. A connection is known to
//! reach the token's run when both hold:
//!
//! * It was opened (and answered) before the command that read the token was sent, and is
//!   still open: a TCP connection does not outlive the process that accepted it, so that
//!   process was alive from before the read to after it, and only one process serves the port
//!   at a time (`ReadOn`). This alone tells runs apart whatever they report: memcached in a
//!   container is pid 1 on every run, and a container restarted at once (Docker's restart
//!   policy waits 100 ms) starts in the same second as the last run, so it reports the very
//!   same `stats` (`tests/restart_tokens.rs`).
//! * The server's run it read when it opened ([`ServerInstance`]: the process id and start time
//!   `stats` reports, one round trip per connection) is the token's.
//!
//! A connection opened after a token was read (the pool grew meanwhile) answers `Changed` for
//! it although it may reach the same run: a caller reads the value again, over a connection
//! that then qualifies, at the cost of that round trip.

/// One run of a memcached server: its process id and the time it started (`stats`: `pid`, and
/// `time - uptime`, which is constant for a run). Two runs may match (the same pid reused
/// within the same second: a container restarted at once), so a token is not sent by this
/// alone (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ServerInstance {
    pid: u64,
    started: i64,
}

impl ServerInstance {
    /// The run a `stats` reply describes; a reply without these fields (not memcached) gives
    /// the default run, which every such connection shares, so tokens work there as before.
    pub(crate) fn new(pid: u64, started: i64) -> ServerInstance {
        ServerInstance { pid, started }
    }
}

/// Where a token was read: the run its connection reached, and which connections of the pool
/// that read it may carry it (those it had opened before the read was sent, the first
/// `opened` of pool `pool`; see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ReadOn {
    pub(crate) instance: ServerInstance,
    pub(crate) pool: u64,
    pub(crate) opened: u64,
}

/// A CAS token memcached gave a value (`mg ... c`, `ms ... c`), and the run of the server that
/// gave it: the token names that value on that run only. Two tokens are equal when they name
/// the same value on the same run, whichever connection read them.
#[derive(Debug, Clone, Copy)]
pub struct CasToken {
    value: u64,
    read: ReadOn,
}

impl PartialEq for CasToken {
    fn eq(&self, other: &CasToken) -> bool {
        (self.value, self.read.instance) == (other.value, other.read.instance)
    }
}

impl Eq for CasToken {}

impl CasToken {
    /// The token `value`, read as `read` tells.
    pub(crate) fn new(value: u64, read: ReadOn) -> CasToken {
        CasToken { value, read }
    }

    /// Where it was read.
    pub(crate) fn read(&self) -> &ReadOn {
        &self.read
    }

    /// The number memcached gave the value.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// The run of the server that gave it.
    pub fn instance(&self) -> ServerInstance {
        self.read.instance
    }
}

/// `token` as one that names a value, or `None` for 0, which names none: memcached counts
/// tokens from 1, and a server run without them (`-C`, 8 bytes saved per item) gives every value
/// 0, answers every compare-and-swap by that token `EX` (changed), and carries out `md <key> C0`
/// on whatever value is there. A caller holding `None` must do without the compare (a `replace`,
/// or a check of the value read) or not at all.
pub fn usable_cas_token(token: CasToken) -> Option<CasToken> {
    (token.value != 0).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read on a connection to `instance`, the first of the pool `pool`.
    fn on(instance: ServerInstance, pool: u64) -> ReadOn {
        ReadOn {
            instance,
            pool,
            opened: 1,
        }
    }

    #[test]
    fn the_token_0_names_no_value_on_any_run() {
        let run = ServerInstance::new(4242, 1_796_596_777);
        let token = CasToken::new(42, on(run, 0));
        assert_eq!(usable_cas_token(token), Some(token));
        // memcached run with -C: every value's token is 0, and `md <key> C0` deletes any
        assert_eq!(usable_cas_token(CasToken::new(0, on(run, 0))), None);
        assert_eq!(
            usable_cas_token(CasToken::new(0, on(ServerInstance::default(), 0))),
            None
        );
        assert_ne!(
            token,
            CasToken::new(42, on(ServerInstance::new(4242, 1_796_596_778), 0))
        );
        // the same value on the same run, read by another pool
        assert_eq!(token, CasToken::new(42, on(run, 1)));
    }
}
