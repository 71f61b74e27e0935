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
use simd_json::prelude::{ValueAsScalar, ValueIntoString};

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
    /// The workload, when its pod template is one to preview: its kind, name and pod template only.
    workload: Option<Value>,
    /// Not previewed, and why: the workload (`Deployment shop/web`) whose pod template is too large to expand.
    too_large: Option<String>,
}

/// The most values (strings, numbers, members of objects and lists...) a pod template may have to be previewed.
/// A preview expands the template into a document of its own and a pod review, several times its size in memory
/// (about 80 bytes a value each time): a workload of a few MiB of small values held hundreds of MiB. Real pod
/// templates have hundreds to a few thousand; one over this is admitted with a warning, not previewed.
pub(crate) const MAX_PREVIEW_VALUES: usize = 32 * 1024;

/// Reads a review for a preview: its envelope as every review's ([`review::read`]), and the workload, when it is
/// one to preview, with nothing but what the preview reads of it (its pod template, from the tape).
pub(crate) fn read(root: simd_json::tape::Value<'_, '_>) -> Result<Previewable, ReviewError> {
    let review = review::read(root)?;
    let mut previewable = Previewable {
        version: review.version,
        uid: review.uid.to_owned(),
        namespace: review.namespace.to_owned(),
        workload: None,
        too_large: None,
    };
    let kind = review.kind;
    let workload = crate::workload::Kind::of_group(kind.group, kind.kind);
    let Some(path) = workload.pod_template_path() else { return Ok(previewable) };
    // A Pod has its own webhook; a subresource (scale, status) does not change the pod template.
    if path.is_empty() || !review.sub_resource.is_empty() {
        return Ok(previewable);
    }
    let (Some(object), "CREATE" | "UPDATE") = (review.object, review.operation) else { return Ok(previewable) };
    if made_by_a_controller(object) {
        return Ok(previewable);
    }
    let template = pointer(object, path);
    // Compared on the tape, members in order: an update that reorders them is previewed again, harmlessly.
    if review.operation == "UPDATE" && review.old_object.and_then(|old| pointer(old, path)) == template {
        return Ok(previewable);
    }
    let text = |key: &str| object.get(key).and_then(|v| v.into_string()).unwrap_or_default();
    let metadata = object.get("metadata");
    let meta = |key: &str| metadata.and_then(|m| m.get(key)).and_then(|v| v.into_string());
    // The name and namespace as the object has them (a workload without a namespace takes the request's).
    let named = ["name", "namespace"].into_iter().filter_map(|key| Some((key.to_owned(), meta(key)?.into())));
    let mut slim = serde_json::json!({
        "apiVersion": text("apiVersion"),
        "kind": text("kind"),
        "metadata": Value::Object(named.collect()),
    });
    if let Some(template) = template {
        if !has_at_most(template, MAX_PREVIEW_VALUES) {
            let namespace = meta("namespace").unwrap_or(review.namespace);
            previewable.too_large = Some(format!("{} {namespace}/{}", text("kind"), meta("name").unwrap_or_default()));
            return Ok(previewable);
        }
        insert_at(&mut slim, path, crate::pod::to_json(template));
    }
    previewable.workload = Some(slim);
    Ok(previewable)
}

/// The value at a JSON pointer of plain keys (`/spec/template`) on the tape.
fn pointer<'t, 'i>(value: simd_json::tape::Value<'t, 'i>, path: &str) -> Option<simd_json::tape::Value<'t, 'i>> {
    path.split('/').skip(1).try_fold(value, |at, key| at.get(key))
}

/// `value` set at a JSON pointer of plain keys in `document`, making the objects on the way.
fn insert_at(document: &mut Value, path: &str, value: Value) {
    let mut at = document;
    for key in path.split('/').skip(1) {
        if !at.is_object() {
            *at = Value::Object(serde_json::Map::new());
        }
        at = &mut at[key];
    }
    *at = value;
}

/// Does `value` hold at most `limit` values, itself and everything nested (object keys not counted)? Stops
/// counting past the limit.
fn has_at_most(value: simd_json::tape::Value<'_, '_>, limit: usize) -> bool {
    fn count(value: simd_json::tape::Value<'_, '_>, left: &mut usize) -> bool {
        let Some(rest) = left.checked_sub(1) else { return false };
        *left = rest;
        if let Some(object) = value.as_object() {
            return object.iter().all(|(_, member)| count(member, left));
        }
        if let Some(array) = value.as_array() {
            return array.iter().all(|element| count(element, left));
        }
        true
    }
    let mut left = limit;
    count(value, &mut left)
}

/// Does a controller own `object` (an owner reference with `controller: true`)?
fn made_by_a_controller(object: simd_json::tape::Value<'_, '_>) -> bool {
    let owners = object.get("metadata").and_then(|m| m.get("ownerReferences")).and_then(|o| o.as_array());
    owners
        .into_iter()
        .flat_map(|o| o.iter())
        .any(|owner| owner.get("controller").and_then(|c| c.as_bool()) == Some(true))
}

/// Injects the pod templates of the workload read, and writes the answer to `out`: allowed, with a warning for
/// each thing that would go wrong.
pub(crate) fn answer(engine: &Engine, previewable: Previewable, out: &mut Vec<u8>) -> Outcome {
    let Previewable { version, uid, namespace, workload, too_large } = previewable;
    let mut preview = match workload {
        Some(mut workload) => crate::offline::preview_document(engine, &mut workload, &namespace),
        None => crate::offline::Preview::default(),
    };
    if let Some(workload) = too_large {
        preview.warnings.push(format!(
            "{workload}: not previewed by the sidecar injector: its pod template has more than {MAX_PREVIEW_VALUES} \
             values, more than a preview expands"
        ));
    }
    response::open(out, version, &uid);
    response::allow(out);
    response::close(out, &preview.warnings, None);
    let mut outcome = Outcome::new(version, false);
    outcome.verdict = Verdict::Previewed { templates: preview.templates, unknown_template: preview.unknown_template };
    outcome.warnings = preview.warnings;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_counted_whole_and_the_count_stops_at_the_limit() {
        let mut json = br#"{"a": [1, 2, {"b": null}], "c": "d"}"#.to_vec();
        let tape = simd_json::to_tape(&mut json).unwrap();
        // The object, the list, 1, 2, the inner object, null, "d".
        assert!(has_at_most(tape.as_value(), 7));
        assert!(!has_at_most(tape.as_value(), 6));
        let template = pointer(tape.as_value(), "/a").unwrap();
        assert!(has_at_most(template, 5) && !has_at_most(template, 4), "the list, 1, 2, the object, null");
        assert_eq!(pointer(tape.as_value(), "/a/b"), None);
    }

    #[test]
    fn the_template_goes_where_its_path_says_with_the_objects_on_the_way() {
        let mut document = serde_json::json!({"kind": "CronJob"});
        insert_at(&mut document, "/spec/jobTemplate/spec/template", serde_json::json!({"spec": {}}));
        assert_eq!(
            document,
            serde_json::json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": {}}}}}})
        );
    }
}
