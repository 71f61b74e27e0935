//! `sidecar-injector check`: validate and dry-render templates offline, as CI does before a ConfigMap change.

use std::path::PathBuf;

use crate::{TemplateError, TemplateSet};
use clap::Args;

/// Arguments of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A template file, or a template directory (NAME.yaml per template, optional values.yaml).
    #[arg(value_name = "DIR|FILE")]
    pub path: PathBuf,

    /// For a directory: the template of pods that do not name one (it must exist).
    #[arg(long, value_name = "NAME", default_value = crate::template::BUILTIN_NAME,
          env = "SIDECAR_INJECTOR_DEFAULT_TEMPLATE")]
    pub default_template: String,

    /// The annotation prefix the templates will be served with.
    #[arg(long, value_name = "PREFIX", default_value = crate::template::DEFAULT_PREFIX,
          env = "SIDECAR_INJECTOR_ANNOTATION_PREFIX")]
    pub annotation_prefix: String,
}

/// Runs `check`: a summary on stdout and exit 0, or every problem (file:line: reason) and exit 1.
pub fn run(args: &CheckArgs) -> Result<(), String> {
    let prefix = &args.annotation_prefix;
    let loaded = if args.path.is_dir() {
        TemplateSet::load_dir(&args.path, &args.default_template, prefix)
    } else {
        TemplateSet::from_file(&args.path, prefix)
    };
    let set = loaded.map_err(|e| {
        let problems = match e {
            TemplateError::Several(all) => all.iter().map(ToString::to_string).collect(),
            one => vec![one.to_string()],
        };
        format!("{} refused:\n{}", args.path.display(), problems.iter().map(|p| format!("  {p}\n")).collect::<String>())
            .trim_end()
            .to_owned()
    })?;
    print!("{}", summary(&args.path.display().to_string(), &set));
    Ok(())
}

/// What a set injects, template by template.
fn summary(label: &str, set: &TemplateSet) -> String {
    let mut text = format!("{label}: set {}, default template {}\n", set.hash(), set.default_template().name());
    for template in set.templates() {
        let status: serde_json::Value = serde_json::from_str(template.status()).unwrap_or_default();
        let list = |key: &str| {
            let names: Vec<&str> = status[key].as_array().into_iter().flatten().filter_map(|v| v.as_str()).collect();
            if names.is_empty() { "-".to_owned() } else { names.join(", ") }
        };
        text.push_str(&format!(
            "  {}: version {}; containers: {}; init containers: {}; volumes: {}\n",
            template.name(),
            template.hash(),
            list("containers"),
            list("initContainers"),
            list("volumes")
        ));
        for (annotation, kind) in template.override_annotations() {
            text.push_str(&format!("    override: {annotation} ({kind})\n"));
        }
    }
    for file in set.ignored() {
        text.push_str(&format!("  ignored (not NAME.yaml): {file}\n"));
    }
    text.push_str("ok\n");
    text
}
