//! The memcached meta text protocol: which bytes a command is, and what a reply's bytes mean.
//!
//! Commands used (memcached >= 1.6, see its `protocol.txt`): `mg <key> v` (with `c` for the
//! value's CAS token), `ms <key> <len> T<ttl>` (with `ME` for add, `MR` for replace, `C<token>`
//! for compare-and-swap, `c` for an add that returns its CAS token), `ms <key> <len> MA` for
//! append, `md <key>` (with `C<token>` for compare-and-delete), `mg <key> T<ttl>` for touch, and
//! for batches `mg <key> v q O<i>` per key closed by `mn`; `stats` once per connection, for
//! the run of the server it reaches ([`crate::cas_token`]).
//!
//! Nothing here owns a socket: a command is encoded into a byte buffer and replies are read from
//! any `AsyncRead`, so the `connection` module decides how bytes travel and the tests below
//! check the encoding and parsing on plain byte buffers.

use crate::cas_token::ServerInstance;
use crate::error::McError;
use bytes::{Bytes, BytesMut};
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt};

/// memcached's limit on key length, in bytes.
pub const MAX_KEY_LEN: usize = 250;
/// Longest TTL sent; memcached reads larger values as absolute Unix times.
const MAX_TTL_SECS: u32 = 30 * 24 * 3600;
/// Longest response header line accepted (they are short: `VA <len> O<n>`).
const MAX_LINE: usize = 1024;
/// Largest value accepted from a server, to bound memory on a corrupt length.
const MAX_VALUE_LEN: usize = 128 << 20;
/// Most lines of a `stats` reply read (memcached 1.6 sends about 80).
const MAX_STATS_LINES: usize = 1024;

/// Rejects keys memcached's text protocol cannot carry, before anything is sent.
pub(crate) fn check_key(key: &[u8]) -> Result<(), McError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(McError::Protocol(format!(
            "key length {} not in 1..=250",
            key.len()
        )));
    }
    if key.iter().any(|&b| b <= b' ' || b == 0x7f) {
        return Err(McError::Protocol(
            "key contains whitespace or control bytes".into(),
        ));
    }
    Ok(())
}

/// Which store a `Store` command is: whatever is there, only when nothing is, or only when
/// something is; or (`Cas`) only when the value is still the one read with that CAS token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreMode {
    Set,
    /// Not retried: a retry whose first attempt landed reads "already there" (a fill lease
    /// another node holds, to its caller).
    Add,
    /// An add whose caller reads "already there" as "look at what is there", so a retry that
    /// finds its own first attempt is harmless: retried like a set.
    AddRetried,
    /// An add that returns the CAS token memcached gave the value it stored (`ME c`), for a
    /// claimant that later deletes its value only if it is still the one it stored
    /// ([`Command::DeleteCas`]). Not retried, as [`StoreMode::Add`].
    AddToken,
    Replace,
    /// Compare-and-swap: stored only if the value's CAS token is still this one. A retry whose
    /// first attempt landed reads "changed", which its caller reads again: retried like a set.
    Cas(u64),
}

/// What a compare-and-swap ([`StoreMode::Cas`]) or a compare-and-delete ([`Command::DeleteCas`])
/// did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasOutcome {
    /// The value was still the one read with the token: replaced (or deleted).
    Stored,
    /// Another write (or a touch) changed the value since it was read: nothing stored (or
    /// deleted).
    Changed,
    /// The key is gone (deleted or expired since it was read): nothing stored (or deleted).
    Gone,
}

/// One request, so a single exchange routine serves every call (and its retry).
/// Keys are checked by [`check_key`] before a command is built.
pub(crate) enum Command<'a> {
    Get(&'a [u8]),
    /// A get that also asks for the value's CAS token (`mg <key> v c`).
    Gets(&'a [u8]),
    GetMulti(&'a [&'a [u8]]),
    Store {
        key: &'a [u8],
        value: &'a [u8],
        ttl: u32,
        mode: StoreMode,
    },
    Delete(&'a [u8]),
    /// Deletes the value only if its CAS token is still this one (`md <key> C<token>`).
    DeleteCas(&'a [u8], u64),
    Touch(&'a [u8], u32),
    /// Appends to an existing value (the value keeps its TTL); a missing key is not stored.
    Append {
        key: &'a [u8],
        value: &'a [u8],
    },
    /// The server's statistics, read for the run they describe ([`ServerInstance`]): once per
    /// connection, when it opens.
    Stats,
}

impl Command<'_> {
    /// Whether sending the command twice has the effect of sending it once, and the second
    /// reply means to its caller what the first would have, which is what allows the pool to
    /// retry it on a fresh connection (not a lease's add, nor an append, which would append
    /// twice).
    pub(crate) fn is_idempotent(&self) -> bool {
        !matches!(
            self,
            Command::Store {
                mode: StoreMode::Add | StoreMode::AddToken,
                ..
            } | Command::Append { .. }
        )
    }

    /// Appends the command's bytes to `out`, so that it leaves in one write.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Command::Get(key) => put(out, &[b"mg ", key, b" v\r\n"]),
            Command::Gets(key) => put(out, &[b"mg ", key, b" v c\r\n"]),
            Command::GetMulti(keys) => {
                for (i, key) in keys.iter().enumerate() {
                    put(out, &[b"mg ", key, b" v q O"]);
                    put_number(out, i);
                    put(out, &[b"\r\n"]);
                }
                put(out, &[b"mn\r\n"]);
            }
            Command::Store {
                key,
                value,
                ttl,
                mode,
            } => {
                put(out, &[b"ms ", key, b" "]);
                put_number(out, value.len());
                put(out, &[b" T"]);
                put_number(out, ttl.min(MAX_TTL_SECS));
                match mode {
                    StoreMode::Set => {}
                    StoreMode::Add | StoreMode::AddRetried => put(out, &[b" ME"]),
                    StoreMode::AddToken => put(out, &[b" ME c"]),
                    StoreMode::Replace => put(out, &[b" MR"]),
                    StoreMode::Cas(token) => {
                        put(out, &[b" C"]);
                        put_number(out, token);
                    }
                }
                put(out, &[b"\r\n", value, b"\r\n"]);
            }
            Command::Delete(key) => put(out, &[b"md ", key, b"\r\n"]),
            Command::DeleteCas(key, token) => {
                put(out, &[b"md ", key, b" C"]);
                put_number(out, token);
                put(out, &[b"\r\n"]);
            }
            Command::Touch(key, ttl) => {
                put(out, &[b"mg ", key, b" T"]);
                put_number(out, ttl.min(MAX_TTL_SECS));
                put(out, &[b"\r\n"]);
            }
            Command::Append { key, value } => {
                put(out, &[b"ms ", key, b" "]);
                put_number(out, value.len());
                put(out, &[b" MA\r\n", value, b"\r\n"]);
            }
            Command::Stats => put(out, &[b"stats\r\n"]),
        }
    }
}

/// Appends the literal and key parts of a command.
fn put(out: &mut Vec<u8>, parts: &[&[u8]]) {
    for part in parts {
        out.extend_from_slice(part);
    }
}

/// Appends `n` in decimal: the lengths, TTLs and batch indexes a command carries.
fn put_number(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// What a command's reply says, by command: a value for `Get`, values in key order for
/// `GetMulti`, and stored / found for the others.
#[derive(Debug, PartialEq)]
pub(crate) enum Reply {
    Value(Option<Bytes>),
    /// A value and its CAS token (`Gets`).
    ValueCas(Option<(Bytes, u64)>),
    Values(Vec<Option<Bytes>>),
    Flag(bool),
    Cas(CasOutcome),
    /// The CAS token of the value an add stored, `None` when it stored nothing
    /// ([`StoreMode::AddToken`]).
    Token(Option<u64>),
    /// The run of the server a `stats` reply describes.
    Instance(ServerInstance),
}

/// Room kept free in the read buffer before each read: a read fills whatever the buffer has
/// room for, so one `read` brings in many replies of a batch (or several batches' worth).
const READ_ROOM: usize = 16 * 1024;

/// Reads replies from one connection's incoming bytes, and remembers whether the current
/// reply has begun: a failure before its first byte means the request may never have reached
/// the server, which is when the pool may retry.
///
/// The bytes arrive in one growing buffer and are parsed where they lie: a response line is a
/// slice of it, and a value is split off it (`BytesMut::split_to`), so a value reaches its
/// caller without being copied (measured: copying each value out of a `BufReader` and
/// allocating each line cost about 2,000 instructions per hit). A value shares the buffer's
/// allocation until the buffer moves on; a caller that keeps a value long (Lacquer's memory
/// tier, when it promotes one) copies it into its own allocation, and one that keeps a few
/// values to recognise them (Lacquer's `decoded_values`) bounds how many and how large.
pub(crate) struct ReplyReader<R> {
    inner: R,
    /// Bytes read and not yet parsed.
    buf: BytesMut,
    /// Whether any byte of the current exchange's response has arrived.
    read_any: bool,
}

impl<R: AsyncRead + Unpin> ReplyReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        ReplyReader {
            inner,
            buf: BytesMut::new(),
            read_any: false,
        }
    }

    /// Starts a new exchange, before its command is written: nothing of its reply has arrived.
    pub(crate) fn start_exchange(&mut self) {
        self.read_any = !self.buf.is_empty();
    }

    /// Whether any byte of the current exchange's reply has arrived.
    pub(crate) fn reply_started(&self) -> bool {
        self.read_any
    }

    /// Reads the whole reply to `command`.
    pub(crate) async fn read_reply(&mut self, command: &Command<'_>) -> Result<Reply, McError> {
        match command {
            Command::Get(_) => self.read_value().await.map(Reply::Value),
            Command::Gets(_) => self.read_value_cas().await.map(Reply::ValueCas),
            Command::GetMulti(keys) => self.read_batch(keys.len()).await.map(Reply::Values),
            Command::Store {
                mode: StoreMode::Cas(_),
                ..
            } => self.read_cas().await.map(Reply::Cas),
            Command::Store {
                mode: StoreMode::AddToken,
                ..
            } => self.read_token().await.map(Reply::Token),
            Command::Store { .. } | Command::Append { .. } => {
                self.read_flag("HD", "NS").await.map(Reply::Flag)
            }
            Command::Delete(_) => self.read_flag("HD", "NF").await.map(Reply::Flag),
            Command::DeleteCas(..) => self.read_cas().await.map(Reply::Cas),
            Command::Touch(..) => self.read_flag("HD", "EN").await.map(Reply::Flag),
            Command::Stats => self.read_instance().await.map(Reply::Instance),
        }
    }

    /// Reads more bytes into the buffer, with room for at least `want` more; end of stream
    /// is an I/O error (a reply was expected).
    async fn fill(&mut self, want: usize) -> Result<(), McError> {
        self.buf.reserve(want.max(READ_ROOM));
        let n = self.inner.read_buf(&mut self.buf).await?;
        if n == 0 {
            let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed");
            return Err(McError::Io(eof));
        }
        self.read_any = true;
        Ok(())
    }

    /// Reads one `\r\n`-terminated response line and removes it from the buffer; the line
    /// (without its terminator) is returned as its own bytes.
    async fn read_line(&mut self) -> Result<BytesMut, McError> {
        loop {
            let window = &self.buf[..self.buf.len().min(MAX_LINE)];
            if let Some(end) = memchr::memchr(b'\n', window) {
                if end == 0 || self.buf[end - 1] != b'\r' {
                    return Err(McError::Protocol("response line not ended by CRLF".into()));
                }
                let mut line = self.buf.split_to(end + 1);
                line.truncate(end - 1);
                return Ok(line);
            }
            if self.buf.len() >= MAX_LINE {
                return Err(McError::Protocol("response line too long".into()));
            }
            self.fill(0).await?;
        }
    }

    /// Reads `len` data bytes and their `\r\n` terminator; the data is split off the buffer,
    /// not copied.
    async fn read_data(&mut self, len: &str) -> Result<Bytes, McError> {
        let len: usize = len
            .parse()
            .ok()
            .filter(|&n| n <= MAX_VALUE_LEN)
            .ok_or_else(|| McError::Protocol(format!("bad value length {len:?}")))?;
        while self.buf.len() < len + 2 {
            // room for the rest of this value at once, so it arrives in one allocation
            let missing = len + 2 - self.buf.len();
            self.fill(missing).await?;
        }
        let mut data = self.buf.split_to(len + 2);
        if &data[len..] != b"\r\n" {
            return Err(McError::Protocol("value not terminated by CRLF".into()));
        }
        data.truncate(len);
        Ok(data.freeze())
    }

    /// Reads the reply to `mg <key> v`: `VA <len> ...` and data, or `EN`.
    async fn read_value(&mut self) -> Result<Option<Bytes>, McError> {
        let line = self.read_line().await?;
        let line = text(&line)?;
        if line == "EN" {
            return Ok(None);
        }
        let mut tokens = line.split(' ');
        match (tokens.next(), tokens.next()) {
            (Some("VA"), Some(len)) => self.read_data(len).await.map(Some),
            _ => Err(unexpected(line)),
        }
    }

    /// Reads the reply to `mg <key> v c`: `VA <len> ... c<token> ...` and data, or `EN`.
    async fn read_value_cas(&mut self) -> Result<Option<(Bytes, u64)>, McError> {
        let line = self.read_line().await?;
        let line = text(&line)?;
        if line == "EN" {
            return Ok(None);
        }
        let mut tokens = line.split(' ');
        let len = match (tokens.next(), tokens.next()) {
            (Some("VA"), Some(len)) => len,
            _ => return Err(unexpected(line)),
        };
        let token = tokens
            .find_map(|f| f.strip_prefix('c'))
            .and_then(|t| t.parse::<u64>().ok())
            .ok_or_else(|| McError::Protocol(format!("no CAS token in {line:?}")))?;
        Ok(Some((self.read_data(len).await?, token)))
    }

    /// Reads the reply to an add that returns its token (`ms <key> ... ME c`): `HD c<token>`
    /// stored, `NS` not stored (memcached 1.6.18 says `NS c0`).
    async fn read_token(&mut self) -> Result<Option<u64>, McError> {
        let line = self.read_line().await?;
        let line = text(&line)?;
        let mut tokens = line.split(' ');
        match tokens.next() {
            Some("NS") => return Ok(None),
            Some("HD") => {}
            _ => return Err(unexpected(line)),
        }
        tokens
            .find_map(|f| f.strip_prefix('c'))
            .and_then(|t| t.parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| McError::Protocol(format!("no CAS token in {line:?}")))
    }

    /// Reads the reply to a compare-and-swap or compare-and-delete: `HD` stored (deleted), `EX`
    /// changed since, `NF` gone.
    async fn read_cas(&mut self) -> Result<CasOutcome, McError> {
        let line = self.read_line().await?;
        match text(&line)? {
            "HD" => Ok(CasOutcome::Stored),
            "EX" => Ok(CasOutcome::Changed),
            "NF" => Ok(CasOutcome::Gone),
            l => Err(unexpected(l)),
        }
    }

    /// Reads the replies to a `mg <key> v q O<i>` batch up to the closing `MN`.
    async fn read_batch(&mut self, count: usize) -> Result<Vec<Option<Bytes>>, McError> {
        let mut values = vec![None; count];
        let mut next = 0;
        loop {
            let line = self.read_line().await?;
            let line = text(&line)?;
            if line == "MN" {
                return Ok(values);
            }
            let mut tokens = line.split(' ');
            let len = match (tokens.next(), tokens.next()) {
                (Some("VA"), Some(len)) => len,
                _ => return Err(unexpected(line)),
            };
            // Hits come back in request order, each tagged with its index.
            let index = tokens
                .find_map(|f| f.strip_prefix('O'))
                .and_then(|i| i.parse::<usize>().ok())
                .filter(|&i| i >= next && i < count)
                .ok_or_else(|| McError::Protocol(format!("bad opaque in {line:?}")))?;
            values[index] = Some(self.read_data(len).await?);
            next = index + 1;
        }
    }

    /// Reads a `stats` reply (`STAT <name> <value>` lines up to `END`) for the run it describes:
    /// `pid`, and `time - uptime`, the start time, constant for a run. At most
    /// [`MAX_STATS_LINES`] lines (memcached 1.6 sends about 80).
    async fn read_instance(&mut self) -> Result<ServerInstance, McError> {
        let (mut pid, mut uptime, mut time) = (0u64, 0i64, 0i64);
        for _ in 0..MAX_STATS_LINES {
            let line = self.read_line().await?;
            let line = text(&line)?;
            if line == "END" {
                // wrapping: numbers a server made up must not panic (overflow checks) or fail
                return Ok(ServerInstance::new(pid, time.wrapping_sub(uptime)));
            }
            let mut fields = line.split(' ');
            match (fields.next(), fields.next(), fields.next()) {
                (Some("STAT"), Some("pid"), Some(v)) => pid = v.parse().unwrap_or(0),
                (Some("STAT"), Some("uptime"), Some(v)) => uptime = v.parse().unwrap_or(0),
                (Some("STAT"), Some("time"), Some(v)) => time = v.parse().unwrap_or(0),
                (Some("STAT"), Some(_), _) => {}
                _ => return Err(unexpected(line)),
            }
        }
        Err(McError::Protocol("stats reply too long".into()))
    }

    /// Reads a one-line reply that is either `yes` (true) or `no` (false).
    async fn read_flag(&mut self, yes: &str, no: &str) -> Result<bool, McError> {
        let line = self.read_line().await?;
        match text(&line)? {
            l if l == yes => Ok(true),
            l if l == no => Ok(false),
            l => Err(unexpected(l)),
        }
    }
}

/// A response line as text (they are ASCII).
fn text(line: &[u8]) -> Result<&str, McError> {
    std::str::from_utf8(line).map_err(|_| McError::Protocol("non-UTF-8 response line".into()))
}

/// Maps an unexpected response line to the matching error.
fn unexpected(line: &str) -> McError {
    match line.strip_prefix("SERVER_ERROR") {
        Some(msg) => McError::ServerError(msg.trim().to_string()),
        None => McError::Protocol(format!("unexpected response {line:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(command: Command<'_>) -> String {
        let mut out = Vec::new();
        command.encode(&mut out);
        String::from_utf8(out).unwrap()
    }

    async fn reply_to(command: Command<'_>, input: &[u8]) -> Result<Reply, McError> {
        ReplyReader::new(input).read_reply(&command).await
    }

    fn values(list: &[Option<&'static [u8]>]) -> Reply {
        Reply::Values(list.iter().map(|v| v.map(Bytes::from_static)).collect())
    }

    #[test]
    fn commands_encode_as_meta_protocol_lines() {
        assert_eq!(encoded(Command::Get(b"k")), "mg k v\r\n");
        assert_eq!(
            encoded(Command::GetMulti(&[b"a", b"b", b"a"])),
            "mg a v q O0\r\nmg b v q O1\r\nmg a v q O2\r\nmn\r\n"
        );
        let keys: Vec<&[u8]> = vec![b"k"; 12];
        let batch = encoded(Command::GetMulti(&keys));
        assert!(batch.ends_with("mg k v q O9\r\nmg k v q O10\r\nmg k v q O11\r\nmn\r\n"));
        let store = |mode, ttl| Command::Store {
            key: b"k",
            value: b"v\r\nEN\r\n",
            ttl,
            mode,
        };
        assert_eq!(
            encoded(store(StoreMode::Set, 60)),
            "ms k 7 T60\r\nv\r\nEN\r\n\r\n"
        );
        assert_eq!(
            encoded(store(StoreMode::Add, 0)),
            "ms k 7 T0 ME\r\nv\r\nEN\r\n\r\n"
        );
        assert_eq!(
            encoded(store(StoreMode::Replace, 3)),
            "ms k 7 T3 MR\r\nv\r\nEN\r\n\r\n"
        );
        // More than 30 days would be read as an absolute time: capped at 30 days.
        assert_eq!(
            encoded(store(StoreMode::Set, 31 * 24 * 3600)),
            "ms k 7 T2592000\r\nv\r\nEN\r\n\r\n"
        );
        let big = vec![b'x'; 1_048_576];
        let store_big = Command::Store {
            key: b"big",
            value: &big,
            ttl: 2_591_999,
            mode: StoreMode::Set,
        };
        assert!(encoded(store_big).starts_with("ms big 1048576 T2591999\r\nxx"));
        assert_eq!(
            encoded(store(StoreMode::AddRetried, 3)),
            "ms k 7 T3 ME\r\nv\r\nEN\r\n\r\n"
        );
        assert_eq!(
            encoded(store(StoreMode::Cas(18_446_744_073_709_551_615), 60)),
            "ms k 7 T60 C18446744073709551615\r\nv\r\nEN\r\n\r\n"
        );
        assert_eq!(encoded(Command::Gets(b"k")), "mg k v c\r\n");
        assert_eq!(encoded(Command::Delete(b"k")), "md k\r\n");
        assert_eq!(
            encoded(store(StoreMode::AddToken, 4)),
            "ms k 7 T4 ME c\r\nv\r\nEN\r\n\r\n"
        );
        assert_eq!(encoded(Command::DeleteCas(b"k", 42)), "md k C42\r\n");
        assert_eq!(encoded(Command::Touch(b"k", 5)), "mg k T5\r\n");
        assert_eq!(encoded(Command::Touch(b"k", u32::MAX)), "mg k T2592000\r\n");
        let append = Command::Append {
            key: b"k",
            value: b"ab",
        };
        assert_eq!(encoded(append), "ms k 2 MA\r\nab\r\n");
    }

    #[tokio::test]
    async fn one_line_replies_mean_what_each_command_expects() {
        let value = reply_to(Command::Get(b"k"), b"VA 4 f0\r\nab\r\n\r\n").await;
        assert_eq!(
            value.unwrap(),
            Reply::Value(Some(Bytes::from_static(b"ab\r\n")))
        );
        let miss = reply_to(Command::Get(b"k"), b"EN\r\n").await;
        assert_eq!(miss.unwrap(), Reply::Value(None));
        let store = Command::Store {
            key: b"k",
            value: b"v",
            ttl: 0,
            mode: StoreMode::Add,
        };
        assert_eq!(reply_to(store, b"HD\r\n").await.unwrap(), Reply::Flag(true));
        let store = Command::Store {
            key: b"k",
            value: b"v",
            ttl: 0,
            mode: StoreMode::Add,
        };
        assert_eq!(
            reply_to(store, b"NS\r\n").await.unwrap(),
            Reply::Flag(false)
        );
        let delete = |input| reply_to(Command::Delete(b"k"), input);
        assert_eq!(delete(b"HD\r\n").await.unwrap(), Reply::Flag(true));
        assert_eq!(delete(b"NF\r\n").await.unwrap(), Reply::Flag(false));
        let touch = |input| reply_to(Command::Touch(b"k", 1), input);
        assert_eq!(touch(b"HD\r\n").await.unwrap(), Reply::Flag(true));
        assert_eq!(touch(b"EN\r\n").await.unwrap(), Reply::Flag(false));
        // One command's "no" is another's nonsense.
        let wrong = delete(b"EN\r\n").await;
        assert!(matches!(wrong, Err(McError::Protocol(_))), "{wrong:?}");
        let wrong = reply_to(Command::Get(b"k"), b"HD\r\n").await;
        assert!(matches!(wrong, Err(McError::Protocol(_))), "{wrong:?}");
    }

    #[tokio::test]
    async fn a_gets_reply_carries_the_cas_token_and_a_cas_reply_says_what_happened() {
        let gets = |input| reply_to(Command::Gets(b"k"), input);
        assert_eq!(
            gets(b"VA 4 c42\r\nab\r\n\r\n").await.unwrap(),
            Reply::ValueCas(Some((Bytes::from_static(b"ab\r\n"), 42)))
        );
        // the token wherever the flags put it
        assert_eq!(
            gets(b"VA 1 t-1 c7 f0\r\nx\r\n").await.unwrap(),
            Reply::ValueCas(Some((Bytes::from_static(b"x"), 7)))
        );
        assert_eq!(gets(b"EN\r\n").await.unwrap(), Reply::ValueCas(None));
        for input in [&b"VA 1\r\nx\r\n"[..], b"VA 1 cx\r\nx\r\n", b"HD\r\n"] {
            let reply = gets(input).await;
            assert!(matches!(reply, Err(McError::Protocol(_))), "{reply:?}");
        }
        let cas = |input| {
            reply_to(
                Command::Store {
                    key: b"k",
                    value: b"v",
                    ttl: 0,
                    mode: StoreMode::Cas(3),
                },
                input,
            )
        };
        assert_eq!(
            cas(b"HD\r\n").await.unwrap(),
            Reply::Cas(CasOutcome::Stored)
        );
        assert_eq!(
            cas(b"EX\r\n").await.unwrap(),
            Reply::Cas(CasOutcome::Changed)
        );
        assert_eq!(cas(b"NF\r\n").await.unwrap(), Reply::Cas(CasOutcome::Gone));
        let wrong = cas(b"NS\r\n").await;
        assert!(matches!(wrong, Err(McError::Protocol(_))), "{wrong:?}");
        let delete = |input| reply_to(Command::DeleteCas(b"k", 3), input);
        assert_eq!(
            delete(b"HD\r\n").await.unwrap(),
            Reply::Cas(CasOutcome::Stored)
        );
        assert_eq!(
            delete(b"EX\r\n").await.unwrap(),
            Reply::Cas(CasOutcome::Changed)
        );
        assert_eq!(
            delete(b"NF\r\n").await.unwrap(),
            Reply::Cas(CasOutcome::Gone)
        );
    }

    #[tokio::test]
    async fn a_stats_reply_names_the_run_of_the_server_by_pid_and_start_time() {
        assert_eq!(encoded(Command::Stats), "stats\r\n");
        let stats = |input| reply_to(Command::Stats, input);
        let run = stats(b"STAT pid 4242\r\nSTAT uptime 60\r\nSTAT time 1796596837\r\nSTAT version 1.6.18\r\nEND\r\n");
        assert_eq!(
            run.await.unwrap(),
            Reply::Instance(ServerInstance::new(4242, 1_796_596_777))
        );
        // the same run read a minute later
        let later = stats(b"STAT uptime 120\r\nSTAT pid 4242\r\nSTAT time 1796596897\r\nEND\r\n");
        assert_eq!(
            later.await.unwrap(),
            Reply::Instance(ServerInstance::new(4242, 1_796_596_777))
        );
        // not memcached's: every such server is one run, as before runs were told apart
        let bare = stats(b"STAT curr_items 3\r\nEND\r\n");
        assert_eq!(
            bare.await.unwrap(),
            Reply::Instance(ServerInstance::default())
        );
        for input in [
            &b"ERROR\r\n"[..],
            b"STAT pid 1\r\nVA 3\r\n",
            b"STAT pid 1\r\n",
        ] {
            let reply = stats(input).await;
            assert!(reply.is_err(), "{reply:?}");
        }
        let endless = "STAT x 1\r\n".repeat(MAX_STATS_LINES + 1);
        let reply = stats(endless.as_bytes()).await;
        assert!(matches!(reply, Err(McError::Protocol(_))), "{reply:?}");
    }

    #[tokio::test]
    async fn an_add_that_returns_its_token_reads_it_from_its_reply() {
        let add = |input| {
            reply_to(
                Command::Store {
                    key: b"k",
                    value: b"v",
                    ttl: 0,
                    mode: StoreMode::AddToken,
                },
                input,
            )
        };
        assert_eq!(add(b"HD c17\r\n").await.unwrap(), Reply::Token(Some(17)));
        assert_eq!(add(b"NS\r\n").await.unwrap(), Reply::Token(None));
        assert_eq!(add(b"NS c0\r\n").await.unwrap(), Reply::Token(None));
        for input in [&b"HD\r\n"[..], b"HD cx\r\n", b"EX\r\n"] {
            let reply = add(input).await;
            assert!(matches!(reply, Err(McError::Protocol(_))), "{reply:?}");
        }
    }

    #[test]
    fn only_a_leases_add_and_an_append_are_not_retried() {
        let store = |mode| Command::Store {
            key: b"k",
            value: b"v",
            ttl: 0,
            mode,
        };
        assert!(!store(StoreMode::Add).is_idempotent());
        assert!(!store(StoreMode::AddToken).is_idempotent());
        assert!(!Command::Append {
            key: b"k",
            value: b"v"
        }
        .is_idempotent());
        for mode in [
            StoreMode::Set,
            StoreMode::AddRetried,
            StoreMode::Replace,
            StoreMode::Cas(1),
        ] {
            assert!(store(mode).is_idempotent(), "{mode:?}");
        }
        assert!(Command::Gets(b"k").is_idempotent());
        assert!(Command::DeleteCas(b"k", 1).is_idempotent());
    }

    #[tokio::test]
    async fn a_batch_reply_places_hits_by_their_opaque() {
        let keys: [&[u8]; 4] = [b"a", b"b", b"c", b"d"];
        let reply = reply_to(
            Command::GetMulti(&keys),
            b"VA 2 O1\r\nab\r\nVA 0 O3\r\n\r\nMN\r\n",
        )
        .await;
        assert_eq!(
            reply.unwrap(),
            values(&[None, Some(b"ab"), None, Some(b"")])
        );
        let none = reply_to(Command::GetMulti(&keys), b"MN\r\n").await;
        assert_eq!(none.unwrap(), values(&[None, None, None, None]));
    }

    #[tokio::test]
    async fn a_batch_reply_out_of_order_out_of_range_or_untagged_is_rejected() {
        let keys: [&[u8]; 3] = [b"a", b"b", b"c"];
        for input in [
            &b"VA 1 O2\r\nx\r\nVA 1 O1\r\ny\r\nMN\r\n"[..],
            b"VA 1 O1\r\nx\r\nVA 1 O1\r\ny\r\nMN\r\n",
            b"VA 1 O3\r\nx\r\nMN\r\n",
            b"VA 1\r\nx\r\nMN\r\n",
            b"VA 1 Ox\r\nx\r\nMN\r\n",
            b"EN\r\nMN\r\n",
        ] {
            let reply = reply_to(Command::GetMulti(&keys), input).await;
            assert!(matches!(reply, Err(McError::Protocol(_))), "{reply:?}");
        }
    }

    #[tokio::test]
    async fn server_errors_are_told_apart_from_nonsense() {
        let reply = reply_to(Command::Delete(b"k"), b"SERVER_ERROR out of memory\r\n").await;
        assert!(
            matches!(&reply, Err(McError::ServerError(m)) if m == "out of memory"),
            "{reply:?}"
        );
        let reply = reply_to(Command::Delete(b"k"), b"CLIENT_ERROR bad command\r\n").await;
        assert!(matches!(reply, Err(McError::Protocol(_))), "{reply:?}");
    }

    #[tokio::test]
    async fn malformed_values_are_protocol_errors() {
        let get = |input| reply_to(Command::Get(b"k"), input);
        for input in [
            // Not terminated by CRLF where the length says it ends.
            &b"VA 2\r\nabcd\r\n"[..],
            // A length that is not a number, or beyond the bound.
            b"VA x\r\n",
            b"VA 134217729\r\n",
            // A line with no end in sight.
            &[b'V'; 2000],
            // Not UTF-8.
            b"VA \xff\r\n",
        ] {
            let reply = get(input).await;
            assert!(matches!(reply, Err(McError::Protocol(_))), "{reply:?}");
        }
    }

    #[tokio::test]
    async fn a_reply_cut_short_is_an_io_error_that_knows_whether_it_had_begun() {
        let command = Command::Get(b"k");
        let mut silent = ReplyReader::new(&b""[..]);
        silent.start_exchange();
        let reply = silent.read_reply(&command).await;
        assert!(matches!(reply, Err(McError::Io(_))), "{reply:?}");
        assert!(!silent.reply_started(), "nothing arrived: a retry is safe");

        let mut cut = ReplyReader::new(&b"VA 5\r\nab"[..]);
        cut.start_exchange();
        let reply = cut.read_reply(&command).await;
        assert!(matches!(reply, Err(McError::Io(_))), "{reply:?}");
        assert!(cut.reply_started(), "the server had begun answering");

        // One byte is enough to know the request reached the server.
        let mut half_line = ReplyReader::new(&b"V"[..]);
        half_line.start_exchange();
        let reply = half_line.read_reply(&command).await;
        assert!(matches!(reply, Err(McError::Io(_))), "{reply:?}");
        assert!(half_line.reply_started());
    }

    /// Gives its bytes a few at a time, as a socket may: every reply split across reads.
    struct Trickle<'a> {
        bytes: &'a [u8],
        step: usize,
    }

    impl tokio::io::AsyncRead for Trickle<'_> {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            let n = self.step.min(self.bytes.len()).min(buf.remaining());
            buf.put_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn replies_split_across_reads_anywhere_parse_the_same() {
        let keys: [&[u8]; 3] = [b"a", b"b", b"c"];
        let big = vec![b'x'; 40_000];
        let mut input = b"VA 5 O0\r\nab\r\nc\r\n".to_vec();
        input.extend_from_slice(b"VA 40000 O2\r\n");
        input.extend_from_slice(&big);
        input.extend_from_slice(b"\r\nMN\r\nVA 2\r\nhi\r\nEN\r\n");
        for step in [1, 2, 3, 7, 4096, 1 << 20] {
            let mut reader = ReplyReader::new(Trickle {
                bytes: &input,
                step,
            });
            let batch = reader.read_reply(&Command::GetMulti(&keys)).await;
            assert_eq!(
                batch.unwrap(),
                Reply::Values(vec![
                    Some(Bytes::from_static(b"ab\r\nc")),
                    None,
                    Some(Bytes::from(big.clone())),
                ]),
                "step {step}"
            );
            // the replies after it on the same connection are read from where it ended
            let value = reader.read_reply(&Command::Get(b"k")).await.unwrap();
            assert_eq!(value, Reply::Value(Some(Bytes::from_static(b"hi"))));
            let miss = reader.read_reply(&Command::Get(b"k")).await.unwrap();
            assert_eq!(miss, Reply::Value(None));
        }
    }

    #[test]
    fn keys_memcached_cannot_carry_are_rejected() {
        assert!(check_key(&[b'k'; MAX_KEY_LEN]).is_ok());
        assert!(check_key(b"lacquer:0123abcd:fill:x").is_ok());
        let long = [b'k'; MAX_KEY_LEN + 1];
        for key in [
            &b""[..],
            &long,
            b"a b",
            b"a\tb",
            b"a\r\n",
            b"a\0b",
            b"a\x7fb",
        ] {
            let checked = check_key(key);
            assert!(matches!(checked, Err(McError::Protocol(_))), "{key:?}");
        }
    }
}
