//! Decision to patch: the add-only merge of a compiled template into the pod.
//!
//! The template is a partial pod. Walking it beside the real pod, every template node falls in one of three cases:
//!
//! - the pod lacks it (absent, null, or an empty map or list): one `add` of the whole template value there;
//! - both are maps: recurse member by member;
//! - both are keyed lists (containers by `name`, volumeMounts by `mountPath`, ...): recurse into the items the
//!   pod already has, then add the missing ones (appended, or inserted at the front for init containers);
//! - anything else is present in the pod and belongs to the user: left alone, whatever the template says.
//!
//! The API's own rules widen "present" ([`Shape`](crate::template::schema::Shape)). Not added: a member of a
//! union the pod has already chosen another member of (an env var's `valueFrom` beside its `value`, a second
//! probe handler, a second volume source); a resource request or limit for a resource the pod sizes itself in the
//! other map; `allowPrivilegeEscalation` beside the user's `privileged: true` (or `CAP_SYS_ADMIN`), and back; a
//! container the pod declares in another container list (names are unique across them); a port whose name the
//! container gives another port. Each would make a pod the API server refuses, or quietly change
//! what the user set.
//!
//! So nothing present is ever replaced, a second run adds nothing (idempotence), and a sidecar the user declared
//! is completed without overriding what they set. Operations apply in order, so within a list the recursions
//! (which use the pod's original indices) are written before the insertions (which shift them).

use simd_json::prelude::*;
use simd_json::tape::{Array, Value};

use crate::patch::{OpHead, PatchWriter, Pointer, Sink};
use crate::pod::{CONTAINER_LISTS, PodView};
use crate::template::schema::Shape;
use crate::template::tree::{Item, KeyValue, List, Object, Rendered, TNode};
use crate::template::{InitPosition, Template};

/// The field whose missing items may be inserted at the front rather than appended.
const INIT_CONTAINERS: &str = "initContainers";
/// A container's ports: matched by `containerPort`, and their names are unique too.
const PORTS: &str = "ports";

struct Merge<'p, 'b, 't, 'i, S: Sink> {
    patch: PatchWriter<'b, S>,
    path: &'p mut Pointer,
    rendered: Rendered<'p>,
    init_position: InitPosition,
    /// The pod's container lists (in [`CONTAINER_LISTS`] order): a name may appear in only one of them.
    container_lists: [Option<Array<'t, 'i>>; 3],
}

/// Writes the add-only patch that merges `template` into `pod` (with or without per-pod overrides), returning the
/// number of operations.
pub(crate) fn merge(
    template: &Template,
    overridden: bool,
    pod: &PodView<'_, '_>,
    rendered: Rendered<'_>,
    path: &mut Pointer,
    out: &mut impl Sink,
) -> usize {
    path.clear();
    let mut cx = Merge {
        patch: PatchWriter::new(out),
        path,
        rendered,
        init_position: template.init_position,
        container_lists: pod.container_lists(),
    };
    let trees = template.trees(overridden);
    // Container defaults first: they address the pod's own containers by their original index, which the
    // appended sidecars below do not shift.
    if let (Some(defaults), Some(containers)) = (trees.container_defaults.as_ref(), pod.container_lists()[0]) {
        let spec_mark = cx.path.push_token("spec");
        cx.path.push_token("containers");
        for (index, container) in containers.iter().enumerate() {
            let name = container.get("name").and_then(|n| n.into_string()).unwrap_or("");
            if template.injected_containers.iter().any(|c| c == name) {
                continue; // the template's own container is completed from the template, not from defaults
            }
            let mark = cx.path.push_index(index);
            cx.present(defaults, container, "", None, None);
            cx.path.truncate(mark);
        }
        cx.path.truncate(spec_mark);
    }
    cx.present(&trees.pod, pod.object, "", None, None);
    cx.patch.finish()
}

impl<S: Sink> Merge<'_, '_, '_, '_, S> {
    /// Merges `t` into a value the pod has at the current path; `field` is the key it sits under and `head` the
    /// precompiled start of an `add` there, if the path is static. `taken` is a map of the pod whose keys are the
    /// user's here too (see [`Shape::Resources`](crate::template::schema::Shape::Resources)).
    fn present(&mut self, t: &TNode, value: Value<'_, '_>, field: &str, head: Option<&OpHead>, taken: Taken<'_, '_>) {
        if value.is_null() {
            return self.add_here(t, head, taken, field);
        }
        match t {
            TNode::Object(object) => match value.as_object() {
                // An empty map in the pod takes the template's whole value, unless that is empty too (`{}`
                // already satisfies `emptyDir: {}`: re-adding it would never converge).
                Some(o) if o.is_empty() && !object.members.is_empty() => self.add_here(t, head, taken, field),
                Some(_) => self.object(object, value, taken),
                None => {} // the user's value has another type: theirs wins
            },
            TNode::List(list) => match value.as_array() {
                // Likewise an empty list takes the template's whole list, unless that is empty too.
                Some(a) if a.is_empty() && !list.items.is_empty() => self.add_here(t, head, None, field),
                Some(a) if list.merge_key.is_some() => self.keyed_list(list, a, field),
                _ => {} // an atomic list, or another type: the user's value wins
            },
            TNode::Scalar(_) | TNode::Dynamic(_) => {} // present: the user's value wins
        }
    }

    fn object(&mut self, t: &Object, value: Value<'_, '_>, taken: Taken<'_, '_>) {
        for member in t.members.iter().filter(|m| !is_set(taken, &m.key)) {
            let mark = self.path.push_token(&member.token);
            let head = member.add_head.as_ref();
            let linked = t.shape.linked(&member.key).and_then(|other| value.get(other));
            match value.get(&*member.key).filter(|v| !v.is_null()) {
                Some(v) => self.present(&member.node, v, &member.key, head, linked),
                // The user chose another member of this union.
                None if t.shape.rivals(&member.key).iter().any(|rival| is_set(Some(value), rival)) => {}
                None if t.shape == Shape::SecurityContext && escalation_conflict(&member.key, value) => {}
                None => self.add_here(&member.node, head, linked, &member.key),
            }
            self.path.truncate(mark);
        }
    }

    fn keyed_list(&mut self, t: &List, items: Array<'_, '_>, field: &str) {
        let merge_key = t.merge_key.unwrap_or_default();
        let mut missing = 0;
        for item in &t.items {
            match find_item(item.key.as_ref(), items, merge_key) {
                Some((index, existing)) => {
                    let mark = self.path.push_index(index);
                    self.present(&item.node, existing, "", None, None);
                    self.path.truncate(mark);
                }
                None if self.clashes(field, item, items) => {}
                None => missing += 1,
            }
        }
        if missing == 0 {
            return;
        }
        let insert_front = field == INIT_CONTAINERS && self.init_position == InitPosition::First;
        let mut inserted = 0;
        for item in &t.items {
            if find_item(item.key.as_ref(), items, merge_key).is_some() || self.clashes(field, item, items) {
                continue;
            }
            let rendered = self.rendered;
            if insert_front {
                // Inserting at 0, 1, 2... keeps the template's order in front of the pod's own items.
                let mark = self.path.push_index(inserted);
                self.patch.add(None, self.path, false, |out| item.node.write(out, rendered));
                self.path.truncate(mark);
            } else {
                self.patch.add(t.append_head.as_ref(), self.path, true, |out| item.node.write(out, rendered));
            }
            inserted += 1;
        }
    }

    /// One `add` of the whole template node (under `field`) at the current path, less the members `taken` has
    /// and the containers the pod has in another list: nothing at all when that leaves none.
    fn add_here(&mut self, t: &TNode, head: Option<&OpHead>, taken: Taken<'_, '_>, field: &str) {
        let rendered = self.rendered;
        match (t, taken) {
            (TNode::Object(object), Some(taken)) if object.members.iter().any(|m| is_set(Some(taken), &m.key)) => {
                self.add_members(object, head, taken)
            }
            (TNode::List(list), _)
                if list.items.iter().any(|item| named_elsewhere(&self.container_lists, field, item)) =>
            {
                self.add_items(list, head, field)
            }
            _ => self.patch.add(head, self.path, false, |out| t.write(out, rendered)),
        }
    }

    /// One `add` of the members of `object` that `taken` lacks, if any.
    #[cold]
    fn add_members(&mut self, object: &Object, head: Option<&OpHead>, taken: Value<'_, '_>) {
        let keep = |key: &str| !is_set(Some(taken), key);
        if object.members.iter().any(|m| keep(&m.key)) {
            let rendered = self.rendered;
            self.patch.add(head, self.path, false, |out| object.write_members(out, rendered, keep));
        }
    }

    /// One `add` of the items of `list` (a container list) that the pod does not have in another list, if any.
    #[cold]
    fn add_items(&mut self, list: &List, head: Option<&OpHead>, field: &str) {
        let lists = self.container_lists;
        let keep = |item: &Item| !named_elsewhere(&lists, field, item);
        if list.items.iter().any(keep) {
            let rendered = self.rendered;
            self.patch.add(head, self.path, false, |out| list.write_items(out, rendered, keep));
        }
    }

    /// Would adding `item` to the pod's `items` (the list under `field`) repeat a name the API server wants
    /// unique: a container declared in another container list, or a port name the container already uses for
    /// another port?
    fn clashes(&self, field: &str, item: &Item, items: Array<'_, '_>) -> bool {
        match (field, &item.name) {
            (PORTS, Some(name)) => {
                items.iter().any(|port| port.get("name").and_then(|n| n.into_string()) == Some(name))
            }
            _ => named_elsewhere(&self.container_lists, field, item),
        }
    }
}

/// Is `item`, an item of the container list `field`, a container the pod declares in another of its container
/// `lists`? Names are unique across them: adding it would make a pod the API server refuses, and the pod's own
/// (say, the sidecar declared as a native sidecar) is the user's choice.
fn named_elsewhere(lists: &[Option<Array<'_, '_>>; 3], field: &str, item: &Item) -> bool {
    let Some(KeyValue::Str(name)) = &item.key else { return false };
    let Some(list) = CONTAINER_LISTS.iter().position(|list| *list == field) else { return false };
    let others = lists.iter().enumerate().filter(|(i, _)| *i != list).filter_map(|(_, l)| *l);
    let named = |c: Value<'_, '_>| c.get("name").and_then(|n| n.into_string()) == Some(&**name);
    others.into_iter().any(|containers| containers.iter().any(named))
}

/// Would adding `key` to the user's security context `context` pair `allowPrivilegeEscalation` with privilege
/// (`privileged: true`, or `CAP_SYS_ADMIN` added)? The API server refuses the pair; the user's setting wins.
fn escalation_conflict(key: &str, context: Value<'_, '_>) -> bool {
    let privileged = || {
        context.get("privileged").and_then(|p| p.as_bool()) == Some(true)
            || context
                .get("capabilities")
                .and_then(|c| c.get("add"))
                .and_then(|a| a.as_array())
                .is_some_and(|added| added.iter().any(|c| c.as_str() == Some("CAP_SYS_ADMIN")))
    };
    match key {
        "allowPrivilegeEscalation" => privileged(),
        "privileged" => context.get("allowPrivilegeEscalation").and_then(|a| a.as_bool()) == Some(false),
        _ => false,
    }
}

/// A map of the pod whose keys are the user's: a container's `limits` beside its `requests`, and back.
type Taken<'t, 'i> = Option<Value<'t, 'i>>;

/// Does the pod's map `map` set `key` (to anything but null)?
fn is_set(map: Option<Value<'_, '_>>, key: &str) -> bool {
    map.and_then(|m| m.get(key)).is_some_and(|v| !v.is_null())
}

/// The pod's item whose `merge_key` equals the template item's key, with its index.
fn find_item<'t, 'i>(key: Option<&KeyValue>, items: Array<'t, 'i>, merge_key: &str) -> Option<(usize, Value<'t, 'i>)> {
    let key = key?;
    items.iter().enumerate().find(|(_, v)| v.get(merge_key).is_some_and(|k| key_matches(key, k)))
}

fn key_matches(key: &KeyValue, value: Value<'_, '_>) -> bool {
    match key {
        KeyValue::Str(s) => value.as_str() == Some(&**s),
        KeyValue::Int(i) => value.as_i64() == Some(*i),
    }
}
