//! Combining templates: a pod that asks for `template: a,b` gets `a`, then whatever `b` adds that `a` does not
//! already have, by the same add-only rule injection follows (maps member by member, keyed lists item by item,
//! anything else: the earlier template wins).

use super::schema::merge_key_for;
use super::yaml::{YNode, YValue};

/// Adds to `base` what `overlay` has and `base` lacks. `field` is the key both sit under (it picks a list's
/// merge key).
pub(crate) fn fill(base: &mut YNode, overlay: &YNode, field: Option<&str>) {
    match (&mut base.value, &overlay.value) {
        (YValue::Null, _) => *base = overlay.clone(),
        (YValue::Map(mine), YValue::Map(theirs)) => {
            for (key, value) in theirs {
                match mine.iter_mut().find(|(k, _)| k == key) {
                    Some((_, existing)) => fill(existing, value, Some(key)),
                    None => mine.push((key.clone(), value.clone())),
                }
            }
        }
        (YValue::Seq(mine), YValue::Seq(theirs)) => {
            let Some(merge_key) = field.and_then(merge_key_for) else { return };
            for item in theirs {
                let key = item.map_get(merge_key).map(|k| &k.value);
                match mine.iter_mut().find(|m| key.is_some() && m.map_get(merge_key).map(|k| &k.value) == key) {
                    Some(existing) => fill(existing, item, None),
                    None => mine.push(item.clone()),
                }
            }
        }
        _ => {}
    }
}

/// `node` with every render slot moved up by `offset` (the slots of the templates before it).
pub(crate) fn renumbered(node: &YNode, offset: usize) -> YNode {
    let value = match &node.value {
        YValue::Dynamic(slot) => YValue::Dynamic(slot + offset),
        YValue::Seq(items) => YValue::Seq(items.iter().map(|i| renumbered(i, offset)).collect()),
        YValue::Map(members) => YValue::Map(members.iter().map(|(k, v)| (k.clone(), renumbered(v, offset))).collect()),
        other => other.clone(),
    };
    YNode { line: node.line, value }
}

/// `node` with the render slots in `fixed` replaced by their value.
pub(crate) fn substituted(node: &YNode, fixed: &std::collections::HashMap<usize, serde_json::Value>) -> YNode {
    match &node.value {
        YValue::Dynamic(slot) => match fixed.get(slot) {
            Some(value) => super::yaml::from_json(value.clone(), node.line),
            None => node.clone(),
        },
        YValue::Seq(items) => {
            YNode { line: node.line, value: YValue::Seq(items.iter().map(|i| substituted(i, fixed)).collect()) }
        }
        YValue::Map(members) => YNode {
            line: node.line,
            value: YValue::Map(members.iter().map(|(k, v)| (k.clone(), substituted(v, fixed))).collect()),
        },
        _ => node.clone(),
    }
}

/// Lays `overlay` over `base`: maps are merged key by key, anything else in `overlay` replaces `base`'s. This is
/// how the set's shared values file overrides a template's own `values`.
pub(crate) fn overlay_json(base: &mut serde_json::Value, overlay: serde_json::Value) {
    match (base, overlay) {
        (serde_json::Value::Object(mine), serde_json::Value::Object(theirs)) => {
            for (key, value) in theirs {
                match mine.get_mut(&key) {
                    Some(existing) => overlay_json(existing, value),
                    None => {
                        mine.insert(key, value);
                    }
                }
            }
        }
        (base, overlay) => *base = overlay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::yaml::{parse, to_json};

    fn json(node: &YNode) -> serde_json::Value {
        to_json(node, &mut |slot| serde_json::json!(format!("slot{slot}")))
    }

    #[test]
    fn the_later_template_only_fills_what_the_earlier_lacks() {
        let mut a = parse(
            "spec:\n  containers:\n    - {name: proxy, image: a, env: [{name: X, value: a}]}\n  volumes: [{name: v, emptyDir: {}}]\n  tolerations: [{key: a}]\n",
        )
        .unwrap();
        let b = parse(
            "metadata: {labels: {b: 'true'}}\nspec:\n  containers:\n    - {name: proxy, image: b, env: [{name: X, value: b}, {name: Z, value: b}]}\n    - {name: agent, image: b}\n  tolerations: [{key: b}]\n",
        )
        .unwrap();
        fill(&mut a, &b, None);
        assert_eq!(
            json(&a),
            serde_json::json!({
                "spec": {
                    "containers": [
                        {"name": "proxy", "image": "a", "env": [{"name": "X", "value": "a"}, {"name": "Z", "value": "b"}]},
                        {"name": "agent", "image": "b"}
                    ],
                    "volumes": [{"name": "v", "emptyDir": {}}],
                    "tolerations": [{"key": "a"}]
                },
                "metadata": {"labels": {"b": "true"}}
            })
        );
    }

    #[test]
    fn slots_are_renumbered_and_values_overlaid() {
        let node = YNode { line: 1, value: YValue::Seq(vec![YNode { line: 1, value: YValue::Dynamic(1) }]) };
        assert_eq!(json(&renumbered(&node, 3)), serde_json::json!(["slot4"]));
        let mut values = serde_json::json!({"image": "shared", "res": {"cpu": "1", "memory": "1Gi"}});
        overlay_json(&mut values, serde_json::json!({"res": {"cpu": "2"}, "extra": 1}));
        assert_eq!(values, serde_json::json!({"image": "shared", "res": {"cpu": "2", "memory": "1Gi"}, "extra": 1}));
    }
}
