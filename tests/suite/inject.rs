//! `sidecar-injector inject`: every workload kind's pod template injected once, other objects untouched, the
//! output injected again unchanged, YAML read as kubectl reads it.

use crate::common;

use common::{env_value, run};
use serde_json::Value;

/// One of every kind `inject` knows, and some it must leave alone.
const MANIFESTS: &str = r#"# A namespace-less Service: passed through.
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  ports:
  - port: 80
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  enabled: "yes"
  mode: "0644"
---
apiVersion: v1
kind: Pod
metadata:
  name: solo
  namespace: shop
spec:
  containers:
  - name: app
    image: nginx
    volumeMounts:
    - name: config
      mountPath: /etc/app
  volumes:
  - name: config
    configMap:
      name: settings
      defaultMode: 0644
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        ports:
        - containerPort: 8080
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: legacy
spec:
  selector:
    matchLabels: {app: legacy}
  template:
    metadata:
      labels: {app: legacy}
      annotations:
        sidecar-injector.io/inject: "false"
    spec:
      containers:
      - name: legacy
        image: legacy:1
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
  namespace: data
spec:
  serviceName: db
  selector:
    matchLabels: {app: db}
  template:
    metadata:
      labels: {app: db}
    spec:
      containers:
      - name: postgres
        image: postgres:17
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
spec:
  selector:
    matchLabels: {app: agent}
  template:
    metadata:
      labels: {app: agent}
    spec:
      containers:
      - name: agent
        image: agent:2
---
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: rs
spec:
  selector:
    matchLabels: {app: rs}
  template:
    metadata:
      labels: {app: rs}
    spec:
      containers:
      - name: rs
        image: rs:1
---
apiVersion: v1
kind: ReplicationController
metadata:
  name: rc
spec:
  selector: {app: rc}
  template:
    metadata:
      labels: {app: rc}
    spec:
      containers:
      - name: rc
        image: rc:1
---
apiVersion: batch/v1
kind: Job
metadata:
  name: migrate
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: migrate
        image: migrate:1
---
apiVersion: batch/v1
kind: CronJob
metadata:
  name: nightly
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers:
          - name: report
            image: report:1
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata:
    name: listed
  spec:
    containers:
    - name: app
      image: busybox
- apiVersion: v1
  kind: Secret
  metadata:
    name: s
  stringData:
    password: "on"
---
# Another group's Job has no pod template where batch/v1's has one.
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: volcano
spec:
  tasks: []
"#;

fn documents(text: &[u8]) -> Vec<Value> {
    sidecar_injector_core::offline::read_documents(std::str::from_utf8(text).unwrap()).unwrap()
}

/// The pod template of a workload (the object itself for a Pod).
fn template(object: &Value) -> Option<&Value> {
    let group = object["apiVersion"].as_str()?.rsplit_once('/').map_or("", |(group, _)| group);
    if !["", "apps", "batch"].contains(&group) {
        return None;
    }
    match object["kind"].as_str()? {
        "Pod" => Some(object),
        "CronJob" => object.pointer("/spec/jobTemplate/spec/template"),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "ReplicationController" | "Job" => {
            object.pointer("/spec/template")
        }
        _ => None,
    }
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array().map(|items| items.iter().filter_map(|c| c["name"].as_str()).collect()).unwrap_or_default()
}

fn all_objects(documents: &[Value]) -> Vec<&Value> {
    documents
        .iter()
        .flat_map(|d| match d["kind"].as_str() {
            Some("List") => d["items"].as_array().unwrap().iter().collect(),
            _ => vec![d],
        })
        .collect()
}

#[test]
fn every_pod_template_is_injected_once_and_everything_else_is_untouched() {
    let output = run(&["inject", "-f", "-"], MANIFESTS);
    assert!(output.status.success());
    let before = documents(MANIFESTS.as_bytes());
    let after = documents(&output.stdout);
    assert_eq!(after.len(), before.len(), "one document out for each in");
    let (before, after) = (all_objects(&before), all_objects(&after));

    let mut injected = Vec::new();
    for (old, new) in before.iter().zip(&after) {
        let name = format!("{} {}", old["kind"].as_str().unwrap(), old["metadata"]["name"].as_str().unwrap_or(""));
        let opted_out = name == "Deployment legacy";
        match template(new) {
            Some(pod) if !opted_out => {
                let containers = names(&pod["spec"]["containers"]);
                // A Job's pods (and a CronJob's) get the proxy as a native sidecar, which ends with the Job.
                let by_job = old["apiVersion"].as_str().is_some_and(|v| v.starts_with("batch/"));
                let (proxies, init) = if by_job { (0, vec!["proxy-init", "proxy"]) } else { (1, vec!["proxy-init"]) };
                assert_eq!(containers.iter().filter(|n| **n == "proxy").count(), proxies, "{name}: {containers:?}");
                assert_eq!(names(&pod["spec"]["initContainers"]), init, "{name}");
                assert!(names(&pod["spec"]["volumes"]).contains(&"sidecar-injector-proxy"), "{name}");
                assert_eq!(pod["metadata"]["labels"]["sidecar-injector.io/injected"], "true", "{name}");
                assert!(pod["metadata"]["annotations"]["sidecar-injector.io/status"].is_string(), "{name}");
                // The user's containers are kept, first and unchanged.
                assert_eq!(pod["spec"]["containers"][0], template(old).unwrap()["spec"]["containers"][0], "{name}");
                // What was injected is a valid Pod.
                let as_pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"], "spec": pod["spec"]});
                serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(as_pod)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                // Outside the template, nothing changed.
                let (mut old_rest, mut new_rest) = ((*old).clone(), (*new).clone());
                for rest in [&mut old_rest, &mut new_rest] {
                    strip_template(rest);
                }
                assert_eq!(old_rest, new_rest, "{name}: only the pod template changes");
                injected.push(name);
            }
            _ => assert_eq!(old, new, "{name} passes through"),
        }
    }
    assert_eq!(
        injected,
        [
            "Pod solo",
            "Deployment web",
            "StatefulSet db",
            "DaemonSet agent",
            "ReplicaSet rs",
            "ReplicationController rc",
            "Job migrate",
            "CronJob nightly",
            "Pod listed"
        ]
    );
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("Deployment default/legacy: not injected (opted-out)"), "{stderr}");

    // YAML as kubectl reads it: the octal mode is 0644, quoted strings stay strings.
    let solo = after.iter().find(|o| o["metadata"]["name"] == "solo").unwrap();
    assert_eq!(solo["spec"]["volumes"][0]["configMap"]["defaultMode"], 0o644);
    let settings = after.iter().find(|o| o["metadata"]["name"] == "settings").unwrap();
    assert_eq!(settings["data"], serde_json::json!({"enabled": "yes", "mode": "0644"}));
    // Per-pod values are rendered from the template's labels, namespace and the controller's name.
    let web = after.iter().find(|o| o["metadata"]["name"] == "web" && o["kind"] == "Deployment").unwrap();
    let proxy = &web["spec"]["template"]["spec"]["containers"][1];
    assert_eq!(env_value(proxy, "PROXY_SERVICE_NAME"), "web");
}

fn strip_template(object: &mut Value) {
    let path = match object["kind"].as_str() {
        Some("Pod") => {
            object["metadata"] = Value::Null;
            object["spec"] = Value::Null;
            return;
        }
        Some("CronJob") => "/spec/jobTemplate/spec/template",
        _ => "/spec/template",
    };
    if let Some(template) = object.pointer_mut(path) {
        *template = Value::Null;
    }
}

#[test]
fn injecting_the_output_again_changes_nothing() {
    let first = run(&["inject", "-f", "-"], MANIFESTS);
    assert!(first.status.success());
    let second = run(&["inject", "-f", "-"], std::str::from_utf8(&first.stdout).unwrap());
    assert!(second.status.success());
    assert_eq!(String::from_utf8(second.stdout).unwrap(), String::from_utf8(first.stdout).unwrap());
    let stderr = String::from_utf8(second.stderr).unwrap();
    assert_eq!(stderr.matches("already-injected").count(), 9, "{stderr}");
}

#[test]
fn json_in_json_out_and_files_work_like_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("workloads.yaml");
    std::fs::write(&file, MANIFESTS).unwrap();
    let from_file = run(&["inject", "-f", file.to_str().unwrap(), "-q"], "");
    let from_stdin = run(&["inject", "--filename", "-", "--quiet"], MANIFESTS);
    assert!(from_file.status.success());
    assert_eq!(from_file.stdout, from_stdin.stdout);
    assert!(from_file.stderr.is_empty(), "--quiet");

    let pod = std::fs::read_to_string(common::corpus("pods/k8s-examples-AI_model-serving-tensorflow_deployment.json"))
        .unwrap();
    let json = run(&["inject", "-f", "-"], &pod);
    assert!(json.status.success());
    let out: Value = serde_json::from_slice(&json.stdout).expect("JSON in, JSON out");
    assert!(names(&out["spec"]["containers"]).contains(&"proxy"));
    let yaml = run(&["inject", "-f", "-", "-o", "yaml"], &pod);
    assert_eq!(documents(&yaml.stdout), [out]);
}

#[test]
fn a_refused_pod_or_bad_yaml_fails_with_the_reason_and_prints_nothing() {
    let asks = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n    sidecar-injector.io/template: nope\nspec:\n  containers:\n  - {name: a, image: b}\n";
    // A template whose `onError: deny` refuses a pod it cannot render for.
    let dir = tempfile::tempdir().unwrap();
    let denies = dir.path().join("denies.yaml");
    let source =
        "onError: deny\npod:\n  spec:\n    containers: [{name: s, image: x, args: [\"{{ pod.labels.app }}\"]}]\n";
    std::fs::write(&denies, source).unwrap();
    let plain = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - {name: a, image: b}\n";
    let refused = run(&["inject", "-f", "-", "--template", denies.to_str().unwrap()], plain);
    assert_eq!(refused.status.code(), Some(1));
    assert!(refused.stdout.is_empty());
    let stderr = String::from_utf8(refused.stderr).unwrap();
    assert!(stderr.contains("Pod default/p: refused:") && stderr.contains("pod.labels.app"), "{stderr}");

    // Admitted without the sidecar by the webhook, which `inject` reports as a failure too (issue 38).
    let allowed = run(&["inject", "-f", "-"], asks);
    assert_eq!(allowed.status.code(), Some(1));
    assert!(allowed.stdout.is_empty());
    assert!(String::from_utf8(allowed.stderr).unwrap().contains("warning"));

    let broken = run(&["inject", "-f", "-"], "kind: Pod\nspec: [1, 2\nmetadata: {}\n");
    assert_eq!(broken.status.code(), Some(1));
    assert!(broken.stdout.is_empty());
    let stderr = String::from_utf8(broken.stderr).unwrap();
    assert!(stderr.starts_with("sidecar-injector: stdin: ") && stderr.contains("line"), "{stderr}");
}

/// Issue 38: a pod template that should get the sidecar and cannot (an expression fails to render for it, a
/// template it names is not there) exits 1 with nothing on stdout, naming the workload and, through the
/// webhook's warning, the fix; a pod the rules leave out (opted out) is not a failure.
#[test]
fn a_pod_template_that_cannot_be_injected_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("reads-app.yaml");
    let source = "pod:\n  spec:\n    containers:\n      - { name: side, image: x, args: [\"{{ pod.labels.app }}\"] }\n";
    std::fs::write(&template, source).unwrap();
    let template = template.to_str().unwrap();
    let deployment = |labels: &str, annotations: &str| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web}}\nspec:\n  template:\n    metadata: \
             {{labels: {labels}, annotations: {annotations}}}\n    spec:\n      containers: [{{name: web, image: nginx}}]\n"
        )
    };
    let unlabelled = run(&["inject", "-f", "-", "--template", template], deployment("{x: y}", "{}"));
    assert_eq!(unlabelled.status.code(), Some(1));
    assert!(unlabelled.stdout.is_empty(), "nothing on stdout");
    let stderr = String::from_utf8(unlabelled.stderr).unwrap();
    assert!(stderr.contains("could not inject Deployment default/web (render-failed)"), "{stderr}");
    assert!(stderr.contains("`{{ pod.labels.app | default(...) }}`"), "the fix: {stderr}");

    let labelled = run(&["inject", "-f", "-", "--template", template], deployment("{app: web}", "{}"));
    assert_eq!(labelled.status.code(), Some(0), "{}", String::from_utf8_lossy(&labelled.stderr));

    let unknown = run(&["inject", "-f", "-"], deployment("{}", "{sidecar-injector.io/template: nope}"));
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("(unknown-template)"));

    let opted_out = run(&["inject", "-f", "-"], deployment("{}", "{sidecar-injector.io/inject: \"false\"}"));
    assert_eq!(opted_out.status.code(), Some(0), "left out by the rules, not a failure");
}

/// Issue 38: a CronJob's pod on a Kubernetes without native sidecars is reported with that cause, once, not as
/// its template's `jobs` setting; with `jobs: skip` the setting is the cause.
#[test]
fn a_jobs_pod_left_out_for_the_kubernetes_version_says_so() {
    let cronjob = "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: nightly}\nspec:\n  schedule: '0 0 * * *'\n  \
                   jobTemplate:\n    spec:\n      template:\n        spec:\n          restartPolicy: Never\n          \
                   containers: [{name: job, image: busybox}]\n";
    let old = run(&["inject", "-f", "-", "--kubernetes-version", "1.27"], cronjob);
    assert!(old.status.success());
    let stderr = String::from_utf8(old.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("CronJob default/nightly: not injected (job): "), "{stderr}");
    assert!(stderr.contains("needs Kubernetes 1.29, and this injector is set for 1.27"), "{stderr}");
    assert!(!stderr.contains("`jobs` setting"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let skip = dir.path().join("skip.yaml");
    std::fs::write(&skip, "jobs: skip\npod:\n  spec:\n    containers: [{name: side, image: x}]\n").unwrap();
    let skipped = run(&["inject", "-f", "-", "--template", skip.to_str().unwrap()], cronjob);
    assert!(String::from_utf8(skipped.stderr).unwrap().contains("(its `jobs` setting)"));
}

/// `inject` then `uninject` with the same templates: every workload kind comes back exactly as it was written.
#[test]
fn uninject_gives_back_every_workload_kind_as_it_was_before_inject() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("workloads.yaml");
    std::fs::write(&manifests, MANIFESTS).unwrap();
    let before = documents(MANIFESTS.as_bytes());
    for template in ["default", "native-sidecar", "restricted", "demo", "wait-for-sidecar"] {
        let file = format!("templates/{template}.yaml");
        let injected = run(&["inject", "-q", "--template", &file, "-f", manifests.to_str().unwrap()], "");
        assert!(injected.status.success(), "{template}");
        assert_ne!(documents(&injected.stdout), before, "{template}: inject changed something");
        let out = run(&["uninject", "--template", &file, "-f", "-"], &injected.stdout);
        assert!(out.status.success(), "{template}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(documents(&out.stdout), before, "{template}: uninject is the inverse of inject");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr, "Deployment default/legacy: not injected (no status annotation): left as it is\n");
    }
    // Manifests that were never injected pass through.
    let untouched = run(&["uninject", "-q", "-f", "-"], MANIFESTS);
    assert!(untouched.status.success());
    assert_eq!(documents(&untouched.stdout), before);
}

/// What the user set beside the injection stays: their own entry in a list the template completes, their own
/// name in the autoscaler's list, their fields of a sidecar they declared, their overrides.
#[test]
fn uninject_keeps_what_the_user_set_beside_the_injection() {
    let pod = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web, sidecar-injector.io/keep: "yes"}
      annotations:
        cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes: "cache, scratch"
        sidecar-injector.io/proxy-cpu: 250m
    spec:
      securityContext: {runAsUser: 1000}
      containers:
      - name: web
        image: nginx
        resources: {limits: {cpu: "2"}}
      - name: proxy
        image: my-proxy:1
        env: [{name: POD_IP, value: 10.0.0.1}]
      volumes:
      - {name: cache, emptyDir: {}}
"#;
    let injected = run(&["inject", "-f", "-"], pod);
    assert!(injected.status.success());
    let text = String::from_utf8(injected.stdout.clone()).unwrap();
    assert!(text.contains("cache, scratch,sidecar-injector-proxy") && text.contains("proxy-init"), "{text}");
    let out = run(&["uninject", "-f", "-"], &injected.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(documents(&out.stdout), documents(pod.as_bytes()));
}

#[test]
fn uninject_refuses_a_pod_injected_by_a_template_version_it_does_not_have() {
    let injected = run(&["inject", "-q", "-f", "-"], MANIFESTS);
    assert!(injected.status.success());
    let dir = tempfile::tempdir().unwrap();
    let edited =
        std::fs::read_to_string("templates/default.yaml").unwrap().replace("logLevel: info", "logLevel: debug");
    let file = dir.path().join("default.yaml");
    std::fs::write(&file, edited).unwrap();
    let out = run(&["uninject", "--template", file.to_str().unwrap(), "-f", "-"], &injected.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "nothing is printed unless every document could be uninjected");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("Pod shop/solo: cannot uninject: injected-by-other-version")
            && stderr.contains("another template version"),
        "{stderr}"
    );
}
