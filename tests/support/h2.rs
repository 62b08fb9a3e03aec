//! Raw HTTP/2 clients (h2c, and h2 over TLS) on the `h2` crate, for the tests that need what
//! `reqwest` hides: a connection's and a stream's windows, streams reset or left unread, requests
//! whose answer is read later or never. Shared by `h2_attacks`, `fill_pace_attacks` and
//! `protocols`.
//!
//! Each function does one job: connect ([`h2_connect_default`], [`h2_connect_wide`],
//! [`h2_connect_with`], over TLS [`h2_connect_tls`]), send a request ([`h2_request`],
//! [`h2_try_request`]), read a body ([`h2_read_body`]) or a whole answer ([`h2_read_answer`],
//! [`H2Answer`]), both at once ([`h2_fetch`], [`h2_get`], [`h2_get_text`]), and wait until the
//! proxy has sent a stream bytes its client has not released ([`h2_wait_unreleased`]).
//!
//! The crate is imported as `::h2`: this module is named like it.

use ::h2::client::{Builder, ResponseFuture, SendRequest};
use ::h2::{RecvStream, SendStream};
use bytes::Bytes;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

use super::poll::poll_until_async;

/// The connection window of [`h2_connect_wide`]: large enough that streams whose client reads
/// nothing hold only their own 64 KiB stream windows, never the other streams' room.
pub const H2_WIDE_CONNECTION_WINDOW: u32 = 64 << 20;

/// An h2c client connection to `addr` made by `builder` (windows, settings as the test needs),
/// its driver spawned. Aborting the driver drops the connection.
pub async fn h2_connect_with(
    addr: SocketAddr,
    builder: &Builder,
) -> (SendRequest<Bytes>, JoinHandle<()>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    h2_handshake(tcp, builder).await
}

/// The h2 connection `builder` makes over `io` (plain TCP or TLS), its driver spawned.
async fn h2_handshake<T>(io: T, builder: &Builder) -> (SendRequest<Bytes>, JoinHandle<()>)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = builder.handshake(io).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    (sender, driver)
}

/// An h2 client connection over TLS to `addr` (ALPN `h2`, the server checked as `localhost`
/// against the certificate authority in the PEM file `ca`), with the h2 crate's defaults; its
/// driver spawned.
pub async fn h2_connect_tls(addr: SocketAddr, ca: &Path) -> (SendRequest<Bytes>, JoinHandle<()>) {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName};
    use tokio_rustls::rustls::crypto::ring::default_provider;
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};

    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("read the CA file") {
        roots.add(cert.expect("a PEM certificate")).unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "h2 through ALPN"
    );
    h2_handshake(tls, &Builder::new()).await
}

/// [`h2_connect_with`] the h2 crate's defaults: a 64 KiB window for the connection as for each
/// stream, so one stream left unread can shut the whole connection's window.
pub async fn h2_connect_default(addr: SocketAddr) -> (SendRequest<Bytes>, JoinHandle<()>) {
    h2_connect_with(addr, &Builder::new()).await
}

/// [`h2_connect_with`] a connection window of [`H2_WIDE_CONNECTION_WINDOW`] (64 MiB), stream
/// windows left at their default: streams whose client reads nothing hold only their own
/// 64 KiB, never the other streams' room.
pub async fn h2_connect_wide(addr: SocketAddr) -> (SendRequest<Bytes>, JoinHandle<()>) {
    let mut builder = Builder::new();
    builder.initial_connection_window_size(H2_WIDE_CONNECTION_WINDOW);
    h2_connect_with(addr, &builder).await
}

/// The head of a request (`method`, `url`, then `fields` in order) as the h2 crate sends it; a
/// body, if any, goes on the request's stream afterwards.
pub fn h2_request_head(method: &str, url: &str, fields: &[(&str, &str)]) -> http::Request<()> {
    let mut builder = http::Request::builder().method(method).uri(url);
    for (name, value) in fields {
        builder = builder.header(*name, *value);
    }
    builder.body(()).expect("a valid request")
}

/// Sends a request without a body on `sender` (once it has room for a stream); returns the
/// answer's future and the request's stream (to reset it), or the error that refused it.
pub async fn h2_try_request(
    sender: &SendRequest<Bytes>,
    method: &str,
    url: &str,
    fields: &[(&str, &str)],
) -> Result<(ResponseFuture, SendStream<Bytes>), ::h2::Error> {
    let mut ready = sender.clone().ready().await?;
    ready.send_request(h2_request_head(method, url, fields), true)
}

/// [`h2_try_request`] for a connection that must take the request: fails the test otherwise.
pub async fn h2_request(
    sender: &SendRequest<Bytes>,
    method: &str,
    url: &str,
    fields: &[(&str, &str)],
) -> (ResponseFuture, SendStream<Bytes>) {
    h2_try_request(sender, method, url, fields)
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: not sent: {e:?}"))
}

/// Reads an h2 body to its end, releasing window as it goes. Without `pace`, each chunk's bytes
/// are released as they come; with `pace` `(step, pause)`, window is released `step` bytes at a
/// time, a pause before each (what is received but not yet released stays under one step, so
/// the stream's window never shuts).
pub async fn h2_read_body(
    body: &mut RecvStream,
    pace: Option<(usize, Duration)>,
) -> Result<Vec<u8>, ::h2::Error> {
    let mut bytes = Vec::new();
    let mut unreleased = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        bytes.extend_from_slice(&chunk);
        match pace {
            Some((step, pause)) => {
                unreleased += chunk.len();
                while unreleased >= step {
                    tokio::time::sleep(pause).await;
                    let _ = body.flow_control().release_capacity(step);
                    unreleased -= step;
                }
            }
            None => {
                let _ = body.flow_control().release_capacity(chunk.len());
            }
        }
    }
    Ok(bytes)
}

/// A whole answer as an h2 client got it.
#[derive(Debug)]
pub struct H2Answer {
    pub status: u16,
    pub fields: http::HeaderMap,
    pub body: Vec<u8>,
}

impl H2Answer {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `Cache-Status` field, all values joined with `", "` (empty when there is none).
    pub fn cache_status(&self) -> String {
        let all: Vec<&str> = self
            .fields
            .get_all("cache-status")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        all.join(", ")
    }

    /// A parameter of the last `Cache-Status` entry, as [`crate::client::Resp::cache_status_param`].
    pub fn cache_status_param(&self, name: &str) -> Option<String> {
        crate::client::cache_status_param(&self.cache_status(), name)
    }
}

/// Reads the answer `response` promises, whole: its head, then its body as [`h2_read_body`]
/// reads it (with `pace`, if any).
pub async fn h2_read_answer(
    response: ResponseFuture,
    pace: Option<(usize, Duration)>,
) -> Result<H2Answer, ::h2::Error> {
    let (parts, mut body) = response.await?.into_parts();
    let body = h2_read_body(&mut body, pace).await?;
    Ok(H2Answer {
        status: parts.status.as_u16(),
        fields: parts.headers,
        body,
    })
}

/// Sends a request without a body on `sender` and reads its answer whole; any h2 error (the
/// request refused, the stream reset, the connection gone) is returned.
pub async fn h2_fetch(
    sender: &SendRequest<Bytes>,
    method: &str,
    url: &str,
    fields: &[(&str, &str)],
) -> Result<H2Answer, ::h2::Error> {
    let (response, _) = h2_try_request(sender, method, url, fields).await?;
    h2_read_answer(response, None).await
}

/// `GET url` on `sender`, which must be answered whole within `within`; fails the test if it is
/// not, or on any h2 error.
pub async fn h2_get(sender: &SendRequest<Bytes>, url: &str, within: Duration) -> H2Answer {
    match tokio::time::timeout(within, h2_fetch(sender, "GET", url, &[])).await {
        Ok(answer) => answer.unwrap_or_else(|e| panic!("GET {url}: {e:?}")),
        Err(_) => panic!("never happened within {within:?}: GET {url}"),
    }
}

/// `GET url` on `sender`, with no bound on its wait: the status and the body as text, to compare
/// with one `(status, text)` pair. Fails the test on any h2 error.
pub async fn h2_get_text(sender: &SendRequest<Bytes>, url: &str) -> (u16, String) {
    let answer = h2_fetch(sender, "GET", url, &[])
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e:?}"));
    (answer.status, answer.text())
}

/// Waits, for `within` at most (else the test fails naming `what`), until `body` holds at least
/// `n` bytes its client has not released: the proxy sent that much and, when `n` is the
/// stream's whole window, now waits for the client to make room.
pub async fn h2_wait_unreleased(body: &mut RecvStream, n: usize, within: Duration, what: &str) {
    assert!(
        poll_until_async(within, || body.flow_control().used_capacity() >= n).await,
        "{what}: never got {n} unreleased bytes within {within:?}"
    );
}
