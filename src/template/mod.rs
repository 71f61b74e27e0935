//! Templates: what to inject, loaded from YAML, validated and compiled once, then applied to many pods.
//!
//! A template file is YAML with these top-level keys (see `templates/default.yaml` and the README):
//!
//! - `values`: free-form data that expressions can use as `values.*`;
//! - `pod`: a partial Pod (`metadata.labels`, `metadata.annotations` and any `spec` field) merged add-only into
//!   every injected pod;
//! - `containerDefaults`: a partial container merged add-only into each of the pod's own containers;
//! - `initContainerPosition`: `first` (default) or `last`, where missing init containers are inserted;
//! - `injectHostNetwork`: whether `hostNetwork` pods are injected (default `false`).
//!
//! String values may be minijinja expressions. Those that use only `values` are rendered at load time; those
//! that use `pod` are rendered per request. Loading fails, with the file, line and reason, when the YAML is
//! malformed, an expression does not compile or render on a sample pod, or the result is not a valid part of
//! a Pod.

mod render;
pub(crate) mod tree;
mod validate;
pub(crate) mod yaml;

use std::path::Path;

use sha2::{Digest, Sha256};

pub(crate) use render::{LeafCache, PodContext, Renderer};
use render::{LeafKind, is_template};
use tree::TNode;
use yaml::{PathSeg, YNode, YValue, display_path};

/// The template compiled into the binary: `templates/default.yaml`.
pub const BUILTIN_SOURCE: &str = include_str!("../../templates/default.yaml");
/// The name the built-in template is known by.
pub const BUILTIN_NAME: &str = "default";
/// The default annotation prefix.
pub const DEFAULT_PREFIX: &str = "sidecar-injector.io/";

const TOP_LEVEL_KEYS: [&str; 5] = ["values", "pod", "containerDefaults", "initContainerPosition", "injectHostNetwork"];

/// Why a template was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The file could not be read.
    #[error("{file}: cannot read template")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The template is malformed or invalid at a given line.
    #[error("{file}:{line}: {reason}")]
    Invalid {
        /// The file (or a label for an in-memory source).
        file: String,
        /// 1-based line.
        line: usize,
        /// What is wrong and, where useful, what was expected.
        reason: String,
    },
}

/// Where missing init containers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitPosition {
    /// Before the pod's own init containers (so a proxy or native sidecar runs before them).
    First,
    /// After the pod's own init containers.
    Last,
}

/// A compiled template.
#[derive(Debug)]
pub struct Template {
    name: String,
    hash: String,
    status: String,
    pub(crate) pod: TNode,
    pub(crate) container_defaults: Option<TNode>,
    /// Names of the containers the template declares; `containerDefaults` leaves them to the template.
    pub(crate) injected_containers: Vec<String>,
    pub(crate) init_position: InitPosition,
    pub(crate) inject_host_network: bool,
    pub(crate) renderer: Renderer,
    /// For each render slot, where its expression sits (for error messages).
    slot_paths: Vec<Vec<PathSeg>>,
}

impl Template {
    /// The built-in template, with the given annotation prefix.
    pub fn builtin(prefix: &str) -> Result<Self, TemplateError> {
        Self::compile(BUILTIN_NAME, "templates/default.yaml (built in)", BUILTIN_SOURCE, prefix)
    }

    /// Loads a template from a file; its name is the file stem.
    pub fn from_file(path: &Path, prefix: &str) -> Result<Self, TemplateError> {
        let file = path.display().to_string();
        let source =
            std::fs::read_to_string(path).map_err(|source| TemplateError::Read { file: file.clone(), source })?;
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or(BUILTIN_NAME);
        Self::compile(name, &file, &source, prefix)
    }

    /// Compiles a template from source. `file` labels error messages; `prefix` is the annotation prefix, which
    /// names the status annotation.
    pub fn compile(name: &str, file: &str, source: &str, prefix: &str) -> Result<Self, TemplateError> {
        let invalid = |line: usize, reason: String| TemplateError::Invalid { file: file.to_owned(), line, reason };
        let root = yaml::parse(source).map_err(|p| invalid(p.line, p.reason))?;
        let YValue::Map(members) = &root.value else {
            return Err(invalid(
                root.line,
                "a template is a mapping with `values`, `pod`, `containerDefaults`, ...".into(),
            ));
        };
        if let Some((key, node)) = members.iter().find(|(k, _)| !TOP_LEVEL_KEYS.contains(&k.as_str())) {
            return Err(invalid(
                node.line,
                format!("unknown top-level key `{key}` (expected one of {})", TOP_LEVEL_KEYS.join(", ")),
            ));
        }
        let values = match root.map_get("values") {
            None => serde_json::Value::Object(Default::default()),
            Some(v @ YNode { value: YValue::Map(_), .. }) => yaml::to_json(v, &mut |_| serde_json::Value::Null),
            Some(v) => return Err(invalid(v.line, "`values` must be a mapping".into())),
        };
        let init_position = match root.map_get("initContainerPosition") {
            None => InitPosition::First,
            Some(n) => match n.as_str() {
                Some("first") => InitPosition::First,
                Some("last") => InitPosition::Last,
                _ => return Err(invalid(n.line, "`initContainerPosition` must be `first` or `last`".into())),
            },
        };
        let inject_host_network = match root.map_get("injectHostNetwork") {
            None => false,
            Some(YNode { value: YValue::Bool(b), .. }) => *b,
            Some(n) => return Err(invalid(n.line, "`injectHostNetwork` must be true or false".into())),
        };

        let mut renderer = Renderer::new(&values);
        let mut slot_paths = Vec::new();
        let mut resolve_section = |key: &str| -> Result<Option<YNode>, TemplateError> {
            let Some(node) = root.map_get(key) else { return Ok(None) };
            let mut node = node.clone();
            let mut path = vec![PathSeg::Key(key.to_owned())];
            resolve(&mut node, &mut path, &mut renderer, &mut slot_paths)
                .map_err(|(line, path, reason)| invalid(line, format!("{}: {reason}", display_path(&path))))?;
            Ok(Some(node))
        };
        let mut pod = resolve_section("pod")?.unwrap_or(YNode { line: 1, value: YValue::Map(Vec::new()) });
        let container_defaults = resolve_section("containerDefaults")?;

        let hash = hex_prefix(&Sha256::digest(source.as_bytes()));
        let status = status_value(name, &hash, &pod);
        let status_key = format!("{prefix}status");
        insert_status(&mut pod, &status_key, &status).map_err(|(line, reason)| invalid(line, reason))?;

        // Dry-render the pod-dependent leaves on a sample pod, then check the result against the API types.
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        if let Err(e) = renderer.render(&sample_pod(), &mut buf, &mut ranges) {
            let path = &slot_paths[e.slot];
            return Err(invalid(
                root.line_of(path),
                format!("{}: cannot render on a sample pod: {}", display_path(path), e.reason),
            ));
        }
        let mut rendered =
            |slot: usize| serde_json::from_slice(&buf[ranges[slot].clone()]).unwrap_or(serde_json::Value::Null);
        let problem = |(path, reason): validate::Problem| {
            invalid(root.line_of(&path), format!("{}: {reason}", display_path(&path)))
        };
        validate::pod(&yaml::to_json(&pod, &mut rendered)).map_err(problem)?;
        if let Some(defaults) = &container_defaults {
            validate::container_defaults(&yaml::to_json(defaults, &mut rendered)).map_err(problem)?;
        }

        let compile_problem = |base: &str, (path, reason): tree::CompileProblem| {
            let full = [vec![PathSeg::Key(base.to_owned())], path].concat();
            invalid(root.line_of(&full), format!("{}: {reason}", display_path(&full)))
        };
        let pod_tree = tree::compile(&pod, None, &mut Vec::new(), Some("")).map_err(|p| compile_problem("pod", p))?;
        let defaults_tree = match &container_defaults {
            Some(d) => Some(
                tree::compile(d, None, &mut Vec::new(), None).map_err(|p| compile_problem("containerDefaults", p))?,
            ),
            None => None,
        };
        Ok(Template {
            name: name.to_owned(),
            hash,
            status,
            injected_containers: names_in(&pod, "containers"),
            pod: pod_tree,
            container_defaults: defaults_tree,
            init_position,
            inject_host_network,
            renderer,
            slot_paths,
        })
    }

    /// The template's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The template's version: the first 16 hex digits of the SHA-256 of its source.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The value of the status annotation this template writes on the pods it injects.
    pub fn status(&self) -> &str {
        &self.status
    }

    /// Where the expression behind render slot `slot` sits in the template, for messages.
    pub(crate) fn slot_path(&self, slot: usize) -> String {
        self.slot_paths.get(slot).map(|p| display_path(p)).unwrap_or_default()
    }
}

/// Replaces values-only expressions by their rendered value and pod-dependent ones by render slots.
fn resolve(
    node: &mut YNode,
    path: &mut Vec<PathSeg>,
    renderer: &mut Renderer,
    slot_paths: &mut Vec<Vec<PathSeg>>,
) -> Result<(), (usize, Vec<PathSeg>, String)> {
    match &mut node.value {
        YValue::Str(source) if is_template(source) => match renderer.add_leaf(source) {
            Ok(LeafKind::Static(json)) => *node = yaml::from_json(json, node.line),
            Ok(LeafKind::Dynamic(slot)) => {
                slot_paths.push(path.clone());
                node.value = YValue::Dynamic(slot);
            }
            Err(reason) => return Err((node.line, path.clone(), reason)),
        },
        YValue::Map(members) => {
            for (key, value) in members {
                if is_template(key) {
                    return Err((value.line, path.clone(), format!("keys cannot be templated: {key:?}")));
                }
                path.push(PathSeg::Key(key.clone()));
                resolve(value, path, renderer, slot_paths)?;
                path.pop();
            }
        }
        YValue::Seq(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(PathSeg::Index(i));
                resolve(item, path, renderer, slot_paths)?;
                path.pop();
            }
        }
        _ => {}
    }
    Ok(())
}

fn hex_prefix(digest: &[u8]) -> String {
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The names of the items of `pod.spec.<list>`.
fn names_in(pod: &YNode, list: &str) -> Vec<String> {
    match pod.map_get("spec").and_then(|s| s.map_get(list)).map(|l| &l.value) {
        Some(YValue::Seq(items)) => {
            items.iter().filter_map(|i| i.map_get("name").and_then(YNode::as_str)).map(str::to_owned).collect()
        }
        _ => Vec::new(),
    }
}

/// The status annotation: which template and version, and what it injects.
fn status_value(name: &str, hash: &str, pod: &YNode) -> String {
    serde_json::json!({
        "template": name,
        "version": hash,
        "containers": names_in(pod, "containers"),
        "initContainers": names_in(pod, "initContainers"),
        "volumes": names_in(pod, "volumes"),
    })
    .to_string()
}

/// Adds the status annotation to the template's `pod.metadata.annotations`, so that it is merged like any other
/// annotation: added when absent, left alone when present.
fn insert_status(pod: &mut YNode, key: &str, value: &str) -> Result<(), (usize, String)> {
    let line = pod.line;
    let section = |node: &mut YNode, name: &str| -> Result<(), (usize, String)> {
        match &mut node.value {
            YValue::Map(members) => {
                if !members.iter().any(|(k, _)| k == name) {
                    members.push((name.to_owned(), YNode { line, value: YValue::Map(Vec::new()) }));
                }
                Ok(())
            }
            _ => Err((node.line, format!("`{name}`'s parent must be a mapping"))),
        }
    };
    section(pod, "metadata")?;
    let metadata = pod.map_get_mut("metadata").expect("inserted above");
    section(metadata, "annotations")?;
    let annotations = metadata.map_get_mut("annotations").expect("inserted above");
    if annotations.map_get(key).is_some() {
        return Err((annotations.line, format!("the annotation `{key}` is written by the injector; remove it")));
    }
    let YValue::Map(members) = &mut annotations.value else {
        return Err((annotations.line, "`metadata.annotations` must be a mapping".into()));
    };
    members.push((key.to_owned(), YNode { line, value: YValue::Str(value.to_owned()) }));
    Ok(())
}

/// The pod that templates are dry-rendered on when they load.
fn sample_pod() -> PodContext<'static, std::collections::BTreeMap<&'static str, &'static str>> {
    PodContext {
        name: "sample-7c9d5b8f6-x2x8q",
        generate_name: "sample-7c9d5b8f6-",
        namespace: "default",
        service_account_name: "default",
        labels: [("app", "sample"), ("app.kubernetes.io/name", "sample"), ("version", "v1")].into_iter().collect(),
        annotations: Default::default(),
    }
}

#[cfg(test)]
mod tests;
