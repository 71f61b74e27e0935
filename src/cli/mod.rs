//! The command line of the `sidecar-injector` binary: every subcommand and flag in one place. Each flag can also
//! be set from the environment (`SIDECAR_INJECTOR_*`), the way a Deployment configures a container.
//!
//! It lives in the library so that the load harness (`loadtest --start`) can run this very `serve` in a child
//! process of its own, always built from the same source as the harness.

pub mod certs;
pub mod check;
pub mod inject;
pub mod names;
pub mod overlay;
pub mod policy;
pub mod review;
pub mod serve;
pub mod status;
pub mod tag;

use std::path::PathBuf;

use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand};
use sidecar_injector_core::{Policy, Validation};

/// What the exit codes mean, for scripts (`--help` shows it).
pub const EXIT_CODES: &str = "Exit codes: 0 success; 1 the work found a problem (check refused a template or an \
overlay that would leave one out, review or validate refused a pod, inject could not inject or uninject could not \
uninject, the input is not a review or not YAML, status found pods that do not run the current sidecar or that name \
a template the injector lacks, tag refused a change); 2 bad usage or bad configuration (an unknown flag, an \
unreadable file or directory, a bad flag value, a template that does not load for any command but check, TLS \
material serve cannot use, an API server status or tag cannot reach).";

/// A Kubernetes mutating admission webhook that injects a templated sidecar into Pods.
#[derive(Debug, Parser)]
#[command(name = "sidecar-injector", version, about, propagate_version = true, after_help = EXIT_CODES)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Why a command failed: the exit code a script can act on, and the one-line reason printed on stderr.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The work found a problem: a template, a pod or the input was refused. Exit code 1.
    #[error("{0}")]
    Refused(String),
    /// Bad usage or bad configuration: nothing was judged. Exit code 2, as clap's own usage errors.
    #[error("{0}")]
    Config(String),
}

impl CliError {
    /// The process's exit code for this error (see [`EXIT_CODES`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Refused(_) => 1,
            CliError::Config(_) => 2,
        }
    }

    /// Why templates could not be loaded: refused (malformed or invalid) or not there to read.
    pub(crate) fn templates(error: sidecar_injector_core::TemplateError, refused: bool) -> Self {
        match error {
            sidecar_injector_core::TemplateError::Read { .. }
            | sidecar_injector_core::TemplateError::Directory { .. } => CliError::Config(error.to_string()),
            invalid if refused => CliError::Refused(invalid.to_string()),
            invalid => CliError::Config(invalid.to_string()),
        }
    }
}

/// Parses `args` (the first one is the program's name) and runs the subcommand: the whole `sidecar-injector`
/// binary, with the exit codes of [`EXIT_CODES`].
pub fn main<I, T>(args: I) -> std::process::ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    let result = match &cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Review(args) => review::run(args),
        Command::Check(args) => check::run(args),
        Command::Inject(args) => inject::run(args),
        Command::Uninject(args) => inject::run_uninject(args),
        Command::Certs(args) => certs::run(args),
        Command::Status(args) => status::run(args),
        Command::Policy(args) => policy::run(args),
        Command::Tag(args) => tag::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            stderr(format_args!("sidecar-injector: {error}\n"));
            std::process::ExitCode::from(error.exit_code())
        }
    }
}

/// Writes `bytes` to stdout, all of them or none that matter: a reader that has gone away
/// (`sidecar-injector check templates | head -1`) ends the output quietly, as it wanted no more. `print!` would
/// panic on that broken pipe (Rust ignores SIGPIPE, so the write fails instead of the process ending).
pub(crate) fn stdout(bytes: impl AsRef<[u8]>) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes.as_ref()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(CliError::Config(format!("writing to stdout: {e}")))
        }
        _ => Ok(()),
    }
}

/// Writes a note to stderr; a stderr that cannot be written to (closed, a broken pipe) loses the note, and
/// nothing else: there is nowhere left to report it.
pub(crate) fn stderr(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    // Deliberately ignored: see above.
    let _ = std::io::stderr().lock().write_fmt(text);
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the webhook over HTTPS (with no flags: built-in template, generated development certificate).
    #[command(mut_arg("template_dir", |arg| arg.help(SERVE_TEMPLATE_DIR)))]
    Serve(Box<serve::ServeArgs>),
    /// Answer one AdmissionReview (from a file or stdin) as the webhook would, on stdout.
    Review(review::ReviewArgs),
    /// Validate and dry-render a template file or directory (what CI runs before a ConfigMap change).
    Check(check::CheckArgs),
    /// Inject the sidecar into every pod template of YAML or JSON manifests (Pod, Deployment, StatefulSet,
    /// DaemonSet, ReplicaSet, ReplicationController, Job, CronJob) and print them; other objects pass through.
    Inject(inject::InjectArgs),
    /// Take out of every pod template of YAML or JSON manifests what `inject` (or the webhook) put in, as its status
    /// annotation and the templates say, and print them: the inverse of `inject`. The templates must be those it
    /// was injected with.
    Uninject(inject::InjectArgs),
    /// Write a CA, a serving certificate for the webhook's Service and a kustomize overlay that deploys them
    /// (for clusters without cert-manager).
    Certs(certs::CertsArgs),
    /// Report which running pods carry the current sidecar, through your kubeconfig, by namespace and workload
    /// (exit 1 on drift); `--restart` rolls the Deployments, StatefulSets and DaemonSets that do not.
    #[command(mut_arg("template_dir", |arg| arg.help(STATUS_TEMPLATE_DIR)))]
    Status(Box<status::StatusArgs>),
    /// Compile templates into MutatingAdmissionPolicies and their bindings (Kubernetes 1.36+): injection by the
    /// API server itself, with no webhook to run; templates that need the webhook are named, with the reason
    Policy(policy::PolicyArgs),
    /// Point a revision tag (a stable name such as prod) at a revision, list the tags, or remove one, through
    /// your kubeconfig: namespaces labelled with a tag move when it moves.
    Tag(tag::TagArgs),
}

/// Which templates: the options of every command that injects or judges pods (`serve`, `review`, `inject`,
/// `status`). Each command words `--template-dir` in its own terms (`serve` reloads it and serves revisions at
/// their own paths): see [`SERVE_TEMPLATE_DIR`] and [`STATUS_TEMPLATE_DIR`].
#[derive(Debug, Args)]
pub struct TemplateArgs {
    /// A template file (YAML), the template of every pod. Without it or --template-dir, the built-in template
    /// (templates/default.yaml) is used.
    #[arg(long, value_name = "FILE", env = "SIDECAR_INJECTOR_TEMPLATE", conflicts_with = "template_dir")]
    pub template: Option<PathBuf>,

    /// A directory of templates, as the ConfigMap is mounted: one NAME.yaml per template and an optional
    /// values.yaml shared by all; pods name theirs with the `<prefix>template` annotation. As REVISION=DIR it is
    /// that revision's (the status annotation names it); given several times, the first is used.
    #[arg(long, value_name = "[REVISION=]DIR", env = "SIDECAR_INJECTOR_TEMPLATE_DIR", value_delimiter = ',')]
    pub template_dir: Vec<RevisionDir>,

    /// How the templates are served: the default template, the annotation prefix, the Kubernetes version.
    #[command(flatten)]
    pub served: ServedAs,
}

/// How templates are served: the options `check` shares with every command that injects or judges pods, so that a
/// template is checked as it will be served.
#[derive(Debug, Args)]
pub struct ServedAs {
    /// With a template directory: the template of pods that do not name one with the `<prefix>template`
    /// annotation (it must exist).
    #[arg(long, value_name = "NAME", default_value = sidecar_injector_core::template::BUILTIN_NAME,
          env = "SIDECAR_INJECTOR_DEFAULT_TEMPLATE")]
    pub default_template: String,

    /// The prefix of the annotations the injector reads and writes (`<prefix>inject`, `<prefix>status`,
    /// `<prefix>template`, overrides).
    #[arg(long, value_name = "PREFIX", default_value = sidecar_injector_core::settings::DEFAULT_PREFIX,
          env = "SIDECAR_INJECTOR_ANNOTATION_PREFIX")]
    pub annotation_prefix: String,

    /// The Kubernetes version the injected pods are for (1.29, v1.30.2): templates are validated against its API
    /// server's rules when they load (a native sidecar needs 1.29, the sleep hook 1.30).
    #[arg(long, value_name = "VERSION", default_value_t = sidecar_injector_core::validation::KubeVersion::DEFAULT,
          env = "SIDECAR_INJECTOR_KUBERNETES_VERSION")]
    pub kubernetes_version: sidecar_injector_core::validation::KubeVersion,
}

impl ServedAs {
    /// The engine settings these options give; the others at their defaults.
    pub fn settings(&self) -> sidecar_injector_core::settings::Settings {
        sidecar_injector_core::settings::Settings {
            annotation_prefix: self.annotation_prefix.clone(),
            kubernetes_version: self.kubernetes_version,
            ..sidecar_injector_core::settings::Settings::default()
        }
    }
}

/// `serve`'s words for `--template-dir`: it watches the directories and serves each revision at its own paths.
pub const SERVE_TEMPLATE_DIR: &str = "A directory of templates, as a ConfigMap is mounted: one NAME.yaml per \
template and an optional values.yaml shared by all, reloaded when it changes. Repeat it as REVISION=DIR to serve \
several revisions side by side (/mutate/REVISION, /validate/REVISION); the first is also served at the bare paths, \
and a directory without a name is the revision `default`.";

/// `status`'s words for `--template-dir`: the templates each revision's pods are judged by.
pub const STATUS_TEMPLATE_DIR: &str = "A directory of the templates the injector serves (NAME.yaml each, an \
optional values.yaml), to judge pods by instead of --configmap. Repeat it as REVISION=DIR for each revision: a pod \
is judged by the templates of the revision that injected it.";

/// How the webhook answers a pod it cannot inject, or whose injection is incomplete: the options of the commands
/// that answer as the webhook does (`serve`, `review`).
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// A pod whose injection cannot be rendered is admitted without the sidecar (allow, with a warning) or
    /// refused (deny). A template's own `onError` takes precedence.
    #[arg(long, value_parser = one_of::<Policy>(), default_value_t = Policy::Allow, env = "SIDECAR_INJECTOR_ON_ERROR")]
    pub on_error: Policy,

    /// A pod that names a template the injector does not have is admitted without the sidecar (allow, with a
    /// warning) or refused (deny).
    #[arg(long, value_parser = one_of::<Policy>(), default_value_t = Policy::Allow, env = "SIDECAR_INJECTOR_UNKNOWN_TEMPLATE")]
    pub unknown_template: Policy,

    /// What validation answers for a pod that lacks part of its injection: refuse it naming what is missing
    /// (deny) or admit it with that as a warning (warn). A template's own `validation` takes precedence.
    #[arg(long, value_parser = one_of::<Validation>(), default_value_t = Validation::Deny, env = "SIDECAR_INJECTOR_VALIDATION")]
    pub validation: Validation,
}

/// The parser of a flag whose values are a closed enum of the core: its possible values (listed by `--help`) are
/// the enum's own names, and each is read by the enum's `FromStr`, so the names are written once, in its derive.
fn one_of<T>() -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr + strum::VariantNames + Clone + Send + Sync + 'static,
{
    // Cannot fail: the values offered are the enum's own names, which its `FromStr` reads.
    clap::builder::PossibleValuesParser::new(T::VARIANTS)
        .map(|name| name.parse::<T>().ok().expect("a name of the enum"))
}

/// One revision's template directory: `REVISION=DIR`, or `DIR` for the revision `default`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionDir {
    /// The revision's name: a DNS-1123 label, as it appears in a URL path and a label value.
    pub revision: String,
    /// Its template directory.
    pub dir: PathBuf,
}

impl std::str::FromStr for RevisionDir {
    type Err = RevisionArgError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (revision, dir) = split_revision(text, "directory")?;
        Ok(RevisionDir { revision, dir: PathBuf::from(dir) })
    }
}

/// `[REVISION=]VALUE`: the revision (the default one without `REVISION=`, which must be a DNS-1123 label) and
/// the value, which must not be empty (`what` names it in the message).
pub(crate) fn split_revision<'t>(text: &'t str, what: &'static str) -> Result<(String, &'t str), RevisionArgError> {
    let (revision, value) = match text.split_once('=') {
        Some((name, value)) => (name, value),
        None => (sidecar_injector_core::settings::DEFAULT_REVISION, text),
    };
    if let Some(problem) = sidecar_injector_core::validation::dns1123_label(revision).into_iter().next() {
        return Err(RevisionArgError::Revision { revision: revision.to_owned(), problem });
    }
    if value.is_empty() {
        return Err(RevisionArgError::Empty { revision: revision.to_owned(), what });
    }
    Ok((revision.to_owned(), value))
}

/// Why a `[REVISION=]VALUE` option value is refused.
#[derive(Debug, thiserror::Error)]
pub enum RevisionArgError {
    /// The revision is not a DNS-1123 label.
    #[error("revision {revision:?}: {problem}")]
    Revision {
        /// The revision given.
        revision: String,
        /// The rule it breaks.
        problem: String,
    },
    /// Nothing after `REVISION=`.
    #[error("revision {revision:?} names no {what}")]
    Empty {
        /// The revision given.
        revision: String,
        /// What the value names: `directory`, `ConfigMap`.
        what: &'static str,
    },
    /// A ConfigMap named without its namespace where one is needed.
    #[error("{value:?} is not NAMESPACE/NAME")]
    NotNamespaced {
        /// The value given.
        value: String,
    },
    /// The ConfigMap's name is not a valid object name.
    #[error("ConfigMap name {name:?}: {problem}")]
    ConfigMapName {
        /// The name given.
        name: String,
        /// The rule it breaks.
        problem: String,
    },
}

impl TemplateArgs {
    /// The engine settings these options describe, for `revision`, with the webhook's `policies` (the defaults of
    /// [`sidecar_injector_core::settings::Settings`] without them).
    pub fn settings_for(
        &self,
        revision: &str,
        policies: Option<&PolicyArgs>,
    ) -> sidecar_injector_core::settings::Settings {
        sidecar_injector_core::settings::Settings { revision: revision.to_owned(), ..self.settings(policies) }
    }

    /// The template directories, one per revision, in order: the first is the default revision. Refuses a
    /// revision named twice.
    pub fn revisions(&self) -> Result<&[RevisionDir], CliError> {
        for (i, one) in self.template_dir.iter().enumerate() {
            if self.template_dir[..i].iter().any(|other| other.revision == one.revision) {
                return Err(CliError::Config(format!("revision {:?} is given twice (--template-dir)", one.revision)));
            }
        }
        Ok(&self.template_dir)
    }

    /// The engine settings these options describe, with the webhook's `policies` (the defaults of
    /// [`sidecar_injector_core::settings::Settings`] without them).
    pub fn settings(&self, policies: Option<&PolicyArgs>) -> sidecar_injector_core::settings::Settings {
        let served = self.served.settings();
        sidecar_injector_core::settings::Settings {
            on_error: policies.map_or(served.on_error, |p| p.on_error),
            on_unknown_template: policies.map_or(served.on_unknown_template, |p| p.unknown_template),
            validation: policies.map_or(served.validation, |p| p.validation),
            ..served
        }
    }

    /// Loads the templates and builds the engine these options describe: of the first revision, when there are
    /// several.
    pub fn engine(
        &self,
        policies: Option<&PolicyArgs>,
    ) -> Result<sidecar_injector_core::Engine, sidecar_injector_core::TemplateError> {
        match self.template_dir.first() {
            Some(first) => self.revision_engine(first, policies),
            None => {
                let settings = self.settings(policies);
                let set = match &self.template {
                    Some(file) => sidecar_injector_core::TemplateSet::from_file(file, &settings)?,
                    None => sidecar_injector_core::TemplateSet::builtin(&settings)?,
                };
                Ok(sidecar_injector_core::Engine::new(set, &settings))
            }
        }
    }

    /// Where `revision`'s templates come from, for the start log: its directory, the template file, or the
    /// built-in template.
    pub fn source_of(&self, revision: &str) -> String {
        match (self.template_dir.iter().find(|r| r.revision == revision), &self.template) {
            (Some(dir), _) => format!("{} (reloaded when it changes)", dir.dir.display()),
            (None, Some(file)) => file.display().to_string(),
            (None, None) => "the built-in template (templates/default.yaml)".to_owned(),
        }
    }

    /// Loads one revision's templates and builds its engine.
    pub fn revision_engine(
        &self,
        revision: &RevisionDir,
        policies: Option<&PolicyArgs>,
    ) -> Result<sidecar_injector_core::Engine, sidecar_injector_core::TemplateError> {
        let settings = self.settings_for(&revision.revision, policies);
        let set =
            sidecar_injector_core::TemplateSet::load_dir(&revision.dir, &self.served.default_template, &settings)?;
        Ok(sidecar_injector_core::Engine::new(set, &settings))
    }
}
