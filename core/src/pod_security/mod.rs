//! The Kubernetes Pod Security Standards over a Pod's JSON: which level (`privileged`, `baseline`, `restricted`) a
//! pod meets, and which fields keep it from the next one. `check --pod-security` runs it on the pods a template
//! injects.
//!
//! The checks follow the Pod Security admission plugin's, `k8s.io/pod-security-admission/policy` (the `check_*.go`
//! files) at Kubernetes 1.34 (v0.34.9, commit d830801b), policy version `latest`: one function per upstream check, each citing the
//! check it follows. They walk `initContainers`, `containers` and `ephemeralContainers`, as upstream's
//! `visitContainers` does. At `restricted`, three restricted checks replace the baseline check they strengthen
//! (upstream's `OverrideCheckIDs`): `capabilities_restricted` replaces `capabilities_baseline`,
//! `restrictedVolumes` replaces `hostPathVolumes`, `seccompProfile_restricted` replaces `seccompProfile_baseline`.
//!
//! The pod is judged as the API server hands it to admission, after its defaults: a volume without a source is an
//! `emptyDir`. A missing, `null` or ill-typed field counts as absent, as it would be once decoded. Not mirrored:
//! the relaxation for pods in a user namespace (`hostUsers: false`), which 1.34 applies only behind the alpha
//! feature gate `UserNamespacesPodSecurityStandards`; a `hostNetwork` pod's `hostPort` defaulting, which only adds
//! fields to a pod that already breaks `baseline`; older policy versions; cluster exemptions.

mod baseline;
mod restricted;
#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value as J};

use crate::pod_api::read::{items, object, text};
use crate::pod_api::spec::{CONTAINERS, EPHEMERAL_CONTAINERS, INIT_CONTAINERS};

/// A Pod Security Standards level, from the least to the most restrictive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Unrestricted: any pod meets it.
    Privileged,
    /// Prevents known privilege escalations; a pod with no security settings meets it.
    Baseline,
    /// Current pod hardening practice: non-root, no privilege escalation, capabilities dropped, seccomp set.
    Restricted,
}

impl Level {
    /// The level's name as a namespace label writes it: `privileged`, `baseline`, `restricted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A level name other than `privileged`, `baseline` or `restricted`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a Pod Security level: write privileged, baseline or restricted")]
pub struct UnknownLevel(String);

impl FromStr for Level {
    type Err = UnknownLevel;

    /// Parses a level as the `pod-security.kubernetes.io/enforce` label does: lowercase, exactly.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "privileged" => Ok(Level::Privileged),
            "baseline" => Ok(Level::Baseline),
            "restricted" => Ok(Level::Restricted),
            _ => Err(UnknownLevel(text.to_owned())),
        }
    }
}

/// One check the pod fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The lowest level this violation breaks: `Baseline` (and so `Restricted` too) or `Restricted`.
    pub level: Level,
    /// The upstream check's ID: `capabilities_baseline`, `runAsNonRoot`...
    pub check: &'static str,
    /// The offending fields, containers and volumes named by name:
    /// `spec.initContainers[proxy-init].securityContext.capabilities.add`.
    pub fields: Vec<String>,
    /// One line: what is set, and what the level allows.
    pub detail: String,
}

impl Violation {
    /// Does this violation keep the pod from meeting `level`? A baseline violation does not count at `restricted`
    /// when a restricted check replaces its check there (the restricted check then reports it).
    fn breaks(&self, level: Level) -> bool {
        match level {
            Level::Privileged => false,
            Level::Baseline => self.level == Level::Baseline,
            Level::Restricted => self.level == Level::Restricted || !replaced_at_restricted(self.check),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.check, self.fields.join(", "), self.detail)
    }
}

/// Every check a pod fails, baseline checks first, each level's checks in the order of their IDs (as upstream
/// reports them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The failed checks.
    pub violations: Vec<Violation>,
}

impl Report {
    /// The highest level the pod meets. Levels are cumulative: a pod that breaks `baseline` is `privileged`, even
    /// in the one case upstream's `restricted` would admit it (a Windows pod setting a Linux-only field, such as an
    /// `Unconfined` seccomp profile, which the API server refuses anyway).
    pub fn level(&self) -> Level {
        if self.breaking(Level::Baseline).next().is_some() {
            Level::Privileged
        } else if self.breaking(Level::Restricted).next().is_some() {
            Level::Baseline
        } else {
            Level::Restricted
        }
    }

    /// The violations that keep the pod from meeting `level` (none for `Privileged`).
    pub fn breaking(&self, level: Level) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |violation| violation.breaks(level))
    }
}

/// Evaluates `pod` (a Pod's JSON: `metadata` and `spec`) against every check of the latest policy.
///
/// ```
/// use sidecar_injector_core::pod_security::{Level, evaluate};
///
/// let pod = serde_json::json!({"spec": {"containers": [{"name": "app", "image": "nginx"}]}});
/// let report = evaluate(&pod);
/// assert_eq!(report.level(), Level::Baseline);
/// let first = report.breaking(Level::Restricted).next().unwrap();
/// assert_eq!(first.check, "allowPrivilegeEscalation");
/// assert_eq!(first.fields, ["spec.containers[app].securityContext.allowPrivilegeEscalation"]);
/// ```
pub fn evaluate(pod: &J) -> Report {
    let pod = Pod::new(pod);
    let violations = CHECKS
        .iter()
        .filter_map(|check| {
            (check.run)(&pod).map(|found| Violation {
                level: check.level,
                check: check.id,
                fields: found.fields,
                detail: found.detail,
            })
        })
        .collect();
    Report { violations }
}

/// One upstream check.
struct Check {
    id: &'static str,
    level: Level,
    /// The baseline check this one replaces at `restricted` (upstream's `OverrideCheckIDs`).
    replaces: Option<&'static str>,
    run: fn(&Pod<'_>) -> Option<Finding>,
}

/// Every check, in upstream's order: baseline, then restricted, each by ID.
const CHECKS: &[Check] = &[
    baseline_check("appArmorProfile", baseline::app_armor_profile),
    baseline_check("capabilities_baseline", baseline::capabilities),
    baseline_check("hostNamespaces", baseline::host_namespaces),
    baseline_check("hostPathVolumes", baseline::host_path_volumes),
    baseline_check("hostPorts", baseline::host_ports),
    baseline_check("hostProbesAndHostLifecycle", baseline::host_probes_and_lifecycle),
    baseline_check("privileged", baseline::privileged),
    baseline_check("procMount", baseline::proc_mount),
    baseline_check("seLinuxOptions", baseline::se_linux_options),
    baseline_check("seccompProfile_baseline", baseline::seccomp_profile),
    baseline_check("sysctls", baseline::sysctls),
    baseline_check("windowsHostProcess", baseline::windows_host_process),
    restricted_check("allowPrivilegeEscalation", None, restricted::allow_privilege_escalation),
    restricted_check("capabilities_restricted", Some("capabilities_baseline"), restricted::capabilities),
    restricted_check("restrictedVolumes", Some("hostPathVolumes"), restricted::volumes),
    restricted_check("runAsNonRoot", None, restricted::run_as_non_root),
    restricted_check("runAsUser", None, restricted::run_as_user),
    restricted_check("seccompProfile_restricted", Some("seccompProfile_baseline"), restricted::seccomp_profile),
];

const fn baseline_check(id: &'static str, run: fn(&Pod<'_>) -> Option<Finding>) -> Check {
    Check { id, level: Level::Baseline, replaces: None, run }
}

const fn restricted_check(
    id: &'static str,
    replaces: Option<&'static str>,
    run: fn(&Pod<'_>) -> Option<Finding>,
) -> Check {
    Check { id, level: Level::Restricted, replaces, run }
}

fn replaced_at_restricted(check: &str) -> bool {
    CHECKS.iter().any(|c| c.replaces == Some(check))
}

/// What a failed check found: the fields and a one-line detail.
struct Finding {
    fields: Vec<String>,
    detail: String,
}

/// A finding, if any field was found.
fn finding(fields: Vec<String>, detail: impl FnOnce() -> String) -> Option<Finding> {
    (!fields.is_empty()).then(|| Finding { fields, detail: detail() })
}

/// The container lists, in the order upstream's `visitContainers` walks them, which is the order a violation
/// lists its fields in: init containers first, unlike [`CONTAINER_LISTS`](crate::pod_api::spec::CONTAINER_LISTS), whose order the merge's readers index.
const VISIT_ORDER: [&str; 3] = [INIT_CONTAINERS, CONTAINERS, EPHEMERAL_CONTAINERS];

/// The parts of a pod the checks read, located once. A view of its own over `serde_json` rather than the request
/// path's `PodView`: that one reads a review's simd-json tape, while Pod Security judges a `serde_json` pod (the
/// pod a template's dry run injects, for `check --pod-security`), and walks every container with its path.
struct Pod<'a> {
    annotations: Option<&'a Map<String, J>>,
    spec: Option<&'a Map<String, J>>,
    /// `spec.securityContext`.
    security_context: Option<&'a Map<String, J>>,
    /// Every container of every list, in upstream's order.
    containers: Vec<Container<'a>>,
}

impl<'a> Pod<'a> {
    fn new(pod: &'a J) -> Self {
        let root = pod.as_object();
        let spec = object(at(root, &["spec"]));
        let containers = VISIT_ORDER
            .iter()
            .flat_map(|list| {
                let entries = items(at(spec, &[list]));
                entries.iter().enumerate().filter_map(move |(index, entry)| Container::new(list, index, entry))
            })
            .collect();
        Pod {
            annotations: object(at(root, &["metadata", "annotations"])),
            spec,
            security_context: object(at(spec, &["securityContext"])),
            containers,
        }
    }

    /// A field under `spec`.
    fn spec(&self, path: &[&str]) -> Option<&'a J> {
        at(self.spec, path)
    }

    /// A field under `spec.securityContext`.
    fn security(&self, path: &[&str]) -> Option<&'a J> {
        at(self.security_context, path)
    }

    /// `spec.volumes`, each with its path, named by its name (or by its index if it has none):
    /// `spec.volumes[logs]`.
    fn volumes(&self) -> impl Iterator<Item = (String, &'a Map<String, J>)> {
        items(self.spec(&["volumes"])).iter().enumerate().filter_map(|(index, volume)| {
            let volume = volume.as_object()?;
            Some((named("spec.volumes", text(volume.get("name")), index), volume))
        })
    }

    /// Is this a Windows pod (`spec.os.name: windows`)? The restricted checks of Linux-only fields exempt those,
    /// since the API server refuses a Windows pod that sets them.
    fn is_windows(&self) -> bool {
        text(self.spec(&["os", "name"])) == "windows"
    }
}

/// One container of any list.
struct Container<'a> {
    /// Where it sits, named by its name (or by its index if it has none): `spec.initContainers[proxy-init]`.
    path: String,
    json: &'a Map<String, J>,
    security_context: Option<&'a Map<String, J>>,
}

impl<'a> Container<'a> {
    fn new(list: &str, index: usize, entry: &'a J) -> Option<Self> {
        let json = entry.as_object()?;
        let path = named(&format!("spec.{list}"), text(json.get("name")), index);
        Some(Container { path, json, security_context: object(json.get("securityContext")) })
    }

    /// A field of the container.
    fn get(&self, path: &[&str]) -> Option<&'a J> {
        at(Some(self.json), path)
    }

    /// A field under the container's `securityContext`.
    fn security(&self, path: &[&str]) -> Option<&'a J> {
        at(self.security_context, path)
    }

    /// The path of a field of this container: `field("securityContext.privileged")`.
    fn field(&self, rest: &str) -> String {
        format!("{}.{rest}", self.path)
    }
}

/// The path of a list item, named by its name, or by its index if it has none: `spec.volumes[logs]`.
fn named(list: &str, name: &str, index: usize) -> String {
    if name.is_empty() { format!("{list}[{index}]") } else { format!("{list}[{name}]") }
}

/// The type of a profile (seccomp, AppArmor) that is set but not one of `allowed`; an object without a type has
/// the empty one, which no level allows.
fn forbidden_profile_type<'a>(profile: Option<&'a J>, allowed: &[&str]) -> Option<&'a str> {
    let kind = text(object(profile)?.get("type"));
    (!allowed.contains(&kind)).then_some(kind)
}

/// The value at `path` under `object`, through nested objects; `None` when a step is missing, `null` or not an
/// object, as a decoded pod would have it.
fn at<'a>(object: Option<&'a Map<String, J>>, path: &[&str]) -> Option<&'a J> {
    let (last, parents) = path.split_last()?;
    let mut current = object?;
    for key in parents {
        current = current.get(*key)?.as_object()?;
    }
    current.get(*last).filter(|value| !value.is_null())
}

/// Values for a detail, comma-separated, an empty one shown as `""`.
fn listed<'s>(values: impl IntoIterator<Item = &'s str>) -> String {
    let shown: Vec<&str> = values.into_iter().map(|value| if value.is_empty() { "\"\"" } else { value }).collect();
    shown.join(", ")
}
