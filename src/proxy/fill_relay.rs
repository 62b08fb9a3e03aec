//! The body of a direct miss that is being stored, relayed so that the fill goes at the origin's
//! pace, not at the pace of the client that asked first.
//!
//! Other requests for the URL stream the fill as it is written (the cache lock lets them go when
//! it starts). If the origin's body were read only as fast as the first client took it, one
//! client that stops reading (a slow-read attack, a phone in a tunnel) would hold back every
//! request streaming the fill, for as long as `server.send_timeout` lets its writes wait. So two
//! halves run side by side in the request's task:
//!
//! - the **reader** reads the origin's body, runs the upstream body filters, writes each chunk
//!   into the fill and queues it for the client, without waiting for the client;
//! - the **writer** takes the queued chunks, runs the downstream body filters and writes them to
//!   the client as fast as it takes them.
//!
//! What a slow client has not taken yet is held for it (the storage keeps its own copy), at most
//! the object (`cache.max_object_size`) per relay and, across all relays at once, what the
//! [`ReadAheadBudget`] allows (a quarter of `cache.memory_size`): an attacker opening many
//! stalled connections on many large misses cannot make the node hold more than that. The
//! standard path's misses have a budget of their own, of the same size (so neither starves the
//! other): each one whose answer may run ahead of its client (Pingora's proxy tasks, turned on in
//! `cache_miss`) reserves a whole object's worth while it lasts ([`Reservation`]); when that
//! budget has no room, its fill keeps its client's pace. Hits reserve nothing: they read nothing
//! ahead of their client. Past the budget,
//! or when the fill is abandoned (the body outgrew its size limit, so nothing but the client
//! wants it), the reader stays at most [`READ_AHEAD`] bytes ahead of its client, as before: the
//! fill then goes at the client's pace again, for at most `server.send_timeout`. A client that goes away does not end the
//! fill; a failure of the origin's body ends both halves, as before, and abandons the fill. A
//! client whose write failed (given up at `send_timeout`) is ended at once, its connection shut
//! down or its HTTP/2 stream reset, rather than left silent until the fill ends. The origin's
//! connection goes back to the idle pool as soon as the body's end is read: neither a slow client
//! nor one that left keeps it from the next request.
//!
//! A body that is not being stored is relayed chunk by chunk in `direct_pass` itself: there no
//! one else waits for it.

use super::direct_pass::next_chunk;
use super::{LacquerProxy, RequestCtx};
use bytes::Bytes;
use pingora_cache::storage::MissHandler;
use pingora_core::protocols::http::v1::client::HttpSession as UpstreamSession;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Error;
use pingora_proxy::Session;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;

/// How far the reader may run ahead of the client once nothing is being stored, or once the
/// [`ReadAheadBudget`] is spent.
pub const READ_AHEAD: usize = 256 * 1024;

/// The bytes all relays together hold for clients slower than their fill, and the most they
/// may hold before each goes back to its client's pace (beyond its own [`READ_AHEAD`]).
pub struct ReadAheadBudget {
    held: AtomicUsize,
    limit: usize,
    /// Woken when the budget goes from spent to not: relays paused by it resume.
    given_back: Notify,
}

impl ReadAheadBudget {
    /// A budget of `limit` bytes, for the process's lifetime (shared by every request).
    pub fn leak(limit: usize) -> &'static ReadAheadBudget {
        Box::leak(Box::new(ReadAheadBudget {
            held: AtomicUsize::new(0),
            limit,
            given_back: Notify::new(),
        }))
    }

    /// Bytes held now, across all relays.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    fn spent(&self) -> bool {
        self.held() > self.limit
    }

    fn take(&self, bytes: usize) {
        self.held.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Gives `bytes` back; the relays the budget paused are woken when it has room again.
    fn give_back(&self, bytes: usize) {
        let before = self.held.fetch_sub(bytes, Ordering::Relaxed);
        if before > self.limit && before - bytes <= self.limit {
            self.given_back.notify_waiters();
        }
    }

    /// Reserves `bytes` while the budget has room for them, for a request of the standard path
    /// whose answer may be read ahead of its client: its fill goes on at the origin's pace while
    /// the client's reader of it keeps what the client has not taken, up to the whole object.
    /// `None` when the budget has no room: that request's fill keeps its client's pace.
    pub fn reserve(&'static self, bytes: usize) -> Option<Reservation> {
        let mut held = self.held();
        loop {
            if held.saturating_add(bytes) > self.limit {
                return None;
            }
            match self.held.compare_exchange_weak(
                held,
                held + bytes,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Reservation {
                        budget: self,
                        bytes,
                    })
                }
                Err(now) => held = now,
            }
        }
    }
}

/// Bytes of the [`ReadAheadBudget`] held for one request, given back when it ends (dropped).
pub struct Reservation {
    budget: &'static ReadAheadBudget,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// The storing of a storable answer, written into the storage's miss handler as it is relayed
/// (requests for the URL that arrive meanwhile stream it from there, as from the standard
/// path's fill).
pub(super) struct Fill {
    pub(super) miss: MissHandler,
    /// Bytes written so far.
    pub(super) len: usize,
    /// `cache.max_object_size` when the fill started: past it, the fill is abandoned.
    pub(super) limit: usize,
}

impl Fill {
    /// Writes the next chunk; `false` when the fill is to be abandoned: the storage failed, or
    /// the body outgrew the size limit (with no length announced) and no request streams it.
    /// Past the limit, the storage keeps nothing and only carries the body to the requests
    /// that stream it (`storage::memory::fill`), at their pace. Readers of an abandoned fill are
    /// told it failed, never given a truncated body as whole.
    async fn write(&mut self, chunk: &Bytes) -> bool {
        self.len += chunk.len();
        self.miss.write_body(chunk.clone(), false).await.is_ok()
    }

    /// Past the size limit: nothing will be stored.
    fn relaying(&self) -> bool {
        self.len > self.limit
    }

    /// Completes the stored object (a failure is logged: the answer itself is not affected).
    pub(super) async fn finish(self) {
        if let Err(e) = self.miss.finish().await {
            log::warn!("storing the answer to a request forwarded directly failed: {e}");
        }
    }
}

/// How the relay ended, for the request's result.
#[derive(Default)]
pub(super) struct Relayed {
    /// The origin's body (or its storing) failed: the request's error; the fill is abandoned.
    pub(super) upstream_failed: Option<Box<Error>>,
    /// The client went away or could not be written to (its answer is cut short; the fill went
    /// on without it).
    pub(super) client_failed: Option<Box<Error>>,
}

/// What the two halves share. Locked only between their awaits: they run in one task, so the
/// lock is never contended (a `Mutex` rather than a `RefCell` only because the request's future
/// must be `Send`).
struct Shared {
    /// Chunks read and not yet given to the client, with whether each is the last.
    queue: VecDeque<(Option<Bytes>, bool)>,
    /// Bytes in `queue`, counted in `budget` too.
    queued: usize,
    budget: &'static ReadAheadBudget,
    /// The reader is done: the whole body is queued, or it failed.
    reading_done: bool,
    relayed: Relayed,
}

impl Shared {
    fn push(&mut self, data: Option<Bytes>, ended: bool) {
        let len = data.as_ref().map_or(0, Bytes::len);
        self.queued += len;
        self.budget.take(len);
        self.queue.push_back((data, ended));
    }

    fn pop(&mut self) -> Option<(Option<Bytes>, bool)> {
        let next = self.queue.pop_front()?;
        let len = next.0.as_ref().map_or(0, Bytes::len);
        self.queued -= len;
        self.budget.give_back(len);
        Some(next)
    }

    fn clear(&mut self) {
        self.queue.clear();
        self.budget.give_back(self.queued);
        self.queued = 0;
    }
}

impl Drop for Shared {
    /// A relay dropped mid-way (its client's connection closed under it) gives its bytes back.
    fn drop(&mut self) {
        self.clear();
    }
}

impl LacquerProxy {
    /// Relays the rest of the body (`first`, then what `upstream` sends) to the client while
    /// writing it into `fill` (see the module doc), and finishes the fill as soon as the body's
    /// end is read: the requests streaming it, and the client's next request, find it complete
    /// while the client may still be taking its copy. (A body that came whole with its head goes
    /// to [`Self::store_then_write`] instead.)
    pub(super) async fn relay_while_filling(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        (mut upstream, peer): (Box<UpstreamSession>, &HttpPeer),
        fill: Fill,
        first: Option<Bytes>,
        client_gone: Option<Box<Error>>,
    ) -> Relayed {
        let mut fill = Some(fill);
        let shared = Mutex::new(Shared {
            queue: VecDeque::new(),
            queued: 0,
            budget: self.read_ahead,
            reading_done: false,
            relayed: Relayed {
                upstream_failed: None,
                client_failed: client_gone,
            },
        });
        let ctx = Mutex::new(ctx);
        let (chunk_queued, chunk_taken) = (Notify::new(), Notify::new());
        let reader = async {
            let mut first = first;
            loop {
                // with nothing stored any more, only the client wants the body, and past the
                // budget no one may hold more for it: keep its pace
                loop {
                    // registered before the check, so a budget given back meanwhile wakes it
                    let given_back = self.read_ahead.given_back.notified();
                    tokio::pin!(given_back);
                    given_back.as_mut().enable();
                    let paused = {
                        let s = lock(&shared);
                        s.relayed.client_failed.is_none()
                            && s.queued > READ_AHEAD
                            && (fill.as_ref().is_none_or(Fill::relaying) || s.budget.spent())
                    };
                    if !paused {
                        break;
                    }
                    tokio::select! {
                        _ = chunk_taken.notified() => {}
                        _ = given_back => {}
                    }
                }
                if fill.is_none() && lock(&shared).relayed.client_failed.is_some() {
                    break;
                }
                let chunk = next_chunk(&mut upstream, &mut first).await;
                let filtered = chunk.and_then(|(mut data, ended)| {
                    self.on_upstream_body(&mut lock_ctx(&ctx), &mut data, ended)
                        .map(|()| (data, ended))
                });
                let (data, ended) = match filtered {
                    Ok(chunk) => chunk,
                    Err(e) => {
                        // the origin's connection is closed now, not when the client's request
                        // ends (it may be stalled for up to send_timeout)
                        if let Some(socket) = upstream.stream().get_socket_digest() {
                            let _ = socket.shutdown_now();
                        }
                        let mut s = lock(&shared);
                        s.relayed.upstream_failed = Some(e);
                        // the answer is cut short: the client gets no more of it
                        s.clear();
                        break;
                    }
                };
                if let (Some(writing), Some(chunk)) = (fill.as_mut(), &data) {
                    let was_storing = !writing.relaying();
                    if !writing.write(chunk).await {
                        fill = None;
                    }
                    let storing = fill.as_ref().is_some_and(|f| !f.relaying());
                    if was_storing && !storing {
                        // nothing will be stored: the cluster's lease is given up now, not
                        // kept alive for as long as the client takes the rest
                        lock_ctx(&ctx).give_up_fill_lease();
                    }
                }
                {
                    let mut s = lock(&shared);
                    if s.relayed.client_failed.is_none() {
                        s.push(data, ended);
                        chunk_queued.notify_one();
                    }
                }
                if ended {
                    // the next request to the origin may use the connection now, not once
                    // this request's client has taken the rest of its answer (and before the
                    // fill is seen complete)
                    self.keep_idle(upstream, peer).await;
                    if let Some(writing) = fill.take() {
                        writing.finish().await;
                    }
                    break;
                }
            }
            // a fill not finished by now is abandoned at once (the origin failed): the requests
            // streaming it learn so now, not when this request's client is done
            fill = None;
            lock(&shared).reading_done = true;
            chunk_queued.notify_one();
        };
        let writer = async {
            if lock(&shared).relayed.client_failed.is_some() {
                return;
            }
            loop {
                let next = {
                    let mut s = lock(&shared);
                    let next = s.pop();
                    if next.is_some() {
                        chunk_taken.notify_one();
                    } else if s.reading_done {
                        return;
                    }
                    next
                };
                let Some((mut data, ended)) = next else {
                    chunk_queued.notified().await;
                    continue;
                };
                // the lock is let go before each write's await (the reader takes it meanwhile);
                // a body decoded for the client goes in bounded pieces
                let written = loop {
                    let filtered =
                        self.on_downstream_body_in_pieces(&mut lock_ctx(&ctx), &mut data, ended);
                    let more = match filtered {
                        Ok(more) => more,
                        Err(e) => break Err(e),
                    };
                    let piece = session.write_response_body(data.take(), ended && !more);
                    if let Err(e) = piece.await {
                        break Err(e);
                    }
                    if !more {
                        break Ok(());
                    }
                };
                if let Err(e) = written {
                    // nothing more is written to it: it sees the end of what it was sent now,
                    // not a stall until the fill ends (vendored pingora-core 0023)
                    match super::client_socket_of_a_close_delimited_answer(session) {
                        // an answer delimited by the close is reset, not ended with a FIN that
                        // would make it look whole (vendored pingora-core 0040)
                        Some(socket) => {
                            let _ = socket.reset_now();
                            session.downstream_session.set_keepalive(None);
                        }
                        None => session.downstream_session.abort(),
                    }
                    let mut s = lock(&shared);
                    s.relayed.client_failed = Some(e);
                    s.clear();
                    chunk_taken.notify_one();
                    return;
                }
                if ended {
                    return;
                }
            }
        };
        tokio::join!(reader, writer);
        let mut shared = shared
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        std::mem::take(&mut shared.relayed)
    }

    /// The whole body already in hand (most small answers arrive with their head): stored and
    /// finished first, then written to the client, with no need for two halves.
    pub(super) async fn store_then_write(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        mut fill: Fill,
        mut data: Option<Bytes>,
        client_gone: Option<Box<Error>>,
    ) -> Relayed {
        let mut relayed = Relayed {
            upstream_failed: None,
            client_failed: client_gone,
        };
        if let Err(e) = self.on_upstream_body(ctx, &mut data, true) {
            relayed.upstream_failed = Some(e);
            return relayed;
        }
        let written = match &data {
            Some(chunk) => fill.write(chunk).await,
            None => true,
        };
        if !written || fill.relaying() {
            // nothing is stored (a relay's readers still get the whole body from `finish`)
            ctx.give_up_fill_lease();
        }
        if written {
            fill.finish().await;
        }
        if relayed.client_failed.is_none() {
            relayed.client_failed = if crate::compression::decodes_in_pieces(&ctx.compression) {
                Box::pin(self.write_decoded_body(session, ctx, data, true))
                    .await
                    .err()
            } else {
                match self.on_downstream_body(ctx, &mut data, true) {
                    Ok(()) => session.write_response_body(data, true).await.err(),
                    Err(e) => Some(e),
                }
            };
        }
        relayed
    }
}

/// The shared state, locked for a few synchronous steps (see [`Shared`]).
fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The request's context, locked for one synchronous filter call (see [`Shared`]).
fn lock_ctx<'a, 'c>(ctx: &'a Mutex<&'c mut RequestCtx>) -> MutexGuard<'a, &'c mut RequestCtx> {
    ctx.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
