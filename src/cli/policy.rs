//! `sidecar-injector policy`: the templates as MutatingAdmissionPolicies (Kubernetes 1.36 and later), for
//! injection without a webhook (docs/policy.md).

use std::path::{Path, PathBuf};

use super::CliError;
use clap::Args;
use sidecar_injector_core::TemplateSet;
use sidecar_injector_core::policy::{Selection, compile};

/// The shipped mutating webhook configuration: the policies select the pods it selects.
const WEBHOOK_CONFIGURATION: &str = include_str!("../../manifests/base/mutatingwebhookconfiguration.yaml");

/// Arguments of `policy`.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// A template file or a template directory (NAME.yaml per template, optional values.yaml), as for `check`.
    #[arg(value_name = "DIR|FILE")]
    pub path: PathBuf,

    /// Write each template's policy and binding to DIR/NAME.yaml, with a kustomization.yaml listing them, instead
    /// of printing them all on stdout.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// How the templates will be served.
    #[command(flatten)]
    pub served: super::ServedAs,
}

/// The pods the shipped webhook is called for.
pub fn shipped_selection() -> Selection {
    let configuration: serde_json::Value =
        serde_saphyr::from_str(WEBHOOK_CONFIGURATION).expect("the shipped webhook configuration is YAML");
    Selection::of_webhook(&configuration["webhooks"][0])
}

/// Runs `policy`: every template that compiles, as YAML; exit 1 naming each one that does not (what does compile is
/// still written).
pub fn run(args: &PolicyArgs) -> Result<(), CliError> {
    let set = load(&args.path, &args.served)?;
    let selection = shipped_selection();
    let mut documents = Vec::new();
    let mut refused = Vec::new();
    for template in set.templates() {
        match compile(template, set.default_template().name(), &selection) {
            Ok(objects) => documents.push((template.name().to_owned(), objects)),
            Err(refusal) => refused.push(format!("  {}: {refusal}", file_of(&args.path, template.name()))),
        }
    }
    match &args.out {
        Some(dir) => write_dir(dir, &documents)?,
        None => {
            let yaml: Vec<String> =
                documents.iter().flat_map(|(_, objects)| objects.iter().map(to_yaml)).collect::<Result<_, _>>()?;
            super::stdout(yaml.join("---\n"))?;
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(CliError::Refused(format!(
        "{} template(s) do not compile into a policy (keep them on the webhook):\n{}",
        refused.len(),
        refused.join("\n")
    )))
}

/// The template set at `path`, as `check` loads it.
fn load(path: &Path, served: &super::ServedAs) -> Result<TemplateSet, CliError> {
    let settings = served.settings();
    let loaded = if path.is_dir() {
        TemplateSet::load_dir(path, &served.default_template, &settings)
    } else {
        TemplateSet::from_file(path, &settings)
    };
    loaded.map_err(|e| CliError::templates(e, true))
}

/// The file of template `name` under `path`, for messages.
fn file_of(path: &Path, name: &str) -> String {
    if path.is_dir() { path.join(format!("{name}.yaml")).display().to_string() } else { path.display().to_string() }
}

/// An object as a YAML document.
pub(super) fn to_yaml(object: &serde_json::Value) -> Result<String, CliError> {
    serde_saphyr::to_string(object).map_err(|e| CliError::Config(format!("writing YAML: {e}")))
}

/// DIR/NAME.yaml per template (its policy and binding) and DIR/kustomization.yaml listing them.
fn write_dir(dir: &Path, documents: &[(String, [serde_json::Value; 2])]) -> Result<(), CliError> {
    let io = |e: std::io::Error| CliError::Config(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut resources = Vec::new();
    for (name, objects) in documents {
        let file = format!("{name}.yaml");
        let yaml = objects.iter().map(to_yaml).collect::<Result<Vec<_>, _>>()?.join("---\n");
        std::fs::write(dir.join(&file), yaml).map_err(io)?;
        resources.push(file);
    }
    let kustomization = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": resources,
    });
    std::fs::write(dir.join("kustomization.yaml"), to_yaml(&kustomization)?).map_err(io)
}
