//! Metrics: registered once at start as handles, so recording one on the request path is an atomic add, not a
//! registry lookup. Rendered in the Prometheus text format on the admin listener.

use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::SkipReason;

/// Why a request got an error status (the `reason` label of `result="error"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorReason {
    BadRequest,
    TooLarge,
    Timeout,
    Panic,
    NotFound,
    Method,
    MediaType,
}

impl ErrorReason {
    const ALL: [ErrorReason; 7] = [
        ErrorReason::BadRequest,
        ErrorReason::TooLarge,
        ErrorReason::Timeout,
        ErrorReason::Panic,
        ErrorReason::NotFound,
        ErrorReason::Method,
        ErrorReason::MediaType,
    ];

    fn as_str(self) -> &'static str {
        match self {
            ErrorReason::BadRequest => "bad-request",
            ErrorReason::TooLarge => "too-large",
            ErrorReason::Timeout => "timeout",
            ErrorReason::Panic => "panic",
            ErrorReason::NotFound => "not-found",
            ErrorReason::Method => "method-not-allowed",
            ErrorReason::MediaType => "unsupported-media-type",
        }
    }
}

/// Adds one to the counter registered for `reason`, if there is one.
fn count<R: PartialEq>(counters: &[(R, Counter)], reason: R) {
    if let Some((_, counter)) = counters.iter().find(|(r, _)| *r == reason) {
        counter.increment(1);
    }
}

/// The metric handles, and the recorder for the few series made later (by template hash). Cloning shares them.
#[derive(Clone)]
pub(crate) struct Metrics(Arc<Handles>, Arc<PrometheusRecorder>);

struct Handles {
    prometheus: PrometheusHandle,
    injected: Counter,
    skipped: Vec<(SkipReason, Counter)>,
    denied: Vec<(SkipReason, Counter)>,
    errors: Vec<(ErrorReason, Counter)>,
    validated_ok: Counter,
    validated_missing_denied: Counter,
    validated_missing_warned: Counter,
    validated_skipped: Vec<(SkipReason, Counter)>,
    duration: Histogram,
    body_bytes: Histogram,
    in_flight: Gauge,
    handshakes_ok: Counter,
    handshakes_failed: Counter,
    reloads_ok: Counter,
    reloads_failed: Counter,
    template_reloads_ok: Counter,
    template_reloads_failed: Counter,
    template_generation: Gauge,
    template_last_reload_ok: Gauge,
}

const REQUESTS: &str = "sidecar_injector_requests_total";
const VALIDATIONS: &str = "sidecar_injector_validations_total";
const DURATION: &str = "sidecar_injector_request_duration_seconds";
const BODY: &str = "sidecar_injector_request_body_bytes";
const TEMPLATE_RELOADS: &str = "sidecar_injector_template_reloads_total";
const TEMPLATE_SET: &str = "sidecar_injector_template_set_info";

impl Metrics {
    /// A recorder of this server's own (not the process-wide one, so that servers in one process, as in the
    /// tests, keep separate counts) and every metric registered on it.
    pub(crate) fn new() -> Result<Metrics, String> {
        let recorder = PrometheusBuilder::new()
            // From 10 µs (a cached answer) to 1 s (something is very wrong).
            .set_buckets_for_metric(
                Matcher::Full(DURATION.to_owned()),
                &[1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 1e-1, 1.0],
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(BODY.to_owned()),
                    &[1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0],
                )
            })
            .map_err(|e| e.to_string())?
            .build_recorder();
        let prometheus = recorder.handle();
        let handles = metrics::with_local_recorder(&recorder, || Self::register(prometheus));
        Ok(Metrics(Arc::new(handles), Arc::new(recorder)))
    }

    /// Registers every metric on the recorder in scope; the handles stay bound to it.
    fn register(prometheus: PrometheusHandle) -> Handles {
        metrics::describe_counter!(REQUESTS, "Admission requests answered, by result and reason.");
        metrics::describe_counter!(
            VALIDATIONS,
            "Pods validated: ok (fully injected), missing (lacking part of the injection; denied or warned), skipped."
        );
        metrics::describe_histogram!(DURATION, metrics::Unit::Seconds, "Time to answer one admission request.");
        metrics::describe_histogram!(BODY, metrics::Unit::Bytes, "Size of admission request bodies.");
        let handles = Handles {
            prometheus,
            injected: metrics::counter!(REQUESTS, "result" => "injected", "reason" => ""),
            skipped: SkipReason::ALL
                .iter()
                .map(|r| (*r, metrics::counter!(REQUESTS, "result" => "skipped", "reason" => r.as_str())))
                .collect(),
            denied: [SkipReason::RenderFailed, SkipReason::UnknownTemplate]
                .iter()
                .map(|r| (*r, metrics::counter!(REQUESTS, "result" => "denied", "reason" => r.as_str())))
                .collect(),
            errors: ErrorReason::ALL
                .iter()
                .map(|r| (*r, metrics::counter!(REQUESTS, "result" => "error", "reason" => r.as_str())))
                .collect(),
            validated_ok: metrics::counter!(VALIDATIONS, "result" => "ok", "reason" => ""),
            validated_missing_denied: metrics::counter!(VALIDATIONS, "result" => "missing", "reason" => "denied"),
            validated_missing_warned: metrics::counter!(VALIDATIONS, "result" => "missing", "reason" => "warned"),
            validated_skipped: SkipReason::ALL
                .iter()
                .map(|r| (*r, metrics::counter!(VALIDATIONS, "result" => "skipped", "reason" => r.as_str())))
                .collect(),
            duration: metrics::histogram!(DURATION),
            body_bytes: metrics::histogram!(BODY),
            in_flight: metrics::gauge!("sidecar_injector_requests_in_flight"),
            handshakes_ok: metrics::counter!("sidecar_injector_tls_handshakes_total", "result" => "ok"),
            handshakes_failed: metrics::counter!("sidecar_injector_tls_handshakes_total", "result" => "error"),
            reloads_ok: metrics::counter!("sidecar_injector_certificate_reloads_total", "result" => "ok"),
            reloads_failed: metrics::counter!("sidecar_injector_certificate_reloads_total", "result" => "error"),
            template_reloads_ok: metrics::counter!(TEMPLATE_RELOADS, "result" => "ok"),
            template_reloads_failed: metrics::counter!(TEMPLATE_RELOADS, "result" => "error"),
            template_generation: metrics::gauge!("sidecar_injector_template_generation"),
            template_last_reload_ok: metrics::gauge!("sidecar_injector_template_last_reload_success"),
        };
        metrics::describe_counter!(TEMPLATE_RELOADS, "Template directory changes applied (ok) or refused (error).");
        metrics::describe_gauge!(
            "sidecar_injector_template_generation",
            "Template sets published since start (1 at start)."
        );
        metrics::describe_gauge!(
            "sidecar_injector_template_last_reload_success",
            "1 when the newest template edit was applied, 0 when it was refused (the last good set serves)."
        );
        metrics::describe_gauge!(TEMPLATE_SET, "The template set serving (1) by hash.");
        metrics::gauge!("sidecar_injector_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
        handles
    }

    pub(crate) fn render(&self) -> String {
        self.0.prometheus.render()
    }

    pub(crate) fn injected(&self) {
        self.0.injected.increment(1);
    }

    pub(crate) fn skipped(&self, reason: SkipReason) {
        count(&self.0.skipped, reason);
    }

    pub(crate) fn denied(&self, reason: SkipReason) {
        count(&self.0.denied, reason);
    }

    pub(crate) fn validated_ok(&self) {
        self.0.validated_ok.increment(1);
    }

    pub(crate) fn validated_missing(&self, refused: bool) {
        let counter = if refused { &self.0.validated_missing_denied } else { &self.0.validated_missing_warned };
        counter.increment(1);
    }

    pub(crate) fn validated_skipped(&self, reason: SkipReason) {
        count(&self.0.validated_skipped, reason);
    }

    pub(crate) fn error(&self, reason: ErrorReason) {
        count(&self.0.errors, reason);
    }

    pub(crate) fn duration(&self, elapsed: Duration) {
        self.0.duration.record(elapsed.as_secs_f64());
    }

    pub(crate) fn body_bytes(&self, bytes: usize) {
        self.0.body_bytes.record(bytes as f64);
    }

    pub(crate) fn in_flight(&self, delta: f64) {
        self.0.in_flight.increment(delta);
    }

    pub(crate) fn handshake_done(&self) {
        self.0.handshakes_ok.increment(1);
    }

    pub(crate) fn handshake_failed(&self) {
        self.0.handshakes_failed.increment(1);
    }

    pub(crate) fn cert_reload(&self, ok: bool) {
        if ok { &self.0.reloads_ok } else { &self.0.reloads_failed }.increment(1);
    }
}

impl Metrics {
    /// The template set serving at start.
    pub(crate) fn template_start(&self, hash: &str) {
        self.0.template_generation.set(1.0);
        self.0.template_last_reload_ok.set(1.0);
        metrics::with_local_recorder(&*self.1, || metrics::gauge!(TEMPLATE_SET, "hash" => hash.to_owned()).set(1.0));
    }

    pub(crate) fn template_reload(&self, ok: bool) {
        if ok { &self.0.template_reloads_ok } else { &self.0.template_reloads_failed }.increment(1);
        self.0.template_last_reload_ok.set(if ok { 1.0 } else { 0.0 });
    }

    /// A new set was published: its generation, and the info gauge moved from the previous hash to the new one.
    pub(crate) fn template_set(&self, generation: u64, previous: &str, hash: &str) {
        self.0.template_generation.set(generation as f64);
        metrics::with_local_recorder(&*self.1, || {
            metrics::gauge!(TEMPLATE_SET, "hash" => previous.to_owned()).set(0.0);
            metrics::gauge!(TEMPLATE_SET, "hash" => hash.to_owned()).set(1.0);
        });
    }
}

/// Histogram samples accumulate until drained: drain them regularly, not only when scraped.
pub(crate) async fn upkeep(metrics: Metrics) {
    let mut ticks = tokio::time::interval(Duration::from_secs(5));
    loop {
        ticks.tick().await;
        metrics.0.prometheus.run_upkeep();
    }
}
