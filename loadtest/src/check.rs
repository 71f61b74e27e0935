//! Every answer is checked before its latency counts: status 200, an AdmissionReview response in the version sent
//! with our uid, allowed, and a patch that decodes (base64, then JSON) to `add` operations only. The first answer
//! for each body is also applied to the pod, which must still be a valid Pod afterwards.
//!
//! The stack floor (`--start-floor`) does no review work, so it cannot echo the uid: it answers each body with a
//! fixed answer, the injector's own answer to that body as loaded ([`FixedAnswers`]). Each fixed answer is checked
//! once, at start, exactly as above (its uid being the body's placeholder uid) and applied to its pod; then every
//! answer of the floor is checked against it byte for byte, with its status and content type. An answer that is
//! byte-equal to a checked one is as correct as that one, and costs the harness a `memcmp` rather than a parse.

use std::borrow::Cow;

use base64::Engine as _;
use bytes::Bytes;
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
        return Err(not_ok(status, body));
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

/// A status other than 200, with the start of the body (the server's reason, as a rule).
fn not_ok(status: u16, body: &[u8]) -> Wrong {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    wrong(format!("HTTP {status}: {}", text.trim()))
}

/// The stack floor's answers: one fixed answer per body, each checked as a correct answer to its body.
#[derive(Debug)]
pub struct FixedAnswers {
    answers: Vec<Bytes>,
    /// The patch operations of each answer.
    ops: Vec<usize>,
}

impl FixedAnswers {
    /// `answers[i]`, the answer to body `i` as loaded (uid `uid`), checked as [`check`] checks an answer and
    /// applied to `pods[i]`: an answer that fails is a setup error, naming the body.
    pub fn new(answers: Vec<Bytes>, uid: &str, pods: &[(&str, &Value)]) -> Result<FixedAnswers, String> {
        if answers.len() != pods.len() {
            return Err(format!("{} fixed answers for {} bodies", answers.len(), pods.len()));
        }
        let mut ops = Vec::with_capacity(answers.len());
        for (answer, (name, pod)) in answers.iter().zip(pods) {
            let checked = check(200, answer, uid, true).and_then(|(answer, patch)| match patch {
                Some(patch) => applies(pod, &patch).map(|()| answer),
                None => Ok(answer),
            });
            let answer = checked.map_err(|e| format!("the fixed answer to {name} is not a correct answer: {e}"))?;
            ops.push(answer.ops);
        }
        Ok(FixedAnswers { answers, ops })
    }

    /// The answers, in the order of the bodies.
    pub fn answers(&self) -> &[Bytes] {
        &self.answers
    }

    /// Checks an answer to body `index`: status 200, `Content-Type: application/json`, and exactly the fixed
    /// answer's bytes.
    pub fn check(&self, index: usize, status: u16, content_type: Option<&[u8]>, body: &[u8]) -> Result<Answer, Wrong> {
        if status != 200 {
            return Err(not_ok(status, body));
        }
        if content_type != Some(b"application/json") {
            let shown = content_type.map(String::from_utf8_lossy);
            return Err(wrong(format!("Content-Type {shown:?}, not \"application/json\"")));
        }
        let expected = &self.answers[index];
        if body != expected {
            let at =
                body.iter().zip(expected.iter()).position(|(a, b)| a != b).unwrap_or(body.len().min(expected.len()));
            return Err(wrong(format!(
                "not the fixed answer: {} bytes where {} were expected, first differing at byte {at}",
                body.len(),
                expected.len()
            )));
        }
        Ok(Answer { ops: self.ops[index] })
    }
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
    fn the_floors_fixed_answers_are_checked_once_then_compared_byte_for_byte() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app"}]}});
        let good = patched(json!([{"op": "add", "path": "/spec/containers/-", "value": {"name": "proxy"}}]));
        let skipped = answer(json!({"uid": UID, "allowed": true}));
        let fixed =
            FixedAnswers::new(vec![Bytes::from(good.clone()), Bytes::from(skipped)], UID, &[("a", &pod), ("b", &pod)])
                .unwrap();
        let json = Some(&b"application/json"[..]);
        assert_eq!(fixed.check(0, 200, json, &good), Ok(Answer { ops: 1 }));
        assert_eq!(fixed.check(1, 200, json, &fixed.answers()[1]), Ok(Answer { ops: 0 }));
        assert!(fixed.check(1, 200, json, &good).unwrap_err().0.contains("not the fixed answer"));
        let mut flipped = good.clone();
        flipped[5] ^= 1;
        assert!(fixed.check(0, 200, json, &flipped).unwrap_err().0.contains("first differing at byte 5"));
        assert!(fixed.check(0, 404, json, b"not found").unwrap_err().0.starts_with("HTTP 404: not found"));
        assert!(fixed.check(0, 200, Some(b"text/plain"), &good).unwrap_err().0.contains("Content-Type"));
        assert!(fixed.check(0, 200, None, &good).unwrap_err().0.contains("Content-Type"));

        // A fixed answer that is not itself a correct answer is refused at start, naming its body.
        let other_uid = answer(json!({"uid": "other", "allowed": true}));
        let e = FixedAnswers::new(vec![Bytes::from(other_uid)], UID, &[("pod-3.json", &pod)]).unwrap_err();
        assert!(e.contains("pod-3.json") && e.contains("is not the request's"), "{e}");
        let missing = patched(json!([{"op": "add", "path": "/spec/volumes/0", "value": {"name": "v"}}]));
        let e = FixedAnswers::new(vec![Bytes::from(missing)], UID, &[("p", &pod)]).unwrap_err();
        assert!(e.contains("does not apply"), "{e}");
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
