//! Validation (`POST /validate`): what a pod still lacks of its template's injection, in words a person can act on.
//!
//! Injection is idempotent, so "the final pod is correct" means "injecting it again would add nothing". For a pod
//! that lacks something, the merge runs again watched by [`Missing`]: each `add` it would make is one thing
//! missing, named by what it adds (`container proxy`, `volume data`, `annotation sidecar-injector.io/status`)
//! rather than by its JSON Pointer. Only pods that fail validation get here, so this may allocate.

// The traits by name, not the prelude's glob: its `ArrayTrait` turns every `Vec::iter` into a boxed iterator.
use simd_json::prelude::ValueIntoString;

use crate::merge::{Added, Observer, Step};
use crate::pod::PodView;
use crate::pod_api::spec::{CONTAINERS, INIT_CONTAINERS};
use crate::template::tree::{Item, KeyValue, TNode};

/// At most this many missing things are named in a message; the rest are counted.
const MAX_NAMED: usize = 10;

/// Watches a merge and names each thing it adds.
pub(crate) struct Missing<'m, 'p, 't, 'i> {
    pod: &'p PodView<'t, 'i>,
    steps: Vec<Step<'m>>,
    items: Vec<String>,
}

impl<'m, 'p, 't, 'i> Missing<'m, 'p, 't, 'i> {
    pub(crate) fn new(pod: &'p PodView<'t, 'i>) -> Self {
        Missing { pod, steps: Vec::new(), items: Vec::new() }
    }

    /// What the pod lacks, one thing each, in the merge's order.
    pub(crate) fn into_items(mut self) -> Vec<String> {
        self.items.dedup();
        self.items
    }
}

impl<'m> Observer<'m> for Missing<'m, '_, '_, '_> {
    fn enter(&mut self, step: Step<'m>) {
        self.steps.push(step);
    }

    fn leave(&mut self) {
        self.steps.pop();
    }

    fn added(&mut self, what: Added<'m, '_>) {
        describe(self.pod, &self.steps, what, &mut self.items);
    }
}

/// One line naming `items`, the things a pod lacks: the first [`MAX_NAMED`], and how many more.
pub(crate) fn one_line(items: &[String]) -> String {
    let mut line = items.iter().take(MAX_NAMED).map(String::as_str).collect::<Vec<_>>().join(", ");
    let more = items.len().saturating_sub(MAX_NAMED);
    if more > 0 {
        line.push_str(&format!(" and {more} more"));
    }
    line
}

/// The lists of a pod spec whose missing items are named (`container proxy`): lists the merge matches by `name`
/// (a test holds them to it). Not `ephemeralContainers`, which a template cannot add: the API server refuses them
/// at create.
const NAMED_LISTS: [&str; 4] = [CONTAINERS, INIT_CONTAINERS, "volumes", "imagePullSecrets"];

/// Names what one `add` of `what` at `steps` adds, one item per thing.
fn describe(pod: &PodView<'_, '_>, steps: &[Step<'_>], what: Added<'_, '_>, out: &mut Vec<String>) {
    use Step::{Field, Index};
    match (steps, what) {
        ([Field("metadata"), Field(map @ ("annotations" | "labels")), Field(key)], _) => {
            out.push(format!("{} {key}", singular(map)))
        }
        ([Field("metadata"), Field(map @ ("annotations" | "labels"))], what) => {
            out.extend(member_keys(what).into_iter().map(|key| format!("{} {key}", singular(map))))
        }
        ([Field("spec"), Field(list)], Added::Item(item)) if NAMED_LISTS.contains(list) => {
            out.push(format!("{} {}", singular(list), item_key(item).unwrap_or_else(|| "(unnamed)".to_owned())))
        }
        ([Field("spec"), Field(list)], what) if NAMED_LISTS.contains(list) => {
            out.extend(item_keys(what).into_iter().map(|name| format!("{} {name}", singular(list))))
        }
        ([Field("spec"), Field(list @ (CONTAINERS | INIT_CONTAINERS)), Index(index), rest @ ..], what) => {
            let name = container_name(pod, list, *index).unwrap_or_else(|| format!("#{index}"));
            out.push(format!("{} {name}: {}", singular(list), field(rest, what)))
        }
        (rest, what) => out.push(field(rest, what)),
    }
}

/// A field inside an object: its dotted path, with the key of a list item (`env[POD_IP]`).
fn field(steps: &[Step<'_>], what: Added<'_, '_>) -> String {
    let mut text = String::new();
    for step in steps {
        if let Step::Field(key) = step {
            if !text.is_empty() {
                text.push('.');
            }
            text.push_str(key);
        }
    }
    if let Added::Item(item) = what {
        if let Some(key) = item_key(item) {
            text.push_str(&format!("[{key}]"));
        }
    } else if text.is_empty() {
        text.push_str("the pod's ");
        text.push_str(&member_keys(what).join(", "));
    }
    text
}

fn singular(collection: &str) -> &str {
    match collection {
        "annotations" => "annotation",
        "labels" => "label",
        CONTAINERS => "container",
        INIT_CONTAINERS => "init container",
        "volumes" => "volume",
        "imagePullSecrets" => "imagePullSecret",
        other => other,
    }
}

/// The item's merge-key value (`name`, `mountPath`, `containerPort`...), as the merge matched it.
fn item_key(item: &Item) -> Option<String> {
    match item.key.as_ref()? {
        KeyValue::Str(s) => Some(s.to_string()),
        KeyValue::Int(i) => Some(i.to_string()),
    }
}

/// The keys of the members an object `add` writes.
fn member_keys<'m>(what: Added<'m, '_>) -> Vec<&'m str> {
    match what {
        Added::Value(TNode::Object(object)) => object.members.iter().map(|m| &*m.key).collect(),
        Added::Members(object, keep) => object.members.iter().map(|m| &*m.key).filter(|k| keep(k)).collect(),
        _ => Vec::new(),
    }
}

/// The keys of the items a list `add` writes.
fn item_keys(what: Added<'_, '_>) -> Vec<String> {
    match what {
        Added::Value(TNode::List(list)) => list.items.iter().filter_map(item_key).collect(),
        Added::Items(list, keep) => list.items.iter().filter(|i| keep(i)).filter_map(item_key).collect(),
        Added::Item(item) => item_key(item).into_iter().collect(),
        _ => Vec::new(),
    }
}

/// The name of the pod's container (or init container) at `index`.
fn container_name(pod: &PodView<'_, '_>, list: &str, index: usize) -> Option<String> {
    let containers = pod.spec()?.get(list)?.as_array()?;
    containers.get(index)?.get("name")?.into_string().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, Settings, TemplateSet};

    /// What `/validate` says `pod` lacks of the template in `source`.
    fn missing(source: &str, pod: serde_json::Value) -> Vec<String> {
        let settings = Settings::default();
        let engine = Engine::new(TemplateSet::from_source("t", "t.yaml", source, &settings).unwrap(), &settings);
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                        "namespace": "ns", "object": pod}
        });
        let mut body = serde_json::to_vec(&review).unwrap();
        let outcome = engine.validate(&mut body, &mut Vec::new()).unwrap();
        assert!(outcome.message.as_deref().unwrap_or_default().ends_with(&one_line(&outcome.missing)));
        outcome.missing
    }

    #[test]
    fn named_lists_are_lists_the_merge_matches_by_name() {
        for list in NAMED_LISTS {
            assert_eq!(crate::pod_api::merge_rules::merge_key_for(list), Some("name"), "{list}");
        }
    }

    #[test]
    fn names_what_each_operation_adds() {
        let template = "pod:
  metadata:
    labels: {a: '1', b: '2'}
  spec:
    initContainers: [{name: init, image: busybox}]
    containers:
      - {name: agent, image: agent}
      - name: proxy
        image: proxy
        env: [{name: POD_IP, value: x}]
        volumeMounts: [{name: data, mountPath: /d}]
        ports: [{name: admin, containerPort: 15000}]
        resources: {requests: {cpu: 50m}}
    volumes: [{name: data, emptyDir: {}}]
";
        let pod = serde_json::json!({
            "metadata": {"name": "p", "annotations": {"team": "x"}},
            "spec": {
                "containers": [
                    {"name": "app", "image": "a"},
                    {"name": "proxy", "image": "p", "env": [{"name": "OTHER", "value": "1"}],
                     "volumeMounts": [{"name": "x", "mountPath": "/x"}], "ports": [{"containerPort": 80}],
                     "resources": {"requests": {"memory": "1Mi"}}}
                ],
                "volumes": [{"name": "x", "emptyDir": {}}]
            }
        });
        assert_eq!(
            missing(template, pod).join(", "),
            "label a, label b, annotation kubectl.kubernetes.io/default-container, \
             annotation cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes, \
             annotation sidecar-injector.io/status, init container init, \
             container proxy: env[POD_IP], container proxy: volumeMounts[/d], container proxy: ports[15000], \
             container proxy: resources.requests.cpu, container agent, volume data"
        );
    }

    #[test]
    fn a_long_list_is_cut_and_counted() {
        let items: Vec<String> = (0..12).map(|i| format!("volume v{i}")).collect();
        let text = one_line(&items);
        assert!(text.starts_with("volume v0, volume v1,") && text.ends_with("volume v9 and 2 more"), "{text}");
    }

    #[test]
    fn a_union_member_or_a_name_elsewhere_is_not_missing() {
        // The pod chose `valueFrom` for X and declares `agent` as an init container: neither is missing.
        let template = "pod:\n  spec:\n    containers:\n      - name: agent\n        image: a\n        env: [{name: X, value: x}]\n      - {name: proxy, image: p, env: [{name: X, value: x}]}\n";
        let pod = serde_json::json!({"metadata": {"name": "p", "annotations": {}}, "spec": {
            "initContainers": [{"name": "agent", "image": "a"}],
            "containers": [{"name": "proxy", "image": "p", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}]
        }});
        assert_eq!(
            missing(template, pod),
            ["annotation kubectl.kubernetes.io/default-container", "annotation sidecar-injector.io/status"]
        );
    }

    #[test]
    fn list_items_are_named_by_the_merge_key_the_merge_matched_them_by() {
        // The merge keys come from the one rule set: `ip` for hostAliases, `topologyKey` for spread constraints.
        let template = "pod:
  spec:
    hostAliases: [{ip: 10.0.0.1, hostnames: [mesh.local]}]
    topologySpreadConstraints:
      - {topologyKey: zone, maxSkew: 1, whenUnsatisfiable: ScheduleAnyway}
";
        let pod = serde_json::json!({"metadata": {"name": "p", "annotations": {}}, "spec": {
            "containers": [{"name": "app", "image": "a"}],
            "hostAliases": [{"ip": "10.0.0.2", "hostnames": ["db"]}],
            "topologySpreadConstraints": [{"topologyKey": "host", "maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]
        }});
        assert_eq!(
            missing(template, pod),
            [
                "spec.hostAliases[10.0.0.1]",
                "spec.topologySpreadConstraints[zone]",
                "annotation sidecar-injector.io/status"
            ]
        );
    }
}
