//! Kubernetes Events about admissions (`--events`): a pod injected (with its template and version), refused, or
//! admitted without the sidecar for a reason its owner would not expect (`Outcome::deserves_event`), on the pod's
//! controller (so that `kubectl describe` of its ReplicaSet, Job, ... shows it) or else on the pod by name.
//!
//! Off the request path: the handler only moves the outcome (with its subject) into a bounded queue (`try_send`, no
//! wait, no lock, nothing copied or formatted); a full queue drops it and counts it. One task makes each into a
//! [`Notice`] and publishes it through kube's `Recorder`, which aggregates repeats
//! as client-go's recorder does: the same reason on the same object within six minutes becomes one Event whose
//! series counts them (a patch, not a new object).

use std::fmt;

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use sidecar_injector_core::{Outcome, Subject, Verdict};
use tokio::sync::mpsc;

use super::telemetry::{EventResult, Metrics};

/// Outcomes waiting to be published, at most: a burst of admissions beyond it loses its Events (counted as
/// `dropped`), never a request's time.
pub(crate) const QUEUE: usize = 1024;

/// The most an Event's note may hold (the API's limit: 1 kB).
const NOTE_BYTES: usize = 1024;

/// Who publishes, and through which client: made by the CLI (the in-cluster service account, or a kubeconfig).
#[derive(Clone)]
pub struct Publisher {
    /// The client the Events are created and patched through.
    pub client: kube::Client,
    /// This replica's name (the pod's, from the downward API), as the Events' `reportingInstance`.
    pub instance: Option<String>,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher").field("instance", &self.instance).finish_non_exhaustive()
    }
}

/// What one Event says, and what it regards.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Notice {
    pub subject: Subject,
    pub warning: bool,
    /// `Injected`, `NotInjected` or `Refused`: the Event's reason, which `kubectl describe` shows.
    pub reason: &'static str,
    pub note: String,
}

impl Notice {
    /// The notice an outcome with a subject deserves ([`sidecar_injector_core::Engine::answer_call`] with `Call::subject`).
    pub(crate) fn of(outcome: &mut Outcome) -> Option<Notice> {
        let subject = outcome.subject.take()?;
        let template = outcome.template.as_deref().map(|id| format!("template {} version {}", id.name, id.version));
        let (warning, reason, note) = match outcome.verdict {
            Verdict::Injected { .. } => {
                let injected = format!("injected with {}", template.unwrap_or_else(|| "its template".to_owned()));
                match outcome.warnings.first() {
                    Some(first) => (true, "Injected", format!("{injected}; {first}")),
                    None => (false, "Injected", injected),
                }
            }
            Verdict::Denied(reason) => {
                let message = outcome.message.clone().unwrap_or_else(|| reason.explain().to_owned());
                (true, "Refused", format!("refused ({}): {message}", reason.as_str()))
            }
            Verdict::Skipped(reason) => {
                let why = outcome.warnings.first().cloned().or_else(|| outcome.skip_explanation()).unwrap_or_default();
                (true, "NotInjected", format!("admitted without the sidecar ({}): {why}", reason.as_str()))
            }
            _ => return None,
        };
        Some(Notice { subject, warning, reason, note: cut(note, NOTE_BYTES) })
    }

    fn event(&self) -> Event {
        Event {
            type_: if self.warning { EventType::Warning } else { EventType::Normal },
            reason: self.reason.to_owned(),
            note: Some(self.note.clone()),
            action: "Admit".to_owned(),
            secondary: None,
        }
    }

    /// The controller, or the pod by name (no uid: a pod under admission has none yet).
    fn regarding(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        let namespace = Some(self.subject.namespace.clone());
        match &self.subject.controller {
            Some([api_version, kind, name, uid]) => k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some(api_version.clone()),
                kind: Some(kind.clone()),
                name: Some(name.clone()),
                uid: Some(uid.clone()),
                namespace,
                ..Default::default()
            },
            None => k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: Some(self.subject.pod.clone()),
                namespace,
                ..Default::default()
            },
        }
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The queue's sending end, which the handler offers outcomes to.
pub(crate) struct Events {
    queue: mpsc::Sender<Outcome>,
    metrics: Metrics,
}

impl Events {
    /// Starts the publishing task (in the runtime in scope) and returns its queue of `capacity` outcomes.
    pub(crate) fn start(publisher: Publisher, metrics: Metrics, capacity: usize) -> Events {
        let (queue, mut outcomes) = mpsc::channel::<Outcome>(capacity);
        let reporter = Reporter { controller: "sidecar-injector".to_owned(), instance: publisher.instance };
        let recorder = Recorder::new(publisher.client, reporter);
        let counted = metrics.clone();
        tokio::spawn(async move {
            while let Some(mut outcome) = outcomes.recv().await {
                let Some(notice) = Notice::of(&mut outcome) else { continue };
                match recorder.publish(&notice.event(), &notice.regarding()).await {
                    Ok(()) => counted.event(EventResult::Published),
                    Err(error) => {
                        counted.event(EventResult::Failed);
                        tracing::debug!(%error, reason = notice.reason, "an Event was not published");
                    }
                }
            }
        });
        Events { queue, metrics }
    }

    /// Offers `outcome`, when it has a subject (it deserves an Event), without waiting: a full queue drops it
    /// (counted). The answer is already written: the outcome is moved, not copied.
    pub(crate) fn offer(&self, outcome: Outcome) {
        if outcome.subject.is_none() {
            return;
        }
        if self.queue.try_send(outcome).is_err() {
            self.metrics.event(EventResult::Dropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecar_injector_core::SkipReason;

    fn outcome(verdict: Verdict) -> Outcome {
        Outcome {
            version: sidecar_injector_core::ApiVersion::V1,
            verdict,
            warnings: Vec::new(),
            template: None,
            message: None,
            missing: Vec::new(),
            trace: None,
            because: None,
            subject: Some(Subject { namespace: "shop".into(), pod: "web-".into(), controller: None }),
        }
    }

    #[test]
    fn each_verdict_says_what_happened_on_the_controller_or_the_pod() {
        let mut injected = outcome(Verdict::Injected { ops: 3 });
        let notice = Notice::of(&mut injected).unwrap();
        assert_eq!((notice.warning, notice.reason), (false, "Injected"));
        assert!(notice.note.starts_with("injected with "), "{}", notice.note);
        assert_eq!(notice.regarding().kind.as_deref(), Some("Pod"));
        assert_eq!(notice.regarding().name.as_deref(), Some("web-"));
        assert!(injected.subject.is_none(), "taken");

        let mut skipped = outcome(Verdict::Skipped(SkipReason::UnknownTemplate));
        skipped.warnings.push("sidecar-injector: no template named demi".into());
        skipped.subject.as_mut().unwrap().controller =
            Some(["apps/v1".into(), "ReplicaSet".into(), "web-1".into(), "u-1".into()]);
        let notice = Notice::of(&mut skipped).unwrap();
        assert_eq!((notice.warning, notice.reason), (true, "NotInjected"));
        assert_eq!(
            notice.note,
            "admitted without the sidecar (unknown-template): sidecar-injector: no template named demi"
        );
        let regarding = notice.regarding();
        assert_eq!((regarding.kind.as_deref(), regarding.uid.as_deref()), (Some("ReplicaSet"), Some("u-1")));

        let mut refused = outcome(Verdict::Denied(SkipReason::RenderFailed));
        refused.message = Some("x".repeat(2000) + "é");
        let notice = Notice::of(&mut refused).unwrap();
        assert_eq!((notice.warning, notice.reason), (true, "Refused"));
        assert!(notice.note.len() <= NOTE_BYTES, "{}", notice.note.len());

        // No subject: nothing to say.
        let mut none = outcome(Verdict::Skipped(SkipReason::OptedOut));
        none.subject = None;
        assert_eq!(Notice::of(&mut none), None);
    }

    #[test]
    fn a_note_is_cut_at_a_character_boundary() {
        assert_eq!(cut("aé".repeat(3), 4), "aéa");
        assert_eq!(cut("short".into(), 10), "short");
    }
}
