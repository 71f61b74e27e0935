//! The command line: every subcommand and flag in one place. Each flag can also be set from the environment
//! (`SIDECAR_INJECTOR_*`), the way a Deployment configures a container.

pub mod review;
pub mod serve;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
}

/// Options shared by every command that injects.
#[derive(Debug, Args)]
pub struct TemplateArgs {
    /// The template file (YAML). Without it, the built-in template (templates/default.yaml) is used.
    #[arg(long, value_name = "FILE", env = "SIDECAR_INJECTOR_TEMPLATE")]
    pub template: Option<PathBuf>,

    /// The prefix of the annotations the injector reads and writes (`<prefix>inject`, `<prefix>status`).
    #[arg(long, value_name = "PREFIX", default_value = sidecar_injector::template::DEFAULT_PREFIX,
          env = "SIDECAR_INJECTOR_ANNOTATION_PREFIX")]
    pub annotation_prefix: String,
}

impl TemplateArgs {
    /// Builds the engine these options describe.
    pub fn engine(&self) -> Result<sidecar_injector::Engine, sidecar_injector::TemplateError> {
        let settings = sidecar_injector::Settings { annotation_prefix: self.annotation_prefix.clone() };
        let template = match &self.template {
            Some(path) => sidecar_injector::Template::from_file(path, &settings.annotation_prefix)?,
            None => sidecar_injector::Template::builtin(&settings.annotation_prefix)?,
        };
        Ok(sidecar_injector::Engine::new(template, &settings))
    }
}
