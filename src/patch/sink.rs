//! Where patch bytes go: a plain buffer (tests, `--explain`) or, on the request path, straight into the response
//! as base64.
//!
//! Most of a patch is template JSON that never changes. Each such piece is a [`Fragment`] that carries its base64
//! encoding, computed once at load for each of the three phases an encoder can be in (0, 1 or 2 bytes left over
//! from what came before), so on the request path only the few dynamic bytes around it (op headers, paths,
//! rendered leaves) are encoded. The output is byte for byte the standard, padded base64 of the whole patch.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// A static piece of JSON with its base64 pre-encoded for every phase.
#[derive(Debug)]
pub(crate) struct Fragment {
    json: Box<[u8]>,
    /// `encoded[phase]`: the base64 of the whole 3-byte groups of `json[skip(phase)..]`, where `skip(phase)` is
    /// what completes the group the encoder had started with `phase` pending bytes.
    encoded: [Box<[u8]>; 3],
}

/// How many bytes of a fragment complete a group that already holds `pending` bytes.
fn skip(pending: usize) -> usize {
    (3 - pending) % 3
}

impl Fragment {
    pub(crate) fn new(json: Vec<u8>) -> Self {
        let encoded = [0, 1, 2].map(|pending| {
            let rest = json.get(skip(pending)..).unwrap_or_default();
            STANDARD.encode(&rest[..rest.len() / 3 * 3]).into_bytes().into_boxed_slice()
        });
        Fragment { json: json.into_boxed_slice(), encoded }
    }
}

/// A destination for JSON text.
pub(crate) trait Sink {
    /// Appends bytes computed on this request.
    fn raw(&mut self, bytes: &[u8]);
    /// Appends a static fragment.
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

    /// Encodes what is left, with padding.
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
        let pending = self.staged.len() % 3;
        let head = skip(pending);
        if fragment.json.len() < head {
            // Too short to complete the pending group: it is simply more staged bytes.
            return self.raw(&fragment.json);
        }
        // The fragment's first bytes complete the last group, so the staged bytes encode in one call.
        self.staged.extend_from_slice(&fragment.json[..head]);
        encode_into(self.out, self.staged);
        self.staged.clear();
        self.out.extend_from_slice(&fragment.encoded[pending]);
        let tail = head + (fragment.json.len() - head) / 3 * 3;
        self.staged.extend_from_slice(&fragment.json[tail..]);
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

    fn encode_pieces(pieces: &[(bool, Vec<u8>)]) -> (Vec<u8>, Vec<u8>) {
        let fragments: Vec<Option<Fragment>> =
            pieces.iter().map(|(is_static, bytes)| is_static.then(|| Fragment::new(bytes.clone()))).collect();
        let (mut out, mut staged, mut plain) = (b"prefix:".to_vec(), b"stale".to_vec(), Vec::new());
        let mut sink = Base64Sink::new(&mut out, &mut staged);
        for ((_, bytes), fragment) in pieces.iter().zip(&fragments) {
            match fragment {
                Some(f) => {
                    sink.fragment(f);
                    plain.fragment(f);
                }
                None => {
                    sink.raw(bytes);
                    plain.raw(bytes);
                }
            }
        }
        sink.finish();
        (out, plain)
    }

    proptest! {
        #[test]
        fn pre_encoded_fragments_give_the_base64_of_the_whole(pieces in proptest::collection::vec(piece(), 0..10)) {
            let (out, plain) = encode_pieces(&pieces);
            let expected = format!("prefix:{}", STANDARD.encode(&plain));
            prop_assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
    }

    #[test]
    fn every_phase_and_short_fragments_are_exact() {
        // Dynamic prefixes of length 0, 1 and 2 put the encoder in each phase before fragments of 0 to 4 bytes.
        for lead in 0..3 {
            for len in 0..5 {
                let pieces = vec![(false, vec![b'd'; lead]), (true, (0..len as u8).collect()), (false, b"x".to_vec())];
                let (out, plain) = encode_pieces(&pieces);
                assert_eq!(out, [b"prefix:".as_slice(), STANDARD.encode(&plain).as_bytes()].concat(), "{lead} {len}");
            }
        }
    }
}
