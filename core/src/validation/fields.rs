//! Every field a template can write into a pod, accounted for: judged by the validator's rules, or not judged,
//! with the reason. The test below reads the fields of k8s-openapi's `PodSpec`, `Container`, `Volume` and
//! `ObjectMeta` (through their `Deserialize`, which names them) and fails when a field has no entry here, or an
//! entry names a field the types do not have: a new k8s-openapi (a new Kubernetes) cannot add a field silently.

/// How the validator accounts for a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Account {
    /// Judged by the API server's rules in `validation::pod` (the field, and what is under it, as the API server
    /// validates it at CREATE; docs/validation.md lists the rules).
    Judged,
    /// Not judged, and why: any value of the field's type is valid, or the API server or an admission plugin owns
    /// it, or its rules are left to the API server.
    NotJudged(&'static str),
}

use Account::{Judged, NotJudged};

const BOOLEAN: &str = "a boolean: either value is valid (cluster policy, such as Pod Security admission, is judged by \
                       `check --pod-security`)";
const SET_BY_THE_API_SERVER: &str = "set by the API server: ignored or overwritten on create";
const GATED_OFF: &str = "behind a feature gate off by default up to 1.37, so the API server drops it: refused at \
                         load (pod_api::releases)";
const GATED_NEWER: &str = "kept from 1.35 (its feature on by default from then) and refused at load below \
                           (pod_api::releases); its rules (action and exit codes) are left to the API server";
const PLUGIN_OWNED: &str = "owned by an admission plugin on by default (Priority, RuntimeClass), which refuses a \
                            pod's own value: refused at load (pod_api::plugins)";
const STORAGE_DRIVER: &str = "a storage driver's own fields, left to the API server (that a volume has exactly one \
                              source is judged)";

/// The fields of a pod's types and how each is accounted for: `(type, field, account)`.
pub const POD_FIELDS: &[(&str, &str, Account)] = &[
    ("ObjectMeta", "annotations", Judged),
    ("ObjectMeta", "creationTimestamp", NotJudged(SET_BY_THE_API_SERVER)),
    ("ObjectMeta", "deletionGracePeriodSeconds", NotJudged(SET_BY_THE_API_SERVER)),
    ("ObjectMeta", "deletionTimestamp", NotJudged(SET_BY_THE_API_SERVER)),
    ("ObjectMeta", "finalizers", NotJudged("set by controllers, not templates; left to the API server")),
    ("ObjectMeta", "generateName", Judged),
    ("ObjectMeta", "generation", NotJudged(SET_BY_THE_API_SERVER)),
    ("ObjectMeta", "labels", Judged),
    ("ObjectMeta", "managedFields", NotJudged(SET_BY_THE_API_SERVER)),
    ("ObjectMeta", "name", Judged),
    ("ObjectMeta", "namespace", NotJudged("the request's namespace: the API server refuses any other")),
    ("ObjectMeta", "ownerReferences", NotJudged("set by controllers, not templates; left to the API server")),
    ("ObjectMeta", "resourceVersion", NotJudged(SET_BY_THE_API_SERVER)),
    ("ObjectMeta", "selfLink", NotJudged(SET_BY_THE_API_SERVER)),
    ("ObjectMeta", "uid", NotJudged(SET_BY_THE_API_SERVER)),
    ("PodSpec", "activeDeadlineSeconds", Judged),
    ("PodSpec", "affinity", Judged),
    ("PodSpec", "automountServiceAccountToken", NotJudged(BOOLEAN)),
    ("PodSpec", "containers", Judged),
    ("PodSpec", "dnsConfig", Judged),
    ("PodSpec", "dnsPolicy", Judged),
    ("PodSpec", "enableServiceLinks", NotJudged(BOOLEAN)),
    ("PodSpec", "evictionResponders", NotJudged(GATED_OFF)),
    ("PodSpec", "ephemeralContainers", Judged),
    ("PodSpec", "hostAliases", Judged),
    ("PodSpec", "hostIPC", NotJudged(BOOLEAN)),
    ("PodSpec", "hostNetwork", NotJudged(BOOLEAN)),
    ("PodSpec", "hostPID", NotJudged(BOOLEAN)),
    ("PodSpec", "hostUsers", NotJudged(BOOLEAN)),
    ("PodSpec", "hostname", Judged),
    ("PodSpec", "hostnameOverride", Judged),
    ("PodSpec", "imagePullSecrets", Judged),
    ("PodSpec", "initContainers", Judged),
    ("PodSpec", "nodeName", Judged),
    ("PodSpec", "nodeSelector", Judged),
    ("PodSpec", "os", Judged),
    ("PodSpec", "overhead", NotJudged(PLUGIN_OWNED)),
    ("PodSpec", "preemptionPolicy", NotJudged(PLUGIN_OWNED)),
    ("PodSpec", "priority", NotJudged(PLUGIN_OWNED)),
    ("PodSpec", "priorityClassName", Judged),
    ("PodSpec", "readinessGates", Judged),
    ("PodSpec", "resourceClaims", NotJudged("dynamic resource allocation: left to the API server")),
    ("PodSpec", "resources", Judged),
    ("PodSpec", "restartPolicy", Judged),
    ("PodSpec", "runtimeClassName", Judged),
    ("PodSpec", "schedulerName", NotJudged("any name: a scheduler of that name must exist, which no API rule checks")),
    ("PodSpec", "schedulingGroup", NotJudged(GATED_OFF)),
    ("PodSpec", "schedulingGates", NotJudged("removed by controllers, not set by templates; left to the API server")),
    ("PodSpec", "securityContext", Judged),
    ("PodSpec", "serviceAccount", NotJudged("the deprecated alias of serviceAccountName, which the API server fills")),
    ("PodSpec", "serviceAccountName", Judged),
    ("PodSpec", "setHostnameAsFQDN", NotJudged(BOOLEAN)),
    ("PodSpec", "shareProcessNamespace", NotJudged(BOOLEAN)),
    ("PodSpec", "subdomain", Judged),
    ("PodSpec", "terminationGracePeriodSeconds", NotJudged("any number: the API server raises a negative one to 1")),
    ("PodSpec", "tolerations", Judged),
    ("PodSpec", "topologySpreadConstraints", Judged),
    ("PodSpec", "volumes", Judged),
    ("Container", "args", NotJudged("strings handed to the container")),
    ("Container", "command", NotJudged("strings handed to the container")),
    ("Container", "env", Judged),
    ("Container", "envFrom", Judged),
    ("Container", "image", Judged),
    ("Container", "imagePullPolicy", Judged),
    ("Container", "lifecycle", Judged),
    ("Container", "livenessProbe", Judged),
    ("Container", "name", Judged),
    ("Container", "ports", Judged),
    ("Container", "readinessProbe", Judged),
    ("Container", "resizePolicy", Judged),
    ("Container", "resources", Judged),
    ("Container", "restartPolicy", Judged),
    ("Container", "restartPolicyRules", NotJudged(GATED_NEWER)),
    ("Container", "securityContext", Judged),
    ("Container", "startupProbe", Judged),
    ("Container", "stdin", NotJudged(BOOLEAN)),
    ("Container", "stdinOnce", NotJudged(BOOLEAN)),
    ("Container", "terminationMessagePath", NotJudged("any path: the API server defaults an empty one")),
    ("Container", "terminationMessagePolicy", Judged),
    ("Container", "tty", NotJudged(BOOLEAN)),
    ("Container", "volumeDevices", NotJudged("block devices of claims: only their clash with mounts is judged")),
    ("Container", "volumeMounts", Judged),
    ("Container", "workingDir", NotJudged("any path inside the container")),
    ("Volume", "awsElasticBlockStore", NotJudged(STORAGE_DRIVER)),
    ("Volume", "azureDisk", NotJudged(STORAGE_DRIVER)),
    ("Volume", "azureFile", NotJudged(STORAGE_DRIVER)),
    ("Volume", "cephfs", NotJudged(STORAGE_DRIVER)),
    ("Volume", "cinder", NotJudged(STORAGE_DRIVER)),
    ("Volume", "configMap", Judged),
    ("Volume", "csi", Judged),
    ("Volume", "downwardAPI", Judged),
    ("Volume", "emptyDir", Judged),
    ("Volume", "ephemeral", NotJudged("a claim template: left to the API server")),
    ("Volume", "fc", NotJudged(STORAGE_DRIVER)),
    ("Volume", "flexVolume", NotJudged(STORAGE_DRIVER)),
    ("Volume", "flocker", NotJudged(STORAGE_DRIVER)),
    ("Volume", "gcePersistentDisk", NotJudged(STORAGE_DRIVER)),
    ("Volume", "gitRepo", NotJudged(STORAGE_DRIVER)),
    ("Volume", "glusterfs", NotJudged(STORAGE_DRIVER)),
    ("Volume", "hostPath", Judged),
    ("Volume", "image", NotJudged("an OCI image volume (1.31+): left to the API server")),
    ("Volume", "iscsi", NotJudged(STORAGE_DRIVER)),
    ("Volume", "name", Judged),
    ("Volume", "nfs", NotJudged(STORAGE_DRIVER)),
    ("Volume", "persistentVolumeClaim", Judged),
    ("Volume", "photonPersistentDisk", NotJudged(STORAGE_DRIVER)),
    ("Volume", "portworxVolume", NotJudged(STORAGE_DRIVER)),
    ("Volume", "projected", Judged),
    ("Volume", "quobyte", NotJudged(STORAGE_DRIVER)),
    ("Volume", "rbd", NotJudged(STORAGE_DRIVER)),
    ("Volume", "scaleIO", NotJudged(STORAGE_DRIVER)),
    ("Volume", "secret", Judged),
    ("Volume", "storageos", NotJudged(STORAGE_DRIVER)),
    ("Volume", "vsphereVolume", NotJudged(STORAGE_DRIVER)),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde::de::{self, Deserialize, Deserializer, Visitor};

    use super::{Account, POD_FIELDS};

    /// A deserializer that only notes the field names a type asks for (`deserialize_struct` is told them all)
    /// and then fails: the fields of a k8s-openapi type, as its `Deserialize` knows them.
    struct Fields(Vec<&'static str>);

    #[derive(Debug)]
    struct Noted;

    impl std::fmt::Display for Noted {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("fields noted")
        }
    }

    impl std::error::Error for Noted {}

    impl de::Error for Noted {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Noted
        }
    }

    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = Noted;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Noted> {
            Err(Noted)
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Noted> {
            self.0.extend_from_slice(fields);
            Err(Noted)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    fn fields_of<T: for<'de> Deserialize<'de>>() -> Vec<&'static str> {
        let mut fields = Fields(Vec::new());
        let _ = T::deserialize(&mut fields);
        fields.0
    }

    /// Issue 35: every field of the pod's types is judged or listed with the reason it is not, and the list
    /// names no field the types do not have.
    #[test]
    fn every_field_of_the_pod_types_is_accounted_for() {
        use k8s_openapi::api::core::v1::{Container, PodSpec, Volume};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let types = [
            ("ObjectMeta", fields_of::<ObjectMeta>()),
            ("PodSpec", fields_of::<PodSpec>()),
            ("Container", fields_of::<Container>()),
            ("Volume", fields_of::<Volume>()),
        ];
        let mut in_the_types = BTreeSet::new();
        for (kind, fields) in &types {
            assert!(fields.len() >= 10, "{kind}: the fields are read from its Deserialize: {fields:?}");
            in_the_types.extend(fields.iter().map(|field| (*kind, *field)));
        }
        let accounted: BTreeSet<(&str, &str)> = POD_FIELDS.iter().map(|(kind, field, _)| (*kind, *field)).collect();
        let missing: Vec<_> = in_the_types.difference(&accounted).collect();
        assert!(
            missing.is_empty(),
            "fields neither judged nor listed with a reason (core/src/validation/fields.rs): {missing:?}"
        );
        let stale: Vec<_> = accounted.difference(&in_the_types).collect();
        assert!(stale.is_empty(), "listed fields the types do not have: {stale:?}");
        assert_eq!(accounted.len(), POD_FIELDS.len(), "each field listed once");
        for (kind, field, account) in POD_FIELDS {
            if let Account::NotJudged(reason) = account {
                assert!(reason.len() > 10, "{kind}.{field}: a reason, not a placeholder");
            }
        }
    }

    /// A field listed as judged is one the validator reads: setting it to a value of the wrong shape for its
    /// rules gives an error at that field (a spot check over the judged fields that hold a string).
    #[test]
    fn judged_string_fields_are_read_by_the_validator() {
        use serde_json::json;
        for (field, value) in [
            ("dnsPolicy", "Sometimes"),
            ("hostname", "Bad_Host"),
            ("nodeName", "Bad_Node"),
            ("priorityClassName", "Bad_Class"),
            ("restartPolicy", "Sometimes"),
            ("runtimeClassName", "Bad_Class"),
            ("serviceAccountName", "Bad_Account"),
            ("subdomain", "Bad_Sub"),
        ] {
            assert!(POD_FIELDS.contains(&("PodSpec", field, Account::Judged)), "{field}");
            let mut pod = json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "a", "image": "a"}]}});
            pod["spec"][field] = json!(value);
            let errors = super::super::validate_pod(&pod, super::super::KubeVersion::DEFAULT);
            assert!(errors.iter().any(|e| e.path.to_string() == format!("spec.{field}")), "{field}: {errors:?}");
        }
    }
}
