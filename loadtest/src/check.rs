//! Every answer is checked before its latency counts: status 200, an AdmissionReview response in the version sent
//! with our uid, allowed, and a patch that decodes (base64, then JSON) to `add` operations only. The first answer
//! for each body is also applied to the pod, which must still be a valid Pod afterwards.

use std::borrow::Cow;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

/// What a correct answer carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// Number of patch operations (0: allowed without a patch).
    pub ops: usize,
}

/// A wrong answer: the reason, one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Wrong(pub String);

fn wrong(reason: impl Into<String>) -> Wrong {
    Wrong(reason.into())
}

#[derive(Deserialize)]
struct Review<'a> {
    #[serde(rename = "apiVersion", borrow)]
    api_version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    response: Option<Response<'a>>,
}

#[derive(Deserialize)]
struct Response<'a> {
    #[serde(borrow)]
    uid: Cow<'a, str>,
    allowed: bool,
    #[serde(rename = "patchType", borrow)]
    patch_type: Option<Cow<'a, str>>,
    #[serde(borrow)]
    patch: Option<Cow<'a, str>>,
    status: Option<Status>,
}

#[derive(Deserialize)]
struct Status {
    message: Option<String>,
}

#[derive(Deserialize)]
struct Op<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
}

/// Checks one answer to a v1 review with `uid`. Returns the decoded patch too when `keep_patch` is set.
pub fn check(status: u16, body: &[u8], uid: &str, keep_patch: bool) -> Result<(Answer, Option<Vec<u8>>), Wrong> {
    if status != 200 {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
        return Err(wrong(format!("HTTP {status}: {}", text.trim())));
    }
    let review: Review<'_> =
        serde_json::from_slice(body).map_err(|e| wrong(format!("the answer is not an AdmissionReview: {e}")))?;
    if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
        return Err(wrong(format!(
            "answered as {} {}, not admission.k8s.io/v1 AdmissionReview",
            review.api_version, review.kind
        )));
    }
    let response = review.response.ok_or_else(|| wrong("the answer has no response"))?;
    if response.uid != uid {
        return Err(wrong(format!("response.uid {:?} is not the request's {uid:?}", response.uid)));
    }
    if !response.allowed {
        let message = response.status.and_then(|s| s.message).unwrap_or_default();
        return Err(wrong(format!("not allowed: {message}")));
    }
    let Some(patch) = response.patch else {
        return Ok((Answer { ops: 0 }, None));
    };
    if response.patch_type.as_deref() != Some("JSONPatch") {
        return Err(wrong(format!("patchType {:?}, not \"JSONPatch\"", response.patch_type)));
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(patch.as_bytes())
        .map_err(|e| wrong(format!("the patch is not base64: {e}")))?;
    let ops: Vec<Op<'_>> =
        serde_json::from_slice(&decoded).map_err(|e| wrong(format!("the patch is not a JSON Patch: {e}")))?;
    if let Some(op) = ops.iter().find(|o| o.op != "add") {
        return Err(wrong(format!("the patch has a {:?} operation; only \"add\" is expected", op.op)));
    }
    let answer = Answer { ops: ops.len() };
    Ok((answer, keep_patch.then_some(decoded)))
}

/// Applies a decoded patch to `pod`, a valid Pod: it must apply (RFC 6902, the `json-patch` crate) and leave a
/// valid Pod.
pub fn applies(pod: &Value, patch: &[u8]) -> Result<(), Wrong> {
    let patch: json_patch::Patch =
        serde_json::from_slice(patch).map_err(|e| wrong(format!("the patch is not a JSON Patch: {e}")))?;
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).map_err(|e| wrong(format!("the patch does not apply to the pod: {e}")))?;
    serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(patched)
        .map(drop)
        .map_err(|e| wrong(format!("the patched pod is not a valid Pod: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const UID: &str = "00000001-0000-4000-8000-000000000001";

    fn answer(response: Value) -> Vec<u8> {
        serde_json::to_vec(
            &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
        )
        .unwrap()
    }

    fn patched(ops: Value) -> Vec<u8> {
        let patch = base64::engine::general_purpose::STANDARD.encode(ops.to_string());
        answer(json!({"uid": UID, "allowed": true, "patchType": "JSONPatch", "patch": patch}))
    }

    fn reason(status: u16, body: &[u8]) -> String {
        check(status, body, UID, false).unwrap_err().0
    }

    #[test]
    fn a_correct_patch_passes() {
        let body = patched(json!([{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]));
        assert_eq!(check(200, &body, UID, false).unwrap().0, Answer { ops: 1 });
        let skipped = answer(json!({"uid": UID, "allowed": true}));
        assert_eq!(check(200, &skipped, UID, false).unwrap().0, Answer { ops: 0 });
    }

    #[test]
    fn each_wrong_answer_is_named() {
        assert!(reason(500, b"engine panicked").starts_with("HTTP 500: engine panicked"));
        assert!(reason(200, b"not json").contains("not an AdmissionReview"));
        let v1beta1 = br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","response":{"uid":"x","allowed":true}}"#;
        assert!(reason(200, v1beta1).contains("not admission.k8s.io/v1"));
        assert!(reason(200, &answer(json!({"uid": "other", "allowed": true}))).contains("is not the request's"));
        let denied = answer(json!({"uid": UID, "allowed": false, "status": {"message": "no"}}));
        assert_eq!(reason(200, &denied), "not allowed: no");
        let no_type = answer(json!({"uid": UID, "allowed": true, "patch": "W10="}));
        assert!(reason(200, &no_type).contains("patchType"));
        let not_b64 = answer(json!({"uid": UID, "allowed": true, "patchType": "JSONPatch", "patch": "[{]"}));
        assert!(reason(200, &not_b64).contains("not base64"));
        let replace = patched(json!([{"op": "replace", "path": "/spec", "value": {}}]));
        assert!(reason(200, &replace).contains("\"replace\" operation"));
    }

    #[test]
    fn the_first_answer_must_apply_and_leave_a_pod() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app"}]}});
        let good = json!([{"op": "add", "path": "/spec/containers/-", "value": {"name": "proxy"}}]).to_string();
        assert_eq!(applies(&pod, good.as_bytes()), Ok(()));
        let missing = json!([{"op": "add", "path": "/spec/volumes/0", "value": {"name": "v"}}]).to_string();
        assert!(applies(&pod, missing.as_bytes()).unwrap_err().0.contains("does not apply"));
        let bad_type = json!([{"op": "add", "path": "/spec/containers/-", "value": {"name": 5}}]).to_string();
        assert!(applies(&pod, bad_type.as_bytes()).unwrap_err().0.contains("not a valid Pod"));
    }
}
