//! A real node: a one-node Kubernetes 1.20 cluster (`tests/e2e/cluster.sh`: the API server, the controllers, the
//! scheduler, a kubelet on containerd and runc, kube-proxy) judges the drop-in Deployment as the API server judges
//! a pod. The image is built from the binary under test (`manifests/image.sh`) and imported; the README's deploy
//! path runs as written (its shell blocks, read from README.md, with the one change the README gives for a cluster
//! of this version); the pods we inject must start, and the sidecar must share them. Nothing is pulled: a pull
//! attempt fails at once (containerd's registries are behind a proxy that is not there) and fails the test.
//!
//! `cargo test --release --test cluster -- --include-ignored`, as root (tests/e2e/README.md). The first run builds
//! the Kubernetes binaries from Debian's source (17 to 20 minutes on 2 cores) into `~/.cache/sidecar-injector-e2e`.
//!
//! One test runs the scenarios in order on one cluster (bringing it up costs 30 to 60 s), then takes it down and
//! checks that the host is as it was (sysctls, iptables chains and rules, links, routes, mounts, paths, cgroups).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/cluster.sh");
const BINARY: &str = env!("CARGO_BIN_EXE_sidecar-injector");
/// The Kubernetes version of the cluster, as the README tells `certs` for an older cluster.
const VERSION: &str = "1.20";
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

    /// Applies YAML from standard input.
    fn apply(&self, yaml: &str) {
        let mut child = self
            .command("kubectl")
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
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
    let build = |dir: &str| -> Vec<Value> {
        let yaml = cluster.kubectl_ok(&["kustomize", dir]);
        yaml.split("\n---\n").map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap()).collect()
    };
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
    expected_args.push(format!("--kubernetes-version={VERSION}").into());
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

/// The Deployment as it runs: the shipped replicas Ready, non-root, a read-only root filesystem, the probes.
fn check_the_injector_runs_as_shipped(cluster: &Cluster) {
    let deployment = cluster.json(&["-n", "sidecar-injector", "get", "deployment", "sidecar-injector"]);
    assert_eq!(deployment["status"]["readyReplicas"], 2, "{}", deployment["status"]);
    let pods =
        cluster.json(&["-n", "sidecar-injector", "get", "pods", "-l", "app.kubernetes.io/name=sidecar-injector"]);
    let pods = pods["items"].as_array().unwrap();
    assert_eq!(pods.len(), 2);
    for pod in pods {
        assert!(all_ready(pod), "{}", pod["status"]);
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["image"], IMAGE);
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
          command: [sh, -c, 'until wget -qO- http://127.0.0.1:15000/; do sleep 1; done; exec sleep 3600']
          readinessProbe:
            exec: {command: [cat, /var/run/demo/index.html]}
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
    // A Job's pod at 1.20: the demo template's `jobs` is `native-sidecar`, which needs 1.29, so with
    // --kubernetes-version 1.20 the pod is admitted without the sidecar and the Job completes.
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
        - {name: app, image: "busybox:1.36", command: [sh, -c, "echo done"]}
"#,
    );
    cluster.kubectl_ok(&["-n", "demo", "wait", "--for=condition=complete", "job/once", "--timeout=90s"]);
    let pods = cluster.json(&["-n", "demo", "get", "pods", "-l", "job-name=once"]);
    assert_eq!(names(&pods["items"][0], "containers"), ["app"], "{}", pods["items"][0]["spec"]);
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

#[test]
#[ignore = "needs root and a one-node cluster: tests/e2e/cluster.sh (tests/e2e/README.md)"]
fn a_real_node_runs_the_readme_deploy_path_and_the_pods_we_inject() {
    let output = Command::new(SCRIPT).arg("build").output().unwrap();
    assert!(output.status.success(), "cluster.sh build failed:\n{}", text(&output));
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::up(dir.path());

    // The image, without a daemon, from the binary under test; the same as the Dockerfile's.
    let archive = dir.path().join("image.tar");
    let output = Command::new(Path::new(ROOT).join("manifests/image.sh"))
        .args(["--tag", IMAGE, "--binary", BINARY, "--out"])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(output.status.success(), "manifests/image.sh:\n{}", text(&output));
    check_image_matches_the_dockerfile(&image_config(&archive));
    let output = Command::new(SCRIPT).arg("import").arg(dir.path()).arg(&archive).output().unwrap();
    assert!(output.status.success(), "import:\n{}", text(&output));

    // The README's deploy path as written, with the change it documents for a cluster older than 1.30.
    let deploy = readme_block("deploy");
    let documented = format!("--kubernetes-version {VERSION}");
    let certs_line = deploy.lines().find(|l| l.starts_with("sidecar-injector certs")).expect("a certs line").to_owned();
    let deploy = deploy.replace(&certs_line, &format!("{certs_line} {documented}"));
    let output = cluster.shell(&deploy);
    assert!(output.status.success(), "the README's deploy block failed:\n{deploy}\n{}", text(&output));
    check_overlay_changes_only_what_the_readme_says(&cluster);
    check_the_injector_runs_as_shipped(&cluster);

    let try_it = readme_block("try-it");
    let output = cluster.shell(&try_it);
    let printed = text(&output);
    assert!(output.status.success(), "the README's try-it block failed:\n{try_it}\n{printed}");
    assert!(printed.contains("web demo-sidecar"), "{printed}");
    assert!(printed.contains("hello from the sidecar of demo/web"), "{printed}");

    check_injected_pods_start_and_share(&cluster);
    check_what_is_not_injected(&cluster);
    check_nothing_was_pulled(&cluster);

    let changed = cluster.down();
    assert!(changed.is_empty(), "the host differs after down:\n{}", changed.join("\n"));
    // A second teardown is harmless.
    let output = Command::new(SCRIPT).arg("down").arg(dir.path()).output().unwrap();
    assert!(output.status.success(), "a second down:\n{}", text(&output));
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
