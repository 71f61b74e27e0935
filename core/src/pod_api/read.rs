//! A pod's JSON (`serde_json`) read as the API server's decoder would see it: a field that is missing, `null` or
//! of another type counts as absent. Shared by validation and Pod Security, which both judge pods as JSON.

use serde_json::{Map, Value as J};

/// The value as an object.
pub(crate) fn object(value: Option<&J>) -> Option<&Map<String, J>> {
    value.and_then(J::as_object)
}

/// The value's items, none when it is not a list.
pub(crate) fn items(value: Option<&J>) -> &[J] {
    value.and_then(J::as_array).map_or(&[], Vec::as_slice)
}

/// The strings of a list (other items would not decode, and are skipped).
pub(crate) fn strings(value: Option<&J>) -> impl Iterator<Item = &str> {
    items(value).iter().filter_map(J::as_str)
}

/// A string field, `""` when absent (as Go reads an unset string).
pub(crate) fn text(value: Option<&J>) -> &str {
    value.and_then(J::as_str).unwrap_or("")
}

/// A boolean field that is present and true.
pub(crate) fn is_true(value: Option<&J>) -> bool {
    value.and_then(J::as_bool) == Some(true)
}
