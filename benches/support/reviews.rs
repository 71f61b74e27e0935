//! The reviews the benchmarks send, shared by `benches/engine.rs` (criterion, wall-clock) and
//! `core/benches/gate.rs` (instruction counts): the recorded API server request grown to a size, and the
//! pathological pods, valid pods at the API server's limits (issue 54).

use serde_json::{Value, json};

/// The pod's name and its `app` label, whose 8 digits the benchmarks that vary them rewrite on every call.
pub const UNIQUE_NAME: &str = "name-00000000";
pub const UNIQUE_APP: &str = "app-00000000";

/// The real API server request (1.20), as recorded.
pub fn recorded() -> Value {
    let text = include_str!("../../tests/corpus/reviews/apiserver-1.20-pod-create.json");
    serde_json::from_str(text).expect("the recorded review is JSON")
}

/// The recorded review, its pod renamed `UNIQUE_NAME` and labelled `app: UNIQUE_APP`.
fn placeholder_review() -> Value {
    let mut review = recorded();
    review["request"]["object"]["metadata"]["name"] = json!(UNIQUE_NAME);
    review["request"]["object"]["metadata"]["labels"]["app"] = json!(UNIQUE_APP);
    review
}

/// Where the 8 digits of `placeholder` are in `body`.
pub fn digits_of(body: &[u8], placeholder: &str) -> usize {
    let at = body.windows(placeholder.len()).position(|w| w == placeholder.as_bytes());
    at.expect("the placeholder is in the body") + placeholder.len() - 8
}

/// Writes `n` in hex over the 8 digits at `at`.
pub fn stamp(buf: &mut [u8], at: usize, n: u32) {
    for (i, digit) in buf[at..at + 8].iter_mut().enumerate() {
        *digit = b"0123456789abcdef"[(n >> (28 - 4 * i)) as usize & 15];
    }
}

/// The recorded review, its pod named and labelled with the placeholders, grown with env vars and annotations to
/// about `target` bytes.
pub fn review_of_size(target: usize) -> Vec<u8> {
    let mut review = placeholder_review();
    let mut i = 0;
    // The size is tracked by what is added (serialising 1 MB at every step would take minutes), then checked.
    let mut length = serde_json::to_vec(&review).unwrap().len();
    let object = &mut review["request"]["object"];
    let mut env = object["spec"]["containers"][0]["env"].as_array_mut().map(std::mem::take).unwrap_or_default();
    while length < target {
        if i % 4 == 0 && i < 400 {
            let (key, value) = (format!("example.com/note-{i}"), format!("a \"quoted\" note number {i}"));
            length += key.len() + value.len() + 8;
            object["metadata"]["annotations"][key] = json!(value);
        } else {
            let var = json!({"name": format!("SETTING_{i}"), "value": format!("value-{i}-{}", "x".repeat(24))});
            length += var.to_string().len() + 1;
            env.push(var);
        }
        i += 1;
    }
    object["spec"]["containers"][0]["env"] = Value::Array(env);
    let bytes = serde_json::to_vec(&review).unwrap();
    assert!(bytes.len() >= target && bytes.len() < target + target / 20 + 300, "{target}: {}", bytes.len());
    bytes
}

/// The pathological pod beyond the API server's limits (see [`PATHOLOGICAL`]).
pub const BEYOND_API_LIMITS: &str = "last-applied-1MiB";

/// The API server's limit on a pod's annotations, keys and values together (`TotalAnnotationSizeLimitB`).
pub const ANNOTATIONS_LIMIT: usize = 256 * 1024;

/// How a pathological pod grows the placeholder pod.
pub type Grow = fn(&mut Value);

/// Pods at (and one beyond) the API server's limits, by name, each the placeholder pod with one thing grown: what
/// made other injectors take seconds (Istio's took 15 s and four CPUs for 1,500 env vars, istio#34799). Every one
/// but [`BEYOND_API_LIMITS`] is a pod the API server accepts, injected; that one carries an annotation beyond the
/// API server's limit, which the API server refuses only after the mutating webhooks have answered (validation
/// follows mutation), so the webhook must answer it all the same.
pub const PATHOLOGICAL: [(&str, Grow); 6] = [
    ("env-1500", |pod| {
        let env: Vec<Value> =
            (0..1500).map(|i| json!({"name": format!("SETTING_{i}"), "value": format!("value-{i}")})).collect();
        pod["spec"]["containers"][0]["env"] = Value::Array(env);
    }),
    ("containers-250", |pod| {
        let first = pod["spec"]["containers"][0].clone();
        let containers: Vec<Value> = (0..250)
            .map(|i| {
                let mut c = first.clone();
                c["name"] = json!(format!("app-{i}"));
                c
            })
            .collect();
        pod["spec"]["containers"] = Value::Array(containers);
    }),
    ("annotations-10000", |pod| {
        for i in 0..10_000 {
            pod["metadata"]["annotations"][format!("example.com/note-{i}")] = json!(format!("n{i}"));
        }
    }),
    ("last-applied-250KiB", |pod| last_applied(pod, ANNOTATIONS_LIMIT - 8 * 1024)),
    (BEYOND_API_LIMITS, |pod| last_applied(pod, 1024 * 1024)),
    ("volumes-1000", |pod| {
        let volumes: Vec<Value> = (0..1000).map(|i| json!({"name": format!("data-{i}"), "emptyDir": {}})).collect();
        let mounts: Vec<Value> =
            (0..1000).map(|i| json!({"name": format!("data-{i}"), "mountPath": format!("/data/{i}")})).collect();
        pod["spec"]["volumes"] = Value::Array(volumes);
        pod["spec"]["containers"][0]["volumeMounts"] = Value::Array(mounts);
    }),
];

/// The review of the pathological pod `name` ([`PATHOLOGICAL`]), built only when asked for (the largest is
/// 1 MiB); `None` for a name not in the table.
pub fn pathological_review(name: &str) -> Option<Vec<u8>> {
    let (_, grow) = PATHOLOGICAL.iter().find(|(n, _)| *n == name)?;
    let mut review = placeholder_review();
    grow(&mut review["request"]["object"]);
    let annotations = review["request"]["object"]["metadata"]["annotations"].as_object();
    let total: usize = annotations.into_iter().flatten().map(|(k, v)| k.len() + v.as_str().map_or(0, str::len)).sum();
    assert_eq!(total > ANNOTATIONS_LIMIT, name == BEYOND_API_LIMITS, "{name}: {total} bytes of annotations");
    Some(serde_json::to_vec(&review).unwrap())
}

/// Every pathological pod's review, in [`PATHOLOGICAL`]'s order.
pub fn pathological() -> Vec<(&'static str, Vec<u8>)> {
    PATHOLOGICAL.iter().map(|(name, _)| (*name, pathological_review(name).expect("a name of the table"))).collect()
}

/// Gives `pod` a `kubectl.kubernetes.io/last-applied-configuration` of about `bytes`: the pod itself, as kubectl
/// writes it, padded with env vars.
fn last_applied(pod: &mut Value, bytes: usize) {
    let mut applied = pod.clone();
    let mut env = Vec::new();
    let mut length = serde_json::to_vec(&applied).unwrap().len();
    let mut i = 0;
    while length < bytes {
        let var = json!({"name": format!("SETTING_{i}"), "value": format!("value-{i}-{}", "x".repeat(40))});
        length += var.to_string().len() + 1;
        env.push(var);
        i += 1;
    }
    applied["spec"]["containers"][0]["env"] = Value::Array(env);
    let text = serde_json::to_string(&applied).unwrap();
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = json!(text);
}
