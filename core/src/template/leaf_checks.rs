//! The API server's rules held against a template's own leaves, so that a value rendered from a pod or set by
//! an override lands only where the API server would accept it. (The whole template is proven on sample pods one
//! floor up, in [`crate::template_set`]: that needs the merge, which needs a compiled template.)
//!
//! - **Per pod**: a leaf rendered from the pod is held to the rule of the field it lands in ([`LeafCheck`],
//!   found by the validator itself), and a template whose leaves render numbers or quantities has its own part
//!   judged whole with the pod's values ([`Template::check_rendered`]).
//! - **Overrides**: tried on the template's own containers; one that would make them invalid is refused with a
//!   warning ([`Template::vet_overrides`]).

use serde_json::{Value as J, json};

use super::tree::Rendered;
use super::yaml::{self, PathSeg, YNode};
use super::{ContainerEntries, PodContext, StrEntries, Template};
use crate::pod_api::spec::{CONTAINERS, INIT_CONTAINERS};
use crate::validation::{self, FieldError, FieldPath, KubeVersion, Rule, Seg};

/// The name the container defaults go by when they are validated as a container of their own.
const DEFAULTS_CONTAINER: &str = "container-defaults";

/// What a per-pod leaf holds while the validator finds the rules of the fields the leaves sit in: a value most
/// rules accept, so that a field the validator only judges when it is set (a `hostname`, an `envFrom` prefix) has
/// its rule found too. The rules are found by where the leaves sit, not by what they hold.
const LEAF_PLACEHOLDER: &str = "x";

/// A per-pod leaf and the rule of the field it is rendered into.
#[derive(Debug, Clone)]
pub(crate) struct LeafCheck {
    pub slot: usize,
    pub rule: Rule,
    /// The field, for messages.
    pub path: FieldPath,
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
    let Some(containers) = spec.as_object_mut().map(|s| s.entry(CONTAINERS).or_insert_with(|| json!([]))) else {
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
    let (fragment, defaults_index) = fragment(pod, defaults, &mut |_| J::String(LEAF_PLACEHOLDER.to_owned()));
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
            let mut path = vec![PathSeg::Key("spec".into()), PathSeg::Key(CONTAINERS.into()), PathSeg::Index(index)];
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
        && [CONTAINERS, INIT_CONTAINERS].contains(&list.as_ref())
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
            let rendered = Rendered { buf: &buf, ranges: &ranges, stamp: None };
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
