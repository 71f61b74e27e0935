//! `sidecar-injector review`: what the webhook would answer to one AdmissionReview.

use std::io::{Read, Write};
use std::path::PathBuf;

use crate::Verdict;
use base64::Engine as _;
use clap::Args;

use super::{CliError, TemplateArgs};

/// Arguments of `review`.
#[derive(Debug, Args)]
pub struct ReviewArgs {
    /// The AdmissionReview to answer (JSON); `-` or nothing reads stdin.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,

    /// Also print, on stderr, the decision, its reason and the decoded patch.
    #[arg(long)]
    pub explain: bool,

    /// Answer as the validating webhook (`/validate`) does: is the pod's injection complete?
    #[arg(long)]
    pub validate: bool,

    /// Which templates, and how to apply them.
    #[command(flatten)]
    pub template: TemplateArgs,
}

/// Runs `review`. The response goes to stdout; errors come back as a one-line message.
pub fn run(args: &ReviewArgs) -> Result<(), CliError> {
    let engine = args.template.engine().map_err(|e| CliError::templates(e, false))?;
    let (label, mut body) = match args.file.as_deref() {
        None => ("stdin".to_owned(), read_stdin()?),
        Some(p) if p.as_os_str() == "-" => ("stdin".to_owned(), read_stdin()?),
        Some(p) => {
            let body = std::fs::read(p).map_err(|e| CliError::Config(format!("{}: {e}", p.display())))?;
            (p.display().to_string(), body)
        }
    };
    let original = args.explain.then(|| body.clone());
    let mut response = Vec::new();
    let outcome =
        if args.validate { engine.validate(&mut body, &mut response) } else { engine.review(&mut body, &mut response) }
            .map_err(|e| CliError::Refused(format!("{label}: {e}")))?;
    response.push(b'\n');
    std::io::stdout().write_all(&response).map_err(|e| CliError::Config(format!("writing the response: {e}")))?;
    if let Some(original) = original {
        eprint!("{}", explain(&engine, &original, &outcome, &response));
    }
    match outcome.verdict {
        crate::Verdict::Denied(reason) => {
            Err(CliError::Refused(format!("{label}: the pod is refused ({})", reason.as_str())))
        }
        crate::Verdict::Incomplete { refused: true, .. } => {
            Err(CliError::Refused(format!("{label}: the pod is refused: it lacks part of its injection")))
        }
        _ => Ok(()),
    }
}

fn read_stdin() -> Result<Vec<u8>, CliError> {
    let mut body = Vec::new();
    std::io::stdin().read_to_end(&mut body).map_err(|e| CliError::Config(format!("reading stdin: {e}")))?;
    Ok(body)
}

/// The human-readable account of a decision.
fn explain(engine: &crate::Engine, request: &[u8], outcome: &crate::Outcome, response: &[u8]) -> String {
    let request: serde_json::Value = serde_json::from_slice(request).unwrap_or_default();
    let object = &request["request"]["object"];
    let namespace = object["metadata"]["namespace"].as_str().or(request["request"]["namespace"].as_str()).unwrap_or("");
    let name = object["metadata"]["name"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{}*", object["metadata"]["generateName"].as_str().unwrap_or("<unnamed>")));
    let response: serde_json::Value = serde_json::from_slice(response).unwrap_or_default();
    let audit = &response["response"]["auditAnnotations"];
    let mut text = format!("pod: {namespace}/{name}\n");
    if let Some(template) = audit["template"].as_str() {
        let version = audit["template-version"].as_str().unwrap_or("");
        text.push_str(&format!("template: {template} (version {version}, set {})\n", engine.set().hash()));
    }
    match outcome.verdict {
        Verdict::Injected { ops } => {
            text.push_str(&format!("decision: injected, {ops} add operation(s)\npatch:\n"));
            let patch = response["response"]["patch"].as_str().unwrap_or("");
            let decoded = base64::engine::general_purpose::STANDARD.decode(patch).unwrap_or_default();
            let patch: serde_json::Value = serde_json::from_slice(&decoded).unwrap_or_default();
            text.push_str(&serde_json::to_string_pretty(&patch).unwrap_or_default());
            text.push('\n');
        }
        Verdict::Skipped(reason) => {
            text.push_str(&format!("decision: not injected ({}): {}\n", reason.as_str(), reason.explain()));
        }
        Verdict::Denied(reason) => {
            let message = response["response"]["status"]["message"].as_str().unwrap_or("");
            text.push_str(&format!("decision: refused ({}): {message}\n", reason.as_str()));
        }
        Verdict::Complete => text.push_str("validation: complete, the pod has everything its template injects\n"),
        Verdict::Incomplete { missing, refused: true } => {
            let message = response["response"]["status"]["message"].as_str().unwrap_or("");
            text.push_str(&format!("validation: refused, {missing} missing part(s): {message}\n"));
        }
        Verdict::Incomplete { missing, refused: false } => {
            text.push_str(&format!("validation: admitted with a warning, {missing} missing part(s)\n"));
        }
    }
    for warning in &outcome.warnings {
        text.push_str(&format!("warning: {warning}\n"));
    }
    text
}
