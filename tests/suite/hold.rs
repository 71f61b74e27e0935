//! The app waits for its sidecar (issue 41, item 5; istio#11130): `holdApplicationUntilSidecarReady`. Below
//! Kubernetes 1.29 the template's containers go first, each with its `postStart` wait; from 1.29 they are native
//! sidecars held by their `startupProbe`. Exact patches, the refusals at load, idempotence and `uninject`, the
//! shipped template at both versions. tests/cluster.rs runs it on a real 1.20 kubelet.

use crate::common;

use common::*;
use serde_json::{Value, json};
use sidecar_injector_core::validation::KubeVersion;
use sidecar_injector_core::{Engine, Hold, SetSources, Settings, TemplateSet};

/// Two sidecars (the second one's `lifecycle` has a `preStop` too), an init container of the template's own, and
/// container defaults, which address the pod's containers by index while the sidecars are inserted in front.
const HELD: &str = r#"
holdApplicationUntilSidecarReady: true
pod:
  spec:
    initContainers:
      - { name: init, image: "init:1" }
    containers:
      - name: side
        image: "side:1"
        startupProbe: { exec: { command: [test, -f, /ready] }, periodSeconds: 1 }
        lifecycle:
          postStart: { exec: { command: [sh, -c, "until test -f /ready; do sleep 1; done"] } }
      - name: second
        image: "second:1"
        startupProbe: { tcpSocket: { port: 9000 } }
        lifecycle:
          postStart: { exec: { command: [wait-for, "127.0.0.1:9000"] } }
          preStop: { exec: { command: [sleep, "5"] } }
containerDefaults:
  env: [{ name: MESH, value: "on" }]
"#;

fn settings_at(minor: u32) -> Settings {
    Settings { kubernetes_version: KubeVersion::new(minor), ..Settings::default() }
}

fn engine_at(source: &str, minor: u32) -> Engine {
    let settings = settings_at(minor);
    Engine::new(TemplateSet::from_source("held", "held.yaml", source, &settings).unwrap(), &settings)
}

fn refusal(source: &str) -> String {
    TemplateSet::from_source("held", "held.yaml", source, &Settings::default()).unwrap_err().to_string()
}

fn app_pod() -> Value {
    json!({
        "metadata": {"name": "web-0"},
        "spec": {"containers": [{"name": "web", "image": "web:1"}, {"name": "worker", "image": "worker:1"}]}
    })
}

fn status(engine: &Engine) -> String {
    engine.template().status().to_owned()
}

#[test]
fn below_1_29_the_sidecars_go_first_with_their_post_start_waits() {
    let engine = engine_at(HELD, 28);
    assert_eq!(engine.template().hold(), Some(Hold::PostStart));
    let pod = app_pod();
    let patch = patch_for(&engine, &pod).expect("injected");
    let side = json!({"name": "side", "image": "side:1",
        "startupProbe": {"exec": {"command": ["test", "-f", "/ready"]}, "periodSeconds": 1},
        "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "until test -f /ready; do sleep 1; done"]}}}});
    let second = json!({"name": "second", "image": "second:1", "startupProbe": {"tcpSocket": {"port": 9000}},
        "lifecycle": {"postStart": {"exec": {"command": ["wait-for", "127.0.0.1:9000"]}},
                      "preStop": {"exec": {"command": ["sleep", "5"]}}}});
    assert_eq!(
        patch,
        json!([
            // The defaults first, at the pod's own indices, before the insertions shift them.
            {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "MESH", "value": "on"}]},
            {"op": "add", "path": "/spec/containers/1/env", "value": [{"name": "MESH", "value": "on"}]},
            {"op": "add", "path": "/spec/initContainers", "value": [{"name": "init", "image": "init:1"}]},
            // In front, in the template's order: the kubelet starts them first, one after the other.
            {"op": "add", "path": "/spec/containers/0", "value": side},
            {"op": "add", "path": "/spec/containers/1", "value": second},
            {"op": "add", "path": "/metadata/annotations", "value": {
                "kubectl.kubernetes.io/default-container": "web",
                "sidecar-injector.io/status": status(&engine)}},
        ])
    );
    let injected = apply(&pod, &patch);
    assert_eq!(names(&injected, "containers"), ["side", "second", "web", "worker"]);
    assert_eq!(injected["spec"]["containers"][2]["env"], json!([{"name": "MESH", "value": "on"}]), "the app's");
    assert!(injected["spec"]["containers"][0].get("env").is_none(), "not the sidecar's");
    assert_eq!(patch_for(&engine, &injected), None, "second pass: no patch");
    check_properties(&engine, &pod);
    assert_uninjects(&engine, &injected, &pod);
}

#[test]
fn from_1_29_the_sidecars_are_native_sidecars_held_by_their_startup_probes() {
    let engine = engine_at(HELD, 29);
    assert_eq!(engine.template().hold(), Some(Hold::StartupProbe));
    let pod = app_pod();
    let patch = patch_for(&engine, &pod).expect("injected");
    let env = json!([{"name": "MESH", "value": "on"}]);
    assert_eq!(
        patch,
        json!([
            {"op": "add", "path": "/spec/containers/0/env", "value": env},
            {"op": "add", "path": "/spec/containers/1/env", "value": env},
            {"op": "add", "path": "/spec/initContainers", "value": [
                {"name": "init", "image": "init:1"},
                // The postStart wait is left out: the startup probe holds the app.
                {"name": "side", "image": "side:1",
                 "startupProbe": {"exec": {"command": ["test", "-f", "/ready"]}, "periodSeconds": 1},
                 "restartPolicy": "Always"},
                {"name": "second", "image": "second:1", "startupProbe": {"tcpSocket": {"port": 9000}},
                 "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}, "restartPolicy": "Always"},
            ]},
            // No default container to name: the app's containers are the pod's only ones.
            {"op": "add", "path": "/metadata/annotations", "value": {"sidecar-injector.io/status": status(&engine)}},
        ])
    );
    let injected = apply(&pod, &patch);
    assert_eq!(names(&injected, "containers"), ["web", "worker"]);
    let status: Value =
        serde_json::from_str(injected["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap())
            .unwrap();
    assert_eq!((&status["containers"], &status["initContainers"]), (&json!([]), &json!(["init", "side", "second"])));
    assert_eq!(patch_for(&engine, &injected), None, "second pass: no patch");
    check_properties(&engine, &pod);
    assert_uninjects(&engine, &injected, &pod);
}

/// The pod's own init containers run before the app's containers either way: native sidecars go after the
/// template's init containers and before the pod's (`initContainerPosition: first`), so those may use them.
#[test]
fn a_pod_with_init_containers_and_a_jobs_pod_get_the_same_hold() {
    let mut pod = app_pod();
    pod["spec"]["initContainers"] = json!([{"name": "migrate", "image": "migrate:1"}]);
    let native = apply(&pod, &patch_for(&engine_at(HELD, 30), &pod).unwrap());
    assert_eq!(names(&native, "initContainers"), ["init", "side", "second", "migrate"]);
    let first = apply(&pod, &patch_for(&engine_at(HELD, 20), &pod).unwrap());
    assert_eq!(names(&first, "initContainers"), ["init", "migrate"]);
    assert_eq!(names(&first, "containers"), ["side", "second", "web", "worker"]);

    // A Job's pod: from 1.29 the same native sidecars (no other shape to make), below it skipped as before.
    let mut job = app_pod();
    job["spec"]["restartPolicy"] = json!("Never");
    let for_job = apply(&job, &patch_for(&engine_at(HELD, 29), &job).unwrap());
    assert_eq!(names(&for_job, "initContainers"), ["init", "side", "second"]);
    assert_eq!(names(&for_job, "containers"), ["web", "worker"]);
    assert_eq!(patch_for(&engine_at(HELD, 28), &job), None);
}

/// A pod that declares the sidecar itself keeps it where it put it: completed, as any declared sidecar is.
#[test]
fn a_sidecar_the_pod_declares_is_completed_where_it_is() {
    let engine = engine_at(HELD, 28);
    let mut pod = app_pod();
    pod["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "side", "image": "mine:2"}));
    let injected = apply(&pod, &patch_for(&engine, &pod).unwrap());
    assert_eq!(names(&injected, "containers"), ["second", "web", "worker", "side"]);
    let side = &injected["spec"]["containers"][3];
    assert_eq!(side["image"], "mine:2");
    assert!(side["lifecycle"]["postStart"]["exec"].is_object() && side["startupProbe"].is_object(), "{side}");
    assert_eq!(patch_for(&engine, &injected), None);
}

#[test]
fn a_template_that_cannot_say_when_its_sidecar_is_ready_is_refused_at_the_containers_line() {
    let without_probe =
        HELD.replace("        startupProbe: { exec: { command: [test, -f, /ready] }, periodSeconds: 1 }\n", "");
    assert_ne!(without_probe, HELD);
    let message = refusal(&without_probe);
    let needs = "`holdApplicationUntilSidecarReady` needs";
    let expected = format!("held.yaml:8: pod.spec.containers[0]: {needs} `side` to have a `startupProbe`");
    assert!(message.starts_with(&expected), "{message}");
    // An httpGet hook is tried once, it does not wait: the wait is a command.
    let http_hook = HELD.replace(
        "postStart: { exec: { command: [wait-for, \"127.0.0.1:9000\"] } }",
        "postStart: { httpGet: { port: 9000 } }",
    );
    assert_ne!(http_hook, HELD);
    let message = refusal(&http_hook);
    let expected =
        format!("held.yaml:13: pod.spec.containers[1]: {needs} `second` to have a `lifecycle.postStart.exec`");
    assert!(message.starts_with(&expected), "{message}");
    // Both at once, and in every container, each on its line.
    let bare = "holdApplicationUntilSidecarReady: true\npod:\n  spec:\n    containers:\n\
                \x20     - {name: a, image: a}\n      - {name: b, image: b}\n";
    let message = refusal(bare);
    assert_eq!(message.lines().count(), 4, "{message}");
    assert!(message.lines().all(|l| l.starts_with("held.yaml:5:") || l.starts_with("held.yaml:6:")), "{message}");
    // Nothing to wait for.
    let native_only = "pod:\n  spec:\n    initContainers: [{name: a, image: a, restartPolicy: Always}]\n\
                       holdApplicationUntilSidecarReady: true\n";
    let message = refusal(native_only);
    assert!(message.starts_with(&format!("held.yaml:4: {needs} the template to inject `containers`")), "{message}");
    // The value's type.
    let message = refusal(
        &HELD.replace("holdApplicationUntilSidecarReady: true", "holdApplicationUntilSidecarReady: yes please"),
    );
    assert!(message.starts_with("held.yaml:2: `holdApplicationUntilSidecarReady` must be true or false"), "{message}");
    // Without the setting the same containers load, and are appended as before.
    let plain = engine_at(&without_probe.replace("holdApplicationUntilSidecarReady: true", ""), 28);
    assert_eq!(plain.template().hold(), None);
    let injected = apply(&app_pod(), &patch_for(&plain, &app_pod()).unwrap());
    assert_eq!(names(&injected, "containers"), ["web", "worker", "side", "second"]);
}

/// In a combination the app waits if any template says so, for every template's containers.
#[test]
fn a_combination_holds_the_app_if_any_of_its_templates_does() {
    let plain = "pod:\n  spec:\n    containers: [{name: logger, image: logger:1}]\n";
    let sources = SetSources {
        origin: "test".into(),
        templates: vec![
            ("default".into(), "default.yaml".into(), plain.into()),
            ("held".into(), "held.yaml".into(), HELD.into()),
        ],
        values: None,
        ignored: Vec::new(),
    };
    let mut pod = app_pod();
    pod["metadata"]["annotations"] = json!({"sidecar-injector.io/template": "default,held"});
    for (minor, containers, init) in [
        (28, vec!["logger", "side", "second", "web", "worker"], vec!["init"]),
        (29, vec!["web", "worker"], vec!["init", "logger", "side", "second"]),
    ] {
        let settings = settings_at(minor);
        let engine = Engine::new(TemplateSet::compile(sources.clone(), "default", &settings).unwrap(), &settings);
        let injected = apply(&pod, &patch_for(&engine, &pod).expect("injected"));
        assert_eq!(names(&injected, "containers"), containers, "at 1.{minor}");
        assert_eq!(names(&injected, "initContainers"), init, "at 1.{minor}");
        assert_eq!(patch_for(&engine, &injected), None, "at 1.{minor}: second pass");
    }
}

/// `templates/wait-for-sidecar.yaml` at both versions, and what `check` says of it.
#[test]
fn the_shipped_template_holds_the_app_both_ways_and_check_says_how() {
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/templates/wait-for-sidecar.yaml")).unwrap();
    let pod = app_pod();
    let first = apply(&pod, &patch_for(&engine_at(&source, 20), &pod).unwrap());
    assert_eq!(names(&first, "containers"), ["agent", "web", "worker"]);
    let command = first["spec"]["containers"][0]["lifecycle"]["postStart"]["exec"]["command"].as_array().unwrap();
    assert!(command[2].as_str().unwrap().starts_with("for i in $(seq 120); do wget"), "{command:?}");
    assert!(first["spec"]["containers"][0]["startupProbe"].is_object());
    let native = apply(&pod, &patch_for(&engine_at(&source, 29), &pod).unwrap());
    assert_eq!(
        (names(&native, "containers"), names(&native, "initContainers")),
        (vec!["web", "worker"], vec!["agent"])
    );
    let agent = &native["spec"]["initContainers"][0];
    assert_eq!(agent["restartPolicy"], "Always");
    assert!(agent["startupProbe"].is_object() && agent.get("lifecycle").is_none(), "{agent}");

    for (version, how) in [("1.20", "its containers first"), ("1.29", "its containers as native sidecars")] {
        let output = run(&["check", "--kubernetes-version", version, "templates/wait-for-sidecar.yaml"], "");
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(output.status.success(), "{stdout}");
        assert!(
            stdout.contains(&format!("    holds the app until its sidecars are ready: {how}")),
            "{version}: {stdout}"
        );
    }
}
