//! `sidecar-injector status` (issue 24) against the real API server, as a person runs it: the binary, a kubeconfig
//! of their own (certificates embedded, as kind and the clouds write them), workloads of every kind this
//! repository does not ship. No webhook runs: the 1.20 API server has no controller-manager either, so the test
//! lays out what the controllers and the injector would have left behind: a Deployment with its ReplicaSet and
//! that ReplicaSet's pods (injected by the current template, by an older version, by the other revision, not at
//! all, injected and then stripped of a label), a StatefulSet's current pod, a bare pod, an opted-out pod, a Job's
//! pod; a namespace on the `canary` revision with a pod of each revision; and a namespace not opted in.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use hyper::Method;
use serde_json::{Value, json};
use sidecar_injector_core::{Engine, Settings, TemplateSet};

use super::Cluster;

const DEFAULT_NS: &str = "e2e-status";
const CANARY_NS: &str = "e2e-status-canary";
const OFF_NS: &str = "e2e-status-off";
/// Where the template ConfigMaps live, as in `manifests/`; never judged itself.
const INJECTOR_NS: &str = "sidecar-injector";
const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/e2e/apiserver.sh"]
async fn status_against_a_real_api_server() {
    let cluster = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    // The revisions `status` is given: the repository's templates, and a canary whose shared values change every
    // template's version. And an older edit of the default template, which only made the stale pod.
    let current = templates(work.path(), "current", &[]);
    let canary = templates(work.path(), "canary", &[("values.yaml", "logLevel: debug\n".to_owned())]);
    let edit = std::fs::read_to_string(current.join("default.yaml")).unwrap().replace("proxy:1.4.2", "proxy:1.4.1");
    let old = templates(work.path(), "old", &[("default.yaml", edit)]);
    let (current, canary, old) = (engine(&current, "default"), engine(&canary, "canary"), engine(&old, "default"));
    let kubeconfig = kubeconfig(&cluster, work.path());

    for (name, labels) in [
        (DEFAULT_NS, json!({"sidecar-injector.io/inject": "enabled"})),
        (CANARY_NS, json!({"sidecar-injector.io/rev": "canary"})),
        (OFF_NS, json!({})),
        (INJECTOR_NS, json!({})),
    ] {
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
        cluster.must_create("/api/v1/namespaces", namespace).await;
    }

    // A Deployment, its ReplicaSet, and the ReplicaSet's pods in every state.
    let apps = format!("/apis/apps/v1/namespaces/{DEFAULT_NS}");
    let pods = format!("/api/v1/namespaces/{DEFAULT_NS}/pods");
    let labels = json!({"app": "web", "pod-template-hash": "7d9f"});
    let deployment = cluster.must_create(&format!("{apps}/deployments"), workload("Deployment", "web", &labels)).await;
    let mut replicaset = workload("ReplicaSet", "web-7d9f", &labels);
    replicaset["metadata"]["ownerReferences"] = json!([reference(&deployment)]);
    let replicaset = cluster.must_create(&format!("{apps}/replicasets"), replicaset).await;
    let web = |name: &str| owned(pod(name, &labels), &replicaset);
    cluster.must_create(&pods, injected(&current, DEFAULT_NS, &web("web-7d9f-current"))).await;
    cluster.must_create(&pods, injected(&old, DEFAULT_NS, &web("web-7d9f-stale"))).await;
    cluster.must_create(&pods, web("web-7d9f-missing")).await;
    let mut incomplete = injected(&current, DEFAULT_NS, &web("web-7d9f-incomplete"));
    incomplete["metadata"]["labels"].as_object_mut().unwrap().remove("sidecar-injector.io/injected");
    cluster.must_create(&pods, incomplete).await;
    cluster.must_create(&pods, injected(&canary, DEFAULT_NS, &web("web-7d9f-canary"))).await;

    // A StatefulSet whose pod is current: nothing to restart there.
    let db = json!({"app": "db"});
    let mut statefulset = workload("StatefulSet", "db", &db);
    statefulset["spec"]["serviceName"] = json!("db");
    let statefulset = cluster.must_create(&format!("{apps}/statefulsets"), statefulset).await;
    cluster.must_create(&pods, injected(&current, DEFAULT_NS, &owned(pod("db-0", &db), &statefulset))).await;

    // A bare pod without the sidecar, one opted out, and a Job's pod (at the default --kubernetes-version, 1.29,
    // a Job's pod gets the sidecar as a native sidecar: this one lacks it).
    cluster.must_create(&pods, pod("bare", &json!({"app": "bare"}))).await;
    // Issue 50: a pod injected with a template the set no longer has (its annotation names it).
    let mut removed = injected(&current, DEFAULT_NS, &pod("asks-removed", &json!({"app": "gone"})));
    removed["metadata"]["annotations"]["sidecar-injector.io/template"] = json!("removed");
    cluster.must_create(&pods, removed).await;
    let mut opted_out = pod("opted-out", &json!({"app": "tool"}));
    opted_out["metadata"]["annotations"] = json!({"sidecar-injector.io/inject": "false"});
    cluster.must_create(&pods, opted_out).await;
    let mut job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "backup"}, "spec": {"template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "backup", "image": "busybox:1.36"}]}}}});
    job = cluster.must_create(&format!("/apis/batch/v1/namespaces/{DEFAULT_NS}/jobs"), job).await;
    let job_labels = job["spec"]["template"]["metadata"]["labels"].clone();
    cluster.must_create(&pods, owned(pod("backup-x2x8q", &job_labels), &job)).await;

    // The canary namespace: a pod of its own revision, and one the default revision injected.
    let canary_pods = format!("/api/v1/namespaces/{CANARY_NS}/pods");
    cluster.must_create(&canary_pods, injected(&canary, CANARY_NS, &pod("canary-current", &json!({})))).await;
    cluster.must_create(&canary_pods, injected(&current, CANARY_NS, &pod("from-default", &json!({})))).await;
    // Not opted in: not looked at unless asked for.
    cluster.must_create(&format!("/api/v1/namespaces/{OFF_NS}/pods"), pod("off", &json!({}))).await;

    let dirs = [
        format!("--template-dir={}", work.path().join("current").display()),
        format!("--template-dir=canary={}", work.path().join("canary").display()),
    ];
    let dirs: Vec<&str> = dirs.iter().map(String::as_str).collect();
    let (code, report) = status(&kubeconfig, &[&dirs[..], &["-o", "json"]].concat());
    assert_eq!(code, 1, "drift exits 1");
    let report: Value = serde_json::from_str(&report).unwrap();
    let version = |engine: &Engine| engine.template().hash().to_owned();
    let expected = [
        (DEFAULT_NS, "Deployment/web", "web-7d9f-canary", "other-revision"),
        (DEFAULT_NS, "Deployment/web", "web-7d9f-current", "current"),
        (DEFAULT_NS, "Deployment/web", "web-7d9f-incomplete", "incomplete"),
        (DEFAULT_NS, "Deployment/web", "web-7d9f-missing", "missing"),
        (DEFAULT_NS, "Deployment/web", "web-7d9f-stale", "stale"),
        (DEFAULT_NS, "StatefulSet/db", "db-0", "current"),
        (DEFAULT_NS, "Job/backup", "backup-x2x8q", "missing"),
        (DEFAULT_NS, "Pod/asks-removed", "asks-removed", "unknown-template"),
        (DEFAULT_NS, "Pod/bare", "bare", "missing"),
        (DEFAULT_NS, "Pod/opted-out", "opted-out", "skipped"),
        (CANARY_NS, "Pod/canary-current", "canary-current", "current"),
        (CANARY_NS, "Pod/from-default", "from-default", "other-revision"),
    ];
    assert_eq!(classes(&report), expected.map(|(n, w, p, c)| (n.to_owned(), w.to_owned(), p.to_owned(), c.to_owned())));
    let pod_of = |name: &str| find_pod(&report, name);
    let stale = pod_of("web-7d9f-stale");
    assert_eq!(
        (stale["version"].as_str(), stale["currentVersion"].as_str()),
        (Some(&*version(&old)), Some(&*version(&current)))
    );
    assert_eq!(pod_of("web-7d9f-canary")["revision"], "canary");
    assert_eq!(pod_of("from-default")["revision"], "default");
    assert_eq!(pod_of("canary-current")["version"], version(&canary));
    assert_eq!(pod_of("web-7d9f-incomplete")["missing"], json!(["label sidecar-injector.io/injected"]));
    assert_eq!(pod_of("opted-out")["reason"], "opted-out");
    let asks_removed = pod_of("asks-removed");
    assert_eq!(asks_removed["asksFor"], "removed");
    assert_eq!(asks_removed["injected"], format!("default {}", version(&current)));
    let summary = &report["summary"];
    assert_eq!((summary["pods"].as_u64(), summary["namespaces"].as_u64()), (Some(12), Some(2)));
    assert_eq!(summary["unknownTemplate"], 1);
    assert_eq!((summary["workloadsWithDrift"].as_u64(), summary["drift"].as_bool()), (Some(4), Some(true)));

    // The same answer from the templates in ConfigMaps, read through the API server as `serve` reads them mounted.
    let configmaps = format!("/api/v1/namespaces/{INJECTOR_NS}/configmaps");
    cluster.must_create(&configmaps, configmap("templates", &work.path().join("current"))).await;
    cluster.must_create(&configmaps, configmap("templates-canary", &work.path().join("canary"))).await;
    let (code, from_configmaps) = status(
        &kubeconfig,
        &[
            "-o",
            "json",
            "--configmap",
            &format!("{INJECTOR_NS}/templates"),
            "--configmap",
            &format!("canary={INJECTOR_NS}/templates-canary"),
        ],
    );
    let from_configmaps: Value = serde_json::from_str(&from_configmaps).unwrap();
    assert_eq!(code, 1);
    assert_eq!(from_configmaps["namespaces"], report["namespaces"]);
    assert_eq!(from_configmaps["summary"], report["summary"]);
    assert_eq!(from_configmaps["revisions"][1]["source"], format!("configmap/{INJECTOR_NS}/templates-canary"));
    assert_eq!(from_configmaps["revisions"][1]["set"], report["revisions"][1]["set"]);

    // The table a person reads.
    let (code, table) = status(&kubeconfig, &dirs);
    assert_eq!(code, 1);
    let web_row: Vec<&str> = table.lines().find(|l| l.contains("Deployment/web")).unwrap().split_whitespace().collect();
    assert_eq!(web_row, [DEFAULT_NS, "default", "Deployment/web", "5", "1", "1", "1", "1", "1", "0", "0"]);
    assert!(table.contains(
        "unknown template: 1 pod(s) in 1 workload(s) name a template their revision does not have (removed)"
    ));
    assert!(table.contains(&format!("stale, default {} (now {}): web-7d9f-stale", version(&old), version(&current))));
    assert!(table.contains(
        "not restartable, recreate by hand: Job e2e-status/backup (1 pod(s)), Pod e2e-status/bare (1 pod(s))"
    ));

    // Other scopes: one namespace not opted in, every namespace.
    let (code, off) = status(&kubeconfig, &[&dirs[..], &["-o", "json", "-n", OFF_NS]].concat());
    let off: Value = serde_json::from_str(&off).unwrap();
    assert_eq!(code, 0, "pods of a namespace not opted in are not drift");
    assert_eq!(classes(&off), [(OFF_NS.to_owned(), "Pod/off".to_owned(), "off".to_owned(), "skipped".to_owned())]);
    assert_eq!(find_pod(&off, "off")["reason"], "namespace-not-opted-in");
    let (code, all) = status(&kubeconfig, &[&dirs[..], &["-o", "json", "-A"]].concat());
    let all: Value = serde_json::from_str(&all).unwrap();
    assert_eq!(code, 1);
    let opt_in =
        |name: &str| all["namespaces"].as_array().unwrap().iter().find(|n| n["name"] == name).unwrap()["optIn"].clone();
    assert_eq!(
        (opt_in(OFF_NS), opt_in(INJECTOR_NS), opt_in("kube-system")),
        (json!("not-opted-in"), json!("excluded"), json!("excluded"))
    );
    assert_eq!(all["summary"]["pods"], 13);

    // --restart --dry-run names the Deployment and changes nothing.
    let (code, dry) = status(&kubeconfig, &[&dirs[..], &["-o", "json", "--restart", "--dry-run"]].concat());
    assert_eq!(code, 1, "the Job and the bare pod are left to recreate by hand");
    let dry: Value = serde_json::from_str(&dry).unwrap();
    let restart = &dry["restart"];
    assert_eq!(restart["dryRun"], true);
    assert_eq!(
        restart["restarted"],
        json!([{"namespace": DEFAULT_NS, "kind": "Deployment", "name": "web", "driftingPods": 4}])
    );
    let by_hand: Vec<&str> =
        restart["notRestartable"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(by_hand, ["backup", "bare", "from-default"]);
    let deployment_path = format!("{apps}/deployments/web");
    let restarted_at = async |path: &str| {
        let (status, object) = cluster.call(Method::GET, path, None).await;
        assert_eq!(status, 200, "{object}");
        object["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT].as_str().map(str::to_owned)
    };
    assert_eq!(restarted_at(&deployment_path).await, None, "a dry run changes nothing");

    // --restart rolls the Deployment, as `kubectl rollout restart` does, and nothing else.
    let (code, table) = status(&kubeconfig, &[&dirs[..], &["--restart"]].concat());
    assert_eq!(code, 1);
    assert!(table.contains(&format!("): Deployment {DEFAULT_NS}/web (4 pod(s))\n")), "{table}");
    let at = restarted_at(&deployment_path).await.expect("the Deployment's pod template was annotated");
    humantime::parse_rfc3339(&at).unwrap_or_else(|e| panic!("{at}: {e}"));
    assert!(table.contains(&format!("restarted ({RESTARTED_AT}={at}): ")), "{table}");
    assert_eq!(restarted_at(&format!("{apps}/statefulsets/db")).await, None, "no drift, no restart");

    // Another context of the kubeconfig, on which no API server listens: exit 2, saying so.
    let (code, _, stderr) = status_with_stderr(&kubeconfig, &[&dirs[..], &["--context", "nowhere"]].concat());
    assert_eq!(code, 2);
    assert!(stderr.starts_with("sidecar-injector: cannot reach the API server https://127.0.0.1:"), "{stderr}");
}

/// A template directory under `work`: the repository's templates, with `files` written over them.
fn templates(work: &Path, name: &str, files: &[(&str, String)]) -> PathBuf {
    let dir = work.join(name);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("templates")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    dir
}

fn engine(dir: &Path, revision: &str) -> Engine {
    let settings = Settings { revision: revision.to_owned(), ..Settings::default() };
    Engine::new(TemplateSet::load_dir(dir, "default", &settings).unwrap(), &settings)
}

/// `pod` as the webhook of `engine`'s revision injects it in `namespace`: the engine's patch, applied.
fn injected(engine: &Engine, namespace: &str, pod: &Value) -> Value {
    let mut review = super::common::review(pod);
    review["request"]["namespace"] = json!(namespace);
    let (_, _, patch) = super::common::answer(engine, &review);
    super::common::apply(pod, &patch.expect("the pod is injected"))
}

fn pod(name: &str, labels: &Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}
    })
}

/// An `apps/v1` workload of `kind` whose pods carry `labels`.
fn workload(kind: &str, name: &str, labels: &Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}}}
    })
}

/// The owner reference a controller puts on what it creates.
fn reference(owner: &Value) -> Value {
    json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true
    })
}

fn owned(mut pod: Value, owner: &Value) -> Value {
    pod["metadata"]["ownerReferences"] = json!([reference(owner)]);
    pod
}

/// A ConfigMap of every file of `dir`, as `kubectl create configmap --from-file=DIR` makes it.
fn configmap(name: &str, dir: &Path) -> Value {
    let mut data = serde_json::Map::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        data.insert(path.file_name().unwrap().to_string_lossy().into(), std::fs::read_to_string(&path).unwrap().into());
    }
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

/// A kubeconfig for the test cluster with everything embedded, as kind and the clouds write them; and a context
/// `nowhere` whose server does not listen.
pub(super) fn kubeconfig(cluster: &Cluster, work: &Path) -> PathBuf {
    let data = |file: &str| {
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(cluster.dir.path().join(file)).unwrap())
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n\
         - name: e2e\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\n\
         - name: nowhere\n  cluster:\n    server: https://127.0.0.1:{closed}\n    certificate-authority-data: {ca}\n\
         users:\n- name: admin\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n\
         contexts:\n- name: e2e\n  context: {{cluster: e2e, user: admin}}\n\
         - name: nowhere\n  context: {{cluster: nowhere, user: admin}}\ncurrent-context: e2e\n",
        addr = cluster.addr,
        ca = data("ca.crt"),
        cert = data("admin.crt"),
        key = data("admin.key"),
        closed = super::free_port(),
    );
    let path = work.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `sidecar-injector status ARGS` with `KUBECONFIG` set, as a person would: its exit code and stdout.
fn status(kubeconfig: &Path, args: &[&str]) -> (i32, String) {
    let (code, stdout, _) = status_with_stderr(kubeconfig, args);
    (code, stdout)
}

/// [`status`], and its stderr.
fn status_with_stderr(kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .arg("status")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8(output.stdout).unwrap(), String::from_utf8(output.stderr).unwrap());
    eprintln!(
        "$ sidecar-injector status {}\nstatus: {}\nstdout:\n{stdout}\nstderr: {stderr}",
        args.join(" "),
        output.status
    );
    (output.status.code().unwrap_or(-1), stdout, stderr)
}

/// Every pod of a JSON report: (namespace, workload, pod, class), in report order.
fn classes(report: &Value) -> Vec<(String, String, String, String)> {
    let text = |v: &Value| v.as_str().unwrap().to_owned();
    let mut found = Vec::new();
    for namespace in report["namespaces"].as_array().unwrap() {
        for workload in namespace["workloads"].as_array().unwrap() {
            for pod in workload["pods"].as_array().unwrap() {
                let name = format!("{}/{}", text(&workload["kind"]), text(&workload["name"]));
                found.push((text(&namespace["name"]), name, text(&pod["name"]), text(&pod["class"])));
            }
        }
    }
    found
}

fn find_pod<'r>(report: &'r Value, name: &str) -> &'r Value {
    let mut pods = report["namespaces"].as_array().unwrap().iter().flat_map(|n| n["workloads"].as_array().unwrap());
    pods.find_map(|w| w["pods"].as_array().unwrap().iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no pod {name} in {report}"))
}
