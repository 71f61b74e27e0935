//! Never a pod the API server refuses (issue 20): the findings that each answered 200 with a pod the API server
//! refuses, or said nothing, kept as regression tests. The rules themselves are tested one by one in
//! `core/src/validation/tests.rs`, and against a real API server in tests/e2e.rs.

use crate::common;

use common::{answer, apply, builtin, review, run};
use serde_json::{Value, json};
use sidecar_injector_core::validation::{KubeVersion, validate_pod};
use sidecar_injector_core::{Settings, TemplateError, TemplateSet, Verdict};

fn pod_with_annotations(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}, "annotations": annotations},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
    })
}

/// Injects `pod` with the built-in template: the warnings, and the injected pod, which the API server's rules
/// must accept.
fn inject(pod: &Value) -> (Vec<String>, Value) {
    let (outcome, _, patch) = answer(&builtin(), &review(pod));
    assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{outcome:?}");
    let injected = apply(pod, &patch.unwrap());
    let problems = validate_pod(&injected, KubeVersion::DEFAULT);
    assert!(problems.is_empty(), "the injected pod is invalid: {problems:#?}");
    (outcome.warnings, injected)
}

fn proxy(pod: &Value) -> &Value {
    pod["spec"]["containers"].as_array().unwrap().iter().find(|c| c["name"] == "proxy").unwrap()
}

#[test]
fn a_negative_quantity_override_is_refused_naming_the_rule() {
    let (warnings, injected) = inject(&pod_with_annotations(json!({"sidecar-injector.io/proxy-cpu": "-100m"})));
    assert_eq!(proxy(&injected)["resources"]["requests"]["cpu"], "50m", "the template's value is used");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("sidecar-injector.io/proxy-cpu=\"-100m\" refused"), "{warnings:?}");
    assert!(warnings[0].contains("Invalid value: \"-100m\": must be greater than or equal to 0"), "{warnings:?}");
    // The proxy follows the pod's own container (`containers[1]`): the warning names it, not the index it has in
    // the template (issue 38 met `spec.containers[0]`, the app).
    assert!(warnings[0].contains("spec.containers[proxy].resources.requests[cpu]"), "{warnings:?}");
}

#[test]
fn an_override_above_the_limit_it_meets_is_refused_and_one_with_its_limit_is_not() {
    let (warnings, injected) = inject(&pod_with_annotations(json!({"sidecar-injector.io/proxy-memory": "1Gi"})));
    assert_eq!(proxy(&injected)["resources"]["requests"]["memory"], "64Mi");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("must be less than or equal to memory limit"), "{warnings:?}");

    // Both overrides together are a valid pair: the request meets the overridden limit.
    let both = json!({"sidecar-injector.io/proxy-memory": "1Gi", "sidecar-injector.io/proxy-memory-limit": "2Gi"});
    let (warnings, injected) = inject(&pod_with_annotations(both));
    assert_eq!(warnings, Vec::<String>::new());
    assert_eq!(
        proxy(&injected)["resources"],
        json!({"requests": {"cpu": "50m", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "2Gi"}})
    );

    // The same for CPU: a request above the template's CPU limit is refused, and valid with a raised limit.
    let (warnings, injected) = inject(&pod_with_annotations(json!({"sidecar-injector.io/proxy-cpu": "2"})));
    assert!(warnings[0].contains("must be less than or equal to cpu limit"), "{warnings:?}");
    assert_eq!(proxy(&injected)["resources"]["requests"]["cpu"], "50m");
    let both = json!({"sidecar-injector.io/proxy-cpu": "2", "sidecar-injector.io/proxy-cpu-limit": "4"});
    let (warnings, injected) = inject(&pod_with_annotations(both));
    assert_eq!(warnings, Vec::<String>::new());
    assert_eq!(proxy(&injected)["resources"]["limits"]["cpu"], "4");

    // A limit lowered below the request is the one refused when it alone is at fault.
    let low = json!({"sidecar-injector.io/proxy-memory-limit": "32Mi", "sidecar-injector.io/proxy-cpu": "100m"});
    let (warnings, injected) = inject(&pod_with_annotations(low));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("proxy-memory-limit=\"32Mi\" refused"), "{warnings:?}");
    assert_eq!(proxy(&injected)["resources"]["requests"]["cpu"], "100m", "the valid override stays");
}

/// The built-in template with one line changed.
fn builtin_with(from: &str, to: &str) -> String {
    let source = sidecar_injector_core::template::BUILTIN_SOURCE;
    assert!(source.contains(from), "{from}");
    source.replacen(from, to, 1)
}

fn refusal(source: &str) -> Vec<String> {
    match TemplateSet::from_source("edited", "edited.yaml", source, &Settings::default()) {
        Ok(_) => panic!("accepted:\n{source}"),
        Err(TemplateError::Several(all)) => all.iter().map(ToString::to_string).collect(),
        Err(one) => vec![one.to_string()],
    }
}

fn line_of(source: &str, text: &str) -> usize {
    source.lines().position(|l| l.contains(text)).unwrap() + 1
}

#[test]
fn template_edits_the_api_server_would_refuse_are_refused_at_their_line() {
    let source = builtin_with("proxyMemory: 64Mi", "proxyMemory: 1Gi");
    let errors = refusal(&source);
    let requests = line_of(&source, "requests: { cpu: \"{{ values.proxyCPU }}\"");
    assert!(
        errors.iter().any(|e| e.starts_with(&format!("edited.yaml:{requests}: spec.containers[1].resources.requests: Invalid value: \"1Gi\": must be less than or equal to memory limit"))),
        "{errors:#?}"
    );

    let source = builtin_with("- name: proxy\n", "- name: Proxy_Sidecar\n");
    let errors = refusal(&source);
    let name = line_of(&source, "name: Proxy_Sidecar");
    assert!(
        errors.iter().any(|e| e.starts_with(&format!(
            "edited.yaml:{name}: spec.containers[1].name: Invalid value: \"Proxy_Sidecar\": a lowercase RFC 1123 label"
        ))),
        "{errors:#?}"
    );

    let source = builtin_with("containerPort: 15000", "containerPort: 99999");
    let errors = refusal(&source);
    let port = line_of(&source, "containerPort: 99999");
    assert!(
        errors.iter().any(|e| e.starts_with(&format!("edited.yaml:{port}: spec.containers[1].ports[0].containerPort: Invalid value: 99999: must be between 1 and 65535, inclusive"))),
        "{errors:#?}"
    );
}

#[test]
fn a_leading_zero_is_octal_as_kubectl_reads_it() {
    let source =
        "pod:\n  spec:\n    volumes:\n      - name: config\n        configMap: { name: agent, defaultMode: 0644 }\n";
    let template = TemplateSet::from_source("t", "t.yaml", source, &Settings::default()).unwrap();
    drop(template);
    let pod = pod_with_annotations(json!({}));
    let engine = common::engine_from(source);
    let (_, _, patch) = answer(&engine, &review(&pod));
    let injected = apply(&pod, &patch.unwrap());
    assert_eq!(injected["spec"]["volumes"][0]["configMap"]["defaultMode"], 420, "0644 is octal, as in kubectl");
    // Quoted, it is the string it looks like, and the API types refuse a string there.
    assert!(TemplateSet::from_source("t", "t.yaml", &source.replace("0644", "'0644'"), &Settings::default()).is_err());
}

#[test]
fn a_misspelt_annotation_under_our_prefix_gets_a_warning_naming_the_closest() {
    let (warnings, injected) = inject(&pod_with_annotations(json!({"sidecar-injector.io/proxy-cpus": "1"})));
    assert_eq!(proxy(&injected)["resources"]["requests"]["cpu"], "50m");
    assert_eq!(
        warnings,
        [
            "sidecar-injector: annotation sidecar-injector.io/proxy-cpus is not one the injector reads (did you mean sidecar-injector.io/proxy-cpu?); it is ignored"
        ]
    );
    // Our own annotations, declared overrides and other prefixes are quiet.
    let quiet = json!({"sidecar-injector.io/inject": "true", "sidecar-injector.io/proxy-cpu": "100m",
                       "example.com/proxy-cpus": "1"});
    assert_eq!(inject(&pod_with_annotations(quiet)).0, Vec::<String>::new());
    let far = inject(&pod_with_annotations(json!({"sidecar-injector.io/colour": "blue"}))).0;
    assert!(far[0].contains("not one the injector reads for template default (known: "), "{far:?}");
}

#[test]
fn check_lists_every_problem_of_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = builtin_with("containerPort: 15000", "containerPort: 99999")
        .replacen("- name: proxy\n", "- name: Proxy_Sidecar\n", 1)
        .replacen("proxyMemory: 64Mi", "proxyMemory: 1Gi", 1);
    std::fs::write(dir.path().join("default.yaml"), &bad).unwrap();
    std::fs::write(dir.path().join("other.yaml"), "pod:\n  metadata:\n    labels:\n      Bad Key: x\n").unwrap();
    let output = run(&["check", dir.path().to_str().unwrap()], "");
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    for expected in [
        "Invalid value: 99999",
        "Invalid value: \"Proxy_Sidecar\"",
        "must be less than or equal to memory limit",
        "other.yaml:4: metadata.labels: Invalid value: \"Bad Key\"",
    ] {
        assert!(stderr.contains(expected), "{expected} missing from:\n{stderr}");
    }
}

#[test]
fn container_defaults_never_pair_no_escalation_with_privilege() {
    let source =
        "containerDefaults:\n  securityContext: { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true }\n";
    let engine = common::engine_from(source);
    for context in [json!({"privileged": true}), json!({"capabilities": {"add": ["CAP_SYS_ADMIN"]}})] {
        let mut pod = pod_with_annotations(json!({}));
        pod["spec"]["containers"][0]["securityContext"] = context.clone();
        let (_, _, patch) = answer(&engine, &review(&pod));
        let injected = apply(&pod, &patch.unwrap());
        let sc = &injected["spec"]["containers"][0]["securityContext"];
        assert!(sc.get("allowPrivilegeEscalation").is_none(), "{sc}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "the rest of the defaults is added: {sc}");
        assert!(validate_pod(&injected, KubeVersion::DEFAULT).is_empty(), "{injected}");
    }
}

#[test]
fn a_per_pod_value_the_api_server_would_refuse_follows_on_error() {
    // A label rendered from the pod's name is longer than 63 characters for a long name.
    let template = |policy: &str| {
        format!(
            "onError: {policy}\npod:\n  metadata:\n    labels:\n      owner: \"{{{{ pod.name or pod.generateName }}}}-sidecar\"\n  spec:\n    \
             containers:\n      - {{ name: proxy, image: \"proxy:1\" }}\n"
        )
    };
    let long = "a".repeat(60);
    let mut pod = pod_with_annotations(json!({}));
    pod["metadata"]["name"] = json!(long);

    let (outcome, response, patch) = answer(&common::engine_from(&template("deny")), &review(&pod));
    assert!(matches!(outcome.verdict, Verdict::Denied(sidecar_injector_core::SkipReason::RenderFailed)), "{outcome:?}");
    assert!(patch.is_none());
    let message = response["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("field pod.metadata.labels.owner rendered a value the API server would refuse"),
        "{message}"
    );
    assert!(
        message.contains("metadata.labels[owner]: Invalid value: \"aaaa")
            && message.contains("must be no more than 63 characters"),
        "{message}"
    );

    let (outcome, _, patch) = answer(&common::engine_from(&template("allow")), &review(&pod));
    assert!(
        matches!(outcome.verdict, Verdict::Skipped(sidecar_injector_core::SkipReason::RenderFailed)),
        "{outcome:?}"
    );
    assert!(patch.is_none() && outcome.warnings[0].contains("admitted without the sidecar"), "{outcome:?}");

    // A short name passes, and pays only the check of its one leaf.
    pod["metadata"]["name"] = json!("web");
    let (outcome, _, patch) = answer(&common::engine_from(&template("deny")), &review(&pod));
    assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{outcome:?}");
    assert_eq!(apply(&pod, &patch.unwrap())["metadata"]["labels"]["owner"], "web-sidecar");
}

/// Issue 35: fields the validator did not judge. Each edit of the built-in template passed `check` and made the
/// API server refuse every injected pod; now each is refused at its line with the API server's error.
#[test]
fn template_fields_the_validator_did_not_judge_are_refused_at_their_line() {
    let spec = "  spec:\n    initContainers:\n";
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "proxyImage: ghcr.io/sidecar-injector/proxy:1.4.2",
            "proxyImage: \"ghcr.io/sidecar-injector/proxy:1.4.2 \"",
            "image: \"{{ values.proxyImage }}\"",
            "spec.containers[1].image: Invalid value: \"ghcr.io/sidecar-injector/proxy:1.4.2 \": must not have leading or trailing whitespace",
        ),
        (
            spec,
            "  spec:\n    dnsPolicy: None\n    initContainers:\n",
            "dnsPolicy: None",
            "spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None",
        ),
        (
            spec,
            "  spec:\n    readinessGates:\n      - conditionType: \"proxy ready\"\n    initContainers:\n",
            "conditionType: \"proxy ready\"",
            "spec.readinessGates[0].conditionType: Invalid value: \"proxy ready\": name part must consist of alphanumeric characters",
        ),
        (
            spec,
            "  spec:\n    runtimeClassName: Kata_Containers\n    initContainers:\n",
            "runtimeClassName: Kata_Containers",
            "spec.runtimeClassName: Invalid value: \"Kata_Containers\": a lowercase RFC 1123 subdomain",
        ),
        (
            spec,
            "  spec:\n    tolerations:\n      - { key: dedicated, operator: Equals, value: proxy }\n    initContainers:\n",
            "operator: Equals",
            "spec.tolerations[0].operator: Unsupported value: \"Equals\": supported values: \"Equal\", \"Exists\"",
        ),
        (
            spec,
            "  spec:\n    tolerations:\n      - { key: dedicated, operator: Exists, value: proxy }\n    initContainers:\n",
            "operator: Exists, value: proxy",
            "value must be empty when `operator` is 'Exists'",
        ),
        (
            spec,
            "  spec:\n    tolerations:\n      - { key: dedicated, value: \"a b\" }\n    initContainers:\n",
            "value: \"a b\"",
            "spec.tolerations[0].operator: Invalid value: \"a b\": a valid label must be",
        ),
        (
            spec,
            "  spec:\n    affinity:\n      nodeAffinity:\n        requiredDuringSchedulingIgnoredDuringExecution:\n          nodeSelectorTerms:\n            - matchExpressions:\n                - { key: zone, operator: Within, values: [a] }\n    initContainers:\n",
            "operator: Within",
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator: Invalid value: \"Within\": not a valid selector operator",
        ),
        (
            spec,
            "  spec:\n    affinity:\n      nodeAffinity:\n        requiredDuringSchedulingIgnoredDuringExecution:\n          nodeSelectorTerms:\n            - matchExpressions:\n                - { key: zone, operator: In }\n    initContainers:\n",
            "operator: In }",
            "matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
        ),
        (
            spec,
            "  spec:\n    affinity:\n      podAntiAffinity:\n        preferredDuringSchedulingIgnoredDuringExecution:\n          - weight: 0\n            podAffinityTerm:\n              topologyKey: kubernetes.io/hostname\n              labelSelector:\n                matchExpressions:\n                  - { key: app, operator: Exists, values: [web] }\n    initContainers:\n",
            "weight: 0",
            "spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: Invalid value: 0: must be in the range 1-100",
        ),
    ];
    for (from, to, at, expected) in cases {
        let source = builtin_with(from, to);
        let errors = refusal(&source);
        let line = line_of(&source, at);
        assert!(
            errors.iter().any(|e| e.starts_with("edited.yaml:") && e.contains(expected)),
            "{to}: expected {expected:?}:\n{errors:#?}"
        );
        assert!(
            errors.iter().filter(|e| e.contains(expected)).all(|e| {
                let reported: usize = e["edited.yaml:".len()..].split(':').next().unwrap().parse().unwrap();
                reported <= line && reported + 12 >= line
            }),
            "{to}: reported near line {line}:\n{errors:#?}"
        );
    }
}

/// Issue 35: an image with trailing whitespace from a values file (a directory's values.yaml, shared by every
/// template) is refused like one written in the template.
#[test]
fn an_image_with_whitespace_from_a_values_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("default.yaml"), sidecar_injector_core::template::BUILTIN_SOURCE).unwrap();
    std::fs::write(dir.path().join("values.yaml"), "proxyImage: \" ghcr.io/sidecar-injector/proxy:1.4.2\"\n").unwrap();
    let output = run(&["check", dir.path().to_str().unwrap()], "");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "spec.containers[1].image: Invalid value: \" ghcr.io/sidecar-injector/proxy:1.4.2\": must not have leading or trailing whitespace"
        ),
        "{stderr}"
    );
}

/// Issue 35: `containerDefaults` with a host port passed the one-container sample pods and was refused for every
/// pod with two containers (the same host port twice). The sample pods now include one with several containers
/// of other shapes, so the template is refused at load, at the defaults' line.
#[test]
fn container_defaults_with_a_host_port_are_refused_for_pods_of_several_containers() {
    let source = "containerDefaults:\n  ports:\n    - { name: node-metrics, containerPort: 9100, hostPort: 9100 }\n\
                  pod:\n  spec:\n    containers:\n      - { name: proxy, image: \"proxy:1\" }\n";
    let errors = refusal(source);
    assert!(
        errors.iter().any(|e| e
            .starts_with("edited.yaml:3: spec.containers[1].ports[1].hostPort: Duplicate value: \"TCP//9100\"")
            && e.contains("a pod with several containers")),
        "{errors:#?}"
    );
    // Defaults without a host port are fine in every container shape.
    let fine = "containerDefaults:\n  env:\n    - { name: MESH, value: \"on\" }\n\
                pod:\n  spec:\n    containers:\n      - { name: proxy, image: \"proxy:1\" }\n";
    assert!(TemplateSet::from_source("fine", "fine.yaml", fine, &Settings::default()).is_ok());
}

/// Issue 35: a sidecar host port the pod already uses was patched in; the API server then refused the pod. Now
/// the pod is judged whole (only for templates that write host ports) and the template's `onError` decides, with
/// a warning naming the rule and the value.
#[test]
fn a_sidecar_host_port_the_pod_already_uses_follows_on_error() {
    let template = |policy: &str| {
        format!(
            "onError: {policy}\npod:\n  spec:\n    containers:\n      - name: agent\n        image: \"agent:1\"\n        \
             ports: [{{ name: dns, containerPort: 53, hostPort: 53, protocol: UDP }}]\n"
        )
    };
    let mut pod = pod_with_annotations(json!({}));
    pod["spec"]["containers"][0]["ports"] = json!([{"containerPort": 5353, "hostPort": 53, "protocol": "UDP"}]);

    let (outcome, _, patch) = answer(&common::engine_from(&template("allow")), &review(&pod));
    assert_eq!(outcome.verdict, Verdict::Skipped(sidecar_injector_core::SkipReason::PodConflict), "{outcome:?}");
    assert!(patch.is_none());
    assert!(
        outcome.warnings[0].contains("admitted without the sidecar")
            && outcome.warnings[0].contains("hostPort: Duplicate value: \"UDP//53\""),
        "{:?}",
        outcome.warnings
    );

    let (outcome, response, _) = answer(&common::engine_from(&template("deny")), &review(&pod));
    assert_eq!(outcome.verdict, Verdict::Denied(sidecar_injector_core::SkipReason::PodConflict));
    assert!(response["response"]["status"]["message"].as_str().unwrap().contains("UDP//53"), "{response}");

    // Another protocol, another address or another port is no clash: injected, and valid.
    for own in [
        json!({"containerPort": 5353, "hostPort": 53, "protocol": "TCP"}),
        json!({"containerPort": 5353, "hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.1"}),
        json!({"containerPort": 5353, "hostPort": 5353, "protocol": "UDP"}),
    ] {
        pod["spec"]["containers"][0]["ports"] = json!([own]);
        let (outcome, _, patch) = answer(&common::engine_from(&template("deny")), &review(&pod));
        assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{own}: {outcome:?}");
        let injected = apply(&pod, &patch.unwrap());
        assert_eq!(validate_pod(&injected, KubeVersion::DEFAULT), vec![], "{own}");
    }
}

/// Issue 35: values rendered from the pod that were served with `allowed: true` and no warning, and refused by
/// the API server: a probe port read from an annotation as 99999, a request read from an annotation above the
/// template's limit, an image read from an annotation with a leading space. Each now follows `onError`, with a
/// warning (or refusal) naming the rule and the value; a pod whose values are fine is injected as before.
#[test]
fn values_rendered_from_the_pod_are_judged_before_the_answer() {
    let template = |policy: &str| {
        format!(
            "onError: {policy}\npod:\n  spec:\n    containers:\n      - name: proxy\n        \
             image: \"{{{{ pod.annotations['example.com/proxy-image'] | default('proxy:1') }}}}\"\n        \
             readinessProbe:\n          tcpSocket:\n            \
             port: \"{{{{ pod.annotations['example.com/probe-port'] | default(15000) | int }}}}\"\n        \
             resources:\n          \
             requests: {{ memory: \"{{{{ pod.annotations['example.com/proxy-memory'] | default('64Mi') }}}}\" }}\n          \
             limits: {{ memory: 256Mi }}\n"
        )
    };
    let cases = [
        (
            "example.com/probe-port",
            "99999",
            "readinessProbe.tcpSocket.port: Invalid value: 99999: must be between 1 and 65535, inclusive",
        ),
        (
            "example.com/proxy-memory",
            "1Gi",
            "resources.requests: Invalid value: \"1Gi\": must be less than or equal to memory limit",
        ),
        (
            "example.com/proxy-image",
            " proxy:2",
            "image: Invalid value: \" proxy:2\": must not have leading or trailing whitespace",
        ),
    ];
    let allow = common::engine_from(&template("allow"));
    let deny = common::engine_from(&template("deny"));
    for (annotation, value, expected) in cases {
        let pod = pod_with_annotations(json!({annotation: value}));
        let (outcome, _, patch) = answer(&allow, &review(&pod));
        assert_eq!(outcome.verdict, Verdict::Skipped(sidecar_injector_core::SkipReason::RenderFailed), "{annotation}");
        assert!(patch.is_none());
        assert!(
            outcome.warnings.len() == 1
                && outcome.warnings[0].contains("admitted without the sidecar")
                && outcome.warnings[0].contains(expected),
            "{annotation}: {:?}",
            outcome.warnings
        );
        let (outcome, response, _) = answer(&deny, &review(&pod));
        assert_eq!(outcome.verdict, Verdict::Denied(sidecar_injector_core::SkipReason::RenderFailed), "{annotation}");
        assert!(response["response"]["status"]["message"].as_str().unwrap().contains(expected), "{response}");
    }
    // Values within the rules are injected, and the pod is one the API server accepts.
    let fine = json!({"example.com/probe-port": "8081", "example.com/proxy-memory": "128Mi",
                      "example.com/proxy-image": "proxy:2"});
    let pod = pod_with_annotations(fine);
    let (outcome, _, patch) = answer(&deny, &review(&pod));
    assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{outcome:?}");
    let injected = apply(&pod, &patch.unwrap());
    assert_eq!(validate_pod(&injected, KubeVersion::DEFAULT), vec![]);
    assert_eq!(injected["spec"]["containers"][1]["readinessProbe"]["tcpSocket"]["port"], 8081);
    // The values judged valid are remembered (the same values again are not judged again); other values still are.
    let (outcome, _, _) = answer(&deny, &review(&pod));
    assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{outcome:?}");
    let bad = pod_with_annotations(json!({"example.com/probe-port": "99999"}));
    let (outcome, _, _) = answer(&deny, &review(&bad));
    assert_eq!(outcome.verdict, Verdict::Denied(sidecar_injector_core::SkipReason::RenderFailed));
}
