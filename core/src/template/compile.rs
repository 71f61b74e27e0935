//! Compiling parts into a [`Template`]: combined in order, the injector's own part added, the leaves dry-rendered on
//! a sample pod, the result decoded as the API types, the trees compiled. Proving the template on sample pods through
//! the merge is [`crate::template_set`]'s.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::native::as_native_sidecars;
use super::part::{annotation_keys, names_in};
use super::part_settings::{JobPolicy, NATIVE_SIDECAR_MINOR, PartSettings};
use super::stamp::{StampText, hex_prefix, insert_status, status_value};
use super::yaml::{self, PathSeg, YNode, YValue, display_path};
use super::{
    Hold, Injects, OverrideSpec, Part, PodContext, Port, Problem, Sources, Template, TemplateError, TemplateId, Trees,
    api_types, by_line, combine, hold, leaf_checks, several, tree,
};
use crate::pod_api::merge_rules::{Place, SAFE_TO_EVICT_LOCAL_VOLUMES};
use crate::pod_api::spec::{CONTAINERS, INIT_CONTAINERS};
use crate::settings::Settings;

/// Which shape of a template to assemble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// As the files say.
    AsWritten,
    /// For the pods of Jobs: the containers as native sidecars.
    ForJobs,
}

/// The sections of several parts laid one over the other: each later part fills only what the earlier ones
/// leave out, by injection's own rules ([`combine::fill`]), its render slots numbered after theirs.
pub(super) struct Combined {
    pub(super) pod: YNode,
    pub(super) container_defaults: Option<YNode>,
    /// For each render slot, the file and place of its expression (for messages).
    pub(super) slot_paths: Vec<String>,
    /// The overrides of every part; an annotation the first to declare it keeps.
    pub(super) overrides: Vec<OverrideSpec>,
}

impl Combined {
    pub(super) fn of(parts: &[&Part]) -> Self {
        let first = parts.first().expect("a template is assembled from at least one part");
        let mut combined = Combined {
            pod: first.pod.clone(),
            container_defaults: first.container_defaults.clone(),
            slot_paths: first.slot_paths.iter().map(|p| display_path(p)).collect(),
            overrides: first.overrides.clone(),
        };
        for part in &parts[1..] {
            combined.add(Some(part));
        }
        combined
    }

    /// Lays `part` under what is there: it fills only what the parts before it leave out.
    pub(super) fn add(&mut self, part: Option<&Part>) {
        let Some(part) = part else { return };
        let offset = self.slot_paths.len();
        combine::fill(&mut self.pod, &combine::renumbered(&part.pod, offset));
        if let Some(defaults) = &part.container_defaults {
            let defaults = combine::renumbered(defaults, offset);
            match &mut self.container_defaults {
                Some(mine) => combine::fill(mine, &defaults),
                None => self.container_defaults = Some(defaults),
            }
        }
        let paths = part.slot_paths.iter().map(|p| format!("{}: {}", part.file, display_path(p)));
        self.slot_paths.extend(paths);
        for spec in &part.overrides {
            if !self.overrides.iter().any(|o| o.annotation == spec.annotation) {
                self.overrides.push(spec.clone());
            }
        }
    }
}

/// The annotation `kubectl logs`, `exec` and `attach` read for the container to use when none is named: without
/// it they take the first container, which may be ours (kubernetes#96986).
pub const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";

/// What the injector adds to every template, as a part of its own laid under the template's (so the same merge
/// rules apply, and a template that writes one of these annotations keeps its own value):
///
/// - when the template injects containers, the default-container annotation, naming the pod's first container
///   that is not one of ours;
/// - when it injects local volumes (`emptyDir`, `hostPath`), the cluster autoscaler's
///   [`SAFE_TO_EVICT_LOCAL_VOLUMES`] naming them, so that they do not keep
///   the node from being scaled down; merged as a set with the pod's own list.
///
/// `None` when there is neither.
pub(super) fn injector_part(
    injects: &Injects,
    pod: &YNode,
    settings: &Settings,
) -> Result<Option<Part>, TemplateError> {
    let written = |key: &str| {
        pod.map_get("metadata").and_then(|m| m.map_get("annotations")).and_then(|a| a.map_get(key)).is_some()
    };
    let mut annotations = serde_json::Map::new();
    if !injects.containers.is_empty() && !written(DEFAULT_CONTAINER_ANNOTATION) {
        annotations.insert(DEFAULT_CONTAINER_ANNOTATION.into(), default_container_leaf(&injects.containers).into());
    }
    let local = local_volumes(pod);
    if !local.is_empty() {
        annotations.insert(SAFE_TO_EVICT_LOCAL_VOLUMES.into(), local.join(",").into());
    }
    if annotations.is_empty() {
        return Ok(None);
    }
    let source = serde_json::json!({"pod": {"metadata": {"annotations": annotations}}});
    let file = "(the injector's annotations)";
    Part::parse("injector", file, &source.to_string(), None, &settings.annotation_prefix).map(Some)
}

/// The default-container annotation's leaf for a template whose containers are `ours`: the pod's first container
/// that is not one of ours. A pod whose every container is ours (it declares only the sidecar) gets an empty name,
/// which kubectl ignores. The first container answers at once when it is not ours (almost every pod): minijinja's
/// filters are eager, and a walk of every name cost a pod of 250 containers half its review.
pub(crate) fn default_container_leaf(ours: &[String]) -> String {
    // A JSON list of names is a minijinja list literal too.
    let ours = serde_json::to_string(ours).expect("a list of strings serialises");
    format!(
        r#"{{{{ pod.containers[0].name if pod.containers and pod.containers[0].name not in {ours} else (pod.containers | map(attribute="name") | reject("in", {ours}) | first | default("")) }}}}"#
    )
}

/// The names of the template's volumes that keep a node from being scaled down unless the pod says they may be
/// lost: `emptyDir` and `hostPath` ones.
pub(super) fn local_volumes(pod: &YNode) -> Vec<&str> {
    let volumes = match pod.map_get("spec").and_then(|s| s.map_get("volumes")).map(|v| &v.value) {
        Some(YValue::Seq(items)) => items.as_slice(),
        _ => &[],
    };
    let local = |volume: &&YNode| ["emptyDir", "hostPath"].iter().any(|source| volume.map_get(source).is_some());
    volumes.iter().filter(local).filter_map(|v| v.map_get("name").and_then(YNode::as_str)).collect()
}

/// The per-pod leaves of every part rendered on the sample pod, slot by slot.
pub(super) struct SampleRender {
    pub(super) buf: Vec<u8>,
    pub(super) ranges: Vec<std::ops::Range<usize>>,
}

impl SampleRender {
    pub(super) fn slot(&self, slot: usize) -> serde_json::Value {
        serde_json::from_slice(&self.buf[self.ranges[slot].clone()]).unwrap_or(serde_json::Value::Null)
    }
}

/// Renders the per-pod leaves of `parts` on the sample pod; every leaf that cannot render there is refused at
/// its line.
pub(super) fn dry_render(parts: &[&Part]) -> Result<SampleRender, TemplateError> {
    let mut sample = SampleRender { buf: Vec::new(), ranges: Vec::new() };
    let pod = sample_pod();
    let mut errors = Vec::new();
    for part in parts {
        if part.renderer.render(&pod, &[], &mut sample.buf, &mut sample.ranges).is_err() {
            let failures = part.renderer.all_failures(&pod);
            errors.extend(failures.iter().map(|e| part.leaf_problem(e, "cannot render on a sample pod")));
        }
    }
    match errors.is_empty() {
        true => Ok(sample),
        false => Err(several(errors)),
    }
}

/// The leaves of `parts` that render on the sample pod but fail on a pod without labels or annotations: reads of
/// a label or an annotation without a default, which fail for every pod that lacks it (each such pod is admitted
/// without the sidecar, or refused, as `onError` says). Warnings, as the template's pods may all carry them.
pub(super) fn unguarded_reads(parts: &[&Part]) -> Vec<String> {
    let bare = PodContext { labels: Default::default(), annotations: Default::default(), ..sample_pod() };
    let what = "fails on a pod without labels or annotations";
    parts
        .iter()
        .flat_map(|part| part.renderer.all_failures(&bare).into_iter().map(|e| part.leaf_problem(&e, what).to_string()))
        .collect()
}

/// Compiles the `pod` and `containerDefaults` sections into the trees the merge walks; the value of the status
/// annotation `status_key` becomes the [`TNode::Stamp`](super::tree::TNode::Stamp) a tag goes into.
pub(super) fn compile_trees(
    pod: &YNode,
    defaults: Option<&YNode>,
    status_key: &str,
    root: &YNode,
    invalid: &dyn Fn(usize, String) -> TemplateError,
) -> Result<Trees, TemplateError> {
    let problem = |base: &str, problem: Problem| {
        let problem = problem.under(base);
        invalid(root.line_of(&problem.path), problem.to_string())
    };
    let container_defaults = match defaults {
        Some(d) => {
            Some(tree::compile(d, Place::Root, &mut Vec::new(), None).map_err(|p| problem("containerDefaults", p))?)
        }
        None => None,
    };
    let mut pod = tree::compile(pod, Place::Root, &mut Vec::new(), Some("")).map_err(|p| problem("pod", p))?;
    pod.mark_stamp(&["metadata", "annotations", status_key]);
    Ok(Trees { pod, container_defaults })
}

/// The leaves of `parts` that read only overridable values, by slot (numbered across the parts), with their
/// value for a pod that overrides nothing.
pub(super) fn override_defaults(parts: &[&Part]) -> std::collections::HashMap<usize, serde_json::Value> {
    let mut fixed = std::collections::HashMap::new();
    let mut offset = 0;
    for part in parts {
        for (slot, json) in part.renderer.override_defaults() {
            fixed.insert(offset + slot, serde_json::from_str(json).unwrap_or(serde_json::Value::Null));
        }
        offset += part.slot_paths.len();
    }
    fixed
}

/// The pod that templates are dry-rendered on when they load.
#[allow(clippy::type_complexity)]
pub(super) fn sample_pod()
-> PodContext<'static, std::collections::BTreeMap<&'static str, &'static str>, Vec<(&'static str, Vec<Port<'static>>)>>
{
    let http = Port { name: Some("http"), container_port: 8080, protocol: "TCP" };
    PodContext {
        containers: vec![("app", vec![http])],
        name: "sample-7c9d5b8f6-x2x8q",
        generate_name: "sample-7c9d5b8f6-",
        namespace: "default",
        service_account_name: "default",
        labels: [("app", "sample"), ("app.kubernetes.io/name", "sample"), ("version", "v1")].into_iter().collect(),
        annotations: Default::default(),
    }
}

impl Template {
    /// Compiles a template from parts applied in order (each later part fills only what the earlier ones leave
    /// out: the same add-only merge as injection): the parts combined, the status annotation added, the leaves
    /// dry-rendered and the result decoded as the API types, then compiled. With the template, the problems that
    /// leave it whole enough to be judged further (unknown fields), so that a file's every problem is listed at
    /// once. Proving it on sample pods is the caller's ([`crate::template_set`]): that needs the merge.
    pub(crate) fn compile(
        parts: &[&Part],
        set_hash: &str,
        settings: &Settings,
        shape: Shape,
    ) -> Result<(Self, Vec<TemplateError>), TemplateError> {
        let first = parts.first().expect("a template is assembled from at least one part");
        let name = parts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(",");
        let file = parts.iter().map(|p| p.file.as_str()).collect::<Vec<_>>().join(" + ");
        let invalid = |line: usize, reason: String| TemplateError::Invalid { file: file.clone(), line, reason };
        let hash = match parts {
            [one] => one.hash.clone(),
            many => hex_prefix(&Sha256::digest(many.iter().map(|p| p.hash.as_str()).collect::<Vec<_>>().join(","))),
        };

        let part_settings: Vec<&PartSettings> = parts.iter().map(|part| &part.settings).collect();
        let combined_settings = PartSettings::combined(&part_settings);
        let native = settings.kubernetes_version.at_least(NATIVE_SIDECAR_MINOR);
        let hold = combined_settings.hold_application.then(|| Hold::for_version(native));
        let mut combined = Combined::of(parts);
        match (shape, hold) {
            // Held by startup probes, the containers are native sidecars already: there is no Job shape to make.
            (_, Some(Hold::StartupProbe)) => hold::as_held_by_startup_probes(&mut combined.pod),
            (Shape::ForJobs, _) => as_native_sidecars(&mut combined.pod),
            (Shape::AsWritten, _) => {}
        }
        let injects = Injects {
            containers: names_in(&combined.pod, CONTAINERS),
            init_containers: names_in(&combined.pod, INIT_CONTAINERS),
            volumes: names_in(&combined.pod, "volumes"),
        };
        // The injector's own part comes last, so the template's own value of what it writes wins.
        let own = injector_part(&injects, &combined.pod, settings)?;
        combined.add(own.as_ref());
        // Every part whose leaves render: the template's, then the injector's. Settings are the template's alone.
        let rendering: Vec<&Part> = parts.iter().copied().chain(own.as_ref()).collect();
        let Combined { mut pod, container_defaults, slot_paths, overrides } = combined;
        let status = status_value(&name, &hash, set_hash, &settings.revision, &injects);
        let status_key = format!("{}status", settings.annotation_prefix);
        insert_status(&mut pod, &status_key, &status, &invalid)?;

        let sample = dry_render(&rendering)?;
        let warnings = unguarded_reads(&rendering);
        let root = &first.root;
        let mut rendered = |slot: usize| sample.slot(slot);
        let problem = |problem: Problem| invalid(root.line_of(&problem.path), problem.to_string());
        let pod_json = yaml::to_json(&pod, &mut rendered);
        let defaults_json = container_defaults.as_ref().map(|defaults| yaml::to_json(defaults, &mut rendered));
        let mut found = api_types::pod(&pod_json);
        let more = defaults_json.as_ref().map(api_types::container_defaults).into_iter();
        let dropped = api_types::dropped_by_release(&pod_json, defaults_json.as_ref(), settings.kubernetes_version);
        let owned = api_types::owned_by_plugins(&pod_json);
        for more in more.chain([dropped, owned]) {
            found.problems.extend(more.problems);
            found.fatal |= more.fatal;
        }
        let problems: Vec<TemplateError> = found.problems.into_iter().map(problem).collect();
        if found.fatal {
            return Err(by_line(problems));
        }

        let compile = |pod: &YNode, defaults: Option<&YNode>| compile_trees(pod, defaults, &status_key, root, &invalid);
        let overridable = compile(&pod, container_defaults.as_ref())?;
        // Leaves that read only overridable values, with their output for a pod that overrides nothing: what a
        // pod without overrides gets, compiled apart so that it costs no more than a template without them.
        let fixed = override_defaults(&rendering);
        let plain = if fixed.is_empty() {
            None
        } else {
            let pod = combine::substituted(&pod, &fixed);
            let defaults = container_defaults.as_ref().map(|d| combine::substituted(d, &fixed));
            Some(compile(&pod, defaults.as_ref())?)
        };
        let all_slot_paths: Vec<Vec<PathSeg>> = rendering.iter().flat_map(|p| p.slot_paths.iter().cloned()).collect();
        // Leaves that read only overridable values are checked with the overrides (`vet_overrides`), not per pod.
        let mut leaf_checks =
            leaf_checks::leaf_checks(&pod, container_defaults.as_ref(), &all_slot_paths, settings.kubernetes_version);
        leaf_checks.retain(|check| !fixed.contains_key(&check.slot));
        // A pod-dependent leaf that renders something other than a string, or a quantity (held to its limit as well
        // as to its syntax), needs its part judged whole per pod; string leaves are held to their field's rule.
        let beyond_single_rules = (0..all_slot_paths.len()).filter(|slot| !fixed.contains_key(slot)).any(|slot| {
            !sample.slot(slot).is_string()
                || leaf_checks.iter().any(|c| c.slot == slot && c.rule == crate::validation::Rule::Quantity)
        });
        let rendered_baseline = beyond_single_rules.then(|| {
            let mut slot = |i: usize| sample.slot(i);
            leaf_checks::fragment_problems(&pod, container_defaults.as_ref(), &mut slot, settings.kubernetes_version)
                .iter()
                .map(crate::validation::FieldError::body)
                .collect()
        });
        let writes_host_ports =
            pod.has_key("hostPort") || container_defaults.as_ref().is_some_and(|d| d.has_key("hostPort"));
        let writes = |key: &str| pod.has_key(key) || container_defaults.as_ref().is_some_and(|d| d.has_key(key));
        let writes_mounts = writes("volumeMounts") || writes("volumeDevices");
        let writes_spread_inputs = writes("labels") || writes("topologySpreadConstraints");
        let writes_resize_policy = writes("resizePolicy");
        let jobs_fell_back = combined_settings.jobs == JobPolicy::NativeSidecar && !native;
        let template = Template {
            id: Arc::new(TemplateId::new(name, hash, set_hash.to_owned())),
            stamp: StampText::new(&status),
            status,
            injects,
            annotations: annotation_keys(&pod).chain(overrides.iter().map(|o| o.annotation.clone())).collect(),
            overridable,
            plain,
            init_position: combined_settings.init_position,
            inject_host_network: combined_settings.inject_host_network,
            hold,
            jobs: if jobs_fell_back { JobPolicy::Skip } else { combined_settings.jobs },
            jobs_fell_back,
            defaults_for: parts.iter().find_map(|p| p.defaults_for.clone()),
            keys: crate::settings::Keys::new(&settings.annotation_prefix),
            job_shape: None,
            on_error: combined_settings.on_error,
            validation: combined_settings.validation,
            overrides,
            renderers: rendering.iter().map(|p| p.renderer.clone()).collect(),
            slot_paths,
            sources: Sources { pod, container_defaults },
            writes_host_ports,
            writes_mounts,
            writes_spread_inputs,
            writes_resize_policy,
            rendered_baseline,
            leaf_checks,
            kubernetes_version: settings.kubernetes_version,
            warnings,
        };
        Ok((template, problems))
    }
}
