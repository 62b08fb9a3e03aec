//! The PROXY protocol (HAProxy's, v1 text and v2 binary) on listeners marked `proxy_protocol`:
//! a load balancer that forwards TCP (HAProxy, cloud network load balancers) starts each
//! connection with a header naming the client, and that address becomes the connection's peer,
//! for `proxy.trusted_proxies`, `purge_from`, fairness and the log alike.
//!
//! The header is read before anything else on the connection: on plain listeners by
//! [`ProxyProtocolApp`], which wraps the HTTP application; on TLS listeners by
//! [`PreTlsHeader`], Pingora's pre-TLS hook (the header comes before the handshake). Both read
//! exactly the header's bytes (nothing of the request after it), parse them with the `ppp`
//! crate, and replace the stream's socket digest with one whose peer is the named client. A
//! connection on such a listener without a valid header is closed. `LOCAL` (v2) and `UNKNOWN`
//! (v1) headers, which health checks send, keep the socket's own peer.

use crate::config::listener_takes;
use crate::proxy::LacquerProxy;
use async_trait::async_trait;
use pingora_core::apps::ServerApp;
use pingora_core::listeners::PreTlsProcess;
use pingora_core::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora_core::protocols::l4::stream::Stream as L4Stream;
use pingora_core::protocols::{GetSocketDigest, SocketDigest, Stream, UniqueID};
use pingora_core::server::ShutdownWatch;
use pingora_error::{Error, ErrorType, Result};
use pingora_proxy::HttpProxy;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The longest v1 header (107 bytes, the protocol's own limit).
const V1_MAX: usize = 107;
/// The v2 signature.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The listener addresses whose connections start with a PROXY header, and how long a client
/// may take to send it.
#[derive(Debug, Clone, Default)]
pub struct ProxyProtocolListeners {
    addrs: Vec<SocketAddr>,
    header_timeout: Duration,
}

impl ProxyProtocolListeners {
    /// The listeners marked `proxy_protocol` in `listen` and `tls.listen`, whose header must be
    /// in within `header_timeout` of the connection's opening: `server.header_read_timeout`, the
    /// bound of a request head (the request head then has its own, so a connection's first
    /// request is complete within twice it). Before 2026-12-08 the header had a fixed 10 s of
    /// its own (`tests/proxy_protocol_and_health_attacks.rs`).
    pub fn new(addrs: Vec<SocketAddr>, header_timeout: Duration) -> Self {
        ProxyProtocolListeners {
            addrs,
            header_timeout,
        }
    }

    /// Whether a connection accepted on `local` (its socket's local address) came through one of
    /// them: same port, and the same address unless the listener is a wildcard.
    fn expects_header(&self, local: Option<SocketAddr>) -> bool {
        let Some(local) = local else { return false };
        self.addrs
            .iter()
            .any(|listener| listener_takes(*listener, local))
    }

    /// Whether no listener expects the header (then no connection is looked at).
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    fn expects_header_on(&self, digest: Option<Arc<SocketDigest>>) -> bool {
        self.expects_header(
            digest
                .and_then(|d| d.local_addr().cloned())
                .and_then(|a| a.as_inet().copied()),
        )
    }
}

/// Reads one PROXY header, v1 or v2, and nothing after it; returns the client it names (`None`
/// for `LOCAL` / `UNKNOWN`).
pub async fn read_header<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
) -> Result<Option<SocketAddr>> {
    let bytes = tokio::time::timeout(timeout, read_header_bytes(stream))
        .await
        .map_err(|_| invalid("no PROXY header in time"))??;
    parse(&bytes)
}

async fn read_header_bytes<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Vec<u8>> {
    let io = |e: std::io::Error| Error::because(ErrorType::ReadError, "PROXY header", e);
    let mut bytes = vec![0u8; 6];
    stream.read_exact(&mut bytes).await.map_err(io)?;
    if bytes == b"PROXY " {
        // v1: a line, byte by byte up to CRLF (the stream is buffered underneath)
        while !bytes.ends_with(b"\r\n") {
            if bytes.len() >= V1_MAX {
                return Err(invalid("PROXY v1 header longer than 107 bytes"));
            }
            bytes.push(stream.read_u8().await.map_err(io)?);
        }
        return Ok(bytes);
    }
    if bytes[..] != V2_SIGNATURE[..6] {
        return Err(invalid("the connection does not start with a PROXY header"));
    }
    // v2: the rest of the 16-byte fixed part, then the length it gives
    bytes.resize(16, 0);
    stream.read_exact(&mut bytes[6..]).await.map_err(io)?;
    let len = u16::from_be_bytes([bytes[14], bytes[15]]) as usize;
    bytes.resize(16 + len, 0);
    stream.read_exact(&mut bytes[16..]).await.map_err(io)?;
    Ok(bytes)
}

/// The client address of a complete header.
fn parse(bytes: &[u8]) -> Result<Option<SocketAddr>> {
    match ppp::HeaderResult::parse(bytes) {
        ppp::HeaderResult::V1(Ok(header)) => Ok(match header.addresses {
            ppp::v1::Addresses::Tcp4(a) => Some((a.source_address, a.source_port).into()),
            ppp::v1::Addresses::Tcp6(a) => Some((a.source_address, a.source_port).into()),
            ppp::v1::Addresses::Unknown => None,
        }),
        ppp::HeaderResult::V2(Ok(header)) => Ok(match (header.command, header.addresses) {
            (ppp::v2::Command::Local, _) => None,
            (_, ppp::v2::Addresses::IPv4(a)) => Some((a.source_address, a.source_port).into()),
            (_, ppp::v2::Addresses::IPv6(a)) => Some((a.source_address, a.source_port).into()),
            (_, _) => None,
        }),
        ppp::HeaderResult::V1(Err(e)) => Err(invalid_owned(format!("PROXY v1 header: {e}"))),
        ppp::HeaderResult::V2(Err(e)) => Err(invalid_owned(format!("PROXY v2 header: {e}"))),
    }
}

fn invalid(why: &'static str) -> Box<Error> {
    Error::explain(ErrorType::InvalidHTTPHeader, why)
}

fn invalid_owned(why: String) -> Box<Error> {
    Error::explain(ErrorType::InvalidHTTPHeader, why)
}

/// A socket digest for the connection with file descriptor `fd` whose peer is `client`.
fn digest_with_peer(fd: i32, client: SocketAddr) -> SocketDigest {
    let digest = SocketDigest::from_raw_fd(fd);
    let _ = digest.peer_addr.set(Some(PeerAddr::Inet(client)));
    digest
}

/// The HTTP application behind plain listeners, reading the PROXY header first on the
/// listeners that expect one (every other connection goes straight through).
pub struct ProxyProtocolApp {
    http: Arc<HttpProxy<LacquerProxy>>,
    listeners: ProxyProtocolListeners,
}

impl ProxyProtocolApp {
    /// Wraps `http` for `listeners`.
    pub fn new(http: HttpProxy<LacquerProxy>, listeners: ProxyProtocolListeners) -> Self {
        ProxyProtocolApp {
            http: Arc::new(http),
            listeners,
        }
    }
}

#[async_trait]
impl ServerApp for ProxyProtocolApp {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // a TLS stream has had its header read before the handshake (`PreTlsHeader`)
        if !self.listeners.is_empty()
            && stream.get_ssl_digest().is_none()
            && self.listeners.expects_header_on(stream.get_socket_digest())
        {
            // boxed: inline, its timer and reads sized this future, which every connection
            // keeps for its life (3.9 KB of an idle one), header or not
            match Box::pin(read_header(&mut stream, self.listeners.header_timeout)).await {
                Ok(Some(client)) => {
                    let fd = stream.id();
                    stream.set_socket_digest(digest_with_peer(fd, client));
                }
                Ok(None) => {}
                Err(e) => {
                    log::debug!("closing a connection: {e}");
                    return None;
                }
            }
        }
        self.http.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        ServerApp::cleanup(&*self.http).await
    }
}

/// Pingora's pre-TLS hook: reads the PROXY header of connections to TLS listeners that expect one.
pub struct PreTlsHeader(pub ProxyProtocolListeners);

#[async_trait]
impl PreTlsProcess for PreTlsHeader {
    async fn process(&self, stream: &mut L4Stream) -> Result<()> {
        if self.0.is_empty() || !self.0.expects_header_on(stream.get_socket_digest()) {
            return Ok(());
        }
        if let Some(client) = read_header(stream, self.0.header_timeout).await? {
            let fd = stream.id();
            stream.set_socket_digest(digest_with_peer(fd, client));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(bytes: &[u8]) -> (Result<Option<SocketAddr>>, Vec<u8>) {
        let mut input = bytes;
        let result = read_header(&mut input, Duration::from_secs(10)).await;
        (result, input.to_vec())
    }

    #[tokio::test]
    async fn v1_names_the_client_and_leaves_the_request() {
        let (client, rest) =
            read(b"PROXY TCP4 198.51.100.7 192.0.2.1 40000 80\r\nGET / HTTP/1.1\r\n").await;
        assert_eq!(client.unwrap(), Some("198.51.100.7:40000".parse().unwrap()));
        assert_eq!(rest, b"GET / HTTP/1.1\r\n");
        let (client, _) = read(b"PROXY UNKNOWN\r\nGET").await;
        assert_eq!(client.unwrap(), None);
    }

    #[tokio::test]
    async fn v2_names_the_client_and_leaves_the_request() {
        let mut header = V2_SIGNATURE.to_vec();
        header.extend_from_slice(&[0x21, 0x11, 0, 12]); // PROXY, TCP over IPv4, 12 bytes
        header.extend_from_slice(&[203, 0, 113, 9, 192, 0, 2, 1]);
        header.extend_from_slice(&4711u16.to_be_bytes());
        header.extend_from_slice(&443u16.to_be_bytes());
        header.extend_from_slice(b"GET");
        let (client, rest) = read(&header).await;
        assert_eq!(client.unwrap(), Some("203.0.113.9:4711".parse().unwrap()));
        assert_eq!(rest, b"GET");
    }

    #[tokio::test]
    async fn anything_else_is_refused() {
        assert!(read(b"GET / HTTP/1.1\r\n\r\n").await.0.is_err());
        assert!(read(b"PROXY TCP4 nonsense\r\n").await.0.is_err());
        let long = format!("PROXY TCP4 {}\r\n", "1".repeat(120));
        assert!(read(long.as_bytes()).await.0.is_err());
    }

    #[test]
    fn wildcard_listeners_match_by_port() {
        let listeners = ProxyProtocolListeners::new(
            vec![
                "0.0.0.0:8443".parse().unwrap(),
                "127.0.0.1:8080".parse().unwrap(),
            ],
            Duration::from_secs(10),
        );
        assert!(listeners.expects_header(Some("10.0.0.1:8443".parse().unwrap())));
        assert!(listeners.expects_header(Some("127.0.0.1:8080".parse().unwrap())));
        assert!(!listeners.expects_header(Some("127.0.0.2:8080".parse().unwrap())));
        assert!(!listeners.expects_header(Some("127.0.0.1:6081".parse().unwrap())));
    }
}
