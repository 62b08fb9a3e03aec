//! One TCP connection to a memcached server: opened within a time bound, counted while it
//! lives, and carrying one exchange (a command out, its whole reply in) at a time.
//!
//! Whether a connection may be used again is not decided here but by [`crate::pool`], which
//! owns every connection between exchanges.

use crate::error::McError;
use crate::protocol::{write_command, Command, Reply, ReplyReader};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// An open connection, buffered both ways.
pub(crate) struct Connection {
    reader: ReplyReader<BufReader<OwnedReadHalf>>,
    writer: BufWriter<OwnedWriteHalf>,
    _open: OpenCount,
}

impl Connection {
    /// Connects to `addr` within `connect_timeout`; `open` counts the connection until it is
    /// dropped. Any failure is [`McError::Connect`] (the cause is logged at debug level).
    pub(crate) async fn open(
        addr: SocketAddr,
        connect_timeout: Duration,
        open: &Arc<AtomicUsize>,
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
        open.fetch_add(1, Ordering::Relaxed);
        Ok(Connection {
            reader: ReplyReader::new(BufReader::new(r)),
            writer: BufWriter::new(w),
            _open: OpenCount(open.clone()),
        })
    }

    /// Sends `command` and reads its whole reply.
    pub(crate) async fn exchange(&mut self, command: &Command<'_>) -> Result<Reply, McError> {
        self.reader.start_exchange();
        let (writer, reader) = (&mut self.writer, &mut self.reader);
        if let Command::GetMulti(_) = command {
            // Read while writing: a big batch of large values could
            // otherwise fill both directions' socket buffers and deadlock.
            let send = async { write_command(writer, command).await.map_err(McError::from) };
            let (_, reply) = tokio::try_join!(send, reader.read_reply(command))?;
            return Ok(reply);
        }
        write_command(writer, command).await?;
        reader.read_reply(command).await
    }

    /// Whether any byte of the last exchange's reply arrived: when none did, the command may
    /// never have reached the server (see the pool's retry rule).
    pub(crate) fn reply_started(&self) -> bool {
        self.reader.reply_started()
    }
}

/// Decrements the open-connection count when its connection is dropped.
struct OpenCount(Arc<AtomicUsize>);

impl Drop for OpenCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
