//! Helpers shared by the integration tests: build reviews, run the engine, decode and apply patches.
#![allow(dead_code)]

pub mod server;

use base64::Engine as _;
use serde_json::{Value, json};
use sidecar_injector_core::{Engine, Outcome, Settings, TemplateSet};

/// A file of the corpus of real pods and reviews kept in the repository (`tests/corpus`, see its README).
pub fn corpus(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus").join(path)
}

/// The AdmissionReview a real kube-apiserver sent for `kubectl create` of a pod, as recorded by tests/e2e.rs: the
/// oldest release's (1.20).
pub fn recorded_review() -> Vec<u8> {
    std::fs::read(corpus("reviews/apiserver-1.20-pod-create.json")).unwrap()
}

/// The same review as each release the e2e suite runs sent it (the oldest's and the newest's), by file name.
pub fn recorded_reviews() -> Vec<(&'static str, Vec<u8>)> {
    ["apiserver-1.20-pod-create.json", "apiserver-1.37-pod-create.json"]
        .into_iter()
        .map(|name| (name, std::fs::read(corpus(&format!("reviews/{name}"))).unwrap()))
        .collect()
}

pub fn engine_from(source: &str) -> Engine {
    let settings = Settings::default();
    Engine::new(TemplateSet::from_source("test", "test.yaml", source, &settings).unwrap(), &settings)
}

pub fn builtin() -> Engine {
    let settings = Settings::default();
    Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings)
}

/// The objects `kubectl kustomize` printed, one JSON value per YAML document.
pub fn kustomized_objects(yaml: &str) -> Vec<Value> {
    yaml.split("\n---\n").map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap()).collect()
}

/// `kind/name` of an object, and `kubectl get`'s words for it (the kind qualified by version and group, so that
/// an object of an API with several versions, as the HorizontalPodAutoscaler's, is read in the version written).
pub fn kubectl_get_args(object: &Value) -> (String, Vec<String>) {
    let kind = object["kind"].as_str().unwrap();
    let name = object["metadata"]["name"].as_str().unwrap();
    let api_version = object["apiVersion"].as_str().unwrap();
    let resource = match api_version.split_once('/') {
        Some((group, version)) => format!("{kind}.{version}.{group}"),
        None => kind.to_owned(),
    };
    let mut args = vec!["get".to_owned(), resource, name.to_owned()];
    if let Some(namespace) = object["metadata"]["namespace"].as_str() {
        args.extend(["-n".to_owned(), namespace.to_owned()]);
    }
    (format!("{kind}/{name}"), args)
}

/// Runs the `sidecar-injector` binary with `args` and `stdin`, as a person would, and shows what it did.
pub fn run(args: &[&str], stdin: impl AsRef<[u8]>) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Dropping the handle once written closes stdin, so the binary sees the end of its input.
    child.stdin.take().unwrap().write_all(stdin.as_ref()).unwrap();
    let output = child.wait_with_output().unwrap();
    eprintln!(
        "$ sidecar-injector {}\nstatus: {}\nstdout: {}\nstderr: {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The `value` of the env var `name` of `container`.
pub fn env_value(container: &Value, name: &str) -> Value {
    let vars = container["env"].as_array().unwrap_or_else(|| panic!("no env in {container}"));
    vars.iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("no env {name} in {container}"))["value"].clone()
}

/// A v1 Pod CREATE review around `pod`.
pub fn review(pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f7c1e9a-uid",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "object": pod,
            "oldObject": null,
            "dryRun": false
        }
    })
}

/// The engine's answer to a review: the outcome, the response JSON and the decoded patch (None when absent).
pub fn answer(engine: &Engine, review: &Value) -> (Outcome, Value, Option<Value>) {
    let mut body = serde_json::to_vec(review).unwrap();
    let mut out = Vec::new();
    let outcome = engine.review(&mut body, &mut out).unwrap();
    let response: Value = serde_json::from_slice(&out).expect("the response is JSON");
    let patch = response["response"].get("patch").map(|p| {
        let bytes = base64::engine::general_purpose::STANDARD.decode(p.as_str().unwrap()).unwrap();
        serde_json::from_slice(&bytes).expect("the patch is JSON")
    });
    (outcome, response, patch)
}

/// The patch for `pod` (as a Pod CREATE review), or None.
pub fn patch_for(engine: &Engine, pod: &Value) -> Option<Value> {
    answer(engine, &review(pod)).2
}

/// Applies a patch with an independent RFC 6902 implementation.
pub fn apply(pod: &Value, patch: &Value) -> Value {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
    let mut doc = pod.clone();
    json_patch::patch(&mut doc, &ops)
        .unwrap_or_else(|e| panic!("patch does not apply: {e}\npatch: {patch}\npod: {pod}"));
    doc
}

/// Every property the engine promises for one pod: the patch applies, is add-only, overwrites nothing present
/// (an empty map or list may be filled), keeps every original value, keeps names unique, and a second run on
/// the result gives no patch.
pub fn check_properties(engine: &Engine, pod: &Value) {
    let Some(patch) = patch_for(engine, pod) else {
        // A pod the mutating path admits as it is, the validating companion admits too: it never demands what
        // the mutating path withheld (found on a real 1.37 cluster, where it refused such a pod).
        let (outcome, response, _) = answer(engine, &review(pod));
        if response["response"]["allowed"] == true {
            let verdict = validation(engine, pod);
            assert!(
                !matches!(verdict, sidecar_injector_core::Verdict::Denied(_)),
                "{outcome:?}, then /validate {verdict:?}"
            );
        }
        return;
    };
    let ops = patch.as_array().expect("a patch is an array");
    assert!(!ops.is_empty(), "a patch is never empty: {patch}");
    let mut seen = std::collections::HashSet::new();
    for op in ops {
        assert_eq!(op["op"], "add", "only add operations: {op}");
        let path = op["path"].as_str().unwrap();
        assert!(seen.insert(path.to_owned()) || path.ends_with("/-"), "two adds at {path}: {patch}");
        if !path.ends_with("/-") && !path.rsplit('/').next().unwrap().chars().all(|c| c.is_ascii_digit()) {
            match pod.pointer(path) {
                None | Some(Value::Null) => {}
                Some(Value::Object(o)) if o.is_empty() => {}
                Some(Value::Array(a)) if a.is_empty() => {}
                // The autoscaler's list of volumes is a set: an add there keeps every name the pod listed.
                Some(Value::String(existing)) if path == SAFE_TO_EVICT_PATH => {
                    let added = op["value"].as_str().unwrap_or_else(|| panic!("{path} set to a non-string: {op}"));
                    assert_names_kept(added, existing, path);
                }
                Some(existing) => panic!("add at {path} overwrites {existing}"),
            }
        }
    }
    let patched = apply(pod, &patch);
    assert_contains(&patched, pod, "");
    assert_no_conflicting_fields(&patched, pod);
    for list in ["containers", "initContainers", "volumes"] {
        let names: Vec<&str> =
            patched["spec"][list].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "duplicate names in spec.{list}: {names:?}");
    }
    // Container names are unique across the container lists too: no name appears more often than it did.
    let before = [names(pod, "containers"), names(pod, "initContainers")].concat();
    let after = [names(&patched, "containers"), names(&patched, "initContainers")].concat();
    for name in &after {
        let count = |names: &[&str]| names.iter().filter(|n| *n == name).count();
        assert!(count(&after) <= count(&before).max(1), "{name} is in both container lists: {after:?}");
    }
    // The API server's own rules: a pod it would accept is still one it accepts once injected.
    let version = sidecar_injector_core::validation::KubeVersion::DEFAULT;
    if sidecar_injector_core::validation::validate_pod(pod, version).is_empty() {
        let problems = sidecar_injector_core::validation::validate_pod(&patched, version);
        let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(problems.is_empty(), "a valid pod became one the API server refuses: {problems:#?}\n{patched}");
    }
    assert_eq!(patch_for(engine, &patched), None, "second run on the patched pod must give no patch");
    assert_uninjects(engine, &patched, pod);
    // The validating webhook agrees: the injected pod is complete, the original one is not.
    assert_eq!(validation(engine, &patched), sidecar_injector_core::Verdict::Complete, "the injected pod validates");
    assert!(
        matches!(validation(engine, pod), sidecar_injector_core::Verdict::Incomplete { .. }),
        "a pod the engine would patch fails validation"
    );
}

/// Fields of which the API server accepts one per object: an env var's value, a probe's handler, a volume's
/// source (the common ones). Written out here, independently of the engine's own list.
const EXCLUSIVE: [(&str, &[&str]); 3] = [
    ("env", &["value", "valueFrom"]),
    ("probe", &["exec", "httpGet", "tcpSocket", "grpc"]),
    ("volume", &["emptyDir", "configMap", "secret", "persistentVolumeClaim", "hostPath", "projected", "csi"]),
];

/// The patched pod sets no two exclusive fields of one object, and no container was given a request or limit
/// for a resource it sized itself in the other map (which could put a request above a limit).
pub fn assert_no_conflicting_fields(patched: &Value, original: &Value) {
    let set = |object: &Value, fields: &[&str]| fields.iter().filter(|f| !object[**f].is_null()).count();
    let items = |pod: &Value, list: &str| pod["spec"][list].as_array().cloned().unwrap_or_default();
    for volume in items(patched, "volumes") {
        assert!(set(&volume, EXCLUSIVE[2].1) <= 1, "a volume with two sources: {volume}");
    }
    for list in ["containers", "initContainers"] {
        let before = items(original, list);
        for container in items(patched, list) {
            for var in container["env"].as_array().into_iter().flatten() {
                assert!(set(var, EXCLUSIVE[0].1) <= 1, "an env var with value and valueFrom: {var}");
            }
            let ports: Vec<&str> =
                container["ports"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
            let unique: std::collections::HashSet<_> = ports.iter().collect();
            assert_eq!(unique.len(), ports.len(), "a port name used twice: {container}");
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                assert!(set(&container[probe], EXCLUSIVE[1].1) <= 1, "a {probe} with two handlers: {container}");
            }
            let Some(was) = before.iter().find(|c| c["name"] == container["name"]) else { continue };
            for (mine, other) in [("requests", "limits"), ("limits", "requests")] {
                for resource in was["resources"][mine].as_object().into_iter().flatten().map(|(k, _)| k) {
                    assert_eq!(
                        container["resources"][other][resource], was["resources"][other][resource],
                        "the pod sized {resource} in {mine}; the patch set its {other}: {container}"
                    );
                }
            }
        }
    }
}

/// What `/validate` says of `pod` (as a Pod CREATE review).
pub fn validation(engine: &Engine, pod: &Value) -> sidecar_injector_core::Verdict {
    let mut body = serde_json::to_vec(&review(pod)).unwrap();
    let mut out = Vec::new();
    let outcome = engine.validate(&mut body, &mut out).unwrap();
    let response: Value = serde_json::from_slice(&out).expect("the response is JSON");
    assert!(response["response"].get("patch").is_none(), "validation never patches");
    outcome.verdict
}

/// Every value in `original` is still in `patched` (lists: every original item, in order, at its index or
/// shifted by insertions before it).
pub fn assert_contains(patched: &Value, original: &Value, at: &str) {
    match (patched, original) {
        // null is "absent" to the API server: filling it loses nothing.
        (_, Value::Null) => {}
        (Value::Object(p), Value::Object(o)) => {
            for (k, v) in o {
                let child = p.get(k).unwrap_or_else(|| panic!("{at}/{k} was lost"));
                assert_contains(child, v, &format!("{at}/{k}"));
            }
        }
        (Value::Array(p), Value::Array(o)) => {
            // Original items keep their relative order; inserted items may sit between them.
            let mut next = 0;
            for (i, item) in o.iter().enumerate() {
                let found = p[next..].iter().position(|c| contains(c, item));
                let offset = found.unwrap_or_else(|| panic!("{at}/{i} was lost or changed: {item}"));
                next += offset + 1;
            }
        }
        (Value::String(p), Value::String(o)) if at.strip_prefix("/metadata/annotations/") == Some(SAFE_TO_EVICT) => {
            assert_names_kept(p, o, at)
        }
        (p, o) => assert_eq!(p, o, "{at} was changed"),
    }
}

/// The cluster autoscaler's annotation of local volumes it may evict a pod with: comma-separated names, which the
/// injector adds its own local volumes to (written out here, independently of the engine's own constant).
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes";
const SAFE_TO_EVICT_PATH: &str = "/metadata/annotations/cluster-autoscaler.kubernetes.io~1safe-to-evict-local-volumes";

/// The names of a comma-separated list, as the cluster autoscaler splits it (spaces around a name trimmed).
pub fn listed(names: &str) -> Vec<&str> {
    names.split(',').map(str::trim).filter(|n| !n.is_empty()).collect()
}

/// `patched`, a comma-separated list, names every name `original` does, and `original` is its start: the pod's own
/// list is kept as written, the injector's names appended.
fn assert_names_kept(patched: &str, original: &str, at: &str) {
    let kept = listed(original).iter().all(|name| listed(patched).contains(name));
    assert!(
        kept && (patched == original || patched.starts_with(original.trim().trim_end_matches(','))),
        "{at}: {original:?} became {patched:?}"
    );
}

fn contains(patched: &Value, original: &Value) -> bool {
    match (patched, original) {
        (_, Value::Null) => true,
        (Value::Object(p), Value::Object(o)) => o.iter().all(|(k, v)| p.get(k).is_some_and(|c| contains(c, v))),
        (Value::Array(p), Value::Array(o)) => o.len() <= p.len() && o.iter().all(|i| p.iter().any(|c| contains(c, i))),
        (p, o) => p == o,
    }
}

/// The names of the items of `pod.spec.<list>`.
pub fn names<'a>(pod: &'a Value, list: &str) -> Vec<&'a str> {
    pod["spec"][list].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect()
}

/// The operations of `patch` whose path starts with `prefix`.
pub fn ops_under<'a>(patch: &'a Value, prefix: &str) -> Vec<&'a Value> {
    patch.as_array().unwrap().iter().filter(|op| op["path"].as_str().unwrap().starts_with(prefix)).collect()
}

/// `uninject` takes out of `injected` (which `engine` injected into `original`) only what was added: what remains
/// is contained in `original` (a value the pod had set to exactly the template's own, or an empty map, cannot be
/// told from an injected one and goes too), and injecting it again gives `injected` back.
pub fn assert_uninjects(engine: &Engine, injected: &Value, original: &Value) {
    let mut document = injected.clone();
    document["apiVersion"] = "v1".into();
    document["kind"] = "Pod".into();
    sidecar_injector_core::offline::uninject_document(engine, &mut document, "shop")
        .unwrap_or_else(|e| panic!("uninject: {e}\noriginal: {original}"));
    let stripped = json!({"metadata": document["metadata"], "spec": document["spec"]});
    let mut expected = original.clone();
    if let Some(o) = expected.as_object_mut() {
        o.retain(|k, _| k == "metadata" || k == "spec");
    }
    assert_within(&stripped, &expected, "");
    let again = match patch_for(engine, &stripped) {
        Some(patch) => apply(&stripped, &patch),
        None => stripped.clone(),
    };
    let injected_part = json!({"metadata": injected["metadata"], "spec": injected["spec"]});
    assert_eq!(again, injected_part, "injecting the uninjected pod gives the injected one back");
}

/// Every value of `part` is in `whole`, as it is there (lists item by item, in order).
fn assert_within(part: &Value, whole: &Value, at: &str) {
    match (part, whole) {
        (Value::Null, _) => {}
        (Value::Object(p), Value::Object(w)) => {
            for (k, v) in p {
                let there = w.get(k).unwrap_or_else(|| panic!("uninject added {at}/{k}: {v}"));
                assert_within(v, there, &format!("{at}/{k}"));
            }
        }
        (Value::Array(p), Value::Array(w)) => {
            let mut next = 0;
            for (i, item) in p.iter().enumerate() {
                let found = w[next..].iter().position(|c| contains(c, item));
                let offset =
                    found.unwrap_or_else(|| panic!("uninject left {at}/{i} that the pod did not have: {item}"));
                next += offset + 1;
            }
        }
        // A list of names comes back with the same names (its spacing and commas are the union's).
        (Value::String(p), Value::String(w)) if at.strip_prefix("/metadata/annotations/") == Some(SAFE_TO_EVICT) => {
            assert_eq!(listed(p), listed(w), "uninject changed {at}")
        }
        (p, w) => assert_eq!(p, w, "uninject changed {at}"),
    }
}
