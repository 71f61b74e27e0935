//! Checks a template's rendered output against the Kubernetes API types (`k8s-openapi`), so that a typo in a
//! field name, a string where a number belongs or a container without an image is refused when the template
//! loads, not discovered when the API server rejects a pod.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value as J;

use super::yaml::PathSeg;

/// A validation problem: where (path from the template's top level) and why.
pub(crate) type Problem = (Vec<PathSeg>, String);

/// Validates the rendered `pod` section.
pub(crate) fn pod(pod: &J) -> Result<(), Problem> {
    let root = vec![PathSeg::Key("pod".into())];
    let J::Object(members) = pod else {
        return Err((root, "`pod` must be a mapping with `metadata` and/or `spec`".into()));
    };
    for (key, value) in members {
        let mut path = root.clone();
        path.push(PathSeg::Key(key.clone()));
        match key.as_str() {
            "metadata" => metadata(value, path)?,
            "spec" => spec(value, path)?,
            _ => return Err((path, format!("`pod.{key}` cannot be injected (only `metadata` and `spec`)"))),
        }
    }
    Ok(())
}

fn metadata(value: &J, path: Vec<PathSeg>) -> Result<(), Problem> {
    if let J::Object(members) = value
        && let Some(key) = members.keys().find(|k| *k != "labels" && *k != "annotations")
    {
        let mut at = path.clone();
        at.push(PathSeg::Key(key.clone()));
        return Err((at, format!("`metadata.{key}` cannot be injected (only `labels` and `annotations`)")));
    }
    typed::<ObjectMeta>(value, path)
}

fn spec(value: &J, path: Vec<PathSeg>) -> Result<(), Problem> {
    let mut with_containers = value.clone();
    if let J::Object(members) = &mut with_containers {
        // PodSpec requires `containers`; a template that injects only volumes or defaults may leave it out.
        members.entry("containers").or_insert_with(|| J::Array(Vec::new()));
    }
    typed::<PodSpec>(&with_containers, path.clone())?;
    for list in ["containers", "initContainers"] {
        for (i, c) in value.get(list).and_then(J::as_array).into_iter().flatten().enumerate() {
            let at = [path.clone(), vec![PathSeg::Key(list.into()), PathSeg::Index(i)]].concat();
            if c.get("image").and_then(J::as_str).is_none_or(str::is_empty) {
                return Err((at, "a container needs an `image`".into()));
            }
        }
    }
    for (i, v) in value.get("volumes").and_then(J::as_array).into_iter().flatten().enumerate() {
        if v.as_object().is_some_and(|o| o.len() < 2) {
            let at = [path.clone(), vec![PathSeg::Key("volumes".into()), PathSeg::Index(i)]].concat();
            return Err((at, "a volume needs a source (emptyDir, configMap, secret, ...)".into()));
        }
    }
    Ok(())
}

/// Validates the `containerDefaults` section: a partial container.
pub(crate) fn container_defaults(value: &J) -> Result<(), Problem> {
    let path = vec![PathSeg::Key("containerDefaults".into())];
    let mut with_name = value.clone();
    match &mut with_name {
        J::Object(members) if members.contains_key("name") => {
            Err((path, "`containerDefaults` applies to every container and cannot set `name`".into()))
        }
        J::Object(members) => {
            members.insert("name".into(), J::String("defaults".into()));
            typed::<Container>(&with_name, path)
        }
        _ => Err((path, "`containerDefaults` must be a mapping (a partial container)".into())),
    }
}

/// Deserialises `value` as `T`, reporting the path of a type error, then serialises it back: a key that does
/// not survive the round trip is a field `T` does not have (k8s-openapi ignores unknown fields on its own).
fn typed<T: DeserializeOwned + Serialize>(value: &J, base: Vec<PathSeg>) -> Result<(), Problem> {
    let typed: T = serde_path_to_error::deserialize(value).map_err(|e| {
        let mut path = base.clone();
        for seg in e.path().iter() {
            match seg {
                serde_path_to_error::Segment::Seq { index } => path.push(PathSeg::Index(*index)),
                serde_path_to_error::Segment::Map { key } => path.push(PathSeg::Key(key.clone())),
                _ => {}
            }
        }
        (path, e.into_inner().to_string())
    })?;
    let round_trip = serde_json::to_value(&typed).expect("k8s-openapi types always serialise");
    let mut path = base;
    match first_unknown_field(value, &round_trip, &mut path) {
        Some(field) => Err((path, format!("unknown field `{field}`"))),
        None => Ok(()),
    }
}

fn first_unknown_field(original: &J, round_trip: &J, path: &mut Vec<PathSeg>) -> Option<String> {
    match (original, round_trip) {
        (J::Object(o), J::Object(r)) => {
            for (key, value) in o {
                if value.is_null() {
                    continue;
                }
                let Some(back) = r.get(key) else {
                    return Some(key.clone());
                };
                path.push(PathSeg::Key(key.clone()));
                if let Some(found) = first_unknown_field(value, back, path) {
                    return Some(found);
                }
                path.pop();
            }
            None
        }
        (J::Object(o), _) => o.keys().next().cloned(),
        (J::Array(o), J::Array(r)) => {
            for (i, (value, back)) in o.iter().zip(r).enumerate() {
                path.push(PathSeg::Index(i));
                if let Some(found) = first_unknown_field(value, back, path) {
                    return Some(found);
                }
                path.pop();
            }
            None
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::yaml::display_path;
    use serde_json::json;

    fn pod_err(v: J) -> (String, String) {
        let (path, reason) = pod(&v).unwrap_err();
        (display_path(&path), reason)
    }

    #[test]
    fn accepts_a_realistic_partial_pod() {
        pod(&json!({"metadata": {"labels": {"a": "b"}}, "spec": {
            "initContainers": [{"name": "i", "image": "x", "restartPolicy": "Always"}],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "securityContext": {"runAsNonRoot": true}}}))
        .unwrap();
    }

    #[test]
    fn names_unknown_fields_with_their_path() {
        let (path, reason) =
            pod_err(json!({"spec": {"containers": [{"name": "p", "image": "x", "imagePullPolcy": "Always"}]}}));
        assert_eq!(path, "pod.spec.containers[0]");
        assert_eq!(reason, "unknown field `imagePullPolcy`");
    }

    #[test]
    fn names_type_errors_with_their_path() {
        let (path, reason) = pod_err(
            json!({"spec": {"containers": [{"name": "p", "image": "x", "ports": [{"containerPort": "http"}]}]}}),
        );
        assert_eq!(path, "pod.spec.containers[0].ports[0].containerPort");
        assert!(reason.contains("invalid type"), "{reason}");
    }

    #[test]
    fn refuses_containers_without_image_and_volumes_without_source() {
        assert_eq!(pod_err(json!({"spec": {"containers": [{"name": "p"}]}})).1, "a container needs an `image`");
        assert!(pod_err(json!({"spec": {"volumes": [{"name": "v"}]}})).1.contains("needs a source"));
    }

    #[test]
    fn refuses_metadata_other_than_labels_and_annotations() {
        assert!(pod_err(json!({"metadata": {"name": "x"}})).1.contains("cannot be injected"));
        assert!(pod_err(json!({"status": {}})).1.contains("cannot be injected"));
    }

    #[test]
    fn container_defaults_are_a_partial_container() {
        container_defaults(&json!({"resources": {"requests": {"cpu": "10m"}}})).unwrap();
        assert!(container_defaults(&json!({"name": "x"})).is_err());
        assert!(container_defaults(&json!({"resourcez": {}})).unwrap_err().1.contains("resourcez"));
    }
}
