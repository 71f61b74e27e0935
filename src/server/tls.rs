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

impl TlsSource {
    /// What `serve` uses without a certificate: a development CA written to
    /// `<temp dir>/sidecar-injector/dev-ca.pem` (the temporary directory comes from `TMPDIR`, read at run time).
    pub fn development() -> TlsSource {
        TlsSource::SelfSigned { ca_out: std::env::temp_dir().join("sidecar-injector").join("dev-ca.pem") }
    }
}

/// Why TLS could not be set up. Each names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file (or directory).
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not the PEM it should be.
    #[error("{path}: not {what}: {source}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What it should hold: `a PEM certificate chain`, `a PEM private key`, `a PEM certificate`.
        what: &'static str,
        /// The PEM error.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A file holds no certificate of the kind it should.
    #[error("{path}: no {what} in the file")]
    Empty {
        /// The file.
        path: PathBuf,
        /// `certificate` or `CA certificate`.
        what: &'static str,
    },
    /// A client CA certificate cannot be a trust anchor.
    #[error("{path}: not a usable CA certificate: {source}")]
    Ca {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// The certificate and key do not form a usable pair.
    #[error("{cert} and {key}: {source}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What is wrong.
        #[source]
        source: rustls::Error,
    },
    /// The development certificate could not be generated.
    #[error("development certificate: {0}")]
    SelfSigned(#[source] crate::pki::PkiError),
    /// rustls refused the protocol versions.
    #[error("TLS configuration: {0}")]
    Config(#[source] rustls::Error),
    /// rustls refused the client certificate verifier.
    #[error("TLS configuration: {0}")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
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
            .map_err(TlsError::Config)?;
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
    let read = |path: &Path| std::fs::read(path).map_err(|source| TlsError::Io { path: path.to_owned(), source });
    Ok(PemPair { cert: read(cert)?, key: read(key)? })
}

fn certified_key(
    pem: &PemPair,
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(&pem.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem { path: cert_path.to_owned(), what: "a PEM certificate chain", source })?;
    if chain.is_empty() {
        return Err(TlsError::Empty { path: cert_path.to_owned(), what: "certificate" });
    }
    let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|source| TlsError::Pem {
        path: key_path.to_owned(),
        what: "a PEM private key",
        source,
    })?;
    CertifiedKey::from_der(chain, key, provider).map(Arc::new).map_err(|source| TlsError::Pair {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        source,
    })
}

fn client_verifier(
    ca: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let pem = std::fs::read(ca).map_err(|source| TlsError::Io { path: ca.to_owned(), source })?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|source| TlsError::Pem { path: ca.to_owned(), what: "a PEM certificate", source })?;
        roots.add(cert).map_err(|source| TlsError::Ca { path: ca.to_owned(), source })?;
    }
    if roots.is_empty() {
        return Err(TlsError::Empty { path: ca.to_owned(), what: "CA certificate" });
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().map_err(TlsError::Verifier)
}

/// A development CA and a serving certificate for localhost signed by it. The CA goes to `ca_out` so that a
/// client can trust it.
fn self_signed(ca_out: &Path, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, TlsError> {
    let generated = DevCertificates::generate().map_err(TlsError::SelfSigned)?;
    if let Some(dir) = ca_out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| TlsError::Io { path: dir.to_owned(), source })?;
    }
    std::fs::write(ca_out, &generated.ca_pem).map_err(|source| TlsError::Io { path: ca_out.to_owned(), source })?;
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
