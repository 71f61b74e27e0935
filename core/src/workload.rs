//! The workload kinds of the Kubernetes API, the one table of their facts: which object (of which API group) is
//! which workload, where its pod template is, and whose pods a Job owns. Read by `inject`, `uninject` and the
//! apply-time preview ([`crate::offline`], [`crate::preview`]), by `status` (a pod's owning workload), and by the
//! engine (a pod owned by a Job runs to completion).

use serde::Serialize;

/// The kind of a workload (or of a pod's owner).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `apps/v1` Deployment.
    Deployment,
    /// `apps/v1` StatefulSet.
    StatefulSet,
    /// `apps/v1` DaemonSet.
    DaemonSet,
    /// `apps/v1` ReplicaSet.
    ReplicaSet,
    /// `v1` ReplicationController.
    ReplicationController,
    /// `batch/v1` Job.
    Job,
    /// `batch/v1` CronJob.
    CronJob,
    /// `v1` Pod.
    Pod,
    /// Any other kind (an Argo Rollout, an operator's own kind, a CRD's `Job`): `Kind.group`, or `Kind` in the
    /// core group. Not ours to inject or roll.
    Other(String),
}

impl Kind {
    /// The kind of an object of `api_version` (`apps/v1`, `v1`) and `kind`.
    pub fn of(api_version: &str, kind: &str) -> Kind {
        Self::of_group(group_of(api_version), kind)
    }

    /// The kind of an object of API group `group` (`""` for the core group) and `kind`.
    pub fn of_group(group: &str, kind: &str) -> Kind {
        match Self::known(group, kind) {
            Some(known) => known,
            None if group.is_empty() => Kind::Other(kind.to_owned()),
            None => Kind::Other(format!("{kind}.{group}")),
        }
    }

    /// The workload kinds we know, without allocating for the others (the engine asks on the request path).
    /// `extensions` is where Deployments, DaemonSets and ReplicaSets lived before `apps` (manifests still say so).
    fn known(group: &str, kind: &str) -> Option<Kind> {
        Some(match (group, kind) {
            ("apps" | "extensions", "Deployment") => Kind::Deployment,
            ("apps", "StatefulSet") => Kind::StatefulSet,
            ("apps" | "extensions", "DaemonSet") => Kind::DaemonSet,
            ("apps" | "extensions", "ReplicaSet") => Kind::ReplicaSet,
            ("", "ReplicationController") => Kind::ReplicationController,
            ("batch", "Job") => Kind::Job,
            ("batch", "CronJob") => Kind::CronJob,
            ("", "Pod") => Kind::Pod,
            _ => return None,
        })
    }

    /// Is an owner reference of `api_version` and `kind` a Job (`batch`, not another group's kind `Job`)?
    pub fn is_job(api_version: &str, kind: &str) -> bool {
        Self::known(group_of(api_version), kind) == Some(Kind::Job)
    }

    /// The name people and kubectl use: `Deployment`, `Rollout.argoproj.io`.
    pub fn as_str(&self) -> &str {
        match self {
            Kind::Deployment => "Deployment",
            Kind::StatefulSet => "StatefulSet",
            Kind::DaemonSet => "DaemonSet",
            Kind::ReplicaSet => "ReplicaSet",
            Kind::ReplicationController => "ReplicationController",
            Kind::Job => "Job",
            Kind::CronJob => "CronJob",
            Kind::Pod => "Pod",
            Kind::Other(kind) => kind,
        }
    }

    /// Where the pod template of an object of this kind is, as a JSON pointer: `""` for a Pod itself, `None`
    /// for kinds without one.
    pub fn pod_template_path(&self) -> Option<&'static str> {
        match self {
            Kind::Pod => Some(""),
            Kind::Deployment
            | Kind::StatefulSet
            | Kind::DaemonSet
            | Kind::ReplicaSet
            | Kind::ReplicationController
            | Kind::Job => Some("/spec/template"),
            Kind::CronJob => Some("/spec/jobTemplate/spec/template"),
            Kind::Other(_) => None,
        }
    }

    /// Are the pods made from this kind's pod template owned by a Job (a Job's own, a CronJob's through its
    /// Jobs), which templates read and which run to completion?
    pub fn makes_a_jobs_pods(&self) -> bool {
        matches!(self, Kind::Job | Kind::CronJob)
    }

    /// Can `status --restart` roll it, as `kubectl rollout restart` does (a new pod template annotation)?
    pub fn restartable(&self) -> bool {
        matches!(self, Kind::Deployment | Kind::StatefulSet | Kind::DaemonSet)
    }

    /// Is it usually controlled by one more workload up, which is the one to name: a ReplicaSet's Deployment,
    /// a Job's CronJob?
    pub fn has_parent(&self) -> bool {
        matches!(self, Kind::ReplicaSet | Kind::Job)
    }
}

/// The API group of an `apiVersion`: `apps` of `apps/v1`, `""` of `v1`.
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_told_apart_by_group_and_kind() {
        assert_eq!(Kind::of("apps/v1", "Deployment"), Kind::Deployment);
        assert_eq!(Kind::of("extensions/v1beta1", "Deployment"), Kind::Deployment, "old manifests");
        assert_eq!(Kind::of("v1", "Node"), Kind::Other("Node".into()));
        assert_eq!(Kind::of("example.com/v1", "Deployment"), Kind::Other("Deployment.example.com".into()));
        assert!(Kind::is_job("batch/v1", "Job") && Kind::is_job("batch/v1beta1", "Job"));
        assert!(!Kind::is_job("batch.volcano.sh/v1alpha1", "Job") && !Kind::is_job("batch/v1", "CronJob"));
    }

    #[test]
    fn each_workload_has_its_pod_template_where_the_api_puts_it() {
        assert_eq!(Kind::of("v1", "Pod").pod_template_path(), Some(""));
        for (api_version, kind) in [("apps/v1", "StatefulSet"), ("v1", "ReplicationController"), ("batch/v1", "Job")] {
            assert_eq!(Kind::of(api_version, kind).pod_template_path(), Some("/spec/template"), "{kind}");
        }
        assert_eq!(Kind::CronJob.pod_template_path(), Some("/spec/jobTemplate/spec/template"));
        assert_eq!(Kind::of("batch.volcano.sh/v1alpha1", "Job").pod_template_path(), None, "a CRD's Job");
        assert!(Kind::Job.makes_a_jobs_pods() && Kind::CronJob.makes_a_jobs_pods());
        assert!(!Kind::Deployment.makes_a_jobs_pods());
    }
}
