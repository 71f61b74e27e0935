//! `status` without an API server: pods as JSON, judged by real engines; the report, its table and JSON, the exit
//! decision and the `--restart` plan; ConfigMap data read as `serve` reads a directory.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::owners::{Kind, Workload};
use super::report::{Report, Surveyed};
use super::restart::{self, Status, Target};
use super::*;
use sidecar_injector_core::template::BUILTIN_SOURCE;
use sidecar_injector_core::validation::KubeVersion;
use sidecar_injector_core::{Mode, SetSources, Settings, TemplateSet};

const NS: &str = "shop";

fn engine(source: &str, revision: &str, version: KubeVersion) -> Engine {
    let settings = Settings { revision: revision.to_owned(), kubernetes_version: version, ..Settings::default() };
    Engine::new(TemplateSet::from_source("default", "default.yaml", source, &settings).unwrap(), &settings)
}

/// The built-in template with another value: another version of the same template.
fn edited() -> String {
    BUILTIN_SOURCE.replace("logLevel: info", "logLevel: debug")
}

/// Revisions `default` (the built-in template) and `canary` (an edit of it).
fn revisions() -> Vec<Revision> {
    vec![
        Revision {
            name: "default".into(),
            source: "built-in".into(),
            engine: engine(BUILTIN_SOURCE, "default", KubeVersion::DEFAULT),
        },
        Revision {
            name: "canary".into(),
            source: "edit".into(),
            engine: engine(&edited(), "canary", KubeVersion::DEFAULT),
        },
    ]
}

fn keys() -> Keys {
    Keys::new(sidecar_injector_core::settings::DEFAULT_PREFIX)
}

fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
        "status": {"phase": "Running"}
    })
}

/// `pod` as `engine` injects it: the patch of a Pod CREATE review, applied.
fn injected(engine: &Engine, pod: &Value) -> Value {
    let mut body = serde_json::to_vec(&review(NS, pod)).unwrap();
    let outcome = engine.trace(&mut body, &mut Vec::new(), Mode::Mutate).unwrap();
    let patch = outcome.trace.unwrap().patch.expect("the pod is injected");
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut pod = pod.clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    pod
}

fn judge(pod: &Value, enrollment: &Enrollment, revisions: &[Revision]) -> Class {
    classify(pod, NS, enrollment, revisions, &keys()).unwrap()
}

fn default_ns() -> Enrollment {
    Enrollment::Revision("default".into())
}

fn version(revisions: &[Revision], revision: usize) -> String {
    revisions[revision].engine.template().hash().to_owned()
}

#[test]
fn current_stale_missing_and_incomplete_come_from_the_engine() {
    let revisions = revisions();
    let (now, canary) = (version(&revisions, 0), version(&revisions, 1));
    let current = injected(&revisions[0].engine, &pod("a"));
    assert_eq!(
        judge(&current, &default_ns(), &revisions),
        Class::Current { template: "default".into(), version: now.clone() }
    );

    // Injected by an older version of the template, in the same revision.
    let old = engine(&edited(), "default", KubeVersion::DEFAULT);
    let stale = injected(&old, &pod("b"));
    assert_eq!(
        judge(&stale, &default_ns(), &revisions),
        Class::Stale { template: "default".into(), version: canary.clone(), current_version: Some(now.clone()) }
    );

    assert_eq!(
        judge(&pod("c"), &default_ns(), &revisions),
        Class::Missing { template: "default".into(), version: now.clone() }
    );

    // The current stamp, but something took the label away.
    let mut incomplete = current.clone();
    incomplete["metadata"]["labels"].as_object_mut().unwrap().remove("sidecar-injector.io/injected");
    assert_eq!(
        judge(&incomplete, &default_ns(), &revisions),
        Class::Incomplete {
            template: "default".into(),
            version: now.clone(),
            missing: vec!["label sidecar-injector.io/injected".into()]
        }
    );

    // A stamp written before revisions existed names none: the default revision's.
    let mut unnamed = current.clone();
    let status = &mut unnamed["metadata"]["annotations"]["sidecar-injector.io/status"];
    let mut stamp: Value = serde_json::from_str(status.as_str().unwrap()).unwrap();
    stamp.as_object_mut().unwrap().remove("revision");
    *status = Value::from(stamp.to_string());
    assert_eq!(judge(&unnamed, &default_ns(), &revisions), Class::Current { template: "default".into(), version: now });

    // A template the revision no longer has: stale, with no current version.
    let gone = engine(&edited(), "default", KubeVersion::DEFAULT);
    let settings = Settings::default();
    let renamed = TemplateSet::from_source("proxy", "proxy.yaml", &edited(), &settings).unwrap();
    let other = Engine::new(renamed, &settings);
    drop(gone);
    let from_gone = injected(&other, &pod("d"));
    assert_eq!(
        judge(&from_gone, &default_ns(), &revisions),
        Class::Stale { template: "proxy".into(), version: canary, current_version: None }
    );
}

#[test]
fn a_stamp_of_another_revision_is_other_revision_both_ways() {
    let revisions = revisions();
    let canary_ns = Enrollment::Revision("canary".into());
    let by_canary = injected(&revisions[1].engine, &pod("a"));
    let by_default = injected(&revisions[0].engine, &pod("b"));
    assert_eq!(
        judge(&by_canary, &default_ns(), &revisions),
        Class::OtherRevision { revision: "canary".into(), template: "default".into(), version: version(&revisions, 1) }
    );
    assert_eq!(
        judge(&by_default, &canary_ns, &revisions),
        Class::OtherRevision {
            revision: "default".into(),
            template: "default".into(),
            version: version(&revisions, 0)
        }
    );
    assert_eq!(
        judge(&by_canary, &canary_ns, &revisions),
        Class::Current { template: "default".into(), version: version(&revisions, 1) }
    );
    // The same template in both revisions: the pod is complete, but its stamp names the other revision.
    let twins = vec![
        Revision {
            name: "default".into(),
            source: "a".into(),
            engine: engine(BUILTIN_SOURCE, "default", KubeVersion::DEFAULT),
        },
        Revision {
            name: "canary".into(),
            source: "b".into(),
            engine: engine(BUILTIN_SOURCE, "canary", KubeVersion::DEFAULT),
        },
    ];
    let twin = injected(&twins[0].engine, &pod("c"));
    assert_eq!(judge(&twin, &canary_ns, &twins).name(), "other-revision");
}

#[test]
fn pods_not_expected_to_have_a_sidecar_are_skipped_with_the_reason() {
    let revisions = revisions();
    let skipped = |pod: &Value, enrollment: &Enrollment, revisions: &[Revision]| match judge(pod, enrollment, revisions)
    {
        Class::Skipped { reason } => reason,
        other => panic!("not skipped: {other:?}"),
    };
    let mut opted_out = pod("a");
    opted_out["metadata"]["annotations"] = json!({"sidecar-injector.io/inject": "Off"});
    assert_eq!(skipped(&opted_out, &default_ns(), &revisions), "opted-out");
    // Whatever it carries: an opted-out pod with a stale stamp is not drift.
    let mut stale_out = injected(&engine(&edited(), "default", KubeVersion::DEFAULT), &pod("b"));
    stale_out["metadata"]["labels"]["sidecar-injector.io/inject"] = json!("false");
    assert_eq!(skipped(&stale_out, &default_ns(), &revisions), "opted-out");
    let mut host = pod("c");
    host["spec"]["hostNetwork"] = json!(true);
    assert_eq!(skipped(&host, &default_ns(), &revisions), "host-network");
    let mut mirror = pod("d");
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
    assert_eq!(skipped(&mirror, &default_ns(), &revisions), "mirror-pod");

    let mut done = pod("e");
    done["status"]["phase"] = json!("Succeeded");
    assert_eq!(skipped(&done, &default_ns(), &revisions), FINISHED);
    let mut going = pod("f");
    going["metadata"]["deletionTimestamp"] = json!("2026-11-21T10:00:00Z");
    assert_eq!(skipped(&going, &default_ns(), &revisions), TERMINATING);

    assert_eq!(skipped(&pod("g"), &Enrollment::NotOptedIn, &revisions), NOT_OPTED_IN);
    assert_eq!(skipped(&pod("g"), &Enrollment::Excluded, &revisions), EXCLUDED);
    assert_eq!(skipped(&pod("g"), &Enrollment::UnknownRevision("blue".into()), &revisions), UNKNOWN_REVISION);
}

/// Issue 50: a pod naming a template its revision lacks (removed by an edit, or a typo) is its own class, with
/// what it asks for and what it was injected with; not drift (a restart brings the same), but `status` fails.
#[test]
fn a_pod_naming_a_template_the_revision_lacks_is_reported() {
    let revisions = revisions();
    let mut typo = pod("a");
    typo["metadata"]["annotations"] = json!({"sidecar-injector.io/template": "defualt"});
    let class = judge(&typo, &default_ns(), &revisions);
    assert_eq!(class, Class::UnknownTemplate { asks_for: "defualt".into(), injected: None });
    assert!(!class.is_drift());
    // Injected before its template went away: the stamp says with what.
    let mut gone = injected(&engine(&edited(), "default", KubeVersion::DEFAULT), &pod("b"));
    gone["metadata"]["annotations"]["sidecar-injector.io/template"] = json!("removed");
    let stamp = Stamp::parse(gone["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap()).unwrap();
    let expected = format!("{} {}", stamp.template, stamp.version);
    assert_eq!(
        judge(&gone, &default_ns(), &revisions),
        Class::UnknownTemplate { asks_for: "removed".into(), injected: Some(expected) }
    );
    let surveyed = Surveyed {
        namespace: "shop".into(),
        enrollment: default_ns(),
        pods: vec![(owner(Kind::Deployment, "web"), "web-1".into(), class)],
    };
    let report = Report::new(&revisions, BTreeMap::new(), vec![surveyed]);
    assert!(!report.summary.drift && alone(&report).failed(), "exit 1, with nothing to restart");
    assert!(restart::plan(&report, 5).restart.is_empty());
}

#[test]
fn a_jobs_pod_follows_the_kubernetes_version_as_serve_would() {
    let mut job_pod = pod("backup-x");
    job_pod["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "backup", "uid": "1", "controller": true}]);
    // At 1.29 a Job's pod gets the sidecar as a native sidecar: without one, it is missing it.
    assert_eq!(judge(&job_pod, &default_ns(), &revisions()).name(), "missing");
    let old = vec![Revision {
        name: "default".into(),
        source: "x".into(),
        engine: engine(BUILTIN_SOURCE, "default", KubeVersion::new(20)),
    }];
    assert_eq!(judge(&job_pod, &default_ns(), &old), Class::Skipped { reason: "job".into() });
}

#[test]
fn namespaces_opt_in_by_label() {
    let revisions = revisions();
    let tags = BTreeMap::from([("prod".to_owned(), "canary".to_owned()), ("gone".to_owned(), "blue".to_owned())]);
    let of = |name: &str, labels: &[(&str, &str)]| {
        let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Enrollment::of(name, &labels, &keys(), &revisions, &tags)
    };
    let (inject, rev) = ("sidecar-injector.io/inject", "sidecar-injector.io/rev");
    assert_eq!(of("shop", &[(inject, "enabled")]), Enrollment::Revision("default".into()));
    assert_eq!(of("shop", &[(rev, "canary")]), Enrollment::Revision("canary".into()));
    assert_eq!(of("shop", &[(inject, "enabled"), (rev, "canary")]), Enrollment::Revision("canary".into()));
    assert_eq!(of("shop", &[(rev, "blue")]), Enrollment::UnknownRevision("blue".into()));
    // The revision's webhook selects on its label alone.
    assert_eq!(of("shop", &[(inject, "disabled"), (rev, "canary")]), Enrollment::Revision("canary".into()));
    assert_eq!(of("shop", &[(inject, "yes")]), Enrollment::NotOptedIn);
    assert_eq!(of("shop", &[]), Enrollment::NotOptedIn);
    assert_eq!(of("kube-system", &[(inject, "enabled")]), Enrollment::Excluded);
    assert!(of("shop", &[(rev, "blue")]).opted_in() && !of("shop", &[]).opted_in());
    // A revision tag: its revision's, when that revision is given.
    let tagged = of("shop", &[(rev, "prod")]);
    assert_eq!(tagged, Enrollment::Tagged { tag: "prod".into(), revision: "canary".into() });
    assert_eq!((tagged.revision(), tagged.tag(), tagged.opted_in()), (Some("canary"), Some("prod"), true));
    assert_eq!(of("shop", &[(rev, "gone")]), Enrollment::UnknownRevision("blue".into()));
    // The default revision is the first given, whatever its name.
    let stable = vec![Revision {
        name: "stable".into(),
        source: "x".into(),
        engine: engine(BUILTIN_SOURCE, "stable", KubeVersion::DEFAULT),
    }];
    let labels = BTreeMap::from([(inject.to_owned(), "enabled".to_owned())]);
    assert_eq!(
        Enrollment::of("shop", &labels, &keys(), &stable, &BTreeMap::new()),
        Enrollment::Revision("stable".into())
    );
    // Another prefix names other labels.
    let other = Keys::new("example.com/");
    assert_eq!(Enrollment::of("shop", &labels, &other, &stable, &BTreeMap::new()), Enrollment::NotOptedIn);
}

/// The webhook configurations select namespaces by the same labels and leave out the same namespaces: the default
/// revision's `<prefix>inject=enabled` without `<prefix>rev`, the canary's `<prefix>rev=canary`.
#[test]
fn the_namespace_rules_are_the_webhook_configurations() {
    let read = |file: &str| {
        let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        sidecar_injector_core::offline::read_documents(&text).unwrap().remove(0)
    };
    let selector = |webhook: &Value, key: &str, operator: &str| -> Option<Vec<String>> {
        let expressions = webhook["namespaceSelector"]["matchExpressions"].as_array().unwrap();
        let found = expressions.iter().find(|e| e["key"] == key && e["operator"] == operator)?;
        Some(found["values"].as_array().into_iter().flatten().map(|v| v.as_str().unwrap().to_owned()).collect())
    };
    let keys = keys();
    let base = read("manifests/base/mutatingwebhookconfiguration.yaml");
    let webhook = &base["webhooks"][0];
    assert_eq!(selector(webhook, &keys.inject, "In").unwrap(), [sidecar_injector_core::decision::NAMESPACE_ENABLED]);
    assert_eq!(selector(webhook, &keys.rev, "DoesNotExist"), Some(Vec::new()));
    let excluded = selector(webhook, "kubernetes.io/metadata.name", "NotIn").unwrap();
    assert_eq!(excluded, sidecar_injector_core::decision::EXCLUDED_NAMESPACES);
    let canary = read("manifests/revision-canary/mutatingwebhookconfiguration.yaml");
    let webhook = &canary[0]["value"];
    assert_eq!(selector(webhook, &keys.rev, "In").unwrap(), ["canary"]);
    assert_eq!(selector(webhook, &keys.inject, "In"), None);
    assert_eq!(selector(webhook, "kubernetes.io/metadata.name", "NotIn").unwrap(), excluded);
}

fn owner(kind: Kind, name: &str) -> Workload {
    Workload { kind, name: name.into() }
}

/// A report over every class: `shop` (a Deployment with every kind of drift, a bare pod, a Job, a current
/// StatefulSet), `quiet` (nothing but current pods) and `blue` (a revision not given).
fn report() -> Report {
    let revisions = revisions();
    let now = version(&revisions, 0);
    let current = || Class::Current { template: "default".into(), version: now.clone() };
    let web = owner(Kind::Deployment, "web");
    let shop = Surveyed {
        namespace: "shop".into(),
        enrollment: default_ns(),
        pods: vec![
            (
                web.clone(),
                "web-2".into(),
                Class::Stale {
                    template: "default".into(),
                    version: "0123456789abcdef".into(),
                    current_version: Some(now.clone()),
                },
            ),
            (web.clone(), "web-1".into(), current()),
            (web.clone(), "web-3".into(), Class::Missing { template: "default".into(), version: now.clone() }),
            (
                web.clone(),
                "web-4".into(),
                Class::Incomplete {
                    template: "default".into(),
                    version: now.clone(),
                    missing: vec!["volume data".into()],
                },
            ),
            (
                web.clone(),
                "web-5".into(),
                Class::OtherRevision {
                    revision: "canary".into(),
                    template: "default".into(),
                    version: "fedcba9876543210".into(),
                },
            ),
            (
                web.clone(),
                "web-6".into(),
                Class::UnknownTemplate { asks_for: "mine".into(), injected: Some("mine 0123456789abcdef".into()) },
            ),
            (web.clone(), "web-7".into(), Class::Skipped { reason: "opted-out".into() }),
            (
                owner(Kind::Pod, "debug"),
                "debug".into(),
                Class::Missing { template: "default".into(), version: now.clone() },
            ),
            (
                owner(Kind::CronJob, "backup"),
                "backup-1-x".into(),
                Class::Missing { template: "default".into(), version: now.clone() },
            ),
            (owner(Kind::StatefulSet, "db"), "db-0".into(), current()),
            (
                owner(Kind::DaemonSet, "agent"),
                "agent-x".into(),
                Class::Stale {
                    template: "default".into(),
                    version: "0123456789abcdef".into(),
                    current_version: Some(now.clone()),
                },
            ),
        ],
    };
    let quiet = Surveyed {
        namespace: "quiet".into(),
        enrollment: default_ns(),
        pods: vec![(owner(Kind::Deployment, "api"), "api-1".into(), current())],
    };
    let blue = Surveyed {
        namespace: "blue".into(),
        enrollment: Enrollment::UnknownRevision("blue".into()),
        pods: vec![(owner(Kind::Deployment, "x"), "x-1".into(), Class::Skipped { reason: UNKNOWN_REVISION.into() })],
    };
    Report::new(&revisions, BTreeMap::new(), vec![shop, quiet, blue])
}

#[test]
fn the_report_groups_by_namespace_and_workload_and_counts_every_class() {
    let report = report();
    let names: Vec<&str> = report.namespaces.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["blue", "quiet", "shop"]);
    let shop = &report.namespaces[2];
    let workloads: Vec<String> = shop.workloads.iter().map(|w| w.workload.to_string()).collect();
    assert_eq!(workloads, ["Deployment/web", "StatefulSet/db", "DaemonSet/agent", "CronJob/backup", "Pod/debug"]);
    let web = &shop.workloads[0];
    assert_eq!(
        (web.counts.pods, web.counts.current, web.counts.stale, web.counts.missing, web.counts.incomplete),
        (7, 1, 1, 1, 1)
    );
    let counts = web.counts;
    assert_eq!((counts.other_revision, counts.unknown_template, counts.skipped, counts.drift()), (1, 1, 1, 4));
    let pods: Vec<&str> = web.pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(pods, ["web-1", "web-2", "web-3", "web-4", "web-5", "web-6", "web-7"]);
    let summary = report.summary;
    assert_eq!(
        (summary.namespaces, summary.counts.pods, summary.counts.drift(), summary.workloads_with_drift),
        (3, 13, 7, 4)
    );
    assert_eq!(summary.workloads_with_unknown_template, 1);
    assert!(summary.drift && alone(&report).failed());
}

#[test]
fn the_table_shows_counts_drift_and_what_restart_would_do() {
    let table = alone(&report()).table();
    eprintln!("{table}");
    let lines: Vec<&str> = table.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAMESPACE",
            "REVISION",
            "WORKLOAD",
            "PODS",
            "CURRENT",
            "STALE",
            "MISSING",
            "INCOMPLETE",
            "OTHER-REV",
            "UNKNOWN-TMPL",
            "SKIPPED"
        ]
    );
    let row = |workload: &str| -> Vec<&str> {
        lines.iter().find(|l| l.contains(&format!(" {workload} "))).unwrap().split_whitespace().collect()
    };
    assert_eq!(row("Deployment/web"), ["shop", "default", "Deployment/web", "7", "1", "1", "1", "1", "1", "1", "1"]);
    assert_eq!(row("Deployment/x"), ["blue", "blue?", "Deployment/x", "1", "0", "0", "0", "0", "0", "0", "1"]);
    let now = version(&revisions(), 0);
    for detail in [
        format!("stale, default 0123456789abcdef (now {now}): web-2"),
        format!("missing, no sidecar (default {now} expected): web-3"),
        format!("incomplete, default {now} lacks volume data: web-4"),
        "other revision, injected by canary (default fedcba9876543210): web-5".to_owned(),
        "unknown template \"mine\", injected with mine 0123456789abcdef before: web-6".to_owned(),
    ] {
        assert!(table.contains(&format!("    {detail}\n")), "{detail}");
    }
    assert!(table.contains("namespace blue: labelled for revision blue, whose templates were not given"));
    assert!(table.contains(
        "13 pod(s) in 3 namespace(s): 3 current, 2 stale, 3 missing, 1 incomplete, 1 other-revision, 1 \
         unknown-template, 2 skipped"
    ));
    assert!(table.contains(
        "unknown template: 1 pod(s) in 1 workload(s) name a template their revision does not have (mine): pods \
         created so are admitted without the sidecar"
    ));
    assert!(table.contains("drift: 7 pod(s) in 4 workload(s)"));
    assert!(table.contains(
        "`status --restart` would restart: Deployment shop/web (4 pod(s)), DaemonSet shop/agent (1 pod(s))\n"
    ));
    assert!(
        table.contains("not restartable, recreate by hand: CronJob shop/backup (1 pod(s)), Pod shop/debug (1 pod(s))")
    );
}

#[test]
fn no_drift_says_so_and_succeeds() {
    let revisions = revisions();
    let now = version(&revisions, 0);
    let quiet = Surveyed {
        namespace: "quiet".into(),
        enrollment: default_ns(),
        pods: vec![
            (
                owner(Kind::Deployment, "api"),
                "api-1".into(),
                Class::Current { template: "default".into(), version: now },
            ),
            (owner(Kind::Job, "once"), "once-x".into(), Class::Skipped { reason: "job".into() }),
        ],
    };
    let report = Report::new(&revisions, BTreeMap::new(), vec![quiet]);
    assert!(!alone(&report).failed());
    let table = alone(&report).table();
    assert!(table.contains("no drift: every pod runs the sidecar"), "{table}");
    assert!(!table.contains("restart"), "{table}");
    // No namespace at all: nothing to say but the totals.
    let empty = Report::new(&revisions, BTreeMap::new(), Vec::new());
    assert!(!alone(&empty).failed());
    assert!(empty.table().starts_with("0 pod(s) in 0 namespace(s)"), "{}", empty.table());
}

#[test]
fn the_json_report_carries_every_class_and_fact() {
    let report = report();
    let json: Value = serde_json::from_str(&alone(&report).json()).unwrap();
    assert_eq!(json["revisions"][0]["name"], "default");
    assert_eq!(json["revisions"][0]["defaultTemplate"], "default");
    assert_eq!(json["revisions"][1]["templates"]["default"], version(&revisions(), 1));
    assert_eq!(json["summary"]["pods"], 13);
    assert_eq!(json["summary"]["unknownTemplate"], 1);
    assert_eq!(json["summary"]["workloadsWithUnknownTemplate"], 1);
    assert_eq!(json["summary"]["otherRevision"], 1);
    assert_eq!(json["summary"]["drift"], true);
    assert_eq!(json["summary"]["workloadsWithDrift"], 4);
    assert!(json.get("restart").is_none());
    let shop = &json["namespaces"][2];
    assert_eq!(
        (shop["name"].as_str(), shop["optIn"].as_str(), shop["revision"].as_str()),
        (Some("shop"), Some("opted-in"), Some("default"))
    );
    let web = &shop["workloads"][0];
    assert_eq!((web["kind"].as_str(), web["name"].as_str()), (Some("Deployment"), Some("web")));
    assert_eq!(
        web["counts"],
        json!({"pods": 7, "current": 1, "stale": 1, "missing": 1, "incomplete": 1, "otherRevision": 1,
               "unknownTemplate": 1, "skipped": 1})
    );
    let classes: Vec<&str> = web["pods"].as_array().unwrap().iter().map(|p| p["class"].as_str().unwrap()).collect();
    assert_eq!(classes, Class::NAMES);
    let stale = &web["pods"][1];
    assert_eq!(stale["name"], "web-2");
    assert_eq!(stale["version"], "0123456789abcdef");
    assert_eq!(stale["currentVersion"], version(&revisions(), 0));
    assert_eq!(web["pods"][3]["missing"], json!(["volume data"]));
    assert_eq!(web["pods"][4]["revision"], "canary");
    assert_eq!(
        (web["pods"][5]["asksFor"].as_str(), web["pods"][5]["injected"].as_str()),
        (Some("mine"), Some("mine 0123456789abcdef"))
    );
    assert_eq!(web["pods"][6]["reason"], "opted-out");
    assert_eq!(json["namespaces"][0]["optIn"], "unknown-revision");
}

fn target(namespace: &str, kind: Kind, name: &str, drifting_pods: usize) -> Target {
    Target { namespace: namespace.into(), workload: owner(kind, name), drifting_pods }
}

#[test]
fn restart_rolls_deployments_statefulsets_and_daemonsets_up_to_the_limit() {
    let report = report();
    let plan = restart::plan(&report, 1);
    assert_eq!(plan.restart, [target("shop", Kind::Deployment, "web", 4)]);
    assert_eq!(plan.deferred, [target("shop", Kind::DaemonSet, "agent", 1)]);
    assert_eq!(
        plan.not_restartable,
        [target("shop", Kind::CronJob, "backup", 1), target("shop", Kind::Pod, "debug", 1)]
    );
    let all = restart::plan(&report, 10);
    assert_eq!((all.restart.len(), all.deferred.len()), (2, 0));
    // Workloads without drift are never touched: quiet/api, shop/db.
    assert!(
        !all.restart.iter().chain(&all.not_restartable).any(|t| t.workload.name == "api" || t.workload.name == "db")
    );

    let patch = restart::patch("2026-11-21T10:00:00Z");
    assert_eq!(
        patch,
        json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-21T10:00:00Z"}}}}})
    );
}

fn outcome(plan: restart::Plan, dry_run: bool) -> restart::Outcome {
    restart::Outcome {
        dry_run,
        restarted_at: "2026-11-21T10:00:00Z".into(),
        max_restarts: 1,
        restarted: plan.restart,
        failed: Vec::new(),
        deferred: plan.deferred,
        not_restartable: plan.not_restartable,
    }
}

#[test]
fn restart_exits_1_only_when_drift_is_left_behind() {
    let mut report = report();
    let dry_run = outcome(restart::plan(&report, 1), true);
    let status = Status { report: &report, restart: Some(&dry_run), upgrade: None };
    assert!(status.failed(), "a deferred workload and pods to recreate by hand are left");
    let table = status.table();
    assert!(table.contains("dry run, nothing changed; would restart: Deployment shop/web (4 pod(s))\n"), "{table}");
    assert!(table.contains("left for the next run (--max-restarts 1): DaemonSet shop/agent (1 pod(s))\n"), "{table}");
    assert!(
        table.contains("not restartable, recreate by hand: CronJob shop/backup (1 pod(s)), Pod shop/debug"),
        "{table}"
    );
    let json: Value = serde_json::from_str(&status.json()).unwrap();
    assert_eq!(json["restart"]["dryRun"], true);
    assert_eq!(
        json["restart"]["restarted"],
        json!([{"namespace": "shop", "kind": "Deployment", "name": "web", "driftingPods": 4}])
    );
    assert_eq!(json["restart"]["deferred"][0]["kind"], "DaemonSet");

    // Only restartable drift, all of it restarted: success (once no pod names an unknown template, which no
    // restart mends).
    let mut done = outcome(restart::plan(&report, 10), false);
    assert!(Status { report: &report, restart: None, upgrade: None }.failed());
    report.summary.counts.unknown_template = 0;
    done.not_restartable.clear();
    let only_deployments = Status { report: &report, restart: Some(&done), upgrade: None };
    assert!(!only_deployments.failed());
    assert!(only_deployments.table().contains(
        "restarted (kubectl.kubernetes.io/restartedAt=2026-11-21T10:00:00Z): Deployment shop/web (4 pod(s)), DaemonSet shop/agent (1 pod(s))\n"
    ));
    // A refused restart is drift left behind.
    let refused = done.restarted.pop().unwrap();
    done.failed.push(restart::Failed { target: refused, reason: "the Deployment is paused".into() });
    let only_deployments = Status { report: &report, restart: Some(&done), upgrade: None };
    assert!(only_deployments.failed());
    assert!(
        only_deployments.table().contains("not restarted: DaemonSet shop/agent (1 pod(s)): the Deployment is paused\n")
    );
}

#[test]
fn a_configmap_is_read_as_serve_reads_its_mounted_directory() {
    let data = BTreeMap::from([
        ("default.yaml".to_owned(), BUILTIN_SOURCE.to_owned()),
        ("debug.yml".to_owned(), edited()),
        ("values.yaml".to_owned(), "logLevel: warn\n".to_owned()),
        ("README.md".to_owned(), "notes".to_owned()),
        (".hidden.yaml".to_owned(), "not: read".to_owned()),
    ]);
    let sources = SetSources::from_config_map("configmap/ns/templates", data.clone());
    assert_eq!(sources.origin, "configmap/ns/templates");
    let templates: Vec<(&str, &str)> = sources.templates.iter().map(|(n, f, _)| (n.as_str(), f.as_str())).collect();
    assert_eq!(
        templates,
        [("debug", "configmap/ns/templates/debug.yml"), ("default", "configmap/ns/templates/default.yaml")]
    );
    assert_eq!(sources.values.as_ref().map(|v| v.0.as_str()), Some("configmap/ns/templates/values.yaml"));
    assert_eq!(sources.ignored, ["configmap/ns/templates/README.md"]);

    // The same files in a directory: the same set, to the hash.
    let dir = tempfile::tempdir().unwrap();
    for (key, value) in &data {
        std::fs::write(dir.path().join(key), value).unwrap();
    }
    let settings = Settings::default();
    let from_dir = TemplateSet::load_dir(dir.path(), "default", &settings).unwrap();
    let from_configmap = TemplateSet::compile(sources, "default", &settings).unwrap();
    assert_eq!(from_configmap.hash(), from_dir.hash());
    assert_eq!(from_configmap.default_template().hash(), from_dir.default_template().hash());
    // Errors name the ConfigMap's keys, not the scratch directory.
    let broken = BTreeMap::from([("default.yaml".to_owned(), "pod: [".to_owned())]);
    let error = TemplateSet::compile(SetSources::from_config_map("configmap/ns/t", broken), "default", &settings)
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("configmap/ns/t/default.yaml:"), "{error}");
    let empty =
        TemplateSet::compile(SetSources::from_config_map("configmap/ns/t", BTreeMap::new()), "default", &settings);
    assert!(empty.unwrap_err().to_string().contains("configmap/ns/t"));
}

#[test]
fn an_error_chain_reads_as_one_line_each_cause_once() {
    #[derive(Debug, thiserror::Error)]
    #[error("listing pods in shop")]
    struct Outer(#[source] Middle);
    #[derive(Debug, thiserror::Error)]
    #[error("connect failed: {0}")]
    struct Middle(#[source] std::io::Error);
    let error = Outer(Middle(std::io::Error::other("connection refused")));
    assert_eq!(chain(&error), "listing pods in shop: connect failed: connection refused");

    let status = kube::core::Status::failure("pods is forbidden: User \"dev\" cannot list", "Forbidden").with_code(403);
    let api = ClusterError::Api { what: "listing pods in shop".into(), source: kube::Error::Api(Box::new(status)) };
    assert_eq!(chain(&api), "listing pods in shop: pods is forbidden: User \"dev\" cannot list (403 Forbidden)");
}

/// The report as `status` prints it without `--restart`.
fn alone(report: &Report) -> Status<'_> {
    Status { report, restart: None, upgrade: None }
}

#[test]
fn a_namespace_on_a_tag_is_reported_with_its_revision_and_the_tags_are_listed() {
    let revisions = revisions();
    let tags = BTreeMap::from([("prod".to_owned(), "canary".to_owned())]);
    let surveyed = Surveyed {
        namespace: "shop".into(),
        enrollment: Enrollment::Tagged { tag: "prod".into(), revision: "canary".into() },
        pods: vec![(owner(Kind::Deployment, "web"), "web-1".into(), Class::Skipped { reason: "job".into() })],
    };
    let report = Report::new(&revisions, tags, vec![surveyed]);
    let table = report.table();
    assert!(table.lines().any(|l| l.starts_with("shop       canary (tag prod)  Deployment/web")), "{table}");
    assert!(table.contains("\nrevision tags: prod -> canary\n"), "{table}");
    let json: Value = serde_json::to_value(&report).unwrap();
    assert_eq!(
        (json["namespaces"][0]["revision"].as_str(), json["namespaces"][0]["tag"].as_str()),
        (Some("canary"), Some("prod"))
    );
    assert_eq!(json["tags"], json!({"prod": "canary"}));
}
