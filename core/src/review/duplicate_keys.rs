//! One reading of a document: an object with the same key twice is refused. simd-json (and our `get`) would read
//! the first occurrence, serde_json and Go's encoding/json (the API server) the last, so a review with a duplicate
//! would be judged as a pod other than the one the API server stores.
//!
//! This runs on every request, so it walks the tape's structure, not every node: a scalar value or an empty
//! container is stepped over without a call, and a list or map whose subtree holds no container (its node count
//! says so) is not entered. How an object's keys are compared depends on its size, so that no input costs more
//! than `n log n`:
//! - up to [`SMALL_OBJECT`] keys (every object of a typical pod but its labels and annotations): each key sets one
//!   bit of a 64-bit filter, from its length and its first and last bytes; only a key whose bit was set already
//!   is compared with the (at most [`SMALL_OBJECT`] - 1) keys before it;
//! - a map of two scalars (an env var, a port: most objects of a large pod) has its two keys compared directly;
//! - up to [`SORTED_OBJECT`] keys (a pod's labels and annotations, as people write them): the keys are sorted, by
//!   their last 8 bytes first (one integer comparison where keys share a prefix), and neighbours compared. An
//!   attacker who picks keys that collide in the filter or share their tails gains nothing: ties fall back to
//!   comparing the strings;
//! - more (10,000 annotations, which the API server allows): each key goes into a hash set, linear where sorting
//!   is `n log n`, seeded at random in each process so that an attacker cannot pick keys that collide in it.

use crate::pod_api::read::key_filter_bit;
use simd_json::tape::Node;
use std::collections::HashSet;

/// Scratch for the keys of the large object being checked, empty between uses: sorted, or in a hash set.
#[derive(Default)]
struct Seen<'i> {
    sorted: Vec<(u64, &'i str)>,
    hashed: HashSet<&'i str, foldhash::fast::RandomState>,
}

/// The most keys an object may have to be checked with the bit filter.
const SMALL_OBJECT: usize = 16;

/// The most keys an object may have to be checked by sorting them: below this, a sort costs less than hashing
/// (its scratch is reused, its count the same on every run); above, the hash set costs a third.
const SORTED_OBJECT: usize = 512;

/// Walks `nodes` (a whole document's tape); returns the first duplicate key found (in the order of the walk).
pub(super) fn find<'i>(nodes: &[Node<'i>]) -> Option<&'i str> {
    let mut seen = Seen::default();
    walk(nodes, 0, &mut seen).err()
}

/// Walks the value at `nodes[at]`; returns the position after it, or the first duplicate key found in it.
/// `large` is scratch space for the keys of large objects, empty between uses.
fn walk<'i>(nodes: &[Node<'i>], at: usize, large: &mut Seen<'i>) -> Result<usize, &'i str> {
    match nodes.get(at) {
        Some(&Node::Object { len, count }) => {
            let small = len <= SMALL_OBJECT;
            if !small {
                check_large(nodes, at, len, large)?;
            }
            // A map of scalars (labels, annotations) has two nodes per key: nothing inside to enter.
            let flat = count == 2 * len;
            // The keys of a small object seen so far, a bit each (see `key_filter_bit`).
            let mut seen = 0u64;
            let mut next = at + 1;
            for _ in 0..len {
                let Some(&Node::String(key)) = nodes.get(next) else { break };
                if small {
                    let bit = 1u64 << key_filter_bit(key);
                    if seen & bit != 0 && earlier_key(nodes, at, next, key) {
                        return Err(key);
                    }
                    seen |= bit;
                }
                next = if flat { next + 2 } else { step_over(nodes, next + 1, large)? };
            }
            Ok(at + count + 1)
        }
        Some(&Node::Array { len, count }) => {
            // A list of scalars has one node per item: nothing inside to enter.
            if count > len {
                let mut next = at + 1;
                for _ in 0..len {
                    next = step_over(nodes, next, large)?;
                }
            }
            Ok(at + count + 1)
        }
        _ => Ok(at + 1),
    }
}

/// The position after the value at `nodes[at]`, checked: scalars and empty containers (most values) without a
/// call to [`walk`]. Inlined into `walk` by force: with the two-key arm it is past the compiler's own limit, and a
/// call per value would cost small reviews what the arm saves large ones.
#[inline(always)]
fn step_over<'i>(nodes: &[Node<'i>], at: usize, large: &mut Seen<'i>) -> Result<usize, &'i str> {
    match nodes.get(at) {
        Some(Node::String(_) | Node::Static(_) | Node::Object { len: 0, .. } | Node::Array { len: 0, .. }) => {
            Ok(at + 1)
        }
        // A map of two scalars (an env var, a port: most objects of a large pod): its two keys compared directly,
        // without a call or a filter.
        Some(&Node::Object { len: 2, count: 4 }) => match (nodes.get(at + 1), nodes.get(at + 3)) {
            (Some(&Node::String(first)), Some(&Node::String(second))) if first == second => Err(second),
            _ => Ok(at + 5),
        },
        _ => walk(nodes, at, large),
    }
}

/// The keys of the object at `nodes[at]`, in order, each with its position.
fn keys<'n, 'i>(nodes: &'n [Node<'i>], at: usize, len: usize) -> impl Iterator<Item = (usize, &'i str)> + 'n {
    let mut next = at + 1;
    (0..len).map_while(move |_| {
        let key_at = next;
        let key = match nodes.get(key_at) {
            Some(&Node::String(key)) => key,
            _ => return None,
        };
        next = key_at + 1 + nodes.get(key_at + 1).map_or(1, subtree_len);
        Some((key_at, key))
    })
}

/// Does the object at `nodes[at]` have `key` before position `key_at` (the key's own)? Asked only when the
/// filter says it may, of at most [`SMALL_OBJECT`] keys.
#[cold]
fn earlier_key(nodes: &[Node<'_>], at: usize, key_at: usize, key: &str) -> bool {
    keys(nodes, at, SMALL_OBJECT).take_while(|&(earlier_at, _)| earlier_at < key_at).any(|(_, earlier)| earlier == key)
}

/// Checks an object of more than [`SMALL_OBJECT`] keys: sorted, or through a hash set above [`SORTED_OBJECT`].
#[cold]
fn check_large<'i>(nodes: &[Node<'i>], at: usize, len: usize, seen: &mut Seen<'i>) -> Result<(), &'i str> {
    let duplicate = if len <= SORTED_OBJECT {
        let sorted = &mut seen.sorted;
        sorted.extend(keys(nodes, at, len).map(|(_, key)| (tail_word(key), key)));
        sorted.sort_unstable();
        let duplicate = sorted.windows(2).find(|pair| pair[0] == pair[1]).map(|pair| pair[0].1);
        sorted.clear();
        duplicate
    } else {
        let hashed = &mut seen.hashed;
        hashed.reserve(len);
        let duplicate = keys(nodes, at, len).map(|(_, key)| key).find(|key| !hashed.insert(key));
        hashed.clear();
        duplicate
    };
    // Name the second occurrence, where a reader that takes the last one differs from one that takes the first.
    match duplicate {
        Some(key) => Err(keys(nodes, at, len).filter(|&(_, k)| k == key).nth(1).map_or(key, |(_, k)| k)),
        None => Ok(()),
    }
}

/// A large object's keys are sorted by this first: their last 8 bytes, where keys that share a prefix (annotations
/// of one domain: `example.com/note-1`, `-2`, ...) differ, so that most comparisons are one integer's instead of a
/// `memcmp` through the prefix. Equal keys have equal words, so they still end up side by side; keys crafted to
/// share their tails fall back to comparing the strings, as before.
fn tail_word(key: &str) -> u64 {
    let bytes = key.as_bytes();
    let tail = &bytes[bytes.len().saturating_sub(8)..];
    let mut word = [0u8; 8];
    word[..tail.len()].copy_from_slice(tail);
    u64::from_be_bytes(word)
}

/// How many tape nodes the value starting at `node` takes, itself included.
fn subtree_len(node: &Node<'_>) -> usize {
    match *node {
        // `count` is the nodes below the header.
        Node::Object { count, .. } | Node::Array { count, .. } => count + 1,
        Node::String(_) | Node::Static(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    /// A JSON document as a generated tree, with keys from a small set so that duplicates (and filter
    /// collisions: same length, same first and last bytes) are common.
    #[derive(Debug, Clone)]
    enum Json {
        Scalar,
        List(Vec<Json>),
        Map(Vec<(String, Json)>),
    }

    impl Json {
        fn text(&self, out: &mut String) {
            match self {
                Json::Scalar => out.push('1'),
                Json::List(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        item.text(out);
                    }
                    out.push(']');
                }
                Json::Map(members) => {
                    out.push('{');
                    for (i, (key, value)) in members.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&serde_json::to_string(key).unwrap());
                        out.push(':');
                        value.text(out);
                    }
                    out.push('}');
                }
            }
        }

        /// The keys that some object has twice: what the finder must report one of.
        fn duplicated(&self, found: &mut Vec<String>) {
            match self {
                Json::Scalar => {}
                Json::List(items) => items.iter().for_each(|item| item.duplicated(found)),
                Json::Map(members) => {
                    for (i, (key, value)) in members.iter().enumerate() {
                        if members[..i].iter().any(|(earlier, _)| earlier == key) {
                            found.push(key.clone());
                        }
                        value.duplicated(found);
                    }
                }
            }
        }
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            // Same length, first and last bytes: one filter bit.
            prop::sample::select(vec!["ab", "aab", "abb", "a\"b", "aXb", "", "é", "name", "image"])
                .prop_map(String::from),
            "[a-c]{1,3}",
            "k[0-9]{1,2}",
        ]
    }

    fn json() -> impl Strategy<Value = Json> {
        Just(Json::Scalar).prop_recursive(5, 200, 40, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Json::List),
                // Up to 40 members: both sides of `SMALL_OBJECT`.
                prop::collection::vec((key(), inner), 0..40).prop_map(Json::Map),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The finder reports a duplicate exactly when some object has a key twice, and the key it names is one
        /// of those.
        #[test]
        fn finds_a_duplicate_exactly_when_there_is_one(document in json()) {
            let mut text = String::new();
            document.text(&mut text);
            let mut expected = Vec::new();
            document.duplicated(&mut expected);
            let mut bytes = text.clone().into_bytes();
            let tape = simd_json::to_tape(&mut bytes).unwrap();
            match super::find(&tape.0) {
                None => prop_assert!(expected.is_empty(), "missed one of {expected:?} in {text}"),
                Some(key) => prop_assert!(expected.iter().any(|k| k == key), "{key:?} is not a duplicate in {text}"),
            }
        }
    }

    proptest! {
        /// Objects on both sides of `SORTED_OBJECT` (sorted below, hashed above), with or without a duplicate of
        /// one of their keys, in any place.
        #[test]
        fn large_objects_are_checked_on_both_sides_of_the_sorted_limit(
            len in 400usize..700,
            duplicate in prop::option::of((0usize..400, 0usize..700)),
        ) {
            let mut keys: Vec<String> = (0..len).map(|i| format!("example.com/note-{i}")).collect();
            if let Some((of, at)) = duplicate {
                keys.insert(at.min(keys.len()), keys[of].clone());
            }
            let members: Vec<String> = keys.iter().map(|k| format!("\"{k}\":1")).collect();
            let mut text = format!("{{{}}}", members.join(",")).into_bytes();
            let found = super::find(&simd_json::to_tape(&mut text).unwrap().0).map(str::to_owned);
            prop_assert_eq!(found, duplicate.map(|(of, _)| format!("example.com/note-{of}")));
        }
    }

    /// An object of many keys that all fall on one filter bit and share their first and last eight bytes: no
    /// false finding, and the one duplicate among them is found (by sorting, not by comparing every pair).
    #[test]
    fn keys_crafted_to_collide_are_told_apart() {
        let keys: Vec<String> = (0..20_000).map(|i| format!("aaaaaaaa{i:08}zzzzzzzz")).collect();
        let members: Vec<String> = keys.iter().map(|k| format!("\"{k}\":1")).collect();
        let mut unique = format!("{{{}}}", members.join(",")).into_bytes();
        assert_eq!(super::find(&simd_json::to_tape(&mut unique).unwrap().0), None);
        let mut twice = format!("{{{},\"{}\":2}}", members.join(","), keys[12_345]).into_bytes();
        assert_eq!(super::find(&simd_json::to_tape(&mut twice).unwrap().0), Some(keys[12_345].as_str()));
    }
}
