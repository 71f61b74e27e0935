//! The add-only merge as CEL: the walk of [`add_only`](crate::pod_api::add_only), taken over a compiled template
//! with the pod unknown, writes each `add` the webhook could write with the condition under which it writes it.
//! The conditions read the pod as the merge rules read it ([`merge_rules`]: merge keys, unions, linked resources,
//! privilege, names unique across container lists, empty is absent, sets of names), so that the policy decides at
//! admission, per pod, what the webhook decides per pod. Every decision is on the pod as it came (the webhook's
//! patch is computed on it too), and the `add`s come in the webhook's order: into the pod's own items first, then
//! the items it lacks.

use super::Refusal;
use super::cel;
use super::leaves::Leaves;
use crate::json::escape_pointer_token;
use crate::pod_api::merge_rules::{self, Shape};
use crate::pod_api::spec::{CONTAINER_LISTS, CONTAINERS, INIT_CONTAINERS};
use crate::template::tree::{KeyValue, List, TNode};

/// A CEL string expression built from static text and expressions, joined with `+` only where needed.
#[derive(Debug, Clone, Default)]
pub(super) struct Text(Vec<Piece>);

#[derive(Debug, Clone)]
enum Piece {
    Static(String),
    Expr(String),
}

impl Text {
    pub(super) fn push_static(&mut self, text: &str) {
        match self.0.last_mut() {
            Some(Piece::Static(last)) => last.push_str(text),
            _ => self.0.push(Piece::Static(text.to_owned())),
        }
    }

    pub(super) fn push_expr(&mut self, expr: String) {
        self.0.push(Piece::Expr(expr));
    }

    /// The expression.
    pub(super) fn cel(&self) -> String {
        if self.0.is_empty() {
            return cel::string("");
        }
        let pieces: Vec<String> = self
            .0
            .iter()
            .map(|piece| match piece {
                Piece::Static(text) => cel::string(text),
                Piece::Expr(expr) => expr.clone(),
            })
            .collect();
        pieces.join(" + ")
    }
}

/// Where the walk is in the pod.
#[derive(Debug, Clone)]
pub(super) struct At {
    /// The pod's value here, as a CEL optional: none when the pod has nothing (or null) here.
    pub node: String,
    /// The pod's value here as a plain CEL expression, when the walk knows it is there (under a guard that says
    /// so): what members and items are read from, without a chain of optionals.
    pub known: Option<String>,
    /// The JSON Pointer here.
    pub pointer: Text,
    /// The place in the Pod (`spec.containers`, list indices left out): what typed object initializers are named.
    pub place: String,
}

impl At {
    /// The pod itself.
    pub(super) fn root() -> At {
        At::item("object".into(), Text::default(), String::new())
    }

    /// A value the walk knows is there (the pod, an item of a list found by its key, the container of a loop),
    /// by a CEL expression of it.
    pub(super) fn item(value: String, pointer: Text, place: String) -> At {
        At { node: format!("optional.of({value})"), known: Some(value), pointer, place }
    }

    /// The member `key` of the value here, which may be absent.
    pub(super) fn member(&self, key: &str) -> At {
        let select = if cel::is_identifier(key) { format!(".?{key}") } else { format!("[?{}]", cel::string(key)) };
        let node = match &self.known {
            Some(value) => format!("{value}{select}"),
            None => format!("{}{select}", self.node),
        };
        let mut pointer = self.pointer.clone();
        pointer.push_static(&format!("/{}", escape_pointer_token(key)));
        let place = if self.place.is_empty() { key.to_owned() } else { format!("{}.{key}", self.place) };
        At { node, known: None, pointer, place }
    }

    /// The member `key` of the value here, known to be there (the walk is under a guard that says so): read by
    /// plain selection from a value the walk knows.
    fn member_there(&self, key: &str) -> At {
        let member = self.member(key);
        let value = match &self.known {
            Some(value) if cel::is_identifier(key) => format!("{value}.{key}"),
            Some(value) => format!("{value}[{}]", cel::string(key)),
            None => member.value(),
        };
        At { known: Some(value), ..member }
    }

    /// The pod's value here (under a guard that says it is there).
    fn value(&self) -> String {
        match &self.known {
            Some(value) => value.clone(),
            None => format!("{}.value()", self.node),
        }
    }

    fn present(&self) -> String {
        format!("{}.hasValue()", self.node)
    }

    fn absent(&self) -> String {
        format!("!{}.hasValue()", self.node)
    }
}

/// One `add` the webhook may write: its conditions (all must hold), where, and what (a CEL value).
#[derive(Debug, Clone)]
pub(super) struct Add {
    pub guard: Vec<String>,
    pub pointer: Text,
    pub value: String,
}

impl Add {
    /// The add as an element of the policy's list of JSONPatch: optional, unless it always applies.
    pub(super) fn cel(&self) -> String {
        let patch = format!("JSONPatch{{op: \"add\", path: {}, value: {}}}", self.pointer.cel(), self.value);
        if self.guard.is_empty() {
            return patch;
        }
        format!("?(({}) ? optional.of({patch}) : optional.none())", self.guard.join(" && "))
    }
}

/// The walk over one compiled tree.
pub(super) struct Walk<'a> {
    pub leaves: &'a Leaves,
    /// The policy's variables (name, CEL), which the adds read: the indices of the items the pod's lists have for
    /// the template's, each computed once. `None` inside a loop over the pod's containers, where an index depends
    /// on the container and is written out.
    pub variables: Option<&'a mut Vec<(String, String)>>,
    /// The template's init containers go in front of the pod's.
    pub init_first: bool,
    /// The template's containers go in front of the pod's.
    pub containers_first: bool,
    pub adds: Vec<Add>,
}

impl Walk<'_> {
    /// `expression` as a variable of the policy (read as `variables.NAME`; one variable for each expression, which
    /// the policy's evaluation computes once), or as it is inside a loop. `kind` prefixes the name.
    fn variable(&mut self, kind: &str, expression: String) -> String {
        let Some(variables) = &mut self.variables else { return expression };
        if let Some((name, _)) = variables.iter().find(|(_, e)| *e == expression) {
            return format!("variables.{name}");
        }
        let name = format!("{kind}{}", variables.len());
        variables.push((name.clone(), expression));
        format!("variables.{name}")
    }

    /// The conjunction of `guard` as one variable (see [`Walk::variable`]), when it has more than one condition.
    fn guard_variable(&mut self, guard: Vec<String>) -> Vec<String> {
        if guard.len() < 2 || self.variables.is_none() {
            return guard;
        }
        vec![self.variable("found", guard.join(" && "))]
    }

    /// Merges the root of a section (`pod`, or `containerDefaults` into a container) into the pod's value at `at`,
    /// which is there.
    pub(super) fn root(&mut self, t: &TNode, at: &At) -> Result<(), Refusal> {
        match t {
            TNode::Object(object) => self.map(object, at, &[], None),
            _ => Err(Refusal::new("a section that is not a map".into())),
        }
    }

    /// Merges `t` into the pod's value at `at`, which `guard` says is present.
    pub(super) fn present(
        &mut self,
        t: &TNode,
        at: &At,
        guard: &[String],
        field: &str,
        taken: Option<&At>,
    ) -> Result<(), Refusal> {
        match t {
            TNode::Object(object) => {
                if object.members.is_empty() {
                    return Ok(()); // `{}` meets anything present: nothing to add, ever
                }
                self.add_whole(t, at, &with(guard, format!("size({}) == 0", at.value())), field, taken)?;
                let guard = self.guard_variable(with(guard, format!("size({}) > 0", at.value())));
                self.map(object, at, &guard, taken)
            }
            TNode::List(list) => {
                if list.items.is_empty() {
                    return Ok(());
                }
                self.add_whole(t, at, &with(guard, format!("size({}) == 0", at.value())), field, None)?;
                match list.merge_key {
                    Some(merge_key) => {
                        let guard = with(guard, format!("size({}) > 0", at.value()));
                        self.keyed_list(list, merge_key, at, &guard, field)
                    }
                    None => Ok(()), // an atomic list: the pod's wins
                }
            }
            TNode::Scalar(_) | TNode::Dynamic(_) | TNode::Stamp(_) if merge_rules::is_name_set(field) => {
                self.names(t, at, guard)
            }
            TNode::Scalar(_) | TNode::Dynamic(_) | TNode::Stamp(_) => Ok(()), // present: the pod's value wins
        }
    }

    fn map(
        &mut self,
        object: &crate::template::tree::Object,
        at: &At,
        guard: &[String],
        taken: Option<&At>,
    ) -> Result<(), Refusal> {
        let shape = object.shape;
        for member in &object.members {
            let key = &*member.key;
            if at.place.is_empty()
                && let ("metadata" | "spec", TNode::Object(section)) = (key, &member.node)
            {
                // Every pod the API server admits has both, and neither empty (a namespace, containers).
                self.map(section, &at.member_there(key), guard, None)?;
                continue;
            }
            let mut guard = guard.to_vec();
            if let Some(taken) = taken {
                guard.push(taken.member(key).absent()); // a resource the pod sizes in the other map is the pod's
            }
            let child = at.member(key);
            let linked = shape.linked(key).map(|other| at.member(other));
            self.present(&member.node, &at.member_there(key), &with(&guard, child.present()), key, linked.as_ref())?;
            let mut absent = with(&guard, child.absent());
            absent.extend(may_add_member(shape, key, at));
            self.add_whole(&member.node, &child, &absent, key, linked.as_ref())?;
        }
        Ok(())
    }

    /// Into the items the pod's list has, then the missing ones (see `add_only::Walk::keyed_list`).
    fn keyed_list(
        &mut self,
        list: &List,
        merge_key: &str,
        at: &At,
        guard: &[String],
        field: &str,
    ) -> Result<(), Refusal> {
        if merge_rules::second_key_for(field).is_some() {
            return Err(Refusal::new(format!("{} (a list matched by two keys)", at.place)));
        }
        let index_of = |key: &KeyValue| {
            let (theirs, ours) = match key {
                KeyValue::Str(s) => (format!("x.?{merge_key}.orValue(\"\")"), cel::string(s)),
                KeyValue::Int(i) => (format!("x.?{merge_key}.orValue(-1)"), i.to_string()),
            };
            format!("{}.map(x, {theirs}).indexOf({ours})", at.value())
        };
        let mut missing = Vec::new();
        for item in &list.items {
            let Some(key) = &item.key else {
                return Err(Refusal::new(format!("{}: an item without its {merge_key}", at.place)));
            };
            let index = self.variable("index", index_of(key));
            let mut found = with(guard, format!("{index} >= 0"));
            if merge_rules::identified_by_name(field)
                && let Some(ours) = &item.name
            {
                // The pod's own mount at our path, of a volume of its own, is the pod's.
                let theirs = format!("{}[{index}].?name.orValue({})", at.value(), cel::string(ours));
                found.push(format!("{theirs} == {}", cel::string(ours)));
            }
            let found = self.guard_variable(found);
            let mut pointer = at.pointer.clone();
            pointer.push_static("/");
            pointer.push_expr(format!("string({index})"));
            let item_value = self.variable("item", format!("{}[{index}]", at.value()));
            let existing = At::item(item_value, pointer, at.place.clone());
            self.present(&item.node, &existing, &found, field, None)?;
            let mut absent = with(guard, format!("{index} < 0"));
            absent.extend(self.may_add_item(field, item.name.as_deref(), at));
            missing.push((item, absent));
        }
        let front = match field {
            INIT_CONTAINERS => self.init_first,
            CONTAINERS => self.containers_first,
            _ => false,
        };
        for (nth, (item, absent)) in missing.iter().enumerate() {
            let mut pointer = at.pointer.clone();
            if front {
                // Inserting at 0, 1, 2... keeps the template's order in front of the pod's own items: the index is
                // how many of the items before this one were added.
                let before: Vec<String> =
                    missing[..nth].iter().map(|(_, g)| format!("(({}) ? 1 : 0)", g.join(" && "))).collect();
                pointer.push_static("/");
                if before.is_empty() {
                    pointer.push_static("0");
                } else {
                    pointer.push_expr(format!("string({})", before.join(" + ")));
                }
            } else {
                pointer.push_static("/-");
            }
            let value = self.value(&item.node, &at.place)?;
            self.adds.push(Add { guard: absent.clone(), pointer, value });
        }
        Ok(())
    }

    /// One `add` of the whole template node `t` at `at` (under `field`), less the members the pod's `taken` map
    /// has and the containers the pod has in another list (see `add_only::Walk::add_whole`): where some are left
    /// out, an empty value and then each kept one, which gives the same pod.
    fn add_whole(
        &mut self,
        t: &TNode,
        at: &At,
        guard: &[String],
        field: &str,
        taken: Option<&At>,
    ) -> Result<(), Refusal> {
        let value = self.value(t, &at.place)?;
        match (t, taken) {
            (TNode::Object(object), Some(taken)) => {
                let is_taken: Vec<String> = object.members.iter().map(|m| taken.member(&m.key).present()).collect();
                let none_taken = format!("!({})", is_taken.join(" || "));
                self.adds.push(Add { guard: with(guard, none_taken), pointer: at.pointer.clone(), value });
                let some_taken = format!("({})", is_taken.join(" || "));
                let empty = cel::value(&serde_json::json!({}), &at.place).map_err(|e| Refusal::new(e.to_string()))?;
                let mut some = with(guard, some_taken);
                let any_kept: Vec<String> = object.members.iter().map(|m| taken.member(&m.key).absent()).collect();
                some.push(format!("({})", any_kept.join(" || ")));
                self.adds.push(Add { guard: some.clone(), pointer: at.pointer.clone(), value: empty });
                for member in &object.members {
                    let child = at.member(&member.key);
                    let kept = with(&some, taken.member(&member.key).absent());
                    let value = self.value(&member.node, &child.place)?;
                    self.adds.push(Add { guard: kept, pointer: child.pointer, value });
                }
            }
            (TNode::List(list), _) if CONTAINER_LISTS.contains(&field) => {
                let elsewhere: Vec<String> = list
                    .items
                    .iter()
                    .map(|item| match &item.name {
                        Some(name) => self.named_elsewhere(field, name),
                        None => "false".to_owned(),
                    })
                    .collect();
                let none = format!("!({})", elsewhere.join(" || "));
                self.adds.push(Add { guard: with(guard, none), pointer: at.pointer.clone(), value });
                let some = with(guard, format!("({})", elsewhere.join(" || ")));
                self.adds.push(Add { guard: some.clone(), pointer: at.pointer.clone(), value: "[]".into() });
                for (item, elsewhere) in list.items.iter().zip(&elsewhere) {
                    let mut pointer = at.pointer.clone();
                    pointer.push_static("/-");
                    let value = self.value(&item.node, &at.place)?;
                    self.adds.push(Add { guard: with(&some, format!("!({elsewhere})")), pointer, value });
                }
            }
            _ => self.adds.push(Add { guard: guard.to_vec(), pointer: at.pointer.clone(), value }),
        }
        Ok(())
    }

    /// The pod's set of names at `at` with those of `t` it lacks appended (see [`merge_rules::name_union`]).
    fn names(&mut self, t: &TNode, at: &At, guard: &[String]) -> Result<(), Refusal> {
        let TNode::Scalar(fragment) = t else {
            return Err(Refusal::new(format!("{}: a set of names rendered per pod", at.place)));
        };
        let theirs: String = serde_json::from_slice(fragment.json())
            .map_err(|_| Refusal::new(format!("{}: a set of names that is not a string", at.place)))?;
        let names: Vec<String> = theirs.split(',').map(str::trim).filter(|n| !n.is_empty()).map(cel::string).collect();
        let existing = format!("string({})", at.value());
        let missing = format!("[{}].filter(n, !{existing}.split(\",\").exists(h, h.trim() == n))", names.join(", "));
        // `trim_end_matches(',')` after `trim()`: the longest prefix that ends in something else.
        let kept = format!("{existing}.trim().find(\"(?s)^.*[^,]\")");
        let union = format!("{kept} + ({kept} == \"\" ? \"\" : \",\") + {missing}.join(\",\")");
        let guard = with(guard, format!("size({missing}) > 0"));
        self.adds.push(Add { guard, pointer: at.pointer.clone(), value: union });
        Ok(())
    }

    /// See [`merge_rules::may_add_item`].
    fn may_add_item(&mut self, field: &str, name: Option<&str>, list: &At) -> Option<String> {
        let name = name?;
        if field == merge_rules::PORTS {
            return Some(format!("!{}.exists(p, p.?name.orValue(\"\") == {})", list.value(), cel::string(name)));
        }
        CONTAINER_LISTS.contains(&field).then(|| format!("!({})", self.named_elsewhere(field, name)))
    }

    /// See [`merge_rules::named_elsewhere`]: the pod's container lists other than `field` (a container's name is
    /// unique across them).
    fn named_elsewhere(&mut self, field: &str, name: &str) -> String {
        let others: Vec<String> = CONTAINER_LISTS
            .iter()
            .filter(|list| **list != field)
            .map(|list| {
                format!("object.spec.?{list}.orValue([]).exists(c, c.?name.orValue(\"\") == {})", cel::string(name))
            })
            .collect();
        self.variable("elsewhere", others.join(" || "))
    }

    /// The template node `t` (at `place`) as a CEL value, its per-pod leaves as their CEL expressions.
    pub(super) fn value(&self, t: &TNode, place: &str) -> Result<String, Refusal> {
        let mut slots = Vec::new();
        let json = to_json(t, &mut slots)?;
        let mut text = cel::value(&json, place).map_err(|e| Refusal::new(e.to_string()))?;
        for slot in slots {
            let expr = self.leaves.expression(slot)?;
            text = text.replace(&cel::string(&slot_marker(slot)), &format!("({expr})"));
        }
        // Not a variable, even when added in several places: typed object initializers exist only in the
        // mutation's own expression.
        Ok(text)
    }
}

/// `guard` and one more condition.
fn with(guard: &[String], condition: String) -> Vec<String> {
    let mut guard = guard.to_vec();
    guard.push(condition);
    guard
}

/// See [`merge_rules::may_add_member`]: the conditions under which the member `key` may be added to the pod's
/// object at `at`, of the given shape, which lacks it.
fn may_add_member(shape: Shape, key: &str, at: &At) -> Vec<String> {
    let rivals: Vec<String> = shape.rivals(key).iter().filter(|r| **r != key).map(|r| cel::string(r)).collect();
    let mut conditions = Vec::new();
    if !rivals.is_empty() {
        conditions.push(format!("![{}].exists(r, r in {})", rivals.join(", "), at.value()));
    }
    if shape == Shape::SecurityContext {
        let privileged = format!(
            "({}.orValue(false) == true || {}.orValue([]).exists(c, c == \"CAP_SYS_ADMIN\"))",
            at.member("privileged").node,
            at.member("capabilities").member("add").node
        );
        match key {
            "allowPrivilegeEscalation" => conditions.push(format!("!{privileged}")),
            "privileged" => {
                conditions.push(format!("{}.orValue(true) != false", at.member("allowPrivilegeEscalation").node))
            }
            _ => {}
        }
    }
    conditions
}

/// The text that stands for render slot `slot` in a value until its CEL expression replaces it.
fn slot_marker(slot: usize) -> String {
    format!("\u{0}slot {slot}\u{0}")
}

/// The node as JSON, its render slots as [`slot_marker`]s (listed in `slots`).
fn to_json(t: &TNode, slots: &mut Vec<usize>) -> Result<serde_json::Value, Refusal> {
    use serde_json::Value as J;
    Ok(match t {
        TNode::Object(object) => J::Object(
            object
                .members
                .iter()
                .map(|m| Ok((m.key.to_string(), to_json(&m.node, slots)?)))
                .collect::<Result<_, Refusal>>()?,
        ),
        TNode::List(list) => J::Array(list.items.iter().map(|i| to_json(&i.node, slots)).collect::<Result<_, _>>()?),
        // A policy is the revision's own injection: its stamp names no tag.
        TNode::Scalar(fragment) | TNode::Stamp(fragment) => serde_json::from_slice(fragment.json())
            .map_err(|e| Refusal::new(format!("a value of the compiled template is not JSON: {e}")))?,
        TNode::Dynamic(slot) => {
            slots.push(*slot);
            J::String(slot_marker(*slot))
        }
    })
}
