//! `sidecar-injector serve`: the webhook server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::server::defaults::*;
use crate::server::reload::TemplateWatch;
use crate::server::source::TemplateSource;
use crate::server::{ServeConfig, Server, TlsSource};
use arc_swap::ArcSwap;
use clap::{Args, ValueEnum};

use super::{CliError, PolicyArgs, TemplateArgs};

/// Arguments of `serve`. Every flag also reads `SIDECAR_INJECTOR_<FLAG>`. The defaults are those of
/// [`crate::server::defaults`], the same that [`ServeConfig::default`] has; durations are written as humantime
/// parses and prints them (`10s`, `1m30s`, `250ms`).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the HTTPS webhook listener.
    #[arg(long, default_value_t = DEFAULT_LISTEN, env = "SIDECAR_INJECTOR_LISTEN")]
    pub listen: SocketAddr,

    /// Address of the plain-HTTP listener for /metrics, /healthz and /readyz.
    #[arg(long, default_value_t = DEFAULT_METRICS_LISTEN, env = "SIDECAR_INJECTOR_METRICS_LISTEN")]
    pub metrics_listen: SocketAddr,

    /// The webhook's path.
    #[arg(long, default_value = DEFAULT_PATH, env = "SIDECAR_INJECTOR_PATH")]
    pub path: String,

    /// The validating webhook's path: refuses (or warns about) pods that lack part of their injection.
    #[arg(long, default_value = DEFAULT_VALIDATE_PATH, env = "SIDECAR_INJECTOR_VALIDATE_PATH")]
    pub validate_path: String,

    /// The apply-time preview's path: admits workloads (Deployments, Jobs...) with warnings naming what would go
    /// wrong for their pods.
    #[arg(long, default_value = DEFAULT_PREVIEW_PATH, env = "SIDECAR_INJECTOR_PREVIEW_PATH")]
    pub preview_path: String,

    /// Serving certificate chain (PEM), reloaded when it changes. Without it (and --tls-key), a development
    /// certificate for localhost is generated.
    #[arg(long, value_name = "FILE", requires = "tls_key", env = "SIDECAR_INJECTOR_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// Private key of the serving certificate (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert", env = "SIDECAR_INJECTOR_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// Where the generated development CA is written when no certificate is given
    /// [default: <temp dir>/sidecar-injector/dev-ca.pem].
    #[arg(long, value_name = "FILE", env = "SIDECAR_INJECTOR_DEV_CA_FILE")]
    pub dev_ca_file: Option<PathBuf>,

    /// Require client certificates signed by this CA bundle (PEM).
    #[arg(long, value_name = "FILE", env = "SIDECAR_INJECTOR_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,

    /// Accept TLS 1.3 only (default: TLS 1.2 and 1.3).
    #[arg(long, env = "SIDECAR_INJECTOR_TLS13_ONLY")]
    pub tls13_only: bool,

    /// How often the certificate files are checked for a change.
    #[arg(long, default_value_t = DEFAULT_TLS_RELOAD_INTERVAL.into(), env = "SIDECAR_INJECTOR_TLS_RELOAD_INTERVAL")]
    pub tls_reload_interval: humantime::Duration,

    /// Largest accepted request body, in bytes; larger ones get 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES, env = "SIDECAR_INJECTOR_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,

    /// Time allowed from the accept for the TLS handshake and the first request (HTTP/2: preface, SETTINGS and
    /// its headers), and on HTTP/1.1 for each later request's headers from their first byte.
    #[arg(long, default_value_t = DEFAULT_HEADER_READ_TIMEOUT.into(), env = "SIDECAR_INJECTOR_HEADER_READ_TIMEOUT")]
    pub header_read_timeout: humantime::Duration,

    /// A keep-alive connection with no request in progress is closed after this long (HTTP/2 with a GOAWAY);
    /// keep it longer than the clients' own idle timeout (the API server's is 90s).
    #[arg(long, default_value_t = DEFAULT_IDLE_TIMEOUT.into(), env = "SIDECAR_INJECTOR_IDLE_TIMEOUT")]
    pub idle_timeout: humantime::Duration,

    /// A connection older than this ends after its next answer (HTTP/1.1 `Connection: close`, HTTP/2 a GOAWAY),
    /// never cutting a request, so that the API server's connections spread over replicas added later; 0s: never.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTION_AGE.into(), env = "SIDECAR_INJECTOR_MAX_CONNECTION_AGE")]
    pub max_connection_age: humantime::Duration,

    /// Request body bytes, and answer bytes until sent, held in memory at once over every connection; a body or
    /// answer that does not fit waits up to 1s for room, then gets 503 with Retry-After. At least twice
    /// --max-body-bytes (each body is held twice: the buffer parsed and a copy kept for a second review).
    #[arg(long, default_value_t = DEFAULT_MAX_INFLIGHT_BODY_BYTES, env = "SIDECAR_INJECTOR_MAX_INFLIGHT_BODY_BYTES")]
    pub max_inflight_body_bytes: usize,

    /// Deadline of one request; the API server's `?timeout=` lowers it.
    #[arg(long, default_value_t = DEFAULT_REQUEST_TIMEOUT.into(), env = "SIDECAR_INJECTOR_REQUEST_TIMEOUT")]
    pub request_timeout: humantime::Duration,

    /// Connections served at once; more wait in the listen backlog.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS, env = "SIDECAR_INJECTOR_MAX_CONNECTIONS")]
    pub max_connections: usize,

    /// Concurrent streams per HTTP/2 connection.
    #[arg(long, default_value_t = DEFAULT_H2_MAX_CONCURRENT_STREAMS, env = "SIDECAR_INJECTOR_H2_MAX_CONCURRENT_STREAMS")]
    pub h2_max_concurrent_streams: u32,

    /// A connection whose peer takes less than 16 KiB of its answers in this long (writes blocked, or HTTP/2
    /// answers waiting for a flow-control window) is closed.
    #[arg(long, default_value_t = DEFAULT_WRITE_TIMEOUT.into(), env = "SIDECAR_INJECTOR_WRITE_TIMEOUT")]
    pub write_timeout: humantime::Duration,

    /// After SIGTERM, keep accepting this long (readiness already 503) while endpoints are removed.
    #[arg(long, default_value_t = DEFAULT_SHUTDOWN_DELAY.into(), env = "SIDECAR_INJECTOR_SHUTDOWN_DELAY")]
    pub shutdown_delay: humantime::Duration,

    /// After SIGTERM, exit within this long even if connections are still open (Kubernetes kills at 30 s).
    #[arg(long, default_value_t = DEFAULT_SHUTDOWN_TIMEOUT.into(), env = "SIDECAR_INJECTOR_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: humantime::Duration,

    /// `[REVISION=]NAME` (repeatable): the ConfigMap, in this pod's namespace, that the revision's --template-dir
    /// is mounted from. A pod naming a template the directory lacks makes the server read it through the API
    /// server (a minute before the kubelet updates the volume, after an edit that added it). Needs the in-cluster
    /// service account and `get` on that ConfigMap (the manifests grant it).
    #[arg(long, value_name = "[REVISION=]NAME", env = "SIDECAR_INJECTOR_TEMPLATE_CONFIGMAP", value_delimiter = ',')]
    pub template_configmap: Vec<RevisionConfigMap>,

    /// With --template-dir: how often the directory is read even without a change event (events can be missed).
    #[arg(long, default_value_t = DEFAULT_TEMPLATE_POLL_INTERVAL.into(), env = "SIDECAR_INJECTOR_TEMPLATE_POLL_INTERVAL")]
    pub template_poll_interval: humantime::Duration,

    /// Worker threads [default: the CPUs this process may use, from affinity and the cgroup CPU quota]. Set it
    /// in a container without a CPU limit, which would otherwise get one worker per node CPU.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..), env = "SIDECAR_INJECTOR_WORKERS")]
    pub workers: Option<u16>,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "SIDECAR_INJECTOR_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// Log filter (`info`, `debug`, `sidecar_injector=debug,warn`, ...).
    #[arg(long, default_value = "info", env = "SIDECAR_INJECTOR_LOG")]
    pub log: String,

    /// Which templates.
    #[command(flatten)]
    pub template: TemplateArgs,

    /// How to answer a pod that cannot be injected, or whose injection is incomplete.
    #[command(flatten)]
    pub policies: PolicyArgs,
}

/// How log lines look.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl ServeArgs {
    fn config(&self) -> ServeConfig {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => TlsSource::Files { cert: cert.clone(), key: key.clone() },
            _ => TlsSource::SelfSigned { ca_out: self.dev_ca_file.clone().unwrap_or_else(default_dev_ca_file) },
        };
        ServeConfig {
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            path: self.path.clone(),
            validate_path: self.validate_path.clone(),
            preview_path: self.preview_path.clone(),
            tls,
            client_ca: self.client_ca.clone(),
            tls13_only: self.tls13_only,
            tls_reload_interval: self.tls_reload_interval.into(),
            max_body_bytes: self.max_body_bytes,
            header_read_timeout: self.header_read_timeout.into(),
            idle_timeout: self.idle_timeout.into(),
            max_connection_age: self.max_connection_age.into(),
            max_inflight_body_bytes: self.max_inflight_body_bytes,
            request_timeout: self.request_timeout.into(),
            max_connections: self.max_connections,
            h2_max_concurrent_streams: self.h2_max_concurrent_streams,
            write_timeout: self.write_timeout.into(),
            shutdown_delay: self.shutdown_delay.into(),
            shutdown_timeout: self.shutdown_timeout.into(),
            template_watches: (self.template.template_dir.iter())
                .map(|revision| TemplateWatch {
                    dir: revision.dir.clone(),
                    default_template: self.template.served.default_template.clone(),
                    settings: self.template.settings_for(&revision.revision, Some(&self.policies)),
                    poll_interval: self.template_poll_interval.into(),
                    debounce: TEMPLATE_DEBOUNCE,
                    events: true,
                    source: None,
                })
                .collect(),
        }
    }
}

/// `--template-configmap [REVISION=]NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionConfigMap {
    /// The revision whose --template-dir the ConfigMap is mounted as.
    pub revision: String,
    /// The ConfigMap's name, in the pod's own namespace.
    pub name: String,
}

impl std::str::FromStr for RevisionConfigMap {
    type Err = super::RevisionArgError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (revision, name) = super::split_revision(text, "ConfigMap")?;
        if let Some(problem) = sidecar_injector_core::validation::dns1123_subdomain(name).into_iter().next() {
            return Err(super::RevisionArgError::ConfigMapName { name: name.to_owned(), problem });
        }
        Ok(RevisionConfigMap { revision, name: name.to_owned() })
    }
}

impl ServeArgs {
    /// Gives each revision named by --template-configmap its ConfigMap as a [`TemplateSource`], read with the
    /// in-cluster service account; an error if a revision has no --template-dir or the pod has no account.
    fn attach_configmaps(&self, config: &mut ServeConfig) -> Result<(), CliError> {
        let Some(first) = self.template_configmap.first() else { return Ok(()) };
        let mut watches = Vec::new();
        for (i, wanted) in self.template_configmap.iter().enumerate() {
            if self.template_configmap[..i].iter().any(|other| other.revision == wanted.revision) {
                let revision = &wanted.revision;
                return Err(CliError::Config(format!("revision {revision:?} is given twice (--template-configmap)")));
            }
            let Some(watch) = config.template_watches.iter().position(|w| w.settings.revision == wanted.revision)
            else {
                return Err(CliError::Config(format!(
                    "--template-configmap {}: revision {:?} has no --template-dir the ConfigMap could be mounted as",
                    wanted.name, wanted.revision
                )));
            };
            watches.push((watch, &wanted.name));
        }
        let incluster = kube::Config::incluster().map_err(|e| {
            CliError::Config(format!(
                "--template-configmap {}: no in-cluster service account to read it with ({e})",
                first.name
            ))
        })?;
        let namespace = incluster.default_namespace.clone();
        let client = kube::Client::try_from(incluster)
            .map_err(|e| CliError::Config(format!("--template-configmap: cannot make an API client: {e}")))?;
        for (watch, name) in watches {
            config.template_watches[watch].source = Some(TemplateSource::config_map(client.clone(), &namespace, name));
        }
        Ok(())
    }
}

/// Runs `serve` until SIGTERM or SIGINT.
pub fn run(args: &ServeArgs) -> Result<(), CliError> {
    init_logging(args)?;
    // One engine per revision (`--template-dir NAME=DIR`, repeated), or the one of --template or the built-in.
    let engines = match args.template.revisions()? {
        [] => vec![args.template.engine(Some(&args.policies))],
        revisions => {
            revisions.iter().map(|revision| args.template.revision_engine(revision, Some(&args.policies))).collect()
        }
    };
    let engines = engines.into_iter().collect::<Result<Vec<_>, _>>().map_err(|e| CliError::templates(e, false))?;
    // std reads the cgroup CPU quota, so a container limited to 2 CPUs gets 2 workers, not one per host core.
    let workers = match args.workers {
        Some(n) => usize::from(n),
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| CliError::Config(format!("cannot start the runtime: {e}")))?;
    let mut config = args.config();
    {
        // The API client starts a task of its own: it is made in the runtime.
        let _runtime = runtime.enter();
        args.attach_configmaps(&mut config)?;
    }
    let describe = |e: &sidecar_injector_core::Engine| {
        let left_out = e.set().unavailable_summary();
        let left_out = if left_out.is_empty() {
            left_out
        } else {
            format!("; left out for {}: {left_out}", e.settings().kubernetes_version)
        };
        let revision = &e.settings().revision;
        let from = args.template.source_of(revision);
        format!("{revision} (from {from}; set {}: {}{left_out})", e.set().hash(), e.set().names())
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        workers,
        revisions = %engines.iter().map(describe).collect::<Vec<_>>().join(", "),
        config = ?config,
        "starting"
    );
    runtime.block_on(async {
        let shutdown = shutdown_signal();
        let engines = engines.into_iter().map(|engine| Arc::new(ArcSwap::from_pointee(engine))).collect();
        let server = Server::bind(config, engines).await.map_err(|e| CliError::Config(e.to_string()))?;
        server.run(shutdown).await;
        Ok(())
    })
}

/// Crates that log a warning of their own for each misbehaving connection (h2 for a rapid-reset flood, rustls for
/// some handshake failures). A client, or a scanner, could fill the log with them; the server counts these errors
/// by kind and logs one summary line per interval instead, so their lines are shown from `error` up, unless the
/// filter names the crate (`--log info,h2=debug`).
const PER_CONNECTION_LOGGERS: [&str; 2] = ["h2", "rustls"];

/// `--log` with [`PER_CONNECTION_LOGGERS`] lowered to errors where it does not name them.
fn log_filter(filter: &str) -> String {
    let named = |target: &str| {
        filter.split(',').any(|directive| {
            let name = directive.split(['=', '[']).next().unwrap_or("").trim();
            name == target || name.starts_with(&format!("{target}::"))
        })
    };
    let mut out = filter.trim().to_owned();
    for target in PER_CONNECTION_LOGGERS.into_iter().filter(|t| !named(t)) {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(target);
        out.push_str("=error");
    }
    out
}

fn init_logging(args: &ServeArgs) -> Result<(), CliError> {
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter(&args.log))
        .map_err(|e| CliError::Config(format!("--log {:?}: {e}", args.log)))?;
    // Colours only for a person at a terminal, not in a container's log file.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

/// Completes at the first SIGTERM (Kubernetes stopping the pod) or SIGINT (Ctrl-C) from the moment it is called:
/// the handlers are installed here, not when the future is first polled, so that a signal arriving right after the
/// server says it is serving stops it gracefully rather than killing it. Called inside the runtime.
fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let streams = signal(SignalKind::terminate()).and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
        async move {
            match streams {
                Ok((mut term, mut interrupt)) => tokio::select! {
                    _ = interrupt.recv() => tracing::info!("SIGINT received"),
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM and SIGINT; only Ctrl-C stops the server");
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(flags: &[&str]) -> ServeArgs {
        let cli = Cli::try_parse_from(["sidecar-injector", "serve"].iter().chain(flags)).unwrap();
        match cli.command {
            Command::Serve(args) => *args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn serve_without_flags_has_the_engines_default_settings() {
        // The engine's defaults (`Settings::default`, what the library and the tests use) and clap's are one.
        let args = parse(&[]);
        assert_eq!(args.template.settings(Some(&args.policies)), sidecar_injector_core::settings::Settings::default());
    }

    #[test]
    fn serve_without_flags_is_the_default_config() {
        let default = ServeConfig::default();
        // Destructured without `..`, so that a new field cannot be left out of this comparison.
        let ServeConfig {
            listen,
            metrics_listen,
            path,
            validate_path,
            preview_path,
            tls,
            client_ca,
            tls13_only,
            tls_reload_interval,
            max_body_bytes,
            header_read_timeout,
            idle_timeout,
            max_connection_age,
            max_inflight_body_bytes,
            request_timeout,
            max_connections,
            h2_max_concurrent_streams,
            write_timeout,
            shutdown_delay,
            shutdown_timeout,
            template_watches,
        } = parse(&[]).config();
        assert_eq!(listen, default.listen, "--listen");
        assert_eq!(metrics_listen, default.metrics_listen, "--metrics-listen");
        assert_eq!(path, default.path, "--path");
        assert_eq!(validate_path, default.validate_path, "--validate-path");
        assert_eq!(preview_path, default.preview_path, "--preview-path");
        assert_eq!(tls, default.tls, "--tls-cert, --tls-key, --dev-ca-file");
        assert_eq!(client_ca, default.client_ca, "--client-ca");
        assert_eq!(tls13_only, default.tls13_only, "--tls13-only");
        assert_eq!(tls_reload_interval, default.tls_reload_interval, "--tls-reload-interval");
        assert_eq!(max_body_bytes, default.max_body_bytes, "--max-body-bytes");
        assert_eq!(header_read_timeout, default.header_read_timeout, "--header-read-timeout");
        assert_eq!(idle_timeout, default.idle_timeout, "--idle-timeout");
        assert_eq!(max_connection_age, default.max_connection_age, "--max-connection-age");
        assert_eq!(max_inflight_body_bytes, default.max_inflight_body_bytes, "--max-inflight-body-bytes");
        assert_eq!(request_timeout, default.request_timeout, "--request-timeout");
        assert_eq!(max_connections, default.max_connections, "--max-connections");
        assert_eq!(h2_max_concurrent_streams, default.h2_max_concurrent_streams, "--h2-max-concurrent-streams");
        assert_eq!(write_timeout, default.write_timeout, "--write-timeout");
        assert_eq!(shutdown_delay, default.shutdown_delay, "--shutdown-delay");
        assert_eq!(shutdown_timeout, default.shutdown_timeout, "--shutdown-timeout");
        assert!(template_watches.is_empty() && default.template_watches.is_empty(), "--template-dir");
    }

    /// Issue 38: the start log said `templates: []` (no directory watched) while the built-in template served.
    #[test]
    fn the_start_log_names_where_each_revisions_templates_come_from() {
        assert_eq!(parse(&[]).template.source_of("default"), "the built-in template (templates/default.yaml)");
        assert_eq!(parse(&["--template", "t.yaml"]).template.source_of("default"), "t.yaml");
        let dirs = parse(&["--template-dir", "/a", "--template-dir", "canary=/b"]);
        assert_eq!(dirs.template.source_of("default"), "/a (reloaded when it changes)");
        assert_eq!(dirs.template.source_of("canary"), "/b (reloaded when it changes)");
    }

    #[test]
    fn the_per_connection_loggers_are_lowered_unless_the_filter_names_them() {
        assert_eq!(log_filter("info"), "info,h2=error,rustls=error");
        assert_eq!(log_filter(""), "h2=error,rustls=error");
        assert_eq!(log_filter("debug,h2=debug"), "debug,h2=debug,rustls=error");
        assert_eq!(log_filter("rustls::server=trace,h2[x]=info"), "rustls::server=trace,h2[x]=info");
        assert_eq!(
            log_filter("sidecar_injector=debug,h2o=info"),
            "sidecar_injector=debug,h2o=info,h2=error,rustls=error"
        );
        for filter in ["info", "", "debug,h2=debug"] {
            tracing_subscriber::EnvFilter::try_new(log_filter(filter)).unwrap();
        }
    }

    #[test]
    fn the_template_watch_defaults_and_durations_parse_as_humantime_writes_them() {
        let args =
            parse(&["--template-dir", "/nonexistent", "--shutdown-delay", "1m30s", "--request-timeout", "250ms"]);
        let config = args.config();
        let [watch] = config.template_watches.as_slice() else { panic!("--template-dir watches the directory") };
        assert_eq!(watch.poll_interval, DEFAULT_TEMPLATE_POLL_INTERVAL);
        assert_eq!(watch.debounce, TEMPLATE_DEBOUNCE);
        assert_eq!(config.shutdown_delay, Duration::from_secs(90));
        assert_eq!(config.request_timeout, Duration::from_millis(250));
        assert!(
            Cli::try_parse_from(["sidecar-injector", "serve", "--shutdown-delay", "2"]).is_err(),
            "a unit is needed"
        );
    }
}
