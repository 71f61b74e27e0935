//! Reading the template ConfigMap through the API server, on demand: when a pod names a template this replica
//! does not have.
//!
//! The kubelet projects a ConfigMap edit into each replica's volume on its own sync, about a minute apart from
//! one replica to the next (docs/operations.md). A template added by that edit is named by pods at once, and the
//! mutating call for such a pod can meet a replica whose volume is still old: it would admit the pod without the
//! sidecar. Instead, the replica reads the ConfigMap itself (a consistent read, so at least as new as what any
//! replica's volume shows), publishes it as a reload would, and reviews the pod again. Reads are made by one task,
//! one at a time and at most one per [`MIN_GAP`]; a request waits only for a read that started after it arrived,
//! and never longer than its bound. The common path (every template known) never gets here.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::reload::Reloader;

/// The shortest time between two reads: a flood of pods naming a template that does not exist costs the API
/// server at most this rate of GETs.
pub(crate) const MIN_GAP: Duration = Duration::from_millis(250);
/// After a read that changed the set, read again this much later: longer than the kubelet takes to project an
/// edit (its sync period, a minute by default, and its cache's delay).
const RECHECK_AFTER: Duration = Duration::from_secs(150);
/// How long one read may take before it counts as failed.
const FETCH_TIMEOUT: Duration = Duration::from_secs(2);

/// A ConfigMap's `data`, or why it could not be read.
pub type FetchFuture = Pin<Box<dyn Future<Output = Result<BTreeMap<String, String>, FetchError>> + Send>>;

/// Why the ConfigMap could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The API server refused the read or did not answer.
    #[error("cannot read {what}")]
    Api {
        /// The ConfigMap.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// No answer within [`FETCH_TIMEOUT`].
    #[error("no answer within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
}

/// Where a revision's template directory comes from, read through the API server.
#[derive(Clone)]
pub struct TemplateSource {
    /// For logs: `ConfigMap sidecar-injector/sidecar-injector-templates`.
    pub label: String,
    fetch: Arc<dyn Fn() -> FetchFuture + Send + Sync>,
}

impl std::fmt::Debug for TemplateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TemplateSource").field("label", &self.label).finish_non_exhaustive()
    }
}

impl TemplateSource {
    /// The ConfigMap `namespace/name`, read with `client`.
    pub fn config_map(client: kube::Client, namespace: &str, name: &str) -> TemplateSource {
        let api = kube::Api::<ConfigMap>::namespaced(client, namespace);
        let (label, name) = (format!("ConfigMap {namespace}/{name}"), name.to_owned());
        let what = label.clone();
        TemplateSource::from_fn(label, move || {
            let (api, name, what) = (api.clone(), name.clone(), what.clone());
            Box::pin(async move {
                let configmap = api.get(&name).await.map_err(|source| FetchError::Api { what, source })?;
                Ok(configmap.data.unwrap_or_default())
            })
        })
    }

    /// A source that calls `fetch` for each read (the tests' fake API server).
    pub fn from_fn(label: String, fetch: impl Fn() -> FetchFuture + Send + Sync + 'static) -> TemplateSource {
        TemplateSource { label, fetch: Arc::new(fetch) }
    }
}

/// The one task that reads a revision's ConfigMap when requests ask for it.
pub(crate) struct Refresher {
    source: TemplateSource,
    reloader: Reloader,
    /// Set by a request that wants a read; a permit is kept if the task is busy, so a read follows.
    wanted: Notify,
    /// When the newest finished read started (`None` before the first).
    done: watch::Sender<Option<Instant>>,
}

impl Refresher {
    pub(crate) fn new(source: TemplateSource, reloader: Reloader) -> Arc<Refresher> {
        Arc::new(Refresher { source, reloader, wanted: Notify::new(), done: watch::Sender::new(None) })
    }

    /// Waits, at most `bound`, for a read of the ConfigMap that started at or after `since` (and its publication,
    /// if it changed the set); asks for one if none is under way. `false` if none finished in time.
    pub(crate) async fn read_since(&self, since: Instant, bound: Duration) -> bool {
        let mut done = self.done.subscribe();
        self.wanted.notify_one();
        let fresh = done.wait_for(|started| started.is_some_and(|started| started >= since));
        matches!(tokio::time::timeout(bound, fresh).await, Ok(Ok(_)))
    }

    /// Reads whenever asked, forever; restarted if it ever stops.
    pub(crate) async fn run(self: Arc<Self>) {
        let metrics = self.reloader.metrics.clone();
        super::supervise(
            "template ConfigMap reads",
            super::SUPERVISE_BACKOFF,
            move || metrics.template_read(ReadResult::Error),
            move || self.clone().serve(),
        )
        .await;
    }

    async fn serve(self: Arc<Self>) {
        let mut recheck = None;
        loop {
            tokio::select! {
                () = self.wanted.notified() => {}
                () = sleep_until_some(recheck) => {}
            }
            let started = Instant::now();
            let result = self.read().await;
            self.reloader.metrics.template_read(result);
            self.done.send_replace(Some(started));
            // A set read here serves ahead of the directory, which the kubelet updates later. Should the edit be
            // undone before then, the directory may never change and so never reload: read again once the
            // kubelet has had time to project the edit, until a read finds the set serving.
            recheck = (result == ReadResult::Changed).then(|| Instant::now() + RECHECK_AFTER);
            tokio::time::sleep(MIN_GAP).await;
        }
    }

    async fn read(&self) -> ReadResult {
        let data = match tokio::time::timeout(FETCH_TIMEOUT, (self.source.fetch)()).await {
            Ok(Ok(data)) => data,
            Ok(Err(e)) => return self.failed(&e),
            Err(_) => return self.failed(&FetchError::Timeout(FETCH_TIMEOUT)),
        };
        let reloader = self.reloader.clone();
        match tokio::task::spawn_blocking(move || reloader.apply_config_map(data)).await {
            Ok(result) => result,
            Err(e) => {
                let reason = if e.is_panic() { super::panic_message(e.into_panic()) } else { e.to_string() };
                tracing::error!(reason, "compiling the templates read from the API server panicked");
                ReadResult::Error
            }
        }
    }

    fn failed(&self, error: &FetchError) -> ReadResult {
        tracing::warn!(source = %self.source.label, error = %error, cause = ?std::error::Error::source(error),
            "cannot read the templates through the API server; the mounted ones keep serving");
        ReadResult::Error
    }
}

/// What one read of the ConfigMap did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadResult {
    /// It held another set than the one serving, which now serves.
    Changed,
    /// It held the set serving.
    Unchanged,
    /// It could not be read, or its set was refused (as the same edit reaching the volume will be).
    Error,
}

impl ReadResult {
    pub(crate) const ALL: [ReadResult; 3] = [ReadResult::Changed, ReadResult::Unchanged, ReadResult::Error];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReadResult::Changed => "changed",
            ReadResult::Unchanged => "unchanged",
            ReadResult::Error => "error",
        }
    }
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
