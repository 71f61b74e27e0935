//! Decision to patch: the add-only merge of a compiled template into the pod, as a JSONPatch.
//!
//! The walk ([`add_only`]) decides, beside the pod, what the template adds: each node the pod lacks (absent, null,
//! or an empty map or list) is one `add` of the template's whole value there, maps and keyed lists (containers by
//! `name`, volumeMounts by `mountPath`, ...) are merged member by member and item by item, and anything else the
//! pod has is the user's, whatever the template says. The API's own rules, in
//! [`merge_rules`](crate::pod_api::merge_rules) (the one rule set, which combining templates follows too), widen
//! "present": a member of a union the pod has already chosen another member of, a resource the pod sizes itself in
//! the other map, `allowPrivilegeEscalation` beside privilege, a container the pod declares in another container
//! list, a port whose name the container gives another port. Each would make a pod the API server refuses, or
//! quietly change what the user set. One string is merged rather than kept: a set of names (the autoscaler's
//! safe-to-evict volumes) gets the names it lacks appended to the pod's own.
//!
//! So nothing present is ever replaced, a second run adds nothing (idempotence), and a sidecar the user declared
//! is completed without overriding what they set. This module writes what the walk decides: the patch, through
//! precompiled op heads where the path is static, with the template's init containers (and containers that hold
//! the app with their `postStart` hooks) inserted in front of the pod's; an [`Observer`] may watch it.

// The traits by name, not the prelude's glob: its `ArrayTrait` turns every `Vec::iter` into a boxed iterator.
use simd_json::prelude::{TypedScalarValue, ValueAsScalar, ValueIntoString};
use simd_json::tape::Value;

use crate::patch::{OpHead, PatchWriter, Pointer, Sink};
use crate::pod::PodView;
use crate::pod_api::add_only::{self, Merger};
use crate::pod_api::merge_rules::Existing;
use crate::pod_api::spec::{CONTAINERS, INIT_CONTAINERS};
use crate::template::tree::{Item, List, Member, Rendered, TNode};
use crate::template::{InitPosition, Template};

pub(crate) use crate::pod_api::add_only::Step;

/// What one `add` of the merge adds, where it is.
pub(crate) type Added<'m, 'k> = add_only::Added<'m, 'k, &'m TNode>;

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

/// Writes the patch the walk decides.
struct Merge<'p, 'b, S: Sink, O> {
    patch: PatchWriter<'b, S>,
    path: &'p mut Pointer,
    rendered: Rendered<'p>,
    init_position: InitPosition,
    /// The template's containers go in front of the pod's ([`Template::containers_first`]).
    containers_first: bool,
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
        observer,
    };
    let lists = pod.container_list_values();
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
            add_only::walk(defaults, container, lists, &mut cx);
            cx.leave(mark);
        }
        cx.leave(containers_mark);
        cx.leave(spec_mark);
    }
    add_only::walk(&trees.pod, pod.object, lists, &mut cx);
    cx.patch.finish()
}

impl<'m, S: Sink, O: Observer<'m>> Merge<'_, '_, S, O> {
    /// Goes down to the member `key` (`token` being its escaped pointer token); returns the mark to leave by.
    fn enter(&mut self, step: Step<'m>, token: &str) -> usize {
        self.observer.enter(step);
        self.path.push_token(token)
    }

    /// The precompiled start of an `add` at the member `at`, if its path is static.
    fn head(at: Option<&'m Member>) -> Option<&'m OpHead> {
        at.and_then(|member| member.add_head.as_ref())
    }
}

impl<'m, 't, 'i, S: Sink, O: Observer<'m>> Merger<'m, &'m TNode, Value<'t, 'i>> for Merge<'_, '_, S, O> {
    type Mark = usize;

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

    #[inline(always)]
    fn met(&mut self, t: &'m TNode, value: Value<'t, 'i>) {
        self.observer.met(t, value, self.rendered);
    }

    fn add(&mut self, at: Option<&'m Member>, what: Added<'m, '_>) {
        let rendered = self.rendered;
        self.observer.added(what);
        let head = Self::head(at);
        match what {
            Added::Value(t) => self.patch.add(head, self.path, false, |out| t.write(out, rendered)),
            Added::Members(object, keep) => {
                self.patch.add(head, self.path, false, |out| object.write_members(out, rendered, keep))
            }
            Added::Items(list, keep) => {
                self.patch.add(head, self.path, false, |out| list.write_items(out, rendered, keep))
            }
            Added::Item(item) => self.patch.add(head, self.path, false, |out| item.node.write(out, rendered)),
        }
    }

    fn add_item(&mut self, list: &'m List, item: &'m Item, field: &str, nth: usize) {
        let rendered = self.rendered;
        self.observer.added(Added::Item(item));
        let insert_front = match field {
            INIT_CONTAINERS => self.init_position == InitPosition::First,
            CONTAINERS => self.containers_first,
            _ => false,
        };
        if insert_front {
            // Inserting at 0, 1, 2... keeps the template's order in front of the pod's own items.
            let mark = self.path.push_index(nth);
            self.patch.add(None, self.path, false, |out| item.node.write(out, rendered));
            self.path.truncate(mark);
        } else {
            self.patch.add(list.append_head.as_ref(), self.path, true, |out| item.node.write(out, rendered));
        }
    }

    /// One `add` of the pod's set of names extended to `union`. Only pods that set such an annotation themselves
    /// come here.
    #[cold]
    fn replace_names(&mut self, at: Option<&'m Member>, t: &'m TNode, union: String) {
        self.observer.added(Added::Value(t));
        self.patch.add(Self::head(at), self.path, false, |out| {
            let mut json = Vec::with_capacity(union.len() + 2);
            crate::json::write_str(&mut json, &union);
            out.raw(&json);
        });
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

    fn int(self) -> Option<i64> {
        self.as_i64()
    }

    fn is_null(self) -> bool {
        TypedScalarValue::is_null(&self)
    }

    fn map_is_empty(self) -> Option<bool> {
        self.as_object().map(|o| o.is_empty())
    }

    fn list_is_empty(self) -> Option<bool> {
        self.as_array().map(|a| a.is_empty())
    }

    fn large_map_entries(self, more_than: usize) -> Option<impl Iterator<Item = (&'i str, Self)>> {
        self.as_object().filter(|o| o.len() > more_than).map(|o| o.iter())
    }
}
