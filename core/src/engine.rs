//! The engine: `AdmissionReview` bytes in, response bytes out. Pure (no I/O, no locks, no logging above debug),
//! so the server, the `review` command and the tests all run exactly the same code.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use simd_json::prelude::ValueIntoString;
use simd_json::{Buffers, Tape};

use crate::decision::{self, SkipReason};
use crate::patch::{Base64Sink, Pointer, Tee};
use crate::pod::PodView;
use crate::review::{self, ApiVersion, Review, ReviewError};
use crate::settings::{Keys, Policy, Settings, Validation};
use crate::template::tree::Rendered;
use crate::template::{LeafCache, NATIVE_SIDECAR_MINOR, Tag, Template, TemplateId};
use crate::template_set::{OnDemand, SelectError, Selection, Serving, TemplateSet};
use crate::validation::{self, FieldError};
use crate::{merge, missing, response};

/// What the engine decided for one review, as facts: callers (the server's metrics, `review --explain`,
/// `inject`, the tests) read these instead of the response bytes, which are in the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The version the review arrived (and was answered) in.
    pub version: ApiVersion,
    /// Injected, skipped or denied, with a reason.
    pub verdict: Verdict,
    /// Warnings sent back to the user (kubectl prints them).
    pub warnings: Vec<String>,
    /// The template that was applied to the pod, or failed to apply: what the response's audit annotations name.
    /// `None` when no template was applied (the pod was not one to inject, or named an unknown template).
    pub template: Option<Arc<TemplateId>>,
    /// The refusal's message, as the response's `status.message` carries it.
    pub message: Option<String>,
    /// Validation: what the pod lacks of its injection, one thing each (`container proxy`, `volume data`).
    pub missing: Vec<String>,
    /// With [`Engine::trace`] only: the pod's name and the patch as plain JSON.
    pub trace: Option<Trace>,
    /// Why the pod was not injected, where the reason's own sentence is not the cause: a Job's pod left out because
    /// the Kubernetes version has no native sidecars, not by its template's `jobs` setting.
    pub because: Option<String>,
    /// With [`Engine::answer_call`] and [`Call::subject`] only, for an outcome that [`Outcome::deserves_event`] of a review that
    /// is not a dry run: what a Kubernetes Event about it regards.
    pub subject: Option<Subject>,
}

/// The object a Kubernetes Event about a pod's admission regards (`serve --events`): the pod's controller (its
/// ReplicaSet, Job, StatefulSet, ...), whose `kubectl describe` shows it, or else the pod by name (a pod under
/// admission has no uid yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// The pod's namespace (the request's, when the pod names none).
    pub namespace: String,
    /// The pod's name, or its `generateName`.
    pub pod: String,
    /// The pod's controller: `apiVersion`, `kind`, `name`, `uid`.
    pub controller: Option<[String; 4]>,
}

impl Subject {
    fn of(pod: &PodView<'_, '_>) -> Subject {
        let name = if pod.name().is_empty() { pod.generate_name() } else { pod.name() };
        Subject {
            namespace: pod.namespace().to_owned(),
            pod: name.to_owned(),
            controller: pod.controller().map(|fields| fields.map(str::to_owned)),
        }
    }
}

/// What [`Engine::trace`] adds to an outcome, for people reading a decision (`review --explain`, `inject`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// The pod as messages name it: `namespace/name`, `namespace/generateName*` or `namespace/<unnamed>`.
    pub pod: Option<String>,
    /// The JSON Patch that was sent (the response carries it in base64), when one was.
    pub patch: Option<Vec<u8>>,
}

impl Outcome {
    pub(crate) fn new(version: ApiVersion, trace: bool) -> Self {
        Outcome {
            version,
            verdict: Verdict::Skipped(SkipReason::NotAPod),
            warnings: Vec::new(),
            template: None,
            message: None,
            missing: Vec::new(),
            trace: trace.then(Trace::default),
            because: None,
            subject: None,
        }
    }

    /// Why a skipped pod was not injected, for people: the cause when the engine knows it
    /// ([`Outcome::because`]), or else the reason's sentence. `None` for a pod that was not skipped.
    pub fn skip_explanation(&self) -> Option<String> {
        match self.verdict {
            Verdict::Skipped(reason) => Some(self.because.clone().unwrap_or_else(|| reason.explain().to_owned())),
            _ => None,
        }
    }

    /// Is this an outcome a Kubernetes Event is published for (`serve --events`)? A pod injected, a pod refused,
    /// and a pod admitted without the sidecar for a reason its owner would not expect: a template it names that
    /// cannot serve it (unknown, not combinable, too new, failing to render), a conflict with the pod, a Windows
    /// pod, a Job's pod on a cluster without native sidecars. Not the pods the rules leave out as asked (opted
    /// out, already injected, not a pod).
    pub fn deserves_event(&self) -> bool {
        match self.verdict {
            Verdict::Injected { .. } | Verdict::Denied(_) => true,
            Verdict::Skipped(reason) => reason.is_failure() || reason == SkipReason::Windows || self.because.is_some(),
            _ => false,
        }
    }
}

/// What a server knows of a call beyond its body ([`Engine::answer_call`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Call<'a> {
    /// The revision tag whose webhook made the call (its path names it): a pod injected through it says so in its
    /// status annotation.
    pub tag: Option<&'a Tag>,
    /// Give an outcome that [`Outcome::deserves_event`] its [`Subject`] (a server that publishes Events).
    pub subject: bool,
}

/// What an outcome carries beyond the verdict: nothing (the request path), a [`Trace`], or a [`Subject`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extras {
    None,
    Trace,
    Subject,
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
    /// Preview (`/preview`): the workload is admitted, with a warning (in [`Outcome::warnings`]) for each thing
    /// that would go wrong for its pods.
    Previewed {
        /// The pod templates injected for the preview: 0 when the object was not one to preview.
        templates: usize,
        /// A pod template names a template the set does not have (perhaps one an edit has just added).
        unknown_template: bool,
    },
}

impl Verdict {
    /// Why a pod was skipped or refused; `None` for the other verdicts.
    pub fn reason(self) -> Option<SkipReason> {
        match self {
            Verdict::Skipped(reason) | Verdict::Denied(reason) => Some(reason),
            _ => None,
        }
    }

    /// Did the pod (or, in a preview, a pod template) name a template the set does not have? A replica whose
    /// template volume is behind its ConfigMap reads the ConfigMap for it, and answers again.
    pub fn names_unknown_template(self) -> bool {
        match self {
            Verdict::Previewed { unknown_template, .. } => unknown_template,
            _ => self.reason() == Some(SkipReason::UnknownTemplate),
        }
    }
}

/// What the engine is asked: to inject (`/mutate`) or to check that injection is complete (`/validate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Inject: answer with the patch.
    Mutate,
    /// Validate: admit the pod if injecting it again would add nothing.
    Validate,
}

/// How far [`Engine::review_until`] runs a request; each stage includes those before it. The stages stream into
/// each other (the patch is base64-encoded into the response as it is written), so a stage's own cost is the
/// difference between two prefixes. For the per-stage benchmarks (`benches/engine.rs`).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// simd-json's tape of the request, unchecked.
    Tape,
    /// The tape, and the one-reading check (no key twice in an object).
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

/// How long after a template first reaches this replica (a ConfigMap edit that adds it) `/validate` admits,
/// with a warning, a pod that no replica injected with it: the kubelet updates each pod's ConfigMap volume on its
/// own sync (every minute by default, plus its cache's delay), so for about that long another replica may answer
/// the mutating call without the template. docs/operations.md, "Changing templates in a running cluster".
pub const TEMPLATE_ROLLOUT_GRACE: std::time::Duration = std::time::Duration::from_secs(120);

/// The injection engine over one template set: the snapshot a request uses from start to end, with what it is
/// served with (its combinations, its templates' arrivals: [`Serving`]).
#[derive(Debug)]
pub struct Engine {
    set: TemplateSet,
    serving: Arc<dyn Serving>,
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
pub(crate) struct Work {
    /// Rendered per-pod leaves: slot `i` is `rendered[ranges[i]]`.
    rendered: Vec<u8>,
    ranges: Vec<Range<usize>>,
    /// The pod's valid overrides.
    overrides: Vec<(String, serde_json::Value)>,
    /// The JSON Pointer of the node being merged.
    path: Pointer,
    /// Patch bytes waiting for base64 encoding.
    staged: Vec<u8>,
    /// The response's patch as base64, when a check's merge wrote it (`Work::merge_for_response`), and the
    /// scratch of its encoding.
    encoded: Vec<u8>,
    encoding: Vec<u8>,
    /// Recently rendered pod contexts.
    leaf_cache: LeafCache,
    /// The last per-pod values judged whole and found valid (`Template::check_rendered`), and the template they
    /// were judged for: a pod that renders the same values again (a cached render) is not judged again.
    judged: Vec<u8>,
    judged_for: Option<Arc<TemplateId>>,
    /// The status annotation of a call through a revision tag's webhook (a JSON string); empty for any other call.
    stamp: Vec<u8>,
}

impl Work {
    /// Writes the patch that merges `template` into `pod`, with the leaves rendered for it, as plain JSON into
    /// `staged`; returns its number of operations. `observer` sees each one.
    fn merge<'m>(
        &mut self,
        template: &'m Template,
        overridden: bool,
        pod: &PodView<'_, '_>,
        observer: &mut impl merge::Observer<'m>,
    ) -> usize {
        let Work { rendered, ranges, path, staged, stamp, .. } = self;
        staged.clear();
        let slots = Rendered { buf: rendered, ranges, stamp: (!stamp.is_empty()).then_some(stamp) };
        merge::merge(template, overridden, pod, slots, path, staged, observer)
    }

    /// [`Work::merge`], which also writes the patch as the response sends it, base64-encoded, into `encoded`: for a
    /// check that reads the patch, so that the response need not merge again.
    fn merge_for_response(&mut self, template: &Template, overridden: bool, pod: &PodView<'_, '_>) -> usize {
        let Work { rendered, ranges, path, staged, encoded, encoding, stamp, .. } = self;
        staged.clear();
        encoded.clear();
        let slots = Rendered { buf: rendered, ranges, stamp: (!stamp.is_empty()).then_some(stamp) };
        let mut base64 = Base64Sink::new(encoded, encoding);
        let ops = merge::merge(template, overridden, pod, slots, path, &mut Tee(staged, &mut base64), &mut ());
        base64.finish();
        ops
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        buffers: parser_buffers(),
        tape: Some(Tape::null()),
        work: Work::default(),
    });
}

/// simd-json's buffers for a new thread, or after a large body.
fn parser_buffers() -> Buffers {
    Buffers::with_max_depth(16 * 1024, review::MAX_DEPTH)
}

/// A body larger than this gives its parser buffers back when it is done: they grow to about 16 bytes per byte
/// of body (a 4 MiB list of numbers takes ~65 MiB), which a worker should not keep after one such request.
/// Reviews of real pods (a few KiB, rarely 100 KiB) keep theirs, so that they allocate nothing.
const KEEP_PARSER_BUFFERS_UP_TO: usize = 1024 * 1024;

/// The spare capacity a request body should have beyond its length: the engine appends this many bytes for
/// simd-json to parse the body in place, which reallocates (copies) the body if its capacity is short.
pub const PARSE_PADDING: usize = simd_json::INPUT_PADDING;

/// Status code of a refusal: the pod as sent cannot be injected.
const DENY_CODE: u16 = 400;
/// Status code of a validation refusal: the pod is well-formed but lacks what policy requires.
const INCOMPLETE_CODE: u16 = 403;

/// What the response will say, decided before a byte of it is written.
enum Decision<'d> {
    /// Admitted as it is.
    Allow(Verdict),
    /// Admitted with the patch that merges the template into the pod: written straight into the response, as
    /// base64, so its verdict (injected, or already injected) is known once it is written.
    /// `written` is the number of operations of the patch when a check already wrote it as the response sends it
    /// (`Work::merge_for_response`: a pod near the annotations' total), rather than merging again.
    Patch { template: Selection<'d>, pod: &'d PodView<'d, 'd>, overridden: bool, written: Option<usize> },
    /// Refused with this status code; the message is the outcome's.
    Deny { verdict: Verdict, code: u16 },
}

/// How injection of one pod could not proceed.
struct Failure {
    reason: SkipReason,
    policy: Policy,
    message: String,
}

/// The pod as JSON and the pod with `template` merged in, for the rare checks that judge the injected pod whole
/// (off the request path's common case): the merge's own patch, applied. `None` when the merge adds nothing (the
/// two would be the same) or the patch does not apply.
#[cold]
fn injected_pod(
    template: &Template,
    pod: &PodView<'_, '_>,
    overridden: bool,
    work: &mut Work,
) -> Option<(serde_json::Value, serde_json::Value)> {
    if work.merge(template, overridden, pod, &mut ()) == 0 {
        return None;
    }
    let original = pod.to_json();
    let injected = crate::patch::apply(&original, &work.staged).ok()?;
    Some((original, injected))
}

impl Engine {
    /// An engine injecting from `set`, its combinations assembled where they are first asked for ([`OnDemand`]).
    pub fn new(set: TemplateSet, settings: &Settings) -> Self {
        Engine::serving(set, settings, Arc::new(OnDemand::default()))
    }

    /// An engine injecting from `set`, served with `serving` (the server's: combinations assembled off its async
    /// workers, arrivals carried over reloads).
    pub fn serving(set: TemplateSet, settings: &Settings, serving: Arc<dyn Serving>) -> Self {
        Engine { set, serving, keys: Keys::new(&settings.annotation_prefix), settings: settings.clone() }
    }

    /// This engine, served with `serving` instead.
    pub fn with_serving(self, serving: Arc<dyn Serving>) -> Self {
        Engine { serving, ..self }
    }

    /// The template set this engine injects from.
    pub fn set(&self) -> &TemplateSet {
        &self.set
    }

    /// What the set is served with.
    pub fn served_with(&self) -> &dyn Serving {
        &*self.serving
    }

    /// Did one of the templates named `names` (`a` or `a,b`) reach this process by a reload less than `grace`
    /// ago? While a ConfigMap edit rolls through the replicas (the kubelet updates each pod's volume within about
    /// a minute), another replica may not have such a template yet, so a pod without it may have been admitted by
    /// a replica that could not inject it.
    fn arrived_within(&self, names: &str, grace: std::time::Duration) -> bool {
        names.split(',').any(|name| self.serving.arrived(name.trim()).is_some_and(|at| at.elapsed() < grace))
    }

    /// The template(s) a pod's template annotation names, as a review would select them.
    pub fn select(&self, annotation: Option<&str>) -> Result<Selection<'_>, SelectError> {
        self.set.select(annotation, &*self.serving)
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
        self.run(body, true, |engine, root, work| engine.answer(root, work, out, Mode::Mutate, Extras::None, None))
    }

    /// Validates one `AdmissionReview` (`/validate`): the pod is allowed if injecting it again would add nothing;
    /// otherwise it is refused, or admitted with a warning, naming what is missing. Everything `review` skips is
    /// allowed. Same buffers and errors as [`Engine::review`].
    pub fn validate(&self, body: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<Outcome, ReviewError> {
        self.run(body, true, |engine, root, work| engine.answer(root, work, out, Mode::Validate, Extras::None, None))
    }

    /// [`Engine::review`] or [`Engine::validate`] (by `mode`) of a call the server knows more of: the webhook of
    /// a revision tag, a subject for Events.
    pub fn answer_call(
        &self,
        body: &mut Vec<u8>,
        out: &mut Vec<u8>,
        mode: Mode,
        call: Call<'_>,
    ) -> Result<Outcome, ReviewError> {
        let extras = if call.subject && mode == Mode::Mutate { Extras::Subject } else { Extras::None };
        self.run(body, true, |engine, root, work| engine.answer(root, work, out, mode, extras, call.tag))
    }

    /// [`Engine::review`] or [`Engine::validate`], with the outcome's [`Trace`]: for people reading a decision,
    /// not for the request path (it writes the patch twice).
    pub fn trace(&self, body: &mut Vec<u8>, out: &mut Vec<u8>, mode: Mode) -> Result<Outcome, ReviewError> {
        self.run(body, true, |engine, root, work| engine.answer(root, work, out, mode, Extras::Trace, None))
    }

    /// For `uninject`: reviews a pod (a Pod CREATE review) as [`Engine::review`] does, and when its template is
    /// chosen, returns with the outcome the JSON Patch (`remove` and `replace` operations) that takes out of the pod
    /// what the template's injection put in, as the merge finds it ([`crate::uninject`]). The outcome's verdict is
    /// the one `review` would give the pod as it is: `already-injected` for a pod injected whole, `Injected` for
    /// one that lacks part of it, a skip (another template version's pod, say) when its template is not chosen. Not
    /// for the request path.
    pub fn uninject(&self, body: &mut Vec<u8>) -> Result<(Outcome, Option<Vec<u8>>), ReviewError> {
        self.run(body, true, |engine, root, work| {
            let review = review::read(root)?;
            let mut outcome = Outcome::new(review.version, true);
            let pod = decision::decide(&review, &engine.keys)?;
            let decision = engine.decide(&pod, work, &mut outcome, Mode::Mutate, None);
            let patch = match decision {
                Decision::Allow(verdict) | Decision::Deny { verdict, .. } => {
                    outcome.verdict = verdict;
                    None
                }
                Decision::Patch { template, pod, overridden, .. } => {
                    let mut injected = crate::uninject::Injected::new();
                    outcome.verdict = match work.merge(&template, overridden, pod, &mut injected) {
                        0 => Verdict::Skipped(SkipReason::AlreadyInjected),
                        ops => Verdict::Injected { ops },
                    };
                    injected.into_patch()
                }
            };
            Ok((outcome, patch))
        })
    }

    /// Runs `body` through the stages up to `until` (see [`Stage`]): what the per-stage benchmarks measure. The
    /// same steps as [`Engine::review`], stopped early.
    #[doc(hidden)]
    pub fn review_until(&self, body: &mut Vec<u8>, out: &mut Vec<u8>, until: Stage) -> Result<(), ReviewError> {
        self.run(body, until > Stage::Tape, |engine, root, work| match until {
            Stage::Tape | Stage::Parse => Ok(()),
            _ => engine.probe(root, work, out, until),
        })
    }

    /// Parses `body` in place into the thread's scratch tape and hands its root to `then`; `one_reading` refuses
    /// a duplicate key first (false only for the benchmark stage that measures the parser alone).
    pub(crate) fn run<R>(
        &self,
        body: &mut Vec<u8>,
        one_reading: bool,
        then: impl FnOnce(&Self, simd_json::tape::Value<'_, '_>, &mut Work) -> Result<R, ReviewError>,
    ) -> Result<R, ReviewError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(ReviewError::Empty);
        }
        let len = body.len();
        // simd-json reads in 64-byte blocks; given the padding past the document, it parses the body where it
        // is instead of first copying it into a padded buffer of its own.
        body.resize(len + PARSE_PADDING, b' ');
        let body_start = body.as_ptr() as usize;
        let answered = SCRATCH.with(|scratch| {
            // Only this synchronous call borrows the thread's scratch, so the borrow cannot be held twice.
            let mut scratch = scratch.borrow_mut();
            let Scratch { buffers, tape: tape_slot, work } = &mut *scratch;
            work.stamp.clear();
            let mut tape = tape_slot.take().unwrap_or_else(Tape::null).reset();
            let answered = simd_json::fill_tape_padded(body, len, buffers, &mut tape).map(|()| {
                let checked = if one_reading { review::refuse_duplicate_keys(&tape.0, body_start) } else { Ok(()) };
                checked.and_then(|()| then(self, tape.as_value(), work))
            });
            if len <= KEEP_PARSER_BUFFERS_UP_TO {
                *tape_slot = Some(tape.reset());
            } else {
                *tape_slot = Some(Tape::null());
                *buffers = parser_buffers();
            }
            answered
        });
        // A parse error is described from the body, which the tape no longer borrows.
        let result = answered.unwrap_or_else(|e| Err(ReviewError::json(&e, body.get(..len).unwrap_or_default())));
        body.truncate(len);
        result
    }

    /// Decides, then writes the response from the decision; the outcome with `extras`.
    fn answer(
        &self,
        root: simd_json::tape::Value<'_, '_>,
        work: &mut Work,
        out: &mut Vec<u8>,
        mode: Mode,
        extras: Extras,
        tag: Option<&Tag>,
    ) -> Result<Outcome, ReviewError> {
        let review = review::read(root)?;
        let mut outcome = Outcome::new(review.version, extras == Extras::Trace);
        let pod = decision::decide(&review, &self.keys)?;
        let decision = self.decide(&pod, work, &mut outcome, mode, tag);
        self.write(&review, decision, work, out, &mut outcome);
        // A dry run (`kubectl create --dry-run=server`, the apply-time preview) admits no pod: nothing to say.
        if extras == Extras::Subject
            && !review.dry_run
            && let Ok(pod) = &pod
            && outcome.deserves_event()
        {
            outcome.subject = Some(Subject::of(pod));
        }
        Ok(outcome)
    }

    /// The steps of [`Engine::answer`] up to `until`, for the per-stage benchmarks.
    fn probe(
        &self,
        root: simd_json::tape::Value<'_, '_>,
        work: &mut Work,
        out: &mut Vec<u8>,
        until: Stage,
    ) -> Result<(), ReviewError> {
        let review = review::read(root)?;
        if until == Stage::Read {
            return Ok(());
        }
        if until < Stage::Respond {
            // As in a whole review, where the response is opened before the stages after reading run.
            response::open(out, review.version, review.uid);
        }
        let mut outcome = Outcome::new(review.version, false);
        let pod = decision::decide(&review, &self.keys)?;
        if until == Stage::Decide {
            if let Ok(pod) = &pod {
                // The choice is the stage measured; what it chose is not used.
                let _chosen = self.choose(pod, work, &mut outcome);
            }
            return Ok(());
        }
        let decision = self.decide(&pod, work, &mut outcome, Mode::Mutate, None);
        match (until, &decision) {
            (Stage::Decide | Stage::Render, _) => {}
            (Stage::Merge, Decision::Patch { template, pod, overridden, .. }) => {
                work.merge(template, *overridden, pod, &mut ());
            }
            (Stage::Merge, _) => {}
            _ => self.write(&review, decision, work, out, &mut outcome),
        }
        Ok(())
    }

    /// Inject or skip: for a pod to inject, its template chosen and its injection prepared; for one the review's
    /// rules skip, that skip. The one sequence a review, `uninject` and the per-stage probe all run. A call through
    /// revision tag `tag` has the template's stamp with the tag from the start, so that every merge (the checks'
    /// and the answer's) writes the one the pod gets.
    fn decide<'d>(
        &'d self,
        pod: &'d Result<PodView<'d, 'd>, SkipReason>,
        work: &mut Work,
        outcome: &mut Outcome,
        mode: Mode,
        tag: Option<&Tag>,
    ) -> Decision<'d> {
        match pod {
            Err(reason) => Decision::Allow(Verdict::Skipped(*reason)),
            Ok(pod) => match self.choose(pod, work, outcome) {
                Ok(template) => {
                    if let Some(tag) = tag {
                        template.write_tagged_stamp(tag, &mut work.stamp);
                    }
                    self.prepare(template, pod, work, outcome, mode)
                }
                Err(decision) => decision,
            },
        }
    }

    /// The template the pod takes; or, when it takes none, the decision already. Reads the pod's overrides
    /// and warns about annotations nothing reads.
    fn choose<'d>(
        &'d self,
        pod: &PodView<'_, '_>,
        work: &mut Work,
        outcome: &mut Outcome,
    ) -> Result<Selection<'d>, Decision<'d>> {
        if let Some(trace) = &mut outcome.trace {
            trace.pod = Some(pod.display_name());
        }
        let template = match self.select(pod.annotation(&self.keys.template)) {
            Ok(template) => template,
            Err(e) => return Err(self.fail(self.unknown_template(pod, e), outcome)),
        };
        let template = if pod.runs_to_completion() {
            match template.for_jobs() {
                Ok(shaped) => shaped,
                Err(fell_back) => {
                    if fell_back {
                        let because = format!(
                            "a pod that runs to completion (a Job's) gets the sidecar as a native sidecar, which needs \
                             Kubernetes 1.{NATIVE_SIDECAR_MINOR}, and this injector is set for {} (--kubernetes-version)",
                            self.settings.kubernetes_version
                        );
                        outcome.warnings.push(format!("{}: not injected: {because}", pod.display_name()));
                        outcome.because = Some(because);
                    }
                    return Err(Decision::Allow(Verdict::Skipped(SkipReason::Job)));
                }
            }
        } else {
            template
        };
        if let Err(reason) = decision::admits(pod, &self.keys, &template) {
            if reason == SkipReason::InjectedByOtherVersion {
                outcome.warnings.push(self.other_version_warning(pod, &template));
            }
            return Err(Decision::Allow(Verdict::Skipped(reason)));
        }
        outcome.template = Some(template.id().clone());
        work.overrides.clear();
        if !template.overrides.is_empty() {
            self.read_overrides(&template, pod, &mut work.overrides, &mut outcome.warnings);
        }
        self.unknown_annotations(&template, pod, &mut outcome.warnings);
        if let Some(names) = pod.annotation(&self.keys.containers) {
            self.unmatched_containers(pod, names, &mut outcome.warnings);
        }
        Ok(template)
    }

    /// A warning for each name in the pod's `<prefix>containers` annotation that names none of its containers
    /// (the defaults then reach no container by that name), with the closest container: the one it differs from
    /// only in case, else one within two edits.
    #[cold]
    fn unmatched_containers(&self, pod: &PodView<'_, '_>, names: &str, warnings: &mut Vec<String>) {
        let containers: Vec<&str> = pod
            .container_lists()
            .into_iter()
            .take(2)
            .flatten()
            .flat_map(|list| list.iter())
            .filter_map(|c| c.get("name").and_then(|n| n.into_string()))
            .collect();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty() && !containers.contains(n)) {
            let hint = match containers.iter().find(|c| c.eq_ignore_ascii_case(name)) {
                Some(close) => format!("did you mean {close}? names are case-sensitive"),
                None => match crate::suggest::closest(name, containers.iter().copied()) {
                    Some(close) => format!("did you mean {close}? the pod's containers: {}", containers.join(", ")),
                    None => format!("the pod's containers: {}", containers.join(", ")),
                },
            };
            warnings.push(format!(
                "sidecar-injector: annotation {}: {:?} names no container of the pod ({hint}); the template's container \
                 defaults reach no container by that name",
                self.keys.containers,
                shorten(name)
            ));
        }
    }

    /// Renders the pod's leaves and checks them: the patch to send, or (when validating) the judgement of the
    /// pod by it.
    fn prepare<'d>(
        &self,
        template: Selection<'d>,
        pod: &'d PodView<'d, 'd>,
        work: &mut Work,
        outcome: &mut Outcome,
        mode: Mode,
    ) -> Decision<'d> {
        let Work { rendered, ranges, overrides, leaf_cache, .. } = work;
        if template.renders_per_pod() {
            let context = pod.context(template.reads());
            if !overrides.is_empty() {
                template.vet_overrides(&context, overrides, &mut outcome.warnings);
            }
            if let Err(e) = template.render(&context, overrides, Some(leaf_cache), rendered, ranges) {
                let failure = self.leaf_failure(&template, e.slot, pod, "failed to render", &e.reason);
                return self.fail(failure, outcome);
            }
        }
        if let Err((slot, error)) = template.check_leaves(Rendered { buf: rendered, ranges, stamp: None }) {
            let what = "rendered a value the API server would refuse";
            return self.fail(self.leaf_failure(&template, slot, pod, what, &error), outcome);
        }
        if template.judges_rendered_values()
            && !(work.judged_for.as_ref() == Some(template.id()) && work.judged == work.rendered)
        {
            if let Err(error) =
                template.check_rendered(Rendered { buf: &work.rendered, ranges: &work.ranges, stamp: None })
            {
                return self.fail(self.rendered_failure(&template, pod, &error), outcome);
            }
            work.judged.clear();
            work.judged.extend_from_slice(&work.rendered);
            work.judged_for = Some(template.id().clone());
        }
        let overridden = !overrides.is_empty();
        // Both modes: what the mutating path withholds from a pod, `/validate` must not then demand of it (the
        // pod it sees is the one the mutating path left; an injected pod gains nothing from the merge, so passes).
        if pod.sets_pod_resources()
            && let Some(failure) = self.pod_resources_failure(&template, pod, overridden, work)
        {
            return self.fail(failure, outcome);
        }
        let counted_whole = validation::annotations_copied_from_fields(self.settings.kubernetes_version);
        let mut written = None;
        if judged_whole(&template, pod) || (pod.large_annotations() && counted_whole) {
            if let Some(failure) = self.pod_conflict_failure(&template, pod, overridden, work) {
                return self.fail(failure, outcome);
            }
        } else if pod.large_annotations() {
            match self.annotations_failure(&template, pod, overridden, work) {
                Ok(ops) => written = Some(ops),
                Err(failure) => return self.fail(failure, outcome),
            }
        }
        match mode {
            Mode::Mutate => Decision::Patch { template, pod, overridden, written },
            Mode::Validate => self.judge(&template, pod, overridden, work, outcome),
        }
    }

    /// Writes the response the decision makes, and the verdict into the outcome.
    fn write(
        &self,
        review: &Review<'_, '_>,
        decision: Decision<'_>,
        work: &mut Work,
        out: &mut Vec<u8>,
        outcome: &mut Outcome,
    ) {
        response::open(out, review.version, review.uid);
        outcome.verdict = match decision {
            Decision::Allow(verdict) => {
                response::allow(out);
                verdict
            }
            Decision::Deny { verdict, code } => {
                response::deny(out, code, outcome.message.as_deref().unwrap_or_default());
                verdict
            }
            Decision::Patch { template, pod, overridden, written } => {
                response::allow(out);
                if let Some(trace) = &mut outcome.trace {
                    let ops = written.unwrap_or_else(|| work.merge(&template, overridden, pod, &mut ()));
                    trace.patch = (ops > 0).then(|| work.staged.clone());
                }
                let ops = match written {
                    Some(ops) => response::encoded_patch(out, &work.encoded, ops),
                    None => {
                        let Work { rendered, ranges, path, staged, stamp, .. } = work;
                        let slots = Rendered { buf: rendered, ranges, stamp: (!stamp.is_empty()).then_some(stamp) };
                        response::patch(out, staged, |sink| {
                            merge::merge(&template, overridden, pod, slots, path, sink, &mut ())
                        })
                    }
                };
                match ops {
                    0 => Verdict::Skipped(SkipReason::AlreadyInjected),
                    ops => Verdict::Injected { ops },
                }
            }
        };
        response::close(out, &outcome.warnings, outcome.template.as_deref().map(TemplateId::audit_json));
    }

    /// Judges a pod for validation: complete pods (injecting them again would add nothing) are allowed; an
    /// incomplete one is refused or warned about, as the template (or the server) says, naming what is missing:
    /// the merge runs again, watched, to name what each of its operations adds.
    fn judge<'d>(
        &self,
        template: &Template,
        pod: &PodView<'_, '_>,
        overridden: bool,
        work: &mut Work,
        outcome: &mut Outcome,
    ) -> Decision<'d> {
        let missing = work.merge(template, overridden, pod, &mut ());
        if missing == 0 {
            return Decision::Allow(Verdict::Complete);
        }
        let mut watch = missing::Missing::new(pod);
        work.merge(template, overridden, pod, &mut watch);
        outcome.missing = watch.into_items();
        let message = format!(
            "sidecar-injector: pod {} lacks what template {} (version {}) injects: {}",
            pod.display_name(),
            template.name(),
            template.hash(),
            missing::one_line(&outcome.missing)
        );
        // A pod no replica injected, asking for a template this replica learned moments ago: the mutating call
        // may have met a replica that does not have it yet. Two replicas that disagree during a rollout must not
        // refuse a pod; `status` lists it as missing the sidecar.
        let uninjected = pod.annotation(&self.keys.status).is_none();
        if uninjected && self.arrived_within(template.name(), TEMPLATE_ROLLOUT_GRACE) {
            outcome.warnings.push(format!(
                "{message} (admitted: template {} reached this replica less than {}s ago, so the replica that \
                 answered the mutating call may not have had it yet)",
                template.name(),
                TEMPLATE_ROLLOUT_GRACE.as_secs()
            ));
            return Decision::Allow(Verdict::Incomplete { missing, refused: false });
        }
        // The API server copies legacy security annotations into the fields they stand for after the mutating
        // webhooks (seccomp before 1.27, AppArmor from 1.30): the pod seen here may have a field the mutating call
        // did not see, whose absence then decided it (a sidecar withheld for a profile that disagreed with the
        // annotation). Such a pod is never refused here for what it lacks; it is warned about.
        let version = self.settings.kubernetes_version;
        if uninjected
            && pod.annotation_entries().any(|(key, _)| validation::annotation_copied_into_a_field(key, version))
        {
            outcome.warnings.push(format!(
                "{message} (admitted: the API server copied the pod's legacy seccomp or AppArmor annotations into \
                 their fields after the mutating call, so what that call judged cannot be told from here)"
            ));
            return Decision::Allow(Verdict::Incomplete { missing, refused: false });
        }
        match template.validation().unwrap_or(self.settings.validation) {
            Validation::Deny => {
                outcome.message = Some(message);
                Decision::Deny { verdict: Verdict::Incomplete { missing, refused: true }, code: INCOMPLETE_CODE }
            }
            Validation::Warn => {
                outcome.warnings.push(message);
                Decision::Allow(Verdict::Incomplete { missing, refused: false })
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
        for (key, raw) in pod.own_annotation_entries() {
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

    /// Values rendered from the pod that break a rule only the whole of the template's part can judge.
    #[cold]
    fn rendered_failure(&self, template: &Template, pod: &PodView<'_, '_>, error: &FieldError) -> Failure {
        Failure {
            reason: SkipReason::RenderFailed,
            policy: template.on_error().unwrap_or(self.settings.on_error),
            message: format!(
                "template {} rendered values the API server would refuse for pod {}: {error}",
                template.name(),
                pod.display_name()
            ),
        }
    }

    /// For a pod that sets pod-level resources: why they cannot hold the sidecar, if they cannot (the API server
    /// would refuse the injected pod). Judges the whole injected pod, so only such pods pay for it; a problem the
    /// pod has without the sidecar is the user's, and left to the API server.
    #[cold]
    fn pod_resources_failure(
        &self,
        template: &Template,
        pod: &PodView<'_, '_>,
        overridden: bool,
        work: &mut Work,
    ) -> Option<Failure> {
        let by_path = |e: &FieldError| e.path.to_string();
        let problem = self.sidecars_problem(template, pod, overridden, work, validation::pod_resources, by_path)?;
        Some(Failure {
            reason: SkipReason::PodResources,
            policy: template.on_error().unwrap_or(self.settings.on_error),
            message: format!(
                "pod {} sets pod-level resources that cannot hold the sidecar of template {}: {problem}; raise \
                 spec.resources or lower the sidecar's with the template's override annotations",
                pod.display_name(),
                template.name(),
            ),
        })
    }

    /// For a pod that decides whether the template's injection is valid ([`judged_whole`]): the pod judged whole
    /// with the sidecar merged in, as the API server will judge it. A problem the pod did not have on its own
    /// (compared by the API server's message, which names the value: a host port taken twice names the protocol,
    /// address and port) is the sidecar's doing: the template's `onError` decides. A pod that breaks a rule on
    /// its own is left to the API server. Only such pods pay this, and they are rare.
    #[cold]
    fn pod_conflict_failure(
        &self,
        template: &Template,
        pod: &PodView<'_, '_>,
        overridden: bool,
        work: &mut Work,
    ) -> Option<Failure> {
        let problem =
            self.sidecars_problem(template, pod, overridden, work, validation::validate_pod, FieldError::body)?;
        Some(self.conflict(template, pod, &problem))
    }

    /// The first problem `check` finds in the pod with the sidecar merged in that it does not find in the pod alone
    /// (told apart by `key`): one the pod has without the sidecar is the user's, and left to the API server. The
    /// pod alone is judged only when the injected pod has a problem, which most have not.
    fn sidecars_problem(
        &self,
        template: &Template,
        pod: &PodView<'_, '_>,
        overridden: bool,
        work: &mut Work,
        check: fn(&serde_json::Value, validation::KubeVersion) -> Vec<FieldError>,
        key: impl Fn(&FieldError) -> String,
    ) -> Option<FieldError> {
        let version = self.settings.kubernetes_version;
        let (original, injected) = injected_pod(template, pod, overridden, work)?;
        let problems = check(&injected, version);
        if problems.is_empty() {
            return None;
        }
        let own: Vec<String> = check(&original, version).iter().map(&key).collect();
        problems.into_iter().find(|e| !own.contains(&key(e)))
    }

    /// A pod whose annotations are close to the API server's total ([`PodView::large_annotations`]) with the
    /// template's added may be over it: the pod's bytes (counted as it was read) and the patch's added up, as the
    /// API server counts them, rather than the pod judged whole (which costs 20 times a review of its size). Over
    /// the total is the sidecar's doing (the pod's own were within it, or the review was refused unread). Within
    /// it, the patch is left encoded in `work` and its number of operations returned: the response sends it as is.
    #[cold]
    fn annotations_failure(
        &self,
        template: &Template,
        pod: &PodView<'_, '_>,
        overridden: bool,
        work: &mut Work,
    ) -> Result<usize, Failure> {
        let ops = work.merge_for_response(template, overridden, pod);
        if ops == 0 {
            return Ok(0);
        }
        // Our own patch: it parses (the suite holds every patch to RFC 6902).
        let Ok(added) = crate::patch::annotation_bytes_added(&work.staged) else { return Ok(ops) };
        match validation::annotations_size(pod.annotation_bytes() + added, self.settings.kubernetes_version) {
            Some(problem) => Err(self.conflict(template, pod, &problem)),
            None => Ok(ops),
        }
    }

    /// The failure of a pod the API server would refuse with the sidecar merged in, for `problem`.
    fn conflict(&self, template: &Template, pod: &PodView<'_, '_>, problem: &FieldError) -> Failure {
        Failure {
            reason: SkipReason::PodConflict,
            policy: template.on_error().unwrap_or(self.settings.on_error),
            message: format!(
                "pod {} cannot take the sidecar of template {}: the API server would refuse it: {problem}",
                pod.display_name(),
                template.name(),
            ),
        }
    }

    /// A warning for each annotation under our prefix that nothing reads: neither the injector's own, nor an
    /// override of `template`, nor one the template injects. A misspelt override is otherwise ignored in silence.
    fn unknown_annotations(&self, template: &Template, pod: &PodView<'_, '_>, warnings: &mut Vec<String>) {
        for (key, _) in pod.own_annotation_entries() {
            if self.keys.is_own(key) || template.reads_or_writes_annotation(key) {
                continue;
            }
            warnings.push(self.unknown_annotation_warning(template, key));
        }
    }

    #[cold]
    fn unknown_annotation_warning(&self, template: &Template, key: &str) -> String {
        let known: Vec<&str> = self.keys.own().chain(template.annotations_read_or_written()).collect();
        match crate::suggest::closest(key, known.iter().copied()) {
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

    /// Decides for a pod whose injection cannot proceed, as the policy says: admitted without the sidecar and
    /// with a warning, or refused with the reason.
    fn fail<'d>(&self, failure: Failure, outcome: &mut Outcome) -> Decision<'d> {
        match failure.policy {
            Policy::Allow => {
                outcome.warnings.push(format!("sidecar-injector: admitted without the sidecar: {}", failure.message));
                Decision::Allow(Verdict::Skipped(failure.reason))
            }
            Policy::Deny => {
                outcome.message = Some(format!("sidecar-injector: {}", failure.message));
                Decision::Deny { verdict: Verdict::Denied(failure.reason), code: DENY_CODE }
            }
        }
    }

    fn unknown_template(&self, pod: &PodView<'_, '_>, error: SelectError) -> Failure {
        let (reason, policy) = match &error {
            SelectError::Unavailable { template, .. } => {
                (SkipReason::TemplateUnavailable, template.on_error.unwrap_or(self.settings.on_error))
            }
            SelectError::TooMany { .. } | SelectError::Combination(_) => {
                (SkipReason::CombinationRefused, self.settings.on_unknown_template)
            }
            _ => (SkipReason::UnknownTemplate, self.settings.on_unknown_template),
        };
        let problem = match error {
            SelectError::Unavailable { .. } => error.to_string(),
            SelectError::Unknown(names) => {
                format!("no template named {} (known: {})", names.join(", "), self.set.names())
            }
            SelectError::TooMany { .. } => format!("the templates cannot be combined: {error}"),
            SelectError::Combination(reason) => format!("the templates cannot be combined: {reason}"),
        };
        Failure {
            reason,
            policy,
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

/// Does `pod` decide whether `template`'s injection is valid, so that it must be judged whole with the sidecar
/// merged in? When the template writes host ports (which the pod's containers may use), when the pod has what the
/// API server's pod-wide rules read ([`PodView::judged_whole`]: host namespaces, `hostNetwork`, legacy security
/// annotations, Windows options, large annotations), when the template writes mounts and the pod uses block
/// devices, when the template writes labels or spread constraints and the pod spreads, and when the template
/// writes resize policies and the pod runs to completion (`Never` allows only `NotRequired`). Everything else the
/// merge keeps valid by itself (a container or mount path taken is the pod's), so other pods pay nothing.
fn judged_whole(template: &Template, pod: &PodView<'_, '_>) -> bool {
    template.judged_with_the_pod()
        || pod.judged_whole()
        || (template.writes_spread_inputs() && pod.spreads())
        || (template.writes_resize_policy() && pod.runs_to_completion())
        || (template.writes_mounts() && pod.has_volume_devices())
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
