//! The checked assembly: a template's parts compiled (by [`crate::template`]), then proven as the API server
//! would judge them. This room sits above the merge because proving needs it: the template is applied to sample
//! pods of several shapes (named, `generateName` only, with init containers of their own, with several containers
//! of other shapes for the container defaults, declaring the sidecar themselves), the patch applied as the API
//! server applies it, and each result validated ([`validation::validate_pod`]). Every problem is reported at the
//! template line that causes it, so a broken edit is refused while the last good set keeps serving.
//!
//! The same dry run gives a template's Pod Security level ([`pod_security`]) and, for the differential tests, a
//! pod injected with nothing checked ([`inject_unchecked`]).

use serde_json::{Value as J, json};

use crate::patch::{ApplyError, Pointer};
use crate::pod::PodView;
use crate::pod_api::merge_rules::merge_key_for;
use crate::settings::Settings;
use crate::template::tree::Rendered;
use crate::template::yaml::{self, YNode};
use crate::template::{Overrides, Part, Shape, Template, TemplateError, by_line, several};
use crate::validation::{self, FieldPath, KubeVersion, Seg};

/// The namespace sample pods are created in.
const SAMPLE_NAMESPACE: &str = "default";

/// Assembles a template from parts applied in order (each later part fills only what the earlier ones leave
/// out: the same add-only merge as injection), then dry-runs it on sample pods and validates the results as the
/// API server would.
///
/// When pods of Jobs get native sidecars, the template is also assembled and checked in that shape.
pub(crate) fn assemble(parts: &[&Part], set_hash: &str, settings: &Settings) -> Result<Template, TemplateError> {
    let file = parts.iter().map(|p| p.file()).collect::<Vec<_>>().join(" + ");
    let checked = |shape: Shape| -> Result<Template, TemplateError> {
        let (template, mut problems) = Template::compile(parts, set_hash, settings, shape)?;
        let file = match shape {
            Shape::AsWritten => file.clone(),
            Shape::ForJobs => format!("{file} (its containers as native sidecars, for Jobs)"),
        };
        let (pod, defaults) = template.sources();
        problems.extend(check(&template, pod, defaults, &file, settings.kubernetes_version));
        match problems.is_empty() {
            true => Ok(template),
            false => Err(by_line(problems)),
        }
    };
    let mut template = checked(Shape::AsWritten)?;
    if template.has_job_shape() {
        let for_jobs = checked(Shape::ForJobs)?;
        template.set_job_shape(for_jobs);
    }
    Ok(template)
}

/// Why a template could not be applied to a pod off the request path.
#[derive(Debug, thiserror::Error)]
pub enum DryRunError {
    /// The template itself did not compile.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The pod could not be read back as JSON.
    #[error("the pod is not JSON: {0}")]
    Pod(#[source] simd_json::Error),
    /// A leaf failed to render for this pod.
    #[error("{0}")]
    Render(String),
    /// The merge's patch does not apply: a bug of ours.
    #[error(transparent)]
    Patch(#[from] ApplyError),
}

/// Injects the template in `source` into `pod` (overrides read from its annotations, checked for their type
/// only) without the API server's rules being applied, neither to the template nor to the overrides: what the
/// injected pod would be if nothing checked it. For tests that compare those rules with a real API server.
#[doc(hidden)]
pub fn inject_unchecked(source: &str, pod: &J, settings: &Settings) -> Result<J, DryRunError> {
    let part = Part::parse("unchecked", "unchecked.yaml", source, None, &settings.annotation_prefix)?;
    let (template, problems) = Template::compile(&[&part], "unchecked", settings, Shape::AsWritten)?;
    if !problems.is_empty() {
        return Err(several(problems).into());
    }
    let overrides = template.overrides_of(pod);
    dry_run(&template, pod, &overrides)
}

/// The Pod Security Standards level of the pods `template` injects, when the app itself meets `restricted`: the
/// highest level its pods can meet, and, in the report, the fields that keep them from the levels above it.
pub fn pod_security(template: &Template) -> Result<crate::pod_security::Report, DryRunError> {
    dry_run(template, &restricted_app_pod(), &[]).map(|injected| crate::pod_security::evaluate(&injected))
}

/// Pods of the shapes a template meets, named for messages: what every template is dry-run on when it loads.
/// `sidecar` is a container the template injects (and `init` whether it is an init container): one sample
/// declares it itself, as a user may.
fn sample_pods(sidecar: Option<(&str, bool)>) -> Vec<(&'static str, J)> {
    let app = json!({
        "name": "app", "image": "registry.example.com/shop/app:1.0",
        "ports": [{"name": "http", "containerPort": 8080}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    });
    let pod = |metadata: J, init: J, extra: Option<J>| {
        let mut containers = vec![app.clone()];
        containers.extend(extra);
        json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"serviceAccountName": "shop", "containers": containers, "initContainers": init,
                     "volumes": [{"name": "data", "emptyDir": {}}]},
        })
    };
    let labels = json!({"app": "shop", "app.kubernetes.io/name": "shop", "version": "v1"});
    let named = json!({"name": "shop-0", "namespace": SAMPLE_NAMESPACE, "labels": labels});
    let generated = json!({"generateName": "shop-7c9d5b8f6-", "namespace": SAMPLE_NAMESPACE, "labels": labels});
    let migrate = json!([{"name": "migrate", "image": "registry.example.com/shop/migrate:1.0"}]);
    // Containers of other shapes, for what the container defaults add to every container: one with nothing but
    // its image, one with limits, a security context, env and a port of another number.
    let worker = json!({
        "name": "worker", "image": "registry.example.com/shop/worker:1.0",
        "ports": [{"name": "metrics", "containerPort": 9090}],
        "env": [{"name": "MODE", "value": "batch"}],
        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": {"runAsUser": 1000, "runAsNonRoot": true},
    });
    let bare = json!({"name": "bare", "image": "registry.example.com/shop/bare:1.0"});
    let mut several = pod(named.clone(), json!([]), Some(worker));
    if let Some(containers) = several["spec"]["containers"].as_array_mut() {
        containers.push(bare);
    }
    let mut samples = vec![
        ("a named pod", pod(named.clone(), json!([]), None)),
        ("a pod with only a generateName", pod(generated, json!([]), None)),
        ("a pod with init containers", pod(named.clone(), migrate, None)),
        ("a pod with several containers", several),
    ];
    if let Some((name, init)) = sidecar {
        let own = json!({"name": name, "image": "registry.example.com/own/sidecar:1.0"});
        let sample = if init { pod(named, json!([own]), None) } else { pod(named, json!([]), Some(own)) };
        samples.push(("a pod that declares the sidecar itself", sample));
    }
    samples
}

/// A pod whose only container meets the Pod Security `restricted` level on its own (nothing set at pod level, so
/// that what a template adds there shows): what a template's [`pod_security`] is judged on.
fn restricted_app_pod() -> J {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "shop-0", "namespace": SAMPLE_NAMESPACE, "labels": {"app": "shop"}},
        "spec": {"containers": [{
            "name": "app", "image": "registry.example.com/shop/app:1.0",
            "ports": [{"name": "http", "containerPort": 8080}],
            "securityContext": {
                "allowPrivilegeEscalation": false, "runAsNonRoot": true,
                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
            },
        }]},
    })
}

/// Applies `template` (with `overrides`) to `pod` as the webhook would, and the patch as the API server would:
/// the injected pod.
fn dry_run(template: &Template, pod: &J, overrides: &Overrides) -> Result<J, DryRunError> {
    // A `Value` always serialises.
    let mut bytes = serde_json::to_vec(pod).expect("JSON values serialise");
    let tape = simd_json::to_tape(&mut bytes).map_err(DryRunError::Pod)?;
    let view = PodView::new(tape.as_value(), SAMPLE_NAMESPACE, &template.keys.prefix);
    let context = view.context(template.reads());
    let (mut buf, mut ranges) = (Vec::new(), Vec::new());
    template.render(&context, overrides, None, &mut buf, &mut ranges).map_err(|e| DryRunError::Render(e.reason))?;
    let mut patch = Vec::new();
    let rendered = Rendered { buf: &buf, ranges: &ranges, stamp: None };
    crate::merge::merge(template, !overrides.is_empty(), &view, rendered, &mut Pointer::default(), &mut patch, &mut ());
    Ok(crate::patch::apply(pod, &patch)?)
}

/// Dry-runs `template` on every sample pod and validates the results: every problem at its line of `file`.
/// `pod` and `defaults` are the template's `pod` and `containerDefaults` sections, with their lines.
fn check(
    template: &Template,
    pod: &YNode,
    defaults: Option<&YNode>,
    file: &str,
    version: KubeVersion,
) -> Vec<TemplateError> {
    let injects = template.injects();
    let sidecar = injects
        .containers
        .first()
        .map(|name| (name.as_str(), false))
        .or_else(|| injects.init_containers.first().map(|name| (name.as_str(), true)));
    let mut problems: Vec<(usize, String, String)> = Vec::new();
    for (shape, sample) in sample_pods(sidecar) {
        let injected = match dry_run(template, &sample, &[]) {
            Ok(injected) => injected,
            Err(reason) => {
                problems.push((pod.line, String::new(), format!("cannot be applied to {shape}: {reason}")));
                continue;
            }
        };
        for error in validation::validate_pod(&injected, version) {
            let line = line_of(pod, defaults, &injected, &error.path);
            let body = error.body();
            if problems.iter().any(|(l, b, _)| *l == line && *b == body) {
                continue; // the same problem, met again on another sample pod
            }
            problems.push((line, body, format!("{error} (the API server would refuse {shape} with this injected)")));
        }
    }
    problems
        .into_iter()
        .map(|(line, _, reason)| TemplateError::Invalid { file: file.to_owned(), line, reason })
        .collect()
}

/// The line of the template that put the field at `path` into `injected`: the template's node for it, found by
/// walking both (list items by their merge key), or the deepest node on the way. A field of one of the pod's own
/// containers comes from the container defaults.
fn line_of(pod: &YNode, defaults: Option<&YNode>, injected: &J, path: &FieldPath) -> usize {
    let mut node = pod;
    let mut value = injected;
    let mut field = "";
    for seg in &path.0 {
        match seg {
            Seg::Field(_) | Seg::Key(_) => {
                let key = seg.key().unwrap_or_default();
                value = value.get(key).unwrap_or(&J::Null);
                match node.map_get(key) {
                    Some(next) => node = next,
                    None => return node.line,
                }
                field = key;
            }
            Seg::Index(i) => {
                let item = value.get(*i).unwrap_or(&J::Null);
                let found = merge_key_for(field).and_then(|key| {
                    let wanted = item.get(key)?;
                    match &node.value {
                        yaml::YValue::Seq(items) => items
                            .iter()
                            .find(|t| t.map_get(key).is_some_and(|k| yaml::to_json(k, &mut |_| J::Null) == *wanted)),
                        _ => None,
                    }
                });
                match (found, defaults) {
                    (Some(next), _) => node = next,
                    // One of the pod's own containers: what the template added to it came from the defaults.
                    (None, Some(defaults)) if field == "containers" => node = defaults,
                    (None, _) => return node.line,
                }
                value = item;
            }
        }
    }
    node.line
}
