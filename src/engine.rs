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
use crate::template::{LeafCache, PodContext, Template};
use crate::{merge, response};

/// What the engine decided for one review. The response bytes are in the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The version the review arrived (and was answered) in.
    pub version: ApiVersion,
    /// Injected, or skipped with a reason.
    pub verdict: Verdict,
    /// Warnings sent back to the user (kubectl prints them).
    pub warnings: Vec<String>,
}

/// The engine's verdict on one review. Every request is allowed: the engine mutates, it does not police.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A patch with this many `add` operations was sent.
    Injected {
        /// Number of patch operations.
        ops: usize,
    },
    /// Allowed without a patch.
    Skipped(SkipReason),
}

/// Engine settings that are not part of a template.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The annotation prefix, e.g. `sidecar-injector.io/`.
    pub annotation_prefix: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { annotation_prefix: crate::template::DEFAULT_PREFIX.to_owned() }
    }
}

/// The injection engine for one template.
#[derive(Debug)]
pub struct Engine {
    template: Template,
    keys: Keys,
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
    /// Rendered pod-dependent leaves: slot `i` is `rendered[ranges[i]]`.
    rendered: Vec<u8>,
    ranges: Vec<Range<usize>>,
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

impl Engine {
    /// An engine injecting `template`.
    pub fn new(template: Template, settings: &Settings) -> Self {
        Engine { template, keys: Keys::new(&settings.annotation_prefix) }
    }

    /// The template this engine injects.
    pub fn template(&self) -> &Template {
        &self.template
    }

    /// Reviews one `AdmissionReview`. `body` is parsed in place (its contents are garbage afterwards) and the
    /// response is written to `out`. An `Err` means the body is not a readable review: answer 400.
    pub fn review(&self, body: &mut [u8], out: &mut Vec<u8>) -> Result<Outcome, ReviewError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(ReviewError::Empty);
        }
        SCRATCH.with(|scratch| {
            // Only this synchronous call borrows the thread's scratch, so the borrow cannot be held twice.
            let mut scratch = scratch.borrow_mut();
            let Scratch { buffers, tape: tape_slot, work } = &mut *scratch;
            let mut tape = tape_slot.take().unwrap_or_else(Tape::null).reset();
            let result = match simd_json::fill_tape(body, buffers, &mut tape) {
                Ok(()) => self.answer(tape.as_value(), work, out),
                Err(e) => Err(ReviewError::json(&e)),
            };
            *tape_slot = Some(tape.reset());
            result
        })
    }

    fn answer(
        &self,
        root: simd_json::tape::Value<'_, '_>,
        work: &mut Work,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, ReviewError> {
        let review = review::read(root)?;
        response::open(out, review.version, review.uid);
        let mut warnings = Vec::new();
        let verdict = match decision::decide(&review, &self.keys, &self.template) {
            Ok(pod) => self.inject(&pod, work, out, &mut warnings),
            Err(reason) => {
                if reason == SkipReason::InjectedByOtherVersion {
                    warnings.push(self.other_version_warning(&review));
                }
                Verdict::Skipped(reason)
            }
        };
        response::close(out, &warnings);
        Ok(Outcome { version: review.version, verdict, warnings })
    }

    /// Renders the pod-dependent leaves and writes the patch into the response.
    fn inject(&self, pod: &PodView<'_, '_>, work: &mut Work, out: &mut Vec<u8>, warnings: &mut Vec<String>) -> Verdict {
        let template = &self.template;
        let Work { rendered, ranges, path, staged, leaf_cache } = work;
        if !template.renderer.is_empty() {
            let context = PodContext {
                name: pod.name(),
                generate_name: pod.generate_name(),
                namespace: pod.namespace(),
                service_account_name: pod.service_account_name(),
                labels: pod.labels(template.renderer.needs_labels()),
                annotations: pod.annotations(template.renderer.needs_annotations()),
            };
            if let Err(e) = template.renderer.render_cached(&context, leaf_cache, rendered, ranges) {
                warnings.push(format!(
                    "sidecar-injector: pod {} admitted without its sidecar: template {} field {} failed to render: {}",
                    pod.display_name(),
                    template.name(),
                    template.slot_path(e.slot),
                    e.reason
                ));
                return Verdict::Skipped(SkipReason::RenderFailed);
            }
        }
        let slots = Rendered { buf: rendered, ranges };
        match response::patch(out, staged, |sink| merge::merge(template, pod, slots, path, sink)) {
            0 => Verdict::Skipped(SkipReason::AlreadyInjected),
            ops => Verdict::Injected { ops },
        }
    }

    fn other_version_warning(&self, review: &review::Review<'_, '_>) -> String {
        let status = review.object.and_then(|o| PodView::new(o, "").annotation(&self.keys.status)).unwrap_or("");
        format!(
            "sidecar-injector: pod already carries a sidecar from another template version ({status}); not injected again (current: template {} version {})",
            self.template.name(),
            self.template.hash()
        )
    }
}
