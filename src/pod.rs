//! A read-only view of the Pod inside a review, over the tape.

use serde::ser::{Serialize, SerializeMap, Serializer};
use simd_json::prelude::*;
use simd_json::tape::{Object, Value};

/// The Pod under review. Every accessor reads the tape; nothing is copied.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PodView<'t, 'i> {
    pub object: Value<'t, 'i>,
    metadata: Option<Value<'t, 'i>>,
    spec: Option<Value<'t, 'i>>,
    /// `request.namespace`, used when the object carries none (controller-created pods).
    request_namespace: &'i str,
}

impl<'t, 'i> PodView<'t, 'i> {
    pub(crate) fn new(object: Value<'t, 'i>, request_namespace: &'i str) -> Self {
        PodView { object, metadata: object.get("metadata"), spec: object.get("spec"), request_namespace }
    }

    pub(crate) fn spec(&self) -> Option<Value<'t, 'i>> {
        self.spec
    }

    fn metadata_str(&self, key: &str) -> &'i str {
        self.metadata.and_then(|m| m.get(key)).and_then(|v| v.into_string()).unwrap_or("")
    }

    fn map(&self, which: &str) -> Option<Object<'t, 'i>> {
        self.metadata.and_then(|m| m.get(which)).and_then(|v| v.as_object())
    }

    pub(crate) fn name(&self) -> &'i str {
        self.metadata_str("name")
    }

    pub(crate) fn generate_name(&self) -> &'i str {
        self.metadata_str("generateName")
    }

    pub(crate) fn namespace(&self) -> &'i str {
        match self.metadata_str("namespace") {
            "" => self.request_namespace,
            ns => ns,
        }
    }

    pub(crate) fn annotation(&self, key: &str) -> Option<&'i str> {
        self.map("annotations").and_then(|m| m.get(key)).and_then(|v| v.into_string())
    }

    pub(crate) fn label(&self, key: &str) -> Option<&'i str> {
        self.map("labels").and_then(|m| m.get(key)).and_then(|v| v.into_string())
    }

    /// The labels, serialisable as a map for templates (an empty map when `with` is false or there are none).
    pub(crate) fn labels(&self, with: bool) -> StrMap<'t, 'i> {
        StrMap(self.map("labels").filter(|_| with))
    }

    /// The annotations, serialisable as a map for templates.
    pub(crate) fn annotations(&self, with: bool) -> StrMap<'t, 'i> {
        StrMap(self.map("annotations").filter(|_| with))
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

/// A string-to-string map on the tape, serialised for template contexts. Non-string values are left out.
pub(crate) struct StrMap<'t, 'i>(Option<Object<'t, 'i>>);

impl Serialize for StrMap<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if let Some(object) = &self.0 {
            for (key, value) in object.iter() {
                if let Some(value) = value.as_str() {
                    map.serialize_entry(key, value)?;
                }
            }
        }
        map.end()
    }
}
