//! Where patch bytes go: a plain buffer (tests, `--explain`, validation) or, on the request path, straight into
//! the response as base64.
//!
//! Most of a patch is template JSON that never changes. Each such piece is a [`Fragment`] that carries its base64,
//! computed once at load: on the request path only the few dynamic bytes between fragments (rendered leaves,
//! paths with a list index) are encoded. A fragment's JSON is padded with spaces to whole 3-byte groups, and so
//! is each run of dynamic bytes that a fragment follows, so that every piece encodes on its own and the
//! encoder never has a partial group to carry across: a fragment is one copy. The spaces sit between JSON
//! tokens ([`Sink::fragment`] is only called there), where JSON allows whitespace; the decoded patch is the same
//! JSON, with at most two spaces at each such seam.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// A static piece of JSON with its base64 encoded once.
#[derive(Debug)]
pub(crate) struct Fragment {
    json: Box<[u8]>,
    /// The base64 of `json` followed by the spaces that make it whole 3-byte groups (so it has no `=`).
    encoded: Box<[u8]>,
}

impl Fragment {
    pub(crate) fn new(json: Vec<u8>) -> Self {
        let mut aligned = json.clone();
        pad_to_group(&mut aligned);
        Fragment { encoded: STANDARD.encode(&aligned).into_bytes().into_boxed_slice(), json: json.into_boxed_slice() }
    }

    /// The JSON text, without alignment.
    pub(crate) fn json(&self) -> &[u8] {
        &self.json
    }
}

/// Appends the spaces (at most two) that make `bytes` a whole number of 3-byte base64 groups.
fn pad_to_group(bytes: &mut Vec<u8>) {
    bytes.resize(bytes.len().next_multiple_of(3), b' ');
}

/// A destination for JSON text.
pub(crate) trait Sink {
    /// Appends bytes computed on this request.
    fn raw(&mut self, bytes: &[u8]);
    /// Appends a static fragment. Only called between JSON tokens (never inside a string), where whitespace may
    /// be inserted.
    fn fragment(&mut self, fragment: &Fragment);
}

impl Sink for Vec<u8> {
    fn raw(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn fragment(&mut self, fragment: &Fragment) {
        self.extend_from_slice(&fragment.json);
    }
}

/// Encodes what it is given as standard, padded base64, appended to `out`.
///
/// Dynamic bytes are staged and encoded in one call when a fragment (or the end) needs them, so many small
/// writes cost one encoder call, not one each.
pub(crate) struct Base64Sink<'a> {
    out: &'a mut Vec<u8>,
    /// Dynamic bytes not yet encoded. Reused across requests by the caller.
    staged: &'a mut Vec<u8>,
}

impl<'a> Base64Sink<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>, staged: &'a mut Vec<u8>) -> Self {
        staged.clear();
        Base64Sink { out, staged }
    }

    /// Encodes what is left, with base64's own `=` padding: nothing follows it.
    pub(crate) fn finish(self) {
        encode_into(self.out, self.staged);
        self.staged.clear();
    }
}

impl Sink for Base64Sink<'_> {
    fn raw(&mut self, bytes: &[u8]) {
        self.staged.extend_from_slice(bytes);
    }

    fn fragment(&mut self, fragment: &Fragment) {
        if !self.staged.is_empty() {
            pad_to_group(self.staged);
            encode_into(self.out, self.staged);
            self.staged.clear();
        }
        self.out.extend_from_slice(&fragment.encoded);
    }
}

/// Writes the same patch to two sinks: a check that reads it as JSON and the response that sends it, from one merge.
pub(crate) struct Tee<'a, A, B>(pub &'a mut A, pub &'a mut B);

impl<A: Sink, B: Sink> Sink for Tee<'_, A, B> {
    fn raw(&mut self, bytes: &[u8]) {
        self.0.raw(bytes);
        self.1.raw(bytes);
    }

    fn fragment(&mut self, fragment: &Fragment) {
        self.0.fragment(fragment);
        self.1.fragment(fragment);
    }
}

/// Appends the standard base64 of `bytes` (padded if its length is not a multiple of 3).
fn encode_into(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let start = out.len();
    // encoded_len is None only on usize overflow, impossible for bytes that fit in memory.
    let len = base64::encoded_len(bytes.len(), true).expect("base64 length of an in-memory buffer fits usize");
    out.resize(start + len, 0);
    // The output was sized by encoded_len, so the slice is always large enough.
    STANDARD.encode_slice(bytes, &mut out[start..]).expect("the output was sized by encoded_len");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A piece of a patch: dynamic bytes or a static fragment.
    fn piece() -> impl Strategy<Value = (bool, Vec<u8>)> {
        (any::<bool>(), proptest::collection::vec(any::<u8>(), 0..12))
    }

    /// The pieces through both sinks at once, by a [`Tee`] (as a check's merge writes them): (base64 sink's
    /// output, plain sink's output).
    fn encode_pieces(pieces: &[(bool, Vec<u8>)]) -> (Vec<u8>, Vec<u8>) {
        let fragments: Vec<Option<Fragment>> =
            pieces.iter().map(|(is_static, bytes)| is_static.then(|| Fragment::new(bytes.clone()))).collect();
        let (mut out, mut staged, mut plain) = (b"prefix:".to_vec(), b"stale".to_vec(), Vec::new());
        let mut sink = Base64Sink::new(&mut out, &mut staged);
        let mut both = Tee(&mut plain, &mut sink);
        for ((_, bytes), fragment) in pieces.iter().zip(&fragments) {
            match fragment {
                Some(f) => both.fragment(f),
                None => both.raw(bytes),
            }
        }
        sink.finish();
        (out, plain)
    }

    /// What the base64 sink encodes: every fragment, and every run of dynamic bytes before a fragment, padded
    /// with spaces to whole groups; the last run as it is.
    fn aligned(pieces: &[(bool, Vec<u8>)]) -> Vec<u8> {
        let (mut text, mut run) = (Vec::new(), Vec::new());
        for (is_static, bytes) in pieces {
            if *is_static {
                for part in [&mut run, &mut bytes.clone()] {
                    pad_to_group(part);
                    text.append(part);
                }
            } else {
                run.extend_from_slice(bytes);
            }
        }
        text.append(&mut run);
        text
    }

    proptest! {
        #[test]
        fn the_output_is_the_base64_of_the_aligned_whole(pieces in proptest::collection::vec(piece(), 0..10)) {
            let (out, plain) = encode_pieces(&pieces);
            let expected = format!("prefix:{}", STANDARD.encode(aligned(&pieces)));
            prop_assert_eq!(String::from_utf8(out).unwrap(), expected);
            // The plain sink writes the pieces as they are, without alignment.
            let plain_again: Vec<u8> = pieces.iter().flat_map(|(_, bytes)| bytes.iter().copied()).collect();
            prop_assert_eq!(plain, plain_again);
        }
    }

    #[test]
    fn every_length_of_run_and_fragment_is_exact() {
        // Dynamic runs of 0 to 3 bytes before fragments of 0 to 4 bytes, then a dynamic tail.
        for lead in 0..4 {
            for len in 0..5 {
                let pieces =
                    vec![(false, vec![b'd'; lead]), (true, (b'a'..b'a' + len).collect()), (false, b"x".to_vec())];
                let (out, _) = encode_pieces(&pieces);
                let decoded = STANDARD.decode(&out[b"prefix:".len()..]).unwrap();
                let run = [vec![b'd'; lead], vec![b' '; (3 - lead % 3) % 3]].concat();
                let fragment = [(b'a'..b'a' + len).collect(), vec![b' '; (3 - len as usize % 3) % 3]].concat();
                assert_eq!(decoded, [run, fragment, b"x".to_vec()].concat(), "{lead} {len}");
            }
        }
    }

    #[test]
    fn aligned_json_parses_to_the_same_value() {
        // A fragment and a dynamic run meeting between tokens, as the patch writer has them.
        let pieces = vec![
            (true, br#"[{"op":"add","path":"/a","value":"#.to_vec()),
            (false, br#""x""#.to_vec()),
            (true, br#"},{"op":"add","path":"/b","value":{"k":"#.to_vec()),
            (false, b"1".to_vec()),
            (true, b"}".to_vec()),
            (false, b"}]".to_vec()),
        ];
        let (out, plain) = encode_pieces(&pieces);
        let decoded = STANDARD.decode(&out[b"prefix:".len()..]).unwrap();
        assert_ne!(decoded, plain, "the seams carry spaces");
        let parsed: serde_json::Value = serde_json::from_slice(&decoded).unwrap();
        assert_eq!(parsed, serde_json::from_slice::<serde_json::Value>(&plain).unwrap());
    }
}
