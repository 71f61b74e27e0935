//! Template reload as Kubernetes does it: a ConfigMap volume whose `..data` symlink the kubelet swaps by rename,
//! under concurrent load, with broken edits refused while the last good set keeps serving.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use base64::Engine as _;
use common::server::*;
use hyper::StatusCode;
use serde_json::Value;
use sidecar_injector::server::reload::TemplateWatch;
use sidecar_injector_core::{Engine, Settings, TemplateSet};

const REVIEW: &[u8] = include_bytes!("../data/pod-create.json");

/// A template whose every version is recognisable in the patch: the image and an env var carry `tag`.
fn template(tag: &str) -> String {
    format!(
        "pod:\n  spec:\n    containers:\n      - name: proxy\n        image: proxy:{tag}\n        env:\n          - name: TAG\n            value: \"{tag}-{{{{ pod.namespace }}}}\"\n"
    )
}

/// The version (hash) the set of one `default.yaml` holding `source` serves.
fn version(source: &str) -> String {
    TemplateSet::from_source("default", "default.yaml", source, &sidecar_injector_core::Settings::default())
        .unwrap()
        .default_template()
        .hash()
        .to_owned()
}

/// A directory laid out and updated exactly as the kubelet's atomic writer does it.
struct ConfigMapVolume {
    root: PathBuf,
    generation: usize,
    _dir: Option<tempfile::TempDir>,
}

impl ConfigMapVolume {
    fn new(root: &Path, files: &[(&str, &str)]) -> Self {
        let mut volume = ConfigMapVolume { root: root.to_owned(), generation: 0, _dir: None };
        volume.update(files);
        volume
    }

    /// Writes a new timestamped directory, points `..data_tmp` at it, renames that over `..data`, links new
    /// keys, unlinks removed ones and deletes the old directory.
    fn update(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let dir_name = format!("..2026_11_21_10_00_00.{:09}", self.generation);
        let dir = self.root.join(&dir_name);
        std::fs::create_dir(&dir).unwrap();
        for (name, content) in files {
            std::fs::write(dir.join(name), content).unwrap();
        }
        let old = std::fs::read_link(self.root.join("..data")).ok();
        let tmp = self.root.join("..data_tmp");
        std::os::unix::fs::symlink(&dir_name, &tmp).unwrap();
        std::fs::rename(&tmp, self.root.join("..data")).unwrap();
        for (name, _) in files {
            let link = self.root.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
            }
        }
        for entry in std::fs::read_dir(&self.root).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if !name.starts_with('.') && !files.iter().any(|(f, _)| *f == name) {
                std::fs::remove_file(self.root.join(name)).unwrap();
            }
        }
        if let Some(old) = old {
            std::fs::remove_dir_all(self.root.join(old)).unwrap();
        }
    }
}

/// A server watching a ConfigMap volume that starts with `default.yaml` = `initial`.
async fn serve_volume(initial: &str, poll: Duration, events: bool) -> (Running, ConfigMapVolume) {
    let volume_dir = tempfile::tempdir().unwrap();
    let volume = ConfigMapVolume::new(volume_dir.path(), &[("default.yaml", initial)]);
    let settings = Settings::default();
    let set = TemplateSet::load_dir(volume_dir.path(), "default", &settings).unwrap();
    let engine = Arc::new(ArcSwap::from_pointee(Engine::new(set, &settings)));
    let watch = TemplateWatch {
        dir: volume_dir.path().to_owned(),
        default_template: "default".into(),
        settings,
        poll_interval: poll,
        debounce: Duration::from_millis(50),
        events,
        source: None,
    };
    let running = start_with(engine, |config, _| config.template_watches = vec![watch]).await;
    (running, ConfigMapVolume { _dir: Some(volume_dir), ..volume })
}

/// The proxy image and the status annotation's version in one review's answer.
fn served(body: &[u8]) -> (String, String, String) {
    let answer: Value = serde_json::from_slice(body).unwrap();
    let patch =
        base64::engine::general_purpose::STANDARD.decode(answer["response"]["patch"].as_str().unwrap()).unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    let mut image = String::new();
    let mut tag = String::new();
    let mut status_version = String::new();
    for op in patch.as_array().unwrap() {
        assert_eq!(op["op"], "add");
        let path = op["path"].as_str().unwrap();
        if path.starts_with("/spec/containers") {
            image = op["value"]["image"].as_str().unwrap().to_owned();
            tag = op["value"]["env"][0]["value"].as_str().unwrap().to_owned();
        }
        if path.ends_with("sidecar-injector.io~1status") {
            let status: Value = serde_json::from_str(op["value"].as_str().unwrap()).unwrap();
            status_version = status["version"].as_str().unwrap().to_owned();
        }
        if path == "/metadata/annotations" {
            let status = op["value"]["sidecar-injector.io/status"].as_str().unwrap();
            status_version = serde_json::from_str::<Value>(status).unwrap()["version"].as_str().unwrap().to_owned();
        }
    }
    (image, tag, status_version)
}

async fn wait_for(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not within {limit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_is_served_within_the_poll_interval_even_without_events() {
    let (server, mut volume) = serve_volume(&template("a"), Duration::from_millis(300), false).await;
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    assert_eq!(served(&conn.review(REVIEW).await.1).0, "proxy:a");
    volume.update(&[("default.yaml", &template("b"))]);
    let took = wait_for("the polled edit", Duration::from_secs(5), async || {
        served(&conn.review(REVIEW).await.1).0 == "proxy:b"
    })
    .await;
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_is_served_at_once_through_directory_events() {
    // Polling every hour: only the inotify watch on the directory can bring the edit in.
    let (server, mut volume) = serve_volume(&template("a"), Duration::from_secs(3600), true).await;
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    tokio::time::sleep(Duration::from_millis(100)).await; // let the watch start
    for tag in ["b", "c", "d"] {
        volume.update(&[("default.yaml", &template(tag))]);
        let image = format!("proxy:{tag}");
        wait_for("the edit through events", Duration::from_secs(3), async || {
            served(&conn.review(REVIEW).await.1).0 == image
        })
        .await;
    }
    let (_, metrics) = admin_get(server.metrics, "/metrics").await;
    assert_eq!(counter(&metrics, r#"sidecar_injector_template_generation{revision="default"}"#), 4.0);
    assert_eq!(counter(&metrics, r#"sidecar_injector_template_reloads_total{revision="default",result="ok"}"#), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_every_answer_is_wholly_one_template_version() {
    let (a, b) = (template("a"), template("b"));
    let versions = [(version(&a), "proxy:a", "a-shop"), (version(&b), "proxy:b", "b-shop")];
    let (server, mut volume) = serve_volume(&a, Duration::from_millis(100), true).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in 0..6 {
        let (addr, ca, stop) = (server.addr, server.ca_pem.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr, &ca, i % 3 == 2).await;
            let mut seen = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let (status, body) = conn.review(REVIEW).await;
                assert_eq!(status, StatusCode::OK);
                seen.push(served(&body));
            }
            seen
        }));
    }
    for round in 0..10 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        volume.update(&[("default.yaml", if round % 2 == 0 { &b } else { &a })]);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let mut counts = [0usize; 2];
    for client in clients {
        for (image, tag, status_version) in client.await.unwrap() {
            let which = versions.iter().position(|(v, _, _)| *v == status_version);
            let which = which.unwrap_or_else(|| panic!("unknown version {status_version}"));
            assert_eq!((image.as_str(), tag.as_str()), (versions[which].1, versions[which].2), "a mixed answer");
            counts[which] += 1;
        }
    }
    assert!(counts[0] > 0 && counts[1] > 0, "both versions were served: {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_edits_are_refused_the_last_good_set_serves_and_a_later_good_edit_lands() {
    let (server, mut volume) = serve_volume(&template("a"), Duration::from_millis(100), true).await;
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    // What /readyz names (the file), and the reason, which it does not quote: anyone reaching the port reads it.
    let broken = [
        ("bad YAML", "pod:\n  spec: [\n".to_owned(), "default.yaml", "spec: ["),
        (
            "fails to render",
            template("a").replace("pod.namespace", "pod.labels.nope"),
            "default.yaml",
            "cannot render on a sample pod",
        ),
        ("no image", template("a").replace("        image: proxy:a\n", ""), "default.yaml", "needs an `image`"),
        (
            "the API server would refuse it",
            template("a").replace("image: proxy:a\n", "image: proxy:a\n        ports: [{containerPort: 99999}]\n"),
            "default.yaml",
            "99999",
        ),
        ("no default", String::new(), "the template directory", "no template named `default`"),
    ];
    for (i, (what, source, file, reason)) in broken.iter().enumerate() {
        let files: Vec<(&str, &str)> =
            if source.is_empty() { vec![("other.yaml", template("x").leak())] } else { vec![("default.yaml", source)] };
        volume.update(&files);
        wait_for(what, Duration::from_secs(5), async || {
            let (_, metrics) = admin_get(server.metrics, "/metrics").await;
            counter(&metrics, r#"sidecar_injector_template_reloads_total{revision="default",result="error"}"#)
                == (i + 1) as f64
        })
        .await;
        assert_eq!(served(&conn.review(REVIEW).await.1).0, "proxy:a", "{what}: the last good set serves");
        let (status, body) = admin_get(server.metrics, "/readyz").await;
        assert_eq!(status, 200, "{what}: still ready");
        let named = format!("newest template edit refused: {file} (the reason is in the log)");
        assert!(body.contains(&named), "{what}: {body}");
        assert!(!body.contains(reason) && !body.contains("/tmp") && !body.contains(":6:"), "{what} quoted: {body}");
        let (_, metrics) = admin_get(server.metrics, "/metrics").await;
        assert_eq!(counter(&metrics, r#"sidecar_injector_template_last_reload_success{revision="default"}"#), 0.0);
        assert_eq!(counter(&metrics, r#"sidecar_injector_template_generation{revision="default"}"#), 1.0);
    }
    volume.update(&[("default.yaml", &template("b"))]);
    wait_for("the good edit", Duration::from_secs(5), async || served(&conn.review(REVIEW).await.1).0 == "proxy:b")
        .await;
    let (_, body) = admin_get(server.metrics, "/readyz").await;
    assert!(!body.contains("refused") && body.contains("generation 2"), "{body}");
    let (_, metrics) = admin_get(server.metrics, "/metrics").await;
    assert_eq!(counter(&metrics, r#"sidecar_injector_template_last_reload_success{revision="default"}"#), 1.0);
    let hash = TemplateSet::load_dir(&volume.root, "default", &sidecar_injector_core::Settings::default())
        .unwrap()
        .hash()
        .to_owned();
    assert_eq!(
        counter(&metrics, &format!("sidecar_injector_template_set_info{{revision=\"default\",hash=\"{hash}\"}}")),
        1.0
    );
}

/// One revision's ConfigMap volume and the watch `serve --template-dir NAME=DIR` sets up for it.
fn revision_volume(name: &str, initial: &str) -> (ConfigMapVolume, Arc<ArcSwap<Engine>>, TemplateWatch) {
    let dir = tempfile::tempdir().unwrap();
    let volume = ConfigMapVolume::new(dir.path(), &[("default.yaml", initial)]);
    let settings = Settings { revision: name.to_owned(), ..Settings::default() };
    let set = TemplateSet::load_dir(dir.path(), "default", &settings).unwrap();
    let engine = Arc::new(ArcSwap::from_pointee(Engine::new(set, &settings)));
    let watch = TemplateWatch {
        dir: dir.path().to_owned(),
        default_template: "default".into(),
        settings,
        poll_interval: Duration::from_millis(100),
        debounce: Duration::from_millis(20),
        events: true,
        source: None,
    };
    (ConfigMapVolume { _dir: Some(dir), ..volume }, engine, watch)
}

/// The revision a review's answer was stamped by.
fn stamped_revision(body: &[u8]) -> String {
    let answer: Value = serde_json::from_slice(body).unwrap();
    let patch =
        base64::engine::general_purpose::STANDARD.decode(answer["response"]["patch"].as_str().unwrap()).unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    let annotations = patch.as_array().unwrap().iter().find(|op| op["path"] == "/metadata/annotations").unwrap();
    let stamp = annotations["value"]["sidecar-injector.io/status"].as_str().unwrap();
    sidecar_injector_core::Stamp::parse(stamp).unwrap().revision().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_are_served_side_by_side_each_reloaded_alone_and_wholly_under_load() {
    let (stable_a, canary_a, canary_b) = (template("stable-a"), template("canary-a"), template("canary-b"));
    let (mut stable, stable_engine, stable_watch) = revision_volume("stable", &stable_a);
    let (mut canary, canary_engine, canary_watch) = revision_volume("canary", &canary_a);
    let server = start_revisions(vec![stable_engine, canary_engine], |config, _| {
        config.template_watches = vec![stable_watch, canary_watch];
    })
    .await;

    // Each path is one revision: the bare one is the first's.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for (i, path) in ["/mutate", "/mutate/stable", "/mutate/canary", "/mutate/canary"].into_iter().enumerate() {
        let (addr, ca, stop) = (server.addr, server.ca_pem.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr, &ca, i % 2 == 1).await;
            let mut seen = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let (status, body) =
                    conn.send(post(&format!("{path}?timeout=10s"), "application/json", REVIEW)).await.unwrap();
                assert_eq!(status, StatusCode::OK, "{path}");
                seen.push((served(&body), stamped_revision(&body)));
            }
            (path, seen)
        }));
    }
    // Only the canary is edited, back and forth; the stable revision must never change.
    for round in 0..8 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        canary.update(&[("default.yaml", if round % 2 == 0 { &canary_b } else { &canary_a })]);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let mut canary_images = std::collections::BTreeSet::new();
    for client in clients {
        let (path, seen) = client.await.unwrap();
        assert!(!seen.is_empty(), "{path}");
        for ((image, tag, version_seen), revision) in seen {
            let tag_of_image = image.strip_prefix("proxy:").unwrap();
            assert_eq!(tag, format!("{tag_of_image}-shop"), "{path}: a mixed answer");
            assert_eq!(version_seen, version(&template(tag_of_image)), "{path}: a mixed answer");
            if path == "/mutate/canary" {
                assert_eq!(revision, "canary");
                canary_images.insert(image);
            } else {
                assert_eq!((image.as_str(), revision.as_str()), ("proxy:stable-a", "stable"), "{path}");
            }
        }
    }
    assert_eq!(canary_images.len(), 2, "both canary versions were served: {canary_images:?}");

    // The stable revision reloads alone too, and each revision's series count its own.
    stable.update(&[("default.yaml", &template("stable-b"))]);
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    wait_for("the stable edit", Duration::from_secs(5), async || {
        served(&conn.review(REVIEW).await.1).0 == "proxy:stable-b"
    })
    .await;
    let (_, metrics) = admin_get(server.metrics, "/metrics").await;
    assert_eq!(counter(&metrics, r#"sidecar_injector_template_generation{revision="stable"}"#), 2.0);
    assert!(counter(&metrics, r#"sidecar_injector_template_generation{revision="canary"}"#) >= 2.0);
    assert!(
        counter(&metrics, r#"sidecar_injector_requests_total{revision="canary",result="injected",reason=""}"#) > 0.0
    );
    let (_, ready) = admin_get(server.metrics, "/readyz").await;
    assert!(
        ready.contains("revision stable: templates: generation 2") && ready.contains("revision canary:"),
        "{ready}"
    );

    // A revision the server does not serve is not found, and the answer names those it does.
    let (status, body) = conn.send(post("/mutate/beta", "application/json", REVIEW)).await.unwrap();
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&body).contains("for stable, canary"), "{body:?}");
}

/// [`REVIEW`] with its pod naming `template`, and an annotation full of escapes: simd-json unescapes strings in
/// place, so a second review of the same request must start again from the bytes received.
fn review_naming(template: &str) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(REVIEW).unwrap();
    review["request"]["object"]["metadata"]["annotations"] =
        serde_json::json!({"sidecar-injector.io/template": template, "note": "a \"quoted\"\\ttab\n\u{e9}"});
    serde_json::to_vec(&review).unwrap()
}

/// The template a review's answer was injected with (its status annotation), or `None` without a patch.
fn injected_template(body: &[u8]) -> Option<String> {
    let answer: Value = serde_json::from_slice(body).unwrap();
    let patch = answer["response"]["patch"].as_str()?;
    let patch: Value =
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(patch).unwrap()).unwrap();
    let stamp = patch.as_array().unwrap().iter().find_map(|op| match op["path"].as_str() {
        Some("/metadata/annotations") => op["value"]["sidecar-injector.io/status"].as_str(),
        Some("/metadata/annotations/sidecar-injector.io~1status") => op["value"].as_str(),
        _ => None,
    })?;
    Some(sidecar_injector_core::Stamp::parse(stamp).unwrap().template)
}

/// The ConfigMap behind a volume, as the API server has it (ahead of the volume after an edit), and how often it
/// was read.
#[derive(Clone, Default)]
struct FakeConfigMap {
    data: Arc<std::sync::Mutex<std::collections::BTreeMap<String, String>>>,
    reads: Arc<std::sync::atomic::AtomicUsize>,
}

impl FakeConfigMap {
    fn set(&self, files: &[(&str, &str)]) {
        *self.data.lock().unwrap() = files.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    }

    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    fn source(&self) -> sidecar_injector::server::source::TemplateSource {
        let this = self.clone();
        sidecar_injector::server::source::TemplateSource::from_fn("ConfigMap test/templates".into(), move || {
            this.reads.fetch_add(1, Ordering::SeqCst);
            let data = this.data.lock().unwrap().clone();
            Box::pin(async move { Ok(data) })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_the_volume_does_not_have_yet_is_read_from_the_configmap_and_injected() {
    let volume_dir = tempfile::tempdir().unwrap();
    let (old, new) = (template("a"), template("x"));
    let mut volume = ConfigMapVolume::new(volume_dir.path(), &[("default.yaml", &old)]);
    let settings = Settings::default();
    let set = TemplateSet::load_dir(volume_dir.path(), "default", &settings).unwrap();
    let engine = Arc::new(ArcSwap::from_pointee(Engine::new(set, &settings)));
    let configmap = FakeConfigMap::default();
    // The edit that adds `extra` has reached the API server, not yet the volume.
    configmap.set(&[("default.yaml", &old), ("extra.yaml", &new)]);
    let watch = TemplateWatch {
        dir: volume_dir.path().to_owned(),
        default_template: "default".into(),
        settings,
        poll_interval: Duration::from_millis(100),
        debounce: Duration::from_millis(20),
        events: true,
        source: Some(configmap.source()),
    };
    let server = start_with(engine, |config, _| config.template_watches = vec![watch]).await;
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    let metrics = async || admin_get(server.metrics, "/metrics").await.1;
    let reads = |m: &str, result: &str| {
        counter(
            m,
            &format!(r#"sidecar_injector_template_configmap_reads_total{{revision="default",result="{result}"}}"#),
        )
    };

    // Pods that name no template, or a known one, never read the ConfigMap.
    assert_eq!(injected_template(&conn.review(REVIEW).await.1).as_deref(), Some("default"));
    assert_eq!(injected_template(&conn.review(&review_naming("default")).await.1).as_deref(), Some("default"));
    assert_eq!(configmap.reads(), 0);

    // The pod naming the new template is injected with it: read, published, reviewed again.
    let (status, body) = conn.review(&review_naming("extra")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(injected_template(&body).as_deref(), Some("extra"), "{}", String::from_utf8_lossy(&body));
    assert_eq!(configmap.reads(), 1);
    let m = metrics().await;
    assert_eq!(reads(&m, "changed"), 1.0, "{m}");
    assert_eq!(counter(&m, r#"sidecar_injector_template_generation{revision="default"}"#), 2.0);
    // So is the validating call, from the same set, without another read.
    let validated = conn.send(post("/validate", "application/json", &review_naming("extra"))).await.unwrap();
    assert_eq!(validated.0, StatusCode::OK);

    // The volume, rewritten by the kubelet but still without the edit, does not take the replica back.
    volume.update(&[("default.yaml", &old)]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(injected_template(&conn.review(&review_naming("extra")).await.1).as_deref(), Some("extra"));
    // And when the edit reaches the volume, it is the set serving already: no new generation.
    volume.update(&[("default.yaml", &old), ("extra.yaml", &new)]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = metrics().await;
    assert_eq!(counter(&m, r#"sidecar_injector_template_generation{revision="default"}"#), 2.0, "{m}");

    // A template nobody has: one read (it may have been added since), then answered as unknown.
    let (status, body) = conn.review(&review_naming("nope")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(injected_template(&body), None);
    assert!(String::from_utf8_lossy(&body).contains("no template named nope"), "{}", String::from_utf8_lossy(&body));
    assert_eq!(configmap.reads(), 2);
    assert_eq!(reads(&metrics().await, "unchanged"), 1.0);

    // Many at once share reads: at most one at a time, a quarter of a second apart.
    let before = configmap.reads();
    let mut flood = Vec::new();
    for _ in 0..24 {
        let (addr, ca) = (server.addr, server.ca_pem.clone());
        flood.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr, &ca, false).await;
            conn.review(&review_naming("nope")).await.0
        }));
    }
    for one in flood {
        assert_eq!(one.await.unwrap(), StatusCode::OK);
    }
    let flood_reads = configmap.reads() - before;
    assert!((1..=4).contains(&flood_reads), "24 requests made {flood_reads} reads");
}

/// Issue 50: a reload that removes a template pods were injected with must not pass unseen. The reload names
/// what it removed (in the log and `/readyz`, which stays ready), as a warning when this replica injected pods
/// with it, and pods naming it from then on are admitted without the sidecar, with a warning, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_a_template_pods_use_names_it_as_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let volume_dir = dir.path().join("templates");
    std::fs::create_dir(&volume_dir).unwrap();
    let mine = template("mine").replace("name: proxy", "name: mine-proxy");
    let unused = template("unused").replace("name: proxy", "name: unused-proxy");
    let mut volume = ConfigMapVolume::new(
        &volume_dir,
        &[("default.yaml", &template("a")), ("mine.yaml", &mine), ("unused.yaml", &unused)],
    );
    let args = ["--template-dir", volume_dir.to_str().unwrap(), "--template-poll-interval", "200ms"];
    let mut server = Process::spawn_with(dir.path(), &args);
    let mut conn = Conn::open(server.addr, &server.ca, false).await;
    for _ in 0..3 {
        let (status, body) = conn.review(&review_naming("mine")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(injected_template(&body).as_deref(), Some("mine"));
    }
    let readyz = || admin_get(server.metrics, "/readyz");

    // The unused template goes first: named, not a warning.
    volume.update(&[("default.yaml", &template("a")), ("mine.yaml", &mine)]);
    wait_for("the reload removing unused", Duration::from_secs(10), async || {
        readyz().await.1.contains("removed templates: unused\n")
    })
    .await;
    // Then the one pods were injected with.
    volume.update(&[("default.yaml", &template("a"))]);
    wait_for("the reload removing mine", Duration::from_secs(10), async || {
        readyz().await.1.contains("removed templates: mine (3 pods injected with it here)\n")
    })
    .await;
    let (status, body) = readyz().await;
    assert_eq!(status, 200, "still ready: the rest of the set serves: {body}");
    let (status, body) = conn.review(&review_naming("mine")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(injected_template(&body), None, "admitted without the sidecar");
    assert!(String::from_utf8_lossy(&body).contains("no template named mine"), "with a warning: {body:?}");
    let metrics = admin_get(server.metrics, "/metrics").await.1;
    let unknown = r#"sidecar_injector_requests_total{revision="default",result="skipped",reason="unknown-template"}"#;
    assert_eq!(counter(&metrics, unknown), 1.0, "and counted");

    drop(conn);
    let log = server.kill();
    let reloads: Vec<&String> = log.iter().filter(|l| l.contains("templates reloaded")).collect();
    assert_eq!(reloads.len(), 2, "{log:#?}");
    assert!(reloads[0].contains(" INFO ") && reloads[0].contains("removed=unused"), "{}", reloads[0]);
    assert!(reloads[1].contains(" WARN "), "{}", reloads[1]);
    assert!(reloads[1].contains("removed=mine (3 pods injected with it here)"), "{}", reloads[1]);
    assert!(reloads[1].contains("admitted without the sidecar"), "{}", reloads[1]);
}
