//! `sidecar-injector inject`: manifests in, the same manifests with the sidecar injected on stdout, like
//! `istioctl kube-inject`. Useful in CI and for a first look before deploying anything. `uninject`, its inverse
//! (like `linkerd uninject`), takes the same arguments.

use std::io::Read;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{CliError, TemplateArgs};
use crate::Verdict;
use crate::offline::{self, Format, Uninjection};

/// Arguments of `inject`.
#[derive(Debug, Args)]
pub struct InjectArgs {
    /// The manifests (YAML or JSON, one or many documents); `-` reads stdin.
    #[arg(short = 'f', long = "filename", value_name = "FILE|-")]
    pub file: PathBuf,

    /// Output format [default: the input's].
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,

    /// The namespace of objects that do not name one (what `kubectl apply -n` would give them).
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,

    /// Say nothing on stderr about pod templates that were not injected.
    #[arg(short = 'q', long)]
    pub quiet: bool,

    /// Which templates, and how to apply them.
    #[command(flatten)]
    pub template: TemplateArgs,
}

/// `yaml` or `json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// YAML documents separated by `---`.
    Yaml,
    /// JSON objects.
    Json,
}

/// Runs `inject`. Nothing is printed unless every document could be injected.
pub fn run(args: &InjectArgs) -> Result<(), CliError> {
    each_document(args, |engine, document, notes| {
        for report in offline::inject_document(engine, document, &args.namespace)? {
            for warning in &report.warnings {
                notes.push_str(&format!("{}: warning: {warning}\n", report.workload));
            }
            if let (Verdict::Skipped(reason), false) = (report.verdict, args.quiet) {
                let (name, why) = (reason.as_str(), reason.explain());
                notes.push_str(&format!("{}: not injected ({name}): {why}\n", report.workload));
            }
        }
        Ok(())
    })
}

/// Runs `uninject`: the inverse of `inject`, with the same arguments. Nothing is printed unless every document
/// could be uninjected.
pub fn run_uninject(args: &InjectArgs) -> Result<(), CliError> {
    each_document(args, |engine, document, notes| {
        for report in offline::uninject_document(engine, document, &args.namespace)? {
            if let (Uninjection::NotInjected, false) = (report.result, args.quiet) {
                notes.push_str(&format!("{}: not injected (no status annotation): left as it is\n", report.workload));
            }
        }
        Ok(())
    })
}

/// Reads the manifests `args` name, hands each document to `work` (with the engine and the notes for stderr),
/// and prints the documents in the output format, the notes on stderr.
fn each_document(
    args: &InjectArgs,
    mut work: impl FnMut(&crate::Engine, &mut serde_json::Value, &mut String) -> Result<(), offline::OfflineError>,
) -> Result<(), CliError> {
    let engine = args.template.engine().map_err(|e| CliError::templates(e, false))?;
    let (label, text) = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|e| CliError::Config(format!("reading stdin: {e}")))?;
        ("stdin".to_owned(), text)
    } else {
        let label = args.file.display().to_string();
        let text = std::fs::read_to_string(&args.file).map_err(|e| CliError::Config(format!("{label}: {e}")))?;
        (label, text)
    };
    let mut documents = offline::read_documents(&text).map_err(|e| CliError::Refused(format!("{label}: {e}")))?;
    let mut notes = String::new();
    for document in &mut documents {
        work(&engine, document, &mut notes).map_err(|e| CliError::Refused(format!("{label}: {e}")))?;
    }
    let format = match args.output {
        Some(OutputFormat::Yaml) => Format::Yaml,
        Some(OutputFormat::Json) => Format::Json,
        None => Format::detect(&text),
    };
    super::stdout(offline::write_documents(&documents, format))?;
    super::stderr(format_args!("{notes}"));
    Ok(())
}
