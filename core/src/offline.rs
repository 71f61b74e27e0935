//! Offline injection (`sidecar-injector inject`): Kubernetes manifests in, the same manifests out with the sidecar
//! injected into every pod template, by the very engine the webhook runs.
//!
//! Each pod template is wrapped as the Pod its controller would create and reviewed as a Pod CREATE; the patch
//! the webhook would send is applied to it and the result written back into the template. So what `inject` prints
//! is what the webhook would have made of those pods, and a pod created from the output is left alone by the
//! webhook (already injected).
//!
//! Manifests are read as kubectl reads them: YAML 1.1 scalars (`0644` is octal, `yes` is a boolean), several
//! documents per file, JSON being YAML too.

use serde_json::{Value, json};

use crate::{Engine, Mode, Outcome, SkipReason, Verdict};

/// Why manifests could not be injected.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// The input is not YAML (or JSON).
    #[error("{0}")]
    Syntax(String),
    /// A pod template is not an object.
    #[error("{workload}: the pod template at {path} is not an object")]
    NotATemplate {
        /// The workload, e.g. `Deployment shop/web`.
        workload: String,
        /// Where its pod template should be.
        path: &'static str,
    },
    /// The engine refused the pod (a template could not be rendered, or an unknown template was named, and the
    /// policy says deny).
    #[error("{workload}: refused: {message}")]
    Refused {
        /// The workload.
        workload: String,
        /// The refusal, as the webhook would send it.
        message: String,
    },
    /// `uninject` cannot take out exactly what injection put in: the pod template was injected by a template (or
    /// version) the given set does not have, or what would remain does not inject back into it.
    #[error("{workload}: cannot uninject: {reason}")]
    CannotUninject {
        /// The workload.
        workload: String,
        /// Why.
        reason: String,
    },
    /// The engine could not read the review built from the template, or its patch did not apply. Either is a bug.
    #[error("{workload}: {reason}")]
    Internal {
        /// The workload.
        workload: String,
        /// What went wrong.
        reason: String,
    },
}

/// What happened to one pod template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateReport {
    /// The workload, e.g. `Deployment shop/web`.
    pub workload: String,
    /// Injected or skipped, and why.
    pub verdict: Verdict,
    /// The warnings the webhook would have sent.
    pub warnings: Vec<String>,
    /// Why it was not injected, when it was skipped ([`crate::Outcome::skip_explanation`]).
    pub why: Option<String>,
}

/// The format of manifests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// YAML documents separated by `---`.
    Yaml,
    /// JSON, one value per document.
    Json,
}

impl Format {
    /// The format `text` is written in: JSON when it starts with `{` or `[`.
    pub fn detect(text: &str) -> Format {
        match text.trim_start().as_bytes().first() {
            Some(b'{' | b'[') => Format::Json,
            _ => Format::Yaml,
        }
    }
}

/// Reads every document of `text` (YAML or JSON). Empty documents are dropped.
pub fn read_documents(text: &str) -> Result<Vec<Value>, OfflineError> {
    // kubectl's YAML (go-yaml v2) reads `defaultMode: 0644` as octal; YAML 1.2 would read 644.
    let documents: Vec<Value> =
        serde_saphyr::from_multiple_with_options(text, crate::template::yaml::kubectl_options())
            .map_err(|e| OfflineError::Syntax(e.to_string()))?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// Writes `documents` in `format`: YAML separated by `---`; JSON, one document as itself and several as one
/// `List`, as `kubectl get -o json` prints several objects (concatenated objects are not one JSON document).
pub fn write_documents(documents: &[Value], format: Format) -> String {
    match format {
        Format::Yaml => {
            let mut out = String::new();
            for (i, document) in documents.iter().enumerate() {
                if i > 0 {
                    out.push_str("---\n");
                }
                // Serialising a `serde_json::Value` cannot fail: it has string keys and finite numbers only.
                out.push_str(&serde_saphyr::to_string(document).expect("JSON values serialise as YAML"));
            }
            out
        }
        Format::Json => {
            let list;
            let document = match documents {
                [one] => one,
                several => {
                    list = json!({"apiVersion": "v1", "items": several, "kind": "List", "metadata": {"resourceVersion": ""}});
                    &list
                }
            };
            // As above: a `Value` always serialises.
            serde_json::to_string_pretty(document).expect("JSON values serialise") + "\n"
        }
    }
}

/// Injects the sidecar into every pod template of `document` (Pod, Deployment, StatefulSet, DaemonSet,
/// ReplicaSet, ReplicationController, Job, CronJob, and the items of a List), in place. Other kinds are left as
/// they are. `namespace` is the namespace of objects that do not name one. Returns one report per pod template.
pub fn inject_document(
    engine: &Engine,
    document: &mut Value,
    namespace: &str,
) -> Result<Vec<TemplateReport>, OfflineError> {
    let mut reports = Vec::new();
    each_pod_template(document, namespace, &mut |pod, workload| {
        reports.push(inject_pod(engine, pod, workload)?);
        Ok(())
    })?;
    Ok(reports)
}

/// What the webhook would make of a workload's pods, for the apply-time preview ([`crate::preview`]).
#[derive(Debug, Default)]
pub(crate) struct Preview {
    /// The pod templates injected.
    pub(crate) templates: usize,
    /// One line for each thing that would go wrong, naming the workload: its pods refused, or admitted without
    /// the sidecar (and why), and the warnings the webhook would send with them.
    pub(crate) warnings: Vec<String>,
    /// A pod template names a template the set does not have.
    pub(crate) unknown_template: bool,
}

/// Injects every pod template of `document` as [`inject_document`] does, without writing the result back, and
/// says what would go wrong for the pods: the apply-time preview. Pods the rules leave out at their own request
/// (opted out) or that are injected already are not worth a warning; every other skip is.
pub(crate) fn preview_document(engine: &Engine, document: &mut Value, namespace: &str) -> Preview {
    let mut preview = Preview::default();
    let looked = each_pod_template(document, namespace, &mut |pod, workload| {
        preview.templates += 1;
        let created = AsCreated::new(pod, workload)?;
        let mut response = Vec::new();
        let outcome = engine
            .review(&mut created.review(workload), &mut response)
            .map_err(|e| internal(workload, e.to_string()))?;
        let name = &workload.name;
        let warnings = &mut preview.warnings;
        match outcome.verdict {
            Verdict::Denied(_) => {
                let message = outcome.message.as_deref().unwrap_or_else(|| SkipReason::RenderFailed.explain());
                warnings.push(format!("{name}: its pods would be refused by the sidecar injector: {message}"));
            }
            Verdict::Skipped(SkipReason::OptedOut | SkipReason::AlreadyInjected) => {}
            // The engine's own warning says why, when it gives one.
            Verdict::Skipped(_) if outcome.warnings.is_empty() => {
                let why = outcome.skip_explanation().unwrap_or_default();
                warnings.push(format!("{name}: its pods would be admitted without the sidecar: {why}"));
            }
            _ => {}
        }
        preview.unknown_template |= outcome.verdict.reason() == Some(SkipReason::UnknownTemplate);
        warnings.extend(outcome.warnings.iter().map(|warning| format!("{name}: {warning}")));
        Ok(())
    });
    if let Err(e) = looked {
        preview.warnings.push(format!("the sidecar injector could not preview this workload's pods: {e}"));
    }
    preview
}

/// What `uninject` did to one pod template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uninjection {
    /// What the injection added was taken out, in this many patch operations.
    Removed {
        /// Number of `remove` and `replace` operations.
        ops: usize,
    },
    /// The pod template carries no status annotation: it was not injected, and is left as it is.
    NotInjected,
}

/// What happened to one pod template in `uninject`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UninjectReport {
    /// The workload, e.g. `Deployment shop/web`.
    pub workload: String,
    /// Taken out, or left alone.
    pub result: Uninjection,
}

/// Takes out of every pod template of `document` (the kinds [`inject_document`] injects) what injection put in,
/// in place: the inverse of `inject`. A pod template is injected when it carries the status annotation; its
/// template (at the version the annotation names) must be in `engine`'s set. What is taken out is what the merge
/// finds the template added ([`Engine::uninject`]), checked by injecting the result again: it must give the pod
/// template back exactly, or nothing is changed and the workload is refused.
pub fn uninject_document(
    engine: &Engine,
    document: &mut Value,
    namespace: &str,
) -> Result<Vec<UninjectReport>, OfflineError> {
    let status = crate::settings::Keys::new(&engine.settings().annotation_prefix).status;
    let mut reports = Vec::new();
    each_pod_template(document, namespace, &mut |pod, workload| {
        reports.push(uninject_pod(engine, pod, workload, &status)?);
        Ok(())
    })?;
    Ok(reports)
}

/// A workload whose pod template is being worked on, and how its controller creates pods from it.
struct Workload {
    /// The workload as messages name it, e.g. `Deployment shop/web`.
    name: String,
    namespace: String,
    /// The `generateName` of its pods (`<name>-`), for a controller's.
    generate_name: Option<String>,
    /// A Job owns its pods (a CronJob's, through its Jobs).
    by_job: bool,
}

/// Calls `each` with every pod template of `document` (the object itself for a Pod; the items of a List).
fn each_pod_template(
    document: &mut Value,
    namespace: &str,
    each: &mut dyn FnMut(&mut Value, &Workload) -> Result<(), OfflineError>,
) -> Result<(), OfflineError> {
    let kind = document["kind"].as_str().unwrap_or_default().to_owned();
    if kind.ends_with("List") {
        if let Some(items) = document.get_mut("items").and_then(Value::as_array_mut) {
            for item in items {
                each_pod_template(item, namespace, each)?;
            }
        }
        return Ok(());
    }
    let workload_kind = crate::workload::Kind::of(document["apiVersion"].as_str().unwrap_or_default(), &kind);
    let Some(path) = workload_kind.pod_template_path() else { return Ok(()) };
    let metadata = &document["metadata"];
    let namespace = metadata["namespace"].as_str().unwrap_or(namespace).to_owned();
    let name = metadata["name"].as_str().unwrap_or_default().to_owned();
    let mut workload = Workload {
        name: format!("{kind} {namespace}/{name}"),
        namespace,
        generate_name: None,
        // The pods of a Job (and of a CronJob, through its Jobs) carry the Job as their owner, which templates read.
        by_job: workload_kind.makes_a_jobs_pods(),
    };
    if path.is_empty() {
        workload.by_job = false;
        return each(document, &workload);
    }
    let Some(template) = document.pointer_mut(path).filter(|t| t.is_object()) else {
        return Err(OfflineError::NotATemplate { workload: workload.name, path });
    };
    // A controller names its pods after itself; `<name>-` is what the webhook's templates will see, near enough.
    workload.generate_name = (!name.is_empty()).then(|| format!("{name}-"));
    each(template, &workload)
}

/// A pod template as the API server would pass the pod to the webhook: with its namespace and, from a
/// controller, a generateName and (from a Job) an owner reference. Each is taken out again when the pod is written
/// back, so the template keeps only what it had.
#[derive(Clone)]
struct AsCreated {
    object: Value,
    added_namespace: bool,
    added_generate_name: bool,
    added_owner: bool,
}

impl AsCreated {
    fn new(pod: &Value, workload: &Workload) -> Result<Self, OfflineError> {
        let mut object = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": pod.get("metadata").cloned().unwrap_or_else(|| json!({})),
            "spec": pod.get("spec").cloned().unwrap_or_else(|| json!({})),
        });
        let metadata =
            object["metadata"].as_object_mut().ok_or_else(|| internal(workload, "metadata is not an object"))?;
        let added_namespace = !metadata.contains_key("namespace");
        if added_namespace {
            metadata.insert("namespace".into(), workload.namespace.clone().into());
        }
        let added_generate_name = match &workload.generate_name {
            Some(generate_name) if !metadata.contains_key("name") && !metadata.contains_key("generateName") => {
                metadata.insert("generateName".into(), generate_name.clone().into());
                true
            }
            _ => false,
        };
        let added_owner = workload.by_job && !metadata.contains_key("ownerReferences");
        if added_owner {
            let job =
                json!({"apiVersion": "batch/v1", "kind": "Job", "name": workload.name, "uid": "", "controller": true});
            metadata.insert("ownerReferences".into(), json!([job]));
        }
        Ok(AsCreated { object, added_namespace, added_generate_name, added_owner })
    }

    /// The same pod changed to `object`, to be written back the same way.
    fn with_object(&self, object: Value) -> Self {
        AsCreated { object, ..self.clone() }
    }

    /// The Pod CREATE review of the pod, as JSON.
    fn review(&self, workload: &Workload) -> Vec<u8> {
        let review = pod_create_review("sidecar-injector-inject", &workload.namespace, self.object.clone());
        // Serialising a `Value` cannot fail.
        serde_json::to_vec(&review).expect("JSON values serialise")
    }

    /// Writes `object` (this pod, changed) back into the pod template `pod`, without what was added to it (and
    /// without `metadata`, when nothing else is left in it).
    fn write_back(&self, mut object: Value, pod: &mut Value, workload: &Workload) -> Result<(), OfflineError> {
        let metadata = object["metadata"].as_object_mut().ok_or_else(|| internal(workload, "metadata vanished"))?;
        for (added, key) in [
            (self.added_namespace, "namespace"),
            (self.added_generate_name, "generateName"),
            (self.added_owner, "ownerReferences"),
        ] {
            if added {
                metadata.remove(key);
            }
        }
        let empty = metadata.is_empty();
        let target = pod.as_object_mut().ok_or_else(|| internal(workload, "the pod is not an object"))?;
        // Metadata left empty (uninjected from a pod template that had none) is not written back.
        match empty {
            true => target.remove("metadata"),
            false => target.insert("metadata".into(), object["metadata"].take()),
        };
        target.insert("spec".into(), object["spec"].take());
        Ok(())
    }
}

fn internal(workload: &Workload, reason: impl Into<String>) -> OfflineError {
    OfflineError::Internal { workload: workload.name.clone(), reason: reason.into() }
}

/// `object` with a JSON Patch applied.
fn patched(object: &Value, patch: &[u8], workload: &Workload) -> Result<Value, OfflineError> {
    crate::patch::apply(object, patch).map_err(|e| internal(workload, e.to_string()))
}

/// The pod `created` injected by the engine, with the outcome: what the webhook would make of it.
fn injected(engine: &Engine, created: &AsCreated, workload: &Workload) -> Result<(Value, Outcome), OfflineError> {
    let mut response = Vec::new();
    let outcome = engine
        .trace(&mut created.review(workload), &mut response, Mode::Mutate)
        .map_err(|e| internal(workload, e.to_string()))?;
    if let Verdict::Denied(_) = outcome.verdict {
        let message = outcome.message.clone().unwrap_or_default();
        return Err(OfflineError::Refused { workload: workload.name.clone(), message });
    }
    let pod = match outcome.trace.as_ref().and_then(|t| t.patch.as_deref()) {
        Some(patch) => patched(&created.object, patch, workload)?,
        None => created.object.clone(),
    };
    Ok((pod, outcome))
}

/// Injects into one pod (or pod template: `metadata` and `spec`) in place, through a Pod CREATE review.
fn inject_pod(engine: &Engine, pod: &mut Value, workload: &Workload) -> Result<TemplateReport, OfflineError> {
    let created = AsCreated::new(pod, workload)?;
    let (result, outcome) = injected(engine, &created, workload)?;
    if matches!(outcome.verdict, Verdict::Injected { .. }) {
        created.write_back(result, pod, workload)?;
    }
    let why = outcome.skip_explanation();
    Ok(TemplateReport { workload: workload.name.clone(), verdict: outcome.verdict, warnings: outcome.warnings, why })
}

/// Takes out of one pod (or pod template) what injection put in, in place, when it carries the `status`
/// annotation; refuses it when what would remain does not inject back into it.
fn uninject_pod(
    engine: &Engine,
    pod: &mut Value,
    workload: &Workload,
    status: &str,
) -> Result<UninjectReport, OfflineError> {
    let report = |result| UninjectReport { workload: workload.name.clone(), result };
    if pod.pointer("/metadata/annotations").and_then(|a| a.get(status)).is_none() {
        return Ok(report(Uninjection::NotInjected));
    }
    let refused = |reason: String| OfflineError::CannotUninject { workload: workload.name.clone(), reason };
    let created = AsCreated::new(pod, workload)?;
    let (outcome, patch) =
        engine.uninject(&mut created.review(workload)).map_err(|e| internal(workload, e.to_string()))?;
    let patch = match (outcome.verdict, patch) {
        (Verdict::Skipped(SkipReason::AlreadyInjected) | Verdict::Injected { .. }, Some(patch)) => patch,
        (Verdict::Skipped(SkipReason::AlreadyInjected) | Verdict::Injected { .. }, None) => {
            return Err(refused("the template adds nothing that the pod has".into()));
        }
        (Verdict::Skipped(reason) | Verdict::Denied(reason), _) => {
            let why = outcome.warnings.first().map_or(reason.explain(), String::as_str);
            return Err(refused(format!("{} ({why})", reason.as_str())));
        }
        (other, _) => return Err(internal(workload, format!("unexpected verdict {other:?}"))),
    };
    let mut ops: Vec<Value> = serde_json::from_slice(&patch).map_err(|e| internal(workload, e.to_string()))?;
    // The check: injecting what remains must give back what injecting the input gives (the input itself, when
    // it was injected whole). A value the pod had set exactly as the template does cannot be told from an injected
    // one by looking; where taking it out makes the check fail (it decided what the merge did, as a resource sized
    // in the other map, or an item's place in a list), it was the pod's: it is kept, and the check runs again.
    let (expected, _) = injected(engine, &created, workload)?;
    loop {
        // Serialising a `Value` cannot fail.
        let patch = serde_json::to_vec(&ops).expect("JSON values serialise");
        let stripped = created.with_object(
            crate::uninject::apply(&created.object, &patch).map_err(|e| internal(workload, e.to_string()))?,
        );
        let (again, _) = injected(engine, &stripped, workload)?;
        if again == expected {
            stripped.write_back(stripped.object.clone(), pod, workload)?;
            return Ok(report(Uninjection::Removed { ops: ops.len() }));
        }
        let at = first_difference(&again, &expected, "");
        let path = |op: &Value| op["path"].as_str().unwrap_or_default().to_owned();
        let within = |outer: &str, inner: &str| inner == outer || inner.starts_with(&format!("{outer}/"));
        let culprit = ops
            .iter()
            .position(|op| within(&path(op), &at))
            .or_else(|| ops.iter().position(|op| within(&at, &path(op))));
        match culprit {
            Some(index) => {
                let op = ops.remove(index);
                ops.extend(item_members(&created.object, &path(&op)));
            }
            None => {
                return Err(refused(format!(
                    "injecting what would remain does not give the pod template back (at {at}): a value injection \
                     added was changed since, or the template reads what it writes"
                )));
            }
        }
    }
}

/// When `pointer` is an item of a keyed list (`/spec/volumes/0`) in `pod`, the removals of each of its members
/// but its merge key: what to take out of an item that equals the template's where the item itself is the pod's
/// (its place in the list says so). Nothing for anything else.
fn item_members(pod: &Value, pointer: &str) -> Vec<Value> {
    let Some((list, index)) = pointer.rsplit_once('/') else { return Vec::new() };
    let field = list.rsplit('/').next().unwrap_or_default();
    let (Ok(_), Some(key)) = (index.parse::<usize>(), crate::pod_api::merge_rules::merge_key_for(field)) else {
        return Vec::new();
    };
    let members = pod.pointer(pointer).and_then(Value::as_object).into_iter().flatten();
    members
        .filter(|(member, _)| member.as_str() != key)
        .map(|(member, _)| {
            let path = format!("{pointer}/{}", crate::json::escape_pointer_token(member));
            json!({"op": "remove", "path": path})
        })
        .collect()
}

/// The JSON Pointer of the first place where `a` and `b` differ.
fn first_difference(a: &Value, b: &Value, at: &str) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k)));
            for key in keys {
                if x.get(key) != y.get(key) {
                    let here = format!("{at}/{}", crate::json::escape_pointer_token(key));
                    return match (x.get(key), y.get(key)) {
                        (Some(x), Some(y)) => first_difference(x, y, &here),
                        _ => here,
                    };
                }
            }
            at.to_owned()
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => match x.iter().zip(y).position(|(x, y)| x != y) {
            Some(i) => first_difference(&x[i], &y[i], &format!("{at}/{i}")),
            None => at.to_owned(),
        },
        _ => at.to_owned(),
    }
}

/// The Pod CREATE review (admission.k8s.io/v1) the API server would send for `pod` in `namespace`: how the
/// commands that judge pods offline (`inject`, `status`) put one through the engine.
pub fn pod_create_review(uid: &str, namespace: &str, pod: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": namespace,
            "object": pod,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Settings, TemplateSet};

    fn engine() -> Engine {
        let settings = Settings::default();
        Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings)
    }

    #[test]
    fn reads_yaml_as_kubectl_does() {
        let docs = read_documents("---\na: 0644\nb: yes\nc: '0644'\n---\n# nothing\n---\nd: 1\n").unwrap();
        assert_eq!(docs, [json!({"a": 420, "b": true, "c": "0644"}), json!({"d": 1})]);
        let text = write_documents(&docs, Format::Yaml);
        assert_eq!(read_documents(&text).unwrap(), docs, "{text}");
        assert!(matches!(read_documents("a: [1\nb: 2\n"), Err(OfflineError::Syntax(m)) if m.contains("line")));
    }

    /// Issue 38: several documents as JSON are one `List`, as kubectl prints them, which reads back as they were.
    #[test]
    fn several_documents_as_json_are_one_list() {
        let docs =
            [json!({"kind": "Service", "metadata": {"name": "a"}}), json!({"kind": "Pod", "metadata": {"name": "b"}})];
        let text = write_documents(&docs, Format::Json);
        let list: Value = serde_json::from_str(&text).expect("one JSON document");
        assert_eq!(list["kind"], "List");
        assert_eq!(list["apiVersion"], "v1");
        assert_eq!(list["items"], json!(docs));
        let one = write_documents(&docs[..1], Format::Json);
        assert_eq!(serde_json::from_str::<Value>(&one).unwrap(), docs[0], "one document is itself");
    }

    #[test]
    fn detects_json() {
        assert_eq!(Format::detect("  {\"kind\": \"Pod\"}"), Format::Json);
        assert_eq!(Format::detect("kind: Pod"), Format::Yaml);
        assert_eq!(Format::detect("---\n{}"), Format::Yaml);
    }

    #[test]
    fn a_deployment_template_is_injected_without_a_namespace_or_name_added() {
        let mut deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
        });
        let reports = inject_document(&engine(), &mut deployment, "shop").unwrap();
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].workload, "Deployment shop/web");
        assert!(matches!(reports[0].verdict, Verdict::Injected { .. }));
        let template = &deployment["spec"]["template"];
        assert_eq!(template["spec"]["containers"][1]["name"], "proxy");
        assert_eq!(template["metadata"]["labels"]["app"], "web", "the template's own labels stay");
        assert!(template["metadata"].get("namespace").is_none());
        assert!(template["metadata"].get("generateName").is_none());
        let service_name = template["spec"]["containers"][1]["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "PROXY_SERVICE_NAME")
            .unwrap()["value"]
            .clone();
        assert_eq!(service_name, "web", "rendered from the pod's labels");
        assert!(deployment.get("status").is_none());
    }

    #[test]
    fn a_template_that_is_not_an_object_is_an_error_naming_the_workload() {
        let mut job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "n"}, "spec": {"template": 3}});
        let error = inject_document(&engine(), &mut job, "default").unwrap_err();
        assert_eq!(error.to_string(), "Job n/j: the pod template at /spec/template is not an object");
        let mut other = json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "spec": {"tasks": []}});
        let before = other.clone();
        assert!(inject_document(&engine(), &mut other, "default").unwrap().is_empty());
        assert_eq!(other, before, "another group's Job is not a workload we know");
    }
}
