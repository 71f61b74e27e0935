//! The engine's rules, one test each, with the exact patch where the exact patch is the point.

use crate::common;

use common::*;
use serde_json::{Value, json};
use sidecar_injector_core::{ApiVersion, ReviewError, SkipReason, Verdict};

const SMALL: &str = r#"
pod:
  metadata:
    labels: { injected: "yes" }
    # `~` would be escaped too (core/src/json.rs), but the API server refuses it in an annotation key.
    annotations: { "example.com/a.b": v }
  spec:
    initContainers:
      - { name: init, image: "init:1" }
    containers:
      - name: side
        image: "side:1"
        env: [{ name: A, value: "1" }]
    volumes:
      - { name: data, emptyDir: {} }
    securityContext:
      runAsNonRoot: true
      seccompProfile: { type: RuntimeDefault }
"#;

fn small() -> sidecar_injector_core::Engine {
    engine_from(SMALL)
}

fn full_pod() -> Value {
    json!({
        "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"keep": "me"}},
        "spec": {
            "initContainers": [{"name": "migrate", "image": "m:1"}],
            "containers": [{"name": "web", "image": "nginx"}],
            "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}],
            "securityContext": {"runAsUser": 1000}
        }
    })
}

fn status(engine: &sidecar_injector_core::Engine) -> String {
    engine.template().status().to_owned()
}

#[test]
fn present_maps_and_lists_get_one_add_per_new_member_with_escaped_keys() {
    let engine = small();
    let patch = patch_for(&engine, &full_pod()).unwrap();
    assert_eq!(
        patch,
        json!([
            {"op": "add", "path": "/metadata/labels/injected", "value": "yes"},
            {"op": "add", "path": "/metadata/annotations/example.com~1a.b", "value": "v"},
            {"op": "add", "path": "/metadata/annotations/kubectl.kubernetes.io~1default-container", "value": "web"},
            {"op": "add", "path": "/metadata/annotations/cluster-autoscaler.kubernetes.io~1safe-to-evict-local-volumes", "value": "data"},
            {"op": "add", "path": "/metadata/annotations/sidecar-injector.io~1status", "value": status(&engine)},
            {"op": "add", "path": "/spec/initContainers/0", "value": {"name": "init", "image": "init:1"}},
            {"op": "add", "path": "/spec/containers/-", "value": {"name": "side", "image": "side:1", "env": [{"name": "A", "value": "1"}]}},
            {"op": "add", "path": "/spec/volumes/-", "value": {"name": "data", "emptyDir": {}}},
            {"op": "add", "path": "/spec/securityContext/runAsNonRoot", "value": true},
            {"op": "add", "path": "/spec/securityContext/seccompProfile", "value": {"type": "RuntimeDefault"}}
        ])
    );
}

#[test]
fn absent_null_and_empty_maps_and_lists_get_one_add_of_the_whole_value() {
    let engine = small();
    for empty in [Value::Null, json!({}), json!("absent")] {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app", "image": "a"}]}});
        for (section, key) in [("metadata", "labels"), ("metadata", "annotations"), ("spec", "securityContext")] {
            if empty != json!("absent") {
                pod[section][key] = empty.clone();
            }
        }
        for list in ["initContainers", "volumes"] {
            match &empty {
                Value::Null => pod["spec"][list] = Value::Null,
                Value::Object(_) => pod["spec"][list] = json!([]),
                _ => {}
            }
        }
        let patch = patch_for(&engine, &pod).unwrap();
        let paths: Vec<&str> = patch.as_array().unwrap().iter().map(|op| op["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/metadata/labels",
                "/metadata/annotations",
                "/spec/initContainers",
                "/spec/containers/-",
                "/spec/volumes",
                "/spec/securityContext"
            ],
            "for {empty}"
        );
        let annotations = json!({
            "example.com/a.b": "v",
            "kubectl.kubernetes.io/default-container": "app",
            "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes": "data",
            "sidecar-injector.io/status": status(&engine)
        });
        assert_eq!(patch[1]["value"], annotations);
        assert_eq!(patch[2]["value"], json!([{"name": "init", "image": "init:1"}]));
        assert_eq!(patch[5]["value"], json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}));
    }
}

#[test]
fn defaults_are_added_leaf_by_leaf_and_never_overwrite() {
    let engine = small();
    let mut pod = full_pod();
    pod["spec"]["securityContext"] =
        json!({"runAsNonRoot": false, "seccompProfile": {"type": "Localhost", "localhostProfile": "x.json"}});
    let patch = patch_for(&engine, &pod).unwrap();
    assert!(
        !patch.as_array().unwrap().iter().any(|op| op["path"].as_str().unwrap().starts_with("/spec/securityContext")),
        "the user's securityContext is complete and must not be touched: {patch}"
    );
    pod["spec"]["securityContext"] = json!({"seccompProfile": {"localhostProfile": "x.json"}});
    let patch = patch_for(&engine, &pod).unwrap();
    let ops = ops_under(&patch, "/spec/securityContext");
    assert_eq!(
        ops,
        [
            &json!({"op": "add", "path": "/spec/securityContext/runAsNonRoot", "value": true}),
            &json!({"op": "add", "path": "/spec/securityContext/seccompProfile/type", "value": "RuntimeDefault"})
        ]
    );
}

#[test]
fn a_user_declared_sidecar_keeps_every_field_the_user_set() {
    let engine = small();
    let mut pod = full_pod();
    pod["spec"]["containers"] = json!([
        {"name": "web", "image": "nginx"},
        {"name": "side", "image": "mine:2", "env": [{"name": "A", "value": "mine"}, {"name": "B", "value": "b"}]}
    ]);
    let patch = patch_for(&engine, &pod).unwrap();
    assert!(!patch.to_string().contains("/spec/containers"), "nothing to add to the user's sidecar: {patch}");

    pod["spec"]["containers"][1] = json!({"name": "side", "image": "mine:2", "env": [{"name": "B", "value": "b"}]});
    let patch = patch_for(&engine, &pod).unwrap();
    let container_ops = ops_under(&patch, "/spec/containers");
    assert_eq!(
        container_ops,
        [&json!({"op": "add", "path": "/spec/containers/1/env/-", "value": {"name": "A", "value": "1"}})]
    );
    let patched = apply(&pod, &patch);
    assert_eq!(patched["spec"]["containers"][1]["image"], "mine:2");
    assert_eq!(patched["spec"]["containers"].as_array().unwrap().len(), 2);
}

#[test]
fn a_sidecar_the_pod_declares_in_the_other_container_list_is_not_added_again() {
    let engine = builtin();
    let mut pod = full_pod();
    // The user runs the proxy as a native sidecar (an init container that keeps running).
    pod["spec"]["initContainers"] = json!([{"name": "proxy", "image": "mine:1", "restartPolicy": "Always"}]);
    let patch = patch_for(&engine, &pod).unwrap();
    let added = |patch: &Value, list: &str| {
        let ops = ops_under(patch, &format!("/spec/{list}/"));
        ops.iter().map(|op| op["value"]["name"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(added(&patch, "initContainers"), ["proxy-init"]);
    assert_eq!(added(&patch, "containers"), Vec::<String>::new(), "no second `proxy`: {patch}");
    assert!(!ops_under(&patch, "/spec/volumes").is_empty(), "the rest of the injection goes on");
    check_properties(&engine, &pod);

    // A whole list the pod lacks is added without that container, or not at all.
    pod["spec"]["initContainers"] = json!(null);
    pod["spec"]["containers"] = json!([{"name": "web", "image": "nginx"}, {"name": "proxy-init", "image": "mine:1"}]);
    let patch = patch_for(&engine, &pod).unwrap();
    assert!(ops_under(&patch, "/spec/initContainers").is_empty(), "{patch}");
    assert_eq!(added(&patch, "containers"), ["proxy"]);
    check_properties(&engine, &pod);
}

#[test]
fn init_containers_go_first_in_template_order_or_last_when_configured() {
    let two = SMALL.replace(
        "      - { name: init, image: \"init:1\" }",
        "      - { name: init, image: \"init:1\" }\n      - { name: native, image: \"n:1\", restartPolicy: Always }",
    );
    let patch = patch_for(&engine_from(&two), &full_pod()).unwrap();
    let inits: Vec<(&str, &str)> = ops_under(&patch, "/spec/initContainers")
        .into_iter()
        .map(|op| (op["path"].as_str().unwrap(), op["value"]["name"].as_str().unwrap()))
        .collect();
    assert_eq!(inits, [("/spec/initContainers/0", "init"), ("/spec/initContainers/1", "native")]);
    let patched = apply(&full_pod(), &patch);
    assert_eq!(names(&patched, "initContainers"), ["init", "native", "migrate"]);
    assert_eq!(patched["spec"]["initContainers"][1]["restartPolicy"], "Always");

    let last = format!("initContainerPosition: last\n{two}");
    let patched = apply(&full_pod(), &patch_for(&engine_from(&last), &full_pod()).unwrap());
    assert_eq!(names(&patched, "initContainers"), ["migrate", "init", "native"]);
}

#[test]
fn a_partly_present_init_list_completes_matches_before_inserting() {
    let two = SMALL.replace(
        "      - { name: init, image: \"init:1\" }",
        "      - { name: init, image: \"init:1\", args: [x] }\n      - { name: native, image: \"n:1\" }",
    );
    let mut pod = full_pod();
    pod["spec"]["initContainers"] = json!([{"name": "migrate", "image": "m"}, {"name": "init", "image": "mine"}]);
    let patch = patch_for(&engine_from(&two), &pod).unwrap();
    let patched = apply(&pod, &patch);
    assert_eq!(
        patched["spec"]["initContainers"],
        json!([
            {"name": "native", "image": "n:1"},
            {"name": "migrate", "image": "m"},
            {"name": "init", "image": "mine", "args": ["x"]}
        ])
    );
}

#[test]
fn container_defaults_reach_every_app_container_but_not_the_template_sidecar() {
    let template = format!("{SMALL}\ncontainerDefaults:\n  resources:\n    requests: {{ cpu: 10m }}\n");
    let engine = engine_from(&template);
    let mut pod = full_pod();
    pod["spec"]["containers"] = json!([
        {"name": "a", "image": "a", "resources": {}},
        {"name": "b", "image": "b", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
        {"name": "side", "image": "mine"},
        {"name": "c", "image": "c", "resources": {"limits": {"cpu": "2"}}}
    ]);
    let patch = patch_for(&engine, &pod).unwrap();
    let ops = ops_under(&patch, "/spec/containers");
    // `c` sized its CPU with a limit (its request defaults to it): that resource is the user's.
    assert_eq!(
        ops,
        [
            &json!({"op": "add", "path": "/spec/containers/0/resources", "value": {"requests": {"cpu": "10m"}}}),
            &json!({"op": "add", "path": "/spec/containers/2/env", "value": [{"name": "A", "value": "1"}]})
        ]
    );
    check_properties(&engine, &pod);
}

#[test]
fn a_mount_of_the_pods_own_volume_at_the_path_the_template_mounts_is_left_as_the_pod_has_it() {
    // The template mounts its volume read-only in every app container, at a path where one container already
    // mounts a volume of its own: that mount is the pod's (found by path, it is another volume's), so neither is
    // `readOnly` added to it nor a second mount at the path (the API server refuses two).
    let template = format!(
        "{SMALL}containerDefaults:\n  volumeMounts:\n    - {{ name: data, mountPath: /shared, readOnly: true }}\n"
    );
    let engine = engine_from(&template);
    let mut pod = full_pod();
    pod["spec"]["volumes"] = json!([{"name": "mine", "emptyDir": {}}]);
    pod["spec"]["containers"] = json!([
        {"name": "a", "image": "a", "volumeMounts": [{"name": "mine", "mountPath": "/shared"}]},
        {"name": "b", "image": "b"},
        {"name": "c", "image": "c", "volumeMounts": [{"name": "data", "mountPath": "/shared"}]}
    ]);
    let patch = patch_for(&engine, &pod).unwrap();
    let mounts: Vec<&Value> = ops_under(&patch, "/spec/containers")
        .into_iter()
        .filter(|op| op["path"].as_str().unwrap().contains("volumeMounts"))
        .collect();
    assert_eq!(
        mounts,
        [
            // `b` gets the mount; `c`, which mounts our volume there already, is completed.
            &json!({"op": "add", "path": "/spec/containers/1/volumeMounts", "value": [{"name": "data", "mountPath": "/shared", "readOnly": true}]}),
            &json!({"op": "add", "path": "/spec/containers/2/volumeMounts/0/readOnly", "value": true})
        ]
    );
    check_properties(&engine, &pod);
}

#[test]
fn completing_a_users_sidecar_never_sets_two_fields_the_api_server_accepts_one_of() {
    let engine = builtin();
    let mut pod = full_pod();
    pod["spec"]["containers"] = json!([
        {"name": "web", "image": "nginx", "resources": {"limits": {"cpu": "5m"}}},
        {
            "name": "proxy",
            "image": "mine:1",
            "env": [{"name": "POD_IP", "value": "10.0.0.1"}],
            "readinessProbe": {"exec": {"command": ["ready"]}},
            "startupProbe": {"tcpSocket": {"port": 15000}, "httpGet": null},
            "resources": {"requests": {"memory": "512Mi"}},
            "ports": [{"containerPort": 9901, "name": "proxy-admin"}]
        }
    ]);
    pod["spec"]["volumes"] = json!([{"name": "sidecar-injector-proxy", "configMap": {"name": "mine"}}]);
    let patch = patch_for(&engine, &pod).unwrap();
    let at = |path: &str| patch.as_array().unwrap().iter().find(|op| op["path"] == path).map(|op| &op["value"]);
    // The user's value, probe handlers and volume source stand alone; the rest of each object is completed.
    assert_eq!(at("/spec/containers/1/env/0/valueFrom"), None);
    assert_eq!(at("/spec/containers/1/readinessProbe/httpGet"), None);
    assert_eq!(at("/spec/containers/1/readinessProbe/periodSeconds"), Some(&json!(5)));
    assert_eq!(at("/spec/containers/1/startupProbe/httpGet"), None, "a null member is absent, but a rival is set");
    assert_eq!(at("/spec/volumes/0/emptyDir"), None);
    // Memory is sized by the user's request: no template limit (256Mi) below it; CPU is the template's.
    assert_eq!(at("/spec/containers/1/resources/requests/cpu"), Some(&json!("50m")));
    assert_eq!(at("/spec/containers/1/resources/limits"), Some(&json!({"cpu": "1000m"})));
    // The user gave the admin port's name to another port: the template's port would repeat the name.
    assert_eq!(ops_under(&patch, "/spec/containers/1/ports"), Vec::<&Value>::new());
    check_properties(&engine, &pod);

    // A map the pod lacks is added without the resources the other map sizes, or not at all.
    pod["spec"]["containers"][1]["resources"] = json!({"limits": {"memory": "32Mi"}});
    let patch = patch_for(&engine, &pod).unwrap();
    let ops = ops_under(&patch, "/spec/containers/1/resources");
    assert_eq!(
        ops,
        [
            &json!({"op": "add", "path": "/spec/containers/1/resources/requests", "value": {"cpu": "50m"}}),
            &json!({"op": "add", "path": "/spec/containers/1/resources/limits/cpu", "value": "1000m"}),
        ]
    );
    check_properties(&engine, &pod);
}

#[test]
fn pod_values_are_rendered_and_escaped_whatever_bytes_the_pod_carries() {
    let template = r#"
pod:
  spec:
    containers:
      - name: side
        image: "side:1"
        env:
          - { name: APP, value: "{{ pod.labels.app }}" }
          - { name: WHO, value: "{{ pod.name or pod.generateName }}.{{ pod.namespace }}@{{ pod.serviceAccountName }}" }
          - { name: NOTE, value: "{{ pod.annotations.note | default('none') }}" }
"#;
    let engine = engine_from(template);
    let hostile = "q\" b\\ \n\t\u{1} é 日本 \u{2028}\u{2029} </script> {{ x }}";
    let pod = json!({
        "metadata": {"generateName": "web-", "labels": {"app": hostile}, "annotations": {"note": hostile}},
        "spec": {"containers": [{"name": "web", "image": "nginx"}], "serviceAccountName": "robot"}
    });
    let patched = apply(&pod, &patch_for(&engine, &pod).unwrap());
    let env = &patched["spec"]["containers"][1]["env"];
    assert_eq!(env[0]["value"], hostile);
    assert_eq!(env[1]["value"], "web-.shop@robot", "namespace comes from the request when the pod has none");
    assert_eq!(env[2]["value"], hostile);
}

#[test]
fn a_template_that_fails_to_render_for_a_pod_admits_it_uninjected_with_a_warning() {
    let engine = engine_from("pod:\n  metadata:\n    labels:\n      v: \"{{ pod.labels.version }}\"\n");
    let (outcome, response, patch) = answer(&engine, &review(&full_pod()));
    assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::RenderFailed));
    assert_eq!(patch, None);
    assert_eq!(response["response"]["allowed"], true);
    let warning = response["response"]["warnings"][0].as_str().unwrap();
    assert!(warning.contains("shop/web") && warning.contains("pod.metadata.labels.v"), "{warning}");
}

#[test]
fn only_pod_creates_without_subresource_are_injected() {
    let engine = small();
    type Mutation = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Mutation, SkipReason)> = vec![
        (
            "deployment",
            Box::new(|r| r["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"})),
            SkipReason::NotAPod,
        ),
        ("update", Box::new(|r| r["request"]["operation"] = json!("UPDATE")), SkipReason::NotCreate),
        ("delete", Box::new(|r| r["request"]["operation"] = json!("DELETE")), SkipReason::NotCreate),
        ("connect", Box::new(|r| r["request"]["operation"] = json!("CONNECT")), SkipReason::NotCreate),
        ("status", Box::new(|r| r["request"]["subResource"] = json!("status")), SkipReason::Subresource),
        (
            "ephemeral",
            Box::new(|r| r["request"]["subResource"] = json!("ephemeralcontainers")),
            SkipReason::Subresource,
        ),
        ("no object", Box::new(|r| r["request"]["object"] = Value::Null), SkipReason::NoObject),
        (
            "mirror",
            Box::new(|r| {
                r["request"]["object"]["metadata"]["annotations"]["kubernetes.io/config.mirror"] = json!("abc")
            }),
            SkipReason::MirrorPod,
        ),
        (
            "opt-out annotation",
            Box::new(|r| {
                r["request"]["object"]["metadata"]["annotations"]["sidecar-injector.io/inject"] = json!("false")
            }),
            SkipReason::OptedOut,
        ),
        (
            "opt-out label",
            Box::new(|r| r["request"]["object"]["metadata"]["labels"]["sidecar-injector.io/inject"] = json!("False")),
            SkipReason::OptedOut,
        ),
        (
            "host network",
            Box::new(|r| r["request"]["object"]["spec"]["hostNetwork"] = json!(true)),
            SkipReason::HostNetwork,
        ),
    ];
    for (name, mutate, reason) in cases {
        let mut r = review(&full_pod());
        mutate(&mut r);
        let (outcome, response, patch) = answer(&engine, &r);
        assert_eq!(outcome.verdict, Verdict::Skipped(reason), "{name}");
        assert_eq!(patch, None, "{name}");
        assert_eq!(
            response["response"],
            json!({"uid": "0f7c1e9a-uid", "allowed": true}),
            "{name}: no patchType without patch"
        );
    }
    // Opting in explicitly, and dry runs, inject as usual.
    let mut r = review(&full_pod());
    r["request"]["object"]["metadata"]["annotations"]["sidecar-injector.io/inject"] = json!("true");
    r["request"]["dryRun"] = json!(true);
    assert!(matches!(answer(&engine, &r).0.verdict, Verdict::Injected { .. }));
}

/// A required node affinity whose terms each carry these `kubernetes.io/os` requirements, `(operator, values)`.
fn os_affinity(terms: &[(&str, &[&str])]) -> Value {
    let terms: Vec<Value> = terms
        .iter()
        .map(|(operator, values)| {
            json!({"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "Exists"},
                {"key": "kubernetes.io/os", "operator": operator, "values": values}
            ]})
        })
        .collect();
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
}

#[test]
fn pods_for_windows_nodes_only_are_skipped_and_others_injected() {
    let engine = small();
    let windows: Vec<(&str, &str, Value)> = vec![
        ("os.name", "os", json!({"name": "windows"})),
        ("node selector", "nodeSelector", json!({"kubernetes.io/os": "windows", "disk": "ssd"})),
        ("affinity", "affinity", os_affinity(&[("In", &["windows"])])),
        ("affinity, every term", "affinity", os_affinity(&[("In", &["windows"]), ("In", &["windows"])])),
    ];
    for (name, field, value) in windows {
        let mut pod = full_pod();
        pod["spec"][field] = value;
        let (outcome, response, patch) = answer(&engine, &review(&pod));
        assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::Windows), "{name}");
        assert_eq!((patch, response["response"].get("warnings")), (None, None), "{name}");
        assert_eq!(validation(&engine, &pod), Verdict::Skipped(SkipReason::Windows), "{name}: /validate agrees");
    }
    // A pod that may land on a Linux node is injected as usual.
    let linux: Vec<(&str, &str, Value)> = vec![
        ("os.name linux", "os", json!({"name": "linux"})),
        ("node selector linux", "nodeSelector", json!({"kubernetes.io/os": "linux"})),
        ("another label is windows", "nodeSelector", json!({"example.com/os": "windows"})),
        ("one term admits linux", "affinity", os_affinity(&[("In", &["windows"]), ("In", &["linux"])])),
        ("In windows or linux", "affinity", os_affinity(&[("In", &["windows", "linux"])])),
        ("NotIn windows", "affinity", os_affinity(&[("NotIn", &["windows"])])),
        (
            "no terms",
            "affinity",
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}),
        ),
        (
            "preferred only",
            "affinity",
            json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]}}
            ]}}),
        ),
    ];
    for (name, field, value) in linux {
        let mut pod = full_pod();
        pod["spec"][field] = value;
        let (outcome, _, _) = answer(&engine, &review(&pod));
        assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{name}: {outcome:?}");
        check_properties(&engine, &pod);
    }
}

const LOCAL_VOLUMES: &str = r#"
pod:
  spec:
    containers:
      - name: side
        image: "side:1"
        volumeMounts: [{ name: data, mountPath: /data }, { name: host, mountPath: /host }]
    volumes:
      - { name: data, emptyDir: {} }
      - { name: host, hostPath: { path: /var/run/side } }
      - { name: cfg, configMap: { name: side } }
"#;

#[test]
fn injected_local_volumes_are_named_for_the_cluster_autoscaler_beside_the_pods_own() {
    let engine = engine_from(LOCAL_VOLUMES);
    let path = "/metadata/annotations/cluster-autoscaler.kubernetes.io~1safe-to-evict-local-volumes";
    // Without the annotation: the template's emptyDir and hostPath volumes, not its configMap.
    let patch = patch_for(&engine, &full_pod()).unwrap();
    assert_eq!(ops_under(&patch, path), [&json!({"op": "add", "path": path, "value": "data,host"})]);
    check_properties(&engine, &full_pod());
    // With the pod's own list: kept as written, the names it lacks appended, in one add.
    for (own, merged) in
        [("mine", Some("mine,data,host")), ("mine, data,", Some("mine, data,host")), ("", Some("data,host"))]
    {
        let mut pod = full_pod();
        pod["metadata"]["annotations"][SAFE_TO_EVICT] = json!(own);
        let patch = patch_for(&engine, &pod).unwrap();
        let expected: Vec<Value> = merged.map(|m| json!({"op": "add", "path": path, "value": m})).into_iter().collect();
        assert_eq!(ops_under(&patch, path), expected.iter().collect::<Vec<_>>(), "{own:?}");
        let injected = apply(&pod, &patch);
        assert_eq!(patch_for(&engine, &injected), None, "{own:?}: idempotent");
        check_properties(&engine, &pod);
    }
    // A list that names them already gets nothing more, whatever else the pod lacks.
    let mut pod = full_pod();
    pod["metadata"]["annotations"][SAFE_TO_EVICT] = json!("host , data");
    assert!(ops_under(&patch_for(&engine, &pod).unwrap(), path).is_empty());
    // A template without local volumes writes no such annotation.
    assert!(ops_under(&patch_for(&small_without_volumes(), &full_pod()).unwrap(), path).is_empty());
    // A template that writes the annotation itself gets the injected names added to its own.
    let own = LOCAL_VOLUMES.replace(
        "pod:\n",
        "pod:\n  metadata: { annotations: { cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes: logs } }\n",
    );
    let patch = patch_for(&engine_from(&own), &full_pod()).unwrap();
    assert_eq!(ops_under(&patch, path), [&json!({"op": "add", "path": path, "value": "logs,data,host"})]);
    // /validate names the annotation when the pod's list lacks one of ours.
    let mut pod = apply(&full_pod(), &patch_for(&engine, &full_pod()).unwrap());
    pod["metadata"]["annotations"][SAFE_TO_EVICT] = json!("data");
    assert!(matches!(validation(&engine, &pod), Verdict::Incomplete { missing: 1, .. }));
}

fn small_without_volumes() -> sidecar_injector_core::Engine {
    engine_from("pod:\n  spec:\n    containers: [{ name: side, image: \"side:1\" }]\n")
}

const DEFAULTS_FOR: &str = r#"
pod:
  spec:
    containers: [{ name: side, image: "side:1" }]
    volumes: [{ name: shared, emptyDir: {} }]
containerDefaults:
  env: [{ name: MESH, value: "on" }]
  volumeMounts: [{ name: shared, mountPath: /shared }]
"#;

/// The names of the pod's containers that got the defaults (the env var `MESH`).
fn reached(engine: &sidecar_injector_core::Engine, pod: &Value) -> Vec<String> {
    let patched = apply(pod, &patch_for(engine, pod).unwrap());
    let containers = patched["spec"]["containers"].as_array().unwrap();
    let has_mesh = |c: &&Value| c["env"].as_array().is_some_and(|e| e.iter().any(|v| v["name"] == "MESH"));
    containers.iter().filter(has_mesh).map(|c| c["name"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn container_defaults_reach_the_containers_the_template_or_the_pod_names() {
    let mut pod = full_pod();
    pod["spec"]["containers"] =
        json!([{"name": "web", "image": "nginx"}, {"name": "worker", "image": "w"}, {"name": "log", "image": "l"}]);
    // Every container of the pod's own, by default.
    assert_eq!(reached(&engine_from(DEFAULTS_FOR), &pod), ["web", "worker", "log"]);
    // The template's setting.
    let limited = engine_from(&format!("{DEFAULTS_FOR}containerDefaultsFor: [web, worker]\n"));
    assert_eq!(reached(&limited, &pod), ["web", "worker"]);
    check_properties(&limited, &pod);
    // The pod's annotation wins over the setting, and no warning calls it unknown.
    for (annotation, expected) in [("log", vec!["log"]), (" worker , web", vec!["web", "worker"]), ("", vec![])] {
        let mut annotated = pod.clone();
        annotated["metadata"]["annotations"]["sidecar-injector.io/containers"] = json!(annotation);
        assert_eq!(reached(&limited, &annotated), expected, "{annotation:?}");
        let (_, response, _) = answer(&limited, &review(&annotated));
        assert!(response["response"].get("warnings").is_none(), "{response}");
        check_properties(&limited, &annotated);
    }
    // A setting that is not a list of names is refused at its line.
    let error = sidecar_injector_core::TemplateSet::from_source(
        "t",
        "t.yaml",
        &format!("{DEFAULTS_FOR}containerDefaultsFor: web\n"),
        &Default::default(),
    );
    assert!(error.unwrap_err().to_string().contains("`containerDefaultsFor` must be a list of container names"));
}

#[test]
fn v1beta1_is_answered_in_v1beta1_with_the_uid_copied() {
    let mut r = review(&full_pod());
    r["apiVersion"] = json!("admission.k8s.io/v1beta1");
    r["request"]["uid"] = json!("weird \"uid\" \\ é");
    let (outcome, response, patch) = answer(&small(), &r);
    assert_eq!(outcome.version, ApiVersion::V1Beta1);
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(response["kind"], "AdmissionReview");
    assert_eq!(response["response"]["uid"], "weird \"uid\" \\ é");
    assert_eq!(response["response"]["patchType"], "JSONPatch");
    assert!(patch.is_some());
}

#[test]
fn a_pod_injected_by_another_template_version_is_left_alone_with_a_warning() {
    let mut pod = full_pod();
    pod["metadata"]["annotations"]["sidecar-injector.io/status"] =
        json!("{\"template\":\"default\",\"version\":\"0000\"}");
    let (outcome, response, patch) = answer(&small(), &review(&pod));
    assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::InjectedByOtherVersion));
    assert_eq!(patch, None);
    assert!(response["response"]["warnings"][0].as_str().unwrap().contains("another template version"));
}

#[test]
fn a_pod_with_our_status_but_a_missing_part_gets_only_that_part_back() {
    let engine = small();
    let injected = apply(&full_pod(), &patch_for(&engine, &full_pod()).unwrap());
    assert_eq!(patch_for(&engine, &injected), None, "idempotent");
    let mut stripped = injected.clone();
    stripped["spec"]["volumes"].as_array_mut().unwrap().retain(|v| v["name"] != "data");
    assert_eq!(
        patch_for(&engine, &stripped).unwrap(),
        json!([{"op": "add", "path": "/spec/volumes/-", "value": {"name": "data", "emptyDir": {}}}])
    );
}

/// The review as the oldest and the newest API server the suite runs sent it: the same answer.
#[test]
fn the_builtin_template_injects_the_real_apiserver_request_once() {
    for (recording, body) in recorded_reviews() {
        let request: Value = serde_json::from_slice(&body).unwrap();
        let engine = builtin();
        let (outcome, response, patch) = answer(&engine, &request);
        assert_eq!(outcome.verdict, Verdict::Injected { ops: 5 }, "{recording}");
        assert_eq!(response["response"]["uid"], request["request"]["uid"], "{recording}");
        let pod = &request["request"]["object"];
        let patched = apply(pod, &patch.unwrap());
        assert_eq!(names(&patched, "containers"), ["c", "proxy"], "{recording}");
        let env = &patched["spec"]["containers"][1]["env"][3];
        assert_eq!(env, &json!({"name": "PROXY_SERVICE_NAME", "value": "demo"}), "{recording}");
        assert_eq!(patched["metadata"]["managedFields"], pod["metadata"]["managedFields"], "{recording}");
        check_properties(&engine, pod);
    }
}

fn error_for(body: &[u8]) -> String {
    let mut body = body.to_vec();
    let err: ReviewError = builtin().review(&mut body, &mut Vec::new()).unwrap_err();
    err.to_string()
}

#[test]
fn malformed_requests_get_a_one_line_reason_naming_what_is_wrong() {
    let valid = serde_json::to_string(&review(&full_pod())).unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"".to_vec(), "empty"),
        (b"  \n".to_vec(), "empty"),
        (b"hello".to_vec(), "not valid JSON"),
        (valid.as_bytes()[..valid.len() / 2].to_vec(), "not valid JSON"),
        (format!("{valid} trailing").into_bytes(), "not valid JSON"),
        ([&valid.as_bytes()[..40], b"\xff\xfe", &valid.as_bytes()[40..]].concat(), "not valid JSON"),
        (b"[1,2]".to_vec(), "not an AdmissionReview"),
        (b"12".to_vec(), "not an AdmissionReview"),
        (br#"{"kind":"Pod","apiVersion":"v1"}"#.to_vec(), "kind is not AdmissionReview"),
        (br#"{"apiVersion":"admission.k8s.io/v1"}"#.to_vec(), "kind is missing"),
        (br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v2"}"#.to_vec(), "unsupported AdmissionReview apiVersion \"admission.k8s.io/v2\""),
        (br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#.to_vec(), "request is missing"),
        (br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":null}"#.to_vec(), "request is null"),
        (br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{}}"#.to_vec(), "request.uid is missing"),
        (br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":7}}"#.to_vec(), "request.uid is not a string"),
        (br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":""}}"#.to_vec(), "request.uid is empty"),
        // Issue 51: the answer echoes the uid; one longer than the API server's is refused before anything.
        (format!(r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"{}"}}}}"#, "u".repeat(37)).into_bytes(), "request.uid is longer than the API server's UIDs (36 characters)"),
        (format!(r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"{}"}}}}"#, "u".repeat(4 << 20)).into_bytes(), "request.uid is longer"),
        (br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"u","operation":"CREATE"}}"#.to_vec(), "request.kind is missing"),
        ((0..100_000).map(|_| b'[').collect(), "nesting deeper than 256"),
    ];
    for (body, expected) in cases {
        let message = error_for(&body);
        assert!(message.contains(expected), "{message:?} should mention {expected:?}");
        assert!(!message.contains('\n'), "one line: {message:?}");
    }
}

/// Issue 51: an answer echoes the pod's names (in messages, in the default-container annotation, in what templates
/// render). Each value longer than the API server lets a pod have is refused up front, naming the field, and one
/// at the limit is answered: no client makes an answer as large as its request.
#[test]
fn values_an_answer_echoes_beyond_the_apis_limits_are_refused_and_at_the_limit_answered() {
    let engine = builtin();
    type SetTo = fn(&mut Value, String);
    let cases: Vec<(&str, usize, SetTo)> = vec![
        ("metadata.name", 253, |pod, v| pod["metadata"]["name"] = json!(v)),
        ("metadata.generateName", 253, |pod, v| pod["metadata"]["generateName"] = json!(v)),
        ("metadata.namespace", 63, |pod, v| pod["metadata"]["namespace"] = json!(v)),
        ("spec.serviceAccountName", 253, |pod, v| pod["spec"]["serviceAccountName"] = json!(v)),
        ("metadata.labels (a key)", 317, |pod, v| pod["metadata"]["labels"][v] = json!("x")),
        ("metadata.labels (a value)", 63, |pod, v| pod["metadata"]["labels"]["app"] = json!(v)),
        ("a container's name", 63, |pod, v| pod["spec"]["containers"][0]["name"] = json!(v)),
        ("a container's name", 63, |pod, v| pod["spec"]["initContainers"][0]["name"] = json!(v)),
        // The pod's other annotations take 23 bytes ("keep": "me", the inject annotation's key and value).
        ("metadata.annotations (in all)", 256 * 1024, |pod, v| {
            let taken: usize = pod["metadata"]["annotations"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| k.len() + v.as_str().unwrap().len())
                .sum();
            pod["metadata"]["annotations"]["big"] = json!(v[..v.len() - taken - 3].to_owned())
        }),
    ];
    for (field, limit, set) in cases {
        for (length, refused) in [(limit, false), (limit + 1, true)] {
            let mut pod = full_pod();
            pod["metadata"]["annotations"]["sidecar-injector.io/inject"] = json!("demo");
            set(&mut pod, "a".repeat(length));
            for validate in [false, true] {
                let mut body = serde_json::to_vec(&review(&pod)).unwrap();
                let mut out = Vec::new();
                let answered =
                    if validate { engine.validate(&mut body, &mut out) } else { engine.review(&mut body, &mut out) };
                match answered {
                    Err(ReviewError::BeyondApiLimit { field: f, limit: l }) => {
                        assert!(refused, "{field} of {length} bytes is within the API's limit");
                        assert_eq!((f, l), (field, limit));
                    }
                    Ok(_) => assert!(!refused, "{field} of {length} bytes answered ({} bytes)", out.len()),
                    Err(e) => panic!("{field} of {length} bytes: {e}"),
                }
            }
        }
    }
}

#[test]
fn the_body_is_parsed_where_it_lies_and_keeps_its_length() {
    let engine = builtin();
    let request = serde_json::to_vec(&review(&full_pod())).unwrap();
    let answer_to = |body: &mut Vec<u8>| {
        let mut out = Vec::new();
        let outcome = engine.review(body, &mut out).unwrap();
        assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{outcome:?}");
        assert_eq!(body.len(), request.len(), "the padding is taken off again");
        out
    };
    // With the padding reserved, as the server reserves it, the body is not moved to parse it.
    let mut roomy = Vec::with_capacity(request.len() + sidecar_injector_core::PARSE_PADDING);
    roomy.extend_from_slice(&request);
    let at = roomy.as_ptr();
    let from_roomy = answer_to(&mut roomy);
    assert_eq!(roomy.as_ptr(), at);
    // Without it the body grows first; the answer is the same.
    let mut tight = request.clone();
    tight.shrink_to_fit();
    assert_eq!(answer_to(&mut tight), from_roomy);
}

#[test]
fn reasonable_nesting_is_accepted() {
    let mut pod = full_pod();
    let mut deep = json!("leaf");
    for _ in 0..100 {
        deep = json!({"d": deep});
    }
    pod["metadata"]["annotations"]["deep"] = json!(deep.to_string());
    pod["spec"]["x-deep"] = deep;
    assert!(patch_for(&small(), &pod).is_some());
}

#[test]
fn review_until_stops_at_each_stage_and_the_last_one_is_the_whole_review() {
    use sidecar_injector_core::Stage;
    let body = recorded_review();
    let engine = builtin();
    let mut whole = Vec::new();
    engine.review(&mut body.clone(), &mut whole).unwrap();
    for stage in [Stage::Tape, Stage::Parse, Stage::Read, Stage::Decide, Stage::Render, Stage::Merge, Stage::Respond] {
        let mut out = Vec::new();
        engine.review_until(&mut body.clone(), &mut out, stage).unwrap();
        match stage {
            // Nothing of the response is written before the review is read.
            Stage::Tape | Stage::Parse | Stage::Read => assert!(out.is_empty(), "{stage:?}"),
            // The response is opened (uid) but carries no verdict yet.
            Stage::Decide | Stage::Render | Stage::Merge => {
                assert!(whole.starts_with(&out) && out.len() < whole.len() && !out.is_empty(), "{stage:?}")
            }
            Stage::Respond => assert_eq!(out, whole),
        }
    }
    let mut not_json = b"{".to_vec();
    assert!(engine.review_until(&mut not_json, &mut Vec::new(), Stage::Parse).is_err());
    // The tape alone does not look for duplicate keys; the parse stage refuses them.
    let twice = br#"{"kind":"AdmissionReview","kind":"Pod"}"#;
    assert!(engine.review_until(&mut twice.to_vec(), &mut Vec::new(), Stage::Tape).is_ok());
    assert!(engine.review_until(&mut twice.to_vec(), &mut Vec::new(), Stage::Parse).is_err());
}

/// The outcome carries the facts the response says, so callers read them instead of the bytes: the template
/// and version (as the audit annotations name them), the refusal's message, what is missing, and, traced, the
/// pod's name and the patch itself.
#[test]
fn the_outcome_states_what_the_response_says() {
    use sidecar_injector_core::Mode;
    let engine = builtin();
    let pod = json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}});
    let (outcome, response, patch) = answer(&engine, &review(&pod));
    let template = outcome.template.as_ref().expect("a template was applied");
    let audit = &response["response"]["auditAnnotations"];
    assert_eq!(
        (audit["template"].as_str(), audit["template-version"].as_str()),
        (Some(&*template.name), Some(&*template.version))
    );
    assert_eq!(outcome.trace, None, "only traced reviews carry a trace");

    let mut body = serde_json::to_vec(&review(&pod)).unwrap();
    let traced = engine.trace(&mut body, &mut Vec::new(), Mode::Mutate).unwrap();
    let trace = traced.trace.expect("traced");
    assert_eq!(trace.pod.as_deref(), Some("shop/web"));
    assert_eq!(serde_json::from_slice::<Value>(&trace.patch.unwrap()).unwrap(), patch.unwrap());

    // Validation: what is missing, one thing each, and the refusal's message as the response carries it.
    let mut body = serde_json::to_vec(&review(&pod)).unwrap();
    let mut out = Vec::new();
    let judged = engine.validate(&mut body, &mut out).unwrap();
    let response: Value = serde_json::from_slice(&out).unwrap();
    assert!(judged.missing.iter().any(|m| m == "container proxy"), "{:?}", judged.missing);
    assert_eq!(judged.message.as_deref(), response["response"]["status"]["message"].as_str());

    // A pod that is not injected names no template.
    let opted_out = json!({"metadata": {"name": "x", "annotations": {"sidecar-injector.io/inject": "false"}}, "spec": {"containers": []}});
    let (outcome, response, _) = answer(&engine, &review(&opted_out));
    assert_eq!((outcome.template, outcome.message), (None, None));
    assert!(response["response"].get("auditAnnotations").is_none());
}

/// The engine's answer to raw bytes: the error, when the body is refused.
fn refusal(body: &[u8]) -> ReviewError {
    builtin().review(&mut body.to_vec(), &mut Vec::new()).expect_err("refused")
}

/// One reading: a key twice in one object, at any depth, is refused with the key and the byte of its second
/// occurrence, whatever simd-json, serde_json or Go would each have made of it.
#[test]
fn a_duplicate_key_anywhere_is_refused_with_its_key_and_position() {
    let pod = json!({"metadata": {"name": "web", "annotations": {"a": "1"}}, "spec": {"containers": [
        {"name": "web", "image": "nginx", "env": [{"name": "X", "value": "1"}]}
    ]}});
    let text = serde_json::to_string(&review(&pod)).unwrap();
    // Each edit adds a second copy of a key that the object already has.
    let duplicates = [
        ("\"kind\":\"AdmissionReview\"", "\"kind\":\"AdmissionReview\",\"kind\":\"AdmissionReview\"", "kind"),
        ("\"uid\":\"0f7c1e9a-uid\"", "\"uid\":\"0f7c1e9a-uid\",\"uid\":\"other\"", "uid"),
        ("\"object\":{", "\"object\":{\"spec\":\"Pod\",", "spec"),
        ("\"annotations\":{\"a\":\"1\"", "\"annotations\":{\"a\":\"1\",\"a\":\"2\"", "a"),
        ("\"value\":\"1\"", "\"value\":\"1\",\"value\":\"2\"", "value"),
    ];
    for (from, to, key) in duplicates {
        assert!(text.contains(from), "{from}");
        let body = text.replacen(from, to, 1);
        let error = refusal(body.as_bytes());
        let ReviewError::DuplicateKey { key: found, at } = &error else { panic!("{to}: {error}") };
        assert_eq!(found, key, "{to}");
        // The position is the first byte of the key's second occurrence, inside its quotes.
        let quoted = format!("\"{key}\"");
        assert!(body[at - 1..].starts_with(&quoted), "{to}: {error}");
        assert!(body[..at - 1].contains(&quoted), "{to}: the first occurrence comes before");
    }
    // A large object (sorted rather than compared pairwise): labels l0..l19, and l7 again at the end.
    let mut labels: Vec<String> = (0..20).map(|i| format!("\"l{i}\":\"v\"")).collect();
    labels.push("\"l7\":\"again\"".to_owned());
    let body = text.replacen("\"annotations\":{\"a\":\"1\"}", &format!("\"labels\":{{{}}}", labels.join(",")), 1);
    let ReviewError::DuplicateKey { key, at } = refusal(body.as_bytes()) else { panic!("l7 twice is refused") };
    assert_eq!((key.as_str(), at), ("l7", body.find("\"l7\":\"again\"").unwrap() + 1), "the second occurrence");
    // The same keys in different objects are not duplicates.
    assert!(builtin().review(&mut text.into_bytes(), &mut Vec::new()).is_ok());
}

/// A JSON error names the byte it happened at, also deep in the body and for invalid UTF-8.
#[test]
fn json_errors_point_at_the_offending_byte() {
    let text = serde_json::to_string(&review(&json!({"metadata": {"name": "web"}, "spec": {}}))).unwrap();
    let at = text.find("\"web\"").unwrap() + 2;
    let mut body = text.clone().into_bytes();
    body[at] = 0xff;
    let message = refusal(&body).to_string();
    assert!(message.contains(&format!("invalid UTF-8 at byte {at}")), "{message}");
    let broken = text.replacen("\"spec\":{}", "\"spec\":tru", 1);
    let at = broken.find("tru").unwrap();
    let message = refusal(broken.as_bytes()).to_string();
    assert!(message.contains(&format!("at byte {at}")), "{message}");
}

/// A keyed list of more than 64 template items (the walk remembers which of the first 64 to add and finds the rest
/// again): every missing item is added once, in the template's order, after the pod's own, whichever side of 64.
#[test]
fn a_long_keyed_list_adds_each_missing_item_once_in_order() {
    let vars: Vec<String> = (0..70).map(|i| format!("      - {{name: E{i}, value: \"{i}\"}}\n")).collect();
    let template = format!("pod: {{}}\ncontainerDefaults:\n  env:\n{}", vars.concat());
    let engine = engine_from(&template);
    let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app", "image": "a",
        "env": [{"name": "E3", "value": "own"}, {"name": "E65", "value": "own"}]}]}});
    check_properties(&engine, &pod);
    let injected = apply(&pod, &patch_for(&engine, &pod).expect("a patch"));
    let env = injected["spec"]["containers"][0]["env"].as_array().unwrap();
    let names: Vec<&str> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
    let expected: Vec<String> = ["E3", "E65"]
        .map(str::to_owned)
        .into_iter()
        .chain((0..70).filter(|i| ![3, 65].contains(i)).map(|i| format!("E{i}")))
        .collect();
    assert_eq!(names, expected);
    assert_eq!((env[0]["value"].as_str(), env[1]["value"].as_str()), (Some("own"), Some("own")), "the pod's own kept");
}
