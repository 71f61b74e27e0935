//! The request bodies: Pod CREATE `AdmissionReview`s, from a directory of pods or grown to a size class, each
//! stamped with a unique uid (and, for generated pods named per request, a unique name) when it is sent.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};

/// Where the bodies come from (`--bodies`).
#[derive(Debug, Clone, PartialEq)]
pub enum BodySpec {
    /// Every `*.json` pod of the `--pods` directory, in file-name order, sent round robin.
    Corpus,
    /// The real API server capture, its pod grown with env vars and annotations to about this many bytes.
    Size(usize),
    /// A pod at the API server's limits, by its name in `benches/support/reviews.rs` (`env-1500`,
    /// `containers-250`, `annotations-10000`, `last-applied-250KiB`, `volumes-1000`).
    Pathological(&'static str),
}

impl FromStr for BodySpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "corpus" {
            return Ok(BodySpec::Corpus);
        }
        // The pod beyond the API server's limits is refused (400), which the harness counts as a failed answer.
        let pathological = || {
            let names = crate::reviews::PATHOLOGICAL.iter().map(|(name, _)| *name);
            names.filter(|name| *name != crate::reviews::BEYOND_API_LIMITS)
        };
        if let Some(name) = pathological().find(|name| *name == s) {
            return Ok(BodySpec::Pathological(name));
        }
        let lower = s.to_ascii_lowercase();
        let (digits, unit) = match lower.strip_suffix(['k', 'm']) {
            Some(digits) => (digits, if lower.ends_with('k') { 1_000 } else { 1_000_000 }),
            None => (lower.as_str(), 1),
        };
        match digits.parse::<f64>() {
            Ok(n) if n >= 1.0 => Ok(BodySpec::Size((n * unit as f64) as usize)),
            _ => Err(format!(
                "{s:?}: expected `corpus`, a size such as 2k, 6k, 60k, 1m, or a pod at the API server's limits: {}",
                pathological().collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

/// How a generated pod is named (`--generate-name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// A new name on every request, as for pods created one by one, the rest of the pod the same: a template that
    /// reads the name renders its per-pod leaves every time (the built-in one reads it only for a pod without an
    /// `app` label, which the generated pods have).
    Unique,
    /// As a ReplicaSet creates pods: `generateName`, no name yet, the `pod-template-hash` label and the owner
    /// reference, the same in every request (the usual case in a cluster; the injector renders the per-pod
    /// leaves once per thread and then reuses them).
    Controller,
}

/// The `generateName` of generated controller pods, and its `pod-template-hash`.
const REPLICASET: &str = "loadtest-5d8f7b9c6";
const TEMPLATE_HASH: &str = "5d8f7b9c6";

/// The real API server's request for `kubectl create` of a pod (v1.20): the base of every generated body.
const CAPTURE: &str = "reviews/apiserver-1.20-pod-create.json";

/// Length of a uid as Kubernetes writes it (a UUID).
pub const UID_LEN: usize = 36;
/// The uid of a body as loaded, before [`Body::stamp`] gives it its own.
pub const UID_PLACEHOLDER: &str = "00000000-0000-4000-8000-000000000000";
/// A generated pod's name; its 12 digits are rewritten on every request.
const NAME_PLACEHOLDER: &str = "loadtest-000000000000";

/// One AdmissionReview, ready to be stamped and sent.
pub struct Body {
    /// Where it came from (a file name, or the size class).
    pub name: String,
    /// The review, with a placeholder uid.
    review: Bytes,
    uid_at: usize,
    /// Where the 12 digits of a generated pod's name are, if it has one to vary.
    name_digits_at: Option<usize>,
    /// The pod as sent, to apply a response's patch to.
    pub pod: Value,
}

impl Body {
    fn new(name: String, review: &Value) -> Body {
        let bytes = serde_json::to_vec(review).expect("a serde_json::Value always serialises");
        let find = |needle: &str| bytes.windows(needle.len()).position(|w| w == needle.as_bytes());
        // The uid placeholder is written by `wrap` below and cannot occur anywhere else in a real pod.
        let uid_at = find(UID_PLACEHOLDER).expect("wrap writes the uid placeholder");
        let name_digits_at = find(NAME_PLACEHOLDER).map(|at| at + NAME_PLACEHOLDER.len() - 12);
        let pod = review["request"]["object"].clone();
        Body { name, review: Bytes::from(bytes), uid_at, name_digits_at, pod }
    }

    /// Size of the review in bytes.
    pub fn len(&self) -> usize {
        self.review.len()
    }

    /// The review as loaded: its uid is [`UID_PLACEHOLDER`], and a generated pod named per request has its
    /// placeholder name (of the same length as every stamped one).
    pub fn unstamped(&self) -> &Bytes {
        &self.review
    }

    /// The same review with its pod injected by `engine` (the answering engine: the built-in template), as the
    /// validating webhook receives it after the mutating one's patch.
    pub fn injected(&self, engine: &sidecar_injector_core::Engine) -> Result<Body, String> {
        let mut review: Value = serde_json::from_slice(&self.review).map_err(|e| format!("{}: {e}", self.name))?;
        let namespace = review["request"]["namespace"].as_str().unwrap_or("default").to_owned();
        let pod = &mut review["request"]["object"];
        sidecar_injector_core::offline::inject_document(engine, pod, &namespace)
            .map_err(|e| format!("{}: not injected: {e}", self.name))?;
        Ok(Body::new(self.name.clone(), &review))
    }

    /// The review for request number `seq` of this run: its own uid, written to `uid`, and for a generated pod
    /// its own name.
    pub fn stamp(&self, run: u32, seq: u64, uid: &mut [u8; UID_LEN]) -> Bytes {
        let mut cursor = std::io::Cursor::new(&mut uid[..]);
        // 8 + 4 + 4 + 4 + 12 hex digits and 4 dashes: exactly UID_LEN bytes, so the write cannot fail.
        write!(cursor, "{run:08x}-0000-4000-8000-{:012x}", seq & 0xffff_ffff_ffff).unwrap();
        let mut review = BytesMut::from(&self.review[..]);
        review[self.uid_at..self.uid_at + UID_LEN].copy_from_slice(uid);
        if let Some(at) = self.name_digits_at {
            review[at..at + 12].copy_from_slice(&uid[UID_LEN - 12..]);
        }
        review.freeze()
    }
}

/// Which of the injector's webhooks the harness drives (`--webhook`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Webhook {
    /// `/mutate`, with the bodies as loaded.
    #[default]
    Mutate,
    /// `/validate`, with each body's pod injected first ([`Body::injected`]): what the validating webhook receives
    /// for every pod the mutating one injected.
    Validate,
}

impl Webhook {
    /// The engine's answer to `body` as this webhook gives it.
    pub fn answer(
        self,
        engine: &sidecar_injector_core::Engine,
        body: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<sidecar_injector_core::Outcome, sidecar_injector_core::ReviewError> {
        match self {
            Webhook::Mutate => engine.review(body, out),
            Webhook::Validate => engine.validate(body, out),
        }
    }

    /// `url` (a started injector's `/mutate` URL) at this webhook's path.
    pub fn url(self, url: &str) -> String {
        match (self, url.strip_suffix("/mutate")) {
            (Webhook::Validate, Some(base)) => format!("{base}/validate"),
            _ => url.to_owned(),
        }
    }
}

/// Where the harness finds the corpus by default: `tests/corpus` of the repository it was built from.
pub fn default_corpus() -> PathBuf {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus");
    corpus.canonicalize().unwrap_or(corpus)
}

/// Why the bodies could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// A file is not JSON, or not a Pod.
    #[error("{}: {reason}", path.display())]
    NotAPod { path: PathBuf, reason: String },
    /// The directory has no pods.
    #[error("{}: no *.json pods in this directory (give another with --pods, or --bodies 6k)", .0.display())]
    Empty(PathBuf),
}

/// The bodies of `spec`: the pods of `pods_dir`, or the capture in `corpus_dir` grown to a size.
/// Pods of the directory that are not valid Pods are left out and returned as errors beside the bodies.
pub fn load(
    spec: &BodySpec,
    naming: Naming,
    pods_dir: &Path,
    corpus_dir: &Path,
) -> Result<(Vec<Body>, Vec<BodyError>), BodyError> {
    match spec {
        BodySpec::Corpus => from_pods(pods_dir),
        BodySpec::Size(size) => Ok((vec![of_size(*size, naming, &corpus_dir.join(CAPTURE))?], Vec::new())),
        BodySpec::Pathological(name) => Ok((vec![pathological(name)], Vec::new())),
    }
}

fn read_json(path: &Path) -> Result<Value, BodyError> {
    let bytes = std::fs::read(path).map_err(|source| BodyError::Read { path: path.to_owned(), source })?;
    serde_json::from_slice(&bytes).map_err(|e| BodyError::NotAPod { path: path.to_owned(), reason: e.to_string() })
}

fn from_pods(dir: &Path) -> Result<(Vec<Body>, Vec<BodyError>), BodyError> {
    let entries = std::fs::read_dir(dir).map_err(|source| BodyError::Read { path: dir.to_owned(), source })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(BodyError::Empty(dir.to_owned()));
    }
    let (mut bodies, mut skipped) = (Vec::new(), Vec::new());
    let read = |path: &PathBuf| {
        let pod = read_json(path)?;
        if pod["kind"] != "Pod" {
            return Err(BodyError::NotAPod { path: path.clone(), reason: "not a Pod (kind)".into() });
        }
        // The API server decodes the object before it calls any webhook, so a pod that does not decode
        // (a few examples carry placeholders such as `lun: "<ADD LUN ID Here>"`) never reaches one.
        if let Err(e) = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(pod.clone()) {
            return Err(BodyError::NotAPod { path: path.clone(), reason: format!("not a valid Pod: {e}") });
        }
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        Ok(Body::new(name, &wrap(pod)))
    };
    for path in &paths {
        match read(path) {
            Ok(body) => bodies.push(body),
            Err(e @ BodyError::NotAPod { .. }) => skipped.push(e),
            Err(e) => return Err(e),
        }
    }
    if bodies.is_empty() {
        return Err(skipped.pop().unwrap_or(BodyError::Empty(dir.to_owned())));
    }
    Ok((bodies, skipped))
}

/// A Pod CREATE review of `pod`, as the API server sends it for a controller creating a pod.
fn wrap(pod: Value) -> Value {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default").to_owned();
    let gvk = json!({"group": "", "version": "v1", "kind": "Pod"});
    let gvr = json!({"group": "", "version": "v1", "resource": "pods"});
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": UID_PLACEHOLDER,
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "5c2f1ba0-3c9e-4a43-8b5a-8f0b1c1f7d11",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]
            },
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// The pathological pod `name`, its uid the placeholder and its name varied per request.
fn pathological(name: &str) -> Body {
    let body = crate::reviews::pathological_review(name).expect("parsed from the table");
    let mut review: Value = serde_json::from_slice(&body).expect("the benches' reviews are JSON");
    review["request"]["uid"] = json!(UID_PLACEHOLDER);
    review["request"]["object"]["metadata"]["name"] = json!(NAME_PLACEHOLDER);
    Body::new(format!("pathological {name}"), &review)
}

/// The capture, its pod named as `naming` says and grown to about `size` bytes: env vars on the first container,
/// and (up to 100) annotations, the way real pods grow.
fn of_size(size: usize, naming: Naming, capture: &Path) -> Result<Body, BodyError> {
    let mut review = read_json(capture)?;
    review["request"]["uid"] = json!(UID_PLACEHOLDER);
    let object = &mut review["request"]["object"];
    match naming {
        Naming::Unique => object["metadata"]["name"] = json!(NAME_PLACEHOLDER),
        Naming::Controller => {
            let metadata = object["metadata"].as_object_mut().expect("the capture's pod has metadata");
            metadata.remove("name");
            metadata.insert("generateName".into(), json!(format!("{REPLICASET}-")));
            metadata.insert(
                "ownerReferences".into(),
                json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": REPLICASET,
                        "uid": "6f1d2c3b-4a59-4e8f-9d7c-0b1a2c3d4e5f", "controller": true, "blockOwnerDeletion": true}]),
            );
            object["metadata"]["labels"]["pod-template-hash"] = json!(TEMPLATE_HASH);
        }
    }
    let mut annotations = object["metadata"]["annotations"].as_object().cloned().unwrap_or_default();
    let mut env = object["spec"]["containers"][0]["env"].as_array().cloned().unwrap_or_default();
    // Track the size by the entries added rather than by serialising the whole review at each step.
    let mut length = serde_json::to_vec(&review).map_or(0, |v| v.len());
    let mut i = 0usize;
    while length < size {
        if i.is_multiple_of(4) && annotations.len() < 100 {
            let (key, value) = (format!("example.com/note-{i}"), format!("a \"quoted\" note number {i}"));
            length += key.len() + value.len() + 8;
            annotations.insert(key, json!(value));
        } else {
            let var = json!({"name": format!("SETTING_{i}"), "value": format!("value-{i}-{}", "x".repeat(24))});
            length += var.to_string().len() + 1;
            env.push(var);
        }
        i += 1;
    }
    let object = &mut review["request"]["object"];
    object["metadata"]["annotations"] = Value::Object(annotations);
    object["spec"]["containers"][0]["env"] = Value::Array(env);
    Ok(Body::new(format!("generated ~{}", human_bytes(size)), &review))
}

/// 6000 as "6 KB", 1000000 as "1 MB".
pub fn human_bytes(n: usize) -> String {
    match n {
        n if n >= 1_000_000 => format!("{:.3} MB", n as f64 / 1e6).replace(".000", ""),
        n if n >= 1_000 => format!("{:.1} KB", n as f64 / 1e3).replace(".0 ", " "),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> PathBuf {
        default_corpus()
    }

    /// `--webhook validate`: each body's pod as the mutating webhook left it, which the validating one admits whole
    /// (the floor's fixed answers are those: allowed, no patch), at `/validate`.
    #[test]
    fn validated_bodies_are_injected_and_complete() {
        let engine = crate::stack_floor::answering_engine().unwrap();
        let (bodies, _) = load(&BodySpec::Size(8_000), Naming::Unique, &corpus().join("pods"), &corpus()).unwrap();
        let injected = bodies[0].injected(&engine).unwrap();
        let names: Vec<&str> = (injected.pod["spec"]["containers"].as_array().unwrap().iter())
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"proxy") && injected.len() > bodies[0].len(), "{names:?}");
        let mut buf = injected.unstamped().to_vec();
        buf.reserve(sidecar_injector_core::PARSE_PADDING);
        let outcome = Webhook::Validate.answer(&engine, &mut buf, &mut Vec::new()).unwrap();
        assert_eq!(outcome.verdict, sidecar_injector_core::Verdict::Complete);
        let fixed = crate::stack_floor::fixed_answers(&[injected], Webhook::Validate).unwrap();
        assert!(!String::from_utf8_lossy(&fixed.answers()[0]).contains("patch"), "admitted as it is");
        assert_eq!(Webhook::Validate.url("https://127.0.0.1:8443/mutate"), "https://127.0.0.1:8443/validate");
        assert_eq!(Webhook::Mutate.url("https://127.0.0.1:8443/mutate"), "https://127.0.0.1:8443/mutate");
    }

    #[test]
    fn specs_parse() {
        assert_eq!("corpus".parse(), Ok(BodySpec::Corpus));
        assert_eq!("2k".parse(), Ok(BodySpec::Size(2_000)));
        assert_eq!("60K".parse(), Ok(BodySpec::Size(60_000)));
        assert_eq!("1m".parse(), Ok(BodySpec::Size(1_000_000)));
        assert_eq!("6500".parse(), Ok(BodySpec::Size(6_500)));
        assert!("lots".parse::<BodySpec>().is_err());
        assert!("0k".parse::<BodySpec>().is_err());
    }

    #[test]
    fn generated_bodies_reach_their_size_class() {
        for size in [2_000, 8_000, 60_000, 1_000_000] {
            let body = of_size(size, Naming::Unique, &corpus().join(CAPTURE)).unwrap();
            assert!(body.len() >= size && body.len() < size + size / 10 + 500, "{size}: {}", body.len());
            let review: Value = serde_json::from_slice(&body.review).unwrap();
            assert_eq!(review["request"]["operation"], "CREATE");
        }
    }

    #[test]
    fn every_stamp_has_its_own_uid_and_name() {
        let body = of_size(2_000, Naming::Unique, &corpus().join(CAPTURE)).unwrap();
        let mut uid = [0u8; UID_LEN];
        let first: Value = serde_json::from_slice(&body.stamp(7, 1, &mut uid)).unwrap();
        assert_eq!(first["request"]["uid"], std::str::from_utf8(&uid).unwrap());
        let second: Value = serde_json::from_slice(&body.stamp(7, 2, &mut uid)).unwrap();
        assert_eq!(second["request"]["uid"], "00000007-0000-4000-8000-000000000002");
        assert_ne!(first["request"]["uid"], second["request"]["uid"]);
        assert_eq!(second["request"]["object"]["metadata"]["name"], "loadtest-000000000002");
    }

    #[test]
    fn controller_pods_share_everything_but_the_uid() {
        let body = of_size(6_000, Naming::Controller, &corpus().join(CAPTURE)).unwrap();
        assert!(body.len() >= 6_000);
        let mut uid = [0u8; UID_LEN];
        let mut first: Value = serde_json::from_slice(&body.stamp(7, 1, &mut uid)).unwrap();
        let mut second: Value = serde_json::from_slice(&body.stamp(7, 2, &mut uid)).unwrap();
        let metadata = &first["request"]["object"]["metadata"];
        assert_eq!(metadata.get("name"), None);
        assert_eq!(metadata["generateName"], "loadtest-5d8f7b9c6-");
        assert_eq!(metadata["labels"]["pod-template-hash"], "5d8f7b9c6");
        assert_eq!(metadata["ownerReferences"][0]["kind"], "ReplicaSet");
        assert_ne!(first["request"]["uid"], second["request"]["uid"]);
        first["request"]["uid"].take();
        second["request"]["uid"].take();
        assert_eq!(first, second);
    }

    #[test]
    fn corpus_pods_become_pod_create_reviews() {
        let (bodies, skipped) = from_pods(&corpus().join("pods")).unwrap();
        assert!(bodies.len() > 300);
        assert!(skipped.len() < 5, "{skipped:?}");
        assert!(skipped.iter().all(|e| e.to_string().contains("not a valid Pod")), "{skipped:?}");
        let mut uid = [0u8; UID_LEN];
        for body in &bodies {
            let review: Value = serde_json::from_slice(&body.stamp(1, 9, &mut uid)).unwrap();
            assert_eq!(review["request"]["kind"]["kind"], "Pod", "{}", body.name);
            assert_eq!(review["request"]["object"], body.pod, "{}", body.name);
        }
    }

    #[test]
    fn an_empty_directory_is_refused_with_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let e = from_pods(dir.path()).err().unwrap().to_string();
        assert!(e.contains("no *.json pods") && e.contains("--bodies"), "{e}");
    }
}
