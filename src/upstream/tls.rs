//! TLS to an origin (`https` upstreams): the name its certificate must carry (sent as SNI), the
//! roots it is verified against (the system's, or a CA file), and the client certificate some
//! origins ask for.
//!
//! The files are read at start, and again on every reload, into the forms Pingora's rustls
//! connector takes per peer (`HttpPeer::options.ca`, `HttpPeer::client_cert_key`), so a bad path
//! or an unparsable file stops start-up, or is refused by the reload ([`OriginTls::load`] says
//! which and why), instead of failing every request. A reload's settings replace the running
//! ones (`super::replicas::Replicas::reconfigure`): a certificate or CA rotated under the same
//! file name is used by every connection made after the reload.
//! Verification is always on: Pingora skips it when the SNI is empty, so [`OriginTls`] never
//! has an empty one (an IP address is verified against the certificate's IP names).

use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::utils::tls::{parse_x509, CertKey, WrappedX509};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// Which key of `[[upstreams]]` a loading error is about, so config validation can name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    /// `ca_file`
    Ca,
    /// `client_cert`
    ClientCert,
    /// `client_key`
    ClientKey,
}

/// Where an origin's TLS material comes from, as configured (paths, not yet read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OriginTlsFiles {
    /// PEM certificates to trust instead of the system roots.
    pub ca_file: Option<String>,
    /// PEM client certificate (chain, leaf first) and its PEM private key.
    pub client_cert_key: Option<(String, String)>,
}

/// One backend's TLS settings, loaded and ready to put on each of its peers.
#[derive(Debug, Clone)]
pub struct OriginTls {
    /// The name sent as SNI and checked against the origin's certificate.
    pub sni: String,
    /// The files as configured (what a reload compares).
    pub files: OriginTlsFiles,
    /// The CA file's certificates; `None`: the system roots.
    ca: Option<Arc<[WrappedX509]>>,
    client_cert_key: Option<Arc<CertKey>>,
}

/// Two settings are the same when they name the same server and the same files: the backend
/// list is a restart-only key, compared on reload, and new content in the same files is not a
/// change of the list (the reload applies it).
impl PartialEq for OriginTls {
    fn eq(&self, other: &Self) -> bool {
        self.sni == other.sni && self.files == other.files
    }
}

impl OriginTls {
    /// Reads and parses the files; the error names the file at fault and the reason.
    pub fn load(sni: String, files: OriginTlsFiles) -> Result<Self, (TlsFile, String)> {
        let ca = match &files.ca_file {
            None => None,
            Some(path) => {
                let certs = certificates(path).map_err(|e| (TlsFile::Ca, e))?;
                let wrapped: Vec<WrappedX509> = certs
                    .into_iter()
                    .map(|der| WrappedX509::new(der, parse_x509))
                    .collect();
                Some(Arc::from(wrapped))
            }
        };
        let client_cert_key = match &files.client_cert_key {
            None => None,
            Some((cert, key)) => {
                let chain = certificates(cert).map_err(|e| (TlsFile::ClientCert, e))?;
                let key = private_key(key).map_err(|e| (TlsFile::ClientKey, e))?;
                Some(Arc::new(CertKey::new(chain, key)))
            }
        };
        Ok(OriginTls {
            sni,
            files,
            ca,
            client_cert_key,
        })
    }

    /// Makes `peer` connect over TLS with these settings.
    pub fn apply(&self, peer: &mut HttpPeer) {
        peer.scheme = pingora_core::upstreams::peer::Scheme::HTTPS;
        peer.sni.clone_from(&self.sni);
        peer.options.verify_cert = true;
        peer.options.verify_hostname = true;
        peer.options.ca.clone_from(&self.ca);
        peer.client_cert_key.clone_from(&self.client_cert_key);
    }
}

/// The certificates of a PEM file, as DER; at least one, each one parsable as X.509 (Pingora
/// parses them again per connection and would panic on a bad one).
fn certificates(path: &str) -> Result<Vec<Vec<u8>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read \"{path}\": {e}"))?;
    let mut certs = Vec::new();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("\"{path}\" is not valid PEM: {e}"))?;
        if x509_parser::parse_x509_certificate(cert.as_ref()).is_err() {
            return Err(format!(
                "\"{path}\" holds a certificate that does not parse"
            ));
        }
        certs.push(cert.to_vec());
    }
    if certs.is_empty() {
        return Err(format!("\"{path}\" holds no PEM certificate"));
    }
    Ok(certs)
}

/// A PEM private key (PKCS#8, PKCS#1 or SEC1), as the DER Pingora's connector turns back into a
/// key per connection (it would panic on one it cannot recognise, so it is checked here).
fn private_key(path: &str) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read \"{path}\": {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("\"{path}\" holds no usable PEM private key: {e}"))?;
    let der = key.secret_der().to_vec();
    PrivateKeyDer::try_from(der.clone())
        .map_err(|e| format!("\"{path}\": the key's format is not recognised: {e}"))?;
    Ok(der)
}
