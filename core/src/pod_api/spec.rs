//! The names the Pod API gives to members of a pod spec that several rooms read as a set: the container lists, a
//! container's probes and lifecycle hooks, and the members of the API's unions (a handler, an env var's source, a
//! volume's source).

/// A pod's app containers.
pub(crate) const CONTAINERS: &str = "containers";
/// A pod's init containers (native sidecars among them).
pub(crate) const INIT_CONTAINERS: &str = "initContainers";
/// A pod's ephemeral (debug) containers.
pub(crate) const EPHEMERAL_CONTAINERS: &str = "ephemeralContainers";
/// The container lists of a pod spec. A container's name is unique across all three. Readers keep the lists in
/// this order, by index (`[0]` is `containers`).
pub(crate) const CONTAINER_LISTS: [&str; 3] = [CONTAINERS, INIT_CONTAINERS, EPHEMERAL_CONTAINERS];

/// A container's probes.
pub(crate) const PROBES: [&str; 3] = ["livenessProbe", "readinessProbe", "startupProbe"];
/// A container's lifecycle hooks (under `lifecycle`).
pub(crate) const LIFECYCLE_HOOKS: [&str; 2] = ["postStart", "preStop"];

/// A probe's handlers (`Probe`).
pub(crate) const PROBE_HANDLERS: &[&str] = &["exec", "httpGet", "tcpSocket", "grpc"];
/// A lifecycle hook's handlers (`LifecycleHandler`).
pub(crate) const LIFECYCLE_HANDLERS: &[&str] = &["exec", "httpGet", "tcpSocket", "sleep"];
/// The sources of an env var's `valueFrom` (`EnvVarSource`).
pub(crate) const ENV_VAR_SOURCES: &[&str] =
    &["fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef", "fileKeyRef"];
/// A volume's sources (`VolumeSource`), in the order of its fields, which is the order Pod Security's
/// `restrictedVolumes` names the first refused source in.
pub(crate) const VOLUME_SOURCES: &[&str] = &[
    "hostPath",
    "emptyDir",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "persistentVolumeClaim",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "downwardAPI",
    "fc",
    "azureFile",
    "configMap",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "projected",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "csi",
    "ephemeral",
    "image",
];

/// The legacy annotation that sets the pod's seccomp profile (still validated, and held to agree with the field).
pub(crate) const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
/// The legacy annotations that set a container's seccomp profile: this prefix and the container's name.
pub(crate) const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";
/// The legacy annotations that set a container's AppArmor profile: this prefix and the container's name.
pub(crate) const APPARMOR_CONTAINER_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The kind of a legacy security annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SecurityAnnotation {
    Seccomp,
    AppArmor,
}

/// Is `key` one of the legacy seccomp or AppArmor annotations, which the API server holds to the fields they
/// stand for (and copies into them in some releases)? Which one.
pub(crate) fn legacy_security_annotation(key: &str) -> Option<SecurityAnnotation> {
    if key == SECCOMP_POD_ANNOTATION || key.starts_with(SECCOMP_CONTAINER_ANNOTATION_PREFIX) {
        Some(SecurityAnnotation::Seccomp)
    } else if key.starts_with(APPARMOR_CONTAINER_ANNOTATION_PREFIX) {
        Some(SecurityAnnotation::AppArmor)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::pod_api::decode::decode;
    use k8s_openapi::api::core::v1::Volume;

    /// Every volume source is a field of k8s-openapi's `Volume`: a misspelt one would be dropped as unknown.
    #[test]
    fn every_volume_source_is_a_field_of_the_api_type() {
        for source in VOLUME_SOURCES {
            let volume = serde_json::json!({"name": "v", *source: {}});
            // A source that requires fields `{}` lacks fails to decode: the type knows it too.
            if let Ok(typed) = decode::<Volume>(&volume) {
                let back = serde_json::to_value(typed).expect("k8s-openapi types always serialise");
                assert!(back.get(source).is_some(), "{source} is not a field of Volume");
            }
        }
    }
}
