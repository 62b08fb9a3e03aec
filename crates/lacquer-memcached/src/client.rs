//! A small async, pooled memcached client for one server: the operations the cache tier uses.
//!
//! This is the transport of Lacquer's shared cache tier: binary values of up
//! to about 1 MB, fetched one at a time or pipelined in batches, with hard
//! time bounds so that a slow or dead memcached degrades into a cache miss
//! instead of stalling requests.  One [`ServerClient`] talks to one server;
//! choosing the server for a key is [`crate::ketama`]'s job.
//!
//! Each operation checks its key, becomes one [`crate::protocol`] command and runs through the
//! server's [`crate::pool`], whose rules bound it in time and decide which connections are
//! reused.

use crate::cas_token::CasToken;
use crate::error::McError;
use crate::pool::{Pool, ServerConfig};
use crate::protocol::{check_key, CasOutcome, Command, Reply, StoreMode};
use crate::server_stats::ServerStats;
use bytes::Bytes;

/// A client for one memcached server with a bounded pool of connections, so
/// that concurrent requests share a few sockets and a bad server is bounded
/// in time.  Cheap to share behind an `Arc`.
pub struct ServerClient {
    pool: Pool,
}

impl ServerClient {
    /// Creates the client; no connection is opened until the first call.
    pub fn new(cfg: ServerConfig) -> ServerClient {
        ServerClient {
            pool: Pool::new(cfg),
        }
    }

    /// The configuration this client was built with, for logs and admin views.
    pub fn config(&self) -> &ServerConfig {
        self.pool.config()
    }

    /// Connections currently open (idle or in use) or being opened, for metrics and to check
    /// that the pool stays bounded and discards broken connections.
    pub fn open_connections(&self) -> usize {
        self.pool.open_connections()
    }

    /// Latency, batch sizes and failures of this server's operations, for metrics.
    pub fn stats(&self) -> &ServerStats {
        self.pool.stats()
    }

    /// Fetches one value; `Ok(None)` on a miss.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, McError> {
        check_key(key)?;
        match self.pool.execute(&Command::Get(key)).await? {
            Reply::Value(v) => Ok(v),
            _ => unreachable!("get yields a value"),
        }
    }

    /// Fetches many values in one pipelined round trip on one connection;
    /// the result has one entry per key, in the same order.
    pub async fn get_multi<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
    ) -> Result<Vec<Option<Bytes>>, McError> {
        let deadline = tokio::time::Instant::now() + self.pool.config().op_timeout;
        self.get_multi_by(keys, deadline).await
    }

    /// [`Self::get_multi`] ending by `deadline` instead of `op_timeout` from now: for a caller
    /// that bounds a wait and this call together. One key goes as a plain get (`mg <key> v`),
    /// which is shorter both ways than a batch of one.
    pub async fn get_multi_by<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Option<Bytes>>, McError> {
        if let [key] = keys {
            let key = key.as_ref();
            check_key(key)?;
            self.pool.stats().on_batch(1);
            return match self.pool.execute_by(&Command::Get(key), deadline).await? {
                Reply::Value(v) => Ok(vec![v]),
                _ => unreachable!("get yields a value"),
            };
        }
        let keys: Vec<&[u8]> = keys.iter().map(AsRef::as_ref).collect();
        keys.iter().try_for_each(|k| check_key(k))?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        match self
            .pool
            .execute_by(&Command::GetMulti(&keys), deadline)
            .await?
        {
            Reply::Values(v) => Ok(v),
            _ => unreachable!("get_multi yields values"),
        }
    }

    /// Fetches one value with its CAS token (memcached `gets`), `Ok(None)` on a miss: for a
    /// writer that replaces a value only after looking at it, with [`Self::cas`], so that a
    /// write landing in between is not lost.
    pub async fn gets(&self, key: &[u8]) -> Result<Option<(Bytes, CasToken)>, McError> {
        check_key(key)?;
        match self
            .pool
            .execute_with_token(&Command::Gets(key), None)
            .await?
        {
            (Reply::ValueCas(v), read) => {
                Ok(v.map(|(value, token)| (value, CasToken::new(token, read))))
            }
            _ => unreachable!("gets yields a value and its token"),
        }
    }

    /// Stores `value` under `key` only if its value is still the one [`Self::gets`] read with
    /// `token` (memcached compare-and-swap): a writer that decided to replace a value by
    /// looking at it replaces that value, not one written since. Retried once on a stale pooled
    /// connection like a set: a retry whose first attempt landed answers
    /// [`CasOutcome::Changed`], and the caller reads the value again. A token is sent only over a
    /// connection known to reach the run of the server that gave it ([`crate::cas_token`]: the
    /// server may have restarted since); otherwise it answers `Changed` too.
    pub async fn cas(
        &self,
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
        token: CasToken,
    ) -> Result<CasOutcome, McError> {
        check_key(key)?;
        let cmd = Command::Store {
            key,
            value: &value,
            ttl: ttl_secs,
            mode: StoreMode::Cas(token.value()),
        };
        match self
            .pool
            .execute_with_token(&cmd, Some(token.read()))
            .await?
        {
            (Reply::Cas(outcome), _) => Ok(outcome),
            _ => unreachable!("a compare-and-swap yields its outcome"),
        }
    }

    /// Stores `value` under `key` for `ttl_secs` seconds (0 = no expiry;
    /// more than 30 days is capped at 30 days).
    pub async fn set(&self, key: &[u8], value: Bytes, ttl_secs: u32) -> Result<(), McError> {
        check_key(key)?;
        let cmd = Command::Store {
            key,
            value: &value,
            ttl: ttl_secs,
            mode: StoreMode::Set,
        };
        match self.pool.execute(&cmd).await? {
            Reply::Flag(true) => Ok(()),
            _ => Err(McError::ServerError("value not stored".into())),
        }
    }

    /// Stores `value` only if `key` is absent: `Ok(true)` if stored, `Ok(false)`
    /// if the key exists.  Never retried (a retry whose first attempt landed would read "there
    /// already"); a fill lease is claimed with [`Self::add_token`].
    pub async fn add(&self, key: &[u8], value: Bytes, ttl_secs: u32) -> Result<bool, McError> {
        self.store_if(StoreMode::Add, key, value, ttl_secs).await
    }

    /// [`Self::add`] that also returns the CAS token memcached gave the value it stored, in the
    /// same round trip: `Ok(Some(token))` if stored, `Ok(None)` if the key exists. For a
    /// claimant that later deletes its value only if it is still the one it stored
    /// ([`Self::delete_cas`]). Never retried, as [`Self::add`].
    pub async fn add_token(
        &self,
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
    ) -> Result<Option<CasToken>, McError> {
        check_key(key)?;
        let cmd = Command::Store {
            key,
            value: &value,
            ttl: ttl_secs,
            mode: StoreMode::AddToken,
        };
        match self.pool.execute_with_token(&cmd, None).await? {
            (Reply::Token(token), read) => Ok(token.map(|token| CasToken::new(token, read))),
            _ => unreachable!("an add that returns its token yields it"),
        }
    }

    /// [`Self::add`] for a caller to whom "already there" means "look at what is there" (a
    /// writer that then compares it, [`Self::gets`] and [`Self::cas`]), not "someone else holds
    /// it" as for a lease: a retry that finds its own first attempt landed is harmless, so it is
    /// retried once on a stale pooled connection, as a set is, rather than failing.
    pub async fn add_retried(
        &self,
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
    ) -> Result<bool, McError> {
        self.store_if(StoreMode::AddRetried, key, value, ttl_secs)
            .await
    }

    /// Stores `value` only if `key` is present (memcached `replace`): `Ok(true)` if stored,
    /// `Ok(false)` if the key is absent, which it stays: a value deleted meanwhile does not come
    /// back.
    pub async fn replace(&self, key: &[u8], value: Bytes, ttl_secs: u32) -> Result<bool, McError> {
        self.store_if(StoreMode::Replace, key, value, ttl_secs)
            .await
    }

    /// A conditional store ([`StoreMode::Add`], [`StoreMode::AddRetried`] or
    /// [`StoreMode::Replace`]): whether it stored.
    async fn store_if(
        &self,
        mode: StoreMode,
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
    ) -> Result<bool, McError> {
        check_key(key)?;
        let cmd = Command::Store {
            key,
            value: &value,
            ttl: ttl_secs,
            mode,
        };
        match self.pool.execute(&cmd).await? {
            Reply::Flag(stored) => Ok(stored),
            _ => unreachable!("a store yields a flag"),
        }
    }

    /// Appends `value` to the value under `key`: `Ok(true)` if appended, `Ok(false)` if the key
    /// does not exist (memcached 1.6.18 cannot create it in the same command). The value keeps
    /// its TTL. Used for logs that several writers extend; never retried (a retry could append
    /// twice).
    pub async fn append(&self, key: &[u8], value: Bytes) -> Result<bool, McError> {
        check_key(key)?;
        match self
            .pool
            .execute(&Command::Append { key, value: &value })
            .await?
        {
            Reply::Flag(stored) => Ok(stored),
            _ => unreachable!("append yields a flag"),
        }
    }

    /// Deletes `key`: `Ok(true)` if it existed, used for purges and lease release.
    pub async fn delete(&self, key: &[u8]) -> Result<bool, McError> {
        check_key(key)?;
        match self.pool.execute(&Command::Delete(key)).await? {
            Reply::Flag(found) => Ok(found),
            _ => unreachable!("delete yields a flag"),
        }
    }

    /// Deletes `key` only if its value is still the one whose CAS token is `token` (memcached
    /// `md <key> C<token>`, atomic on the server): [`CasOutcome::Stored`] when deleted,
    /// [`CasOutcome::Changed`] when the value was written since (nothing deleted),
    /// [`CasOutcome::Gone`] when there was nothing. Retried once on a stale pooled connection
    /// like a delete: a retry whose first attempt landed answers `Gone`. A token is sent only
    /// over a connection known to reach the run of the server that gave it
    /// ([`crate::cas_token`]: a server restarted since may have given the same number to another
    /// value); otherwise it answers `Changed`.
    pub async fn delete_cas(&self, key: &[u8], token: CasToken) -> Result<CasOutcome, McError> {
        check_key(key)?;
        let cmd = Command::DeleteCas(key, token.value());
        match self
            .pool
            .execute_with_token(&cmd, Some(token.read()))
            .await?
        {
            (Reply::Cas(outcome), _) => Ok(outcome),
            _ => unreachable!("a compare-and-delete yields its outcome"),
        }
    }

    /// Resets the TTL of `key` without fetching it: `Ok(true)` if it existed.
    pub async fn touch(&self, key: &[u8], ttl_secs: u32) -> Result<bool, McError> {
        check_key(key)?;
        match self.pool.execute(&Command::Touch(key, ttl_secs)).await? {
            Reply::Flag(found) => Ok(found),
            _ => unreachable!("touch yields a flag"),
        }
    }
}
