//! One webhook request: check method, path and media type, read the body into one buffer within the size limit
//! and the deadline, hand it to the engine mutably (simd-json parses in place), answer with the engine's bytes.

use std::convert::Infallible;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{ALLOW, CONNECTION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode, Version};

use super::budget::{BODY_BUDGET_WAIT, Reserved, held_for};
use super::conn::{Answering, RequestGuard};
use super::tags::Seen;
use super::telemetry::{ErrorReason, RevisionMetrics};
use super::{Endpoint, Revision, Shared};
use sidecar_injector_core::{Call, Mode, Outcome, ReviewError, Verdict};

type Answer = Response<Content>;

/// The body buffer's first capacity when the request announces no length (chunked): a typical pod's review fits,
/// so most requests read without growing it.
const UNANNOUNCED_BODY_CAPACITY: usize = 16 * 1024;

/// What the in-flight budget holds for a body before its bytes arrive, whatever its `Content-Length` says: the
/// reviews the API server sends fit (a pod of 60 KB is a large one); a larger body's share doubles as it arrives.
const FIRST_BODY_STEP: usize = 64 * 1024;

/// The answer buffer's first capacity: a typical injection's AdmissionReview response (its base64 patch) fits.
const ANSWER_CAPACITY: usize = 8 * 1024;

/// The most of an answer handed to hyper at once. hyper takes the next piece only when the last is written
/// (HTTP/1.1: its write buffer has room; HTTP/2: the stream has window), so an answer the peer does not read waits
/// here, in the memory account, rather than whole in hyper's or h2's buffers.
const ANSWER_PIECE: usize = 16 * 1024;

/// An answer larger than this gives back the room its buffer grew beyond it before it waits to be sent.
const LARGE_ANSWER: usize = 64 * 1024;

/// The body of an answer as hyper sends it: the bytes not yet handed over, and what must live until they are sent.
pub(crate) struct AnswerBody {
    rest: Bytes,
    /// The request's body, dropped only once the answer is sent: over HTTP/2 dropping an unfinished request body
    /// resets its stream, and before the answer is sent that reset (CANCEL) replaces the answer (an early 413 or
    /// 408); after, it is the RST_STREAM(NO_ERROR) that tells the client to stop sending and keep the answer.
    _request: Incoming,
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.rest.is_empty() {
            return Poll::Ready(None);
        }
        let piece = self.rest.len().min(ANSWER_PIECE);
        Poll::Ready(Some(Ok(Frame::data(self.rest.split_to(piece)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// An answer's bytes, and the share of the memory account they hold (a review's answer; a refusal holds none).
pub(crate) struct Content {
    bytes: Vec<u8>,
    _reserved: Option<Reserved>,
}

impl Content {
    fn unaccounted(bytes: Vec<u8>) -> Content {
        Content { bytes, _reserved: None }
    }
}

/// An answer handed to hyper: freed with the last piece of it (sent, or dropped with the connection), wherever
/// hyper or h2 keeps the pieces, which releases its share of the memory account and ends its request on the
/// connection (the write timeout's view of it).
struct Sending {
    content: Content,
    _answering: Answering,
}

impl AsRef<[u8]> for Sending {
    fn as_ref(&self) -> &[u8] {
        &self.content.bytes
    }
}

pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    request: RequestGuard,
) -> Result<Response<AnswerBody>, Infallible> {
    let start = Instant::now();
    // A guard, not a decrement after the `.await`: hyper drops this future when the client goes away mid-request.
    let _in_flight = shared.metrics.in_flight();
    let version = req.version();
    let (head, mut body) = req.into_parts();
    let (webhook, mut answer) = respond(&shared, &head, &mut body).await;
    // From the shutdown signal on, each HTTP/1.1 answer closes its connection: the client opens the next one, which
    // reaches a replica that stays, and no request is ever sent on a connection at the moment it is closed (as
    // closing an idle one would risk). HTTP/2 connections get a GOAWAY instead (`conn`).
    // The same past `--max-connection-age`: the API server's next request opens a connection that kube-proxy may
    // send to another replica (one added since), which reusing this one for ever would never do.
    let max_age = shared.config.max_connection_age;
    let aged = !max_age.is_zero() && request.connection_age() >= max_age;
    if version <= Version::HTTP_11 && (aged || shared.shutting_down.load(std::sync::atomic::Ordering::Relaxed)) {
        answer.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    shared.metrics.duration(webhook, start.elapsed());
    let answering = request.answering(answer.body().bytes.len());
    Ok(answer.map(|content| {
        let rest = Bytes::from_owner(Sending { content, _answering: answering });
        AnswerBody { rest, _request: body }
    }))
}

/// The webhook the request's path names, and the answer to the request; `body` is read as far as it needs to be,
/// and left to the caller (see [`AnswerBody`]).
async fn respond(
    shared: &Shared,
    req: &hyper::http::request::Parts,
    body: &mut Incoming,
) -> (Option<Endpoint>, Answer) {
    let config = &shared.config;
    let deadline = deadline(req.uri.query(), config.request_timeout);
    let routed = shared.route(req.uri.path());
    let webhook = routed.as_ref().map(|(_, endpoint, _)| *endpoint);
    let accepted = routed.ok_or_else(|| {
        let (mutate, validate, preview) = (&config.path, &config.validate_path, &config.preview_path);
        let mut paths = format!("POST {mutate}, POST {validate} and POST {preview}");
        if let [_, _, ..] = &*shared.revisions {
            let names: Vec<&str> = shared.revisions.iter().map(|r| r.name.as_str()).collect();
            paths.push_str(&format!(
                ", and {mutate}/REVISION, {validate}/REVISION and {preview}/REVISION for {}",
                names.join(", ")
            ));
        }
        paths.push_str(", each also through a revision tag as PATH/tag/TAG");
        Refusal::NotFound(paths)
    });
    let accepted = accepted.and_then(|(revision, endpoint, tag)| {
        let tag = tag.map(|tag| revision.tags.get(tag, &revision.name, &shared.metrics)).transpose();
        if req.method != Method::POST {
            Err(Refusal::Method)
        } else if !is_json(req.headers.get(CONTENT_TYPE)) {
            Err(Refusal::MediaType)
        } else {
            Ok((revision, endpoint, tag.map_err(Refusal::NotFound)?))
        }
    });
    let work = async {
        match accepted {
            Ok((revision, endpoint, tag)) => {
                read_and_review(shared, Called { revision, endpoint, tag }, body, deadline).await
            }
            Err(refusal) => {
                // Read what was sent (up to the limit): an HTTP/1.1 connection whose request body is left unread
                // is closed after the answer; read, it serves the client's next request.
                discard(body, config.max_body_bytes).await;
                refuse(shared, &refusal)
            }
        }
    };
    let answer = match tokio::time::timeout(deadline, work).await {
        Ok(answer) => answer,
        Err(_) => refuse(shared, &Refusal::Timeout(deadline)),
    };
    (webhook, answer)
}

/// Reads and drops up to `max` bytes of a body that will not be used.
async fn discard(body: &mut Incoming, max: usize) {
    let mut seen = 0;
    while seen <= max {
        match body.frame().await {
            Some(Ok(frame)) => seen += frame.data_ref().map_or(0, |d| d.len()),
            _ => break,
        }
    }
}

/// What a request's path names: the revision, the webhook, and the revision tag the call came through.
struct Called<'s> {
    revision: &'s Revision,
    endpoint: Endpoint,
    tag: Option<Arc<Seen>>,
}

async fn read_and_review(shared: &Shared, called: Called<'_>, body: &mut Incoming, deadline: Duration) -> Answer {
    let Called { revision, endpoint, tag } = called;
    let tag = tag.inspect(|seen| seen.called());
    let max = shared.config.max_body_bytes;
    let announced = body.size_hint().lower();
    if announced > max as u64 {
        // Refused from Content-Length, without reading the body.
        return refuse(shared, &Refusal::TooLarge(max));
    }
    let arrived = tokio::time::Instant::now();
    // The budget holds what has arrived, in steps, never what `Content-Length` announces alone: a client that
    // announces a large body and sends nothing holds one step (issue 51: twenty such connections kept every review
    // out). The buffers are sized for the announced length at once (one allocation each, no copy as they fill):
    // their memory is the pages written, which the budget covers. Released when the request ends (answered, or
    // dropped by hyper when the client goes away).
    let capacity = if announced > 0 { announced as usize } else { UNANNOUNCED_BODY_CAPACITY };
    let mut accounted = capacity.min(FIRST_BODY_STEP);
    let Some(mut reserved) = shared.body_budget.reserve(held_for(accounted), BODY_BUDGET_WAIT).await else {
        return refuse(shared, &Refusal::Overloaded(shared.body_budget.total()));
    };
    let mut buf = Vec::with_capacity(capacity + sidecar_injector_core::PARSE_PADDING);
    // The body as received, copied (the first review parses `buf` in place) only where a review may be made twice:
    // a revision that reads its ConfigMap for a template it lacks reviews again when the read changed the set.
    // Copied, not kept as hyper's frames: a frame is a slice of a read buffer, so a body sent a byte at a time
    // would pin a read buffer per byte, counted nowhere (issue 51: 800 MiB from 200 connections). The account
    // holds room for the copy either way (`held_for`).
    let keeps_copy = revision.refresh.is_some();
    let mut received = Vec::with_capacity(if keeps_copy { capacity } else { 0 });
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return refuse(shared, &Refusal::Body(e)),
        };
        if let Ok(data) = frame.into_data() {
            let needed = buf.len() + data.len();
            if needed > max {
                return refuse(shared, &Refusal::TooLarge(max));
            }
            if needed > accounted {
                // More has arrived than the budget holds for it: double its share, within the limit (the
                // announced length, which hyper holds the body to), once the budget has the bytes.
                let target = needed.max(2 * accounted).min(if announced > 0 { capacity } else { max });
                if !reserved.resize(held_for(target), BODY_BUDGET_WAIT).await {
                    return refuse(shared, &Refusal::Overloaded(shared.body_budget.total()));
                }
                accounted = target;
            }
            let room = buf.capacity() - sidecar_injector_core::PARSE_PADDING;
            if needed > room {
                // A chunked body outgrew its buffers: double them (as `Vec` would).
                let target = needed.max(2 * room).min(max);
                buf.reserve_exact(target + sidecar_injector_core::PARSE_PADDING - buf.len());
                if keeps_copy {
                    received.reserve_exact(target - received.len());
                }
            }
            buf.extend_from_slice(&data);
            if keeps_copy {
                received.extend_from_slice(&data);
            }
        }
    }
    shared.metrics.body_bytes(buf.len());
    let mut out = Vec::with_capacity(ANSWER_CAPACITY);
    // The engine the review used is kept (as an `Arc`, the guard released) only for a template this replica lacks:
    // perhaps one a ConfigMap edit added that the kubelet has not projected here yet.
    let lacks = |reviewed: &Reviewed| {
        revision.refresh.is_some() && matches!(reviewed, Ok(Ok(o)) if o.verdict.names_unknown_template())
    };
    let (mut reviewed, lacked) = {
        let engine = revision.engine.load();
        let reviewed = review(&engine, endpoint, call(shared, tag.as_deref()), &mut buf, &mut out);
        let lacked = lacks(&reviewed).then(|| arc_swap::Guard::into_inner(engine));
        (reviewed, lacked)
    };
    if let (Some(refresh), Some(used)) = (&revision.refresh, lacked) {
        // Read the ConfigMap, and review again if the set serving is no longer the one the review used.
        if refresh.read_since(arrived, REFRESH_WAIT.min(deadline / 2)).await {
            let now = revision.engine.load_full();
            if !Arc::ptr_eq(&used, &now) {
                refill(&mut buf, &received);
                out.clear();
                reviewed = review(&now, endpoint, call(shared, tag.as_deref()), &mut buf, &mut out);
            }
        }
    }
    // The body's buffers go, and the account holds the answer instead, until it is sent (an answer larger than
    // what the body held waits for room, as a body does).
    drop((buf, received));
    if out.capacity() > LARGE_ANSWER && out.capacity() > out.len() + out.len() / 4 {
        // A large answer grew by doubling: up to half its buffer is room, held as long as the answer waits.
        out.shrink_to_fit();
    }
    if !reserved.resize(out.capacity(), BODY_BUDGET_WAIT).await {
        return refuse(shared, &Refusal::Overloaded(shared.body_budget.total()));
    }
    match reviewed {
        Ok(Ok(outcome)) => {
            record(&revision.metrics, endpoint, &outcome);
            if let Some(events) = &shared.events {
                events.offer(outcome);
            }
            let mut answer = Response::new(Content { bytes: out, _reserved: Some(reserved) });
            answer.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            answer
        }
        Ok(Err(e)) => refuse(shared, &Refusal::Review(e)),
        Err(panic) => {
            tracing::error!(panic = %panic.0, "the engine panicked on a request; answered 500");
            refuse(shared, &Refusal::Panic)
        }
    }
}

/// A review, or why there is none: a bad request, or a panic caught.
type Reviewed = Result<Result<Outcome, ReviewError>, Panicked>;

/// How long a request naming a template this replica lacks waits for a read of the template ConfigMap
/// ([`super::refresh`]), at most: well within the API server's timeout for the call.
const REFRESH_WAIT: Duration = Duration::from_secs(2);

/// What the engine is told of a call beyond its body: the tag it came through, and whether an outcome needs its
/// subject (when Events are published).
fn call<'t>(shared: &Shared, tag: Option<&'t Seen>) -> Call<'t> {
    Call { tag: tag.map(|seen| &seen.tag), subject: shared.events.is_some() }
}

/// Reviews `buf` with `engine`, for `endpoint`.
fn review(
    engine: &sidecar_injector_core::Engine,
    endpoint: Endpoint,
    call: Call<'_>,
    buf: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Reviewed {
    review_guarded(|| match endpoint {
        Endpoint::Mutate => engine.answer_call(buf, out, Mode::Mutate, call),
        Endpoint::Validate => engine.answer_call(buf, out, Mode::Validate, call),
        Endpoint::Preview => engine.preview(buf, out),
    })
}

/// Writes the body as received into `buf` again (a parse in place changed it).
fn refill(buf: &mut Vec<u8>, received: &[u8]) {
    buf.clear();
    buf.extend_from_slice(received);
}

/// Runs the engine, turning a panic into an error message instead of a dead connection.
fn review_guarded(review: impl FnOnce() -> Result<Outcome, ReviewError>) -> Reviewed {
    catch_unwind(AssertUnwindSafe(review)).map_err(|payload| Panicked(super::panic_message(payload)))
}

/// The engine panicked on a request: the panic's message, for the log.
#[derive(Debug, PartialEq, Eq)]
struct Panicked(String);

fn record(metrics: &RevisionMetrics, endpoint: Endpoint, outcome: &Outcome) {
    match outcome.verdict {
        Verdict::Complete => {
            metrics.validated_ok();
            tracing::debug!("validated: complete");
        }
        Verdict::Incomplete { missing, refused } => {
            metrics.validated_missing(refused);
            tracing::debug!(missing, refused, "validated: incomplete");
        }
        Verdict::Skipped(reason) | Verdict::Denied(reason) if endpoint == Endpoint::Validate => {
            metrics.validated_skipped(reason);
            tracing::debug!(reason = reason.as_str(), "validation skipped");
        }
        Verdict::Previewed { templates, .. } => {
            metrics.previewed(templates, !outcome.warnings.is_empty());
            tracing::debug!(templates, warnings = outcome.warnings.len(), "previewed");
        }
        Verdict::Injected { ops } => {
            metrics.injected(outcome.template.as_deref());
            tracing::debug!(ops, "injected");
        }
        Verdict::Skipped(reason) => {
            metrics.skipped(reason);
            tracing::debug!(reason = reason.as_str(), "skipped");
        }
        Verdict::Denied(reason) => {
            metrics.denied(reason);
            tracing::debug!(reason = reason.as_str(), "denied");
        }
    }
}

/// Why a request is answered without a review. Each knows its status, its reason (the metric's label) and its
/// one-line message: the one mapping from a failed request to its answer.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// No webhook at this path; where they are.
    #[error("not found: the webhooks are at {0}")]
    NotFound(String),
    #[error("method not allowed: use POST")]
    Method,
    #[error("unsupported media type: the body must be Content-Type: application/json")]
    MediaType,
    /// Announced or read past `--max-body-bytes` (the limit).
    #[error("request body larger than the limit of {0} bytes")]
    TooLarge(usize),
    #[error("bad request: could not read the body: {0}")]
    Body(#[source] hyper::Error),
    #[error("bad request: {0}")]
    Review(#[source] ReviewError),
    /// The engine panicked (logged where it is caught).
    #[error("internal error: the request could not be processed")]
    Panic,
    /// No answer within the request's deadline.
    #[error("request timeout: no answer within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// The memory account (its size) had no room for this body or answer in time: 503 with `Retry-After`.
    #[error("service unavailable: requests in progress (bodies and answers) fill the memory budget ({0} bytes); retry")]
    Overloaded(usize),
}

impl Refusal {
    fn reason(&self) -> ErrorReason {
        match self {
            Refusal::NotFound(_) => ErrorReason::NotFound,
            Refusal::Method => ErrorReason::Method,
            Refusal::MediaType => ErrorReason::MediaType,
            Refusal::TooLarge(_) => ErrorReason::TooLarge,
            Refusal::Body(_) | Refusal::Review(_) => ErrorReason::BadRequest,
            Refusal::Panic => ErrorReason::Panic,
            Refusal::Timeout(_) => ErrorReason::Timeout,
            Refusal::Overloaded(_) => ErrorReason::Overloaded,
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Refusal::NotFound(_) => StatusCode::NOT_FOUND,
            Refusal::Method => StatusCode::METHOD_NOT_ALLOWED,
            Refusal::MediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Refusal::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Body(_) | Refusal::Review(_) => StatusCode::BAD_REQUEST,
            Refusal::Panic => StatusCode::INTERNAL_SERVER_ERROR,
            Refusal::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            Refusal::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// The answer to a refused request: its status, its message as plain text, and the header it calls for.
fn refuse(shared: &Shared, refusal: &Refusal) -> Answer {
    let status = refusal.status();
    shared.metrics.error(refusal.reason());
    tracing::debug!(status = status.as_u16(), message = %refusal, "refused");
    let mut answer = super::plain_text(format!("{refusal}\n").into_bytes()).map(Content::unaccounted);
    *answer.status_mut() = status;
    match refusal {
        Refusal::Method => drop(answer.headers_mut().insert(ALLOW, HeaderValue::from_static("POST"))),
        Refusal::Overloaded(_) => drop(answer.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"))),
        _ => {}
    }
    answer
}

/// `application/json`, with or without parameters (`; charset=utf-8`), in any case.
fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(value) = content_type.and_then(|v| v.to_str().ok()) else { return false };
    value.split(';').next().is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// The request's deadline: ours, lowered by the API server's `?timeout=10s` when it sends one.
fn deadline(query: Option<&str>, ours: Duration) -> Duration {
    let theirs = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("timeout="))
        .and_then(|value| humantime::parse_duration(value).ok());
    match theirs {
        Some(theirs) if !theirs.is_zero() => theirs.min(ours),
        _ => ours,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_servers_timeout_lowers_the_deadline_but_never_raises_it() {
        let ours = Duration::from_secs(10);
        assert_eq!(deadline(Some("timeout=5s"), ours), Duration::from_secs(5));
        assert_eq!(deadline(Some("a=b&timeout=1m30s"), Duration::from_secs(600)), Duration::from_secs(90));
        assert_eq!(deadline(Some("timeout=30s"), ours), ours);
        assert_eq!(deadline(Some("timeout=banana"), ours), ours);
        assert_eq!(deadline(None, ours), ours);
    }

    #[test]
    fn json_media_types_are_recognised_with_parameters_and_any_case() {
        let json = |v: &'static str| is_json(Some(&HeaderValue::from_static(v)));
        assert!(json("application/json") && json("Application/JSON; charset=utf-8"));
        assert!(!json("text/plain") && !json("application/jsonx") && !is_json(None));
    }

    #[test]
    fn a_panicking_review_becomes_an_error_message() {
        let caught = review_guarded(|| panic!("boom"));
        assert_eq!(caught.unwrap_err(), Panicked("boom".into()));
        let caught = review_guarded(|| Err(ReviewError::Empty));
        assert!(matches!(caught, Ok(Err(ReviewError::Empty))));
    }
}
