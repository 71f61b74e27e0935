//! Fields of a pod that the API server keeps only from some release on: before it, behind a feature gate that is
//! off by default, it drops them without a word (`dropDisabledPodFields`, pkg/api/pod/util.go), so a template that
//! sets one would inject nothing there, and `/validate` would then find every pod lacking it. Read from the
//! release's `pkg/features/kube_features.go` (the gate's default by version) and `pkg/api/pod/util.go` (what each
//! gate drops). k8s-openapi's types, which templates are decoded as, know every field of the newest release; this
//! table says which of them the cluster's release keeps.

/// Where a field lives: under the pod, or under each container (a template's containers and its
/// `containerDefaults`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Pod,
    Container,
}

/// A field kept from a release on. `path` is a dotted path under its [`Place`], `[]` standing for every item of a
/// list (`volumeMounts[].bindMountOptions`) and `*` for every key of an object.
#[derive(Debug)]
pub(crate) struct GatedField {
    pub place: Place,
    pub path: &'static str,
    /// The feature gate that keeps it.
    pub feature: &'static str,
    /// The first release that keeps it by default; `None`: off by default in every release up to the newest the
    /// suite tests (1.37).
    pub kept_from: Option<u32>,
}

impl GatedField {
    /// Does the API server of 1.`minor` keep it (by default)?
    pub(crate) fn kept_at(&self, minor: u32) -> bool {
        self.kept_from.is_some_and(|from| minor >= from)
    }
}

/// `spec.hostnameOverride`, which the validator also judges from the release that keeps it.
pub(crate) const HOSTNAME_OVERRIDE: GatedField = pod("spec.hostnameOverride", "HostnameOverride", Some(35));

/// Every gated field a template can set (the pod's spec and its containers). Read from `dropDisabledPodFields` and
/// the gates' defaults of 1.37; `*` stands for any key (every probe, every volume source).
pub(crate) const GATED_FIELDS: &[GatedField] = &[
    pod("spec.volumes[].projected.sources[].podCertificate", "PodCertificateRequest", Some(37)),
    HOSTNAME_OVERRIDE,
    pod("spec.schedulingGroup", "GenericWorkload", None),
    pod("spec.evictionResponders", "EvictionRequestAPI", None),
    pod("spec.volumes[].emptyDir.mode", "EmptyDirVolumeMode", None),
    pod("spec.volumes[].*.defaultUser", "AtomicWriteVolumeUserFields", None),
    pod("spec.volumes[].*.items[].user", "AtomicWriteVolumeUserFields", None),
    pod("spec.volumes[].projected.sources[].*.user", "AtomicWriteVolumeUserFields", None),
    pod("spec.volumes[].projected.sources[].*.items[].user", "AtomicWriteVolumeUserFields", None),
    container("restartPolicyRules", "ContainerRestartRules", Some(35)),
    container("env[].valueFrom.fileKeyRef", "EnvFiles", Some(35)),
    container("lifecycle.stopSignal", "ContainerStopSignals", None),
    container("volumeMounts[].bindMountOptions", "VolumeBindMountOptions", None),
    container("*.httpGet.protocol", "H2CContainerProbe", None),
    container("lifecycle.*.httpGet.protocol", "H2CContainerProbe", None),
    container("*.grpc.mode", "GRPCContainerProbeTLS", None),
];

const fn pod(path: &'static str, feature: &'static str, kept_from: Option<u32>) -> GatedField {
    GatedField { place: Place::Pod, path, feature, kept_from }
}

const fn container(path: &'static str, feature: &'static str, kept_from: Option<u32>) -> GatedField {
    GatedField { place: Place::Container, path, feature, kept_from }
}
