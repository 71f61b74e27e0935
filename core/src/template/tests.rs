//! Template loading: every refusal names the file, the line and the reason.

use super::*;
use crate::TemplateSet;
use std::path::Path;

fn refuse(source: &str) -> (usize, String) {
    match TemplateSet::from_source("t", "t.yaml", source, &crate::settings::Settings::default()).unwrap_err() {
        TemplateError::Invalid { file, line, reason } => {
            assert_eq!(file, "t.yaml");
            (line, reason)
        }
        other => panic!("unexpected {other:?}"),
    }
}

const CONTAINER: &str = "pod:\n  spec:\n    containers:\n      - name: p\n        image: x\n";

#[test]
fn the_shipped_templates_compile() {
    let builtin = TemplateSet::builtin(&crate::settings::Settings::default()).unwrap();
    let builtin = builtin.default_template();
    assert_eq!(builtin.name(), "default");
    assert_eq!(builtin.hash().len(), 16);
    assert_eq!(builtin.injects().containers, ["proxy"]);
    assert!(builtin.renders_per_pod(), "the default template has a per-pod leaf");
    let native = TemplateSet::from_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/native-sidecar.yaml"),
        &crate::settings::Settings::default(),
    )
    .unwrap();
    assert_eq!(native.default_template().name(), "native-sidecar");
}

#[test]
fn the_status_annotation_names_template_version_and_parts() {
    let t = TemplateSet::from_source(
        "mesh",
        "t.yaml",
        CONTAINER,
        &crate::settings::Settings { annotation_prefix: "example.com/".into(), ..Default::default() },
    )
    .unwrap();
    let t = t.default_template();
    let status: serde_json::Value = serde_json::from_str(t.status()).unwrap();
    assert_eq!(status["template"], "mesh");
    assert_eq!(status["version"], t.hash());
    assert_eq!(status["containers"], serde_json::json!(["p"]));
    let edited = TemplateSet::from_source(
        "mesh",
        "t.yaml",
        &CONTAINER.replace("image: x", "image: z"),
        &crate::settings::Settings { annotation_prefix: "example.com/".into(), ..Default::default() },
    )
    .unwrap();
    assert_ne!(edited.default_template().hash(), t.hash(), "any edit changes the version");
}

#[test]
fn malformed_yaml_is_refused_at_its_line() {
    let (line, _) = refuse("pod:\n  spec:\n    containers: [\n");
    assert!(line >= 3);
}

#[test]
fn unknown_keys_and_bad_options_are_refused_at_their_line() {
    assert_eq!(refuse("values: {}\npods: {}\n"), (2, "unknown top-level key `pods` (did you mean `pod`?)".into()));
    assert_eq!(refuse("values: {}\nsidecar: {}\n"), (2, "unknown top-level key `sidecar` (expected one of values, pod, containerDefaults, containerDefaultsFor, overrides, initContainerPosition, injectHostNetwork, holdApplicationUntilSidecarReady, jobs, onError, validation, minKubernetesVersion)".into()));
    assert_eq!(refuse("initContainerPosition: middle\n").0, 1);
    assert_eq!(refuse("values: [1]\n").1, "`values` must be a mapping");
    assert_eq!(refuse("injectHostNetwork: maybe\n").1, "`injectHostNetwork` must be true or false");
    assert_eq!(refuse("validation: allow\n"), (1, "`validation` must be `deny` or `warn`".into()));
}

#[test]
fn invalid_containers_are_refused_at_the_offending_line() {
    let (line, reason) = refuse(&CONTAINER.replace("image: x", "image: x\n        imagePullPolcy: Always"));
    assert_eq!(
        (line, reason.as_str()),
        (6, "pod.spec.containers[0].imagePullPolcy: unknown field `imagePullPolcy` (did you mean `imagePullPolicy`?)")
    );
    let (line, reason) = refuse("pod:\n  spec:\n    containers:\n      - name: p\n");
    assert_eq!((line, reason.as_str()), (4, "pod.spec.containers[0]: a container needs an `image`"));
    let (line, reason) =
        refuse(&CONTAINER.replace("image: x", "image: x\n        ports:\n          - containerPort: http"));
    assert_eq!(line, 7);
    assert!(reason.starts_with("pod.spec.containers[0].ports[0].containerPort: invalid type"), "{reason}");
}

/// k8s-openapi knows every field of the newest release; the cluster's release may drop some (a feature gate off by
/// default there). Each is refused at its line, naming the release that keeps it.
#[test]
fn fields_the_release_drops_are_refused_naming_the_release_that_keeps_them() {
    let at = |minor: u32, source: &str| {
        let settings = crate::settings::Settings {
            kubernetes_version: crate::validation::KubeVersion::new(minor),
            ..Default::default()
        };
        TemplateSet::from_source("t", "t.yaml", source, &settings).map(drop).map_err(|e| e.to_string())
    };
    let hostname = "pod:\n  spec:\n    hostnameOverride: web\n";
    let refused = at(34, hostname).unwrap_err();
    assert!(refused.contains("t.yaml:3") && refused.contains("from Kubernetes 1.35"), "{refused}");
    assert!(refused.contains("HostnameOverride") && refused.contains("1.34"), "{refused}");
    at(35, hostname).unwrap();
    // Off by default in every release: refused at the newest too, in a container and in containerDefaults.
    let stop = CONTAINER.replace("image: x", "image: x\n        lifecycle:\n          stopSignal: SIGUSR1");
    let refused = at(37, &stop).unwrap_err();
    assert!(refused.contains("pod.spec.containers[0].lifecycle.stopSignal") && refused.contains("drops"), "{refused}");
    let defaults = format!(
        "{CONTAINER}containerDefaults:\n  volumeMounts:\n    - {{name: v, mountPath: /v, bindMountOptions: {{}}}}\n"
    );
    let refused = at(37, &defaults).unwrap_err();
    assert!(refused.contains("containerDefaults.volumeMounts[0].bindMountOptions"), "{refused}");
    // On by default from 1.35: a native sidecar's restart rules are kept.
    let rules = "pod:\n  spec:\n    containers:\n      - name: p\n        image: x\n        restartPolicy: Never\n        \
                 restartPolicyRules: [{action: Restart, exitCodes: {operator: In, values: [42]}}]\n";
    assert!(at(34, rules).unwrap_err().contains("restartPolicyRules"));
    // `*`: any probe, any volume source.
    let h2c = CONTAINER
        .replace("image: x", "image: x\n        readinessProbe:\n          httpGet: {port: 80, protocol: H2C}");
    assert!(at(37, &h2c).unwrap_err().contains("pod.spec.containers[0].readinessProbe.httpGet.protocol"));
    let user =
        format!("{CONTAINER}    volumes:\n      - name: s\n        secret: {{secretName: s, defaultUser: 1000}}\n");
    assert!(at(37, &user).unwrap_err().contains("pod.spec.volumes[0].secret.defaultUser"));
}

#[test]
fn merge_keys_must_be_present_unique_and_static() {
    let (line, reason) = refuse("pod:\n  spec:\n    imagePullSecrets:\n      - {}\n");
    assert_eq!(line, 4);
    assert!(reason.contains("needs a `name`"), "{reason}");
    let (line, reason) = refuse(&format!("{CONTAINER}      - name: p\n        image: z\n"));
    assert_eq!(line, 6);
    assert!(reason.contains("two items share the name \"p\""), "{reason}");
    let (_, reason) = refuse(&CONTAINER.replace("name: p", "name: \"{{ pod.name }}\""));
    assert!(reason.contains("cannot depend on the pod"), "{reason}");
}

#[test]
fn members_the_api_server_accepts_one_of_are_refused_together() {
    let probe =
        "image: x\n        readinessProbe:\n          exec: { command: [ready] }\n          httpGet: { port: 1 }";
    let (line, reason) = refuse(&CONTAINER.replace("image: x", probe));
    assert_eq!(line, 8);
    assert!(reason.contains("`httpGet` and `exec` exclude each other"), "{reason}");
    let env = "image: x\n        env:\n          - name: A\n            value: a\n            valueFrom: { fieldRef: { fieldPath: x } }";
    let (line, reason) = refuse(&CONTAINER.replace("image: x", env));
    assert_eq!(line, 9);
    assert!(reason.contains("`valueFrom` and `value` exclude each other"), "{reason}");
}

#[test]
fn expression_errors_are_refused_at_their_line() {
    let (line, reason) = refuse(&CONTAINER.replace("image: x", "image: \"{{ values.image }}\""));
    assert_eq!(line, 5);
    assert!(reason.contains("pod.spec.containers[0].image") && reason.contains("undefined"), "{reason}");
    let (line, reason) = refuse(&CONTAINER.replace("image: x", "image: \"{{ pod.nam | upper }}\""));
    assert_eq!(line, 5);
    assert!(reason.contains("cannot render on a sample pod"), "{reason}");
    let (_, reason) = refuse(&CONTAINER.replace("image: x", "image: \"{{ image }}\""));
    assert!(reason.contains("unknown variable `image`"), "{reason}");
    let (line, _) = refuse(&CONTAINER.replace("image: x", "image: \"{{ values.x \""));
    assert_eq!(line, 5);
}

#[test]
fn values_expressions_may_produce_whole_structures() {
    let source = "values:\n  res: { requests: { cpu: 10m } }\n  port: 9000\npod:\n  spec:\n    containers:\n      - name: p\n        image: x\n        resources: \"{{ values.res }}\"\n        ports: [{ containerPort: \"{{ values.port }}\" }]\n";
    let t = TemplateSet::from_source("t", "t.yaml", source, &crate::settings::Settings::default()).unwrap();
    // Values-only expressions render at load time: the one leaf left per pod is the injector's own.
    let template = t.default_template();
    assert!(template.slot_path(0).contains("default-container") && template.slot_path(1).is_empty());
    // A values expression of the wrong type is caught by validation.
    let (_, reason) = refuse(&source.replace("port: 9000", "port: http"));
    assert!(reason.contains("containerPort"), "{reason}");
}

#[test]
fn the_status_annotation_is_reserved() {
    let (_, reason) = refuse("pod:\n  metadata:\n    annotations:\n      sidecar-injector.io/status: x\n");
    assert!(reason.contains("written by the injector"), "{reason}");
}

#[test]
fn a_missing_file_is_a_read_error_naming_it() {
    let err =
        TemplateSet::from_file(Path::new("/nonexistent/t.yaml"), &crate::settings::Settings::default()).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/t.yaml"));
}

/// Every problem of a file, in the order of its lines: a typo in a field does not hide the API server's rules, nor
/// one expression that does not compile (or render) the others (issue 38).
#[test]
fn every_problem_of_a_file_is_listed() {
    let problems = |source: &str| -> Vec<(usize, String)> {
        match TemplateSet::from_source("t", "t.yaml", source, &crate::settings::Settings::default()).unwrap_err() {
            TemplateError::Several(all) => all
                .into_iter()
                .map(|e| match e {
                    TemplateError::Invalid { line, reason, .. } => (line, reason),
                    other => panic!("unexpected {other:?}"),
                })
                .collect(),
            other => panic!("one problem where there are several: {other:?}"),
        }
    };
    let typo_and_port = "pod:\n  spec:\n    containers:\n      - name: p\n        image: x\n        imagePullPolcy: Always\n        ports:\n          - containerPort: 99999\n";
    let found = problems(typo_and_port);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].0, 6);
    assert!(found[0].1.ends_with("(did you mean `imagePullPolicy`?)"), "{found:?}");
    assert_eq!(found[1].0, 8);
    assert!(found[1].1.contains("must be between 1 and 65535"), "{found:?}");
    let leaves = "pod:\n  spec:\n    containers:\n      - name: p\n        image: \"{{ valus.image }}\"\n        args: [\"{{ pod.labels.nope }}\"]\n        workingDir: \"{{ podd.name }}\"\n";
    let found = problems(leaves);
    assert_eq!(found.iter().map(|(line, _)| *line).collect::<Vec<_>>(), [5, 7], "{found:?}");
    assert!(found[0].1.ends_with("unknown variable `valus` (did you mean `values`?)"), "{found:?}");
    let leaves = leaves.replace("\"{{ valus.image }}\"", "x").replace("podd.name", "pod.nme");
    let found = problems(&leaves);
    assert_eq!(found.iter().map(|(line, _)| *line).collect::<Vec<_>>(), [6, 7], "{found:?}");
    assert!(found[0].1.contains("`{{ pod.labels.nope | default(...) }}`"), "{found:?}");
}

/// `check` warns of a label read without a default: the sample pods carry `app`, pods in the cluster may not
/// (issue 38). A read with a default, or of a label behind a test, is not warned of.
#[test]
fn reads_of_labels_without_a_default_are_warned_of() {
    let set = |leaf: &str| {
        let source = CONTAINER.replace("image: x", &format!("image: x\n        args: [\"{leaf}\"]"));
        TemplateSet::from_source("t", "t.yaml", &source, &crate::settings::Settings::default()).unwrap()
    };
    let unguarded = set("{{ pod.labels.app }}");
    let warnings = unguarded.default_template().warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("t.yaml:6: pod.spec.containers[0].args[0]: fails on a pod without labels"),
        "{warnings:?}"
    );
    assert!(warnings[0].contains("`{{ pod.labels.app | default(...) }}`"), "{warnings:?}");
    for guarded in [
        "{{ pod.labels.app | default(pod.name) }}",
        "{{ pod.labels.app if pod.labels.app is defined else '' }}",
        "{{ pod.name }}",
    ] {
        assert!(set(guarded).default_template().warnings().is_empty(), "{guarded}");
    }
    assert!(
        TemplateSet::builtin(&crate::settings::Settings::default()).unwrap().default_template().warnings().is_empty()
    );
}
