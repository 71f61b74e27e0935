//! `sidecar-injector serve`: the webhook server.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::server::events::Publisher;
use crate::server::limits::TEMPLATE_DEBOUNCE;
use crate::server::reload::TemplateWatch;
use crate::server::serving::Served;
use crate::server::source::TemplateSource;
use crate::server::{EventsMode, ServeConfig, Server, TlsSource};
use arc_swap::ArcSwap;
use clap::{Args, ValueEnum};

use super::{CliError, PolicyArgs, TemplateArgs};

/// Arguments of `serve`: the server's own flags (declared once, on [`ServeConfig`]) and those the CLI turns into
/// its certificate source, template watches, runtime and logging. Every flag also reads `SIDECAR_INJECTOR_<FLAG>`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The server's flags.
    #[command(flatten)]
    pub server: ServeConfig,

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

    /// `[REVISION=]NAME` (repeatable): the ConfigMap, in this pod's namespace, that the revision's --template-dir
    /// is mounted from. A pod naming a template the directory lacks makes the server read it through the API
    /// server (a minute before the kubelet updates the volume, after an edit that added it). Needs the in-cluster
    /// service account and `get` on that ConfigMap (the manifests grant it).
    #[arg(long, value_name = "[REVISION=]NAME", env = "SIDECAR_INJECTOR_TEMPLATE_CONFIGMAP", value_delimiter = ',')]
    pub template_configmap: Vec<RevisionConfigMap>,

    /// Publish the Events of `--events auto` through this kubeconfig's current context rather than the in-cluster
    /// service account: for a server run outside the cluster it serves.
    #[arg(long, value_name = "FILE", env = "SIDECAR_INJECTOR_EVENTS_KUBECONFIG")]
    pub events_kubeconfig: Option<PathBuf>,

    /// With --template-dir: how often the directory is read even without a change event (events can be missed).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_TEMPLATE_POLL_INTERVAL")]
    pub template_poll_interval: Duration,

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
        let tls = match (&self.tls_cert, &self.tls_key, &self.dev_ca_file) {
            (Some(cert), Some(key), _) => TlsSource::Files { cert: cert.clone(), key: key.clone() },
            (_, _, Some(ca_out)) => TlsSource::SelfSigned { ca_out: ca_out.clone() },
            _ => TlsSource::development(),
        };
        ServeConfig {
            tls,
            template_watches: (self.template.template_dir.iter())
                .map(|revision| TemplateWatch {
                    dir: revision.dir.clone(),
                    default_template: self.template.served.default_template.clone(),
                    settings: self.template.settings_for(&revision.revision, Some(&self.policies)),
                    poll_interval: self.template_poll_interval,
                    debounce: TEMPLATE_DEBOUNCE,
                    events: true,
                    source: None,
                })
                .collect(),
            ..self.server.clone()
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

impl ServeArgs {
    /// Who publishes the Events of `--events auto`: the --events-kubeconfig's context, or else the in-cluster
    /// service account; outside a cluster without one, nobody (said once in the log). An error for a kubeconfig
    /// that cannot be read.
    async fn attach_events(&self, config: &mut ServeConfig) -> Result<(), CliError> {
        if config.events == EventsMode::Off {
            return Ok(());
        }
        let credentials = match &self.events_kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| CliError::Config(format!("--events-kubeconfig {}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                    .await
                    .map_err(|e| CliError::Config(format!("--events-kubeconfig {}: {e}", path.display())))?
            }
            None => match kube::Config::incluster() {
                Ok(credentials) => credentials,
                Err(e) => {
                    tracing::info!(
                        "Kubernetes Events are off: not running in a cluster ({e}); --events-kubeconfig publishes them \
                         from outside one"
                    );
                    return Ok(());
                }
            },
        };
        let client = kube::Client::try_from(credentials)
            .map_err(|e| CliError::Config(format!("--events: cannot make an API client: {e}")))?;
        // The pod's name (the manifests set POD_NAME from the downward API) tells the replicas' Events apart.
        config.event_publisher = Some(Publisher { client, instance: std::env::var("POD_NAME").ok() });
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
    // Served as the server serves every set: combinations assembled off its async workers.
    let engines: Vec<_> = engines.into_iter().map(|engine| engine.with_serving(Arc::new(Served::default()))).collect();
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
        runtime.block_on(args.attach_events(&mut config))?;
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
        assert_eq!(watch.poll_interval, Duration::from_secs(10));
        assert_eq!(watch.debounce, TEMPLATE_DEBOUNCE);
        assert_eq!(config.shutdown_delay, Duration::from_secs(90));
        assert_eq!(config.request_timeout, Duration::from_millis(250));
        assert!(
            Cli::try_parse_from(["sidecar-injector", "serve", "--shutdown-delay", "2"]).is_err(),
            "a unit is needed"
        );
    }

    /// The server's flags are declared once, on `ServeConfig`: its `Default` reads the same declarations without
    /// the environment, so a variable set where the library runs cannot change what "default" means.
    #[test]
    fn the_default_config_is_serve_without_flags_and_ignores_the_environment() {
        let config = parse(&["--listen", "127.0.0.1:1", "--max-connections", "3"]).config();
        assert_eq!((config.listen.port(), config.max_connections), (1, 3));
        let default = ServeConfig::default();
        let (flags, defaults) = (format!("{:?}", parse(&[]).config()), format!("{default:?}"));
        assert_eq!(flags, defaults);
        assert_eq!(default.max_inflight_body_bytes, 32 * 1024 * 1024);
        assert_eq!(default.idle_timeout, Duration::from_secs(120));
    }
}
