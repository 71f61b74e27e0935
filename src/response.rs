//! Patch to response: the `AdmissionReview` response bytes, in the version the request came in.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::json::write_str;
use crate::review::ApiVersion;

/// Writes `{"apiVersion":…,"kind":"AdmissionReview","response":{"uid":…,"allowed":true,…}}` into `out`
/// (cleared first). A non-empty `patch` is sent as standard, padded base64 with `patchType: JSONPatch`; without
/// one, neither field is present (the API server rejects a `patchType` without a `patch`).
pub(crate) fn write(out: &mut Vec<u8>, version: ApiVersion, uid: &str, patch: Option<&[u8]>, warnings: &[String]) {
    out.clear();
    out.extend_from_slice(br#"{"apiVersion":""#);
    out.extend_from_slice(version.as_str().as_bytes());
    out.extend_from_slice(br#"","kind":"AdmissionReview","response":{"uid":"#);
    write_str(out, uid);
    out.extend_from_slice(br#","allowed":true"#);
    if let Some(patch) = patch {
        out.extend_from_slice(br#","patchType":"JSONPatch","patch":""#);
        let start = out.len();
        // encoded_len is None only on usize overflow, impossible for a patch that fits in memory.
        let len = base64::encoded_len(patch.len(), true).expect("base64 length of an in-memory patch fits usize");
        out.resize(start + len, 0);
        let written = STANDARD.encode_slice(patch, &mut out[start..]).expect("the output was sized by encoded_len");
        debug_assert_eq!(written, len);
        out.push(b'"');
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

    #[test]
    fn a_response_without_patch_has_no_patch_type() {
        let mut out = Vec::new();
        write(&mut out, ApiVersion::V1Beta1, "a\"b", None, &[]);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","response":{"uid":"a\"b","allowed":true}}"#
        );
    }

    #[test]
    fn a_patch_is_standard_padded_base64_and_warnings_are_escaped() {
        let mut out = Vec::new();
        // 0xfb 0xff encodes to "+/8=" in the standard alphabet, "-_8=" in the URL-safe one.
        write(&mut out, ApiVersion::V1, "u", Some(&[0xfb, 0xff]), &["say \"hi\"".to_owned()]);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u","allowed":true,"patchType":"JSONPatch","patch":"+/8=","warnings":["say \"hi\""]}}"#
        );
    }
}
