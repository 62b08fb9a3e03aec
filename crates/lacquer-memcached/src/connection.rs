//! One TCP connection to a memcached server: opened within a time bound, counted while it
//! lives, and carrying one exchange (a command out, its whole reply in) at a time.
//!
//! Whether a connection may be used again is not decided here but by [`crate::pool`], which
//! owns every connection between exchanges.

use crate::cas_token::ServerInstance;
use crate::error::McError;
use crate::protocol::{Command, Reply, ReplyReader};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// A command buffer that grew past this (a large value was stored) is not kept for the next.
const KEPT_COMMAND_BUFFER: usize = 64 * 1024;

/// An open connection: replies read into its own buffer, commands encoded into one and written
/// whole.
pub(crate) struct Connection {
    reader: ReplyReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// The bytes of the command being sent, kept between exchanges so a command allocates nothing.
    command: Vec<u8>,
    /// The runtime whose reactor the socket is registered with (see the pool's rules).
    runtime: tokio::runtime::Id,
    /// The run of the server this connection reaches, read when it opened.
    instance: ServerInstance,
    /// Its place among the connections its pool opened, counted once it had opened.
    order: u64,
    /// How many connections its pool had opened when the last command was sent over it.
    sent_after: u64,
    _open: OpenCount,
}

impl Connection {
    /// Connects to `addr` within `connect_timeout`, from a task of `runtime`; `count` (reserved
    /// by the pool before connecting) counts the connection until it is dropped, or is given
    /// back if it fails. Any failure to connect is [`McError::Connect`] (the cause is logged at
    /// debug level). Once connected, the server's `stats` are read for the run it is
    /// ([`crate::cas_token`]): one round trip per connection, bounded by the caller's deadline.
    pub(crate) async fn open(
        addr: SocketAddr,
        connect_timeout: Duration,
        count: OpenCount,
        runtime: tokio::runtime::Id,
    ) -> Result<Connection, McError> {
        let stream = match tokio::time::timeout(connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                log::debug!("memcached {addr}: connect failed: {e}");
                return Err(McError::Connect);
            }
            Err(_) => {
                log::debug!("memcached {addr}: connect timed out");
                return Err(McError::Connect);
            }
        };
        stream.set_nodelay(true)?;
        let (r, w) = stream.into_split();
        let mut conn = Connection {
            reader: ReplyReader::new(r),
            writer: w,
            command: Vec::new(),
            runtime,
            instance: ServerInstance::default(),
            order: u64::MAX,
            sent_after: 0,
            _open: count,
        };
        match conn.exchange(&Command::Stats).await? {
            Reply::Instance(instance) => conn.instance = instance,
            _ => unreachable!("stats yield the server's run"),
        }
        Ok(conn)
    }

    /// The run of the server this connection reaches.
    pub(crate) fn instance(&self) -> ServerInstance {
        self.instance
    }

    /// Its place among the connections its pool opened (`u64::MAX` until the pool numbers it).
    pub(crate) fn order(&self) -> u64 {
        self.order
    }

    /// Numbers it among the connections its pool opened.
    pub(crate) fn set_order(&mut self, order: u64) {
        self.order = order;
    }

    /// How many connections its pool had opened when the last command was sent over it.
    pub(crate) fn sent_after(&self) -> u64 {
        self.sent_after
    }

    /// Notes how many connections its pool has opened, before a command is sent over it.
    pub(crate) fn set_sent_after(&mut self, opened: u64) {
        self.sent_after = opened;
    }

    /// The runtime whose reactor this connection's socket is registered with.
    pub(crate) fn runtime(&self) -> tokio::runtime::Id {
        self.runtime
    }

    /// Sends `command` and reads its whole reply.
    pub(crate) async fn exchange(&mut self, command: &Command<'_>) -> Result<Reply, McError> {
        self.reader.start_exchange();
        if self.command.capacity() > KEPT_COMMAND_BUFFER {
            self.command = Vec::new();
        }
        self.command.clear();
        command.encode(&mut self.command);
        let (writer, reader, bytes) = (&mut self.writer, &mut self.reader, &self.command);
        if let Command::GetMulti(_) = command {
            // Read while writing: a big batch of large values could
            // otherwise fill both directions' socket buffers and deadlock.
            let send = async { writer.write_all(bytes).await.map_err(McError::from) };
            let (_, reply) = tokio::try_join!(send, reader.read_reply(command))?;
            return Ok(reply);
        }
        writer.write_all(bytes).await?;
        reader.read_reply(command).await
    }

    /// Whether any byte of the last exchange's reply arrived: when none did, the command may
    /// never have reached the server (see the pool's retry rule).
    pub(crate) fn reply_started(&self) -> bool {
        self.reader.reply_started()
    }
}

/// One place in the open-connection count: taken before connecting (so that callers racing to
/// open cannot pass the pool's bound), given back when the connection, or the failed attempt,
/// is dropped.
pub(crate) struct OpenCount(Arc<AtomicUsize>);

impl OpenCount {
    /// Takes a place in `open`.
    pub(crate) fn reserve(open: &Arc<AtomicUsize>) -> OpenCount {
        open.fetch_add(1, Ordering::Relaxed);
        OpenCount(open.clone())
    }
}

impl Drop for OpenCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
