//! Fields of a pod that the API server keeps only from some release on: before it, behind a feature gate that is
//! off by default, it drops them without a word (`dropDisabledPodFields`, pkg/api/pod/util.go), so a template that
//! sets one would inject nothing there, and `/validate` would then find every pod lacking it. Read from the
//! release's `pkg/features/kube_features.go` (the gate's default by version) and `pkg/api/pod/util.go` (what each
//! gate drops). k8s-openapi's types, which templates are decoded as, know every field of the newest release; this
//! table says which of them the cluster's release keeps. A field newer than a release's types is dropped by its
//! decoder the same way, so "kept from" is the first release whose types have it and whose gate is on by default.
//! Each entry was read from that release's own source (x.y.0 of 1.20 to 1.36, and 1.37.2).

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

/// `spec.securityContext.appArmorProfile` and a container's: from 1.30 the API server also holds the legacy
/// AppArmor annotations to them.
pub(crate) const APPARMOR_FIELDS: GatedField = pod("spec.securityContext.appArmorProfile", "AppArmorFields", Some(30));
/// `windowsOptions.hostProcess` (rejected by 1.22, kept from 1.23), whose pod-wide rules the validator applies
/// from then.
pub(crate) const HOST_PROCESS: GatedField =
    pod("spec.securityContext.windowsOptions.hostProcess", "WindowsHostProcessContainers", Some(23));
/// `spec.hostUsers` (UserNamespacesStatelessPodsSupport from 1.25, UserNamespacesSupport from 1.28).
pub(crate) const HOST_USERS: GatedField = pod("spec.hostUsers", "UserNamespacesSupport", Some(33));
/// A container's `resizePolicy` (in-place resize), which the validator judges from the release that keeps it.
pub(crate) const RESIZE_POLICY: GatedField = container("resizePolicy", "InPlacePodVerticalScaling", Some(33));
/// A topology spread constraint's `minDomains`.
pub(crate) const SPREAD_MIN_DOMAINS: GatedField =
    pod("spec.topologySpreadConstraints[].minDomains", "MinDomainsInPodTopologySpread", Some(27));
/// A topology spread constraint's `matchLabelKeys`.
pub(crate) const SPREAD_MATCH_LABEL_KEYS: GatedField =
    pod("spec.topologySpreadConstraints[].matchLabelKeys", "MatchLabelKeysInPodTopologySpread", Some(27));

/// Every gated field a template can set (the pod's spec and its containers). Read from `dropDisabledPodFields` and
/// the gates' defaults of each release; `*` stands for any key (every probe, every volume source, pod affinity and
/// anti-affinity).
pub(crate) const GATED_FIELDS: &[GatedField] = &[
    pod("spec.volumes[].ephemeral", "GenericEphemeralVolume", Some(21)),
    pod(
        "spec.affinity.*.requiredDuringSchedulingIgnoredDuringExecution[].namespaceSelector",
        "PodAffinityNamespaceSelector",
        Some(22),
    ),
    pod(
        "spec.affinity.*.preferredDuringSchedulingIgnoredDuringExecution[].podAffinityTerm.namespaceSelector",
        "PodAffinityNamespaceSelector",
        Some(22),
    ),
    HOST_PROCESS,
    pod("spec.os", "IdentifyPodOS", Some(24)),
    pod("spec.topologySpreadConstraints[].nodeAffinityPolicy", "NodeInclusionPolicyInPodTopologySpread", Some(26)),
    pod("spec.topologySpreadConstraints[].nodeTaintsPolicy", "NodeInclusionPolicyInPodTopologySpread", Some(26)),
    SPREAD_MIN_DOMAINS,
    SPREAD_MATCH_LABEL_KEYS,
    pod("spec.schedulingGates", "PodSchedulingReadiness", Some(27)),
    APPARMOR_FIELDS,
    pod(
        "spec.affinity.*.requiredDuringSchedulingIgnoredDuringExecution[].matchLabelKeys",
        "MatchLabelKeysInPodAffinity",
        Some(31),
    ),
    pod(
        "spec.affinity.*.requiredDuringSchedulingIgnoredDuringExecution[].mismatchLabelKeys",
        "MatchLabelKeysInPodAffinity",
        Some(31),
    ),
    pod(
        "spec.affinity.*.preferredDuringSchedulingIgnoredDuringExecution[].podAffinityTerm.matchLabelKeys",
        "MatchLabelKeysInPodAffinity",
        Some(31),
    ),
    pod(
        "spec.affinity.*.preferredDuringSchedulingIgnoredDuringExecution[].podAffinityTerm.mismatchLabelKeys",
        "MatchLabelKeysInPodAffinity",
        Some(31),
    ),
    HOST_USERS,
    pod("spec.securityContext.supplementalGroupsPolicy", "SupplementalGroupsPolicy", Some(33)),
    pod("spec.securityContext.seLinuxChangePolicy", "SELinuxChangePolicy", Some(33)),
    pod("spec.resourceClaims", "DynamicResourceAllocation", Some(34)),
    pod("spec.resources", "PodLevelResources", Some(34)),
    // Before 1.35 the API server drops the whole volume, and every mount of it.
    pod("spec.volumes[].image", "ImageVolume", Some(35)),
    pod("spec.volumes[].projected.sources[].clusterTrustBundle", "ClusterTrustBundleProjection", Some(37)),
    pod("spec.volumes[].projected.sources[].podCertificate", "PodCertificateRequest", Some(37)),
    HOSTNAME_OVERRIDE,
    pod("spec.schedulingGroup", "GenericWorkload", None),
    pod("spec.evictionResponders", "EvictionRequestAPI", None),
    pod("spec.volumes[].emptyDir.mode", "EmptyDirVolumeMode", None),
    pod("spec.volumes[].*.defaultUser", "AtomicWriteVolumeUserFields", None),
    pod("spec.volumes[].*.items[].user", "AtomicWriteVolumeUserFields", None),
    pod("spec.volumes[].projected.sources[].*.user", "AtomicWriteVolumeUserFields", None),
    pod("spec.volumes[].projected.sources[].*.items[].user", "AtomicWriteVolumeUserFields", None),
    container("securityContext.windowsOptions.hostProcess", "WindowsHostProcessContainers", Some(23)),
    // Only these two probes' are dropped; a readiness probe's is refused by every release.
    container("livenessProbe.terminationGracePeriodSeconds", "ProbeTerminationGracePeriod", Some(25)),
    container("startupProbe.terminationGracePeriodSeconds", "ProbeTerminationGracePeriod", Some(25)),
    container("securityContext.appArmorProfile", "AppArmorFields", Some(30)),
    container("volumeMounts[].recursiveReadOnly", "RecursiveReadOnlyMounts", Some(31)),
    RESIZE_POLICY,
    container("resources.claims", "DynamicResourceAllocation", Some(34)),
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
