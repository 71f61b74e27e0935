//! The rules that tie one part of a pod to another (`ValidatePodCreate` and the pod strategy's
//! `PrepareForCreate`, which runs after the webhooks): the host namespaces and the flags that exclude each other,
//! ports under `hostNetwork`, the legacy seccomp and AppArmor annotations and the fields they must agree with,
//! Windows options and the pod's OS, and the topology spread constraints. A pod can break these by what it already
//! has when a template adds something, so the engine judges the injected pod whole for the pods that have what
//! they read ([`crate::pod::PodView::judged_whole`]).

use std::collections::HashSet;

use serde_json::Value as J;

use super::field::{BadValue, FieldError, FieldPath};
use super::{Cx, KubeVersion, Rule};
use crate::pod_api::read::{is_true, items, object, strings, text};
use crate::pod_api::releases::{
    APPARMOR_FIELDS, HOST_PROCESS, HOST_USERS, SPREAD_MATCH_LABEL_KEYS, SPREAD_MIN_DOMAINS,
};
use crate::pod_api::spec::{
    APPARMOR_CONTAINER_ANNOTATION_PREFIX, CONTAINER_LISTS, CONTAINERS, EPHEMERAL_CONTAINERS, INIT_CONTAINERS,
    SECCOMP_CONTAINER_ANNOTATION_PREFIX, SECCOMP_POD_ANNOTATION, SecurityAnnotation, legacy_security_annotation,
};

/// The release whose API server reports a port that breaks the `hostNetwork` rule at its `hostPort`
/// (`validatePodHostNetworkDeps`); older ones report it at `containerPort`, the wording reversed.
const HOST_NETWORK_DEPS_MINOR: u32 = 28;
/// The release from which the API server refuses `net.*` sysctls beside `hostNetwork` and IPC sysctls beside
/// `hostIPC` (`ValidateHostSysctl`).
const HOST_SYSCTLS_MINOR: u32 = 27;
/// The last release whose API server copies a seccomp field into its annotation when the annotation is absent
/// (`applySeccompVersionSkew`, removed in 1.25): the copy counts towards the annotations' total size.
const SECCOMP_FIELD_COPIED_UNTIL: u32 = 24;
/// The last release whose API server copies a seccomp annotation into the field it stands for (removed in 1.27).
const SECCOMP_ANNOTATION_COPIED_UNTIL: u32 = 26;

/// Does the API server of `version` copy the legacy security annotation `key` into the field it stands for, after
/// the mutating webhooks (`applySeccompVersionSkew` before 1.27, `applyAppArmorVersionSkew` from 1.30, when the
/// AppArmor fields came)?
pub(crate) fn annotation_copied_into_a_field(key: &str, version: KubeVersion) -> bool {
    match legacy_security_annotation(key) {
        Some(SecurityAnnotation::Seccomp) => !version.at_least(SECCOMP_ANNOTATION_COPIED_UNTIL + 1),
        Some(SecurityAnnotation::AppArmor) => APPARMOR_FIELDS.kept_at(version.minor),
        None => false,
    }
}

const HOST_USERS_FALSE: &str = "when `hostUsers` is false";

/// The pod-wide rules, over the whole pod (`metadata` and `spec`).
pub(super) fn pod(cx: &mut Cx, pod: &J) {
    let empty = J::Object(Default::default());
    let spec = pod.get("spec").unwrap_or(&empty);
    let path = FieldPath::default().child("spec");
    host_namespaces(cx, spec, &path);
    if is_true(spec.get("hostNetwork")) {
        host_network_ports(cx, items(spec.get(CONTAINERS)), &path.child(CONTAINERS));
    }
    host_sysctls(cx, spec, &path);
    let annotations = pod.get("metadata").and_then(|m| object(m.get("annotations")));
    if let Some(annotations) = annotations {
        security_annotations(cx, annotations, spec);
    }
    windows(cx, spec, &path);
    topology_spread(cx, spec, pod, &path.child("topologySpreadConstraints"));
}

/// `shareProcessNamespace` beside `hostPID`, and (where the release keeps `hostUsers`) a user namespace beside
/// any host namespace or a block device.
fn host_namespaces(cx: &mut Cx, spec: &J, path: &FieldPath) {
    if is_true(spec.get("shareProcessNamespace")) && is_true(spec.get("hostPID")) {
        let detail = "ShareProcessNamespace and HostPID cannot both be enabled";
        cx.push(FieldError::invalid(&path.child("shareProcessNamespace"), BadValue::Other("true".into()), detail));
    }
    if spec.get("hostUsers") != Some(&J::Bool(false)) || !HOST_USERS.kept_at(cx.version.minor) {
        return;
    }
    // `validateHostUsers` names the two namespaces with a capital letter.
    for (field, shown) in [("hostNetwork", "hostNetwork"), ("hostPID", "HostPID"), ("hostIPC", "HostIPC")] {
        if is_true(spec.get(field)) {
            cx.push(FieldError::forbidden(&path.child(shown), HOST_USERS_FALSE));
        }
    }
    for list in CONTAINER_LISTS {
        for (i, c) in items(spec.get(list)).iter().enumerate() {
            if !items(c.get("volumeDevices")).is_empty() {
                cx.push(FieldError::forbidden(&path.child(list).index(i).child("volumeDevices"), HOST_USERS_FALSE));
            }
        }
    }
}

/// The port a container's port takes on the host: its `hostPort`, or under `hostNetwork` its `containerPort` when
/// it sets none (the API server's defaulting, which runs again on a webhook's patch). `None`: no host port.
pub(super) fn host_port(port: &J, host_network: bool) -> Option<i64> {
    let host = port.get("hostPort").and_then(J::as_i64).filter(|p| *p != 0);
    let container = || port.get("containerPort").and_then(J::as_i64).filter(|p| *p != 0);
    host.or_else(|| host_network.then(container).flatten())
}

/// Under `hostNetwork` a regular container's port takes its `containerPort` on the host, so a `hostPort` set to
/// another is refused.
fn host_network_ports(cx: &mut Cx, containers: &[J], path: &FieldPath) {
    for (i, c) in containers.iter().enumerate() {
        for (j, port) in items(c.get("ports")).iter().enumerate() {
            let container = port.get("containerPort").and_then(J::as_i64).unwrap_or(0);
            let Some(host) = host_port(port, true).filter(|host| *host != container) else { continue };
            let at = path.index(i).child("ports").index(j);
            cx.push(if cx.version.at_least(HOST_NETWORK_DEPS_MINOR) {
                FieldError::invalid(
                    &at.child("hostPort"),
                    host,
                    "must match `containerPort` when `hostNetwork` is true",
                )
            } else {
                FieldError::invalid(
                    &at.child("containerPort"),
                    container,
                    "must match `hostPort` when `hostNetwork` is true",
                )
            });
        }
    }
}

/// `ValidateHostSysctl`: a pod on the host's network (or IPC namespace) may not set the sysctls of that
/// namespace.
fn host_sysctls(cx: &mut Cx, spec: &J, path: &FieldPath) {
    if !cx.version.at_least(HOST_SYSCTLS_MINOR) {
        return;
    }
    let (network, ipc) = (is_true(spec.get("hostNetwork")), is_true(spec.get("hostIPC")));
    if !network && !ipc {
        return;
    }
    let sysctls = spec.get("securityContext").map(|c| items(c.get("sysctls"))).unwrap_or_default();
    for (i, sysctl) in sysctls.iter().enumerate() {
        let name = text(sysctl.get("name"));
        let at = path.child("securityContext").child("sysctls").index(i).child("name");
        if network && (name.starts_with("net.") || name.starts_with("net/")) {
            cx.push(FieldError::invalid(&at, name, "may not be specified when 'hostNetwork' is true"));
        }
        if ipc && ipc_sysctl(name) {
            cx.push(FieldError::invalid(&at, name, "may not be specified when 'hostIPC' is true"));
        }
    }
}

/// The sysctls of the IPC namespace (`sysctl.GetNamespace`).
fn ipc_sysctl(name: &str) -> bool {
    let name = name.replace('/', ".");
    matches!(
        name.as_str(),
        "kernel.sem" | "kernel.shmall" | "kernel.shmmax" | "kernel.shmmni" | "kernel.shm_rmid_forced"
    ) || name.starts_with("kernel.msg")
        || name.starts_with("fs.mqueue.")
}

/// The legacy seccomp and AppArmor annotations: their values, the containers they name, and (on create) that
/// each agrees with the field it stands for.
fn security_annotations(cx: &mut Cx, annotations: &serde_json::Map<String, J>, spec: &J) {
    let at = FieldPath::default().child("metadata").child("annotations");
    let containers: Vec<(&str, &J, FieldPath)> = visit_containers(spec);
    for (key, value) in annotations {
        let value = value.as_str().unwrap_or_default();
        if key == SECCOMP_POD_ANNOTATION || key.starts_with(SECCOMP_CONTAINER_ANNOTATION_PREFIX) {
            seccomp_annotation_value(cx, value, &at.field_named(key));
        } else if let Some(name) = key.strip_prefix(APPARMOR_CONTAINER_ANNOTATION_PREFIX) {
            let here = at.key(key);
            if !containers.iter().any(|(c, _, _)| *c == name) {
                cx.push(FieldError::invalid(&here, name, "container not found"));
            }
            if !matches!(value, "" | "runtime/default" | "unconfined") && !value.starts_with("localhost/") {
                cx.push(FieldError::invalid(&here, value, format!("invalid AppArmor profile name: {value:?}")));
            }
        }
    }
    let annotation = |key: &str| annotations.get(key).and_then(J::as_str);
    // `validateSeccompAnnotationsAndFields`: each field with the annotation of its own level (the pod's field is
    // not inherited here).
    let context = spec.get("securityContext");
    if let (Some(field), Some(value)) =
        (context.and_then(|c| c.get("seccompProfile")), annotation(SECCOMP_POD_ANNOTATION))
    {
        seccomp_agrees(cx, value, field, &FieldPath::default().child("spec").child("securityContext"));
    }
    for (name, c, path) in &containers {
        let field = c.get("securityContext").and_then(|s| s.get("seccompProfile")).filter(|f| f.is_object());
        if let (Some(field), Some(value)) = (field, annotation(&format!("{SECCOMP_CONTAINER_ANNOTATION_PREFIX}{name}")))
        {
            seccomp_agrees(cx, value, field, &path.child("securityContext"));
        }
    }
    // `validateAppArmorAnnotationsAndFieldsMatchOnCreate`, after `applyAppArmorVersionSkew` has copied each
    // annotation into the field of a container that sets none (when the annotation names a profile).
    if !APPARMOR_FIELDS.kept_at(cx.version.minor) || windows_pod(spec) {
        return;
    }
    let pod_profile = context.and_then(|c| c.get("appArmorProfile")).filter(|p| p.is_object());
    for (name, c, path) in &containers {
        let Some(value) = annotation(&format!("{APPARMOR_CONTAINER_ANNOTATION_PREFIX}{name}")) else { continue };
        let own = c.get("securityContext").and_then(|s| s.get("appArmorProfile")).filter(|p| p.is_object());
        let profile = match own {
            Some(own) => own,
            // The copy makes the container's field the annotation's profile, which then agrees.
            None if apparmor_names_a_profile(value) => continue,
            None => match pod_profile {
                Some(pod) => pod,
                None => continue,
            },
        };
        let at = path.child("securityContext").child("appArmorProfile");
        if let Some(error) = profile_agrees("apparmor", value, profile, &at, &["runtime/default"]) {
            cx.push(error);
        }
    }
}

/// The containers in the order the API server visits them (`VisitContainersWithPath`: init, regular,
/// ephemeral), by name, with their paths.
fn visit_containers(spec: &J) -> Vec<(&str, &J, FieldPath)> {
    let path = FieldPath::default().child("spec");
    [INIT_CONTAINERS, CONTAINERS, EPHEMERAL_CONTAINERS]
        .into_iter()
        .flat_map(|list| {
            let at = path.child(list);
            items(spec.get(list)).iter().enumerate().map(move |(i, c)| (text(c.get("name")), c, at.index(i)))
        })
        .collect()
}

/// `ValidateSeccompProfile`, for an annotation's value.
fn seccomp_annotation_value(cx: &mut Cx, value: &str, at: &FieldPath) {
    match value.strip_prefix("localhost/") {
        _ if matches!(value, "runtime/default" | "docker/default" | "unconfined") => {}
        Some(file) => {
            cx.rule_as(at, file, file, Rule::RelativePath);
        }
        None => cx.push(FieldError::invalid(at, value, "must be a valid seccomp profile")),
    }
}

fn seccomp_agrees(cx: &mut Cx, value: &str, field: &J, context: &FieldPath) {
    let at = context.child("seccompProfile");
    if let Some(error) = profile_agrees("seccomp", value, field, &at, &["runtime/default", "docker/default"]) {
        cx.push(error);
    }
}

/// Does a profile field (`type`, `localhostProfile`) agree with the annotation `value`, which spells
/// `RuntimeDefault` as one of `runtime_default`? The API server's error if not.
fn profile_agrees(kind: &str, value: &str, field: &J, at: &FieldPath, runtime_default: &[&str]) -> Option<FieldError> {
    let type_error =
        || FieldError::forbidden(&at.child("type"), format!("{kind} type in annotation and field must match"));
    match text(field.get("type")) {
        "Unconfined" if value != "unconfined" => Some(type_error()),
        "RuntimeDefault" if !runtime_default.contains(&value) => Some(type_error()),
        "Localhost" => match value.strip_prefix("localhost/") {
            None => Some(type_error()),
            Some(profile) if field.get("localhostProfile").and_then(J::as_str) != Some(profile) => {
                let detail = format!("{kind} profile in annotation and field must match");
                Some(FieldError::forbidden(&at.child("localhostProfile"), detail))
            }
            Some(_) => None,
        },
        _ => None,
    }
}

/// Does an AppArmor annotation's value name a profile the API server copies into the field
/// (`ApparmorFieldForAnnotation`)?
fn apparmor_names_a_profile(value: &str) -> bool {
    matches!(value, "unconfined" | "runtime/default") || value.strip_prefix("localhost/").is_some_and(|p| !p.is_empty())
}

fn windows_pod(spec: &J) -> bool {
    spec.get("os").is_some_and(|os| text(os.get("name")) == "windows")
}

/// Does `version`'s API server add annotations of its own before it counts them (from 1.20 to 1.24 it copies each
/// seccomp field whose annotation is absent into an annotation: `applySeccompVersionSkew`)?
pub(crate) fn annotations_copied_from_fields(version: KubeVersion) -> bool {
    !version.at_least(SECCOMP_FIELD_COPIED_UNTIL + 1)
}

/// The bytes the API server adds to the annotations before it counts them (see
/// [`annotations_copied_from_fields`]).
pub(super) fn annotation_bytes_added(cx: &Cx, pod: &J) -> usize {
    if !annotations_copied_from_fields(cx.version) {
        return 0;
    }
    let Some(spec) = pod.get("spec") else { return 0 };
    let annotations = pod.get("metadata").and_then(|m| object(m.get("annotations")));
    let has = |key: &str| annotations.is_some_and(|a| a.contains_key(key));
    let copied = |key: String, profile: Option<&J>| -> usize {
        let Some(profile) = profile.filter(|p| p.is_object()) else { return 0 };
        if has(&key) {
            return 0;
        }
        let value = match (text(profile.get("type")), profile.get("localhostProfile").and_then(J::as_str)) {
            ("Unconfined", _) => "unconfined".len(),
            ("RuntimeDefault", _) => "runtime/default".len(),
            ("Localhost", Some(file)) => "localhost/".len() + file.len(),
            _ => return 0,
        };
        key.len() + value
    };
    let pod_level =
        copied(SECCOMP_POD_ANNOTATION.to_owned(), spec.get("securityContext").and_then(|c| c.get("seccompProfile")));
    let containers: usize = [INIT_CONTAINERS, CONTAINERS]
        .iter()
        .flat_map(|list| items(spec.get(*list)))
        .map(|c| {
            let key = format!("{SECCOMP_CONTAINER_ANNOTATION_PREFIX}{}", text(c.get("name")));
            copied(key, c.get("securityContext").and_then(|s| s.get("seccompProfile")))
        })
        .sum();
    pod_level + containers
}

/// Windows options (`validateWindowsSecurityContextOptions`), in a pod's or a container's security context.
pub(super) fn windows_options(cx: &mut Cx, options: &J, path: &FieldPath) {
    if let Some(name) = options.get("gmsaCredentialSpecName").and_then(J::as_str) {
        cx.rule(&path.child("gmsaCredentialSpecName"), name, Rule::Dns1123Subdomain);
    }
    if let Some(spec) = options.get("gmsaCredentialSpec").and_then(J::as_str) {
        let at = path.child("gmsaCredentialSpec");
        if spec.is_empty() {
            cx.push(FieldError::invalid(&at, spec, "gmsaCredentialSpec cannot be an empty string"));
        } else if spec.len() > 64 * 1024 {
            cx.push(FieldError::invalid(&at, spec, "gmsaCredentialSpec size must be under 64 KiB"));
        }
    }
    if let Some(user) = options.get("runAsUserName").and_then(J::as_str) {
        let at = path.child("runAsUserName");
        for message in super::names::windows_user_name(user) {
            cx.push(FieldError::invalid(&at, user, message));
        }
    }
}

/// The pod's OS and Windows host-process containers (`validateOS`, `validateLinux`, `validateWindowsHostProcessPod`).
fn windows(cx: &mut Cx, spec: &J, path: &FieldPath) {
    let containers = visit_containers(spec);
    fn options(context: Option<&J>) -> Option<&J> {
        context.and_then(|c| c.get("windowsOptions")).filter(|o| o.is_object())
    }
    let pod_options = options(spec.get("securityContext"));
    if spec.get("os").is_some_and(|os| text(os.get("name")) == "linux") {
        let detail = "windows options cannot be set for a linux pod";
        if pod_options.is_some() {
            cx.push(FieldError::forbidden(&path.child("securityContext").child("windowsOptions"), detail));
        }
        for (_, c, at) in &containers {
            if options(c.get("securityContext")).is_some() {
                cx.push(FieldError::forbidden(&at.child("securityContext").child("windowsOptions"), detail));
            }
        }
    }
    if !HOST_PROCESS.kept_at(cx.version.minor) {
        return;
    }
    let pod_host_process = pod_options.and_then(|o| o.get("hostProcess")).and_then(J::as_bool);
    let (mut any, mut all) = (pod_host_process == Some(true), true);
    for (_, c, at) in &containers {
        let own = options(c.get("securityContext")).and_then(|o| o.get("hostProcess")).and_then(J::as_bool);
        if let (Some(pod), Some(own)) = (pod_host_process, own)
            && pod != own
        {
            let at = at.child("securityContext").child("windowsOptions").child("hostProcess");
            let detail = format!("pod hostProcess value must be identical if both are specified, was {pod}");
            cx.push(FieldError::invalid(&at, BadValue::Other(own.to_string()), detail));
        }
        let host_process = own.or(pod_host_process) == Some(true);
        any |= host_process;
        all &= host_process;
    }
    if !any {
        return;
    }
    if !all {
        let detail = "If pod contains any hostProcess containers then all containers must be HostProcess containers";
        cx.push(FieldError::invalid(path, "", detail));
    }
    if !is_true(spec.get("hostNetwork")) {
        let detail = "hostNetwork must be true if pod contains any hostProcess containers";
        cx.push(FieldError::invalid(&path.child("hostNetwork"), BadValue::Other("false".into()), detail));
    }
}

/// `validateTopologySpreadConstraints`, after `PrepareForCreate` has merged each `matchLabelKeys` key the pod has
/// as a label into the constraint's selector (from the release that keeps `matchLabelKeys`).
fn topology_spread(cx: &mut Cx, spec: &J, pod: &J, path: &FieldPath) {
    let constraints = items(spec.get("topologySpreadConstraints"));
    let labels = pod.get("metadata").and_then(|m| object(m.get("labels")));
    for (i, constraint) in constraints.iter().enumerate() {
        let at = path.index(i);
        let skew = constraint.get("maxSkew").and_then(J::as_i64).unwrap_or(0);
        if skew <= 0 {
            cx.push(FieldError::invalid(&at.child("maxSkew"), skew, "must be greater than zero"));
        }
        let key = text(constraint.get("topologyKey"));
        if key.is_empty() {
            cx.push(FieldError::required(&at.child("topologyKey"), "can not be empty"));
        }
        let when = text(constraint.get("whenUnsatisfiable"));
        cx.rule(&at.child("whenUnsatisfiable"), when, Rule::OneOf(&["DoNotSchedule", "ScheduleAnyway"]));
        // Unique by the pair (compared with the later constraints, so reported at the earlier one).
        let same = |other: &J| text(other.get("topologyKey")) == key && text(other.get("whenUnsatisfiable")) == when;
        if constraints[i + 1..].iter().any(same) {
            let shown = format!("{{{key}, {when}}}");
            cx.push(FieldError::duplicate(&at.field_named("{topologyKey, whenUnsatisfiable}"), shown.as_str()));
        }
        if let Some(domains) = constraint.get("minDomains").and_then(J::as_i64)
            && SPREAD_MIN_DOMAINS.kept_at(cx.version.minor)
        {
            if domains <= 0 {
                cx.push(FieldError::invalid(&at.child("minDomains"), domains, "must be greater than zero"));
            } else if when != "DoNotSchedule" {
                let detail = format!("can only use minDomains if whenUnsatisfiable=DoNotSchedule, not {when}");
                cx.push(FieldError::invalid(&at.child("minDomains"), domains, detail));
            }
        }
        for policy in ["nodeAffinityPolicy", "nodeTaintsPolicy"] {
            if let Some(value) = constraint.get(policy).and_then(J::as_str) {
                cx.rule(&at.child(policy), value, Rule::OneOf(&["Honor", "Ignore"]));
            }
        }
        if SPREAD_MATCH_LABEL_KEYS.kept_at(cx.version.minor) {
            match_label_keys(cx, constraint, labels, &at);
        }
    }
}

/// A constraint's `matchLabelKeys`: label keys, only beside a selector, and none the selector already has once the
/// pod's labels for them are merged in.
fn match_label_keys(cx: &mut Cx, constraint: &J, labels: Option<&serde_json::Map<String, J>>, at: &FieldPath) {
    let keys: Vec<&str> = strings(constraint.get("matchLabelKeys")).collect();
    if keys.is_empty() {
        return;
    }
    let Some(selector) = constraint.get("labelSelector").filter(|s| s.is_object()) else {
        let detail = "must not be specified when labelSelector is not set";
        cx.push(FieldError::forbidden(&at.child("matchLabelKeys"), detail));
        return;
    };
    let mut seen: HashSet<&str> =
        object(selector.get("matchLabels")).into_iter().flatten().map(|(k, _)| k.as_str()).collect();
    seen.extend(items(selector.get("matchExpressions")).iter().map(|e| text(e.get("key"))));
    for (k, key) in keys.iter().enumerate() {
        let here = at.child("matchLabelKeys").index(k);
        if !cx.rule_as(&here, key, key, Rule::QualifiedName) {
            continue;
        }
        // Merged only for the labels the pod has; the merge is what makes a key repeated.
        if labels.is_some_and(|l| l.contains_key(*key)) && !seen.insert(key) {
            cx.push(FieldError::invalid(&here, *key, "exists in both matchLabelKeys and labelSelector"));
        }
    }
}
