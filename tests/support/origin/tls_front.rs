//! [`TlsFront`]: TLS in front of a plain test origin, making it an `https` origin.
//!
//! Each connection is accepted with rustls (the given certificate; a client certificate signed
//! by `client_ca` required when one is given), and only once the handshake has completed are
//! its bytes relayed to the plain origin behind. A client that refuses the certificate (or a
//! handshake the front refuses) never gets a byte through, so the origin's request count says
//! whether anything passed.

use crate::tls::CertFiles;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::crypto::ring::default_provider;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// A running TLS front; stops (with its thread) when dropped.
pub struct TlsFront {
    addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsFront {
    /// TLS on `127.0.0.1:<free port>` with `cert`, relaying to `origin`; with `client_ca`,
    /// clients must present a certificate that CA signed.
    pub fn start(origin: SocketAddr, cert: &CertFiles, client_ca: Option<&Path>) -> TlsFront {
        let acceptor = TlsAcceptor::from(Arc::new(server_config(cert, client_ca)));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the TLS front");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let counted = handshakes.clone();
        let (shutdown, mut stop) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                loop {
                    tokio::select! {
                        _ = &mut stop => break,
                        accepted = listener.accept() => {
                            let Ok((tcp, _)) = accepted else { continue };
                            let acceptor = acceptor.clone();
                            let counted = counted.clone();
                            tokio::spawn(async move {
                                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                                counted.fetch_add(1, Ordering::SeqCst);
                                let Ok(mut plain) = TcpStream::connect(origin).await else {
                                    return;
                                };
                                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                            });
                        }
                    }
                }
            });
        });
        TlsFront {
            addr,
            handshakes,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// The listening address (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// TLS handshakes completed so far (connections whose bytes were relayed).
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        if let Some(stop) = self.shutdown.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn server_config(cert: &CertFiles, client_ca: Option<&Path>) -> ServerConfig {
    let provider = Arc::new(default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert.cert)
        .expect("read the certificate")
        .map(|c| c.expect("a PEM certificate"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(&cert.key).expect("read the key");
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).expect("read the client CA") {
                roots.add(c.expect("a PEM certificate")).unwrap();
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder
        .with_single_cert(chain, key)
        .expect("certificate and key")
}
