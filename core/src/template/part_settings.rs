//! A template's top-level settings (`onError`, `validation`, `jobs`, `initContainerPosition`, ...): the keys a file
//! may have, how each is read, and how a combination takes them from its parts. A new setting is added here (and
//! read into [`Template`](super::Template) in `compile`).

use super::TemplateError;
use super::yaml::{YNode, YValue};
use crate::settings::{Policy, Validation};
use crate::validation::KubeVersion;

/// The key of the setting that holds the app until the sidecars are ready (`hold`).
pub(super) const HOLD_KEY: &str = "holdApplicationUntilSidecarReady";

pub(super) const TOP_LEVEL_KEYS: [&str; 12] = [
    "values",
    "pod",
    "containerDefaults",
    "containerDefaultsFor",
    "initContainerPosition",
    "injectHostNetwork",
    HOLD_KEY,
    "jobs",
    "onError",
    "validation",
    "overrides",
    "minKubernetesVersion",
];

/// What a template does for a pod owned by a Job (which covers a CronJob's): a regular sidecar container never
/// exits, so the Job's pod would never complete (kubernetes#25908).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, strum::EnumString, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "kebab-case")]
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
    /// The setting's name in a template.
    pub fn as_str(self) -> &'static str {
        self.into()
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

/// A template file's settings: its top-level keys besides `values`, `pod`, `containerDefaults` and `overrides`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PartSettings {
    /// `initContainerPosition`: `first` (the default) or `last`.
    pub(super) init_position: InitPosition,
    /// `injectHostNetwork`: `false` by default.
    pub(super) inject_host_network: bool,
    /// `holdApplicationUntilSidecarReady`: `false` by default.
    pub(super) hold_application: bool,
    /// `jobs`: `native-sidecar` (the default), `skip` or `inject`.
    pub(super) jobs: JobPolicy,
    /// `onError`: `allow` or `deny`; the server's setting when absent.
    pub(super) on_error: Option<Policy>,
    /// `validation`: `deny` or `warn`; the server's setting when absent.
    pub(super) validation: Option<Validation>,
    /// `minKubernetesVersion`: the oldest Kubernetes the template is for. Below it the template is not compiled:
    /// a set loads without it, and pods that ask for it are answered per `onError`.
    pub(super) min_version: Option<KubeVersion>,
}

impl PartSettings {
    /// Reads a template file's settings, each refused at its line with what it must be.
    pub(super) fn read(root: &YNode, invalid: &dyn Fn(usize, String) -> TemplateError) -> Result<Self, TemplateError> {
        let position = |n: &YNode| match n.as_str() {
            Some("first") => Some(InitPosition::First),
            Some("last") => Some(InitPosition::Last),
            _ => None,
        };
        let boolean = |n: &YNode| match n.value {
            YValue::Bool(b) => Some(b),
            _ => None,
        };
        let policy = |n: &YNode| n.as_str().and_then(|s| s.parse::<Policy>().ok());
        let jobs = |n: &YNode| n.as_str().and_then(|s| s.parse::<JobPolicy>().ok());
        let validation = |n: &YNode| n.as_str().and_then(|s| s.parse::<Validation>().ok());
        // Quoted: YAML reads 1.30 unquoted as the number 1.3.
        let version = |n: &YNode| n.as_str().and_then(|text| text.parse::<KubeVersion>().ok());
        Ok(PartSettings {
            init_position: setting(root, "initContainerPosition", "`first` or `last`", position, invalid)?
                .unwrap_or(InitPosition::First),
            inject_host_network: setting(root, "injectHostNetwork", "true or false", boolean, invalid)?
                .unwrap_or(false),
            hold_application: setting(root, HOLD_KEY, "true or false", boolean, invalid)?.unwrap_or(false),
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
    pub(super) fn combined(parts: &[&PartSettings]) -> Self {
        let first = parts.first().expect("a template is assembled from at least one part");
        let on_error = if parts.iter().any(|p| p.on_error == Some(Policy::Deny)) {
            Some(Policy::Deny)
        } else {
            parts.iter().find_map(|p| p.on_error)
        };
        let validation = if parts.iter().any(|p| p.validation == Some(Validation::Deny)) {
            Some(Validation::Deny)
        } else {
            parts.iter().find_map(|p| p.validation)
        };
        PartSettings {
            init_position: first.init_position,
            inject_host_network: parts.iter().all(|p| p.inject_host_network),
            hold_application: parts.iter().any(|p| p.hold_application),
            jobs: [JobPolicy::Skip, JobPolicy::NativeSidecar]
                .into_iter()
                .find(|policy| parts.iter().any(|p| p.jobs == *policy))
                .unwrap_or(JobPolicy::Inject),
            on_error,
            validation,
            min_version: parts.iter().filter_map(|p| p.min_version).max(),
        }
    }
}

/// The top-level setting `key` of a template file, if it is there, read by `parse`; refused at its line, saying
/// what it must be, when `parse` cannot read it.
pub(super) fn setting<T>(
    root: &YNode,
    key: &str,
    expected: &str,
    parse: impl Fn(&YNode) -> Option<T>,
    invalid: &dyn Fn(usize, String) -> TemplateError,
) -> Result<Option<T>, TemplateError> {
    let Some(node) = root.map_get(key) else { return Ok(None) };
    parse(node).map(Some).ok_or_else(|| invalid(node.line, format!("`{key}` must be {expected}")))
}
