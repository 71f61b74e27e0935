//! `sidecar-injector inject`: manifests in, the same manifests with the sidecar injected on stdout, like
//! `istioctl kube-inject`. Useful in CI and for a first look before deploying anything. `uninject`, its inverse
//! (like `linkerd uninject`), takes the same arguments.

use std::io::Read;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{CliError, TemplateArgs};
use sidecar_injector_core::Verdict;
use sidecar_injector_core::offline::{self, Format, Uninjection};

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

    /// Which templates.
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

/// Runs `inject`. Nothing is printed unless every document could be injected: a pod template that should get the
/// sidecar and could not (a render that failed, a template it names that is not there) exits 1, as a refused
/// one does, with the reason on stderr.
pub fn run(args: &InjectArgs) -> Result<(), CliError> {
    each_document(args, |engine, document, notes| {
        for report in offline::inject_document(engine, document, &args.namespace)? {
            // A warning that says why the pod was skipped is the note below.
            let said = |warning: &String| report.why.as_deref().is_some_and(|why| warning.ends_with(why));
            for warning in report.warnings.iter().filter(|w| !said(w)) {
                notes.text.push_str(&format!("{}: warning: {warning}\n", report.workload));
            }
            match report.verdict {
                Verdict::Skipped(reason) if reason.is_failure() => {
                    notes.failed.push((report.workload, reason.as_str()))
                }
                Verdict::Skipped(reason) if !args.quiet => {
                    let why = report.why.as_deref().unwrap_or_default();
                    notes.text.push_str(&format!("{}: not injected ({}): {why}\n", report.workload, reason.as_str()));
                }
                _ => {}
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
                let workload = &report.workload;
                notes.text.push_str(&format!("{workload}: not injected (no status annotation): left as it is\n"));
            }
        }
        Ok(())
    })
}

/// What a run says beside the documents: notes for stderr, and the pod templates that should have been injected
/// and could not be (with the reason's name).
#[derive(Default)]
struct Notes {
    text: String,
    failed: Vec<(String, &'static str)>,
}

/// Reads the manifests `args` name, hands each document to `work` (with the engine and the notes), and prints the
/// documents in the output format and the notes on stderr; or, when a pod template could not be injected, nothing
/// but the notes, and exits 1.
fn each_document(
    args: &InjectArgs,
    mut work: impl FnMut(
        &sidecar_injector_core::Engine,
        &mut serde_json::Value,
        &mut Notes,
    ) -> Result<(), offline::OfflineError>,
) -> Result<(), CliError> {
    let engine = args.template.engine(None).map_err(|e| CliError::templates(e, false))?;
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
    let mut notes = Notes::default();
    for document in &mut documents {
        work(&engine, document, &mut notes).map_err(|e| CliError::Refused(format!("{label}: {e}")))?;
    }
    let Notes { text: notes, failed } = notes;
    if !failed.is_empty() {
        // The warnings above say why (the field, the template, the fix); the error names what failed.
        super::stderr(format_args!("{notes}"));
        let workloads: Vec<String> = failed.iter().map(|(workload, reason)| format!("{workload} ({reason})")).collect();
        return Err(CliError::Refused(format!(
            "{label}: could not inject {}: the webhook would admit such pods without the sidecar (or refuse them, as \
             onError says)",
            workloads.join(", ")
        )));
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
