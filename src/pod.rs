//! A read-only view of the Pod inside a review, over the tape.

use simd_json::prelude::*;
use simd_json::tape::Value;

use crate::template::StrEntries;

/// The Pod under review. Accessors read the tape; nothing is copied. The metadata fields are located in one walk
/// over `metadata` when the view is made, because several stages read them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PodView<'t, 'i> {
    pub object: Value<'t, 'i>,
    spec: Option<Value<'t, 'i>>,
    name: &'i str,
    generate_name: &'i str,
    /// The object's namespace, or `request.namespace` when it carries none (controller-created pods).
    namespace: &'i str,
    /// `metadata.labels` and `metadata.annotations`, when they are objects.
    labels: Option<Value<'t, 'i>>,
    annotations: Option<Value<'t, 'i>>,
}

impl<'t, 'i> PodView<'t, 'i> {
    pub(crate) fn new(object: Value<'t, 'i>, request_namespace: &'i str) -> Self {
        let mut pod =
            PodView { object, spec: None, name: "", generate_name: "", namespace: "", labels: None, annotations: None };
        let mut metadata = None;
        for (key, value) in object.as_object().iter().flat_map(|o| o.iter()) {
            match key {
                "metadata" => metadata = value.as_object(),
                "spec" => pod.spec = Some(value),
                _ => {}
            }
        }
        let text = |v: Value<'t, 'i>| v.into_string().unwrap_or("");
        for (key, value) in metadata.iter().flat_map(|m| m.iter()) {
            match key {
                "name" => pod.name = text(value),
                "generateName" => pod.generate_name = text(value),
                "namespace" => pod.namespace = text(value),
                "labels" => pod.labels = value.as_object().map(|_| value),
                "annotations" => pod.annotations = value.as_object().map(|_| value),
                _ => {}
            }
        }
        if pod.namespace.is_empty() {
            pod.namespace = request_namespace;
        }
        pod
    }

    pub(crate) fn spec(&self) -> Option<Value<'t, 'i>> {
        self.spec
    }

    pub(crate) fn name(&self) -> &'i str {
        self.name
    }

    pub(crate) fn generate_name(&self) -> &'i str {
        self.generate_name
    }

    pub(crate) fn namespace(&self) -> &'i str {
        self.namespace
    }

    pub(crate) fn annotation(&self, key: &str) -> Option<&'i str> {
        self.annotations.and_then(|m| m.get(key)).and_then(|v| v.into_string())
    }

    /// Every annotation whose value is a string, in the order the pod has them.
    pub(crate) fn annotation_entries(&self) -> impl Iterator<Item = (&'i str, &'i str)> + use<'t, 'i> {
        self.annotations(true).iter()
    }

    pub(crate) fn label(&self, key: &str) -> Option<&'i str> {
        self.labels.and_then(|m| m.get(key)).and_then(|v| v.into_string())
    }

    /// The labels, as templates see them (an empty map when `with` is false or there are none).
    pub(crate) fn labels(&self, with: bool) -> StrMap<'t, 'i> {
        StrMap(self.labels.filter(|_| with))
    }

    /// The annotations, as templates see them.
    pub(crate) fn annotations(&self, with: bool) -> StrMap<'t, 'i> {
        StrMap(self.annotations.filter(|_| with))
    }

    pub(crate) fn service_account_name(&self) -> &'i str {
        let spec = self.spec;
        let read = |key: &str| spec.and_then(|s| s.get(key)).and_then(|v| v.into_string()).filter(|s| !s.is_empty());
        // `serviceAccount` is the deprecated alias the API server still fills in.
        read("serviceAccountName").or_else(|| read("serviceAccount")).unwrap_or("default")
    }

    pub(crate) fn host_network(&self) -> bool {
        self.spec.and_then(|s| s.get("hostNetwork")).and_then(|v| v.as_bool()).unwrap_or(false)
    }

    /// How the pod is named in messages: its name, or its generateName followed by `*`.
    pub(crate) fn display_name(&self) -> String {
        match (self.name(), self.generate_name()) {
            ("", "") => format!("{}/<unnamed>", self.namespace()),
            ("", generate) => format!("{}/{generate}*", self.namespace()),
            (name, _) => format!("{}/{name}", self.namespace()),
        }
    }
}

/// A string-to-string map on the tape (an object, or none), as templates see it. Non-string values are left out.
pub(crate) struct StrMap<'t, 'i>(Option<Value<'t, 'i>>);

impl<'t, 'i> StrMap<'t, 'i> {
    /// Every entry whose value is a string, in the pod's order.
    fn iter(&self) -> impl Iterator<Item = (&'i str, &'i str)> + use<'t, 'i> {
        let object = self.0.and_then(|m| m.as_object());
        object.into_iter().flat_map(|o| o.iter()).filter_map(|(key, value)| value.into_string().map(|v| (key, v)))
    }
}

impl StrEntries for StrMap<'_, '_> {
    fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.iter()
    }
}
