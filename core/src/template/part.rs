//! One template file parsed: its settings read, its values resolved and its expressions compiled into render
//! slots. A set is made of parts, and a combination (`template: a,b`) is assembled from them.

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::part_settings::{HOLD_KEY, PartSettings, setting, top_level_keys};
use super::render::{LeafKind, RenderError, Renderer, is_template};
use super::stamp::hex_prefix;
use super::yaml::{self, PathSeg, YNode, YValue, display_path};
use super::{BUILTIN_NAME, OverrideSpec, Problem, TemplateError, combine, hold, overrides, several};
use crate::settings::Policy;
use crate::validation::KubeVersion;

/// One template file parsed, its settings read and its expressions compiled: what a set is made of, and what
/// combinations (`template: a,b`) are assembled from.
#[derive(Debug)]
pub(crate) struct Part {
    pub(super) name: String,
    pub(super) file: String,
    /// The first 16 hex digits of the SHA-256 of the shared values file (if any) and this file.
    pub(super) hash: String,
    /// The parsed file, for the lines of later errors.
    pub(super) root: YNode,
    /// `pod` and `containerDefaults` with values-only expressions substituted and per-pod ones as slots.
    pub(super) pod: YNode,
    pub(super) container_defaults: Option<YNode>,
    pub(super) settings: PartSettings,
    pub(super) overrides: Vec<OverrideSpec>,
    pub(super) renderer: Arc<Renderer>,
    /// `containerDefaultsFor`: the pod's containers `containerDefaults` reaches, when not all of them.
    pub(super) defaults_for: Option<Vec<String>>,
    /// For each render slot, where its expression sits.
    pub(super) slot_paths: Vec<Vec<PathSeg>>,
}

impl Part {
    /// A leaf of this part that failed to render (`what` on which pod), at its line.
    pub(super) fn leaf_problem(&self, error: &RenderError, what: &str) -> TemplateError {
        let path = &self.slot_paths[error.slot];
        TemplateError::Invalid {
            file: self.file.clone(),
            line: self.root.line_of(path),
            reason: format!("{}: {what}: {}", display_path(path), error.reason),
        }
    }

    /// The oldest Kubernetes version the template is for (`minKubernetesVersion`), when it says.
    pub(crate) fn min_kubernetes_version(&self) -> Option<KubeVersion> {
        self.settings.min_version
    }

    /// What a pod that asks for this template gets when it cannot be injected (`onError`), when it says.
    pub(crate) fn on_error(&self) -> Option<Policy> {
        self.settings.on_error
    }

    /// The template's name (its file's stem).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The file it was read from, for messages.
    pub(crate) fn file(&self) -> &str {
        &self.file
    }

    /// Parses one template file. `shared` is the set's shared values file, as `(source, values)`, which
    /// overrides the template's own `values` key by key.
    pub(crate) fn parse(
        name: &str,
        file: &str,
        source: &str,
        shared: Option<(&str, &serde_json::Value)>,
        prefix: &str,
    ) -> Result<Part, TemplateError> {
        let invalid = |line: usize, reason: String| TemplateError::Invalid { file: file.to_owned(), line, reason };
        let root = yaml::parse(source).map_err(|p| invalid(p.line, p.reason))?;
        let YValue::Map(members) = &root.value else {
            return Err(invalid(
                root.line,
                "a template is a mapping with `values`, `pod`, `containerDefaults`, ...".into(),
            ));
        };
        if let Some((key, node)) = members.iter().find(|(k, _)| !top_level_keys().any(|known| known == k)) {
            let hint = match crate::suggest::closest(key, top_level_keys()) {
                Some(close) => format!("did you mean `{close}`?"),
                None => format!("expected one of {}", top_level_keys().collect::<Vec<_>>().join(", ")),
            };
            return Err(invalid(node.line, format!("unknown top-level key `{key}` ({hint})")));
        }
        // The template's own values are defaults; the set's shared values file, the site's settings, wins.
        let mut values = match root.map_get("values") {
            None => serde_json::Value::Object(Default::default()),
            Some(v @ YNode { value: YValue::Map(_), .. }) => yaml::to_json(v, &mut |_| serde_json::Value::Null),
            Some(v) => return Err(invalid(v.line, "`values` must be a mapping".into())),
        };
        if let Some((_, shared)) = shared {
            combine::overlay_json(&mut values, shared.clone());
        }
        let settings = PartSettings::read(&root, &invalid)?;
        let names = |n: &YNode| match &n.value {
            YValue::Seq(items) => items.iter().map(|i| i.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>(),
            _ => None,
        };
        let defaults_for = setting(&root, "containerDefaultsFor", "a list of container names", names, &invalid)?;
        let overrides = match root.map_get("overrides") {
            None => Vec::new(),
            Some(section) => overrides::parse(section, &values, prefix)
                .map_err(|problem| invalid(root.line_of(&problem.path), problem.to_string()))?,
        };

        let overridable = overrides.iter().map(|o| o.value.clone()).collect();
        let mut renderer = Renderer::with_overridable(&values, overridable);
        let mut slot_paths = Vec::new();
        // Every expression of both sections is compiled, and every one that does not compile is listed.
        let mut problems = Vec::new();
        let mut resolve_section = |key: &str| -> Option<YNode> {
            let mut node = root.map_get(key)?.clone();
            let mut path = vec![PathSeg::Key(key.to_owned())];
            resolve(&mut node, &mut path, &mut renderer, &mut slot_paths, &mut problems);
            Some(node)
        };
        let pod = resolve_section("pod").unwrap_or(YNode { line: 1, value: YValue::Map(Vec::new()) });
        let container_defaults = resolve_section("containerDefaults");
        if !problems.is_empty() {
            let problems = problems.into_iter();
            return Err(several(problems.map(|(line, problem)| invalid(line, problem.to_string())).collect()));
        }
        if settings.hold_application {
            let line = root.map_get(HOLD_KEY).map_or(root.line, |setting| setting.line);
            let problems = hold::problems(&pod, line, &invalid);
            if !problems.is_empty() {
                return Err(several(problems));
            }
        }

        let mut hasher = Sha256::new();
        if let Some((shared_source, _)) = shared {
            hasher.update(shared_source.as_bytes());
            hasher.update([0]);
        }
        hasher.update(source.as_bytes());
        Ok(Part {
            name: name.to_owned(),
            file: file.to_owned(),
            hash: hex_prefix(&hasher.finalize()),
            root,
            pod,
            container_defaults,
            settings,
            overrides,
            renderer: Arc::new(renderer),
            defaults_for,
            slot_paths,
        })
    }
}

/// Reads a template file: `(name, file label, source)`, the name being the file stem.
pub(crate) fn read_template_file(path: &Path) -> Result<(String, String, String), TemplateError> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path).map_err(|source| TemplateError::Read { file: file.clone(), source })?;
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or(BUILTIN_NAME).to_owned();
    Ok((name, file, source))
}

/// Replaces values-only expressions by their rendered value and pod-dependent ones by render slots; each one
/// that cannot be compiled is added to `problems`, with its line.
pub(super) fn resolve(
    node: &mut YNode,
    path: &mut Vec<PathSeg>,
    renderer: &mut Renderer,
    slot_paths: &mut Vec<Vec<PathSeg>>,
    problems: &mut Vec<(usize, Problem)>,
) {
    match &mut node.value {
        YValue::Str(source) if is_template(source) => match renderer.add_leaf(source) {
            Ok(LeafKind::Static(json)) => *node = yaml::from_json(json, node.line),
            Ok(LeafKind::Dynamic(slot)) => {
                slot_paths.push(path.clone());
                node.value = YValue::Dynamic(slot);
            }
            Err(error) => problems.push((node.line, Problem::new(path.clone(), error.to_string()))),
        },
        YValue::Map(members) => {
            for (key, value) in members {
                if is_template(key) {
                    problems
                        .push((value.line, Problem::new(path.clone(), format!("keys cannot be templated: {key:?}"))));
                    continue;
                }
                path.push(PathSeg::Key(key.clone()));
                resolve(value, path, renderer, slot_paths, problems);
                path.pop();
            }
        }
        YValue::Seq(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(PathSeg::Index(i));
                resolve(item, path, renderer, slot_paths, problems);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The names of the items of `pod.spec.<list>`.
pub(super) fn names_in(pod: &YNode, list: &str) -> Vec<String> {
    match pod.map_get("spec").and_then(|s| s.map_get(list)).map(|l| &l.value) {
        Some(YValue::Seq(items)) => {
            items.iter().filter_map(|i| i.map_get("name").and_then(YNode::as_str)).map(str::to_owned).collect()
        }
        _ => Vec::new(),
    }
}

/// The keys of the template's `pod.metadata.annotations`.
pub(super) fn annotation_keys(pod: &YNode) -> impl Iterator<Item = String> + '_ {
    let annotations = pod.map_get("metadata").and_then(|m| m.map_get("annotations"));
    let members = match annotations.map(|a| &a.value) {
        Some(YValue::Map(members)) => members.as_slice(),
        _ => &[],
    };
    members.iter().map(|(key, _)| key.clone())
}
