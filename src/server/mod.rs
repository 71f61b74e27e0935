//! The HTTPS webhook server: TLS (rustls, certificates reloaded when their files change), HTTP/1.1 or HTTP/2 by
//! ALPN (hyper), the webhook handler, a plain-HTTP admin listener (metrics, health), limits and graceful shutdown.
//!
//! Layers, outermost first: [`Server::run`] accepts connections (bounded by a semaphore, so excess connections
//! wait in the kernel's backlog), `tls` terminates TLS, hyper speaks HTTP, `handler` turns one request into
//! one engine call, `admin` serves `/metrics`, `/healthz` and `/readyz`.

mod admin;
mod handler;
pub mod reload;
mod telemetry;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::Engine;
pub use tls::TlsSource;

/// Everything the server needs, explicit: the CLI fills it from flags and environment variables.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The HTTPS listener.
    pub listen: SocketAddr,
    /// The plain-HTTP listener for `/metrics`, `/healthz` and `/readyz`.
    pub metrics_listen: SocketAddr,
    /// The webhook's path (matched without the query string).
    pub path: String,
    /// The validating webhook's path: is the pod's injection complete?
    pub validate_path: String,
    /// Where the serving certificate comes from.
    pub tls: TlsSource,
    /// Require client certificates signed by this CA bundle.
    pub client_ca: Option<PathBuf>,
    /// Accept TLS 1.3 only (otherwise 1.2 and 1.3).
    pub tls13_only: bool,
    /// How often the certificate files are checked for a change.
    pub tls_reload_interval: Duration,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Time allowed for the TLS handshake and, on HTTP/1.1, for each request's headers.
    pub header_read_timeout: Duration,
    /// Deadline for one request (body and answer); the API server's `?timeout=` lowers it.
    pub request_timeout: Duration,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// Concurrent streams per HTTP/2 connection.
    pub h2_max_concurrent_streams: u32,
    /// After the shutdown signal, keep accepting this long (while `/readyz` says 503) so that endpoints are
    /// removed before the listener closes.
    pub shutdown_delay: Duration,
    /// After the shutdown signal, give up on draining connections after this long.
    pub shutdown_timeout: Duration,
    /// Reload templates from this directory when it changes (otherwise the templates are fixed).
    pub templates: Option<reload::TemplateWatch>,
}

impl ServeConfig {
    /// The defaults of `sidecar-injector serve`, with the given certificate source.
    pub fn new(tls: TlsSource) -> Self {
        ServeConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 8443)),
            metrics_listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            path: "/mutate".to_owned(),
            validate_path: "/validate".to_owned(),
            tls,
            client_ca: None,
            tls13_only: false,
            tls_reload_interval: Duration::from_secs(10),
            max_body_bytes: 4 * 1024 * 1024,
            header_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            max_connections: 1024,
            h2_max_concurrent_streams: 256,
            shutdown_delay: Duration::from_secs(2),
            shutdown_timeout: Duration::from_secs(20),
            templates: None,
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS material could not be loaded or generated.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The metrics recorder could not be installed.
    #[error("cannot set up metrics: {0}")]
    Metrics(String),
}

/// State shared by every connection.
pub(crate) struct Shared {
    pub engine: Arc<ArcSwap<Engine>>,
    pub config: ServeConfig,
    pub metrics: telemetry::Metrics,
    /// Set when shutdown begins: `/readyz` answers 503 from then on.
    pub shutting_down: AtomicBool,
    /// The template generation serving and the newest refused edit.
    pub templates: Arc<reload::ReloadState>,
}

/// A bound, ready-to-run server.
pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
    admin: TcpListener,
    tls: tls::Tls,
}

impl Server {
    /// Loads the TLS material, installs the metrics recorder and binds both listeners. `engine` is shared so that
    /// a template reload can swap it while requests flow.
    pub async fn bind(config: ServeConfig, engine: Arc<ArcSwap<Engine>>) -> Result<Server, ServeError> {
        let metrics = telemetry::Metrics::new().map_err(ServeError::Metrics)?;
        let tls = tls::Tls::load(&config, metrics.clone())?;
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })
        };
        let listener = bind(config.listen).await?;
        let admin = bind(config.metrics_listen).await?;
        let templates = Arc::new(reload::ReloadState::new(&engine.load()));
        metrics.template_start(engine.load().set().hash());
        let shared = Arc::new(Shared { engine, config, metrics, shutting_down: AtomicBool::new(false), templates });
        Ok(Server { shared, listener, admin, tls })
    }

    /// The HTTPS listener's address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.shared.config.listen)
    }

    /// The admin listener's address.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.admin.local_addr().unwrap_or(self.shared.config.metrics_listen)
    }

    /// Serves until `shutdown` resolves, then drains: `/readyz` turns 503 at once, connections are still accepted
    /// for `shutdown_delay`, then the listener closes, in-flight requests finish, idle connections close, and
    /// this returns within `shutdown_timeout` of the signal.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server { shared, listener, admin, tls } = self;
        let config = &shared.config;
        let admin_addr = admin.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let cert_watch = {
            let (tls, interval, metrics) = (tls.clone(), config.tls_reload_interval, shared.metrics.clone());
            tokio::spawn(supervise(
                "certificate reload",
                Duration::from_secs(1),
                move || metrics.cert_reload(false),
                move || tls.clone().watch(interval),
            ))
        };
        let template_watch = config.templates.clone().map(|watch| {
            let reloader = reload::Reloader {
                watch,
                engine: shared.engine.clone(),
                state: shared.templates.clone(),
                metrics: shared.metrics.clone(),
                compile: reload::TemplateWatch::compile,
            };
            tokio::spawn(reloader.run())
        });
        let admin_task = tokio::spawn(admin::serve(admin, shared.clone()));
        let upkeep = tokio::spawn(telemetry::upkeep(shared.metrics.clone()));

        let mut h1 = auto::Builder::new(TokioExecutor::new()).http1_only();
        h1.http1().timer(TokioTimer::new()).header_read_timeout(config.header_read_timeout).keep_alive(true);
        let mut h2 = auto::Builder::new(TokioExecutor::new()).http2_only();
        h2.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(config.h2_max_concurrent_streams)
            .max_pending_accept_reset_streams(20)
            .keep_alive_interval(Duration::from_secs(30));

        let permits = Arc::new(Semaphore::new(config.max_connections.max(1)));
        let connections =
            Connections { shared: shared.clone(), acceptor: tls.acceptor(), h1, h2, graceful: GracefulShutdown::new() };
        tracing::info!(
            listen = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            metrics = %admin_addr,
            path = %config.path,
            validate_path = %config.validate_path,
            "serving"
        );

        let mut shutdown = std::pin::pin!(shutdown);
        let stop_accepting = loop {
            // Waiting for a permit before accepting leaves excess connections in the kernel's backlog.
            let permit = tokio::select! {
                permit = permits.clone().acquire_owned() => permit,
                () = &mut shutdown => break true,
            };
            let Ok(permit) = permit else { break false };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut shutdown => break true,
            };
            let (tcp, peer) = match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            connections.spawn(tcp, peer, permit);
        };

        if stop_accepting {
            shared.shutting_down.store(true, Ordering::SeqCst);
            tracing::info!(delay = ?config.shutdown_delay, "shutdown: readiness is now 503, still accepting");
            let deadline = tokio::time::Instant::now() + config.shutdown_timeout;
            let keep_accepting = tokio::time::sleep(config.shutdown_delay);
            tokio::pin!(keep_accepting);
            loop {
                tokio::select! {
                    () = &mut keep_accepting => break,
                    accepted = listener.accept() => {
                        let Ok((tcp, peer)) = accepted else { continue };
                        let Ok(permit) = permits.clone().try_acquire_owned() else { continue };
                        connections.spawn(tcp, peer, permit);
                    }
                }
            }
            drop(listener);
            tracing::info!("shutdown: listener closed, draining connections");
            match tokio::time::timeout_at(deadline, connections.graceful.shutdown()).await {
                Ok(()) => tracing::info!("shutdown: every connection finished"),
                Err(_) => tracing::warn!("shutdown: deadline reached with connections still open"),
            }
        }
        cert_watch.abort();
        if let Some(task) = template_watch {
            task.abort();
        }
        admin_task.abort();
        upkeep.abort();
    }
}

/// Bytes read from a connection's socket at once: a full TLS record (16 KiB of data and its overhead).
const READ_AHEAD: usize = 16 * 1024 + 512;

/// What every connection is served with.
struct Connections {
    shared: Arc<Shared>,
    acceptor: tokio_rustls::TlsAcceptor,
    h1: auto::Builder<TokioExecutor>,
    h2: auto::Builder<TokioExecutor>,
    graceful: GracefulShutdown,
}

impl Connections {
    /// Serves one accepted connection on its own task, holding `permit` until it ends.
    fn spawn(&self, tcp: tokio::net::TcpStream, peer: SocketAddr, permit: tokio::sync::OwnedSemaphorePermit) {
        // Without TCP_NODELAY, small HTTP/2 frames were seen to wait 40 ms for Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
        // rustls reads at most 4 KiB per call: a 6 KiB review took two recvfrom calls. Reading ahead into a
        // buffer as large as a TLS record takes a whole request in one (the writes pass straight through).
        let tcp = tokio::io::BufReader::with_capacity(READ_AHEAD, tcp);
        let (shared, acceptor, watcher) = (self.shared.clone(), self.acceptor.clone(), self.graceful.watcher());
        let (h1, h2) = (self.h1.clone(), self.h2.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let handshake = tokio::time::timeout(shared.config.header_read_timeout, acceptor.accept(tcp))
                .await
                .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out")));
            let stream = match handshake {
                Ok(stream) => stream,
                Err(e) => {
                    shared.metrics.handshake_failed();
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            shared.metrics.handshake_done();
            let is_h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
            let io = TokioIo::new(stream);
            let service = hyper::service::service_fn(move |req| handler::handle(shared.clone(), req));
            let result = if is_h2 {
                watcher.watch(h2.serve_connection(io, service).into_owned()).await
            } else {
                watcher.watch(h1.serve_connection(io, service).into_owned()).await
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

/// Runs the task that `start` makes, forever: when it ends or panics, the failure is logged and counted with
/// `on_failure`, and a new one starts after `backoff`. Background tasks (certificate and template reload) must
/// not die silently.
pub(crate) async fn supervise<T>(name: &'static str, backoff: Duration, on_failure: impl Fn(), start: impl Fn() -> T)
where
    T: Future<Output = ()> + Send + 'static,
{
    loop {
        let reason = match tokio::spawn(start()).await {
            Ok(()) => "it ended".to_owned(),
            Err(e) if e.is_panic() => format!("it panicked: {}", panic_message(e.into_panic())),
            Err(e) => format!("it stopped: {e}"),
        };
        on_failure();
        tracing::error!(task = name, reason, ?backoff, "background task stopped; restarting it");
        tokio::time::sleep(backoff).await;
    }
}

/// The message of a panic payload.
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[tokio::test]
    async fn a_supervised_task_that_panics_or_ends_is_restarted_and_counted() {
        let starts = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(AtomicUsize::new(0));
        let (s, f) = (starts.clone(), failures.clone());
        let supervisor = tokio::spawn(supervise(
            "test",
            Duration::from_millis(1),
            move || {
                f.fetch_add(1, Ordering::SeqCst);
            },
            move || {
                let n = s.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n {
                        0 => panic!("first run panics"),
                        1 => {} // second run ends
                        _ => std::future::pending().await,
                    }
                }
            },
        ));
        for _ in 0..200 {
            if starts.load(Ordering::SeqCst) >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(starts.load(Ordering::SeqCst), 3, "restarted after the panic and after the end");
        assert_eq!(failures.load(Ordering::SeqCst), 2);
        supervisor.abort();
    }
}
