//! A patch of ours applied to a pod as the API server applies it: the one way an injected pod is computed off the
//! request path (the checks that judge a pod whole, the load-time dry runs, `inject`, `uninject`).

use serde_json::Value;

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
    let ops: json_patch::Patch = serde_json::from_slice(patch).map_err(ApplyError::NotAPatch)?;
    let entry_bytes = |key: &str, value: &Value| key.len() + value.as_str().map_or(0, str::len);
    let mut added = 0;
    for op in &ops.0 {
        let json_patch::PatchOperation::Add(add) = op else { continue };
        let path = add.path.as_str();
        if path == ANNOTATIONS {
            added += add.value.as_object().into_iter().flatten().map(|(k, v)| entry_bytes(k, v)).sum::<usize>();
        } else if let Some(token) = path.strip_prefix(ANNOTATIONS).and_then(|t| t.strip_prefix('/')) {
            // One key: its pointer token unescaped (`~1` is `/`, `~0` is `~`), as the pod will hold it.
            added += entry_bytes(&token.replace("~1", "/").replace("~0", "~"), &add.value);
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
