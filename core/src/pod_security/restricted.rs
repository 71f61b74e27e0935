//! The restricted checks: current pod hardening practice, on top of baseline. Each follows the upstream check it
//! names, at its latest version in Kubernetes 1.34.

use std::collections::BTreeSet;

use serde_json::Value as J;

use super::baseline::SECCOMP_TYPES;
use super::{Finding, Pod, finding, forbidden_profile_type, listed};
use crate::pod_api::read::{object, strings};
use crate::pod_api::spec::VOLUME_SOURCES;

/// The volume sources a restricted pod may use: data the API server or a CSI driver provides, not the node's.
/// Every other source of the API's ([`VOLUME_SOURCES`]) is refused.
const ALLOWED_VOLUME_SOURCES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The one capability a restricted container may add back.
const NET_BIND_SERVICE: &str = "NET_BIND_SERVICE";

/// Upstream `allowPrivilegeEscalation` (check_allowPrivilegeEscalation.go, policy 1.25): every container sets
/// `allowPrivilegeEscalation: false`; Windows pods are exempt.
pub(super) fn allow_privilege_escalation(pod: &Pod<'_>) -> Option<Finding> {
    if pod.is_windows() {
        return None;
    }
    let mut values = BTreeSet::new();
    let mut fields = Vec::new();
    for container in &pod.containers {
        match container.security(&["allowPrivilegeEscalation"]).and_then(J::as_bool) {
            Some(false) => {}
            Some(true) => {
                fields.push(container.field("securityContext.allowPrivilegeEscalation"));
                values.insert("true");
            }
            None => {
                fields.push(container.field("securityContext.allowPrivilegeEscalation"));
                values.insert("unset");
            }
        }
    }
    finding(fields, || format!("allowPrivilegeEscalation {} (restricted requires false)", listed(values)))
}

/// Upstream `capabilities_restricted` (check_capabilities_restricted.go, policy 1.25): every container drops `ALL`
/// (exactly so: `all` does not count) and adds back at most `NET_BIND_SERVICE`; Windows pods are exempt. Replaces
/// `capabilities_baseline` at restricted.
pub(super) fn capabilities(pod: &Pod<'_>) -> Option<Finding> {
    if pod.is_windows() {
        return None;
    }
    let mut fields = Vec::new();
    let mut missing_drop = false;
    let mut added = BTreeSet::new();
    for container in &pod.containers {
        if !strings(container.security(&["capabilities", "drop"])).any(|capability| capability == "ALL") {
            fields.push(container.field("securityContext.capabilities.drop"));
            missing_drop = true;
        }
        let forbidden: Vec<&str> = strings(container.security(&["capabilities", "add"]))
            .filter(|capability| *capability != NET_BIND_SERVICE)
            .collect();
        if !forbidden.is_empty() {
            fields.push(container.field("securityContext.capabilities.add"));
            added.extend(forbidden);
        }
    }
    finding(fields, || {
        let mut set = Vec::new();
        if missing_drop {
            set.push("does not drop ALL".to_owned());
        }
        if !added.is_empty() {
            set.push(format!("adds {}", listed(added)));
        }
        format!("{} (restricted requires drop [ALL] and allows adding only {NET_BIND_SERVICE})", set.join("; "))
    })
}

/// Upstream `restrictedVolumes` (check_restrictedVolumes.go): only the volume sources of
/// [`ALLOWED_VOLUME_SOURCES`]; of the others, the first in the API's order is named, as upstream does. A volume
/// without a known source is an `emptyDir` once the API server has defaulted it. Replaces `hostPathVolumes` at
/// restricted.
pub(super) fn volumes(pod: &Pod<'_>) -> Option<Finding> {
    let mut fields = Vec::new();
    let mut sources = BTreeSet::new();
    for (path, volume) in pod.volumes() {
        let is_set = |source: &str| object(volume.get(source)).is_some();
        if ALLOWED_VOLUME_SOURCES.iter().any(|source| is_set(source)) {
            continue;
        }
        // No allowed source is set, so the first source set is a refused one.
        if let Some(source) = VOLUME_SOURCES.iter().find(|source| is_set(source)) {
            fields.push(format!("{path}.{source}"));
            sources.insert(*source);
        }
    }
    finding(fields, || {
        format!("uses volume type {} (restricted allows only {})", listed(sources), ALLOWED_VOLUME_SOURCES.join(", "))
    })
}

/// Upstream `runAsNonRoot` (check_runAsNonRoot.go): `runAsNonRoot: true` on the pod or on every container, and
/// `false` nowhere (a container's `false` overrides the pod's `true`). The 1.34 relaxation for pods with
/// `hostUsers: false` sits behind an alpha feature gate, off by default, and is not applied.
pub(super) fn run_as_non_root(pod: &Pod<'_>) -> Option<Finding> {
    const FIELD: &str = "securityContext.runAsNonRoot";
    let pod_level = pod.security(&["runAsNonRoot"]).and_then(J::as_bool);
    let mut fields = Vec::new();
    let (mut explicit, mut implicit) = (false, false);
    if pod_level == Some(false) {
        fields.push(format!("spec.{FIELD}"));
        explicit = true;
    }
    for container in &pod.containers {
        match container.security(&["runAsNonRoot"]).and_then(J::as_bool) {
            Some(true) => {}
            Some(false) => {
                fields.push(container.field(FIELD));
                explicit = true;
            }
            None if pod_level == Some(true) => {}
            None => {
                fields.push(container.field(FIELD));
                implicit = true;
            }
        }
    }
    finding(fields, || {
        let mut set = Vec::new();
        if explicit {
            set.push("runAsNonRoot=false");
        }
        if implicit {
            set.push("runAsNonRoot unset on a container of a pod without runAsNonRoot=true");
        }
        format!("{} (restricted requires true on the pod or on every container, and false nowhere)", set.join("; "))
    })
}

/// Upstream `runAsUser` (check_runAsUser.go, policy 1.23): neither the pod nor a container sets `runAsUser: 0`
/// (a container's non-zero user does not excuse the pod's 0). Unset is allowed. The `hostUsers: false` relaxation
/// is not applied, as for `runAsNonRoot`.
pub(super) fn run_as_user(pod: &Pod<'_>) -> Option<Finding> {
    let is_root = |user: Option<&J>| user.and_then(J::as_i64) == Some(0);
    let pod_level = is_root(pod.security(&["runAsUser"])).then(|| "spec.securityContext.runAsUser".to_owned());
    let containers = pod
        .containers
        .iter()
        .filter(|container| is_root(container.security(&["runAsUser"])))
        .map(|container| container.field("securityContext.runAsUser"));
    let fields = pod_level.into_iter().chain(containers).collect();
    finding(fields, || "runAsUser=0 (restricted allows any other user, or unset)".to_owned())
}

/// Upstream `seccompProfile_restricted` (check_seccompProfile_restricted.go, policy 1.25): a seccomp profile of
/// type `RuntimeDefault` or `Localhost` on the pod or on every container, and no other type anywhere; Windows
/// pods are exempt. Replaces `seccompProfile_baseline` at restricted.
pub(super) fn seccomp_profile(pod: &Pod<'_>) -> Option<Finding> {
    if pod.is_windows() {
        return None;
    }
    const FIELD: &str = "securityContext.seccompProfile.type";
    let mut fields = Vec::new();
    let mut types = BTreeSet::new();
    let pod_profile = pod.security(&["seccompProfile"]);
    let pod_forbidden = forbidden_profile_type(pod_profile, SECCOMP_TYPES);
    if let Some(kind) = pod_forbidden {
        fields.push(format!("spec.{FIELD}"));
        types.insert(kind);
    }
    // Only an allowed pod-level profile stands in for the containers' own.
    let pod_covers = object(pod_profile).is_some() && pod_forbidden.is_none();
    let mut unset = false;
    for container in &pod.containers {
        let profile = container.security(&["seccompProfile"]);
        if let Some(kind) = forbidden_profile_type(profile, SECCOMP_TYPES) {
            fields.push(container.field(FIELD));
            types.insert(kind);
        } else if object(profile).is_none() && !pod_covers {
            fields.push(container.field(FIELD));
            unset = true;
        }
    }
    finding(fields, || {
        let mut set = Vec::new();
        if !types.is_empty() {
            set.push(format!("seccomp profile {}", listed(types)));
        }
        if unset {
            set.push("no seccomp profile on a container of a pod without one".to_owned());
        }
        format!("{} (restricted requires RuntimeDefault or Localhost on the pod or on every container)", set.join("; "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One list of the API's volume sources ties restricted's allowed ones to what the merge and validation know:
    /// a source allowed here that the API does not have (misspelt, or removed) would never be found set.
    #[test]
    fn the_allowed_volume_sources_are_sources_of_the_api() {
        for source in ALLOWED_VOLUME_SOURCES {
            assert!(VOLUME_SOURCES.contains(source), "{source} is not in pod_api::spec::VOLUME_SOURCES");
        }
        let refused = VOLUME_SOURCES.iter().filter(|source| !ALLOWED_VOLUME_SOURCES.contains(source));
        assert_eq!(refused.clone().next(), Some(&"hostPath"), "upstream names hostPath first");
        assert_eq!(refused.count(), 21, "the 1.34 API's node and in-tree driver sources");
    }
}
