//! Template YAML to a small tree that remembers the line of every node, so that every later error (a bad
//! expression, an unknown field, a missing image) can name the line a person has to edit.

use saphyr::{MarkedYaml, Scalar, ScalarStyle, ScanError, Tag, YamlData, YamlLoader};

/// A YAML node with its 1-based line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct YNode {
    pub line: usize,
    pub value: YValue,
}

/// The JSON data model, plus a slot for a per-request template expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum YValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<YNode>),
    /// Keys keep the order they were written in, so the injected JSON reads like the template.
    Map(Vec<(String, YNode)>),
    /// A string leaf whose value depends on the pod; rendered per request (see `render`).
    Dynamic(usize),
}

/// A YAML-level problem: the line and what is wrong there.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct YamlProblem {
    pub line: usize,
    pub reason: String,
}

impl YNode {
    /// Does a map at or under this node have `key` (set to anything)?
    pub(crate) fn has_key(&self, key: &str) -> bool {
        match &self.value {
            YValue::Map(members) => members.iter().any(|(k, v)| k == key || v.has_key(key)),
            YValue::Seq(items) => items.iter().any(|item| item.has_key(key)),
            _ => false,
        }
    }

    pub(crate) fn map_get(&self, key: &str) -> Option<&YNode> {
        match &self.value {
            YValue::Map(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub(crate) fn map_get_mut(&mut self, key: &str) -> Option<&mut YNode> {
        match &mut self.value {
            YValue::Map(members) => members.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match &self.value {
            YValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The line of the deepest node on `path` (keys and indices) that exists.
    pub(crate) fn line_of(&self, path: &[PathSeg]) -> usize {
        let mut node = self;
        for seg in path {
            let next = match (seg, &node.value) {
                (PathSeg::Key(k), YValue::Map(members)) => members.iter().find(|(mk, _)| mk == k).map(|(_, v)| v),
                (PathSeg::Index(i), YValue::Seq(items)) => items.get(*i),
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => break,
            }
        }
        node.line
    }
}

/// One step of a path into a document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PathSeg {
    Key(String),
    Index(usize),
}

/// Formats a path the way a person reads it: `spec.containers[0].image`.
pub(crate) fn display_path(path: &[PathSeg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            PathSeg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            PathSeg::Index(i) => {
                out.push('[');
                out.push_str(itoa::Buffer::new().format(*i));
                out.push(']');
            }
        }
    }
    out
}

/// The options that make serde-saphyr read YAML as kubectl does (go-yaml v2, YAML 1.1 scalars): `0644` is octal
/// (420), `yes` and `on` are booleans. Templates and `inject`'s manifests are read the same way, so a value copied
/// from a manifest means in a template what it meant there.
pub(crate) fn kubectl_options() -> serde_saphyr::options::Options {
    let mut options = serde_saphyr::options::Options::default();
    options.legacy_octal_numbers = true;
    options
}

/// Parses one YAML document. An empty file is a problem, and so are several documents in one file.
pub(crate) fn parse(source: &str) -> Result<YNode, YamlProblem> {
    // Scalars are loaded as written and resolved below, the way kubectl resolves them (not as YAML 1.2 would).
    let mut loader: YamlLoader<'_, MarkedYaml<'_>> = YamlLoader::default();
    loader.early_parse(false);
    let scan = |e: &ScanError| YamlProblem { line: e.marker().line(), reason: e.info().to_owned() };
    saphyr_parser::Parser::new_from_str(source).load(&mut loader, true).map_err(|e| scan(&e))?;
    if let Some(e) = loader.error() {
        return Err(scan(e));
    }
    let mut docs = loader.into_documents().into_iter();
    let Some(doc) = docs.next() else {
        return Err(YamlProblem { line: 1, reason: "the file holds no YAML document".to_owned() });
    };
    if let Some(extra) = docs.next() {
        return Err(YamlProblem {
            line: extra.span.start.line(),
            reason: "a template file holds exactly one YAML document".to_owned(),
        });
    }
    convert(doc)
}

/// A scalar as kubectl reads it: quoted and block scalars (and `!!str`) are strings; a plain one is resolved by
/// YAML 1.1's rules, through the same reader `inject` uses for manifests.
fn scalar(text: &str, style: ScalarStyle, tag: Option<&Tag>, line: usize) -> Result<YValue, YamlProblem> {
    let problem = |reason: String| YamlProblem { line, reason };
    let core = |suffix: &str| tag.is_some_and(|t| t.is_yaml_core_schema() && t.suffix == suffix);
    if core("str") || (tag.is_none() && style != ScalarStyle::Plain) {
        return Ok(YValue::Str(text.to_owned()));
    }
    if let Some(tag) = tag.filter(|t| !t.is_yaml_core_schema()) {
        return Err(problem(format!("YAML tags ({tag}) are not supported in templates")));
    }
    // The scalar alone, as the value of a one-key document: what any plain scalar can be in block context.
    let document = format!("v: {text}");
    let mut value: std::collections::BTreeMap<String, serde_json::Value> =
        serde_saphyr::from_str_with_options(&document, kubectl_options())
            .map_err(|e| problem(format!("unreadable YAML value `{text}`: {e}")))?;
    Ok(match value.remove("v").unwrap_or(serde_json::Value::Null) {
        serde_json::Value::Null => YValue::Null,
        serde_json::Value::Bool(b) => YValue::Bool(b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => YValue::Int(i),
            None => match n.as_f64() {
                Some(f) if f.is_finite() => YValue::Float(f),
                _ => return Err(problem("infinite and NaN numbers have no JSON form".to_owned())),
            },
        },
        serde_json::Value::String(s) => YValue::Str(s),
        // A plain scalar is never a collection; a text that reads as one is kept as written.
        _ => YValue::Str(text.to_owned()),
    })
}

fn convert(node: MarkedYaml<'_>) -> Result<YNode, YamlProblem> {
    let line = node.span.start.line();
    let problem = |reason: &str| YamlProblem { line, reason: reason.to_owned() };
    let value = match node.data {
        YamlData::Representation(text, style, tag) => scalar(&text, style, tag.as_deref(), line)?,
        YamlData::Value(Scalar::Null) => YValue::Null,
        YamlData::Value(Scalar::Boolean(b)) => YValue::Bool(b),
        YamlData::Value(Scalar::Integer(i)) => YValue::Int(i),
        YamlData::Value(Scalar::FloatingPoint(f)) => {
            if !f.is_finite() {
                return Err(problem("infinite and NaN numbers have no JSON form"));
            }
            YValue::Float(f.into_inner())
        }
        YamlData::Value(Scalar::String(s)) => YValue::Str(s.into_owned()),
        YamlData::Sequence(items) => YValue::Seq(items.into_iter().map(convert).collect::<Result<_, _>>()?),
        YamlData::Mapping(members) => {
            let mut out: Vec<(String, YNode)> = Vec::with_capacity(members.len());
            for (k, v) in members {
                let key_line = k.span.start.line();
                let key = match convert(k)?.value {
                    YValue::Str(s) => s,
                    _ => {
                        return Err(YamlProblem {
                            line: key_line,
                            reason: "mapping keys must be strings (quote numeric or boolean keys: `on`, `yes` and \
                                     `no` are booleans to kubectl)"
                                .to_owned(),
                        });
                    }
                };
                out.push((key, convert(v)?));
            }
            YValue::Map(out)
        }
        // The loader resolves aliases to their anchor's value; an alias that reaches us is unresolvable.
        YamlData::Alias(_) => return Err(problem("unresolvable YAML alias")),
        YamlData::Tagged(tag, _) => return Err(problem(&format!("YAML tags ({tag}) are not supported in templates"))),
        YamlData::BadValue => return Err(problem("unreadable YAML value")),
    };
    Ok(YNode { line, value })
}

/// Converts a YAML tree without dynamic slots to JSON.
pub(crate) fn to_json(node: &YNode, dynamic: &mut dyn FnMut(usize) -> serde_json::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match &node.value {
        YValue::Null => J::Null,
        YValue::Bool(b) => J::Bool(*b),
        YValue::Int(i) => J::from(*i),
        YValue::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        YValue::Str(s) => J::String(s.clone()),
        YValue::Seq(items) => J::Array(items.iter().map(|n| to_json(n, dynamic)).collect()),
        YValue::Map(members) => J::Object(members.iter().map(|(k, v)| (k.clone(), to_json(v, dynamic))).collect()),
        YValue::Dynamic(slot) => dynamic(*slot),
    }
}

/// Converts JSON (a rendered expression) back to a tree, every node on `line`.
pub(crate) fn from_json(value: serde_json::Value, line: usize) -> YNode {
    use serde_json::Value as J;
    let value = match value {
        J::Null => YValue::Null,
        J::Bool(b) => YValue::Bool(b),
        J::Number(n) => match n.as_i64() {
            Some(i) => YValue::Int(i),
            None => YValue::Float(n.as_f64().unwrap_or(0.0)),
        },
        J::String(s) => YValue::Str(s),
        J::Array(items) => YValue::Seq(items.into_iter().map(|v| from_json(v, line)).collect()),
        J::Object(members) => YValue::Map(members.into_iter().map(|(k, v)| (k, from_json(v, line))).collect()),
    };
    YNode { line, value }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_lines_order_and_scalar_types() {
        let doc = parse("a: 1\nb:\n  - \"2\"\n  - true\nc: ~\nd: 1.5\n").unwrap();
        let YValue::Map(members) = &doc.value else { panic!("not a map") };
        let keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c", "d"]);
        assert_eq!(doc.map_get("a").unwrap().value, YValue::Int(1));
        let b = doc.map_get("b").unwrap();
        assert_eq!(b.line, 3);
        let YValue::Seq(items) = &b.value else { panic!("not a seq") };
        assert_eq!(items[0].value, YValue::Str("2".into()), "a quoted number stays a string");
        assert_eq!(items[1].value, YValue::Bool(true));
        assert_eq!(items[1].line, 4);
        assert_eq!(doc.map_get("c").unwrap().value, YValue::Null);
        assert_eq!(doc.map_get("d").unwrap().value, YValue::Float(1.5));
    }

    #[test]
    fn reports_syntax_errors_with_their_line() {
        let err = parse("a: 1\nb: [1, 2\nc: 3\n").unwrap_err();
        assert!(err.line >= 2, "{err:?}");
        assert!(!err.reason.is_empty());
    }

    #[test]
    fn resolves_aliases_and_refuses_non_string_keys_and_extra_documents() {
        assert_eq!(parse("a: &x 1\nb: *x\n").unwrap().map_get("b").unwrap().value, YValue::Int(1));
        assert_eq!(parse("a: 1\n8080: x\n").unwrap_err().line, 2);
        assert!(parse("a: 1\n---\nb: 2\n").unwrap_err().reason.contains("one YAML document"));
        assert!(parse("").unwrap_err().reason.contains("no YAML"));
    }

    #[test]
    fn line_of_falls_back_to_the_deepest_existing_node() {
        let doc = parse("spec:\n  containers:\n    - name: a\n      image: b\n").unwrap();
        let path = [PathSeg::Key("spec".into()), PathSeg::Key("containers".into()), PathSeg::Index(0)];
        assert_eq!(doc.line_of(&path), 3);
        let missing = [PathSeg::Key("spec".into()), PathSeg::Key("nope".into())];
        assert_eq!(doc.line_of(&missing), 2, "the `spec` block, which has no `nope`");
        assert_eq!(display_path(&path), "spec.containers[0]");
    }
}
