//! Patch to response: the `AdmissionReview` response bytes, in the version the request came in.

use crate::json::write_str;
use crate::patch::Base64Sink;
use crate::review::ApiVersion;

/// Starts the response in `out` (cleared first): `{"apiVersion":…,"kind":"AdmissionReview","response":{"uid":…`.
/// Then comes [`allow`] (and perhaps [`patch`]) or [`deny`], then [`close`].
pub(crate) fn open(out: &mut Vec<u8>, version: ApiVersion, uid: &str) {
    out.clear();
    out.extend_from_slice(br#"{"apiVersion":""#);
    out.extend_from_slice(version.as_str().as_bytes());
    out.extend_from_slice(br#"","kind":"AdmissionReview","response":{"uid":"#);
    write_str(out, uid);
}

/// The pod is admitted.
pub(crate) fn allow(out: &mut Vec<u8>) {
    out.extend_from_slice(br#","allowed":true"#);
}

/// The pod is refused with an HTTP status code and a message the user sees.
pub(crate) fn deny(out: &mut Vec<u8>, code: u16, message: &str) {
    out.extend_from_slice(br#","allowed":false,"status":{"code":"#);
    out.extend_from_slice(itoa::Buffer::new().format(code).as_bytes());
    out.extend_from_slice(br#","message":"#);
    write_str(out, message);
    out.push(b'}');
}

/// Appends `,"patchType":"JSONPatch","patch":"…"`, the patch that `write_patch` writes encoded as standard, padded
/// base64 on the fly. `write_patch` returns its number of operations; with none, nothing is appended (the API
/// server rejects a `patchType` without a `patch`). `staged` is scratch space.
pub(crate) fn patch(
    out: &mut Vec<u8>,
    staged: &mut Vec<u8>,
    write_patch: impl FnOnce(&mut Base64Sink<'_>) -> usize,
) -> usize {
    let mark = out.len();
    out.extend_from_slice(br#","patchType":"JSONPatch","patch":""#);
    let mut sink = Base64Sink::new(out, staged);
    let ops = write_patch(&mut sink);
    sink.finish();
    if ops == 0 {
        out.truncate(mark);
    } else {
        out.push(b'"');
    }
    ops
}

/// [`patch`] for a patch a check already encoded: `encoded` (its base64, by a [`Base64Sink`]), of `ops` operations
/// (none: nothing appended).
pub(crate) fn encoded_patch(out: &mut Vec<u8>, encoded: &[u8], ops: usize) -> usize {
    if ops > 0 {
        out.extend_from_slice(br#","patchType":"JSONPatch","patch":""#);
        out.extend_from_slice(encoded);
        out.push(b'"');
    }
    ops
}

/// Ends the response, with `warnings` if there are any and `auditAnnotations` if given (a JSON object of strings).
pub(crate) fn close(out: &mut Vec<u8>, warnings: &[String], audit: Option<&str>) {
    if let Some(audit) = audit {
        out.extend_from_slice(br#","auditAnnotations":"#);
        out.extend_from_slice(audit.as_bytes());
    }
    if !warnings.is_empty() {
        out.extend_from_slice(br#","warnings":["#);
        for (i, warning) in warnings.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_str(out, warning);
        }
        out.push(b']');
    }
    out.extend_from_slice(b"}}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::Sink;

    #[test]
    fn a_response_without_patch_has_no_patch_type() {
        let mut out = b"stale".to_vec();
        open(&mut out, ApiVersion::V1Beta1, "a\"b");
        allow(&mut out);
        assert_eq!(patch(&mut out, &mut Vec::new(), |_| 0), 0);
        close(&mut out, &[], None);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","response":{"uid":"a\"b","allowed":true}}"#
        );
    }

    #[test]
    fn a_patch_is_standard_padded_base64_and_warnings_are_escaped() {
        let mut out = Vec::new();
        open(&mut out, ApiVersion::V1, "u");
        allow(&mut out);
        // 0xfb 0xff encodes to "+/8=" in the standard alphabet, "-_8=" in the URL-safe one.
        let ops = patch(&mut out, &mut Vec::new(), |sink| {
            sink.raw(&[0xfb, 0xff]);
            1
        });
        assert_eq!(ops, 1);
        close(&mut out, &["say \"hi\"".to_owned()], Some(r#"{"template":"a\\b"}"#));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u","allowed":true,"patchType":"JSONPatch","patch":"+/8=","auditAnnotations":{"template":"a\\b"},"warnings":["say \"hi\""]}}"#
        );
    }

    #[test]
    fn a_denial_carries_a_status_code_and_message() {
        let mut out = Vec::new();
        open(&mut out, ApiVersion::V1, "u");
        deny(&mut out, 400, "no \"x\"");
        close(&mut out, &[], None);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"], serde_json::json!({"code": 400, "message": "no \"x\""}));
    }
}
