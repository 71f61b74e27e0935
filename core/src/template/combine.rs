//! Combining templates: a pod that asks for `template: a,b` gets `a`, then whatever `b` adds that `a` does not
//! already have, by the rules injection follows ([`merge_rules`](crate::pod_api::merge_rules): maps member by
//! member, keyed lists item by item, anything `a` has wins, and nothing of `b` that the API server would refuse
//! beside what `a` has).

use super::yaml::{YNode, YValue};
use crate::pod_api::add_only::{self, Added, Form, ItemKey, Merger, Overlay, Step};
use crate::pod_api::merge_rules::{Existing, Place, Shape, merge_key_for, shape_of};
use crate::pod_api::spec::CONTAINER_LISTS;

/// Adds to `base` what `overlay` has and `base` lacks: the add-only walk of injection, with `base` in the pod's
/// place.
pub(crate) fn fill(base: &mut YNode, overlay: &YNode) {
    // The walk reads `base` as it was, as injection reads the pod; what it adds is written into `base`.
    let before = base.clone();
    let spec = before.member("spec");
    let lists = CONTAINER_LISTS.map(|list| spec.and_then(|s| s.member(list)));
    add_only::walk(overlay, &before, lists, &mut Fill { base, steps: Vec::new() });
}

/// Writes what the walk adds into the template that comes first.
struct Fill<'b, 'm> {
    base: &'b mut YNode,
    /// Where the walk is.
    steps: Vec<Step<'m>>,
}

impl Fill<'_, '_> {
    /// `base`'s node at `steps`. The walk only goes where the node was, and adds only below where it is.
    fn at(&mut self, steps: usize) -> Option<&mut YNode> {
        let mut node = &mut *self.base;
        for step in &self.steps[..steps] {
            node = match (step, &mut node.value) {
                (Step::Field(key), YValue::Map(members)) => {
                    members.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v)?
                }
                (Step::Index(index), YValue::Seq(items)) => items.get_mut(*index)?,
                _ => return None,
            };
        }
        Some(node)
    }

    /// Sets `base`'s value here to `node`: the member the walk is at, added or replaced, or the whole of `base`.
    fn set_here(&mut self, node: YNode) {
        let depth = self.steps.len();
        let Some(last) = depth.checked_sub(1) else {
            *self.base = node;
            return;
        };
        let step = self.steps[last];
        match (step, self.at(last)) {
            (Step::Field(key), Some(YNode { value: YValue::Map(members), .. })) => {
                match members.iter_mut().find(|(k, _)| k == key) {
                    Some((_, existing)) => *existing = node,
                    None => members.push((key.to_owned(), node)),
                }
            }
            (Step::Index(index), Some(YNode { value: YValue::Seq(items), .. })) => {
                if let Some(existing) = items.get_mut(index) {
                    *existing = node;
                }
            }
            _ => {}
        }
    }
}

impl<'m> Merger<'m, &'m YNode, &YNode> for Fill<'_, 'm> {
    type Mark = ();

    fn enter_member(&mut self, member: &'m (String, YNode)) {
        self.steps.push(Step::Field(&member.0));
    }

    fn enter_index(&mut self, index: usize) {
        self.steps.push(Step::Index(index));
    }

    fn leave(&mut self, (): ()) {
        self.steps.pop();
    }

    fn add(&mut self, _: Option<&'m (String, YNode)>, what: Added<'m, '_, &'m YNode>) {
        let node = match what {
            Added::Value(node) | Added::Item(node) => node.clone(),
            Added::Members(map, keep) => {
                let members = match &map.value {
                    YValue::Map(members) => members.iter().filter(|(key, _)| keep(key)).cloned().collect(),
                    _ => Vec::new(),
                };
                YNode { line: map.line, value: YValue::Map(members) }
            }
            Added::Items(list, keep) => {
                let items = match &list.value {
                    YValue::Seq(items) => items.iter().filter(|item| keep(item)).cloned().collect(),
                    _ => Vec::new(),
                };
                YNode { line: list.line, value: YValue::Seq(items) }
            }
        };
        self.set_here(node);
    }

    fn add_item(&mut self, _: &'m YNode, item: &'m YNode, _: &str, _: usize) {
        // Appended: the later template's items come after the earlier one's.
        let depth = self.steps.len();
        if let Some(YNode { value: YValue::Seq(items), .. }) = self.at(depth) {
            items.push(item.clone());
        }
    }

    fn replace_names(&mut self, _: Option<&'m (String, YNode)>, t: &'m YNode, union: String) {
        self.set_here(YNode { line: t.line, value: YValue::Str(union) });
    }
}

/// A template node as written, as the add-only walk reads it when templates are combined.
impl<'m> Overlay<'m> for &'m YNode {
    type Map = &'m YNode;
    type Member = &'m (String, YNode);
    type List = &'m YNode;
    type Item = &'m YNode;

    fn form(self) -> Form<&'m YNode, &'m YNode> {
        match self.value {
            YValue::Map(_) => Form::Map(self),
            YValue::Seq(_) => Form::List(self),
            _ => Form::Leaf,
        }
    }

    fn names(self) -> Option<&'m str> {
        self.string()
    }

    fn members(map: &'m YNode) -> impl Iterator<Item = &'m (String, YNode)> {
        match &map.value {
            YValue::Map(members) => members.iter(),
            _ => [].iter(),
        }
    }

    fn map_is_empty(map: &'m YNode) -> bool {
        <Self as Overlay>::members(map).next().is_none()
    }

    fn shape(_: &'m YNode, place: Place<'_>) -> Shape {
        shape_of(place)
    }

    fn key(member: &'m (String, YNode)) -> &'m str {
        &member.0
    }

    fn value(member: &'m (String, YNode)) -> Self {
        &member.1
    }

    fn items(list: &'m YNode) -> impl Iterator<Item = &'m YNode> {
        match &list.value {
            YValue::Seq(items) => items.iter(),
            _ => [].iter(),
        }
    }

    fn list_is_empty(list: &'m YNode) -> bool {
        <Self as Overlay>::items(list).next().is_none()
    }

    fn merge_key(_: &'m YNode, field: &str) -> Option<&'static str> {
        merge_key_for(field)
    }

    fn item(item: &'m YNode) -> Self {
        item
    }

    fn item_key(item: &'m YNode, merge_key: &str) -> Option<ItemKey<'m>> {
        let key = item.member(merge_key)?;
        key.string().map(ItemKey::Str).or_else(|| key.int().map(ItemKey::Int))
    }

    fn item_second_key(item: &'m YNode, field: &str) -> Option<&'m str> {
        item.member(field).and_then(Existing::string)
    }

    fn item_name(item: &'m YNode) -> Option<&'m str> {
        item.member("name").and_then(Existing::string)
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

    fn int(self) -> Option<i64> {
        match self.value {
            YValue::Int(i) => Some(i),
            _ => None,
        }
    }

    fn is_null(self) -> bool {
        matches!(self.value, YValue::Null)
    }

    fn map_is_empty(self) -> Option<bool> {
        match &self.value {
            YValue::Map(members) => Some(members.is_empty()),
            _ => None,
        }
    }

    fn list_is_empty(self) -> Option<bool> {
        match &self.value {
            YValue::Seq(items) => Some(items.is_empty()),
            _ => None,
        }
    }

    fn large_map_entries(self, more_than: usize) -> Option<impl Iterator<Item = (&'a str, Self)>> {
        match &self.value {
            YValue::Map(members) if members.len() > more_than => {
                Some(members.iter().map(|(key, value)| (key.as_str(), value)))
            }
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
    fn combining_takes_the_walk_of_injection_where_it_once_had_its_own() {
        // A mount at the path where the earlier template mounts another volume is the earlier one's (as a pod's
        // is at injection): not completed from the later template. Containers all named in another list leave no
        // empty list behind.
        let mut a = parse(
            "spec:
  initContainers: [{name: agent, image: a}]
  containers:
    - name: proxy
      image: a
      volumeMounts: [{name: certs, mountPath: /etc/certs}]
",
        )
        .unwrap();
        let b = parse(
            "spec:
  containers:
    - name: proxy
      volumeMounts: [{name: other, mountPath: /etc/certs, readOnly: true}, {name: data, mountPath: /data}]
  ephemeralContainers: [{name: agent, image: b}]
",
        )
        .unwrap();
        fill(&mut a, &b);
        assert_eq!(
            json(&a)["spec"],
            serde_json::json!({
                "initContainers": [{"name": "agent", "image": "a"}],
                "containers": [{
                    "name": "proxy",
                    "image": "a",
                    "volumeMounts": [{"name": "certs", "mountPath": "/etc/certs"}, {"name": "data", "mountPath": "/data"}]
                }]
            })
        );
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

    mod generated {
        use super::*;
        use crate::template::yaml::from_json;
        use proptest::prelude::*;
        use serde_json::{Value, json};

        fn container() -> impl Strategy<Value = Value> {
            let env = prop_oneof![
                ("[XY]").prop_map(|name| json!({"name": name, "value": "v"})),
                ("[XY]")
                    .prop_map(|name| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})),
            ];
            let mount = ("(certs|data)", "/(a|b)").prop_map(|(name, path)| json!({"name": name, "mountPath": path}));
            let resources = prop_oneof![
                Just(json!({"requests": {"cpu": "1"}})),
                Just(json!({"limits": {"cpu": "2", "memory": "1Mi"}})),
                Just(json!({})),
            ];
            let security = prop_oneof![
                Just(json!({"privileged": true})),
                Just(json!({"allowPrivilegeEscalation": false})),
                Just(json!({"runAsUser": 1})),
            ];
            (
                "(proxy|app|agent)",
                proptest::option::of("[ab]"),
                proptest::option::of(prop::collection::vec(env, 0..3)),
                proptest::option::of(prop::collection::vec(mount, 0..3)),
                proptest::option::of(resources),
                proptest::option::of(security),
            )
                .prop_map(|(name, image, env, mounts, resources, security)| {
                    let mut c = json!({"name": name});
                    for (key, value) in [
                        ("image", image.map(Value::from)),
                        ("env", env.map(|e| unique(e, "name"))),
                        ("volumeMounts", mounts.map(|m| unique(m, "mountPath"))),
                        ("resources", resources),
                        ("securityContext", security),
                    ] {
                        if let Some(value) = value {
                            c[key] = value;
                        }
                    }
                    c
                })
        }

        /// Items with distinct `key`s, as a template that compiles has.
        fn unique(items: Vec<Value>, key: &str) -> Value {
            let mut seen = std::collections::HashSet::new();
            Value::Array(items.into_iter().filter(|item| seen.insert(item[key].to_string())).collect())
        }

        fn template() -> impl Strategy<Value = YNode> {
            (
                prop::collection::vec(container(), 0..3),
                proptest::option::of(prop::collection::vec(container(), 0..2)),
                proptest::option::of(prop::collection::vec("(certs|data)", 0..2)),
                proptest::option::of(prop_oneof![Just(json!({})), Just(json!({"a": "x"}))]),
            )
                .prop_map(|(containers, init, volumes, labels)| {
                    let containers = unique(containers, "name");
                    let mut pod = json!({"spec": {"containers": containers}});
                    if let Some(init) = init {
                        // A template names a container in one list only, as a pod does.
                        let elsewhere = |c: &Value| {
                            pod["spec"]["containers"]
                                .as_array()
                                .is_some_and(|cs| cs.iter().any(|o| o["name"] == c["name"]))
                        };
                        let init = init.into_iter().filter(|c| !elsewhere(c)).collect();
                        pod["spec"]["initContainers"] = unique(init, "name");
                    }
                    if let Some(volumes) = volumes {
                        let volumes = volumes.into_iter().map(|name| json!({"name": name, "emptyDir": {}})).collect();
                        pod["spec"]["volumes"] = unique(volumes, "name");
                    }
                    if let Some(labels) = labels {
                        pod["metadata"] = json!({"labels": labels});
                    }
                    from_json(pod, 1)
                })
        }

        /// Does `whole` keep everything `part` has, where `part` has it (lists: `part`'s items first, in order)?
        fn keeps(whole: &Value, part: &Value) -> bool {
            match (whole, part) {
                (Value::Object(w), Value::Object(p)) => p.iter().all(|(k, v)| w.get(k).is_some_and(|wv| keeps(wv, v))),
                (Value::Array(w), Value::Array(p)) => w.len() >= p.len() && w.iter().zip(p).all(|(w, p)| keeps(w, p)),
                (w, p) => w == p,
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(500))]

            /// Combining keeps all of the earlier template, fills it from the later one only once (a second fill
            /// adds nothing), and never gives a container name to two container lists that one had not.
            #[test]
            fn combining_keeps_the_first_converges_and_keeps_names_unique(a in template(), b in template()) {
                let mut combined = a.clone();
                fill(&mut combined, &b);
                let (combined_json, a_json) = (json(&combined), json(&a));
                prop_assert!(keeps(&combined_json, &a_json), "{combined_json} lost part of {a_json}");
                let mut again = combined.clone();
                fill(&mut again, &b);
                prop_assert_eq!(json(&again), combined_json.clone());
                let names = |pod: &Value, list: &str| -> Vec<String> {
                    pod["spec"][list].as_array().into_iter().flatten().map(|c| c["name"].to_string()).collect()
                };
                let (containers, init) = (names(&combined_json, "containers"), names(&combined_json, "initContainers"));
                let (a_containers, a_init) = (names(&a_json, "containers"), names(&a_json, "initContainers"));
                for name in containers.iter().filter(|n| init.contains(n)) {
                    prop_assert!(a_containers.contains(name) && a_init.contains(name), "{name} in both lists: {combined_json}");
                }
            }
        }
    }
}
