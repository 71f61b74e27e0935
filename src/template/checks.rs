//! The API server's rules applied to a template, so that what we inject is a pod it accepts.
//!
//! - **At load** ([`check`]): the template is applied to sample pods of several shapes (named, `generateName`
//!   only, with init containers of their own, with several containers of other shapes for the container defaults,
//!   declaring the sidecar themselves), the patch applied as the API server applies it, and each result validated
//!   ([`validation::validate_pod`]). Every problem is reported at the template line that causes it, so a broken
//!   edit is refused while the last good set keeps serving.
//! - **Per pod, whole**: a template that writes host ports has each pod judged with its sidecar merged in
//!   (`Engine::pod_conflict_failure`), as only the pod knows which host ports it uses.
//! - **Per pod**: a leaf rendered from the pod is held to the rule of the field it lands in ([`LeafCheck`],
//!   found by the validator itself); overrides are tried on the template's own containers and one that would make
//!   them invalid is refused with a warning ([`Template::vet_overrides`]).

use serde_json::{Value as J, json};

use super::schema::merge_key_for;
use super::tree::Rendered;
use super::yaml::{self, PathSeg, YNode};
use super::{ContainerEntries, PodContext, StrEntries, Template, TemplateError};
use crate::patch::Pointer;
use crate::pod::PodView;
use crate::validation::{self, FieldError, FieldPath, KubeVersion, Rule, Seg};

/// The name the container defaults go by when they are validated as a container of their own.
const DEFAULTS_CONTAINER: &str = "container-defaults";
/// The namespace sample pods are created in.
const SAMPLE_NAMESPACE: &str = "default";

/// A per-pod leaf and the rule of the field it is rendered into.
#[derive(Debug, Clone)]
pub(crate) struct LeafCheck {
    pub slot: usize,
    pub rule: Rule,
    /// The field, for messages.
    pub path: FieldPath,
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
/// that what a template adds there shows): what a template's [`pod_security`](Template::pod_security) is judged on.
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

impl Template {
    /// The Pod Security Standards level of the pods this template injects, when the app itself meets
    /// `restricted`: the highest level its pods can meet, and, in the report, the fields that keep them from the
    /// levels above it.
    pub fn pod_security(&self) -> Result<crate::pod_security::Report, String> {
        dry_run(self, &restricted_app_pod(), &[]).map(|injected| crate::pod_security::evaluate(&injected))
    }
}

/// Applies `template` (with `overrides`) to `pod` as the webhook would, and the patch as the API server would:
/// the injected pod.
pub(crate) fn dry_run(template: &Template, pod: &J, overrides: &super::Overrides) -> Result<J, String> {
    // A `Value` always serialises.
    let mut bytes = serde_json::to_vec(pod).expect("JSON values serialise");
    let tape = simd_json::to_tape(&mut bytes).map_err(|e| e.to_string())?;
    let view = PodView::new(tape.as_value(), SAMPLE_NAMESPACE);
    let context = view.context(template.reads());
    let (mut buf, mut ranges) = (Vec::new(), Vec::new());
    template.render(&context, overrides, None, &mut buf, &mut ranges).map_err(|e| e.reason)?;
    let mut patch = Vec::new();
    let rendered = Rendered { buf: &buf, ranges: &ranges };
    crate::merge::merge(template, !overrides.is_empty(), &view, rendered, &mut Pointer::default(), &mut patch, &mut ());
    let patch: json_patch::Patch = serde_json::from_slice(&patch).map_err(|e| e.to_string())?;
    let mut injected = pod.clone();
    json_patch::patch(&mut injected, &patch).map_err(|e| format!("the patch does not apply: {e}"))?;
    Ok(injected)
}

/// Dry-runs `template` on every sample pod and validates the results: every problem at its line of `file`.
/// `pod` and `defaults` are the template's `pod` and `containerDefaults` sections, with their lines.
pub(super) fn check(
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

/// The template's own part of a pod, to validate without a pod around it: its `pod` section, and its container
/// defaults as one more container. Returns the index of that container.
fn fragment(pod: &YNode, defaults: Option<&YNode>, slot: &mut dyn FnMut(usize) -> J) -> (J, Option<usize>) {
    let mut fragment = yaml::to_json(pod, slot);
    let Some(defaults) = defaults else { return (fragment, None) };
    let mut container = yaml::to_json(defaults, slot);
    if let J::Object(members) = &mut container {
        members.entry("name").or_insert_with(|| DEFAULTS_CONTAINER.into());
        members.entry("image").or_insert_with(|| "defaults".into());
    }
    let Some(spec) = fragment.as_object_mut().map(|f| f.entry("spec").or_insert_with(|| json!({}))) else {
        return (fragment, None);
    };
    let Some(containers) = spec.as_object_mut().map(|s| s.entry("containers").or_insert_with(|| json!([]))) else {
        return (fragment, None);
    };
    let Some(list) = containers.as_array_mut() else { return (fragment, None) };
    list.push(container);
    let index = list.len() - 1;
    (fragment, Some(index))
}

/// The rule each per-pod leaf is held to: the validator's rule for the field the leaf sits in, if any.
/// `slot_paths[i]` is where slot `i` sits in the template (`pod.…` or `containerDefaults.…`).
pub(super) fn leaf_checks(
    pod: &YNode,
    defaults: Option<&YNode>,
    slot_paths: &[Vec<PathSeg>],
    version: KubeVersion,
) -> Vec<LeafCheck> {
    // Dynamic leaves become strings here: the rules are found by where they sit, not by what they hold.
    let (fragment, defaults_index) = fragment(pod, defaults, &mut |_| J::String(String::new()));
    let rules = validation::leaf_rules(&fragment, version);
    let mut checks = Vec::new();
    for (slot, template_path) in slot_paths.iter().enumerate() {
        let Some(field_path) = field_path_of(template_path, defaults_index) else { continue };
        if let Some((path, rule)) = rules.iter().find(|(path, _)| same_place(path, &field_path)) {
            let mut path = path.clone();
            name_the_container(&mut path, &fragment);
            checks.push(LeafCheck { slot, rule: *rule, path });
        }
    }
    checks
}

/// A template path (`pod.spec.containers[0].name`, `containerDefaults.resources…`) as keys and indices in the
/// fragment, or `None` for another section.
fn field_path_of(template_path: &[PathSeg], defaults_index: Option<usize>) -> Option<Vec<PathSeg>> {
    let (head, rest) = template_path.split_first()?;
    match (head, defaults_index) {
        (PathSeg::Key(k), _) if k == "pod" => Some(rest.to_vec()),
        (PathSeg::Key(k), Some(index)) if k == "containerDefaults" => {
            let mut path = vec![PathSeg::Key("spec".into()), PathSeg::Key("containers".into()), PathSeg::Index(index)];
            path.extend_from_slice(rest);
            Some(path)
        }
        _ => None,
    }
}

fn same_place(path: &FieldPath, template_path: &[PathSeg]) -> bool {
    path.0.len() == template_path.len()
        && path.0.iter().zip(template_path).all(|(seg, t)| match (seg, t) {
            (Seg::Index(a), PathSeg::Index(b)) => a == b,
            (seg, PathSeg::Key(k)) => seg.key() == Some(k.as_str()),
            _ => false,
        })
}

/// The problems of the template's own part of a pod (its `pod` section and its container defaults as a container),
/// with the leaves' values from `slot`.
pub(super) fn fragment_problems(
    pod: &YNode,
    defaults: Option<&YNode>,
    slot: &mut dyn FnMut(usize) -> J,
    version: KubeVersion,
) -> Vec<FieldError> {
    let (fragment, _) = fragment(pod, defaults, slot);
    let mut problems = validation::validate_pod(&fragment, version);
    for problem in &mut problems {
        name_the_container(&mut problem.path, &fragment);
    }
    problems
}

/// Names the container of a path into a fragment (`spec.containers[proxy].image`) instead of numbering it: in
/// the fragment the template's containers stand alone, and in the injected pod they follow the pod's own, at
/// other indices, so the fragment's index would point at the wrong container.
fn name_the_container(path: &mut FieldPath, fragment: &J) {
    if let [Seg::Field(spec), Seg::Field(list), Seg::Index(i), ..] = path.0.as_slice()
        && spec == "spec"
        && matches!(list.as_ref(), "containers" | "initContainers")
        && let Some(name) = fragment["spec"][list.as_ref()][*i]["name"].as_str()
    {
        path.0[2] = Seg::Key(name.to_owned());
    }
}

impl Template {
    /// Does this template's part need judging whole with each pod's values: do its per-pod leaves render values
    /// no single-field rule judges (numbers, quantities held to their limits)? If so, [`Template::check_rendered`]
    /// gives the first problem the sample pod's values did not have. Every other template pays nothing.
    pub(crate) fn judges_rendered_values(&self) -> bool {
        self.rendered_baseline.is_some()
    }

    /// See [`Template::judges_rendered_values`]: the judgement.
    pub(crate) fn check_rendered(&self, rendered: Rendered<'_>) -> Result<(), FieldError> {
        let Some(baseline) = &self.rendered_baseline else { return Ok(()) };
        self.judge_rendered(rendered, baseline)
    }

    #[cold]
    fn judge_rendered(&self, rendered: Rendered<'_>, baseline: &[String]) -> Result<(), FieldError> {
        let mut slot = |i: usize| serde_json::from_slice(rendered.slot(i)).unwrap_or(J::Null);
        let problems = fragment_problems(
            &self.sources.pod,
            self.sources.container_defaults.as_ref(),
            &mut slot,
            self.kubernetes_version,
        );
        problems.into_iter().find(|e| !baseline.contains(&e.body())).map_or(Ok(()), Err)
    }

    /// Checks the rendered per-pod leaves against the rules of their fields: the first that breaks one, with the
    /// API server's error.
    pub(crate) fn check_leaves(&self, rendered: Rendered<'_>) -> Result<(), (usize, FieldError)> {
        for check in &self.leaf_checks {
            let json = rendered.slot(check.slot);
            // Only strings are held to a string rule; a leaf of another type is refused by the API types at load.
            let Ok(text) = serde_json::from_slice::<std::borrow::Cow<'_, str>>(json) else { continue };
            let mut errors = Vec::new();
            if !check.rule.check(&check.path, &text, &text, &mut errors) {
                return Err((check.slot, errors.swap_remove(0)));
            }
        }
        Ok(())
    }

    /// Refuses, with a warning each, the overrides that would make the template's own containers (or labels,
    /// annotations, volumes) invalid: a negative quantity, a request above the limit it meets once every override
    /// is applied, a bad name. What is left in `overrides` is safe to inject.
    pub(crate) fn vet_overrides<M: StrEntries, C: ContainerEntries>(
        &self,
        pod: &PodContext<'_, M, C>,
        overrides: &mut Vec<(String, J)>,
        warnings: &mut Vec<String>,
    ) {
        let problems = |set: &[(String, J)]| -> Vec<FieldError> {
            let (mut buf, mut ranges) = (Vec::new(), Vec::new());
            // A leaf that fails to render is not this check's to judge: the render proper reports it.
            if self.render(pod, set, None, &mut buf, &mut ranges).is_err() {
                return Vec::new();
            }
            let rendered = Rendered { buf: &buf, ranges: &ranges };
            let mut slot = |i: usize| serde_json::from_slice(rendered.slot(i)).unwrap_or(J::Null);
            let defaults = self.sources.container_defaults.as_ref();
            fragment_problems(&self.sources.pod, defaults, &mut slot, self.kubernetes_version)
        };
        // Most pods' overrides are valid: one validation says so. Only then is the template's own fragment judged:
        // what its own values give (a fragment alone lacks the pod's volumes, say) is not an override's doing.
        let mut current = problems(overrides);
        if current.is_empty() {
            return;
        }
        let baseline = problems(&[]);
        while !overrides.is_empty() {
            let Some(first) = current.iter().find(|e| !baseline.contains(e)) else { return };
            // The override without which this problem goes away; failing that, the last one applied.
            let culprit = (0..overrides.len())
                .find(|&i| {
                    let mut without = overrides.clone();
                    without.remove(i);
                    !problems(&without).contains(first)
                })
                .unwrap_or(overrides.len() - 1);
            let (value_key, value) = overrides.remove(culprit);
            let annotation = self.overrides.iter().find(|o| o.value == value_key).map_or("", |o| o.annotation.as_str());
            let shown = match &value {
                J::String(s) => format!("{s:?}"),
                other => other.to_string(),
            };
            warnings.push(format!(
                "sidecar-injector: annotation {annotation}={shown} refused: the API server would refuse the pod: \
                 {first}; the template's value is used"
            ));
            current = problems(overrides);
        }
    }
}
