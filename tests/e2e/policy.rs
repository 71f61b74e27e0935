//! Issue 53: a template compiled into a MutatingAdmissionPolicy injects a pod as our webhook does, on the real API
//! server. Two namespaces: in one our webhook acts (the shipped mutating configuration, its namespace selector
//! narrowed to that namespace), in the other the policies `sidecar-injector policy` compiles from the shipped
//! templates (theirs narrowed to the other). Every pod of the corpus and a generated set (the admission chain's
//! changes: host namespaces, ports, mounts, volumes, containers of the pod's own, legacy annotations, ...) is
//! created with a server-side dry run in both, naming each template that compiles: the API server's two answers
//! are the same, the stored pods equal field for field but for what it gives every pod (uid, creation time,
//! namespace, managed fields). And the policy's pod, created again under the policy, comes back unchanged.

use std::path::Path;

use proptest::prelude::*;
use serde_json::{Value, json};
use sidecar_injector_core::TemplateSet;
use sidecar_injector_core::policy::{compile, policy_name};
use sidecar_injector_core::settings::Settings;

use super::admission_chain::{change, pod as generated_pod};
use super::{Cluster, Injector, MUTATING, configuration, register};

/// Where our webhook injects.
const BY_WEBHOOK: &str = "e2e-policy-webhook";
/// Where the policies inject.
const BY_POLICY: &str = "e2e-policy-policy";
const POLICIES: &str = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies";
const BINDINGS: &str = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings";
/// Generated cases per template.
const CASES: u32 = 40;
/// Generated cases per template of the policy's own shapes ([`Shape`]).
const SHAPED_CASES: u32 = 60;

/// What a pod may already hold where a policy's guards look, beyond the admission chain's changes: lists of the
/// pod's own beside and inside the sidecar's, the keys a template writes, the skip rules' inputs. (Ephemeral
/// containers are not among them: the API server refuses them on create, the only operation we inject on.)
#[derive(Debug, Clone)]
enum Shape {
    /// An init container of the pod's own, before the sidecar's; a native sidecar (`restartPolicy: Always`) if set.
    InitContainer(&'static str, bool),
    /// A container of the pod's own named as a template's sidecar, with its own env, mount and arguments.
    SameNamedSidecar(&'static str),
    /// A second app container, with its own requests and a mount of its own at a template's path.
    SecondApp,
    /// The app's own requests (a container default's field).
    AppRequests,
    /// The app's env var of the name a template's sidecar sets.
    AppEnv,
    /// An annotation or label a template writes, already there with another value.
    OwnKey,
    /// Opted out: the label or the annotation, in some case.
    OptOut(&'static str),
    /// A Windows pod, by `os` or by node selector.
    Windows(bool),
    /// Another version's status annotation.
    OtherStatus,
    /// Named by `generateName`, with a service account.
    Generated,
    /// Owned by a Job.
    JobOwned,
    /// `restartPolicy: Never` (a pod that runs to completion, whatever owns it).
    NeverRestarts,
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        (prop::sample::select(&["agent", "demo-sidecar", "leaves", "setup"][..]), any::<bool>())
            .prop_map(|(n, native)| Shape::InitContainer(n, native)),
        prop::sample::select(&["agent", "demo-sidecar", "leaves"][..]).prop_map(Shape::SameNamedSidecar),
        Just(Shape::SecondApp),
        Just(Shape::AppRequests),
        Just(Shape::AppEnv),
        Just(Shape::OwnKey),
        prop::sample::select(&["disabled", "Disabled", "false"][..]).prop_map(Shape::OptOut),
        any::<bool>().prop_map(Shape::Windows),
        Just(Shape::OtherStatus),
        Just(Shape::Generated),
        Just(Shape::JobOwned),
        Just(Shape::NeverRestarts),
    ]
}

/// The generated base pod for `template` with `shapes` applied in order.
fn shaped_pod(template: &str, shapes: &[Shape]) -> Value {
    let mut pod = generated_pod("shaped", template, &[]);
    for shape in shapes {
        let spec = &mut pod["spec"];
        match shape {
            Shape::InitContainer(name, native) => {
                let mut container = json!({"name": name, "image": "own:1", "args": ["--own"]});
                if *native {
                    container["restartPolicy"] = json!("Always");
                }
                push(spec, "initContainers", container);
            }
            Shape::SameNamedSidecar(name) => {
                push(spec, "volumes", json!({"name": "own-sidecar", "emptyDir": {}}));
                let container = json!({
                    "name": name, "image": "own:1", "args": ["--own"],
                    "env": [{"name": "POD_NAME", "value": "own"}, {"name": "OWN", "value": "1"}],
                    "volumeMounts": [{"name": "own-sidecar", "mountPath": "/var/run/own"}],
                    "resources": {"requests": {"cpu": "5m"}},
                });
                let list = if *name == "agent" { "initContainers" } else { "containers" };
                push(spec, list, container);
            }
            Shape::SecondApp => {
                push(spec, "volumes", json!({"name": "own-second", "emptyDir": {}}));
                push(
                    spec,
                    "containers",
                    json!({"name": "second", "image": "own:1", "resources": {"requests": {"memory": "64Mi"}},
                        "volumeMounts": [{"name": "own-second", "mountPath": "/var/run/agent"}]}),
                );
            }
            Shape::AppRequests => spec["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}}),
            Shape::AppEnv => push(&mut spec["containers"][0], "env", json!({"name": "POD_NAME", "value": "mine"})),
            Shape::OwnKey => {
                pod["metadata"]["annotations"]["sidecar-injector.io/agent-config"] = json!("/own.yaml");
                pod["metadata"]["annotations"]["example.com/x"] = json!("own");
                pod["metadata"]["labels"]["tier"] = json!("front");
            }
            Shape::OptOut(value) => match value.len() % 2 {
                0 => pod["metadata"]["labels"]["sidecar-injector.io/inject"] = json!(value),
                _ => pod["metadata"]["annotations"]["sidecar-injector.io/inject"] = json!(value),
            },
            Shape::Windows(by_os) => match by_os {
                true => spec["os"] = json!({"name": "windows"}),
                false => spec["nodeSelector"] = json!({"kubernetes.io/os": "windows"}),
            },
            Shape::OtherStatus => {
                pod["metadata"]["annotations"]["sidecar-injector.io/status"] =
                    json!(r#"{"version":"0.0.1","templates":["demo"]}"#)
            }
            Shape::Generated => {
                let metadata = pod["metadata"].as_object_mut().unwrap();
                metadata.remove("name");
                metadata.insert("generateName".into(), json!("shaped-"));
                pod["spec"]["serviceAccountName"] = json!("default");
            }
            Shape::JobOwned => {
                pod["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "batch/v1", "kind": "Job", "name": "nightly", "controller": true,
                    "uid": "6c5b9b1e-0a3c-4c39-9d1e-2b1b7b0c7a11",
                }]);
                pod["spec"]["restartPolicy"] = json!("Never");
            }
            Shape::NeverRestarts => pod["spec"]["restartPolicy"] = json!("Never"),
        }
    }
    pod
}

fn push(object: &mut Value, list: &str, item: Value) {
    match object.get_mut(list).and_then(Value::as_array_mut) {
        Some(items) => items.push(item),
        None => object[list] = json!([item]),
    }
}

/// A template whose per-pod values read the pod every way a policy translates (`or` chains of labels with
/// defaults, names, the namespace, the service account), where no rule of the API server judges them; and a resize
/// policy that restarts the sidecar, which a pod that never restarts does not allow.
const LEAVES: &str = r#"
pod:
  spec:
    containers:
      - name: leaves
        image: busybox:1.36
        args:
          - "--service={{ pod.labels['app.kubernetes.io/name'] | default(none) or pod.labels.app | default(none) or pod.generateName or pod.name }}"
          - "--namespace={{ pod.namespace }}"
          - "--account={{ pod.serviceAccountName }}"
          - "--tier={{ pod.labels.tier | default('none') }}~{{ pod.annotations['example.com/x'] | default('') }}"
        env:
          - name: POD
            value: "{{ pod.name }}"
        resizePolicy:
          - { resourceName: cpu, restartPolicy: NotRequired }
          - { resourceName: memory, restartPolicy: RestartContainer }
"#;

async fn dry_run(cluster: &Cluster, namespace: &str, pod: &Value) -> (u16, Value) {
    let mut pod = pod.clone();
    pod["metadata"]["namespace"] = json!(namespace);
    cluster.create(&format!("/api/v1/namespaces/{namespace}/pods?dryRun=All"), pod).await
}

/// What the API server gives every pod it stores (a generated name too), and the namespace (which templates may
/// render): left out of the comparison, the namespace's name written as `NAMESPACE` wherever it is.
fn comparable(mut pod: Value) -> Value {
    if let Some(metadata) = pod["metadata"].as_object_mut() {
        for field in ["uid", "creationTimestamp", "namespace", "managedFields", "resourceVersion", "generation"] {
            metadata.remove(field);
        }
        // A name the API server generates (after admission: no template saw it) differs between two creations.
        if metadata.contains_key("generateName") {
            metadata.remove("name");
        }
    }
    let text = pod.to_string().replace(BY_WEBHOOK, "NAMESPACE").replace(BY_POLICY, "NAMESPACE");
    serde_json::from_str(&text).unwrap()
}

/// The first place where `a` and `b` differ, as a path, with both values there.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                first_difference(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &format!("{at}/{k}"),
                )
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (p, q))| first_difference(p, q, &format!("{at}/{i}")))
        }
        _ if a == b => None,
        _ => Some(format!("{at}: the webhook {a}, the policy {b}")),
    }
}

/// The two answers for `pod`: equal (whether injected), or the difference with the pod and both results.
async fn compare(cluster: &Cluster, pod: &Value) -> Result<bool, String> {
    let (webhook_status, by_webhook) = dry_run(cluster, BY_WEBHOOK, pod).await;
    let (policy_status, by_policy) = dry_run(cluster, BY_POLICY, pod).await;
    if webhook_status != policy_status {
        return Err(format!(
            "the webhook: {webhook_status}, the policy: {policy_status}\npod: {pod}\nby the webhook: {by_webhook}\n\
             by the policy: {by_policy}"
        ));
    }
    if webhook_status != 201 {
        return Ok(false); // refused by the API server either way (its own rules, not ours)
    }
    let injected = by_webhook["metadata"]["annotations"].get("sidecar-injector.io/status").is_some();
    let (by_webhook, by_policy) = (comparable(by_webhook), comparable(by_policy));
    if let Some(difference) = first_difference(&by_webhook, &by_policy, "") {
        return Err(format!("{difference}\npod: {pod}\nby the webhook: {by_webhook}\nby the policy: {by_policy}"));
    }
    // Idempotence: the policy's pod again under the policy.
    let mut again = by_policy.clone();
    again["metadata"].as_object_mut().unwrap().remove("name");
    again["metadata"]["name"] = pod["metadata"]["name"].clone();
    let (status, twice) = dry_run(cluster, BY_POLICY, &again).await;
    if status != 201 || comparable(twice.clone()) != by_policy {
        return Err(format!("not idempotent: {status}\nonce: {by_policy}\ntwice: {twice}"));
    }
    Ok(injected)
}

/// The corpus's pods as a user would create them: no server-set fields, no status, a name of their own.
fn corpus_pods() -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/pods");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "json"))
        .filter_map(|f| serde_json::from_slice::<Value>(&std::fs::read(f).unwrap()).ok())
        .filter(|pod| pod["kind"] == "Pod")
        .enumerate()
        .map(|(i, mut pod)| {
            pod.as_object_mut().unwrap().remove("status");
            let metadata = pod["metadata"].as_object_mut().unwrap();
            metadata.retain(|k, _| ["labels", "annotations", "ownerReferences"].contains(&k.as_str()));
            metadata.insert("name".into(), json!(format!("corpus-{i}")));
            pod
        })
        .collect()
}

/// Names `template` in `pod`'s annotations.
fn naming(mut pod: Value, template: &str) -> Value {
    if !pod["metadata"]["annotations"].is_object() {
        pod["metadata"]["annotations"] = json!({});
    }
    pod["metadata"]["annotations"]["sidecar-injector.io/template"] = json!(template);
    pod
}

pub(super) async fn policies_inject_as_the_webhook_does(cluster: &Cluster) {
    assert!(
        cluster.version.at_least(36),
        "MutatingAdmissionPolicy is GA in 1.36; this API server is {} (.ci/run skips this test at the oldest release)",
        cluster.version
    );
    // The shipped templates, and one whose per-pod values use every translated form of a leaf.
    let work = tempfile::tempdir().unwrap();
    let templates = work.path().join("templates");
    std::fs::create_dir(&templates).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    for entry in std::fs::read_dir(&shipped).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, templates.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(templates.join("leaves.yaml"), LEAVES).unwrap();
    let settings = Settings { kubernetes_version: cluster.version, ..Settings::default() };
    let set = TemplateSet::load_dir(&templates, "default", &settings).unwrap();
    let mut selection = sidecar_injector::cli::policy::shipped_selection();
    selection.namespace_selector = json!({"matchLabels": {"kubernetes.io/metadata.name": BY_POLICY}});
    let mut compiled = Vec::new();
    for template in set.templates() {
        if let Ok([policy, binding]) = compile(template, set.default_template().name(), &selection) {
            cluster.delete(&format!("{POLICIES}/{}", policy_name(template.name()))).await;
            cluster.delete(&format!("{BINDINGS}/{}", policy_name(template.name()))).await;
            cluster.must_create(POLICIES, policy).await;
            cluster.must_create(BINDINGS, binding).await;
            compiled.push(template.name().to_owned());
        }
    }
    assert!(compiled.len() >= 3, "the templates that compile: {compiled:?}");

    let version = format!("--kubernetes-version={}", cluster.version);
    let (_injector, ca) = Injector::start(work.path(), &templates, &[&version]);
    let url = format!("https://{}", _injector.addr);
    for name in [BY_WEBHOOK, BY_POLICY] {
        let labels = json!({"kubernetes.io/metadata.name": name, "sidecar-injector.io/inject": "enabled"});
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
        cluster.must_create("/api/v1/namespaces", namespace).await;
    }
    let mut mutating = configuration("mutatingwebhookconfiguration.yaml", &url, &ca);
    mutating["metadata"]["name"] = json!("e2e-policy-webhook");
    mutating["webhooks"][0]["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": BY_WEBHOOK}});
    register(cluster, MUTATING, &mutating).await;
    for template in &compiled {
        for namespace in [BY_WEBHOOK, BY_POLICY] {
            super::eventually(&format!("{template} injected in {namespace}"), async || {
                let probe = naming(generated_pod("probe", template, &[]), template);
                let (status, body) = dry_run(cluster, namespace, &probe).await;
                (status == 201 && body["metadata"]["annotations"].get("sidecar-injector.io/status").is_some())
                    .then_some(())
            })
            .await;
        }
    }

    // Four at a time: the API server, not the test, is what a comparison waits for.
    let corpus = corpus_pods();
    let cases: Vec<(&String, &Value)> = compiled.iter().flat_map(|t| corpus.iter().map(move |p| (t, p))).collect();
    let handle = tokio::runtime::Handle::current();
    let differences = std::sync::Mutex::new(Vec::new());
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            for share in cases.chunks(cases.len().div_ceil(4)) {
                let (handle, differences) = (&handle, &differences);
                scope.spawn(move || {
                    for (template, pod) in share {
                        if let Err(difference) = handle.block_on(compare(cluster, &naming((*pod).clone(), template))) {
                            let name = &pod["metadata"]["name"];
                            differences
                                .lock()
                                .unwrap()
                                .push(format!("template {template}, corpus pod {name}: {difference}"));
                        }
                    }
                });
            }
        })
    });
    let differences = differences.into_inner().unwrap();
    let firsts: Vec<&str> = differences.iter().filter_map(|d| d.lines().next()).collect();
    assert!(
        differences.is_empty(),
        "{} differences, at:\n{}\n\nthe first in full:\n{}",
        differences.len(),
        firsts.join("\n"),
        differences.first().map_or("", String::as_str)
    );

    let mut runner = super::case_runner(CASES * compiled.len() as u32);
    let strategy = (prop::sample::select(compiled.clone()), prop::collection::vec(change(), 0..4));
    let generated = std::cell::RefCell::new(Vec::new());
    let result = tokio::task::block_in_place(|| {
        runner.run(&strategy, |(template, changes)| {
            let pod = generated_pod("generated", &template, &changes);
            if let Err(difference) = handle.block_on(compare(cluster, &pod)) {
                generated
                    .borrow_mut()
                    .push(format!("{template} {changes:?}: {}", difference.lines().next().unwrap_or("")));
            }
            Ok(())
        })
    });
    result.unwrap();
    let mut runner = super::case_runner(SHAPED_CASES * compiled.len() as u32);
    let strategy = (prop::sample::select(compiled.clone()), prop::collection::vec(shape(), 1..4));
    let injected = std::cell::Cell::new([0usize; 2]);
    let result = tokio::task::block_in_place(|| {
        runner.run(&strategy, |(template, shapes)| {
            let pod = shaped_pod(&template, &shapes);
            match handle.block_on(compare(cluster, &pod)) {
                Ok(was) => {
                    let mut counts = injected.get();
                    counts[usize::from(was)] += 1;
                    injected.set(counts);
                }
                Err(difference) => generated
                    .borrow_mut()
                    .push(format!("{template} {shapes:?}: {}", difference.lines().next().unwrap_or(""))),
            }
            Ok(())
        })
    });
    result.unwrap();
    // Both sides of the guards are met: pods injected and pods left alone (opted out, Windows, another version).
    let [left_alone, injected] = injected.get();
    assert!(injected >= 40 && left_alone >= 20, "shaped pods: {injected} injected, {left_alone} left alone or refused");
    let generated = generated.into_inner();
    assert!(generated.is_empty(), "{} generated pods injected otherwise:\n{}", generated.len(), generated.join("\n"));
    eprintln!(
        "policies of {compiled:?}: {} corpus pods each, and generated pods, as the webhook; shaped pods: {injected} \
         injected, {left_alone} left alone or refused",
        corpus.len()
    );
}
