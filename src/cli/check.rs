//! `sidecar-injector check`: validate and dry-render templates offline, as CI does before a ConfigMap change.

use std::path::{Path, PathBuf};

use super::CliError;
use super::overlay::{self, Home};
use clap::Args;
use sidecar_injector_core::{TemplateError, TemplateSet};

/// Arguments of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A template file, a template directory (NAME.yaml per template, optional values.yaml), or an overlay
    /// `certs` wrote (each revision's templates, and that its kustomization lists every template file).
    #[arg(value_name = "DIR|FILE")]
    pub path: PathBuf,

    /// How the templates will be served.
    #[command(flatten)]
    pub served: super::ServedAs,

    /// Refuse (exit 1) a template whose injected pods cannot meet this Pod Security level (privileged, baseline,
    /// restricted), naming the fields that break it. Without it, each template's level is reported only.
    #[arg(long, value_name = "LEVEL")]
    pub pod_security: Option<sidecar_injector_core::pod_security::Level>,
}

/// Runs `check`: a summary on stdout and exit 0, or every problem (file:line: reason) and exit 1; exit 2 when
/// there is nothing to check.
pub fn run(args: &CheckArgs) -> Result<(), CliError> {
    let path = &args.path;
    if !path.exists() {
        return Err(CliError::Config(format!("{}: no such file or directory", path.display())));
    }
    // An overlay: the templates of each revision it deploys, each a set of its own.
    let targets: Vec<(PathBuf, Option<Home>)> = if path.join("kustomization.yaml").is_file() {
        let homes: Vec<Home> = Home::all(path).into_iter().filter(|home| home.dir().is_dir()).collect();
        if homes.is_empty() {
            return Err(CliError::Config(format!(
                "{}: a kustomization without a {}/ directory of templates (run `sidecar-injector certs --out {0}` to \
                 give it one)",
                path.display(),
                overlay::TEMPLATES_DIR
            )));
        }
        homes.into_iter().map(|home| (home.dir(), Some(home))).collect()
    } else {
        vec![(path.clone(), Home::of_templates_dir(path))]
    };
    let mut refused = Vec::new();
    for (dir, home) in &targets {
        match check_set(dir, args) {
            Ok(()) => {}
            Err(CliError::Refused(why)) => refused.push(why),
            Err(config) => return Err(config),
        }
        if let Some(problem) = home.as_ref().map(Home::listing_problem).transpose()?.flatten() {
            refused.push(format!("{} is not what `kubectl apply -k` deploys:\n{}", dir.display(), problem.trim_end()));
        }
    }
    if refused.is_empty() { Ok(()) } else { Err(CliError::Refused(refused.join("\n"))) }
}

/// Checks one template file or directory: prints its summary (and the Pod Security verdict), or says why it is
/// refused.
fn check_set(path: &Path, args: &CheckArgs) -> Result<(), CliError> {
    let settings = args.served.settings();
    let loaded = if path.is_dir() {
        TemplateSet::load_dir(path, &args.served.default_template, &settings)
    } else {
        TemplateSet::from_file(path, &settings)
    };
    let set = loaded.map_err(|e| {
        let mut problems = Vec::new();
        every_problem(&e, &mut problems);
        let listed: String = problems.iter().map(|p| format!("  {p}\n")).collect();
        CliError::Refused(format!("{} refused:\n{}", path.display(), listed.trim_end()))
    })?;
    super::stdout(summary(&path.display().to_string(), &set, args.served.kubernetes_version))?;
    let Some(required) = args.pod_security else {
        return super::stdout("ok\n");
    };
    let below: Vec<String> = set
        .templates()
        .filter_map(|template| {
            let report = sidecar_injector_core::template_set::pod_security(template).ok()?;
            let broken: Vec<String> = report.breaking(required).map(|v| format!("    {v}")).collect();
            (!broken.is_empty()).then(|| format!("  {}: {}\n{}", template.name(), report.level(), broken.join("\n")))
        })
        .collect();
    if below.is_empty() {
        return super::stdout(format!("ok: every template's pods can meet Pod Security level {required}\n"));
    }
    Err(CliError::Refused(format!(
        "{}: injected pods cannot meet Pod Security level {required}:\n{}",
        path.display(),
        below.join("\n")
    )))
}

/// A template's Pod Security level, and what keeps it from the next level up (if any): two lines or one.
fn pod_security_lines(template: &sidecar_injector_core::Template) -> String {
    use sidecar_injector_core::pod_security::Level;
    let report = match sidecar_injector_core::template_set::pod_security(template) {
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

/// Whether the template compiles into a MutatingAdmissionPolicy (`sidecar-injector policy`), or why not.
fn policy_line(template: &sidecar_injector_core::Template, default_template: &str) -> String {
    let selection = super::policy::shipped_selection();
    match sidecar_injector_core::policy::compile(template, default_template, &selection) {
        Ok(_) => {
            "    policy: compiles into a MutatingAdmissionPolicy (`sidecar-injector policy`, Kubernetes 1.36+)\n".into()
        }
        Err(refusal) => format!("    policy: needs the webhook: {refusal}\n"),
    }
}

/// Every problem of every file, one line each (a file's own problems are nested in the set's list).
fn every_problem(error: &TemplateError, out: &mut Vec<String>) {
    match error {
        TemplateError::Several(all) => all.iter().for_each(|e| every_problem(e, out)),
        one => out.push(one.to_string()),
    }
}

/// What a set injects, template by template.
fn summary(label: &str, set: &TemplateSet, version: sidecar_injector_core::validation::KubeVersion) -> String {
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
        text.push_str(&policy_line(template, set.default_template().name()));
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
