//! The report of `status`: pods grouped by namespace and workload, counted by class, as a table for people or
//! JSON for scripts (`-o json`), both made from the one [`Report`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::owners::Workload;
use super::{Class, Enrollment, Revision};

/// What `status` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The revisions the pods were judged against, the default one first.
    pub revisions: Vec<RevisionInfo>,
    /// The cluster's revision tags, by name, each with the revision it points to.
    pub tags: BTreeMap<String, String>,
    /// The namespaces looked at, by name.
    pub namespaces: Vec<NamespaceReport>,
    /// The counts over every namespace.
    pub summary: Summary,
}

/// A revision's templates, as the report names them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionInfo {
    /// Its name.
    pub name: String,
    /// Where its templates were read: a directory, a file, `configmap/NS/NAME`, the built-in template.
    pub source: String,
    /// The hash of its template set.
    pub set: String,
    /// The template of pods that name none.
    pub default_template: String,
    /// Each template's current version, by name.
    pub templates: BTreeMap<String, String>,
}

/// One namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceReport {
    /// Its name.
    pub name: String,
    /// `opted-in`, `unknown-revision`, `not-opted-in` or `excluded` (see [`Enrollment`]).
    pub opt_in: &'static str,
    /// The revision its labels name, if any (through a tag, the tag's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The revision tag its label names, if it names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Its pods' counts.
    pub counts: Counts,
    /// Its workloads, by kind and name.
    pub workloads: Vec<WorkloadReport>,
}

/// One workload's pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadReport {
    /// The workload (`kind`, `name`).
    #[serde(flatten)]
    pub workload: Workload,
    /// Its pods, counted by class.
    pub counts: Counts,
    /// Its pods, by name.
    pub pods: Vec<PodReport>,
}

/// One pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    /// The pod's name.
    pub name: String,
    /// Its class, with what the class says (`class`, `template`, `version`, ...).
    #[serde(flatten)]
    pub class: Class,
}

/// Pods counted by class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Every pod.
    pub pods: usize,
    /// [`Class::Current`].
    pub current: usize,
    /// [`Class::Stale`].
    pub stale: usize,
    /// [`Class::Missing`].
    pub missing: usize,
    /// [`Class::Incomplete`].
    pub incomplete: usize,
    /// [`Class::OtherRevision`].
    pub other_revision: usize,
    /// [`Class::UnknownTemplate`].
    pub unknown_template: usize,
    /// [`Class::Skipped`].
    pub skipped: usize,
}

impl Counts {
    fn add(&mut self, class: &Class) {
        self.pods += 1;
        *match class {
            Class::Current { .. } => &mut self.current,
            Class::Stale { .. } => &mut self.stale,
            Class::Missing { .. } => &mut self.missing,
            Class::Incomplete { .. } => &mut self.incomplete,
            Class::OtherRevision { .. } => &mut self.other_revision,
            Class::UnknownTemplate { .. } => &mut self.unknown_template,
            Class::Skipped { .. } => &mut self.skipped,
        } += 1;
    }

    fn merge(&mut self, other: &Counts) {
        self.pods += other.pods;
        self.current += other.current;
        self.stale += other.stale;
        self.missing += other.missing;
        self.incomplete += other.incomplete;
        self.other_revision += other.other_revision;
        self.unknown_template += other.unknown_template;
        self.skipped += other.skipped;
    }

    /// The pods that drift: stale, missing, incomplete or of another revision.
    pub fn drift(&self) -> usize {
        self.stale + self.missing + self.incomplete + self.other_revision
    }

    /// The counts in [`Class::NAMES`] order.
    fn by_class(&self) -> [usize; 7] {
        let Counts { pods: _, current, stale, missing, incomplete, other_revision, unknown_template, skipped } = *self;
        [current, stale, missing, incomplete, other_revision, unknown_template, skipped]
    }
}

/// The counts over every namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Namespaces looked at.
    pub namespaces: usize,
    /// Pods counted by class.
    #[serde(flatten)]
    pub counts: Counts,
    /// Workloads with at least one pod that drifts.
    pub workloads_with_drift: usize,
    /// Workloads with at least one pod that names a template its revision does not have.
    pub workloads_with_unknown_template: usize,
    /// Does any pod drift? (`status` exits 1 if so.)
    pub drift: bool,
}

/// The pods of one namespace, classified, with their workloads: what [`Report::new`] groups.
#[derive(Debug, Clone)]
pub struct Surveyed {
    /// The namespace.
    pub namespace: String,
    /// How it is opted in.
    pub enrollment: Enrollment,
    /// Each pod: its workload, its name, its class.
    pub pods: Vec<(Workload, String, Class)>,
}

impl Report {
    /// Groups the surveyed pods by namespace and workload (both sorted by name, pods too) and counts them.
    pub fn new(revisions: &[Revision], tags: BTreeMap<String, String>, surveyed: Vec<Surveyed>) -> Report {
        let mut namespaces: Vec<NamespaceReport> = surveyed.into_iter().map(NamespaceReport::new).collect();
        namespaces.sort_by(|a, b| a.name.cmp(&b.name));
        let mut summary = Summary { namespaces: namespaces.len(), ..Summary::default() };
        for namespace in &namespaces {
            summary.counts.merge(&namespace.counts);
            summary.workloads_with_drift += namespace.workloads.iter().filter(|w| w.counts.drift() > 0).count();
            summary.workloads_with_unknown_template +=
                namespace.workloads.iter().filter(|w| w.counts.unknown_template > 0).count();
        }
        summary.drift = summary.counts.drift() > 0;
        Report { revisions: revisions.iter().map(RevisionInfo::new).collect(), tags, namespaces, summary }
    }

    /// The report as a table, for people: one line per workload with its counts, then, under each workload that
    /// drifts, its drifting pods grouped by what they run; then the totals.
    pub fn table(&self) -> String {
        let mut rows = vec![
            ["NAMESPACE", "REVISION", "WORKLOAD", "PODS"]
                .into_iter()
                .chain(["CURRENT", "STALE", "MISSING", "INCOMPLETE", "OTHER-REV", "UNKNOWN-TMPL", "SKIPPED"])
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        ];
        let mut details = vec![Vec::new()];
        for namespace in &self.namespaces {
            let revision = match (namespace.revision.as_deref(), namespace.opt_in) {
                (Some(rev), "unknown-revision") => format!("{rev}?"),
                (Some(rev), _) if let Some(tag) = &namespace.tag => format!("{rev} (tag {tag})"),
                (Some(rev), _) => rev.to_owned(),
                (None, opt_in) => format!("({opt_in})"),
            };
            for workload in &namespace.workloads {
                let counts = workload.counts;
                let mut row = vec![namespace.name.clone(), revision.clone(), workload.workload.to_string()];
                row.push(counts.pods.to_string());
                row.extend(counts.by_class().iter().map(usize::to_string));
                rows.push(row);
                details.push(drift_lines(workload));
            }
        }
        let widths: Vec<usize> =
            (0..rows[0].len()).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
        let mut out = String::new();
        if rows.len() > 1 {
            for (row, lines) in rows.iter().zip(&details) {
                let cells = row.iter().zip(&widths).enumerate().map(|(c, (cell, width))| {
                    // Names to the left, numbers to the right.
                    if c < 3 { format!("{cell:<width$}") } else { format!("{cell:>width$}") }
                });
                let _ = writeln!(out, "{}", cells.collect::<Vec<_>>().join("  ").trim_end());
                for line in lines {
                    let _ = writeln!(out, "    {line}");
                }
            }
            out.push('\n');
        }
        for namespace in self.namespaces.iter().filter(|n| n.opt_in == "unknown-revision") {
            let rev = namespace.revision.as_deref().unwrap_or_default();
            let _ = writeln!(
                out,
                "namespace {}: labelled for revision {rev}, whose templates were not given (--template-dir \
                 {rev}=DIR or --configmap {rev}=NS/NAME): its pods are not judged",
                namespace.name
            );
        }
        if !self.tags.is_empty() {
            let tags: Vec<String> = self.tags.iter().map(|(tag, revision)| format!("{tag} -> {revision}")).collect();
            let _ = writeln!(out, "revision tags: {}", tags.join(", "));
        }
        let counts = self.summary.counts;
        let by_class = Class::NAMES.iter().zip(counts.by_class()).map(|(name, n)| format!("{n} {name}"));
        let _ = writeln!(
            out,
            "{} pod(s) in {} namespace(s): {}",
            counts.pods,
            self.summary.namespaces,
            by_class.collect::<Vec<_>>().join(", ")
        );
        if counts.unknown_template > 0 {
            let _ = writeln!(
                out,
                "unknown template: {} pod(s) in {} workload(s) name a template their revision does not have ({}): \
                 pods created so are admitted without the sidecar; put the template back (or change what they name)",
                counts.unknown_template,
                self.summary.workloads_with_unknown_template,
                self.unknown_templates().join(", ")
            );
        }
        if !self.summary.drift {
            out.push_str("no drift: every pod runs the sidecar its namespace's templates inject today\n");
        } else {
            let _ = writeln!(
                out,
                "drift: {} pod(s) in {} workload(s) do not run the current sidecar",
                counts.drift(),
                self.summary.workloads_with_drift
            );
        }
        out
    }
}

impl Report {
    /// The templates pods name that their revision does not have, each once, sorted.
    fn unknown_templates(&self) -> Vec<&str> {
        let pods = self.namespaces.iter().flat_map(|n| &n.workloads).flat_map(|w| &w.pods);
        let mut names: Vec<&str> = pods
            .filter_map(|p| match &p.class {
                Class::UnknownTemplate { asks_for, .. } => Some(asks_for.as_str()),
                _ => None,
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// Under a workload: its drifting pods, grouped by what they run (`stale, default 0123 (now a681): web-1, web-2`).
fn drift_lines(workload: &WorkloadReport) -> Vec<String> {
    /// Pod names listed per line, beyond which only the number is given.
    const NAMES_SHOWN: usize = 5;
    let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for pod in workload.pods.iter().filter(|p| p.class.is_drift() || matches!(p.class, Class::UnknownTemplate { .. })) {
        let what = match &pod.class {
            Class::Stale { template, version, current_version } => format!(
                "stale, {template} {version} (now {})",
                current_version.as_deref().unwrap_or("no such template")
            ),
            Class::Missing { template, version } => format!("missing, no sidecar ({template} {version} expected)"),
            Class::Incomplete { template, version, missing } => {
                format!("incomplete, {template} {version} lacks {}", missing.join(", "))
            }
            Class::OtherRevision { revision, template, version } => {
                format!("other revision, injected by {revision} ({template} {version})")
            }
            Class::UnknownTemplate { asks_for, injected } => match injected {
                Some(injected) => format!("unknown template {asks_for:?}, injected with {injected} before"),
                None => format!("unknown template {asks_for:?}, no sidecar"),
            },
            Class::Current { .. } | Class::Skipped { .. } => continue,
        };
        groups.entry(what).or_default().push(&pod.name);
    }
    groups
        .into_iter()
        .map(|(what, names)| {
            let mut shown = names.iter().take(NAMES_SHOWN).copied().collect::<Vec<_>>().join(", ");
            if names.len() > NAMES_SHOWN {
                let _ = write!(shown, " and {} more", names.len() - NAMES_SHOWN);
            }
            format!("{what}: {shown}")
        })
        .collect()
}

impl NamespaceReport {
    fn new(surveyed: Surveyed) -> NamespaceReport {
        let mut workloads: BTreeMap<Workload, WorkloadReport> = BTreeMap::new();
        let mut counts = Counts::default();
        for (workload, name, class) in surveyed.pods {
            counts.add(&class);
            let report = workloads.entry(workload.clone()).or_insert_with(|| WorkloadReport {
                workload,
                counts: Counts::default(),
                pods: Vec::new(),
            });
            report.counts.add(&class);
            report.pods.push(PodReport { name, class });
        }
        let mut workloads: Vec<WorkloadReport> = workloads.into_values().collect();
        for workload in &mut workloads {
            workload.pods.sort_by(|a, b| a.name.cmp(&b.name));
        }
        NamespaceReport {
            name: surveyed.namespace,
            opt_in: surveyed.enrollment.as_str(),
            revision: surveyed.enrollment.revision().map(str::to_owned),
            tag: surveyed.enrollment.tag().map(str::to_owned),
            counts,
            workloads,
        }
    }
}

impl RevisionInfo {
    fn new(revision: &Revision) -> RevisionInfo {
        let set = revision.engine.set();
        RevisionInfo {
            name: revision.name.clone(),
            source: revision.source.clone(),
            set: set.hash().to_owned(),
            default_template: set.default_template().name().to_owned(),
            templates: set.templates().map(|t| (t.name().to_owned(), t.hash().to_owned())).collect(),
        }
    }
}
