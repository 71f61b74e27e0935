//! A pod's owning workload: the object a person rolls or recreates, found through owner references. A pod's
//! controller is its ReplicaSet, StatefulSet, DaemonSet, Job or ReplicationController; a ReplicaSet is itself
//! controlled by a Deployment (most of the time) and a Job by a CronJob (sometimes), so those two take one more
//! step, which the caller fetches (`status::cluster` caches it per namespace). Pure: no API calls here.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde::Serialize;

pub use sidecar_injector_core::workload::Kind;

/// The workload a pod belongs to: what the report groups pods by and `--restart` rolls.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Workload {
    /// Its kind.
    pub kind: Kind,
    /// Its name (a bare pod's own name).
    pub name: String,
}

impl Workload {
    /// The workload that `reference` names, one step up.
    pub fn of(reference: &OwnerReference) -> Workload {
        Workload { kind: Kind::of(&reference.api_version, &reference.kind), name: reference.name.clone() }
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// The owner reference of the object's controller: the one marked `controller: true`, else the first (objects
/// made by hand may leave the mark out).
pub fn controller(references: &[OwnerReference]) -> Option<&OwnerReference> {
    references.iter().find(|r| r.controller == Some(true)).or_else(|| references.first())
}

/// The workload of a pod named `pod` whose controller is `controller`; `parent` is that controller's own
/// controller, when it is a ReplicaSet or a Job (see [`Kind::has_parent`]) and has one.
pub fn workload(pod: &str, controller: Option<&OwnerReference>, parent: Option<&OwnerReference>) -> Workload {
    let Some(controller) = controller else { return Workload { kind: Kind::Pod, name: pod.to_owned() } };
    let direct = Workload::of(controller);
    match parent {
        Some(parent) if direct.kind.has_parent() => Workload::of(parent),
        _ => direct,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(api_version: &str, kind: &str, name: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller,
            block_owner_deletion: None,
        }
    }

    #[test]
    fn a_deployments_pod_belongs_to_the_deployment() {
        let rs = owner("apps/v1", "ReplicaSet", "web-5d4f", Some(true));
        let deployment = owner("apps/v1", "Deployment", "web", Some(true));
        assert_eq!(
            workload("web-5d4f-x", Some(&rs), Some(&deployment)),
            Workload { kind: Kind::Deployment, name: "web".into() }
        );
        // A ReplicaSet of its own (or whose Deployment is gone).
        assert_eq!(
            workload("web-5d4f-x", Some(&rs), None),
            Workload { kind: Kind::ReplicaSet, name: "web-5d4f".into() }
        );
        // A ReplicaSet under another controller (an Argo Rollout) belongs to it, and is not ours to restart.
        let rollout = owner("argoproj.io/v1alpha1", "Rollout", "web", Some(true));
        let w = workload("web-5d4f-x", Some(&rs), Some(&rollout));
        assert_eq!((w.kind.as_str(), w.name.as_str(), w.kind.restartable()), ("Rollout.argoproj.io", "web", false));
    }

    #[test]
    fn jobs_cronjobs_and_the_rest() {
        let job = owner("batch/v1", "Job", "backup-2900", Some(true));
        let cron = owner("batch/v1", "CronJob", "backup", Some(true));
        assert_eq!(workload("p", Some(&job), Some(&cron)).to_string(), "CronJob/backup");
        assert_eq!(workload("p", Some(&job), None).to_string(), "Job/backup-2900");
        for (api, kind) in [("apps/v1", "StatefulSet"), ("apps/v1", "DaemonSet"), ("v1", "ReplicationController")] {
            let w = workload("p", Some(&owner(api, kind, "x", Some(true))), None);
            assert_eq!(w.to_string(), format!("{kind}/x"));
            assert_eq!(w.kind.restartable(), kind != "ReplicationController", "{kind}");
        }
        // A StatefulSet's parent is not looked at, even if one is given.
        let sts = owner("apps/v1", "StatefulSet", "db", Some(true));
        assert_eq!(workload("p", Some(&sts), Some(&cron)).to_string(), "StatefulSet/db");
        let bare = workload("debug", None, None);
        assert_eq!((bare.to_string(), bare.kind.restartable()), ("Pod/debug".to_owned(), false));
    }

    #[test]
    fn the_controller_reference_wins_over_order() {
        let other = owner("v1", "ConfigMap", "c", None);
        let rs = owner("apps/v1", "ReplicaSet", "r", Some(true));
        assert_eq!(controller(&[other.clone(), rs.clone()]), Some(&rs));
        assert_eq!(controller(std::slice::from_ref(&other)), Some(&other));
        assert_eq!(controller(&[]), None);
    }
}
