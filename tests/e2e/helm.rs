//! The Helm chart, `charts/sidecar-injector`, against the kustomize manifests it renders from values: for each
//! overlay below, `helm template` with the values that say the same renders exactly the objects `kubectl
//! kustomize` builds, compared object by object (keyed by apiVersion, kind, namespace and name, each parsed as a
//! YAML value: order and formatting do not count). The chart adds no labels of Helm's own, so nothing is
//! normalised; the one object left out is the `certs` overlay's TLS Secret, which the chart's `secret` mode takes
//! as provided (by name) rather than renders.
//!
//! The overlays: the one `sidecar-injector certs` writes (without and with a revision, an image and edited
//! templates), `manifests/cert-manager`, and that with `manifests/revision-canary` and a copy of it for a second
//! revision, as docs/operations.md says to make one, with the replicas, resources and Secret patched.
//!
//! helm comes from `tests/e2e/helm.sh build`, kubectl from `tests/e2e/apiserver.sh build` (the suite's, whatever
//! `E2E_KUBERNETES` says: no API server runs here).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

const HELM_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/helm.sh");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    root().join("charts/sidecar-injector")
}

/// Runs a program and returns what it printed; a failure shows both streams.
fn output(command: &mut Command) -> Result<String, String> {
    let what = format!("{command:?}");
    let output = command.output().map_err(|e| format!("{what}: {e}"))?;
    let stdout = String::from_utf8(output.stdout).unwrap();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{what}: {}\n{stdout}{}", output.status, String::from_utf8_lossy(&output.stderr)))
    }
}

/// The helm `tests/e2e/helm.sh` builds (cached after the first time), asked for once per run.
fn helm() -> PathBuf {
    static HELM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    HELM.get_or_init(|| {
        let status = Command::new(HELM_SCRIPT).arg("build").status().unwrap();
        assert!(status.success(), "building helm failed");
        PathBuf::from(output(Command::new(HELM_SCRIPT).arg("bin")).unwrap().trim())
    })
    .clone()
}

/// The kubectl the suite runs (`tests/e2e/apiserver.sh kubectl`).
fn kubectl() -> PathBuf {
    let path = output(Command::new(super::SCRIPT).arg("kubectl")).unwrap_or_default();
    assert!(!path.trim().is_empty(), "no kubectl: run tests/e2e/apiserver.sh build");
    PathBuf::from(path.trim())
}

/// `kubectl kustomize DIR`.
fn kustomize(dir: &Path) -> String {
    output(Command::new(kubectl()).arg("kustomize").arg(dir)).unwrap_or_else(|e| panic!("{e}"))
}

/// `helm template` of the chart with `values` (written as a values file: JSON is YAML).
fn helm_template(values: &Value) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(values).unwrap()).unwrap();
    output(Command::new(helm()).arg("template").arg("sidecar-injector").arg(chart()).arg("--values").arg(&file))
}

/// The objects of a YAML stream by `apiVersion/kind/namespace/name` (no namespace: the cluster's objects).
fn by_identity(yaml: &str, what: &str) -> BTreeMap<String, Value> {
    let documents = sidecar_injector_core::offline::read_documents(yaml).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut objects = BTreeMap::new();
    for object in documents {
        let field = |value: &Value| value.as_str().unwrap_or_default().to_owned();
        let metadata = &object["metadata"];
        let key =
            [&object["apiVersion"], &object["kind"], &metadata["namespace"], &metadata["name"]].map(field).join("/");
        assert!(objects.insert(key.clone(), object).is_none(), "{what}: {key} twice");
    }
    objects
}

/// The first place two values differ, as a JSON pointer with both values; maps by key, lists by position.
fn first_difference(chart: &Value, kustomize: &Value, at: &str) -> Option<String> {
    match (chart, kustomize) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|key| {
                let (a, b) = (a.get(key).unwrap_or(&Value::Null), b.get(key).unwrap_or(&Value::Null));
                first_difference(a, b, &format!("{at}/{}", key.replace('~', "~0").replace('/', "~1")))
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            a.iter().zip(b).enumerate().find_map(|(i, (a, b))| first_difference(a, b, &format!("{at}/{i}")))
        }
        _ if chart == kustomize => None,
        _ => Some(format!("{at}: the chart has {chart}, kustomize {kustomize}")),
    }
}

/// Every difference between the chart's objects and kustomize's, one line each: an object only one side has, or
/// the first differing path of an object both have.
fn differences(chart: &BTreeMap<String, Value>, kustomize: &BTreeMap<String, Value>) -> Vec<String> {
    let mut found = Vec::new();
    for (key, object) in chart {
        match kustomize.get(key) {
            None => found.push(format!("{key}: rendered by the chart only")),
            Some(theirs) => found.extend(first_difference(object, theirs, "").map(|d| format!("{key}: {d}"))),
        }
    }
    found.extend(kustomize.keys().filter(|k| !chart.contains_key(*k)).map(|k| format!("{k}: built by kustomize only")));
    found
}

/// Asserts that the chart with `values` renders what kustomize built (less `left_out`, checked to be there).
fn assert_renders(values: &Value, kustomized: &str, left_out: &[&str], case: &str) {
    let chart = by_identity(&helm_template(values).unwrap_or_else(|e| panic!("{case}: {e}")), "helm template");
    let mut kustomize = by_identity(kustomized, "kubectl kustomize");
    for key in left_out {
        assert!(kustomize.remove(*key).is_some(), "{case}: kustomize built no {key}");
    }
    let found = differences(&chart, &kustomize);
    assert!(found.is_empty(), "{case}: helm template differs from kubectl kustomize:\n{}", found.join("\n"));
    assert!(chart.len() >= 12, "{case}: the base's 12 objects at least: {:?}", chart.keys());
}

/// The template files of a directory, by name, as values (`templates`, `revisionTemplates.NAME`) give them.
fn files(dir: &Path) -> Value {
    let entries = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
    let files = entries.map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p)));
    Value::Object(files.map(|(name, text)| (name, Value::from(text.unwrap()))).collect())
}

/// `sidecar-injector certs` in `work` (where `manifests` is linked to the repository's).
fn certs(work: &Path, args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .arg("certs")
        .args(args)
        .current_dir(work)
        .output()
        .unwrap();
    assert!(output.status.success(), "certs {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// A directory with `manifests` linked to the repository's, for overlays that refer to it.
fn workspace() -> tempfile::TempDir {
    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root().join("manifests"), work.path().join("manifests")).unwrap();
    work
}

/// (a) A provided Secret: the overlay `certs --out DIR` writes (its Secret is what the chart takes by name), then
/// the same with an image, a revision and edited templates.
pub fn renders_the_certs_overlay() {
    let secret = "v1/Secret/sidecar-injector/sidecar-injector-tls";
    let work = workspace();
    let out = work.path().join("my-injector");
    certs(work.path(), &["--out", "my-injector"]);
    let ca = std::fs::read_to_string(out.join("ca.crt")).unwrap();
    let values = json!({"certificates": {"mode": "secret", "caBundle": ca}});
    assert_renders(&values, &kustomize(&out), &[secret], "the certs overlay");

    certs(
        work.path(),
        &["--out", "my-injector", "--image", "registry:5000/team/injector:1.20", "--revision", "canary"],
    );
    // The user's own template, listed by `certs` run again, and an edit of the canary's copy.
    let demo = std::fs::read_to_string(out.join("templates/demo.yaml")).unwrap();
    std::fs::write(out.join("templates/mine.yaml"), demo.replace("demo-sidecar", "mine-sidecar")).unwrap();
    let canary = out.join("revisions/canary/templates");
    std::fs::write(canary.join("demo.yaml"), demo.replace("busybox:1.36", "busybox:1.37")).unwrap();
    certs(work.path(), &["--out", "my-injector"]);
    let values = json!({
        "image": {"repository": "registry:5000/team/injector", "tag": "1.20"},
        "certificates": {"mode": "secret", "caBundle": ca},
        "revisions": ["canary"],
        "templates": files(&out.join("templates")),
        "revisionTemplates": {"canary": files(&canary)},
    });
    assert_renders(&values, &kustomize(&out), &[secret], "the certs overlay with --revision canary");
}

/// (b) cert-manager, the chart's default values; (c) with the revision `canary` (manifests/revision-canary) and
/// `blue` (a copy of it, `canary` replaced as docs/operations.md says), the replicas, resources, pull policy and
/// Secret patched as the values set them.
pub fn renders_the_cert_manager_overlay_and_revisions() {
    assert_renders(&json!({}), &kustomize(&root().join("manifests/cert-manager")), &[], "manifests/cert-manager");

    let work = workspace();
    let blue = work.path().join("revision-blue");
    std::fs::create_dir(&blue).unwrap();
    for entry in std::fs::read_dir(root().join("manifests/revision-canary")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap().replace("canary", "blue");
        std::fs::write(blue.join(path.file_name().unwrap()), text).unwrap();
    }
    let overlay = work.path().join("overlay");
    std::fs::create_dir(&overlay).unwrap();
    let kustomization = r#"
resources: [../manifests/cert-manager]
components: [../manifests/revision-canary, ../revision-blue]
images:
  - name: ghcr.io/sidecar-injector/sidecar-injector
    newName: registry.example.com/sidecar-injector
    newTag: "0.2.0"
patches:
  - target: {kind: Deployment, name: sidecar-injector}
    patch: |-
      - {op: replace, path: /spec/replicas, value: 3}
      - {op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: Always}
      - {op: replace, path: /spec/template/spec/containers/0/resources, value: {requests: {cpu: 250m, memory: 128Mi}, limits: {cpu: "1", memory: 1Gi}}}
      - {op: replace, path: /spec/template/spec/volumes/0/secret/secretName, value: webhook-tls}
  - target: {kind: HorizontalPodAutoscaler, name: sidecar-injector}
    patch: |-
      - {op: replace, path: /spec/minReplicas, value: 3}
  - target: {kind: Certificate, name: sidecar-injector-serving}
    patch: |-
      - {op: replace, path: /spec/secretName, value: webhook-tls}
"#;
    std::fs::write(overlay.join("kustomization.yaml"), kustomization).unwrap();
    let values = json!({
        "image": {"repository": "registry.example.com/sidecar-injector", "tag": "0.2.0", "pullPolicy": "Always"},
        "replicas": 3,
        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "certificates": {"secretName": "webhook-tls"},
        "revisions": ["canary", "blue"],
    });
    assert_renders(&values, &kustomize(&overlay), &[], "cert-manager with the revisions canary and blue");
}

/// `helm lint --strict` finds nothing to warn about, with the default values and with a provided Secret and a
/// revision; values the chart cannot render are refused with the reason.
pub fn lints_clean() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.yaml");
    let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let values = json!({"certificates": {"mode": "secret", "caBundle": ca}, "revisions": ["canary"]});
    std::fs::write(&secret, values.to_string()).unwrap();
    for extra in [&[][..], &["--values".as_ref(), secret.as_os_str()][..]] {
        let printed = output(Command::new(helm()).args(["lint", "--strict"]).arg(chart()).args(extra))
            .unwrap_or_else(|e| panic!("helm lint --strict: {e}"));
        let findings: Vec<&str> =
            printed.lines().filter(|l| l.contains("[WARNING]") || l.contains("[ERROR]")).collect();
        assert!(findings.is_empty() && printed.contains("0 chart(s) failed"), "helm lint --strict:\n{printed}");
    }

    for (values, reason) in [
        (json!({"certificates": {"mode": "secret"}}), "certificates.caBundle: the PEM of the CA"),
        (json!({"certificates": {"mode": "selfSigned"}}), "at '/certificates/mode': value must be one of"),
        (json!({"revisions": ["default"]}), "revisions: default is the default revision's name"),
        (json!({"revisions": ["Canary"]}), "at '/revisions/0': 'Canary' does not match pattern"),
        (json!({"revisions": ["canary"], "revisionTemplates": {"blue": {}}}), "revisionTemplates.blue: blue is not"),
        (json!({"templates": {"mine.txt": ""}}), "at '/templates': additional properties 'mine.txt' not allowed"),
        (json!({"replica": 3}), "additional properties 'replica' not allowed"),
        (json!({"revisions": ["canary"], "revisionTags": {"canary": "default"}}), "\"canary\" is a revision's name"),
        (json!({"revisionTags": {"prod": "blue"}}), "revision \"blue\" is neither default nor one of revisions"),
        (json!({"revisionTags": {"Prod": "default"}}), "'Prod' does not match pattern"),
    ] {
        let refused = helm_template(&values).expect_err(&values.to_string());
        assert!(refused.contains(reason), "{values}: {refused}");
    }
}

/// The chart's revision tags (`revisionTags`) are the webhook configurations `sidecar-injector tag set` makes from
/// the chart's own revision webhooks: the one derivation (`status::tags::derive`) judges the chart's templates. The
/// revisions' configurations do not change with tags.
pub fn renders_revision_tags_as_tag_set_makes_them() {
    use sidecar_injector::status::tags;
    let keys = sidecar_injector_core::settings::Keys::new(sidecar_injector_core::settings::DEFAULT_PREFIX);
    let revisions = json!({"revisions": ["canary"]});
    let tagged = json!({"revisions": ["canary"], "revisionTags": {"prod": "canary", "stable": "default"}});
    let plain = by_identity(&helm_template(&revisions).unwrap(), "helm template");
    let mut chart = by_identity(&helm_template(&tagged).unwrap(), "helm template with tags");
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        let key = |name: &str| format!("admissionregistration.k8s.io/v1/{kind}//{name}");
        let revisions = &plain[&key("sidecar-injector")];
        assert_eq!(&chart[&key("sidecar-injector")], revisions, "{kind}: the revisions' own are as without tags");
        for (tag, revision) in [("prod", "canary"), ("stable", "default")] {
            let tag = sidecar_injector_core::Tag::new(tag).unwrap();
            let made = tags::derive(&tag, revision, revisions, &keys).unwrap();
            let rendered =
                chart.remove(&key(&tags::configuration_name(&tag))).unwrap_or_else(|| panic!("{kind} {tag}"));
            let difference = first_difference(&rendered, &made, "");
            assert!(difference.is_none(), "{kind} {tag}: the chart's and `tag set`'s differ: {difference:?}");
        }
    }
    assert_eq!(chart.len(), plain.len(), "nothing else: {:?}", chart.keys());
}
