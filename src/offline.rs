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

use crate::{Engine, Mode, Verdict};

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
    inject_into(engine, document, namespace, &mut reports)?;
    Ok(reports)
}

fn inject_into(
    engine: &Engine,
    document: &mut Value,
    namespace: &str,
    reports: &mut Vec<TemplateReport>,
) -> Result<(), OfflineError> {
    let kind = document["kind"].as_str().unwrap_or_default().to_owned();
    if kind.ends_with("List") {
        if let Some(items) = document.get_mut("items").and_then(Value::as_array_mut) {
            for item in items {
                inject_into(engine, item, namespace, reports)?;
            }
        }
        return Ok(());
    }
    let group = document["apiVersion"].as_str().and_then(|v| v.rsplit_once('/')).map_or("", |(group, _)| group);
    let Some(path) = template_path(group, &kind) else { return Ok(()) };
    // The pods of a Job (and of a CronJob, through its Jobs) carry the Job as their owner, which templates read.
    let by_job = group == "batch";
    let metadata = &document["metadata"];
    let namespace = metadata["namespace"].as_str().unwrap_or(namespace).to_owned();
    let name = metadata["name"].as_str().unwrap_or_default().to_owned();
    let workload = format!("{kind} {namespace}/{name}");
    if path.is_empty() {
        reports.push(inject_pod(engine, document, &workload, &namespace, None, false)?);
        return Ok(());
    }
    let Some(template) = document.pointer_mut(path).filter(|t| t.is_object()) else {
        return Err(OfflineError::NotATemplate { workload, path });
    };
    // A controller names its pods after itself; `<name>-` is what the webhook's templates will see, near enough.
    let generate_name = (!name.is_empty()).then(|| format!("{name}-"));
    reports.push(inject_pod(engine, template, &workload, &namespace, generate_name, by_job)?);
    Ok(())
}

/// Where the pod template of a workload kind (of an API group) is: `""` for a Pod itself, `None` for kinds
/// without one. Kinds of the same name in other groups (a CRD's `Job`) are not ours to touch.
fn template_path(group: &str, kind: &str) -> Option<&'static str> {
    match (group, kind) {
        ("", "Pod") => Some(""),
        ("", "ReplicationController")
        | ("apps" | "extensions", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
        | ("batch", "Job") => Some("/spec/template"),
        ("batch", "CronJob") => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

/// Injects into one pod (or pod template: `metadata` and `spec`) in place, through a Pod CREATE review.
fn inject_pod(
    engine: &Engine,
    pod: &mut Value,
    workload: &str,
    namespace: &str,
    generate_name: Option<String>,
    by_job: bool,
) -> Result<TemplateReport, OfflineError> {
    let internal = |reason: String| OfflineError::Internal { workload: workload.to_owned(), reason };
    // The pod as the API server would pass it to the webhook: with its namespace and, from a controller, a
    // generateName and (from a Job) an owner reference. Each is taken out again afterwards, so the template keeps
    // only what it had.
    let mut object = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "spec": pod.get("spec").cloned().unwrap_or_else(|| json!({})),
    });
    let metadata = object["metadata"].as_object_mut().ok_or_else(|| internal("metadata is not an object".into()))?;
    let added_namespace = !metadata.contains_key("namespace");
    if added_namespace {
        metadata.insert("namespace".into(), namespace.into());
    }
    let added_generate_name = match generate_name {
        Some(generate_name) if !metadata.contains_key("name") && !metadata.contains_key("generateName") => {
            metadata.insert("generateName".into(), generate_name.into());
            true
        }
        _ => false,
    };
    let added_owner = by_job && !metadata.contains_key("ownerReferences");
    if added_owner {
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "name": workload, "uid": "", "controller": true});
        metadata.insert("ownerReferences".into(), json!([job]));
    }
    let mut review = pod_create_review("sidecar-injector-inject", namespace, object);
    // Serialising a `Value` cannot fail.
    let mut body = serde_json::to_vec(&review).expect("JSON values serialise");
    let mut response = Vec::new();
    let outcome = engine.trace(&mut body, &mut response, Mode::Mutate).map_err(|e| internal(e.to_string()))?;
    if let Verdict::Denied(_) = outcome.verdict {
        let message = outcome.message.clone().unwrap_or_default();
        return Err(OfflineError::Refused { workload: workload.to_owned(), message });
    }
    if let Some(patch) = outcome.trace.as_ref().and_then(|t| t.patch.as_deref()) {
        let patch: json_patch::Patch = serde_json::from_slice(patch).map_err(|e| internal(e.to_string()))?;
        let mut injected = review["request"]["object"].take();
        json_patch::patch(&mut injected, &patch).map_err(|e| internal(format!("the patch does not apply: {e}")))?;
        let metadata = injected["metadata"].as_object_mut().ok_or_else(|| internal("metadata vanished".into()))?;
        if added_namespace {
            metadata.remove("namespace");
        }
        if added_generate_name {
            metadata.remove("generateName");
        }
        if added_owner {
            metadata.remove("ownerReferences");
        }
        let target = pod.as_object_mut().ok_or_else(|| internal("the pod is not an object".into()))?;
        target.insert("metadata".into(), injected["metadata"].take());
        target.insert("spec".into(), injected["spec"].take());
    }
    let why = outcome.skip_explanation();
    Ok(TemplateReport { workload: workload.to_owned(), verdict: outcome.verdict, warnings: outcome.warnings, why })
}

/// The Pod CREATE review (admission.k8s.io/v1) the API server would send for `pod` in `namespace`: how the
/// commands that judge pods offline (`inject`, `status`) put one through the engine.
pub(crate) fn pod_create_review(uid: &str, namespace: &str, pod: Value) -> Value {
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
