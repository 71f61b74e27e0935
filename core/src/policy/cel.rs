//! CEL text: literals, and template values as the values a MutatingAdmissionPolicy's JSONPatch may add.
//!
//! The API server compiles policy expressions with homogeneous aggregate literals: a list's items, and a map's
//! values, must all have one type. So a JSON object becomes a typed object initializer (`Object.spec.containers{name:
//! "proxy", ...}`, its type named by its place in the Pod: the API server checks the name against the place) when
//! its keys are names; a map of the Pod API whose keys are data (labels, annotations, resource names) becomes a map
//! literal, whose values are then all strings.

use std::fmt::Write as _;

/// A CEL string literal of `text`.
pub(crate) fn string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                // Cannot fail: writing to a String.
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Can `key` be a field name in an object initializer (a CEL identifier, not a reserved word)?
pub(crate) fn is_identifier(key: &str) -> bool {
    const RESERVED: &[&str] = &[
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    let mut chars = key.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !RESERVED.contains(&key)
}

/// Maps of the Pod API whose keys are data, not field names, by their place (`spec.containers.resources.limits`,
/// list indices left out): written as map literals even when their keys look like names (`cpu`, `memory`).
fn is_data_map(place: &str) -> bool {
    const DATA_MAPS: &[&str] = &["metadata.labels", "metadata.annotations", "spec.nodeSelector", "spec.overhead"];
    const DATA_MAP_FIELDS: &[&str] =
        [".resources.requests", ".resources.limits", ".csi.volumeAttributes", ".flexVolume.options"].as_slice();
    DATA_MAPS.contains(&place) || DATA_MAP_FIELDS.iter().any(|field| place.ends_with(field))
}

/// Why a value cannot be written as a policy's CEL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unwritable {
    #[error("the map at {place} has values of different types, which a policy's CEL cannot write in one literal")]
    MixedMap { place: String },
    #[error("the list at {place} has items of different types, which a policy's CEL cannot write in one literal")]
    MixedList { place: String },
    #[error("the map at {place} has a key that is not a field name ({key:?}) and values that are not strings")]
    DataKeys { place: String, key: String },
}

/// The CEL type of a written value, as far as homogeneity goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    Int,
    Double,
    String,
    List,
    Map,
    Object(String),
}

/// `value` (JSON) as a CEL value for the place `place` of a Pod (`spec.containers`, list indices left out).
pub(crate) fn value(value: &serde_json::Value, place: &str) -> Result<String, Unwritable> {
    written(value, place).map(|(text, _)| text)
}

fn written(value: &serde_json::Value, place: &str) -> Result<(String, Kind), Unwritable> {
    use serde_json::Value as J;
    Ok(match value {
        J::Null => ("null".to_owned(), Kind::Null),
        J::Bool(b) => (b.to_string(), Kind::Bool),
        J::Number(n) if n.is_i64() || n.is_u64() => (n.to_string(), Kind::Int),
        J::Number(n) => (format!("{:?}", n.as_f64().unwrap_or_default()), Kind::Double),
        J::String(s) => (string(s), Kind::String),
        J::Array(items) => {
            let mut texts = Vec::with_capacity(items.len());
            let mut kind = None;
            for item in items {
                let (text, item_kind) = written(item, place)?;
                if kind.as_ref().is_some_and(|k| *k != item_kind) {
                    return Err(Unwritable::MixedList { place: place.to_owned() });
                }
                kind = Some(item_kind);
                texts.push(text);
            }
            (format!("[{}]", texts.join(", ")), Kind::List)
        }
        J::Object(map) => {
            let names = !is_data_map(place) && map.keys().all(|k| is_identifier(k));
            let mut texts = Vec::with_capacity(map.len());
            let mut kind = None;
            for (key, member) in map {
                let (text, member_kind) = written(member, &format!("{place}.{key}"))?;
                if names {
                    texts.push(format!("{key}: {text}"));
                    continue;
                }
                if kind.as_ref().is_some_and(|k| *k != member_kind) {
                    return Err(match map.keys().all(|k| is_identifier(k)) || is_data_map(place) {
                        true => Unwritable::MixedMap { place: place.to_owned() },
                        false => Unwritable::DataKeys { place: place.to_owned(), key: key.clone() },
                    });
                }
                kind = Some(member_kind);
                texts.push(format!("{}: {text}", string(key)));
            }
            if names {
                let type_name = format!("Object.{place}");
                (format!("{type_name}{{{}}}", texts.join(", ")), Kind::Object(type_name))
            } else {
                (format!("{{{}}}", texts.join(", ")), Kind::Map)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_are_escaped_as_cel_reads_them() {
        assert_eq!(string(r#"a "b" \c"#), r#""a \"b\" \\c""#);
        assert_eq!(string("line\nnext\u{1}"), r#""line\nnext\u0001""#);
    }

    #[test]
    fn objects_with_named_fields_are_typed_by_their_place_and_data_maps_are_map_literals() {
        let container = json!({"name": "proxy", "ports": [{"containerPort": 15000, "protocol": "TCP"}],
                               "resources": {"requests": {"cpu": "10m"}}});
        assert_eq!(
            value(&container, "spec.containers").unwrap(),
            r#"Object.spec.containers{name: "proxy", ports: [Object.spec.containers.ports{containerPort: 15000, protocol: "TCP"}], resources: Object.spec.containers.resources{requests: {"cpu": "10m"}}}"#
        );
        assert_eq!(
            value(&json!({"sidecar-injector.io/injected": "true"}), "metadata.labels").unwrap(),
            r#"{"sidecar-injector.io/injected": "true"}"#
        );
    }

    #[test]
    fn what_cel_cannot_write_in_one_literal_is_refused_naming_the_place() {
        let mixed = json!({"a": 1, "b": "x"});
        assert!(matches!(value(&mixed, "metadata.labels"), Err(Unwritable::MixedMap { .. })));
        let mixed = json!(["a", 1]);
        assert!(matches!(value(&mixed, "spec.containers.args"), Err(Unwritable::MixedList { .. })));
        let keys = json!({"example.com/x": 1, "y": "z"});
        assert!(matches!(value(&keys, "spec.thing"), Err(Unwritable::DataKeys { .. })));
    }
}
