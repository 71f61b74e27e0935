//! The add-only JSON Patch writer (RFC 6902), writing into a [`Sink`]: on the request path, straight into the
//! response as base64.
//!
//! Only `add` exists here: the writer has no way to express `replace` or `remove`. Paths are kept as JSON Pointer
//! text that is already JSON-escaped, so appending a precomputed token (see [`crate::json::path_token`]) is a plain
//! byte copy and the path can be written into the patch without escaping it again.

mod apply;
mod sink;

pub(crate) use apply::{ApplyError, annotation_bytes_added, apply, apply_ops};
pub(crate) use sink::{Base64Sink, Fragment, Sink, Tee};

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

/// What every operation starts with, up to its path.
const OP_OPEN: &[u8] = br#"{"op":"add","path":""#;
/// Between the path and the value.
const OP_VALUE: &[u8] = br#"","value":"#;
/// What comes before an operation: the start of the patch, or the end of the operation before it. Folded into
/// the precompiled start of an operation, so that an operation made of template JSON is, in base64, only copies.
const BEFORE_FIRST: &[u8] = b"[";
const BEFORE_NEXT: &[u8] = b"},";

/// The start of an `add` whose path is known when the template is compiled, precompiled for either place in the
/// patch: `[{"op":"add","path":"<path>","value":` as the first operation, `},{"op":…` after another.
#[derive(Debug)]
pub(crate) struct OpHead {
    first: Fragment,
    next: Fragment,
}

/// The [`OpHead`] of an `add` at `path` (JSON-escaped pointer text); `append` adds `/-`.
pub(crate) fn op_head(path: &str, append: bool) -> OpHead {
    let head = |before: &[u8]| {
        let mut head = Vec::new();
        write_head(&mut head, before, path, append);
        Fragment::new(head)
    };
    OpHead { first: head(BEFORE_FIRST), next: head(BEFORE_NEXT) }
}

/// Writes `before`, then the start of an `add` at `path` (followed by `/-` when `append`) up to its value: what an
/// [`OpHead`] holds precompiled, and what is written per request when the path has a list index.
fn write_head(out: &mut impl Sink, before: &[u8], path: &str, append: bool) {
    out.raw(before);
    out.raw(OP_OPEN);
    out.raw(path.as_bytes());
    out.raw(if append { b"/-" } else { b"" });
    out.raw(OP_VALUE);
}

/// Writes `[{"op":"add","path":…,"value":…},…]` into a [`Sink`].
#[derive(Debug)]
pub(crate) struct PatchWriter<'a, S: Sink> {
    out: &'a mut S,
    ops: usize,
}

impl<'a, S: Sink> PatchWriter<'a, S> {
    /// Starts a patch in `out`. Nothing is written until the first operation or [`PatchWriter::finish`].
    pub(crate) fn new(out: &'a mut S) -> Self {
        PatchWriter { out, ops: 0 }
    }

    /// Appends one `add` of the value that `write_value` writes, at `path`, or at `path` followed by `/-` (append
    /// to an array) when `append` is set. `head` is that operation's start as precompiled by [`op_head`] when the
    /// path is known at compile time; it is then written instead of `path`.
    pub(crate) fn add(
        &mut self,
        head: Option<&OpHead>,
        path: &Pointer,
        append: bool,
        write_value: impl FnOnce(&mut S),
    ) {
        let first = self.ops == 0;
        self.ops += 1;
        match head {
            Some(head) => self.out.fragment(if first { &head.first } else { &head.next }),
            None => write_head(self.out, if first { BEFORE_FIRST } else { BEFORE_NEXT }, path.as_str(), append),
        }
        write_value(self.out);
    }

    /// Closes the last operation and the array, and returns how many operations were written.
    pub(crate) fn finish(self) -> usize {
        self.out.raw(if self.ops == 0 { b"[]" } else { b"}]" });
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
        patch.add(None, &path, false, |o| o.raw(b"\"x\""));
        path.truncate(mark);
        path.push_token(&path_token("list"));
        patch.add(None, &path, true, |o| o.raw(b"1"));
        path.push_index(12);
        patch.add(None, &path, false, |o| o.raw(b"null"));
        assert_eq!(patch.finish(), 3);
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            r#"[{"op":"add","path":"/metadata/annotations/example.com~1a~0b","value":"x"},{"op":"add","path":"/list/-","value":1},{"op":"add","path":"/list/12","value":null}]"#
        );
    }

    #[test]
    fn a_precompiled_head_writes_the_same_bytes_first_and_after_another() {
        let mut path = Pointer::default();
        path.push_token(&path_token("spec"));
        path.push_token(&path_token("a\"b/c"));
        for append in [false, true] {
            let head = op_head(path.as_str(), append);
            let (mut by_path, mut by_head) = (Vec::new(), Vec::new());
            let mut patch = PatchWriter::new(&mut by_path);
            patch.add(None, &path, append, |o| o.raw(b"1"));
            patch.add(None, &path, append, |o| o.raw(b"2"));
            patch.finish();
            let mut patch = PatchWriter::new(&mut by_head);
            patch.add(Some(&head), &path, append, |o| o.raw(b"1"));
            patch.add(Some(&head), &path, append, |o| o.raw(b"2"));
            patch.finish();
            assert_eq!(String::from_utf8_lossy(&by_path), String::from_utf8_lossy(&by_head));
            let ops: serde_json::Value = serde_json::from_slice(&by_head).unwrap();
            assert_eq!(ops.as_array().unwrap().len(), 2, "{ops}");
        }
    }

    #[test]
    fn an_empty_patch_is_an_empty_array() {
        let mut buf = Vec::new();
        assert_eq!(PatchWriter::new(&mut buf).finish(), 0);
        assert_eq!(buf, b"[]");
    }
}
