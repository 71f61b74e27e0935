//! A read-only view of the Pod inside a review, over the tape.

// The traits by name, not the prelude's glob: its `ArrayTrait` turns every `Vec::iter` into a boxed iterator.
use simd_json::prelude::{ValueAsScalar, ValueIntoString};
use simd_json::tape::{Array, Value};

use crate::pod_api::spec::{CONTAINER_LISTS, legacy_security_annotation};

/// The Pod under review. Accessors read the tape; nothing is copied. The metadata fields and the spec fields
/// several stages read are located in one walk over each when the view is made (a `get` per field would rescan
/// the keys each time).
#[derive(Debug, Clone)]
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
    /// The annotations' keys and values, in bytes (what the API server's total limit counts).
    annotation_bytes: usize,
    /// The pod is a mirror pod: it has [`MIRROR_ANNOTATION`].
    mirror: bool,
    /// The injector's prefix (`Keys::prefix`), and the annotations under it when the pod has so many annotations
    /// that they were gathered in the pass above (see [`OwnAnnotations`]).
    own_prefix: &'i str,
    own_annotations: Option<OwnAnnotations<'i>>,
    /// `spec.serviceAccountName`, or its deprecated alias `spec.serviceAccount`, or "default".
    service_account_name: &'i str,
    host_network: bool,
    /// `spec.resources` (pod-level resources, Kubernetes 1.34) is set.
    sets_pod_resources: bool,
    /// The pod has what the API server's pod-wide rules read (see [`PodView::judged_whole`]).
    judged_whole: bool,
    /// `spec.topologySpreadConstraints` is a non-empty list.
    spreads: bool,
    /// The pod runs to completion (see [`PodView::runs_to_completion`]).
    runs_to_completion: bool,
    /// The pod runs on Windows nodes only (see [`PodView::windows`]).
    windows: bool,
    /// `spec.containers`, `spec.initContainers` and `spec.ephemeralContainers`, when they are arrays.
    container_lists: [Option<Value<'t, 'i>>; 3],
    /// `metadata.ownerReferences`, when an array.
    owners: Option<Value<'t, 'i>>,
}

impl<'t, 'i> PodView<'t, 'i> {
    /// The view of `object`; `own_prefix` is the prefix of the injector's annotations (`Keys::prefix`).
    pub(crate) fn new(object: Value<'t, 'i>, request_namespace: &'i str, own_prefix: &'i str) -> Self {
        let mut pod = PodView {
            object,
            spec: None,
            name: "",
            generate_name: "",
            namespace: "",
            labels: None,
            annotations: None,
            annotation_bytes: 0,
            mirror: false,
            own_prefix,
            own_annotations: None,
            service_account_name: "default",
            host_network: false,
            sets_pod_resources: false,
            judged_whole: false,
            spreads: false,
            runs_to_completion: false,
            windows: false,
            container_lists: [None; 3],
            owners: None,
        };
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
                "annotations" => {
                    pod.annotations = value.as_object().map(|_| value);
                    let read = read_annotations(value, own_prefix);
                    pod.annotation_bytes = read.bytes;
                    pod.judged_whole |= read.legacy;
                    pod.mirror = read.mirror;
                    pod.own_annotations = read.own;
                }
                "ownerReferences" => {
                    pod.owners = value.as_array().map(|_| value);
                    pod.runs_to_completion |= value.as_array().is_some_and(|owners| owners.iter().any(is_job))
                }
                _ => {}
            }
        }
        if pod.namespace.is_empty() {
            pod.namespace = request_namespace;
        }
        let (mut account, mut alias) = ("", "");
        for (key, value) in pod.spec.iter().filter_map(|s| s.as_object()).flat_map(|s| s.iter()) {
            match key {
                "serviceAccountName" => account = text(value),
                // The deprecated alias the API server still fills in.
                "serviceAccount" => alias = text(value),
                "hostNetwork" => {
                    pod.host_network = value.as_bool().unwrap_or(false);
                    pod.judged_whole |= pod.host_network;
                }
                "hostPID" | "hostIPC" | "shareProcessNamespace" => pod.judged_whole |= value.as_bool() == Some(true),
                "hostUsers" => pod.judged_whole |= value.as_bool() == Some(false),
                "securityContext" => pod.judged_whole |= value.get("windowsOptions").is_some(),
                "topologySpreadConstraints" => pod.spreads = value.as_array().is_some_and(|list| !list.is_empty()),
                "restartPolicy" => pod.runs_to_completion |= value.into_string().is_some_and(run_to_completion),
                "resources" => pod.sets_pod_resources = value.as_object().is_some_and(|r| !r.is_empty()),
                "nodeSelector" => pod.windows |= value.get(OS_LABEL).and_then(|v| v.into_string()) == Some(WINDOWS),
                "os" => {
                    pod.windows |= value.get("name").and_then(|v| v.into_string()) == Some(WINDOWS);
                    // A Linux pod may not carry Windows options, which a template could add.
                    pod.judged_whole = true;
                }
                "affinity" => pod.windows |= requires_windows_nodes(value),
                _ => {
                    if let Some(list) = CONTAINER_LISTS.iter().position(|list| *list == key) {
                        pod.container_lists[list] = value.as_array().map(|_| value);
                    }
                }
            }
        }
        pod.service_account_name = [account, alias].into_iter().find(|a| !a.is_empty()).unwrap_or("default");
        pod
    }

    /// The spec's container lists, in [`CONTAINER_LISTS`] order.
    pub(crate) fn container_lists(&self) -> [Option<Array<'t, 'i>>; 3] {
        self.container_lists.map(|list| list.and_then(|l| l.as_array()))
    }

    /// The same, as the values the merge rules read.
    pub(crate) fn container_list_values(&self) -> [Option<Value<'t, 'i>>; 3] {
        self.container_lists
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
        match &self.own_annotations {
            Some(own) if key.starts_with(self.own_prefix) => own.get(key),
            _ => self.annotations.and_then(|m| m.get(key)).and_then(|v| v.into_string()),
        }
    }

    /// Every annotation whose value is a string, in the order the pod has them.
    pub(crate) fn annotation_entries(&self) -> impl Iterator<Item = (&'i str, &'i str)> + use<'t, 'i> {
        string_entries(self.annotations)
    }

    /// The annotations under the injector's prefix whose value is a string, in the order the pod has them.
    pub(crate) fn own_annotation_entries(&self) -> impl Iterator<Item = (&'i str, &'i str)> + use<'_, 't, 'i> {
        let prefix = self.own_prefix;
        let (gathered, scanned) = match &self.own_annotations {
            Some(own) => (Some(own.0.iter().copied()), None),
            None => (None, Some(string_entries(self.annotations).filter(move |(key, _)| key.starts_with(prefix)))),
        };
        gathered.into_iter().flatten().chain(scanned.into_iter().flatten())
    }

    pub(crate) fn label(&self, key: &str) -> Option<&'i str> {
        self.labels.and_then(|m| m.get(key)).and_then(|v| v.into_string())
    }

    /// `metadata.labels`, when it is an object.
    pub(crate) fn labels(&self) -> Option<Value<'t, 'i>> {
        self.labels
    }

    /// `metadata.annotations`, when it is an object.
    pub(crate) fn annotations(&self) -> Option<Value<'t, 'i>> {
        self.annotations
    }

    /// `spec.serviceAccountName`, or its deprecated alias `spec.serviceAccount`, or "default".
    pub(crate) fn service_account_name(&self) -> &'i str {
        self.service_account_name
    }

    pub(crate) fn host_network(&self) -> bool {
        self.host_network
    }

    /// Does the pod run to completion, so that a regular sidecar would keep it from ever finishing? Its
    /// `restartPolicy` is `Never` or `OnFailure` (an Argo Workflow's or a Tekton step's pod, a bare pod run
    /// once), or a `batch` Job owns it (whose pods always say one of those; a hand-made one may not). The one
    /// definition of "a Job's pod": the engine gives these the template's `jobs` treatment, whoever owns them,
    /// and `inject` and `status` judge pods through the engine.
    pub(crate) fn runs_to_completion(&self) -> bool {
        self.runs_to_completion
    }

    /// Does the pod run on Windows nodes only, where a Linux sidecar cannot run (linkerd2#2882)? It says so by
    /// `spec.os.name: windows`, by `kubernetes.io/os: windows` in its `nodeSelector`, or by a required node
    /// affinity each of whose terms admits only `kubernetes.io/os In (windows)`.
    pub(crate) fn windows(&self) -> bool {
        self.windows
    }

    pub(crate) fn sets_pod_resources(&self) -> bool {
        self.sets_pod_resources
    }

    /// Does the pod have what the API server's pod-wide rules read, so that what a template adds may break one of
    /// them: a host namespace or `hostNetwork` (whose ports take their container port on the host),
    /// `shareProcessNamespace`, a user namespace, an OS or Windows options, the legacy seccomp or AppArmor
    /// annotations (held to the fields a template sets). Such pods (rare) are judged whole with the sidecar merged
    /// in.
    pub(crate) fn judged_whole(&self) -> bool {
        self.judged_whole
    }

    /// Are the pod's annotations large enough that the template's could take them over the API server's total
    /// ([`LARGE_ANNOTATIONS`])? Their bytes ([`PodView::annotation_bytes`]) and the patch's are then added up.
    pub(crate) fn large_annotations(&self) -> bool {
        self.annotation_bytes > LARGE_ANNOTATIONS
    }

    /// The annotations' keys and values, in bytes, as the API server's total limit counts them.
    pub(crate) fn annotation_bytes(&self) -> usize {
        self.annotation_bytes
    }

    /// Is this a mirror pod (the kubelet's record of a static pod), which no webhook may change?
    pub(crate) fn mirror(&self) -> bool {
        self.mirror
    }

    /// Does the pod set topology spread constraints?
    pub(crate) fn spreads(&self) -> bool {
        self.spreads
    }

    /// Does any of the pod's containers use a block device (`volumeDevices`)? Read on demand: only templates that
    /// write mounts ask.
    pub(crate) fn has_volume_devices(&self) -> bool {
        let containers = self.container_lists().into_iter().flatten().flat_map(|list| list.iter());
        containers.into_iter().any(|c| c.get("volumeDevices").and_then(|d| d.as_array()).is_some_and(|d| !d.is_empty()))
    }

    /// The pod as a `serde_json` value: a copy, for the rare checks that judge the whole injected pod.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        to_json(self.object)
    }

    /// The first value of the pod that answers may echo (its names in messages and patches; what templates read)
    /// longer than the API server lets any pod have, with the API's limit. The API server refuses such a pod after
    /// the mutating webhooks; refused here up front, it cannot make an answer as large as its request.
    pub(crate) fn beyond_api_limits(&self) -> Option<(&'static str, usize)> {
        use crate::validation::{
            DNS1123_LABEL_MAX_LENGTH as LABEL, DNS1123_SUBDOMAIN_MAX_LENGTH as SUBDOMAIN,
            LABEL_VALUE_MAX_LENGTH as LABEL_VALUE, QUALIFIED_NAME_MAX_LENGTH as KEY,
            TOTAL_ANNOTATION_SIZE_LIMIT_B as ANNOTATIONS,
        };
        let strings = [
            ("metadata.name", self.name, SUBDOMAIN),
            ("metadata.generateName", self.generate_name, SUBDOMAIN),
            ("metadata.namespace", self.namespace, LABEL),
            ("spec.serviceAccountName", self.service_account_name, SUBDOMAIN),
        ];
        if let Some((field, _, limit)) = strings.into_iter().find(|(_, value, limit)| value.len() > *limit) {
            return Some((field, limit));
        }
        for (key, value) in string_entries(self.labels) {
            if key.len() > KEY {
                return Some(("metadata.labels (a key)", KEY));
            }
            if value.len() > LABEL_VALUE {
                return Some(("metadata.labels (a value)", LABEL_VALUE));
            }
        }
        if self.annotation_bytes > ANNOTATIONS {
            return Some(("metadata.annotations (in all)", ANNOTATIONS));
        }
        let names = self.container_lists().into_iter().flatten().flat_map(|list| list.iter());
        let too_long = |c: Value<'_, '_>| c.get("name").and_then(|n| n.into_string()).is_some_and(|n| n.len() > LABEL);
        if names.into_iter().any(too_long) {
            return Some(("a container's name", LABEL));
        }
        None
    }

    /// The owner that controls the pod (its `ownerReferences` entry with `controller: true`): `apiVersion`,
    /// `kind`, `name` and `uid`, each present.
    pub(crate) fn controller(&self) -> Option<[&'i str; 4]> {
        let owners = self.owners.and_then(|o| o.as_array())?;
        owners.iter().find(|owner| owner.get("controller").and_then(|c| c.as_bool()) == Some(true)).and_then(|owner| {
            let field = |key: &str| owner.get(key).and_then(|v| v.into_string()).filter(|v| !v.is_empty());
            Some([field("apiVersion")?, field("kind")?, field("name")?, field("uid")?])
        })
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

/// Is a pod with this `restartPolicy` one that runs to completion? `Always` (the API server's default) is the
/// only policy whose containers are restarted for as long as the pod lives.
fn run_to_completion(policy: &str) -> bool {
    matches!(policy, "Never" | "OnFailure")
}

/// The node label the kubelet sets to the node's operating system, and its value on Windows nodes.
const OS_LABEL: &str = "kubernetes.io/os";
const WINDOWS: &str = "windows";

/// Does `affinity` (a pod's `spec.affinity`) require nodes whose `kubernetes.io/os` is `windows`? Only when every
/// term of the required node affinity does (the terms are ORed): a term that also admits other nodes leaves the pod
/// free to run on Linux.
fn requires_windows_nodes(affinity: Value<'_, '_>) -> bool {
    let terms = affinity
        .get("nodeAffinity")
        .and_then(|n| n.get("requiredDuringSchedulingIgnoredDuringExecution"))
        .and_then(|r| r.get("nodeSelectorTerms"))
        .and_then(|t| t.as_array());
    let Some(terms) = terms.filter(|t| !t.is_empty()) else { return false };
    terms.iter().all(|term| {
        let expressions = term.get("matchExpressions").and_then(|e| e.as_array());
        expressions.into_iter().flat_map(|e| e.iter()).any(|requirement| {
            let text = |key: &str| requirement.get(key).and_then(|v| v.into_string());
            let values = requirement.get("values").and_then(|v| v.as_array());
            text("key") == Some(OS_LABEL)
                && text("operator") == Some("In")
                && values.is_some_and(|v| !v.is_empty() && v.iter().all(|v| v.into_string() == Some(WINDOWS)))
        })
    })
}

/// Is this `ownerReferences` entry a Job ([`crate::workload::Kind::is_job`])?
fn is_job(owner: Value<'_, '_>) -> bool {
    let field = |key: &str| owner.get(key).and_then(|v| v.into_string()).unwrap_or_default();
    crate::workload::Kind::is_job(field("apiVersion"), field("kind"))
}

/// Annotations large enough that a template's own could take the pod over the API server's total (pods this
/// close to it have their annotations and the patch's added up): half the limit.
const LARGE_ANNOTATIONS: usize = crate::validation::TOTAL_ANNOTATION_SIZE_LIMIT_B / 2;

/// A pod with more annotations than this has those under the injector's prefix gathered as they are counted: the
/// engine reads a dozen of them by key, and each read would otherwise scan them all (10,000 annotations: 2.4 M
/// instructions of scans, against 1.6 M for the whole of a 60 KB pod's answer). Below, a scan costs less than
/// gathering.
const GATHERED_ANNOTATIONS: usize = 32;

/// The annotations under the injector's prefix whose value is a string, in the pod's order (allocated only for a
/// pod with more than [`GATHERED_ANNOTATIONS`]). No key is here twice: the review was refused otherwise.
#[derive(Debug, Clone)]
struct OwnAnnotations<'i>(Vec<(&'i str, &'i str)>);

impl<'i> OwnAnnotations<'i> {
    fn get(&self, key: &str) -> Option<&'i str> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, value)| *value)
    }
}

/// The annotation the kubelet sets on mirror pods.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What one pass over the pod's annotations finds.
struct ReadAnnotations<'i> {
    /// One is a legacy seccomp or AppArmor annotation (the pod-wide rules read those).
    legacy: bool,
    /// One is [`MIRROR_ANNOTATION`] (with a string value, as every annotation the engine reads by key).
    mirror: bool,
    /// The keys' and values' bytes.
    bytes: usize,
    /// Those under `own_prefix`, when there are more than [`GATHERED_ANNOTATIONS`] annotations in all.
    own: Option<OwnAnnotations<'i>>,
}

fn read_annotations<'i>(annotations: Value<'_, 'i>, own_prefix: &str) -> ReadAnnotations<'i> {
    let gather = annotations.as_object().is_some_and(|map| map.len() > GATHERED_ANNOTATIONS);
    let mut own = gather.then(|| OwnAnnotations(Vec::new()));
    let own_first = own_prefix.as_bytes().first();
    let (mut legacy, mut mirror, mut bytes) = (false, false, 0);
    for (key, value) in string_entries(Some(annotations)) {
        legacy |= legacy_security_annotation(key).is_some();
        mirror |= key == MIRROR_ANNOTATION;
        bytes += key.len() + value.len();
        // The first byte before the prefix: of 10,000 annotations, most differ there, without a `memcmp`.
        if let Some(gathered) =
            own.as_mut().filter(|_| key.as_bytes().first() == own_first && key.starts_with(own_prefix))
        {
            gathered.0.push((key, value));
        }
    }
    ReadAnnotations { legacy, mirror, bytes, own }
}

/// The entries of a string-to-string map on the tape (an object, or none) whose value is a string, in the pod's
/// order: how labels and annotations are read. Non-string values are left out.
pub(crate) fn string_entries<'t, 'i>(
    map: Option<Value<'t, 'i>>,
) -> impl Iterator<Item = (&'i str, &'i str)> + use<'t, 'i> {
    let object = map.and_then(|m| m.as_object());
    object.into_iter().flat_map(|o| o.iter()).filter_map(|(key, value)| value.into_string().map(|v| (key, v)))
}

/// A value on the tape as a `serde_json` value. The tape's depth is bounded by the parser's (`review::MAX_DEPTH`).
pub(crate) fn to_json(value: Value<'_, '_>) -> serde_json::Value {
    use serde_json::Value as J;
    if let Some(object) = value.as_object() {
        return J::Object(object.iter().map(|(key, value)| (key.to_owned(), to_json(value))).collect());
    }
    if let Some(array) = value.as_array() {
        return J::Array(array.iter().map(to_json).collect());
    }
    if let Some(text) = value.into_string() {
        return J::String(text.to_owned());
    }
    if let Some(flag) = value.as_bool() {
        return J::Bool(flag);
    }
    let number = value.as_i64().map(J::from).or_else(|| value.as_u64().map(J::from));
    number.or_else(|| value.as_f64().and_then(serde_json::Number::from_f64).map(J::Number)).unwrap_or(J::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PREFIX: &str = "sidecar-injector.io/";

    proptest! {
        /// Gathered or scanned (on both sides of [`GATHERED_ANNOTATIONS`]), a key reads the
        /// same value, and the annotations under the prefix are the same, in the same order.
        #[test]
        fn gathered_annotations_read_as_a_scan_does(
            others in 0..48usize,
            own in proptest::collection::btree_set("[a-z]{1,3}", 0..20),
            non_string in proptest::option::of("[a-z]{1,3}"),
        ) {
            let mut annotations = serde_json::Map::new();
            for i in 0..others {
                annotations.insert(format!("example.com/note-{i}"), serde_json::json!(format!("v{i}")));
            }
            for key in &own {
                annotations.insert(format!("{PREFIX}{key}"), serde_json::json!(format!("own {key}")));
            }
            if let Some(key) = &non_string {
                annotations.insert(format!("{PREFIX}{key}"), serde_json::json!(7));
            }
            let mut body = serde_json::to_vec(&serde_json::json!({"metadata": {"annotations": annotations}})).unwrap();
            let tape = simd_json::to_tape(&mut body).unwrap();
            let pod = PodView::new(tape.as_value(), "default", PREFIX);
            let scanned: Vec<(&str, &str)> =
                pod.annotation_entries().filter(|(key, _)| key.starts_with(PREFIX)).collect();
            prop_assert_eq!(pod.own_annotation_entries().collect::<Vec<_>>(), scanned.clone());
            for key in own.iter().chain(&non_string).map(|k| format!("{PREFIX}{k}")).chain(["sidecar-injector.io/none".into()]) {
                let scan = scanned.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
                prop_assert_eq!(pod.annotation(&key), scan, "{}", key);
            }
            prop_assert_eq!(pod.annotation("example.com/note-0"), (others > 0).then_some("v0"));
        }
    }
}
