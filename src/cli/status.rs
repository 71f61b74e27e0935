//! `sidecar-injector status`: which running pods carry the sidecar their namespace's templates inject today, read
//! through the caller's kubeconfig; `--restart` rolls the workloads that do not. The judging is the library's
//! (`crate::status`); this is the command line around it and the small runtime its API calls run on.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{CliError, TemplateArgs};
use crate::status::report::{Report, Surveyed};
use crate::status::restart::{self, DEFAULT_MAX_RESTARTS};
use crate::status::{self, Cluster, ClusterError, Revision, Scope};
use sidecar_injector_core::settings::Keys;

/// What `status` says on `--help` after the flags: the classes, the opt-in labels, the exit codes.
pub const STATUS_HELP: &str = "\
Each pod of the namespaces looked at is judged by the templates of its namespace's revision, exactly as the \
validating webhook would judge it, and counted as one of: current (it has everything the template injects, \
stamped by the current version); stale (stamped by another version: the version it runs and the current one are \
shown); missing (no sidecar, though it should have one: created while the webhook was down or before the \
namespace opted in); incomplete (the current stamp, but part of the injection is gone); other-revision (stamped \
by another revision than its namespace's); skipped (not expected to have a sidecar: opted out, a Job's pod the \
template skips, host network, finished, a namespace not opted in...).

A namespace is judged by the templates of the revision its labels select, as the webhook configurations do: \
<prefix>rev=REVISION selects that revision; otherwise <prefix>inject=enabled selects the default revision (the \
first --template-dir or --configmap). kube-system, kube-public, kube-node-lease and sidecar-injector are never \
injected. Without -n or -A, only namespaces with either label are looked at.

--restart rolls the Deployments, StatefulSets and DaemonSets with drifting pods, as `kubectl rollout restart` \
does (the pod template annotation kubectl.kubernetes.io/restartedAt); bare pods, Jobs, CronJobs and other \
controllers are listed to be recreated by hand.

Exit codes: 0 no drift (with --restart: every drifting workload was restarted, or with --dry-run would be); 1 \
drift (with --restart: drift left behind, not restartable, over --max-restarts, or a restart refused); 2 bad \
usage, no usable kubeconfig, an API server that cannot be reached or refuses to list, unusable templates.";

/// Arguments of `status`.
#[derive(Debug, Args)]
#[command(after_help = STATUS_HELP)]
pub struct StatusArgs {
    /// Only these namespaces, opted in or not (repeatable, or comma-separated). Default: every opted-in one.
    #[arg(
        short = 'n',
        long = "namespace",
        value_name = "NS",
        value_delimiter = ',',
        conflicts_with = "all_namespaces"
    )]
    pub namespaces: Vec<String>,

    /// Every namespace, opted in or not (the pods of those not opted in are counted as skipped).
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Output format: a table for people, or JSON for scripts.
    #[arg(short = 'o', long, value_enum, default_value_t = StatusOutput::Table)]
    pub output: StatusOutput,

    /// Read a revision's templates from this ConfigMap through the API server, as `serve` reads it mounted
    /// (NAME.yaml keys, an optional values.yaml), instead of from a directory. Repeat it as REVISION=NS/NAME for
    /// several revisions; the first is the default revision.
    #[arg(long, value_name = "[REVISION=]NS/NAME", value_delimiter = ',', conflicts_with_all = ["template", "template_dir"])]
    pub configmap: Vec<RevisionConfigMap>,

    /// Roll the Deployments, StatefulSets and DaemonSets whose pods drift (`kubectl rollout restart`).
    #[arg(long)]
    pub restart: bool,

    /// With --restart: say what would be restarted, and change nothing.
    #[arg(long, requires = "restart")]
    pub dry_run: bool,

    /// With --restart: roll at most this many workloads in one run; the rest are left for the next run.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_RESTARTS, requires = "restart",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_restarts: u32,

    /// The kubeconfig file [default: KUBECONFIG, then ~/.kube/config, then the pod's service account].
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use [default: its current context].
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,

    /// Which templates: those the injector serves.
    #[command(flatten)]
    pub template: TemplateArgs,
}

/// `table` or `json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    /// One line per workload, drifting pods under it, totals.
    Table,
    /// The whole report as one JSON object.
    Json,
}

/// One revision's templates in a ConfigMap: `REVISION=NS/NAME`, or `NS/NAME` for the revision `default`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionConfigMap {
    /// The revision's name.
    pub revision: String,
    /// The ConfigMap's namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
}

impl std::str::FromStr for RevisionConfigMap {
    type Err = super::RevisionArgError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // `REVISION=NS/NAME` is parsed one way: the revision and its checks are the `--template-dir` flag's.
        let (revision, value) = super::split_revision(text, "ConfigMap")?;
        let Some((namespace, name)) = value.split_once('/').filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        else {
            return Err(super::RevisionArgError::NotNamespaced { value: value.to_owned() });
        };
        Ok(RevisionConfigMap { revision, namespace: namespace.to_owned(), name: name.to_owned() })
    }
}

/// Runs `status`.
pub fn run(args: &StatusArgs) -> Result<(), CliError> {
    // Templates on disk are read before anything is asked of the API server: a typo fails fast.
    let local = if args.configmap.is_empty() { Some(local_revisions(&args.template)?) } else { None };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Config(format!("cannot start the runtime for the API calls: {e}")))?;
    let (report, restarted) = runtime.block_on(survey(args, local))?;
    let status = restart::Status { report: &report, restart: restarted.as_ref() };
    let text = match args.output {
        StatusOutput::Table => status.table(),
        StatusOutput::Json => status.json() + "\n",
    };
    super::stdout(text)?;
    if report.namespaces.is_empty() && args.namespaces.is_empty() && !args.all_namespaces {
        let keys = Keys::new(&args.template.served.annotation_prefix);
        super::stderr(format_args!(
            "sidecar-injector: no namespace is opted in (labelled {}={} or {}=REVISION); -n NS or -A looks at others\n",
            keys.inject,
            sidecar_injector_core::decision::NAMESPACE_ENABLED,
            keys.rev
        ));
    }
    if !status.failed() {
        return Ok(());
    }
    let counts = report.summary.counts;
    Err(CliError::Refused(match status.restart {
        None => format!("drift: {} pod(s) do not run the current sidecar", counts.drift()),
        Some(_) => "drift is left that this run did not restart".to_owned(),
    }))
}

/// The revisions of `--template-dir` (or `--template`, or the built-in template, as revision `default`).
fn local_revisions(template: &TemplateArgs) -> Result<Vec<Revision>, CliError> {
    let dirs = template.revisions()?;
    if dirs.is_empty() {
        let source = match &template.template {
            Some(file) => file.display().to_string(),
            None => "built-in template".to_owned(),
        };
        let engine = template.engine(None).map_err(|e| CliError::templates(e, false))?;
        return Ok(vec![Revision { name: engine.settings().revision.clone(), source, engine }]);
    }
    dirs.iter()
        .map(|dir| {
            let engine = template.revision_engine(dir, None).map_err(|e| CliError::templates(e, false))?;
            Ok(Revision { name: dir.revision.clone(), source: dir.dir.display().to_string(), engine })
        })
        .collect()
}

/// Everything that needs the API server: the ConfigMaps' templates, the namespaces and pods, the owners, the
/// restarts; the report.
async fn survey(
    args: &StatusArgs,
    local: Option<Vec<Revision>>,
) -> Result<(Report, Option<restart::Outcome>), CliError> {
    let keys = Keys::new(&args.template.served.annotation_prefix);
    let mut cluster = Cluster::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await.map_err(config)?;
    let revisions = match local {
        Some(revisions) => revisions,
        None => configmap_revisions(&cluster, args).await?,
    };
    let scope = match (&args.namespaces[..], args.all_namespaces) {
        ([], false) => Scope::OptedIn,
        ([], true) => Scope::All,
        (names, _) => Scope::Named(names.to_vec()),
    };
    let mut surveyed = Vec::new();
    for (namespace, enrollment) in cluster.namespaces(&scope, &keys, &revisions).await.map_err(config)? {
        let mut pods = Vec::new();
        for pod in cluster.pods(&namespace).await.map_err(config)? {
            let workload = cluster.workload(&namespace, &pod).await.map_err(config)?;
            let name = pod.metadata.name.clone().unwrap_or_default();
            // A Pod from the API server is JSON with string keys: it serialises.
            let json = serde_json::to_value(&pod).expect("a Pod serialises");
            let class = status::classify(&json, &namespace, &enrollment, &revisions, &keys)
                .map_err(|e| CliError::Config(format!("pod {namespace}/{name} cannot be judged: {e}")))?;
            pods.push((workload, name, class));
        }
        surveyed.push(Surveyed { namespace, enrollment, pods });
    }
    let report = Report::new(&revisions, surveyed);
    let restarted = if args.restart { Some(restart(&cluster, &report, args).await) } else { None };
    Ok((report, restarted))
}

/// The revisions of `--configmap`, read through the API server and compiled as `serve` compiles a directory.
async fn configmap_revisions(cluster: &Cluster, args: &StatusArgs) -> Result<Vec<Revision>, CliError> {
    let mut revisions: Vec<Revision> = Vec::new();
    for configmap in &args.configmap {
        if revisions.iter().any(|r| r.name == configmap.revision) {
            return Err(CliError::Config(format!("revision {:?} is given twice (--configmap)", configmap.revision)));
        }
        let sources = cluster.configmap_sources(&configmap.namespace, &configmap.name).await.map_err(config)?;
        let source = sources.origin.clone();
        let settings = args.template.settings_for(&configmap.revision, None);
        let set =
            sidecar_injector_core::TemplateSet::compile(sources, &args.template.served.default_template, &settings)
                .map_err(|e| CliError::templates(e, false))?;
        let engine = sidecar_injector_core::Engine::new(set, &settings);
        revisions.push(Revision { name: configmap.revision.clone(), source, engine });
    }
    Ok(revisions)
}

/// Plans and carries out `--restart` (or, `--dry-run`, only plans).
async fn restart(cluster: &Cluster, report: &Report, args: &StatusArgs) -> restart::Outcome {
    let max_restarts = args.max_restarts as usize;
    let plan = restart::plan(report, max_restarts);
    let restarted_at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let mut outcome = restart::Outcome {
        dry_run: args.dry_run,
        restarted_at,
        max_restarts,
        restarted: Vec::new(),
        failed: Vec::new(),
        deferred: plan.deferred,
        not_restartable: plan.not_restartable,
    };
    if args.dry_run {
        outcome.restarted = plan.restart;
        return outcome;
    }
    let patch = restart::patch(&outcome.restarted_at);
    for target in plan.restart {
        match cluster.restart(&target, &patch).await {
            Ok(()) => outcome.restarted.push(target),
            Err(e) => outcome.failed.push(restart::Failed { target, reason: status::chain(&e) }),
        }
    }
    outcome
}

/// The API server could not be asked what `status` needs: exit code 2, with every cause.
fn config(error: ClusterError) -> CliError {
    CliError::Config(status::chain(&error))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<StatusArgs, clap::Error> {
        let cli = Cli::try_parse_from(["sidecar-injector", "status"].iter().chain(args))?;
        match cli.command {
            Command::Status(args) => Ok(*args),
            other => panic!("not status: {other:?}"),
        }
    }

    #[test]
    fn defaults_and_flags() {
        let args = parse(&[]).unwrap();
        assert_eq!((args.namespaces.len(), args.all_namespaces, args.output), (0, false, StatusOutput::Table));
        assert_eq!((args.restart, args.dry_run, args.max_restarts), (false, false, DEFAULT_MAX_RESTARTS));
        let args =
            parse(&["-n", "a,b", "-n", "c", "-o", "json", "--restart", "--dry-run", "--max-restarts", "2"]).unwrap();
        assert_eq!(args.namespaces, ["a", "b", "c"]);
        assert_eq!((args.output, args.restart, args.dry_run, args.max_restarts), (StatusOutput::Json, true, true, 2));
        let args = parse(&["--kubeconfig", "k", "--context", "c", "-A", "--template-dir", "canary=d"]).unwrap();
        assert_eq!(
            (args.kubeconfig.unwrap(), args.context.unwrap(), args.all_namespaces),
            ("k".into(), "c".into(), true)
        );
        assert_eq!(args.template.template_dir[0].revision, "canary");
    }

    #[test]
    fn configmaps_name_a_revision_like_template_dirs() {
        let args = parse(&["--configmap", "sidecar-injector/templates", "--configmap", "canary=ns/canary"]).unwrap();
        let named: Vec<(&str, &str, &str)> =
            args.configmap.iter().map(|c| (c.revision.as_str(), c.namespace.as_str(), c.name.as_str())).collect();
        assert_eq!(named, [("default", "sidecar-injector", "templates"), ("canary", "ns", "canary")]);
        for bad in ["templates", "ns/", "/name", "Canary=ns/name", "canary="] {
            assert!(bad.parse::<RevisionConfigMap>().is_err(), "{bad}");
        }
    }

    #[test]
    fn usage_errors() {
        for args in [
            &["--dry-run"][..],
            &["--max-restarts", "3"],
            &["--restart", "--max-restarts", "0"],
            &["-n", "a", "-A"],
            &["--configmap", "ns/name", "--template-dir", "d"],
            &["--configmap", "ns/name", "--template", "t.yaml"],
            &["-o", "yaml"],
        ] {
            let error = parse(args).unwrap_err();
            assert_eq!(error.exit_code(), 2, "{args:?}: {error}");
        }
    }
}
