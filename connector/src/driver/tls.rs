//! The TLS listener's server side (TLS-1 … TLS-4): the certificate chain and key from PEM files,
//! TLS 1.2 at least, and in mtls mode a client certificate required and verified against a CA
//! bundle. The files are re-read when they change (cert-manager rewrites a Secret in place, and a
//! mounted Secret changes by a symlink swap), so new connections get a rotated certificate
//! without a restart; open connections keep the one they were made with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;
use crate::engine::ClientCertificate;

/// Why the TLS configuration cannot be used; names the file, never its contents.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{0}: no PEM certificate in it")]
    NoCertificate(PathBuf),
    /// The key file holds no PEM private key.
    #[error("{0}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)")]
    NoKey(PathBuf),
    /// rustls refused the material (a key that does not match the certificate, a CA that is
    /// not a certificate, ...).
    #[error("{path}: {reason}")]
    Refused {
        /// The file it is about.
        path: PathBuf,
        /// What rustls said.
        reason: String,
    },
}

/// Where new TLS connections get their server configuration: loaded from the files, and loaded
/// again when one of them has changed.
pub struct TlsSource {
    files: TlsFiles,
    current: Mutex<Loaded>,
}

/// The configuration in use, and the state of the files when they were last loaded (or failed
/// to load: the same broken files are not parsed again for every connection).
struct Loaded {
    tried: Vec<Option<FileStamp>>,
    acceptor: TlsAcceptor,
    /// The server certificate's notAfter, Unix seconds (None when it cannot be read).
    not_after: Option<i64>,
}

/// What tells that a file changed: the file a path leads to (a symlink swap leads elsewhere),
/// its size and modification time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl std::fmt::Debug for TlsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSource")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl TlsSource {
    /// Loads the files; an error here stops the connector at start.
    pub fn load(files: TlsFiles) -> Result<TlsSource, TlsError> {
        let tried = stamps(&files);
        let (config, not_after) = server_config(&files)?;
        Ok(TlsSource {
            files,
            current: Mutex::new(Loaded {
                tried,
                acceptor: TlsAcceptor::from(Arc::new(config)),
                not_after,
            }),
        })
    }

    /// Whether client certificates are required (mtls).
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The acceptor for a new connection: the current files' configuration. When a file
    /// changed and the new set does not load (a half-written rotation), the last good one stays
    /// and the failure is logged once; the next change is tried again.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current().acceptor.clone()
    }

    /// When the certificate new connections get expires, in Unix seconds; the files are looked
    /// at again first, so a rotation shows without waiting for a connection.
    pub fn not_after(&self) -> Option<i64> {
        self.current().not_after
    }

    /// The loaded configuration, loaded again first when a file changed.
    fn current(&self) -> std::sync::MutexGuard<'_, Loaded> {
        let now = stamps(&self.files);
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if now != current.tried {
            match server_config(&self.files) {
                Ok((config, not_after)) => {
                    tracing::info!(cert = %self.files.cert.display(), "TLS files changed: new connections use them");
                    current.acceptor = TlsAcceptor::from(Arc::new(config));
                    current.not_after = not_after;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "TLS files changed but do not load; the previous certificate stays in use")
                }
            }
            current.tried = now;
        }
        current
    }
}

fn stamps(files: &TlsFiles) -> Vec<Option<FileStamp>> {
    use std::os::unix::fs::MetadataExt;
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| {
        std::fs::metadata(p).ok().map(|m| FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            modified: m.modified().ok(),
        })
    })
    .collect()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Refused {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_path_buf()));
    }
    Ok(certs)
}

/// The rustls server configuration of `files`: TLS 1.2 and 1.3 with the ring provider; in
/// mtls mode a verifier that requires a client certificate chaining to the CA bundle. With it,
/// the server certificate's notAfter in Unix seconds.
fn server_config(files: &TlsFiles) -> Result<(ServerConfig, Option<i64>), TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&files.cert)?;
    let not_after = chain.first().and_then(|leaf| {
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
        Some(cert.validity().not_after.timestamp())
    });
    let key = PrivateKeyDer::from_pem_slice(&read(&files.key)?)
        .map_err(|_| TlsError::NoKey(files.key.clone()))?;
    let refused = |path: &Path| {
        let path = path.to_path_buf();
        move |e: rustls::Error| TlsError::Refused {
            path,
            reason: e.to_string(),
        }
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(refused(&files.cert))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert).map_err(refused(ca))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Refused {
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(refused(&files.key))?;
    Ok((config, not_after))
}

/// The verified certificate the client presented (mTLS; TLS-4), for EXTERNAL (SASL-7): its
/// Subject's first common name, empty when it has none or it cannot be read as UTF-8.
pub(super) fn client_certificate(conn: &rustls::ServerConnection) -> Option<ClientCertificate> {
    let leaf = conn.peer_certificates()?.first()?;
    let common_name = x509_parser::parse_x509_certificate(leaf.as_ref())
        .ok()
        .and_then(|(_, cert)| {
            cert.subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok().map(str::to_string))
        })
        .unwrap_or_default();
    Some(ClientCertificate { common_name })
}
