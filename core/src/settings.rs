//! The injector's settings that are not part of a template, in one place: what the engine, the template
//! compiler and the CLI read (clap's `ValueEnum` is derived on the very types), and the annotation names the
//! prefix gives. A new engine setting is a field here, its default in [`Settings::default`], and its flag in
//! `cli/`; `cli::tests` ties the two defaults.

use crate::validation::KubeVersion;

/// The default annotation prefix.
pub const DEFAULT_PREFIX: &str = "sidecar-injector.io/";

/// The name of the revision that serves the bare `/mutate` and `/validate` paths when `serve` is given one
/// unnamed template directory (or none).
pub const DEFAULT_REVISION: &str = "default";

/// Engine settings that are not part of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The annotation prefix, e.g. `sidecar-injector.io/`.
    pub annotation_prefix: String,
    /// What to do with a pod whose injection cannot be rendered, unless its template says otherwise.
    pub on_error: Policy,
    /// What to do with a pod that names a template the set does not have.
    pub on_unknown_template: Policy,
    /// What `/validate` answers for an incompletely injected pod, unless its template says otherwise.
    pub validation: Validation,
    /// The Kubernetes version the injected pods are validated for (templates at load, overrides per pod).
    pub kubernetes_version: KubeVersion,
    /// The revision this engine serves, which the status annotation records.
    pub revision: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            annotation_prefix: DEFAULT_PREFIX.to_owned(),
            on_error: Policy::Allow,
            on_unknown_template: Policy::Allow,
            validation: Validation::Deny,
            kubernetes_version: KubeVersion::DEFAULT,
            revision: DEFAULT_REVISION.to_owned(),
        }
    }
}

/// What to do with a pod when injection cannot proceed (a template fails to render, an unknown template name).
/// Also the value of `--on-error` and `--unknown-template` (`allow`, `deny`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    strum::EnumString,
    strum::Display,
    strum::VariantNames,
    strum::IntoStaticStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Policy {
    /// Admit the pod without the sidecar, with a warning saying why.
    #[default]
    Allow,
    /// Refuse the pod, with a message saying why.
    Deny,
}

/// What `/validate` answers for a pod that lacks part of what its template injects. Also the value of
/// `--validation` (`deny`, `warn`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    strum::EnumString,
    strum::Display,
    strum::VariantNames,
    strum::IntoStaticStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Validation {
    /// Refuse the pod, naming what is missing.
    #[default]
    Deny,
    /// Admit the pod with a warning naming what is missing.
    Warn,
}

/// The annotation keys the engine reads and writes, built once from the prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The prefix every key below starts with, the template overrides' too (`sidecar-injector.io/`).
    pub prefix: String,
    /// `<prefix>inject`: `"false"` opts a pod out (annotation or label).
    pub inject: String,
    /// `<prefix>status`: written on injected pods.
    pub status: String,
    /// `<prefix>template`: the template(s) a pod asks for, comma-separated.
    pub template: String,
    /// `<prefix>containers`: the pod's containers a template's `containerDefaults` reaches, comma-separated.
    pub containers: String,
    /// `<prefix>rev`: the namespace label that opts a namespace in to a named revision
    /// (`serve --template-dir REVISION=DIR`); not a pod annotation, so not one of [`Keys::own`].
    pub rev: String,
}

impl Keys {
    /// Keys under `prefix` (e.g. `sidecar-injector.io/`).
    pub fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_owned(),
            inject: format!("{prefix}inject"),
            status: format!("{prefix}status"),
            template: format!("{prefix}template"),
            containers: format!("{prefix}containers"),
            rev: format!("{prefix}rev"),
        }
    }
    /// The pod annotations the injector itself reads or writes.
    pub fn own(&self) -> impl Iterator<Item = &str> {
        [self.inject.as_str(), self.status.as_str(), self.template.as_str(), self.containers.as_str()].into_iter()
    }

    /// Is `key` one of them?
    pub fn is_own(&self, key: &str) -> bool {
        self.own().any(|k| k == key)
    }
}
