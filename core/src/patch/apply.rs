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

/// `object` with the parsed patch `ops` applied.
pub(crate) fn apply_ops(object: &Value, ops: &json_patch::Patch) -> Result<Value, ApplyError> {
    let mut result = object.clone();
    json_patch::patch(&mut result, ops).map_err(ApplyError::DoesNotApply)?;
    Ok(result)
}
