//! A real node: a one-node Kubernetes cluster of the newest release the suite builds (`tests/e2e/cluster.sh`: the
//! API server, the controllers, the scheduler, a kubelet on containerd and runc, kube-proxy) judges the drop-in
//! Deployment as the API server judges a pod. The image is built from the binary under test (`manifests/image.sh`)
//! and imported; the README's deploy path runs as written (its shell blocks, read from README.md): the base as
//! written, every object stored as the base says it; the pods we inject must start, and the sidecar must share
//! them; what needs a current cluster (native sidecars, the held app, `matchConditions`, the preStop sleep, the
//! PodDisruptionBudget, pod-level resources) is judged by what the kubelet and the API server do. Nothing is
//! pulled: a pull attempt fails at once (containerd's registries are behind a proxy that is not there) and fails
//! the test. With `E2E_KUBERNETES=oldest E2E_NODE=1` the same test runs on 1.20, with the change the README gives
//! for an older cluster.
//!
//! `cargo test --release --test cluster -- --include-ignored`, as root (tests/e2e/README.md). The first run builds
//! the Kubernetes binaries from the Go module proxy into `~/.cache/sidecar-injector-e2e` (tests/e2e/README.md).
//!
//! One test runs the scenarios in order on one cluster (bringing it up costs 30 to 60 s), then takes it down and
//! checks that the host is as it was (sysctls, iptables chains and rules, links, routes, mounts, paths, cgroups).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{kubectl_get_args, kustomized_objects};
use serde_json::Value;
use sidecar_injector_core::validation::KubeVersion;

mod common;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/cluster.sh");
const APISERVER_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/apiserver.sh");
const BINARY: &str = env!("CARGO_BIN_EXE_sidecar-injector");

/// The binary the injector's image carries: the test's own, unless `CLUSTER_IMAGE_BINARY` names another (the
/// profile-guided build the image ships, `manifests/pgo-build.sh`, which CI deploys). The commands the README runs
/// on the host (`sidecar-injector certs`) are the test's own either way.
fn image_binary() -> PathBuf {
    std::env::var_os("CLUSTER_IMAGE_BINARY").map_or_else(|| PathBuf::from(BINARY), PathBuf::from)
}

/// The Kubernetes release of the cluster (`apiserver.sh release`: `E2E_KUBERNETES`, the newest unless told).
fn release() -> KubeVersion {
    static RELEASE: std::sync::OnceLock<KubeVersion> = std::sync::OnceLock::new();
    *RELEASE.get_or_init(|| {
        let output = Command::new(APISERVER_SCRIPT).arg("release").output().unwrap();
        assert!(output.status.success(), "apiserver.sh release: {}", text(&output));
        String::from_utf8(output.stdout).unwrap().trim().parse().unwrap()
    })
}

/// A cluster older than the base as written needs (1.30: `matchConditions` GA, the preStop `sleep` on by default):
/// the README's deploy path then tells `certs` its version.
fn older_cluster() -> bool {
    !release().at_least(30)
}

/// What the README adds to the `certs` line for this cluster: nothing for a current one.
fn certs_version_flag() -> String {
    if older_cluster() { format!(" --kubernetes-version {}", release()) } else { String::new() }
}
/// The image name the README deploys.
const IMAGE: &str = "sidecar-injector:dev";

/// The cluster, taken down when dropped (a test that panics leaves nothing running either).
struct Cluster {
    dir: PathBuf,
    /// Where the README's commands run: `manifests` links to the repository's, `my-injector` is written there.
    work: PathBuf,
    bin: PathBuf,
    up: bool,
}

impl Cluster {
    fn up(dir: &Path) -> Cluster {
        let output = Command::new(SCRIPT).arg("up").arg(dir).output().unwrap();
        assert!(output.status.success(), "cluster.sh up failed:\n{}", text(&output));
        let work = dir.join("work");
        let bin = dir.join("bin");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(Path::new(ROOT).join("manifests"), work.join("manifests")).unwrap();
        // The README's commands call `sidecar-injector` from the PATH (after `cargo install --path .`).
        std::os::unix::fs::symlink(BINARY, bin.join("sidecar-injector")).unwrap();
        Cluster { dir: dir.to_owned(), work, bin, up: true }
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        let path = format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap_or_default());
        command.env("KUBECONFIG", self.dir.join("kubeconfig")).env("PATH", path).current_dir(&self.work);
        command.stdin(Stdio::null());
        command
    }

    /// A shell script, as a user would paste it: bash, stopping at the first failure.
    fn shell(&self, script: &str) -> Output {
        self.command("bash").args(["-euo", "pipefail", "-c", script]).output().unwrap()
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        self.command("kubectl").args(args).output().unwrap()
    }

    /// kubectl that must succeed: its standard output.
    fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(output.status.success(), "kubectl {}:\n{}", args.join(" "), text(&output));
        String::from_utf8(output.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&args)).unwrap()
    }

    /// kubectl with `input` on its standard input.
    fn kubectl_with_input(&self, args: &[&str], input: &str) -> Output {
        self.with_input("kubectl", args, input)
    }

    /// `program` (kubectl, sidecar-injector) with `input` on its standard input.
    fn with_input(&self, program: &str, args: &[&str], input: &str) -> Output {
        let mut child = self
            .command(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    /// Applies YAML from standard input.
    fn apply(&self, yaml: &str) {
        let output = self.kubectl_with_input(&["apply", "-f", "-"], yaml);
        assert!(output.status.success(), "kubectl apply:\n{}\n{yaml}", text(&output));
    }

    /// Takes the cluster down; what differs on the host afterwards (nothing, when all is put back).
    fn down(&mut self) -> Vec<String> {
        self.up = false;
        let output = Command::new(SCRIPT).arg("down").arg(&self.dir).output().unwrap();
        assert!(output.status.success(), "cluster.sh down failed:\n{}", text(&output));
        let output = Command::new(SCRIPT).arg("host-diff").arg(&self.dir).output().unwrap();
        assert!(output.status.success(), "cluster.sh host-diff failed:\n{}", text(&output));
        String::from_utf8(output.stdout).unwrap().lines().map(str::to_owned).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.up {
            let _ = Command::new(SCRIPT).arg("down").arg(&self.dir).status();
        }
    }
}

/// Builds what the cluster needs (cached), brings it up, builds the image from the binary under test (`image.sh`, as
/// the Dockerfile's: checked), imports it, and runs the README's deploy block as written (for a cluster older than
/// 1.30, with the change it documents).
impl Cluster {
    fn up_with_the_readme_deploy(dir: &Path) -> Cluster {
        let output = Command::new(SCRIPT).arg("build").output().unwrap();
        assert!(output.status.success(), "cluster.sh build failed:\n{}", text(&output));
        let cluster = Cluster::up(dir);
        let archive = dir.join("image.tar");
        build_image(IMAGE, &image_binary(), &archive);
        check_image_matches_the_dockerfile(&image_config(&archive));
        cluster.import(&archive);
        let deploy = readme_block("deploy");
        let certs_line =
            deploy.lines().find(|l| l.starts_with("sidecar-injector certs")).expect("a certs line").to_owned();
        let deploy = deploy.replace(&certs_line, &format!("{certs_line}{}", certs_version_flag()));
        let output = cluster.shell(&deploy);
        assert!(output.status.success(), "the README's deploy block failed:\n{deploy}\n{}", text(&output));
        cluster
    }

    /// Imports an image archive into the node's containerd.
    fn import(&self, archive: &Path) {
        let output = Command::new(SCRIPT).arg("import").arg(&self.dir).arg(archive).output().unwrap();
        assert!(output.status.success(), "import:\n{}", text(&output));
    }
}

/// The image `tag` of `binary`, without a daemon (`manifests/image.sh`), written to `archive`.
fn build_image(tag: &str, binary: &Path, archive: &Path) {
    let output = Command::new(Path::new(ROOT).join("manifests/image.sh"))
        .args(["--tag", tag, "--binary"])
        .arg(binary)
        .arg("--out")
        .arg(archive)
        .output()
        .unwrap();
    assert!(output.status.success(), "manifests/image.sh:\n{}", text(&output));
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The shell block of README.md that follows the marker `<!-- cluster test: NAME -->`.
fn readme_block(name: &str) -> String {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let marker = format!("<!-- cluster test: {name} -->");
    let after = readme.split_once(&marker).unwrap_or_else(|| panic!("README.md has no {marker}")).1;
    let block =
        after.trim_start().strip_prefix("```sh\n").unwrap_or_else(|| panic!("{marker} is not before a sh block"));
    block.split_once("\n```").unwrap().0.to_owned()
}

/// Polls `check` every second until it returns `Some`, for at most `limit`.
fn wait_for<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn names<'a>(pod: &'a Value, list: &str) -> Vec<&'a str> {
    pod["spec"][list].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect()
}

/// Every container of the pod is running and ready.
fn all_ready(pod: &Value) -> bool {
    let statuses = pod["status"]["containerStatuses"].as_array();
    statuses.is_some_and(|s| !s.is_empty() && s.iter().all(|c| c["ready"] == true && !c["state"]["running"].is_null()))
}

/// The Dockerfile's last-stage instruction `name`, as written.
fn dockerfile(name: &str) -> Vec<String> {
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).unwrap();
    let last_stage = dockerfile.rsplit_once("\nFROM ").unwrap().1;
    last_stage.lines().filter_map(|l| l.strip_prefix(&format!("{name} "))).map(str::to_owned).collect()
}

/// The image's config (`config` of the OCI image config), read from the archive `manifests/image.sh` wrote.
fn image_config(archive: &Path) -> Value {
    let read = |member: &str| -> Value {
        let output = Command::new("tar").arg("-xOf").arg(archive).arg(member).output().unwrap();
        assert!(output.status.success(), "{member} in {}: {}", archive.display(), text(&output));
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let blob = |digest: &Value| format!("blobs/{}", digest.as_str().unwrap().replacen(':', "/", 1));
    let index = read("index.json");
    let manifest = read(&blob(&index["manifests"][0]["digest"]));
    read(&blob(&manifest["config"]["digest"]))["config"].clone()
}

/// The image `manifests/image.sh` builds is the Dockerfile's: its user, entrypoint, command, ports and labels.
fn check_image_matches_the_dockerfile(config: &Value) {
    let json_array = |text: &str| serde_json::from_str::<Value>(text).unwrap();
    assert_eq!(config["User"], dockerfile("USER")[0], "{config}");
    assert_eq!(config["Entrypoint"], json_array(&dockerfile("ENTRYPOINT")[0]), "{config}");
    assert_eq!(config["Cmd"], json_array(&dockerfile("CMD")[0]), "{config}");
    for port in dockerfile("EXPOSE")[0].split_whitespace() {
        assert!(config["ExposedPorts"].get(format!("{port}/tcp")).is_some(), "port {port}: {config}");
    }
    let labels = dockerfile("LABEL");
    assert!(!labels.is_empty());
    for label in labels {
        let (key, value) = label.split_once('=').unwrap();
        assert_eq!(config["Labels"][key], value.trim_matches('"'), "{config}");
    }
}

/// What the overlay deploys differs from the base only where the README says a user changes it: the image, and
/// for an older cluster what `certs --kubernetes-version` patches out (the same objects, replicas, probes,
/// security contexts, resources, volumes, PodDisruptionBudget and Service).
fn check_overlay_changes_only_what_the_readme_says(cluster: &Cluster) {
    let build = |dir: &str| kustomized(cluster, dir);
    let find = |objects: &[Value], kind: &str| -> Value {
        objects.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == "sidecar-injector").unwrap().clone()
    };
    let base = build("manifests/base");
    let overlay = build("my-injector");
    let mut base_deployment = find(&base, "Deployment");
    let mut deployment = find(&overlay, "Deployment");
    let container = &mut deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], IMAGE);
    let args: Vec<Value> = container["args"].as_array().unwrap().clone();
    let base_container = &mut base_deployment["spec"]["template"]["spec"]["containers"][0];
    let mut expected_args = base_container["args"].as_array().unwrap().clone();
    expected_args.push(format!("--kubernetes-version={}", release()).into());
    expected_args.push("--shutdown-delay=7s".into());
    assert_eq!(args, expected_args, "the serve arguments");
    assert!(container.get("lifecycle").is_none(), "the preStop sleep is patched out below 1.30");
    for field in ["image", "args", "lifecycle"] {
        container.as_object_mut().unwrap().remove(field);
        base_container.as_object_mut().unwrap().remove(field);
    }
    assert_eq!(deployment, base_deployment, "the Deployment differs beyond the image, args and preStop");
    for kind in ["Service", "NetworkPolicy", "ServiceAccount", "Namespace"] {
        assert_eq!(find(&overlay, kind), find(&base, kind), "{kind}");
    }
    let (mut pdb, mut base_pdb) = (find(&overlay, "PodDisruptionBudget"), find(&base, "PodDisruptionBudget"));
    assert_eq!(pdb["apiVersion"], "policy/v1beta1");
    base_pdb["spec"].as_object_mut().unwrap().remove("unhealthyPodEvictionPolicy");
    pdb["apiVersion"] = base_pdb["apiVersion"].clone();
    assert_eq!(pdb, base_pdb, "the PodDisruptionBudget differs beyond its apiVersion");
    let (mut hpa, base_hpa) = (find(&overlay, "HorizontalPodAutoscaler"), find(&base, "HorizontalPodAutoscaler"));
    assert_eq!(hpa["apiVersion"], "autoscaling/v2beta2");
    hpa["apiVersion"] = base_hpa["apiVersion"].clone();
    assert_eq!(hpa, base_hpa);
}

/// The objects a kustomization deploys: `kubectl kustomize DIR`.
fn kustomized(cluster: &Cluster, dir: &str) -> Vec<Value> {
    kustomized_objects(&cluster.kubectl_ok(&["kustomize", dir]))
}

/// The leaves of `written` that `stored` lacks or holds with another value, as paths: the API server dropped or
/// changed what the manifest says. Lists are compared item by item (the API server keeps their order).
fn not_stored(written: &Value, stored: &Value, at: &str, out: &mut Vec<String>) {
    match (written, stored) {
        (Value::Object(members), Value::Object(kept)) => {
            for (key, member) in members {
                match kept.get(key) {
                    Some(kept) => not_stored(member, kept, &format!("{at}.{key}"), out),
                    None => out.push(format!("{at}.{key}: dropped")),
                }
            }
        }
        (Value::Array(items), Value::Array(kept)) if items.len() == kept.len() => {
            for (i, (item, kept)) in items.iter().zip(kept).enumerate() {
                not_stored(item, kept, &format!("{at}[{i}]"), out);
            }
        }
        (written, stored) if written == stored => {}
        (written, stored) => out.push(format!("{at}: written {written}, stored {stored}")),
    }
}

/// The base as written, on a cluster of the release it is for: the overlay `certs` wrote deploys the base's
/// objects changed only where the README says (the image, each webhook's caBundle, and the TLS Secret it adds),
/// and the API server stored every field of every object as the base writes it: a field the cluster ignores,
/// drops or refuses fails here, not in a user's cluster.
fn check_the_base_as_written_is_what_runs(cluster: &Cluster) {
    let base = kustomized(cluster, "manifests/base");
    let overlay = kustomized(cluster, "my-injector");
    let key = |o: &Value| kubectl_get_args(o).0;
    let mut overlay_keys: Vec<String> = overlay.iter().map(key).collect();
    let mut expected_keys: Vec<String> = base.iter().map(key).collect();
    expected_keys.push("Secret/sidecar-injector-tls".to_owned());
    overlay_keys.sort();
    expected_keys.sort();
    assert_eq!(overlay_keys, expected_keys, "the overlay deploys the base's objects and the TLS Secret");
    let mut problems = Vec::new();
    for written in &overlay {
        let (name, args) = kubectl_get_args(written);
        let mut deployed = written.clone();
        if written["kind"] == "Deployment" {
            let container = &mut deployed["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(container["image"], IMAGE);
            container["image"] = Value::Null;
        }
        for webhook in deployed.get_mut("webhooks").and_then(Value::as_array_mut).into_iter().flatten() {
            assert!(webhook["clientConfig"]["caBundle"].as_str().is_some_and(|b| !b.is_empty()), "{name}");
            webhook["clientConfig"].as_object_mut().unwrap().remove("caBundle");
        }
        if let Some(original) = base.iter().find(|o| key(o) == name) {
            let mut original = original.clone();
            if original["kind"] == "Deployment" {
                original["spec"]["template"]["spec"]["containers"][0]["image"] = Value::Null;
            }
            assert_eq!(deployed, original, "{name}: the overlay changes more than the image and the caBundle");
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let stored = cluster.json(&args);
        let mut written = written.clone();
        // kustomize folds a Secret's base64 into lines; the API server stores it unfolded.
        if written["kind"] == "Secret" {
            for value in written["data"].as_object_mut().unwrap().values_mut() {
                *value = Value::from(value.as_str().unwrap().split_whitespace().collect::<String>());
            }
        }
        not_stored(&written, &stored, &name, &mut problems);
    }
    assert!(
        problems.is_empty(),
        "fields of the base the API server did not store as written:\n{}",
        problems.join("\n")
    );
    // The running pods carry what the base sets for a current cluster: the preStop sleep (the drain) and the
    // bound token, projected by the kubelet.
    let pods =
        cluster.json(&["-n", "sidecar-injector", "get", "pods", "-l", "app.kubernetes.io/name=sidecar-injector"]);
    for pod in pods["items"].as_array().unwrap() {
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["lifecycle"]["preStop"]["sleep"]["seconds"], 5, "{}", pod["spec"]);
        let volumes = pod["spec"]["volumes"].as_array().unwrap();
        let projected = volumes.iter().find(|v| v["name"] == "api-access").expect("the api-access volume");
        assert!(projected["projected"]["sources"][0]["serviceAccountToken"].is_object(), "{projected}");
    }
}

/// The Deployment as it runs: the shipped replicas Ready, non-root, a read-only root filesystem, the probes.
fn check_the_injector_runs_as_shipped(cluster: &Cluster) {
    let deployment = cluster.json(&["-n", "sidecar-injector", "get", "deployment", "sidecar-injector"]);
    assert_eq!(deployment["status"]["readyReplicas"], 2, "{}", deployment["status"]);
    // A rollout's old replica lingers while it drains (the shutdown delay, then the grace period): wait it out.
    let pods = wait_for(Duration::from_secs(90), "only the shipped two replicas", || {
        let pods =
            cluster.json(&["-n", "sidecar-injector", "get", "pods", "-l", "app.kubernetes.io/name=sidecar-injector"]);
        let pods = pods["items"].as_array().unwrap().clone();
        (pods.len() == 2).then_some(pods)
    });
    // The image imported first, or the one an upgrade moved to (`check_upgrade_in_place`).
    let image = &deployment["spec"]["template"]["spec"]["containers"][0]["image"];
    assert!(image == IMAGE || image == NEXT_IMAGE, "{image}");
    for pod in &pods {
        assert!(all_ready(pod), "{}", pod["status"]);
        let container = &pod["spec"]["containers"][0];
        assert_eq!(&container["image"], image);
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(pod["spec"]["securityContext"]["runAsUser"], 65532);
        assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0, "{}", pod["status"]);
    }
    // The Service reaches both replicas (the API server calls them through it).
    let endpoints = cluster.json(&["-n", "sidecar-injector", "get", "endpoints", "sidecar-injector"]);
    let addresses = endpoints["subsets"][0]["addresses"].as_array().map_or(0, Vec::len);
    assert_eq!(addresses, 2, "{endpoints}");
    cluster.kubectl_ok(&["-n", "sidecar-injector", "get", "poddisruptionbudget", "sidecar-injector"]);
    // Each replica is serving the shipped templates for this version: the ones that need 1.29 are left out.
    let pod = pods[0]["metadata"]["name"].as_str().unwrap();
    let log = cluster.kubectl_ok(&["-n", "sidecar-injector", "logs", pod]);
    assert!(log.contains("demo") && log.contains("default"), "{log}");
}

/// A Deployment of a test app in the injected namespace: every container of every pod Running and Ready, the
/// sidecar beside the app, the app reading it over localhost and through the volume the template adds.
fn check_injected_pods_start_and_share(cluster: &Cluster) {
    cluster.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: shop, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: shop}}
  template:
    metadata:
      labels: {app: shop}
      annotations: {sidecar-injector.io/template: demo}
    spec:
      containers:
        - name: app
          image: busybox:1.36
          # Ready once it has logged the sidecar's answer (so the log check below does not race it).
          command: [sh, -c, 'until wget -qO /tmp/answer http://127.0.0.1:15000/; do sleep 1; done; cat /tmp/answer; touch /tmp/answered; exec sleep 3600']
          readinessProbe:
            exec: {command: [test, -f, /tmp/answered]}
            periodSeconds: 1
"#,
    );
    let pods = wait_for(Duration::from_secs(120), "the shop Deployment's pods Ready", || {
        let pods = cluster.json(&["-n", "demo", "get", "pods", "-l", "app=shop"]);
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        (items.len() == 2 && items.iter().all(all_ready)).then_some(items)
    });
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().unwrap();
        assert_eq!(names(pod, "containers"), ["app", "demo-sidecar"], "{name}");
        assert!(pod["metadata"]["annotations"]["sidecar-injector.io/status"].is_string(), "{name}");
        // `kubectl logs` without -c reads the app (the default-container annotation), which logged what the
        // sidecar answered over localhost.
        let log = cluster.kubectl_ok(&["-n", "demo", "logs", name]);
        assert!(log.contains(&format!("hello from the sidecar of demo/{name}")), "{name}: {log}");
        // The volume the template adds is mounted in both: the app reads the sidecar's file.
        let file =
            cluster.kubectl_ok(&["-n", "demo", "exec", name, "-c", "app", "--", "cat", "/var/run/demo/index.html"]);
        assert!(file.contains(name), "{file}");
    }
}

/// Pods that must not get the sidecar, and a Job that must finish.
fn check_what_is_not_injected(cluster: &Cluster) {
    let pod = |namespace: &str, name: &str, annotations: &str| {
        format!(
            r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
  annotations: {{{annotations}}}
spec:
  containers:
    - {{name: app, image: "busybox:1.36", command: [sleep, "3600"]}}
"#
        )
    };
    cluster.kubectl_ok(&["create", "namespace", "plain"]);
    cluster.apply(&pod(
        "demo",
        "opted-out",
        r#"sidecar-injector.io/inject: "false", sidecar-injector.io/template: demo"#,
    ));
    cluster.apply(&pod("plain", "not-opted-in", "sidecar-injector.io/template: demo"));
    for (namespace, name) in [("demo", "opted-out"), ("plain", "not-opted-in")] {
        let pod = wait_for(Duration::from_secs(60), name, || {
            let pod = cluster.json(&["-n", namespace, "get", "pod", name]);
            all_ready(&pod).then_some(pod)
        });
        assert_eq!(names(&pod, "containers"), ["app"], "{namespace}/{name}");
        assert!(pod["metadata"]["annotations"].get("sidecar-injector.io/status").is_none());
    }
    check_a_job_completes(cluster);
}

/// A Job whose pod names the demo template, whose `jobs` is `native-sidecar`. From 1.29 the sidecar is a native
/// sidecar: the app reads it over localhost while the Job runs (so it ran during the Job), and the Job completes
/// (so it ended with the app). Below 1.29 (`--kubernetes-version`) the pod is admitted without the sidecar and the
/// Job completes.
fn check_a_job_completes(cluster: &Cluster) {
    cluster.apply(
        r#"
apiVersion: batch/v1
kind: Job
metadata: {name: once, namespace: demo}
spec:
  backoffLimit: 0
  template:
    metadata: {annotations: {sidecar-injector.io/template: demo}}
    spec:
      restartPolicy: Never
      containers:
        - name: app
          image: busybox:1.36
          # The sidecar's answer where there is one (at most 30 tries), then done.
          command: [sh, -c, 'for i in $(seq 30); do wget -qO- http://127.0.0.1:15000/ && break; sleep 1; done; echo done']
"#,
    );
    cluster.kubectl_ok(&["-n", "demo", "wait", "--for=condition=complete", "job/once", "--timeout=120s"]);
    let pods = cluster.json(&["-n", "demo", "get", "pods", "-l", "job-name=once"]);
    let pod = &pods["items"][0];
    assert_eq!(names(pod, "containers"), ["app"], "{}", pod["spec"]);
    let name = pod["metadata"]["name"].as_str().unwrap();
    let log = cluster.kubectl_ok(&["-n", "demo", "logs", name, "-c", "app"]);
    if !release().at_least(29) {
        assert_eq!(names(pod, "initContainers"), Vec::<&str>::new(), "{}", pod["spec"]);
        return;
    }
    assert_eq!(names(pod, "initContainers"), ["demo-sidecar"], "{}", pod["spec"]);
    assert_eq!(pod["spec"]["initContainers"][0]["restartPolicy"], "Always");
    assert!(log.contains(&format!("hello from the sidecar of demo/{name}")), "the app reached the sidecar: {log}");
    // The kubelet stops the sidecar once the app has ended.
    wait_for(Duration::from_secs(60), "the Job's sidecar to end with its app", || {
        let pod = cluster.json(&["-n", "demo", "get", "pod", name]);
        pod["status"]["initContainerStatuses"][0]["state"]["terminated"].is_object().then_some(())
    });
}

/// The apply-time preview (issue 41) through the drop-in Deployment: `kubectl apply` of a Deployment whose pods
/// would go without the sidecar prints our warning, and the Deployment is admitted; a clean one prints none. Server
/// dry runs: the webhooks are called, nothing is stored.
fn check_apply_time_preview(cluster: &Cluster) {
    let deployment = |name: &str, template: &str| {
        format!(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: demo}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}, annotations: {{sidecar-injector.io/template: {template}}}}}
    spec:
      containers:
        - {{name: app, image: "busybox:1.36", command: [sleep, "3600"]}}
"#
        )
    };
    let printed = |yaml: &str| {
        let output = cluster.kubectl_with_input(&["apply", "--dry-run=server", "-f", "-"], yaml);
        assert!(output.status.success(), "a preview never refuses:\n{}", text(&output));
        String::from_utf8(output.stderr).unwrap()
    };
    let warned = printed(&deployment("previewed", "dmeo"));
    assert!(warned.contains("Warning: Deployment demo/previewed: "), "{warned}");
    assert!(warned.contains("\"dmeo\"") || warned.contains("dmeo"), "names the template: {warned}");
    let clean = printed(&deployment("clean", "demo"));
    assert!(!clean.contains("Warning:"), "{clean}");
}

/// Issue 41, item 5: `holdApplicationUntilSidecarReady`. A sidecar that becomes ready 5 s after it starts (it writes
/// a file its startupProbe and postStart wait for), injected by `inject --kubernetes-version RELEASE` with the
/// webhook's engine into a namespace the webhook leaves alone: held, the app starts once the sidecar is ready,
/// finding the file (from 1.29 a native sidecar the kubelet holds the app for until its startupProbe passes; below,
/// the first container, whose postStart wait holds the next); the same pod injected without the setting is the
/// control, whose app starts before the sidecar is ready.
fn check_the_app_waits_for_its_sidecar(cluster: &Cluster) {
    let template = |hold: bool| {
        format!(
            r#"
holdApplicationUntilSidecarReady: {hold}
pod:
  spec:
    containers:
      - name: slow-sidecar
        image: busybox:1.36
        imagePullPolicy: IfNotPresent
        command: [sh, -c, "sleep 5; touch /shared/ready; exec sleep 3600"]
        startupProbe:
          exec: {{command: [test, -f, /shared/ready]}}
          periodSeconds: 1
          failureThreshold: 60
        lifecycle:
          postStart:
            exec: {{command: [sh, -c, "until test -f /shared/ready; do sleep 1; done"]}}
        volumeMounts: [{{name: shared, mountPath: /shared}}]
    volumes: [{{name: shared, emptyDir: {{}}}}]
containerDefaults:
  volumeMounts: [{{name: shared, mountPath: /shared}}]
"#
        )
    };
    cluster.kubectl_ok(&["create", "namespace", "hold"]);
    for (name, hold) in [("held", true), ("not-held", false)] {
        let file = cluster.work.join(format!("{name}.yaml"));
        std::fs::write(&file, template(hold)).unwrap();
        // The app says whether the sidecar was ready when it started.
        let app =
            "if test -f /shared/ready; then echo ready at start; else echo not ready at start; fi; exec sleep 3600";
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "hold"},
            "spec": {"containers": [{"name": "app", "image": "busybox:1.36", "command": ["sh", "-c", app]}]}
        })
        .to_string();
        let file = file.display().to_string();
        let version = release().to_string();
        let args = ["inject", "--kubernetes-version", &version, "-f", "-", "--template", file.as_str()];
        let output = cluster.with_input("sidecar-injector", &args, &pod);
        assert!(output.status.success(), "inject {name}:\n{}", text(&output));
        cluster.apply(&String::from_utf8(output.stdout).unwrap());
    }
    // A container's status, in either list (a native sidecar's is among the init containers').
    let status = |pod: &Value, container: &str| -> Option<Value> {
        let lists = ["initContainerStatuses", "containerStatuses"];
        let mut statuses = lists.iter().filter_map(|list| pod["status"][list].as_array()).flatten();
        statuses.find(|s| s["name"] == container).cloned()
    };
    let started = |pod: &Value, container: &str| -> std::time::SystemTime {
        let status = status(pod, container).unwrap();
        humantime::parse_rfc3339(status["state"]["running"]["startedAt"].as_str().unwrap()).unwrap()
    };
    let native = release().at_least(29);
    for (name, held, at_start) in [("held", true, "ready at start"), ("not-held", false, "not ready at start")] {
        // Both containers running and the app's line logged (not Ready: a 1.20 kubelet marks a container without a
        // readiness probe ready once its startup probe has passed only at the pod's next periodic sync).
        let (pod, log) = wait_for(Duration::from_secs(60), name, || {
            let pod = cluster.json(&["-n", "hold", "get", "pod", name]);
            let running = ["app", "slow-sidecar"]
                .iter()
                .all(|c| status(&pod, c).is_some_and(|s| !s["state"]["running"].is_null()));
            let log = cluster.kubectl(&["-n", "hold", "logs", name, "-c", "app"]).stdout;
            (running && !log.is_empty()).then(|| (pod, String::from_utf8(log).unwrap()))
        });
        let (init, containers): (Vec<&str>, Vec<&str>) = match (held, native) {
            (true, true) => (vec!["slow-sidecar"], vec!["app"]),
            (true, false) => (vec![], vec!["slow-sidecar", "app"]),
            (false, _) => (vec![], vec!["app", "slow-sidecar"]),
        };
        assert_eq!((names(&pod, "initContainers"), names(&pod, "containers")), (init, containers), "{name}");
        assert_eq!(log.trim(), at_start, "{name}: what the app found when it started");
        // Seconds, as the kubelet reports them. `None`: the app started first.
        let after = started(&pod, "app").duration_since(started(&pod, "slow-sidecar")).ok();
        eprintln!("{name}: the app started {after:?} after the sidecar");
        if name == "held" {
            assert!(after.is_some_and(|after| after >= Duration::from_secs(4)), "{name}: the app did not wait");
        } else {
            assert!(after.is_none_or(|after| after <= Duration::from_secs(1)), "{name}: the app waited");
        }
    }
    cluster.kubectl_ok(&["delete", "namespace", "hold", "--wait=false"]);
}

/// The sums over the injector's replicas of the reviews each webhook answered: `/mutate`, `/validate`, `/preview`.
fn reviews_answered(cluster: &Cluster) -> [f64; 3] {
    let families =
        ["sidecar_injector_requests_total", "sidecar_injector_validations_total", "sidecar_injector_previews_total"];
    let replicas = replica_metrics(cluster);
    families.map(|family| replicas.iter().map(|(_, page)| metric_sum(page, family)).sum())
}

/// Creates `yaml` with a server-side dry run (every admission webhook runs, nothing is stored): its stderr.
fn dry_run(cluster: &Cluster, yaml: &str) -> String {
    let output = cluster.kubectl_with_input(&["create", "--dry-run=server", "-o", "json", "-f", "-"], yaml);
    assert!(output.status.success(), "{yaml}\n{}", text(&output));
    String::from_utf8(output.stderr).unwrap()
}

/// The base's CEL `matchConditions` (GA in 1.30) keep from our webhooks what they exclude, by what the API server
/// does, not by what we answer: a pod opted out by annotation reaches neither pod webhook, and the ReplicaSet the
/// Deployment controller makes never reaches `/preview` (nor do its updates of the Deployment), while an opted-in
/// pod reaches both and the user's Deployment reaches `/preview` once. Each replica's counters, summed.
fn check_match_conditions(cluster: &Cluster) {
    let pod = |name: &str, annotations: &str| {
        format!(
            r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}", "namespace": "demo",
                "annotations": {{{annotations}}}}},
                "spec": {{"containers": [{{"name": "app", "image": "busybox:1.36"}}]}}}}"#
        )
    };
    let before = reviews_answered(cluster);
    dry_run(cluster, &pod("cel-opted-out", r#""sidecar-injector.io/inject": " Off ""#));
    assert_eq!(reviews_answered(cluster), before, "an opted-out pod reached a webhook");
    dry_run(cluster, &pod("cel-opted-in", r#""sidecar-injector.io/template": "demo""#));
    // `/mutate` once or twice: the ServiceAccount plugin, run again after our patch, mounts the token into the
    // container we added, which changes the pod and reinvokes us (`reinvocationPolicy: IfNeeded`; we add nothing).
    let [mutated, validated, previewed] = reviews_answered(cluster);
    assert!(
        (1.0..=2.0).contains(&(mutated - before[0])),
        "an opted-in pod reached /mutate: {mutated} after {before:?}"
    );
    assert_eq!((validated - before[1], previewed), (1.0, before[2]), "an opted-in pod reached /validate alone");

    cluster.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: cel, namespace: demo}
spec:
  replicas: 1
  selector: {matchLabels: {app: cel}}
  template:
    metadata: {labels: {app: cel}, annotations: {sidecar-injector.io/template: demo}}
    spec:
      containers:
        - {name: app, image: "busybox:1.36", command: [sleep, "3600"]}
"#,
    );
    // The controller has made the ReplicaSet, updated the Deployment (its revision annotation) and the pod exists.
    cluster.kubectl_ok(&["-n", "demo", "rollout", "status", "deployment/cel", "--timeout=120s"]);
    let after = reviews_answered(cluster);
    assert_eq!(after[2] - before[2], 1.0, "the Deployment alone reached /preview, not its ReplicaSet: {after:?}");
    assert!(after[0] - mutated >= 1.0, "the Deployment's pod reached /mutate");
    cluster.kubectl_ok(&["-n", "demo", "delete", "deployment", "cel"]);
}

/// The PodDisruptionBudget (`policy/v1`, `maxUnavailable: 1`) through the eviction API, as `kubectl drain` uses it:
/// one replica may be evicted, and the other not while the first is away.
fn check_the_disruption_budget(cluster: &Cluster) {
    let pods = replica_metrics(cluster).into_iter().map(|(pod, _)| pod).collect::<Vec<_>>();
    assert_eq!(pods.len(), 2, "two replicas ready before the evictions");
    let evict = |pod: &str| {
        let eviction = format!(
            r#"{{"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {{"name": "{pod}", "namespace": "sidecar-injector"}}}}"#
        );
        let path = format!("/api/v1/namespaces/sidecar-injector/pods/{pod}/eviction");
        cluster.kubectl_with_input(&["create", "--raw", &path, "-f", "-"], &eviction)
    };
    let first = evict(&pods[0]);
    assert!(first.status.success(), "the first eviction is allowed: {}", text(&first));
    let second = evict(&pods[1]);
    assert!(!second.status.success(), "the second eviction left no replica: {}", text(&second));
    assert!(text(&second).contains("disruption budget"), "{}", text(&second));
    wait_for(Duration::from_secs(120), "the evicted replica replaced", || {
        let deployment = cluster.json(&["-n", "sidecar-injector", "get", "deployment", "sidecar-injector"]);
        (deployment["status"]["readyReplicas"] == 2 && replica_metrics(cluster).len() == 2).then_some(())
    });
}

/// Pod-level resources (`spec.resources`, beta and on by default from 1.34), as docs/templates.md says: a pod
/// whose pod-level limits hold the sidecar beside its containers is injected and the API server accepts the pod
/// we answer with; one whose limits cannot hold it is admitted without the sidecar, with our warning.
fn check_pod_level_resources(cluster: &Cluster) {
    let pod = |name: &str, memory: &str| {
        format!(
            r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}", "namespace": "demo",
                "annotations": {{"sidecar-injector.io/template": "demo"}}}},
                "spec": {{"resources": {{"limits": {{"cpu": "1", "memory": "{memory}"}}}},
                  "containers": [{{"name": "app", "image": "busybox:1.36", "command": ["sleep", "3600"],
                    "resources": {{"requests": {{"cpu": "100m", "memory": "64Mi"}}}}}}]}}}}"#
        )
    };
    let output = cluster.kubectl_with_input(&["create", "-o", "json", "-f", "-"], &pod("roomy", "256Mi"));
    assert!(output.status.success(), "{}", text(&output));
    let stored: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(names(&stored, "containers"), ["app", "demo-sidecar"], "{}", stored["spec"]);
    wait_for(Duration::from_secs(90), "the pod with pod-level resources Ready", || {
        all_ready(&cluster.json(&["-n", "demo", "get", "pod", "roomy"])).then_some(())
    });
    // 70Mi holds the app's 64Mi request, not the sidecar's 16Mi beside it.
    let output =
        cluster.kubectl_with_input(&["create", "--dry-run=server", "-o", "json", "-f", "-"], &pod("tight", "70Mi"));
    assert!(output.status.success(), "{}", text(&output));
    let admitted: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(names(&admitted, "containers"), ["app"], "{}", admitted["spec"]);
    let warning = String::from_utf8(output.stderr).unwrap();
    assert!(warning.contains("pod-level resources"), "{warning}");
    cluster.kubectl_ok(&["-n", "demo", "delete", "pod", "roomy", "--wait=false"]);
}

/// Nothing was pulled or tried: every image came from the archives imported at `up`.
fn check_nothing_was_pulled(cluster: &Cluster) {
    let events = cluster.json(&["get", "events", "--all-namespaces"]);
    let pulls: Vec<String> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            let message = e["message"].as_str().unwrap_or("");
            e["reason"] == "Pulling"
                || e["reason"] == "Pulled" && !message.contains("already present")
                || message.contains("ErrImagePull")
                || message.contains("pull image")
        })
        .map(|e| format!("{}: {}", e["reason"], e["message"]))
        .collect();
    assert!(pulls.is_empty(), "pull attempts: {pulls:#?}");
}

/// The injector's replicas: each pod's name and its `/metrics` as it answers them (from the host, which reaches
/// pod addresses on the node's bridge).
fn replica_metrics(cluster: &Cluster) -> Vec<(String, String)> {
    let pods =
        cluster.json(&["-n", "sidecar-injector", "get", "pods", "-l", "app.kubernetes.io/name=sidecar-injector"]);
    let mut replicas = Vec::new();
    for pod in pods["items"].as_array().unwrap() {
        if pod["metadata"]["deletionTimestamp"].is_string() || !all_ready(pod) {
            continue;
        }
        let ip = pod["status"]["podIP"].as_str().unwrap();
        let output = Command::new("curl")
            .args(["-sf", "--max-time", "5", &format!("http://{ip}:9090/metrics")])
            .output()
            .unwrap();
        assert!(output.status.success(), "metrics of {ip}: {}", text(&output));
        replicas
            .push((pod["metadata"]["name"].as_str().unwrap().to_owned(), String::from_utf8(output.stdout).unwrap()));
    }
    replicas
}

/// The value of the first series of `name` whose labels contain `labels` (`a="b"`), in a Prometheus text page.
fn metric(page: &str, name: &str, labels: &str) -> Option<f64> {
    page.lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with(['{', ' ']) && line.contains(labels))
        .find_map(|line| line.rsplit(' ').next()?.parse().ok())
}

/// The set hash a replica serves (`sidecar_injector_template_set_info{revision,hash}`).
fn served_set(page: &str) -> String {
    let line =
        page.lines().find(|l| l.starts_with("sidecar_injector_template_set_info{")).expect("the set info metric");
    let hash = line.split("hash=\"").nth(1).unwrap_or_else(|| panic!("no hash label: {line}"));
    hash.split('"').next().unwrap().to_owned()
}

/// A bare pod naming `template`, created with a server-side dry run: every admission webhook runs, nothing is
/// stored. The pod as the API server would store it, or the refusal.
fn dry_run_pod(cluster: &Cluster, namespace: &str, name: &str, template: &str) -> Result<Value, String> {
    let pod = format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}", "namespace": "{namespace}",
            "annotations": {{"sidecar-injector.io/template": "{template}"}}}},
            "spec": {{"containers": [{{"name": "app", "image": "busybox:1.36", "command": ["sleep", "3600"]}}]}}}}"#
    );
    let output = cluster.kubectl_with_input(&["create", "--dry-run=server", "-o", "json", "-f", "-"], &pod);
    if output.status.success() { Ok(serde_json::from_slice(&output.stdout).unwrap()) } else { Err(text(&output)) }
}

/// The template version a pod was injected with (its status annotation), if any.
fn injected_version(pod: &Value) -> Option<String> {
    let status = pod["metadata"]["annotations"]["sidecar-injector.io/status"].as_str()?;
    Some(serde_json::from_str::<Value>(status).unwrap()["version"].as_str().unwrap().to_owned())
}

/// The overlay's templates (issue 50: their one home), which `certs` seeded with the shipped ones.
fn overlay_templates(cluster: &Cluster) -> PathBuf {
    cluster.work.join("my-injector/templates")
}

/// Edits the overlay's templates in place (`edit` on `my-injector/templates/`) and deploys them the README's way
/// (its "edit" block: `check` the overlay, `kubectl apply -k`; the log line it greps is for people).
fn apply_templates(cluster: &Cluster, edit: impl Fn(&Path)) -> Instant {
    edit(&overlay_templates(cluster));
    let block = readme_block("edit");
    let block: String = block.lines().filter(|l| !l.contains(" logs ")).map(|l| format!("{l}\n")).collect();
    let output = cluster.command("bash").env("EDITOR", "true").args(["-euo", "pipefail", "-c", &block]).output();
    let output = output.unwrap();
    assert!(output.status.success(), "the README's edit block:\n{block}\n{}", text(&output));
    Instant::now()
}

/// `sidecar-injector check my-injector`, which must refuse: what it says.
fn check_refuses_the_overlay(cluster: &Cluster) -> String {
    let output = cluster.command("sidecar-injector").args(["check", "my-injector"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "check refuses:\n{}", text(&output));
    text(&output)
}

/// A template edit through the API reaches every replica through the kubelet's projection: new pods get the new
/// version, pods created before keep theirs, and while the edit rolls through the replicas no pod is refused.
/// Then an edit that adds a template pods ask for at once: each replica that meets such a pod before the kubelet
/// updated its volume reads the ConfigMap itself, so none is admitted without its sidecar and none is refused
/// because the mutating and the validating call met replicas with different sets. Returns the seconds from the
/// first apply to the first pod injected with the new version, and from the second to the first pod with the new
/// template.
fn check_a_template_edit_through_the_api(cluster: &Cluster) -> (u64, u64) {
    let before = cluster.json(&["-n", "demo", "get", "pods", "-l", "app=shop"]);
    let old_versions: Vec<Option<String>> = before["items"].as_array().unwrap().iter().map(injected_version).collect();
    let old_version = old_versions[0].clone().expect("the shop pods are injected");
    let old_sets: Vec<String> = replica_metrics(cluster).iter().map(|(_, page)| served_set(page)).collect();
    cluster.kubectl_ok(&["create", "namespace", "rollout"]);
    cluster.kubectl_ok(&["label", "namespace", "rollout", "sidecar-injector.io/inject=enabled"]);
    // 1. An edit of a template: the kubelet brings it to each replica on its own sync.
    let applied = apply_templates(cluster, |dir| {
        let demo = std::fs::read_to_string(dir.join("demo.yaml")).unwrap();
        let edited = demo.replace("  port: 15000\n", "  port: 15000\n  edition: 2\n");
        assert_ne!(demo, edited);
        std::fs::write(dir.join("demo.yaml"), edited).unwrap();
    });
    let mut refused = Vec::new();
    let mut first_new = None;
    for round in 0..240 {
        match dry_run_pod(cluster, "rollout", &format!("edited-{round}"), "demo") {
            Ok(pod) => {
                let version = injected_version(&pod).expect("a pod asking for demo is injected");
                if version != old_version && first_new.is_none() {
                    first_new = Some(applied.elapsed().as_secs());
                }
            }
            Err(e) => refused.push(e),
        }
        let sets: Vec<String> = replica_metrics(cluster).iter().map(|(_, page)| served_set(page)).collect();
        if first_new.is_some() && sets.len() == 2 && sets.iter().all(|set| !old_sets.contains(set)) {
            break;
        }
        assert!(round < 239, "the edit did not reach every replica within 240 rounds: {sets:?}");
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(refused.is_empty(), "pods refused while the edit rolled through the replicas: {refused:#?}");
    let edited_after = first_new.unwrap();

    // 2. An edit that adds a template of the test's own (no file of this repository), named by pods from the
    // moment it is applied. Until the overlay lists it, `check` refuses: `kubectl apply -k` would leave it out.
    let edited_sets: Vec<String> = replica_metrics(cluster).iter().map(|(_, page)| served_set(page)).collect();
    let applied = apply_templates(cluster, |dir| {
        let demo = std::fs::read_to_string(dir.join("demo.yaml")).unwrap();
        let second =
            demo.replace("demo-sidecar", "demo2-sidecar").replace("sidecar-injector-demo", "sidecar-injector-demo2");
        std::fs::write(dir.join("demo2.yaml"), second).unwrap();
        let refusal = check_refuses_the_overlay(cluster);
        assert!(refusal.contains("demo2.yaml: not in the files of"), "{refusal}");
        // Listed as the README says (a line under `files:`).
        let kustomization = dir.parent().unwrap().join("kustomization.yaml");
        let text = std::fs::read_to_string(&kustomization).unwrap();
        let listed = text
            .replace("      - templates/demo.yaml\n", "      - templates/demo.yaml\n      - templates/demo2.yaml\n");
        assert_ne!(text, listed);
        std::fs::write(&kustomization, listed).unwrap();
    });
    let (mut missed, mut first_added) = (0, None);
    for round in 0..240 {
        match dry_run_pod(cluster, "rollout", &format!("new-{round}"), "demo2") {
            Ok(pod) if names(&pod, "containers").contains(&"demo2-sidecar") => {
                first_added.get_or_insert(applied.elapsed().as_secs());
            }
            Ok(_) => missed += 1,
            Err(e) => refused.push(e),
        }
        let sets: Vec<String> = replica_metrics(cluster).iter().map(|(_, page)| served_set(page)).collect();
        if round >= 10 && sets.len() == 2 && sets.iter().all(|set| !edited_sets.contains(set)) {
            break;
        }
        assert!(round < 239, "the new template did not reach every replica within 240 rounds: {sets:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(refused.is_empty(), "pods refused while the new template rolled through the replicas: {refused:#?}");
    assert_eq!(missed, 0, "pods asking for the new template admitted without it");
    let reads: f64 = (replica_metrics(cluster).iter())
        .filter_map(|(_, page)| metric(page, "sidecar_injector_template_configmap_reads_total", r#"result="changed""#))
        .sum();
    assert!(reads >= 1.0, "a replica read the ConfigMap for the new template");
    let added_after = first_added.unwrap();
    eprintln!(
        "template edit: first pod with the new version {edited_after} s after the apply (the kubelet's sync); a new \
         template: first pod with it {added_after} s after the apply, none without it ({reads} ConfigMap reads)"
    );
    // Pods created before the edit keep the version they were injected with.
    let after = cluster.json(&["-n", "demo", "get", "pods", "-l", "app=shop"]);
    let versions: Vec<Option<String>> = after["items"].as_array().unwrap().iter().map(injected_version).collect();
    assert_eq!(versions, old_versions);
    (edited_after, added_after)
}

/// A broken edit through the API is refused by every replica (the metric, the log naming the file and line), the
/// last good set keeps serving and the replicas stay ready; the fix is taken without a restart.
fn check_a_broken_edit_is_refused_and_the_fix_recovers(cluster: &Cluster) {
    let good: Vec<String> = replica_metrics(cluster).iter().map(|(_, page)| served_set(page)).collect();
    let refusals =
        |page: &str| metric(page, "sidecar_injector_template_reloads_total", r#"result="error""#).unwrap_or(0.0);
    let before: Vec<f64> = replica_metrics(cluster).iter().map(|(_, page)| refusals(page)).collect();
    let good_version = injected_version(&dry_run_pod(cluster, "rollout", "before-broken", "demo").unwrap());
    // A pull policy the API server does not know: it would refuse every pod injected with it. `check` says so;
    // applied anyway (as by a user who skips it), the replicas refuse it.
    let demo = overlay_templates(cluster).join("demo.yaml");
    let good_demo = std::fs::read_to_string(&demo).unwrap();
    let broken = good_demo.replace("imagePullPolicy: IfNotPresent", "imagePullPolicy: Sometimes");
    assert_ne!(good_demo, broken);
    std::fs::write(&demo, broken).unwrap();
    let refusal = check_refuses_the_overlay(cluster);
    assert!(refusal.contains("demo.yaml:") && refusal.contains("Sometimes"), "{refusal}");
    cluster.kubectl_ok(&["apply", "-k", "my-injector"]);
    wait_for(Duration::from_secs(240), "every replica to refuse the broken edit", || {
        let replicas = replica_metrics(cluster);
        (replicas.len() == 2 && replicas.iter().zip(&before).all(|((_, page), was)| refusals(page) > *was))
            .then_some(())
    });
    for (pod, page) in replica_metrics(cluster) {
        assert!(good.contains(&served_set(&page)), "{pod} serves the last good set");
        let log = cluster.kubectl_ok(&["-n", "sidecar-injector", "logs", &pod]);
        let refusal =
            log.lines().find(|l| l.contains("template edit refused")).unwrap_or_else(|| panic!("{pod}: {log}"));
        assert!(refusal.contains("demo.yaml:"), "the refusal names the file and line: {refusal}");
    }
    check_the_injector_runs_as_shipped(cluster);
    let version = injected_version(&dry_run_pod(cluster, "rollout", "during-broken", "demo").unwrap());
    assert_eq!(version, good_version, "the last good template serves");
    // The fix: the edit as it was before, a new edition.
    apply_templates(cluster, |dir| {
        std::fs::write(dir.join("demo.yaml"), good_demo.replace("  edition: 2\n", "  edition: 3\n")).unwrap();
    });
    wait_for(Duration::from_secs(240), "every replica to take the fix", || {
        let sets: Vec<String> = replica_metrics(cluster).iter().map(|(_, page)| served_set(page)).collect();
        (sets.len() == 2 && sets.iter().all(|set| !good.contains(set))).then_some(())
    });
    check_the_injector_runs_as_shipped(cluster);
}

/// `sidecar-injector status` against the cluster names the workload whose pods an edit left behind, `--restart`
/// rolls it, and once the rollout ends `status` exits 0.
fn check_the_drift_report(cluster: &Cluster) {
    let status = |extra: &[&str]| {
        let mut args = vec!["status", "-n", "demo", "--configmap", "sidecar-injector/sidecar-injector-templates"];
        args.extend(extra);
        cluster.command("sidecar-injector").args(&args).output().unwrap()
    };
    // Bare pods are listed to recreate by hand; this check is about the Deployment.
    cluster.kubectl_ok(&["-n", "demo", "delete", "pod", "web", "opted-out", "--wait=false"]);
    cluster.kubectl_ok(&["-n", "demo", "delete", "job", "once"]);
    let output = status(&[]);
    assert_eq!(output.status.code(), Some(1), "status names the drift:\n{}", text(&output));
    assert!(text(&output).contains("shop"), "{}", text(&output));
    let output = status(&["--restart"]);
    assert!(output.status.success() || output.status.code() == Some(1), "{}", text(&output));
    cluster.kubectl_ok(&["-n", "demo", "rollout", "status", "deployment/shop", "--timeout=120s"]);
    wait_for(Duration::from_secs(120), "status to report no drift", || {
        let output = status(&[]);
        (output.status.code() == Some(0)).then_some(())
    });
}

/// Re-running `certs` (the CA kept) and `kubectl apply -k` rotates the serving certificate: every replica reloads
/// it, no admission fails while pods are created meanwhile, and the overlay's templates stay (issue 50: the
/// README's renewal once put the shipped ConfigMap back over the user's): every pod naming the test's own
/// template, `demo2`, is injected with it throughout.
fn check_certificate_rotation(cluster: &Cluster) {
    let reloads =
        |page: &str| metric(page, "sidecar_injector_certificate_reloads_total", r#"result="ok""#).unwrap_or(0.0);
    let before: Vec<(String, f64)> =
        replica_metrics(cluster).iter().map(|(pod, page)| (pod.clone(), reloads(page))).collect();
    let deploy = readme_block("deploy");
    let certs_line = deploy.lines().find(|l| l.starts_with("sidecar-injector certs")).unwrap();
    let version = certs_version_flag();
    let (injected, missing, refused) = pods_during(cluster, 20, "demo2", || {
        let output = cluster.shell(&format!("{certs_line}{version} && kubectl apply -k my-injector"));
        assert!(output.status.success(), "{}", text(&output));
        let said = text(&output);
        assert!(said.contains("keeping the CA") && said.contains("keeping the templates in"), "{said}");
        wait_for(Duration::from_secs(240), "the certificate on every replica", || {
            let now = replica_metrics(cluster);
            let rotated = now.len() == before.len()
                && now.iter().all(|(pod, page)| before.iter().any(|(p, was)| p == pod && reloads(page) > *was));
            rotated.then_some(())
        });
    });
    eprintln!("renewal: {injected} pods injected with demo2, {missing} without it, {} refused", refused.len());
    assert_eq!((missing, refused.len()), (0, 0), "pods lost during the renewal: {refused:#?}");
}

/// Issue 50: an upgrade in place, as docs/operations.md ("Upgrading") gives it: a newer release's base (here the
/// repository's manifests with a changed shipped template, where a user would `git pull`) and a new image tag,
/// `certs --out my-injector --image NEW` and `kubectl apply -k`. The replicas roll onto the new image; the CA and
/// the user's templates stay (the changed shipped template never reaches the cluster); every pod created
/// meanwhile naming the test's own template is injected with it.
fn check_upgrade_in_place(cluster: &Cluster, archive_dir: &Path) {
    // The new release's image: the same binary under a new tag, built and imported as the first.
    let archive = archive_dir.join("image-next.tar");
    build_image(NEXT_IMAGE, &image_binary(), &archive);
    cluster.import(&archive);
    // The new release's manifests, where the README's commands find them.
    let next = cluster.work.join("manifests-next");
    copy_tree(&Path::new(ROOT).join("manifests"), &next);
    let configmap = next.join("base/configmap.yaml");
    let shipped = std::fs::read_to_string(&configmap).unwrap();
    let changed = shipped.replace("hello from the sidecar of", "hello from the next release's sidecar of");
    assert_ne!(shipped, changed, "the next release changes a shipped template");
    std::fs::write(&configmap, changed).unwrap();
    std::fs::remove_file(cluster.work.join("manifests")).unwrap();
    std::os::unix::fs::symlink(&next, cluster.work.join("manifests")).unwrap();

    let ours_before = cluster.json(&["-n", "sidecar-injector", "get", "configmap", "sidecar-injector-templates"]);
    let bundle = || {
        let configuration = cluster.json(&["get", "mutatingwebhookconfiguration", "sidecar-injector"]);
        configuration["webhooks"][0]["clientConfig"]["caBundle"].as_str().unwrap().to_owned()
    };
    let bundle_before = bundle();
    let version = certs_version_flag();
    let started = Instant::now();
    let (injected, missing, refused) = pods_during(cluster, 20, "demo2", || {
        let output = cluster.shell(&format!(
            "sidecar-injector certs --out my-injector --image {NEXT_IMAGE}{version} && kubectl apply -k my-injector"
        ));
        assert!(output.status.success(), "{}", text(&output));
        assert!(text(&output).contains("keeping the templates in"), "{}", text(&output));
        wait_for_the_injector_rollout(cluster);
        // Until the old replicas have drained and gone: pods keep coming while they still hold connections.
        wait_for(Duration::from_secs(120), "only the new replicas", || {
            let selector = ["-n", "sidecar-injector", "get", "pods", "-l", "app.kubernetes.io/name=sidecar-injector"];
            let pods = cluster.json(&selector);
            let images: Vec<&Value> =
                pods["items"].as_array().unwrap().iter().map(|p| &p["spec"]["containers"][0]["image"]).collect();
            (images.len() == 2 && images.iter().all(|i| *i == NEXT_IMAGE)).then_some(())
        });
    });
    eprintln!(
        "upgrade: {injected} pods injected with demo2, {missing} without it, {} refused, in {} s",
        refused.len(),
        started.elapsed().as_secs()
    );
    assert_eq!((missing, refused.len()), (0, 0), "pods lost during the upgrade: {refused:#?}");
    let deployment = cluster.json(&["-n", "sidecar-injector", "get", "deployment", "sidecar-injector"]);
    assert_eq!(deployment["spec"]["template"]["spec"]["containers"][0]["image"], NEXT_IMAGE);
    check_the_injector_runs_as_shipped(cluster);
    let ours_after = cluster.json(&["-n", "sidecar-injector", "get", "configmap", "sidecar-injector-templates"]);
    assert_eq!(ours_after["data"], ours_before["data"], "the user's templates, not the new release's");
    assert!(ours_after["data"]["demo2.yaml"].is_string(), "the test's own template is deployed");
    assert!(!ours_after["data"].to_string().contains("next release"), "the new release's template stays out");
    assert_eq!(bundle(), bundle_before, "the CA stays");
}

/// The image tag of the "next release" the upgrade moves to.
const NEXT_IMAGE: &str = "sidecar-injector:next";

/// Copies the directory `from` to `to` (files and directories; symlinks followed).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// Pods created (server-side dry runs, five a second, in an injected namespace) naming `template` while
/// `disrupt` runs on another thread, `rounds` of them at least and until `disrupt` has returned (3,000 at most):
/// how many got the template's sidecar (`TEMPLATE-sidecar`), how many were admitted without it, and the refusals.
fn pods_during(
    cluster: &Cluster,
    rounds: usize,
    template: &str,
    disrupt: impl FnOnce() + Send,
) -> (usize, usize, Vec<String>) {
    const MAX_ROUNDS: usize = 3000;
    let done = std::sync::atomic::AtomicBool::new(false);
    let sidecar = format!("{template}-sidecar");
    std::thread::scope(|scope| {
        let creating = scope.spawn(|| {
            let (mut injected, mut missing, mut refused) = (0, 0, Vec::new());
            let mut round = 0;
            while round < rounds || !done.load(std::sync::atomic::Ordering::SeqCst) {
                assert!(round < MAX_ROUNDS, "the disruption did not end within {MAX_ROUNDS} pods");
                match dry_run_pod(cluster, "rollout", &format!("disruption-{round}"), template) {
                    Ok(pod) if names(&pod, "containers").contains(&sidecar.as_str()) => injected += 1,
                    Ok(_) => missing += 1,
                    Err(e) => refused.push(e),
                }
                round += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            (injected, missing, refused)
        });
        // Set however `disrupt` ends: a failed assertion in it must not leave the loop running to its bound.
        struct Done<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let finished = Done(&done);
        std::thread::sleep(Duration::from_secs(2));
        disrupt();
        drop(finished);
        creating.join().unwrap()
    })
}

/// Disruption with the shipped policies (the mutating webhook fails open, the validating one decides): a rolling
/// restart of the injector loses nothing; a replica killed outright never lets a pod run without its sidecar, and
/// the pods refused while the API server still routes to the dead replica (its endpoint stays until its readiness
/// probe fails) are counted and printed.
fn check_disruption(cluster: &Cluster) {
    let (injected, missing, refused) = pods_during(cluster, 150, "demo", || {
        cluster.kubectl_ok(&["-n", "sidecar-injector", "rollout", "restart", "deployment/sidecar-injector"]);
        wait_for_the_injector_rollout(cluster);
    });
    eprintln!("rollout restart: {injected} pods injected, {missing} without the sidecar, {} refused", refused.len());
    assert_eq!((missing, refused.len()), (0, 0), "a rolling restart lost pods: {refused:#?}");
    check_the_injector_runs_as_shipped(cluster);

    let (injected, missing, refused) = pods_during(cluster, 100, "demo", || {
        let output = Command::new("pkill").args(["-KILL", "-o", "-f", "^/sidecar-injector serve"]).output().unwrap();
        assert!(output.status.success(), "no injector process to kill: {}", text(&output));
    });
    eprintln!("one replica killed: {injected} pods injected, {missing} without the sidecar, {} refused", refused.len());
    assert_eq!(missing, 0, "a pod ran without its sidecar");
    assert!(refused.len() <= 10, "refused for longer than the dead replica's endpoint lives: {refused:#?}");
    // Either call may meet the dead replica: the validating one fails (closed), or the mutating one fails (open)
    // and the validating companion refuses the pod it left without the sidecar.
    for refusal in &refused {
        let dead_replica = refusal.contains("failed calling webhook") || refusal.contains("lacks what template demo");
        assert!(dead_replica, "refused for another reason: {refusal}");
    }
    wait_for(Duration::from_secs(60), "the killed replica back", || {
        let deployment = cluster.json(&["-n", "sidecar-injector", "get", "deployment", "sidecar-injector"]);
        (deployment["status"]["readyReplicas"] == 2).then_some(())
    });
}

/// Waits (two minutes at most) until the injector's Deployment has rolled out.
fn wait_for_the_injector_rollout(cluster: &Cluster) {
    cluster.kubectl_ok(&[
        "-n",
        "sidecar-injector",
        "rollout",
        "status",
        "deployment/sidecar-injector",
        "--timeout=120s",
    ]);
}

/// The sum of every series of `name` in a Prometheus text page.
fn metric_sum(page: &str, name: &str) -> f64 {
    metric_sum_of(page, name, &[])
}

/// The sum of the series of `name` in a Prometheus text page that have every one of `labels`.
fn metric_sum_of(page: &str, name: &str, labels: &[&str]) -> f64 {
    let series = |line: &&str| {
        line.starts_with(name)
            && line[name.len()..].starts_with(['{', ' '])
            && labels.iter().all(|label| line.contains(label))
    };
    page.lines().filter(series).filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// Sets the injector's `--max-connection-age` (a rollout), then scales it from two replicas to three and creates
/// pods for `window`: each replica's share of the reviews in that window, the replica added last first.
fn shares_after_scaling_out(cluster: &Cluster, max_age: &str, window: Duration) -> Vec<f64> {
    let deployment = cluster.json(&["-n", "sidecar-injector", "get", "deployment", "sidecar-injector"]);
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].as_array().unwrap();
    let index = args.iter().position(|a| a.as_str().unwrap().starts_with("--max-connection-age=")).unwrap();
    let patch = format!(
        r#"[{{"op": "replace", "path": "/spec/template/spec/containers/0/args/{index}", "value": "--max-connection-age={max_age}"}},
            {{"op": "replace", "path": "/spec/replicas", "value": 2}}]"#
    );
    cluster.kubectl_ok(&[
        "-n",
        "sidecar-injector",
        "patch",
        "deployment",
        "sidecar-injector",
        "--type=json",
        "-p",
        &patch,
    ]);
    wait_for_the_injector_rollout(cluster);
    wait_for(Duration::from_secs(60), "two replicas serving", || (replica_metrics(cluster).len() == 2).then_some(()));
    // The replaced replicas linger through their preStop sleep and drain: a connection the API server opened to one
    // of them would end after the scaling, and its next one could go to the replica added last.
    wait_for(Duration::from_secs(90), "the replaced replicas gone", || {
        let pods =
            cluster.json(&["-n", "sidecar-injector", "get", "pods", "-l", "app.kubernetes.io/name=sidecar-injector"]);
        (pods["items"].as_array().unwrap().len() == 2).then_some(())
    });
    // The API server's connections are now to these two.
    for round in 0..10 {
        dry_run_pod(cluster, "rollout", &format!("warm-{round}"), "demo").unwrap();
    }
    cluster.kubectl_ok(&["-n", "sidecar-injector", "scale", "deployment/sidecar-injector", "--replicas=3"]);
    wait_for_the_injector_rollout(cluster);
    wait_for(Duration::from_secs(60), "three replicas serving", || (replica_metrics(cluster).len() == 3).then_some(()));
    let pods =
        cluster.json(&["-n", "sidecar-injector", "get", "pods", "-l", "app.kubernetes.io/name=sidecar-injector"]);
    let newest = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .max_by_key(|p| p["metadata"]["creationTimestamp"].as_str().unwrap().to_owned())
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .unwrap();
    let count = || -> Vec<(String, f64)> {
        replica_metrics(cluster)
            .iter()
            .map(|(pod, page)| (pod.clone(), metric_sum(page, "sidecar_injector_requests_total")))
            .collect()
    };
    let before = count();
    let start = Instant::now();
    let mut round = 0;
    while start.elapsed() < window {
        dry_run_pod(cluster, "rollout", &format!("spread-{round}"), "demo").unwrap();
        round += 1;
    }
    let after = count();
    let deltas: Vec<(String, f64)> = after
        .iter()
        .map(|(pod, n)| (pod.clone(), n - before.iter().find(|(p, _)| p == pod).map_or(0.0, |(_, b)| *b)))
        .collect();
    let total: f64 = deltas.iter().map(|(_, d)| d).sum();
    assert!(total > 0.0);
    let mut shares: Vec<(bool, f64)> = deltas.iter().map(|(pod, d)| (*pod != newest, d / total)).collect();
    shares.sort_by(|a, b| a.partial_cmp(b).unwrap());
    shares.into_iter().map(|(_, share)| share).collect()
}

/// The API server keeps its keep-alive connections to a webhook, so a replica added later gets no reviews at all
/// unless connections end; with `--max-connection-age` they do, and the three replicas share the reviews.
fn check_load_spread(cluster: &Cluster) {
    let without = shares_after_scaling_out(cluster, "0s", Duration::from_secs(45));
    eprintln!("shares after scaling 2 -> 3, no maximum connection age (newest first): {without:.2?}");
    assert!(without[0] < 0.05, "the replica added last got a share without connection ages: {without:?}");
    let with = shares_after_scaling_out(cluster, "1s", Duration::from_secs(60));
    eprintln!("shares after scaling 2 -> 3, --max-connection-age=1s (newest first): {with:.2?}");
    assert!(with.iter().all(|share| *share >= 0.1), "a replica got less than 0.1 of the reviews: {with:?}");
}

/// The API server's own view of our calls: p50 and p99 of `apiserver_admission_webhook_admission_duration_seconds`
/// for each of our webhooks, from its `/metrics` (bucket bounds, so an upper estimate).
fn webhook_latency(cluster: &Cluster) -> Vec<String> {
    let page = cluster.kubectl_ok(&["get", "--raw", "/metrics"]);
    let mut lines = Vec::new();
    for webhook in ["inject.sidecar-injector.io", "validate.sidecar-injector.io"] {
        let buckets: Vec<(f64, f64)> = page
            .lines()
            .filter(|l| l.starts_with("apiserver_admission_webhook_admission_duration_seconds_bucket{"))
            .filter(|l| l.contains(&format!("name=\"{webhook}\"")) && l.contains(r#"operation="CREATE""#))
            .filter_map(|l| {
                let le = l.split("le=\"").nth(1)?.split('"').next()?;
                let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
                Some((bound, l.rsplit(' ').next()?.parse().ok()?))
            })
            .collect();
        // Summed over the series of one webhook (rejected true and false): cumulative counts by bound.
        let mut bounds: Vec<f64> = buckets.iter().map(|(b, _)| *b).collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let cumulative: Vec<(f64, f64)> =
            bounds.iter().map(|b| (*b, buckets.iter().filter(|(x, _)| x == b).map(|(_, c)| c).sum())).collect();
        let total = cumulative.last().map_or(0.0, |(_, c)| *c);
        let quantile = |q: f64| cumulative.iter().find(|(_, c)| *c >= q * total).map_or(f64::NAN, |(b, _)| *b);
        assert!(total > 0.0, "the API server recorded calls of {webhook}");
        lines.push(format!("{webhook}: {total} calls, p50 <= {} s, p99 <= {} s", quantile(0.5), quantile(0.99)));
    }
    lines
}

/// The median wall time of `n` pod creations (server-side dry runs, kubectl included), in milliseconds.
fn creation_median_ms(cluster: &Cluster, n: usize, label: &str) -> u128 {
    let mut times: Vec<u128> = (0..n)
        .map(|i| {
            let start = Instant::now();
            dry_run_pod(cluster, "rollout", &format!("{label}-{i}"), "demo").unwrap();
            start.elapsed().as_millis()
        })
        .collect();
    times.sort_unstable();
    times[n / 2]
}

#[test]
#[ignore = "needs root and a one-node cluster: tests/e2e/cluster.sh (tests/e2e/README.md)"]
fn a_real_node_runs_the_readme_deploy_path_and_the_pods_we_inject() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::up_with_the_readme_deploy(dir.path());
    if older_cluster() {
        check_overlay_changes_only_what_the_readme_says(&cluster);
    } else {
        check_the_base_as_written_is_what_runs(&cluster);
    }
    check_the_injector_runs_as_shipped(&cluster);

    let try_it = readme_block("try-it");
    let output = cluster.shell(&try_it);
    let printed = text(&output);
    assert!(output.status.success(), "the README's try-it block failed:\n{try_it}\n{printed}");
    assert!(printed.contains("web demo-sidecar"), "{printed}");
    assert!(printed.contains("hello from the sidecar of demo/web"), "{printed}");

    check_injected_pods_start_and_share(&cluster);
    if !older_cluster() {
        check_events_on_the_owners(&cluster);
    }
    check_what_is_not_injected(&cluster);
    check_apply_time_preview(&cluster);
    check_the_app_waits_for_its_sidecar(&cluster);
    if !older_cluster() {
        check_match_conditions(&cluster);
        check_the_disruption_budget(&cluster);
    }
    if release().at_least(34) {
        check_pod_level_resources(&cluster);
    }

    // Day two (issue 37): edits, the drift report and a certificate rotation through the API and the kubelet.
    let (propagation, new_template) = check_a_template_edit_through_the_api(&cluster);
    check_a_broken_edit_is_refused_and_the_fix_recovers(&cluster);
    check_the_drift_report(&cluster);
    check_certificate_rotation(&cluster);
    check_upgrade_in_place(&cluster, dir.path());
    check_disruption(&cluster);
    check_load_spread(&cluster);
    if release().at_least(35) {
        check_a_sidecar_resized_in_place(&cluster);
    }
    check_sidecars_upgraded_in_place(&cluster);
    check_a_revision_tag(&cluster);
    eprintln!(
        "template edit to the first pod with the new version: {propagation} s; with a new template: {new_template} s"
    );
    for line in webhook_latency(&cluster) {
        eprintln!("as the API server saw our calls: {line}");
    }
    let with = creation_median_ms(&cluster, 30, "with-webhooks");
    cluster.kubectl_ok(&["delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "sidecar-injector"]);
    let without = creation_median_ms(&cluster, 30, "without-webhooks");
    eprintln!(
        "pod creation (dry run, kubectl included), median of 30: {with} ms with our webhooks, {without} ms without"
    );
    if !older_cluster() {
        check_helm_install_and_upgrade(&cluster);
    }
    check_nothing_was_pulled(&cluster);

    let changed = cluster.down();
    assert!(changed.is_empty(), "the host differs after down:\n{}", changed.join("\n"));
    // A second teardown is harmless.
    let output = Command::new(SCRIPT).arg("down").arg(dir.path()).output().unwrap();
    assert!(output.status.success(), "a second down:\n{}", text(&output));
}

/// Issue 55, item 4: a revision tag made with `sidecar-injector tag set` from the webhooks as deployed (through
/// the Service, at `/mutate/tag/prod`, with the deployed caBundle): a namespace labelled with the tag runs injected
/// pods whose stamp names it, `tag list` and `status` show it; removed with the namespace relabelled, it is gone.
/// Moving a tag between revisions is the e2e test's (this cluster serves one revision).
fn check_a_revision_tag(cluster: &Cluster) {
    let cli = |args: &[&str]| {
        let output = cluster.command("sidecar-injector").args(args).output().unwrap();
        assert!(output.status.success(), "sidecar-injector {}:\n{}", args.join(" "), text(&output));
        String::from_utf8(output.stdout).unwrap()
    };
    cluster.kubectl_ok(&["create", "namespace", "tagged"]);
    cluster.kubectl_ok(&["label", "namespace", "tagged", "sidecar-injector.io/rev=prod"]);
    let set = cli(&["tag", "set", "prod", "--revision", "default"]);
    assert_eq!(
        set,
        "tag prod points to revision default: 1 namespace(s) labelled sidecar-injector.io/rev=prod (tagged)\n"
    );
    let webhooks = cluster.json(&["get", "mutatingwebhookconfiguration", "sidecar-injector-tag-prod"]);
    assert_eq!(webhooks["webhooks"][0]["clientConfig"]["service"]["path"], "/mutate/tag/prod", "{webhooks}");
    cluster.apply(&sleeping_deployment("tagged", "shop", "demo", 2));
    let pods = wait_for(Duration::from_secs(120), "the tagged namespace's pods Ready", || {
        let items = cluster.json(&["-n", "tagged", "get", "pods"])["items"].as_array().cloned().unwrap_or_default();
        (items.len() == 2 && items.iter().all(all_ready)).then_some(items)
    });
    for pod in &pods {
        assert_eq!(names(pod, "containers"), ["app", "demo-sidecar"], "{pod}");
        let stamp = pod["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap();
        let stamp = sidecar_injector_core::Stamp::parse(stamp).unwrap();
        assert_eq!((stamp.revision(), stamp.tag.as_deref()), ("default", Some("prod")), "{pod}");
    }
    assert_eq!(cli(&["tag", "list"]), "TAG   REVISION  NAMESPACES\nprod  default   tagged\n");
    let report = cli(&["status", "-n", "tagged", "--configmap", "sidecar-injector/sidecar-injector-templates"]);
    let row = report.lines().find(|l| l.starts_with("tagged ")).unwrap_or_default();
    assert!(row.contains(" default (tag prod) ") && row.contains("Deployment/shop"), "{report}");
    assert!(report.contains("\nrevision tags: prod -> default\n"), "{report}");
    cluster.kubectl_ok(&["label", "namespace", "tagged", "sidecar-injector.io/rev-"]);
    assert_eq!(cli(&["tag", "remove", "prod"]), "tag prod removed\n");
    assert_eq!(cli(&["tag", "list"]), "TAG  REVISION  NAMESPACES\n");
    cluster.kubectl_ok(&["delete", "namespace", "tagged", "--wait=false"]);
}

/// A Deployment `name` in `namespace` whose pods (labelled `app: NAME`) name `template` and sleep.
fn sleeping_deployment(namespace: &str, name: &str, template: &str, replicas: u32) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{sidecar-injector.io/template: {template}}}
    spec:
      containers:
        - {{name: app, image: "busybox:1.36", command: [sleep, "3600"]}}
"#
    )
}

/// Issue 55, item 2: the injector's Events, through its own service account and RBAC as deployed, on the pods'
/// ReplicaSets, where `kubectl describe` shows them: the shop's pods injected with demo; a Deployment whose pods
/// name a template the injector does not have, admitted without the sidecar, with the template named.
fn check_events_on_the_owners(cluster: &Cluster) {
    let described = |selector: &str, wanted: &[&str]| {
        wait_for(Duration::from_secs(60), &format!("the Events of {selector}'s ReplicaSet: {wanted:?}"), || {
            let text = cluster.kubectl_ok(&["-n", "demo", "describe", "replicaset", "-l", selector]);
            wanted.iter().all(|w| text.contains(w)).then_some(text)
        })
    };
    described("app=shop", &["Injected", "injected with template demo version"]);
    cluster.apply(&sleeping_deployment("demo", "typo", "demi", 1));
    let text = described("app=typo", &["NotInjected", "(unknown-template)", "no template named demi"]);
    assert!(text.contains("Warning"), "{text}");
    cluster.kubectl_ok(&["-n", "demo", "delete", "deployment", "typo", "--wait=false"]);
}

/// Issue 55, item 5: a sidecar's CPU resized in place (GA in 1.35). A template whose sidecar says
/// `resizePolicy: NotRequired` (added through the overlay, the README's way); its pod is resized through the
/// `resize` subresource: the kubelet applies the new CPU to the running sidecar, no container restarts, and neither
/// webhook is called (they are registered for `pods`, not its subresources).
fn check_a_sidecar_resized_in_place(cluster: &Cluster) {
    apply_templates(cluster, |dir| {
        let demo = std::fs::read_to_string(dir.join("demo.yaml")).unwrap();
        let resizable = demo.replace("demo-sidecar", "resizable-sidecar").replace("sidecar-injector-demo", "resizable").replace(
            "        resources:\n",
            "        resizePolicy:\n          - { resourceName: cpu, restartPolicy: NotRequired }\n        resources:\n",
        );
        assert!(resizable.contains("resizePolicy"));
        std::fs::write(dir.join("resizable.yaml"), resizable).unwrap();
        let kustomization = dir.parent().unwrap().join("kustomization.yaml");
        let text = std::fs::read_to_string(&kustomization).unwrap();
        let listed = text.replace(
            "      - templates/demo.yaml\n",
            "      - templates/demo.yaml\n      - templates/resizable.yaml\n",
        );
        std::fs::write(&kustomization, listed).unwrap();
    });
    let pod = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "resized", "namespace": "demo",
        "annotations": {"sidecar-injector.io/template": "resizable"}},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}}"#;
    // Until every replica has the template (the kubelet's sync): a pod that asks for it gets it.
    wait_for(Duration::from_secs(180), "the resizable template on a replica", || {
        dry_run_pod(cluster, "demo", "resizable-probe", "resizable")
            .ok()
            .filter(|p| names(p, "containers").contains(&"resizable-sidecar"))
    });
    let output = cluster.kubectl_with_input(&["create", "-f", "-"], pod);
    assert!(output.status.success(), "{}", text(&output));
    let sidecar_status = |pod: &Value| {
        pod["status"]["containerStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|c| c["name"] == "resizable-sidecar").cloned())
    };
    let before = wait_for(Duration::from_secs(90), "the resizable pod Ready", || {
        let pod = cluster.json(&["-n", "demo", "get", "pod", "resized"]);
        all_ready(&pod).then_some(pod)
    });
    assert_eq!(names(&before, "containers"), ["app", "resizable-sidecar"]);
    // Each replica's own counters, compared replica by replica: one may come or go meanwhile (the autoscaler).
    let answered_by = || {
        let families = ["sidecar_injector_requests_total", "sidecar_injector_validations_total"];
        replica_metrics(cluster)
            .into_iter()
            .map(|(name, page)| (name, families.map(|family| metric_sum(&page, family))))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    wait_for_the_injector_rollout(cluster);
    let answered = answered_by();
    let patch = r#"{"spec": {"containers": [{"name": "resizable-sidecar",
        "resources": {"requests": {"cpu": "20m"}, "limits": {"cpu": "200m"}}}]}}"#;
    cluster.kubectl_ok(&["-n", "demo", "patch", "pod", "resized", "--subresource", "resize", "--patch", patch]);
    let after = wait_for(Duration::from_secs(90), "the sidecar running with the new CPU", || {
        let pod = cluster.json(&["-n", "demo", "get", "pod", "resized"]);
        let status = sidecar_status(&pod)?;
        (status["resources"]["limits"]["cpu"] == "200m" && status["resources"]["requests"]["cpu"] == "20m")
            .then_some(pod)
    });
    for container in ["app", "resizable-sidecar"] {
        let status = |pod: &Value| {
            pod["status"]["containerStatuses"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == container)
                .cloned()
                .unwrap()
        };
        let (was, is) = (status(&before), status(&after));
        assert_eq!(is["restartCount"], 0, "{container} restarted: {is}");
        assert_eq!(was["containerID"], is["containerID"], "{container} replaced");
        assert_eq!(was["state"]["running"]["startedAt"], is["state"]["running"]["startedAt"], "{container}");
    }
    let now = answered_by();
    let common: Vec<&String> = answered.keys().filter(|name| now.contains_key(*name)).collect();
    assert!(!common.is_empty(), "no replica served throughout: {answered:?} then {now:?}");
    for name in common {
        assert_eq!(now[name], answered[name], "a resize reached our webhooks ({name})");
    }
    cluster.kubectl_ok(&["-n", "demo", "delete", "pod", "resized", "--wait=false"]);
}

/// Issue 55, item 1: `status --upgrade`. Two templates of the test's own (demo's sidecar under other names) and
/// their pods; then an edit that changes one's image alone (to the node's busybox with a label of its own, built
/// and imported: nothing is pulled) and the other's image and an env var. `--partition 1` upgrades one of the
/// two image-only pods and leaves the other; `-l` selects the other; a run over the namespace lists the reshaped
/// pod for a restart and exits 1. On the kubelet: the upgraded sidecars run the new image, the app containers
/// were not restarted (same container, same start, no restart), and `status` calls the upgraded pods current.
fn check_sidecars_upgraded_in_place(cluster: &Cluster) {
    const NEW_IMAGE: &str = "busybox:1.36-upgraded";
    let socket = cluster.dir.join("containerd/containerd.sock");
    // A new image, not a second tag of the old one (the runtime names a container's image by its ID, whose first
    // name would be the old tag): the node's busybox with a label of its own, built with buildah from the archive
    // the node's images came from, and imported.
    let cache = std::env::var("E2E_CACHE")
        .unwrap_or_else(|_| format!("{}/.cache/sidecar-injector-e2e", std::env::var("HOME").unwrap()));
    let buildah = |args: &[&str]| {
        let output = Command::new("buildah").args(args).output().unwrap();
        assert!(output.status.success(), "buildah {}: {}", args.join(" "), text(&output));
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    };
    let working = buildah(&["from", &format!("oci-archive:{cache}/images/busybox.tar")]);
    buildah(&["config", "--label", "sidecar-injector.io/test=upgraded", &working]);
    let archive = cluster.dir.join("busybox-upgraded.tar");
    buildah(&["commit", "-q", &working, &format!("oci-archive:{}:docker.io/library/{NEW_IMAGE}", archive.display())]);
    buildah(&["rm", &working]);
    cluster.import(&archive);
    let derived = |dir: &Path, name: &str, edit: &dyn Fn(String) -> String| {
        let demo = std::fs::read_to_string(dir.join("demo.yaml")).unwrap();
        let text = demo.replace("demo-sidecar", &format!("{name}-sidecar")).replace("sidecar-injector-demo", name);
        std::fs::write(dir.join(format!("{name}.yaml")), edit(text)).unwrap();
    };
    apply_templates(cluster, |dir| {
        derived(dir, "upgradable", &|t| t);
        derived(dir, "reshaped", &|t| t);
        let kustomization = dir.parent().unwrap().join("kustomization.yaml");
        let text = std::fs::read_to_string(&kustomization).unwrap().replace(
            "      - templates/demo.yaml\n",
            "      - templates/demo.yaml\n      - templates/upgradable.yaml\n      - templates/reshaped.yaml\n",
        );
        std::fs::write(&kustomization, text).unwrap();
    });
    cluster.kubectl_ok(&["create", "namespace", "upgrades"]);
    cluster.kubectl_ok(&["label", "namespace", "upgrades", "sidecar-injector.io/inject=enabled"]);
    for template in ["upgradable", "reshaped"] {
        wait_for(Duration::from_secs(180), &format!("template {template} on the replicas"), || {
            dry_run_pod(cluster, "upgrades", "probe", template)
                .ok()
                .filter(|p| names(p, "containers").contains(&format!("{template}-sidecar").as_str()))
        });
    }
    for (name, template, replicas) in [("up", "upgradable", 2), ("re", "reshaped", 1)] {
        cluster.apply(&sleeping_deployment("upgrades", name, template, replicas));
    }
    let pods = || cluster.json(&["-n", "upgrades", "get", "pods"])["items"].as_array().cloned().unwrap_or_default();
    let before = wait_for(Duration::from_secs(120), "the upgrades pods Ready", || {
        let items = pods();
        (items.len() == 3 && items.iter().all(all_ready)).then_some(items)
    });
    let container = |pod: &Value, name: &str| {
        pod["status"]["containerStatuses"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap()
    };
    // The edit: both images, and the reshaped sidecar's env as well.
    apply_templates(cluster, |dir| {
        let image = |t: String| t.replace("  image: busybox:1.36\n", &format!("  image: {NEW_IMAGE}\n"));
        derived(dir, "upgradable", &image);
        derived(dir, "reshaped", &|t| {
            image(t).replace("        env:\n", "        env:\n          - { name: RESHAPED, value: \"1\" }\n")
        });
    });
    wait_for(Duration::from_secs(180), "the edit on every replica", || {
        (0..6)
            .all(|i| {
                dry_run_pod(cluster, "upgrades", &format!("edited-{i}"), "upgradable")
                    .is_ok_and(|p| p["spec"]["containers"].as_array().unwrap().iter().any(|c| c["image"] == NEW_IMAGE))
            })
            .then_some(())
    });
    let status = |extra: &[&str]| {
        let mut args = vec!["status", "-n", "upgrades", "--configmap", "sidecar-injector/sidecar-injector-templates"];
        args.extend(extra);
        cluster.command("sidecar-injector").args(&args).output().unwrap()
    };
    let planned = status(&["--upgrade", "--dry-run"]);
    let planned_text = text(&planned);
    assert!(planned_text.contains("upgrade in place: 3 matched, 2 would upgrade"), "{planned_text}");
    assert!(planned_text.contains("restart: spec.containers[reshaped-sidecar].env"), "{planned_text}");
    let mut up: Vec<String> = before
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "up")
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    up.sort();
    // A canary: the first of the two, by name; the second kept by the partition.
    let canary = status(&["--upgrade", "-l", "app=up", "--partition", "1"]);
    let canary_text = text(&canary);
    assert!(canary.status.success(), "{canary_text}");
    assert!(canary_text.contains("upgrade in place: 2 matched, 1 upgraded, 1 ready"), "{canary_text}");
    assert!(canary_text.contains(&format!("upgrades/{}: left", up[1])), "{canary_text}");
    let rest = status(&["--upgrade", "-l", "app=up"]);
    assert!(rest.status.success(), "{}", text(&rest));
    assert!(text(&rest).contains("1 matched, 1 upgraded, 1 ready"), "{}", text(&rest));
    let whole = status(&["--upgrade"]);
    assert_eq!(
        whole.status.code(),
        Some(1),
        "the reshaped pod is left for a restart:
{}",
        text(&whole)
    );
    let after = pods();
    for name in &up {
        let was = before.iter().find(|p| &p["metadata"]["name"] == name).unwrap();
        let is = after.iter().find(|p| &p["metadata"]["name"] == name).unwrap();
        let (app_was, app_is) = (container(was, "app"), container(is, "app"));
        assert_eq!(app_is["restartCount"], 0, "{name}: {app_is}");
        assert_eq!(app_was["containerID"], app_is["containerID"], "{name}: the app was replaced");
        assert_eq!(app_was["state"]["running"]["startedAt"], app_is["state"]["running"]["startedAt"], "{name}");
        let sidecar = container(is, "upgradable-sidecar");
        assert_eq!(sidecar["ready"], true, "{name}: {sidecar}");
        assert_ne!(sidecar["containerID"], container(was, "upgradable-sidecar")["containerID"], "{name}: replaced");
        assert_eq!(is["spec"]["containers"][1]["image"], NEW_IMAGE);
        // What the runtime runs (the kubelet's status may name an image by another of its tags).
        let id = sidecar["containerID"].as_str().unwrap().trim_start_matches("containerd://");
        let info = Command::new("ctr")
            .args(["--address", socket.to_str().unwrap(), "-n", "k8s.io", "containers", "info", id])
            .output()
            .unwrap();
        assert!(info.status.success(), "ctr containers info: {}", text(&info));
        let info: Value = serde_json::from_slice(&info.stdout).unwrap();
        assert_eq!(info["Image"], format!("docker.io/library/{NEW_IMAGE}"), "{name}: the runtime's container");
    }
    // `status` judges them current; the reshaped pod stale, untouched.
    let report: Value = serde_json::from_slice(&status(&["-o", "json"]).stdout).unwrap();
    let classes: Vec<(String, String)> = report["namespaces"][0]["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w["pods"].as_array().unwrap().iter())
        .map(|p| (p["name"].as_str().unwrap().to_owned(), p["class"].as_str().unwrap().to_owned()))
        .collect();
    for (name, class) in &classes {
        let expected = if up.contains(name) { "current" } else { "stale" };
        assert_eq!(class, expected, "{name}: {classes:?}");
    }
    cluster.kubectl_ok(&["delete", "namespace", "upgrades", "--wait=false"]);
}

/// The TLS Secret `name` in the injector's namespace, from the `tls.crt` and `tls.key` that `certs` wrote into `dir`.
fn create_tls_secret(cluster: &Cluster, name: &str, dir: &str) {
    let (cert, key) = (format!("--cert={dir}/tls.crt"), format!("--key={dir}/tls.key"));
    cluster.kubectl_ok(&["-n", "sidecar-injector", "create", "secret", "tls", name, &cert, &key]);
}

/// Issue 55, item 3: the chart on the real cluster. The README's deployment is taken down and the chart installed in
/// its place with the same image and certificate (`certificates.mode: secret`, the overlay's CA and Secret): pods
/// are injected; `helm upgrade` to three replicas rolls out and pods are still injected; `helm uninstall` removes
/// the webhooks. (The chart's objects equal the manifests': tests/e2e/helm.rs.)
fn check_helm_install_and_upgrade(cluster: &Cluster) {
    let helm = String::from_utf8(
        Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/helm.sh")).arg("bin").output().unwrap().stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    assert!(Path::new(&helm).is_file(), "helm is built: tests/e2e/helm.sh build");
    // (Its webhook configurations are gone already: the creation timings above deleted them.)
    cluster.kubectl_ok(&["delete", "-k", "my-injector", "--ignore-not-found", "--wait=true", "--timeout=120s"]);
    let chart = Path::new(ROOT).join("charts/sidecar-injector");
    let chart = chart.to_str().unwrap();
    let helm_ok = |args: &[&str]| {
        let output = cluster.command(&helm).args(args).output().unwrap();
        assert!(output.status.success(), "helm {}:\n{}", args.join(" "), text(&output));
    };
    let (repository, tag) = IMAGE.split_once(':').unwrap();
    let values = [
        "--set".to_owned(),
        "certificates.mode=secret".to_owned(),
        "--set-file".to_owned(),
        "certificates.caBundle=my-injector/ca.crt".to_owned(),
        "--set".to_owned(),
        format!("image.repository={repository},image.tag={tag}"),
    ];
    let install: Vec<&str> = ["install", "sidecar-injector", chart, "-n", "default"]
        .into_iter()
        .chain(values.iter().map(String::as_str))
        .collect();
    helm_ok(&install);
    // The Secret is the user's, as the overlay's is: created from the same files.
    create_tls_secret(cluster, "sidecar-injector-tls", "my-injector");
    wait_for_the_injector_rollout(cluster);
    let injected = |name: &str| {
        wait_for(Duration::from_secs(60), "a pod injected by the chart's webhook", || {
            dry_run_pod(cluster, "demo", name, "demo").ok().filter(|p| names(p, "containers").contains(&"demo-sidecar"))
        })
    };
    injected("helm-installed");
    let upgrade: Vec<&str> = ["upgrade", "sidecar-injector", chart, "-n", "default", "--set", "replicas=3"]
        .into_iter()
        .chain(values.iter().map(String::as_str))
        .collect();
    helm_ok(&upgrade);
    wait_for_the_injector_rollout(cluster);
    let deployment = cluster.json(&["-n", "sidecar-injector", "get", "deployment", "sidecar-injector"]);
    assert_eq!(deployment["spec"]["replicas"], 3, "{}", deployment["spec"]);
    wait_for(Duration::from_secs(120), "three replicas ready", || {
        let deployment = cluster.json(&["-n", "sidecar-injector", "get", "deployment", "sidecar-injector"]);
        (deployment["status"]["readyReplicas"] == 3).then_some(())
    });
    injected("helm-upgraded");
    let releases = cluster.command(&helm).args(["list", "-n", "default", "-o", "json"]).output().unwrap();
    let releases: Value = serde_json::from_slice(&releases.stdout).unwrap();
    assert_eq!(releases[0]["revision"], "2", "{releases}");
    helm_ok(&["uninstall", "sidecar-injector", "-n", "default", "--wait"]);
    let left = cluster.kubectl(&["get", "mutatingwebhookconfiguration", "sidecar-injector"]);
    assert!(!left.status.success(), "the chart's webhook outlived the uninstall");
}

/// The floor the API server times our webhooks against (issue 54): the load harness's stack floor (`loadtest
/// __floor-server --allow-all`: hyper and rustls set up as `serve` sets them up; the review not parsed, its uid
/// echoed, allowed), deployed as ours is: the base's Deployment and Service renamed, its own image and certificate.
/// Three webhooks call it, each a copy of one of ours (its conditions, timeout and policies) with its own namespace
/// selector: a mutating one where it answers our patch to the measured pod (`--patch`; the API server then applies
/// the same patch as after ours, and on its second call gets none, as from ours), a validating one on the pods it
/// injected (as our validating webhook sees ours), and a mutating one where it answers nothing (its pods carry the
/// status annotation that withholds the patch): the do-nothing webhook.
const FLOOR: &str = "stack-floor";
const FLOOR_IMAGE: &str = "stack-floor:test";
const FLOOR_WEBHOOKS: [&str; 3] =
    ["floor-patch.sidecar-injector.io", "floor-validate.sidecar-injector.io", "floor-nothing.sidecar-injector.io"];
const OUR_WEBHOOKS: [&str; 2] = ["inject.sidecar-injector.io", "validate.sidecar-injector.io"];
/// The measurement's namespaces: ours, the floor with our patch, the do-nothing floor, and one no webhook selects.
const TIMED: [&str; 4] = ["timed-ours", "timed-floor", "timed-nothing", "timed-none"];
/// The label of each of [`TIMED`] that the webhooks select.
const TIMED_LABELS: [Option<&str>; 4] =
    [Some("sidecar-injector.io/inject=enabled"), Some("stack-floor=patch"), Some("stack-floor=nothing"), None];
/// The annotation whose key withholds the floor's patch (`--unless-body-contains`): the status annotation ours writes.
const STATUS_KEY: &str = "sidecar-injector.io/status";

/// The measured pod, `name` in `namespace`: a small app pod of the default template, as a Deployment's. In the
/// do-nothing floor's namespace it carries the status annotation, so that the floor answers it nothing.
fn timed_pod(namespace: &str, name: &str) -> Value {
    let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "timed"}},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36", "command": ["sleep", "3600"],
                 "ports": [{"containerPort": 8080}], "resources": {"requests": {"cpu": "10m"}}}]}});
    if namespace == TIMED[2] {
        pod["metadata"]["annotations"] = serde_json::json!({STATUS_KEY: "{}"});
    }
    pod
}

/// Our patch to the measured pod as the API server sends it to a webhook: the pod dry-run created where no webhook
/// is called yet (the API server's defaults and in-tree plugins applied), answered by `sidecar-injector review`
/// with the deployed templates.
fn our_patch(cluster: &Cluster) -> String {
    let output = cluster.kubectl_with_input(
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        &timed_pod(TIMED[1], "patch-source").to_string(),
    );
    assert!(output.status.success(), "{}", text(&output));
    let pod: Value = serde_json::from_slice(&output.stdout).unwrap();
    let review = sidecar_injector_core::offline::pod_create_review("measured", TIMED[1], pod);
    let output = cluster.with_input(
        "sidecar-injector",
        &["review", "--template-dir", "my-injector/templates"],
        &review.to_string(),
    );
    assert!(output.status.success(), "sidecar-injector review:\n{}", text(&output));
    let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
    use base64::Engine as _;
    let patch = answer["response"]["patch"].as_str().expect("our answer has a patch");
    let patch = base64::engine::general_purpose::STANDARD.decode(patch).unwrap();
    String::from_utf8(patch).unwrap()
}

/// `TIMED_FLOOR_BUSY_US`: microseconds of CPU the floor spends on each call before it answers (0 unless set), to
/// ask how much of the gap between ours and the floor the API server's clock shows is our CPU time per call.
fn floor_busy_ns() -> u64 {
    floor_knob("TIMED_FLOOR_BUSY_US") * 1000
}

/// `TIMED_FLOOR_TOUCH_KIB`: KiB of memory the floor writes and reads back on each call (0 unless set), to ask how
/// much of that gap is the memory our call touches, cold again after the node's other work between calls.
fn floor_touch_kib() -> u64 {
    floor_knob("TIMED_FLOOR_TOUCH_KIB")
}

fn floor_knob(name: &str) -> u64 {
    std::env::var(name).map_or(0, |value| value.parse().unwrap_or_else(|_| panic!("{name} is a number")))
}

/// Deploys the floor ([`FLOOR`]) answering `patch`; its webhook configurations are returned, not applied.
fn deploy_the_floor(cluster: &Cluster, patch: &str) -> Value {
    let loadtest = Path::new(BINARY).with_file_name("loadtest");
    assert!(loadtest.exists(), "{} is missing: `cargo build --release -p loadtest` first", loadtest.display());
    let archive = cluster.dir.join("floor.tar");
    build_image(FLOOR_IMAGE, &loadtest, &archive);
    cluster.import(&archive);
    let output =
        cluster.command("sidecar-injector").args(["certs", "--service", FLOOR, "--out", "floor-certs"]).output();
    let output = output.unwrap();
    assert!(output.status.success(), "certs for the floor:\n{}", text(&output));
    create_tls_secret(cluster, "stack-floor-tls", "floor-certs");
    std::fs::write(cluster.work.join("floor-patch.json"), patch).unwrap();
    cluster.kubectl_ok(&[
        "-n",
        "sidecar-injector",
        "create",
        "configmap",
        "stack-floor-patch",
        "--from-file=patch.json=floor-patch.json",
    ]);
    let objects = kustomized(cluster, "manifests/base");
    let of_kind = |kind: &str| objects.iter().find(|o| o["kind"] == kind).unwrap().clone();
    let labels = serde_json::json!({"app.kubernetes.io/name": FLOOR});
    let mut deployment = of_kind("Deployment");
    deployment["metadata"]["name"] = FLOOR.into();
    deployment["metadata"]["labels"] = labels.clone();
    deployment["spec"]["selector"]["matchLabels"] = labels.clone();
    let template = &mut deployment["spec"]["template"];
    template["metadata"]["labels"] =
        serde_json::json!({"app.kubernetes.io/name": FLOOR, "sidecar-injector.io/inject": "false"});
    let spec = template["spec"].as_object_mut().unwrap();
    spec.remove("topologySpreadConstraints");
    spec.insert(
        "volumes".into(),
        serde_json::json!([{"name": "tls", "secret": {"secretName": "stack-floor-tls"}},
                           {"name": "patch", "configMap": {"name": "stack-floor-patch"}}]),
    );
    let container = spec["containers"][0].as_object_mut().unwrap();
    let tls = "/etc/sidecar-injector/tls";
    for (key, value) in [
        ("name", serde_json::json!(FLOOR)),
        ("image", serde_json::json!(FLOOR_IMAGE)),
        (
            "args",
            serde_json::json!([
                "__floor-server",
                "--listen=0.0.0.0:8443",
                format!("--tls-cert={tls}/tls.crt"),
                format!("--tls-key={tls}/tls.key"),
                "--allow-all",
                "--patch=/etc/stack-floor/patch.json",
                format!("--unless-body-contains={STATUS_KEY}"),
                format!("--busy-ns={}", floor_busy_ns()),
                format!("--touch-kib={}", floor_touch_kib())
            ]),
        ),
        ("ports", serde_json::json!([{"name": "https", "containerPort": 8443, "protocol": "TCP"}])),
        ("readinessProbe", serde_json::json!({"tcpSocket": {"port": "https"}, "periodSeconds": 2})),
        (
            "volumeMounts",
            serde_json::json!([{"name": "tls", "mountPath": tls, "readOnly": true},
                               {"name": "patch", "mountPath": "/etc/stack-floor", "readOnly": true}]),
        ),
    ] {
        container.insert(key.into(), value);
    }
    container.remove("env");
    container.remove("livenessProbe");
    let mut service = of_kind("Service");
    service["metadata"]["name"] = FLOOR.into();
    service["metadata"]["labels"] = labels.clone();
    service["spec"]["selector"] = labels;
    service["spec"]["ports"] =
        serde_json::json!([{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]);
    cluster.apply(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [deployment, service]}).to_string());
    cluster.kubectl_ok(&["-n", "sidecar-injector", "rollout", "status", "deployment/stack-floor", "--timeout=120s"]);

    let ca = std::fs::read(cluster.work.join("floor-certs/ca.crt")).unwrap();
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    // Each of ours as the pattern of the floor's: (the floor's name, its namespace's label, our configuration).
    let floor = [
        (FLOOR_WEBHOOKS[0], TIMED_LABELS[1], "mutatingwebhookconfiguration"),
        (FLOOR_WEBHOOKS[1], TIMED_LABELS[1], "validatingwebhookconfiguration"),
        (FLOOR_WEBHOOKS[2], TIMED_LABELS[2], "mutatingwebhookconfiguration"),
    ];
    let configs = ["mutatingwebhookconfiguration", "validatingwebhookconfiguration"].map(|kind| {
        let ours = cluster.json(&["get", kind, "sidecar-injector"]);
        let webhooks: Vec<Value> = floor
            .iter()
            .filter(|(_, _, of)| *of == kind)
            .map(|(name, label, _)| {
                let mut webhook = ours["webhooks"][0].clone();
                assert!(OUR_WEBHOOKS.contains(&webhook["name"].as_str().unwrap()), "{webhook}");
                webhook["name"] = (*name).into();
                // The floor answers one path; the validating call gets no patch, the pod carrying the status.
                webhook["clientConfig"]["service"]["name"] = FLOOR.into();
                webhook["clientConfig"]["service"]["path"] = "/mutate".into();
                webhook["clientConfig"]["caBundle"] = ca.clone().into();
                let (key, value) = label.unwrap().split_once('=').unwrap();
                webhook["namespaceSelector"] = serde_json::json!({"matchLabels": {key: value}});
                webhook
            })
            .collect();
        let mut config = serde_json::json!({"metadata": {"name": FLOOR}, "webhooks": webhooks});
        config["apiVersion"] = ours["apiVersion"].clone();
        config["kind"] = ours["kind"].clone();
        config
    });
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": configs})
}

/// What our replicas timed so far of the reviews each of our webhooks answered ([`OUR_WEBHOOKS`] order: `mutate`,
/// `validate`), each as (seconds, calls).
fn our_own_clock(cluster: &Cluster) -> [(f64, f64); 2] {
    let replicas = replica_metrics(cluster);
    ["mutate", "validate"].map(|webhook| {
        let label = format!("webhook=\"{webhook}\"");
        let total = |family: &str| replicas.iter().map(|(_, page)| metric_sum_of(page, family, &[&label])).sum::<f64>();
        (
            total("sidecar_injector_request_duration_seconds_sum"),
            total("sidecar_injector_request_duration_seconds_count"),
        )
    })
}

/// The sum and count of a histogram of the API server's `/metrics`, over its series with every one of `labels`.
fn histogram(page: &str, family: &str, labels: &[&str]) -> (f64, f64) {
    let total = |suffix: &str| metric_sum_of(page, &format!("{family}_{suffix}"), labels);
    (total("sum"), total("count"))
}

/// What the API server has timed so far, each as (seconds, count): the calls of each admission webhook
/// ([`OUR_WEBHOOKS`], then [`FLOOR_WEBHOOKS`]), and the pod creations (server-side dry runs).
fn api_server_clock(cluster: &Cluster) -> [(f64, f64); 6] {
    let page = cluster.kubectl_ok(&["get", "--raw", "/metrics"]);
    let webhook = |name: &str| {
        let name = format!("name=\"{name}\"");
        histogram(&page, "apiserver_admission_webhook_admission_duration_seconds", &[&name, r#"operation="CREATE""#])
    };
    let creations = histogram(
        &page,
        "apiserver_request_duration_seconds",
        &[r#"verb="POST""#, r#"resource="pods""#, r#"subresource="""#, r#"dry_run="All""#],
    );
    let [inject, validate] = OUR_WEBHOOKS.map(webhook);
    let [floor_patch, floor_validate, floor_nothing] = FLOOR_WEBHOOKS.map(webhook);
    [inject, validate, floor_patch, floor_validate, floor_nothing, creations]
}

/// Creates `pods` (server-side dry runs, one kubectl, one request each, in order); what the API server timed
/// meanwhile, by [`api_server_clock`].
fn time_pods(cluster: &Cluster, pods: Vec<Value>) -> [(f64, f64); 6] {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": pods}).to_string();
    let before = api_server_clock(cluster);
    let output = cluster.kubectl_with_input(&["create", "--dry-run=server", "-o", "name", "-f", "-"], &list);
    assert!(output.status.success(), "{}", text(&output));
    let after = api_server_clock(cluster);
    std::array::from_fn(|i| (after[i].0 - before[i].0, after[i].1 - before[i].1))
}

/// The API server takes a moment to see a new webhook configuration: creates one pod in each webhook's namespace
/// until every webhook is called.
fn settle(cluster: &Cluster) {
    let mut calls = [0.0; 5];
    for round in 0..60 {
        let pods = TIMED[..3].iter().map(|namespace| timed_pod(namespace, &format!("settle-{round}"))).collect();
        let timed = time_pods(cluster, pods);
        calls = [0, 1, 2, 3, 4].map(|i| timed[i].1);
        if calls.iter().all(|count| *count > 0.0) {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("the API server did not call each of {OUR_WEBHOOKS:?} and {FLOOR_WEBHOOKS:?} (the last: {calls:?})");
}

/// The API server's own clock on our webhooks (issue 54, docs/performance.md "As the API server sees it"), on the
/// cluster as the README deploys it, with the floor ([`deploy_the_floor`]) beside ours. First `n` pods in each of
/// the three webhooks' namespaces, interleaved (the same seconds for all): each webhook's mean call as the API
/// server timed it (`apiserver_admission_webhook_admission_duration_seconds`, sum ÷ count, which includes the API
/// server's own work on the answer: decoding and applying the patch), ours ÷ the floor's; then `n` pods at a time in
/// each namespace: the mean pod creation as it timed it (`apiserver_request_duration_seconds`, POST pods).
/// Asserted: each webhook was called for each of its pods (the mutating ones twice where a patch added the sidecar:
/// the ServiceAccount plugin then mounts its token into the sidecar, and the API server calls every `IfNeeded`
/// webhook again), and the floor's pods were injected as ours.
#[test]
#[ignore = "a measurement for docs/performance.md, not run by .ci/run: needs root, the cluster (tests/e2e/cluster.sh) \
            and target/release/loadtest (cargo build --release -p loadtest)"]
fn the_api_server_times_our_webhooks_beside_a_do_nothing_one() {
    let n: usize = std::env::var("TIMED_PODS").map_or(300, |n| n.parse().expect("TIMED_PODS is a number"));
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::up_with_the_readme_deploy(dir.path());
    check_the_injector_runs_as_shipped(&cluster);
    for (namespace, label) in TIMED.iter().zip(TIMED_LABELS) {
        cluster.kubectl_ok(&["create", "namespace", namespace]);
        if let Some(label) = label {
            cluster.kubectl_ok(&["label", "namespace", namespace, label]);
        }
    }
    let config = deploy_the_floor(&cluster, &our_patch(&cluster));
    cluster.apply(&config.to_string());
    settle(&cluster);
    let injected = |namespace: &str| {
        let output = cluster.kubectl_with_input(
            &["create", "--dry-run=server", "-o", "json", "-f", "-"],
            &timed_pod(namespace, "look").to_string(),
        );
        assert!(output.status.success(), "{}", text(&output));
        let pod: Value = serde_json::from_slice(&output.stdout).unwrap();
        (names(&pod, "containers").iter().map(|s| s.to_string()).collect::<Vec<_>>(), pod["metadata"]["labels"].clone())
    };
    assert_eq!(injected(TIMED[1]), injected(TIMED[0]), "the floor's patch injects as ours does");

    let pods = (0..n)
        .flat_map(|i| TIMED[..3].iter().map(move |namespace| timed_pod(namespace, &format!("all-{i}"))))
        .collect();
    let ours_before = our_own_clock(&cluster);
    let timed = time_pods(&cluster, pods);
    let inside = {
        let after = our_own_clock(&cluster);
        [0, 1].map(|i| (after[i].0 - ours_before[i].0, after[i].1 - ours_before[i].1))
    };
    let calls = timed.map(|(_, count)| count);
    let n_calls = n as f64;
    assert!(calls[0] >= n_calls && calls[1] == n_calls, "our calls for {n} pods each: {calls:?}");
    let floor_called = calls[2] >= n_calls && calls[3] == n_calls && calls[4] == n_calls;
    assert!(floor_called, "the floor's calls for {n} pods each: {calls:?}");
    let mean_ms = |(seconds, count): (f64, f64)| 1000.0 * seconds / count;
    let [inject, validate, floor_patch, floor_validate, floor_nothing, _] = timed.map(mean_ms);
    eprintln!(
        "as the API server timed them, {n} pods for each, interleaved (the floor busy {} µs and touching {} KiB a \
         call): {} {inject:.3} ms a call ({} calls), the floor answering our patch {floor_patch:.3} ms ({}): {:.2}x; {} {validate:.3} ms ({}), the floor validating \
         {floor_validate:.3} ms ({}): {:.2}x; the do-nothing floor {floor_nothing:.3} ms ({}), {} / it: {:.2}x",
        floor_busy_ns() / 1000,
        floor_touch_kib(),
        OUR_WEBHOOKS[0],
        calls[0],
        calls[2],
        inject / floor_patch,
        OUR_WEBHOOKS[1],
        calls[1],
        calls[3],
        validate / floor_validate,
        calls[4],
        OUR_WEBHOOKS[0],
        inject / floor_nothing
    );

    let [(mutate_seconds, mutate_calls), (validate_seconds, validate_calls)] = inside;
    eprintln!(
        "our replicas' own clock over the same calls (sidecar_injector_request_duration_seconds, from the request's \
         head to the answer written): {} {:.3} ms a call ({mutate_calls} calls), {} {:.3} ms ({validate_calls})",
        OUR_WEBHOOKS[0],
        1000.0 * mutate_seconds / mutate_calls,
        OUR_WEBHOOKS[1],
        1000.0 * validate_seconds / validate_calls
    );

    let mut creations = Vec::new();
    for (namespace, what) in
        TIMED.iter().zip(["our webhooks", "the floor with our patch", "the do-nothing floor", "no webhook"])
    {
        let pods = (0..n).map(|i| timed_pod(namespace, &format!("alone-{i}"))).collect();
        creations.push((what, mean_ms(time_pods(&cluster, pods)[5])));
    }
    let none = creations[3].1;
    for (what, mean) in &creations {
        eprintln!(
            "pod creation (dry run) as the API server timed it, {n} pods: {what}: {mean:.3} ms ({:.2}x no webhook)",
            mean / none
        );
    }
    check_nothing_was_pulled(&cluster);
    let changed = cluster.down();
    assert!(changed.is_empty(), "the host differs after down:\n{}", changed.join("\n"));
}

/// The cluster script refuses what it cannot do in one line, before it changes anything.
#[test]
fn the_cluster_script_says_what_is_missing_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let empty_cache = tempfile::tempdir().unwrap();
    let state = dir.path().join("cluster");
    let output = Command::new(SCRIPT).arg("up").arg(&state).env("E2E_CACHE", empty_cache.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let running_as_root = Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
    if running_as_root {
        assert!(stderr.contains("no kube-apiserver in") && stderr.contains("build"), "{stderr}");
    } else {
        assert!(stderr.contains("must run as root"), "{stderr}");
    }
    assert!(!state.exists(), "a refused up created {}", state.display());
    let output = Command::new(SCRIPT).arg("start").output().unwrap();
    assert_eq!(output.status.code(), Some(2), "an unknown verb is a usage error");
}
