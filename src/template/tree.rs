//! The compiled form of a template: a tree whose static subtrees are already JSON bytes, whose lists know their
//! Kubernetes merge key, and whose pod-dependent leaves are numbered slots rendered per request.

use std::ops::Range;

use super::yaml::{PathSeg, YNode, YValue};
use crate::json::{path_token, write_str};

/// A compiled template node.
#[derive(Debug)]
pub(crate) enum TNode {
    Object(Object),
    List(List),
    /// A JSON scalar, as text.
    Scalar(Box<[u8]>),
    /// A pod-dependent leaf: the index of its rendered JSON in [`Rendered`].
    Dynamic(usize),
}

#[derive(Debug)]
pub(crate) struct Object {
    pub members: Vec<Member>,
    /// The whole object as JSON, when no leaf below it is dynamic.
    json: Option<Box<[u8]>>,
}

#[derive(Debug)]
pub(crate) struct Member {
    pub key: Box<str>,
    /// The key as a JSON Pointer token, pointer- and JSON-escaped.
    pub token: Box<str>,
    /// `"key":` as JSON text.
    json_key: Box<[u8]>,
    pub node: TNode,
}

#[derive(Debug)]
pub(crate) struct List {
    /// The field items are matched by (`name`, `mountPath`, ...), or `None` for an atomic list.
    pub merge_key: Option<&'static str>,
    pub items: Vec<Item>,
    json: Option<Box<[u8]>>,
}

#[derive(Debug)]
pub(crate) struct Item {
    /// The item's merge-key value, for keyed lists.
    pub key: Option<KeyValue>,
    pub node: TNode,
}

/// A merge-key value: names and paths are strings, `containerPort` is an integer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyValue {
    Str(Box<str>),
    Int(i64),
}

/// The merge key of a Pod list field (the `patchMergeKey` of the Kubernetes API). Lists not named here are
/// atomic, as in Kubernetes: their order and content belong to the user (`command`, `args`, `tolerations`...).
pub(crate) fn merge_key_for(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "ports" => Some("containerPort"),
        "hostAliases" => Some("ip"),
        "topologySpreadConstraints" => Some("topologyKey"),
        _ => None,
    }
}

/// Per-request rendered slots: slot `i` is `buf[ranges[i]]`, JSON text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rendered<'a> {
    pub buf: &'a [u8],
    pub ranges: &'a [Range<usize>],
}

impl TNode {
    /// Writes the node as JSON.
    pub(crate) fn write(&self, out: &mut Vec<u8>, rendered: Rendered<'_>) {
        match self {
            TNode::Scalar(json) => out.extend_from_slice(json),
            TNode::Dynamic(slot) => out.extend_from_slice(&rendered.buf[rendered.ranges[*slot].clone()]),
            TNode::Object(Object { json: Some(json), .. }) | TNode::List(List { json: Some(json), .. }) => {
                out.extend_from_slice(json)
            }
            TNode::Object(Object { members, json: None }) => {
                out.push(b'{');
                for (i, m) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(&m.json_key);
                    m.node.write(out, rendered);
                }
                out.push(b'}');
            }
            TNode::List(List { items, json: None, .. }) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.node.write(out, rendered);
                }
                out.push(b']');
            }
        }
    }

    fn static_json(&self) -> Option<&[u8]> {
        match self {
            TNode::Scalar(json) => Some(json),
            TNode::Object(o) => o.json.as_deref(),
            TNode::List(l) => l.json.as_deref(),
            TNode::Dynamic(_) => None,
        }
    }
}

/// A compile problem: where (path in the template) and why.
pub(crate) type CompileProblem = (Vec<PathSeg>, String);

/// Compiles a resolved YAML tree (values-only expressions already substituted, pod-dependent ones turned into
/// slots). `field` is the key the node sits under, which picks a list's merge key.
pub(crate) fn compile(node: &YNode, field: Option<&str>, path: &mut Vec<PathSeg>) -> Result<TNode, CompileProblem> {
    Ok(match &node.value {
        YValue::Dynamic(slot) => TNode::Dynamic(*slot),
        YValue::Map(members) => {
            let mut out = Vec::with_capacity(members.len());
            for (key, value) in members {
                path.push(PathSeg::Key(key.clone()));
                let child = compile(value, Some(key), path)?;
                path.pop();
                let mut json_key = Vec::with_capacity(key.len() + 3);
                write_str(&mut json_key, key);
                json_key.push(b':');
                out.push(Member {
                    key: key.as_str().into(),
                    token: path_token(key),
                    json_key: json_key.into(),
                    node: child,
                });
            }
            let json = all_static(out.iter().map(|m| &m.node)).then(|| {
                let mut buf = vec![b'{'];
                for (i, m) in out.iter().enumerate() {
                    if i > 0 {
                        buf.push(b',');
                    }
                    buf.extend_from_slice(&m.json_key);
                    buf.extend_from_slice(m.node.static_json().unwrap_or_default());
                }
                buf.push(b'}');
                buf.into_boxed_slice()
            });
            TNode::Object(Object { members: out, json })
        }
        YValue::Seq(items) => {
            let merge_key = field.and_then(merge_key_for);
            let mut out: Vec<Item> = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                path.push(PathSeg::Index(i));
                let key = match merge_key {
                    Some(mk) => {
                        let key = item_key(item, mk).map_err(|reason| (path.clone(), reason))?;
                        if out.iter().any(|o| o.key.as_ref() == Some(&key)) {
                            return Err((path.clone(), format!("two items share the {mk} {}", show_key(&key))));
                        }
                        Some(key)
                    }
                    None => None,
                };
                let node = compile(item, None, path)?;
                path.pop();
                out.push(Item { key, node });
            }
            let json = all_static(out.iter().map(|i| &i.node)).then(|| {
                let mut buf = vec![b'['];
                for (i, item) in out.iter().enumerate() {
                    if i > 0 {
                        buf.push(b',');
                    }
                    buf.extend_from_slice(item.node.static_json().unwrap_or_default());
                }
                buf.push(b']');
                buf.into_boxed_slice()
            });
            TNode::List(List { merge_key, items: out, json })
        }
        scalar => {
            let json = super::yaml::to_json(&YNode { line: node.line, value: scalar.clone() }, &mut |_| {
                serde_json::Value::Null
            });
            TNode::Scalar(serde_json::to_vec(&json).expect("a JSON value always serialises").into())
        }
    })
}

fn all_static<'a>(mut nodes: impl Iterator<Item = &'a TNode>) -> bool {
    nodes.all(|n| n.static_json().is_some())
}

fn item_key(item: &YNode, merge_key: &str) -> Result<KeyValue, String> {
    let Some(value) = item.map_get(merge_key) else {
        return Err(format!("each item of this list needs a `{merge_key}` (items are matched by it)"));
    };
    match &value.value {
        YValue::Str(s) => Ok(KeyValue::Str(s.as_str().into())),
        YValue::Int(i) => Ok(KeyValue::Int(*i)),
        YValue::Dynamic(_) => Err(format!("`{merge_key}` cannot depend on the pod: items are matched by it")),
        _ => Err(format!("`{merge_key}` must be a string or an integer")),
    }
}

fn show_key(key: &KeyValue) -> String {
    match key {
        KeyValue::Str(s) => format!("{s:?}"),
        KeyValue::Int(i) => i.to_string(),
    }
}
