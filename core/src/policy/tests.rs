//! The compilation, rule by rule: each merge rule to its CEL guard, each refusal to its message. That the guards
//! decide as the webhook does is the e2e differential's to show (tests/e2e/policy.rs, on the real API server).

use serde_json::{Value, json};

use super::{Selection, compile};
use crate::settings::Settings;
use crate::template_set::TemplateSet;

fn selection() -> Selection {
    Selection::of_webhook(&json!({
        "namespaceSelector": {"matchLabels": {"sidecar-injector.io/inject": "enabled"}},
        "objectSelector": {}, "matchConditions": [], "failurePolicy": "Ignore", "reinvocationPolicy": "IfNeeded",
    }))
}

fn compiled(source: &str) -> Result<[Value; 2], super::Refusal> {
    let set = TemplateSet::from_source("t", "t.yaml", source, &Settings::default()).unwrap();
    compile(set.default_template(), "t", &selection())
}

/// The policy's mutations and variables, as one text to search.
fn cel(source: &str) -> String {
    let [policy, _] = compiled(source).unwrap();
    format!("{}\n{}", policy["spec"]["mutations"], policy["spec"]["variables"])
}

const CONTAINER: &str = "
pod:
  spec:
    containers:
      - name: proxy
        image: proxy:1
";

/// [`CONTAINER`] with more lines of the proxy container (indented as its fields).
fn proxy_with(lines: &str) -> String {
    format!("{CONTAINER}{lines}\n")
}

#[test]
fn a_keyed_item_is_found_by_its_merge_key_and_added_only_when_absent() {
    let cel = cel(CONTAINER);
    assert!(cel.contains(r#"object.spec.containers.map(x, x.?name.orValue(\"\")).indexOf(\"proxy\")"#), "{cel}");
    assert!(cel.contains(r#"path: \"/spec/containers/-\""#), "appended where the pod lacks it: {cel}");
    // A container of that name in another list is the user's: not added beside it.
    assert!(cel.contains(r#"object.spec.?initContainers.orValue([]).exists(c, c.?name.orValue(\"\") == \"proxy\")"#));
}

#[test]
fn init_containers_go_in_front_counting_those_added_before() {
    let cel = cel("
initContainerPosition: first
pod:
  spec:
    initContainers:
      - { name: a, image: a:1 }
      - { name: b, image: b:1 }
");
    assert!(cel.contains(r#"path: \"/spec/initContainers/0\""#), "{cel}");
    assert!(cel.contains(r#"\"/spec/initContainers/\" + string((("#), "the second's index: {cel}");
}

#[test]
fn a_union_member_is_not_added_beside_its_rival() {
    let cel = cel(&proxy_with("        env: [{ name: MODE, value: sidecar }]"));
    assert!(cel.contains(r#"![\"valueFrom\"].exists(r, r in "#), "value only where valueFrom is not set: {cel}");
}

#[test]
fn a_resource_the_pod_sizes_in_the_other_map_is_the_pods() {
    let cel = cel(&proxy_with("        resources: { requests: { cpu: 10m } }"));
    assert!(cel.contains(".resources.?limits.?cpu.hasValue()"), "{cel}");
}

#[test]
fn privilege_and_no_escalation_are_not_paired() {
    let cel = cel(&proxy_with("        securityContext: { allowPrivilegeEscalation: false }"));
    assert!(cel.contains(r#"?privileged.orValue(false) == true"#) && cel.contains("CAP_SYS_ADMIN"), "{cel}");
}

#[test]
fn a_set_of_names_gets_the_names_it_lacks_appended() {
    let cel = cel("
pod:
  spec:
    volumes: [{ name: cache, emptyDir: {} }]
");
    assert!(cel.contains("safe-to-evict-local-volumes"), "{cel}");
    assert!(cel.contains(r#".trim().find(\"(?s)^.*[^,]\")"#), "{cel}");
}

#[test]
fn per_pod_values_become_cel_over_the_object() {
    let cel = cel(&proxy_with(r#"        args: ["--namespace={{ pod.namespace }}"]"#));
    assert!(cel.contains("request.namespace"), "{cel}");
}

#[test]
fn the_status_annotation_is_written_as_the_webhook_writes_it_and_another_versions_skips_the_pod() {
    let set = TemplateSet::from_source("t", "t.yaml", CONTAINER, &Settings::default()).unwrap();
    let template = set.default_template();
    let [policy, binding] = compile(template, "t", &selection()).unwrap();
    let text = policy.to_string();
    let status = serde_json::to_string(template.status()).unwrap();
    assert!(text.contains(&serde_json::to_string(&status).unwrap()[1..20]), "{text}");
    let conditions: Vec<&str> =
        policy["spec"]["matchConditions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    for expected in
        ["takes-this-template", "not-skipped-opted-out", "not-skipped-windows", "not-skipped-injected-by-other-version"]
    {
        assert!(conditions.contains(&expected), "{conditions:?}");
    }
    assert_eq!(policy["spec"]["reinvocationPolicy"], "IfNeeded");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
}

#[test]
fn what_a_policy_cannot_do_as_the_webhook_does_is_refused_with_the_reason_and_line() {
    let refused = |source: &str| compiled(source).unwrap_err().to_string();
    let overrides = refused(
        "
values: { cpu: 10m }
overrides: { proxy-cpu: { value: cpu, type: quantity } }
pod:
  spec:
    containers: [{ name: proxy, image: p, resources: { requests: { cpu: \"{{ values.cpu }}\" } } }]
",
    );
    assert!(overrides.contains("overrides"), "{overrides}");
    let hold = refused(&format!(
        "holdApplicationUntilSidecarReady: true\n{CONTAINER}        startupProbe: {{ httpGet: {{ path: /ready, port: 15021 }} }}\n        lifecycle: {{ postStart: {{ exec: {{ command: [sh, -c, \"true\"] }} }} }}\n"
    ));
    assert!(hold.contains("holdApplicationUntilSidecarReady"), "{hold}");
    let leaf = refused(&proxy_with("        args:\n          - \"{{ pod.containers[0].name }}\""));
    assert!(leaf.starts_with("line 8: ") && leaf.contains("no CEL equivalent"), "{leaf}");

    // A container of hundreds of env vars: a guard for each, in case the pod declares the container itself.
    let env: String = (0..600).map(|i| format!("          - {{ name: VAR_{i}, value: \"{i}\" }}\n")).collect();
    let long = refused(&proxy_with(&format!("        env:\n{env}")));
    assert!(long.contains("characters, beyond the 100000"), "{long}");
}

#[test]
fn a_resize_policy_that_restarts_keeps_the_policy_from_pods_that_never_restart() {
    let kept = |source: &str| {
        let [policy, _] = compiled(source).unwrap();
        let conditions = policy["spec"]["matchConditions"].as_array().unwrap().clone();
        conditions
            .into_iter()
            .find(|c| c["name"] == "the-injected-pod-keeps-the-pod-wide-rules")
            .map(|c| c["expression"].clone())
    };
    let never = r#"string(object.spec.?restartPolicy.orValue("Always")) != "Never""#;
    let restarts = proxy_with("        resizePolicy: [{ resourceName: memory, restartPolicy: RestartContainer }]");
    let expression = kept(&restarts).expect("a condition");
    assert!(expression.as_str().unwrap().contains(never), "{expression}");
    let not_required = proxy_with("        resizePolicy: [{ resourceName: cpu, restartPolicy: NotRequired }]");
    assert!(
        !kept(&not_required).is_some_and(|e| e.as_str().unwrap().contains(never)),
        "NotRequired is kept everywhere"
    );
}
