//! Issue 55, item 2: Kubernetes Events about admissions, published by the server (`--events`, here through a
//! kubeconfig: the test's API server has no pods of ours to hold a service account) on the real API server. A
//! ReplicaSet's pods (no controller runs here, so the test creates them as its controller would, owned by it):
//! those injected give one `Injected` Event on the ReplicaSet, their repeats counted in its series; a pod naming a
//! template the injector does not have gives a `NotInjected` Warning naming it; a bare pod's Event is on the pod by
//! name; a dry run and an opted-out pod give none. With `--events off`, nothing is published. And, through the same
//! webhook, the warnings of item 6 as kubectl shows them.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Cluster, Injector, MUTATING, configuration, register};

const NAMESPACE: &str = "e2e-events";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/e2e-events/events";

fn pod(name: &str, template: &str, owner: Option<&Value>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"sidecar-injector.io/template": template}},
        "spec": {"containers": [{"name": "app", "image": "shop:1"}]},
    });
    if let Some(owner) = owner {
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": true,
        }]);
    }
    pod
}

/// The Events in the namespace, as `(regarding kind, regarding name, type, reason, note, count)`.
async fn events(cluster: &Cluster) -> Vec<(String, String, String, String, String, i64)> {
    let (status, list) = cluster.call(hyper::Method::GET, EVENTS, None).await;
    assert_eq!(status, 200, "{list}");
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (list["items"].as_array().unwrap().iter())
        .map(|e| {
            let count = e["series"]["count"].as_i64().unwrap_or(1);
            let regarding = &e["regarding"];
            (
                text(&regarding["kind"]),
                text(&regarding["name"]),
                text(&e["type"]),
                text(&e["reason"]),
                text(&e["note"]),
                count,
            )
        })
        .collect()
}

pub(super) async fn events_on_the_pods_controller(cluster: &Cluster) {
    let work = tempfile::tempdir().unwrap();
    let templates = work.path().join("templates");
    std::fs::create_dir(&templates).unwrap();
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    for entry in std::fs::read_dir(&shipped).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, templates.join(path.file_name().unwrap())).unwrap();
    }
    // Two templates that each load and do not combine: both take host port 9999.
    for name in ["port-a", "port-b"] {
        let source = format!(
            "pod:\n  spec:\n    containers:\n      - name: {name}\n        image: busybox:1.36\n        ports: \
             [{{containerPort: 8080, hostPort: 9999}}]\n"
        );
        std::fs::write(templates.join(format!("{name}.yaml")), source).unwrap();
    }
    let kubeconfig = format!("--events-kubeconfig={}", cluster.dir.path().join("kubeconfig").display());
    let version = format!("--kubernetes-version={}", cluster.version);
    let (injector, ca) = Injector::start(work.path(), &templates, &[&kubeconfig, &version]);
    let labels = json!({"kubernetes.io/metadata.name": NAMESPACE, "sidecar-injector.io/inject": "enabled"});
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}});
    cluster.must_create("/api/v1/namespaces", namespace).await;
    let mut mutating = configuration("mutatingwebhookconfiguration.yaml", &format!("https://{}", injector.addr), &ca);
    mutating["metadata"]["name"] = json!("e2e-events");
    mutating["webhooks"][0]["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}});
    register(cluster, MUTATING, &mutating).await;
    let pods = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    super::eventually("the webhook in effect", async || {
        let (status, body) = cluster.create(&format!("{pods}?dryRun=All"), pod("probe", "demo", None)).await;
        (status == 201 && body["metadata"]["annotations"].get("sidecar-injector.io/status").is_some()).then_some(())
    })
    .await;

    let replica_set = cluster
        .must_create(
            &format!("/apis/apps/v1/namespaces/{NAMESPACE}/replicasets"),
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "shop-1"},
                   "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "shop"}},
                            "template": {"metadata": {"labels": {"app": "shop"}},
                                         "spec": {"containers": [{"name": "app", "image": "shop:1"}]}}}}),
        )
        .await;
    for i in 0..5 {
        cluster.must_create(&pods, pod(&format!("shop-1-{i}"), "demo", Some(&replica_set))).await;
    }
    cluster.must_create(&pods, pod("shop-1-typo", "demi", Some(&replica_set))).await;
    cluster.must_create(&pods, pod("bare", "demo", None)).await;
    // Neither a dry run nor an opted-out pod says anything.
    let (status, _) = cluster.create(&format!("{pods}?dryRun=All"), pod("dry", "demo", None)).await;
    assert_eq!(status, 201);
    let mut opted_out = pod("opted-out", "demo", None);
    opted_out["metadata"]["annotations"]["sidecar-injector.io/inject"] = json!("false");
    cluster.must_create(&pods, opted_out).await;

    // Published off the request path: within seconds, not with the answer.
    let deadline = Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let seen = events(cluster).await;
        let injected = seen.iter().find(|e| e.0 == "ReplicaSet" && e.3 == "Injected").map_or(0, |e| e.5);
        if (injected == 5 && seen.len() == 3) || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let find = |kind: &str, name: &str, reason: &str| {
        seen.iter()
            .find(|e| e.0 == kind && e.1 == name && e.3 == reason)
            .unwrap_or_else(|| panic!("no {reason} on {kind} {name}: {seen:#?}"))
    };
    let injected = find("ReplicaSet", "shop-1", "Injected");
    assert_eq!(injected.2, "Normal");
    assert!(injected.4.starts_with("injected with template demo version "), "{injected:?}");
    assert_eq!(injected.5, 5, "five admissions, one Event with its series: {seen:#?}");
    let typo = find("ReplicaSet", "shop-1", "NotInjected");
    assert_eq!(typo.2, "Warning");
    assert!(typo.4.contains("(unknown-template)") && typo.4.contains("demi"), "{typo:?}");
    find("Pod", "bare", "Injected");
    assert_eq!(seen.len(), 3, "the dry run and the opted-out pod said nothing: {seen:#?}");

    // Issue 55, item 6, as kubectl shows it: a mistyped name in the containers annotation is answered with the
    // closest container; templates that cannot be combined (both take one host port) are named as that, not as an
    // unknown template.
    let mut typo = pod("typo", "demo", None);
    typo["metadata"]["annotations"]["sidecar-injector.io/containers"] = json!("ap");
    let (status, _, warnings) =
        cluster.call_for_warnings(hyper::Method::POST, &format!("{pods}?dryRun=All"), Some(&typo)).await;
    assert_eq!(status, 201);
    assert!(
        warnings.iter().any(|w| w.contains("ap") && w.contains("names no container of the pod (did you mean app?")),
        "{warnings:?}"
    );
    let (status, _, warnings) = cluster
        .call_for_warnings(
            hyper::Method::POST,
            &format!("{pods}?dryRun=All"),
            Some(&pod("clashing", "port-a,port-b", None)),
        )
        .await;
    assert_eq!(status, 201);
    assert!(warnings.iter().any(|w| w.contains("cannot be combined")), "{warnings:?}");
    assert!(!warnings.iter().any(|w| w.contains("no template named")), "{warnings:?}");
    drop(injector);

    // `--events off`: the same pod, nothing published.
    let work = tempfile::tempdir().unwrap();
    let (quiet, ca) = Injector::start(work.path(), &templates, &[&kubeconfig, &version, "--events=off"]);
    mutating["webhooks"][0]["clientConfig"] = configuration(
        "mutatingwebhookconfiguration.yaml",
        &format!("https://{}", quiet.addr),
        &ca,
    )["webhooks"][0]["clientConfig"]
        .clone();
    register(cluster, MUTATING, &mutating).await;
    super::eventually("the quiet webhook in effect", async || {
        let (status, body) = cluster.create(&pods, pod(&super::unique("quiet"), "demo", Some(&replica_set))).await;
        (status == 201 && body["metadata"]["annotations"].get("sidecar-injector.io/status").is_some()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let count = events(cluster).await.iter().find(|e| e.0 == "ReplicaSet" && e.3 == "Injected").map_or(0, |e| e.5);
    assert_eq!(count, 5, "--events off published");
}
