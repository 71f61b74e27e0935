//! Never a pod the API server refuses, 3 (issue 49): one regression test for each class of pod the API server
//! accepted as sent and refused once injected, and for the wrong refusals and silences found beside them. Each
//! failed before the fix. The rules are the API server's own (1.37's `pkg/apis/core/validation` and the pod
//! strategy; 1.20's where they differ); the e2e differential (`tests/e2e/admission_chain.rs`) judges the same
//! classes on the real admission chain.

use crate::common;

use common::{answer, apply, check_properties, review, validation};
use serde_json::{Value, json};
use sidecar_injector_core::validation::{KubeVersion, validate_pod};
use sidecar_injector_core::{Engine, Settings, SkipReason, TemplateSet, Verdict};

fn engine_at(source: &str, minor: u32) -> Result<Engine, String> {
    let settings = Settings { kubernetes_version: KubeVersion::new(minor), ..Settings::default() };
    TemplateSet::from_source("t", "t.yaml", source, &settings)
        .map(|set| Engine::new(set, &settings))
        .map_err(|e| e.to_string())
}

fn loaded(source: &str) -> Engine {
    engine_at(source, KubeVersion::DEFAULT.minor).unwrap_or_else(|e| panic!("template refused: {e}"))
}

fn refusal(source: &str, minor: u32) -> String {
    match engine_at(source, minor) {
        Ok(_) => panic!("the template loaded at 1.{minor}:\n{source}"),
        Err(reason) => reason,
    }
}

fn app_pod(spec: Value, annotations: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}, "annotations": annotations},
        "spec": spec,
    });
    if pod["spec"].get("containers").is_none() {
        pod["spec"]["containers"] = json!([{"name": "app", "image": "shop:1", "ports": [{"containerPort": 8080}]}]);
    }
    pod
}

/// The pod is admitted without the sidecar, with a warning naming `rule`, and `/validate` does not then demand
/// what was withheld.
fn assert_withheld(engine: &Engine, pod: &Value, rule: &str) {
    let (outcome, response, patch) = answer(engine, &review(pod));
    assert_eq!(patch, None, "{outcome:?}");
    assert_eq!(response["response"]["allowed"], true);
    assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::PodConflict), "{outcome:?}");
    assert!(outcome.warnings.iter().any(|w| w.contains(rule)), "no warning names {rule:?}: {:?}", outcome.warnings);
    assert_ne!(validation(engine, pod), Verdict::Incomplete { missing: 1, refused: true });
    assert!(!matches!(validation(engine, pod), Verdict::Incomplete { refused: true, .. }));
}

/// The pod is injected, and the injected pod is one the API server's rules accept.
fn assert_injected_valid(engine: &Engine, pod: &Value) -> Value {
    let (outcome, _, patch) = answer(engine, &review(pod));
    let patch = patch.unwrap_or_else(|| panic!("not injected: {outcome:?}"));
    let injected = apply(pod, &patch);
    let problems = validate_pod(&injected, KubeVersion::DEFAULT);
    assert!(problems.is_empty(), "{problems:?}");
    check_properties(engine, pod);
    injected
}

const HOST_NETWORK_TEMPLATE: &str = r#"
injectHostNetwork: true
pod:
  spec:
    containers:
      - name: proxy
        image: proxy:1
        ports: [{ containerPort: 15090, name: metrics }]
"#;

#[test]
fn class_1_a_host_network_pod_whose_port_the_sidecar_takes_is_admitted_without_it() {
    let engine = loaded(HOST_NETWORK_TEMPLATE);
    // Defaulting gives the sidecar's port the host port 15090, which the app's own port already takes.
    let spec = json!({"hostNetwork": true, "containers": [
        {"name": "app", "image": "shop:1", "ports": [{"containerPort": 15090, "hostPort": 15090}]}]});
    assert_withheld(&engine, &app_pod(spec, json!({})), "Duplicate value: \"TCP//15090\"");
    // Another port: injected, and valid.
    let free = json!({"hostNetwork": true, "containers": [
        {"name": "app", "image": "shop:1", "ports": [{"containerPort": 8080, "hostPort": 8080}]}]});
    assert_injected_valid(&engine, &app_pod(free, json!({})));
    // A template port whose host port differs from its container port cannot serve a host-network pod.
    let apart = HOST_NETWORK_TEMPLATE.replace("name: metrics", "name: metrics, hostPort: 16090");
    let spec = json!({"hostNetwork": true});
    assert_withheld(
        &loaded(&apart),
        &app_pod(spec, json!({})),
        "must match `containerPort` when `hostNetwork` is true",
    );
}

#[test]
fn class_2_share_process_namespace_beside_the_pods_host_pid_is_withheld() {
    let engine = loaded(
        "pod:\n  spec:\n    shareProcessNamespace: true\n    containers:\n      - name: proxy\n        image: proxy:1\n",
    );
    let pod = app_pod(json!({"hostPID": true}), json!({}));
    assert_withheld(&engine, &pod, "ShareProcessNamespace and HostPID cannot both be enabled");
    assert_injected_valid(&engine, &app_pod(json!({}), json!({})));
}

#[test]
fn class_3_bidirectional_propagation_needs_a_privileged_container() {
    let defaults = "pod:\n  spec:\n    volumes: [{ name: shared, emptyDir: {} }]\ncontainerDefaults:\n  volumeMounts:\n    - { name: shared, mountPath: /shared, mountPropagation: Bidirectional }\n";
    let reason = refusal(defaults, 37);
    assert!(reason.contains("Bidirectional mount propagation is available only to privileged containers"), "{reason}");
    let privileged = "pod:\n  spec:\n    volumes: [{ name: shared, emptyDir: {} }]\n    containers:\n      - name: proxy\n        image: proxy:1\n        securityContext: { privileged: true }\n        volumeMounts: [{ name: shared, mountPath: /shared, mountPropagation: Bidirectional }]\n";
    assert!(engine_at(privileged, 37).is_ok());
}

#[test]
fn class_4_a_mount_where_the_pod_has_a_block_device_is_withheld_by_the_shipped_demo() {
    let engine = loaded(include_str!("../../templates/demo.yaml"));
    let spec = json!({
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "containers": [{"name": "app", "image": "shop:1", "volumeDevices": [{"name": "data", "devicePath": "/var/run/demo"}]}],
    });
    assert_withheld(&engine, &app_pod(spec, json!({})), "must not already exist as a path in volumeDevices");
    // A device elsewhere: injected.
    let elsewhere = json!({
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "containers": [{"name": "app", "image": "shop:1", "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]}],
    });
    assert_injected_valid(&engine, &app_pod(elsewhere, json!({})));
}

#[test]
fn class_5_legacy_security_annotations_are_held_to_the_fields_a_template_sets() {
    // The shipped native-sidecar template sets the pod's seccomp profile where the pod has none.
    let native = loaded(include_str!("../../templates/native-sidecar.yaml"));
    let pod = app_pod(json!({}), json!({"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}));
    assert_withheld(&native, &pod, "seccomp type in annotation and field must match");
    let agreeing = app_pod(json!({}), json!({"seccomp.security.alpha.kubernetes.io/pod": "runtime/default"}));
    assert_injected_valid(&native, &agreeing);
    // A container's AppArmor annotation against the profile the defaults give it.
    let apparmor = loaded(
        "containerDefaults:\n  securityContext:\n    appArmorProfile: { type: RuntimeDefault }\npod:\n  spec:\n    containers:\n      - name: proxy\n        image: proxy:1\n",
    );
    let pod = app_pod(json!({}), json!({"container.apparmor.security.beta.kubernetes.io/app": "unconfined"}));
    assert_withheld(&apparmor, &pod, "apparmor type in annotation and field must match");
    // The values themselves are judged: a pod that breaks them on its own is left to the API server.
    let problems = validate_pod(
        &app_pod(json!({}), json!({"seccomp.security.alpha.kubernetes.io/pod": "bogus"})),
        KubeVersion::DEFAULT,
    );
    assert!(problems.iter().any(|p| p.to_string().contains("must be a valid seccomp profile")), "{problems:?}");
}

#[test]
fn class_6_the_annotations_total_counts_the_pods_own() {
    let engine = common::builtin();
    // Just under the limit on its own; the status annotation takes it over.
    let filler = 256 * 1024 - "filler".len() - 100;
    let pod = app_pod(json!({}), json!({"filler": "x".repeat(filler)}));
    assert!(validate_pod(&pod, KubeVersion::DEFAULT).is_empty());
    assert_withheld(&engine, &pod, "may not be more than 262144 bytes");
}

#[test]
fn class_7_values_rendered_from_the_pod_are_held_to_the_rule_of_their_field() {
    let cases = [
        ("    hostname: \"{{ pod.annotations.v | default('web') }}\"\n", "", "web.v2"),
        ("    serviceAccountName: \"{{ pod.annotations.v | default('web') }}\"\n", "", "Web_App"),
        (
            "",
            "        envFrom: [{ prefix: \"{{ pod.annotations.v | default('web') }}\", configMapRef: { name: c } }]\n",
            "a=b",
        ),
        (
            "",
            "        env: [{ name: S, valueFrom: { secretKeyRef: { name: \"{{ pod.annotations.v | default('web') }}\", key: k } } }]\n",
            "Web_App",
        ),
        (
            "",
            "        readinessProbe: { httpGet: { port: 80, httpHeaders: [{ name: \"{{ pod.annotations.v | default('web') }}\", value: v }] } }\n",
            "X Auth Token",
        ),
        (
            "",
            "        volumeMounts: [{ name: v, mountPath: /v, subPath: \"{{ pod.annotations.v | default('web') }}\" }]\n",
            "../escape",
        ),
        (
            "    volumes: [{ name: v, emptyDir: {} }, { name: d, downwardAPI: { items: [{ path: \"{{ pod.annotations.v | default('web') }}\", fieldRef: { fieldPath: metadata.name } }] } }]\n",
            "",
            "..escape",
        ),
    ];
    for (spec, container, value) in cases {
        let volumes = if spec.contains("volumes:") { "" } else { "    volumes: [{ name: v, emptyDir: {} }]\n" };
        let source = format!(
            "pod:\n  spec:\n{spec}{volumes}    containers:\n      - name: proxy\n        image: proxy:1\n{container}"
        );
        let engine = loaded(&source);
        let mut pod = app_pod(json!({}), json!({}));
        pod["metadata"]["annotations"]["v"] = json!(value);
        let (outcome, _, patch) = answer(&engine, &review(&pod));
        assert_eq!(patch, None, "{value:?} served by:\n{source}");
        assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::RenderFailed), "{outcome:?}");
        // A value the field accepts is served.
        pod["metadata"]["annotations"]["v"] = json!("web");
        assert_injected_valid(&engine, &pod);
    }
}

#[test]
fn class_8_windows_options_are_judged() {
    let with = |options: &str| {
        format!(
            "pod:\n  spec:\n    containers:\n      - name: proxy\n        image: proxy:1\n        securityContext:\n          windowsOptions: {options}\n"
        )
    };
    let reason = refusal(&with("{ runAsUserName: 'a\\b\\c' }"), 37);
    assert!(reason.contains("runAsUserName cannot contain more than one backslash"), "{reason}");
    let reason = refusal(&with("{ gmsaCredentialSpecName: Bad_Name }"), 37);
    assert!(reason.contains("gmsaCredentialSpecName") && reason.contains("RFC 1123 subdomain"), "{reason}");
    assert!(engine_at(&with("{ runAsUserName: 'NT AUTHORITY\\NETWORK SERVICE' }"), 37).is_ok());
    // A Linux pod may not carry them: judged with the pod.
    let engine = loaded(&with("{ runAsUserName: ContainerUser }"));
    let pod = app_pod(json!({"os": {"name": "linux"}}), json!({}));
    assert_withheld(&engine, &pod, "windows options cannot be set for a linux pod");
}

#[test]
fn class_9_fields_an_admission_plugin_owns_are_refused_at_load() {
    for (field, plugin) in [
        ("priority: 1000", "Priority"),
        ("preemptionPolicy: Never", "Priority"),
        ("overhead: { cpu: 10m }", "RuntimeClass"),
    ] {
        let reason = refusal(
            &format!("pod:\n  spec:\n    {field}\n    containers:\n      - name: proxy\n        image: proxy:1\n"),
            37,
        );
        assert!(reason.contains(&format!("the {plugin} admission plugin")), "{reason}");
    }
}

#[test]
fn class_10_a_field_newer_than_the_release_is_refused_naming_the_release() {
    let container = "    containers:\n      - name: proxy\n        image: proxy:1\n";
    let cases = [
        ("    os: { name: linux }\n", "", 24),
        ("    schedulingGates: [{ name: wait }]\n", "", 27),
        (
            "    volumes: [{ name: e, ephemeral: { volumeClaimTemplate: { spec: { accessModes: [ReadWriteOnce], resources: { requests: { storage: 1Gi } } } } } }]\n",
            "",
            21,
        ),
        (
            "    topologySpreadConstraints: [{ topologyKey: zone, maxSkew: 1, whenUnsatisfiable: DoNotSchedule, minDomains: 2 }]\n",
            "",
            27,
        ),
        ("    securityContext: { appArmorProfile: { type: RuntimeDefault } }\n", "", 30),
        ("", "        livenessProbe: { exec: { command: [ok] }, terminationGracePeriodSeconds: 5 }\n", 25),
        (
            "    volumes: [{ name: r, emptyDir: {} }]\n",
            "        volumeMounts: [{ name: r, mountPath: /r, readOnly: true, recursiveReadOnly: Enabled }]\n",
            31,
        ),
    ];
    for (spec, more, kept_from) in cases {
        let source = format!("pod:\n  spec:\n{spec}{container}{more}");
        let reason = refusal(&source, kept_from - 1);
        assert!(reason.contains(&format!("from Kubernetes 1.{kept_from}")), "{reason}");
        assert!(engine_at(&source, kept_from).is_ok(), "refused at 1.{kept_from}: {source}");
    }
}

#[test]
fn class_11_spread_constraints_are_told_apart_by_key_and_when_unsatisfiable() {
    let engine = loaded(
        "pod:\n  spec:\n    topologySpreadConstraints:\n      - { topologyKey: zone, maxSkew: 1, whenUnsatisfiable: DoNotSchedule }\n      - { topologyKey: zone, maxSkew: 2, whenUnsatisfiable: ScheduleAnyway }\n    containers:\n      - name: proxy\n        image: proxy:1\n",
    );
    // The pod's own (zone, ScheduleAnyway) is kept; the template's (zone, DoNotSchedule) is added beside it.
    let pod = app_pod(
        json!({"topologySpreadConstraints": [{"topologyKey": "zone", "maxSkew": 5, "whenUnsatisfiable": "ScheduleAnyway"}]}),
        json!({}),
    );
    let injected = assert_injected_valid(&engine, &pod);
    let constraints = injected["spec"]["topologySpreadConstraints"].as_array().unwrap();
    assert_eq!(constraints.len(), 2, "{constraints:?}");
    assert_eq!(constraints[0]["maxSkew"], 5);
}

#[test]
fn a_containers_annotation_that_names_no_container_is_warned_of() {
    let engine = common::builtin();
    let pod = app_pod(json!({}), json!({"sidecar-injector.io/containers": "App,worker,ap,app"}));
    let (outcome, _, _) = answer(&engine, &review(&pod));
    let warnings = outcome.warnings.join("\n");
    assert!(warnings.contains("\"App\" names no container of the pod (did you mean app?"), "{warnings}");
    assert!(warnings.contains("\"worker\" names no container of the pod (the pod's containers: app)"), "{warnings}");
    // A typo within two edits: the closest container, and the list.
    assert!(
        warnings.contains("\"ap\" names no container of the pod (did you mean app? the pod's containers: app)"),
        "{warnings}"
    );
    assert_eq!(outcome.warnings.len(), 3, "a name that matches is not warned of: {warnings}");
}

#[test]
fn an_undefined_value_is_named_with_the_closest_defined_one() {
    let reason = refusal(
        "values:\n  image: proxy:1\npod:\n  spec:\n    containers:\n      - name: proxy\n        image: \"{{ values.imag }}\"\n",
        37,
    );
    assert!(reason.contains("`values.imag` is undefined (did you mean `values.image`?)"), "{reason}");
}

/// Issue 55: a template's resize policies. A pod that never restarts allows only `NotRequired`: such a pod (a Job's,
/// whose sidecar is a native one) is admitted without the sidecar; a pod that restarts gets it, policies and all.
#[test]
fn a_resize_policy_that_restarts_the_sidecar_is_withheld_from_pods_that_never_restart() {
    let engine = loaded(
        "pod:\n  spec:\n    containers:\n      - name: proxy\n        image: proxy:1\n        resizePolicy:\n          \
         - { resourceName: cpu, restartPolicy: NotRequired }\n          \
         - { resourceName: memory, restartPolicy: RestartContainer }\n",
    );
    let injected = assert_injected_valid(&engine, &app_pod(json!({}), json!({})));
    assert_eq!(injected["spec"]["containers"][1]["resizePolicy"][1]["restartPolicy"], "RestartContainer");
    let mut never = app_pod(json!({}), json!({}));
    never["spec"]["restartPolicy"] = json!("Never");
    assert_withheld(&engine, &never, "must be 'NotRequired' when pod `restartPolicy` is 'Never'");
    // `OnFailure` restarts: injected (as a native sidecar, a pod that runs to completion).
    never["spec"]["restartPolicy"] = json!("OnFailure");
    let injected = assert_injected_valid(&engine, &never);
    assert_eq!(injected["spec"]["initContainers"][0]["resizePolicy"][0]["resourceName"], "cpu");
    // Only `NotRequired`: pods that never restart get it too.
    let engine = loaded(
        "pod:\n  spec:\n    containers:\n      - name: proxy\n        image: proxy:1\n        resizePolicy:\n          \
         - { resourceName: cpu, restartPolicy: NotRequired }\n",
    );
    never["spec"]["restartPolicy"] = json!("Never");
    assert_injected_valid(&engine, &never);
    // Before 1.33 the API server would drop the field: the template is refused at load.
    let refused = refusal(
        "pod:\n  spec:\n    containers:\n      - name: proxy\n        image: proxy:1\n        resizePolicy:\n          \
         - { resourceName: cpu, restartPolicy: NotRequired }\n",
        32,
    );
    assert!(refused.contains("InPlacePodVerticalScaling"), "{refused}");
}
