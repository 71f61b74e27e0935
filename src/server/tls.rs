//! TLS: the serving certificate behind an `ArcSwap` (a handshake costs one atomic load to find it), reloaded when
//! its files change (cert-manager rotates them in place), optional client-certificate verification, and a
//! generated development CA for a zero-configuration first run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use super::ServeConfig;
use super::telemetry::Metrics;

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// PEM files, as mounted from a Secret; reloaded when they change.
    Files {
        /// The certificate chain.
        cert: PathBuf,
        /// The private key.
        key: PathBuf,
    },
    /// A development CA and a certificate for localhost, generated at start; the CA is written to `ca_out`.
    SelfSigned {
        /// Where the CA certificate (PEM) is written for clients to trust.
        ca_out: PathBuf,
    },
}

/// Why TLS could not be set up. Each names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The certificate and key do not form a usable pair.
    #[error("{cert} and {key}: {reason}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The development certificate could not be generated or written.
    #[error("development certificate: {0}")]
    SelfSigned(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The serving certificate, swappable while handshakes run.
#[derive(Debug)]
struct SwappableCert(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// The TLS side of the server: the acceptor and what is needed to reload its certificate.
#[derive(Clone)]
pub(crate) struct Tls {
    acceptor: TlsAcceptor,
    resolver: Arc<SwappableCert>,
    provider: Arc<CryptoProvider>,
    /// The files to watch, when the certificate comes from files.
    files: Option<CertFiles>,
    metrics: Metrics,
}

/// Certificate files and the contents now being served from them.
#[derive(Clone)]
struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    serving: PemPair,
}

impl Tls {
    pub(crate) fn load(config: &ServeConfig, metrics: Metrics) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let (key, files) = match &config.tls {
            TlsSource::Files { cert, key } => {
                let serving = read_pair(cert, key)?;
                let certified = certified_key(&serving, cert, key, &provider)?;
                (certified, Some(CertFiles { cert: cert.clone(), key: key.clone(), serving }))
            }
            TlsSource::SelfSigned { ca_out } => (self_signed(ca_out, &provider)?, None),
        };
        let resolver = Arc::new(SwappableCert(ArcSwap::from(key)));
        let versions: &[&rustls::SupportedProtocolVersion] = if config.tls13_only {
            &[&rustls::version::TLS13]
        } else {
            &[&rustls::version::TLS13, &rustls::version::TLS12]
        };
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &config.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, &provider)?),
        };
        let mut server = builder.with_cert_resolver(resolver.clone());
        // ALPN decides the protocol: the API server offers only http/1.1 to Service webhooks; others may use h2.
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls { acceptor: TlsAcceptor::from(Arc::new(server)), resolver, provider, files, metrics })
    }

    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }

    /// Checks the certificate files every `interval` and swaps in a changed pair. A broken pair (half-written,
    /// mismatched) is logged and counted, and the current certificate keeps serving.
    pub(crate) async fn watch(self, interval: Duration) {
        let Some(mut files) = self.files.clone() else {
            // A generated certificate has no files to watch; the task idles rather than end (and be restarted).
            return std::future::pending().await;
        };
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let (cert, key) = (files.cert.clone(), files.key.clone());
            // File reads are blocking I/O: off the async workers.
            let Ok(read) = tokio::task::spawn_blocking(move || read_pair(&cert, &key)).await else { continue };
            let changed = read.and_then(|pem| {
                if pem == files.serving {
                    return Ok(None);
                }
                certified_key(&pem, &files.cert, &files.key, &self.provider).map(|certified| Some((pem, certified)))
            });
            match changed {
                Ok(None) => {}
                Ok(Some((pem, certified))) => {
                    self.resolver.0.store(certified);
                    files.serving = pem;
                    self.metrics.cert_reload(true);
                    tracing::info!(cert = %files.cert.display(), "certificate reloaded");
                }
                Err(e) => {
                    self.metrics.cert_reload(false);
                    tracing::error!(error = %e, "certificate reload failed; the current certificate keeps serving");
                }
            }
        }
    }
}

/// The PEM bytes of a certificate and its key.
#[derive(Clone, PartialEq, Eq)]
struct PemPair {
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn read_pair(cert: &Path, key: &Path) -> Result<PemPair, TlsError> {
    let read =
        |path: &Path| std::fs::read(path).map_err(|e| TlsError::File { path: path.to_owned(), reason: e.to_string() });
    Ok(PemPair { cert: read(cert)?, key: read(key)? })
}

fn certified_key(
    pem: &PemPair,
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let file_error = |path: &Path, reason: String| TlsError::File { path: path.to_owned(), reason };
    let chain = CertificateDer::pem_slice_iter(&pem.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(cert_path, format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(file_error(cert_path, "no certificate in the file".to_owned()));
    }
    let key = PrivateKeyDer::from_pem_slice(&pem.key)
        .map_err(|e| file_error(key_path, format!("not a PEM private key: {e}")))?;
    CertifiedKey::from_der(chain, key, provider).map(Arc::new).map_err(|e| TlsError::Pair {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        reason: e.to_string(),
    })
}

fn client_verifier(
    ca: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let file_error = |reason: String| TlsError::File { path: ca.to_owned(), reason };
    let pem = std::fs::read(ca).map_err(|e| file_error(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| file_error(format!("not a PEM certificate: {e}")))?;
        roots.add(cert).map_err(|e| file_error(format!("not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(file_error("no CA certificate in the file".to_owned()));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))
}

/// A development CA and a serving certificate for localhost signed by it. The CA goes to `ca_out` so that a
/// client can trust it.
fn self_signed(ca_out: &Path, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, TlsError> {
    let generated = DevCertificates::generate().map_err(|e| TlsError::SelfSigned(e.to_string()))?;
    if let Some(dir) = ca_out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| TlsError::File { path: dir.to_owned(), reason: e.to_string() })?;
    }
    std::fs::write(ca_out, &generated.ca_pem)
        .map_err(|e| TlsError::File { path: ca_out.to_owned(), reason: e.to_string() })?;
    tracing::warn!(
        ca = %ca_out.display(),
        "no --tls-cert/--tls-key: serving a generated certificate for localhost, signed by a development CA \
         written to this file. This is for trying the webhook out, not for a cluster."
    );
    let pem = PemPair { cert: generated.cert_pem.into_bytes(), key: generated.key_pem.into_bytes() };
    certified_key(&pem, Path::new("<generated certificate>"), Path::new("<generated key>"), provider)
}

/// A development CA with one serving certificate, as PEM.
pub struct DevCertificates {
    /// The CA certificate, to trust.
    pub ca_pem: String,
    /// The serving certificate (for `localhost`, `127.0.0.1`, `::1` and any extra names).
    pub cert_pem: String,
    /// The serving certificate's private key.
    pub key_pem: String,
}

impl DevCertificates {
    /// A new CA and a certificate for localhost.
    pub fn generate() -> Result<Self, crate::pki::PkiError> {
        Self::generate_for(&[])
    }

    /// A new CA and a certificate for localhost and `extra_names` (DNS names or IP addresses).
    pub fn generate_for(extra_names: &[String]) -> Result<Self, crate::pki::PkiError> {
        // A development certificate lives as long as the process that generated it; a year is plenty.
        const VALIDITY: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);
        let ca = crate::pki::Authority::generate("sidecar-injector development CA", VALIDITY)?;
        let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
        names.extend_from_slice(extra_names);
        let leaf = ca.issue_server("sidecar-injector", &names, VALIDITY)?;
        Ok(DevCertificates { ca_pem: ca.cert_pem().to_owned(), cert_pem: leaf.cert_pem, key_pem: leaf.key_pem })
    }
}
