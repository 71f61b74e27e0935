//! A template's top-level settings (`onError`, `validation`, `jobs`, `initContainerPosition`, ...), one row each:
//! its key, what it must be, how it is read, its value when absent and how a combination takes it from its parts.
//! The rows make [`PartSettings`], its reading and its combining, and the keys a file may have; a new setting is
//! one row here (and, if the compiled template needs it, a read in `compile`).

use super::TemplateError;
use super::yaml::{YNode, YValue};
use crate::settings::{Policy, Validation};
use crate::validation::KubeVersion;
use strum::VariantNames;

/// The key of the setting that holds the app until the sidecars are ready (`hold`).
pub(super) const HOLD_KEY: &str = "holdApplicationUntilSidecarReady";

/// The top-level keys of a template file that are not settings: its sections.
const SECTIONS: [&str; 5] = ["values", "pod", "containerDefaults", "containerDefaultsFor", "overrides"];

/// Declares the settings, one row each: `field: Type = "key", what it must be, read, absent, combine;` and makes
/// [`PartSettings`] (one field per row), [`SETTING_KEYS`], [`PartSettings::read`] and
/// [`PartSettings::combined`] from them.
macro_rules! part_settings {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty = $key:expr, $expected:expr,
            read $read:expr, absent $absent:expr, combine $combine:expr;
    )*) => {
        /// A template file's settings: its top-level keys besides its sections.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(super) struct PartSettings {
            $( $(#[doc = $doc])* pub(super) $field: $ty, )*
        }

        /// The settings' keys, in the order of their rows.
        const SETTING_KEYS: &[&str] = &[$($key),*];

        impl PartSettings {
            /// Reads a template file's settings, each refused at its line with what it must be.
            pub(super) fn read(
                root: &YNode,
                invalid: &dyn Fn(usize, String) -> TemplateError,
            ) -> Result<Self, TemplateError> {
                Ok(PartSettings {
                    $( $field: setting(root, $key, &$expected, $read, invalid)?.unwrap_or($absent), )*
                })
            }

            /// The settings of parts applied in order, each combined by its row's rule.
            pub(super) fn combined(parts: &[&PartSettings]) -> Self {
                assert!(!parts.is_empty(), "a template is assembled from at least one part");
                PartSettings {
                    $( $field: {
                        let values: Vec<$ty> = parts.iter().map(|part| part.$field).collect();
                        let combine: fn(&[$ty]) -> $ty = $combine;
                        combine(&values)
                    }, )*
                }
            }
        }
    };
}

part_settings! {
    /// `initContainerPosition`: where missing init containers go, `first` (the default) or `last`; a combination
    /// takes the first part's.
    init_position: InitPosition = "initContainerPosition", one_of(InitPosition::VARIANTS),
        read |n| n.as_str()?.parse().ok(), absent InitPosition::First, combine |values| values[0];
    /// `injectHostNetwork`: `false` by default; a combination injects a host-network pod only if every part does.
    inject_host_network: bool = "injectHostNetwork", "true or false",
        read boolean, absent false, combine |values| values.iter().all(|&b| b);
    /// `holdApplicationUntilSidecarReady`: `false` by default; a combination holds the app if any part does.
    hold_application: bool = HOLD_KEY, "true or false",
        read boolean, absent false, combine |values| values.iter().any(|&b| b);
    /// `jobs`: `native-sidecar` (the default), `skip` or `inject`; a combination takes the strictest, `skip` over
    /// `native-sidecar` over `inject`.
    jobs: JobPolicy = "jobs", one_of(JobPolicy::VARIANTS),
        read |n| n.as_str()?.parse().ok(), absent JobPolicy::NativeSidecar,
        combine |values| [JobPolicy::Skip, JobPolicy::NativeSidecar, JobPolicy::Inject]
            .into_iter()
            .find(|policy| values.contains(policy))
            .unwrap_or_default();
    /// `onError`: `allow` or `deny`; the server's setting when absent; a combination denies if any part does.
    on_error: Option<Policy> = "onError", one_of(Policy::VARIANTS),
        read |n| n.as_str()?.parse().ok().map(Some), absent None, combine |values| strictest(values, Policy::Deny);
    /// `validation`: `deny` or `warn`; the server's setting when absent; a combination denies if any part does.
    validation: Option<Validation> = "validation", one_of(Validation::VARIANTS),
        read |n| n.as_str()?.parse().ok().map(Some), absent None,
        combine |values| strictest(values, Validation::Deny);
    /// `minKubernetesVersion`: the oldest Kubernetes the template is for. Below it the template is not compiled:
    /// a set loads without it, and pods that ask for it are answered per `onError`. A combination is for the
    /// newest of its parts' versions.
    min_version: Option<KubeVersion> = "minKubernetesVersion",
        "a Kubernetes version in quotes, such as \"1.29\" (unquoted, 1.30 is the number 1.3)",
        // Quoted: YAML reads 1.30 unquoted as the number 1.3.
        read |n| n.as_str()?.parse().ok().map(Some), absent None,
        combine |values| values.iter().flatten().max().copied();
}

/// Every top-level key a template file may have: its sections, then its settings.
pub(super) fn top_level_keys() -> impl Iterator<Item = &'static str> {
    SECTIONS.into_iter().chain(SETTING_KEYS.iter().copied())
}

/// `true` or `false`.
fn boolean(node: &YNode) -> Option<bool> {
    match node.value {
        YValue::Bool(b) => Some(b),
        _ => None,
    }
}

/// The words of a closed set, as a refusal lists them: "`allow` or `deny`", "`a`, `b` or `c`".
fn one_of(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|word| format!("`{word}`")).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// `strict` if any part says so, else the first part's own word, else none.
fn strictest<T: Copy + PartialEq>(values: &[Option<T>], strict: T) -> Option<T> {
    if values.contains(&Some(strict)) { Some(strict) } else { values.iter().flatten().next().copied() }
}

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumString, strum::VariantNames)]
#[strum(serialize_all = "kebab-case")]
pub enum InitPosition {
    /// Before the pod's own init containers (so a proxy or native sidecar runs before them).
    First,
    /// After the pod's own init containers.
    Last,
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
