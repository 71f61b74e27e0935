//! Uninjection (`sidecar-injector uninject`): what a template's injection put into a pod, found by the merge
//! itself and taken out again.
//!
//! The merge runs over the injected pod as it would to inject it again (which adds nothing), watched by
//! [`Injected`]: wherever the template meets the pod, a pod value equal to what the template would have written
//! there (its rendered leaves included) is what injection added, and is removed whole; a value that differs is
//! the user's, and is kept (only what the template completes inside it is looked at). A set of names
//! ([`merge_rules::is_name_set`]) loses the template's names that injection appended to it. The result is a JSON Patch
//! of `remove` and `replace` operations, in an order that applies; [`apply`] applies it, and removes the maps it
//! leaves empty (injection adds a whole map where the pod has none).
//!
//! Injection is add-only, so what it added cannot be told from a value the user had set to exactly the template's
//! own: both are removed. `offline::uninject_document` checks the result by injecting it again.

use std::cmp::Ordering;

use simd_json::prelude::ValueIntoString;
use simd_json::tape::Value;

use crate::json::{escape_pointer_token, write_str};
use crate::merge::{Added, Observer, Step};
use crate::patch::ApplyError;
use crate::pod_api::merge_rules;
use crate::template::tree::{Object, Rendered, TNode};

/// One step of a path into the pod, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Key(String),
    Index(usize),
}

/// Orders paths so that, applied in this order, no removal shifts the index of another: within a list, higher
/// indices first.
fn later_first(a: &[Token], b: &[Token]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let order = match (x, y) {
            (Token::Index(x), Token::Index(y)) => y.cmp(x),
            (Token::Key(x), Token::Key(y)) => x.cmp(y),
            (Token::Key(_), Token::Index(_)) => Ordering::Less,
            (Token::Index(_), Token::Key(_)) => Ordering::Greater,
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    b.len().cmp(&a.len())
}

/// An operation of the inverse patch.
#[derive(Debug)]
enum Op {
    Remove(Vec<Token>),
    /// A set of names, with the template's appended names taken off.
    Replace(Vec<Token>, String),
}

impl Op {
    fn path(&self) -> &[Token] {
        match self {
            Op::Remove(path) | Op::Replace(path, _) => path,
        }
    }
}

/// Watches the merge over an injected pod and notes what injection put there.
#[derive(Debug, Default)]
pub(crate) struct Injected<'m> {
    steps: Vec<Step<'m>>,
    /// The depth of the node removed whole that the merge is inside, if it is: nothing under it is looked at.
    removed_at: Option<usize>,
    ops: Vec<Op>,
}

impl Injected<'_> {
    pub(crate) fn new() -> Self {
        Injected::default()
    }

    fn path(&self) -> Vec<Token> {
        self.steps
            .iter()
            .map(|step| match step {
                Step::Field(key) => Token::Key((*key).to_owned()),
                Step::Index(index) => Token::Index(*index),
            })
            .collect()
    }

    /// The inverse patch as JSON: `remove` and `replace` operations, in an order that applies (`None` when there
    /// is nothing to take out).
    pub(crate) fn into_patch(mut self) -> Option<Vec<u8>> {
        if self.ops.is_empty() {
            return None;
        }
        self.ops.sort_by(|a, b| later_first(a.path(), b.path()));
        let mut out = b"[".to_vec();
        for (i, op) in self.ops.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let pointer: String = op
                .path()
                .iter()
                .map(|token| match token {
                    Token::Key(key) => format!("/{}", escape_pointer_token(key)),
                    Token::Index(index) => format!("/{index}"),
                })
                .collect();
            let (name, value) = match op {
                Op::Remove(_) => ("remove", None),
                Op::Replace(_, value) => ("replace", Some(value)),
            };
            out.extend_from_slice(b"{\"op\":");
            write_str(&mut out, name);
            out.extend_from_slice(b",\"path\":");
            write_str(&mut out, &pointer);
            if let Some(value) = value {
                out.extend_from_slice(b",\"value\":");
                write_str(&mut out, value);
            }
            out.push(b'}');
        }
        out.push(b']');
        Some(out)
    }
}

impl Injected<'_> {
    /// Notes the resources of the pod's `resources` that injection sized. A resource the pod sizes in `requests` or
    /// `limits` is the user's in both (the merge's rule), so a resource was injected exactly when the pod sizes it
    /// in the same maps, with the same quantities, as the template does; nothing under `resources` is looked at
    /// again.
    fn resources(&mut self, t: &Object, value: Value<'_, '_>, rendered: Rendered<'_>) {
        const MAPS: [&str; 2] = ["requests", "limits"];
        let template_sizes = |map: &str| {
            t.members.iter().find(|m| &*m.key == map).and_then(|m| match &m.node {
                TNode::Object(sizes) => Some(sizes),
                _ => None,
            })
        };
        let mut names: Vec<&str> = MAPS
            .iter()
            .filter_map(|map| template_sizes(map))
            .flat_map(|sizes| sizes.members.iter().map(|size| &*size.key))
            .collect();
        names.sort_unstable();
        names.dedup();
        let path = self.path();
        for name in names {
            let template = MAPS.map(|map| {
                let size = template_sizes(map)?.members.iter().find(|size| &*size.key == name)?;
                let mut written = Vec::new();
                size.node.write(&mut written, rendered);
                serde_json::from_slice::<serde_json::Value>(&written).ok()
            });
            let pod = MAPS.map(|map| value.get(map).and_then(|m| m.get(name)).map(crate::pod::to_json));
            if template != pod {
                continue;
            }
            for (map, _) in MAPS.iter().zip(&pod).filter(|(_, size)| size.is_some()) {
                let at = [Token::Key((*map).to_owned()), Token::Key(name.to_owned())];
                self.ops.push(Op::Remove(path.iter().cloned().chain(at).collect()));
            }
        }
        self.removed_at = Some(self.steps.len());
    }
}

impl<'m> Observer<'m> for Injected<'m> {
    fn enter(&mut self, step: Step<'m>) {
        self.steps.push(step);
    }

    fn leave(&mut self) {
        self.steps.pop();
        if self.removed_at.is_some_and(|depth| self.steps.len() < depth) {
            self.removed_at = None;
        }
    }

    /// What a second injection would add is not in the pod: nothing to take out.
    fn added(&mut self, _: Added<'m, '_>) {}

    fn met(&mut self, t: &'m TNode, value: Value<'_, '_>, rendered: Rendered<'_>) {
        // The pod itself is never removed, nor anything inside what is.
        if self.steps.is_empty() || self.removed_at.is_some() {
            return;
        }
        // An item's merge key (and second key) names it: the item stays, so does its key.
        if let [.., Step::Field(list), Step::Index(_), Step::Field(key)] = self.steps.as_slice()
            && (merge_rules::merge_key_for(list) == Some(*key)
                || merge_rules::second_key_for(list).is_some_and(|second| second.field == *key))
        {
            return;
        }
        let mut written = Vec::new();
        t.write(&mut written, rendered);
        let Ok(template) = serde_json::from_slice::<serde_json::Value>(&written) else { return };
        let pod = crate::pod::to_json(value);
        if pod == template {
            self.ops.push(Op::Remove(self.path()));
            self.removed_at = Some(self.steps.len());
            return;
        }
        // `requests` and `limits`: a resource the pod sizes in one is the user's in both, so the merge does not
        // look at what it added to the other (the injected pod sizes it in both). Each resource is judged here.
        if let TNode::Object(object) = t
            && object.shape == merge_rules::Shape::Resources
        {
            self.resources(object, value, rendered);
            return;
        }
        let set = matches!(self.steps.last(), Some(Step::Field(key)) if merge_rules::is_name_set(key));
        if let (true, Some(names), Some(existing)) = (set, template.as_str(), value.into_string())
            && let Some(kept) = merge_rules::name_difference(existing, names)
        {
            self.ops.push(Op::Replace(self.path(), kept));
        }
    }
}

/// Applies the inverse `patch` to `pod` (the injected pod), and then removes each object or list that the
/// removals left empty where the injected pod had something: injection adds a whole map where the pod has none
/// (or an empty one), so a map all of whose members it added was not the pod's. Top-level members are left to the
/// caller.
pub(crate) fn apply(pod: &serde_json::Value, patch: &[u8]) -> Result<serde_json::Value, ApplyError> {
    let ops: json_patch::Patch = serde_json::from_slice(patch).map_err(ApplyError::NotAPatch)?;
    let mut result = crate::patch::apply_ops(pod, &ops)?;
    let nonempty = |v: &serde_json::Value| match v {
        serde_json::Value::Object(o) => Some(!o.is_empty()),
        serde_json::Value::Array(a) => Some(!a.is_empty()),
        _ => None,
    };
    for op in &ops.0 {
        let json_patch::PatchOperation::Remove(remove) = op else { continue };
        let mut at = remove.path.as_str();
        while let Some((parent, _)) = at.rsplit_once('/') {
            // `/metadata` and `/spec` themselves are the caller's.
            if parent.matches('/').count() < 2 {
                break;
            }
            let emptied = result.pointer(parent).and_then(nonempty) == Some(false);
            if !(emptied && pod.pointer(parent).and_then(nonempty) == Some(true)) {
                break;
            }
            remove_at(&mut result, parent);
            at = parent;
        }
    }
    Ok(result)
}

/// Removes the value at `pointer` (not the root) from `value`, if it is there.
fn remove_at(value: &mut serde_json::Value, pointer: &str) {
    let Some((parent, token)) = pointer.rsplit_once('/') else { return };
    let token = token.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(serde_json::Value::Object(members)) => {
            members.remove(&token);
        }
        Some(serde_json::Value::Array(items)) => {
            if let Some(index) = token.parse::<usize>().ok().filter(|i| *i < items.len()) {
                items.remove(index);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_indices_of_a_list_come_first_and_a_parent_after_its_children() {
        let key = |k: &str| Token::Key(k.to_owned());
        let mut paths = [
            vec![key("spec"), key("containers"), Token::Index(1)],
            vec![key("spec"), key("containers"), Token::Index(3)],
            vec![key("spec"), key("containers"), Token::Index(1), key("env"), Token::Index(0)],
        ];
        paths.sort_by(|a, b| later_first(a, b));
        assert_eq!(
            paths,
            [
                vec![key("spec"), key("containers"), Token::Index(3)],
                vec![key("spec"), key("containers"), Token::Index(1), key("env"), Token::Index(0)],
                vec![key("spec"), key("containers"), Token::Index(1)],
            ]
        );
    }
}
