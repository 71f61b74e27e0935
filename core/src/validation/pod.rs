//! The API server's validation of a Pod at CREATE (`ValidatePodCreate` and what it calls in Kubernetes'
//! `pkg/apis/core/validation`), over the pod's JSON, for the fields a template or an override can put into a pod.
//!
//! It judges the pod as the API server does: after its defaults (a missing `protocol` is TCP, a missing request
//! is the limit, a probe's zero thresholds are its defaults, a volume without a source is an `emptyDir`), with
//! its messages. What it does not check (other volume sources' own fields, the values of affinity label
//! selectors, cluster policy such as `privileged`) is left to the API server; see docs/validation.md.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value as J};

use super::field::{FieldError, FieldPath};
use super::quantity::{self, Quantity};
use super::{Cx, Rule, pod_wide};
use crate::pod_api::read::{items, object, strings};
use crate::pod_api::releases::{HOSTNAME_OVERRIDE, RESIZE_POLICY};
use crate::pod_api::spec::{
    CONTAINERS, ENV_VAR_SOURCES, EPHEMERAL_CONTAINERS, INIT_CONTAINERS, LIFECYCLE_HANDLERS, LIFECYCLE_HOOKS,
    PROBE_HANDLERS, PROBES, VOLUME_SOURCES,
};

const FILE_MODE: &str = "must be a number between 0 and 0777 (octal), both inclusive";
const MAX_INT32: i64 = i32::MAX as i64;
/// What the API server's `IsValidUserID` and `IsValidGroupID` accept.
const ID_RANGE: &str = "must be between 0 and 2147483647, inclusive";
const NOT_FOR_INIT: &str = "must not be set for init containers";

const PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
const RESTART_POLICIES: &[&str] = &["Always", "OnFailure", "Never"];
const DNS_POLICIES: &[&str] = &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"];
const HTTP_SCHEMES: &[&str] = &["HTTP", "HTTPS"];
const PROC_MOUNTS: &[&str] = &["Default", "Unmasked"];
const SECCOMP_TYPES: &[&str] = &["Localhost", "RuntimeDefault", "Unconfined"];
const HOST_PATH_TYPES: &[&str] =
    &["", "BlockDevice", "CharDevice", "Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket"];
const MOUNT_PROPAGATIONS: &[&str] = &["Bidirectional", "HostToContainer", "None"];
const TOLERATION_OPERATORS: &[&str] = &["Equal", "Exists"];
const TAINT_EFFECTS: &[&str] = &["NoExecute", "NoSchedule", "PreferNoSchedule"];
const NOT_A_SELECTOR_OPERATOR: &str = "not a valid selector operator";
const WEIGHT_RANGE: &str = "must be in the range 1-100";
/// The native-sidecar restart policy, the only one an init container may have.
const SIDECAR_RESTART: &[&str] = &["Always"];

/// The fields an env var's `fieldRef` may read, by the API server's conversion of a v1 field label.
const FIELD_LABELS: &[&str] = &[
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.serviceAccountName",
    "spec.schedulerName",
    "status.phase",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];
/// Of those, what an env var may read (`validEnvDownwardAPIFieldPathExpressions`).
const ENV_FIELD_PATHS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];
/// What a downward API volume file may read.
const VOLUME_FIELD_PATHS: &[&str] =
    &["metadata.annotations", "metadata.labels", "metadata.name", "metadata.namespace", "metadata.uid"];
const RESOURCE_FIELD_PATHS: &[&str] = &[
    "limits.cpu",
    "limits.ephemeral-storage",
    "limits.memory",
    "requests.cpu",
    "requests.ephemeral-storage",
    "requests.memory",
];

/// Validates a whole pod, as the API server's `ValidatePodCreate` would after defaulting.
pub(super) fn pod(cx: &mut Cx, pod: &J) {
    let root = FieldPath::default();
    if let Some(metadata) = pod.get("metadata") {
        let added = pod_wide::annotation_bytes_added(cx, pod);
        object_meta(cx, metadata, added, &root.child("metadata"));
    }
    let empty = J::Object(Map::new());
    let spec_value = pod.get("spec").unwrap_or(&empty);
    spec(cx, spec_value, &root.child("spec"));
    pod_wide::pod(cx, pod);
}

/// The release from which the API machinery says "may not be more than N bytes" (before: "must have at most").
const TOO_LONG_WORDING_MINOR: u32 = 32;

/// The object's metadata; `added` is what the API server adds to the annotations before it counts them.
fn object_meta(cx: &mut Cx, metadata: &J, added: usize, path: &FieldPath) {
    if let Some(name) = str_of(metadata, "name").filter(|n| !n.is_empty()) {
        cx.rule(&path.child("name"), name, Rule::Dns1123Subdomain);
    } else if let Some(prefix) = str_of(metadata, "generateName").filter(|n| !n.is_empty()) {
        // A prefix is checked with its trailing dash masked, as the name it makes will end in random characters.
        let masked = prefix.strip_suffix('-').map(|p| format!("{p}a"));
        cx.rule(&path.child("generateName"), masked.as_deref().unwrap_or(prefix), Rule::Dns1123Subdomain);
    }
    if let Some(labels) = object(metadata.get("labels")) {
        labels_map(cx, labels, &path.child("labels"));
    }
    if let Some(annotations) = object(metadata.get("annotations")) {
        let at = path.child("annotations");
        let mut total = added;
        for (key, value) in annotations {
            // The API server lowercases annotation keys before checking them.
            cx.rule_as(&at, &key.to_lowercase(), key, Rule::QualifiedName);
            total += key.len() + value.as_str().map_or(0, str::len);
        }
        if let Some(error) = annotations_size(total, cx.version, &at) {
            cx.push(error);
        }
    }
}

/// The API server's error for annotations (at `at`) whose keys and values come to `total` bytes, if that is over
/// its limit.
pub(super) fn annotations_size(total: usize, version: super::KubeVersion, at: &FieldPath) -> Option<FieldError> {
    let limit = super::names::TOTAL_ANNOTATION_SIZE_LIMIT_B;
    if total <= limit {
        return None;
    }
    let detail = match version.at_least(TOO_LONG_WORDING_MINOR) {
        true => format!("may not be more than {limit} bytes"),
        false => format!("must have at most {limit} bytes"),
    };
    Some(FieldError::new(at, super::field::ErrorKind::TooLong, detail))
}

/// `validatePodHostName`: a `hostnameOverride` is a DNS-1123 subdomain of at most 64 characters, and neither
/// `setHostnameAsFQDN` nor `hostNetwork` beside it.
fn hostname_override(cx: &mut Cx, spec: &J, path: &FieldPath) {
    let Some(value) = str_of(spec, "hostnameOverride") else { return };
    // Dropped by releases that do not keep it (and refused at load in a template: `pod_api::releases`).
    if !HOSTNAME_OVERRIDE.kept_at(cx.version.minor) {
        return;
    }
    let at = path.child("hostnameOverride");
    if spec.get("setHostnameAsFQDN").and_then(J::as_bool) == Some(true) {
        cx.push(FieldError::forbidden(&at, "may not be specified when setHostnameAsFQDN is true"));
    }
    if spec.get("hostNetwork").and_then(J::as_bool) == Some(true) {
        cx.push(FieldError::forbidden(&at, "may not be specified when hostNetwork is true"));
    }
    if value.len() > 64 {
        cx.push(FieldError::new(&at, super::field::ErrorKind::TooLong, "may not be more than 64 bytes"));
    }
    cx.rule(&at, value, Rule::Dns1123Subdomain);
}

/// Label keys and values (`ValidateLabels`), also used for a node selector.
fn labels_map(cx: &mut Cx, labels: &Map<String, J>, at: &FieldPath) {
    for (key, value) in labels {
        cx.rule_as(at, key, key, Rule::QualifiedName);
        if let Some(value) = value.as_str() {
            cx.rule_leaf(at, &at.key(key), value, Rule::LabelValue);
        }
    }
}

fn spec(cx: &mut Cx, spec: &J, path: &FieldPath) {
    let volumes = volumes(cx, items(spec.get("volumes")), &path.child("volumes"));
    let containers = items(spec.get(CONTAINERS));
    let init_containers = items(spec.get(INIT_CONTAINERS));
    if containers.is_empty() {
        cx.push(FieldError::required(&path.child(CONTAINERS), ""));
    }
    let mut names = HashSet::new();
    let scope = PodScope {
        volumes,
        host_network: spec.get("hostNetwork").and_then(J::as_bool) == Some(true),
        never_restarts: str_of(spec, "restartPolicy") == Some("Never"),
    };
    container_list(cx, containers, false, &scope, &mut names, &path.child(CONTAINERS));
    container_list(cx, init_containers, true, &scope, &mut names, &path.child(INIT_CONTAINERS));
    for (i, container) in items(spec.get(EPHEMERAL_CONTAINERS)).iter().enumerate() {
        let name = str_of(container, "name").unwrap_or_default();
        if !name.is_empty() && !names.insert(name) {
            cx.push(FieldError::duplicate(&path.child(EPHEMERAL_CONTAINERS).index(i).child("name"), name));
        }
    }
    if !items(spec.get(EPHEMERAL_CONTAINERS)).is_empty() {
        // `ValidatePodCreate`: only the ephemeralcontainers subresource adds them (before 1.23 the API server
        // drops them instead, which would leave the template half-applied).
        cx.push(FieldError::forbidden(&path.child(EPHEMERAL_CONTAINERS), "cannot be set on create"));
    }
    if let Some(node) = str_of(spec, "nodeName").filter(|n| !n.is_empty()) {
        cx.rule(&path.child("nodeName"), node, Rule::Dns1123Subdomain);
    }
    if let Some(os) = spec.get("os").filter(|o| o.is_object()) {
        match str_of(os, "name").filter(|n| !n.is_empty()) {
            None => cx.push(FieldError::required(&path.child("os").child("name"), "")),
            Some(name) => {
                cx.rule(&path.child("os").child("name"), name, Rule::OneOf(&["linux", "windows"]));
            }
        }
    }
    let host_network = spec.get("hostNetwork").and_then(J::as_bool) == Some(true);
    host_ports(cx, containers, host_network, &path.child(CONTAINERS));
    pod_resources(cx, spec, path);
    if let Some(policy) = str_of(spec, "restartPolicy").filter(|p| !p.is_empty()) {
        cx.rule(&path.child("restartPolicy"), policy, Rule::OneOf(RESTART_POLICIES));
    }
    if let Some(policy) = str_of(spec, "dnsPolicy").filter(|p| !p.is_empty()) {
        cx.rule(&path.child("dnsPolicy"), policy, Rule::OneOf(DNS_POLICIES));
    }
    if let Some(selector) = object(spec.get("nodeSelector")) {
        labels_map(cx, selector, &path.child("nodeSelector"));
    }
    dns_config(cx, spec, &path.child("dnsConfig"));
    for (i, gate) in items(spec.get("readinessGates")).iter().enumerate() {
        let condition = str_of(gate, "conditionType").unwrap_or_default();
        cx.rule(&path.child("readinessGates").index(i).child("conditionType"), condition, Rule::QualifiedName);
    }
    if let Some(class) = str_of(spec, "runtimeClassName") {
        cx.rule(&path.child("runtimeClassName"), class, Rule::Dns1123Subdomain);
    }
    tolerations(cx, items(spec.get("tolerations")), &path.child("tolerations"));
    if let Some(affinity) = spec.get("affinity").filter(|a| a.is_object()) {
        self::affinity(cx, affinity, &path.child("affinity"));
    }
    if let Some(context) = spec.get("securityContext").filter(|c| c.is_object()) {
        pod_security_context(cx, context, &path.child("securityContext"));
    }
    for (field, rule) in [
        ("serviceAccountName", Rule::Dns1123Subdomain),
        ("hostname", Rule::Dns1123Label),
        ("subdomain", Rule::Dns1123Label),
        ("priorityClassName", Rule::Dns1123Subdomain),
    ] {
        if let Some(value) = str_of(spec, field).filter(|v| !v.is_empty()) {
            cx.rule(&path.child(field), value, rule);
        }
    }
    hostname_override(cx, spec, path);
    if let Some(deadline) = int_of(spec, "activeDeadlineSeconds")
        && !(1..=MAX_INT32).contains(&deadline)
    {
        let detail = format!("must be between 1 and {MAX_INT32}, inclusive");
        cx.push(FieldError::invalid(&path.child("activeDeadlineSeconds"), deadline, detail));
    }
    for (i, secret) in items(spec.get("imagePullSecrets")).iter().enumerate() {
        if str_of(secret, "name").is_none_or(str::is_empty) {
            cx.push(FieldError::required(&path.child("imagePullSecrets").index(i).child("name"), ""));
        }
    }
    for (i, alias) in items(spec.get("hostAliases")).iter().enumerate() {
        let at = path.child("hostAliases").index(i);
        let ip = str_of(alias, "ip").unwrap_or_default();
        if ip.parse::<std::net::IpAddr>().is_err() {
            cx.push(FieldError::invalid(&at.child("ip"), ip, "must be valid IP address"));
        }
        for hostname in strings(alias.get("hostnames")) {
            cx.rule_as(&at.child("hostnames"), hostname, hostname, Rule::Dns1123Subdomain);
        }
    }
}

/// `validatePodDNSConfig`: `dnsPolicy: None` needs a `dnsConfig` with a nameserver; nameservers are IP addresses,
/// search domains DNS subdomains (a trailing dot allowed), each option named. Kubernetes 1.26 raised the limits
/// (ExpandedDNSConfig, on by default) from 6 search paths and 256 characters to 32 and 2048; 1.33 accepts `.` and
/// underscores in search domains (RelaxedDNSSearchValidation).
fn dns_config(cx: &mut Cx, spec: &J, path: &FieldPath) {
    let config = spec.get("dnsConfig").filter(|c| c.is_object());
    if str_of(spec, "dnsPolicy") == Some("None") {
        match config {
            None => return cx.push(FieldError::required(path, "must provide `dnsConfig` when `dnsPolicy` is None")),
            Some(config) if items(config.get("nameservers")).is_empty() => {
                let detail = "must provide at least one DNS nameserver when `dnsPolicy` is None";
                return cx.push(FieldError::required(&path.child("nameservers"), detail));
            }
            Some(_) => {}
        }
    }
    let Some(config) = config else { return };
    let nameservers = items(config.get("nameservers"));
    if nameservers.len() > 3 {
        let shown = J::Array(nameservers.to_vec()).to_string();
        cx.push(FieldError::invalid(
            &path.child("nameservers"),
            shown.as_str(),
            "must not have more than 3 nameservers",
        ));
    }
    for (i, server) in nameservers.iter().enumerate() {
        let server = server.as_str().unwrap_or_default();
        if server.parse::<std::net::IpAddr>().is_err() {
            cx.push(FieldError::invalid(&path.child("nameservers").index(i), server, "must be valid IP address"));
        }
    }
    let searches: Vec<&str> = items(config.get("searches")).iter().map(|s| s.as_str().unwrap_or_default()).collect();
    let (most, chars) = if cx.version.at_least(26) { (32, 2048) } else { (6, 256) };
    let shown = || J::from(searches.clone()).to_string();
    if searches.len() > most {
        let detail = format!("must not have more than {most} search paths");
        cx.push(FieldError::invalid(&path.child("searches"), shown().as_str(), detail));
    }
    if searches.join(" ").len() > chars {
        let detail = format!("must not have more than {chars} characters (including spaces) in the search list");
        cx.push(FieldError::invalid(&path.child("searches"), shown().as_str(), detail));
    }
    let relaxed = cx.version.at_least(33);
    for (i, search) in searches.iter().enumerate() {
        let at = path.child("searches").index(i);
        if relaxed && *search == "." {
            continue;
        }
        // A trailing dot is fine.
        let name = search.strip_suffix('.').unwrap_or(search);
        if relaxed {
            let masked = name.replace('_', "a");
            cx.rule_as(&at, &masked, search, Rule::Dns1123Subdomain);
        } else {
            cx.rule_as(&at, name, name, Rule::Dns1123Subdomain);
        }
    }
    for (i, option) in items(config.get("options")).iter().enumerate() {
        if str_of(option, "name").is_none_or(str::is_empty) {
            cx.push(FieldError::required(&path.child("options").index(i), "Option.Name must not be empty"));
        }
    }
}

/// `ValidateTolerations`: keys are label names, an empty key goes with `Exists`, `tolerationSeconds` with
/// `NoExecute`, the operator is `Equal` (or empty) with a label value or `Exists` with none, and the effect one of
/// the taint effects.
fn tolerations(cx: &mut Cx, tolerations: &[J], path: &FieldPath) {
    for (i, toleration) in tolerations.iter().enumerate() {
        let at = path.index(i);
        let key = str_of(toleration, "key").unwrap_or_default();
        let operator = str_of(toleration, "operator").unwrap_or_default();
        let value = str_of(toleration, "value").unwrap_or_default();
        let effect = str_of(toleration, "effect").unwrap_or_default();
        if !key.is_empty() {
            cx.rule(&at.child("key"), key, Rule::QualifiedName);
        }
        if key.is_empty() && operator != "Exists" {
            let detail = "operator must be Exists when `key` is empty, which means \"match all values and all keys\"";
            cx.push(FieldError::invalid(&at.child("operator"), operator, detail));
        }
        if is_set(toleration, "tolerationSeconds") && effect != "NoExecute" {
            cx.push(FieldError::invalid(
                &at.child("effect"),
                effect,
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            ));
        }
        match operator {
            "Equal" | "" => {
                // The API server reports a bad value at the operator.
                cx.record(&at.child("value"), Rule::LabelValue);
                let messages = super::names::label_value(value);
                if !messages.is_empty() {
                    cx.push(FieldError::invalid(&at.child("operator"), value, messages.join(";")));
                }
            }
            "Exists" if !value.is_empty() => {
                let shown = toleration.to_string();
                cx.push(FieldError::invalid(
                    &at.child("operator"),
                    shown.as_str(),
                    "value must be empty when `operator` is 'Exists'",
                ));
            }
            "Exists" => {}
            other => cx.push(FieldError::not_supported(&at.child("operator"), other, TOLERATION_OPERATORS)),
        }
        if !effect.is_empty() {
            cx.rule(&at.child("effect"), effect, Rule::OneOf(TAINT_EFFECTS));
        }
    }
}

/// `validateAffinity`: node affinity's selector terms and the pod (anti-)affinity terms.
fn affinity(cx: &mut Cx, affinity: &J, path: &FieldPath) {
    if let Some(node) = affinity.get("nodeAffinity").filter(|n| n.is_object()) {
        let at = path.child("nodeAffinity");
        let required = "requiredDuringSchedulingIgnoredDuringExecution";
        if let Some(selector) = node.get(required).filter(|s| s.is_object()) {
            let terms_path = at.child(required).child("nodeSelectorTerms");
            let terms = items(selector.get("nodeSelectorTerms"));
            if terms.is_empty() {
                cx.push(FieldError::required(&terms_path, "must have at least one node selector term"));
            }
            for (i, term) in terms.iter().enumerate() {
                node_selector_term(cx, term, &terms_path.index(i));
            }
        }
        let preferred = "preferredDuringSchedulingIgnoredDuringExecution";
        for (i, term) in items(node.get(preferred)).iter().enumerate() {
            let here = at.child(preferred).index(i);
            weight(cx, term, &here);
            let empty = J::Object(Map::new());
            node_selector_term(cx, term.get("preference").unwrap_or(&empty), &here.child("preference"));
        }
    }
    for kind in ["podAffinity", "podAntiAffinity"] {
        let Some(pods) = affinity.get(kind).filter(|p| p.is_object()) else { continue };
        let at = path.child(kind);
        let required = "requiredDuringSchedulingIgnoredDuringExecution";
        for (i, term) in items(pods.get(required)).iter().enumerate() {
            pod_affinity_term(cx, term, &at.child(required).index(i));
        }
        let preferred = "preferredDuringSchedulingIgnoredDuringExecution";
        for (i, term) in items(pods.get(preferred)).iter().enumerate() {
            let here = at.child(preferred).index(i);
            weight(cx, term, &here);
            let empty = J::Object(Map::new());
            pod_affinity_term(cx, term.get("podAffinityTerm").unwrap_or(&empty), &here.child("podAffinityTerm"));
        }
    }
}

fn weight(cx: &mut Cx, term: &J, path: &FieldPath) {
    let weight = int_of(term, "weight").unwrap_or(0);
    if !(1..=100).contains(&weight) {
        cx.push(FieldError::invalid(&path.child("weight"), weight, WEIGHT_RANGE));
    }
}

/// `ValidateNodeSelectorTerm`: label expressions, and field expressions (only `metadata.name`, with one value).
fn node_selector_term(cx: &mut Cx, term: &J, path: &FieldPath) {
    for (j, requirement) in items(term.get("matchExpressions")).iter().enumerate() {
        let at = path.child("matchExpressions").index(j);
        let values = items(requirement.get("values"));
        let operator = str_of(requirement, "operator").unwrap_or_default();
        if !set_operator_values(cx, operator, values, &at) {
            match operator {
                "Gt" | "Lt" if values.len() != 1 => {
                    let detail = "must be specified single value when `operator` is 'Lt' or 'Gt'";
                    cx.push(FieldError::required(&at.child("values"), detail));
                }
                "Gt" | "Lt" => {}
                other => cx.push(FieldError::invalid(&at.child("operator"), other, NOT_A_SELECTOR_OPERATOR)),
            }
        }
        let key = str_of(requirement, "key").unwrap_or_default();
        cx.rule(&at.child("key"), key, Rule::QualifiedName);
    }
    for (j, requirement) in items(term.get("matchFields")).iter().enumerate() {
        let at = path.child("matchFields").index(j);
        let values = items(requirement.get("values"));
        match str_of(requirement, "operator").unwrap_or_default() {
            "In" | "NotIn" if values.len() != 1 => {
                let detail = "must be only one value when `operator` is 'In' or 'NotIn' for node field selector";
                cx.push(FieldError::required(&at.child("values"), detail));
            }
            "In" | "NotIn" => {}
            other => cx.push(FieldError::invalid(&at.child("operator"), other, NOT_A_SELECTOR_OPERATOR)),
        }
        let key = str_of(requirement, "key").unwrap_or_default();
        if key != "metadata.name" {
            cx.push(FieldError::invalid(&at.child("key"), key, "not a valid field selector key"));
        } else {
            // A node's name is a DNS subdomain.
            for (k, value) in values.iter().enumerate() {
                let value = value.as_str().unwrap_or_default();
                cx.rule(&at.child("values").index(k), value, Rule::Dns1123Subdomain);
            }
        }
    }
}

/// `validatePodAffinityTerm`: the label selector, the namespaces (DNS labels) and a topology key.
fn pod_affinity_term(cx: &mut Cx, term: &J, path: &FieldPath) {
    if let Some(selector) = term.get("labelSelector").filter(|s| s.is_object()) {
        // Kubernetes 1.20 reports the selector's problems under `matchExpressions` (as measured against its API
        // server); 1.21 (which added `namespaceSelector` beside it) under `labelSelector`.
        let name = if cx.version.at_least(21) { "labelSelector" } else { "matchExpressions" };
        label_selector(cx, selector, &path.child(name));
    }
    for namespace in strings(term.get("namespaces")) {
        cx.rule_as(&path.child("namespace"), namespace, namespace, Rule::Dns1123Label);
    }
    match str_of(term, "topologyKey").filter(|k| !k.is_empty()) {
        Some(key) => {
            cx.rule(&path.child("topologyKey"), key, Rule::QualifiedName);
        }
        None => {
            cx.push(FieldError::required(&path.child("topologyKey"), "can not be empty"));
            cx.rule(&path.child("topologyKey"), "", Rule::QualifiedName);
        }
    }
}

/// The values of a requirement with a set-based operator (`In`, `NotIn`, `Exists`, `DoesNotExist`), which label
/// selectors and node selector terms judge alike: `true` if `operator` is one of them (judged here).
fn set_operator_values(cx: &mut Cx, operator: &str, values: &[J], at: &FieldPath) -> bool {
    match operator {
        "In" | "NotIn" if values.is_empty() => {
            let detail = "must be specified when `operator` is 'In' or 'NotIn'";
            cx.push(FieldError::required(&at.child("values"), detail));
        }
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            let detail = "may not be specified when `operator` is 'Exists' or 'DoesNotExist'";
            cx.push(FieldError::forbidden(&at.child("values"), detail));
        }
        "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
        _ => return false,
    }
    true
}

/// `ValidateLabelSelector`: its labels, and each expression's operator and key. (Values are held to label values
/// only by newer API servers; they are not judged here.)
fn label_selector(cx: &mut Cx, selector: &J, path: &FieldPath) {
    if let Some(labels) = object(selector.get("matchLabels")) {
        labels_map(cx, labels, &path.child("matchLabels"));
    }
    for (i, requirement) in items(selector.get("matchExpressions")).iter().enumerate() {
        let at = path.child("matchExpressions").index(i);
        let values = items(requirement.get("values"));
        let operator = str_of(requirement, "operator").unwrap_or_default();
        if !set_operator_values(cx, operator, values, &at) {
            cx.push(FieldError::invalid(&at.child("operator"), operator, NOT_A_SELECTOR_OPERATOR));
        }
        let key = str_of(requirement, "key").unwrap_or_default();
        cx.rule(&at.child("key"), key, Rule::QualifiedName);
    }
}

/// `ValidateVolumes`: the volumes that are valid, by name, for mounts to refer to (an invalid volume is not one).
fn volumes<'j>(cx: &mut Cx, volumes: &'j [J], path: &FieldPath) -> HashSet<&'j str> {
    let mut valid = HashSet::new();
    let mut seen = HashSet::new();
    for (i, volume) in volumes.iter().enumerate() {
        let at = path.index(i);
        let before = cx.errors.len();
        volume_source(cx, volume, &at);
        let name = str_of(volume, "name").unwrap_or_default();
        if name.is_empty() {
            cx.push(FieldError::required(&at.child("name"), ""));
        } else {
            cx.rule(&at.child("name"), name, Rule::Dns1123Label);
        }
        if !seen.insert(name) {
            cx.push(FieldError::duplicate(&at.child("name"), name));
        }
        if cx.errors.len() == before {
            valid.insert(name);
        }
    }
    valid
}

fn volume_source(cx: &mut Cx, volume: &J, path: &FieldPath) {
    // A volume without a source is defaulted to an emptyDir.
    let mut first = None;
    for source in VOLUME_SOURCES.iter().copied().filter(|s| is_set(volume, s)) {
        if first.is_some() {
            cx.push(FieldError::forbidden(&path.child(source), "may not specify more than 1 volume type"));
            continue;
        }
        first = Some(source);
        let at = path.child(source);
        let body = &volume[source];
        match source {
            "emptyDir" => {
                if let Some(limit) = body.get("sizeLimit").and_then(|q| quantity::from_json(q).ok())
                    && limit.is_negative()
                {
                    let detail = "SizeLimit field must be a valid resource quantity";
                    cx.push(FieldError::forbidden(&at.child("sizeLimit"), detail));
                }
            }
            "hostPath" => {
                let host_path = str_of(body, "path").unwrap_or_default();
                if host_path.is_empty() {
                    cx.push(FieldError::required(&at.child("path"), ""));
                } else {
                    no_backsteps(cx, host_path, &at.child("path"));
                }
                if let Some(kind) = str_of(body, "type") {
                    cx.rule(&at.child("type"), kind, Rule::OneOf(HOST_PATH_TYPES));
                }
            }
            "secret" | "configMap" => {
                let name_field = if source == "secret" { "secretName" } else { "name" };
                if str_of(body, name_field).is_none_or(str::is_empty) {
                    cx.push(FieldError::required(&at.child(name_field), ""));
                }
                file_mode(cx, body, "defaultMode", &at);
                key_to_paths(cx, body, &at);
            }
            "downwardAPI" => {
                file_mode(cx, body, "defaultMode", &at);
                // The API server reports these files at the source's own path, without their index.
                for (i, file) in items(body.get("items")).iter().enumerate() {
                    downward_api_file(cx, file, &at, &at.child("items").index(i));
                }
            }
            "projected" => projected(cx, body, &at),
            "persistentVolumeClaim" if str_of(body, "claimName").is_none_or(str::is_empty) => {
                cx.push(FieldError::required(&at.child("claimName"), ""));
            }
            "csi" => {
                let driver = str_of(body, "driver").unwrap_or_default();
                if driver.is_empty() {
                    cx.push(FieldError::required(&at.child("driver"), ""));
                } else {
                    cx.rule(&at.child("driver"), driver, Rule::Dns1123Subdomain);
                }
            }
            _ => {}
        }
    }
}

fn key_to_paths(cx: &mut Cx, body: &J, path: &FieldPath) {
    for (i, item) in items(body.get("items")).iter().enumerate() {
        let at = path.child("items").index(i);
        if str_of(item, "key").is_none_or(str::is_empty) {
            cx.push(FieldError::required(&at.child("key"), ""));
        }
        let file = str_of(item, "path").unwrap_or_default();
        if file.is_empty() {
            cx.push(FieldError::required(&at.child("path"), ""));
        }
        cx.rule(&at.child("path"), file, Rule::NonReservedPath);
        file_mode(cx, item, "mode", &at);
    }
}

/// A downward API file, reported at `path`; `item` is where it sits (its rendered leaves' rules are recorded
/// there).
fn downward_api_file(cx: &mut Cx, file: &J, path: &FieldPath, item: &FieldPath) {
    let target = str_of(file, "path").unwrap_or_default();
    if target.is_empty() {
        cx.push(FieldError::required(&path.child("path"), ""));
    }
    cx.rule_leaf(&path.child("path"), &item.child("path"), target, Rule::NonReservedPath);
    match (file.get("fieldRef").filter(|f| f.is_object()), file.get("resourceFieldRef").filter(|f| f.is_object())) {
        (Some(field_ref), resource) => {
            object_field_selector(cx, field_ref, VOLUME_FIELD_PATHS, &path.child("fieldRef"));
            if resource.is_some() {
                let detail = "fieldRef and resourceFieldRef can not be specified simultaneously";
                cx.push(FieldError::invalid(path, "resource", detail));
            }
        }
        (None, Some(resource)) => resource_field_selector(cx, resource, true, &path.child("resourceFieldRef")),
        (None, None) => cx.push(FieldError::required(path, "one of fieldRef and resourceFieldRef is required")),
    }
    file_mode(cx, file, "mode", path);
}

fn projected(cx: &mut Cx, body: &J, path: &FieldPath) {
    file_mode(cx, body, "defaultMode", path);
    let mut paths = HashSet::new();
    for (i, source) in items(body.get("sources")).iter().enumerate() {
        let at = path.child("sources").index(i);
        let mut count = 0;
        for kind in ["secret", "configMap", "downwardAPI", "serviceAccountToken", "clusterTrustBundle"] {
            let Some(projection) = source.get(kind).filter(|p| p.is_object()) else { continue };
            count += 1;
            let here = at.child(kind);
            match kind {
                "secret" | "configMap" => {
                    if str_of(projection, "name").is_none_or(str::is_empty) {
                        cx.push(FieldError::required(&here.child("name"), ""));
                    }
                    key_to_paths(cx, projection, &here);
                }
                "downwardAPI" => {
                    for (i, file) in items(projection.get("items")).iter().enumerate() {
                        downward_api_file(cx, file, &here, &here.child("items").index(i));
                    }
                }
                "serviceAccountToken" => {
                    if let Some(seconds) = int_of(projection, "expirationSeconds") {
                        if seconds < 600 {
                            let detail = "may not specify a duration less than 10 minutes";
                            cx.push(FieldError::invalid(&here.child("expirationSeconds"), seconds, detail));
                        }
                        if seconds > 1 << 32 {
                            let detail = "may not specify a duration larger than 2^32 seconds";
                            cx.push(FieldError::invalid(&here.child("expirationSeconds"), seconds, detail));
                        }
                    }
                    if str_of(projection, "path").is_none_or(str::is_empty) {
                        cx.push(FieldError::required(&here.child("path"), ""));
                    }
                }
                _ => {}
            }
            let mut targets: Vec<&str> =
                items(projection.get("items")).iter().filter_map(|i| str_of(i, "path")).collect();
            targets.extend(str_of(projection, "path"));
            for target in targets {
                if !paths.insert(target) {
                    cx.push(FieldError::invalid(&here, target, "conflicting duplicate paths"));
                }
            }
        }
        if count > 1 {
            cx.push(FieldError::forbidden(&at, "may not specify more than 1 volume type"));
        }
    }
}

fn file_mode(cx: &mut Cx, object: &J, field: &'static str, path: &FieldPath) {
    if let Some(mode) = int_of(object, field)
        && !(0..=0o777).contains(&mode)
    {
        cx.push(FieldError::invalid(&path.child(field), mode, FILE_MODE));
    }
}

/// A list of containers (or init containers), the names of earlier lists in `names`.
/// What the pod decides for each of its containers' checks.
struct PodScope<'j> {
    /// The pod's valid volumes, by name (see [`volumes`]).
    volumes: HashSet<&'j str>,
    host_network: bool,
    /// `restartPolicy: Never`: a container may then only be resized in place without a restart.
    never_restarts: bool,
}

fn container_list<'j>(
    cx: &mut Cx,
    containers: &'j [J],
    init: bool,
    scope: &PodScope<'_>,
    names: &mut HashSet<&'j str>,
    path: &FieldPath,
) {
    for (i, c) in containers.iter().enumerate() {
        let at = path.index(i);
        let name = str_of(c, "name").unwrap_or_default();
        if name.is_empty() {
            cx.push(FieldError::required(&at.child("name"), ""));
        } else {
            cx.rule(&at.child("name"), name, Rule::Dns1123Label);
        }
        if !names.insert(name) {
            cx.push(FieldError::duplicate(&at.child("name"), name));
        }
        container(cx, c, init, scope, &at);
    }
    if init {
        // Init containers run one after the other, so only ports within one of them can collide.
        for (i, c) in containers.iter().enumerate() {
            let mut seen = HashSet::new();
            host_ports_of(cx, c, scope.host_network, &path.index(i), &mut seen);
        }
    }
}

fn container(cx: &mut Cx, c: &J, init: bool, scope: &PodScope<'_>, path: &FieldPath) {
    let image = str_of(c, "image").unwrap_or_default();
    if image.is_empty() {
        cx.push(FieldError::required(&path.child("image"), ""));
    }
    // `validateContainersOnlyForPod`: a pod's (not a pod template's) images, regular and init.
    cx.rule(&path.child("image"), image, Rule::Image);
    let sidecar = restart_policy(cx, c, init, path);
    // Init containers run to completion, so they have no probes and no hooks; native sidecars do.
    let runs_alongside = !init || sidecar;
    if let Some(lifecycle) = c.get("lifecycle").filter(|l| l.is_object()) {
        if runs_alongside {
            for hook in LIFECYCLE_HOOKS {
                if let Some(handler) = lifecycle.get(hook).filter(|h| h.is_object()) {
                    handler_of(cx, handler, LIFECYCLE_HANDLERS, &path.child("lifecycle").child(hook));
                }
            }
        } else {
            cx.push(FieldError::invalid(&path.child("lifecycle"), "lifecycle", NOT_FOR_INIT));
        }
    }
    for probe in PROBES {
        let Some(body) = c.get(probe).filter(|p| p.is_object()) else { continue };
        let at = path.child(probe);
        if !runs_alongside {
            cx.push(FieldError::invalid(&at, probe, NOT_FOR_INIT));
            continue;
        }
        handler_of(cx, body, PROBE_HANDLERS, &at);
        for number in ["initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold"]
        {
            if let Some(n) = int_of(body, number)
                && n < 0
            {
                cx.push(FieldError::invalid(&at.child(number), n, "must be greater than or equal to 0"));
            }
        }
        // A zero threshold is defaulted to 1; liveness and startup probes succeed once, by definition.
        let success = int_of(body, "successThreshold").filter(|n| *n != 0).unwrap_or(1);
        if probe != "readinessProbe" && success != 1 {
            cx.push(FieldError::invalid(&at.child("successThreshold"), success, "must be 1"));
        }
    }
    if let Some(policy) = str_of(c, "terminationMessagePolicy").filter(|p| !p.is_empty())
        && !matches!(policy, "File" | "FallbackToLogsOnError")
    {
        let detail = "must be 'File' or 'FallbackToLogsOnError'";
        cx.push(FieldError::invalid(&path.child("terminationMessagePolicy"), policy, detail));
    }
    ports(cx, items(c.get("ports")), &path.child("ports"));
    env(cx, items(c.get("env")), &path.child("env"));
    env_from(cx, items(c.get("envFrom")), &path.child("envFrom"));
    volume_mounts(cx, c, &scope.volumes, &path.child("volumeMounts"));
    if let Some(policy) = str_of(c, "imagePullPolicy").filter(|p| !p.is_empty()) {
        cx.rule(&path.child("imagePullPolicy"), policy, Rule::OneOf(PULL_POLICIES));
    }
    if let Some(resources) = c.get("resources").filter(|r| r.is_object()) {
        resource_requirements(cx, resources, &path.child("resources"));
    }
    if RESIZE_POLICY.kept_at(cx.version.minor) {
        let policies = items(c.get("resizePolicy"));
        resize_policy(cx, policies, init && !sidecar, scope.never_restarts, &path.child("resizePolicy"));
    }
    if let Some(context) = c.get("securityContext").filter(|s| s.is_object()) {
        security_context(cx, context, &path.child("securityContext"));
    }
}

const RESIZE_RESOURCES: &[&str] = &["cpu", "memory"];
const RESIZE_RESTART_POLICIES: &[&str] = &["NotRequired", "RestartContainer"];

/// `validateResizePolicy` and the init containers' part of `validateInitContainers`: how a container is resized in
/// place (GA in 1.35), each resource once. An init container that runs to completion is never restarted for it,
/// and nor is any container of a pod that never restarts.
fn resize_policy(cx: &mut Cx, policies: &[J], run_to_completion: bool, never_restarts: bool, path: &FieldPath) {
    let mut seen = HashSet::new();
    for (i, policy) in policies.iter().enumerate() {
        let at = path.index(i);
        let resource = str_of(policy, "resourceName").unwrap_or_default();
        if !seen.insert(resource) {
            cx.push(FieldError::duplicate(&at, resource));
        }
        match resource {
            "" => cx.push(FieldError::required(path, "")),
            _ => {
                cx.rule_leaf(path, &at.child("resourceName"), resource, Rule::OneOf(RESIZE_RESOURCES));
            }
        }
        let restart = str_of(policy, "restartPolicy").unwrap_or_default();
        match restart {
            "" => cx.push(FieldError::required(path, "")),
            _ => {
                cx.rule_leaf(path, &at.child("restartPolicy"), restart, Rule::OneOf(RESIZE_RESTART_POLICIES));
            }
        }
        if never_restarts && restart != "NotRequired" {
            cx.push(FieldError::invalid(path, restart, "must be 'NotRequired' when pod `restartPolicy` is 'Never'"));
        }
        if run_to_completion && restart == "RestartContainer" {
            let detail = "must not be set to 'RestartContainer' for non-sidecar initContainers";
            cx.push(FieldError::invalid(&at.child("restartPolicy"), restart, detail));
        }
    }
}

/// A container's `restartPolicy`: only init containers have one, only `Always` (a native sidecar), and only from
/// Kubernetes 1.29 (1.28 behind the SidecarContainers gate). Returns whether this is a native sidecar (an init
/// container that keeps running).
fn restart_policy(cx: &mut Cx, c: &J, init: bool, path: &FieldPath) -> bool {
    let Some(policy) = str_of(c, "restartPolicy") else { return false };
    let at = path.child("restartPolicy");
    if !cx.version.at_least(29) {
        let detail = format!(
            "a container's restartPolicy (a native sidecar) needs Kubernetes 1.29 or later (1.28 with the \
             SidecarContainers feature gate); the target version is {}",
            cx.version
        );
        cx.push(FieldError::forbidden(&at, detail));
        return false;
    }
    if !init {
        cx.push(FieldError::forbidden(&at, "may not be set for non-init containers"));
        return false;
    }
    cx.rule(&at, policy, Rule::OneOf(SIDECAR_RESTART));
    policy == "Always"
}

/// A probe or lifecycle hook: exactly one of `handlers`, each valid.
fn handler_of(cx: &mut Cx, body: &J, handlers: &[&'static str], path: &FieldPath) {
    let mut count = 0;
    let mut too_new = false;
    for &kind in handlers.iter().filter(|h| is_set(body, h)) {
        let at = path.child(kind);
        if let Some(since) = handler_since(kind)
            && !cx.version.at_least(since)
        {
            let detail =
                format!("the {kind} handler needs Kubernetes 1.{since} or later; the target version is {}", cx.version);
            cx.push(FieldError::forbidden(&at, detail));
            too_new = true;
            continue;
        }
        if count > 0 {
            cx.push(FieldError::forbidden(&at, "may not specify more than 1 handler type"));
            continue;
        }
        count += 1;
        let action = &body[kind];
        match kind {
            "exec" if items(action.get("command")).is_empty() => {
                cx.push(FieldError::required(&at.child("command"), ""));
            }
            "httpGet" => {
                port_number_or_name(cx, action.get("port"), &at.child("port"));
                if let Some(scheme) = str_of(action, "scheme").filter(|s| !s.is_empty()) {
                    cx.rule(&at.child("scheme"), scheme, Rule::OneOf(HTTP_SCHEMES));
                }
                let headers = at.child("httpHeaders");
                for (i, header) in items(action.get("httpHeaders")).iter().enumerate() {
                    let name = str_of(header, "name").unwrap_or_default();
                    // Reported at the list, as the API server does; each name is its own leaf.
                    cx.rule_leaf(&headers, &headers.index(i).child("name"), name, Rule::HttpHeaderName);
                }
            }
            "tcpSocket" => port_number_or_name(cx, action.get("port"), &at.child("port")),
            "grpc" => {
                let port = int_of(action, "port").unwrap_or(0);
                for message in super::names::port_num(port) {
                    cx.push(FieldError::invalid(&at.child("port"), port, message));
                }
            }
            "sleep" => {
                let seconds = int_of(action, "seconds").unwrap_or(0);
                // Zero became valid with PodLifecycleSleepActionAllowZero, on by default from 1.33.
                let least = if cx.version.at_least(33) { 0 } else { 1 };
                if seconds < least {
                    let detail = if least == 0 { "must be non-negative" } else { "must be greater than 0" };
                    cx.push(FieldError::invalid(&at.child("seconds"), seconds, detail));
                }
            }
            _ => {}
        }
    }
    if count == 0 && !too_new {
        cx.push(FieldError::required(path, "must specify a handler type"));
    }
}

/// The first Kubernetes minor version whose API server knows a handler, for those newer than 1.20.
fn handler_since(kind: &str) -> Option<u32> {
    match kind {
        "grpc" => Some(24),
        "sleep" => Some(30),
        _ => None,
    }
}

fn port_number_or_name(cx: &mut Cx, port: Option<&J>, path: &FieldPath) {
    match port {
        Some(J::String(name)) => {
            cx.rule(path, name, Rule::PortName);
        }
        Some(number) => {
            let number = number.as_i64().unwrap_or(0);
            for message in super::names::port_num(number) {
                cx.push(FieldError::invalid(path, number, message));
            }
        }
        None => {
            for message in super::names::port_num(0) {
                cx.push(FieldError::invalid(path, 0, message));
            }
        }
    }
}

fn ports(cx: &mut Cx, ports: &[J], path: &FieldPath) {
    let mut names = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let at = path.index(i);
        if let Some(name) = str_of(port, "name").filter(|n| !n.is_empty()) {
            if !cx.rule(&at.child("name"), name, Rule::PortName) {
                // Invalid names are not counted as taken, as in the API server.
            } else if !names.insert(name) {
                cx.push(FieldError::duplicate(&at.child("name"), name));
            }
        }
        match int_of(port, "containerPort").unwrap_or(0) {
            0 => cx.push(FieldError::required(&at.child("containerPort"), "")),
            number => {
                for message in super::names::port_num(number) {
                    cx.push(FieldError::invalid(&at.child("containerPort"), number, message));
                }
            }
        }
        if let Some(host) = int_of(port, "hostPort").filter(|p| *p != 0) {
            for message in super::names::port_num(host) {
                cx.push(FieldError::invalid(&at.child("hostPort"), host, message));
            }
        }
        if let Some(protocol) = str_of(port, "protocol").filter(|p| !p.is_empty()) {
            cx.rule(&at.child("protocol"), protocol, Rule::OneOf(PROTOCOLS));
        }
    }
}

/// Host ports across the pod's regular containers: one protocol, address and port may be taken once. Under
/// `hostNetwork` a port without a `hostPort` takes its `containerPort` (the API server's default).
fn host_ports(cx: &mut Cx, containers: &[J], host_network: bool, path: &FieldPath) {
    let mut seen = HashSet::new();
    for (i, c) in containers.iter().enumerate() {
        host_ports_of(cx, c, host_network, &path.index(i), &mut seen);
    }
}

fn host_ports_of(cx: &mut Cx, c: &J, host_network: bool, path: &FieldPath, seen: &mut HashSet<String>) {
    for (i, port) in items(c.get("ports")).iter().enumerate() {
        let Some(host) = pod_wide::host_port(port, host_network) else { continue };
        let protocol = str_of(port, "protocol").filter(|p| !p.is_empty()).unwrap_or("TCP");
        let key = format!("{protocol}/{}/{host}", str_of(port, "hostIP").unwrap_or_default());
        if !seen.insert(key.clone()) {
            cx.push(FieldError::duplicate(&path.child("ports").index(i).child("hostPort"), key.as_str()));
        }
    }
}

fn env(cx: &mut Cx, vars: &[J], path: &FieldPath) {
    for (i, var) in vars.iter().enumerate() {
        let at = path.index(i);
        let name = str_of(var, "name").unwrap_or_default();
        if name.is_empty() {
            cx.push(FieldError::required(&at.child("name"), ""));
        } else {
            let rule = if cx.version.at_least(32) { Rule::EnvVarNameRelaxed } else { Rule::EnvVarName };
            cx.rule(&at.child("name"), name, rule);
        }
        let Some(from) = var.get("valueFrom").filter(|v| !v.is_null()) else { continue };
        let from_path = at.child("valueFrom");
        let mut sources = 0;
        for &source in ENV_VAR_SOURCES.iter().filter(|s| is_set(from, s)) {
            sources += 1;
            let selector = &from[source];
            let here = from_path.child(source);
            match source {
                "fieldRef" => object_field_selector(cx, selector, ENV_FIELD_PATHS, &here),
                "resourceFieldRef" => resource_field_selector(cx, selector, false, &here),
                "configMapKeyRef" | "secretKeyRef" => {
                    // `ValidateSecretName` (a DNS subdomain) for both, so an empty name breaks it too.
                    cx.rule(&here.child("name"), str_of(selector, "name").unwrap_or_default(), Rule::Dns1123Subdomain);
                    match str_of(selector, "key").filter(|k| !k.is_empty()) {
                        Some(key) => {
                            cx.rule(&here.child("key"), key, Rule::ConfigMapKey);
                        }
                        None => cx.push(FieldError::required(&here.child("key"), "")),
                    }
                }
                _ => {}
            }
        }
        if sources == 0 {
            let detail = "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`";
            cx.push(FieldError::invalid(&from_path, "", detail));
        } else if str_of(var, "value").is_some_and(|v| !v.is_empty()) {
            cx.push(FieldError::invalid(&from_path, "", "may not be specified when `value` is not empty"));
        } else if sources > 1 {
            cx.push(FieldError::invalid(&from_path, "", "may not have more than one field specified at a time"));
        }
    }
}

fn env_from(cx: &mut Cx, sources: &[J], path: &FieldPath) {
    for (i, source) in sources.iter().enumerate() {
        let at = path.index(i);
        if let Some(prefix) = str_of(source, "prefix").filter(|p| !p.is_empty()) {
            let rule = if cx.version.at_least(32) { Rule::EnvVarNameRelaxed } else { Rule::EnvVarName };
            cx.rule(&at.child("prefix"), prefix, rule);
        }
        let mut count = 0;
        for kind in ["configMapRef", "secretRef"] {
            let Some(reference) = source.get(kind).filter(|r| r.is_object()) else { continue };
            count += 1;
            if count > 1 {
                cx.push(FieldError::forbidden(&at.child(kind), "may not have more than one field specified at a time"));
            }
            match str_of(reference, "name").filter(|n| !n.is_empty()) {
                Some(name) => {
                    cx.rule(&at.child(kind).child("name"), name, Rule::Dns1123Subdomain);
                }
                None => cx.push(FieldError::required(&at.child(kind).child("name"), "")),
            }
        }
        if count == 0 {
            cx.push(FieldError::invalid(&at, "", "must specify one of: `configMapRef` or `secretRef`"));
        }
    }
}

/// A `fieldRef`: the API version (defaulted to v1) and a field path the API server can convert and `allowed` has.
fn object_field_selector(cx: &mut Cx, selector: &J, allowed: &[&str], path: &FieldPath) {
    let version = str_of(selector, "apiVersion").filter(|v| !v.is_empty()).unwrap_or("v1");
    let field_path = str_of(selector, "fieldPath").unwrap_or_default();
    if field_path.is_empty() {
        cx.push(FieldError::required(&path.child("fieldPath"), ""));
        return;
    }
    let converted = if version != "v1" {
        Err(format!("unsupported pod version: {version}"))
    } else if let Some((base, subscript)) = split_subscript(field_path) {
        match base {
            "metadata.annotations" | "metadata.labels" => Ok(Some((base, subscript))),
            _ => Err(format!("field label does not support subscript: {field_path}")),
        }
    } else if field_path == "status.hostIPs" && !cx.version.at_least(29) {
        // PodHostIPs: on by default from 1.29.
        Err(format!("field label not supported: {field_path}"))
    } else if FIELD_LABELS.contains(&field_path) || field_path == "spec.host" {
        Ok(None)
    } else {
        Err(format!("field label not supported: {field_path}"))
    };
    match converted {
        Err(reason) => {
            let detail = format!("error converting fieldPath: {reason}");
            cx.push(FieldError::invalid(&path.child("fieldPath"), field_path, detail));
        }
        Ok(Some((base, subscript))) => {
            // Subscripted paths name one label or annotation: its key must be a qualified name.
            let key = if base == "metadata.annotations" { subscript.to_lowercase() } else { subscript.to_owned() };
            cx.rule_as(path, &key, subscript, Rule::QualifiedName);
        }
        Ok(None) => {
            let field_path = if field_path == "spec.host" { "spec.nodeName" } else { field_path };
            if !allowed.contains(&field_path) {
                cx.push(FieldError::not_supported(&path.child("fieldPath"), field_path, allowed));
            }
        }
    }
}

/// `metadata.labels['app']` as `("metadata.labels", "app")`.
fn split_subscript(path: &str) -> Option<(&str, &str)> {
    let inner = path.strip_suffix("']")?;
    let (base, subscript) = inner.split_once("['")?;
    Some((base, subscript))
}

fn resource_field_selector(cx: &mut Cx, selector: &J, volume: bool, path: &FieldPath) {
    let resource = str_of(selector, "resource").unwrap_or_default();
    if volume && str_of(selector, "containerName").is_none_or(str::is_empty) {
        cx.push(FieldError::required(&path.child("containerName"), ""));
    } else if resource.is_empty() {
        cx.push(FieldError::required(&path.child("resource"), ""));
    } else if !(RESOURCE_FIELD_PATHS.contains(&resource)
        || resource.starts_with("requests.hugepages-")
        || resource.starts_with("limits.hugepages-"))
    {
        cx.push(FieldError::not_supported(&path.child("resource"), resource, RESOURCE_FIELD_PATHS));
    }
    let Some(divisor) = selector.get("divisor").and_then(|d| quantity::from_json(d).ok()) else { return };
    if divisor.is_zero() {
        return;
    }
    let one = |text: &str| quantity::parse(text).is_ok_and(|q| q == divisor);
    let (allowed, detail): (&[&str], &str) = if resource.ends_with(".cpu") {
        (&["1m", "1"], "only divisor's values 1m and 1 are supported with the cpu resource")
    } else if resource.ends_with(".memory") || resource.ends_with(".ephemeral-storage") {
        let what = if resource.ends_with(".memory") { "memory" } else { "local ephemeral storage" };
        let detail = match what {
            "memory" => {
                "only divisor's values 1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei are supported with the memory resource"
            }
            _ => {
                "only divisor's values 1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei are supported with the local ephemeral storage resource"
            }
        };
        (&["1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei"], detail)
    } else {
        return;
    };
    if !allowed.iter().any(|a| one(a)) {
        cx.push(FieldError::invalid(&path.child("divisor"), resource, detail));
    }
}

fn volume_mounts(cx: &mut Cx, c: &J, volumes: &HashSet<&str>, path: &FieldPath) {
    let devices: HashMap<&str, &str> = items(c.get("volumeDevices"))
        .iter()
        .map(|d| (str_of(d, "name").unwrap_or_default(), str_of(d, "devicePath").unwrap_or_default()))
        .collect();
    let mut mount_points = HashSet::new();
    for (i, mount) in items(c.get("volumeMounts")).iter().enumerate() {
        let at = path.index(i);
        let name = str_of(mount, "name").unwrap_or_default();
        if name.is_empty() {
            cx.push(FieldError::required(&at.child("name"), ""));
        }
        if !volumes.contains(name) {
            cx.push(FieldError::not_found(&at.child("name"), name));
        }
        let mount_path = str_of(mount, "mountPath").unwrap_or_default();
        if mount_path.is_empty() {
            cx.push(FieldError::required(&at.child("mountPath"), ""));
        }
        if !mount_points.insert(mount_path) {
            cx.push(FieldError::invalid(&at.child("mountPath"), mount_path, "must be unique"));
        }
        if devices.contains_key(name) {
            cx.push(FieldError::invalid(&at.child("name"), name, "must not already exist in volumeDevices"));
        }
        if devices.values().any(|p| *p == mount_path) {
            let detail = "must not already exist as a path in volumeDevices";
            cx.push(FieldError::invalid(&at.child("mountPath"), mount_path, detail));
        }
        let sub_path = str_of(mount, "subPath").unwrap_or_default();
        if !sub_path.is_empty() {
            // The API server reports sub paths at the list's path, without the index.
            cx.rule_leaf(&path.child("subPath"), &at.child("subPath"), sub_path, Rule::RelativePath);
        }
        if let Some(expr) = str_of(mount, "subPathExpr").filter(|e| !e.is_empty()) {
            if !sub_path.is_empty() {
                let detail = "subPathExpr and subPath are mutually exclusive";
                cx.push(FieldError::invalid(&at.child("subPathExpr"), expr, detail));
            }
            cx.rule_leaf(&path.child("subPathExpr"), &at.child("subPathExpr"), expr, Rule::RelativePath);
        }
        let propagation = str_of(mount, "mountPropagation");
        if let Some(propagation) = propagation
            && cx.rule(&path.child("mountPropagation"), propagation, Rule::OneOf(MOUNT_PROPAGATIONS))
            && propagation == "Bidirectional"
            && c.get("securityContext").and_then(|s| s.get("privileged")).and_then(J::as_bool) != Some(true)
        {
            let detail = "Bidirectional mount propagation is available only to privileged containers";
            cx.push(FieldError::forbidden(&path.child("mountPropagation"), detail));
        }
        recursive_read_only(cx, mount, propagation, &path.child("recursiveReadOnly"));
    }
}

fn no_backsteps(cx: &mut Cx, target: &str, path: &FieldPath) {
    if target.split('/').any(|part| part == "..") {
        cx.push(FieldError::invalid(path, target, "must not contain '..'"));
    }
}

/// `validateMountRecursiveReadOnly` (from the release that keeps the field): `Enabled` and `IfPossible` need a
/// read-only mount without propagation.
fn recursive_read_only(cx: &mut Cx, mount: &J, propagation: Option<&str>, at: &FieldPath) {
    let Some(mode) = str_of(mount, "recursiveReadOnly") else { return };
    if !cx.rule(at, mode, Rule::OneOf(&["Disabled", "Enabled", "IfPossible"])) || mode == "Disabled" {
        return;
    }
    if mount.get("readOnly").and_then(J::as_bool) != Some(true) {
        cx.push(FieldError::forbidden(at, "may only be specified when readOnly is true"));
    }
    if propagation.is_some_and(|p| p != "None") {
        cx.push(FieldError::forbidden(at, "may only be specified when mountPropagation is None or not specified"));
    }
}

/// `ValidateResourceRequirements` for a pod's container, after the API server's default: a resource limited but
/// not requested is requested at its limit.
fn resource_requirements(cx: &mut Cx, resources: &J, path: &FieldPath) {
    let limits_path = path.child("limits");
    let requests_path = path.child("requests");
    let limits_map = object(resources.get("limits"));
    let limits = quantities(cx, limits_map, &limits_path);
    // A pod's container requests what it limits unless it says otherwise (the API server's default).
    let mut requested = object(resources.get("requests")).cloned().unwrap_or_default();
    for (name, limit) in limits_map.into_iter().flatten() {
        requested.entry(name.clone()).or_insert_with(|| limit.clone());
    }
    let requests = quantities(cx, Some(&requested), &requests_path);
    let compute = |name: &str| name == "cpu" || name == "memory";
    let has_compute = limits.keys().chain(requests.keys()).any(|n| compute(n));
    let has_huge_pages = limits.keys().chain(requests.keys()).any(|n| n.starts_with("hugepages-"));
    for (name, (request, text)) in &requests {
        match limits.get(name).map(|(limit, _)| limit) {
            Some(limit) if !overcommit_allowed(name) && request != limit => {
                let detail = format!("must be equal to {name} limit");
                cx.push(FieldError::invalid(&requests_path, text.as_str(), detail));
            }
            Some(limit) if request > limit => {
                let detail = format!("must be less than or equal to {name} limit");
                cx.push(FieldError::invalid(&requests_path, text.as_str(), detail));
            }
            Some(_) => {}
            None if !overcommit_allowed(name) => {
                cx.push(FieldError::required(&limits_path, "Limit must be set for non overcommitable resources"));
            }
            None => {}
        }
    }
    if !has_compute && has_huge_pages {
        cx.push(FieldError::forbidden(path, "HugePages require cpu or memory"));
    }
}

/// The first release whose API server enables pod-level resources (`spec.resources`) by default (beta).
const POD_LEVEL_RESOURCES_MINOR: u32 = 34;

/// `validatePodResourceConsistency`: the pod's requests (`spec.resources.requests`) hold what its containers
/// request together (the API server's `AggregateContainerRequests`: the regular containers and the native sidecars
/// together, or an init container with the sidecars started before it, whichever is more), and no container
/// limits more than the pod's limit (`spec.resources.limits`) of the same resource. Requests are defaulted from
/// limits, as the API server does first.
pub(super) fn pod_resources(cx: &mut Cx, spec: &J, path: &FieldPath) {
    let Some(pod) = spec.get("resources").filter(|r| r.is_object()) else { return };
    if !cx.version.at_least(POD_LEVEL_RESOURCES_MINOR) {
        return;
    }
    let nanos = |map: Option<&Map<String, J>>| -> HashMap<String, u128> {
        let parsed =
            map.into_iter().flatten().filter_map(|(name, value)| Some((name, quantity::from_json(value).ok()?)));
        parsed.map(|(name, q)| (name.clone(), q.saturating_nanos())).collect()
    };
    let requests_of = |container: &J| {
        let resources = container.get("resources");
        let mut requested = nanos(resources.and_then(|r| object(r.get("limits"))));
        requested.extend(nanos(resources.and_then(|r| object(r.get("requests")))));
        requested
    };
    let add = |sum: &mut HashMap<String, u128>, more: &HashMap<String, u128>| {
        for (name, value) in more {
            let total = sum.entry(name.clone()).or_default();
            *total = total.saturating_add(*value);
        }
    };
    let (mut sidecars, mut init_peak) = (HashMap::new(), HashMap::<String, u128>::new());
    for init in items(spec.get(INIT_CONTAINERS)) {
        if str_of(init, "restartPolicy") == Some("Always") {
            add(&mut sidecars, &requests_of(init));
        } else {
            let mut running = sidecars.clone();
            add(&mut running, &requests_of(init));
            for (name, value) in running {
                let peak = init_peak.entry(name).or_default();
                *peak = (*peak).max(value);
            }
        }
    }
    let mut aggregate = sidecars;
    for container in items(spec.get(CONTAINERS)) {
        add(&mut aggregate, &requests_of(container));
    }
    for (name, peak) in init_peak {
        let total = aggregate.entry(name).or_default();
        *total = (*total).max(peak);
    }
    let at = path.child("resources");
    for (name, value) in object(pod.get("requests")).into_iter().flatten() {
        let Ok(limit) = quantity::from_json(value) else { continue };
        let needed = aggregate.get(name).copied().unwrap_or(0);
        if needed > limit.saturating_nanos() {
            let text = value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string());
            let detail =
                format!("must be greater than or equal to aggregate container requests of {}", show_nanos(needed));
            cx.push(FieldError::invalid(&at.child("requests").key(name), text.as_str(), detail));
        }
    }
    let pod_limits = nanos(object(pod.get("limits")));
    if cx.version.at_least(POD_REQUESTS_DEFAULTED_AFTER_ADMISSION_MINOR) {
        defaulted_requests_within_limits(cx, pod, &aggregate, &pod_limits, &at);
    }
    for (i, container) in items(spec.get(CONTAINERS)).iter().enumerate() {
        let limits = container.get("resources").and_then(|r| object(r.get("limits")));
        for (name, value) in limits.into_iter().flatten() {
            let (Some(pod_limit), Ok(limit)) = (pod_limits.get(name), quantity::from_json(value)) else { continue };
            if limit.saturating_nanos() > *pod_limit {
                let text = value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string());
                let field = path.child(CONTAINERS).index(i).child("resources").child("limits").key(name);
                let detail = format!("must be less than or equal to pod limits of {}", show_nanos(*pod_limit));
                cx.push(FieldError::invalid(&field, text.as_str(), detail));
            }
        }
    }
}

/// The first release that defaults the pod's requests after the admission webhooks (`PodLevelResourcesFixDefaulting`,
/// beta and on in 1.37: `DefaultPodLevelResources` in the pod strategy's `PrepareForCreate`) rather than when it
/// decodes the request, so a webhook sees no defaulted pod-level requests, and the containers it adds count in them.
const POD_REQUESTS_DEFAULTED_AFTER_ADMISSION_MINOR: u32 = 37;

/// `defaultPodLevelRequests`, then `validatePodResourceRequirements`' "request <= limit" for what it defaulted: a
/// pod-level request the pod leaves out becomes its containers' aggregate request (CPU and memory) or else its
/// pod-level limit, and must not exceed that limit. Requests the pod sets are judged as written elsewhere.
fn defaulted_requests_within_limits(
    cx: &mut Cx,
    pod: &J,
    aggregate: &HashMap<String, u128>,
    pod_limits: &HashMap<String, u128>,
    at: &FieldPath,
) {
    let explicit = object(pod.get("requests"));
    let set = |name: &str| explicit.is_some_and(|requests| requests.contains_key(name));
    for (name, limit) in pod_limits {
        let overcommittable = name == "cpu" || name == "memory";
        if set(name) || !overcommittable {
            continue; // hugepages default to their limit, which they then equal
        }
        let Some(&defaulted) = aggregate.get(name) else { continue };
        if defaulted > *limit {
            let detail = format!("must be less than or equal to {name} limit of {}", show_nanos(*limit));
            cx.push(FieldError::invalid(&at.child("requests"), show_nanos(defaulted).as_str(), detail));
        }
    }
}

/// A quantity counted in nano units, written in the largest unit that holds it whole (`250m`, `2`, `67108864`).
fn show_nanos(nanos: u128) -> String {
    const NANOS_PER_UNIT: u128 = 1_000_000_000;
    match nanos {
        u128::MAX => "more than any quantity".to_owned(),
        n if n % NANOS_PER_UNIT == 0 => (n / NANOS_PER_UNIT).to_string(),
        n if n % 1_000_000 == 0 => format!("{}m", n / 1_000_000),
        n => format!("{n}n"),
    }
}

/// The valid quantities of a `limits` or `requests` map, with their text, by resource name; an error for each
/// invalid one.
fn quantities(cx: &mut Cx, map: Option<&Map<String, J>>, path: &FieldPath) -> HashMap<String, (Quantity, String)> {
    let mut out = HashMap::new();
    for (name, value) in map.into_iter().flatten() {
        let at = path.key(name);
        resource_name(cx, name, &at);
        let text = value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string());
        match quantity::from_json(value) {
            Err(e) => cx.push(FieldError::invalid(&at, text.as_str(), e.to_string())),
            Ok(q) => {
                if q.is_negative() {
                    cx.push(FieldError::invalid(&at, text.as_str(), "must be greater than or equal to 0"));
                } else if integer_resource(name) && !q.is_integer() {
                    cx.push(FieldError::invalid(&at, text.as_str(), "must be an integer"));
                }
                out.insert(name.clone(), (q, text));
            }
        }
        // The leaf rule records that a string rendered here must be a non-negative quantity.
        cx.record(&at, Rule::Quantity);
    }
    out
}

/// `validateContainerResourceName`: a standard container resource, or an extended resource's qualified name.
fn resource_name(cx: &mut Cx, name: &str, path: &FieldPath) {
    if !cx.rule_as(path, name, name, Rule::QualifiedName) {
        return;
    }
    if !name.contains('/') {
        if !matches!(name, "cpu" | "memory" | "ephemeral-storage") && !name.starts_with("hugepages-") {
            cx.push(FieldError::invalid(path, name, "must be a standard resource for containers"));
        }
    } else if !native_resource(name)
        && (name.starts_with("requests.") || !super::names::qualified_name(&format!("requests.{name}")).is_empty())
    {
        cx.push(FieldError::invalid(path, name, "doesn't follow extended resource name standard"));
    }
}

/// In the `kubernetes.io/` namespace (or unqualified).
fn native_resource(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

fn overcommit_allowed(name: &str) -> bool {
    native_resource(name) && !name.starts_with("hugepages-")
}

/// Extended resources are counted in whole units.
fn integer_resource(name: &str) -> bool {
    !native_resource(name)
}

fn security_context(cx: &mut Cx, context: &J, path: &FieldPath) {
    ids(cx, context, path);
    if let Some(options) = context.get("windowsOptions").filter(|o| o.is_object()) {
        pod_wide::windows_options(cx, options, &path.child("windowsOptions"));
    }
    if let Some(mount) = str_of(context, "procMount") {
        cx.rule(&path.child("procMount"), mount, Rule::OneOf(PROC_MOUNTS));
    }
    if let Some(profile) = context.get("seccompProfile").filter(|p| p.is_object()) {
        seccomp_profile(cx, profile, &path.child("seccompProfile"));
    }
    if context.get("allowPrivilegeEscalation") == Some(&J::Bool(false)) {
        if context.get("privileged") == Some(&J::Bool(true)) {
            let detail = "cannot set `allowPrivilegeEscalation` to false and `privileged` to true";
            cx.push(FieldError::invalid(path, "securityContext", detail));
        }
        let added = context.get("capabilities").map(|c| items(c.get("add"))).unwrap_or_default();
        if added.iter().any(|c| c.as_str() == Some("CAP_SYS_ADMIN")) {
            let detail = "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN";
            cx.push(FieldError::invalid(path, "securityContext", detail));
        }
    }
}

fn pod_security_context(cx: &mut Cx, context: &J, path: &FieldPath) {
    ids(cx, context, path);
    if let Some(options) = context.get("windowsOptions").filter(|o| o.is_object()) {
        pod_wide::windows_options(cx, options, &path.child("windowsOptions"));
    }
    if let Some(group) = int_of(context, "fsGroup")
        && !(0..=MAX_INT32).contains(&group)
    {
        cx.push(FieldError::invalid(&path.child("fsGroup"), group, ID_RANGE));
    }
    for (i, group) in items(context.get("supplementalGroups")).iter().enumerate() {
        let group = group.as_i64().unwrap_or(0);
        if !(0..=MAX_INT32).contains(&group) {
            cx.push(FieldError::invalid(&path.child("supplementalGroups").index(i), group, ID_RANGE));
        }
    }
    if let Some(policy) = str_of(context, "fsGroupChangePolicy") {
        cx.rule(&path.child("fsGroupChangePolicy"), policy, Rule::OneOf(&["Always", "OnRootMismatch"]));
    }
    if let Some(profile) = context.get("seccompProfile").filter(|p| p.is_object()) {
        seccomp_profile(cx, profile, &path.child("seccompProfile"));
    }
    let mut sysctls = HashSet::new();
    for (i, sysctl) in items(context.get("sysctls")).iter().enumerate() {
        let at = path.child("sysctls").index(i).child("name");
        let name = str_of(sysctl, "name").unwrap_or_default();
        if name.is_empty() {
            cx.push(FieldError::required(&at, ""));
        } else if !sysctlish(name) {
            let detail = "must have at most 253 characters and match regex ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$";
            cx.push(FieldError::invalid(&at, name, detail));
        } else if !sysctls.insert(name) {
            cx.push(FieldError::duplicate(&at, name));
        }
    }
}

/// `runAsUser` and `runAsGroup`, in a pod's or a container's security context.
fn ids(cx: &mut Cx, context: &J, path: &FieldPath) {
    for field in ["runAsUser", "runAsGroup"] {
        if let Some(id) = int_of(context, field)
            && !(0..=MAX_INT32).contains(&id)
        {
            cx.push(FieldError::invalid(&path.child(field), id, ID_RANGE));
        }
    }
}

fn seccomp_profile(cx: &mut Cx, profile: &J, path: &FieldPath) {
    let kind = str_of(profile, "type").unwrap_or_default();
    if kind.is_empty() {
        cx.push(FieldError::required(&path.child("type"), "type is required when seccompProfile is set"));
    } else {
        cx.rule(&path.child("type"), kind, Rule::OneOf(SECCOMP_TYPES));
    }
    let localhost = str_of(profile, "localhostProfile");
    match (kind, localhost) {
        ("Localhost", None) => {
            let detail = "must be set when seccomp type is Localhost";
            cx.push(FieldError::required(&path.child("localhostProfile"), detail));
        }
        ("Localhost", Some(file)) => {
            cx.rule(&path.child("localhostProfile"), file, Rule::RelativePath);
        }
        (_, Some(_)) => {
            let detail = "can only be set when seccomp type is Localhost";
            cx.push(FieldError::invalid(&path.child("localhostProfile"), "seccompProfile", detail));
        }
        (_, None) => {}
    }
}

/// A sysctl name: dot- or slash-separated segments of lowercase letters, digits, `-` and `_`.
fn sysctlish(name: &str) -> bool {
    name.len() <= 253
        && name.split(['.', '/']).all(|segment| {
            let bytes = segment.as_bytes();
            let inner = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'_';
            let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            !bytes.is_empty() && bytes.iter().all(inner) && edge(&bytes[0]) && edge(&bytes[bytes.len() - 1])
        })
}

fn str_of<'j>(object: &'j J, key: &str) -> Option<&'j str> {
    object.get(key).and_then(J::as_str)
}

fn int_of(object: &J, key: &str) -> Option<i64> {
    object.get(key).and_then(J::as_i64)
}

/// Is `key` set on `object` to something other than null?
fn is_set(object: &J, key: &str) -> bool {
    object.get(key).is_some_and(|v| !v.is_null())
}
