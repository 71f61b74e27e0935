//! Does this template hold as the Kubernetes API types (`k8s-openapi`)? Its `pod` and `containerDefaults` decoded,
//! so that a typo in a field name, a string where a number belongs or a container without an image is refused
//! when the template loads, with the fields a template may inject at all. Whether the pods it makes are valid is
//! the API server's rules' question ([`crate::validation`], asked by [`crate::template_set`]'s proof): a volume
//! without a source, say, is an `emptyDir` there, and so here.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value as J;

use super::Problem;
use super::yaml::PathSeg;
use crate::pod_api::releases::{self, Place};
use crate::pod_api::spec::{CONTAINERS, INIT_CONTAINERS};
use crate::pod_api::{decode, plugins, spec};
use crate::validation::KubeVersion;

/// Every problem of a section. `fatal` unless they are all unknown fields: the API types drop those, so what
/// remains can still be judged by the API server's rules, and their problems listed too.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub problems: Vec<Problem>,
    pub fatal: bool,
}

impl Findings {
    fn fatal(&mut self, path: Vec<PathSeg>, reason: impl Into<String>) {
        self.problems.push(Problem::new(path, reason));
        self.fatal = true;
    }
}

/// Validates the rendered `pod` section.
pub(crate) fn pod(pod: &J) -> Findings {
    let mut found = Findings::default();
    let root = vec![PathSeg::Key("pod".into())];
    let J::Object(members) = pod else {
        found.fatal(root, "`pod` must be a mapping with `metadata` and/or `spec`");
        return found;
    };
    for (key, value) in members {
        let mut path = root.clone();
        path.push(PathSeg::Key(key.clone()));
        match key.as_str() {
            "metadata" => metadata(value, path, &mut found),
            "spec" => spec(value, path, &mut found),
            _ => found.fatal(path, format!("`pod.{key}` cannot be injected (only `metadata` and `spec`)")),
        }
    }
    found
}

fn metadata(value: &J, path: Vec<PathSeg>, found: &mut Findings) {
    if let J::Object(members) = value {
        for key in members.keys().filter(|k| *k != "labels" && *k != "annotations") {
            let mut at = path.clone();
            at.push(PathSeg::Key(key.clone()));
            found.fatal(at, format!("`metadata.{key}` cannot be injected (only `labels` and `annotations`)"));
        }
    }
    typed::<ObjectMeta>(value, path, found);
}

fn spec(value: &J, path: Vec<PathSeg>, found: &mut Findings) {
    // A template that injects only volumes or defaults may leave `containers` out: it decodes.
    typed::<PodSpec>(value, path.clone(), found);
    for list in [CONTAINERS, INIT_CONTAINERS] {
        for (i, c) in value.get(list).and_then(J::as_array).into_iter().flatten().enumerate() {
            let at = [path.clone(), vec![PathSeg::Key(list.into()), PathSeg::Index(i)]].concat();
            if c.get("image").and_then(J::as_str).is_none_or(str::is_empty) {
                found.fatal(at, "a container needs an `image`");
            }
        }
    }
}

/// Fields an admission plugin owns ([`plugins::PLUGIN_FIELDS`]), in the rendered `pod`: each refused at its path,
/// naming the plugin, rather than injected into a pod the plugin then refuses.
pub(crate) fn owned_by_plugins(pod: &J) -> Findings {
    let mut found = Findings::default();
    for field in plugins::PLUGIN_FIELDS {
        let mut paths = Vec::new();
        let segs: Vec<&str> = field.path.split('.').collect();
        occurrences(pod, &segs, vec![PathSeg::Key("pod".into())], &mut paths);
        for path in paths {
            let reason = format!(
                "`{}` belongs to the {} admission plugin (on by default), which {}; a template cannot set it",
                field.path, field.plugin, field.why
            );
            found.fatal(path, reason);
        }
    }
    found
}

/// Fields that the API server of `version` drops (behind a feature gate off by default there,
/// [`releases::GATED_FIELDS`]), in the rendered `pod` and `containerDefaults`: each refused at its path, naming the
/// release that keeps it, rather than injected into nothing (and then demanded of every pod by `/validate`).
pub(crate) fn dropped_by_release(pod: &J, container_defaults: Option<&J>, version: KubeVersion) -> Findings {
    let mut found = Findings::default();
    for field in releases::GATED_FIELDS.iter().filter(|f| !f.kept_at(version.minor)) {
        let mut places: Vec<(Vec<PathSeg>, &J)> = Vec::new();
        match field.place {
            Place::Pod => places.push((vec![PathSeg::Key("pod".into())], pod)),
            Place::Container => {
                for list in spec::CONTAINER_LISTS {
                    let containers = pod.get("spec").and_then(|s| s.get(list)).and_then(J::as_array);
                    for (i, container) in containers.into_iter().flatten().enumerate() {
                        let at = ["pod", "spec", list].map(|k| PathSeg::Key(k.into())).into_iter();
                        places.push((at.chain([PathSeg::Index(i)]).collect(), container));
                    }
                }
                if let Some(defaults) = container_defaults {
                    places.push((vec![PathSeg::Key("containerDefaults".into())], defaults));
                }
            }
        }
        let reason = match field.kept_from {
            Some(from) => format!(
                "the API server keeps `{}` from Kubernetes 1.{from} (feature {}, on by default from then); at \
                 --kubernetes-version {version} it drops it",
                field.path, field.feature
            ),
            None => format!(
                "the API server drops `{}` (feature {}, off by default up to Kubernetes {})",
                field.path,
                field.feature,
                KubeVersion::DEFAULT
            ),
        };
        for (at, value) in places {
            let mut paths = Vec::new();
            occurrences(value, &field.path.split('.').collect::<Vec<_>>(), at, &mut paths);
            for path in paths {
                found.fatal(path, reason.clone());
            }
        }
    }
    found
}

/// The paths under `at` where `value` has the field `segs` names (`name[]`: each item of the list `name`; `*`:
/// every key).
fn occurrences(value: &J, segs: &[&str], at: Vec<PathSeg>, out: &mut Vec<Vec<PathSeg>>) {
    let Some((first, rest)) = segs.split_first() else {
        out.push(at);
        return;
    };
    match first.strip_suffix("[]") {
        Some(list) => {
            for (i, item) in value.get(list).and_then(J::as_array).into_iter().flatten().enumerate() {
                let path = [at.clone(), vec![PathSeg::Key(list.into()), PathSeg::Index(i)]].concat();
                occurrences(item, rest, path, out);
            }
        }
        None => {
            let members = value.as_object().into_iter().flatten().filter(|(key, _)| *first == "*" || key == first);
            for (key, member) in members {
                let path = [at.clone(), vec![PathSeg::Key(key.clone())]].concat();
                occurrences(member, rest, path, out);
            }
        }
    }
}

/// Validates the `containerDefaults` section: a partial container.
pub(crate) fn container_defaults(value: &J) -> Findings {
    let mut found = Findings::default();
    let path = vec![PathSeg::Key("containerDefaults".into())];
    let mut with_name = value.clone();
    match &mut with_name {
        J::Object(members) if members.contains_key("name") => {
            found.fatal(path, "`containerDefaults` applies to every container and cannot set `name`");
        }
        J::Object(members) => {
            members.insert("name".into(), J::String("defaults".into()));
            typed::<Container>(&with_name, path, &mut found);
        }
        _ => found.fatal(path, "`containerDefaults` must be a mapping (a partial container)"),
    }
    found
}

/// Deserialises `value` as `T`, reporting the path of a type error, then serialises it back: a key that does
/// not survive the round trip is a field `T` does not have (k8s-openapi ignores unknown fields on its own), each
/// reported at its own path with the closest field `T` has there.
fn typed<T: DeserializeOwned + Serialize>(value: &J, base: Vec<PathSeg>, found: &mut Findings) {
    let typed: T = match decode::decode(value) {
        Ok(typed) => typed,
        Err(e) => {
            let steps = e.path.into_iter().map(|step| match step {
                decode::Step::Index(index) => PathSeg::Index(index),
                decode::Step::Key(key) => PathSeg::Key(key),
            });
            found.fatal(base.iter().cloned().chain(steps).collect(), e.message);
            return;
        }
    };
    let round_trip = serde_json::to_value(&typed).expect("k8s-openapi types always serialise");
    let mut unknown = Vec::new();
    unknown_fields(value, &round_trip, &mut base.clone(), &mut unknown);
    if unknown.is_empty() {
        return;
    }
    let known = super::known_fields::known_fields::<T>(value, &base);
    for path in unknown {
        let Some((PathSeg::Key(field), parent)) = path.split_last() else { continue };
        let fields = known.iter().find(|(at, _)| at == parent).map_or(&[][..], |(_, fields)| *fields);
        let reason = match crate::suggest::closest(field, fields.iter().copied()) {
            Some(close) => format!("unknown field `{field}` (did you mean `{close}`?)"),
            None => format!("unknown field `{field}`"),
        };
        found.problems.push(Problem::new(path.clone(), reason));
    }
}

/// The paths of the keys of `original` that `round_trip` lacks, in order.
fn unknown_fields(original: &J, round_trip: &J, path: &mut Vec<PathSeg>, out: &mut Vec<Vec<PathSeg>>) {
    match (original, round_trip) {
        (J::Object(o), J::Object(r)) => {
            for (key, value) in o {
                if value.is_null() {
                    continue;
                }
                path.push(PathSeg::Key(key.clone()));
                match r.get(key) {
                    Some(back) => unknown_fields(value, back, path, out),
                    None => out.push(path.clone()),
                }
                path.pop();
            }
        }
        (J::Object(o), _) => {
            for key in o.keys() {
                out.push([path.as_slice(), &[PathSeg::Key(key.clone())]].concat());
            }
        }
        (J::Array(o), J::Array(r)) => {
            for (i, (value, back)) in o.iter().zip(r).enumerate() {
                path.push(PathSeg::Index(i));
                unknown_fields(value, back, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::yaml::display_path;
    use serde_json::json;

    fn pod_err(v: J) -> (String, String) {
        let Problem { path, rule: reason } = pod(&v).problems.into_iter().next().expect("a problem");
        (display_path(&path), reason)
    }

    #[test]
    fn accepts_a_realistic_partial_pod() {
        let found = pod(&json!({"metadata": {"labels": {"a": "b"}}, "spec": {
            "initContainers": [{"name": "i", "image": "x", "restartPolicy": "Always"}],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "securityContext": {"runAsNonRoot": true}}}));
        assert!(found.problems.is_empty() && !found.fatal, "{found:?}");
    }

    #[test]
    fn names_every_unknown_field_at_its_own_path_with_the_closest_known_one() {
        let found = pod(&json!({"spec": {
            "containers": [{"name": "p", "image": "x", "imagePullPolcy": "Always",
                            "resources": {"limts": {"cpu": "1"}}, "zzzzzz": 1}],
            "securityContext": {"runAsNonRot": true}}}));
        let listed: Vec<(String, &str)> =
            found.problems.iter().map(|p| (display_path(&p.path), p.rule.as_str())).collect();
        assert_eq!(
            listed,
            [
                (
                    "pod.spec.containers[0].imagePullPolcy".into(),
                    "unknown field `imagePullPolcy` (did you mean `imagePullPolicy`?)"
                ),
                ("pod.spec.containers[0].resources.limts".into(), "unknown field `limts` (did you mean `limits`?)"),
                ("pod.spec.containers[0].zzzzzz".into(), "unknown field `zzzzzz`"),
                (
                    "pod.spec.securityContext.runAsNonRot".into(),
                    "unknown field `runAsNonRot` (did you mean `runAsNonRoot`?)"
                ),
            ]
        );
        assert!(!found.fatal, "unknown fields leave the rest to judge");
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
    fn refuses_containers_without_image_and_accepts_volumes_without_source() {
        assert_eq!(pod_err(json!({"spec": {"containers": [{"name": "p"}]}})).1, "a container needs an `image`");
        let both = pod(&json!({"spec": {"containers": [{"name": "p"}], "initContainers": [{"name": "i"}]}}));
        assert_eq!(both.problems.len(), 2, "every problem, not the first: {both:?}");
        assert!(both.fatal);
        // A volume without a source is the API server's `emptyDir`: not ours to refuse.
        assert!(pod(&json!({"spec": {"volumes": [{"name": "v"}]}})).problems.is_empty());
    }

    #[test]
    fn refuses_metadata_other_than_labels_and_annotations() {
        assert!(pod_err(json!({"metadata": {"name": "x"}})).1.contains("cannot be injected"));
        assert!(pod_err(json!({"status": {}})).1.contains("cannot be injected"));
    }

    #[test]
    fn container_defaults_are_a_partial_container() {
        assert!(container_defaults(&json!({"resources": {"requests": {"cpu": "10m"}}})).problems.is_empty());
        assert!(container_defaults(&json!({"name": "x"})).fatal);
        let typo = container_defaults(&json!({"resourcez": {}}));
        assert_eq!(typo.problems[0].rule, "unknown field `resourcez` (did you mean `resources`?)");
    }
}
