//! Metrics: registered once at start as handles, so recording one on the request path is an atomic add, not a
//! registry lookup. Rendered in the Prometheus text format on the admin listener.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{LabelSet, Matcher, PrometheusBuilder, PrometheusHandle, formatting};

use sidecar_injector_core::{SkipReason, TemplateId};

use super::Endpoint;

/// Why a request got an error status (the `reason` label of `result="error"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum ErrorReason {
    BadRequest,
    TooLarge,
    Timeout,
    Panic,
    NotFound,
    #[strum(serialize = "method-not-allowed")]
    Method,
    #[strum(serialize = "unsupported-media-type")]
    MediaType,
    Overloaded,
}

impl ErrorReason {
    /// Every one, for registering metrics up front.
    const ALL: &'static [ErrorReason] = <ErrorReason as strum::VariantArray>::VARIANTS;

    /// Its name: a metric's label, the word in logs, warnings and the docs.
    fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why a connection ended before its client closed it normally (the `kind` label of
/// `sidecar_injector_connection_errors_total`). Each is logged at debug level, with the peer; at warning level
/// only [`report_connection_errors`]' summary appears, at most once per [`CONNECTION_ERROR_LOG_INTERVAL`], so that a
/// scanner or a broken client cannot flood the log with a line per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum ConnectionError {
    /// The TLS handshake failed (no common protocol or cipher, a refused client certificate, not TLS at all).
    TlsHandshake,
    /// The TLS handshake and first request, or a later request's headers, did not arrive within
    /// `--header-read-timeout`.
    Timeout,
    /// An HTTP/1.1 protocol error (a request that does not parse, headers too large).
    Http1,
    /// An HTTP/2 protocol error, the rapid-reset flood (CVE-2023-44487) among them.
    Http2,
    /// The transport failed under the connection (reset by the peer, closed mid-request).
    Io,
    /// Cut to make room at the connection limit: it had made no progress the longest (no first request yet, or
    /// answers its peer did not take).
    Evicted,
}

impl ConnectionError {
    /// Every one, for registering metrics up front.
    const ALL: &'static [ConnectionError] = <ConnectionError as strum::VariantArray>::VARIANTS;

    /// Its name: a metric's label, the word in logs, warnings and the docs.
    pub(crate) fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What one read of the template ConfigMap did (the `result` label of `sidecar_injector_template_reads_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum ReadResult {
    /// It held another set than the one serving, which now serves.
    Changed,
    /// It held the set serving.
    Unchanged,
    /// It could not be read, or its set was refused (as the same edit reaching the volume will be).
    Error,
}

/// What became of a Kubernetes Event the server had to say (the `result` label of `sidecar_injector_events_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum EventResult {
    /// Created, or counted into an Event's series.
    Published,
    /// The API server refused it or could not be reached (logged at debug level).
    Failed,
    /// Not queued: the queue was full (`events::QUEUE`).
    Dropped,
}

/// At most one warning line per this interval summarises the connection errors counted since the previous one.
pub(crate) const CONNECTION_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The webhooks a request's duration is timed under, with their `webhook` label: each a server answers, then
/// `other` for requests whose path names none.
const TIMED_WEBHOOKS: [(Option<Endpoint>, &str); 4] = [
    (Some(Endpoint::Mutate), "mutate"),
    (Some(Endpoint::Validate), "validate"),
    (Some(Endpoint::Preview), "preview"),
    (None, "other"),
];

/// Buckets of the request duration, in seconds: from 10 µs (a cached answer) to 1 s (something is very wrong).
const DURATION_BUCKETS: [f64; 12] = [1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 1e-1, 1.0];

/// Buckets of the request body size, in bytes: from 1 KiB (a bare pod) by fours to 4 MiB (as large as the default
/// `--max-body-bytes`).
const BODY_BUCKETS: [f64; 7] = [1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0];

/// How often histogram samples are drained into their buckets: samples pile up in memory between drains, so
/// this bounds that memory under load even when nothing scrapes (scrapes drain too).
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// One counter of `name` per reason, labelled `result` and `reason`, for every reason in `reasons`: each series
/// exists (at 0) from the start, so that a rate or an alert on any of them works before its first event, and no
/// reason goes uncounted for want of a series.
fn per_reason<R: Copy>(
    name: &'static str,
    result: &'static str,
    reasons: &[R],
    label: fn(R) -> &'static str,
) -> Vec<(R, Counter)> {
    reasons.iter().map(|r| (*r, metrics::counter!(name, "result" => result, "reason" => label(*r)))).collect()
}

/// [`per_reason`] for one revision's series (labelled `revision` too).
fn per_reason_of<R: Copy>(
    name: &'static str,
    revision: &str,
    result: &'static str,
    reasons: &[R],
    label: fn(R) -> &'static str,
) -> Vec<(R, Counter)> {
    let counter =
        |r: R| metrics::counter!(name, "revision" => revision.to_owned(), "result" => result, "reason" => label(r));
    reasons.iter().map(|r| (*r, counter(*r))).collect()
}

/// Adds one to the counter registered for `reason` ([`per_reason`] registers one for every reason).
fn count<R: PartialEq + std::fmt::Debug>(counters: &[(R, Counter)], reason: R) {
    match counters.iter().find(|(r, _)| *r == reason) {
        Some((_, counter)) => counter.increment(1),
        None => debug_assert!(false, "no counter registered for {reason:?}"),
    }
}

/// The metric handles. Cloning shares them.
#[derive(Clone)]
pub(crate) struct Metrics(Arc<Handles>);

/// One request in flight, counted in `sidecar_injector_requests_in_flight` from [`Metrics::in_flight`] until it is
/// dropped: when the request is answered, and also when hyper drops the request's future unanswered (the client
/// went away mid-request), which a decrement placed after an `.await` would miss, leaving the gauge one too high
/// for good.
#[must_use = "the request counts as in flight until this is dropped"]
pub(crate) struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

struct Handles {
    /// Kept to register the series of each revision the server is given.
    recorder: metrics_exporter_prometheus::PrometheusRecorder,
    prometheus: PrometheusHandle,
    errors: Vec<(ErrorReason, Counter)>,
    /// Per webhook, in [`TIMED_WEBHOOKS`] order.
    duration: [Histogram; 4],
    body_bytes: Histogram,
    in_flight: Gauge,
    inflight_body_bytes: Gauge,
    /// Per kind: the counter, and the same count readable here for [`report_connection_errors`].
    connection_errors: Vec<(ConnectionError, Counter, AtomicU64)>,
    /// Signalled at each connection error (a stored permit when the reporter is not waiting).
    connection_error_seen: tokio::sync::Notify,
    handshakes_ok: Counter,
    handshakes_failed: Counter,
    reloads_ok: Counter,
    reloads_failed: Counter,
    events: Vec<(EventResult, Counter)>,
    /// The revisions' handles, in the server's order, for rendering their template set series.
    revisions: std::sync::Mutex<Vec<RevisionMetrics>>,
}

/// The metrics of one revision (its template set and the requests it answered), labelled `revision`. Cloning
/// shares them.
#[derive(Clone)]
pub(crate) struct RevisionMetrics(Arc<RevisionHandles>);

struct RevisionHandles {
    revision: String,
    injected: Counter,
    skipped: Vec<(SkipReason, Counter)>,
    denied: Vec<(SkipReason, Counter)>,
    validated_ok: Counter,
    validated_missing_denied: Counter,
    validated_missing_warned: Counter,
    validated_skipped: Vec<(SkipReason, Counter)>,
    /// Previews: with no warning, with warnings, and of objects not previewed.
    previews: [Counter; 3],
    template_reloads_ok: Counter,
    template_reloads_failed: Counter,
    template_reads: Vec<(ReadResult, Counter)>,
    template_generation: Gauge,
    template_last_reload_ok: Gauge,
    /// The hash of the set serving, for `sidecar_injector_template_set_info` (empty before the first).
    template_set: ArcSwap<String>,
    /// How many pods this replica injected with each template of the set serving, by name; carried over a reload
    /// for the templates it keeps. A reload that removes a template reads it to say whether pods use it.
    uses: ArcSwap<Vec<(String, AtomicU64)>>,
}

/// How a family is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A metric family, written once: its name, how it is recorded, its unit and its help line. [`FAMILIES`] lists
/// them all; each is described on the recorder from there, and registered by name where its series are made.
struct Family {
    name: &'static str,
    kind: Kind,
    unit: Option<metrics::Unit>,
    help: &'static str,
}

const REQUESTS: Family = Family {
    name: "sidecar_injector_requests_total",
    kind: Kind::Counter,
    unit: None,
    help: "Admission requests answered, by result and reason.",
};

const VALIDATIONS: Family = Family {
    name: "sidecar_injector_validations_total",
    kind: Kind::Counter,
    unit: None,
    help: "Pods validated: ok (fully injected), missing (lacking part of the injection; denied or warned), skipped.",
};

const TAG_REQUESTS: Family = Family {
    name: "sidecar_injector_tag_requests_total",
    kind: Kind::Counter,
    unit: None,
    help: "Admission requests that came through a revision tag's webhooks, by revision and tag.",
};

const PREVIEWS: Family = Family { name: "sidecar_injector_previews_total", kind: Kind::Counter, unit: None, help: "" };

const DURATION: Family = Family {
    name: "sidecar_injector_request_duration_seconds",
    kind: Kind::Histogram,
    unit: Some(metrics::Unit::Seconds),
    help: "Time to answer one admission request.",
};

const BODY: Family = Family {
    name: "sidecar_injector_request_body_bytes",
    kind: Kind::Histogram,
    unit: Some(metrics::Unit::Bytes),
    help: "Size of admission request bodies.",
};

const TEMPLATE_RELOADS: Family = Family {
    name: "sidecar_injector_template_reloads_total",
    kind: Kind::Counter,
    unit: None,
    help: "Template directory changes applied (ok) or refused (error).",
};

const IN_FLIGHT: Family = Family {
    name: "sidecar_injector_requests_in_flight",
    kind: Kind::Gauge,
    unit: None,
    help: "Admission requests being answered now.",
};

const HANDSHAKES: Family = Family {
    name: "sidecar_injector_tls_handshakes_total",
    kind: Kind::Counter,
    unit: None,
    help: "TLS handshakes on the webhook listener: completed (ok) or failed (error).",
};

const CERTIFICATE_RELOADS: Family = Family {
    name: "sidecar_injector_certificate_reloads_total",
    kind: Kind::Counter,
    unit: None,
    help: "Serving certificate changes applied (ok) or refused (error; the last good certificate serves).",
};

const BUILD_INFO: Family = Family {
    name: "sidecar_injector_build_info",
    kind: Kind::Gauge,
    unit: None,
    help: "1, labelled with the injector's version.",
};

const TEMPLATE_SET: Family = Family {
    name: "sidecar_injector_template_set_info",
    kind: Kind::Gauge,
    unit: None,
    help: "The template set each revision serves (1), by revision and hash.",
};

const TEMPLATE_READS: Family =
    Family { name: "sidecar_injector_template_configmap_reads_total", kind: Kind::Counter, unit: None, help: "" };

const CONNECTION_ERRORS: Family = Family {
    name: "sidecar_injector_connection_errors_total",
    kind: Kind::Counter,
    unit: None,
    help: "Connections ended by an error, by kind (the kind label: tls-handshake, timeout, http1, http2, io, evicted).",
};

const EVENTS: Family = Family {
    name: "sidecar_injector_events_total",
    kind: Kind::Counter,
    unit: None,
    help: "Kubernetes Events about admissions (--events), by result: published, failed, dropped (the queue full).",
};

const INFLIGHT_BODY_BYTES: Family = Family {
    name: "sidecar_injector_inflight_body_bytes",
    kind: Kind::Gauge,
    unit: Some(metrics::Unit::Bytes),
    help: "Request body bytes, and answer bytes until sent, held in memory now over every connection (at most --max-inflight-body-bytes).",
};

const TEMPLATE_GENERATION: Family = Family {
    name: "sidecar_injector_template_generation",
    kind: Kind::Gauge,
    unit: None,
    help: "Template sets published since start (1 at start), by revision.",
};

const TEMPLATE_LAST_RELOAD: Family = Family {
    name: "sidecar_injector_template_last_reload_success",
    kind: Kind::Gauge,
    unit: None,
    help: "1 when the newest template edit was applied, 0 when it was refused (the last good set serves), by revision.",
};

/// Every family the server records.
const FAMILIES: [&Family; 18] = [
    &REQUESTS,
    &TAG_REQUESTS,
    &VALIDATIONS,
    &PREVIEWS,
    &DURATION,
    &BODY,
    &TEMPLATE_RELOADS,
    &IN_FLIGHT,
    &HANDSHAKES,
    &CERTIFICATE_RELOADS,
    &BUILD_INFO,
    &TEMPLATE_SET,
    &TEMPLATE_READS,
    &CONNECTION_ERRORS,
    &EVENTS,
    &INFLIGHT_BODY_BYTES,
    &TEMPLATE_GENERATION,
    &TEMPLATE_LAST_RELOAD,
];

/// Describes every family on the recorder in scope (its `# HELP` line and unit). The template set's family is
/// rendered by hand ([`render_template_sets`]), so it is described there.
fn describe_families() {
    for family in FAMILIES.iter().filter(|family| family.name != TEMPLATE_SET.name) {
        let (name, help) = (family.name, family.help);
        match (family.kind, family.unit) {
            (Kind::Counter, Some(unit)) => metrics::describe_counter!(name, unit, help),
            (Kind::Counter, None) => metrics::describe_counter!(name, help),
            (Kind::Gauge, Some(unit)) => metrics::describe_gauge!(name, unit, help),
            (Kind::Gauge, None) => metrics::describe_gauge!(name, help),
            (Kind::Histogram, Some(unit)) => metrics::describe_histogram!(name, unit, help),
            (Kind::Histogram, None) => metrics::describe_histogram!(name, help),
        }
    }
}

impl Metrics {
    /// A recorder of this server's own (not the process-wide one, so that servers in one process, as in the
    /// tests, keep separate counts) and every metric registered on it.
    pub(crate) fn new() -> Result<Metrics, metrics_exporter_prometheus::BuildError> {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(DURATION.name.to_owned()), &DURATION_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(BODY.name.to_owned()), &BODY_BUCKETS))?
            .build_recorder();
        let prometheus = recorder.handle();
        let handles = metrics::with_local_recorder(&recorder, || Self::register(prometheus));
        Ok(Metrics(Arc::new(Handles { recorder, ..handles })))
    }

    /// The counter of requests to `revision` through the tag `tag` (made by the first call through the tag).
    pub(crate) fn tag_requests(&self, revision: &str, tag: &str) -> Counter {
        metrics::with_local_recorder(
            &self.0.recorder,
            || metrics::counter!(TAG_REQUESTS.name, "revision" => revision.to_owned(), "tag" => tag.to_owned()),
        )
    }

    /// Registers the series of `revision` (every one at 0, as [`per_reason`] does), and renders its template set
    /// series from then on.
    pub(crate) fn revision(&self, revision: &str) -> RevisionMetrics {
        let handles = metrics::with_local_recorder(&self.0.recorder, || {
            let label = || revision.to_owned();
            let reasons = |name, result| per_reason_of(name, revision, result, SkipReason::ALL, SkipReason::as_str);
            let validated = |result: &'static str, reason: &'static str| metrics::counter!(VALIDATIONS.name, "revision" => label(), "result" => result, "reason" => reason);
            let template_reloads = |result: &'static str| metrics::counter!(TEMPLATE_RELOADS.name, "revision" => label(), "result" => result);
            RevisionHandles {
                revision: revision.to_owned(),
                injected: metrics::counter!(REQUESTS.name, "revision" => label(), "result" => "injected", "reason" => ""),
                skipped: reasons(REQUESTS.name, "skipped"),
                // Every reason, not only the ones a template's `onError: deny` gives today: a denial is never lost.
                denied: reasons(REQUESTS.name, "denied"),
                validated_ok: validated("ok", ""),
                validated_missing_denied: validated("missing", "denied"),
                validated_missing_warned: validated("missing", "warned"),
                validated_skipped: reasons(VALIDATIONS.name, "skipped"),
                previews: ["clean", "warned", "not-previewed"]
                    .map(|result| metrics::counter!(PREVIEWS.name, "revision" => label(), "result" => result)),
                template_reloads_ok: template_reloads("ok"),
                template_reloads_failed: template_reloads("error"),
                template_reads: (<ReadResult as strum::VariantArray>::VARIANTS.iter())
                    .map(|&result| {
                        let name: &'static str = result.into();
                        let counter = metrics::counter!(TEMPLATE_READS.name, "revision" => label(), "result" => name);
                        (result, counter)
                    })
                    .collect(),
                template_generation: metrics::gauge!(TEMPLATE_GENERATION.name, "revision" => label()),
                template_last_reload_ok: metrics::gauge!(TEMPLATE_LAST_RELOAD.name, "revision" => label()),
                template_set: ArcSwap::from_pointee(String::new()),
                uses: ArcSwap::from_pointee(Vec::new()),
            }
        });
        let metrics = RevisionMetrics(Arc::new(handles));
        // Only taken when a server starts and when metrics are rendered: never on the request path.
        self.0.revisions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(metrics.clone());
        metrics
    }

    /// Registers every metric on the recorder in scope; the handles stay bound to it.
    fn register(prometheus: PrometheusHandle) -> Handles {
        describe_families();
        let handles = Handles {
            // Replaced by the caller with the recorder in scope here.
            recorder: PrometheusBuilder::new().build_recorder(),
            prometheus,
            errors: per_reason(REQUESTS.name, "error", ErrorReason::ALL, ErrorReason::as_str),
            duration: TIMED_WEBHOOKS.map(|(_, label)| metrics::histogram!(DURATION.name, "webhook" => label)),
            body_bytes: metrics::histogram!(BODY.name),
            in_flight: metrics::gauge!(IN_FLIGHT.name),
            inflight_body_bytes: metrics::gauge!(INFLIGHT_BODY_BYTES.name),
            connection_errors: ConnectionError::ALL
                .iter()
                .map(|k| (*k, metrics::counter!(CONNECTION_ERRORS.name, "kind" => k.as_str()), AtomicU64::new(0)))
                .collect(),
            connection_error_seen: tokio::sync::Notify::new(),
            handshakes_ok: metrics::counter!(HANDSHAKES.name, "result" => "ok"),
            handshakes_failed: metrics::counter!(HANDSHAKES.name, "result" => "error"),
            reloads_ok: metrics::counter!(CERTIFICATE_RELOADS.name, "result" => "ok"),
            reloads_failed: metrics::counter!(CERTIFICATE_RELOADS.name, "result" => "error"),
            events: (<EventResult as strum::VariantArray>::VARIANTS.iter())
                .map(|&result| {
                    let name: &'static str = result.into();
                    (result, metrics::counter!(EVENTS.name, "result" => name))
                })
                .collect(),
            revisions: std::sync::Mutex::new(Vec::new()),
        };
        metrics::gauge!(BUILD_INFO.name, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
        handles
    }

    /// Every metric in the Prometheus text format (what `/metrics` answers).
    pub(crate) fn render(&self) -> String {
        let mut text = self.0.prometheus.render();
        let revisions = self.0.revisions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        render_template_sets(&mut text, &revisions);
        text
    }

    pub(crate) fn event(&self, result: EventResult) {
        count(&self.0.events, result);
    }

    pub(crate) fn error(&self, reason: ErrorReason) {
        count(&self.0.errors, reason);
    }

    /// One request of `webhook` (`None`: a path that names no webhook) took `elapsed`.
    pub(crate) fn duration(&self, webhook: Option<Endpoint>, elapsed: Duration) {
        // Every value of `webhook` is in the table.
        let index = TIMED_WEBHOOKS.iter().position(|(w, _)| *w == webhook).unwrap_or(TIMED_WEBHOOKS.len() - 1);
        self.0.duration[index].record(elapsed.as_secs_f64());
    }

    pub(crate) fn body_bytes(&self, bytes: usize) {
        self.0.body_bytes.record(bytes as f64);
    }

    /// Counts one more request in flight, until the guard is dropped.
    pub(crate) fn in_flight(&self) -> InFlight<'_> {
        self.0.in_flight.increment(1.0);
        InFlight(&self.0.in_flight)
    }

    /// Body bytes reserved (`bytes` > 0) or released (< 0) in the in-flight budget.
    pub(crate) fn inflight_body_bytes(&self, bytes: f64) {
        self.0.inflight_body_bytes.increment(bytes);
    }

    /// Counts a connection that ended with an error of `kind` (the caller logs it at debug level).
    pub(crate) fn connection_error(&self, kind: ConnectionError) {
        match self.0.connection_errors.iter().find(|(k, _, _)| *k == kind) {
            Some((_, counter, seen)) => {
                counter.increment(1);
                seen.fetch_add(1, Ordering::Relaxed);
                self.0.connection_error_seen.notify_one();
            }
            None => debug_assert!(false, "no counter registered for {kind:?}"),
        }
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

/// Help text of `sidecar_injector_template_set_info`.
/// `sidecar_injector_template_set_info{revision,hash} 1`, one series per revision naming the set it serves (only
/// that one). The recorder cannot remove a series, so a gauge per hash there left a 0-valued series behind at
/// every reload, for good; this family is rendered here instead (with the exporter's own formatting).
fn render_template_sets(text: &mut String, revisions: &[RevisionMetrics]) {
    let serving: Vec<(&str, Arc<String>)> = revisions
        .iter()
        .map(|r| (r.0.revision.as_str(), r.0.template_set.load_full()))
        .filter(|(_, h)| !h.is_empty())
        .collect();
    if serving.is_empty() {
        return;
    }
    formatting::write_help_line(text, TEMPLATE_SET.name, None, None, TEMPLATE_SET.help);
    formatting::write_type_line(text, TEMPLATE_SET.name, None, None, "gauge");
    for (revision, hash) in serving {
        let labels = vec![
            metrics::Label::new("revision", revision.to_owned()),
            metrics::Label::new("hash", hash.as_str().to_owned()),
        ];
        let key = metrics::Key::from_parts(TEMPLATE_SET.name, labels);
        let labels = LabelSet::from_key_and_global(&key, &Default::default());
        formatting::write_metric_line::<&str, f64>(text, TEMPLATE_SET.name, None, &labels, None, 1.0, None);
    }
    text.push('\n');
}

impl RevisionMetrics {
    /// A pod injected with `template` (one of the set, or a combination `a,b` of its templates).
    pub(crate) fn injected(&self, template: Option<&TemplateId>) {
        self.0.injected.increment(1);
        let Some(template) = template else { return };
        let uses = self.0.uses.load();
        for name in template.name.split(',') {
            if let Some((_, count)) = uses.iter().find(|(known, _)| known == name) {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The templates of the set now serving: their counts of pods injected start at 0, or where they were for a
    /// template the previous set had too.
    pub(crate) fn template_names<'a>(&self, names: impl Iterator<Item = &'a str>) {
        let previous = self.0.uses.load();
        let carried = |name: &str| {
            let count = previous.iter().find(|(known, _)| known == name).map(|(_, c)| c.load(Ordering::Relaxed));
            AtomicU64::new(count.unwrap_or(0))
        };
        self.0.uses.store(Arc::new(names.map(|name| (name.to_owned(), carried(name))).collect()));
    }

    /// How many pods this replica injected with the template `name` of the set serving (0 for one it lacks).
    pub(crate) fn uses(&self, name: &str) -> u64 {
        let uses = self.0.uses.load();
        uses.iter().find(|(known, _)| known == name).map_or(0, |(_, count)| count.load(Ordering::Relaxed))
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

    /// A preview of `templates` pod templates, with or without warnings.
    pub(crate) fn previewed(&self, templates: usize, warned: bool) {
        let [clean, warnings, not_previewed] = &self.0.previews;
        let counter = match (templates, warned) {
            (0, false) => not_previewed,
            (_, false) => clean,
            (_, true) => warnings,
        };
        counter.increment(1);
    }

    /// The template set serving at start.
    pub(crate) fn template_start(&self, hash: &str) {
        self.0.template_generation.set(1.0);
        self.0.template_last_reload_ok.set(1.0);
        self.0.template_set.store(Arc::new(hash.to_owned()));
    }

    pub(crate) fn template_reload(&self, ok: bool) {
        if ok { &self.0.template_reloads_ok } else { &self.0.template_reloads_failed }.increment(1);
        self.0.template_last_reload_ok.set(if ok { 1.0 } else { 0.0 });
    }

    /// A read of the template ConfigMap through the API server ([`super::refresh`]).
    pub(crate) fn template_read(&self, result: ReadResult) {
        if let Some((_, counter)) = self.0.template_reads.iter().find(|(r, _)| *r == result) {
            counter.increment(1);
        }
    }

    /// A new set was published: its generation, and the info series now names its hash (only its hash).
    pub(crate) fn template_set(&self, generation: u64, hash: &str) {
        self.0.template_generation.set(generation as f64);
        self.0.template_set.store(Arc::new(hash.to_owned()));
    }
}

/// Histogram samples accumulate until drained: drain them regularly, not only when scraped.
pub(crate) async fn upkeep(metrics: Metrics) {
    let mut ticks = tokio::time::interval(UPKEEP_INTERVAL);
    loop {
        ticks.tick().await;
        metrics.0.prometheus.run_upkeep();
    }
}

/// Logs the connection errors in one warning line at most every [`CONNECTION_ERROR_LOG_INTERVAL`]: the first error
/// after a quiet interval at once, those that follow within the interval summed up at its end. Each connection's
/// own error is at debug level; this is what shows at the default level.
pub(crate) async fn report_connection_errors(metrics: Metrics) {
    let mut reported = vec![0; ConnectionError::ALL.len()];
    loop {
        metrics.0.connection_error_seen.notified().await;
        let mut summary = String::new();
        for ((kind, _, seen), reported) in metrics.0.connection_errors.iter().zip(&mut reported) {
            let seen = seen.load(Ordering::Relaxed);
            if seen > *reported {
                if !summary.is_empty() {
                    summary.push(' ');
                }
                summary.push_str(&format!("{}={}", kind.as_str(), seen - *reported));
                *reported = seen;
            }
        }
        if !summary.is_empty() {
            tracing::warn!(
                counts = %summary,
                interval = ?CONNECTION_ERROR_LOG_INTERVAL,
                "connections ended by errors since the last report (one line per interval at most; each at debug level)"
            );
        }
        tokio::time::sleep(CONNECTION_ERROR_LOG_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The value of the series `series` (name and labels, as rendered), if it is there.
    fn value(rendered: &str, series: &str) -> Option<f64> {
        rendered.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// A family is described from its row of [`FAMILIES`]: one registered without a row there would be rendered
    /// without its help line, and one with a row but never registered would be documented for nothing.
    #[test]
    fn every_family_rendered_is_one_of_the_table_and_has_its_help_line() {
        let all = Metrics::new().unwrap();
        let metrics = all.revision("default");
        metrics.template_start("0123456789abcdef");
        all.body_bytes(1024);
        // Made by the first call through a tag.
        all.tag_requests("default", "prod").increment(1);
        let rendered = all.render();
        let typed: BTreeSet<&str> =
            rendered.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split_whitespace().next()).collect();
        let helped: BTreeSet<&str> =
            rendered.lines().filter_map(|l| l.strip_prefix("# HELP ")?.split_whitespace().next()).collect();
        let table: BTreeSet<&str> = FAMILIES.iter().map(|family| family.name).collect();
        assert_eq!(typed, helped, "{rendered}");
        assert_eq!(typed, table, "rendered families against the table");
    }

    #[test]
    fn every_reason_of_every_verdict_has_a_series_from_zero_and_is_counted() {
        let all = Metrics::new().unwrap();
        let metrics = all.revision("canary");
        let series = |name: &str, result: &str, reason: SkipReason| {
            format!("{name}{{revision=\"canary\",result=\"{result}\",reason=\"{}\"}}", reason.as_str())
        };
        let labels = [(REQUESTS.name, "skipped"), (REQUESTS.name, "denied"), (VALIDATIONS.name, "skipped")];
        let before = all.render();
        for (name, result) in labels {
            for &reason in SkipReason::ALL {
                assert_eq!(
                    value(&before, &series(name, result, reason)),
                    Some(0.0),
                    "{}",
                    series(name, result, reason)
                );
            }
        }
        for &reason in SkipReason::ALL {
            metrics.skipped(reason);
            metrics.denied(reason);
            metrics.validated_skipped(reason);
        }
        let after = all.render();
        for (name, result) in labels {
            for &reason in SkipReason::ALL {
                assert_eq!(value(&after, &series(name, result, reason)), Some(1.0), "{}", series(name, result, reason));
            }
        }
    }

    #[test]
    fn every_metric_family_has_help_text() {
        let metrics = Metrics::new().unwrap();
        metrics.revision("default").template_start("abc");
        let page = metrics.render();
        let families: Vec<&str> =
            page.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
        assert!(families.len() >= 15, "{page}");
        for family in families {
            assert!(page.contains(&format!("# HELP {family} ")), "{family} has no help text:\n{page}");
        }
    }

    #[test]
    fn a_request_stays_in_flight_until_its_guard_is_dropped_however_it_ends() {
        let metrics = Metrics::new().unwrap();
        let in_flight = |m: &Metrics| value(&m.render(), "sidecar_injector_requests_in_flight");
        let answered = metrics.in_flight();
        let abandoned = async {
            let _guard = metrics.in_flight();
            std::future::pending::<()>().await;
        };
        let mut abandoned = Box::pin(abandoned);
        let waker = std::task::Waker::noop();
        assert!(abandoned.as_mut().poll(&mut std::task::Context::from_waker(waker)).is_pending());
        assert_eq!(in_flight(&metrics), Some(2.0));
        drop(abandoned); // as hyper drops the service future of a client that went away
        drop(answered);
        assert_eq!(in_flight(&metrics), Some(0.0));
    }

    #[test]
    fn the_template_set_info_names_only_the_set_each_revision_serves() {
        let metrics = Metrics::new().unwrap();
        let (stable, canary) = (metrics.revision("stable"), metrics.revision("canary"));
        stable.template_start("aaaa");
        canary.template_start("dddd");
        stable.template_set(2, "bbbb");
        stable.template_set(3, "cccc");
        let rendered = metrics.render();
        let series: Vec<&str> = rendered.lines().filter(|l| l.starts_with(TEMPLATE_SET.name)).collect();
        assert_eq!(
            series,
            [
                r#"sidecar_injector_template_set_info{revision="stable",hash="cccc"} 1"#,
                r#"sidecar_injector_template_set_info{revision="canary",hash="dddd"} 1"#
            ],
            "{rendered}"
        );
        assert_eq!(rendered.matches(&format!("# TYPE {} gauge\n", TEMPLATE_SET.name)).count(), 1, "{rendered}");
        assert_eq!(value(&rendered, r#"sidecar_injector_template_generation{revision="stable"}"#), Some(3.0));
        assert_eq!(value(&rendered, r#"sidecar_injector_template_generation{revision="canary"}"#), Some(1.0));
    }
}
