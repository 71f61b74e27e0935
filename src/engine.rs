//! The engine: `AdmissionReview` bytes in, response bytes out. Pure (no I/O, no locks, no logging above debug),
//! so the server, the `review` command and the tests all run exactly the same code.

use std::cell::RefCell;
use std::ops::Range;

use simd_json::{Buffers, Tape};

use crate::decision::{self, Keys, SkipReason};
use crate::patch::Pointer;
use crate::pod::PodView;
use crate::review::{self, ApiVersion, ReviewError};
use crate::template::tree::Rendered;
use crate::template::{LeafCache, PodContext, Policy, SelectError, Template, TemplateSet, Validation};
use crate::validation::KubeVersion;
use crate::{merge, response, validate};

/// What the engine decided for one review. The response bytes are in the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The version the review arrived (and was answered) in.
    pub version: ApiVersion,
    /// Injected, skipped or denied, with a reason.
    pub verdict: Verdict,
    /// Warnings sent back to the user (kubectl prints them).
    pub warnings: Vec<String>,
}

/// The engine's verdict on one review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A patch with this many `add` operations was sent.
    Injected {
        /// Number of patch operations.
        ops: usize,
    },
    /// Allowed without a patch.
    Skipped(SkipReason),
    /// Refused, because injection could not proceed and the error policy says `deny`.
    Denied(SkipReason),
    /// Validation: the pod has everything its template injects.
    Complete,
    /// Validation: the pod lacks what this many patch operations would add. It was refused, or admitted with a
    /// warning, as the template's validation policy says.
    Incomplete {
        /// Number of patch operations injection would still make.
        missing: usize,
        /// Whether the pod was refused (policy `deny`) rather than warned about.
        refused: bool,
    },
}

/// What the engine is asked: to inject (`/mutate`) or to check that injection is complete (`/validate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Mutate,
    Validate,
}

/// How far [`Engine::review_until`] runs a request; each stage includes those before it. The stages stream into
/// each other (the patch is base64-encoded into the response as it is written), so a stage's own cost is the
/// difference between two prefixes. For the per-stage benchmarks (`benches/engine.rs`).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// simd-json's tape of the request.
    Parse,
    /// The review's fields (uid, kind, operation, object) read from the tape.
    Read,
    /// Inject or skip: the pod's metadata read, the template selected, the injection checks made.
    Decide,
    /// The per-pod leaves of the template rendered.
    Render,
    /// The add-only merge written as a JSON Patch into a plain buffer.
    Merge,
    /// Everything: the patch written as base64 into the response.
    Respond,
}

/// Engine settings that are not part of a template.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The annotation prefix, e.g. `sidecar-injector.io/`.
    pub annotation_prefix: String,
    /// What to do with a pod whose injection cannot be rendered, unless its template says otherwise.
    pub on_error: Policy,
    /// What to do with a pod that names a template the set does not have.
    pub on_unknown_template: Policy,
    /// What `/validate` answers for an incompletely injected pod, unless its template says otherwise.
    pub validation: Validation,
    /// The Kubernetes version the injected pods are validated for (templates at load, overrides per pod).
    pub kubernetes_version: KubeVersion,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            annotation_prefix: crate::template::DEFAULT_PREFIX.to_owned(),
            on_error: Policy::Allow,
            on_unknown_template: Policy::Allow,
            validation: Validation::Deny,
            kubernetes_version: KubeVersion::DEFAULT,
        }
    }
}

/// The injection engine over one template set: the snapshot a request uses from start to end.
#[derive(Debug)]
pub struct Engine {
    set: TemplateSet,
    keys: Keys,
    settings: Settings,
}

/// Per-thread buffers reused across requests, so that a request allocates (almost) nothing.
struct Scratch {
    buffers: Buffers,
    /// Always empty between requests; `reset` gives it the lifetime of the next request's buffer.
    tape: Option<Tape<'static>>,
    work: Work,
}

/// The scratch space of the stages after parsing.
#[derive(Default)]
struct Work {
    /// Rendered per-pod leaves: slot `i` is `rendered[ranges[i]]`.
    rendered: Vec<u8>,
    ranges: Vec<Range<usize>>,
    /// The pod's valid overrides.
    overrides: Vec<(String, serde_json::Value)>,
    /// The JSON Pointer of the node being merged.
    path: Pointer,
    /// Patch bytes waiting for base64 encoding.
    staged: Vec<u8>,
    /// Recently rendered pod contexts.
    leaf_cache: LeafCache,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        buffers: Buffers::with_max_depth(16 * 1024, review::MAX_DEPTH),
        tape: Some(Tape::null()),
        work: Work::default(),
    });
}

/// The spare capacity a request body should have beyond its length: the engine appends this many bytes for
/// simd-json to parse the body in place, which reallocates (copies) the body if its capacity is short.
pub const PARSE_PADDING: usize = simd_json::INPUT_PADDING;

/// Status code of a refusal: the pod as sent cannot be injected.
const DENY_CODE: u16 = 400;
/// Status code of a validation refusal: the pod is well-formed but lacks what policy requires.
const INCOMPLETE_CODE: u16 = 403;

/// How injection of one pod could not proceed.
struct Failure {
    reason: SkipReason,
    policy: Policy,
    message: String,
}

impl Engine {
    /// An engine injecting from `set` (a [`TemplateSet`], or a single [`Template`]).
    pub fn new(set: impl Into<TemplateSet>, settings: &Settings) -> Self {
        Engine { set: set.into(), keys: Keys::new(&settings.annotation_prefix), settings: settings.clone() }
    }

    /// The template set this engine injects from.
    pub fn set(&self) -> &TemplateSet {
        &self.set
    }

    /// The template of pods that do not name one.
    pub fn template(&self) -> &Template {
        self.set.default_template()
    }

    /// The settings this engine was built with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Reviews one `AdmissionReview`. `body` is parsed in place (its contents are garbage afterwards; see
    /// [`PARSE_PADDING`] for its capacity) and the response is written to `out`. An `Err` means the body is not a
    /// readable review: answer 400.
    pub fn review(&self, body: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<Outcome, ReviewError> {
        // With `Stage::Respond` every stage runs and `run` always returns an outcome.
        self.run(body, out, Stage::Respond, Mode::Mutate)
            .map(|outcome| outcome.expect("the last stage returns an outcome"))
    }

    /// Validates one `AdmissionReview` (`/validate`): the pod is allowed if injecting it again would add nothing;
    /// otherwise it is refused, or admitted with a warning, naming what is missing. Everything `review` skips is
    /// allowed. Same buffers and errors as [`Engine::review`].
    pub fn validate(&self, body: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<Outcome, ReviewError> {
        // As in `review`: the last stage always returns an outcome.
        self.run(body, out, Stage::Respond, Mode::Validate)
            .map(|outcome| outcome.expect("the last stage returns an outcome"))
    }

    /// Runs `body` through the stages up to `until` (see [`Stage`]): what the per-stage benchmarks measure.
    #[doc(hidden)]
    pub fn review_until(&self, body: &mut Vec<u8>, out: &mut Vec<u8>, until: Stage) -> Result<(), ReviewError> {
        self.run(body, out, until, Mode::Mutate).map(drop)
    }

    fn run(
        &self,
        body: &mut Vec<u8>,
        out: &mut Vec<u8>,
        until: Stage,
        mode: Mode,
    ) -> Result<Option<Outcome>, ReviewError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(ReviewError::Empty);
        }
        let len = body.len();
        // simd-json reads in 64-byte blocks; given the padding past the document, it parses the body where it
        // is instead of first copying it into a padded buffer of its own.
        body.resize(len + PARSE_PADDING, b' ');
        let result = SCRATCH.with(|scratch| {
            // Only this synchronous call borrows the thread's scratch, so the borrow cannot be held twice.
            let mut scratch = scratch.borrow_mut();
            let Scratch { buffers, tape: tape_slot, work } = &mut *scratch;
            let mut tape = tape_slot.take().unwrap_or_else(Tape::null).reset();
            let result = match simd_json::fill_tape_padded(body, len, buffers, &mut tape) {
                Ok(()) if until == Stage::Parse => Ok(None),
                Ok(()) => self.answer(tape.as_value(), work, out, until, mode),
                Err(e) => Err(ReviewError::json(&e)),
            };
            *tape_slot = Some(tape.reset());
            result
        });
        body.truncate(len);
        result
    }

    fn answer(
        &self,
        root: simd_json::tape::Value<'_, '_>,
        work: &mut Work,
        out: &mut Vec<u8>,
        until: Stage,
        mode: Mode,
    ) -> Result<Option<Outcome>, ReviewError> {
        let review = review::read(root)?;
        if until == Stage::Read {
            return Ok(None);
        }
        response::open(out, review.version, review.uid);
        let mut warnings = Vec::new();
        let pod = match decision::decide(&review, &self.keys) {
            Ok(pod) => pod,
            Err(reason) => {
                response::allow(out);
                response::close(out, &warnings, None);
                return Ok(Some(Outcome { version: review.version, verdict: Verdict::Skipped(reason), warnings }));
            }
        };
        let (verdict, template) = match self.set.select(pod.annotation(&self.keys.template)) {
            Ok(template) => match self.inject(&template, &pod, work, out, &mut warnings, until, mode) {
                Some(verdict) => (verdict, Some(template)),
                None => return Ok(None),
            },
            Err(e) => (self.fail(self.unknown_template(&pod, e), out, &mut warnings), None),
        };
        // The audit log records which template and version were applied (or failed to apply) to the pod.
        let applied = matches!(
            verdict,
            Verdict::Injected { .. }
                | Verdict::Complete
                | Verdict::Incomplete { .. }
                | Verdict::Skipped(SkipReason::AlreadyInjected | SkipReason::RenderFailed)
                | Verdict::Denied(SkipReason::RenderFailed)
        );
        let audit = template.as_ref().filter(|_| applied).map(|t| t.audit_json());
        response::close(out, &warnings, audit);
        Ok(Some(Outcome { version: review.version, verdict, warnings }))
    }

    /// Injects `template` into `pod` if it takes it: renders the per-pod leaves and writes the patch (or, when
    /// validating, judges the pod by it). `None` when `until` stops it first.
    #[allow(clippy::too_many_arguments)] // The stages' shared state, passed down rather than bundled for one call.
    fn inject(
        &self,
        template: &Template,
        pod: &PodView<'_, '_>,
        work: &mut Work,
        out: &mut Vec<u8>,
        warnings: &mut Vec<String>,
        until: Stage,
        mode: Mode,
    ) -> Option<Verdict> {
        if let Err(reason) = decision::admits(pod, &self.keys, template) {
            if reason == SkipReason::InjectedByOtherVersion {
                warnings.push(self.other_version_warning(pod, template));
            }
            response::allow(out);
            return Some(Verdict::Skipped(reason));
        }
        let Work { rendered, ranges, overrides, path, staged, leaf_cache } = work;
        overrides.clear();
        if !template.overrides.is_empty() {
            self.read_overrides(template, pod, overrides, warnings);
        }
        self.unknown_annotations(template, pod, warnings);
        if until == Stage::Decide {
            return None;
        }
        if template.renders_per_pod() {
            let context = PodContext {
                name: pod.name(),
                generate_name: pod.generate_name(),
                namespace: pod.namespace(),
                service_account_name: pod.service_account_name(),
                labels: pod.labels(template.needs_labels()),
                annotations: pod.annotations(template.needs_annotations()),
            };
            if !overrides.is_empty() {
                template.vet_overrides(&context, overrides, warnings);
            }
            if let Err(e) = template.render(&context, overrides, Some(leaf_cache), rendered, ranges) {
                let failure = self.leaf_failure(template, e.slot, pod, "failed to render", &e.reason);
                return Some(self.fail(failure, out, warnings));
            }
        }
        let slots = Rendered { buf: rendered, ranges };
        if let Err((slot, error)) = template.check_leaves(slots) {
            let what = "rendered a value the API server would refuse";
            return Some(self.fail(self.leaf_failure(template, slot, pod, what, &error), out, warnings));
        }
        let overridden = !overrides.is_empty();
        if mode == Mode::Validate {
            staged.clear();
            let missing = merge::merge(template, overridden, pod, slots, path, staged);
            return Some(self.judge(template, pod, missing, staged, out, warnings));
        }
        match until {
            Stage::Render => return None,
            Stage::Merge => {
                staged.clear();
                merge::merge(template, overridden, pod, slots, path, staged);
                return None;
            }
            _ => {}
        }
        response::allow(out);
        Some(match response::patch(out, staged, |sink| merge::merge(template, overridden, pod, slots, path, sink)) {
            0 => Verdict::Skipped(SkipReason::AlreadyInjected),
            ops => Verdict::Injected { ops },
        })
    }

    /// Answers a validation: complete pods are allowed; an incomplete one is refused or warned about, as the
    /// template (or the server) says, naming what is missing. `patch` is the JSON Patch injection would send.
    fn judge(
        &self,
        template: &Template,
        pod: &PodView<'_, '_>,
        missing: usize,
        patch: &[u8],
        out: &mut Vec<u8>,
        warnings: &mut Vec<String>,
    ) -> Verdict {
        if missing == 0 {
            response::allow(out);
            return Verdict::Complete;
        }
        let message = format!(
            "sidecar-injector: pod {} lacks what template {} (version {}) injects: {}",
            pod.display_name(),
            template.name(),
            template.hash(),
            validate::describe_missing(pod, patch)
        );
        match template.validation().unwrap_or(self.settings.validation) {
            Validation::Deny => {
                response::deny(out, INCOMPLETE_CODE, &message);
                Verdict::Incomplete { missing, refused: true }
            }
            Validation::Warn => {
                response::allow(out);
                warnings.push(message);
                Verdict::Incomplete { missing, refused: false }
            }
        }
    }

    /// The pod's valid overrides of the template's values, in one pass over its annotations; a warning for
    /// each invalid one.
    fn read_overrides(
        &self,
        template: &Template,
        pod: &PodView<'_, '_>,
        overrides: &mut Vec<(String, serde_json::Value)>,
        warnings: &mut Vec<String>,
    ) {
        let prefix = self.settings.annotation_prefix.as_str();
        for (key, raw) in pod.annotation_entries().filter(|(key, _)| key.starts_with(prefix)) {
            let Some(spec) = template.overrides.iter().find(|s| s.annotation == key) else { continue };
            match spec.accept(raw) {
                Ok(value) => overrides.push((spec.value.clone(), value)),
                Err(reason) => warnings.push(format!(
                    "sidecar-injector: annotation {key}={:?} refused: the value {reason}; the template's value is used",
                    shorten(raw)
                )),
            }
        }
    }

    /// A per-pod leaf of `template` that cannot be injected into `pod`: the template's error policy decides.
    #[cold]
    fn leaf_failure(
        &self,
        template: &Template,
        slot: usize,
        pod: &PodView<'_, '_>,
        what: &str,
        why: &dyn std::fmt::Display,
    ) -> Failure {
        Failure {
            reason: SkipReason::RenderFailed,
            policy: template.on_error().unwrap_or(self.settings.on_error),
            message: format!(
                "template {} field {} {what} for pod {}: {why}",
                template.name(),
                template.slot_path(slot),
                pod.display_name()
            ),
        }
    }

    /// A warning for each annotation under our prefix that nothing reads: neither the injector's own, nor an
    /// override of `template`, nor one the template injects. A misspelt override is otherwise ignored in silence.
    fn unknown_annotations(&self, template: &Template, pod: &PodView<'_, '_>, warnings: &mut Vec<String>) {
        let prefix = self.settings.annotation_prefix.as_str();
        for (key, _) in pod.annotation_entries() {
            if !key.starts_with(prefix) || self.keys.is_own(key) || template.reads_or_writes_annotation(key) {
                continue;
            }
            warnings.push(self.unknown_annotation_warning(template, key));
        }
    }

    #[cold]
    fn unknown_annotation_warning(&self, template: &Template, key: &str) -> String {
        let known: Vec<&str> = self.keys.own().chain(template.annotations_read_or_written()).collect();
        let closest = known
            .iter()
            .map(|k| (strsim::levenshtein(k, key), *k))
            .filter(|(distance, _)| *distance <= 2)
            .min()
            .map(|(_, k)| k);
        match closest {
            Some(closest) => format!(
                "sidecar-injector: annotation {} is not one the injector reads (did you mean {closest}?); it is ignored",
                shorten(key)
            ),
            None => format!(
                "sidecar-injector: annotation {} is not one the injector reads for template {} (known: {}); it is ignored",
                shorten(key),
                template.name(),
                known.join(", ")
            ),
        }
    }

    /// Answers a pod whose injection cannot proceed, as the policy says: admitted without the sidecar and with
    /// a warning, or refused with the reason.
    fn fail(&self, failure: Failure, out: &mut Vec<u8>, warnings: &mut Vec<String>) -> Verdict {
        match failure.policy {
            Policy::Allow => {
                response::allow(out);
                warnings.push(format!("sidecar-injector: admitted without the sidecar: {}", failure.message));
                Verdict::Skipped(failure.reason)
            }
            Policy::Deny => {
                response::deny(out, DENY_CODE, &format!("sidecar-injector: {}", failure.message));
                Verdict::Denied(failure.reason)
            }
        }
    }

    fn unknown_template(&self, pod: &PodView<'_, '_>, error: SelectError) -> Failure {
        let problem = match error {
            SelectError::Unknown(names) => {
                format!("no template named {} (known: {})", names.join(", "), self.set.names())
            }
            SelectError::Combination(reason) => format!("the templates cannot be combined: {reason}"),
        };
        Failure {
            reason: SkipReason::UnknownTemplate,
            policy: self.settings.on_unknown_template,
            message: format!(
                "pod {} asks for {}={:?}: {problem}",
                pod.display_name(),
                self.keys.template,
                shorten(pod.annotation(&self.keys.template).unwrap_or(""))
            ),
        }
    }

    fn other_version_warning(&self, pod: &PodView<'_, '_>, template: &Template) -> String {
        let status = pod.annotation(&self.keys.status).unwrap_or("");
        format!(
            "sidecar-injector: pod already carries a sidecar from another template version ({}); not injected again (current: template {} version {})",
            shorten(status),
            template.name(),
            template.hash()
        )
    }
}

/// A user-supplied value cut to a length fit for a one-line message.
fn shorten(value: &str) -> &str {
    const MAX: usize = 120;
    if value.len() <= MAX {
        return value;
    }
    let mut end = MAX;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}
