//! What a test origin answers: status, fields, a body in one of the framings a real origin may
//! use (sized, chunked, paced, truncated, close-delimited, generated), and an optional delay;
//! plus two ready-made handlers.

use super::RecordedRequest;
use crate::fields::field;
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A response body the origin can send.
#[derive(Clone, Debug, Default)]
pub enum Body {
    /// No body (`Content-Length: 0` unless the status forbids a body).
    #[default]
    Empty,
    /// A fixed body sent with `Content-Length` (unless the handler set its own framing,
    /// in which case these bytes are written verbatim).
    Bytes(Bytes),
    /// `len` bytes of deterministic content (see [`generated_bytes`](crate::generated_bytes)) streamed in
    /// 64 KiB pieces without ever being held in memory whole.
    Generated {
        /// Total body length in bytes.
        len: usize,
        /// Selects the content; different seeds give different bytes.
        seed: u8,
    },
    /// Sent with `Transfer-Encoding: chunked`, one HTTP chunk per element
    /// (empty elements are skipped: they would end the body).
    Chunked(Vec<Bytes>),
    /// Like [`Body::Chunked`], but the origin pauses `interval` before each chunk after
    /// the first, so the body trickles out (for streaming / coalescing tests).
    Paced {
        /// The chunks, each sent as one HTTP chunk.
        chunks: Vec<Bytes>,
        /// Pause before every chunk except the first, and before the terminating chunk.
        interval: Duration,
    },
    /// Advertises `Content-Length: declared_len` but sends only `data` and then closes
    /// the connection: a broken origin, for error-handling tests.
    Truncated {
        /// The Content-Length announced.
        declared_len: usize,
        /// What is actually sent before the connection is closed.
        data: Bytes,
    },
    /// No `Content-Length` and no chunking: the body ends when the origin closes
    /// the connection (HTTP/1.0-style close-delimited framing).
    CloseDelimited(Bytes),
}

impl Body {
    /// The number of body bytes that will be sent on the wire (before chunk framing).
    pub fn len(&self) -> usize {
        match self {
            Body::Empty => 0,
            Body::Bytes(b) | Body::CloseDelimited(b) => b.len(),
            Body::Generated { len, .. } => *len,
            Body::Chunked(c) | Body::Paced { chunks: c, .. } => c.iter().map(|b| b.len()).sum(),
            Body::Truncated { data, .. } => data.len(),
        }
    }

    /// Whether [`Body::len`] is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        Body::Bytes(b)
    }
}

impl From<Vec<u8>> for Body {
    fn from(b: Vec<u8>) -> Self {
        Body::Bytes(Bytes::from(b))
    }
}

impl From<&[u8]> for Body {
    fn from(b: &[u8]) -> Self {
        Body::Bytes(Bytes::copy_from_slice(b))
    }
}

impl From<String> for Body {
    fn from(s: String) -> Self {
        Body::Bytes(Bytes::from(s))
    }
}

impl From<&str> for Body {
    fn from(s: &str) -> Self {
        Body::Bytes(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<&String> for Body {
    fn from(s: &String) -> Self {
        Body::from(s.as_str())
    }
}

/// What the origin answers to one request. Build with [`OriginResponse::ok`] /
/// [`OriginResponse::new`] and the chained helpers.
///
/// Framing rules: unless the handler set `Content-Length` or `Transfer-Encoding`
/// itself, the origin adds `Content-Length` for `Empty`/`Bytes`/`Generated`/`Truncated`
/// bodies and `Transfer-Encoding: chunked` for `Chunked`/`Paced` ones. No body (but the
/// same headers) is sent for `HEAD` requests and for 1xx/204/304 statuses. A `Date`
/// header is added if the handler didn't set one.
#[derive(Clone, Debug)]
pub struct OriginResponse {
    /// Status code.
    pub status: u16,
    /// Header fields, sent in this order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Body,
    /// Wait this long before sending the response head.
    pub delay: Option<Duration>,
    /// Interim (1xx) responses sent first, in order, each a status and its fields: written
    /// before the delay, so the delay is the time the client waits between them and the final
    /// response.
    pub interim: Vec<(u16, Vec<(String, String)>)>,
}

impl OriginResponse {
    /// A response with status `status`, no headers and an empty body.
    pub fn new(status: u16) -> Self {
        OriginResponse {
            status,
            headers: Vec::new(),
            body: Body::Empty,
            delay: None,
            interim: Vec::new(),
        }
    }

    /// No response at all: the origin closes the connection after reading the request, as an
    /// origin that crashes or is restarted mid-request does.
    pub fn close_without_answer() -> Self {
        OriginResponse::new(CLOSE_WITHOUT_ANSWER)
    }

    /// Whether this is [`OriginResponse::close_without_answer`].
    pub fn is_close_without_answer(&self) -> bool {
        self.status == CLOSE_WITHOUT_ANSWER
    }

    /// A `200 OK` response with the given body (`&str`, `String`, `Vec<u8>`, `Bytes` or a [`Body`]).
    pub fn ok(body: impl Into<Body>) -> Self {
        OriginResponse::new(200).body(body)
    }

    /// A `200 OK` response with a [`Body::Generated`] body of `len` bytes.
    pub fn generated(len: usize, seed: u8) -> Self {
        OriginResponse::ok(Body::Generated { len, seed })
    }

    /// A `200 OK` response with a [`Body::Chunked`] body.
    pub fn chunked<I, B>(chunks: I) -> Self
    where
        I: IntoIterator<Item = B>,
        B: Into<Bytes>,
    {
        OriginResponse::ok(Body::Chunked(chunks.into_iter().map(Into::into).collect()))
    }

    /// Sets the status code.
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Appends a header field (repeat the call for repeated fields).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Replaces the body.
    pub fn body(mut self, body: impl Into<Body>) -> Self {
        self.body = body.into();
        self
    }

    /// Sends an interim response (`103 Early Hints`, `102 Processing`) with `fields` before the
    /// final one (repeat the call for several).
    pub fn interim(mut self, status: u16, fields: &[(&str, &str)]) -> Self {
        let fields = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.interim.push((status, fields));
        self
    }

    /// Delays the response head by `d`.
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = Some(d);
        self
    }

    /// First value of header `name` (case-insensitive) set so far, if any.
    pub fn get_header(&self, name: &str) -> Option<&str> {
        field(&self.headers, name)
    }
}

/// The status that stands for [`OriginResponse::close_without_answer`] (no real status is 0).
const CLOSE_WITHOUT_ANSWER: u16 = 0;

/// A handler answering every request with `200`, `Cache-Control: <cache_control>`
/// (omitted if empty), `Content-Type: text/plain` and the given body.
pub fn static_handler(
    cache_control: &str,
    body: &str,
) -> impl Fn(&RecordedRequest) -> OriginResponse + Send + Sync + 'static {
    let cc = cache_control.to_string();
    let body = Bytes::copy_from_slice(body.as_bytes());
    move |_req: &RecordedRequest| {
        let mut r = OriginResponse::ok(body.clone()).header("Content-Type", "text/plain");
        if !cc.is_empty() {
            r = r.header("Cache-Control", cc.clone());
        }
        r
    }
}

/// A handler answering every request with `200`, `Cache-Control: <cache_control>`
/// (omitted if empty) and a body naming the request: `"<METHOD> <path> #<n>"`, where
/// `n` counts the handler's calls from 1. Handy to tell a cached copy from a fresh one.
pub fn echo_handler(
    cache_control: &str,
) -> impl Fn(&RecordedRequest) -> OriginResponse + Send + Sync + 'static {
    let cc = cache_control.to_string();
    let n = AtomicUsize::new(0);
    move |req: &RecordedRequest| {
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        let mut r = OriginResponse::ok(format!("{} {} #{}", req.method, req.path, i))
            .header("Content-Type", "text/plain");
        if !cc.is_empty() {
            r = r.header("Cache-Control", cc.clone());
        }
        r
    }
}
