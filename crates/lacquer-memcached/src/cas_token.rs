//! CAS tokens that name a value on one run of one server, not on any run.
//!
//! memcached numbers the values it stores from 1, and a server restarted empty counts from 1
//! again: a token read before the restart may name, after it, a value written by someone else.
//! A compare-and-swap or compare-and-delete sent with such a token (`ms ... C<token>`,
//! `md ... C<token>`) acts on that other value. Lacquer's fill leases are released by the token
//! their `add` was given, so a release after a restart could delete the lease of a claim another
//! node made since, and the fill from before a POST was kept (`tests/fill_lease_attacks.rs`).
//!
//! So every connection learns, when it opens, which run of the server it talks to
//! ([`ServerInstance`]: the process id and start time `stats` reports, one round trip per
//! connection), and a token read on it carries that run ([`CasToken`]). A command carrying a
//! token is sent only over a connection to the same run; over any other the pool answers
//! [`crate::CasOutcome::Changed`] without sending it, which is true (the value the token named
//! is gone with its run) and which every caller already handles by reading the value again.
//! A connection to the old run is dead by then, so no command can reach it.

/// One run of a memcached server: its process id and the time it started (`stats`: `pid`, and
/// `time - uptime`, which is constant for a run). Two runs match only by chance (the same pid
/// reused within the same second: a container restarted within a second).
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

/// A CAS token memcached gave a value (`mg ... c`, `ms ... c`), and the run of the server that
/// gave it: the token names that value on that run only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasToken {
    value: u64,
    instance: ServerInstance,
}

impl CasToken {
    /// The token `value`, read on a connection to `instance`.
    pub(crate) fn new(value: u64, instance: ServerInstance) -> CasToken {
        CasToken { value, instance }
    }

    /// The number memcached gave the value.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// The run of the server that gave it.
    pub fn instance(&self) -> ServerInstance {
        self.instance
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

    #[test]
    fn the_token_0_names_no_value_on_any_run() {
        let run = ServerInstance::new(4242, 1_796_596_777);
        let token = CasToken::new(42, run);
        assert_eq!(usable_cas_token(token), Some(token));
        // memcached run with -C: every value's token is 0, and `md <key> C0` deletes any
        assert_eq!(usable_cas_token(CasToken::new(0, run)), None);
        assert_eq!(
            usable_cas_token(CasToken::new(0, ServerInstance::default())),
            None
        );
        assert_ne!(
            token,
            CasToken::new(42, ServerInstance::new(4242, 1_796_596_778))
        );
    }
}
