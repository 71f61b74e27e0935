//! A pod's JSON (`serde_json`) read as the API server's decoder would see it: a field that is missing, `null` or
//! of another type counts as absent. Shared by validation and Pod Security, which both judge pods as JSON.
//! And the filter bit of an object's key, by which the readers of the tape (the duplicate-key check, the merge)
//! tell most keys apart without comparing strings.

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

/// One of 64 bits for an object key, from its length and its first and last bytes (without a branch on the
/// length: keys of every length are mixed in one object, so such a branch would be mispredicted). A filter of
/// these bits tells most keys apart from a few without comparing strings: the duplicate-key check of small
/// objects, and the merge's lookups in large maps.
pub(crate) fn key_filter_bit(key: &str) -> u32 {
    let bytes = key.as_bytes();
    let first = bytes.first().copied().unwrap_or_default();
    let last = bytes.last().copied().unwrap_or_default();
    let mixed = (bytes.len() as u64) << 16 | u64::from(first) << 8 | u64::from(last);
    // The top six bits of a Fibonacci hash.
    (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as u32
}
