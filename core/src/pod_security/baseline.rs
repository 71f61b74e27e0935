//! The baseline checks: no known privilege escalation. Each follows the upstream check it names, at its latest
//! version in Kubernetes 1.34.

use std::collections::BTreeSet;

use serde_json::Value as J;

use super::{Finding, Pod, finding, forbidden_profile_type, listed};
use crate::pod_api::read::{is_true, items, object, strings, text};
use crate::pod_api::spec::{LIFECYCLE_HOOKS, PROBES};

/// The capabilities a container may add (the container runtimes' default set).
const CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The sysctls that are namespaced and isolated from other pods: policy 1.32's set, the latest in 1.34.
const SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// The SELinux types a pod may ask for (the empty type is the runtime's choice): policy 1.31's set.
const SELINUX_TYPES: &[&str] = &["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"];

const APP_ARMOR_TYPES: &[&str] = &["RuntimeDefault", "Localhost"];
const APP_ARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
pub(super) const SECCOMP_TYPES: &[&str] = &["RuntimeDefault", "Localhost"];

const HOST_NAMESPACES: &[&str] = &["hostNetwork", "hostPID", "hostIPC"];
/// The handlers that can reach another host; `tcpSocket` is deprecated in lifecycle hooks but still decoded.
const NETWORK_HANDLERS: &[&str] = &["httpGet", "tcpSocket"];

/// Upstream `appArmorProfile` (check_appArmorProfile.go): an AppArmor profile set on the pod or a container must
/// be `RuntimeDefault` or `Localhost`, and a `container.apparmor.security.beta.kubernetes.io/*` annotation
/// `runtime/default`, `localhost/*` or empty.
pub(super) fn app_armor_profile(pod: &Pod<'_>) -> Option<Finding> {
    let mut fields = Vec::new();
    let mut types = BTreeSet::new();
    if let Some(kind) = forbidden_profile_type(pod.security(&["appArmorProfile"]), APP_ARMOR_TYPES) {
        fields.push("spec.securityContext.appArmorProfile.type".to_owned());
        types.insert(kind);
    }
    for container in &pod.containers {
        if let Some(kind) = forbidden_profile_type(container.security(&["appArmorProfile"]), APP_ARMOR_TYPES) {
            fields.push(container.field("securityContext.appArmorProfile.type"));
            types.insert(kind);
        }
    }
    // Upstream checks every annotation with the prefix, whether or not it names a container of the pod.
    let mut annotations: Vec<(&str, &str)> = pod
        .annotations
        .into_iter()
        .flatten()
        .filter_map(|(key, value)| Some((key.as_str(), value.as_str()?)))
        .filter(|(key, value)| key.starts_with(APP_ARMOR_ANNOTATION_PREFIX) && !allowed_app_armor_annotation(value))
        .collect();
    annotations.sort_unstable();
    fields.extend(annotations.iter().map(|(key, _)| format!("metadata.annotations[{key}]")));
    finding(fields, || {
        let mut set = Vec::new();
        if !types.is_empty() {
            set.push(format!("profile type {}", listed(types)));
        }
        if !annotations.is_empty() {
            let shown: Vec<String> = annotations.iter().map(|(key, value)| format!("{key}={value:?}")).collect();
            set.push(format!("annotation {}", shown.join(", ")));
        }
        format!(
            "AppArmor {} (baseline allows type RuntimeDefault or Localhost, annotations runtime/default or \
             localhost/*, or unset)",
            set.join("; ")
        )
    })
}

fn allowed_app_armor_annotation(value: &str) -> bool {
    value.is_empty() || value == "runtime/default" || value.starts_with("localhost/")
}

/// Upstream `capabilities_baseline` (check_capabilities_baseline.go): a container may add only capabilities of the
/// default set, spelt exactly as listed (`CAP_CHOWN` and `chown` are not `CHOWN`).
pub(super) fn capabilities(pod: &Pod<'_>) -> Option<Finding> {
    let mut fields = Vec::new();
    let mut added = BTreeSet::new();
    for container in &pod.containers {
        let forbidden: Vec<&str> = strings(container.security(&["capabilities", "add"]))
            .filter(|capability| !CAPABILITIES.contains(capability))
            .collect();
        if !forbidden.is_empty() {
            fields.push(container.field("securityContext.capabilities.add"));
            added.extend(forbidden);
        }
    }
    finding(fields, || format!("adds {} (baseline allows only {})", listed(added), CAPABILITIES.join(", ")))
}

/// Upstream `hostNamespaces` (check_hostNamespaces.go): no `hostNetwork`, `hostPID` or `hostIPC`.
pub(super) fn host_namespaces(pod: &Pod<'_>) -> Option<Finding> {
    let shared: Vec<&str> = HOST_NAMESPACES.iter().copied().filter(|key| is_true(pod.spec(&[key]))).collect();
    let fields = shared.iter().map(|key| format!("spec.{key}")).collect();
    finding(fields, || {
        let set: Vec<String> = shared.iter().map(|key| format!("{key}=true")).collect();
        format!("shares the host's namespaces: {} (baseline allows false or unset)", set.join(", "))
    })
}

/// Upstream `hostPathVolumes` (check_hostPathVolumes.go): no `hostPath` volume.
pub(super) fn host_path_volumes(pod: &Pod<'_>) -> Option<Finding> {
    let fields: Vec<String> = pod
        .volumes()
        .filter(|(_, volume)| object(volume.get("hostPath")).is_some())
        .map(|(path, _)| format!("{path}.hostPath"))
        .collect();
    finding(fields, || "mounts a hostPath volume (baseline allows none)".to_owned())
}

/// Upstream `hostPorts` (check_hostPorts.go): no container port bound to a host port (0 means none).
pub(super) fn host_ports(pod: &Pod<'_>) -> Option<Finding> {
    let mut fields = Vec::new();
    let mut bound = BTreeSet::new();
    for container in &pod.containers {
        let ports = items(container.get(&["ports"]));
        for (index, port) in ports.iter().enumerate() {
            let host_port = port.get("hostPort").and_then(J::as_i64).unwrap_or(0);
            if host_port != 0 {
                fields.push(container.field(&format!("ports[{index}].hostPort")));
                bound.insert(host_port);
            }
        }
    }
    finding(fields, || {
        let ports: Vec<String> = bound.iter().map(i64::to_string).collect();
        format!("binds hostPort {} (baseline allows 0 or unset)", ports.join(", "))
    })
}

/// Upstream `hostProbesAndHostLifecycle` (check_hostProbesAndhostLifecycle.go, policy 1.34): a probe's or a
/// lifecycle hook's `httpGet` or `tcpSocket` must not name a `host`, which would let the kubelet reach any
/// address on the pod's behalf.
pub(super) fn host_probes_and_lifecycle(pod: &Pod<'_>) -> Option<Finding> {
    let mut fields = Vec::new();
    let mut hosts = BTreeSet::new();
    for container in &pod.containers {
        for handler in handler_paths() {
            for network in NETWORK_HANDLERS {
                let path = [&handler[..], &[network, "host"]].concat();
                let host = text(container.get(&path));
                if !host.is_empty() {
                    fields.push(container.field(&path.join(".")));
                    hosts.insert(host);
                }
            }
        }
    }
    finding(fields, || format!("probes or hooks host {} (baseline allows empty or unset)", listed(hosts)))
}

/// Where a container's probes and lifecycle hooks sit: `livenessProbe`, ..., `lifecycle.preStop`.
fn handler_paths() -> impl Iterator<Item = Vec<&'static str>> {
    let probes = PROBES.into_iter().map(|probe| vec![probe]);
    probes.chain(LIFECYCLE_HOOKS.into_iter().map(|hook| vec!["lifecycle", hook]))
}

/// Upstream `privileged` (check_privileged.go): no privileged container.
pub(super) fn privileged(pod: &Pod<'_>) -> Option<Finding> {
    let fields = pod
        .containers
        .iter()
        .filter(|container| is_true(container.security(&["privileged"])))
        .map(|container| container.field("securityContext.privileged"))
        .collect();
    finding(fields, || "privileged=true (baseline allows false or unset)".to_owned())
}

/// Upstream `procMount` (check_procMount.go): the default /proc masks. The 1.34 relaxation for pods with
/// `hostUsers: false` sits behind an alpha feature gate, off by default, and is not applied.
pub(super) fn proc_mount(pod: &Pod<'_>) -> Option<Finding> {
    let mut fields = Vec::new();
    let mut mounts = BTreeSet::new();
    for container in &pod.containers {
        if let Some(mount) = container.security(&["procMount"]).and_then(J::as_str)
            && mount != "Default"
        {
            fields.push(container.field("securityContext.procMount"));
            mounts.insert(mount);
        }
    }
    finding(fields, || format!("procMount {} (baseline allows Default or unset)", listed(mounts)))
}

/// Upstream `seLinuxOptions` (check_seLinuxOptions.go, policy 1.31): an SELinux type from the allowed set, and no
/// SELinux user or role.
pub(super) fn se_linux_options(pod: &Pod<'_>) -> Option<Finding> {
    let mut fields = Vec::new();
    let mut types = BTreeSet::new();
    let (mut user, mut role) = (false, false);
    let settings = std::iter::once(("spec.securityContext".to_owned(), pod.security(&["seLinuxOptions"])))
        .chain(pod.containers.iter().map(|c| (c.field("securityContext"), c.security(&["seLinuxOptions"]))));
    for (base, options) in settings {
        let Some(options) = object(options) else { continue };
        let kind = text(options.get("type"));
        if !SELINUX_TYPES.contains(&kind) {
            fields.push(format!("{base}.seLinuxOptions.type"));
            types.insert(kind);
        }
        if !text(options.get("user")).is_empty() {
            fields.push(format!("{base}.seLinuxOptions.user"));
            user = true;
        }
        if !text(options.get("role")).is_empty() {
            fields.push(format!("{base}.seLinuxOptions.role"));
            role = true;
        }
    }
    finding(fields, || {
        let mut set = Vec::new();
        if !types.is_empty() {
            set.push(format!("type {}", listed(types)));
        }
        if user {
            set.push("a user".to_owned());
        }
        if role {
            set.push("a role".to_owned());
        }
        let allowed = listed(SELINUX_TYPES.iter().copied().filter(|kind| !kind.is_empty()));
        format!("SELinux {} (baseline allows type {allowed} or empty, and no user or role)", set.join(", "))
    })
}

/// Upstream `seccompProfile_baseline` (check_seccompProfile_baseline.go, policy 1.19): a seccomp profile set on the
/// pod or a container must be `RuntimeDefault` or `Localhost` (so not `Unconfined`).
pub(super) fn seccomp_profile(pod: &Pod<'_>) -> Option<Finding> {
    let mut fields = Vec::new();
    let mut types = BTreeSet::new();
    if let Some(kind) = forbidden_profile_type(pod.security(&["seccompProfile"]), SECCOMP_TYPES) {
        fields.push("spec.securityContext.seccompProfile.type".to_owned());
        types.insert(kind);
    }
    for container in &pod.containers {
        if let Some(kind) = forbidden_profile_type(container.security(&["seccompProfile"]), SECCOMP_TYPES) {
            fields.push(container.field("securityContext.seccompProfile.type"));
            types.insert(kind);
        }
    }
    finding(fields, || {
        format!("seccomp profile {} (baseline allows RuntimeDefault, Localhost or unset)", listed(types))
    })
}

/// Upstream `sysctls` (check_sysctls.go, policy 1.32): only the safe, namespaced sysctls.
pub(super) fn sysctls(pod: &Pod<'_>) -> Option<Finding> {
    let forbidden: Vec<&str> = pod
        .security(&["sysctls"])
        .and_then(J::as_array)
        .into_iter()
        .flatten()
        .filter_map(J::as_object)
        .map(|sysctl| text(sysctl.get("name")))
        .filter(|name| !SYSCTLS.contains(name))
        .collect();
    let fields = forbidden.iter().map(|name| format!("spec.securityContext.sysctls[{name}]")).collect();
    finding(fields, || format!("sets sysctl {} (baseline allows only {})", listed(forbidden), SYSCTLS.join(", ")))
}

/// Upstream `windowsHostProcess` (check_windowsHostProcess.go): no Windows HostProcess pod or container.
pub(super) fn windows_host_process(pod: &Pod<'_>) -> Option<Finding> {
    const FIELD: [&str; 2] = ["windowsOptions", "hostProcess"];
    let pod_level = is_true(pod.security(&FIELD)).then(|| "spec.securityContext.windowsOptions.hostProcess".to_owned());
    let containers = pod
        .containers
        .iter()
        .filter(|container| is_true(container.security(&FIELD)))
        .map(|container| container.field("securityContext.windowsOptions.hostProcess"));
    let fields = pod_level.into_iter().chain(containers).collect();
    finding(fields, || "windowsOptions.hostProcess=true (baseline allows false or unset)".to_owned())
}
