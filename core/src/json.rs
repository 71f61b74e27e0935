//! JSON text helpers shared by the patch and response writers.
//!
//! Escaping is delegated to `serde_json`, whose string escaper is table-driven and correct for every code point
//! (quotes, backslashes, control characters, non-ASCII). We never build JSON strings by hand.

/// Appends `s` to `out` as a quoted, escaped JSON string.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    // Writing to a Vec cannot fail and a &str always serialises, so the Result carries no information.
    serde_json::to_writer(out, s).expect("serialising a str into a Vec cannot fail");
}

/// Returns `s` escaped as the inside of a JSON string (without the surrounding quotes).
pub(crate) fn escape_contents(s: &str) -> String {
    let quoted = serde_json::to_string(s).expect("serialising a str cannot fail");
    quoted[1..quoted.len() - 1].to_owned()
}

/// Escapes one JSON Pointer reference token (RFC 6901 §3): `~` becomes `~0` first, then `/` becomes `~1`.
/// The order matters: escaping `/` first would turn `/` into `~1` and then into `~01`.
pub(crate) fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// A JSON Pointer token ready to be appended to a path that is itself written inside a JSON string: pointer
/// escaping first, then JSON escaping. Computed once, when a template is compiled.
pub(crate) fn path_token(key: &str) -> Box<str> {
    escape_contents(&escape_pointer_token(key)).into_boxed_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_tokens_escape_tilde_before_slash() {
        assert_eq!(escape_pointer_token("example.com/a~b"), "example.com~1a~0b");
        assert_eq!(escape_pointer_token("~1"), "~01");
        assert_eq!(escape_pointer_token("a/~/b"), "a~1~0~1b");
        assert_eq!(escape_pointer_token("plain"), "plain");
    }

    #[test]
    fn path_tokens_are_json_escaped_after_pointer_escaping() {
        assert_eq!(&*path_token("a\"b\\c/d"), "a\\\"b\\\\c~1d");
    }

    #[test]
    fn strings_are_escaped_for_every_awkward_byte() {
        let mut out = Vec::new();
        write_str(&mut out, "q\" b\\ nl\n tab\t nul\u{0} é \u{2028}");
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, "\"q\\\" b\\\\ nl\\n tab\\t nul\\u0000 é \u{2028}\"");
        let back: String = serde_json::from_str(&text).unwrap();
        assert_eq!(back, "q\" b\\ nl\n tab\t nul\u{0} é \u{2028}");
    }
}
