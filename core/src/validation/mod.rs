//! What the API server will refuse: its validation of a Pod, applied to what we inject, so that the injector never
//! answers 200 with a patch that makes the pod invalid.
//!
//! [`validate_pod`] judges a whole pod as the API server's `ValidatePodCreate` does (after its defaults), with its
//! messages, for a target Kubernetes version ([`KubeVersion`]): the rules of newer releases (native sidecars, the
//! sleep hook, relaxed env var names) apply from the release that brought them. Templates are validated with it when
//! they load (dry-rendered onto sample pods); per-pod values are checked with the same [`Rule`]s where they are
//! rendered, and overrides before they are used (`template::checks`).

mod field;
mod fields;
pub(crate) mod names;
mod pod;
mod pod_wide;
pub(crate) mod quantity;
#[cfg(test)]
mod tests;
mod version;

use serde_json::Value as J;

use crate::pod_api::decode;

pub use field::{BadValue, ErrorKind, FieldError, FieldPath, Seg};
pub use fields::{Account, POD_FIELDS};
pub use names::{dns1123_label, dns1123_subdomain};
pub use version::{KubeVersion, VersionError};

/// The most bytes a pod's annotations may hold, keys and values together.
pub(crate) use names::{
    DNS1123_LABEL_MAX_LENGTH, DNS1123_SUBDOMAIN_MAX_LENGTH, LABEL_VALUE_MAX_LENGTH, QUALIFIED_NAME_MAX_LENGTH,
    TOTAL_ANNOTATION_SIZE_LIMIT_B,
};
pub(crate) use pod_wide::{annotation_copied_into_a_field, annotations_copied_from_fields};

/// The problems the API server would report for `pod` (a Pod's JSON: `metadata` and `spec`), if Kubernetes
/// `version` judged it; empty when it would accept it.
pub fn validate_pod(pod: &J, version: KubeVersion) -> Vec<FieldError> {
    if let Err(error) = decode_pod(pod) {
        // The API server refuses a pod it cannot decode before it validates anything.
        return vec![error];
    }
    let mut cx = Cx { errors: Vec::new(), version, recorded: None };
    pod::pod(&mut cx, pod);
    cx.errors
}

/// The problems the API server would report for the pod-level resources of `pod` (Kubernetes 1.34 and later):
/// what its containers request together must fit the pod's requests, and no container may limit more than the
/// pod. Empty for a pod without `spec.resources` and for an older `version`. For the engine, which judges every
/// pod that sets them once its sidecar is merged in; [`validate_pod`] applies the same rule.
pub(crate) fn pod_resources(pod: &J, version: KubeVersion) -> Vec<FieldError> {
    let mut cx = Cx { errors: Vec::new(), version, recorded: None };
    if let Some(spec) = pod.get("spec") {
        pod::pod_resources(&mut cx, spec, &FieldPath::default().child("spec"));
    }
    cx.errors
}

/// The API server's error for a pod whose annotations (keys and values) come to `total` bytes, if that is over its
/// limit. Where `version` adds annotations of its own before counting ([`annotations_copied_from_fields`]), only
/// [`validate_pod`] counts them. For the engine, which adds up a large-annotation pod's and its patch's bytes.
pub(crate) fn annotations_size(total: usize, version: KubeVersion) -> Option<FieldError> {
    let at = FieldPath::default().child("metadata").child("annotations");
    pod::annotations_size(total, version, &at)
}

/// The rule each string field of `pod` is held to, by path: what a per-pod value rendered into that field must
/// pass. Recorded while validating, so the rules and the places they apply to are written once.
pub(crate) fn leaf_rules(pod: &J, version: KubeVersion) -> Vec<(FieldPath, Rule)> {
    let mut cx = Cx { errors: Vec::new(), version, recorded: Some(Vec::new()) };
    pod::pod(&mut cx, pod);
    cx.recorded.unwrap_or_default()
}

/// Reads the pod into the API types, as the API server decodes a request body: a string where a number belongs,
/// or a number out of an `int32`'s range, is refused here.
fn decode_pod(pod: &J) -> Result<(), FieldError> {
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn typed<T: serde::de::DeserializeOwned>(value: &J, base: FieldPath) -> Result<(), FieldError> {
        decode::decode::<T>(value).map(drop).map_err(|e| {
            let mut path = base;
            for step in &e.path {
                path.0.push(match step {
                    decode::Step::Index(index) => Seg::Index(*index),
                    decode::Step::Key(key) => Seg::Field(key.clone().into()),
                });
            }
            FieldError::invalid(&path, BadValue::Other(e.value_in(value).to_string()), e.message)
        })
    }
    let root = FieldPath::default();
    if let Some(metadata) = pod.get("metadata") {
        typed::<ObjectMeta>(metadata, root.child("metadata"))?;
    }
    if let Some(spec) = pod.get("spec") {
        // A missing `containers` decodes, and is a validation error (reported as such).
        typed::<PodSpec>(spec, root.child("spec"))?;
    }
    Ok(())
}

/// A rule a single string value is held to, with the API server's messages: what the validator applies to a
/// field, and what a per-pod value rendered into that field is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// A DNS-1123 label: container, volume and port-less names.
    Dns1123Label,
    /// A DNS-1123 subdomain: object names.
    Dns1123Subdomain,
    /// A qualified name (`prefix/name`): label and annotation keys, resource names.
    QualifiedName,
    /// A label value: at most 63 characters, alphanumeric at both ends.
    LabelValue,
    /// An env var name, as Kubernetes before 1.32 checks it.
    EnvVarName,
    /// An env var name from 1.32 on: printable ASCII but `=`.
    EnvVarNameRelaxed,
    /// An IANA service name: a port's name.
    PortName,
    /// A ConfigMap or Secret key.
    ConfigMapKey,
    /// An HTTP header name.
    HttpHeaderName,
    /// A relative path without a `..` element: a mount's `subPath`.
    RelativePath,
    /// A relative path that neither contains a `..` element nor starts with `..`: a projected file's path.
    NonReservedPath,
    /// A non-negative resource quantity.
    Quantity,
    /// A container image: no leading or trailing whitespace.
    Image,
    /// One of these values.
    OneOf(&'static [&'static str]),
}

impl Rule {
    /// Appends an error at `path` for each way `value` breaks the rule (`shown` is the value the message shows);
    /// returns whether it passed. Allocates nothing when it passes.
    pub(crate) fn check(self, path: &FieldPath, value: &str, shown: &str, out: &mut Vec<FieldError>) -> bool {
        let messages = match self {
            Rule::Dns1123Label => names::dns1123_label(value),
            Rule::Dns1123Subdomain => names::dns1123_subdomain(value),
            Rule::QualifiedName => names::qualified_name(value),
            Rule::LabelValue => names::label_value(value),
            Rule::EnvVarName => names::env_var_name(value),
            Rule::EnvVarNameRelaxed => names::env_var_name_relaxed(value),
            Rule::PortName => names::port_name(value),
            Rule::ConfigMapKey => names::config_map_key(value),
            Rule::HttpHeaderName => names::http_header_name(value),
            Rule::RelativePath => names::relative_path(value),
            Rule::NonReservedPath => names::non_reserved_path(value),
            Rule::Image if value.trim() == value => return true,
            Rule::Image => vec!["must not have leading or trailing whitespace".to_owned()],
            Rule::Quantity => match quantity::parse(value) {
                Err(e) => vec![e.to_string()],
                Ok(q) if q.is_negative() => vec!["must be greater than or equal to 0".to_owned()],
                Ok(_) => Vec::new(),
            },
            Rule::OneOf(allowed) => {
                if allowed.contains(&value) {
                    return true;
                }
                out.push(FieldError::not_supported(path, shown, allowed));
                return false;
            }
        };
        let passed = messages.is_empty();
        out.extend(messages.into_iter().map(|m| FieldError::invalid(path, shown, m)));
        passed
    }
}

/// The validator's state: the errors so far, the target version, and (when asked) the rule applied at each path.
pub(crate) struct Cx {
    errors: Vec<FieldError>,
    version: KubeVersion,
    recorded: Option<Vec<(FieldPath, Rule)>>,
}

impl Cx {
    fn push(&mut self, error: FieldError) {
        self.errors.push(error);
    }

    /// Applies `rule` to the value of the field at `path`; returns whether it passed.
    fn rule(&mut self, path: &FieldPath, value: &str, rule: Rule) -> bool {
        self.record(path, rule);
        rule.check(path, value, value, &mut self.errors)
    }

    /// Applies `rule` to the value at `leaf` (a map's value), reporting errors at `at` (the map), as the API
    /// server reports label values.
    fn rule_leaf(&mut self, at: &FieldPath, leaf: &FieldPath, value: &str, rule: Rule) -> bool {
        self.record(leaf, rule);
        rule.check(at, value, value, &mut self.errors)
    }

    /// Applies `rule` to `checked`, something other than the field's value (a map key), showing `shown`.
    fn rule_as(&mut self, path: &FieldPath, checked: &str, shown: &str, rule: Rule) -> bool {
        rule.check(path, checked, shown, &mut self.errors)
    }

    fn record(&mut self, path: &FieldPath, rule: Rule) {
        if let Some(recorded) = &mut self.recorded {
            recorded.push((path.clone(), rule));
        }
    }
}
