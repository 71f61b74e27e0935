//! The apply-time preview (`/preview`): a workload under review (Deployment, StatefulSet, DaemonSet, ReplicaSet,
//! ReplicationController, Job, CronJob) has its pod template injected as its pods will be, by the same engine
//! and [`crate::offline`]'s reading of workloads, and what would go wrong for those pods (refused, or admitted
//! without the sidecar) is said back as admission warnings, which `kubectl apply` prints. A preview never
//! refuses: the workload is always admitted, and an error of ours is a warning too.
//!
//! Left out, silently: workloads a controller made (a Deployment's ReplicaSets, a CronJob's Jobs: their owner was
//! previewed, and nobody reads warnings sent to a controller), updates that leave the pod template as it was,
//! subresources, deletes, and objects that are not workloads.

use serde_json::Value;

use crate::review::{self, ApiVersion, ReviewError};
use crate::{Engine, Outcome, Verdict, response};

impl Engine {
    /// Previews one `AdmissionReview` of a workload (`/preview`): its pod templates are injected as their pods
    /// will be, and the workload is admitted with a warning for each thing that would go wrong for those pods
    /// (this module). Same buffers and errors as [`Engine::review`]; not for pods.
    pub fn preview(&self, body: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<Outcome, ReviewError> {
        // The review is read inside the parse, and the pod templates are injected after it: each injection is a
        // review of its own, on the same thread's scratch tape.
        let previewable = self.run(body, true, |_, root, _| read(root))?;
        Ok(answer(self, previewable, out))
    }
}

/// A review read for a preview: what the answer needs, owned (the tape is gone by the time the pod templates are
/// injected, through reviews of their own).
pub(crate) struct Previewable {
    version: ApiVersion,
    uid: String,
    namespace: String,
    /// The workload, when its pod template is one to preview.
    workload: Option<Value>,
}

/// Reads a review for a preview: its envelope as every review's ([`review::read`]), and the workload, when it is
/// one to preview.
pub(crate) fn read(root: simd_json::tape::Value<'_, '_>) -> Result<Previewable, ReviewError> {
    let review = review::read(root)?;
    let mut previewable = Previewable {
        version: review.version,
        uid: review.uid.to_owned(),
        namespace: review.namespace.to_owned(),
        workload: None,
    };
    let kind = review.kind;
    let workload = crate::workload::Kind::of_group(kind.group, kind.kind);
    let Some(path) = workload.pod_template_path() else { return Ok(previewable) };
    // A Pod has its own webhook; a subresource (scale, status) does not change the pod template.
    if path.is_empty() || !review.sub_resource.is_empty() {
        return Ok(previewable);
    }
    let (Some(object), "CREATE" | "UPDATE") = (review.object, review.operation) else { return Ok(previewable) };
    let object = crate::pod::to_json(object);
    if made_by_a_controller(&object) {
        return Ok(previewable);
    }
    if review.operation == "UPDATE" {
        let old = review.old_object.map(crate::pod::to_json);
        if old.as_ref().and_then(|old| old.pointer(path)) == object.pointer(path) {
            return Ok(previewable);
        }
    }
    previewable.workload = Some(object);
    Ok(previewable)
}

/// Does a controller own `object` (an owner reference with `controller: true`)?
fn made_by_a_controller(object: &Value) -> bool {
    let owners = object.pointer("/metadata/ownerReferences").and_then(Value::as_array);
    owners.into_iter().flatten().any(|owner| owner["controller"] == Value::Bool(true))
}

/// Injects the pod templates of the workload read, and writes the answer to `out`: allowed, with a warning for
/// each thing that would go wrong.
pub(crate) fn answer(engine: &Engine, previewable: Previewable, out: &mut Vec<u8>) -> Outcome {
    let Previewable { version, uid, namespace, workload } = previewable;
    let preview = match workload {
        Some(mut workload) => crate::offline::preview_document(engine, &mut workload, &namespace),
        None => crate::offline::Preview::default(),
    };
    response::open(out, version, &uid);
    response::allow(out);
    response::close(out, &preview.warnings, None);
    let mut outcome = Outcome::new(version, false);
    outcome.verdict = match preview.pending {
        true => Verdict::Pending,
        false => Verdict::Previewed { templates: preview.templates, unknown_template: preview.unknown_template },
    };
    outcome.warnings = preview.warnings;
    outcome
}
