//! Templates: what to inject, loaded from YAML, validated and compiled once, then applied to many pods.
//!
//! A template file is YAML with these top-level keys (see `templates/default.yaml` and docs/templates.md):
//!
//! - `values`: free-form data that expressions can use as `values.*`;
//! - `pod`: a partial Pod (`metadata.labels`, `metadata.annotations` and any `spec` field) merged add-only into
//!   every injected pod;
//! - `containerDefaults`: a partial container merged add-only into each of the pod's own containers;
//! - `initContainerPosition`: `first` (default) or `last`, where missing init containers are inserted;
//! - `injectHostNetwork`: whether `hostNetwork` pods are injected (default `false`);
//! - `holdApplicationUntilSidecarReady`: whether the app's containers start only once the template's are ready
//!   (default `false`; see [`Hold`]).
//!
//! String values may be minijinja expressions. Those that use only `values` are rendered at load time; those
//! that use `pod` are rendered per request. Loading fails, with the file, line and reason, when the YAML is
//! malformed, an expression does not compile or render on a sample pod, or the result is not a valid part of
//! a Pod.

mod combine;
mod hold;
mod known_fields;
mod leaf_cache;
mod leaf_checks;
mod overrides;
mod pod_context;
mod render;
pub(crate) mod tree;
mod validate;
pub(crate) mod yaml;

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::settings::{DEFAULT_REVISION, Policy, Settings, Validation};
use crate::validation::KubeVersion;

use crate::pod_api::merge_rules::{Place, SAFE_TO_EVICT_LOCAL_VOLUMES};
pub use hold::Hold;
pub(crate) use leaf_cache::LeafCache;
use leaf_checks::LeafCheck;
pub(crate) use overrides::OverrideSpec;
pub(crate) use pod_context::{ContainerEntries, PodContext, Port, Reads, StrEntries};
use render::{LeafKind, is_template};
pub(crate) use render::{Overrides, RenderError, Renderer};
use tree::TNode;
use yaml::{PathSeg, YNode, YValue, display_path};

/// The template compiled into the binary: `templates/default.yaml`.
pub const BUILTIN_SOURCE: &str = include_str!("../../templates/default.yaml");
/// The name the built-in template is known by, and the template pods get when they do not ask for one.
pub const BUILTIN_NAME: &str = "default";

const TOP_LEVEL_KEYS: [&str; 12] = [
    "values",
    "pod",
    "containerDefaults",
    "containerDefaultsFor",
    "initContainerPosition",
    "injectHostNetwork",
    hold::KEY,
    "jobs",
    "onError",
    "validation",
    "overrides",
    "minKubernetesVersion",
];

/// Why a template (or a set of them) was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The file could not be read.
    #[error("{file}: cannot read template: {source}")]
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
    /// The template directory as a whole is unusable (unreadable, empty, no default template).
    #[error("{dir}: {reason}")]
    Directory {
        /// The directory.
        dir: String,
        /// What is wrong.
        reason: String,
    },
    /// Several files were refused; each error is on its own line.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Several(Vec<TemplateError>),
}

impl TemplateError {
    /// What was refused, quoting nothing of it (a reason can quote the template): the files' names, or the template
    /// directory. For what any client may read, as `/readyz`; the reason itself goes to the log.
    pub fn subject(&self) -> String {
        let name = |file: &str| {
            std::path::Path::new(file).file_name().map_or_else(|| file.to_owned(), |n| n.to_string_lossy().into_owned())
        };
        match self {
            TemplateError::Read { file, .. } | TemplateError::Invalid { file, .. } => name(file),
            TemplateError::Directory { .. } => "the template directory".to_owned(),
            TemplateError::Several(errors) => {
                let mut names: Vec<String> = errors.iter().map(TemplateError::subject).collect();
                names.dedup();
                names.join(", ")
            }
        }
    }
}

/// What a template does for a pod owned by a Job (which covers a CronJob's): a regular sidecar container never
/// exits, so the Job's pod would never complete (kubernetes#25908).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JobPolicy {
    /// The template's containers become native sidecars (init containers with `restartPolicy: Always`), which
    /// the kubelet stops when the Job's own containers end. Needs Kubernetes 1.29; below it, `Skip` with a
    /// warning. The default: the sidecar's service where it can be given, a Job that completes everywhere.
    #[default]
    NativeSidecar,
    /// The pod is admitted without the sidecar (reason `job`).
    Skip,
    /// The template as written, for sidecars that exit on their own when the app does.
    Inject,
}

impl JobPolicy {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "native-sidecar" => Some(JobPolicy::NativeSidecar),
            "skip" => Some(JobPolicy::Skip),
            "inject" => Some(JobPolicy::Inject),
            _ => None,
        }
    }

    /// The setting's name in a template.
    pub fn as_str(self) -> &'static str {
        match self {
            JobPolicy::NativeSidecar => "native-sidecar",
            JobPolicy::Skip => "skip",
            JobPolicy::Inject => "inject",
        }
    }
}

/// The first Kubernetes minor version that runs native sidecars without a feature gate.
pub const NATIVE_SIDECAR_MINOR: u32 = 29;

/// Where missing init containers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitPosition {
    /// Before the pod's own init containers (so a proxy or native sidecar runs before them).
    First,
    /// After the pod's own init containers.
    Last,
}

/// Which shape of a template to assemble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// As the files say.
    AsWritten,
    /// For the pods of Jobs: the containers as native sidecars.
    ForJobs,
}

/// Moves the template's containers to the end of its init containers, each with `restartPolicy: Always`: native
/// sidecars, started in order after the template's own init containers (which may set up what they need) and
/// stopped by the kubelet once the pod's own containers have ended.
fn as_native_sidecars(pod: &mut YNode) {
    let Some(spec) = pod.map_get_mut("spec") else { return };
    let YValue::Map(members) = &mut spec.value else { return };
    let Some(at) = members.iter().position(|(key, _)| key == "containers") else { return };
    let (_, containers) = members.remove(at);
    let line = containers.line;
    let YValue::Seq(mut sidecars) = containers.value else { return };
    for sidecar in &mut sidecars {
        if let YValue::Map(fields) = &mut sidecar.value
            && !fields.iter().any(|(key, _)| key == "restartPolicy")
        {
            let always = YNode { line: sidecar.line, value: YValue::Str("Always".into()) };
            fields.push(("restartPolicy".into(), always));
        }
    }
    match members.iter_mut().find(|(key, _)| key == "initContainers") {
        Some((_, YNode { value: YValue::Seq(init), .. })) => init.append(&mut sidecars),
        _ => members.push(("initContainers".into(), YNode { line, value: YValue::Seq(sidecars) })),
    }
}

/// One template file parsed, its settings read and its expressions compiled: what a set is made of, and what
/// combinations (`template: a,b`) are assembled from.
#[derive(Debug)]
pub(crate) struct Part {
    name: String,
    file: String,
    /// The first 16 hex digits of the SHA-256 of the shared values file (if any) and this file.
    hash: String,
    /// The parsed file, for the lines of later errors.
    root: YNode,
    /// `pod` and `containerDefaults` with values-only expressions substituted and per-pod ones as slots.
    pod: YNode,
    container_defaults: Option<YNode>,
    settings: PartSettings,
    overrides: Vec<OverrideSpec>,
    renderer: Arc<Renderer>,
    /// `containerDefaultsFor`: the pod's containers `containerDefaults` reaches, when not all of them.
    defaults_for: Option<Vec<String>>,
    /// For each render slot, where its expression sits.
    slot_paths: Vec<Vec<PathSeg>>,
}

/// The compiled `pod` and `containerDefaults` sections.
#[derive(Debug)]
pub(crate) struct Trees {
    pub pod: TNode,
    pub container_defaults: Option<TNode>,
}

/// The `pod` and `containerDefaults` sections as written (with the lines of their nodes), per-pod and
/// overridable leaves as slots: what the checks validate and point at.
#[derive(Debug)]
struct Sources {
    pod: YNode,
    container_defaults: Option<YNode>,
}

/// Which template, at which version: what the status annotation, the response's audit annotations and an
/// engine's [`Outcome`](crate::Outcome) name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateId {
    /// The template's name: a file's stem, or the names of a combination joined by commas.
    pub name: String,
    /// The template's version: the first 16 hex digits of the SHA-256 of its sources (and the shared values).
    pub version: String,
    /// The hash of the whole set the template was loaded with.
    pub set: String,
    /// The response's `auditAnnotations` for a pod this template was applied to, as JSON: the same for every pod,
    /// so written once.
    audit_json: String,
}

impl TemplateId {
    fn new(name: String, version: String, set: String) -> Self {
        let audit_json =
            serde_json::json!({"template": name, "template-version": version, "template-set": set}).to_string();
        TemplateId { name, version, set, audit_json }
    }

    /// The `auditAnnotations` object (JSON) of a response for a pod this template was applied to.
    pub(crate) fn audit_json(&self) -> &str {
        &self.audit_json
    }
}

/// The names of what a template declares, as its status annotation lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Injects {
    /// Its containers.
    pub containers: Vec<String>,
    /// Its init containers.
    pub init_containers: Vec<String>,
    /// Its volumes.
    pub volumes: Vec<String>,
}

/// A template ready to inject: one file, or several applied in order.
#[derive(Debug)]
pub struct Template {
    /// Shared with every outcome that names this template (a reference count, not a copy, per request).
    id: Arc<TemplateId>,
    status: String,
    /// What is injected, with the leaves that read overridable values as per-pod slots.
    overridable: Trees,
    /// The same with those leaves rendered from the template's own values: what a pod without overrides gets,
    /// so that it costs no more than a template without overrides. `None` when there are no such leaves.
    plain: Option<Trees>,
    /// What the template declares; `containerDefaults` leaves its containers to the template.
    injects: Injects,
    /// The annotations the template writes (the status annotation among them) and those its overrides read.
    annotations: Vec<String>,
    pub(crate) init_position: InitPosition,
    pub(crate) inject_host_network: bool,
    /// The containers `containerDefaults` reaches when the pod does not say (`containerDefaultsFor`; all when
    /// `None`), and the pod annotation that says (`<prefix>containers`).
    defaults_for: Option<Vec<String>>,
    containers_key: String,
    /// How the app's containers are held until the template's are ready (`holdApplicationUntilSidecarReady`), for
    /// the Kubernetes version: `None` when they are not.
    hold: Option<Hold>,
    /// What a pod owned by a Job gets, after the fallback for the Kubernetes version.
    jobs: JobPolicy,
    /// `jobs` is `Skip` because `native-sidecar` needs a newer Kubernetes than the server's setting.
    jobs_fell_back: bool,
    /// The template in the Job shape (its containers as native sidecars), when `jobs` is `native-sidecar` and
    /// the template has containers to move.
    job_shape: Option<Box<Template>>,
    on_error: Option<Policy>,
    validation: Option<Validation>,
    pub(crate) overrides: Vec<OverrideSpec>,
    /// The renderers of the parts, in order; their slots are numbered one after the other.
    renderers: Vec<Arc<Renderer>>,
    /// For each render slot, the file and place of its expression (for messages).
    slot_paths: Vec<String>,
    /// The sections as written, for the checks of overrides.
    sources: Sources,
    /// The per-pod leaves that land in a field with a rule, and the rule.
    leaf_checks: Vec<LeafCheck>,
    /// The Kubernetes version the injected pods are validated for.
    kubernetes_version: KubeVersion,
    /// The template writes a host port (into its containers or, through the defaults, the pod's): whether it is
    /// free depends on the pod's own ports, so each pod is judged whole once the sidecar is merged in.
    writes_host_ports: bool,
    /// The API server's messages for the template's own part of a pod rendered on the sample pod, when some
    /// per-pod leaf renders a value no single-field rule can judge (a number, a quantity that meets a limit):
    /// such a template's part is validated whole with each pod's values, and a message not among these is the
    /// pod's values' doing (`Template::check_rendered`). `None` for every other template.
    rendered_baseline: Option<Vec<String>>,
    /// What `check` warns of: leaves that fail on a pod without labels or annotations (`file:line: ...`).
    warnings: Vec<String>,
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

        let combined_settings = PartSettings::combined(parts);
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
            containers: names_in(&combined.pod, "containers"),
            init_containers: names_in(&combined.pod, "initContainers"),
            volumes: names_in(&combined.pod, "volumes"),
        };
        // The injector's own part comes last, so the template's own value of what it writes wins.
        let own = injector_part(&injects, &combined.pod, settings)?;
        combined.add(own.as_ref());
        // Every part whose leaves render: the template's, then the injector's. Settings are the template's alone.
        let rendering: Vec<&Part> = parts.iter().copied().chain(own.as_ref()).collect();
        let Combined { mut pod, container_defaults, slot_paths, overrides } = combined;
        let status = status_value(&name, &hash, set_hash, &settings.revision, &injects);
        insert_status(&mut pod, &format!("{}status", settings.annotation_prefix), &status, &invalid)?;

        let sample = dry_render(&rendering)?;
        let warnings = unguarded_reads(&rendering);
        let root = &first.root;
        let mut rendered = |slot: usize| sample.slot(slot);
        let problem = |(path, reason): validate::Problem| {
            invalid(root.line_of(&path), format!("{}: {reason}", display_path(&path)))
        };
        let mut found = validate::pod(&yaml::to_json(&pod, &mut rendered));
        if let Some(defaults) = &container_defaults {
            let more = validate::container_defaults(&yaml::to_json(defaults, &mut rendered));
            found.problems.extend(more.problems);
            found.fatal |= more.fatal;
        }
        let problems: Vec<TemplateError> = found.problems.into_iter().map(problem).collect();
        if found.fatal {
            return Err(by_line(problems));
        }

        let compile = |pod: &YNode, defaults: Option<&YNode>| compile_trees(pod, defaults, root, &invalid);
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
        let jobs_fell_back = combined_settings.jobs == JobPolicy::NativeSidecar && !native;
        let template = Template {
            id: Arc::new(TemplateId::new(name, hash, set_hash.to_owned())),
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
            containers_key: crate::settings::Keys::new(&settings.annotation_prefix).containers,
            job_shape: None,
            on_error: combined_settings.on_error,
            validation: combined_settings.validation,
            overrides,
            renderers: rendering.iter().map(|p| p.renderer.clone()).collect(),
            slot_paths,
            sources: Sources { pod, container_defaults },
            writes_host_ports,
            rendered_baseline,
            leaf_checks,
            kubernetes_version: settings.kubernetes_version,
            warnings,
        };
        Ok((template, problems))
    }

    /// The `pod` and `containerDefaults` sections as written, with their lines: what the checks point at.
    pub(crate) fn sources(&self) -> (&YNode, Option<&YNode>) {
        (&self.sources.pod, self.sources.container_defaults.as_ref())
    }

    /// Is the template also assembled in the shape it takes for the pods of Jobs (its containers as native
    /// sidecars)? See [`Template::for_jobs`].
    pub(crate) fn has_job_shape(&self) -> bool {
        self.jobs == JobPolicy::NativeSidecar && !self.injects.containers.is_empty()
    }

    /// Sets the template's Job shape (see [`Template::has_job_shape`]), proven by the caller.
    pub(crate) fn set_job_shape(&mut self, for_jobs: Template) {
        self.job_shape = Some(Box::new(for_jobs));
    }

    /// The overrides `pod`'s annotations set, checked for their type only: for tests that compare the API server's
    /// rules with a real API server, which must see what nothing vetted.
    pub(crate) fn overrides_of(&self, pod: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
        let annotations = pod["metadata"]["annotations"].as_object();
        self.overrides
            .iter()
            .filter_map(|spec| {
                let raw = annotations?.get(&spec.annotation)?.as_str()?;
                Some((spec.value.clone(), spec.accept(raw).ok()?))
            })
            .collect()
    }

    /// Does `containerDefaults` reach the pod's container `name`? The pod's `<prefix>containers` annotation (names,
    /// comma-separated) says which containers it reaches, or else the template's `containerDefaultsFor`, or else
    /// every one.
    pub(crate) fn defaults_reach(&self, pod: &crate::pod::PodView<'_, '_>, name: &str) -> bool {
        match pod.annotation(&self.containers_key) {
            Some(names) => names.split(',').any(|n| n.trim() == name),
            None => self.defaults_for.as_ref().is_none_or(|names| names.iter().any(|n| n == name)),
        }
    }

    /// Does the pod decide whether this template's injection is valid (see `writes_host_ports`)? Such pods are
    /// judged whole, with the sidecar merged in, before the webhook answers.
    pub(crate) fn judged_with_the_pod(&self) -> bool {
        self.writes_host_ports
    }

    /// What a pod owned by a Job gets: the template as written, the template in the Job shape, or nothing
    /// (`Err`, saying whether that is the fallback of `native-sidecar` for the Kubernetes version).
    pub(crate) fn for_jobs(&self) -> Result<&Template, bool> {
        match self.jobs {
            JobPolicy::Inject => Ok(self),
            JobPolicy::NativeSidecar => Ok(self.job_shape.as_deref().unwrap_or(self)),
            JobPolicy::Skip => Err(self.jobs_fell_back),
        }
    }

    /// What the template does that fails for some pods though it loads: each a `file:line: ...` line with the
    /// fix (a label or annotation read without a default).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The `jobs` setting in effect.
    pub fn jobs(&self) -> JobPolicy {
        self.jobs
    }

    /// How the app's containers wait for the template's (`holdApplicationUntilSidecarReady`) at the Kubernetes
    /// version the template was assembled for; `None` when they do not.
    pub fn hold(&self) -> Option<Hold> {
        self.hold
    }

    /// Do the template's containers go in front of the pod's own, rather than after them? So when they hold the
    /// app with their `postStart` hooks, which the kubelet runs one container after the other.
    pub(crate) fn containers_first(&self) -> bool {
        self.hold == Some(Hold::PostStart)
    }

    /// The template's name: a file's stem, or the names of a combination joined by commas.
    pub fn name(&self) -> &str {
        &self.id.name
    }

    /// The template's version: the first 16 hex digits of the SHA-256 of its sources (and the shared values).
    pub fn hash(&self) -> &str {
        &self.id.version
    }

    /// The hash of the whole set this template was loaded with.
    pub fn set_hash(&self) -> &str {
        &self.id.set
    }

    /// The template's name and version.
    pub fn id(&self) -> &Arc<TemplateId> {
        &self.id
    }

    /// The value of the status annotation this template writes on the pods it injects.
    pub fn status(&self) -> &str {
        &self.status
    }

    /// The names of what the template declares.
    pub fn injects(&self) -> &Injects {
        &self.injects
    }

    /// The template's own error policy (`onError`), if it sets one.
    pub fn on_error(&self) -> Option<Policy> {
        self.on_error
    }

    /// The template's own validation policy (`validation`), if it sets one.
    pub fn validation(&self) -> Option<Validation> {
        self.validation
    }

    /// The annotations pods may set to override this template's values, with the type each must have.
    pub fn override_annotations(&self) -> impl Iterator<Item = (&str, &'static str)> {
        self.overrides.iter().map(|o| (o.annotation.as_str(), o.kind.name()))
    }

    /// Does a pod's status annotation say it was injected by this template, at this version? The set's hash is
    /// not compared: an edit of another template in the set does not make this pod's sidecar outdated.
    pub(crate) fn wrote_status(&self, status: &str) -> bool {
        status == self.status
            || Stamp::parse(status).is_some_and(|w| w.template == self.id.name && w.version == self.id.version)
    }

    /// Does the template write the annotation `key`, or read it as an override?
    pub(crate) fn reads_or_writes_annotation(&self, key: &str) -> bool {
        self.annotations.iter().any(|a| a == key)
    }

    /// The annotations the template writes or reads, for messages.
    pub(crate) fn annotations_read_or_written(&self) -> impl Iterator<Item = &str> {
        self.annotations.iter().map(String::as_str)
    }

    /// What to inject into a pod with (or without) overrides.
    pub(crate) fn trees(&self, overridden: bool) -> &Trees {
        match &self.plain {
            Some(plain) if !overridden => plain,
            _ => &self.overridable,
        }
    }

    /// True when the template has per-request leaves.
    pub(crate) fn renders_per_pod(&self) -> bool {
        self.renderers.iter().any(|r| !r.is_empty())
    }

    /// The fields of the pod the template's leaves read: the rest is not handed to them.
    pub(crate) fn reads(&self) -> Reads {
        self.renderers.iter().fold(Reads::default(), |reads, r| reads.union(r.reads()))
    }

    /// Renders every per-request leaf of every part for `pod` into `buf`, one range per slot (both cleared first),
    /// through the per-thread `cache` on the request path (without one for dry runs and checks).
    pub(crate) fn render<M: StrEntries, C: ContainerEntries>(
        &self,
        pod: &PodContext<'_, M, C>,
        overrides: &Overrides,
        mut cache: Option<&mut LeafCache>,
        buf: &mut Vec<u8>,
        ranges: &mut Vec<std::ops::Range<usize>>,
    ) -> Result<(), RenderError> {
        buf.clear();
        ranges.clear();
        for renderer in &self.renderers {
            let base = ranges.len();
            match cache.as_deref_mut() {
                Some(cache) => renderer.render_cached(pod, overrides, cache, buf, ranges),
                None => renderer.render(pod, overrides, buf, ranges),
            }
            .map_err(|e| RenderError { slot: base + e.slot, reason: e.reason })?;
        }
        Ok(())
    }

    /// Where the expression behind render slot `slot` sits in the template, for messages.
    pub(crate) fn slot_path(&self, slot: usize) -> &str {
        self.slot_paths.get(slot).map_or("", String::as_str)
    }
}

/// The sections of several parts laid one over the other: each later part fills only what the earlier ones
/// leave out, by injection's own rules ([`combine::fill`]), its render slots numbered after theirs.
struct Combined {
    pod: YNode,
    container_defaults: Option<YNode>,
    /// For each render slot, the file and place of its expression (for messages).
    slot_paths: Vec<String>,
    /// The overrides of every part; an annotation the first to declare it keeps.
    overrides: Vec<OverrideSpec>,
}

impl Combined {
    fn of(parts: &[&Part]) -> Self {
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
    fn add(&mut self, part: Option<&Part>) {
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
fn injector_part(injects: &Injects, pod: &YNode, settings: &Settings) -> Result<Option<Part>, TemplateError> {
    let written = |key: &str| {
        pod.map_get("metadata").and_then(|m| m.map_get("annotations")).and_then(|a| a.map_get(key)).is_some()
    };
    let mut annotations = serde_json::Map::new();
    if !injects.containers.is_empty() && !written(DEFAULT_CONTAINER_ANNOTATION) {
        // `ours` is a JSON list of names, which is a minijinja list literal too. A pod whose every container is
        // ours (it declares only the sidecar) gets an empty name, which kubectl ignores.
        let ours = serde_json::to_string(&injects.containers).expect("a list of strings serialises");
        let leaf =
            format!(r#"{{{{ pod.containers | map(attribute="name") | reject("in", {ours}) | first | default("") }}}}"#);
        annotations.insert(DEFAULT_CONTAINER_ANNOTATION.into(), leaf.into());
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

/// The names of the template's volumes that keep a node from being scaled down unless the pod says they may be
/// lost: `emptyDir` and `hostPath` ones.
fn local_volumes(pod: &YNode) -> Vec<&str> {
    let volumes = match pod.map_get("spec").and_then(|s| s.map_get("volumes")).map(|v| &v.value) {
        Some(YValue::Seq(items)) => items.as_slice(),
        _ => &[],
    };
    let local = |volume: &&YNode| ["emptyDir", "hostPath"].iter().any(|source| volume.map_get(source).is_some());
    volumes.iter().filter(local).filter_map(|v| v.map_get("name").and_then(YNode::as_str)).collect()
}

/// The per-pod leaves of every part rendered on the sample pod, slot by slot.
struct SampleRender {
    buf: Vec<u8>,
    ranges: Vec<std::ops::Range<usize>>,
}

impl SampleRender {
    fn slot(&self, slot: usize) -> serde_json::Value {
        serde_json::from_slice(&self.buf[self.ranges[slot].clone()]).unwrap_or(serde_json::Value::Null)
    }
}

/// Renders the per-pod leaves of `parts` on the sample pod; every leaf that cannot render there is refused at
/// its line.
fn dry_render(parts: &[&Part]) -> Result<SampleRender, TemplateError> {
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
fn unguarded_reads(parts: &[&Part]) -> Vec<String> {
    let bare = PodContext { labels: Default::default(), annotations: Default::default(), ..sample_pod() };
    let what = "fails on a pod without labels or annotations";
    parts
        .iter()
        .flat_map(|part| part.renderer.all_failures(&bare).into_iter().map(|e| part.leaf_problem(&e, what).to_string()))
        .collect()
}

/// Compiles the `pod` and `containerDefaults` sections into the trees the merge walks.
fn compile_trees(
    pod: &YNode,
    defaults: Option<&YNode>,
    root: &YNode,
    invalid: &dyn Fn(usize, String) -> TemplateError,
) -> Result<Trees, TemplateError> {
    let problem = |base: &str, (path, reason): tree::CompileProblem| {
        let full = [vec![PathSeg::Key(base.to_owned())], path].concat();
        invalid(root.line_of(&full), format!("{}: {reason}", display_path(&full)))
    };
    let container_defaults = match defaults {
        Some(d) => {
            Some(tree::compile(d, Place::Root, &mut Vec::new(), None).map_err(|p| problem("containerDefaults", p))?)
        }
        None => None,
    };
    let pod = tree::compile(pod, Place::Root, &mut Vec::new(), Some("")).map_err(|p| problem("pod", p))?;
    Ok(Trees { pod, container_defaults })
}

/// The leaves of `parts` that read only overridable values, by slot (numbered across the parts), with their
/// value for a pod that overrides nothing.
fn override_defaults(parts: &[&Part]) -> std::collections::HashMap<usize, serde_json::Value> {
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

/// A template file's settings: its top-level keys besides `values`, `pod`, `containerDefaults` and `overrides`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PartSettings {
    /// `initContainerPosition`: `first` (the default) or `last`.
    init_position: InitPosition,
    /// `injectHostNetwork`: `false` by default.
    inject_host_network: bool,
    /// `holdApplicationUntilSidecarReady`: `false` by default.
    hold_application: bool,
    /// `jobs`: `native-sidecar` (the default), `skip` or `inject`.
    jobs: JobPolicy,
    /// `onError`: `allow` or `deny`; the server's setting when absent.
    on_error: Option<Policy>,
    /// `validation`: `deny` or `warn`; the server's setting when absent.
    validation: Option<Validation>,
    /// `minKubernetesVersion`: the oldest Kubernetes the template is for. Below it the template is not compiled:
    /// a set loads without it, and pods that ask for it are answered per `onError`.
    min_version: Option<KubeVersion>,
}

impl PartSettings {
    /// Reads a template file's settings, each refused at its line with what it must be.
    fn read(root: &YNode, invalid: &dyn Fn(usize, String) -> TemplateError) -> Result<Self, TemplateError> {
        let position = |n: &YNode| match n.as_str() {
            Some("first") => Some(InitPosition::First),
            Some("last") => Some(InitPosition::Last),
            _ => None,
        };
        let boolean = |n: &YNode| match n.value {
            YValue::Bool(b) => Some(b),
            _ => None,
        };
        let policy = |n: &YNode| n.as_str().and_then(Policy::parse);
        let jobs = |n: &YNode| n.as_str().and_then(JobPolicy::parse);
        let validation = |n: &YNode| n.as_str().and_then(Validation::parse);
        // Quoted: YAML reads 1.30 unquoted as the number 1.3.
        let version = |n: &YNode| n.as_str().and_then(|text| text.parse::<KubeVersion>().ok());
        Ok(PartSettings {
            init_position: setting(root, "initContainerPosition", "`first` or `last`", position, invalid)?
                .unwrap_or(InitPosition::First),
            inject_host_network: setting(root, "injectHostNetwork", "true or false", boolean, invalid)?
                .unwrap_or(false),
            hold_application: setting(root, hold::KEY, "true or false", boolean, invalid)?.unwrap_or(false),
            jobs: setting(root, "jobs", "`native-sidecar`, `skip` or `inject`", jobs, invalid)?.unwrap_or_default(),
            on_error: setting(root, "onError", "`allow` or `deny`", policy, invalid)?,
            validation: setting(root, "validation", "`deny` or `warn`", validation, invalid)?,
            min_version: setting(
                root,
                "minKubernetesVersion",
                "a Kubernetes version in quotes, such as \"1.29\" (unquoted, 1.30 is the number 1.3)",
                version,
                invalid,
            )?,
        })
    }

    /// The settings of parts applied in order: the first part's init position; a host-network pod is injected
    /// only if every part allows it; the app waits for the sidecars if any part says so; for each policy, the
    /// strictest part decides (for Jobs: `skip` over `native-sidecar` over `inject`).
    fn combined(parts: &[&Part]) -> Self {
        let first = parts.first().expect("a template is assembled from at least one part");
        let on_error = if parts.iter().any(|p| p.settings.on_error == Some(Policy::Deny)) {
            Some(Policy::Deny)
        } else {
            parts.iter().find_map(|p| p.settings.on_error)
        };
        let validation = if parts.iter().any(|p| p.settings.validation == Some(Validation::Deny)) {
            Some(Validation::Deny)
        } else {
            parts.iter().find_map(|p| p.settings.validation)
        };
        PartSettings {
            init_position: first.settings.init_position,
            inject_host_network: parts.iter().all(|p| p.settings.inject_host_network),
            hold_application: parts.iter().any(|p| p.settings.hold_application),
            jobs: [JobPolicy::Skip, JobPolicy::NativeSidecar]
                .into_iter()
                .find(|policy| parts.iter().any(|p| p.settings.jobs == *policy))
                .unwrap_or(JobPolicy::Inject),
            on_error,
            validation,
            min_version: parts.iter().filter_map(|p| p.settings.min_version).max(),
        }
    }
}

/// The top-level setting `key` of a template file, if it is there, read by `parse`; refused at its line, saying
/// what it must be, when `parse` cannot read it.
fn setting<T>(
    root: &YNode,
    key: &str,
    expected: &str,
    parse: impl Fn(&YNode) -> Option<T>,
    invalid: &dyn Fn(usize, String) -> TemplateError,
) -> Result<Option<T>, TemplateError> {
    let Some(node) = root.map_get(key) else { return Ok(None) };
    parse(node).map(Some).ok_or_else(|| invalid(node.line, format!("`{key}` must be {expected}")))
}

impl Part {
    /// A leaf of this part that failed to render (`what` on which pod), at its line.
    fn leaf_problem(&self, error: &RenderError, what: &str) -> TemplateError {
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
        if let Some((key, node)) = members.iter().find(|(k, _)| !TOP_LEVEL_KEYS.contains(&k.as_str())) {
            let hint = match crate::suggest::closest(key, TOP_LEVEL_KEYS) {
                Some(close) => format!("did you mean `{close}`?"),
                None => format!("expected one of {}", TOP_LEVEL_KEYS.join(", ")),
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
                .map_err(|(path, reason)| invalid(root.line_of(&path), format!("{}: {reason}", display_path(&path))))?,
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
            return Err(several(
                problems
                    .map(|(line, path, reason)| invalid(line, format!("{}: {reason}", display_path(&path))))
                    .collect(),
            ));
        }
        if settings.hold_application {
            let line = root.map_get(hold::KEY).map_or(root.line, |setting| setting.line);
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

/// One error for several: the only one, or all of them.
pub(crate) fn several(mut errors: Vec<TemplateError>) -> TemplateError {
    if errors.len() == 1 { errors.remove(0) } else { TemplateError::Several(errors) }
}

/// The problems of one file in the order of their lines, as one error.
pub(crate) fn by_line(mut errors: Vec<TemplateError>) -> TemplateError {
    errors.sort_by_key(|e| match e {
        TemplateError::Invalid { line, .. } => *line,
        _ => 0,
    });
    several(errors)
}

/// Reads a template file: `(name, file label, source)`, the name being the file stem.
pub(crate) fn read_template_file(path: &Path) -> Result<(String, String, String), TemplateError> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path).map_err(|source| TemplateError::Read { file: file.clone(), source })?;
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or(BUILTIN_NAME).to_owned();
    Ok((name, file, source))
}

/// The hash of a whole set: every template's name and source, and the shared values file.
pub(crate) fn set_hash<'a>(templates: impl Iterator<Item = (&'a str, &'a str)>, values: Option<&str>) -> String {
    let mut hasher = Sha256::new();
    for (name, source) in templates {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(source.as_bytes());
        hasher.update([0]);
    }
    if let Some(values) = values {
        hasher.update(b"values\0");
        hasher.update(values.as_bytes());
    }
    hex_prefix(&hasher.finalize())
}

/// Replaces values-only expressions by their rendered value and pod-dependent ones by render slots; each one
/// that cannot be compiled is added to `problems` (line, path, reason).
fn resolve(
    node: &mut YNode,
    path: &mut Vec<PathSeg>,
    renderer: &mut Renderer,
    slot_paths: &mut Vec<Vec<PathSeg>>,
    problems: &mut Vec<(usize, Vec<PathSeg>, String)>,
) {
    match &mut node.value {
        YValue::Str(source) if is_template(source) => match renderer.add_leaf(source) {
            Ok(LeafKind::Static(json)) => *node = yaml::from_json(json, node.line),
            Ok(LeafKind::Dynamic(slot)) => {
                slot_paths.push(path.clone());
                node.value = YValue::Dynamic(slot);
            }
            Err(error) => problems.push((node.line, path.clone(), error.to_string())),
        },
        YValue::Map(members) => {
            for (key, value) in members {
                if is_template(key) {
                    problems.push((value.line, path.clone(), format!("keys cannot be templated: {key:?}")));
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

/// The keys of the template's `pod.metadata.annotations`.
fn annotation_keys(pod: &YNode) -> impl Iterator<Item = String> + '_ {
    let annotations = pod.map_get("metadata").and_then(|m| m.map_get("annotations"));
    let members = match annotations.map(|a| &a.value) {
        Some(YValue::Map(members)) => members.as_slice(),
        _ => &[],
    };
    members.iter().map(|(key, _)| key.clone())
}

/// The status annotation (`<prefix>status`) the injector writes on every pod it injects: which template, at which
/// version, from which set and revision, and what it injects. Written when a template is assembled, read back by
/// the engine (is a pod's sidecar this template's?) and by `status` (which pods run an outdated one?).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stamp {
    /// The containers the template injects.
    #[serde(default)]
    pub containers: Vec<String>,
    /// Its init containers (native sidecars among them).
    #[serde(default)]
    pub init_containers: Vec<String>,
    /// The revision (`serve --template-dir NAME=DIR`) that injected the pod; absent on pods injected before
    /// revisions existed, which the default revision did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The hash of the template set.
    #[serde(default)]
    pub set: String,
    /// The template's name.
    pub template: String,
    /// The template's version.
    pub version: String,
    /// The volumes it injects.
    #[serde(default)]
    pub volumes: Vec<String>,
}

impl Stamp {
    /// Reads a pod's status annotation; `None` when it is not one of ours.
    pub fn parse(annotation: &str) -> Option<Stamp> {
        serde_json::from_str(annotation).ok()
    }

    /// The revision that injected the pod: the default one for a pod stamped before revisions existed.
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }
}

/// The status annotation: which template, its version, the set's and the revision, and what it injects.
fn status_value(name: &str, hash: &str, set_hash: &str, revision: &str, injects: &Injects) -> String {
    let stamp = Stamp {
        containers: injects.containers.clone(),
        init_containers: injects.init_containers.clone(),
        revision: Some(revision.to_owned()),
        set: set_hash.to_owned(),
        template: name.to_owned(),
        version: hash.to_owned(),
        volumes: injects.volumes.clone(),
    };
    serde_json::to_string(&stamp).expect("a stamp serialises")
}

/// Adds the status annotation to the template's `pod.metadata.annotations`, so that it is merged like any other
/// annotation: added when absent, left alone when present.
fn insert_status(
    pod: &mut YNode,
    key: &str,
    value: &str,
    invalid: &dyn Fn(usize, String) -> TemplateError,
) -> Result<(), TemplateError> {
    let line = pod.line;
    let section = |node: &mut YNode, name: &str| -> Result<(), TemplateError> {
        match &mut node.value {
            YValue::Map(members) => {
                if !members.iter().any(|(k, _)| k == name) {
                    members.push((name.to_owned(), YNode { line, value: YValue::Map(Vec::new()) }));
                }
                Ok(())
            }
            _ => Err(invalid(node.line, format!("`{name}`'s parent must be a mapping"))),
        }
    };
    section(pod, "metadata")?;
    let metadata = pod.map_get_mut("metadata").expect("inserted above");
    section(metadata, "annotations")?;
    let annotations = metadata.map_get_mut("annotations").expect("inserted above");
    if annotations.map_get(key).is_some() {
        return Err(invalid(annotations.line, format!("the annotation `{key}` is written by the injector; remove it")));
    }
    let YValue::Map(members) = &mut annotations.value else {
        return Err(invalid(annotations.line, "`metadata.annotations` must be a mapping".into()));
    };
    members.push((key.to_owned(), YNode { line, value: YValue::Str(value.to_owned()) }));
    Ok(())
}

/// The pod that templates are dry-rendered on when they load.
#[allow(clippy::type_complexity)]
fn sample_pod()
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

#[cfg(test)]
mod tests;
