//! `status --upgrade`: a running pod's sidecar upgraded in place when the current template differs from the one
//! that injected it only in the sidecar's image (OpenKruise SidecarSet's in-place update; istio#28265). A
//! container's `image` is the one field of a running pod's spec that may change, and the kubelet then restarts that
//! container alone: the app keeps running.
//!
//! What the current template would make of the pod is asked of the API server itself: the pod as it was before
//! its injection ([`uninjected`]: the containers, init containers and volumes its stamp names taken out, the status
//! annotation and what the API server sets removed) is created with a server-side dry run, so that our webhook
//! injects it with the current template and the API server defaults it as it did the running pod. The two are then
//! compared ([`compare`]): equal but for the sidecars' images and the stamp, the pod is upgraded by a JSON Patch of
//! those (with a `test` of each old image, so that a pod changed meanwhile is left alone); anything else differs,
//! and the pod is listed for a restart, never patched.
//!
//! Known limit: what only the old version added outside the stamped containers and volumes (a mount or env var
//! in the app's containers, a pod-level default) stays in the pod after the upgrade, as it would not in a pod
//! created now; the add-only merge keeps it, and `/validate` judges the pod complete.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Value, json};

use sidecar_injector_core::Stamp;
use sidecar_injector_core::settings::Keys;

const EPHEMERAL: &str = "ephemeralContainers";

/// The spec's fields `compare` leaves out of the pod-level comparison: the lists it compares item by item, and what
/// the scheduler and `kubectl debug` add to a running pod.
const COMPARED_APART: [&str; 5] = ["containers", "initContainers", "volumes", "nodeName", EPHEMERAL];

/// The volume (and mounts) the ServiceAccount admission plugin adds to every pod: its name has a random suffix,
/// so it is compared by this prefix.
const SERVICE_ACCOUNT_VOLUME: &str = "kube-api-access-";

/// One container's image to change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageChange {
    /// `containers` or `initContainers`.
    pub list: &'static str,
    /// Its index in that list.
    pub index: usize,
    /// The container's name.
    pub name: String,
    /// The image it runs.
    pub from: String,
    /// The image the current template gives it.
    pub to: String,
}

/// The pod as it was before its injection, to be created again with a dry run: `None` when its stamp cannot be
/// read. Its name is kept (so that templates reading it render the same) unless it was generated, in which case
/// `generateName` makes another; a named pod's probe gets `-upgrade-probe` appended (the dry run would collide
/// with the pod itself), which a template reading `pod.name` then renders differently: such a pod differs, and is
/// restarted instead.
pub fn uninjected(pod: &Value, keys: &Keys) -> Option<Value> {
    let annotations = pod.pointer("/metadata/annotations")?;
    let stamp = Stamp::parse(annotations.get(&keys.status)?.as_str()?)?;
    let metadata = pod.get("metadata")?.as_object()?;
    let mut fresh = serde_json::Map::new();
    for key in ["labels", "annotations", "ownerReferences", "generateName"] {
        if let Some(value) = metadata.get(key) {
            fresh.insert(key.to_owned(), value.clone());
        }
    }
    if !metadata.contains_key("generateName") {
        let name = metadata.get("name").and_then(Value::as_str).unwrap_or("pod");
        fresh.insert("name".to_owned(), json!(format!("{name}-upgrade-probe")));
    }
    if let Some(annotations) = fresh.get_mut("annotations").and_then(Value::as_object_mut) {
        annotations.remove(&keys.status);
    }
    let mut spec = pod.get("spec")?.clone();
    let spec_map = spec.as_object_mut()?;
    // What the scheduler sets (the dry run is not scheduled), and the ephemeral containers `kubectl debug` adds,
    // which cannot be set on create. The rest, defaults included, is sent as it is: the API server takes back what
    // it set (a priority, a toleration) when it agrees, and a user's own value stays the user's.
    for key in ["nodeName", EPHEMERAL] {
        spec_map.remove(key);
    }
    retain_named(spec_map, "containers", &stamp.containers);
    retain_named(spec_map, "initContainers", &stamp.init_containers);
    retain_named(spec_map, "volumes", &stamp.volumes);
    if let Some(volumes) = spec_map.get_mut("volumes").and_then(Value::as_array_mut) {
        volumes.retain(|v| !name_of(v).starts_with(SERVICE_ACCOUNT_VOLUME));
    }
    for list in ["containers", "initContainers"] {
        for container in spec_map.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(mounts) = container.get_mut("volumeMounts").and_then(Value::as_array_mut) {
                mounts.retain(|m| !name_of(m).starts_with(SERVICE_ACCOUNT_VOLUME));
            }
        }
    }
    Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": fresh, "spec": spec}))
}

fn name_of(value: &Value) -> &str {
    value.get("name").and_then(Value::as_str).unwrap_or_default()
}

/// Takes the items named `injected` out of the list `key`.
fn retain_named(spec: &mut serde_json::Map<String, Value>, key: &str, injected: &[String]) {
    if let Some(items) = spec.get_mut(key).and_then(Value::as_array_mut) {
        items.retain(|item| !injected.iter().any(|name| name == name_of(item)));
    }
}

/// How the running pod and the pod the current template makes of it (`fresh`, the dry run's) compare: the image
/// changes that upgrade the running one, and the stamp to write; or the first difference that is not an image.
pub fn compare(running: &Value, fresh: &Value, keys: &Keys) -> Result<(Vec<ImageChange>, String), String> {
    let stamp = fresh
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(&keys.status))
        .and_then(Value::as_str)
        .ok_or("the current template does not inject it (no status annotation on the dry run)")?;
    let sidecars = Stamp::parse(stamp).ok_or("the dry run's status annotation is not a stamp")?;
    let mut changes = Vec::new();
    for (list, injected) in [("containers", &sidecars.containers), ("initContainers", &sidecars.init_containers)] {
        let ours = items(running, list);
        let theirs = items(fresh, list);
        let names = |items: &[Value]| items.iter().map(|c| name_of(c).to_owned()).collect::<Vec<_>>();
        if names(ours) != names(theirs) {
            return Err(format!("spec.{list}: {:?} now, {:?} as injected today", names(ours), names(theirs)));
        }
        for (index, (now, today)) in ours.iter().zip(theirs).enumerate() {
            let name = name_of(now);
            let (mut now, mut today) = (without_token_mounts(now), without_token_mounts(today));
            if injected.iter().any(|n| n == name) {
                let from = take_image(&mut now);
                let to = take_image(&mut today);
                if from != to {
                    changes.push(ImageChange { list, index, name: name.to_owned(), from, to });
                }
            }
            if let Some(at) = first_difference(&now, &today, &format!("spec.{list}[{name}]")) {
                return Err(at);
            }
        }
    }
    let volumes = |pod: &Value| {
        let mut list: Vec<Value> =
            items(pod, "volumes").iter().filter(|v| !name_of(v).starts_with(SERVICE_ACCOUNT_VOLUME)).cloned().collect();
        list.sort_by(|a, b| name_of(a).cmp(name_of(b)));
        Value::Array(list)
    };
    if let Some(at) = first_difference(&volumes(running), &volumes(fresh), "spec.volumes") {
        return Err(at);
    }
    // Pod-level fields (a default the template gives the pod), both pods as the API server defaulted them.
    let pod_level = |pod: &Value| {
        let mut spec = pod.get("spec").cloned().unwrap_or(json!({}));
        if let Some(spec) = spec.as_object_mut() {
            spec.retain(|key, _| !COMPARED_APART.contains(&key.as_str()));
        }
        spec
    };
    if let Some(at) = first_difference(&pod_level(running), &pod_level(fresh), "spec") {
        return Err(at);
    }
    for key in ["labels", "annotations"] {
        let mut now = running.pointer(&format!("/metadata/{key}")).cloned().unwrap_or(json!({}));
        let mut today = fresh.pointer(&format!("/metadata/{key}")).cloned().unwrap_or(json!({}));
        for map in [&mut now, &mut today] {
            if let Some(map) = map.as_object_mut() {
                map.remove(&keys.status);
            }
        }
        if let Some(at) = first_difference(&now, &today, &format!("metadata.{key}")) {
            return Err(at);
        }
    }
    Ok((changes, stamp.to_owned()))
}

fn items<'v>(pod: &'v Value, list: &str) -> &'v [Value] {
    pod.pointer(&format!("/spec/{list}")).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn without_token_mounts(container: &Value) -> Value {
    let mut container = container.clone();
    if let Some(mounts) = container.get_mut("volumeMounts").and_then(Value::as_array_mut) {
        mounts.retain(|m| !name_of(m).starts_with(SERVICE_ACCOUNT_VOLUME));
        if mounts.is_empty() {
            container.as_object_mut().map(|c| c.remove("volumeMounts"));
        }
    }
    container
}

fn take_image(container: &mut Value) -> String {
    let image = container.as_object_mut().and_then(|c| c.remove("image"));
    image.and_then(|i| i.as_str().map(str::to_owned)).unwrap_or_default()
}

/// The first place where `now` and `today` differ, with both values.
fn first_difference(now: &Value, today: &Value, at: &str) -> Option<String> {
    match (now, today) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|k| {
                first_difference(
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                    &format!("{at}.{k}"),
                )
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            a.iter().zip(b).enumerate().find_map(|(i, (x, y))| first_difference(x, y, &format!("{at}[{i}]")))
        }
        _ if now == today => None,
        _ => Some(format!("{at}: {now} now, {today} as injected today")),
    }
}

/// The JSON Patch that upgrades a pod: each image tested, then replaced, and the stamp replaced.
pub fn patch(changes: &[ImageChange], stamp: &str, keys: &Keys) -> Value {
    let mut ops = Vec::new();
    for change in changes {
        let path = format!("/spec/{}/{}/image", change.list, change.index);
        ops.push(json!({"op": "test", "path": path, "value": change.from}));
        ops.push(json!({"op": "replace", "path": path, "value": change.to}));
    }
    let key = keys.status.replace('~', "~0").replace('/', "~1");
    ops.push(json!({"op": "replace", "path": format!("/metadata/annotations/{key}"), "value": stamp}));
    Value::Array(ops)
}

/// The status of the container `change` names, in `pod`.
fn container_status<'p>(pod: &'p Value, change: &ImageChange) -> Option<&'p Value> {
    let statuses = match change.list {
        "initContainers" => "initContainerStatuses",
        _ => "containerStatuses",
    };
    let statuses = pod.pointer(&format!("/status/{statuses}")).and_then(Value::as_array)?;
    statuses.iter().find(|s| s.get("name").and_then(Value::as_str) == Some(change.name.as_str()))
}

/// Is the upgraded pod's every changed container a new one (the kubelet replaced the one `before` had, as it does
/// for a new image), running and ready? Not judged by the status's image name: the kubelet may report an image by
/// another of its tags.
pub fn upgraded(pod: &Value, before: &Value, changes: &[ImageChange]) -> bool {
    changes.iter().all(|change| {
        let id = |pod| container_status(pod, change).and_then(|s| s.get("containerID")).and_then(Value::as_str);
        container_status(pod, change).is_some_and(|s| {
            s.pointer("/state/running").is_some()
                && s.get("ready").and_then(Value::as_bool) == Some(true)
                && id(pod).is_some_and(|now| Some(now) != id(before))
        })
    })
}

/// What became of one pod `--upgrade` looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum PodResult {
    /// Patched, and its new sidecar running and ready within `--timeout`.
    Ready,
    /// Patched, and its new sidecar not running and ready within `--timeout`.
    Upgraded,
    /// Left at its version: by `--partition`, `--max-upgrades`, or after a failed batch.
    Left,
    /// Would be patched (`--dry-run`).
    Planned,
    /// More than the image differs: only a restart brings the current injection.
    Restart,
    /// A read or the patch failed.
    Failed,
}

/// One pod `--upgrade` looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodUpgrade {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// What became of it.
    pub result: PodResult,
    /// The images changed (or to change).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageChange>,
    /// Why it needs a restart, or why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What `--upgrade` did: every stale pod it matched (by `--selector`, if given), once each. The counts are read
/// from the pods (and serialised with them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// `--dry-run`: nothing was changed.
    pub dry_run: bool,
    /// Every pod, in the order looked at.
    pub pods: Vec<PodUpgrade>,
}

impl Outcome {
    fn count(&self, results: &[PodResult]) -> usize {
        self.pods.iter().filter(|p| results.contains(&p.result)).count()
    }

    /// Stale pods matched.
    pub fn matched(&self) -> usize {
        self.pods.len()
    }

    /// Pods whose image was patched.
    pub fn updated(&self) -> usize {
        self.count(&[PodResult::Ready, PodResult::Upgraded])
    }

    /// Of those, the ones whose new sidecar was running and ready within `--timeout`.
    pub fn ready(&self) -> usize {
        self.count(&[PodResult::Ready])
    }

    /// Did a read or a patch fail, or a patched pod not come up ready? (Pods to restart are drift, which `status`
    /// reports.)
    pub fn failed(&self) -> bool {
        self.count(&[PodResult::Failed, PodResult::Upgraded]) > 0
    }

    /// Does a pod need a restart?
    pub fn restarts(&self) -> bool {
        self.count(&[PodResult::Restart]) > 0
    }

    /// For people: the counts, then one line per pod.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let (verb, done) = match self.dry_run {
            true => ("would upgrade", self.count(&[PodResult::Planned])),
            false => ("upgraded", self.updated()),
        };
        let _ = writeln!(out, "upgrade in place: {} matched, {done} {verb}, {} ready", self.matched(), self.ready());
        for pod in &self.pods {
            let images: Vec<String> = pod.images.iter().map(|c| format!("{} {} -> {}", c.name, c.from, c.to)).collect();
            let detail = pod.reason.clone().unwrap_or_else(|| images.join(", "));
            let result: &'static str = pod.result.into();
            let _ = writeln!(out, "  {}/{}: {result}: {detail}", pod.namespace, pod.name);
        }
        out
    }
}

impl Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Counted<'a> {
            dry_run: bool,
            matched: usize,
            updated: usize,
            ready: usize,
            pods: &'a [PodUpgrade],
        }
        let counted = Counted {
            dry_run: self.dry_run,
            matched: self.matched(),
            updated: self.updated(),
            ready: self.ready(),
            pods: &self.pods,
        };
        counted.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new("sidecar-injector.io/")
    }

    fn stamp(version: &str) -> String {
        json!({"containers": ["proxy"], "initContainers": [], "set": "s", "template": "t", "version": version,
               "volumes": ["proxy-data"]})
        .to_string()
    }

    fn running(image: &str, version: &str) -> Value {
        json!({
            "metadata": {"name": "web-abc", "generateName": "web-", "uid": "u", "resourceVersion": "7",
                         "labels": {"app": "web"},
                         "annotations": {"sidecar-injector.io/status": stamp(version)}},
            "spec": {"nodeName": "n", "priority": 0,
                     "containers": [
                        {"name": "app", "image": "shop:1", "volumeMounts": [
                            {"name": "proxy-data", "mountPath": "/p"}, {"name": "kube-api-access-x1", "mountPath": "/t"}]},
                        {"name": "proxy", "image": image, "volumeMounts": [{"name": "kube-api-access-x1", "mountPath": "/t"}]}],
                     "volumes": [{"name": "proxy-data", "emptyDir": {}}, {"name": "kube-api-access-x1", "projected": {}}]},
            "status": {"phase": "Running"},
        })
    }

    #[test]
    fn the_pod_before_injection_keeps_its_own_and_loses_what_its_stamp_names() {
        let before = uninjected(&running("proxy:1", "v1"), &keys()).unwrap();
        assert_eq!(before["metadata"]["generateName"], "web-");
        assert!(before["metadata"].get("name").is_none() && before["metadata"].get("uid").is_none());
        assert!(before["metadata"]["annotations"].get("sidecar-injector.io/status").is_none());
        let names: Vec<&str> = before["spec"]["containers"].as_array().unwrap().iter().map(name_of).collect();
        assert_eq!(names, ["app"]);
        assert_eq!(before["spec"]["volumes"], json!([]), "the stamp's volume and the token's");
        assert_eq!(before["spec"]["containers"][0]["volumeMounts"], json!([{"name": "proxy-data", "mountPath": "/p"}]));
        assert!(before["spec"].get("nodeName").is_none());
        assert_eq!(before["spec"]["priority"], 0, "the pod's own fields are kept");
        // A named pod's probe is named apart from it.
        let mut named = running("proxy:1", "v1");
        named["metadata"].as_object_mut().unwrap().remove("generateName");
        assert_eq!(uninjected(&named, &keys()).unwrap()["metadata"]["name"], "web-abc-upgrade-probe");
        // No stamp: nothing to go on.
        named["metadata"]["annotations"] = json!({});
        assert_eq!(uninjected(&named, &keys()), None);
    }

    #[test]
    fn only_an_image_upgrades_in_place_and_anything_else_is_a_restart() {
        let mut fresh = running("proxy:2", "v2");
        // The dry run's own token volume has another suffix.
        fresh["spec"]["volumes"][1]["name"] = json!("kube-api-access-y2");
        for container in fresh["spec"]["containers"].as_array_mut().unwrap() {
            let mounts = container["volumeMounts"].as_array_mut().unwrap();
            mounts.last_mut().unwrap()["name"] = json!("kube-api-access-y2");
        }
        let (changes, new_stamp) = compare(&running("proxy:1", "v1"), &fresh, &keys()).unwrap();
        assert_eq!(
            changes,
            [ImageChange {
                list: "containers",
                index: 1,
                name: "proxy".into(),
                from: "proxy:1".into(),
                to: "proxy:2".into()
            }]
        );
        assert_eq!(new_stamp, stamp("v2"));
        let ops = patch(&changes, &new_stamp, &keys());
        assert_eq!(ops[0], json!({"op": "test", "path": "/spec/containers/1/image", "value": "proxy:1"}));
        assert_eq!(ops[2]["path"], "/metadata/annotations/sidecar-injector.io~1status");

        // An env var the new version adds: not an image.
        let mut more = fresh.clone();
        more["spec"]["containers"][1]["env"] = json!([{"name": "X", "value": "1"}]);
        let difference = compare(&running("proxy:1", "v1"), &more, &keys()).unwrap_err();
        assert!(difference.starts_with("spec.containers[proxy].env"), "{difference}");
        // A pod-level default it adds.
        let mut defaulted = fresh.clone();
        defaulted["spec"]["securityContext"] = json!({"seccompProfile": {"type": "RuntimeDefault"}});
        let difference = compare(&running("proxy:1", "v1"), &defaulted, &keys()).unwrap_err();
        assert!(difference.starts_with("spec.securityContext"), "{difference}");
        // What the scheduler sets on the running pod is not a difference.
        let mut scheduled = running("proxy:1", "v1");
        scheduled["spec"]["nodeName"] = json!("node-2");
        assert!(compare(&scheduled, &fresh, &keys()).is_ok());
        // A label it adds; a container it adds.
        let mut labelled = fresh.clone();
        labelled["metadata"]["labels"]["mesh"] = json!("on");
        assert!(
            compare(&running("proxy:1", "v1"), &labelled, &keys()).unwrap_err().starts_with("metadata.labels.mesh")
        );
        let mut second = fresh.clone();
        second["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "extra", "image": "e"}));
        assert!(compare(&running("proxy:1", "v1"), &second, &keys()).unwrap_err().starts_with("spec.containers:"));
        // The app's own image is never the template's to change.
        let mut app = fresh.clone();
        app["spec"]["containers"][0]["image"] = json!("shop:2");
        assert!(compare(&running("proxy:1", "v1"), &app, &keys()).unwrap_err().contains("spec.containers[app].image"));
        // Not injected today: nothing to compare with.
        let mut skipped = fresh;
        skipped["metadata"]["annotations"] = json!({});
        assert!(compare(&running("proxy:1", "v1"), &skipped, &keys()).is_err());
    }

    #[test]
    fn upgraded_means_a_new_container_running_and_ready() {
        let change =
            ImageChange { list: "containers", index: 1, name: "proxy".into(), from: "p:1".into(), to: "p:2".into() };
        let pod = |id: &str, ready: bool| {
            json!({"status": {"containerStatuses": [{"name": "proxy", "containerID": id, "ready": ready,
                                                     "state": {"running": {"startedAt": "t"}}}]}})
        };
        let changes = std::slice::from_ref(&change);
        let before = pod("containerd://a", true);
        assert!(upgraded(&pod("containerd://b", true), &before, changes));
        assert!(!upgraded(&pod("containerd://b", false), &before, changes), "not ready yet");
        assert!(!upgraded(&before, &before, changes), "the old container still");
        assert!(upgraded(&before, &before, &[]), "only the stamp changed");
    }
}
