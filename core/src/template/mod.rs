//! Templates: what to inject, loaded from YAML, validated and compiled once, then applied to many pods.
//!
//! A template file is YAML with these top-level keys (see `templates/default.yaml` and docs/templates.md):
//!
//! - `values`: free-form data that expressions can use as `values.*`;
//! - `pod`: a partial Pod (`metadata.labels`, `metadata.annotations` and any `spec` field) merged add-only into
//!   every injected pod;
//! - `containerDefaults`: a partial container merged add-only into each of the pod's own containers
//!   (`containerDefaultsFor` names which);
//! - `overrides`: the per-pod annotations a template lets a pod set;
//! - its settings (`onError`, `jobs`, `initContainerPosition`, ...), each declared once, in `part_settings`.
//!
//! String values may be minijinja expressions. Those that use only `values` are rendered at load time; those
//! that use `pod` are rendered per request. Loading fails, with the file, line and reason, when the YAML is
//! malformed, an expression does not compile or render on a sample pod, or the result is not a valid part of
//! a Pod.

mod api_types;
mod combine;
mod compile;
mod error;
mod hold;
mod known_fields;
mod leaf_cache;
mod leaf_checks;
mod native;
mod overrides;
mod part;
mod part_settings;
mod pod_context;
mod render;
mod stamp;
pub(crate) mod tree;
pub(crate) mod yaml;

use std::sync::Arc;

use crate::settings::{Policy, Validation};
use crate::validation::KubeVersion;

pub(crate) use compile::{Shape, default_container_leaf};
pub use error::TemplateError;
pub(crate) use error::{Problem, by_line, several};
pub use hold::Hold;
pub(crate) use leaf_cache::LeafCache;
use leaf_checks::LeafCheck;
pub(crate) use overrides::OverrideSpec;
pub(crate) use part::{Part, read_template_file};
pub use part_settings::{InitPosition, JobPolicy, NATIVE_SIDECAR_MINOR};
pub(crate) use pod_context::{ContainerEntries, PodContext, Port, Reads, StrEntries};
pub(crate) use render::{Overrides, RenderError, Renderer};
pub(crate) use stamp::set_hash;
pub use stamp::{Stamp, Tag, TemplateId};
use tree::TNode;
use yaml::YNode;

/// The template compiled into the binary: `templates/default.yaml`.
pub const BUILTIN_SOURCE: &str = include_str!("../../../templates/default.yaml");
/// The templates this release ships (`templates/`), by file name: what `certs` seeds the templates directory of
/// an overlay with. The base's ConfigMap holds the same files (tests/suite/manifests.rs checks both against `templates/`).
pub const SHIPPED: &[(&str, &str)] = &[
    ("default.yaml", BUILTIN_SOURCE),
    ("demo.yaml", include_str!("../../../templates/demo.yaml")),
    ("native-sidecar.yaml", include_str!("../../../templates/native-sidecar.yaml")),
    ("restricted.yaml", include_str!("../../../templates/restricted.yaml")),
    ("wait-for-sidecar.yaml", include_str!("../../../templates/wait-for-sidecar.yaml")),
];
/// The name the built-in template is known by, and the template pods get when they do not ask for one.
pub const BUILTIN_NAME: &str = "default";

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
    /// `status` split where a revision tag goes.
    stamp: stamp::StampText,
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
    /// `None`); the pod annotation that says is `keys.containers`.
    defaults_for: Option<Vec<String>>,
    /// The injector's annotation keys, under the prefix the template was compiled with.
    pub(crate) keys: crate::settings::Keys,
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
    /// The template writes volume mounts or devices: a path the pod's container uses for a block device (or a
    /// volume it uses as one) makes the mount invalid, so pods with block devices are judged whole.
    writes_mounts: bool,
    /// The template writes labels or topology spread constraints, which meet a pod's own constraints (their
    /// `matchLabelKeys` read the pod's labels once the API server merges them), so pods with spread constraints
    /// are judged whole.
    writes_spread_inputs: bool,
    /// The template writes resize policies, which a pod that never restarts allows only as `NotRequired`: pods
    /// that run to completion are judged whole.
    writes_resize_policy: bool,
    /// The API server's messages for the template's own part of a pod rendered on the sample pod, when some
    /// per-pod leaf renders a value no single-field rule can judge (a number, a quantity that meets a limit):
    /// such a template's part is validated whole with each pod's values, and a message not among these is the
    /// pod's values' doing (`Template::check_rendered`). `None` for every other template.
    rendered_baseline: Option<Vec<String>>,
    /// What `check` warns of: leaves that fail on a pod without labels or annotations (`file:line: ...`).
    warnings: Vec<String>,
}

impl Template {
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
        match pod.annotation(&self.keys.containers) {
            Some(names) => names.split(',').any(|n| n.trim() == name),
            None => self.defaults_for.as_ref().is_none_or(|names| names.iter().any(|n| n == name)),
        }
    }

    /// Does the pod decide whether this template's injection is valid (see `writes_host_ports`)? Such pods are
    /// judged whole, with the sidecar merged in, before the webhook answers.
    pub(crate) fn judged_with_the_pod(&self) -> bool {
        self.writes_host_ports
    }

    /// See `writes_mounts`.
    pub(crate) fn writes_mounts(&self) -> bool {
        self.writes_mounts
    }

    /// See `writes_spread_inputs`.
    pub(crate) fn writes_spread_inputs(&self) -> bool {
        self.writes_spread_inputs
    }

    /// See `writes_resize_policy`.
    pub(crate) fn writes_resize_policy(&self) -> bool {
        self.writes_resize_policy
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

    /// Writes the status annotation of a pod that came through the webhooks of revision tag `tag`, as a JSON
    /// string, into `out` (cleared).
    pub(crate) fn write_tagged_stamp(&self, tag: &Tag, out: &mut Vec<u8>) {
        self.stamp.write_tagged(tag, out);
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
            || self.stamp.is_tagged(status)
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

    /// The leaf behind render slot `slot` as written (its minijinja text), and the values it may read.
    pub(crate) fn slot_source(&self, slot: usize) -> Option<(&str, &serde_json::Value)> {
        let mut local = slot;
        for renderer in &self.renderers {
            if local < renderer.slots() {
                return renderer.leaf_source(local);
            }
            local -= renderer.slots();
        }
        None
    }

    /// The line of render slot `slot` in the template's own sections, when it is there.
    pub(crate) fn slot_line(&self, slot: usize) -> Option<usize> {
        fn find(node: &YNode, slot: usize) -> Option<usize> {
            match &node.value {
                yaml::YValue::Dynamic(s) if *s == slot => Some(node.line),
                yaml::YValue::Map(members) => members.iter().find_map(|(_, v)| find(v, slot)),
                yaml::YValue::Seq(items) => items.iter().find_map(|v| find(v, slot)),
                _ => None,
            }
        }
        find(&self.sources.pod, slot).or_else(|| self.sources.container_defaults.as_ref().and_then(|d| find(d, slot)))
    }

    /// The containers `containerDefaults` reaches when the pod's annotation does not say (`None`: every one).
    pub(crate) fn defaults_for(&self) -> Option<&[String]> {
        self.defaults_for.as_deref()
    }

    /// Does the template validate per-pod values beyond what each field's own rule judges, or hold the app?
    /// What the policy compiler cannot carry (see `policy`): the reasons, if any.
    pub(crate) fn needs_the_webhook(&self) -> Vec<&'static str> {
        let mut reasons = Vec::new();
        if !self.overrides.is_empty() {
            reasons.push("it has overrides, vetted per pod against the API server's rules");
        }
        if self.hold.is_some() {
            reasons.push("holdApplicationUntilSidecarReady");
        }
        if !self.leaf_checks.is_empty() || self.rendered_baseline.is_some() {
            reasons.push("a per-pod value lands in a field the API server validates, which the webhook checks per pod");
        }
        if self.writes_host_ports {
            reasons.push("it writes host ports, judged with each pod's own");
        }
        reasons
    }

    /// Where the expression behind render slot `slot` sits in the template, for messages.
    pub(crate) fn slot_path(&self, slot: usize) -> &str {
        self.slot_paths.get(slot).map_or("", String::as_str)
    }
}

#[cfg(test)]
mod tests;
