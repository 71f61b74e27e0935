//! `sidecar-injector check`: validate and dry-render templates offline, as CI does before a ConfigMap change.

use std::path::PathBuf;

use super::CliError;
use crate::{TemplateError, TemplateSet};
use clap::Args;

/// Arguments of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A template file, or a template directory (NAME.yaml per template, optional values.yaml).
    #[arg(value_name = "DIR|FILE")]
    pub path: PathBuf,

    /// How the templates will be served.
    #[command(flatten)]
    pub served: super::ServedAs,

    /// Refuse (exit 1) a template whose injected pods cannot meet this Pod Security level (privileged, baseline,
    /// restricted), naming the fields that break it. Without it, each template's level is reported only.
    #[arg(long, value_name = "LEVEL")]
    pub pod_security: Option<crate::pod_security::Level>,
}

/// Runs `check`: a summary on stdout and exit 0, or every problem (file:line: reason) and exit 1; exit 2 when
/// there is nothing to check.
pub fn run(args: &CheckArgs) -> Result<(), CliError> {
    if !args.path.exists() {
        return Err(CliError::Config(format!("{}: no such file or directory", args.path.display())));
    }
    let settings = args.served.settings();
    let loaded = if args.path.is_dir() {
        TemplateSet::load_dir(&args.path, &args.served.default_template, &settings)
    } else {
        TemplateSet::from_file(&args.path, &settings)
    };
    let set = loaded.map_err(|e| {
        let mut problems = Vec::new();
        every_problem(&e, &mut problems);
        let listed: String = problems.iter().map(|p| format!("  {p}\n")).collect();
        CliError::Refused(format!("{} refused:\n{}", args.path.display(), listed.trim_end()))
    })?;
    super::stdout(summary(&args.path.display().to_string(), &set, args.served.kubernetes_version))?;
    let Some(required) = args.pod_security else {
        return super::stdout("ok\n");
    };
    let below: Vec<String> = set
        .templates()
        .filter_map(|template| {
            let report = crate::template_set::pod_security(template).ok()?;
            let broken: Vec<String> = report.breaking(required).map(|v| format!("    {v}")).collect();
            (!broken.is_empty()).then(|| format!("  {}: {}\n{}", template.name(), report.level(), broken.join("\n")))
        })
        .collect();
    if below.is_empty() {
        return super::stdout(format!("ok: every template's pods can meet Pod Security level {required}\n"));
    }
    Err(CliError::Refused(format!(
        "{}: injected pods cannot meet Pod Security level {required}:\n{}",
        args.path.display(),
        below.join("\n")
    )))
}

/// A template's Pod Security level, and what keeps it from the next level up (if any): two lines or one.
fn pod_security_lines(template: &crate::Template) -> String {
    use crate::pod_security::Level;
    let report = match crate::template_set::pod_security(template) {
        Ok(report) => report,
        Err(reason) => return format!("    pod security: not judged ({reason})\n"),
    };
    let level = report.level();
    let mut text = format!("    pod security: {level} (for an app that meets restricted)\n");
    let next = match level {
        Level::Privileged => Some(Level::Baseline),
        Level::Baseline => Some(Level::Restricted),
        Level::Restricted => None,
    };
    if let Some(next) = next {
        for violation in report.breaking(next) {
            text.push_str(&format!("      not {next}: {violation}\n"));
        }
    }
    text
}

/// Every problem of every file, one line each (a file's own problems are nested in the set's list).
fn every_problem(error: &TemplateError, out: &mut Vec<String>) {
    match error {
        TemplateError::Several(all) => all.iter().for_each(|e| every_problem(e, out)),
        one => out.push(one.to_string()),
    }
}

/// What a set injects, template by template.
fn summary(label: &str, set: &TemplateSet, version: crate::validation::KubeVersion) -> String {
    let mut text = format!(
        "{label}: set {}, default template {}; injected pods valid for Kubernetes {version}\n",
        set.hash(),
        set.default_template().name()
    );
    for template in set.templates() {
        let list = |names: &[String]| if names.is_empty() { "-".to_owned() } else { names.join(", ") };
        let injects = template.injects();
        text.push_str(&format!(
            "  {}: version {}; containers: {}; init containers: {}; volumes: {}\n",
            template.name(),
            template.hash(),
            list(&injects.containers),
            list(&injects.init_containers),
            list(&injects.volumes)
        ));
        if let Some(hold) = template.hold() {
            text.push_str(&format!("    holds the app until its sidecars are ready: {}\n", hold.describe()));
        }
        for warning in template.warnings() {
            text.push_str(&format!("    warning: {warning}\n"));
        }
        for (annotation, kind) in template.override_annotations() {
            text.push_str(&format!("    override: {annotation} ({kind})\n"));
        }
        text.push_str(&pod_security_lines(template));
    }
    for template in set.unavailable() {
        text.push_str(&format!(
            "  {}: left out: needs Kubernetes {} (minKubernetesVersion); pods that ask for it are not injected\n",
            template.name, template.needs
        ));
    }
    for file in set.ignored() {
        text.push_str(&format!("  ignored (not NAME.yaml): {file}\n"));
    }
    text
}
