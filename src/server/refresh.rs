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

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::reload::Reloader;
use super::source::{FetchError, TemplateSource};
use super::telemetry::ReadResult;

/// The shortest time between two reads: a flood of pods naming a template that does not exist costs the API
/// server at most this rate of GETs.
pub(crate) const MIN_GAP: Duration = Duration::from_millis(250);
/// After a read that changed the set, read again this much later: longer than the kubelet takes to project an
/// edit (its sync period, a minute by default, and its cache's delay).
const RECHECK_AFTER: Duration = Duration::from_secs(150);
/// How long one read may take before it counts as failed.
pub(crate) const FETCH_TIMEOUT: Duration = Duration::from_secs(2);

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
        let data = match tokio::time::timeout(FETCH_TIMEOUT, self.source.fetch()).await {
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

/// Sleeps until `at`, or for ever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
