//! Validation (`POST /validate`): what a pod still lacks of its template's injection, in words a person can act on.
//!
//! Injection is idempotent, so "the final pod is correct" means "injecting it again would add nothing". The
//! engine writes the patch it would send; each of its `add` operations is one thing missing, described here by
//! what it adds (`container proxy`, `volume data`, `annotation sidecar-injector.io/status`) rather than by its
//! JSON Pointer. Only pods that fail validation get here, so this may allocate.

use serde_json::Value;
use simd_json::prelude::*;

use crate::pod::PodView;

/// At most this many missing things are named in a message; the rest are counted.
const MAX_NAMED: usize = 10;

/// One line naming what the operations of `patch` (a JSON Patch of `add` operations) would add to `pod`.
pub(crate) fn describe_missing(pod: &PodView<'_, '_>, patch: &[u8]) -> String {
    let ops: Vec<Value> = serde_json::from_slice(patch).unwrap_or_default();
    let mut items: Vec<String> =
        ops.iter().map(|op| describe(pod, op["path"].as_str().unwrap_or_default(), &op["value"])).collect();
    items.dedup();
    let more = items.len().saturating_sub(MAX_NAMED);
    items.truncate(MAX_NAMED);
    let mut line = items.join(", ");
    if more > 0 {
        line.push_str(&format!(" and {more} more"));
    }
    line
}

/// What one `add` at `path` of `value` adds.
fn describe(pod: &PodView<'_, '_>, path: &str, value: &Value) -> String {
    let segments: Vec<String> = path.split('/').skip(1).map(|s| s.replace("~1", "/").replace("~0", "~")).collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    match segments.as_slice() {
        ["metadata", map @ ("annotations" | "labels"), key] => format!("{} {key}", singular(map)),
        ["metadata", map @ ("annotations" | "labels")] => each(singular(map), keys(value)),
        ["spec", list @ ("containers" | "initContainers" | "volumes" | "imagePullSecrets")] => {
            each(singular(list), value.as_array().into_iter().flatten().filter_map(item_key).collect())
        }
        ["spec", list @ ("containers" | "initContainers" | "volumes" | "imagePullSecrets"), position]
            if is_position(position) =>
        {
            format!("{} {}", singular(list), item_key(value).unwrap_or_else(|| "(unnamed)".to_owned()))
        }
        ["spec", list @ ("containers" | "initContainers"), index, rest @ ..] if index.parse::<usize>().is_ok() => {
            let name = container_name(pod, list, index).unwrap_or_else(|| format!("#{index}"));
            format!("{} {name}: {}", singular(list), field(rest, value))
        }
        rest => field(rest, value),
    }
}

/// A field inside an object: its dotted path, with the key of a list item (`env[POD_NAME]`).
fn field(segments: &[&str], value: &Value) -> String {
    let mut text = String::new();
    for segment in segments {
        if is_position(segment) {
            continue;
        }
        if !text.is_empty() {
            text.push('.');
        }
        text.push_str(segment);
    }
    if let [.., list, last] = segments
        && is_position(last)
    {
        if let Some(key) = merge_key(list, value) {
            text.push_str(&format!("[{key}]"));
        }
    } else if text.is_empty() {
        text.push_str("the pod's ");
        text.push_str(&keys(value).join(", "));
    }
    text
}

/// `-` or an index: the add goes into a list.
fn is_position(segment: &str) -> bool {
    segment == "-" || segment.parse::<usize>().is_ok()
}

fn singular(collection: &str) -> &str {
    match collection {
        "annotations" => "annotation",
        "labels" => "label",
        "containers" => "container",
        "initContainers" => "init container",
        "volumes" => "volume",
        "imagePullSecrets" => "imagePullSecret",
        other => other,
    }
}

/// The merge key of an item of `list`, as the merge matches them: `mountPath` for volume mounts,
/// `containerPort` for ports, `name` for the rest.
fn merge_key(list: &str, value: &Value) -> Option<String> {
    let key = match list {
        "volumeMounts" => "mountPath",
        "ports" => "containerPort",
        _ => "name",
    };
    match &value[key] {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn item_key(value: &Value) -> Option<String> {
    merge_key("", value)
}

/// `volume a, volume b`: one item per name, as if each had been added alone.
fn each(noun: &str, names: Vec<String>) -> String {
    names.iter().map(|name| format!("{noun} {name}")).collect::<Vec<_>>().join(", ")
}

fn keys(value: &Value) -> Vec<String> {
    value.as_object().map(|map| map.keys().cloned().collect()).unwrap_or_default()
}

/// The name of the pod's container (or init container) at `index`.
fn container_name(pod: &PodView<'_, '_>, list: &str, index: &str) -> Option<String> {
    let index = index.parse().ok()?;
    let containers = pod.spec()?.get(list)?.as_array()?;
    containers.get(index)?.get("name")?.into_string().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn missing(pod: &str, patch: &str) -> String {
        let mut bytes = pod.as_bytes().to_vec();
        let tape = simd_json::to_tape(&mut bytes).unwrap();
        let view = PodView::new(tape.as_value(), "ns");
        describe_missing(&view, patch.as_bytes())
    }

    #[test]
    fn names_what_each_operation_adds() {
        let pod = r#"{"metadata":{"name":"p"},"spec":{"containers":[{"name":"app"},{"name":"proxy"}]}}"#;
        let patch = r#"[
            {"op":"add","path":"/metadata/annotations/sidecar-injector.io~1status","value":"{}"},
            {"op":"add","path":"/metadata/labels","value":{"a":"1","b":"2"}},
            {"op":"add","path":"/spec/initContainers","value":[{"name":"init"}]},
            {"op":"add","path":"/spec/containers/-","value":{"name":"agent"}},
            {"op":"add","path":"/spec/volumes/-","value":{"name":"data"}},
            {"op":"add","path":"/spec/containers/1/env/-","value":{"name":"POD_IP"}},
            {"op":"add","path":"/spec/containers/1/volumeMounts/0","value":{"name":"data","mountPath":"/d"}},
            {"op":"add","path":"/spec/containers/1/ports/-","value":{"name":"admin","containerPort":15000}},
            {"op":"add","path":"/spec/containers/1/resources/requests/cpu","value":"50m"}
        ]"#;
        assert_eq!(
            missing(pod, patch),
            "annotation sidecar-injector.io/status, label a, label b, init container init, container agent, \
             volume data, container proxy: env[POD_IP], container proxy: volumeMounts[/d], container proxy: ports[15000], \
             container proxy: resources.requests.cpu"
        );
    }

    #[test]
    fn a_long_list_is_cut_and_counted() {
        let pod = r#"{"metadata":{},"spec":{"containers":[]}}"#;
        let ops: Vec<String> =
            (0..12).map(|i| format!(r#"{{"op":"add","path":"/spec/volumes/-","value":{{"name":"v{i}"}}}}"#)).collect();
        let text = missing(pod, &format!("[{}]", ops.join(",")));
        assert!(text.starts_with("volume v0, volume v1,") && text.ends_with("volume v9 and 2 more"), "{text}");
    }
}
