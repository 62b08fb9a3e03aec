// LACQUER PATCH (idle connection memory): this file is new.

//! The write buffer in front of an L4 stream, holding memory only while it holds bytes.
//!
//! tokio's `BufWriter`, which this replaces, allocates its whole capacity when the stream is
//! set up and keeps it for the connection's life: every idle keep-alive client connection kept
//! a 16 KiB buffer (Lacquer's `server.write_buffer`), the largest part of what it cost.
//! [`WriteBuffer`] writes as `BufWriter` does (a write that fits is copied in, a larger one goes
//! straight through once what is buffered has gone, vectored writes alike), with the same
//! capacity, but allocates it at the first write it keeps and frees it when a flush or a
//! shutdown has sent everything: a connection whose response was flushed holds none while it
//! waits for the next request.
//!
//! A freed buffer goes to a one-buffer spare slot of its thread, where the next connection that
//! needs one takes it: allocated and freed through mimalloc for every response, a 16 KiB block
//! alone on its page retired the page at each free and took the allocator's slow path at each
//! allocation, about 120 instructions more per 1 KB hit than the slot's thread-local access
//! (`bench/hit_instructions.sh`: 21,159 against 21,040). A thread keeps at most one spare.

use std::cell::Cell;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

thread_local! {
    /// The thread's spare buffer (empty: none), see the module doc.
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// An empty buffer of `capacity` bytes: the thread's spare one when it has that capacity.
fn take_buffer(capacity: usize) -> Vec<u8> {
    let spare = SPARE.with(Cell::take);
    if spare.capacity() == capacity {
        spare
    } else {
        Vec::with_capacity(capacity)
    }
}

/// Keeps `buf` (empty) as the thread's spare buffer; the one it replaces, if any, is freed.
fn give_back_buffer(buf: Vec<u8>) {
    debug_assert!(buf.is_empty());
    drop(SPARE.with(|spare| spare.replace(buf)));
}

/// A write buffer of `capacity` bytes over `inner`, allocated while it holds bytes (see the
/// module doc).
#[derive(Debug)]
pub(crate) struct WriteBuffer<W> {
    inner: W,
    buf: Vec<u8>,
    capacity: usize,
    /// How much of `buf` a flush in progress has written.
    written: usize,
}

impl<W: AsyncWrite + Unpin> WriteBuffer<W> {
    /// A buffer of `capacity` bytes (none: every write goes straight to `inner`), not allocated
    /// yet.
    pub(crate) fn with_capacity(capacity: usize, inner: W) -> Self {
        WriteBuffer {
            inner,
            buf: Vec::new(),
            capacity,
            written: 0,
        }
    }

    pub(crate) fn get_ref(&self) -> &W {
        &self.inner
    }

    pub(crate) fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// The stream; anything buffered is lost.
    pub(crate) fn into_inner(self) -> W {
        self.inner
    }

    fn room(&self) -> usize {
        self.capacity - self.buf.len()
    }

    /// Copies `bytes` in (they fit), allocating the buffer if it is not.
    fn keep(&mut self, bytes: &[u8]) {
        if self.buf.capacity() == 0 {
            self.buf = take_buffer(self.capacity);
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Writes out what is buffered (tokio's `BufWriter::flush_buf`).
    fn flush_buf(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut ret = Ok(());
        while self.written < self.buf.len() {
            match ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..])) {
                Ok(0) => {
                    ret = Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "failed to write the buffered data",
                    ));
                    break;
                }
                Ok(n) => self.written += n,
                Err(e) => {
                    ret = Err(e);
                    break;
                }
            }
        }
        if self.written > 0 {
            self.buf.drain(..self.written);
        }
        self.written = 0;
        Poll::Ready(ret)
    }

    /// Writes out what is buffered and frees the buffer.
    fn flush_and_free(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.flush_buf(cx))?;
        if self.buf.capacity() != 0 {
            give_back_buffer(std::mem::take(&mut self.buf));
        }
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for WriteBuffer<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.len() > self.room() {
            ready!(self.flush_buf(cx))?;
        }
        if buf.len() >= self.capacity {
            Pin::new(&mut self.inner).poll_write(cx, buf)
        } else {
            self.keep(buf);
            Poll::Ready(Ok(buf.len()))
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.inner.is_write_vectored() {
            let total_len = bufs
                .iter()
                .fold(0usize, |acc, b| acc.saturating_add(b.len()));
            if total_len > self.room() {
                ready!(self.flush_buf(cx))?;
            }
            if total_len >= self.capacity {
                Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
            } else {
                for b in bufs {
                    self.keep(b);
                }
                Poll::Ready(Ok(total_len))
            }
        } else {
            let mut iter = bufs.iter();
            let mut total_written = if let Some(buf) = iter.by_ref().find(|buf| !buf.is_empty()) {
                // the first non-empty slice: if it does not fit, flush and go on
                if buf.len() > self.room() {
                    ready!(self.flush_buf(cx))?;
                }
                if buf.len() >= self.capacity {
                    return Pin::new(&mut self.inner).poll_write(cx, buf);
                }
                self.keep(buf);
                buf.len()
            } else {
                return Poll::Ready(Ok(0));
            };
            for buf in iter {
                if buf.len() > self.room() {
                    break;
                }
                self.keep(buf);
                total_written += buf.len();
            }
            Poll::Ready(Ok(total_written))
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.flush_and_free(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.flush_and_free(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<W: AsyncRead + Unpin> AsyncRead for WriteBuffer<W> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}
