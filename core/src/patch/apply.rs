//! A patch of ours applied to a pod as the API server applies it: the one way an injected pod is computed off the
//! request path (the checks that judge a pod whole, the load-time dry runs, `inject`, `uninject`).

use std::borrow::Cow;

use serde_json::Value;
use serde_json::value::RawValue;

/// Why a patch of ours could not be applied: a bug of ours either way.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// It does not parse as a JSON Patch.
    #[error("the patch is not a JSON Patch: {0}")]
    NotAPatch(#[source] serde_json::Error),
    /// An operation does not apply to the object.
    #[error("the patch does not apply: {0}")]
    DoesNotApply(#[source] json_patch::PatchError),
}

/// `object` with the JSON Patch `patch` applied (by the independent `json-patch` crate, as the API server would).
pub(crate) fn apply(object: &Value, patch: &[u8]) -> Result<Value, ApplyError> {
    let ops: json_patch::Patch = serde_json::from_slice(patch).map_err(ApplyError::NotAPatch)?;
    apply_ops(object, &ops)
}

/// The bytes (keys and values) a patch of ours adds to `metadata.annotations`, as the API server counts an object's
/// annotations: what the engine adds to a large-annotation pod's own, without the pod copied to apply it to.
pub(crate) fn annotation_bytes_added(patch: &[u8]) -> Result<usize, ApplyError> {
    const ANNOTATIONS: &str = "/metadata/annotations";
    /// An operation with its value unread: only the few under the annotations are (the sidecar's are most of it).
    #[derive(serde::Deserialize)]
    struct Op<'a> {
        #[serde(borrow)]
        op: Cow<'a, str>,
        #[serde(borrow)]
        path: Cow<'a, str>,
        #[serde(borrow)]
        value: Option<&'a RawValue>,
    }
    let ops: Vec<Op<'_>> = serde_json::from_slice(patch).map_err(ApplyError::NotAPatch)?;
    let text_len = |value: &Value| value.as_str().map_or(0, str::len);
    let mut added = 0;
    for Op { op, path, value } in ops {
        let Some(value) = value.filter(|_| op == "add") else { continue };
        if path == ANNOTATIONS {
            let map: serde_json::Map<String, Value> =
                serde_json::from_str(value.get()).map_err(ApplyError::NotAPatch)?;
            added += map.iter().map(|(key, value)| key.len() + text_len(value)).sum::<usize>();
        } else if let Some(token) = path.strip_prefix(ANNOTATIONS).and_then(|t| t.strip_prefix('/')) {
            // One key: its pointer token unescaped (`~1` is `/`, `~0` is `~`), as the pod will hold it.
            let value: Value = serde_json::from_str(value.get()).map_err(ApplyError::NotAPatch)?;
            added += token.replace("~1", "/").replace("~0", "~").len() + text_len(&value);
        }
    }
    Ok(added)
}

/// `object` with the parsed patch `ops` applied.
pub(crate) fn apply_ops(object: &Value, ops: &json_patch::Patch) -> Result<Value, ApplyError> {
    let mut result = object.clone();
    json_patch::patch(&mut result, ops).map_err(ApplyError::DoesNotApply)?;
    Ok(result)
}
