//! `sidecar-injector status`: which running pods carry the sidecar their namespace's templates inject today.
//!
//! Every pod is judged by the engine itself, as the validating webhook (`/validate`) would judge it if it were
//! created now: the pod goes into a Pod CREATE review, [`Engine::validate`] answers, and the answer, with the
//! pod's [`Stamp`], gives its [`Class`]. No rule of the engine is written again here. The namespace's labels say
//! which revision's engine judges it ([`Enrollment`]), [`owners`] finds the workload each pod belongs to,
//! [`report`] groups and prints, [`restart`] plans `--restart`, [`upgrade`] decides `--upgrade`; `cluster` is the only
//! part that talks to the API server (with the caller's credentials).

mod cluster;
pub mod owners;
pub mod report;
pub mod restart;
pub mod tags;
pub mod upgrade;

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use sidecar_injector_core::decision::{self, SkipReason};
use sidecar_injector_core::settings::Keys;
use sidecar_injector_core::{Engine, ReviewError, Stamp, Verdict};

pub(crate) use cluster::{Cluster, ClusterError, Scope};

/// One revision's engine: what `serve --template-dir REVISION=DIR` serves under that name.
#[derive(Debug)]
pub struct Revision {
    /// The revision's name (`default` unless named).
    pub name: String,
    /// Where its templates come from, for the report: a directory, a file, a ConfigMap.
    pub source: String,
    /// Its engine.
    pub engine: Engine,
}

/// How a namespace stands with the injector, from its name and labels, as the webhook configuration selects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enrollment {
    /// Opted in to this revision: `<prefix>rev=REVISION`, or `<prefix>inject=enabled` without `<prefix>rev` for
    /// the default revision (the first one given), as the webhook configurations select namespaces.
    Revision(String),
    /// Opted in to the revision a tag points to: `<prefix>rev=TAG` ([`tags`]).
    Tagged {
        /// The tag its label names.
        tag: String,
        /// The revision the tag points to.
        revision: String,
    },
    /// Labelled `<prefix>rev=` a revision whose templates this run was not given: its pods are not judged.
    UnknownRevision(String),
    /// Not opted in: neither label.
    NotOptedIn,
    /// Never injected whatever its labels: a system namespace or the injector's own
    /// ([`decision::EXCLUDED_NAMESPACES`]).
    Excluded,
}

impl Enrollment {
    /// The enrollment of the namespace `name` with `labels`, for a run given `revisions` (the first is the
    /// default revision) and the cluster's revision tags (each with the revision it points to).
    pub fn of(
        name: &str,
        labels: &BTreeMap<String, String>,
        keys: &Keys,
        revisions: &[Revision],
        tags: &BTreeMap<String, String>,
    ) -> Enrollment {
        if decision::EXCLUDED_NAMESPACES.contains(&name) {
            return Enrollment::Excluded;
        }
        // The default revision's webhook selects `<prefix>inject=enabled` where `<prefix>rev` does not exist; each
        // named revision's selects `<prefix>rev=NAME` alone (manifests/base, manifests/revision-canary).
        match (labels.get(&keys.rev), labels.get(&keys.inject).map(String::as_str)) {
            (Some(rev), _) if revisions.iter().any(|r| &r.name == rev) => Enrollment::Revision(rev.clone()),
            (Some(tag), _) => match tags.get(tag) {
                Some(revision) if revisions.iter().any(|r| &r.name == revision) => {
                    Enrollment::Tagged { tag: tag.clone(), revision: revision.clone() }
                }
                Some(revision) => Enrollment::UnknownRevision(revision.clone()),
                None => Enrollment::UnknownRevision(tag.clone()),
            },
            (None, Some(decision::NAMESPACE_ENABLED)) => match revisions.first() {
                Some(default) => Enrollment::Revision(default.name.clone()),
                None => Enrollment::UnknownRevision(sidecar_injector_core::settings::DEFAULT_REVISION.to_owned()),
            },
            (None, _) => Enrollment::NotOptedIn,
        }
    }

    /// Is the namespace opted in (to a revision given or not)? The namespaces `status` lists by default.
    pub fn opted_in(&self) -> bool {
        matches!(self, Enrollment::Revision(_) | Enrollment::Tagged { .. } | Enrollment::UnknownRevision(_))
    }

    /// A short name for the report: `opted-in`, `unknown-revision`, `not-opted-in`, `excluded`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Enrollment::Revision(_) | Enrollment::Tagged { .. } => "opted-in",
            Enrollment::UnknownRevision(_) => "unknown-revision",
            Enrollment::NotOptedIn => "not-opted-in",
            Enrollment::Excluded => "excluded",
        }
    }

    /// The revision named by the namespace's labels, known or not.
    pub fn revision(&self) -> Option<&str> {
        match self {
            Enrollment::Revision(r) | Enrollment::Tagged { revision: r, .. } | Enrollment::UnknownRevision(r) => {
                Some(r)
            }
            Enrollment::NotOptedIn | Enrollment::Excluded => None,
        }
    }

    /// The revision tag its label names, when it names one.
    pub fn tag(&self) -> Option<&str> {
        match self {
            Enrollment::Tagged { tag, .. } => Some(tag),
            _ => None,
        }
    }
}

/// Where a pod stands. Every class but `current` and `skipped` is drift.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "class", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum Class {
    /// It has everything its template injects, stamped by the template's current version.
    Current {
        /// The template.
        template: String,
        /// Its version.
        version: String,
    },
    /// It carries the stamp of another version (or template) than the one its revision injects now.
    Stale {
        /// The template its stamp names.
        template: String,
        /// The version its stamp names.
        version: String,
        /// The version of that template now, if the revision still has it.
        current_version: Option<String>,
    },
    /// It has no sidecar, and should have: created while the webhook was down, or before the namespace opted in.
    Missing {
        /// The template it would get.
        template: String,
        /// Its version.
        version: String,
    },
    /// It carries the current version's stamp but lacks part of the injection (something removed it).
    Incomplete {
        /// The template.
        template: String,
        /// Its version.
        version: String,
        /// What it lacks, one item each (`container proxy`, `label sidecar-injector.io/injected`).
        missing: Vec<String>,
    },
    /// It was injected by another revision than its namespace's (the namespace moved, or the pod predates it).
    OtherRevision {
        /// The revision its stamp names.
        revision: String,
        /// The template its stamp names.
        template: String,
        /// The version its stamp names.
        version: String,
    },
    /// It names a template its revision does not have (removed by an edit, or a typo): a pod created so is admitted
    /// without the sidecar. Not drift (a restart brings the same), but a problem `status` reports and exits 1 on.
    UnknownTemplate {
        /// What it asks for: the value of its template annotation.
        asks_for: String,
        /// `TEMPLATE VERSION` of its stamp, if it was injected (before the template went away).
        injected: Option<String>,
    },
    /// It is not expected to have a sidecar: the engine would not inject it (`opted-out`, `job`,
    /// `host-network`...), its namespace is not opted in, or it is finished or terminating.
    Skipped {
        /// Why: one of the engine's skip reasons, or [`NOT_OPTED_IN`], [`EXCLUDED`], [`UNKNOWN_REVISION`],
        /// [`FINISHED`], [`TERMINATING`].
        reason: String,
    },
}

/// A pod in a namespace that is not opted in.
pub const NOT_OPTED_IN: &str = "namespace-not-opted-in";
/// A pod in a namespace the webhook never sees ([`decision::EXCLUDED_NAMESPACES`]).
pub const EXCLUDED: &str = "excluded-namespace";
/// A pod in a namespace labelled for a revision this run has no templates for.
pub const UNKNOWN_REVISION: &str = "unknown-revision";
/// A pod that has run to its end (phase `Succeeded` or `Failed`): nothing of it runs any more.
pub const FINISHED: &str = "finished";
/// A pod being deleted: its replacement, if any, is judged on its own.
pub const TERMINATING: &str = "terminating";

impl Class {
    /// Every class's name, in report order.
    pub const NAMES: [&str; 7] =
        ["current", "stale", "missing", "incomplete", "other-revision", "unknown-template", "skipped"];

    /// Its name in the report and the JSON (`other-revision`).
    pub fn name(&self) -> &'static str {
        match self {
            Class::Current { .. } => "current",
            Class::Stale { .. } => "stale",
            Class::Missing { .. } => "missing",
            Class::Incomplete { .. } => "incomplete",
            Class::OtherRevision { .. } => "other-revision",
            Class::UnknownTemplate { .. } => "unknown-template",
            Class::Skipped { .. } => "skipped",
        }
    }

    /// Does the pod run something other than what its namespace's templates inject today?
    pub fn is_drift(&self) -> bool {
        !matches!(self, Class::Current { .. } | Class::UnknownTemplate { .. } | Class::Skipped { .. })
    }

    fn skipped(reason: &str) -> Class {
        Class::Skipped { reason: reason.to_owned() }
    }
}

/// Classifies one pod (as the API server returns it, JSON) of a namespace with `enrollment`, by running the
/// engine of the namespace's revision on it. `Err` only if the engine cannot read the review made of it, which
/// a pod from the API server never causes.
pub fn classify(
    pod: &Value,
    namespace: &str,
    enrollment: &Enrollment,
    revisions: &[Revision],
    keys: &Keys,
) -> Result<Class, ReviewError> {
    if pod.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
        return Ok(Class::skipped(TERMINATING));
    }
    if matches!(pod.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed")) {
        return Ok(Class::skipped(FINISHED));
    }
    let revision = match enrollment {
        Enrollment::Excluded => return Ok(Class::skipped(EXCLUDED)),
        Enrollment::NotOptedIn => return Ok(Class::skipped(NOT_OPTED_IN)),
        Enrollment::UnknownRevision(_) => return Ok(Class::skipped(UNKNOWN_REVISION)),
        Enrollment::Revision(name) | Enrollment::Tagged { revision: name, .. } => name,
    };
    let Some(revision) = revisions.iter().find(|r| &r.name == revision) else {
        return Ok(Class::skipped(UNKNOWN_REVISION));
    };
    let mut body = serde_json::to_vec(&review(namespace, pod)).expect("a JSON value serialises");
    let mut response = Vec::new();
    let outcome = revision.engine.validate(&mut body, &mut response)?;
    let annotations = pod.pointer("/metadata/annotations");
    let status = annotations.and_then(|a| a.get(&keys.status)).and_then(Value::as_str);
    let stamp = status.and_then(Stamp::parse);
    if outcome.verdict.names_unknown_template() {
        let asks_for = annotations.and_then(|a| a.get(&keys.template)).and_then(Value::as_str).unwrap_or_default();
        let injected = stamp.as_ref().map(|stamp| format!("{} {}", stamp.template, stamp.version));
        return Ok(Class::UnknownTemplate { asks_for: asks_for.to_owned(), injected });
    }
    if let Verdict::Skipped(reason) | Verdict::Denied(reason) = outcome.verdict
        && !matches!(reason, SkipReason::InjectedByOtherVersion | SkipReason::AlreadyInjected)
    {
        // Not the engine's to inject, whatever the pod carries.
        return Ok(Class::skipped(reason.as_str()));
    }
    if let Some(stamp) = stamp.as_ref().filter(|s| s.revision() != revision.name) {
        return Ok(Class::OtherRevision {
            revision: stamp.revision().to_owned(),
            template: stamp.template.clone(),
            version: stamp.version.clone(),
        });
    }
    let (template, version) = match outcome.template.as_deref() {
        Some(id) => (id.name.clone(), id.version.clone()),
        None => Default::default(),
    };
    Ok(match outcome.verdict {
        Verdict::Skipped(SkipReason::InjectedByOtherVersion) => {
            let (template, version) = match stamp {
                Some(stamp) => (stamp.template, stamp.version),
                // The engine read the annotation as another version's, but it is no stamp we can read.
                None => ("?".to_owned(), status.unwrap_or_default().to_owned()),
            };
            let current_version = revision.engine.select(Some(&template)).ok().map(|t| t.hash().to_owned());
            Class::Stale { template, version, current_version }
        }
        // `status` validates; a preview's verdict never reaches here, and would say nothing is missing. Nor does
        // `Pending`: the CLI's sets assemble combinations as they are asked for.
        Verdict::Complete | Verdict::Skipped(_) | Verdict::Previewed { .. } => Class::Current { template, version },
        // Validation never injects; a patch to send would mean the same as a missing part.
        Verdict::Incomplete { .. } | Verdict::Injected { .. } | Verdict::Denied(_) => match stamp {
            None => Class::Missing { template, version },
            Some(_) => Class::Incomplete { template, version, missing: outcome.missing },
        },
    })
}

/// An error and its causes on one line, `a: b: c`, each said once: a cause whose text is already in the line (some
/// libraries put their source into their own message) is left out, and an API server's refusal is given as its
/// own message with its code, not as the client's debug dump.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    let mut next = Some(error);
    while let Some(cause) = next {
        let line = match cause.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(status)) if !status.message.is_empty() => {
                format!("{} ({} {})", status.message, status.code, status.reason)
            }
            _ => cause.to_string(),
        };
        if !text.contains(&line) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&line);
        }
        next = match cause.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(_)) => None,
            _ => cause.source(),
        };
    }
    text
}

/// The Pod CREATE review the API server would send for `pod` in `namespace`.
fn review(namespace: &str, pod: &Value) -> Value {
    sidecar_injector_core::offline::pod_create_review("sidecar-injector-status", namespace, pod.clone())
}

#[cfg(test)]
mod tests;
