//! The add-only JSON Patch writer (RFC 6902), writing into a [`Sink`]: on the request path, straight into the
//! response as base64.
//!
//! Only `add` exists here: the writer has no way to express `replace` or `remove`. Paths are kept as JSON Pointer
//! text that is already JSON-escaped, so appending a precomputed token (see [`crate::json::path_token`]) is a plain
//! byte copy and the path can be written into the patch without escaping it again.

mod sink;

pub(crate) use sink::{Base64Sink, Fragment, Sink};

/// A JSON Pointer under construction, as JSON-escaped text. `push_*` returns the previous length so the caller
/// can `truncate` back after visiting a child.
#[derive(Debug, Default)]
pub(crate) struct Pointer {
    text: String,
}

impl Pointer {
    pub(crate) fn clear(&mut self) {
        self.text.clear();
    }

    /// Appends `/token`, where `token` is already pointer- and JSON-escaped.
    pub(crate) fn push_token(&mut self, token: &str) -> usize {
        let mark = self.text.len();
        self.text.push('/');
        self.text.push_str(token);
        mark
    }

    /// Appends `/index`.
    pub(crate) fn push_index(&mut self, index: usize) -> usize {
        let mark = self.text.len();
        self.text.push('/');
        self.text.push_str(itoa::Buffer::new().format(index));
        mark
    }

    pub(crate) fn truncate(&mut self, mark: usize) {
        self.text.truncate(mark);
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }
}

/// Writes `[{"op":"add","path":…,"value":…},…]` into a [`Sink`].
#[derive(Debug)]
pub(crate) struct PatchWriter<'a, S: Sink> {
    out: &'a mut S,
    ops: usize,
}

impl<'a, S: Sink> PatchWriter<'a, S> {
    /// Starts a patch in `out`.
    pub(crate) fn new(out: &'a mut S) -> Self {
        out.raw(b"[");
        PatchWriter { out, ops: 0 }
    }

    /// Appends one `add` of the value that `write_value` writes, at `path`, or at `path` followed by `/-` (append
    /// to an array) when `append` is set.
    pub(crate) fn add(&mut self, path: &Pointer, append: bool, write_value: impl FnOnce(&mut S)) {
        let open: &[u8] = if self.ops > 0 { br#",{"op":"add","path":""# } else { br#"{"op":"add","path":""# };
        self.ops += 1;
        self.out.raw(open);
        self.out.raw(path.as_str().as_bytes());
        self.out.raw(if append { br#"/-","value":"# } else { br#"","value":"# });
        write_value(self.out);
        self.out.raw(b"}");
    }

    /// Closes the array and returns how many operations were written.
    pub(crate) fn finish(self) -> usize {
        self.out.raw(b"]");
        self.ops
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::path_token;

    #[test]
    fn writes_add_operations_with_escaped_paths() {
        let mut buf = Vec::new();
        let mut path = Pointer::default();
        let mut patch = PatchWriter::new(&mut buf);
        let mark = path.push_token(&path_token("metadata"));
        path.push_token(&path_token("annotations"));
        path.push_token(&path_token("example.com/a~b"));
        patch.add(&path, false, |o| o.raw(b"\"x\""));
        path.truncate(mark);
        path.push_token(&path_token("list"));
        patch.add(&path, true, |o| o.raw(b"1"));
        path.push_index(12);
        patch.add(&path, false, |o| o.raw(b"null"));
        assert_eq!(patch.finish(), 3);
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            r#"[{"op":"add","path":"/metadata/annotations/example.com~1a~0b","value":"x"},{"op":"add","path":"/list/-","value":1},{"op":"add","path":"/list/12","value":null}]"#
        );
    }

    #[test]
    fn an_empty_patch_is_an_empty_array() {
        let mut buf = Vec::new();
        assert_eq!(PatchWriter::new(&mut buf).finish(), 0);
        assert_eq!(buf, b"[]");
    }
}
