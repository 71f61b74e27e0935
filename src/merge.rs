//! Decision to patch: the add-only merge of a compiled template into the pod.
//!
//! The template is a partial pod. Walking it beside the real pod, every template node falls in one of three cases:
//!
//! - the pod lacks it (absent, null, or an empty map or list): one `add` of the whole template value there;
//! - both are maps: recurse member by member;
//! - both are keyed lists (containers by `name`, volumeMounts by `mountPath`, ...): recurse into the items the
//!   pod already has, then add the missing ones (appended, or inserted at the front: init containers, and
//!   containers that hold the app with their `postStart` hooks);
//! - anything else is present in the pod and belongs to the user: left alone, whatever the template says.
//!
//! The API's own rules, in [`merge_rules`](crate::pod_api::merge_rules) (the one rule set, which combining
//! templates follows too), widen "present": a member of a union the pod has already chosen another member of, a
//! resource the pod sizes itself in the other map, `allowPrivilegeEscalation` beside privilege, a container the pod
//! declares in another container list, a port whose name the container gives another port. Each would make a
//! pod the API server refuses, or quietly change what the user set. One string is merged rather than kept: a set
//! of names (the autoscaler's safe-to-evict volumes) gets the names it lacks appended to the pod's own.
//!
//! So nothing present is ever replaced, a second run adds nothing (idempotence), and a sidecar the user declared
//! is completed without overriding what they set. Operations apply in order, so within a list the recursions
//! (which use the pod's original indices) are written before the insertions (which shift them).

// The traits by name, not the prelude's glob: its `ArrayTrait` turns every `Vec::iter` into a boxed iterator.
use simd_json::prelude::{TypedScalarValue, ValueAsScalar, ValueIntoString};
use simd_json::tape::{Array, Value};

use crate::patch::{Fragment, OpHead, PatchWriter, Pointer, Sink};
use crate::pod::PodView;
use crate::pod_api::merge_rules::{self, Existing};
use crate::pod_api::spec::{CONTAINERS, INIT_CONTAINERS};
use crate::template::tree::{Item, KeyValue, List, Member, Object, Rendered, TNode};
use crate::template::{InitPosition, Template};

/// One step from the pod's root to where the merge is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step<'m> {
    /// The member under this key.
    Field(&'m str),
    /// The item at this index of the pod's list.
    Index(usize),
}

/// What one `add` adds, at the steps where the merge is.
#[derive(Clone, Copy)]
pub(crate) enum Added<'m, 'k> {
    /// The whole template value.
    Value(&'m TNode),
    /// Those members of the object that `keep` accepts.
    Members(&'m Object, &'k dyn Fn(&str) -> bool),
    /// Those items of the list that `keep` accepts.
    Items(&'m List, &'k dyn Fn(&Item) -> bool),
    /// One item, appended to (or inserted into) the keyed list.
    Item(&'m Item),
}

/// Watches the merge: where it goes and what each `add` adds, so that validation can name what a pod lacks
/// without reading the patch back. The response's merge has none (`()`), which compiles to nothing.
pub(crate) trait Observer<'m> {
    /// The merge goes one step down.
    fn enter(&mut self, step: Step<'m>);
    /// The merge comes back up one step.
    fn leave(&mut self);
    /// An `add` of `what` where the merge is.
    fn added(&mut self, what: Added<'m, '_>);
    /// The template's node `t` meets the pod's `value` where the merge is, both present: the merge completes the
    /// pod's value from `t`, or leaves it. `rendered` holds the pod's rendered leaves, which `t` may read.
    fn met(&mut self, t: &'m TNode, value: Value<'_, '_>, rendered: Rendered<'_>) {
        let _ = (t, value, rendered);
    }
}

impl Observer<'_> for () {
    fn enter(&mut self, _: Step<'_>) {}
    fn leave(&mut self) {}
    fn added(&mut self, _: Added<'_, '_>) {}
    #[inline(always)]
    fn met(&mut self, _: &TNode, _: Value<'_, '_>, _: Rendered<'_>) {}
}

struct Merge<'p, 'b, 't, 'i, S: Sink, O> {
    patch: PatchWriter<'b, S>,
    path: &'p mut Pointer,
    rendered: Rendered<'p>,
    init_position: InitPosition,
    /// The template's containers go in front of the pod's ([`Template::containers_first`]).
    containers_first: bool,
    /// The pod's container lists (in [`merge_rules::CONTAINER_LISTS`] order): a name may appear in only one of them.
    container_lists: [Option<Value<'t, 'i>>; 3],
    observer: &'p mut O,
}

/// Writes the add-only patch that merges `template` into `pod` (with or without per-pod overrides), returning the
/// number of operations. `observer` sees each operation (`&mut ()` when nobody watches).
pub(crate) fn merge<'m>(
    template: &'m Template,
    overridden: bool,
    pod: &PodView<'_, '_>,
    rendered: Rendered<'_>,
    path: &mut Pointer,
    out: &mut impl Sink,
    observer: &mut impl Observer<'m>,
) -> usize {
    path.clear();
    let mut cx = Merge {
        patch: PatchWriter::new(out),
        path,
        rendered,
        init_position: template.init_position,
        containers_first: template.containers_first(),
        container_lists: pod.container_list_values(),
        observer,
    };
    let trees = template.trees(overridden);
    // Container defaults first: they address the pod's own containers by their original index, which the
    // sidecars added below (appended, or inserted in front) would shift.
    if let (Some(defaults), Some(containers)) = (trees.container_defaults.as_ref(), pod.container_lists()[0]) {
        let spec_mark = cx.enter(Step::Field("spec"), "spec");
        let containers_mark = cx.enter(Step::Field(CONTAINERS), CONTAINERS);
        for (index, container) in containers.iter().enumerate() {
            let name = container.get("name").and_then(|n| n.into_string()).unwrap_or("");
            if template.injects().containers.iter().any(|c| c == name) {
                continue; // the template's own container is completed from the template, not from defaults
            }
            if !template.defaults_reach(pod, name) {
                continue; // the pod (or the template) limits the defaults to other containers
            }
            let mark = cx.enter_index(index);
            cx.present(defaults, container, "", None, None);
            cx.leave(mark);
        }
        cx.leave(containers_mark);
        cx.leave(spec_mark);
    }
    cx.present(&trees.pod, pod.object, "", None, None);
    cx.patch.finish()
}

impl<'m, S: Sink, O: Observer<'m>> Merge<'_, '_, '_, '_, S, O> {
    /// Goes down to the member `key` (`token` being its escaped pointer token); returns the mark to leave by.
    fn enter(&mut self, step: Step<'m>, token: &str) -> usize {
        self.observer.enter(step);
        self.path.push_token(token)
    }

    fn enter_member(&mut self, member: &'m Member) -> usize {
        self.enter(Step::Field(&member.key), &member.token)
    }

    fn enter_index(&mut self, index: usize) -> usize {
        self.observer.enter(Step::Index(index));
        self.path.push_index(index)
    }

    fn leave(&mut self, mark: usize) {
        self.observer.leave();
        self.path.truncate(mark);
    }

    /// Merges `t` into a value the pod has at the current path; `field` is the key it sits under and `head` the
    /// precompiled start of an `add` there, if the path is static. `taken` is a map of the pod whose keys are the
    /// user's here too (see [`Shape::Resources`](merge_rules::Shape::Resources)).
    fn present(
        &mut self,
        t: &'m TNode,
        value: Value<'_, '_>,
        field: &str,
        head: Option<&OpHead>,
        taken: Taken<'_, '_>,
    ) {
        if value.is_null() {
            return self.add_here(t, head, taken, field);
        }
        self.observer.met(t, value, self.rendered);
        match t {
            TNode::Object(object) => match value.as_object() {
                Some(o) if merge_rules::empty_is_absent(o.is_empty(), object.members.is_empty()) => {
                    self.add_here(t, head, taken, field)
                }
                Some(_) => self.object(object, value, taken),
                None => {} // the user's value has another type: theirs wins
            },
            TNode::List(list) => match value.as_array() {
                Some(a) if merge_rules::empty_is_absent(a.is_empty(), list.items.is_empty()) => {
                    self.add_here(t, head, None, field)
                }
                Some(a) if list.merge_key.is_some() => self.keyed_list(list, value, a, field),
                _ => {} // an atomic list, or another type: the user's value wins
            },
            TNode::Scalar(names) if merge_rules::is_name_set(field) => {
                if let Some(existing) = value.into_string() {
                    self.add_names(t, names, existing, head);
                }
            }
            TNode::Scalar(_) | TNode::Dynamic(_) => {} // present: the user's value wins
        }
    }

    /// One `add` of the pod's set of names `existing` with those of the template's `names` it lacks appended, if
    /// it lacks any ([`merge_rules::is_name_set`]). Only pods that set such an annotation themselves come here.
    #[cold]
    fn add_names(&mut self, t: &'m TNode, names: &Fragment, existing: &str, head: Option<&OpHead>) {
        // The template's value is a static JSON string; one that is not (it cannot be) adds nothing.
        let Ok(template) = serde_json::from_slice::<&str>(names.json()) else { return };
        let Some(union) = merge_rules::name_union(existing, template) else { return };
        self.observer.added(Added::Value(t));
        self.patch.add(head, self.path, false, |out| {
            let mut json = Vec::with_capacity(union.len() + 2);
            crate::json::write_str(&mut json, &union);
            out.raw(&json);
        });
    }

    fn object(&mut self, t: &'m Object, value: Value<'_, '_>, taken: Taken<'_, '_>) {
        for member in t.members.iter().filter(|m| !merge_rules::is_set(taken, &m.key)) {
            let mark = self.enter_member(member);
            let head = member.add_head.as_ref();
            let linked = t.shape.linked(&member.key).and_then(|other| value.member(other));
            match value.member(&member.key) {
                Some(v) => self.present(&member.node, v, &member.key, head, linked),
                None if merge_rules::may_add_member(t.shape, &member.key, value) => {
                    self.add_here(&member.node, head, linked, &member.key)
                }
                None => {} // the user chose otherwise (another member of a union, say)
            }
            self.leave(mark);
        }
    }

    fn keyed_list(&mut self, t: &'m List, list: Value<'_, '_>, items: Array<'_, '_>, field: &str) {
        let merge_key = t.merge_key.unwrap_or_default();
        let mut missing = 0;
        for item in &t.items {
            match find_item(item.key.as_ref(), items, merge_key) {
                Some((_, existing)) if another_object(field, item, existing) => {}
                Some((index, existing)) => {
                    let mark = self.enter_index(index);
                    self.present(&item.node, existing, "", None, None);
                    self.leave(mark);
                }
                None if self.may_add(field, item, list) => missing += 1,
                None => {}
            }
        }
        if missing == 0 {
            return;
        }
        let insert_front = match field {
            INIT_CONTAINERS => self.init_position == InitPosition::First,
            CONTAINERS => self.containers_first,
            _ => false,
        };
        let mut inserted = 0;
        for item in &t.items {
            if find_item(item.key.as_ref(), items, merge_key).is_some() || !self.may_add(field, item, list) {
                continue;
            }
            let rendered = self.rendered;
            self.observer.added(Added::Item(item));
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
    fn add_here(&mut self, t: &'m TNode, head: Option<&OpHead>, taken: Taken<'_, '_>, field: &str) {
        let rendered = self.rendered;
        match (t, taken) {
            (TNode::Object(object), Some(taken))
                if object.members.iter().any(|m| merge_rules::is_set(Some(taken), &m.key)) =>
            {
                self.add_members(object, head, taken)
            }
            (TNode::List(list), _) if list.items.iter().any(|item| self.named_elsewhere(field, item)) => {
                self.add_items(list, head, field)
            }
            _ => {
                self.observer.added(Added::Value(t));
                self.patch.add(head, self.path, false, |out| t.write(out, rendered))
            }
        }
    }

    /// One `add` of the members of `object` that `taken` lacks, if any.
    #[cold]
    fn add_members(&mut self, object: &'m Object, head: Option<&OpHead>, taken: Value<'_, '_>) {
        let keep = |key: &str| !merge_rules::is_set(Some(taken), key);
        if object.members.iter().any(|m| keep(&m.key)) {
            let rendered = self.rendered;
            self.observer.added(Added::Members(object, &keep));
            self.patch.add(head, self.path, false, |out| object.write_members(out, rendered, keep));
        }
    }

    /// One `add` of the items of `list` (a container list) that the pod does not have in another list, if any.
    #[cold]
    fn add_items(&mut self, list: &'m List, head: Option<&OpHead>, field: &str) {
        let lists = self.container_lists;
        let keep =
            |item: &Item| !item.name.as_deref().is_some_and(|name| merge_rules::named_elsewhere(&lists, field, name));
        if list.items.iter().any(keep) {
            let rendered = self.rendered;
            self.observer.added(Added::Items(list, &keep));
            self.patch.add(head, self.path, false, |out| list.write_items(out, rendered, keep));
        }
    }

    /// May `item` be added to the pod's `list` (under `field`), which lacks its merge key? See
    /// [`merge_rules::may_add_item`].
    fn may_add(&self, field: &str, item: &Item, list: Value<'_, '_>) -> bool {
        merge_rules::may_add_item(field, item.name.as_deref(), list, &self.container_lists)
    }

    fn named_elsewhere(&self, field: &str, item: &Item) -> bool {
        item.name.as_deref().is_some_and(|name| merge_rules::named_elsewhere(&self.container_lists, field, name))
    }
}

/// A map of the pod whose keys are the user's: a container's `limits` beside its `requests`, and back.
type Taken<'t, 'i> = Option<Value<'t, 'i>>;

/// Is the pod's `existing` item, found by the template item's merge key, one of the pod's own objects rather than
/// the template's (see [`merge_rules::identified_by_name`])?
fn another_object(field: &str, item: &Item, existing: Value<'_, '_>) -> bool {
    let theirs = || existing.member("name").and_then(Existing::string);
    merge_rules::identified_by_name(field)
        && item.name.as_deref().is_some_and(|ours| theirs().is_some_and(|theirs| theirs != ours))
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

/// The pod, on simd-json's tape, as the merge rules read it.
impl<'t, 'i> Existing<'i> for Value<'t, 'i> {
    fn member(self, key: &str) -> Option<Self> {
        self.get(key).filter(|v| !v.is_null())
    }

    fn string(self) -> Option<&'i str> {
        self.into_string()
    }

    fn boolean(self) -> Option<bool> {
        self.as_bool()
    }

    fn items(self) -> Option<impl Iterator<Item = Self>> {
        self.as_array().map(|a| a.iter())
    }
}
