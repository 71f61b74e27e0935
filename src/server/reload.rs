//! Template reload: the template directory (a mounted ConfigMap) is watched and, when its content changes, the
//! whole set is compiled off the request path and published with one `ArcSwap::store`.
//!
//! The kubelet updates a ConfigMap volume by writing a new timestamped directory and renaming a `..data` symlink
//! over the old one; the visible files are symlinks through `..data`. A watch on a file follows the old inode
//! and dies, so the **directory** is watched, any event in it means "maybe changed", bursts are debounced, and
//! the files are re-read through their stable paths and compared by content hash. Events can be missed (or
//! inotify be unavailable), so the directory is also polled. A refused edit is remembered by hash: it is
//! reported once, and the next different edit is tried.
//!
//! The task is supervised: if it ends or panics, it is logged, counted and restarted (a reload task that died
//! silently left another webhook serving stale certificates: kubewarden/policy-server#1061).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use notify::Watcher;

use super::serving::Served;
use super::source::TemplateSource;
use super::telemetry::{ReadResult, RevisionMetrics};

/// When reading the directory fails, read it once more after this pause before calling the edit refused: a read
/// can race the kubelet deleting the previous timestamped directory, which takes it well under this long.
const REREAD_PAUSE: Duration = Duration::from_millis(100);
use sidecar_injector_core::{Engine, SetSources, Settings, TemplateError, TemplateSet};

/// Where templates are reloaded from, and how.
#[derive(Debug, Clone)]
pub struct TemplateWatch {
    /// The directory (a mounted ConfigMap).
    pub dir: PathBuf,
    /// The template of pods that do not name one.
    pub default_template: String,
    /// The engine settings every reloaded set is served with.
    pub settings: Settings,
    /// How often the directory is read even without an event.
    pub poll_interval: Duration,
    /// How long to wait after an event for the burst to end.
    pub debounce: Duration,
    /// Watch for change events (inotify); `false` polls only, for filesystems that send none.
    pub events: bool,
    /// The ConfigMap the directory is mounted from, read through the API server when a pod names a template
    /// the directory does not have yet ([`super::refresh`]); `None` reads the directory only.
    pub source: Option<TemplateSource>,
}

impl TemplateWatch {
    /// Compiles the set in `sources`.
    pub fn compile(&self, sources: SetSources) -> Result<TemplateSet, TemplateError> {
        TemplateSet::compile(sources, &self.default_template, &self.settings)
    }
}

/// What `/readyz` and the metrics say about templates: the generation serving and the newest refused edit.
#[derive(Debug)]
pub(crate) struct ReloadState {
    generation: AtomicU64,
    /// The hash of the newest directory content seen, applied or refused.
    seen: ArcSwap<String>,
    /// The newest edit refused; cleared by a good edit.
    refused: ArcSwapOption<Refused>,
    /// The templates the reload of the set serving removed (for `/readyz`).
    removed: ArcSwap<Vec<Removed>>,
}

/// A template the set serving had and a reload's set lacks: pods naming it are admitted without the sidecar from
/// then on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Removed {
    pub name: String,
    /// The pods this replica injected with it (in this process's life).
    pub injected: u64,
}

impl Removed {
    /// The templates of `previous` that `next` lacks, with how many pods each injected here.
    fn between(previous: &TemplateSet, next: &TemplateSet, metrics: &RevisionMetrics) -> Vec<Removed> {
        let kept = |name: &str| next.templates().any(|t| t.name() == name);
        let names = previous.templates().map(sidecar_injector_core::Template::name).filter(|name| !kept(name));
        names.map(|name| Removed { name: name.to_owned(), injected: metrics.uses(name) }).collect()
    }

    /// `a, b (12 pods injected with it here)`: for the log and `/readyz`.
    pub(crate) fn list(removed: &[Removed]) -> String {
        let one = |r: &Removed| match r.injected {
            0 => r.name.clone(),
            n => format!("{} ({n} pods injected with it here)", r.name),
        };
        removed.iter().map(one).collect::<Vec<_>>().join(", ")
    }
}

/// A template edit refused.
#[derive(Debug)]
pub(crate) struct Refused {
    /// What was refused, quoting nothing of it: the files' names (for `/readyz`).
    pub subject: String,
    /// Why, in full (for the log).
    pub reason: String,
}

impl ReloadState {
    pub(crate) fn new(engine: &Engine) -> Self {
        ReloadState {
            generation: AtomicU64::new(1),
            seen: ArcSwap::from_pointee(engine.set().hash().to_owned()),
            refused: ArcSwapOption::empty(),
            removed: ArcSwap::from_pointee(Vec::new()),
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    pub(crate) fn refused(&self) -> Option<Arc<Refused>> {
        self.refused.load_full()
    }

    /// The templates the reload of the set serving removed (none at start).
    pub(crate) fn removed(&self) -> Arc<Vec<Removed>> {
        self.removed.load_full()
    }
}

/// Compiles a directory's sources into a set: [`TemplateWatch::compile`], replaceable in tests.
pub(crate) type Compile = fn(&TemplateWatch, SetSources) -> Result<TemplateSet, TemplateError>;

/// One reloader: the watch configuration, the engine it swaps and the state it reports.
#[derive(Clone)]
pub(crate) struct Reloader {
    pub watch: TemplateWatch,
    pub engine: Arc<ArcSwap<Engine>>,
    pub state: Arc<ReloadState>,
    pub metrics: RevisionMetrics,
    pub compile: Compile,
}

impl Reloader {
    /// Watches and reloads forever; restarted if it ever stops.
    pub(crate) async fn run(self) {
        let metrics = self.metrics.clone();
        super::supervise(
            "template reload",
            super::SUPERVISE_BACKOFF,
            move || metrics.template_reload(false),
            move || self.clone().watch(),
        )
        .await;
    }

    async fn watch(self) {
        let wake = Arc::new(tokio::sync::Notify::new());
        let _watcher = if self.watch.events { self.start_watcher(wake.clone()) } else { None };
        let mut ticks = tokio::time::interval(self.watch.poll_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is immediate; the directory was just loaded
        loop {
            tokio::select! {
                () = wake.notified() => tokio::time::sleep(self.watch.debounce).await,
                _ = ticks.tick() => {}
            }
            self.check().await;
        }
    }

    /// An inotify watch on the directory that wakes the loop on any event; `None` (polling only) when
    /// inotify is unavailable (`fs.inotify.max_user_instances` reached, an exotic filesystem).
    fn start_watcher(&self, wake: Arc<tokio::sync::Notify>) -> Option<notify::RecommendedWatcher> {
        let started = notify::recommended_watcher(move |_event: notify::Result<notify::Event>| wake.notify_one())
            .and_then(|mut watcher| {
                watcher.watch(&self.watch.dir, notify::RecursiveMode::NonRecursive)?;
                Ok(watcher)
            });
        match started {
            Ok(watcher) => Some(watcher),
            Err(e) => {
                tracing::warn!(dir = %self.watch.dir.display(), error = %e,
                    interval = ?self.watch.poll_interval, "cannot watch the template directory; polling only");
                None
            }
        }
    }

    /// Reads the directory and, if its content changed, compiles and publishes it: on a blocking thread, since
    /// it reads files and compiling takes a while. A panic there is caught, counted and retried at the next tick.
    pub(crate) async fn check(&self) {
        let this = self.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || this.check_blocking()).await {
            let reason = if e.is_panic() { super::panic_message(e.into_panic()) } else { e.to_string() };
            self.state.seen.store(Arc::new(String::new())); // so the same content is tried again
            self.metrics.template_reload(false);
            tracing::error!(reason, "template reload panicked; the current templates keep serving");
        }
    }

    fn check_blocking(&self) {
        // A read can race the kubelet deleting the previous timestamped directory (a file resolved through the
        // old `..data` vanishes before it is opened): read again once before calling it a failure.
        let read = SetSources::read_dir(&self.watch.dir).or_else(|_| {
            std::thread::sleep(REREAD_PAUSE);
            SetSources::read_dir(&self.watch.dir)
        });
        let sources = match read {
            Ok(sources) => sources,
            Err(e) => return self.refuse(&e),
        };
        let hash = sources.hash();
        if **self.state.seen.load() == hash {
            return;
        }
        self.state.seen.store(Arc::new(hash.clone()));
        // The same set may already serve, read through the API server before the kubelet projected it
        // ([`super::refresh`]): nothing to publish.
        if self.engine.load().set().hash() == hash {
            return;
        }
        match (self.compile)(&self.watch, sources) {
            Ok(engine) => self.publish(engine),
            Err(e) => self.refuse(&e),
        }
    }

    /// Publishes the set a read of the directory's ConfigMap through the API server gave, unless it is the one
    /// serving: compiled and published (or refused) as the same edit will be when it reaches the directory. The
    /// directory's own content, and so what its watch compares against, is left as it is: until the kubelet
    /// projects the edit, the directory still shows the older set, which must not be published over this one.
    pub(crate) fn apply_config_map(&self, data: std::collections::BTreeMap<String, String>) -> ReadResult {
        let sources = SetSources::from_config_map(&self.watch.dir.display().to_string(), data);
        if self.engine.load().set().hash() == sources.hash() {
            return ReadResult::Unchanged;
        }
        match (self.compile)(&self.watch, sources) {
            Ok(set) => {
                self.publish(set);
                ReadResult::Changed
            }
            Err(e) => {
                self.refuse(&e);
                ReadResult::Error
            }
        }
    }

    /// Serves `set` from now on, with its serving state carried over from the set it replaces.
    fn publish(&self, set: TemplateSet) {
        let previous = self.engine.load_full();
        let served = Served::after(&previous, &set, std::time::Instant::now());
        let engine = Engine::serving(set, &self.watch.settings, Arc::new(served));
        let set = engine.set();
        let names = set.names();
        let left_out = set.unavailable_summary();
        let hash = set.hash().to_owned();
        if !set.ignored().is_empty() {
            tracing::warn!(files = ?set.ignored(), "files in the template directory that are not templates were ignored");
        }
        let removed = Removed::between(previous.set(), set, &self.metrics);
        self.metrics.template_names(set.templates().map(sidecar_injector_core::Template::name));
        self.engine.store(Arc::new(engine));
        let generation = self.state.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.state.refused.store(None);
        self.metrics.template_reload(true);
        self.metrics.template_set(generation, &hash);
        let listed = Removed::list(&removed);
        if removed.iter().any(|r| r.injected > 0) {
            tracing::warn!(generation, set = %hash, templates = %names, left_out = %left_out, removed = %listed,
                "templates reloaded; it removed templates that pods were injected with: pods naming them are now \
                 admitted without the sidecar");
        } else {
            tracing::info!(generation, set = %hash, templates = %names, left_out = %left_out, removed = %listed,
                "templates reloaded");
        }
        self.state.removed.store(Arc::new(removed));
    }

    fn refuse(&self, error: &TemplateError) {
        let reason = error.to_string();
        let repeated = self.state.refused.load().as_deref().is_some_and(|r| r.reason == reason);
        self.state.refused.store(Some(Arc::new(Refused { subject: error.subject(), reason })));
        self.metrics.template_reload(false);
        if !repeated {
            tracing::error!(
                error = %error,
                generation = self.state.generation(),
                set = %self.engine.load().set().hash(),
                "template edit refused; the last good templates keep serving"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::server::telemetry::Metrics;

    static PANIC_NEXT: AtomicBool = AtomicBool::new(true);

    /// Panics on its first call, then compiles normally.
    fn panics_once(watch: &TemplateWatch, sources: SetSources) -> Result<TemplateSet, TemplateError> {
        if PANIC_NEXT.swap(false, Ordering::SeqCst) {
            panic!("a bug in compilation");
        }
        watch.compile(sources)
    }

    const SOURCE: &str = "pod:\n  spec:\n    containers:\n      - name: p\n        image: old\n";

    /// A reloader over a new directory holding `default.yaml` = `SOURCE`.
    /// The reloader, and the server-wide metrics its revision's series render in.
    fn reloader(dir: &std::path::Path, compile: Compile) -> (Reloader, Metrics) {
        std::fs::write(dir.join("default.yaml"), SOURCE).unwrap();
        let settings = Settings::default();
        let first = TemplateSet::load_dir(dir, "default", &settings).unwrap();
        let engine = Arc::new(ArcSwap::from_pointee(Engine::new(first, &settings)));
        let metrics = Metrics::new().unwrap();
        let reloader = Reloader {
            watch: TemplateWatch {
                dir: dir.to_owned(),
                default_template: "default".into(),
                settings,
                poll_interval: Duration::from_secs(3600),
                debounce: Duration::ZERO,
                events: false,
                source: None,
            },
            state: Arc::new(ReloadState::new(&engine.load())),
            engine,
            metrics: metrics.revision("default"),
            compile,
        };
        (reloader, metrics)
    }

    #[tokio::test]
    async fn an_unreadable_directory_is_reported_and_the_old_set_serves() {
        let dir = tempfile::tempdir().unwrap();
        let (reloader, metrics) = reloader(dir.path(), TemplateWatch::compile);
        let old = reloader.engine.load().set().hash().to_owned();
        std::fs::remove_dir_all(dir.path()).unwrap();
        reloader.check().await;
        assert_eq!(reloader.engine.load().set().hash(), old);
        let refused = reloader.state.refused().expect("the failure is shown");
        assert!(refused.reason.contains("cannot read the template directory"), "{refused:?}");
        assert_eq!(refused.subject, "the template directory");
        let rendered = metrics.render();
        assert!(
            rendered.contains(r#"sidecar_injector_template_last_reload_success{revision="default"} 0"#),
            "{rendered}"
        );
    }

    #[tokio::test]
    async fn after_two_reloads_one_template_set_info_series_remains_the_one_serving() {
        let dir = tempfile::tempdir().unwrap();
        let (reloader, metrics) = reloader(dir.path(), TemplateWatch::compile);
        reloader.metrics.template_start(reloader.engine.load().set().hash());
        for image in ["new", "newer"] {
            std::fs::write(dir.path().join("default.yaml"), SOURCE.replace("old", image)).unwrap();
            reloader.check().await;
        }
        assert_eq!(reloader.state.generation(), 3, "both edits were published");
        let rendered = metrics.render();
        let series: Vec<&str> =
            rendered.lines().filter(|l| l.starts_with("sidecar_injector_template_set_info")).collect();
        let serving = reloader.engine.load().set().hash().to_owned();
        let expected = format!("sidecar_injector_template_set_info{{revision=\"default\",hash=\"{serving}\"}} 1");
        assert_eq!(series, [expected], "{rendered}");
    }

    #[tokio::test]
    async fn a_panicking_reload_is_counted_and_retried_while_the_old_set_serves() {
        let dir = tempfile::tempdir().unwrap();
        let (reloader, metrics) = reloader(dir.path(), panics_once);
        let (engine, source) = (reloader.engine.clone(), SOURCE);
        let old = engine.load().set().hash().to_owned();
        reloader.check().await;
        assert_eq!(engine.load().set().hash(), old, "unchanged content is not compiled");

        std::fs::write(dir.path().join("default.yaml"), source.replace("old", "new")).unwrap();
        reloader.check().await;
        assert_eq!(engine.load().set().hash(), old, "the panic left the old set serving");
        assert_eq!(reloader.state.generation(), 1);
        let errors = r#"sidecar_injector_template_reloads_total{revision="default",result="error"} 1"#;
        assert!(metrics.render().contains(errors));

        reloader.check().await;
        assert_ne!(engine.load().set().hash(), old, "the same content was tried again, and published");
        assert_eq!(reloader.state.generation(), 2);
        assert!(
            metrics.render().contains(r#"sidecar_injector_template_reloads_total{revision="default",result="ok"} 1"#)
        );
    }
}
