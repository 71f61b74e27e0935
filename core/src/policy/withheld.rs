//! Pods the webhook leaves alone because the injected pod would break one of the API server's pod-wide rules,
//! as match conditions of the policy: the webhook judges such a pod whole once injected and admits it without the
//! sidecar (or refuses it, as the template's error policy says); the policy, which cannot judge a pod whole, must
//! not apply to it either, or the API server would refuse the pod. Each rule is written for what the template
//! writes, and only when it writes it:
//!
//! - the total size of the annotations (256 KiB): the pod's own and those the template adds;
//! - the legacy seccomp annotation of the pod against the profile the template gives the pod;
//! - a container's block device at a path where the container defaults mount a volume;
//! - a resize policy that restarts a container, in a pod that never restarts (`restartPolicy: Never`).

use serde_json::Value;

use super::Refusal;
use super::cel;
use super::walk::Walk;
use crate::template::tree::TNode;
use crate::validation::TOTAL_ANNOTATION_SIZE_LIMIT_B;

/// The member `key` of the map node `t`.
fn member<'a>(t: &'a TNode, key: &str) -> Option<&'a TNode> {
    match t {
        TNode::Object(object) => object.members.iter().find(|m| &*m.key == key).map(|m| &m.node),
        _ => None,
    }
}

/// A static string leaf.
fn text(t: &TNode) -> Option<String> {
    match t {
        TNode::Scalar(fragment) => serde_json::from_slice::<Value>(fragment.json()).ok()?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// The annotations' total after the template's are added stays within the API server's limit.
pub(super) fn annotations_total(pod: &TNode, walk: &Walk<'_>) -> Result<Option<String>, Refusal> {
    let Some(TNode::Object(annotations)) = member(pod, "metadata").and_then(|m| member(m, "annotations")) else {
        return Ok(None);
    };
    let mut added = Vec::new();
    for m in &annotations.members {
        let key = cel::string(&m.key);
        let existing = format!("object.metadata.?annotations[?{key}]");
        let value = walk.value(&m.node, "metadata.annotations")?;
        let bytes = format!("size(bytes({value}))");
        let grown = if crate::pod_api::merge_rules::is_name_set(&m.key) {
            // A set of names the pod has grows by the names it lacks, and a comma before each.
            let names: Vec<String> = text(&m.node)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(cel::string)
                .collect();
            format!(
                "[0] + [{}].filter(n, !string({existing}.value()).split(\",\").exists(h, h.trim() == n)).map(n, size(bytes(n)) + 1)",
                names.join(", ")
            )
        } else {
            "[0]".to_owned()
        };
        added.push(format!("({existing}.hasValue() ? ({grown}).sum() : {} + {bytes})", m.key.len()));
    }
    Ok(Some(format!(
        "([0] + object.metadata.?annotations.orValue({{}}).transformList(k, v, size(bytes(k)) + size(bytes(v)))).sum() + {} <= {TOTAL_ANNOTATION_SIZE_LIMIT_B}",
        added.join(" + ")
    )))
}

/// The pod's legacy seccomp annotation agrees with the profile the template gives a pod that has none.
pub(super) fn pod_seccomp(pod: &TNode) -> Option<String> {
    let profile =
        member(pod, "spec").and_then(|s| member(s, "securityContext")).and_then(|c| member(c, "seccompProfile"))?;
    let annotation = match text(member(profile, "type")?)?.as_str() {
        "RuntimeDefault" => "runtime/default".to_owned(),
        "Unconfined" => "unconfined".to_owned(),
        "Localhost" => format!("localhost/{}", text(member(profile, "localhostProfile")?)?),
        _ => return None,
    };
    let key = cel::string("seccomp.security.alpha.kubernetes.io/pod");
    Some(format!(
        "object.spec.?securityContext.?seccompProfile.hasValue() || !object.metadata.?annotations[?{key}].hasValue() \
         || string(object.metadata.annotations[{key}]) == {}",
        cel::string(&annotation)
    ))
}

/// No container the defaults reach has a block device where they mount a volume.
pub(super) fn device_paths(defaults: &TNode, reach: &str) -> Option<String> {
    let TNode::List(mounts) = member(defaults, "volumeMounts")? else { return None };
    let paths: Vec<String> = mounts
        .items
        .iter()
        .filter_map(|item| member(&item.node, "mountPath").and_then(text))
        .map(|p| cel::string(&p))
        .collect();
    if paths.is_empty() {
        return None;
    }
    Some(format!(
        "!object.spec.?containers.orValue([]).exists(c, ({reach}) && c.?volumeDevices.orValue([]).exists(d, d.?devicePath.orValue(\"\") in [{}]))",
        paths.join(", ")
    ))
}

/// The pod does not say `restartPolicy: Never` when the template writes a resize policy other than `NotRequired`
/// (in `pod` or in the container defaults), which only that allows in such a pod. A per-pod resize policy is
/// read as one that may restart.
pub(super) fn resize_restarts(trees: &[Option<&TNode>]) -> Option<String> {
    fn restarts(t: &TNode, under_resize: bool) -> bool {
        match t {
            TNode::Object(object) => object.members.iter().any(|m| match (&*m.key, under_resize) {
                ("restartPolicy", true) => text(&m.node).is_none_or(|policy| policy != "NotRequired"),
                (key, _) => restarts(&m.node, under_resize || key == "resizePolicy"),
            }),
            TNode::List(list) => list.items.iter().any(|item| restarts(&item.node, under_resize)),
            TNode::Dynamic(_) => under_resize,
            TNode::Scalar(_) | TNode::Stamp(_) => false,
        }
    }
    trees
        .iter()
        .flatten()
        .any(|t| restarts(t, false))
        .then(|| "string(object.spec.?restartPolicy.orValue(\"Always\")) != \"Never\"".to_owned())
}
