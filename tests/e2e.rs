//! End to end against a real kube-apiserver and etcd, at the release `E2E_KUBERNETES` names (`newest`, the default:
//! 1.37, built by `tests/e2e/apiserver.sh` from the Go module proxy; `oldest`: 1.20, from Debian's source): the API
//! server's own TLS client calls `sidecar-injector serve` over HTTP/1.1 with `?timeout=`, applies our patch with its
//! own JSON-patch library and validates the pod it stores. `.ci/run` runs the suite at both.
//!
//! `cargo test --release --test e2e -- --include-ignored` (the first run builds the API server into
//! `~/.cache/sidecar-injector-e2e`, tests/e2e/README.md). Its tests are `#[ignore]`d otherwise: `cargo test` lists
//! them as ignored, with the reason, rather than passing without testing.
//!
//! One test runs the scenarios in order, because webhook configurations are cluster-wide: each scenario sets up
//! the webhooks it needs.

#[path = "e2e/admission_chain.rs"]
mod admission_chain;
mod common;
#[path = "e2e/differential.rs"]
mod differential;
#[path = "e2e/events.rs"]
mod events;
#[path = "e2e/helm.rs"]
mod helm;
#[path = "e2e/policy.rs"]
mod policy;
/// The reviews the benches send, pathological pods among them.
#[path = "../benches/support/reviews.rs"]
#[allow(dead_code)]
mod reviews;
#[path = "e2e/status.rs"]
mod status;
#[path = "e2e/tags.rs"]
mod tags;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::env_value;
use common::server::{Conn, client_config};
use http_body_util::Full;
use hyper::{Method, Request};
use serde_json::{Value, json};
use sidecar_injector::pki::Authority;
use sidecar_injector_core::validation::KubeVersion;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/apiserver.sh");

/// etcd and kube-apiserver, stopped on drop.
struct Cluster {
    // Dropped first: the processes stop before their directory is deleted.
    _running: Stop,
    dir: tempfile::TempDir,
    addr: SocketAddr,
    client: rustls::ClientConfig,
    /// The release it runs: our rules are judged at the same one.
    version: KubeVersion,
}

/// Stops what `apiserver.sh start DIR` started, when dropped: even if the test panics while setting up.
struct Stop(std::path::PathBuf);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT).arg("stop").arg(&self.0).status();
    }
}

impl Cluster {
    fn start() -> Cluster {
        let status = Command::new(SCRIPT).arg("build").status().unwrap();
        assert!(status.success(), "building kube-apiserver failed");
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new(SCRIPT).arg("start").arg(dir.path()).status().unwrap();
        assert!(status.success(), "starting kube-apiserver failed");
        let running = Stop(dir.path().to_owned());
        let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
        let port: u16 = env.lines().find_map(|l| l.strip_prefix("APISERVER_PORT=")).unwrap().parse().unwrap();
        let version = env.lines().find_map(|l| l.strip_prefix("KUBERNETES_RELEASE=")).unwrap().parse().unwrap();
        let read = |file: &str| std::fs::read_to_string(dir.path().join(file)).unwrap();
        let client =
            client_config(read("ca.crt").as_bytes(), b"http/1.1", Some((&read("admin.crt"), &read("admin.key"))));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        Cluster { _running: running, dir, addr, client, version }
    }

    /// One API call: the status and the JSON body.
    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> (u16, Value) {
        let (status, body, _) = self.call_for_warnings(method, path, body).await;
        (status, body)
    }

    /// [`Cluster::call`], with the warnings the API server sent (`Warning: 299 - "..."` headers, as kubectl prints
    /// them).
    async fn call_for_warnings(&self, method: Method, path: &str, body: Option<&Value>) -> (u16, Value, Vec<String>) {
        let mut conn = Conn::open_as(self.addr, self.client.clone(), "127.0.0.1").await.unwrap();
        let content_type = if method == Method::PATCH { "application/merge-patch+json" } else { "application/json" };
        let request = Request::builder()
            .method(method)
            .uri(format!("https://127.0.0.1{path}"))
            .header("host", self.addr.to_string())
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body.map(|b| serde_json::to_vec(b).unwrap()).unwrap_or_default())))
            .unwrap();
        let (status, headers, bytes) = conn.send_for_headers(request).await.unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::from(String::from_utf8_lossy(&bytes)));
        let warnings = headers
            .get_all("warning")
            .iter()
            .map(|w| w.to_str().unwrap().trim_start_matches("299 - \"").trim_end_matches('"').to_owned())
            .collect();
        (status.as_u16(), body, warnings)
    }

    async fn create(&self, path: &str, object: Value) -> (u16, Value) {
        self.call(Method::POST, path, Some(&object)).await
    }

    async fn must_create(&self, path: &str, object: Value) -> Value {
        let (status, body) = self.create(path, object).await;
        assert!((200..300).contains(&status), "POST {path}: {status} {body}");
        body
    }

    async fn delete(&self, path: &str) {
        self.call(Method::DELETE, path, None).await;
    }
}

/// `sidecar-injector serve` on 127.0.0.1 with a certificate for that address, templates from a directory.
struct Injector {
    child: Option<Child>,
    addr: SocketAddr,
    args: Vec<String>,
}

impl Injector {
    fn start(dir: &Path, templates: &Path, extra: &[&str]) -> (Injector, String) {
        let ca = Authority::generate("e2e webhook CA", Duration::from_secs(86400)).unwrap();
        let leaf = ca.issue_server("127.0.0.1", &["127.0.0.1".to_owned()], Duration::from_secs(86400)).unwrap();
        std::fs::write(dir.join("tls.crt"), leaf.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), leaf.key_pem).unwrap();
        let port = free_port();
        let args = vec![
            "serve".to_owned(),
            format!("--listen=127.0.0.1:{port}"),
            format!("--metrics-listen=127.0.0.1:{}", free_port()),
            format!("--tls-cert={}", dir.join("tls.crt").display()),
            format!("--tls-key={}", dir.join("tls.key").display()),
            format!("--template-dir={}", templates.display()),
            "--template-poll-interval=500ms".to_owned(),
            "--shutdown-delay=0s".to_owned(),
        ];
        let args = args.into_iter().chain(extra.iter().map(|a| a.to_string())).collect();
        let mut injector = Injector { child: None, addr: SocketAddr::from(([127, 0, 0, 1], port)), args };
        injector.resume();
        (injector, ca.cert_pem().to_owned())
    }

    fn resume(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(self.addr).is_err() {
            assert!(Instant::now() < deadline, "the injector did not start listening");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `prefix-N`, a new N each call: pod names never collide within a run.
fn unique(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    format!("{prefix}-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A webhook configuration from `manifests/base`, pointed at `url` (the URL form: no Service here) with `ca`.
fn configuration(file: &str, url: &str, ca_pem: &str) -> Value {
    configuration_with(file, None, url, ca_pem)
}

/// [`configuration`], with the JSON patch of the same name from the component `component` applied first, as
/// kustomize applies it.
fn configuration_with(file: &str, component: Option<&str>, url: &str, ca_pem: &str) -> Value {
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    let read = |dir: &str| {
        let text = std::fs::read_to_string(manifests.join(dir).join(file)).unwrap();
        sidecar_injector_core::offline::read_documents(&text).unwrap().remove(0)
    };
    let mut configuration = read("base");
    if let Some(component) = component {
        let patch: json_patch::Patch = serde_json::from_value(read(component)).unwrap();
        json_patch::patch(&mut configuration, &patch).unwrap();
    }
    use base64::Engine as _;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    for webhook in configuration["webhooks"].as_array_mut().unwrap() {
        let path = webhook["clientConfig"]["service"]["path"].as_str().unwrap().to_owned();
        webhook["clientConfig"] = json!({"url": format!("{url}{path}"), "caBundle": bundle});
    }
    configuration
}

/// Gives a copy of one of our configurations its own names, for a second webhook beside ours. Configurations are
/// called in name order, so a `zz-` name runs after ours.
fn renamed(configuration: &mut Value, name: &str, webhook: &str) {
    configuration["metadata"]["name"] = json!(name);
    configuration["webhooks"][0]["name"] = json!(webhook);
}

/// Creates plain pods (`prefix-N`) in the opted-in namespace until one is refused, and returns the API server's
/// message: configuration changes take effect asynchronously.
async fn first_refusal(cluster: &Cluster, what: &str, prefix: &str) -> String {
    let refusal = eventually(what, async || {
        let (status, body) = cluster.create(PODS, pod(&unique(prefix), json!({}), json!({}))).await;
        (status >= 400).then_some(body)
    })
    .await;
    refusal["message"].as_str().unwrap_or_default().to_owned()
}

fn pod(name: &str, annotations: Value, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}
    })
}

fn container_names(pod: &Value, list: &str) -> Vec<String> {
    pod["spec"][list].as_array().into_iter().flatten().map(|c| c["name"].as_str().unwrap().to_owned()).collect()
}

fn proxies(pod: &Value) -> usize {
    container_names(pod, "containers").iter().filter(|n| *n == "proxy").count()
}

const MUTATING: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
const VALIDATING: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
/// The pods of the opted-in namespace.
const PODS: &str = "/api/v1/namespaces/e2e-in/pods";

/// Registers a webhook configuration, replacing one of the same name. The API server picks it up
/// asynchronously: callers wait for its effect with `eventually`.
/// Below 1.28 the API server has no `matchConditions` (1.20 would drop the field; the injector applies the same
/// rules itself), so they are left out there, as `certs --kubernetes-version` leaves them out.
async fn register(cluster: &Cluster, collection: &str, configuration: &Value) {
    let name = configuration["metadata"]["name"].as_str().unwrap();
    let mut configuration = configuration.clone();
    if !cluster.version.at_least(28) {
        for webhook in configuration["webhooks"].as_array_mut().unwrap() {
            webhook.as_object_mut().unwrap().remove("matchConditions");
        }
    }
    cluster.delete(&format!("{collection}/{name}")).await;
    cluster.must_create(collection, configuration).await;
}

/// The runner of a generated campaign: `cases` cases from a fixed seed, the same on every run (CI stays
/// reproducible); `E2E_CASES=N` draws N new ones from a random seed.
fn case_runner(cases: u32) -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let campaign: Option<u32> = std::env::var("E2E_CASES").ok().and_then(|n| n.parse().ok());
    let config = Config { cases: campaign.unwrap_or(cases), failure_persistence: None, ..Config::default() };
    match campaign {
        Some(_) => TestRunner::new(config),
        None => TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha)),
    }
}

/// Retries `attempt` until it returns `Some`, for at most 30 s: configuration changes and template reloads reach
/// the API server and the injector asynchronously.
async fn eventually<T>(what: &str, mut attempt: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Issue 49: generated pods through both our webhooks on the API server's own admission chain; see
/// `tests/e2e/admission_chain.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/e2e/apiserver.sh"]
async fn the_admission_chain_accepts_every_pod_the_api_server_accepts_as_sent() {
    let cluster = Cluster::start();
    admission_chain::the_admission_chain_accepts_every_pod_it_accepted_as_sent(&cluster).await;
}

/// Issue 55: Kubernetes Events about admissions; see `tests/e2e/events.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/e2e/apiserver.sh"]
async fn events_against_a_real_api_server() {
    let cluster = Cluster::start();
    events::events_on_the_pods_controller(&cluster).await;
}

/// Issue 55: revision tags set, moved and removed by `sidecar-injector tag`; see `tests/e2e/tags.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/e2e/apiserver.sh"]
async fn revision_tags_against_a_real_api_server() {
    let cluster = Cluster::start();
    tags::tags_move_namespaces(&cluster).await;
}

/// Issue 53: the templates compiled into MutatingAdmissionPolicies inject pods as the webhook does; see
/// `tests/e2e/policy.rs`. Needs Kubernetes 1.36 or later (.ci/run skips it at the oldest release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver of 1.36 or later: tests/e2e/apiserver.sh"]
async fn policies_inject_pods_as_the_webhook_does() {
    let cluster = Cluster::start();
    policy::policies_inject_as_the_webhook_does(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/e2e/apiserver.sh"]
async fn against_a_real_api_server() {
    let cluster = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    let templates = work.path().join("templates");
    std::fs::create_dir(&templates).unwrap();
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/default.yaml"), templates.join("default.yaml"))
        .unwrap();
    let (mut injector, ca) = Injector::start(work.path(), &templates, &[]);
    let url = format!("https://{}", injector.addr);

    // Namespaces: opted in, not opted in, and system ones labelled in as well (they must stay excluded). 1.20
    // does not set `kubernetes.io/metadata.name` itself; later versions do.
    for (name, opted_in) in [("e2e-in", true), ("e2e-out", false), ("kube-node-lease", true), ("kube-system", true)] {
        let mut labels = json!({"kubernetes.io/metadata.name": name});
        if opted_in {
            labels["sidecar-injector.io/inject"] = json!("enabled");
        }
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
        let (status, _) = cluster.create("/api/v1/namespaces", namespace.clone()).await;
        if status == 409 {
            cluster
                .call(
                    Method::PATCH,
                    &format!("/api/v1/namespaces/{name}"),
                    Some(&json!({"metadata": {"labels": labels}})),
                )
                .await;
        }
    }
    let mutating = configuration("mutatingwebhookconfiguration.yaml", &url, &ca);
    register(&cluster, MUTATING, &mutating).await;

    // A pod in an opted-in namespace gets the sidecar once, and the API server stores it (its validation passed).
    let stored = eventually("the webhook configuration to take effect", async || {
        let name = unique("web");
        let (status, body) = cluster.create(PODS, pod(&name, json!({}), json!({"app": "web"}))).await;
        assert_eq!(status, 201, "{body}");
        (proxies(&body) > 0).then_some(body)
    })
    .await;
    assert_eq!(proxies(&stored), 1, "{stored}");
    assert_eq!(container_names(&stored, "initContainers"), ["proxy-init"]);
    assert!(stored["metadata"]["annotations"]["sidecar-injector.io/status"].is_string());
    let name = stored["metadata"]["name"].as_str().unwrap();
    let (status, fetched) = cluster.call(Method::GET, &format!("{PODS}/{name}"), None).await;
    assert_eq!((status, proxies(&fetched)), (200, 1), "what was stored has the sidecar");

    // Server-side dry run shows the injected pod and stores nothing.
    let (status, dry) = cluster.create(&format!("{PODS}?dryRun=All"), pod("dry", json!({}), json!({}))).await;
    assert_eq!((status, proxies(&dry)), (201, 1), "{dry}");
    assert_eq!(cluster.call(Method::GET, &format!("{PODS}/dry"), None).await.0, 404, "a dry run persists nothing");

    // Pods at the API server's limits (issue 54): each injected once and stored by a dry run (the API server's
    // validation passed); the one beyond them refused (by us, unread, or by the API server: either way not stored).
    for (case, body) in reviews::pathological() {
        let review: Value = serde_json::from_slice(&body).unwrap();
        let mut pod = review["request"]["object"].clone();
        let metadata = pod["metadata"].as_object_mut().unwrap();
        metadata.insert("name".into(), json!(unique("limits")));
        metadata.remove("managedFields");
        // The priority admission plugin fills `priority` in from the class; the recorded pod carries it filled.
        pod["spec"].as_object_mut().unwrap().remove("priority");
        let (status, created) = cluster.create(&format!("{PODS}?dryRun=All"), pod).await;
        if case == reviews::BEYOND_API_LIMITS {
            assert!((400..500).contains(&status), "{case}: {status} {}", created["message"]);
        } else {
            assert_eq!((status, proxies(&created)), (201, 1), "{case}: {}", created["message"]);
        }
    }

    // Opted out, not opted in, excluded namespaces, other objects: untouched.
    let opted_out = cluster
        .must_create(PODS, pod("out-annotation", json!({"sidecar-injector.io/inject": "false"}), json!({})))
        .await;
    assert_eq!(proxies(&opted_out), 0);
    let labelled_out =
        cluster.must_create(PODS, pod("out-label", json!({}), json!({"sidecar-injector.io/inject": "false"}))).await;
    assert_eq!(proxies(&labelled_out), 0);
    for namespace in ["e2e-out", "kube-system", "kube-node-lease"] {
        let created = cluster
            .must_create(&format!("/api/v1/namespaces/{namespace}/pods"), pod("plain", json!({}), json!({})))
            .await;
        assert_eq!(proxies(&created), 0, "{namespace}");
        assert!(created["metadata"]["annotations"].get("sidecar-injector.io/status").is_none(), "{namespace}");
    }
    let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}});
    let stored_configmap = cluster.must_create("/api/v1/namespaces/e2e-in/configmaps", configmap).await;
    assert_eq!(stored_configmap["data"], json!({"k": "v"}));
    assert!(stored_configmap["metadata"].get("annotations").is_none());

    // A Deployment is stored as written; the pods created from its template (as its ReplicaSet would, here by
    // hand: no controller manager runs) are injected.
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "shop"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "shop"}},
                 "template": {"metadata": {"labels": {"app": "shop"}},
                              "spec": {"containers": [{"name": "shop", "image": "shop:1"}]}}}
    });
    let stored_deployment = cluster.must_create("/apis/apps/v1/namespaces/e2e-in/deployments", deployment).await;
    assert_eq!(proxies(&stored_deployment["spec"]["template"]), 0, "the webhook sees PODS, not Deployments");
    let template = &stored_deployment["spec"]["template"];
    for _ in 0..2 {
        let from_template = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "shop-5d8f7c-", "labels": template["metadata"]["labels"]},
            "spec": template["spec"],
        });
        let created = cluster.must_create(PODS, from_template).await;
        assert_eq!(proxies(&created), 1, "{created}");
        assert_eq!(
            env_value(&created["spec"]["containers"][1], "PROXY_SERVICE_NAME"),
            "shop",
            "rendered per pod from its labels"
        );
    }

    // A pod that declares the sidecar itself, with fields of which the API accepts one (an env var's value, a
    // probe's exec, a volume's configMap), a memory request above the template's limit, the admin port's name on
    // another port, and `proxy-init` as a regular container: completed around what the user set, and stored (the
    // API server's validation passed).
    let own = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": unique("own")},
        "spec": {
            "containers": [
                {"name": "app", "image": "nginx:1.27"},
                {"name": "proxy", "image": "mine:1",
                 "env": [{"name": "POD_IP", "value": "10.0.0.1"}],
                 "readinessProbe": {"exec": {"command": ["ready"]}},
                 "resources": {"requests": {"memory": "512Mi"}},
                 "ports": [{"containerPort": 9901, "name": "proxy-admin"}]},
                {"name": "proxy-init", "image": "mine:1"}
            ],
            "volumes": [{"name": "sidecar-injector-proxy", "configMap": {"name": "mine"}}]
        }
    });
    let stored_own = cluster.must_create(PODS, own).await;
    assert!(stored_own["metadata"]["annotations"]["sidecar-injector.io/status"].is_string(), "{stored_own}");
    assert_eq!(container_names(&stored_own, "initContainers"), Vec::<String>::new());
    let proxy = &stored_own["spec"]["containers"][1];
    assert_eq!(proxy["env"][0], json!({"name": "POD_IP", "value": "10.0.0.1"}), "{proxy}");
    assert_eq!(env_value(proxy, "PROXY_SERVICE_ACCOUNT"), "default", "the rest was added: {proxy}");
    assert!(proxy["readinessProbe"].get("httpGet").is_none(), "{proxy}");
    // The user sized memory (so no memory limit of ours below their request); CPU is the template's, request and
    // limit (the API server writes 1000m as 1).
    assert_eq!(proxy["resources"], json!({"requests": {"cpu": "50m", "memory": "512Mi"}, "limits": {"cpu": "1"}}));
    assert_eq!(proxy["ports"].as_array().unwrap().len(), 1, "{proxy}");
    assert!(stored_own["spec"]["volumes"][0].get("emptyDir").is_none(), "{stored_own}");

    // A second mutating webhook that changes the pod after ours (it injects its own container; configurations are
    // called in name order) makes the API server call ours again (reinvocationPolicy: IfNeeded): still one sidecar.
    let late_templates = work.path().join("late-templates");
    std::fs::create_dir(&late_templates).unwrap();
    std::fs::write(
        late_templates.join("default.yaml"),
        "pod:\n  metadata:\n    labels: { late: \"yes\" }\n  spec:\n    containers:\n      - { name: late, image: \"late:1\" }\n",
    )
    .unwrap();
    let late_dir = work.path().join("late");
    std::fs::create_dir(&late_dir).unwrap();
    // Its own annotation prefix: with ours, it would take our status annotation for another version's sidecar.
    let (late, late_ca) = Injector::start(&late_dir, &late_templates, &["--annotation-prefix=late.e2e.example.com/"]);
    let mut second = configuration("mutatingwebhookconfiguration.yaml", &format!("https://{}", late.addr), &late_ca);
    renamed(&mut second, "zz-late-webhook", "late.e2e.example.com");
    second["webhooks"][0]["reinvocationPolicy"] = json!("Never");
    register(&cluster, MUTATING, &second).await;
    let both = eventually("the second webhook to take effect", async || {
        let name = unique("both");
        let created = cluster.must_create(PODS, pod(&name, json!({}), json!({}))).await;
        container_names(&created, "containers").contains(&"late".to_owned()).then_some(created)
    })
    .await;
    assert_eq!(proxies(&both), 1, "{both}");
    assert_eq!(container_names(&both, "initContainers"), ["proxy-init"]);
    cluster.delete(&format!("{MUTATING}/zz-late-webhook")).await;
    drop(late);

    // The injector stopped: with failurePolicy Ignore pods are admitted without the sidecar; with Fail they are
    // refused with the API server's error, and admitted with it again once the injector is back.
    injector.stop();
    let admitted = cluster.must_create(PODS, pod("while-down", json!({}), json!({}))).await;
    assert_eq!(proxies(&admitted), 0, "fails open");
    let mut failing = mutating.clone();
    failing["webhooks"][0]["failurePolicy"] = json!("Fail");
    register(&cluster, MUTATING, &failing).await;
    let message = first_refusal(&cluster, "failurePolicy Fail to take effect", "refused").await;
    assert!(message.contains("failed calling webhook") && message.contains("inject.sidecar-injector.io"), "{message}");
    injector.resume();
    let back = cluster.must_create(PODS, pod("back", json!({}), json!({}))).await;
    assert_eq!(proxies(&back), 1);
    register(&cluster, MUTATING, &mutating).await;

    // A template edit (the directory swapped as the kubelet updates a ConfigMap volume) reaches the next pod.
    let edited = std::fs::read_to_string(templates.join("default.yaml"))
        .unwrap()
        .replace("ghcr.io/sidecar-injector/proxy:1.4.2", "ghcr.io/sidecar-injector/proxy:1.5.0");
    let staged = templates.join("default.yaml.new");
    std::fs::write(&staged, edited).unwrap();
    std::fs::rename(&staged, templates.join("default.yaml")).unwrap();
    eventually("the edited template to be served", async || {
        let created = cluster.must_create(PODS, pod(&unique("edited"), json!({}), json!({}))).await;
        let proxy = created["spec"]["containers"].as_array().unwrap().iter().find(|c| c["name"] == "proxy").cloned();
        proxy.filter(|p| p["image"] == "ghcr.io/sidecar-injector/proxy:1.5.0")
    })
    .await;

    validating_companion(&cluster, &injector, &ca).await;
    apply_time_preview(&cluster, &injector, &ca).await;
}

/// Issue 41 against the real API server: a Deployment whose pods would go without the sidecar is admitted, and
/// the API server passes our warning to the client (`kubectl apply` prints it); one whose pods inject cleanly, or
/// one outside the injected namespaces, gets no warning of ours.
async fn apply_time_preview(cluster: &Cluster, injector: &Injector, ca: &str) {
    let url = format!("https://{}", injector.addr);
    register(cluster, VALIDATING, &configuration("validatingwebhookconfiguration.yaml", &url, ca)).await;
    let deployment = |name: &str, annotations: Value| {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}, "annotations": annotations},
                    "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}
                }
            }
        })
    };
    let deployments = |namespace: &str| format!("/apis/apps/v1/namespaces/{namespace}/deployments");
    let warnings = eventually("the preview webhook to take effect", async || {
        let name = unique("previewed");
        let misnamed = deployment(&name, json!({"sidecar-injector.io/template": "defualt"}));
        let (status, body, warnings) =
            cluster.call_for_warnings(Method::POST, &deployments("e2e-in"), Some(&misnamed)).await;
        assert_eq!(status, 201, "a preview never refuses: {body}");
        (!warnings.is_empty()).then_some(warnings)
    })
    .await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].starts_with("Deployment e2e-in/previewed-"), "{warnings:?}");
    assert!(warnings[0].contains("defualt") && warnings[0].contains("default"), "{warnings:?}");

    let clean = deployment(&unique("clean"), json!({}));
    let (status, _, warnings) = cluster.call_for_warnings(Method::POST, &deployments("e2e-in"), Some(&clean)).await;
    assert_eq!((status, warnings.len()), (201, 0), "{warnings:?}");
    let elsewhere = deployment(&unique("elsewhere"), json!({"sidecar-injector.io/template": "defualt"}));
    let (status, _, warnings) =
        cluster.call_for_warnings(Method::POST, &deployments("e2e-out"), Some(&elsewhere)).await;
    assert_eq!((status, warnings.len()), (201, 0), "not an injected namespace: {warnings:?}");
}

/// Issue 8 against the real API server: the validating webhook refuses pods that lack their injection.
async fn validating_companion(cluster: &Cluster, injector: &Injector, ca: &str) {
    let url = format!("https://{}", injector.addr);
    // Only the validating webhook (as if the mutating call had been skipped under failurePolicy Ignore).
    cluster.delete(&format!("{MUTATING}/sidecar-injector")).await;
    register(cluster, VALIDATING, &configuration("validatingwebhookconfiguration.yaml", &url, ca)).await;
    let message = first_refusal(cluster, "the validating webhook to take effect", "unchecked").await;
    assert!(
        message.contains("validate.sidecar-injector.io") && message.contains("lacks what template default"),
        "{message}"
    );
    assert!(message.contains("container proxy"), "{message}");
    let opted_out = cluster
        .must_create(PODS, pod("unchecked-opted-out", json!({"sidecar-injector.io/inject": "false"}), json!({})))
        .await;
    assert_eq!(proxies(&opted_out), 0, "opted-out pods are allowed");

    // Both of ours: the pod is created with its sidecar.
    register(cluster, MUTATING, &configuration("mutatingwebhookconfiguration.yaml", &url, ca)).await;
    let created = eventually("both webhooks to take effect", async || {
        let (status, body) = cluster.create(PODS, pod(&unique("checked"), json!({}), json!({}))).await;
        (status == 201).then_some(body)
    })
    .await;
    assert_eq!(proxies(&created), 1);

    // A later mutating webhook that strips our sidecar on every pass: the final pod is refused with our message.
    let (stripper, stripper_ca) = strip_proxy_webhook().await;
    let mut strip = configuration("mutatingwebhookconfiguration.yaml", &format!("https://{stripper}"), &stripper_ca);
    renamed(&mut strip, "zz-strip-webhook", "strip.e2e.example.com");
    register(cluster, MUTATING, &strip).await;
    let message = first_refusal(cluster, "the stripping webhook to take effect", "stripped").await;
    assert!(message.contains("validate.sidecar-injector.io") && message.contains("container proxy"), "{message}");
    assert!(!message.contains("volume sidecar-injector-proxy"), "only what was stripped is named: {message}");
    cluster.delete(&format!("{MUTATING}/zz-strip-webhook")).await;
}

/// A test fixture: a mutating webhook that removes the container named `proxy` from every pod it sees.
async fn strip_proxy_webhook() -> (SocketAddr, String) {
    use base64::Engine as _;
    fixture_webhook(|body: &[u8]| {
        let review: Value = serde_json::from_slice(body).unwrap();
        let request = &review["request"];
        let containers = request["object"]["spec"]["containers"].as_array().cloned().unwrap_or_default();
        let mut response = json!({"uid": request["uid"], "allowed": true});
        if let Some(index) = containers.iter().position(|c| c["name"] == "proxy") {
            let patch = json!([{"op": "remove", "path": format!("/spec/containers/{index}")}]);
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
        }
        response
    })
    .await
}

/// A test fixture: a webhook over TLS on 127.0.0.1 whose `respond` turns each request body into the review's
/// `response`. Returns its address and CA.
async fn fixture_webhook(respond: impl Fn(&[u8]) -> Value + Send + Sync + 'static) -> (SocketAddr, String) {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    let ca = Authority::generate("e2e fixture CA", Duration::from_secs(86400)).unwrap();
    let leaf = ca.issue_server("127.0.0.1", &["127.0.0.1".to_owned()], Duration::from_secs(86400)).unwrap();
    let chain = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let respond = std::sync::Arc::new(respond);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, respond) = (acceptor.clone(), respond.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let respond = respond.clone();
                    async move {
                        use http_body_util::BodyExt;
                        let body = request.into_body().collect().await?.to_bytes();
                        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                            "response": respond(&body)});
                        let mut reply =
                            hyper::Response::new(Full::new(Bytes::from(serde_json::to_vec(&review).unwrap())));
                        reply.headers_mut().insert("content-type", "application/json".parse().unwrap());
                        Ok::<_, hyper::Error>(reply)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
            });
        }
    });
    (addr, ca.cert_pem().to_owned())
}

/// The overlay `certs` writes, applied as the README says (`kubectl apply -k`) to this API server: at the newest
/// release the base as written (no `--kubernetes-version`), at the oldest the overlay for its version. Every object
/// is stored and reads back in the API version the overlay wrote. Nothing runs here (no node): tests/cluster.rs
/// deploys the newest on a node.
#[test]
#[ignore = "needs a kube-apiserver: tests/e2e/apiserver.sh"]
fn the_readme_overlay_applies() {
    let cluster = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests"), work.path().join("manifests"))
        .unwrap();
    let mut certs = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"));
    certs.args(["certs", "--image", "sidecar-injector:dev", "--out", "my-injector"]).current_dir(work.path());
    // The README: a cluster older than the base as written (1.30) gives `certs` its version.
    if !cluster.version.at_least(30) {
        certs.args(["--kubernetes-version", &cluster.version.to_string()]);
    }
    let output = certs.output().unwrap();
    assert!(output.status.success(), "certs: {}", String::from_utf8_lossy(&output.stderr));
    let kubectl = Command::new(SCRIPT).arg("kubectl").output().unwrap();
    let kubectl = String::from_utf8(kubectl.stdout).unwrap().trim().to_owned();
    let run = |args: &[&str]| {
        let output = Command::new(&kubectl)
            .args(args)
            .env("KUBECONFIG", cluster.dir.path().join("kubeconfig"))
            .current_dir(work.path())
            .output()
            .unwrap();
        let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "kubectl {}:\n{printed}", args.join(" "));
        printed
    };
    let applied = run(&["apply", "-k", "my-injector"]);
    let objects = common::kustomized_objects(&run(&["kustomize", "my-injector"]));
    assert!(objects.len() >= 12, "{objects:?}");
    for object in &objects {
        let (name, args) = common::kubectl_get_args(object);
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["-o", "json"]);
        let stored: Value = serde_json::from_str(&run(&args)).unwrap();
        assert_eq!(stored["apiVersion"], object["apiVersion"], "{name}: {applied}");
    }

    // Issue 50: the stored template ConfigMaps are the overlay's files. A template of the user's own, then a
    // renewal (`certs` again, which lists it) and a revision (seeded with a copy): each applied, each stored.
    let stored_templates = |configmap: &str| -> Value {
        let stored = run(&["-n", "sidecar-injector", "get", "configmap", configmap, "-o", "json"]);
        serde_json::from_str::<Value>(&stored).unwrap()["data"].clone()
    };
    let files = |dir: &Path| -> Value {
        let entries = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
        let pairs = entries
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()));
        Value::Object(pairs.map(|(k, v)| (k, Value::from(v))).collect())
    };
    let templates = work.path().join("my-injector/templates");
    assert_eq!(stored_templates("sidecar-injector-templates"), files(&templates), "the shipped ones, seeded");
    let demo = std::fs::read_to_string(templates.join("demo.yaml")).unwrap();
    std::fs::write(templates.join("mine.yaml"), demo.replace("demo-sidecar", "mine-sidecar")).unwrap();
    for extra in [&[][..], &["--revision", "canary"][..]] {
        let output = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
            .args(["certs", "--out", "my-injector"])
            .args(extra)
            .current_dir(work.path())
            .output()
            .unwrap();
        assert!(output.status.success(), "certs again: {}", String::from_utf8_lossy(&output.stderr));
        run(&["apply", "-k", "my-injector"]);
        let stored = stored_templates("sidecar-injector-templates");
        assert_eq!(stored, files(&templates), "the overlay's templates, the user's own among them");
        assert!(stored["mine.yaml"].is_string());
    }
    let canary = work.path().join("my-injector/revisions/canary/templates");
    assert_eq!(stored_templates("sidecar-injector-templates-canary"), files(&canary));
    assert!(files(&canary)["mine.yaml"].is_string(), "the canary starts as a copy of the user's templates");
}

/// Where the review recorded from this API server is kept: the tests and benchmarks read it as what a real API
/// server sends.
fn recorded_review(version: KubeVersion) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/corpus/reviews/apiserver-{version}-pod-create.json"))
}

/// Records the AdmissionReview the API server sends a webhook for a `kubectl create` of a pod, byte for byte.
/// With `E2E_RECORD=1` it replaces the recording in `tests/corpus/reviews`; without, it checks that the one kept
/// there has the same shape (the same fields, in the same places) as what the API server sends today.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/e2e/apiserver.sh"]
async fn record_the_api_servers_review_of_a_pod_create() {
    let cluster = Cluster::start();
    let recorded = std::sync::Arc::new(std::sync::Mutex::new(None::<Vec<u8>>));
    let keep = recorded.clone();
    let (addr, ca) = fixture_webhook(move |body: &[u8]| {
        let review: Value = serde_json::from_slice(body).unwrap();
        *keep.lock().unwrap() = Some(body.to_vec());
        json!({"uid": review["request"]["uid"], "allowed": true})
    })
    .await;
    for name in ["webhook-test", "webhook-probe"] {
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        cluster.must_create("/api/v1/namespaces", namespace).await;
    }
    let mut recorder = configuration("mutatingwebhookconfiguration.yaml", &format!("https://{addr}"), &ca);
    renamed(&mut recorder, "recorder", "recorder.e2e.example.com");
    recorder["webhooks"][0]["namespaceSelector"] = json!({});
    recorder["webhooks"][0]["objectSelector"] = json!({});
    register(&cluster, MUTATING, &recorder).await;
    let demo = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "demo"}},
               "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}})
    };
    eventually("the recording webhook to be called", async || {
        cluster.must_create("/api/v1/namespaces/webhook-probe/pods", demo(&unique("probe"))).await;
        recorded.lock().unwrap().take()
    })
    .await;
    // What `kubectl create -f demo.yaml` sends: kubectl names itself the field manager.
    cluster.must_create("/api/v1/namespaces/webhook-test/pods?fieldManager=kubectl-create", demo("demo")).await;
    let body = recorded.lock().unwrap().take().expect("the webhook was called for the pod");
    let recording = recorded_review(cluster.version);
    if std::env::var_os("E2E_RECORD").is_some() {
        std::fs::write(&recording, &body).unwrap();
        eprintln!("recorded into {}", recording.display());
        return;
    }
    let fresh: Value = serde_json::from_slice(&body).unwrap();
    let kept = std::fs::read(&recording)
        .unwrap_or_else(|e| panic!("{}: {e}: record it with E2E_RECORD=1", recording.display()));
    let kept: Value = serde_json::from_slice(&kept).unwrap();
    assert_eq!(shape(&kept), shape(&fresh), "the recorded review is out of date: run this test with E2E_RECORD=1");
}

/// The paths of every field of `value` (object keys and list positions), without the values.
fn shape(value: &Value) -> std::collections::BTreeSet<String> {
    fn walk(value: &Value, at: String, out: &mut std::collections::BTreeSet<String>) {
        match value {
            Value::Object(members) => members.iter().for_each(|(k, v)| walk(v, format!("{at}/{k}"), out)),
            Value::Array(items) => items.iter().enumerate().for_each(|(i, v)| walk(v, format!("{at}/{i}"), out)),
            _ => {
                out.insert(at);
            }
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(value, String::new(), &mut out);
    out
}

/// Issue 23 against the real API server. A Job's pod follows its template's `jobs` setting: from 1.29 the sidecar
/// is a native sidecar (an init container with `restartPolicy: Always`, which the API server stores); the 1.20 API
/// server runs no native sidecars, so the injector is told its version and falls back to skipping them; a template
/// that says `jobs: skip` skips them at every version. A namespace whose ResourceQuota covers `limits.cpu` admits injected pods,
/// because every container the template adds has a CPU limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/e2e/apiserver.sh"]
async fn jobs_and_cpu_quotas_against_a_real_api_server() {
    let cluster = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    let templates = work.path().join("templates");
    std::fs::create_dir(&templates).unwrap();
    let builtin = sidecar_injector_core::template::BUILTIN_SOURCE;
    std::fs::write(templates.join("default.yaml"), builtin).unwrap();
    std::fs::write(templates.join("skip-jobs.yaml"), format!("jobs: skip\n{builtin}")).unwrap();
    let version = format!("--kubernetes-version={}", cluster.version);
    let (injector, ca) = Injector::start(work.path(), &templates, &[&version]);

    let labels = json!({"kubernetes.io/metadata.name": "e2e-in", "sidecar-injector.io/inject": "enabled"});
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "e2e-in", "labels": labels}});
    cluster.must_create("/api/v1/namespaces", namespace).await;
    let quotas = "/api/v1/namespaces/e2e-in/resourcequotas";
    let hard = json!({"limits.cpu": "20"});
    let quota =
        json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "cpu"}, "spec": {"hard": hard}});
    cluster.must_create(quotas, quota).await;
    // No controller-manager runs here, and quota admission refuses pods while a quota has no usage: write the
    // status its controller would.
    let (_, mut quota) = cluster.call(Method::GET, &format!("{quotas}/cpu"), None).await;
    quota["status"] = json!({"hard": hard, "used": {"limits.cpu": "0"}});
    let (status, body) = cluster.call(Method::PUT, &format!("{quotas}/cpu/status"), Some(&quota)).await;
    assert_eq!(status, 200, "{body}");
    register(
        &cluster,
        MUTATING,
        &configuration("mutatingwebhookconfiguration.yaml", &format!("https://{}", injector.addr), &ca),
    )
    .await;

    let app_pod = |name: &str, annotations: Value| {
        let mut pod = pod(name, annotations, json!({}));
        pod["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "100m"}});
        pod
    };
    let job_pod = |name: &str, annotations: Value| {
        let mut pod = app_pod(name, annotations);
        pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "backup-28391",
            "uid": "0d1c9a9e-0000-4000-8000-000000000001", "controller": true}]);
        pod["spec"]["restartPolicy"] = json!("Never");
        pod
    };

    // The quota admits the injected pod: without a CPU limit on each added container it would refuse it
    // ("must specify limits.cpu").
    let stored = eventually("the webhook configuration to take effect", async || {
        let (status, body) = cluster.create(PODS, app_pod(&unique("quota"), json!({}))).await;
        assert_eq!(status, 201, "{body}");
        (proxies(&body) > 0).then_some(body)
    })
    .await;
    for list in ["containers", "initContainers"] {
        for container in stored["spec"][list].as_array().unwrap() {
            assert!(container["resources"]["limits"]["cpu"].is_string(), "{container}");
        }
    }

    // A Job's pod (and a CronJob's, whose pods its Jobs own): a native sidecar where the release runs them (the
    // proxy among the init containers, after proxy-init, restarting always), admitted without it at 1.20.
    let job = cluster.must_create(PODS, job_pod("job", json!({}))).await;
    if cluster.version.at_least(29) {
        assert_eq!(proxies(&job), 0, "{job}");
        assert_eq!(container_names(&job, "initContainers"), ["proxy-init", "proxy"], "{job}");
        assert_eq!(job["spec"]["initContainers"][1]["restartPolicy"], "Always", "{job}");
        assert!(job["metadata"]["annotations"]["sidecar-injector.io/status"].is_string(), "{job}");
    } else {
        assert_eq!((proxies(&job), container_names(&job, "initContainers")), (0, vec![]), "{job}");
        assert!(job["metadata"]["annotations"].get("sidecar-injector.io/status").is_none(), "{job}");
    }
    // With a template that skips Jobs: the same, while its other pods are injected.
    let skip = json!({"sidecar-injector.io/template": "skip-jobs"});
    let cron = cluster.must_create(PODS, job_pod("cron-job", skip.clone())).await;
    assert_eq!((proxies(&cron), container_names(&cron, "initContainers")), (0, vec![]), "{cron}");
    let other = cluster.must_create(PODS, app_pod("not-a-job", skip)).await;
    assert_eq!(proxies(&other), 1, "{other}");
}

/// The proxy image of a stored pod, and the revision its status annotation names.
fn proxy_and_revision(pod: &Value) -> (String, String) {
    let proxy = pod["spec"]["containers"].as_array().unwrap().iter().find(|c| c["name"] == "proxy");
    let image = proxy.map(|c| c["image"].as_str().unwrap().to_owned()).unwrap_or_default();
    let stamp = pod["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap_or_default();
    let revision = sidecar_injector_core::Stamp::parse(stamp).map(|s| s.revision().to_owned()).unwrap_or_default();
    (image, revision)
}

/// Two revisions served side by side, routed by namespace label exactly as `manifests/revision-canary` routes
/// them; moving a namespace is one label, and an edit of the canary reaches only the canary's namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/e2e/apiserver.sh"]
async fn revisions_against_a_real_api_server() {
    let cluster = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    let builtin = sidecar_injector_core::template::BUILTIN_SOURCE;
    let (stable, canary) = (work.path().join("stable"), work.path().join("canary"));
    for (dir, image) in [(&stable, "proxy:1.4.2"), (&canary, "proxy:1.5.0-rc1")] {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join("default.yaml"), builtin.replace("proxy:1.4.2", image)).unwrap();
    }
    let canary_flag = format!("--template-dir=canary={}", canary.display());
    let (injector, ca) = Injector::start(work.path(), &stable, &[&canary_flag]);
    let url = format!("https://{}", injector.addr);
    for (file, collection) in
        [("mutatingwebhookconfiguration.yaml", MUTATING), ("validatingwebhookconfiguration.yaml", VALIDATING)]
    {
        register(&cluster, collection, &configuration_with(file, Some("revision-canary"), &url, &ca)).await;
    }
    // `on-default` opted in; `on-canary` opted in and moved to the canary (the rev label wins).
    for (name, revision) in [("on-default", None), ("on-canary", Some("canary"))] {
        let mut labels = json!({"kubernetes.io/metadata.name": name, "sidecar-injector.io/inject": "enabled"});
        if let Some(revision) = revision {
            labels["sidecar-injector.io/rev"] = json!(revision);
        }
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
        cluster.must_create("/api/v1/namespaces", namespace).await;
    }
    let served = async |namespace: &str, image: &str, revision: &str| {
        let pods = format!("/api/v1/namespaces/{namespace}/pods");
        eventually(&format!("{namespace}: {image} from {revision}"), async || {
            let (status, body) = cluster.create(&pods, pod(&unique("web"), json!({}), json!({}))).await;
            assert_eq!(status, 201, "{body}");
            assert!(proxies(&body) <= 1, "injected once: {body}");
            (proxy_and_revision(&body) == (format!("ghcr.io/sidecar-injector/{image}"), revision.to_owned()))
                .then_some(body)
        })
        .await
    };
    served("on-default", "proxy:1.4.2", "default").await;
    served("on-canary", "proxy:1.5.0-rc1", "canary").await;

    // An edit of the canary's templates reaches the canary's namespace only.
    std::fs::write(canary.join("default.yaml"), builtin.replace("proxy:1.4.2", "proxy:1.5.0-rc2")).unwrap();
    served("on-canary", "proxy:1.5.0-rc2", "canary").await;
    let (status, body) =
        cluster.create("/api/v1/namespaces/on-default/pods", pod(&unique("web"), json!({}), json!({}))).await;
    assert_eq!(
        (status, proxy_and_revision(&body)),
        (201, ("ghcr.io/sidecar-injector/proxy:1.4.2".to_owned(), "default".to_owned()))
    );

    // One label moves a namespace to the canary, and its removal back.
    let label = async |revision: Value| {
        let patch = json!({"metadata": {"labels": {"sidecar-injector.io/rev": revision}}});
        let (status, body) = cluster.call(Method::PATCH, "/api/v1/namespaces/on-default", Some(&patch)).await;
        assert_eq!(status, 200, "{body}");
    };
    label(json!("canary")).await;
    served("on-default", "proxy:1.5.0-rc2", "canary").await;
    label(Value::Null).await;
    served("on-default", "proxy:1.4.2", "default").await;
}

/// The Helm chart renders the objects of the overlay `sidecar-injector certs` writes, given the Secret and its CA
/// (tests/e2e/helm.rs).
#[test]
#[ignore = "needs helm and kubectl: tests/e2e/helm.sh build, tests/e2e/apiserver.sh build"]
fn the_helm_chart_renders_the_certs_overlay() {
    helm::renders_the_certs_overlay();
}

/// The Helm chart renders `manifests/cert-manager`, and with revisions what `manifests/revision-canary` adds.
#[test]
#[ignore = "needs helm and kubectl: tests/e2e/helm.sh build, tests/e2e/apiserver.sh build"]
fn the_helm_chart_renders_the_cert_manager_overlay_and_revisions() {
    helm::renders_the_cert_manager_overlay_and_revisions();
}

/// The Helm chart's revision tags are what `sidecar-injector tag set` makes (tests/e2e/helm.rs).
#[test]
#[ignore = "needs helm: tests/e2e/helm.sh build"]
fn the_helm_chart_renders_revision_tags_as_tag_set_makes_them() {
    helm::renders_revision_tags_as_tag_set_makes_them();
}

/// `helm lint --strict` is clean, and values the chart cannot render are refused with the reason.
#[test]
#[ignore = "needs helm: tests/e2e/helm.sh build"]
fn the_helm_chart_lints_clean() {
    helm::lints_clean();
}
