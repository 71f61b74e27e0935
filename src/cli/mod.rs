//! The command line: every subcommand and flag in one place. Each flag can also be set from the environment
//! (`SIDECAR_INJECTOR_*`), the way a Deployment configures a container.

pub mod check;
pub mod review;
pub mod serve;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// A Kubernetes mutating admission webhook that injects a templated sidecar into Pods.
#[derive(Debug, Parser)]
#[command(name = "sidecar-injector", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the webhook over HTTPS (with no flags: built-in template, generated development certificate).
    Serve(Box<serve::ServeArgs>),
    /// Answer one AdmissionReview (from a file or stdin) as the webhook would, on stdout.
    Review(review::ReviewArgs),
    /// Validate and dry-render a template file or directory (what CI runs before a ConfigMap change).
    Check(check::CheckArgs),
}

/// Options shared by every command that injects.
#[derive(Debug, Args)]
pub struct TemplateArgs {
    /// A template file (YAML), the template of every pod. Without it or --template-dir, the built-in template
    /// (templates/default.yaml) is used.
    #[arg(long, value_name = "FILE", env = "SIDECAR_INJECTOR_TEMPLATE", conflicts_with = "template_dir")]
    pub template: Option<PathBuf>,

    /// A directory of templates, as a ConfigMap is mounted: one NAME.yaml per template and an optional
    /// values.yaml shared by all. `serve` reloads it when it changes.
    #[arg(long, value_name = "DIR", env = "SIDECAR_INJECTOR_TEMPLATE_DIR")]
    pub template_dir: Option<PathBuf>,

    /// With --template-dir: the template of pods that do not name one with the `<prefix>template` annotation.
    #[arg(long, value_name = "NAME", default_value = sidecar_injector::template::BUILTIN_NAME,
          env = "SIDECAR_INJECTOR_DEFAULT_TEMPLATE")]
    pub default_template: String,

    /// A pod whose injection cannot be rendered is admitted without the sidecar (allow, with a warning) or
    /// refused (deny). A template's own `onError` takes precedence.
    #[arg(long, value_enum, default_value_t = PolicyArg::Allow, env = "SIDECAR_INJECTOR_ON_ERROR")]
    pub on_error: PolicyArg,

    /// A pod that names a template the injector does not have is admitted without the sidecar (allow, with a
    /// warning) or refused (deny).
    #[arg(long, value_enum, default_value_t = PolicyArg::Allow, env = "SIDECAR_INJECTOR_UNKNOWN_TEMPLATE")]
    pub unknown_template: PolicyArg,

    /// The prefix of the annotations the injector reads and writes (`<prefix>inject`, `<prefix>status`,
    /// `<prefix>template`, overrides).
    #[arg(long, value_name = "PREFIX", default_value = sidecar_injector::template::DEFAULT_PREFIX,
          env = "SIDECAR_INJECTOR_ANNOTATION_PREFIX")]
    pub annotation_prefix: String,
}

/// `allow` or `deny`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Admit the pod without the sidecar, with a warning.
    Allow,
    /// Refuse the pod, saying why.
    Deny,
}

impl From<PolicyArg> for sidecar_injector::Policy {
    fn from(policy: PolicyArg) -> Self {
        match policy {
            PolicyArg::Allow => sidecar_injector::Policy::Allow,
            PolicyArg::Deny => sidecar_injector::Policy::Deny,
        }
    }
}

impl TemplateArgs {
    /// The engine settings these options describe.
    pub fn settings(&self) -> sidecar_injector::Settings {
        sidecar_injector::Settings {
            annotation_prefix: self.annotation_prefix.clone(),
            on_error: self.on_error.into(),
            on_unknown_template: self.unknown_template.into(),
        }
    }

    /// Loads the templates and builds the engine these options describe.
    pub fn engine(&self) -> Result<sidecar_injector::Engine, sidecar_injector::TemplateError> {
        use sidecar_injector::TemplateSet;
        let prefix = &self.annotation_prefix;
        let set = match (&self.template, &self.template_dir) {
            (Some(file), _) => TemplateSet::from_file(file, prefix)?,
            (None, Some(dir)) => TemplateSet::load_dir(dir, &self.default_template, prefix)?,
            (None, None) => TemplateSet::builtin(prefix)?,
        };
        Ok(sidecar_injector::Engine::new(set, &self.settings()))
    }
}
