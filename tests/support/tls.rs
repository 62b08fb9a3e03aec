//! Certificates for TLS tests, made with the `openssl` command line tool: a self-signed one for
//! Lacquer's TLS listeners, and a test certificate authority ([`TestCa`]) signing the server and
//! client certificates of `https` origins.

use crate::child::stderr_text;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate and its key, as PEM files.
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    /// Lacquer's `[tls]` config section: a listener on `listen` (an address, maybe followed by
    /// ` proxy_protocol`) serving this certificate.
    pub fn tls_toml(&self, listen: &str) -> String {
        format!(
            "[tls]\nlisten = [\"{listen}\"]\ncert = \"{}\"\nkey = \"{}\"\n",
            self.cert.display(),
            self.key.display()
        )
    }
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

/// A throw-away certificate authority: its certificate is what Lacquer is told to trust
/// (`ca_file`), and it signs the certificates test origins and clients present.
pub struct TestCa {
    dir: PathBuf,
    /// The CA's certificate (PEM).
    pub cert: PathBuf,
    key: PathBuf,
}

/// Runs `openssl` with `args`, panicking with its stderr when it fails.
fn openssl(args: &[&str]) {
    let made = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl is installed");
    assert!(made.status.success(), "{}", stderr_text(&made));
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

impl TestCa {
    /// A new CA named `name`, its files in `dir` (P-256 keys: quick to make).
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let cert = dir.join(format!("{name}-ca.pem"));
        let key = dir.join(format!("{name}-ca-key.pem"));
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            &format!("/CN={name} test CA"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            path_str(&key),
            "-out",
            path_str(&cert),
        ]);
        TestCa {
            dir: dir.to_path_buf(),
            cert,
            key,
        }
    }

    /// A server certificate for `localhost` and `127.0.0.1`, signed by this CA.
    pub fn server_cert(&self, file_stem: &str) -> CertFiles {
        self.issue(
            file_stem,
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
    }

    /// A client certificate (for mutual TLS), signed by this CA.
    pub fn client_cert(&self, file_stem: &str) -> CertFiles {
        self.issue(file_stem, "extendedKeyUsage=clientAuth\n")
    }

    fn issue(&self, file_stem: &str, extensions: &str) -> CertFiles {
        let cert = self.dir.join(format!("{file_stem}.pem"));
        let key = self.dir.join(format!("{file_stem}-key.pem"));
        let csr = self.dir.join(format!("{file_stem}.csr"));
        let ext = self.dir.join(format!("{file_stem}.ext"));
        std::fs::write(&ext, extensions).expect("write the extensions file");
        openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={file_stem}"),
            "-keyout",
            path_str(&key),
            "-out",
            path_str(&csr),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            path_str(&csr),
            "-CA",
            path_str(&self.cert),
            "-CAkey",
            path_str(&self.key),
            "-set_serial",
            "2",
            "-days",
            "1",
            "-extfile",
            path_str(&ext),
            "-out",
            path_str(&cert),
        ]);
        CertFiles { cert, key }
    }
}
