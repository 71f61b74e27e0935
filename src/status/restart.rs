//! `status --restart`: which workloads to roll so that their pods are created again, and injected with the
//! current templates; and the patch that rolls one, the very one `kubectl rollout restart` sends.
//!
//! Only Deployments, StatefulSets and DaemonSets roll on a pod template change. Anything else with drifting pods
//! (a bare pod, a Job or CronJob, a ReplicaSet or ReplicationController of its own, another controller's kind) is
//! reported for a person to recreate: deleting a Job's pod can lose its work, and a bare pod is not recreated.
//!
//! [`Status`] is what `status` prints and exits by: the report, and what `--restart` did with it.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Value, json};

use super::owners::Workload;
use super::report::Report;

/// The pod template annotation `kubectl rollout restart` sets to the current time.
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// How many workloads one `--restart` run rolls at most (`--max-restarts`). Each roll replaces all of a
/// workload's pods, and every new pod pulls images and warms up at once: a handful at a time keeps that load
/// bounded; the next run goes on with the rest.
pub const DEFAULT_MAX_RESTARTS: u32 = 5;

/// The field manager of our patches, as the API server records it in `managedFields`.
pub const FIELD_MANAGER: &str = "sidecar-injector-status";

/// A workload with drifting pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// Its namespace.
    pub namespace: String,
    /// The workload (`kind`, `name`).
    #[serde(flatten)]
    pub workload: Workload,
    /// How many of its pods drift.
    pub drifting_pods: usize,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{} ({} pod(s))", self.workload.kind, self.namespace, self.workload.name, self.drifting_pods)
    }
}

/// What `--restart` is to do, before it does it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Workloads to roll now, at most `--max-restarts`.
    pub restart: Vec<Target>,
    /// Restartable workloads beyond the limit, left for the next run.
    pub deferred: Vec<Target>,
    /// Workloads with drift that no rollout fixes: recreate their pods by hand.
    pub not_restartable: Vec<Target>,
}

/// The plan for `report`: every workload with a drifting pod, in report order (namespace, kind, name); the
/// first `max` restartable ones to restart.
pub fn plan(report: &Report, max: usize) -> Plan {
    let mut plan = Plan::default();
    for namespace in &report.namespaces {
        for workload in namespace.workloads.iter().filter(|w| w.counts.drift() > 0) {
            let target = Target {
                namespace: namespace.name.clone(),
                workload: workload.workload.clone(),
                drifting_pods: workload.counts.drift(),
            };
            if !target.workload.kind.restartable() {
                plan.not_restartable.push(target);
            } else if plan.restart.len() < max {
                plan.restart.push(target);
            } else {
                plan.deferred.push(target);
            }
        }
    }
    plan
}

/// The strategic merge patch that rolls a workload: its pod template's [`RESTARTED_AT`] set to `now` (RFC 3339).
pub fn patch(now: &str) -> Value {
    json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}}})
}

/// What a `--restart` run did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// `--dry-run`: nothing was changed; `restarted` is what would have been.
    pub dry_run: bool,
    /// The [`RESTARTED_AT`] value written.
    pub restarted_at: String,
    /// The `--max-restarts` limit.
    pub max_restarts: usize,
    /// Workloads rolled (or, dry run, to roll).
    pub restarted: Vec<Target>,
    /// Workloads whose restart the API server refused, or that could not be rolled (a paused Deployment).
    pub failed: Vec<Failed>,
    /// Workloads over the limit, left for the next run.
    pub deferred: Vec<Target>,
    /// Workloads to recreate by hand.
    pub not_restartable: Vec<Target>,
}

/// A restart that did not happen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failed {
    /// The workload.
    #[serde(flatten)]
    pub target: Target,
    /// Why.
    pub reason: String,
}

impl Outcome {
    /// Is drift left that this run did not restart?
    pub fn left_behind(&self) -> bool {
        !(self.failed.is_empty() && self.deferred.is_empty() && self.not_restartable.is_empty())
    }

    /// The outcome for people, one line per list.
    pub fn text(&self) -> String {
        let mut out = String::new();
        match (self.dry_run, self.restarted.is_empty()) {
            (_, true) => out.push_str("restarted nothing\n"),
            (true, false) => {
                let _ = writeln!(out, "dry run, nothing changed; would restart: {}", list(&self.restarted));
            }
            (false, false) => {
                let _ = writeln!(out, "restarted ({RESTARTED_AT}={}): {}", self.restarted_at, list(&self.restarted));
            }
        }
        for failed in &self.failed {
            let _ = writeln!(out, "not restarted: {}: {}", failed.target, failed.reason);
        }
        if !self.deferred.is_empty() {
            let _ =
                writeln!(out, "left for the next run (--max-restarts {}): {}", self.max_restarts, list(&self.deferred));
        }
        if !self.not_restartable.is_empty() {
            let _ = writeln!(out, "not restartable, recreate by hand: {}", list(&self.not_restartable));
        }
        out
    }
}

/// `Deployment shop/web (2 pods), Pod shop/debug (1 pod)`.
pub(crate) fn list(targets: &[Target]) -> String {
    targets.iter().map(Target::to_string).collect::<Vec<_>>().join(", ")
}

/// What `status` prints and exits by: the report, and what `--restart` did (or, with `--dry-run`, would do).
#[derive(Debug, Serialize)]
pub struct Status<'a> {
    /// The survey.
    #[serde(flatten)]
    pub report: &'a Report,
    /// What `--restart` did, when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart: Option<&'a Outcome>,
    /// What `--upgrade` did, when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<&'a super::upgrade::Outcome>,
}

impl Status<'_> {
    /// Should the command exit 1? When a pod names a template its revision does not have (no restart mends
    /// that); without `--restart`, when any pod drifts; with it, when drift is left that this run did not restart
    /// (not restartable, over `--max-restarts`, or a restart that failed).
    pub fn failed(&self) -> bool {
        self.report.summary.counts.unknown_template > 0
            || match (self.restart, self.upgrade) {
                (Some(restart), _) => restart.left_behind(),
                // Pods kept by --partition or deferred by --max-upgrades are left on purpose.
                (None, Some(upgrade)) => upgrade.failed() || upgrade.restarts(),
                (None, None) => self.report.summary.drift,
            }
    }

    /// As JSON, for `-o json`: the report, with `restart` when there was one.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serialises: its maps have string keys")
    }

    /// As a table, for people: the report's, then what `--restart` did or would do.
    pub fn table(&self) -> String {
        let mut out = self.report.table();
        if let Some(upgrade) = self.upgrade {
            out.push_str(&upgrade.text());
            return out;
        }
        match self.restart {
            Some(restart) => out.push_str(&restart.text()),
            None if self.report.summary.drift => {
                let plan = plan(self.report, usize::MAX);
                if !plan.restart.is_empty() {
                    let _ = writeln!(out, "`status --restart` would restart: {}", list(&plan.restart));
                }
                if !plan.not_restartable.is_empty() {
                    let _ = writeln!(out, "not restartable, recreate by hand: {}", list(&plan.not_restartable));
                }
            }
            None => {}
        }
        out
    }
}
