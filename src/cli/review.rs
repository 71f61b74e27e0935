//! `sidecar-injector review`: what the webhook would answer to one AdmissionReview.

use std::io::Read;
use std::path::PathBuf;

use clap::Args;
use sidecar_injector_core::{Mode, Outcome, Verdict};

use super::{CliError, PolicyArgs, TemplateArgs};

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

    /// Answer as the apply-time preview (`/preview`) does, for a workload's review (a Deployment, a Job...):
    /// admitted, with a warning for each thing that would go wrong for its pods.
    #[arg(long, conflicts_with = "validate")]
    pub preview: bool,

    /// Which templates.
    #[command(flatten)]
    pub template: TemplateArgs,

    /// How the webhook answers a pod it cannot inject, or whose injection is incomplete (as `serve` is set).
    #[command(flatten)]
    pub policies: PolicyArgs,
}

/// Runs `review`. The response goes to stdout; errors come back as a one-line message.
pub fn run(args: &ReviewArgs) -> Result<(), CliError> {
    let engine = args.template.engine(Some(&args.policies)).map_err(|e| CliError::templates(e, false))?;
    let (label, mut body) = match args.file.as_deref() {
        None => ("stdin".to_owned(), read_stdin()?),
        Some(p) if p.as_os_str() == "-" => ("stdin".to_owned(), read_stdin()?),
        Some(p) => {
            let body = std::fs::read(p).map_err(|e| CliError::Config(format!("{}: {e}", p.display())))?;
            (p.display().to_string(), body)
        }
    };
    let mut response = Vec::new();
    let mode = if args.validate { Mode::Validate } else { Mode::Mutate };
    let outcome = if args.preview {
        engine.preview(&mut body, &mut response)
    } else if args.explain {
        engine.trace(&mut body, &mut response, mode)
    } else if args.validate {
        engine.validate(&mut body, &mut response)
    } else {
        engine.review(&mut body, &mut response)
    }
    .map_err(|e| CliError::Refused(format!("{label}: {e}")))?;
    response.push(b'\n');
    super::stdout(&response)?;
    if args.explain {
        super::stderr(format_args!("{}", explain(&engine, &outcome)));
    }
    match outcome.verdict {
        sidecar_injector_core::Verdict::Denied(reason) => {
            Err(CliError::Refused(format!("{label}: the pod is refused ({})", reason.as_str())))
        }
        sidecar_injector_core::Verdict::Incomplete { refused: true, .. } => {
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

/// The human-readable account of a decision, from the outcome's facts.
fn explain(engine: &sidecar_injector_core::Engine, outcome: &Outcome) -> String {
    let trace = outcome.trace.clone().unwrap_or_default();
    let mut text = match outcome.verdict {
        // A preview's pods are named in its warnings, each with its workload.
        Verdict::Previewed { .. } => String::new(),
        _ => format!("pod: {}\n", trace.pod.as_deref().unwrap_or("-")),
    };
    if let Some(template) = &outcome.template {
        text.push_str(&format!(
            "template: {} (version {}, set {})\n",
            template.name,
            template.version,
            engine.set().hash()
        ));
    }
    let message = outcome.message.as_deref().unwrap_or_default();
    match outcome.verdict {
        Verdict::Injected { ops } => {
            text.push_str(&format!("decision: injected, {ops} add operation(s)\npatch:\n"));
            // The patch is our own JSON: it reads back as JSON.
            let patch: serde_json::Value = serde_json::from_slice(trace.patch.as_deref().unwrap_or(b"[]"))
                .expect("the engine writes a JSON patch");
            text.push_str(&serde_json::to_string_pretty(&patch).expect("a JSON value serialises"));
            text.push('\n');
        }
        Verdict::Skipped(reason) => {
            let why = outcome.skip_explanation().unwrap_or_default();
            text.push_str(&format!("decision: not injected ({}): {why}\n", reason.as_str()));
        }
        Verdict::Denied(reason) => {
            text.push_str(&format!("decision: refused ({}): {message}\n", reason.as_str()));
        }
        Verdict::Complete => text.push_str("validation: complete, the pod has everything its template injects\n"),
        Verdict::Incomplete { missing, refused: true } => {
            text.push_str(&format!("validation: refused, {missing} missing part(s): {message}\n"));
        }
        Verdict::Incomplete { missing, refused: false } => {
            text.push_str(&format!("validation: admitted with a warning, {missing} missing part(s)\n"));
        }
        Verdict::Previewed { templates, .. } => {
            text.push_str(&format!("preview: {templates} pod template(s) injected as their pods would be\n"));
        } // The CLI's sets assemble combinations as they are asked for: never pending.
    }
    for warning in &outcome.warnings {
        text.push_str(&format!("warning: {warning}\n"));
    }
    text
}
