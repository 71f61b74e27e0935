//! Combining templates: a pod that asks for `template: a,b` gets `a`, then whatever `b` adds that `a` does not
//! already have, by the rules injection follows ([`merge_rules`](crate::pod_api::merge_rules): maps member by
//! member, keyed lists item by item, anything `a` has wins, and nothing of `b` that the API server would refuse
//! beside what `a` has).

use super::yaml::{YNode, YValue};
use crate::pod_api::merge_rules::{self, Existing, Place, empty_is_absent, merge_key_for, shape_of};
use crate::pod_api::spec::CONTAINER_LISTS;

/// Adds to `base` what `overlay` has and `base` lacks: the add-only merge of injection, with `base` in the
/// pod's place.
pub(crate) fn fill(base: &mut YNode, overlay: &YNode) {
    // A container's name is unique across the container lists: the names `base` has before `overlay` is added.
    let before = base.clone();
    let spec = before.member("spec");
    let lists = CONTAINER_LISTS.map(|list| spec.and_then(|s| s.member(list)));
    Fill { lists }.node(base, overlay, Place::Root, None);
}

struct Fill<'a> {
    lists: [Option<&'a YNode>; 3],
}

impl Fill<'_> {
    /// Merges `overlay` into `base`, a value `base` has at `place`. `taken` is `base`'s map whose keys rule out
    /// `overlay`'s here (see [`merge_rules::Shape::linked`]).
    fn node(&self, base: &mut YNode, overlay: &YNode, place: Place<'_>, taken: Option<&YNode>) {
        let field = match place {
            Place::Field(field) => field,
            _ => "",
        };
        let absent = match (&base.value, &overlay.value) {
            (YValue::Null, _) => true,
            (YValue::Map(mine), YValue::Map(theirs)) => empty_is_absent(mine.is_empty(), theirs.is_empty()),
            (YValue::Seq(mine), YValue::Seq(theirs)) => empty_is_absent(mine.is_empty(), theirs.is_empty()),
            _ => false,
        };
        if absent {
            *base = self.whole(overlay, field, taken);
            return;
        }
        match (&base.value, &overlay.value) {
            (YValue::Map(_), YValue::Map(theirs)) => self.map(base, theirs, place, taken),
            (YValue::Seq(_), YValue::Seq(theirs)) => self.list(base, theirs, field),
            (YValue::Str(mine), YValue::Str(theirs)) if merge_rules::is_name_set(field) => {
                if let Some(union) = merge_rules::name_union(mine, theirs) {
                    base.value = YValue::Str(union);
                }
            }
            _ => {} // present in `base`: its value wins
        }
    }

    fn map(&self, base: &mut YNode, theirs: &[(String, YNode)], place: Place<'_>, taken: Option<&YNode>) {
        let shape = shape_of(place);
        for (key, value) in theirs.iter().filter(|(key, _)| !merge_rules::is_set(taken, key)) {
            let snapshot = &*base;
            let linked = shape.linked(key).and_then(|other| snapshot.member(other)).cloned();
            if snapshot.member(key).is_none() && !merge_rules::may_add_member(shape, key, snapshot) {
                continue; // `base` chose otherwise (another member of a union, say)
            }
            let YValue::Map(mine) = &mut base.value else { return };
            match mine.iter_mut().find(|(k, _)| k == key) {
                Some((_, existing)) => self.node(existing, value, Place::Field(key), linked.as_ref()),
                None => mine.push((key.clone(), self.whole(value, key, linked.as_ref()))),
            }
        }
    }

    fn list(&self, base: &mut YNode, theirs: &[YNode], field: &str) {
        let Some(merge_key) = merge_key_for(field) else { return }; // atomic: `base`'s list wins
        for item in theirs {
            let key = item.member(merge_key).map(|k| &k.value);
            let snapshot = &*base;
            let found = snapshot.items().and_then(|mut items| {
                items.position(|m| key.is_some() && m.member(merge_key).map(|k| &k.value) == key)
            });
            let name = item.member("name").and_then(Existing::string);
            if found.is_none() && !merge_rules::may_add_item(field, name, snapshot, &self.lists) {
                continue; // a name the API server wants unique
            }
            let YValue::Seq(mine) = &mut base.value else { return };
            match found {
                Some(index) => self.node(&mut mine[index], item, Place::ItemOf(field), None),
                None => mine.push(item.clone()),
            }
        }
    }

    /// `overlay` whole, for a place `base` lacks, less the members `taken` has and the containers named in
    /// another list.
    fn whole(&self, overlay: &YNode, field: &str, taken: Option<&YNode>) -> YNode {
        let value = match &overlay.value {
            YValue::Map(members) if taken.is_some() => {
                YValue::Map(members.iter().filter(|(key, _)| !merge_rules::is_set(taken, key)).cloned().collect())
            }
            YValue::Seq(items) => YValue::Seq(
                items
                    .iter()
                    .filter(|item| {
                        let name = item.member("name").and_then(Existing::string);
                        !name.is_some_and(|name| merge_rules::named_elsewhere(&self.lists, field, name))
                    })
                    .cloned()
                    .collect(),
            ),
            other => other.clone(),
        };
        YNode { line: overlay.line, value }
    }
}

/// A template node, as the merge rules read it when templates are combined.
impl<'a> Existing<'a> for &'a YNode {
    fn member(self, key: &str) -> Option<Self> {
        self.map_get(key).filter(|v| !matches!(v.value, YValue::Null))
    }

    fn string(self) -> Option<&'a str> {
        match &self.value {
            YValue::Str(s) => Some(s),
            _ => None,
        }
    }

    fn boolean(self) -> Option<bool> {
        match self.value {
            YValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    fn items(self) -> Option<impl Iterator<Item = Self>> {
        match &self.value {
            YValue::Seq(items) => Some(items.iter()),
            _ => None,
        }
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
        fill(&mut a, &b);
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

    #[test]
    fn combining_follows_the_api_rules_of_injection() {
        // What the later template would add beside the earlier one's choice is left out, as injection leaves it
        // out beside the pod's: a second union member, a request for a resource the earlier one limits,
        // escalation beside privilege, a container named in another list, a port name in use.
        let mut a = parse(
            "spec:
  initContainers: [{name: agent, image: a, restartPolicy: Always}]
  containers:
    - name: proxy
      image: a
      env: [{name: X, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
      resources: {limits: {cpu: '1'}}
      securityContext: {privileged: true}
      ports: [{name: http, containerPort: 8080}]
      readinessProbe: {tcpSocket: {port: 8080}}
",
        )
        .unwrap();
        let b = parse(
            "spec:
  containers:
    - name: proxy
      image: b
      env: [{name: X, value: b}, {name: Z, value: b}]
      resources: {requests: {cpu: 2, memory: 1Mi}}
      securityContext: {allowPrivilegeEscalation: false, runAsUser: 1}
      ports: [{name: http, containerPort: 9090}, {name: admin, containerPort: 9091}]
      readinessProbe: {httpGet: {port: 8080}, periodSeconds: 5}
    - {name: agent, image: b}
    - {name: extra, image: b}
",
        )
        .unwrap();
        fill(&mut a, &b);
        assert_eq!(
            json(&a)["spec"],
            serde_json::json!({
                "initContainers": [{"name": "agent", "image": "a", "restartPolicy": "Always"}],
                "containers": [
                    {
                        "name": "proxy",
                        "image": "a",
                        "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, {"name": "Z", "value": "b"}],
                        "resources": {"limits": {"cpu": "1"}, "requests": {"memory": "1Mi"}},
                        "securityContext": {"privileged": true, "runAsUser": 1},
                        "ports": [{"name": "http", "containerPort": 8080}, {"name": "admin", "containerPort": 9091}],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 5}
                    },
                    {"name": "extra", "image": "b"}
                ]
            })
        );
    }
}
