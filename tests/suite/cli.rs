//! The `sidecar-injector` binary (`review`, `serve`, `check`), run as a person would run it.

use crate::common;

use common::run;
use std::process::{Command, Output, Stdio};

const REVIEW: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus/reviews/apiserver-1.20-pod-create.json");

fn response(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).expect("stdout is the response AdmissionReview")
}

#[test]
fn review_answers_a_file_and_stdin_identically() {
    let from_file = run(&["review", "-f", REVIEW], "");
    assert!(from_file.status.success());
    let from_stdin = run(&["review"], std::fs::read(REVIEW).unwrap());
    assert!(from_stdin.status.success());
    assert_eq!(from_file.stdout, from_stdin.stdout);
    let answer = response(&from_file);
    let sent: serde_json::Value = serde_json::from_slice(&std::fs::read(REVIEW).unwrap()).unwrap();
    assert_eq!(answer["response"]["uid"], sent["request"]["uid"]);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    assert!(from_file.stderr.is_empty(), "nothing on stderr without --explain");
}

#[test]
fn explain_prints_the_decision_and_the_decoded_patch_on_stderr() {
    let output = run(&["review", "-f", REVIEW, "--explain"], "");
    assert!(output.status.success());
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    assert!(stderr.contains("pod: webhook-test/demo"), "{stderr}");
    assert!(stderr.contains("decision: injected, 5 add operation(s)"), "{stderr}");
    assert!(stderr.contains("\"path\": \"/spec/containers/-\""), "{stderr}");
    response(&output);

    let mut opted_out: serde_json::Value = serde_json::from_slice(&std::fs::read(REVIEW).unwrap()).unwrap();
    opted_out["request"]["object"]["metadata"]["annotations"] =
        serde_json::json!({"sidecar-injector.io/inject": "false"});
    let output = run(&["review", "--explain"], serde_json::to_vec(&opted_out).unwrap());
    assert!(output.status.success());
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    assert!(stderr.contains("decision: not injected (opted-out)"), "{stderr}");
    assert!(response(&output)["response"].get("patch").is_none());
}

#[test]
fn a_malformed_request_fails_with_a_one_line_reason() {
    let output = run(&["review"], b"{\"kind\":\"AdmissionReview\"");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("sidecar-injector: stdin: request body is not valid JSON"), "{stderr}");
}

#[test]
fn a_bad_template_fails_with_file_line_and_reason() {
    let dir = std::env::temp_dir().join(format!("si-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("broken.yaml");
    std::fs::write(&file, "pod:\n  spec:\n    containers:\n      - name: p\n").unwrap();
    let output = run(&["review", "-f", REVIEW, "--template", file.to_str().unwrap()], "");
    assert_eq!(output.status.code(), Some(2), "the templates are review's configuration");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains(&format!("{}:4: pod.spec.containers[0]: a container needs an `image`", file.display())),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn another_template_and_prefix_can_be_chosen() {
    let output = run(
        &[
            "review",
            "-f",
            REVIEW,
            "--template",
            "templates/native-sidecar.yaml",
            "--annotation-prefix",
            "mesh.example.com/",
            "--explain",
        ],
        "",
    );
    assert!(output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("template: native-sidecar"), "{stderr}");
    assert!(stderr.contains("\"mesh.example.com/status\""), "{stderr}");
    assert!(stderr.contains("\"restartPolicy\": \"Always\""), "{stderr}");
}

#[test]
fn serve_starts_with_no_configuration_and_exits_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--shutdown-delay", "0s"])
        .arg("--dev-ca-file")
        .arg(&ca)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("serving") {
        let mut line = String::new();
        assert!(log.read_line(&mut line).unwrap() > 0, "serve exited before serving:\n{seen}");
        seen.push_str(&line);
    }
    assert!(seen.contains("development CA") && ca.exists(), "{seen}");
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "serve did not exit after SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut log, &mut rest).unwrap();
    assert!(rest.contains("SIGTERM received"), "{rest}");
}

#[test]
fn check_summarises_a_good_directory_and_lists_every_problem_of_a_bad_one() {
    let output = run(&["check", "templates"], "");
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("default template default"), "{stdout}");
    assert!(stdout.contains("native-sidecar: version "), "{stdout}");
    assert!(stdout.contains("override: sidecar-injector.io/proxy-cpu (quantity)"), "{stdout}");
    assert!(stdout.ends_with("ok\n"));

    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string("templates/default.yaml").unwrap();
    std::fs::write(dir.path().join("default.yaml"), good.replace("proxyCPU: 50m", "proxyCPU: lots")).unwrap();
    std::fs::write(dir.path().join("agent.yaml"), "pod:\n  spec:\n    containers:\n      - name: a\n").unwrap();
    std::fs::write(dir.path().join("README.md"), "not a template").unwrap();
    let output = run(&["check", dir.path().to_str().unwrap()], "");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("agent.yaml:4: pod.spec.containers[0]: a container needs an `image`"), "{stderr}");
    assert!(stderr.contains("default.yaml:") && stderr.contains("not a valid quantity"), "{stderr}");
    assert!(output.stdout.is_empty());

    // Issue 38: a label read without a default passes (the sample pods carry `app`), with a warning and the fix.
    let reads_app = dir.path().join("reads-app.yaml");
    let source = "pod:\n  spec:\n    containers:\n      - name: side\n        image: x\n        args: [\"{{ pod.labels.app }}\"]\n";
    std::fs::write(&reads_app, source).unwrap();
    let output = run(&["check", reads_app.to_str().unwrap()], "");
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("    warning: ")
            && stdout.contains("reads-app.yaml:6: pod.spec.containers[0].args[0]: fails on a pod without labels"),
        "{stdout}"
    );
    assert!(stdout.contains("`{{ pod.labels.app | default(...) }}`"), "{stdout}");

    let output = run(&["check", "/nonexistent/t.yaml"], "");
    assert_eq!(output.status.code(), Some(2), "nothing to check is bad usage");
    assert!(String::from_utf8(output.stderr).unwrap().contains("/nonexistent/t.yaml"));
}

#[test]
fn check_reports_each_templates_pod_security_level_and_refuses_one_below_the_level_asked_for() {
    let output = run(&["check", "templates"], "");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("pod security: privileged (for an app that meets restricted)"), "{stdout}");
    assert!(stdout.contains("not baseline: capabilities_baseline (spec.initContainers[proxy-init]"), "{stdout}");

    let output = run(&["check", "--pod-security", "baseline", "templates"], "");
    assert_eq!(output.status.code(), Some(1), "the default template cannot meet baseline");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("cannot meet Pod Security level baseline"), "{stderr}");
    assert!(stderr.contains("default: privileged") && stderr.contains("capabilities.add"), "{stderr}");
    assert!(!stderr.contains("restricted: "), "the restricted template is not named: {stderr}");

    let output = run(&["check", "--pod-security", "restricted", "templates/restricted.yaml"], "");
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8(output.stdout).unwrap().ends_with("can meet Pod Security level restricted\n"));

    let output = run(&["check", "--pod-security", "strict", "templates"], "");
    assert_eq!(output.status.code(), Some(2), "an unknown level is bad usage");
}

#[test]
fn serve_refuses_to_start_without_a_valid_template_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("default.yaml"), "pod:\n  spec: [\n").unwrap();
    let output = run(&["serve", "--template-dir", dir.path().to_str().unwrap(), "--listen", "127.0.0.1:0"], "");
    assert_eq!(output.status.code(), Some(2), "serve's templates are its configuration");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("default.yaml:"), "{stderr}");

    std::fs::write(dir.path().join("default.yaml"), "pod: {}\n").unwrap();
    let output = run(&["serve", "--template-dir", dir.path().to_str().unwrap(), "--default-template", "mesh"], "");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8(output.stderr).unwrap().contains("no template named `mesh`"));

    // Revisions: each named once, with a name that fits a URL path and a label value.
    let dir = dir.path().to_str().unwrap();
    let twice = [format!("--template-dir=canary={dir}"), format!("--template-dir=canary={dir}")];
    let output = run(&["serve", &twice[0], &twice[1], "--listen", "127.0.0.1:0"], "");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8(output.stderr).unwrap().contains(r#"revision "canary" is given twice"#));
    let output = run(&["serve", &format!("--template-dir=Canary_1={dir}")], "");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8(output.stderr).unwrap().contains(r#"revision "Canary_1""#));

    // The ConfigMap read through the API server: of a revision served from a directory, by a valid name, in a pod
    // with a service account.
    let refused = [
        (vec!["--template-configmap=Bad_Name".to_owned()], r#"ConfigMap name "Bad_Name""#),
        (vec!["--template-configmap=canary=templates".to_owned()], r#"revision "canary" has no --template-dir"#),
        (vec!["--template-configmap=templates".to_owned()], "no in-cluster service account"),
    ];
    for (args, says) in refused {
        let mut all = vec!["serve".to_owned(), format!("--template-dir={dir}"), "--listen=127.0.0.1:0".to_owned()];
        all.extend(args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let output = run(&all, "");
        assert_eq!(output.status.code(), Some(2), "{all:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains(says), "{all:?}: {stderr}");
    }
}

#[test]
fn review_takes_a_template_directory_and_the_pods_template_annotation() {
    let mut review: serde_json::Value = serde_json::from_slice(&std::fs::read(REVIEW).unwrap()).unwrap();
    review["request"]["object"]["metadata"]["annotations"] =
        serde_json::json!({"sidecar-injector.io/template": "native-sidecar"});
    let output = run(&["review", "--template-dir", "templates", "--explain"], serde_json::to_vec(&review).unwrap());
    assert!(output.status.success());
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    assert!(stderr.contains("template: native-sidecar (version "), "{stderr}");
    assert_eq!(response(&output)["response"]["auditAnnotations"]["template"], "native-sidecar");
}

#[test]
fn review_validate_answers_as_the_validating_webhook() {
    let output = run(&["review", "--validate", "-f", REVIEW, "--explain"], "");
    assert_eq!(
        output.status.code(),
        Some(1),
        "validation refused the pod: the answer is printed, and the exit says so"
    );
    let answer = response(&output);
    assert_eq!(answer["response"]["allowed"], false);
    assert!(answer["response"]["status"]["message"].as_str().unwrap().contains("lacks what template default"));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("validation: refused,"), "{stderr}");

    let output = run(&["review", "--validate", "--validation", "warn", "-f", REVIEW], "");
    let answer = response(&output);
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["warnings"].as_array().unwrap().len(), 1);
}

/// The exit code of a run: 0 success, 1 the work found a problem, 2 bad usage or configuration.
fn code(output: &Output) -> i32 {
    output.status.code().expect("the binary exited (no signal)")
}

#[test]
fn exit_codes_tell_a_refusal_from_bad_usage() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "pod:\n  spec:\n    containers:\n      - { name: Proxy_Sidecar, image: x }\n").unwrap();
    let good = concat!(env!("CARGO_MANIFEST_DIR"), "/templates/default.yaml");
    let missing = dir.path().join("missing.yaml");
    let missing = missing.to_str().unwrap();

    assert_eq!(code(&run(&["check", good], "")), 0);
    assert_eq!(code(&run(&["check", broken.to_str().unwrap()], "")), 1, "check refused a template");
    assert_eq!(code(&run(&["check", missing], "")), 2, "nothing to check");
    assert_eq!(code(&run(&["check"], "")), 2, "clap's usage error");
    assert_eq!(code(&run(&["check", good, "--kubernetes-version", "latest"], "")), 2, "a bad flag value");

    assert_eq!(code(&run(&["review", "-f", REVIEW], "")), 0);
    assert_eq!(code(&run(&["review"], "{not json")), 1, "the input is not a review");
    assert_eq!(code(&run(&["review", "-f", missing], "")), 2, "an unreadable file");
    assert_eq!(
        code(&run(&["review", "-f", REVIEW, "--template", broken.to_str().unwrap()], "")),
        2,
        "unusable templates"
    );
    let review = std::fs::read(REVIEW).unwrap();
    assert_eq!(code(&run(&["review", "--validate"], &review)), 1, "validation refused the uninjected pod");

    let manifest = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: a}]}\n";
    assert_eq!(code(&run(&["inject", "-f", "-"], manifest)), 0);
    assert_eq!(code(&run(&["inject", "-f", "-"], "a: [1\n")), 1, "not YAML");
    assert_eq!(code(&run(&["inject", "-f", missing], "")), 2);
    assert_eq!(code(&run(&["serve", "--tls-cert", missing, "--tls-key", missing], "")), 2, "unusable TLS material");

    let help = run(&["--help"], "");
    assert!(String::from_utf8_lossy(&help.stdout).contains("Exit codes: 0 success; 1 the work found a problem"));
}

#[test]
fn certs_with_a_bad_base_leaves_the_output_directory_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let absent = dir.path().join("absent");
    for out in [&empty, &absent] {
        let output = run(&["certs", "--out", out.to_str().unwrap(), "--base", "/nonexistent/base"], "");
        assert_eq!(code(&output), 2, "{}", String::from_utf8_lossy(&output.stderr));
        assert!(String::from_utf8_lossy(&output.stderr).contains("--base /nonexistent/base: no such directory"));
    }
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "the empty directory stays empty");
    assert!(!absent.exists(), "the absent directory is not created");
    // A directory that is no kustomize base is refused the same way.
    let output = run(&["certs", "--out", absent.to_str().unwrap(), "--base", empty.to_str().unwrap()], "");
    assert_eq!(code(&output), 2);
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a kustomize base"));
    assert!(!absent.exists());
    // From another directory, with the base given, it works.
    let base = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/base");
    let output = run(&["certs", "--out", absent.to_str().unwrap(), "--base", base], "");
    assert_eq!(code(&output), 0, "{}", String::from_utf8_lossy(&output.stderr));
    let kustomization = std::fs::read_to_string(absent.join("kustomization.yaml")).unwrap();
    let reference =
        kustomization.lines().find(|l| l.contains("manifests/base")).unwrap().trim().trim_start_matches("- ");
    assert!(absent.join(reference).join("kustomization.yaml").is_file(), "{kustomization}");
}

#[test]
fn certs_with_a_revision_adds_its_component_and_the_ca_bundle_of_its_webhooks() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("overlay");
    let base = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/base");
    let output = run(&["certs", "--out", out.to_str().unwrap(), "--base", base, "--revision", "canary"], "");
    assert_eq!(code(&output), 0, "{}", String::from_utf8_lossy(&output.stderr));
    let kustomization = std::fs::read_to_string(out.join("kustomization.yaml")).unwrap();
    let component = kustomization.lines().skip_while(|l| *l != "components:").nth(1).unwrap();
    let component = component.trim().trim_start_matches("- ");
    assert!(component.ends_with("manifests/revision-canary"), "{kustomization}");
    assert!(out.join(component).join("kustomization.yaml").is_file(), "{kustomization}");
    let patch = std::fs::read_to_string(out.join("webhook-ca-patch.yaml")).unwrap();
    for webhook in ["inject", "validate", "canary.inject", "canary.validate"] {
        assert!(patch.contains(&format!("  - name: {webhook}.sidecar-injector.io\n")), "{webhook}: {patch}");
    }

    // A revision without a component is refused before anything is written.
    let absent = dir.path().join("absent");
    let output = run(&["certs", "--out", absent.to_str().unwrap(), "--base", base, "--revision", "beta"], "");
    assert_eq!(code(&output), 2);
    assert!(String::from_utf8_lossy(&output.stderr).contains("no component"), "{output:?}");
    assert!(!absent.exists());
}

/// `certs --kubernetes-version` for a cluster older than the base needs: the overlay tells the injector the version
/// and patches out what that version lacks, one `remove` of matchConditions per webhook (the revisions' too); a
/// version the manifests cannot serve is refused before anything is written.
#[test]
fn certs_for_an_older_cluster_patches_out_what_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let base = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/base");
    let out = dir.path().join("old");
    let args = ["certs", "--out", out.to_str().unwrap(), "--base", base, "--revision", "canary"];
    let output = run(&[&args[..], &["--kubernetes-version", "1.22"]].concat(), "");
    assert_eq!(code(&output), 0, "{}", String::from_utf8_lossy(&output.stderr));
    let kustomization = std::fs::read_to_string(out.join("kustomization.yaml")).unwrap();
    for expected in [
        "value: --kubernetes-version=1.22}",
        "/spec/template/spec/containers/0/lifecycle}",
        "value: --shutdown-delay=7s}",
        "{op: remove, path: /webhooks/0/matchConditions}",
        "{op: remove, path: /webhooks/1/matchConditions}",
        "/spec/unhealthyPodEvictionPolicy}",
        "value: autoscaling/v2beta2}",
    ] {
        assert!(kustomization.contains(expected), "{expected}:\n{kustomization}");
    }
    assert!(!kustomization.contains("policy/v1beta1"), "1.22 has policy/v1:\n{kustomization}");
    // Without the flag, nothing of it.
    let current = dir.path().join("current");
    let output = run(&["certs", "--out", current.to_str().unwrap(), "--base", base], "");
    assert_eq!(code(&output), 0);
    let kustomization = std::fs::read_to_string(current.join("kustomization.yaml")).unwrap();
    assert!(!kustomization.contains("kubernetes-version") && !kustomization.contains("op:"), "{kustomization}");
    // 1.19: no bound token for the ConfigMap read; the Deployment patches apply to the base (their `test`s hold).
    let oldest = dir.path().join("oldest");
    let output = run(&["certs", "--out", oldest.to_str().unwrap(), "--base", base, "--kubernetes-version", "1.19"], "");
    assert_eq!(code(&output), 0, "{}", String::from_utf8_lossy(&output.stderr));
    let kustomization = std::fs::read_to_string(oldest.join("kustomization.yaml")).unwrap();
    let kustomization = &sidecar_injector_core::offline::read_documents(&kustomization).unwrap()[0];
    let deployment_text = std::fs::read_to_string(format!("{base}/deployment.yaml")).unwrap();
    let mut deployment = sidecar_injector_core::offline::read_documents(&deployment_text).unwrap().remove(0);
    for patch in kustomization["patches"].as_array().unwrap() {
        if patch["target"]["kind"] != "Deployment" {
            continue;
        }
        let ops = sidecar_injector_core::offline::read_documents(patch["patch"].as_str().unwrap()).unwrap().remove(0);
        let ops: json_patch::Patch = serde_json::from_value(ops).unwrap();
        json_patch::patch(&mut deployment, &ops).unwrap_or_else(|e| panic!("{e}: {}", patch["patch"]));
    }
    let pod = &deployment["spec"]["template"]["spec"];
    let text = pod.to_string();
    assert!(!text.contains("api-access") && !text.contains("--template-configmap"), "{text}");
    assert!(text.contains("--template-dir") && text.contains("--kubernetes-version=1.19"), "{text}");
    // Too old for admissionregistration.k8s.io/v1.
    let absent = dir.path().join("absent");
    let output = run(&["certs", "--out", absent.to_str().unwrap(), "--base", base, "--kubernetes-version", "1.15"], "");
    assert_eq!(code(&output), 2);
    assert!(String::from_utf8_lossy(&output.stderr).contains("need Kubernetes 1.16"), "{output:?}");
    assert!(!absent.exists());
}

/// Re-running `certs` on its overlay without `--image` or `--kubernetes-version` (the README's renewal step) keeps
/// what the first run was told, and says so; giving them again changes them.
#[test]
fn certs_run_again_keeps_the_image_and_version_of_its_overlay() {
    let dir = tempfile::tempdir().unwrap();
    let base = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/base");
    let out = dir.path().join("overlay");
    let out = out.to_str().unwrap();
    let first = [
        "certs",
        "--out",
        out,
        "--base",
        base,
        "--image",
        "registry.example:5000/injector:1.2",
        "--kubernetes-version",
        "1.27",
    ];
    assert_eq!(code(&run(&first, "")), 0);
    let written = std::fs::read_to_string(dir.path().join("overlay/kustomization.yaml")).unwrap();
    let output = run(&["certs", "--out", out, "--base", base], "");
    assert_eq!(code(&output), 0, "{}", String::from_utf8_lossy(&output.stderr));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("keeping the image registry.example:5000/injector:1.2"), "{stderr}");
    assert!(stderr.contains("keeping --kubernetes-version 1.27"), "{stderr}");
    let again = std::fs::read_to_string(dir.path().join("overlay/kustomization.yaml")).unwrap();
    assert_eq!(again, written, "the renewal wrote the same overlay");
    // Told anew, it changes.
    let output = run(
        &["certs", "--out", out, "--base", base, "--image", "injector@sha256:abc", "--kubernetes-version", "1.30"],
        "",
    );
    assert_eq!(code(&output), 0);
    let changed = std::fs::read_to_string(dir.path().join("overlay/kustomization.yaml")).unwrap();
    assert!(changed.contains("digest: \"sha256:abc\"") && changed.contains("--kubernetes-version=1.30"), "{changed}");
    assert!(!changed.contains("shutdown-delay"), "1.30 has the sleep action: {changed}");
}

/// Issue 38: the canary component added by hand to a `certs` overlay (as the README offers) had webhooks without
/// a caBundle. `certs` run again keeps it, with any other component added by hand, and patches its webhooks.
#[test]
fn certs_run_again_keeps_a_component_added_by_hand_and_gives_its_webhooks_the_ca_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let base = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/base");
    let out = dir.path().join("overlay");
    let args = ["certs", "--out", out.to_str().unwrap(), "--base", base, "--kubernetes-version", "1.22"];
    assert_eq!(code(&run(&args, "")), 0);
    let written = std::fs::read_to_string(out.join("kustomization.yaml")).unwrap();
    assert!(written.contains("run `certs` again"), "the overlay says how to add a revision: {written}");
    let manifests = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests");
    let by_hand =
        format!("{written}components:\n  - {manifests}/revision-canary\n  - {manifests}/availability-first\n");
    std::fs::write(out.join("kustomization.yaml"), by_hand).unwrap();
    let output = run(&["certs", "--out", out.to_str().unwrap(), "--base", base], "");
    assert_eq!(code(&output), 0, "{}", String::from_utf8_lossy(&output.stderr));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("revision-canary of the existing overlay (its webhooks get the caBundle)"), "{stderr}");
    assert!(stderr.contains("keeping the component ") && stderr.contains("availability-first"), "{stderr}");
    let patch = std::fs::read_to_string(out.join("webhook-ca-patch.yaml")).unwrap();
    for webhook in ["canary.inject", "canary.validate"] {
        assert!(patch.contains(&format!("  - name: {webhook}.sidecar-injector.io\n")), "{webhook}: {patch}");
    }
    let again = std::fs::read_to_string(out.join("kustomization.yaml")).unwrap();
    assert!(again.contains("revision-canary") && again.contains("availability-first"), "{again}");
    assert!(again.contains("{op: remove, path: /webhooks/1/matchConditions}"), "the canary's webhooks too: {again}");
    // Run once more, nothing changes: the component is named once.
    assert_eq!(code(&run(&["certs", "--out", out.to_str().unwrap(), "--base", base], "")), 0);
    let third = std::fs::read_to_string(out.join("kustomization.yaml")).unwrap();
    assert_eq!(third, again);
}

/// Issue 35: `sidecar-injector check templates | head -1` panicked on the broken pipe (exit 101, a backtrace).
/// A reader that goes away ends the output quietly, for every command that writes to stdout.
#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    let templates = concat!(env!("CARGO_MANIFEST_DIR"), "/templates");
    let review = std::fs::read(REVIEW).unwrap();
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: a}]}\n";
    for (args, stdin) in [
        (vec!["check", templates], &b""[..]),
        (vec!["review", "--explain"], &review[..]),
        (vec!["inject", "-f", "-"], manifest.as_bytes()),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader is gone before the first byte is written.
        drop(child.stdout.take());
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin).unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
    }
}

/// `policy` writes a policy and a binding for each template that compiles, and names each that does not, with the
/// reason, exiting 1 (what compiles is still written); `--out` writes them as a kustomization.
#[test]
fn policy_compiles_the_templates_it_can_and_names_the_others_with_the_reason() {
    let templates = concat!(env!("CARGO_MANIFEST_DIR"), "/templates");
    let output = run(&["policy", templates], "");
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    for (file, reason) in
        [("default.yaml", "overrides"), ("restricted.yaml", "overrides"), ("wait-for-sidecar.yaml", "holdApplication")]
    {
        let line = stderr.lines().find(|l| l.contains(file)).unwrap_or_else(|| panic!("{file} named: {stderr}"));
        assert!(line.contains(reason), "{line}");
    }
    let documents = sidecar_injector_core::offline::read_documents(&String::from_utf8(output.stdout).unwrap()).unwrap();
    let names: Vec<(&str, &str)> =
        documents.iter().map(|d| (d["kind"].as_str().unwrap(), d["metadata"]["name"].as_str().unwrap())).collect();
    assert_eq!(
        names,
        [
            ("MutatingAdmissionPolicy", "sidecar-injector-demo"),
            ("MutatingAdmissionPolicyBinding", "sidecar-injector-demo"),
            ("MutatingAdmissionPolicy", "sidecar-injector-native-sidecar"),
            ("MutatingAdmissionPolicyBinding", "sidecar-injector-native-sidecar"),
        ]
    );
    let spec = &documents[0]["spec"];
    assert_eq!(spec["reinvocationPolicy"], "IfNeeded");
    assert_eq!(spec["matchConstraints"]["resourceRules"][0]["resources"][0], "pods");
    assert!(spec["mutations"][0]["jsonPatch"]["expression"].as_str().unwrap().contains("JSONPatch{op: \"add\""));

    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("policies");
    let output = run(&["policy", templates, "--out", dir.to_str().unwrap()], "");
    assert_eq!(output.status.code(), Some(1));
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    assert!(kustomization.contains("demo.yaml") && kustomization.contains("native-sidecar.yaml"), "{kustomization}");
    assert!(dir.join("demo.yaml").is_file() && !dir.join("default.yaml").exists());
}
