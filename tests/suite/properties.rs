//! Properties of every patch, over generated pods and over the real pods in `tests/corpus`: the patch applies
//! (checked with the independent `json-patch` crate), has only `add`s, overwrites nothing present, keeps every
//! original value, keeps container/init container/volume names unique, a second run gives no patch, and the
//! validating webhook passes the injected pod and fails the original.

use crate::common;

use common::*;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use sidecar_injector_core::validation::KubeVersion;
use sidecar_injector_core::{Engine, Settings, TemplateSet};

/// Templates the properties are checked against: the shipped ones and one heavy on defaults; the one that holds
/// the app until its sidecar is ready in both its shapes (a native sidecar, and below 1.29 first in the list).
fn engines() -> Vec<(&'static str, Engine)> {
    let native = std::fs::read_to_string("templates/native-sidecar.yaml").unwrap();
    let restricted = std::fs::read_to_string("templates/restricted.yaml").unwrap();
    let wait = std::fs::read_to_string("templates/wait-for-sidecar.yaml").unwrap();
    let below_1_29 = Settings { kubernetes_version: KubeVersion::new(28), ..Settings::default() };
    let wait_below_1_29 =
        Engine::new(TemplateSet::from_source("wait", "wait.yaml", &wait, &below_1_29).unwrap(), &below_1_29);
    let defaults = r#"
pod:
  metadata: { labels: { "team.example.com/mesh": "on" }, annotations: { "example.com/b.c": "x" } }
  spec:
    containers:
      - name: proxy
        image: proxy:1
        env: [{ name: POD, value: "{{ pod.name or pod.generateName }}" }]
        volumeMounts: [{ name: shared, mountPath: /shared }]
        ports: [{ containerPort: 15000 }]
    volumes: [{ name: shared, emptyDir: {} }]
    imagePullSecrets: [{ name: registry }]
    securityContext: { runAsNonRoot: true, fsGroup: 1337, seccompProfile: { type: RuntimeDefault } }
    tolerations: [{ key: mesh, operator: Exists }]
containerDefaults:
  resources: { requests: { cpu: 10m, memory: 16Mi }, limits: { memory: 1Gi } }
  env: [{ name: MESH, value: "on" }]
  securityContext: { allowPrivilegeEscalation: false }
"#;
    vec![
        ("builtin", builtin()),
        ("native-sidecar", engine_from(&native)),
        ("restricted", engine_from(&restricted)),
        ("wait-for-sidecar", engine_from(&wait)),
        ("wait-for-sidecar at 1.28", wait_below_1_29),
        ("defaults", engine_from(defaults)),
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("app".to_owned()),
        Just("proxy".to_owned()),
        Just("proxy-init".to_owned()),
        Just("agent".to_owned()),
        Just("sidecar-injector-proxy".to_owned()),
        Just("shared".to_owned()),
        "[a-z]{1,8}",
    ]
}

/// Strings with the bytes that break naive injectors: quotes, backslashes, control characters, slashes and
/// tildes (JSON Pointer), non-ASCII and U+2028.
fn awkward() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9./~-]{0,12}", "\\PC{0,12}", Just("q\"b\\s/t~0~1\n\u{2028}é".to_owned())]
}

/// An optional map or list in one of the shapes that matter: absent, null, empty, or with content.
fn shape(content: BoxedStrategy<Value>) -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        Just(Some(Value::Null)),
        Just(Some(json!({}))),
        Just(Some(json!([]))),
        content.prop_map(Some)
    ]
}

fn string_map() -> BoxedStrategy<Value> {
    prop::collection::btree_map(
        prop_oneof![
            awkward(),
            Just("app".to_owned()),
            Just("sidecar-injector.io/inject".to_owned()),
            Just(SAFE_TO_EVICT.to_owned())
        ],
        prop_oneof![
            awkward(),
            Just("shared".to_owned()),
            Just(" cache, shared,".to_owned()),
            Just("cache,".to_owned())
        ],
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k, Value::String(v))).collect()))
    .boxed()
}

fn container() -> impl Strategy<Value = Value> {
    (
        name(),
        shape(
            prop::collection::vec((env_name(), awkward(), any::<bool>()), 0..3)
                .prop_map(|e| {
                    let var = |(name, value, from_secret): (String, String, bool)| match from_secret {
                        true => json!({"name": name, "valueFrom": {"secretKeyRef": {"name": "s", "key": value}}}),
                        false => json!({"name": name, "value": value}),
                    };
                    json!(e.into_iter().map(var).collect::<Vec<_>>())
                })
                .boxed(),
        ),
        shape(
            prop::collection::vec(
                prop_oneof![Just("/shared".to_owned()), Just("/var/run/proxy".to_owned()), "/[a-z]{1,5}"],
                0..3,
            )
            .prop_map(|m| json!(m.into_iter().map(|p| json!({"name": "vol", "mountPath": p})).collect::<Vec<_>>()))
            .boxed(),
        ),
        shape(
            prop_oneof![
                Just(json!({"requests": {"cpu": "1"}})),
                Just(json!({"limits": {"memory": "1Gi"}})),
                Just(json!({"requests": {"memory": "4Gi"}})),
                Just(json!({"limits": {"cpu": "5m"}, "requests": null})),
                Just(json!({"requests": {}}))
            ]
            .boxed(),
        ),
        prop::option::of(prop_oneof![
            Just(json!([{"containerPort": 15000, "name": "taken"}])),
            Just(json!([{"containerPort": 9901, "name": "proxy-admin"}])),
        ]),
        prop::option::of(Just(json!({"exec": {"command": ["true"]}}))),
    )
        .prop_map(|(name, env, mounts, resources, ports, probe)| {
            let mut c = Map::new();
            c.insert("name".into(), json!(name));
            c.insert("image".into(), json!("img:1"));
            let fields = [
                ("env", env),
                ("volumeMounts", mounts),
                ("resources", resources),
                ("ports", ports),
                ("readinessProbe", probe),
            ];
            for (key, value) in fields {
                if let Some(v) = value {
                    c.insert(key.into(), v);
                }
            }
            Value::Object(c)
        })
}

/// A volume: an emptyDir, or a configMap (a source the templates' emptyDirs must not be added beside).
fn volume((name, config_map): (String, bool)) -> Value {
    match config_map {
        true => json!({"name": name, "configMap": {"name": "cfg"}}),
        false => json!({"name": name, "emptyDir": {}}),
    }
}

/// Env var names, among them those the templates inject.
fn env_name() -> impl Strategy<Value = String> {
    prop_oneof![name(), Just("POD_IP".to_owned()), Just("POD".to_owned()), Just("MESH".to_owned())]
}

fn unique_by_name(items: Vec<Value>) -> Value {
    let mut seen = std::collections::HashSet::new();
    Value::Array(items.into_iter().filter(|c| seen.insert(c["name"].as_str().unwrap_or("").to_owned())).collect())
}

prop_compose! {
    fn pod()(
        named in any::<bool>(),
        pod_name in "[a-z][a-z0-9-]{0,10}",
        labels in shape(string_map()),
        annotations in shape(string_map()),
        containers in prop::collection::vec(container(), 1..4),
        init in shape(prop::collection::vec(container(), 1..3).prop_map(unique_by_name).boxed()),
        volumes in shape(prop::collection::vec((name(), any::<bool>()), 1..3).prop_map(|v| unique_by_name(v.into_iter().map(volume).collect())).boxed()),
        security in shape(prop_oneof![Just(json!({"runAsNonRoot": false})), Just(json!({"seccompProfile": {}})), Just(json!({"fsGroup": 1}))].boxed()),
        pull in shape(Just(json!([{"name": "registry"}])).boxed()),
    ) -> Value {
        let mut metadata = Map::new();
        metadata.insert(if named { "name" } else { "generateName" }.into(), json!(pod_name));
        if let Some(l) = labels { metadata.insert("labels".into(), l); }
        if let Some(a) = annotations { metadata.insert("annotations".into(), a); }
        let mut spec = Map::new();
        spec.insert("containers".into(), unique_by_name(containers));
        for (key, value) in [("initContainers", init), ("volumes", volumes), ("securityContext", security), ("imagePullSecrets", pull)] {
            if let Some(v) = value { spec.insert(key.into(), v); }
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
    }
}

/// A JSON `[]` where the API expects a map (or `{}` for a list) is not a valid pod; the engine must still be
/// safe, but the shape generator should mostly produce valid ones. Replace mismatched empties.
fn normalise(mut pod: Value) -> Value {
    for (section, key, want_list) in [
        ("metadata", "labels", false),
        ("metadata", "annotations", false),
        ("spec", "securityContext", false),
        ("spec", "initContainers", true),
        ("spec", "volumes", true),
        ("spec", "imagePullSecrets", true),
    ] {
        let slot = &mut pod[section][key];
        match (slot.is_array(), slot.is_object(), want_list) {
            (true, _, false) => *slot = json!({}),
            (_, true, true) if slot.as_object().unwrap().is_empty() => *slot = json!([]),
            _ => {}
        }
    }
    for c in pod["spec"]["containers"].as_array_mut().unwrap() {
        for (key, want_list) in [("env", true), ("volumeMounts", true), ("resources", false)] {
            if let Some(slot) = c.get_mut(key) {
                match (slot.is_array(), slot.is_object(), want_list) {
                    (true, _, false) => *slot = json!({}),
                    (_, true, true) => *slot = json!([]),
                    _ => {}
                }
            }
        }
    }
    pod
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn generated_pods_satisfy_every_property(pod in pod().prop_map(normalise)) {
        for (_, engine) in engines() {
            check_properties(&engine, &pod);
        }
    }

    #[test]
    fn mismatched_shapes_never_break_the_engine(pod in pod()) {
        // Lists where maps belong and vice versa: the API server would reject such a pod, but our answer must
        // still be a valid, add-only patch that applies.
        for (_, engine) in engines() {
            if let Some(patch) = patch_for(&engine, &pod) {
                apply(&pod, &patch);
                prop_assert!(patch.as_array().unwrap().iter().all(|op| op["op"] == "add"));
            }
        }
    }
}

fn corpus_pods() -> Vec<(String, Value)> {
    let dir = corpus("pods");
    let mut pods: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let pod = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            (path.display().to_string(), pod)
        })
        .collect();
    pods.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(pods.len() > 300, "the corpus has {} pods", pods.len());
    pods
}

#[test]
fn every_corpus_pod_satisfies_every_property() {
    let engines = engines();
    let mut injected = 0;
    for (file, pod) in corpus_pods() {
        for (template, engine) in &engines {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_properties(engine, &pod)));
            assert!(result.is_ok(), "{file} with template {template}");
            injected += usize::from(patch_for(engine, &pod).is_some());
        }
    }
    assert!(injected > 900, "most corpus pods are injected by every template ({injected})");
}

#[test]
fn the_real_apiserver_request_satisfies_every_property() {
    let request: Value = serde_json::from_slice(&recorded_review()).unwrap();
    // The object carries no namespace (kubectl sent none): the review's is the pod's.
    let mut pod = request["request"]["object"].clone();
    pod["metadata"]["namespace"] = request["request"]["namespace"].clone();
    for (_, engine) in engines() {
        let (_, _, patch) = answer(&engine, &request);
        assert_eq!(patch.as_ref(), patch_for(&engine, &pod).as_ref());
        check_properties(&engine, &pod);
    }
}
