//! A real server on 127.0.0.1 (random ports) and a real TLS client for it, HTTP/1.1 or HTTP/2.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sidecar_injector::server::{ServeConfig, Server, TlsSource};
use sidecar_injector_core::{Engine, Settings, TemplateSet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// A running server and what a client needs to reach it.
pub struct Running {
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    pub ca_pem: Vec<u8>,
    pub stop: Option<oneshot::Sender<()>>,
    pub done: tokio::task::JoinHandle<()>,
    pub dir: tempfile::TempDir,
}

pub fn engine() -> Arc<ArcSwap<Engine>> {
    let settings = Settings::default();
    Arc::new(ArcSwap::from_pointee(Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings)))
}

pub fn test_config(dir: &Path) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        shutdown_delay: Duration::ZERO,
        shutdown_timeout: Duration::from_secs(5),
        tls: TlsSource::SelfSigned { ca_out: dir.join("ca.pem") },
        ..ServeConfig::default()
    }
}

impl Running {
    /// A server running elsewhere (a child process), to use the helpers that take a [`Running`].
    pub fn attach(addr: SocketAddr, metrics: SocketAddr, ca_pem: Vec<u8>) -> Running {
        let done = tokio::spawn(async {});
        Running { addr, metrics, ca_pem, stop: None, done, dir: tempfile::tempdir().unwrap() }
    }
}

pub async fn start(configure: impl FnOnce(&mut ServeConfig, &Path)) -> Running {
    start_with(engine(), configure).await
}

/// Starts a server on `engine`, in a fresh temporary directory that `configure` may use.
pub async fn start_with(engine: Arc<ArcSwap<Engine>>, configure: impl FnOnce(&mut ServeConfig, &Path)) -> Running {
    start_revisions(vec![engine], configure).await
}

/// Starts a server on `engines`, one per revision (the first also at the bare paths), in a fresh temporary
/// directory that `configure` may use.
pub async fn start_revisions(
    engines: Vec<Arc<ArcSwap<Engine>>>,
    configure: impl FnOnce(&mut ServeConfig, &Path),
) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    configure(&mut config, dir.path());
    let ca_out = match &config.tls {
        TlsSource::SelfSigned { ca_out } => ca_out.clone(),
        TlsSource::Files { .. } => dir.path().join("ca.pem"),
    };
    let server = Server::bind(config, engines).await.unwrap();
    let (addr, metrics) = (server.local_addr(), server.metrics_addr());
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let ca_pem = std::fs::read(ca_out).unwrap();
    Running { addr, metrics, ca_pem, stop: Some(stop), done, dir }
}

pub fn client_config(ca_pem: &[u8], alpn: &[u8], identity: Option<(&str, &str)>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>().unwrap();
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap()).unwrap()
        }
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    config
}

pub async fn tls_connect(
    addr: SocketAddr,
    config: rustls::ClientConfig,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    tls_connect_as(addr, config, "localhost").await
}

/// Connects to `addr` expecting a certificate for `server_name` (as the API server reaches `svc.ns.svc`).
pub async fn tls_connect_as(
    addr: SocketAddr,
    config: rustls::ClientConfig,
    server_name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    connector.connect(ServerName::try_from(server_name.to_owned()).unwrap(), tcp).await
}

/// One HTTP connection, either protocol.
pub enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    /// Waits, from now, until the server has closed the connection: how long that took, or `None` after
    /// `patience`.
    pub async fn closed_within(&self, patience: Duration) -> Option<Duration> {
        let started = std::time::Instant::now();
        let closed = || match self {
            Conn::H1(s) => s.is_closed(),
            Conn::H2(s) => s.is_closed(),
        };
        while !closed() {
            if started.elapsed() >= patience {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some(started.elapsed())
    }

    pub async fn open(addr: SocketAddr, ca_pem: &[u8], h2: bool) -> Conn {
        let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
        Self::open_with(addr, client_config(ca_pem, alpn, None)).await.unwrap()
    }

    pub async fn open_with(addr: SocketAddr, config: rustls::ClientConfig) -> Result<Conn, String> {
        Self::open_as(addr, config, "localhost").await
    }

    pub async fn open_as(addr: SocketAddr, config: rustls::ClientConfig, server_name: &str) -> Result<Conn, String> {
        let h2 = config.alpn_protocols == [b"h2".to_vec()];
        let tls = tls_connect_as(addr, config, server_name).await.map_err(|e| e.to_string())?;
        let io = TokioIo::new(tls);
        if h2 {
            let (send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            Ok(Conn::H2(send))
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            Ok(Conn::H1(send))
        }
    }

    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), String> {
        self.send_for_headers(req).await.map(|(status, _, body)| (status, body))
    }

    /// [`Conn::send`], with the response's headers.
    pub async fn send_for_headers(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, hyper::HeaderMap, Bytes), String> {
        // Wait until the connection can take a request: right after a response, an h1 connection may still be
        // finishing the previous exchange, and sending then fails as "canceled" without reaching the server.
        let response = match self {
            Conn::H1(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
            Conn::H2(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        let (status, headers) = (response.status(), response.headers().clone());
        let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, headers, body))
    }

    pub async fn review(&mut self, body: &[u8]) -> (StatusCode, Bytes) {
        self.send(post("/mutate?timeout=10s", "application/json", body)).await.unwrap()
    }
}

pub fn post(path: &str, content_type: &str, body: &[u8]) -> Request<Full<Bytes>> {
    Request::post(format!("https://localhost{path}"))
        .header("content-type", content_type)
        .body(Full::new(Bytes::copy_from_slice(body)))
        .unwrap()
}

/// A plain GET on the admin listener.
pub async fn admin_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    tcp.read_to_string(&mut text).await.unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// Reads until the server closes the connection (or fails it), and says how long that took; `None` if it was
/// still open after `patience`.
pub async fn closed_within(stream: &mut (impl tokio::io::AsyncRead + Unpin), patience: Duration) -> Option<Duration> {
    let started = std::time::Instant::now();
    let mut buf = vec![0; 4096];
    tokio::time::timeout(patience, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    })
    .await
    .ok()
    .map(|()| started.elapsed())
}

/// The HTTP/2 client preface and an empty SETTINGS frame.
pub const H2_PREFACE_AND_SETTINGS: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// An HTTP/2 frame's bytes.
pub fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    frame.extend([kind, flags]);
    frame.extend(stream.to_be_bytes());
    frame.extend(payload);
    frame
}

pub fn counter(metrics: &str, series: &str) -> f64 {
    metrics.lines().find_map(|line| line.strip_prefix(series).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0.0)
}

/// `sidecar-injector serve` running on free ports, killed when dropped.
pub struct Process {
    pub child: std::process::Child,
    pub addr: std::net::SocketAddr,
    pub metrics: std::net::SocketAddr,
    pub ca: Vec<u8>,
    /// The log lines after the one that announced the addresses, until the process ends.
    log: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Process {
    pub fn spawn(dir: &Path) -> Process {
        Process::spawn_with(dir, &[])
    }

    /// With `args` added to `serve`'s.
    pub fn spawn_with(dir: &Path, args: &[&str]) -> Process {
        use std::io::BufRead;
        let ca = dir.join("ca.pem");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
            .args(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--dev-ca-file"])
            .arg(&ca)
            .args(args)
            .env_remove("SIDECAR_INJECTOR_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Killed when dropped, should the log not announce the addresses.
        let unbound = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
        let mut process = Process { child, addr: unbound, metrics: unbound, ca: Vec::new(), log: None };
        let mut lines = std::io::BufReader::new(process.child.stderr.take().unwrap()).lines();
        let field = |line: &str, name: &str| -> std::net::SocketAddr {
            let at = line.find(&format!(" {name}=")).unwrap_or_else(|| panic!("no {name} in {line}")) + name.len() + 2;
            line[at..].split_whitespace().next().unwrap().parse().unwrap()
        };
        loop {
            let line = lines.next().expect("the server stopped before serving").unwrap();
            if line.contains(" serving listen=") {
                (process.addr, process.metrics) = (field(&line, "listen"), field(&line, "metrics"));
                process.ca = std::fs::read(ca).unwrap();
                process.log = Some(std::thread::spawn(move || lines.map_while(Result::ok).collect()));
                return process;
            }
        }
    }

    /// A field of the process's /proc status in KiB (`VmRSS`, `VmHWM`).
    pub fn memory_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap_or_else(|| panic!("no {field}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Kills the process and returns the rest of its log.
    pub fn kill(&mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log.take().map(|log| log.join().unwrap()).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}
