//! The HTTPS webhook server: TLS (rustls, certificates reloaded when their files change), HTTP/1.1 or HTTP/2 by
//! ALPN (hyper), the webhook handler, a plain-HTTP admin listener (metrics, health), limits and graceful shutdown.
//!
//! Layers, outermost first: [`Server::run`] accepts connections (bounded by a semaphore, so excess connections
//! wait in the kernel's backlog), `tls` terminates TLS, `conn` bounds each connection's life (deadlines, idle
//! timeout, shutdown), hyper speaks HTTP, `handler` turns one request into one engine call (its body within the
//! in-flight memory `budget`), `admin` serves `/metrics`, `/healthz` and `/readyz`.

mod admin;
mod budget;
mod conn;
pub mod events;
mod handler;
pub mod limits;
pub mod refresh;
pub mod reload;
pub mod serving;
pub mod source;
mod tags;
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
use tokio::net::TcpListener;
use tokio::sync::{AcquireError, Semaphore, watch};

use limits::*;
use sidecar_injector_core::Engine;
pub use tls::TlsSource;

/// How long a background task (certificate or template reload) that ended or panicked waits before it is started
/// again: soon enough that a reload is hardly delayed, slow enough that a task failing at once does not spin.
pub(crate) const SUPERVISE_BACKOFF: Duration = Duration::from_secs(1);

/// After a failed `accept` (out of file descriptors or memory, mostly), wait this long before the next: the cause
/// lasts a while, and accepting again at once would spin a core and flood the log. Both listeners use it.
pub(crate) const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// HTTP/2 streams a client may open and reset before the server has accepted them, past which the connection is
/// closed: the "rapid reset" attack (CVE-2023-44487) is bounded by it. h2's own default, written here so that a
/// dependency upgrade cannot loosen it unnoticed; no honest client comes near it.
const H2_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;

/// HTTP/2 PING interval on idle connections: finds a peer that vanished without closing (a node gone) well
/// before the kernel's TCP keep-alive would, while costing nothing measurable.
const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long an HTTP/2 PING may go unanswered before the connection is closed: hyper's default, written here.
const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Everything the server needs, explicit. Each field that is a flag of `serve` is declared here once: its doc
/// comment is both this documentation and `--help`'s line, its attribute the flag's default and its environment
/// variable (`SIDECAR_INJECTOR_<FLAG>`); the CLI flattens this into its arguments, and [`Default`] is `serve` with
/// no flags (the same declarations, read with no environment). Durations are written as humantime parses and
/// prints them (`10s`, `1m30s`, `250ms`).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeConfig {
    /// Address of the HTTPS webhook listener.
    #[arg(long, default_value = "0.0.0.0:8443", env = "SIDECAR_INJECTOR_LISTEN")]
    pub listen: SocketAddr,

    /// Address of the plain-HTTP listener for /metrics, /healthz and /readyz. In a pod, every interface is the
    /// pod's own network namespace: its IP (probes, Prometheus) and loopback (`kubectl port-forward`).
    #[arg(long, default_value = "0.0.0.0:9090", env = "SIDECAR_INJECTOR_METRICS_LISTEN")]
    pub metrics_listen: SocketAddr,

    /// The webhook's path (matched without the query string).
    #[arg(long, default_value = "/mutate", env = "SIDECAR_INJECTOR_PATH")]
    pub path: String,

    /// The validating webhook's path: refuses (or warns about) pods that lack part of their injection.
    #[arg(long, default_value = "/validate", env = "SIDECAR_INJECTOR_VALIDATE_PATH")]
    pub validate_path: String,

    /// The apply-time preview's path: admits workloads (Deployments, Jobs...) with warnings naming what would go
    /// wrong for their pods.
    #[arg(long, default_value = "/preview", env = "SIDECAR_INJECTOR_PREVIEW_PATH")]
    pub preview_path: String,

    /// Where the serving certificate comes from (the CLI's --tls-cert, --tls-key, --dev-ca-file).
    #[arg(skip = TlsSource::development())]
    pub tls: TlsSource,

    /// Require client certificates signed by this CA bundle (PEM).
    #[arg(long, value_name = "FILE", env = "SIDECAR_INJECTOR_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,

    /// Accept TLS 1.3 only (default: TLS 1.2 and 1.3).
    #[arg(long, env = "SIDECAR_INJECTOR_TLS13_ONLY")]
    pub tls13_only: bool,

    /// How often the certificate files are checked for a change.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_TLS_RELOAD_INTERVAL")]
    pub tls_reload_interval: Duration,

    /// Largest accepted request body, in bytes (4 MiB); larger ones get 413.
    #[arg(long, default_value = "4194304", env = "SIDECAR_INJECTOR_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,

    /// Time allowed from the accept for the TLS handshake and the first request (HTTP/2: preface, SETTINGS and
    /// its headers), and on HTTP/1.1 for each later request's headers from their first byte.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_HEADER_READ_TIMEOUT")]
    pub header_read_timeout: Duration,

    /// A keep-alive connection with no request in progress is closed after this long (HTTP/2 with a GOAWAY);
    /// keep it longer than the clients' own idle timeout (the API server's is 90s), so that the client closes
    /// first and never sends a request on a connection being closed.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_IDLE_TIMEOUT")]
    pub idle_timeout: Duration,

    /// A connection older than this ends after its next answer (HTTP/1.1 `Connection: close`, HTTP/2 a GOAWAY),
    /// never cutting a request, so that the API server's connections spread over replicas added later
    /// (kubernetes#75791; the manifests set it); 0s: never.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_MAX_CONNECTION_AGE")]
    pub max_connection_age: Duration,

    /// Request body bytes, and answer bytes until sent, held in memory at once over every connection (32 MiB); a
    /// body or answer that does not fit waits up to 1s for room, then gets 503 with Retry-After. At least twice
    /// --max-body-bytes (each body is held twice: the buffer parsed and a copy kept for a second review). With the
    /// shipped pod's memory limit, the arithmetic is in docs/operations.md.
    #[arg(long, default_value = "33554432", env = "SIDECAR_INJECTOR_MAX_INFLIGHT_BODY_BYTES")]
    pub max_inflight_body_bytes: usize,

    /// Deadline of one request; the API server's `?timeout=` lowers it.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_REQUEST_TIMEOUT")]
    pub request_timeout: Duration,

    /// Connections served at once; more wait in the listen backlog. At the limit, the oldest idle connection (or
    /// the one stalled longest) makes room for a new one.
    #[arg(long, default_value = "256", env = "SIDECAR_INJECTOR_MAX_CONNECTIONS")]
    pub max_connections: usize,

    /// Concurrent streams per HTTP/2 connection (the API server speaks HTTP/1.1 to webhooks).
    #[arg(long, default_value = "8", env = "SIDECAR_INJECTOR_H2_MAX_CONCURRENT_STREAMS")]
    pub h2_max_concurrent_streams: u32,

    /// A connection whose peer takes less than 16 KiB of its answers in this long (writes blocked, or HTTP/2
    /// answers waiting for a flow-control window) is closed.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_WRITE_TIMEOUT")]
    pub write_timeout: Duration,

    /// After SIGTERM, keep accepting this long (readiness already 503) while endpoints are removed.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_SHUTDOWN_DELAY")]
    pub shutdown_delay: Duration,

    /// After SIGTERM, exit within this long even if connections are still open (Kubernetes kills at 30 s).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: Duration,

    /// Reload each revision's templates from its directory when it changes (a revision without one keeps its
    /// templates); matched to the revisions by [`Settings::revision`](sidecar_injector_core::settings::Settings)
    /// (the CLI's --template-dir).
    #[arg(skip)]
    pub template_watches: Vec<reload::TemplateWatch>,

    /// Kubernetes Events about admissions: `auto` publishes them (a pod injected with its template and version,
    /// refused, or admitted without the sidecar for a reason its owner would not expect) on the pod's controller,
    /// through the in-cluster service account, when the server runs in a cluster; `off` never does.
    #[arg(long, value_enum, default_value_t = EventsMode::Auto, env = "SIDECAR_INJECTOR_EVENTS")]
    pub events: EventsMode,

    /// Who publishes the Events (made by the CLI from `--events`): none, no Events.
    #[arg(skip)]
    pub event_publisher: Option<events::Publisher>,
}

/// `--events`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EventsMode {
    /// Published when the server has cluster credentials (in a pod: its service account).
    Auto,
    /// Never published.
    Off,
}

impl Default for ServeConfig {
    /// `sidecar-injector serve` with no flags: the defaults its declarations give, whatever the environment.
    fn default() -> Self {
        use clap::{Args, FromArgMatches};
        let flags = ServeConfig::augment_args(clap::Command::new("serve")).mut_args(|flag| flag.env(None));
        // Cannot fail: every flag has a default its parser reads (`serve` with no flags parses them all).
        let matches = flags.try_get_matches_from(["serve"]).expect("serve's defaults parse");
        ServeConfig::from_arg_matches(&matches).expect("serve's defaults make a config")
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
    Metrics(#[source] metrics_exporter_prometheus::BuildError),
    /// The limits contradict each other.
    #[error("{0}")]
    Limits(String),
    /// The revisions cannot be served as given.
    #[error("{0}")]
    Revisions(String),
}

/// State shared by every connection.
pub(crate) struct Shared {
    /// The template sets served, one per revision; the first also at the bare paths.
    pub revisions: Box<[Revision]>,
    pub config: ServeConfig,
    pub metrics: telemetry::Metrics,
    /// Set when shutdown begins: `/readyz` answers 503 from then on.
    pub shutting_down: AtomicBool,
    /// The memory account of requests in progress: their bodies, then their answers until sent.
    pub body_budget: Arc<budget::BodyBudget>,
    /// The connections being served, to make room at the connection limit and in the memory account.
    pub open: Arc<OpenConnections>,
    /// The queue of Kubernetes Events to publish (`--events`), when they are.
    pub events: Option<events::Events>,
}

/// One revision: a template set served at `<path>/<name>` and `<validate-path>/<name>`, reloaded on its own.
pub(crate) struct Revision {
    pub name: String,
    /// The engine serving now; a reload swaps it whole.
    pub engine: Arc<ArcSwap<Engine>>,
    /// The template generation serving and the newest refused edit.
    pub templates: Arc<reload::ReloadState>,
    pub metrics: telemetry::RevisionMetrics,
    /// Reloads `engine` when its template directory changes (`--template-dir`).
    pub reloader: Option<reload::Reloader>,
    /// Reads the directory's ConfigMap through the API server for a pod naming a template `engine` lacks
    /// (`--template-configmap`).
    pub refresh: Option<Arc<refresh::Refresher>>,
    /// The revision tags it was called through.
    pub tags: tags::Tags,
}

/// A `200` with `body` as plain UTF-8 text: every answer of ours that is not a review (a refusal, a probe).
pub(crate) fn plain_text<B>(body: B) -> hyper::Response<B> {
    let mut answer = hyper::Response::new(body);
    let content_type = hyper::header::HeaderValue::from_static("text/plain; charset=utf-8");
    answer.headers_mut().insert(hyper::header::CONTENT_TYPE, content_type);
    answer
}

/// The three webhooks a server answers, for each revision: what a request's path names ([`Shared::route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// Inject (`--path`, `/mutate`).
    Mutate,
    /// Check that injection is complete (`--validate-path`, `/validate`).
    Validate,
    /// Warn about a workload whose pods would not be injected (`--preview-path`, `/preview`).
    Preview,
}

impl Shared {
    /// The revision a request's path names, which webhook, and the revision tag it came through:
    /// `<base>[/REVISION][/tag/TAG]`, the bare paths the first revision's. `None` for a path of no revision.
    pub(crate) fn route<'p>(&self, path: &'p str) -> Option<(&Revision, Endpoint, Option<&'p str>)> {
        let config = &self.config;
        for (base, endpoint) in [
            (&config.path, Endpoint::Mutate),
            (&config.validate_path, Endpoint::Validate),
            (&config.preview_path, Endpoint::Preview),
        ] {
            let Some(rest) = path.strip_prefix(base.as_str()) else { continue };
            let rest = if rest.is_empty() { None } else { Some(rest.strip_prefix('/')?) };
            let mut segments = rest.into_iter().flat_map(|rest| rest.split('/'));
            let (name, tag) = match [(); 4].map(|()| segments.next()) {
                [None, ..] => (None, None),
                [Some(name), None, ..] => (Some(name), None),
                [Some("tag"), Some(tag), None, _] => (None, Some(tag)),
                [Some(name), Some("tag"), Some(tag), None] => (Some(name), Some(tag)),
                _ => return None,
            };
            let revision = match name {
                None => &self.revisions[0],
                Some(name) => self.revisions.iter().find(|r| r.name == name)?,
            };
            return Some((revision, endpoint, tag));
        }
        None
    }
}

/// A bound, ready-to-run server.
pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
    admin: TcpListener,
    tls: tls::Tls,
}

impl Server {
    /// Loads the TLS material, installs the metrics recorder and binds both listeners. Each engine is a revision
    /// (named by its [`Settings::revision`](sidecar_injector_core::settings::Settings)), the first also served at the bare paths; each is
    /// shared so that a template reload can swap it while requests flow.
    pub async fn bind(config: ServeConfig, engines: Vec<Arc<ArcSwap<Engine>>>) -> Result<Server, ServeError> {
        if engines.is_empty() {
            return Err(ServeError::Revisions("no template set to serve".to_owned()));
        }
        let names: Vec<String> = engines.iter().map(|e| e.load().settings().revision.clone()).collect();
        if let Some(twice) = names.iter().enumerate().find_map(|(i, n)| names[..i].contains(n).then_some(n)) {
            return Err(ServeError::Revisions(format!("revision {twice:?} is served twice")));
        }
        if let Some(watch) = config.template_watches.iter().find(|w| !names.contains(&w.settings.revision)) {
            let revision = &watch.settings.revision;
            return Err(ServeError::Revisions(format!(
                "templates are watched for revision {revision:?}, which is not served"
            )));
        }
        let largest_buffer = budget::held_for(config.max_body_bytes);
        if config.max_inflight_body_bytes < largest_buffer {
            return Err(ServeError::Limits(format!(
                "--max-inflight-body-bytes ({}) must hold at least one body of --max-body-bytes ({}) twice (the \
                 buffer parsed and the copy kept for a second review) and the parser's padding ({}): at least \
                 {largest_buffer}",
                config.max_inflight_body_bytes,
                config.max_body_bytes,
                sidecar_injector_core::PARSE_PADDING
            )));
        }
        let metrics = telemetry::Metrics::new().map_err(ServeError::Metrics)?;
        let tls = tls::Tls::load(&config, metrics.clone())?;
        let listener =
            bind_webhook(config.listen).map_err(|source| ServeError::Bind { addr: config.listen, source })?;
        let admin = TcpListener::bind(config.metrics_listen)
            .await
            .map_err(|source| ServeError::Bind { addr: config.metrics_listen, source })?;
        let revisions = engines
            .into_iter()
            .zip(names)
            .map(|(engine, name)| {
                let revision_metrics = metrics.revision(&name);
                revision_metrics.template_start(engine.load().set().hash());
                revision_metrics
                    .template_names(engine.load().set().templates().map(sidecar_injector_core::Template::name));
                let templates = Arc::new(reload::ReloadState::new(&engine.load()));
                let watch = config.template_watches.iter().find(|w| w.settings.revision == name);
                let reloader = watch.map(|watch| reload::Reloader {
                    watch: watch.clone(),
                    engine: engine.clone(),
                    state: templates.clone(),
                    metrics: revision_metrics.clone(),
                    compile: reload::TemplateWatch::compile,
                });
                let refresh = reloader.as_ref().and_then(|reloader| {
                    let source = reloader.watch.source.clone()?;
                    Some(refresh::Refresher::new(source, reloader.clone()))
                });
                Revision {
                    name,
                    engine,
                    templates,
                    metrics: revision_metrics,
                    reloader,
                    refresh,
                    tags: Default::default(),
                }
            })
            .collect();
        let open = Arc::new(OpenConnections::default());
        let room = Arc::clone(&open);
        let body_budget = budget::BodyBudget::new(config.max_inflight_body_bytes, metrics.clone())
            .making_room(move || room.make_room_in_the_account());
        let (body_budget, shutting_down) = (Arc::new(body_budget), AtomicBool::new(false));
        let events = (config.event_publisher.clone())
            .map(|publisher| events::Events::start(publisher, metrics.clone(), events::QUEUE));
        let shared = Arc::new(Shared { revisions, config, metrics, shutting_down, body_budget, open, events });
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
    /// for `shutdown_delay` (every HTTP/1.1 answer closes its connection, every HTTP/2 connection gets a GOAWAY),
    /// then the listener closes, in-flight requests finish, idle connections close, and this returns within
    /// `shutdown_timeout` of the signal.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server { shared, listener, admin, tls } = self;
        let config = &shared.config;
        let admin_addr = admin.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let cert_watch = {
            let (tls, interval, metrics) = (tls.clone(), config.tls_reload_interval, shared.metrics.clone());
            tokio::spawn(supervise(
                "certificate reload",
                SUPERVISE_BACKOFF,
                move || metrics.cert_reload(false),
                move || tls.clone().watch(interval),
            ))
        };
        let template_watches: Vec<_> = (shared.revisions.iter())
            .filter_map(|revision| revision.reloader.clone())
            .map(|reloader| tokio::spawn(reloader.run()))
            .chain(shared.revisions.iter().filter_map(|r| r.refresh.clone()).map(|r| tokio::spawn(r.run())))
            .collect();
        let admin_task = tokio::spawn(admin::serve(admin, shared.clone()));
        let upkeep = tokio::spawn(telemetry::upkeep(shared.metrics.clone()));
        let error_log = tokio::spawn(telemetry::report_connection_errors(shared.metrics.clone()));

        let mut h1 = auto::Builder::new(TokioExecutor::new()).http1_only();
        // hyper's header read timeout is off: `conn` keeps the headers' deadline (hyper's also ran while a
        // connection was idle, closing keep-alive connections after the header timeout).
        h1.http1().timer(TokioTimer::new()).header_read_timeout(None).keep_alive(true).max_buf_size(H1_MAX_BUF_SIZE);
        let mut h2 = auto::Builder::new(TokioExecutor::new()).http2_only();
        h2.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(config.h2_max_concurrent_streams)
            .max_pending_accept_reset_streams(H2_MAX_PENDING_ACCEPT_RESET_STREAMS)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .max_send_buf_size(H2_MAX_SEND_BUF_SIZE)
            .max_header_list_size(H2_MAX_HEADER_LIST_SIZE)
            .keep_alive_interval(H2_KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);

        let permits = Arc::new(Semaphore::new(config.max_connections.max(1)));
        let (stage, _) = watch::channel(conn::Stage::Serving);
        let connections = Connections { shared: shared.clone(), acceptor: tls.acceptor(), h1, h2, stage };
        tracing::info!(
            listen = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            metrics = %admin_addr,
            path = %config.path,
            validate_path = %config.validate_path,
            preview_path = %config.preview_path,
            "serving"
        );

        let mut waiting = None;
        if connections.accept_until(&listener, &permits, &mut waiting, shutdown).await {
            shared.shutting_down.store(true, Ordering::SeqCst);
            connections.stage.send_replace(conn::Stage::Delay);
            tracing::info!(delay = ?config.shutdown_delay, "shutdown: readiness is now 503, still accepting");
            let deadline = tokio::time::Instant::now() + config.shutdown_timeout;
            // As before the signal: a connection is accepted once a permit is free, and then served. (Accepting it
            // and dropping it for want of a permit refused it although a permit might free up within the delay.)
            let delay = tokio::time::sleep(config.shutdown_delay);
            connections.accept_until(&listener, &permits, &mut waiting, delay).await;
            drop(listener);
            connections.stage.send_replace(conn::Stage::Drain);
            // A connection accepted at the limit and still waiting for a slot is served as every accepted one is.
            if let Some(last) = waiting {
                let permit = tokio::time::timeout_at(last.until, permits.clone().acquire_owned()).await.ok();
                connections.serve_waiting(last, permit);
            }
            tracing::info!("shutdown: listener closed, draining connections");
            // Each connection holds a receiver until it ends.
            match tokio::time::timeout_at(deadline, connections.stage.closed()).await {
                Ok(()) => tracing::info!("shutdown: every connection finished"),
                Err(_) => tracing::warn!("shutdown: deadline reached with connections still open"),
            }
        }
        cert_watch.abort();
        for task in template_watches {
            task.abort();
        }
        admin_task.abort();
        upkeep.abort();
        error_log.abort();
    }
}

/// The webhook listener, with the kernel buffers of its connections bounded ([`limits::SOCKET_BUFFER`]); as
/// `TcpListener::bind` otherwise (address reuse, a backlog of 1024).
fn bind_webhook(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.set_recv_buffer_size(limits::SOCKET_BUFFER)?;
    socket.set_send_buffer_size(limits::SOCKET_BUFFER)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// How long a connection must have made no progress before it may be cut to make room at the limit: far longer
/// than a real client takes for its TLS handshake and first request (milliseconds), or leaves an answer unread.
const STALLED_FOR_ROOM: Duration = Duration::from_secs(1);

/// While a connection waits for a slot, or a request for room in the memory account, how often room is looked for
/// again (a connection may have stalled since).
const ROOM_RETRY: Duration = Duration::from_millis(250);

/// Bytes read from a connection's socket at once: a full TLS record (16 KiB of data and its overhead).
const READ_AHEAD: usize = 16 * 1024 + 512;

/// What every connection is served with.
struct Connections {
    shared: Arc<Shared>,
    acceptor: tokio_rustls::TlsAcceptor,
    h1: auto::Builder<TokioExecutor>,
    h2: auto::Builder<TokioExecutor>,
    /// The server's stage, which every connection watches (holding a receiver until it ends).
    stage: watch::Sender<conn::Stage>,
}

/// A connection accepted with every slot taken, waiting for one until `until`.
struct Waiting {
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    until: tokio::time::Instant,
}

/// The connections being served (from the accept), each by its [`conn::Activity`]. Touched when a connection
/// starts and ends, at the connection limit, and by a request only when it must wait for room in the memory
/// account.
#[derive(Default)]
pub(crate) struct OpenConnections {
    next: std::sync::atomic::AtomicU64,
    all: std::sync::Mutex<std::collections::HashMap<u64, Arc<conn::Activity>>>,
}

impl OpenConnections {
    /// Adds `activity` until the returned guard is dropped.
    fn register(self: &Arc<Self>, activity: Arc<conn::Activity>) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.all.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, activity);
        Registered { open: self.clone(), id }
    }

    /// Makes room for a connection waiting at the limit: asks the connection idle the longest to close (gracefully),
    /// or, with none idle, cuts the one that has made no progress the longest (no first request yet, or answers its
    /// peer does not take). A client that opens connections and says nothing, or stops reading, so loses its slots
    /// to newcomers rather than keeping them out.
    fn make_room(&self) {
        let all = self.all.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let idle = all.values().filter_map(|a| Some((a.idle_since()?, a))).min_by_key(|(since, _)| *since);
        match idle {
            Some((_, activity)) => activity.evict(),
            None => cut_the_longest_stalled(all.values(), conn::Activity::stalled_since),
        }
    }

    /// Makes room in the memory account for a request waiting for it: cuts the connection whose answers have
    /// waited for their peer the longest. Its answers, and their share of the account, go with it. A peer that asks
    /// and does not read so cannot keep reviews out of the account.
    fn make_room_in_the_account(&self) {
        let all = self.all.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        cut_the_longest_stalled(all.values(), conn::Activity::answers_stalled_since);
    }
}

/// Cuts the connection of `connections` stalled the longest by `stalled_since`, if for [`STALLED_FOR_ROOM`] at least.
fn cut_the_longest_stalled<'a>(
    connections: impl Iterator<Item = &'a Arc<conn::Activity>>,
    stalled_since: impl Fn(&conn::Activity) -> Option<tokio::time::Instant>,
) {
    let Some(stalled_before) = tokio::time::Instant::now().checked_sub(STALLED_FOR_ROOM) else { return };
    let longest = connections
        .filter_map(|a| Some((stalled_since(a)?, a)))
        .filter(|(since, _)| *since <= stalled_before)
        .min_by_key(|(since, _)| *since);
    if let Some((_, activity)) = longest {
        activity.cut();
    }
}

/// A connection in [`OpenConnections`] until dropped.
struct Registered {
    open: Arc<OpenConnections>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.all.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.id);
    }
}

impl Connections {
    /// Accepts and serves connections until `stop` completes (then `true`; `false` if the permits were closed,
    /// which nothing does). A permit is taken before accepting, so excess connections wait in the kernel's
    /// backlog rather than being accepted and dropped. At the limit, a connection that arrives is accepted and the
    /// oldest idle keep-alive connection is asked to close to make room for it; it waits for a permit up to
    /// `--header-read-timeout` (in `waiting`, across a change of stage) and is closed if none frees (every slot busy
    /// with requests or first requests).
    async fn accept_until(
        &self,
        listener: &TcpListener,
        permits: &Arc<Semaphore>,
        waiting: &mut Option<Waiting>,
        stop: impl Future<Output = ()>,
    ) -> bool {
        let mut stop = std::pin::pin!(stop);
        loop {
            if let Some(first) = waiting.take() {
                let acquire = tokio::time::timeout_at(first.until, permits.clone().acquire_owned());
                let mut acquire = std::pin::pin!(acquire);
                let permit = loop {
                    tokio::select! {
                        permit = &mut acquire => break permit.ok(),
                        () = tokio::time::sleep(ROOM_RETRY) => self.shared.open.make_room(),
                        () = &mut stop => {
                            *waiting = Some(first);
                            return true;
                        }
                    }
                };
                self.serve_waiting(first, permit);
                continue;
            }
            let free = match permits.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(tokio::sync::TryAcquireError::Closed) => return false,
                Err(tokio::sync::TryAcquireError::NoPermits) => None,
            };
            let permit = match free {
                Some(permit) => permit,
                None => tokio::select! {
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return false,
                    },
                    (tcp, peer) = accept_next("webhook", || listener.accept()) => {
                        self.shared.open.make_room();
                        let until = tokio::time::Instant::now() + self.shared.config.header_read_timeout;
                        *waiting = Some(Waiting { tcp, peer, until });
                        continue;
                    }
                    () = &mut stop => return true,
                },
            };
            let (tcp, peer) = tokio::select! {
                accepted = accept_next("webhook", || listener.accept()) => accepted,
                () = &mut stop => return true,
            };
            self.spawn(tcp, peer, permit);
        }
    }

    /// Serves a connection that waited for a slot with the `permit` it got, or closes it if it got none in time.
    fn serve_waiting(&self, waiting: Waiting, permit: Option<Result<tokio::sync::OwnedSemaphorePermit, AcquireError>>) {
        match permit {
            Some(Ok(permit)) => self.spawn(waiting.tcp, waiting.peer, permit),
            // Closed: nothing closes the permits.
            Some(Err(_)) => {}
            None => {
                self.shared.metrics.connection_error(telemetry::ConnectionError::Timeout);
                let peer = waiting.peer;
                tracing::debug!(%peer, "every connection busy for the header read timeout; refused");
            }
        }
    }

    /// Serves one accepted connection on its own task, holding `permit` until it ends.
    fn spawn(&self, tcp: tokio::net::TcpStream, peer: SocketAddr, permit: tokio::sync::OwnedSemaphorePermit) {
        // Without TCP_NODELAY, small HTTP/2 frames were seen to wait 40 ms for Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
        // rustls reads at most 4 KiB per call: a 6 KiB review took two recvfrom calls. Reading ahead into a
        // buffer as large as a TLS record takes a whole request in one (the writes pass straight through).
        let tcp = tokio::io::BufReader::with_capacity(READ_AHEAD, tcp);
        let (shared, acceptor, stage) = (self.shared.clone(), self.acceptor.clone(), self.stage.subscribe());
        let open = self.shared.open.clone();
        let (h1, h2) = (self.h1.clone(), self.h2.clone());
        let first_request_by = tokio::time::Instant::now() + shared.config.header_read_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            // Registered from the accept: a connection that never finishes its handshake holds a slot too.
            let activity = conn::Activity::new(true);
            let registered = open.register(activity.clone());
            let handshake = tokio::select! {
                handshake = tokio::time::timeout_at(first_request_by, acceptor.accept(tcp)) => handshake,
                () = activity.cut_asked() => {
                    // Asked before its first request, so still stalled: cut.
                    let _ = conn::cut(&activity, &shared.metrics, peer);
                    return;
                }
            };
            let stream = match handshake {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    shared.metrics.handshake_failed();
                    shared.metrics.connection_error(telemetry::ConnectionError::TlsHandshake);
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    shared.metrics.handshake_failed();
                    shared.metrics.connection_error(telemetry::ConnectionError::Timeout);
                    tracing::debug!(%peer, "TLS handshake not within the header read timeout");
                    return;
                }
            };
            shared.metrics.handshake_done();
            let is_h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
            activity.set_h1(!is_h2);
            let (give_back, mut given_back) = tokio::sync::oneshot::channel();
            let io = TokioIo::new(conn::Watched::new(stream, activity.clone(), give_back));
            let service = {
                let (shared, activity) = (shared.clone(), activity.clone());
                hyper::service::service_fn(move |req| {
                    let request = activity.request_started();
                    handler::handle(shared.clone(), req, request)
                })
            };
            let builder = if is_h2 { &h2 } else { &h1 };
            let config = &shared.config;
            let timeouts = conn::Timeouts {
                idle: config.idle_timeout,
                header: config.header_read_timeout,
                write: config.write_timeout,
            };
            // HTTP/2 gets its GOAWAY from the driver at this age; HTTP/1.1 its `Connection: close` from the handler.
            let max_age = config.max_connection_age;
            let close_by = (is_h2 && !max_age.is_zero()).then(|| tokio::time::Instant::now() + max_age);
            let limits = conn::Limits { first_request_by, timeouts, h2: is_h2, close_by };
            // Held while the connection lingers, so that a shutdown waits for it too.
            let lingering = stage.clone();
            let connection = builder.serve_connection(io, service);
            let ended = conn::drive(connection, &activity, limits, stage, &shared.metrics, peer).await;
            drop(registered);
            // The transport comes back when hyper drops it, which it has with the connection.
            if let (conn::Ended::Finished, Ok(stream)) = (ended, given_back.try_recv()) {
                let bounds = conn::LingerBounds { bytes: LINGER_BYTES, time: LINGER_TIME };
                let drained = conn::linger(stream, bounds).await;
                tracing::trace!(%peer, drained, "closed after lingering");
            }
            drop(lingering);
        });
    }
}

/// The next connection `accept` (a listener's `accept`) gives; each error is logged and followed by a pause of
/// [`ACCEPT_ERROR_BACKOFF`] rather than an immediate retry. Cancel-safe when `accept` is, as `TcpListener`'s is.
pub(crate) async fn accept_next<T, F>(listener: &'static str, mut accept: impl FnMut() -> F) -> (T, SocketAddr)
where
    F: Future<Output = std::io::Result<(T, SocketAddr)>>,
{
    loop {
        match accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(listener, error = %e, backoff = ?ACCEPT_ERROR_BACKOFF, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
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
    async fn a_failed_accept_is_retried_after_the_backoff_not_at_once() {
        let calls = AtomicUsize::new(0);
        let started = std::time::Instant::now();
        let peer = SocketAddr::from(([127, 0, 0, 1], 1));
        let accepted = accept_next("test", || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0..3 => Err(std::io::Error::other("too many open files")),
                    _ => Ok((n, peer)),
                }
            }
        })
        .await;
        assert_eq!(accepted, (3, peer), "the fourth attempt succeeded");
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert!(started.elapsed() >= 3 * ACCEPT_ERROR_BACKOFF, "retried after {:?}", started.elapsed());
    }

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
