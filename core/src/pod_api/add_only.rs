//! The add-only walk: a template walked beside what it is merged into, deciding at every node what to add. The
//! one walk both merges take: injecting a compiled template into a pod (`merge`, which writes a JSONPatch) and
//! combining templates (`template::combine`, which fills the first template from the next).
//!
//! Every template node falls in one of these cases:
//!
//! - the other side lacks it (absent, null, or an empty map or list: [`empty_is_absent`]): one `add` of the
//!   whole template value there;
//! - both are maps: member by member;
//! - both are keyed lists (containers by `name`, volumeMounts by `mountPath`, ...): into the items the other side
//!   already has, then one `add` of each missing item;
//! - a set of names in a string (see [`merge_rules::is_name_set`]): the names it lacks appended;
//! - anything else is present and belongs to the other side: left alone, whatever the template says.
//!
//! The API's own rules ([`merge_rules`]) widen "present" (a union member chosen, a resource sized in the other
//! map, a container name used in another list, ...). The walk decides; a [`Merger`] writes what it decides (a
//! patch, or the combined template) and may watch it.

use std::marker::PhantomData;

use super::merge_rules::{self, Existing, Place, Shape, empty_is_absent};
use super::read::key_filter_bit;

/// One step from the root to where the walk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step<'m> {
    /// The member under this key.
    Field(&'m str),
    /// The item at this index of the other side's list.
    Index(usize),
}

/// What a template node is, for the walk.
pub(crate) enum Form<M, L> {
    Map(M),
    List(L),
    /// A scalar, or a value rendered per pod.
    Leaf,
}

/// The value of an item's merge key: names and paths are strings, `containerPort` is an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ItemKey<'a> {
    Str(&'a str),
    Int(i64),
}

impl ItemKey<'_> {
    fn matches<'e>(self, value: impl Existing<'e>) -> bool {
        match self {
            ItemKey::Str(s) => value.string() == Some(s),
            ItemKey::Int(i) => value.int() == Some(i),
        }
    }
}

/// A template, as the walk reads it: compiled (`&TNode`, injecting) or as written (`&YNode`, combining).
pub(crate) trait Overlay<'m>: Copy {
    /// A map node.
    type Map: Copy;
    /// One member of a map.
    type Member: Copy;
    /// A list node.
    type List: Copy;
    /// One item of a list.
    type Item: Copy;

    fn form(self) -> Form<Self::Map, Self::List>;
    /// The node as a string, when it is a static one (a set of names).
    fn names(self) -> Option<&'m str>;

    fn members(map: Self::Map) -> impl Iterator<Item = Self::Member>;
    fn map_is_empty(map: Self::Map) -> bool;
    /// How the map's members relate in the API, the map being at `place`.
    fn shape(map: Self::Map, place: Place<'_>) -> Shape;
    fn key(member: Self::Member) -> &'m str;
    fn value(member: Self::Member) -> Self;

    fn items(list: Self::List) -> impl Iterator<Item = Self::Item>;
    fn list_is_empty(list: Self::List) -> bool;
    /// The list's merge key, the list being under `field`; `None` for an atomic list.
    fn merge_key(list: Self::List, field: &str) -> Option<&'static str>;
    fn item(item: Self::Item) -> Self;
    /// The item's merge-key value.
    fn item_key(item: Self::Item, merge_key: &str) -> Option<ItemKey<'m>>;
    /// The item's value of a list's second key ([`merge_rules::SecondKey`]), when it sets it.
    fn item_second_key(item: Self::Item, field: &str) -> Option<&'m str>;
    /// The item's `name`, when it is a static string.
    fn item_name(item: Self::Item) -> Option<&'m str>;
}

/// What one `add` adds, where the walk is.
pub(crate) enum Added<'m, 'k, T: Overlay<'m>> {
    /// The whole template value.
    Value(T),
    /// Those members of the map that `keep` accepts.
    Members(T::Map, &'k dyn Fn(&str) -> bool),
    /// Those items of the list that `keep` accepts.
    Items(T::List, &'k dyn Fn(T::Item) -> bool),
    /// One item, added to the keyed list.
    Item(T::Item),
}

impl<'m, T: Overlay<'m>> Clone for Added<'m, '_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<'m, T: Overlay<'m>> Copy for Added<'m, '_, T> {}

/// Writes what the walk decides, where it is: the patch of an injection, or the combined template.
pub(crate) trait Merger<'m, T: Overlay<'m>, E> {
    /// What [`Merger::leave`] needs to go back up.
    type Mark;

    /// The walk goes down to a member of the template's map.
    fn enter_member(&mut self, member: T::Member) -> Self::Mark;
    /// The walk goes down to the item at `index` of the other side's list.
    fn enter_index(&mut self, index: usize) -> Self::Mark;
    /// The walk comes back up one step.
    fn leave(&mut self, mark: Self::Mark);
    /// The template's node `t` meets the other side's `value` here, both present.
    fn met(&mut self, t: T, value: E) {
        let _ = (t, value);
    }
    /// One `add` of `what` here; `at` is the template member the walk is at, if it is at one.
    fn add(&mut self, at: Option<T::Member>, what: Added<'m, '_, T>);
    /// One `add` of `item` to the keyed list `list` (under `field`) here: the `nth` item added to it.
    fn add_item(&mut self, list: T::List, item: T::Item, field: &str, nth: usize);
    /// The other side's set of names here becomes `union` (the template's node is `t`).
    fn replace_names(&mut self, at: Option<T::Member>, t: T, union: String);
}

/// Merges `template` into `existing` (present), by the add-only rules, telling `merger` what to add. `lists` are
/// the other side's container lists (in [`CONTAINER_LISTS`](super::spec::CONTAINER_LISTS) order): a container's
/// name is unique across them.
#[inline]
pub(crate) fn walk<'m, 'e, T, E, M>(template: T, existing: E, lists: [Option<E>; 3], merger: &mut M)
where
    T: Overlay<'m>,
    E: Existing<'e>,
    M: Merger<'m, T, E>,
{
    Walk { lists, merger, _template: PhantomData }.present(template, existing, Place::Root, None, None)
}

struct Walk<'w, 'm, T, E, M> {
    lists: [Option<E>; 3],
    merger: &'w mut M,
    _template: PhantomData<fn() -> (&'m (), T)>,
}

/// A map of the other side larger than this has the template's members found in it in one pass.
const LARGE_MAP: usize = 32;

/// The members of `map` that `value` has (not null), found in one pass over `value` when it is a map of more than
/// [`LARGE_MAP`] entries (10,000 annotations: a scan of them for each of the template's keys cost 20 times the
/// rest of the review); `None` for a smaller map, whose members are looked up one by one. Each entry's key is
/// held to a filter of the template's keys' [`key_filter_bit`]s before any string is compared.
fn found_in_one_pass<'m, 'e, T: Overlay<'m>, E: Existing<'e>>(map: T::Map, value: E) -> Option<Vec<(&'m str, E)>> {
    let entries = value.large_map_entries(LARGE_MAP)?;
    let keys: Vec<&'m str> = T::members(map).map(T::key).collect();
    let filter = keys.iter().fold(0u64, |filter, key| filter | 1 << key_filter_bit(key));
    let mut found: Vec<(&'m str, E)> = Vec::with_capacity(keys.len());
    for (key, entry) in entries {
        if filter & 1 << key_filter_bit(key) == 0 || entry.is_null() {
            continue;
        }
        // The first occurrence, as `member` reads it (a review with a key twice was refused before).
        if let Some(&ours) = keys.iter().find(|k| **k == key)
            && !found.iter().any(|(k, _)| *k == ours)
        {
            found.push((ours, entry));
        }
    }
    Some(found)
}

/// A map of the other side whose keys are its own here too: a container's `limits` beside its `requests`, and back
/// (see [`Shape::linked`]).
type Taken<E> = Option<E>;

impl<'m, 'e, T, E, M> Walk<'_, 'm, T, E, M>
where
    T: Overlay<'m>,
    E: Existing<'e>,
    M: Merger<'m, T, E>,
{
    /// Merges `t` into `value`, which the other side has at `place`; `at` is the template member there, if any.
    fn present(&mut self, t: T, value: E, place: Place<'m>, at: Option<T::Member>, taken: Taken<E>) {
        let field = match place {
            Place::Field(field) => field,
            _ => "",
        };
        if value.is_null() {
            return self.add_whole(t, at, taken, field);
        }
        self.merger.met(t, value);
        match t.form() {
            Form::Map(map) => match value.map_is_empty() {
                Some(empty) if empty_is_absent(empty, T::map_is_empty(map)) => self.add_whole(t, at, taken, field),
                Some(_) => self.map(map, value, place, taken),
                None => {} // the other side's value has another type: it wins
            },
            Form::List(list) => match value.list_is_empty() {
                Some(empty) if empty_is_absent(empty, T::list_is_empty(list)) => self.add_whole(t, at, None, field),
                Some(_) => {
                    if let Some(merge_key) = T::merge_key(list, field) {
                        self.keyed_list(list, merge_key, value, field)
                    }
                    // an atomic list: the other side's wins
                }
                None => {}
            },
            Form::Leaf if merge_rules::is_name_set(field) => self.names(t, value, at),
            Form::Leaf => {} // present: the other side's value wins
        }
    }

    /// The other side's set of names with those of `t` it lacks appended, if it lacks any.
    #[cold]
    fn names(&mut self, t: T, value: E, at: Option<T::Member>) {
        if let (Some(theirs), Some(existing)) = (t.names(), value.string())
            && let Some(union) = merge_rules::name_union(existing, theirs)
        {
            self.merger.replace_names(at, t, union);
        }
    }

    fn map(&mut self, map: T::Map, value: E, place: Place<'m>, taken: Taken<E>) {
        let shape = T::shape(map, place);
        let found = found_in_one_pass::<T, E>(map, value);
        for member in T::members(map).filter(|m| !merge_rules::is_set(taken, T::key(*m))) {
            let key = T::key(member);
            let mark = self.merger.enter_member(member);
            let linked = shape.linked(key).and_then(|other| value.member(other));
            let existing = match &found {
                Some(found) => found.iter().find(|(k, _)| *k == key).map(|&(_, v)| v),
                None => value.member(key),
            };
            match existing {
                Some(v) => self.present(T::value(member), v, Place::Field(key), Some(member), linked),
                None if merge_rules::may_add_member(shape, key, value) => {
                    self.add_whole(T::value(member), Some(member), linked, key)
                }
                None => {} // the other side chose otherwise (another member of a union, say)
            }
            self.merger.leave(mark);
        }
    }

    /// Into the items the other side's `list` has, then the missing ones: the recursions address the other
    /// side's items by their original indices, which the additions (possibly in front) would shift.
    fn keyed_list(&mut self, t: T::List, merge_key: &'static str, list: E, field: &'m str) {
        // The items to add, by index: the first 64 remembered from the first pass (a list of 250 containers is
        // searched once per item, not twice), any past them found again.
        let (mut missing, mut remembered) = (0, 0u64);
        for (i, item) in T::items(t).enumerate() {
            match find_item::<T, E>(item, list, merge_key, field) {
                Some((_, existing)) if another_object::<T, E>(field, item, existing) => {}
                Some((index, existing)) => {
                    let mark = self.merger.enter_index(index);
                    self.present(T::item(item), existing, Place::ItemOf(field), None, None);
                    self.merger.leave(mark);
                }
                None if self.may_add(field, item, list) => {
                    missing += 1;
                    if i < 64 {
                        remembered |= 1 << i;
                    }
                }
                None => {}
            }
        }
        if missing == 0 {
            return;
        }
        let mut nth = 0;
        for (i, item) in T::items(t).enumerate() {
            let adds = if i < 64 {
                remembered & (1 << i) != 0
            } else {
                find_item::<T, E>(item, list, merge_key, field).is_none() && self.may_add(field, item, list)
            };
            if adds {
                self.merger.add_item(t, item, field, nth);
                nth += 1;
            }
        }
    }

    /// One `add` of the whole template node `t` (under `field`) here, less the members `taken` has and the
    /// containers the other side has in another list: nothing at all when that leaves none.
    fn add_whole(&mut self, t: T, at: Option<T::Member>, taken: Taken<E>, field: &str) {
        match (t.form(), taken) {
            (Form::Map(map), Some(taken)) if T::members(map).any(|m| merge_rules::is_set(Some(taken), T::key(m))) => {
                self.add_members(map, at, taken)
            }
            (Form::List(list), _) if T::items(list).any(|item| self.named_elsewhere(field, item)) => {
                self.add_items(list, at, field)
            }
            _ => self.merger.add(at, Added::Value(t)),
        }
    }

    /// One `add` of the members of `map` that `taken` lacks, if any.
    #[cold]
    fn add_members(&mut self, map: T::Map, at: Option<T::Member>, taken: E) {
        let keep = |key: &str| !merge_rules::is_set(Some(taken), key);
        if T::members(map).any(|m| keep(T::key(m))) {
            self.merger.add(at, Added::Members(map, &keep));
        }
    }

    /// One `add` of the items of `list` (a container list) that the other side has in no other list, if any.
    #[cold]
    fn add_items(&mut self, list: T::List, at: Option<T::Member>, field: &str) {
        let lists = self.lists;
        let keep =
            |item: T::Item| !T::item_name(item).is_some_and(|name| merge_rules::named_elsewhere(&lists, field, name));
        if T::items(list).any(keep) {
            self.merger.add(at, Added::Items(list, &keep));
        }
    }

    /// May `item` be added to the other side's `list` (under `field`), which lacks its merge key? See
    /// [`merge_rules::may_add_item`].
    fn may_add(&self, field: &str, item: T::Item, list: E) -> bool {
        merge_rules::may_add_item(field, T::item_name(item), list, &self.lists)
    }

    fn named_elsewhere(&self, field: &str, item: T::Item) -> bool {
        T::item_name(item).is_some_and(|name| merge_rules::named_elsewhere(&self.lists, field, name))
    }
}

/// The other side's item whose `merge_key` (and second key, for a list under `field` that has one) equals the
/// template item's, with its index.
fn find_item<'m, 'e, T: Overlay<'m>, E: Existing<'e>>(
    item: T::Item,
    list: E,
    merge_key: &str,
    field: &str,
) -> Option<(usize, E)> {
    let key = T::item_key(item, merge_key)?;
    let second = merge_rules::second_key_for(field);
    list.items()?.enumerate().find(|(_, v)| {
        v.member(merge_key).is_some_and(|k| key.matches(k))
            && second.is_none_or(|second| {
                let theirs = v.member(second.field).and_then(Existing::string);
                second.same(T::item_second_key(item, second.field), theirs)
            })
    })
}

/// Is the other side's `existing` item, found by the template item's merge key, one of its own objects rather
/// than the template's (see [`merge_rules::identified_by_name`])?
fn another_object<'m, 'e, T: Overlay<'m>, E: Existing<'e>>(field: &str, item: T::Item, existing: E) -> bool {
    let theirs = || existing.member("name").and_then(Existing::string);
    merge_rules::identified_by_name(field)
        && T::item_name(item).is_some_and(|ours| theirs().is_some_and(|theirs| theirs != ours))
}
