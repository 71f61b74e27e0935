//! The compiled form of a template: a tree whose lists know their Kubernetes merge key, whose pod-dependent
//! leaves are numbered slots rendered per request, and whose every map and list is also kept as its whole JSON:
//! static fragments (pre-encoded in base64) between those slots.

use std::ops::Range;

use super::Problem;
use super::yaml::{PathSeg, YNode, YValue};
use crate::json::{path_token, write_str};
use crate::patch::{Fragment, OpHead, Sink, op_head};
use crate::pod_api::add_only::{Form, ItemKey, Overlay};
use crate::pod_api::merge_rules::{Place, Shape, merge_key_for, second_key_for, shape_of};

/// A compiled template node.
#[derive(Debug)]
pub(crate) enum TNode {
    Object(Object),
    List(List),
    /// A JSON scalar, as text (a fragment: added alone, as a label's value is, it is copied in base64 too).
    Scalar(Fragment),
    /// A pod-dependent leaf: the index of its rendered JSON in [`Rendered`].
    Dynamic(usize),
    /// The status annotation's value: this fragment, or the stamp [`Rendered`] carries for a call through a
    /// revision tag's webhooks. A scalar to everything but the writer.
    Stamp(Fragment),
}

#[derive(Debug)]
pub(crate) struct Object {
    /// How the members relate in the API (see [`Shape`]).
    pub shape: Shape,
    pub members: Vec<Member>,
    /// The whole object as JSON.
    whole: Pieces,
}

#[derive(Debug)]
pub(crate) struct Member {
    pub key: Box<str>,
    /// The key as a JSON Pointer token, pointer- and JSON-escaped.
    pub token: Box<str>,
    pub node: TNode,
    /// The start of an `add` of this member, when its path is the same in every pod (no list index on the way).
    pub add_head: Option<OpHead>,
}

#[derive(Debug)]
pub(crate) struct List {
    /// The field items are matched by (`name`, `mountPath`, ...), or `None` for an atomic list.
    pub merge_key: Option<&'static str>,
    pub items: Vec<Item>,
    /// The start of an `add` appending to this list (`…/-`), when its path is the same in every pod.
    pub append_head: Option<OpHead>,
    /// The whole list as JSON.
    whole: Pieces,
}

#[derive(Debug)]
pub(crate) struct Item {
    /// The item's merge-key value, for keyed lists.
    pub key: Option<KeyValue>,
    /// The item's value of the list's second key, when the list has one and the item sets it
    /// ([`SecondKey`](crate::pod_api::merge_rules::SecondKey)).
    pub second_key: Option<Box<str>>,
    /// The item's `name`, when it is a static string: a port's name must be unique in its container too.
    pub name: Option<Box<str>>,
    pub node: TNode,
}

/// A merge-key value: names and paths are strings, `containerPort` is an integer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyValue {
    Str(Box<str>),
    Int(i64),
}

/// Per-request rendered slots: slot `i` is `buf[ranges[i]]`, JSON text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rendered<'a> {
    pub buf: &'a [u8],
    pub ranges: &'a [Range<usize>],
    /// The status annotation's value (a JSON string) when it is not the template's own: a call through a revision
    /// tag's webhooks.
    pub stamp: Option<&'a [u8]>,
}

/// A node's JSON text: static fragments with the rendered slots between them.
#[derive(Debug)]
struct Pieces(Box<[Piece]>);

#[derive(Debug)]
enum Piece {
    Static(Fragment),
    Slot(usize),
    Stamp(Fragment),
}

impl Pieces {
    /// The JSON that `build` writes, its static runs merged into as few fragments as its slots allow.
    fn build(build: impl FnOnce(&mut PiecesBuilder)) -> Self {
        let mut builder = PiecesBuilder { text: Vec::new(), pieces: Vec::new() };
        build(&mut builder);
        builder.flush();
        Pieces(builder.pieces.into_boxed_slice())
    }
}

struct PiecesBuilder {
    text: Vec<u8>,
    pieces: Vec<Piece>,
}

impl PiecesBuilder {
    fn flush(&mut self) {
        if !self.text.is_empty() {
            self.pieces.push(Piece::Static(Fragment::new(std::mem::take(&mut self.text))));
        }
    }

    fn node(&mut self, node: &TNode) {
        match node {
            TNode::Scalar(scalar) => self.text.extend_from_slice(scalar.json()),
            TNode::Dynamic(slot) => {
                self.flush();
                self.pieces.push(Piece::Slot(*slot));
            }
            TNode::Stamp(stamp) => {
                self.flush();
                self.pieces.push(Piece::Stamp(Fragment::new(stamp.json().to_vec())));
            }
            TNode::Object(object) => self.object(&object.members),
            TNode::List(list) => self.list(&list.items),
        }
    }

    fn object(&mut self, members: &[Member]) {
        self.text.push(b'{');
        for (i, member) in members.iter().enumerate() {
            if i > 0 {
                self.text.push(b',');
            }
            write_str(&mut self.text, &member.key);
            self.text.push(b':');
            self.node(&member.node);
        }
        self.text.push(b'}');
    }

    fn list(&mut self, items: &[Item]) {
        self.text.push(b'[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.text.push(b',');
            }
            self.node(&item.node);
        }
        self.text.push(b']');
    }
}

impl TNode {
    /// Writes the node as JSON.
    pub(crate) fn write(&self, out: &mut impl Sink, rendered: Rendered<'_>) {
        let pieces = match self {
            TNode::Scalar(scalar) => return out.fragment(scalar),
            TNode::Dynamic(slot) => return out.raw(rendered.slot(*slot)),
            TNode::Stamp(stamp) => return rendered.write_stamp(out, stamp),
            TNode::Object(Object { whole, .. }) | TNode::List(List { whole, .. }) => whole,
        };
        for piece in &pieces.0 {
            match piece {
                Piece::Static(fragment) => out.fragment(fragment),
                Piece::Slot(slot) => out.raw(rendered.slot(*slot)),
                Piece::Stamp(stamp) => rendered.write_stamp(out, stamp),
            }
        }
    }

    /// Makes the scalar at `path` (object keys from this node) the [`TNode::Stamp`], and the whole JSON of the
    /// objects on the way writes it as such. Nothing when there is no scalar there.
    pub(crate) fn mark_stamp(&mut self, path: &[&str]) -> bool {
        let TNode::Object(object) = self else { return false };
        let Some((first, rest)) = path.split_first() else { return false };
        let Some(member) = object.members.iter_mut().find(|m| &*m.key == *first) else { return false };
        let marked = match (&mut member.node, rest) {
            (TNode::Scalar(scalar), []) => {
                member.node = TNode::Stamp(Fragment::new(scalar.json().to_vec()));
                true
            }
            (node, rest) => node.mark_stamp(rest),
        };
        if marked {
            object.whole = Pieces::build(|b| b.object(&object.members));
        }
        marked
    }
}

impl Object {
    /// Writes the object as JSON with only the members whose key `keep` accepts, member by member (the whole
    /// object's precompiled pieces cannot leave one out).
    pub(crate) fn write_members(&self, out: &mut impl Sink, rendered: Rendered<'_>, keep: impl Fn(&str) -> bool) {
        let mut text = Vec::new();
        let mut separator = b'{';
        for member in self.members.iter().filter(|m| keep(&m.key)) {
            text.clear();
            text.push(separator);
            write_str(&mut text, &member.key);
            text.push(b':');
            out.raw(&text);
            member.node.write(out, rendered);
            separator = b',';
        }
        out.raw(if separator == b'{' { b"{}" } else { b"}" });
    }
}

impl List {
    /// Writes the list as JSON with only the items `keep` accepts.
    pub(crate) fn write_items<'a>(
        &'a self,
        out: &mut impl Sink,
        rendered: Rendered<'_>,
        keep: impl Fn(&'a Item) -> bool,
    ) {
        let mut separator: &[u8] = b"[";
        for item in self.items.iter().filter(|item| keep(item)) {
            out.raw(separator);
            item.node.write(out, rendered);
            separator = b",";
        }
        out.raw(if separator == b"[" { b"[]" } else { b"]" });
    }
}

impl Rendered<'_> {
    /// The JSON text rendered for `slot`.
    pub(crate) fn slot(&self, slot: usize) -> &[u8] {
        &self.buf[self.ranges[slot].clone()]
    }

    /// Writes the status annotation's value: the call's stamp, else the template's own.
    fn write_stamp(&self, out: &mut impl Sink, own: &Fragment) {
        match self.stamp {
            Some(stamp) => out.raw(stamp),
            None => out.fragment(own),
        }
    }
}

/// A compiled template, as the add-only walk reads it when injecting: shapes and merge keys compiled in.
impl<'m> Overlay<'m> for &'m TNode {
    type Map = &'m Object;
    type Member = &'m Member;
    type List = &'m List;
    type Item = &'m Item;

    #[inline]
    fn form(self) -> Form<&'m Object, &'m List> {
        match self {
            TNode::Object(object) => Form::Map(object),
            TNode::List(list) => Form::List(list),
            TNode::Scalar(_) | TNode::Dynamic(_) | TNode::Stamp(_) => Form::Leaf,
        }
    }

    fn names(self) -> Option<&'m str> {
        // A static JSON string (one with escapes has none to offer, and adds nothing).
        match self {
            TNode::Scalar(json) => serde_json::from_slice::<&str>(json.json()).ok(),
            _ => None,
        }
    }

    fn members(map: &'m Object) -> impl Iterator<Item = &'m Member> {
        map.members.iter()
    }

    fn map_is_empty(map: &'m Object) -> bool {
        map.members.is_empty()
    }

    fn shape(map: &'m Object, _: Place<'_>) -> Shape {
        map.shape
    }

    fn key(member: &'m Member) -> &'m str {
        &member.key
    }

    fn value(member: &'m Member) -> Self {
        &member.node
    }

    fn items(list: &'m List) -> impl Iterator<Item = &'m Item> {
        list.items.iter()
    }

    fn list_is_empty(list: &'m List) -> bool {
        list.items.is_empty()
    }

    fn merge_key(list: &'m List, _: &str) -> Option<&'static str> {
        list.merge_key
    }

    fn item(item: &'m Item) -> Self {
        &item.node
    }

    fn item_key(item: &'m Item, _: &str) -> Option<ItemKey<'m>> {
        item.key.as_ref().map(|key| match key {
            KeyValue::Str(s) => ItemKey::Str(s),
            KeyValue::Int(i) => ItemKey::Int(*i),
        })
    }

    fn item_second_key(item: &'m Item, _: &str) -> Option<&'m str> {
        item.second_key.as_deref()
    }

    fn item_name(item: &'m Item) -> Option<&'m str> {
        item.name.as_deref()
    }
}

/// Compiles a resolved YAML tree (values-only expressions already substituted, pod-dependent ones turned into
/// slots). `place` (the key the node sits under, or the list it is an item of) picks a list's merge key and an
/// object's [`Shape`]. `pointer` is the node's JSON Pointer in the pod (JSON-escaped) when it is the same for
/// every pod, `None` under a list item.
pub(crate) fn compile(
    node: &YNode,
    place: Place<'_>,
    path: &mut Vec<PathSeg>,
    pointer: Option<&str>,
) -> Result<TNode, Problem> {
    Ok(match &node.value {
        YValue::Dynamic(slot) => TNode::Dynamic(*slot),
        YValue::Map(members) => {
            let shape = shape_of(place);
            let mut out = Vec::with_capacity(members.len());
            for (index, (key, value)) in members.iter().enumerate() {
                path.push(PathSeg::Key(key.clone()));
                if let Some(other) = shape.conflict(members[..index].iter().map(|(k, _)| k.as_str()), key) {
                    let reason = format!("`{key}` and `{other}` exclude each other: the API server refuses both");
                    return Err(Problem::new(path.clone(), reason));
                }
                let token = path_token(key);
                let child_pointer = pointer.map(|p| format!("{p}/{token}"));
                let child = compile(value, Place::Field(key), path, child_pointer.as_deref())?;
                path.pop();
                let add_head = child_pointer.map(|p| op_head(&p, false));
                out.push(Member { key: key.as_str().into(), token, node: child, add_head });
            }
            let whole = Pieces::build(|b| b.object(&out));
            TNode::Object(Object { shape, members: out, whole })
        }
        YValue::Seq(items) => {
            let field = match place {
                Place::Field(field) => Some(field),
                _ => None,
            };
            let merge_key = field.and_then(merge_key_for);
            let second = field.and_then(second_key_for);
            let mut out: Vec<Item> = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                path.push(PathSeg::Index(i));
                let second_key = match second {
                    Some(second) => second_key(item, second.field, path)?,
                    None => None,
                };
                let key = match merge_key {
                    Some(mk) => {
                        let key = item_key(item, mk, path)?;
                        let same = |o: &Item| {
                            o.key.as_ref() == Some(&key)
                                && second.is_none_or(|s| s.same(o.second_key.as_deref(), second_key.as_deref()))
                        };
                        if out.iter().any(same) {
                            let also = second.map(|s| {
                                format!(" and {} {:?}", s.field, second_key.as_deref().or(s.default).unwrap_or(""))
                            });
                            return Err(Problem::new(
                                path.clone(),
                                format!("two items share the {mk} {}{}", show_key(&key), also.unwrap_or_default()),
                            ));
                        }
                        Some(key)
                    }
                    None => None,
                };
                let node = compile(item, field.map_or(Place::Root, Place::ItemOf), path, None)?;
                path.pop();
                let name = match item.map_get("name").map(|n| &n.value) {
                    Some(YValue::Str(name)) => Some(name.as_str().into()),
                    _ => None,
                };
                out.push(Item { key, second_key, name, node });
            }
            let whole = Pieces::build(|b| b.list(&out));
            let append_head = pointer.map(|p| op_head(p, true));
            TNode::List(List { merge_key, items: out, append_head, whole })
        }
        scalar => {
            let json = super::yaml::to_json(&YNode { line: node.line, value: scalar.clone() }, &mut |_| {
                serde_json::Value::Null
            });
            TNode::Scalar(Fragment::new(serde_json::to_vec(&json).expect("a JSON value always serialises")))
        }
    })
}

/// The merge key's value of a list item at `path`: what items are matched by.
fn item_key(item: &YNode, merge_key: &str, path: &[PathSeg]) -> Result<KeyValue, Problem> {
    let problem = |rule: String| Problem::new(path.to_vec(), rule);
    let Some(value) = item.map_get(merge_key) else {
        return Err(problem(format!("each item of this list needs a `{merge_key}` (items are matched by it)")));
    };
    match &value.value {
        YValue::Str(s) => Ok(KeyValue::Str(s.as_str().into())),
        YValue::Int(i) => Ok(KeyValue::Int(*i)),
        YValue::Dynamic(_) => Err(problem(format!("`{merge_key}` cannot depend on the pod: items are matched by it"))),
        _ => Err(problem(format!("`{merge_key}` must be a string or an integer"))),
    }
}

/// The value of a list's second key in an item at `path`, if it sets one: static, as items are matched by it.
fn second_key(item: &YNode, field: &str, path: &[PathSeg]) -> Result<Option<Box<str>>, Problem> {
    match item.map_get(field).map(|v| &v.value) {
        None | Some(YValue::Null) => Ok(None),
        Some(YValue::Str(s)) => Ok(Some(s.as_str().into())),
        Some(YValue::Dynamic(_)) => {
            Err(Problem::new(path.to_vec(), format!("`{field}` cannot depend on the pod: items are matched by it")))
        }
        // Not a string: the API types refuse it, with their own message.
        Some(_) => Ok(None),
    }
}

fn show_key(key: &KeyValue) -> String {
    match key {
        KeyValue::Str(s) => format!("{s:?}"),
        KeyValue::Int(i) => i.to_string(),
    }
}
