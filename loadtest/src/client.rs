//! HTTPS connections to one webhook: TLS by rustls, HTTP/1.1 or HTTP/2 by hyper's connection-level client, so
//! the harness decides exactly how many connections there are and which request goes on which.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::check::FixedAnswers;

/// The request header naming the body sent (its index, from 0), when there is more than one.
pub const BODY_HEADER: &str = "x-loadtest-body";

/// A webhook URL, resolved, with the TLS settings to reach it.
pub struct Target {
    /// `sidecar-injector`, `baseline`, `stack-floor`, or the URL.
    pub label: String,
    /// The URL as given.
    pub url: String,
    addr: SocketAddr,
    /// The request target: the path (HTTP/1.1, with a Host header) or the whole URL (HTTP/2's `:authority`).
    uri: Uri,
    host: HeaderValue,
    server_name: ServerName<'static>,
    tls: TlsConnector,
    http2: bool,
    /// The stack floor's fixed answers: its answers are checked against them, not as reviews.
    pub fixed: Option<Arc<FixedAnswers>>,
    /// Name the body sent in each request's [`BODY_HEADER`] (the stack floor, with more than one body).
    tag_bodies: bool,
}

/// The answer to one request.
pub struct Reply {
    /// Its status.
    pub status: StatusCode,
    /// Its `Content-Type`, if any.
    pub content_type: Option<HeaderValue>,
    /// Its whole body.
    pub body: Bytes,
}

/// Why a request got no answer (a transport error, as opposed to a wrong answer).
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// TCP connect failed.
    #[error("connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    /// The TLS handshake failed.
    #[error("TLS handshake with {addr}: {source}")]
    Tls { addr: SocketAddr, source: std::io::Error },
    /// The server did not agree to the protocol we asked for.
    #[error("the server negotiated {negotiated:?} by ALPN, not {wanted}")]
    Alpn { wanted: &'static str, negotiated: Option<String> },
    /// HTTP failed (connection closed, protocol error).
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
}

/// Why a target cannot be used at all.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The URL is not an https URL with a host.
    #[error("{0:?}: expected an https:// URL with a host, such as https://127.0.0.1:8443/mutate")]
    Url(String),
    /// The host does not resolve.
    #[error("{url}: cannot resolve the host: {reason}")]
    Resolve { url: String, reason: String },
    /// The CA file cannot be used.
    #[error("{path}: {reason}")]
    Ca { path: String, reason: String },
}

/// A client TLS configuration trusting the CA certificates of `ca_pem` (PEM), asking for `h2` or `http/1.1`.
pub fn tls_config(ca_pem: &[u8], ca_name: &Path, http2: bool) -> Result<Arc<rustls::ClientConfig>, TargetError> {
    let ca_error = |reason: String| TargetError::Ca { path: ca_name.display().to_string(), reason };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| ca_error(format!("not a PEM certificate bundle: {e}")))?;
        roots.add(cert).map_err(|e| ca_error(format!("not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(ca_error("no certificate in this file".into()));
    }
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    // Offer the cipher suites in the order the API server (Go's crypto/tls, on a CPU with AES instructions) does:
    // AES-128-GCM first. rustls' own order starts with AES-256-GCM, which costs both servers more per byte than
    // what they would negotiate in a cluster.
    provider.cipher_suites.sort_by_key(|suite| api_server_preference(suite.suite()));
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| ca_error(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![if http2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
    Ok(Arc::new(config))
}

/// Rank of a cipher suite in Go's client preference (lower first): AES-128-GCM, AES-256-GCM, then the rest.
fn api_server_preference(suite: rustls::CipherSuite) -> u8 {
    use rustls::CipherSuite as S;
    match suite {
        S::TLS13_AES_128_GCM_SHA256
        | S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 0,
        S::TLS13_AES_256_GCM_SHA384
        | S::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        | S::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => 1,
        _ => 2,
    }
}

impl Target {
    /// Resolves `url` (https only).
    pub async fn new(
        label: &str,
        url: &str,
        tls: Arc<rustls::ClientConfig>,
        http2: bool,
    ) -> Result<Target, TargetError> {
        let bad_url = || TargetError::Url(url.to_owned());
        let uri: Uri = url.parse().map_err(|_| bad_url())?;
        if uri.scheme_str() != Some("https") {
            return Err(bad_url());
        }
        let host = uri.host().ok_or_else(bad_url)?.trim_matches(['[', ']']).to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let resolve_error = |reason: String| TargetError::Resolve { url: url.to_owned(), reason };
        let addr = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| resolve_error(e.to_string()))?
            .next()
            .ok_or_else(|| resolve_error("no address".into()))?;
        let server_name = ServerName::try_from(host).map_err(|_| bad_url())?;
        // The authority of a parsed URI is a valid header value.
        let host = HeaderValue::from_str(uri.authority().map_or("", |a| a.as_str())).map_err(|_| bad_url())?;
        let uri = match http2 {
            true => uri,
            false => uri.path_and_query().map_or_else(|| Uri::from_static("/"), |p| Uri::from(p.clone())),
        };
        Ok(Target {
            label: label.to_owned(),
            url: url.to_owned(),
            addr,
            uri,
            host,
            server_name,
            tls: TlsConnector::from(tls),
            http2,
            fixed: None,
            tag_bodies: false,
        })
    }

    /// This target answers each body with a fixed answer (the stack floor): check its answers against `fixed`,
    /// and, when there is more than one, name the body in each request so that it knows which to send.
    pub fn with_fixed_answers(mut self, fixed: Arc<FixedAnswers>) -> Target {
        self.tag_bodies = fixed.answers().len() > 1;
        self.fixed = Some(fixed);
        self
    }

    /// A new connection: TCP (no Nagle), TLS, then the HTTP handshake.
    pub async fn connect(&self) -> Result<Connection, TransportError> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(|source| TransportError::Connect { addr: self.addr, source })?;
        // Without it, small HTTP/2 frames wait for delayed ACKs (40 ms).
        tcp.set_nodelay(true).map_err(|source| TransportError::Connect { addr: self.addr, source })?;
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|source| TransportError::Tls { addr: self.addr, source })?;
        let wanted: &'static str = if self.http2 { "h2" } else { "http/1.1" };
        let negotiated = tls.get_ref().1.alpn_protocol();
        if negotiated != Some(wanted.as_bytes()) {
            let negotiated = negotiated.map(|p| String::from_utf8_lossy(p).into_owned());
            return Err(TransportError::Alpn { wanted, negotiated });
        }
        let io = TokioIo::new(tls);
        if self.http2 {
            let (sender, connection) = http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(connection);
            Ok(Connection::H2(sender))
        } else {
            let (sender, connection) = http1::handshake(io).await?;
            tokio::spawn(connection);
            Ok(Connection::H1(sender))
        }
    }

    /// The POST of `body`, body number `index`, to this target's path.
    fn request(&self, body: Bytes, index: usize) -> Request<Full<Bytes>> {
        let mut builder =
            Request::post(self.uri.clone()).header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if !self.http2 {
            builder = builder.header(HOST, self.host.clone());
        }
        if self.tag_bodies {
            builder = builder.header(BODY_HEADER, HeaderValue::from(index));
        }
        // Only parts validated in `new` go into the builder, so it cannot fail.
        builder.body(Full::new(body)).unwrap()
    }
}

/// One HTTP connection (HTTP/2: shared by several senders).
pub enum Connection {
    /// HTTP/1.1: one request at a time.
    H1(http1::SendRequest<Full<Bytes>>),
    /// HTTP/2: streams multiplexed.
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Connection {
    /// Sends `body`, body number `index`, to `target` and reads the whole answer.
    pub async fn send(&mut self, target: &Target, body: Bytes, index: usize) -> Result<Reply, TransportError> {
        let request = target.request(body, index);
        let response = match self {
            Connection::H1(sender) => {
                sender.ready().await?;
                sender.send_request(request).await?
            }
            Connection::H2(sender) => {
                sender.ready().await?;
                sender.send_request(request).await?
            }
        };
        let status = response.status();
        let content_type = response.headers().get(CONTENT_TYPE).cloned();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Reply { status, content_type, body })
    }

    /// Another sender on the same connection: HTTP/2 only, HTTP/1.1 carries one request at a time.
    pub fn share(&self) -> Option<Connection> {
        match self {
            Connection::H1(_) => None,
            Connection::H2(sender) => Some(Connection::H2(sender.clone())),
        }
    }

    /// Whether the connection can still carry requests.
    pub fn is_open(&self) -> bool {
        match self {
            Connection::H1(sender) => !sender.is_closed(),
            Connection::H2(sender) => !sender.is_closed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_prefers_aes_128_gcm_as_the_api_server_does() {
        let authority =
            sidecar_injector::pki::Authority::generate("test CA", std::time::Duration::from_secs(3600)).unwrap();
        let ca = authority.cert_pem().to_owned();
        let config = tls_config(ca.as_bytes(), Path::new("ca.pem"), false).unwrap();
        let suites: Vec<_> = config.crypto_provider().cipher_suites.iter().map(|s| s.suite()).collect();
        let tls13: Vec<_> = suites.iter().filter(|s| format!("{s:?}").starts_with("TLS13")).collect();
        assert_eq!(tls13[0], &rustls::CipherSuite::TLS13_AES_128_GCM_SHA256, "{suites:?}");
        assert_eq!(tls13[1], &rustls::CipherSuite::TLS13_AES_256_GCM_SHA384, "{suites:?}");
    }
}
