//! Validation (`/validate`, `review --validate`): a pod passes exactly when injecting it again would add nothing.

use crate::common;

use common::*;
use serde_json::{Value, json};
use sidecar_injector_core::{Engine, Outcome, Settings, SkipReason, TemplateSet, Validation, Verdict};

/// The engine's validation answer: outcome and response JSON.
fn validate(engine: &Engine, pod: &Value) -> (Outcome, Value) {
    let mut body = serde_json::to_vec(&review(pod)).unwrap();
    let mut out = Vec::new();
    let outcome = engine.validate(&mut body, &mut out).unwrap();
    (outcome, serde_json::from_slice(&out).expect("the response is JSON"))
}

fn app_pod() -> Value {
    json!({
        "metadata": {"generateName": "web-7d4b9c-", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}
    })
}

/// The pod as the mutating webhook leaves it.
fn injected(engine: &Engine, pod: &Value) -> Value {
    apply(pod, &patch_for(engine, pod).expect("the pod is injected"))
}

fn with_validation(policy: Validation) -> Engine {
    let settings = Settings { validation: policy, ..Settings::default() };
    Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings)
}

fn refusal(response: &Value) -> (bool, i64, String) {
    let r = &response["response"];
    (
        r["allowed"].as_bool().unwrap(),
        r["status"]["code"].as_i64().unwrap_or(0),
        r["status"]["message"].as_str().unwrap_or("").to_owned(),
    )
}

#[test]
fn an_injected_pod_is_complete() {
    let engine = builtin();
    let (outcome, response) = validate(&engine, &injected(&engine, &app_pod()));
    assert_eq!(outcome.verdict, Verdict::Complete);
    assert_eq!(response["response"]["allowed"], true);
    assert!(response["response"].get("warnings").is_none());
    assert!(response["response"].get("patch").is_none(), "validation never patches");
    assert_eq!(response["response"]["uid"], "0f7c1e9a-uid");
}

#[test]
fn a_pod_stripped_of_any_injected_part_is_refused_naming_it() {
    let engine = builtin();
    let template = engine.template();
    let good = injected(&engine, &app_pod());
    let mut cases: Vec<(&str, Value, &str)> = Vec::new();

    let mut no_sidecar = good.clone();
    no_sidecar["spec"]["containers"].as_array_mut().unwrap().retain(|c| c["name"] != "proxy");
    cases.push(("the sidecar container", no_sidecar, "container proxy"));

    let mut no_volume = good.clone();
    no_volume["spec"]["volumes"].as_array_mut().unwrap().retain(|v| v["name"] != "sidecar-injector-proxy");
    cases.push(("an injected volume", no_volume, "volume sidecar-injector-proxy"));

    let mut no_status = good.clone();
    no_status["metadata"]["annotations"].as_object_mut().unwrap().remove("sidecar-injector.io/status");
    cases.push(("the status annotation", no_status, "annotation sidecar-injector.io/status"));

    let mut renamed_mount = good.clone();
    renamed_mount["spec"]["containers"][1]["volumeMounts"][0]["mountPath"] = json!("/elsewhere");
    cases.push(("a mount moved by a later webhook", renamed_mount, "container proxy: volumeMounts[/var/run/proxy]"));

    cases.push(("a pod created while the injector was down", app_pod(), "container proxy"));

    for (what, pod, named) in cases {
        let (outcome, response) = validate(&engine, &pod);
        assert!(matches!(outcome.verdict, Verdict::Incomplete { refused: true, .. }), "{what}: {:?}", outcome.verdict);
        let (allowed, code, message) = refusal(&response);
        assert!(!allowed, "{what}");
        assert_eq!(code, 403, "{what}");
        assert!(message.contains(named), "{what}: {message}");
        let expected = format!("lacks what template {} (version {}) injects", template.name(), template.hash());
        assert!(message.contains(&expected), "{what}: {message}");
        assert!(!message.contains('\n'), "one line");
    }
    let (_, response) = validate(&engine, &app_pod());
    let message = refusal(&response).2;
    for part in [
        "container proxy",
        "init container proxy-init",
        "volume sidecar-injector-proxy",
        "label sidecar-injector.io/injected",
    ] {
        assert!(message.contains(part), "an uninjected pod lacks {part}: {message}");
    }
}

#[test]
fn warn_admits_the_pod_with_the_same_words() {
    let engine = with_validation(Validation::Warn);
    let (outcome, response) = validate(&engine, &app_pod());
    assert!(matches!(outcome.verdict, Verdict::Incomplete { refused: false, missing } if missing > 0));
    assert_eq!(response["response"]["allowed"], true);
    let warnings = response["response"]["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].as_str().unwrap().contains("lacks what template default"), "{warnings:?}");
    assert_eq!(outcome.warnings.len(), 1);
}

#[test]
fn a_templates_own_policy_wins_and_the_strictest_part_of_a_combination_decides() {
    let dir = tempfile::tempdir().unwrap();
    let template = |validation: &str, container: &str| {
        format!(
            "validation: {validation}\npod:\n  spec:\n    containers:\n      - {{ name: {container}, image: \"{container}:1\" }}\n"
        )
    };
    std::fs::write(dir.path().join("default.yaml"), template("warn", "a")).unwrap();
    std::fs::write(dir.path().join("strict.yaml"), template("deny", "b")).unwrap();
    let settings = Settings { validation: Validation::Deny, ..Settings::default() };
    let set = TemplateSet::load_dir(dir.path(), "default", &settings).unwrap();
    let engine = Engine::new(set, &settings);
    let pod = |template: Option<&str>| {
        let mut pod = app_pod();
        if let Some(name) = template {
            pod["metadata"]["annotations"] = json!({"sidecar-injector.io/template": name});
        }
        pod
    };
    let refused = |pod: &Value| match validate(&engine, pod).0.verdict {
        Verdict::Incomplete { refused, .. } => refused,
        other => panic!("{other:?}"),
    };
    assert!(!refused(&pod(None)), "the default template only warns, whatever the server default");
    assert!(refused(&pod(Some("strict"))));
    assert!(refused(&pod(Some("default,strict"))), "deny wins in a combination");
    assert!(
        std::panic::catch_unwind(|| {
            let bad = "validation: maybe\npod: {}\n";
            sidecar_injector_core::TemplateSet::from_source(
                "bad",
                "bad.yaml",
                bad,
                &sidecar_injector_core::Settings::default(),
            )
            .unwrap()
        })
        .is_err()
    );
    let error = sidecar_injector_core::TemplateSet::from_source(
        "bad",
        "bad.yaml",
        "pod: {}\nvalidation: maybe\n",
        &sidecar_injector_core::Settings { annotation_prefix: "p/".into(), ..Default::default() },
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("bad.yaml:2") && error.to_string().contains("`validation` must be `deny` or `warn`"),
        "{error}"
    );
}

#[test]
fn what_the_mutating_path_skips_is_allowed_without_question() {
    let engine = builtin();
    let mut opted_out = app_pod();
    opted_out["metadata"]["annotations"] = json!({"sidecar-injector.io/inject": "false"});
    let mut mirror = app_pod();
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
    let mut host_network = app_pod();
    host_network["spec"]["hostNetwork"] = json!(true);
    for (pod, reason) in
        [(opted_out, SkipReason::OptedOut), (mirror, SkipReason::MirrorPod), (host_network, SkipReason::HostNetwork)]
    {
        let (outcome, response) = validate(&engine, &pod);
        assert_eq!(outcome.verdict, Verdict::Skipped(reason));
        assert_eq!(response["response"]["allowed"], true);
        assert!(response["response"].get("warnings").is_none());
    }
    // Not a pod, not a CREATE: allowed.
    let mut update = review(&app_pod());
    update["request"]["operation"] = json!("UPDATE");
    let mut body = serde_json::to_vec(&update).unwrap();
    let mut out = Vec::new();
    assert_eq!(engine.validate(&mut body, &mut out).unwrap().verdict, Verdict::Skipped(SkipReason::NotCreate));
}

#[test]
fn a_users_own_override_of_a_sidecar_field_is_not_a_violation() {
    let engine = builtin();
    let mut customised = injected(&engine, &app_pod());
    let proxy = &mut customised["spec"]["containers"][1];
    assert_eq!(proxy["name"], "proxy");
    proxy["image"] = json!("registry.example.com/proxy:patched");
    proxy["resources"]["requests"]["cpu"] = json!("2");
    proxy["env"][0]["valueFrom"] = json!({"fieldRef": {"fieldPath": "metadata.uid"}});
    proxy["securityContext"]["runAsUser"] = json!(2000);
    let (outcome, _) = validate(&engine, &customised);
    assert_eq!(outcome.verdict, Verdict::Complete, "only what injection would add counts");

    // A pod that declared the sidecar itself, partly: injection completes it, so validation names the rest.
    let mut declared = app_pod();
    declared["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "proxy", "image": "mine:1"}));
    let (outcome, response) = validate(&engine, &declared);
    assert!(matches!(outcome.verdict, Verdict::Incomplete { .. }));
    let message = refusal(&response).2;
    assert!(message.contains("container proxy: args") && !message.contains("container proxy,"), "{message}");
}

#[test]
fn validation_answers_in_the_version_asked() {
    let engine = builtin();
    let mut review = review(&app_pod());
    review["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut body = serde_json::to_vec(&review).unwrap();
    let mut out = Vec::new();
    engine.validate(&mut body, &mut out).unwrap();
    let response: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(response["response"]["allowed"], false);
}

/// While a ConfigMap edit that adds a template rolls through the replicas, the mutating call may meet a replica
/// that does not have the template yet (the pod is admitted uninjected) and the validating call one that does: a
/// template that reached this replica by a reload less than the grace ago does not make it refuse such a pod (a
/// warning says why). Templates it started with, an older arrival, and a pod some replica did inject are judged
/// as always.
#[test]
fn a_template_that_just_arrived_does_not_refuse_pods_no_replica_injected() {
    use std::time::{Duration, Instant};
    let settings = Settings::default();
    let default = TemplateSet::builtin(&settings).unwrap();
    let compile = |templates: &[(&str, &str)]| {
        let sources = sidecar_injector_core::SetSources {
            origin: "test".into(),
            templates: templates.iter().map(|(n, s)| (n.to_string(), format!("{n}.yaml"), s.to_string())).collect(),
            values: None,
            ignored: Vec::new(),
        };
        TemplateSet::compile(sources, "default", &settings).unwrap()
    };
    // The server's reload: the set served with the state carried from the engine it replaces.
    let replacing = |set: TemplateSet, previous: &Engine, now: Instant| {
        let served = sidecar_injector::server::serving::Served::after(previous, &set, now);
        Engine::serving(set, &settings, std::sync::Arc::new(served))
    };
    let agent = "pod:\n  spec:\n    containers:\n      - {name: agent, image: \"agent:1\"}\n";
    let source = sidecar_injector_core::template::BUILTIN_SOURCE;
    let before = Engine::new(default, &settings);
    let asks = {
        let mut pod = app_pod();
        pod["metadata"]["annotations"] = json!({"sidecar-injector.io/template": "agent"});
        pod
    };

    // The reload that brought `agent` happened just now: admitted, with the reason.
    let after = replacing(compile(&[("default", source), ("agent", agent)]), &before, Instant::now());
    let (outcome, response) = validate(&after, &asks);
    assert_eq!(outcome.verdict, Verdict::Incomplete { missing: 3, refused: false }, "{response}");
    assert_eq!(response["response"]["allowed"], true);
    let warning = response["response"]["warnings"][0].as_str().unwrap();
    assert!(warning.contains("reached this replica less than 120s ago"), "{warning}");
    // The default template was there before the reload: a pod without it is refused as always.
    let (outcome, _) = validate(&after, &app_pod());
    assert!(matches!(outcome.verdict, Verdict::Incomplete { refused: true, .. }), "{:?}", outcome.verdict);
    // A pod that a replica injected and something stripped is refused even during the grace.
    let mut stripped = injected(&after, &asks);
    stripped["spec"]["containers"].as_array_mut().unwrap().retain(|c| c["name"] != "agent");
    let (outcome, _) = validate(&after, &stripped);
    assert!(matches!(outcome.verdict, Verdict::Incomplete { refused: true, .. }), "{:?}", outcome.verdict);

    // Past the grace (the reload three minutes ago), refused; a later reload keeps the first arrival.
    let long_ago = Instant::now().checked_sub(Duration::from_secs(180)).expect("the machine is up for 3 minutes");
    let settled = replacing(compile(&[("default", source), ("agent", agent)]), &before, long_ago);
    let again = replacing(compile(&[("default", source), ("agent", agent)]), &settled, Instant::now());
    for engine in [&settled, &again] {
        let (outcome, response) = validate(engine, &asks);
        assert!(matches!(outcome.verdict, Verdict::Incomplete { refused: true, .. }), "{response}");
    }
    // A template the process started with is never in its grace.
    let (outcome, _) = validate(&Engine::new(compile(&[("default", source), ("agent", agent)]), &settings), &asks);
    assert!(matches!(outcome.verdict, Verdict::Incomplete { refused: true, .. }));
}
