//! `sidecar-injector status`: which running pods carry the sidecar their namespace's templates inject today, read
//! through the caller's kubeconfig; `--restart` rolls the workloads that do not. The judging is the library's
//! (`crate::status`); this is the command line around it and the small runtime its API calls run on.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{CliError, TemplateArgs};
use crate::status::report::{Report, Surveyed};
use crate::status::restart::{self, DEFAULT_MAX_RESTARTS};
use crate::status::upgrade;
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
<prefix>rev=REVISION selects that revision (<prefix>rev=TAG, a revision tag, the revision it points to: \
`sidecar-injector tag`); otherwise <prefix>inject=enabled selects the default revision (the first --template-dir \
or --configmap). kube-system, kube-public, kube-node-lease and sidecar-injector are never \
injected. Without -n or -A, only namespaces with either label are looked at.

--restart rolls the Deployments, StatefulSets and DaemonSets with drifting pods, as `kubectl rollout restart` \
does (the pod template annotation kubectl.kubernetes.io/restartedAt); bare pods, Jobs, CronJobs and other \
controllers are listed to be recreated by hand.

--upgrade patches, in place, the sidecar image of each stale pod that differs from what its template injects \
today only in that image (asked of the API server with a dry run of the pod as it was before its injection): the \
kubelet restarts the sidecar alone. Pods that differ in more are listed for a restart.

Exit codes: 0 no drift (with --restart: every drifting workload was restarted, or with --dry-run would be; with \
--upgrade: every upgradable pod upgraded and ready, none needing a restart); 1 drift (with --restart: drift left \
behind, not restartable, over --max-restarts, or a restart refused; with --upgrade: a failure, or a pod only a \
restart fixes); 2 bad \
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

    /// Upgrade in place the sidecars of stale pods that differ from what their template injects today only in
    /// the sidecar's image: the image is patched and the kubelet restarts that container alone, the app keeps
    /// running. Pods that differ in more are listed for a restart, never patched.
    #[arg(long, conflicts_with = "restart")]
    pub upgrade: bool,

    /// With --upgrade: only the pods this label selector selects (`app=web,tier!=batch`).
    #[arg(short = 'l', long, value_name = "SELECTOR", requires = "upgrade")]
    pub selector: Option<String>,

    /// With --upgrade: leave this many of the pods that could be upgraded at their version (the last by
    /// namespace and name), as a canary's partition does.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "upgrade")]
    pub partition: usize,

    /// With --upgrade: patch at most this many pods at once, and wait until their new sidecars are ready before
    /// the next ones.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "upgrade", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_unavailable: u32,

    /// With --upgrade: upgrade at most this many pods in this run, then stop (a pause: run again to go on).
    #[arg(long, value_name = "N", requires = "upgrade", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_upgrades: Option<u32>,

    /// With --upgrade: how long an upgraded pod's new sidecar has to be running and ready.
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = humantime::parse_duration, requires = "upgrade")]
    pub timeout: std::time::Duration,

    /// With --restart or --upgrade: say what would be done, and change nothing.
    #[arg(long)]
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
    if args.dry_run && !args.restart && !args.upgrade {
        return Err(CliError::Config("--dry-run needs --restart or --upgrade".to_owned()));
    }
    let (report, restarted, upgraded) = runtime.block_on(survey(args, local))?;
    let status = restart::Status { report: &report, restart: restarted.as_ref(), upgrade: upgraded.as_ref() };
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
    Err(CliError::Refused(match (status.restart, status.upgrade) {
        (Some(_), _) => "drift is left that this run did not restart".to_owned(),
        (_, Some(upgrade)) if upgrade.failed() => "an upgrade failed".to_owned(),
        (_, Some(_)) => "drift is left that only a restart fixes".to_owned(),
        (None, None) => format!("drift: {} pod(s) do not run the current sidecar", counts.drift()),
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
) -> Result<(Report, Option<restart::Outcome>, Option<upgrade::Outcome>), CliError> {
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
    let tags = revision_tags(&cluster).await?;
    let mut surveyed = Vec::new();
    for (namespace, enrollment) in cluster.namespaces(&scope, &keys, &revisions, &tags).await.map_err(config)? {
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
    let report = Report::new(&revisions, tags, surveyed);
    let restarted = if args.restart { Some(restart(&cluster, &report, args).await) } else { None };
    let upgraded = if args.upgrade { Some(upgrade(&cluster, &report, args, &keys).await?) } else { None };
    Ok((report, restarted, upgraded))
}

/// The cluster's revision tags, each with its revision; none, with a note, when the API server refuses the list (a
/// caller who may not list webhook configurations): the namespaces labelled with a tag are then of an unknown
/// revision. An API server that cannot be reached is an error, as for every other call.
async fn revision_tags(cluster: &Cluster) -> Result<std::collections::BTreeMap<String, String>, CliError> {
    match cluster.revision_tags().await {
        Ok(tags) => Ok(tags),
        Err(e @ ClusterError::Api { .. }) => {
            super::stderr(format_args!("sidecar-injector: revision tags not read: {}\n", status::chain(&e)));
            Ok(Default::default())
        }
        Err(e) => Err(config(e)),
    }
}

/// Carries out `--upgrade` (or, `--dry-run`, only decides): each stale pod compared with what the API server would
/// make of it today, the image-only ones patched a batch at a time, each batch ready before the next.
async fn upgrade(
    cluster: &Cluster,
    report: &Report,
    args: &StatusArgs,
    keys: &Keys,
) -> Result<upgrade::Outcome, CliError> {
    use upgrade::{PodResult, PodUpgrade};
    let mut stale: Vec<(String, String)> = Vec::new();
    for namespace in &report.namespaces {
        let selected = match &args.selector {
            Some(selector) => Some(cluster.pods_selected(&namespace.name, selector).await.map_err(config)?),
            None => None,
        };
        for pod in namespace.workloads.iter().flat_map(|w| &w.pods) {
            let chosen = selected.as_ref().is_none_or(|names| names.contains(&pod.name));
            if chosen && matches!(pod.class, status::Class::Stale { .. }) {
                stale.push((namespace.name.clone(), pod.name.clone()));
            }
        }
    }
    stale.sort();
    let mut outcome = upgrade::Outcome { dry_run: args.dry_run, pods: Vec::with_capacity(stale.len()) };
    let entry = |(namespace, name): &(String, String), result, images, reason| PodUpgrade {
        namespace: namespace.clone(),
        name: name.clone(),
        result,
        images,
        reason,
    };
    let mut eligible = Vec::new();
    for pod in &stale {
        let (namespace, name) = pod;
        let running = match cluster.pod_json(namespace, name).await {
            Ok(running) => running,
            Err(e) => {
                outcome.pods.push(entry(pod, PodResult::Failed, Vec::new(), Some(status::chain(&e))));
                continue;
            }
        };
        let Some(before) = upgrade::uninjected(&running, keys) else {
            outcome.pods.push(entry(
                pod,
                PodResult::Restart,
                Vec::new(),
                Some("its status annotation is not ours".into()),
            ));
            continue;
        };
        let decided = match cluster.dry_run_pod(namespace, &before).await {
            Ok(fresh) => upgrade::compare(&running, &fresh, keys),
            Err(e) => Err(format!("the API server refuses the pod as injected today: {}", status::chain(&e))),
        };
        match decided {
            Ok((images, stamp)) => eligible.push((pod.clone(), images, stamp, running)),
            Err(difference) => outcome.pods.push(entry(pod, PodResult::Restart, Vec::new(), Some(difference))),
        }
    }
    let kept = eligible.split_off(eligible.len() - args.partition.min(eligible.len()));
    let cap = args.max_upgrades.map_or(usize::MAX, |n| n as usize);
    let deferred = if eligible.len() > cap { eligible.split_off(cap) } else { Vec::new() };
    for (pod, images, ..) in kept {
        outcome.pods.push(entry(&pod, PodResult::Left, images, Some("kept at its version by --partition".into())));
    }
    for (pod, images, ..) in deferred {
        outcome.pods.push(entry(&pod, PodResult::Left, images, Some("beyond --max-upgrades: the next run's".into())));
    }
    if args.dry_run {
        outcome
            .pods
            .extend(eligible.into_iter().map(|(pod, images, ..)| entry(&pod, PodResult::Planned, images, None)));
        return Ok(outcome);
    }
    let mut batches = eligible.chunks(args.max_unavailable as usize);
    for batch in batches.by_ref() {
        let mut patched = Vec::new();
        for (pod, images, stamp, running) in batch {
            match cluster.patch_pod(&pod.0, &pod.1, &upgrade::patch(images, stamp, keys)).await {
                Ok(()) => patched.push((pod, images, running)),
                Err(e) => outcome.pods.push(entry(pod, PodResult::Failed, images.clone(), Some(status::chain(&e)))),
            }
        }
        let deadline = std::time::Instant::now() + args.timeout;
        let mut waiting = patched;
        while !waiting.is_empty() {
            let mut still = Vec::new();
            for (pod, images, running) in waiting {
                let now = cluster.pod_json(&pod.0, &pod.1).await;
                if now.is_ok_and(|now| upgrade::upgraded(&now, running, images)) {
                    outcome.pods.push(entry(pod, PodResult::Ready, images.clone(), None));
                } else {
                    still.push((pod, images, running));
                }
            }
            waiting = still;
            if std::time::Instant::now() > deadline {
                let reason = format!(
                    "its new sidecar was not running and ready within {}",
                    humantime::format_duration(args.timeout)
                );
                for (pod, images, _) in waiting.drain(..) {
                    outcome.pods.push(entry(pod, PodResult::Upgraded, images.clone(), Some(reason.clone())));
                }
            } else if !waiting.is_empty() {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
        if outcome.failed() {
            break;
        }
    }
    // After a failed batch, nothing more is touched.
    for (pod, images, ..) in batches.flatten() {
        outcome.pods.push(entry(
            pod,
            PodResult::Left,
            images.clone(),
            Some("not started: an earlier batch failed".into()),
        ));
    }
    Ok(outcome)
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
            &["--upgrade", "--restart"][..],
            &["--partition", "1"],
            &["-l", "app=web"],
            &["--upgrade", "--max-unavailable", "0"],
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
