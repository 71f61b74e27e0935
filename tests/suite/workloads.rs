//! Injection that knows the workload (issue 23): the pods of Jobs, and kubectl's default container.

use crate::common;

use common::*;
use serde_json::{Value, json};
use sidecar_injector_core::offline::{inject_document, read_documents};
use sidecar_injector_core::pod_security::Level;
use sidecar_injector_core::validation::KubeVersion;
use sidecar_injector_core::{Engine, Settings, SkipReason, TemplateSet, Verdict};

/// A pod as the Job controller creates it: owned by its Job.
fn job_pod(owner_api_version: &str) -> Value {
    json!({
        "metadata": {
            "generateName": "backup-28391-",
            "labels": {"job-name": "backup-28391"},
            "ownerReferences": [{"apiVersion": owner_api_version, "kind": "Job", "name": "backup-28391",
                                 "uid": "5c1f0b7e-1", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {"restartPolicy": "Never", "containers": [{"name": "backup", "image": "backup:1"}]}
    })
}

/// The same pod as a ReplicaSet creates it (whose pods always restart).
fn deployment_pod() -> Value {
    let mut pod = job_pod("apps/v1");
    pod["metadata"]["ownerReferences"][0]["kind"] = json!("ReplicaSet");
    pod["spec"]["restartPolicy"] = json!("Always");
    pod
}

fn engine_at(source: Option<&str>, minor: u32) -> Engine {
    let settings = Settings { kubernetes_version: KubeVersion::new(minor), ..Settings::default() };
    let set = match source {
        Some(source) => TemplateSet::from_source("test", "test.yaml", source, &settings),
        None => TemplateSet::builtin(&settings),
    };
    Engine::new(set.unwrap(), &settings)
}

/// The built-in template with a top-level setting added.
fn builtin_with(setting: &str) -> String {
    format!("{setting}\n{}", sidecar_injector_core::template::BUILTIN_SOURCE)
}

fn restart_policy<'a>(pod: &'a Value, list: &str, name: &str) -> Option<&'a str> {
    let containers = pod["spec"][list].as_array()?;
    containers.iter().find(|c| c["name"] == name)?["restartPolicy"].as_str()
}

#[test]
fn a_jobs_pod_gets_the_sidecar_as_a_native_sidecar_after_the_templates_init_containers() {
    let engine = engine_at(None, 29);
    let pod = job_pod("batch/v1");
    let injected = apply(&pod, &patch_for(&engine, &pod).expect("a Job's pod is injected"));
    assert_eq!(names(&injected, "containers"), ["backup"], "no container that would keep the Job running");
    assert_eq!(names(&injected, "initContainers"), ["proxy-init", "proxy"]);
    assert_eq!(restart_policy(&injected, "initContainers", "proxy"), Some("Always"));
    assert_eq!(restart_policy(&injected, "initContainers", "proxy-init"), None, "a plain init container still");
    let status: Value =
        serde_json::from_str(injected["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap())
            .unwrap();
    assert_eq!(status["containers"], json!([]));
    assert_eq!(status["initContainers"], json!(["proxy-init", "proxy"]));
    assert_eq!(patch_for(&engine, &injected), None, "second pass: no patch");
    check_properties(&engine, &pod);
}

#[test]
fn a_deployments_pod_and_another_groups_job_that_restarts_keep_the_sidecar_as_a_container() {
    let engine = engine_at(None, 29);
    let mut volcano = job_pod("batch.volcano.sh/v1alpha1");
    volcano["spec"]["restartPolicy"] = json!("Always");
    for pod in [deployment_pod(), volcano] {
        let injected = apply(&pod, &patch_for(&engine, &pod).unwrap());
        assert_eq!(names(&injected, "containers"), ["backup", "proxy"]);
        assert_eq!(names(&injected, "initContainers"), ["proxy-init"]);
        assert_eq!(patch_for(&engine, &injected), None);
    }
}

/// A pod that runs to completion, owned by `owner` (`apiVersion`, `kind`) or by nothing.
fn run_once_pod(owner: Option<(&str, &str)>, restart_policy: Option<&str>) -> Value {
    let mut pod = job_pod("batch/v1");
    match owner {
        Some((api_version, kind)) => {
            pod["metadata"]["ownerReferences"][0]["apiVersion"] = json!(api_version);
            pod["metadata"]["ownerReferences"][0]["kind"] = json!(kind);
        }
        None => drop(pod["metadata"].as_object_mut().unwrap().remove("ownerReferences")),
    }
    match restart_policy {
        Some(policy) => pod["spec"]["restartPolicy"] = json!(policy),
        None => drop(pod["spec"].as_object_mut().unwrap().remove("restartPolicy")),
    }
    pod
}

const OWNERS: &[Option<(&str, &str)>] = &[
    None,
    Some(("batch/v1", "Job")),
    Some(("argoproj.io/v1alpha1", "Workflow")),
    Some(("tekton.dev/v1", "TaskRun")),
    Some(("apps/v1", "ReplicaSet")),
    Some(("batch.volcano.sh/v1alpha1", "Job")),
];

proptest::proptest! {
    /// Issue 35: a pod that runs to completion (restartPolicy Never or OnFailure) gets the Job treatment
    /// whoever owns it (an Argo Workflow's step, a Tekton TaskRun's, a bare pod), and so does a batch Job's pod;
    /// a pod that restarts (Always, or no policy: the API server's default) keeps a regular sidecar. The same
    /// through the webhook and through `inject` of the pod's manifest, at 1.29 (native sidecar) and 1.28 (skipped).
    #[test]
    fn a_pod_that_runs_to_completion_gets_the_job_treatment_whoever_owns_it(
        owner in proptest::sample::select(OWNERS),
        policy in proptest::sample::select(&[None, Some("Always"), Some("Never"), Some("OnFailure")][..]),
        minor in 28u32..=29,
    ) {
        let engine = engine_at(None, minor);
        let pod = run_once_pod(owner, policy);
        let completes = matches!(policy, Some("Never" | "OnFailure")) || owner == Some(("batch/v1", "Job"));
        let (outcome, _, patch) = answer(&engine, &review(&pod));
        match (completes, minor) {
            (true, 28) => proptest::prop_assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::Job)),
            (true, _) => {
                let injected = apply(&pod, patch.as_ref().expect("injected"));
                proptest::prop_assert_eq!(names(&injected, "containers"), ["backup"]);
                proptest::prop_assert_eq!(restart_policy(&injected, "initContainers", "proxy"), Some("Always"));
            }
            (false, _) => {
                let injected = apply(&pod, patch.as_ref().expect("injected"));
                proptest::prop_assert_eq!(names(&injected, "containers"), ["backup", "proxy"]);
            }
        }
        // `inject` of the same pod as a manifest decides the same way.
        let mut manifest = pod.clone();
        manifest["apiVersion"] = json!("v1");
        manifest["kind"] = json!("Pod");
        manifest["metadata"]["name"] = json!("backup-1");
        let reports = inject_document(&engine, &mut manifest, "default").unwrap();
        let skipped_as_job = reports[0].verdict == Verdict::Skipped(SkipReason::Job);
        proptest::prop_assert_eq!(skipped_as_job, completes && minor == 28);
        if !skipped_as_job {
            let sidecar_is_a_container = names(&manifest, "containers").contains(&"proxy");
            proptest::prop_assert_eq!(sidecar_is_a_container, !completes);
        }
    }
}

#[test]
fn below_kubernetes_1_29_a_jobs_pod_is_skipped_with_a_warning_saying_why() {
    let engine = engine_at(None, 28);
    let (outcome, response, patch) = answer(&engine, &review(&job_pod("batch/v1")));
    assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::Job));
    assert_eq!(patch, None);
    let warning = response["response"]["warnings"][0].as_str().expect("a warning");
    assert!(warning.contains("native sidecar") && warning.contains("1.29") && warning.contains("1.28"), "{warning}");
    // Other pods are injected as before.
    assert!(patch_for(&engine, &deployment_pod()).is_some());
}

#[test]
fn the_jobs_setting_skips_or_injects_as_written() {
    let skip = engine_at(Some(&builtin_with("jobs: skip")), 29);
    let (outcome, response, patch) = answer(&skip, &review(&job_pod("batch/v1")));
    assert_eq!((outcome.verdict, patch), (Verdict::Skipped(SkipReason::Job), None));
    assert!(response["response"]["warnings"].is_null(), "a chosen skip is not a warning: {response}");

    let inject = engine_at(Some(&builtin_with("jobs: inject")), 29);
    let pod = job_pod("batch/v1");
    let injected = apply(&pod, &patch_for(&inject, &pod).unwrap());
    assert_eq!(names(&injected, "containers"), ["backup", "proxy"]);
    assert_eq!(restart_policy(&injected, "containers", "proxy"), None);
}

#[test]
fn a_template_with_only_init_containers_is_the_same_for_jobs() {
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/templates/native-sidecar.yaml")).unwrap();
    let engine = engine_at(Some(&source), 29);
    let pod = job_pod("batch/v1");
    let mut for_job = apply(&pod, &patch_for(&engine, &pod).unwrap());
    let mut for_deployment = apply(&deployment_pod(), &patch_for(&engine, &deployment_pod()).unwrap());
    // The pods' own restart policies differ (Never, Always); what the template adds does not.
    for injected in [&mut for_job, &mut for_deployment] {
        injected["spec"].as_object_mut().unwrap().remove("restartPolicy");
    }
    assert_eq!(for_job["spec"], for_deployment["spec"]);
}

#[test]
fn a_bad_jobs_setting_is_refused_at_its_line() {
    let settings = Settings::default();
    let error = TemplateSet::from_source("t", "t.yaml", &builtin_with("jobs: sometimes"), &settings).unwrap_err();
    let message = error.to_string();
    assert!(message.starts_with("t.yaml:1:") && message.contains("`native-sidecar`, `skip` or `inject`"), "{message}");
}

#[test]
fn inject_gives_job_and_cronjob_manifests_native_sidecars_and_adds_no_owner() {
    let engine = engine_at(None, 29);
    let manifests = r#"
apiVersion: batch/v1
kind: Job
metadata: { name: migrate, namespace: shop }
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{ name: migrate, image: "migrate:1" }]
---
apiVersion: batch/v1
kind: CronJob
metadata: { name: backup, namespace: shop }
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers: [{ name: backup, image: "backup:1" }]
---
apiVersion: apps/v1
kind: Deployment
metadata: { name: web, namespace: shop }
spec:
  selector: { matchLabels: { app: web } }
  template:
    metadata: { labels: { app: web } }
    spec:
      containers: [{ name: web, image: "nginx:1" }]
"#;
    let mut documents = read_documents(manifests).unwrap();
    for document in &mut documents {
        inject_document(&engine, document, "default").unwrap();
    }
    let pods = [
        &documents[0]["spec"]["template"],
        &documents[1]["spec"]["jobTemplate"]["spec"]["template"],
        &documents[2]["spec"]["template"],
    ];
    for pod in &pods[..2] {
        assert_eq!(names(pod, "initContainers"), ["proxy-init", "proxy"], "{pod}");
        assert_eq!(restart_policy(pod, "initContainers", "proxy"), Some("Always"));
        assert!(pod["metadata"].get("ownerReferences").is_none(), "the owner was only for the review: {pod}");
    }
    assert_eq!(names(pods[2], "containers"), ["web", "proxy"]);
    let once = documents.clone();
    for document in &mut documents {
        inject_document(&engine, document, "default").unwrap();
    }
    assert_eq!(documents, once, "injecting the output again changes nothing");
}

/// The annotation kubectl reads for the container to use without `-c`.
const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";

fn default_container(pod: &Value) -> Option<&str> {
    pod["metadata"]["annotations"][DEFAULT_CONTAINER].as_str()
}

#[test]
fn kubectl_lands_on_the_pods_first_own_container_never_on_the_sidecar() {
    let engine = engine_at(None, 29);
    let mut pod = deployment_pod();
    pod["spec"]["containers"] = json!([{"name": "web", "image": "web:1"}, {"name": "worker", "image": "worker:1"}]);
    let injected = apply(&pod, &patch_for(&engine, &pod).unwrap());
    assert_eq!(default_container(&injected), Some("web"));
    assert_eq!(patch_for(&engine, &injected), None, "second pass: no patch");
    check_properties(&engine, &pod);

    // A pod that declares the sidecar itself, first: the annotation still names the app.
    pod["spec"]["containers"] = json!([{"name": "proxy", "image": "own-proxy:1"}, {"name": "web", "image": "web:1"}]);
    let injected = apply(&pod, &patch_for(&engine, &pod).unwrap());
    assert_eq!(default_container(&injected), Some("web"));
    assert_eq!(patch_for(&engine, &injected), None);
}

#[test]
fn a_default_container_the_pod_or_the_template_sets_is_kept() {
    let engine = engine_at(None, 29);
    let mut pod = deployment_pod();
    pod["spec"]["containers"] = json!([{"name": "web", "image": "web:1"}, {"name": "worker", "image": "worker:1"}]);
    pod["metadata"]["annotations"] = json!({DEFAULT_CONTAINER: "worker"});
    let injected = apply(&pod, &patch_for(&engine, &pod).unwrap());
    assert_eq!(default_container(&injected), Some("worker"), "the pod's own choice is kept");

    // A template that writes the annotation itself keeps its own value, from the render context.
    let template = "pod:\n  metadata:\n    annotations:\n      kubectl.kubernetes.io/default-container: \"{{ pod.containers[-1].name }}\"\n  spec:\n    containers:\n      - {name: agent, image: agent:1}\n";
    let engine = engine_at(Some(template), 29);
    pod["metadata"]["annotations"] = json!({});
    let injected = apply(&pod, &patch_for(&engine, &pod).unwrap());
    assert_eq!(default_container(&injected), Some("worker"));
    assert_eq!(patch_for(&engine, &injected), None);
}

#[test]
fn a_jobs_native_sidecar_needs_no_default_container() {
    let engine = engine_at(None, 29);
    let pod = job_pod("batch/v1");
    let injected = apply(&pod, &patch_for(&engine, &pod).unwrap());
    assert_eq!(default_container(&injected), None, "the only container is the Job's own");
}

/// The Pod Security level of `template`'s injected pods, and the fields that keep them from `next`.
fn pod_security(source: &str, next: Level) -> (Level, Vec<String>) {
    let set = TemplateSet::from_source("t", "t.yaml", source, &Settings::default()).unwrap();
    let report = sidecar_injector_core::template_set::pod_security(set.default_template()).unwrap();
    let fields = report.breaking(next).flat_map(|v| v.fields.iter().map(|f| format!("{}: {f}", v.check))).collect();
    (report.level(), fields)
}

fn shipped(name: &str) -> String {
    std::fs::read_to_string(format!("{}/templates/{name}.yaml", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn the_shipped_templates_meet_the_pod_security_levels_they_document() {
    let (level, fields) = pod_security(&shipped("default"), Level::Baseline);
    assert_eq!(level, Level::Privileged, "proxy-init adds NET_ADMIN and NET_RAW");
    assert_eq!(fields, ["capabilities_baseline: spec.initContainers[proxy-init].securityContext.capabilities.add"]);
    assert!(shipped("default").contains("meet only the `privileged` level"), "the template says so");
    for name in ["restricted", "native-sidecar"] {
        assert_eq!(pod_security(&shipped(name), Level::Restricted), (Level::Restricted, Vec::new()), "{name}");
    }
}

#[test]
fn the_pod_security_check_names_the_fields_that_break_the_next_level() {
    let base = "pod:\n  spec:\n    containers:\n      - name: agent\n        image: agent:1\n";
    // No security context at all: baseline, and every restricted rule the container breaks is named.
    let (level, fields) = pod_security(base, Level::Restricted);
    assert_eq!(level, Level::Baseline);
    for check in ["allowPrivilegeEscalation", "capabilities_restricted", "runAsNonRoot", "seccompProfile_restricted"] {
        assert!(fields.iter().any(|f| f.starts_with(check) && f.contains("containers[agent]")), "{check}: {fields:?}");
    }
    // A hostPath volume and a privileged container: below baseline, each named.
    let host = format!(
        "{base}        securityContext: {{ privileged: true }}\n    volumes:\n      - {{ name: logs, hostPath: {{ path: /var/log }} }}\n"
    );
    let (level, fields) = pod_security(&host, Level::Baseline);
    assert_eq!(level, Level::Privileged);
    assert_eq!(
        fields,
        [
            "hostPathVolumes: spec.volumes[logs].hostPath",
            "privileged: spec.containers[agent].securityContext.privileged"
        ]
    );
}

#[test]
fn the_restricted_template_injects_a_native_sidecar_into_every_pod() {
    let engine = engine_at(Some(&shipped("restricted")), 29);
    let pod = deployment_pod();
    let injected = apply(&pod, &patch_for(&engine, &pod).unwrap());
    assert_eq!(names(&injected, "containers"), ["backup"]);
    assert_eq!(names(&injected, "initContainers"), ["proxy"]);
    assert_eq!(restart_policy(&injected, "initContainers", "proxy"), Some("Always"));
    assert_eq!(default_container(&injected), None, "the pod's only container is its own");
    assert_eq!(patch_for(&engine, &injected), None);
    check_properties(&engine, &pod);
    // Below 1.29 the template is refused at load, not half-applied.
    let old = Settings { kubernetes_version: KubeVersion::new(28), ..Settings::default() };
    assert!(TemplateSet::from_source("r", "restricted.yaml", &shipped("restricted"), &old).is_err());
}

/// A Deployment's pod that sets pod-level resources (Kubernetes 1.34), its container requesting `app_cpu`.
fn pod_with_pod_resources(app_cpu: &str, resources: Value) -> Value {
    let mut pod = deployment_pod();
    pod["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": app_cpu}});
    pod["spec"]["resources"] = resources;
    pod
}

#[test]
fn a_pod_whose_pod_level_resources_cannot_hold_the_sidecar_is_admitted_without_it_and_warned() {
    let engine = engine_at(None, 34);
    // Room for the proxy's 50m beside the app's 50m (proxy-init's 10m runs before them): injected.
    let roomy = pod_with_pod_resources("50m", json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "2"}}));
    let injected = apply(&roomy, &patch_for(&engine, &roomy).expect("it fits"));
    assert_eq!(names(&injected, "containers"), ["backup", "proxy"]);
    assert!(sidecar_injector_core::validation::validate_pod(&injected, KubeVersion::new(34)).is_empty());

    // 80m cannot hold 50m + 50m: the API server would refuse the injected pod, so it is not injected.
    let crowded = pod_with_pod_resources("50m", json!({"requests": {"cpu": "80m"}}));
    let (outcome, response, patch) = answer(&engine, &review(&crowded));
    assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::PodResources));
    assert!(patch.is_none() && response["response"]["allowed"] == true);
    // The validating companion admits the pod the mutating path left as it was, for the same reason.
    assert_eq!(validation(&engine, &crowded), Verdict::Skipped(SkipReason::PodResources));
    check_properties(&engine, &crowded);
    let warning = outcome.warnings.join("\n");
    assert!(warning.contains("spec.resources.requests[cpu]") && warning.contains("100m"), "{warning}");

    // A pod-level CPU limit below the proxy's limit (1000m) is refused by the API server too.
    let tight = pod_with_pod_resources("50m", json!({"limits": {"cpu": "500m"}}));
    let (outcome, _, _) = answer(&engine, &review(&tight));
    assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::PodResources));
    assert!(outcome.warnings.join("\n").contains("containers[1].resources.limits[cpu]"), "{:?}", outcome.warnings);
    // ...unless the pod lowers the proxy's limit by annotation.
    let mut lowered = tight.clone();
    lowered["metadata"]["annotations"] = json!({"sidecar-injector.io/proxy-cpu-limit": "400m"});
    assert!(patch_for(&engine, &lowered).is_some());

    // With `onError: deny` the pod is refused instead, naming the field.
    let deny = engine_at(Some(&builtin_with("onError: deny")), 34);
    let (outcome, response, _) = answer(&deny, &review(&tight));
    assert_eq!(outcome.verdict, Verdict::Denied(SkipReason::PodResources));
    assert!(response["response"]["status"]["message"].as_str().unwrap().contains("pod-level resources"));
}

#[test]
fn pod_level_resources_are_judged_only_where_the_api_server_judges_them() {
    // Before 1.34 (the feature's beta) the API server does not hold containers to them.
    let tight = pod_with_pod_resources("50m", json!({"requests": {"cpu": "80m"}}));
    assert!(patch_for(&engine_at(None, 33), &tight).is_some());
    // A pod that breaks them on its own is the user's problem: the sidecar is not blamed, and not withheld.
    let broken = pod_with_pod_resources("200m", json!({"requests": {"cpu": "100m"}}));
    let (outcome, _, patch) = answer(&engine_at(None, 34), &review(&broken));
    assert!(patch.is_some(), "{outcome:?}");
}
