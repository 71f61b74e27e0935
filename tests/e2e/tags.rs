//! Issue 55, item 4: revision tags on the real API server. The injector serves two revisions (`default` and
//! `canary`, whose shared values differ, so every template's version does) behind the webhook configurations of
//! `manifests/base` and `manifests/revision-canary`; a namespace is labelled with the tag `prod`.
//! `sidecar-injector tag set` points `prod` at the canary (its refusals on the way), a pod created there is injected
//! by the canary through the tag's own webhooks and says so in its stamp, `tag list` and `status` show the tag;
//! `tag set --overwrite` moves it to `default` with one command: the next pod gets `default`, and `status` lists the
//! first as other-revision; `tag remove` refuses while the namespace uses the tag, and with `--force` leaves new
//! pods uninjected. `--dry-run` prints the objects and changes nothing.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use sidecar_injector_core::Stamp;

use super::{Cluster, Injector, MUTATING, VALIDATING, configuration_with, eventually, register};

const NAMESPACE: &str = "e2e-tags";

/// Runs `sidecar-injector ARGS` with `KUBECONFIG` set: its exit code, stdout and stderr.
fn cli(kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
    let output =
        Command::new(env!("CARGO_BIN_EXE_sidecar-injector")).args(args).env("KUBECONFIG", kubeconfig).output().unwrap();
    let (stdout, stderr) = (String::from_utf8(output.stdout).unwrap(), String::from_utf8(output.stderr).unwrap());
    eprintln!("$ sidecar-injector {}\nstatus: {}\nstdout:\n{stdout}\nstderr: {stderr}", args.join(" "), output.status);
    (output.status.code().unwrap_or(-1), stdout, stderr)
}

fn copy_templates(to: &Path, values: Option<&str>) {
    std::fs::create_dir(to).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    for entry in std::fs::read_dir(&shipped).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
    if let Some(values) = values {
        std::fs::write(to.join("values.yaml"), values).unwrap();
    }
}

fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"sidecar-injector.io/template": "demo"}},
        "spec": {"containers": [{"name": "app", "image": "shop:1"}]},
    })
}

fn stamp(pod: &Value) -> Option<Stamp> {
    pod["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().and_then(Stamp::parse)
}

/// Creates `name` once a pod created now is stamped by `revision` (a moved tag takes effect asynchronously: the
/// API server's configuration informer), and returns its stamp.
async fn create_stamped_by(cluster: &Cluster, name: &str, revision: &str) -> Stamp {
    let pods = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    eventually(&format!("pods stamped by {revision}"), async || {
        let (status, body) = cluster.create(&format!("{pods}?dryRun=All"), pod(name)).await;
        (status == 201 && stamp(&body).is_some_and(|s| s.revision() == revision)).then_some(())
    })
    .await;
    stamp(&cluster.must_create(&pods, pod(name)).await).expect("stamped")
}

pub(super) async fn tags_move_namespaces(cluster: &Cluster) {
    let work = tempfile::tempdir().unwrap();
    let (default_dir, canary_dir) = (work.path().join("templates"), work.path().join("canary"));
    copy_templates(&default_dir, None);
    copy_templates(&canary_dir, Some("logLevel: debug\n"));
    let canary_flag = format!("--template-dir=canary={}", canary_dir.display());
    let version = format!("--kubernetes-version={}", cluster.version);
    let (injector, ca) = Injector::start(work.path(), &default_dir, &[&canary_flag, &version]);
    let url = format!("https://{}", injector.addr);
    for (file, collection) in
        [("mutatingwebhookconfiguration.yaml", MUTATING), ("validatingwebhookconfiguration.yaml", VALIDATING)]
    {
        register(cluster, collection, &configuration_with(file, Some("revision-canary"), &url, &ca)).await;
    }
    let labels = json!({"sidecar-injector.io/rev": "prod"});
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}});
    cluster.must_create("/api/v1/namespaces", namespace).await;
    let kubeconfig = super::status::kubeconfig(cluster, work.path());
    let status_args = [
        "status",
        "-n",
        NAMESPACE,
        "-o",
        "json",
        &format!("--template-dir={}", default_dir.display()),
        &canary_flag,
        &version,
    ];

    // Refused: a revision that does not exist, a revision's own name.
    let (code, _, stderr) = cli(&kubeconfig, &["tag", "set", "prod", "--revision", "blue"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("revision \"blue\" has no webhooks") && stderr.contains("default, canary"), "{stderr}");
    let (code, _, stderr) = cli(&kubeconfig, &["tag", "set", "canary", "--revision", "default"]);
    assert_eq!((code, stderr.contains("is a revision's name")), (1, true), "{stderr}");
    let (code, _, stderr) = cli(&kubeconfig, &["tag", "set", "Prod", "--revision", "default"]);
    assert_eq!(code, 2, "{stderr}");
    // A dry run prints the objects and makes none.
    let (code, yaml, _) = cli(&kubeconfig, &["tag", "set", "prod", "--revision", "canary", "--dry-run"]);
    assert_eq!(code, 0);
    assert!(yaml.contains("name: sidecar-injector-tag-prod") && yaml.contains("/mutate/canary/tag/prod"), "{yaml}");
    assert!(yaml.contains("/validate/canary/tag/prod") && yaml.contains("kind: ValidatingWebhookConfiguration"));
    let (code, listed, _) = cli(&kubeconfig, &["tag", "list", "-o", "json"]);
    assert_eq!((code, serde_json::from_str::<Value>(&listed).unwrap()), (0, json!([])));

    // The tag points to the canary: a pod in its namespace is the canary's, through the tag.
    let (code, stdout, _) = cli(&kubeconfig, &["tag", "set", "prod", "--revision", "canary"]);
    assert_eq!(code, 0);
    assert_eq!(
        stdout,
        "tag prod points to revision canary: 1 namespace(s) labelled sidecar-injector.io/rev=prod (e2e-tags)\n"
    );
    let before = create_stamped_by(cluster, "before", "canary").await;
    assert_eq!(before.tag.as_deref(), Some("prod"));
    let (code, listed, _) = cli(&kubeconfig, &["tag", "list", "-o", "json"]);
    assert_eq!(
        (code, serde_json::from_str::<Value>(&listed).unwrap()),
        (0, json!([{"tag": "prod", "revision": "canary", "namespaces": [NAMESPACE]}]))
    );
    let (code, table, _) = cli(&kubeconfig, &["tag", "list"]);
    assert_eq!((code, table.as_str()), (0, "TAG   REVISION  NAMESPACES\nprod  canary    e2e-tags\n"));
    let (code, report, _) = cli(&kubeconfig, &status_args);
    let report: Value = serde_json::from_str(&report).unwrap();
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["tags"], json!({"prod": "canary"}));
    assert_eq!(
        (&report["namespaces"][0]["revision"], &report["namespaces"][0]["tag"]),
        (&json!("canary"), &json!("prod"))
    );
    assert_eq!(report["summary"]["current"], 1, "{report}");

    // Moving it needs --overwrite; then one command moves the namespace's new pods.
    let (code, _, stderr) = cli(&kubeconfig, &["tag", "set", "prod", "--revision", "default"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("tag prod points to revision canary: --overwrite moves it"), "{stderr}");
    let (code, stdout, _) = cli(&kubeconfig, &["tag", "set", "prod", "--revision", "default", "--overwrite"]);
    assert_eq!(code, 0);
    assert!(stdout.starts_with("tag prod moved from revision canary to default: 1 namespace(s)"), "{stdout}");
    let after = create_stamped_by(cluster, "after", "default").await;
    assert_eq!(after.tag.as_deref(), Some("prod"));
    assert_ne!(after.version, before.version, "the revisions' templates differ");
    let (code, report, _) = cli(&kubeconfig, &status_args);
    let report: Value = serde_json::from_str(&report).unwrap();
    assert_eq!(code, 1, "drift: {report}");
    let counts = &report["summary"];
    assert_eq!((counts["current"].as_u64(), counts["otherRevision"].as_u64()), (Some(1), Some(1)), "{report}");

    // Removing it: refused while the namespace uses it; forced, new pods there get nothing.
    let (code, _, stderr) = cli(&kubeconfig, &["tag", "remove", "prod"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("namespaces e2e-tags are labelled sidecar-injector.io/rev=prod"), "{stderr}");
    let (code, stdout, _) = cli(&kubeconfig, &["tag", "remove", "prod", "--force"]);
    assert_eq!((code, stdout.as_str()), (0, "tag prod removed\n"));
    let pods = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    eventually("the tag's webhooks gone", async || {
        let (status, body) = cluster.create(&format!("{pods}?dryRun=All"), pod("gone")).await;
        (status == 201 && stamp(&body).is_none()).then_some(())
    })
    .await;
    let (code, _, stderr) = cli(&kubeconfig, &["tag", "remove", "prod", "--force"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no tag prod"), "{stderr}");
    drop(injector);
}
