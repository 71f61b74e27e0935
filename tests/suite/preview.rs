//! The apply-time preview (`/preview`, issue 41): a workload's pod template injected as its pods will be, and what
//! would go wrong said back as warnings. Never a refusal.

use crate::common;

use common::*;
use serde_json::{Value, json};
use sidecar_injector_core::{Engine, Outcome, Settings, TemplateSet, Verdict};

/// A workload review (`kind` in `group`, `operation`) around `object`.
fn workload_review(group: &str, kind: &str, operation: &str, object: &Value, old: Option<&Value>) -> Value {
    let version = "v1";
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7d1f-preview",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
            "namespace": "shop",
            "operation": operation,
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    })
}

/// A Deployment whose pods carry `annotations` and `spec`.
fn deployment(annotations: Value, spec: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}, "annotations": annotations}, "spec": spec}
        }
    })
}

fn app() -> Value {
    json!({"containers": [{"name": "app", "image": "shop/web:1"}]})
}

/// The preview's outcome and its response, checked for what every preview answer must be: the same version and
/// uid, allowed, no patch, and exactly the outcome's warnings.
fn preview(engine: &Engine, review: &Value) -> (Outcome, Value) {
    let mut body = serde_json::to_vec(review).unwrap();
    let mut out = Vec::new();
    let outcome = engine.preview(&mut body, &mut out).unwrap();
    let response: Value = serde_json::from_slice(&out).expect("the answer is JSON");
    assert_eq!(response["apiVersion"], review["apiVersion"]);
    assert_eq!(response["kind"], "AdmissionReview");
    assert_eq!(response["response"]["uid"], review["request"]["uid"]);
    assert_eq!(response["response"]["allowed"], true, "a preview never refuses: {response}");
    assert!(response["response"].get("patch").is_none(), "a preview never patches: {response}");
    let sent: Vec<&str> =
        response["response"]["warnings"].as_array().into_iter().flatten().map(|w| w.as_str().unwrap()).collect();
    assert_eq!(sent, outcome.warnings, "the warnings sent are the outcome's");
    (outcome, response)
}

fn templates(outcome: &Outcome) -> usize {
    match outcome.verdict {
        Verdict::Previewed { templates, .. } => templates,
        other => panic!("not a preview's verdict: {other:?}"),
    }
}

#[test]
fn a_deployment_whose_pods_inject_cleanly_is_admitted_without_a_warning() {
    let (outcome, _) =
        preview(&builtin(), &workload_review("apps", "Deployment", "CREATE", &deployment(json!({}), app()), None));
    assert_eq!(templates(&outcome), 1);
    assert!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);
}

#[test]
fn a_pod_template_naming_an_unknown_template_is_warned_about_with_the_workload_and_the_reason() {
    let object = deployment(json!({"sidecar-injector.io/template": "defualt"}), app());
    let (outcome, _) = preview(&builtin(), &workload_review("apps", "Deployment", "CREATE", &object, None));
    assert_eq!(outcome.verdict, Verdict::Previewed { templates: 1, unknown_template: true });
    assert_eq!(outcome.warnings.len(), 1, "{:?}", outcome.warnings);
    let warning = &outcome.warnings[0];
    assert!(warning.starts_with("Deployment shop/web: "), "{warning}");
    assert!(
        warning.contains("defualt") && warning.contains("default"),
        "names the template and a suggestion: {warning}"
    );
}

#[test]
fn under_the_deny_policy_the_warning_says_the_pods_would_be_refused() {
    let settings = Settings { on_unknown_template: sidecar_injector_core::Policy::Deny, ..Settings::default() };
    let engine = Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings);
    let object = deployment(json!({"sidecar-injector.io/template": "nope"}), app());
    let (outcome, _) = preview(&engine, &workload_review("apps", "Deployment", "CREATE", &object, None));
    assert_eq!(outcome.warnings.len(), 1, "{:?}", outcome.warnings);
    assert!(
        outcome.warnings[0].starts_with("Deployment shop/web: its pods would be refused by the sidecar injector: "),
        "{:?}",
        outcome.warnings
    );
    assert!(outcome.warnings[0].contains("nope"), "{:?}", outcome.warnings);
}

#[test]
fn pods_the_rules_leave_out_are_named_with_the_reason_but_opted_out_pods_are_not() {
    let host = json!({"hostNetwork": true, "containers": [{"name": "app", "image": "shop/web:1"}]});
    let mut daemonset = deployment(json!({}), host);
    daemonset["kind"] = json!("DaemonSet");
    let (outcome, _) = preview(&builtin(), &workload_review("apps", "DaemonSet", "CREATE", &daemonset, None));
    assert_eq!(outcome.warnings.len(), 1, "{:?}", outcome.warnings);
    let warning = &outcome.warnings[0];
    assert!(warning.starts_with("DaemonSet shop/web: its pods would be admitted without the sidecar: "), "{warning}");
    assert!(warning.contains("host network"), "{warning}");

    let opted_out = deployment(json!({"sidecar-injector.io/inject": "false"}), app());
    let (outcome, _) = preview(&builtin(), &workload_review("apps", "Deployment", "CREATE", &opted_out, None));
    assert_eq!(templates(&outcome), 1);
    assert!(outcome.warnings.is_empty(), "the user asked for it: {:?}", outcome.warnings);
}

#[test]
fn a_value_the_template_renders_for_these_pods_that_the_api_server_would_refuse_is_named() {
    // A label rendered from the pod's generateName (the workload's name and `-`) is too long for a long name.
    let template = |policy: &str| {
        engine_from(&format!(
            "onError: {policy}\npod:\n  metadata:\n    labels:\n      owner: \"{{{{ pod.name or pod.generateName }}}}-sidecar\"\n  \
             spec:\n    containers:\n      - {{ name: proxy, image: \"proxy:1\" }}\n"
        ))
    };
    let mut object = deployment(json!({}), app());
    object["metadata"]["name"] = json!("a".repeat(60));
    let review = workload_review("apps", "Deployment", "CREATE", &object, None);
    let (outcome, _) = preview(&template("deny"), &review);
    assert_eq!(outcome.warnings.len(), 1, "{:?}", outcome.warnings);
    let warning = &outcome.warnings[0];
    assert!(warning.contains(": its pods would be refused by the sidecar injector: "), "{warning}");
    assert!(warning.contains("metadata.labels[owner]") && warning.contains("63 characters"), "{warning}");
    let (outcome, _) = preview(&template("allow"), &review);
    assert_eq!(outcome.warnings.len(), 1, "one warning, the engine's own: {:?}", outcome.warnings);
    assert!(outcome.warnings[0].contains("admitted without the sidecar"), "{:?}", outcome.warnings);
    // A short name renders a valid label: no warning.
    let (outcome, _) = preview(
        &template("deny"),
        &workload_review("apps", "Deployment", "CREATE", &deployment(json!({}), app()), None),
    );
    assert!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);
}

#[test]
fn cronjobs_and_jobs_are_previewed_through_their_own_template_paths() {
    let pod = json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "backup", "image": "backup:1"}]}});
    let cronjob = json!({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": pod}}}
    });
    let (outcome, _) = preview(&builtin(), &workload_review("batch", "CronJob", "CREATE", &cronjob, None));
    assert_eq!(templates(&outcome), 1);
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once"}, "spec": {"template": pod}});
    let (outcome, _) = preview(&builtin(), &workload_review("batch", "Job", "CREATE", &job, None));
    assert_eq!(templates(&outcome), 1);
    // On a Kubernetes without native sidecars, a Job's pods go without the sidecar: said once, with the cause.
    let settings =
        Settings { kubernetes_version: sidecar_injector_core::validation::KubeVersion::new(28), ..Settings::default() };
    let old = Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings);
    let (outcome, _) = preview(&old, &workload_review("batch", "Job", "CREATE", &job, None));
    assert_eq!(outcome.warnings.len(), 1, "{:?}", outcome.warnings);
    assert!(
        outcome.warnings[0].starts_with("Job shop/once: ") && outcome.warnings[0].contains("1.29"),
        "{:?}",
        outcome.warnings
    );
}

#[test]
fn what_is_not_a_users_new_pod_template_is_not_previewed() {
    let engine = builtin();
    let broken = deployment(json!({"sidecar-injector.io/template": "nope"}), app());
    let not_previewed = |review: Value| {
        let (outcome, _) = preview(&engine, &review);
        assert_eq!(outcome.verdict, Verdict::Previewed { templates: 0, unknown_template: false }, "{review}");
        assert!(outcome.warnings.is_empty());
    };
    // A controller's ReplicaSet: its Deployment was previewed.
    let mut owned = broken.clone();
    owned["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "1", "controller": true}]);
    not_previewed(workload_review("apps", "ReplicaSet", "CREATE", &owned, None));
    // An update that leaves the pod template as it was (a replica count, a label).
    let mut scaled = broken.clone();
    scaled["spec"]["replicas"] = json!(5);
    not_previewed(workload_review("apps", "Deployment", "UPDATE", &scaled, Some(&broken)));
    // A subresource, a delete, a Pod (it has its own webhook), a kind of another group.
    let mut review = workload_review("apps", "Deployment", "UPDATE", &broken, Some(&broken));
    review["request"]["subResource"] = json!("scale");
    not_previewed(review);
    not_previewed(workload_review("apps", "Deployment", "DELETE", &broken, None));
    not_previewed(workload_review(
        "",
        "Pod",
        "CREATE",
        &json!({"metadata": {"annotations": {"sidecar-injector.io/template": "nope"}}, "spec": app()}),
        None,
    ));
    not_previewed(workload_review("example.com", "Deployment", "CREATE", &broken, None));

    // An update that changes the pod template is previewed; an owner that is not the controller does not count.
    let mut owned_loosely = broken.clone();
    owned_loosely["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "2"}]);
    let (outcome, _) = preview(
        &engine,
        &workload_review("apps", "Deployment", "UPDATE", &owned_loosely, Some(&deployment(json!({}), app()))),
    );
    assert_eq!(outcome.verdict, Verdict::Previewed { templates: 1, unknown_template: true });
}

/// Issue 51, item 4: a preview expands the pod template several times in memory (a Deployment of 1 MiB of numbers
/// held 230 MiB), so a template of more values than a preview expands is admitted with a warning that says so,
/// not previewed; one of ten thousand values is previewed as any other.
#[test]
fn a_pod_template_too_large_to_expand_is_admitted_with_a_warning_not_previewed() {
    let engine = builtin();
    let with_values = |n: usize| {
        let mut spec = app();
        spec["containers"][0]["args"] = json!(vec!["a"; n]);
        workload_review(
            "apps",
            "Deployment",
            "CREATE",
            &deployment(json!({"sidecar-injector.io/template": "nope"}), spec),
            None,
        )
    };
    let (outcome, _) = preview(&engine, &with_values(10_000));
    assert_eq!(outcome.verdict, Verdict::Previewed { templates: 1, unknown_template: true });
    let (outcome, _) = preview(&engine, &with_values(40_000));
    assert_eq!(outcome.verdict, Verdict::Previewed { templates: 0, unknown_template: false });
    assert_eq!(
        outcome.warnings,
        ["Deployment shop/web: not previewed by the sidecar injector: its pod template has more than 32768 values, \
          more than a preview expands"]
    );
}

#[test]
fn a_v1beta1_review_is_answered_in_v1beta1_and_a_broken_one_is_an_error() {
    let mut review = workload_review("apps", "Deployment", "CREATE", &deployment(json!({}), app()), None);
    review["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let (outcome, response) = preview(&builtin(), &review);
    assert_eq!(templates(&outcome), 1);
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1beta1");
    let mut out = Vec::new();
    assert!(builtin().preview(&mut b"{\"kind\":\"AdmissionReview\"".to_vec(), &mut out).is_err());
    let mut duplicated =
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","kind":"AdmissionReview","request":{}}"#
            .to_vec();
    assert!(builtin().preview(&mut duplicated, &mut out).is_err(), "the one reading of each key holds here too");
}

#[test]
fn the_preview_says_what_inject_would_do_to_the_same_manifest() {
    // The same engine and the same reading of workloads: a workload `inject` injects is one the preview passes
    // quietly, and one it skips is one the preview warns about.
    let engine = builtin();
    for (object, warned) in [
        (deployment(json!({}), app()), false),
        (deployment(json!({}), json!({"hostNetwork": true, "containers": [{"name": "a", "image": "a"}]})), true),
        (deployment(json!({"sidecar-injector.io/template": "nope"}), app()), true),
    ] {
        let mut document = object.clone();
        let reports = sidecar_injector_core::offline::inject_document(&engine, &mut document, "shop").unwrap();
        let injected = matches!(reports[0].verdict, Verdict::Injected { .. });
        let (outcome, _) = preview(&engine, &workload_review("apps", "Deployment", "CREATE", &object, None));
        assert_eq!(!outcome.warnings.is_empty(), warned, "{:?}", outcome.warnings);
        assert_eq!(injected, !warned, "{reports:?}");
    }
}
