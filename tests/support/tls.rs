//! Certificates for TLS tests, made with the `openssl` command line tool: a self-signed one for
//! Lacquer's TLS listeners.

use crate::support::child::stderr_text;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate and its key, as PEM files.
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A self-signed certificate for `localhost`, valid for a day, written into `dir`.
pub fn self_signed_cert(dir: &Path) -> CertFiles {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl is installed");
    assert!(made.status.success(), "{}", stderr_text(&made));
    CertFiles { cert, key }
}
