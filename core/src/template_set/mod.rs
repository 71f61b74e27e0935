//! A template set: every template of a directory (as Kubernetes mounts a ConfigMap), compiled together into one
//! immutable snapshot. The engine serves one snapshot per request and a reload replaces it whole, so a response
//! is always wholly the old set or wholly the new one.
//!
//! A directory holds one template per `NAME.yaml` (or `.yml`) file and, optionally, `values.yaml`: values shared
//! by every template, which override a template's own `values` (its defaults) key by key. Hidden entries (the kubelet's `..data` and
//! timestamped directories) are skipped; other files are reported as ignored.

use std::path::Path;
use std::sync::Arc;

mod assembly;
mod serving;

pub use assembly::{DryRunError, inject_unchecked, pod_security};
pub use serving::{Combinations, OnDemand, Serving};

use crate::settings::Policy;
use crate::settings::Settings;
use crate::template::{BUILTIN_NAME, BUILTIN_SOURCE, Part, Template, TemplateError, set_hash, several, yaml};
use crate::validation::KubeVersion;

/// The name of the shared values file (with a `.yaml` or `.yml` extension).
pub const VALUES_FILE: &str = "values";

/// The most templates one pod may ask for.
const MAX_TEMPLATES_PER_POD: usize = 8;

/// The files of a template directory, read but not yet compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSources {
    /// Where they come from (the directory), for messages about the set as a whole.
    pub origin: String,
    /// `(name, file, source)` of each template, sorted by name.
    pub templates: Vec<(String, String, String)>,
    /// `(file, source)` of the shared values file.
    pub values: Option<(String, String)>,
    /// Files that are neither templates nor the values file.
    pub ignored: Vec<String>,
}

impl SetSources {
    /// Reads every template file of `dir` (following the kubelet's symlinks).
    pub fn read_dir(dir: &Path) -> Result<SetSources, TemplateError> {
        let label = dir.display().to_string();
        let unreadable = |e: std::io::Error| TemplateError::Directory {
            dir: label.clone(),
            reason: format!("cannot read the template directory: {e}"),
        };
        let mut sources = SetSources::empty(label.clone());
        let mut errors = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(unreadable)? {
            let path = entry.map_err(unreadable)?.path();
            let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            if path.is_dir() {
                continue;
            }
            let file = path.display().to_string();
            match FileKind::of(file_name) {
                FileKind::Machinery => {}
                FileKind::Other => sources.ignored.push(file),
                kind => match std::fs::read_to_string(&path) {
                    Ok(source) => sources.add(kind, file, source),
                    Err(source) => errors.push(TemplateError::Read { file, source }),
                },
            }
        }
        if !errors.is_empty() {
            return Err(several(errors));
        }
        sources.sort();
        Ok(sources)
    }

    /// The sources a ConfigMap's `data` holds, each key a file as the kubelet projects it, labelled
    /// `origin/KEY`: with the directory it is mounted at as `origin`, the same set, hash and file names in
    /// messages as [`SetSources::read_dir`] gives once the kubelet has projected it.
    pub fn from_config_map(origin: &str, data: impl IntoIterator<Item = (String, String)>) -> SetSources {
        let origin = origin.trim_end_matches('/');
        let mut sources = SetSources::empty(origin.to_owned());
        for (key, source) in data {
            let file = format!("{origin}/{key}");
            match FileKind::of(&key) {
                FileKind::Machinery => {}
                FileKind::Other => sources.ignored.push(file),
                kind => sources.add(kind, file, source),
            }
        }
        sources.sort();
        sources
    }

    fn empty(origin: String) -> SetSources {
        SetSources { origin, templates: Vec::new(), values: None, ignored: Vec::new() }
    }

    fn add(&mut self, kind: FileKind<'_>, file: String, source: String) {
        match kind {
            FileKind::Template(name) => self.templates.push((name.to_owned(), file, source)),
            FileKind::Values => self.values = Some((file, source)),
            FileKind::Machinery | FileKind::Other => {}
        }
    }

    fn sort(&mut self) {
        self.templates.sort();
        self.ignored.sort();
    }

    /// The hash of the whole set: every template's name and source, and the shared values.
    pub fn hash(&self) -> String {
        set_hash(
            self.templates.iter().map(|(n, _, s)| (n.as_str(), s.as_str())),
            self.values.as_ref().map(|v| v.1.as_str()),
        )
    }
}

/// What a file of a template directory (a key of its ConfigMap) is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKind<'a> {
    /// `NAME.yaml` or `NAME.yml`: the template NAME.
    Template(&'a str),
    /// `values.yaml`: the shared values.
    Values,
    /// `..data`, `..2026_11_21_...`: the kubelet's machinery; the files we want are symlinks beside them.
    Machinery,
    /// Anything else: listed as ignored.
    Other,
}

impl FileKind<'_> {
    fn of(file_name: &str) -> FileKind<'_> {
        if file_name.starts_with('.') {
            return FileKind::Machinery;
        }
        match file_name.rsplit_once('.') {
            Some((VALUES_FILE, "yaml" | "yml")) => FileKind::Values,
            Some((stem, "yaml" | "yml")) if !stem.is_empty() => FileKind::Template(stem),
            _ => FileKind::Other,
        }
    }
}

/// A compiled set of named templates.
#[derive(Debug)]
pub struct TemplateSet {
    /// Sorted by name; `templates[i]` is `parts[i]` alone.
    parts: Vec<Part>,
    templates: Vec<Template>,
    default: usize,
    hash: String,
    /// What the set was compiled with, for the combinations assembled later.
    settings: Settings,
    ignored: Vec<String>,
    /// Templates that need a newer Kubernetes than the set is compiled for (`minKubernetesVersion`): not
    /// compiled; a pod that asks for one is answered per its `onError`.
    unavailable: Vec<Unavailable>,
}

/// The template(s) a pod asked for.
#[derive(Debug)]
pub enum Selection<'s> {
    /// One template of the set.
    One(&'s Template),
    /// Several, applied in order.
    Combined(Arc<Template>),
    /// Several, in the shape they take for a pod owned by a Job.
    CombinedForJobs(Arc<Template>),
}

impl<'s> Selection<'s> {
    /// The selection for a pod owned by a Job ([`Template::for_jobs`]): `Err` when such pods are skipped, saying
    /// whether that is the fallback for the Kubernetes version.
    pub(crate) fn for_jobs(self) -> Result<Selection<'s>, bool> {
        match self {
            Selection::One(template) => template.for_jobs().map(Selection::One),
            Selection::Combined(template) | Selection::CombinedForJobs(template) => {
                template.for_jobs()?;
                Ok(Selection::CombinedForJobs(template))
            }
        }
    }
}

impl std::ops::Deref for Selection<'_> {
    type Target = Template;
    fn deref(&self) -> &Template {
        match self {
            Selection::One(t) => t,
            Selection::Combined(t) => t,
            // Only made when `for_jobs` is `Ok`.
            Selection::CombinedForJobs(t) => t.for_jobs().unwrap_or(t),
        }
    }
}

/// A template of the set that needs a newer Kubernetes than the set is compiled for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The template's name.
    pub name: String,
    /// Its `minKubernetesVersion`.
    pub needs: KubeVersion,
    /// Its `onError`, for the pods that ask for it.
    pub on_error: Option<Policy>,
}

/// Why a pod's template annotation could not be honoured.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// These names are not in the set.
    #[error("no template named {}", .0.join(", "))]
    Unknown(Vec<String>),
    /// The template needs a newer Kubernetes than the injector is set for.
    #[error("template `{}` needs Kubernetes {} (its minKubernetesVersion) and this injector is set for {set_for} \
             (--kubernetes-version)", .template.name, .template.needs)]
    Unavailable {
        /// The template.
        template: Unavailable,
        /// The injector's `--kubernetes-version`.
        set_for: KubeVersion,
    },
    /// The combination asks for too many templates.
    #[error("{requested} templates requested; at most {MAX_TEMPLATES_PER_POD} can be combined")]
    TooMany {
        /// How many the pod asked for.
        requested: usize,
    },
    /// The combination could not be assembled.
    #[error("the templates cannot be combined: {0}")]
    Combination(#[source] Arc<TemplateError>),
}

impl TemplateSet {
    /// The built-in template, alone, as `default`.
    pub fn builtin(settings: &Settings) -> Result<Self, TemplateError> {
        Self::from_source(BUILTIN_NAME, "templates/default.yaml (built in)", BUILTIN_SOURCE, settings)
    }

    /// One template file, which is the set's default whatever its name (its name is the file's stem).
    pub fn from_file(path: &Path, settings: &Settings) -> Result<Self, TemplateError> {
        let (name, file, source) = crate::template::read_template_file(path)?;
        Self::from_source(&name, &file, &source, settings)
    }

    /// One template from its source, alone in its set and its default. `file` labels error messages; the
    /// settings' annotation prefix names the status and override annotations, and their Kubernetes version is the
    /// one the injected pods are validated for.
    pub fn from_source(name: &str, file: &str, source: &str, settings: &Settings) -> Result<Self, TemplateError> {
        let sources = SetSources {
            origin: file.into(),
            templates: vec![(name.into(), file.into(), source.into())],
            values: None,
            ignored: Vec::new(),
        };
        Self::compile(sources, name, settings)
    }

    /// Every template of a directory; `default` names the template of pods that do not ask for one.
    pub fn load_dir(dir: &Path, default: &str, settings: &Settings) -> Result<Self, TemplateError> {
        Self::compile(SetSources::read_dir(dir)?, default, settings)
    }

    /// Compiles a set from its sources. Every template is parsed, dry-rendered and validated; the errors of every
    /// file are reported together.
    pub fn compile(mut sources: SetSources, default: &str, settings: &Settings) -> Result<Self, TemplateError> {
        let prefix = settings.annotation_prefix.as_str();
        sources.templates.sort();
        let origin = sources.origin.clone();
        let directory = |reason: String| TemplateError::Directory { dir: origin.clone(), reason };
        if sources.templates.is_empty() {
            return Err(directory("no template files (NAME.yaml or NAME.yml)".into()));
        }
        let hash = sources.hash();
        let shared = match &sources.values {
            None => None,
            Some((file, source)) => Some((source.as_str(), shared_values(file, source)?)),
        };
        let shared = shared.as_ref().map(|(source, values)| (*source, values));
        let mut parts = Vec::with_capacity(sources.templates.len());
        let mut templates = Vec::with_capacity(sources.templates.len());
        let mut unavailable = Vec::new();
        let mut errors = Vec::new();
        for (name, file, source) in &sources.templates {
            let part = match Part::parse(name, file, source, shared, prefix) {
                Ok(part) => part,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            // A template for a newer Kubernetes is parsed (its syntax is still checked) but not compiled: its
            // checks would apply rules this version does not have.
            if let Some(needs) = part.min_kubernetes_version().filter(|v| *v > settings.kubernetes_version) {
                unavailable.push(Unavailable { name: part.name().to_owned(), needs, on_error: part.on_error() });
                continue;
            }
            match assembly::assemble(&[&part], &hash, settings) {
                Ok(template) => {
                    parts.push(part);
                    templates.push(template);
                }
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(several(errors));
        }
        if let Some(template) = unavailable.iter().find(|u| u.name == default) {
            return Err(directory(format!(
                "the default template `{default}` needs Kubernetes {} (its minKubernetesVersion) and the injector is \
                 set for {} (--kubernetes-version): every pod would go without the sidecar",
                template.needs, settings.kubernetes_version
            )));
        }
        let Some(default) = parts.iter().position(|p| p.name() == default) else {
            let found = parts.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ");
            return Err(directory(format!(
                "no template named `{default}` (the template of pods that do not name one); found: {found}"
            )));
        };
        Ok(TemplateSet {
            parts,
            templates,
            default,
            hash,
            settings: settings.clone(),
            ignored: sources.ignored,
            unavailable,
        })
    }

    /// The hash of the set's sources.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The templates, by name.
    pub fn templates(&self) -> impl Iterator<Item = &Template> {
        self.templates.iter()
    }

    /// The template of pods that do not name one.
    pub fn default_template(&self) -> &Template {
        &self.templates[self.default]
    }

    /// The templates' names, for messages: `default, native-sidecar`.
    pub fn names(&self) -> String {
        self.templates.iter().map(Template::name).collect::<Vec<_>>().join(", ")
    }

    /// Files of the directory that were neither templates nor the values file.
    pub fn ignored(&self) -> &[String] {
        &self.ignored
    }

    /// The templates that need a newer Kubernetes than the set is compiled for, by name.
    pub fn unavailable(&self) -> &[Unavailable] {
        &self.unavailable
    }

    /// Is `name` one of the set's templates?
    pub fn has(&self, name: &str) -> bool {
        self.templates.iter().any(|t| t.name() == name)
    }

    /// The templates left out for the Kubernetes version, for logs: `native-sidecar (needs 1.29)`; empty if none.
    pub fn unavailable_summary(&self) -> String {
        self.unavailable.iter().map(|u| format!("{} (needs {})", u.name, u.needs)).collect::<Vec<_>>().join(", ")
    }

    /// The template(s) a pod's template annotation names (`a` or `a,b`), or the default without one; a
    /// combination from `serving`, which assembles it the first time.
    pub fn select(&self, annotation: Option<&str>, serving: &dyn Serving) -> Result<Selection<'_>, SelectError> {
        let index = |name: &str| self.templates.iter().position(|t| t.name() == name);
        let requested = annotation.map_or("", str::trim);
        // Most pods name no template or one: answered without collecting names.
        if !requested.contains(',') {
            return match requested {
                "" => Ok(Selection::One(&self.templates[self.default])),
                one => index(one).map(|i| Selection::One(&self.templates[i])).ok_or_else(|| self.missing(&[one])),
            };
        }
        let mut names: Vec<&str> = Vec::new();
        for name in requested.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        match names.as_slice() {
            [] => return Ok(Selection::One(&self.templates[self.default])),
            [one] => {
                return index(one).map(|i| Selection::One(&self.templates[i])).ok_or_else(|| self.missing(&names));
            }
            many if many.len() > MAX_TEMPLATES_PER_POD => {
                return Err(SelectError::TooMany { requested: many.len() });
            }
            _ => {}
        }
        let missing: Vec<&str> = names.iter().copied().filter(|n| index(n).is_none()).collect();
        if !missing.is_empty() {
            return Err(self.missing(&missing));
        }
        serving.combination(self, &names).map(Selection::Combined).map_err(SelectError::Combination)
    }

    /// Assembles the combination of `names` (each a template of the set), applied in order, and proves it on the
    /// sample pods as the set's own templates were: a dry run on every sample pod, so [`Serving`] keeps it.
    pub fn assemble(&self, names: &[&str]) -> Result<Template, TemplateError> {
        let parts: Vec<&Part> = names
            .iter()
            .filter_map(|n| self.templates.iter().position(|t| t.name() == *n))
            .map(|i| &self.parts[i])
            .collect();
        assembly::assemble(&parts, &self.hash, &self.settings)
    }
}

impl TemplateSet {
    /// Why `names`, none of them in the set, cannot be selected: the first that needs a newer Kubernetes, or else
    /// all of them unknown.
    fn missing(&self, names: &[&str]) -> SelectError {
        if let Some(template) = names.iter().find_map(|n| self.unavailable.iter().find(|u| u.name == *n)) {
            return SelectError::Unavailable { template: template.clone(), set_for: self.settings.kubernetes_version };
        }
        SelectError::Unknown(names.iter().map(|n| (*n).to_owned()).collect())
    }
}

/// Parses the shared values file: a mapping.
fn shared_values(file: &str, source: &str) -> Result<serde_json::Value, TemplateError> {
    let invalid = |line: usize, reason: String| TemplateError::Invalid { file: file.to_owned(), line, reason };
    let root = yaml::parse(source).map_err(|p| invalid(p.line, p.reason))?;
    if !matches!(root.value, yaml::YValue::Map(_)) {
        return Err(invalid(root.line, "the values file is a mapping of names to values".into()));
    }
    Ok(yaml::to_json(&root, &mut |_| serde_json::Value::Null))
}
