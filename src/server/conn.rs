//! One connection's life after the TCP accept, and the deadlines that bound it:
//!
//! - **until the first request**: the TLS handshake and the first request (HTTP/1.1: its headers; HTTP/2: the
//!   preface, SETTINGS and the first HEADERS) must arrive within `--header-read-timeout` of the accept, or the
//!   connection is closed. A client that completes TLS and then says nothing holds a connection slot for that long
//!   at most.
//! - **idle**: a connection with no request in progress is closed after `--idle-timeout` (HTTP/2 with a GOAWAY).
//! - **each later HTTP/1.1 request's headers**: within `--header-read-timeout` of their first byte. (hyper's own
//!   header timeout is off: it starts when the connection turns idle, so it closed every idle keep-alive connection
//!   after the header timeout, long before a client stops reusing it.)
//! - **writes**: an answer must be taken by the peer. Writes to the socket that stay blocked for `--write-timeout`
//!   with less than [`MIN_WRITE_PROGRESS`] taken meanwhile (a peer reading a few bytes at a time is a peer not
//!   reading), or answers handed to the connection none of which is sent for that long (an HTTP/2 peer that
//!   grants no flow-control window, or a few bytes of it), close the connection: a peer that does not read cannot
//!   hold a slot, nor the answers' memory.
//! - **room at the limit**: with every slot taken and a connection waiting, the oldest idle keep-alive connection
//!   is asked to close ([`Activity::evict`]); with none idle, the one that has made no progress the longest (no
//!   first request yet, or answers the peer does not take) is cut ([`Activity::cut`]).
//! - **after the last answer**: a connection that ends after answering is half-closed and what the peer still
//!   sends is read and dropped ([`linger`], bounded in bytes and time) before the socket is closed. Closing a socket
//!   with unread bytes sends a reset, and a reset can destroy the answer on its way (an early 413 or 408 whose
//!   body is still arriving, the last answer before a close or a GOAWAY).
//! - **shutdown**: from the signal on, HTTP/2 connections get a GOAWAY once their first request is in (its two
//!   steps let the streams already sent finish), and HTTP/1.1 answers say `Connection: close` (`handler`); when
//!   the listener closes, every connection past its first request is shut down gracefully: one with a request in
//!   progress finishes it, an idle one closes. A connection still waiting for its first request is served as
//!   usual (its request may already be on the way) within its first-request deadline.
//!
//! The request path only stores timestamps and counts in atomics ([`Activity`]); nothing wakes the driver or
//! touches a timer per request. The driver looks when a deadline could next fall due, which it can tell in advance
//! (see [`Activity::next_check`]), so every deadline is kept to the tick of the timer.

use std::error::Error as StdError;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::telemetry::{ConnectionError, Metrics};

/// While writes are blocked, the peer must take this many bytes within `--write-timeout` (a minimum rate of 16 KiB
/// per write timeout, 1.6 KiB/s by default): one TLS record's worth, far below any real client's pace.
pub(crate) const MIN_WRITE_PROGRESS: usize = 16 * 1024;

/// Where the server is in its life, as each connection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
    /// Serving normally.
    Serving,
    /// The shutdown signal came: still accepting (`--shutdown-delay`); HTTP/2 connections are sent a GOAWAY.
    Delay,
    /// The listener is closed: connections finish what is in progress and close.
    Drain,
}

/// What the requests of one connection have done, written by the service (each request's start and end) and the
/// transport (bytes read), read by [`drive`] when it looks. Atomics, not a lock: an HTTP/2 request ends on a task
/// of its own. Everything else happens inside the connection's future, on [`drive`]'s task: hyper calls the service
/// (a request starts, clearing the idle and header instants) and reads there, and HTTP/1.1 runs the whole request
/// there. So [`drive`] never reads an instant older than the last start, and at worst sees a request's end late,
/// which only delays its look.
pub(crate) struct Activity {
    /// The instants below are nanoseconds since this one, plus one (0: none).
    epoch: Instant,
    /// Requests in progress (HTTP/2: several at once).
    active: AtomicUsize,
    /// A request has started since the connection opened.
    started: AtomicBool,
    /// Since when no request has been in progress (none while one is, and before the first).
    idle_since: AtomicU64,
    /// HTTP/1.1: when the first byte of the next request arrived, while none is in progress.
    head_since: AtomicU64,
    /// Answers handed to hyper and not yet all sent (HTTP/2: waiting for the peer's flow-control window).
    answers: AtomicUsize,
    /// While answers are waiting: since when less than [`MIN_WRITE_PROGRESS`] of answers has been sent (from the
    /// first handed over, or since the answers sent last made that much).
    answer_since: AtomicU64,
    /// Bytes of the answers sent since `answer_since`.
    answer_progress: AtomicUsize,
    /// Since when writes to the peer have been blocked (its socket full) with less than [`MIN_WRITE_PROGRESS`]
    /// taken since, while they are.
    blocked_since: AtomicU64,
    /// Bytes written since `blocked_since`.
    progress: AtomicUsize,
    /// Asked to close if idle, to make room for a new connection at the limit.
    evict: Notify,
    /// Asked to close at once if it still makes no progress ([`Activity::stalled_since`]), to make room for a new
    /// connection at the limit.
    cut: Notify,
    /// HTTP/1.1: bytes read while no request is in progress start the next request's header deadline. Known once
    /// the TLS handshake has chosen the protocol.
    h1: AtomicBool,
}

impl Activity {
    pub(crate) fn new(h1: bool) -> Arc<Activity> {
        Arc::new(Activity {
            epoch: Instant::now(),
            active: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            answers: AtomicUsize::new(0),
            answer_since: AtomicU64::new(0),
            answer_progress: AtomicUsize::new(0),
            blocked_since: AtomicU64::new(0),
            progress: AtomicUsize::new(0),
            evict: Notify::new(),
            cut: Notify::new(),
            h1: AtomicBool::new(h1),
        })
    }

    fn stamp(&self) -> u64 {
        // u64 nanoseconds last 584 years; a connection does not.
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    fn instant(&self, stamp: u64) -> Option<Instant> {
        stamp.checked_sub(1).map(|nanos| self.epoch + Duration::from_nanos(nanos))
    }

    /// A request's headers arrived (the service was called): in progress until the guard is dropped.
    pub(crate) fn request_started(self: &Arc<Self>) -> RequestGuard {
        self.active.fetch_add(1, Relaxed);
        self.started.store(true, Relaxed);
        self.idle_since.store(0, Relaxed);
        self.head_since.store(0, Relaxed);
        RequestGuard(self.clone())
    }

    fn bytes_read(&self) {
        if self.h1.load(Relaxed) && self.active.load(Relaxed) == 0 && self.head_since.load(Relaxed) == 0 {
            self.head_since.store(self.stamp(), Relaxed);
        }
    }

    fn write_blocked(&self) {
        if self.blocked_since.load(Relaxed) == 0 {
            self.progress.store(0, Relaxed);
            self.blocked_since.store(self.stamp(), Relaxed);
        }
    }

    /// `bytes` written while writes may be blocked: only [`MIN_WRITE_PROGRESS`] of them together end the block (a
    /// peer reading a few bytes at a time does not restart the write timeout each time).
    fn wrote(&self, bytes: usize) {
        if self.blocked_since.load(Relaxed) != 0
            && self.progress.fetch_add(bytes, Relaxed) + bytes >= MIN_WRITE_PROGRESS
        {
            self.blocked_since.store(0, Relaxed);
        }
    }

    /// Everything written has gone to the socket: nothing is blocked.
    fn flushed(&self) {
        if self.blocked_since.load(Relaxed) != 0 {
            self.blocked_since.store(0, Relaxed);
        }
    }

    fn has_started(&self) -> bool {
        self.started.load(Relaxed)
    }

    /// Past its first request, with nothing in progress: since when (the oldest is closed first to make room).
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        if !self.has_started() || self.active.load(Relaxed) > 0 {
            return None;
        }
        self.instant(self.idle_since.load(Relaxed))
    }

    /// How long ago the connection was accepted.
    pub(crate) fn age(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Asks the connection to close if it is still idle when its driver looks (at once).
    pub(crate) fn evict(&self) {
        self.evict.notify_one();
    }

    /// The protocol the TLS handshake chose.
    pub(crate) fn set_h1(&self, h1: bool) {
        self.h1.store(h1, Relaxed);
    }

    /// Since when the connection has made no progress, if it makes none: accepted and still without its first
    /// request (a silent client, or a handshake that does not end), or past it with its writes blocked or its
    /// answers waiting, the peer taking less than [`MIN_WRITE_PROGRESS`] of them since. Such a connection holds a
    /// slot for nothing; at the limit, the one stalled longest is cut to make room ([`Activity::cut`]).
    pub(crate) fn stalled_since(&self) -> Option<Instant> {
        if !self.has_started() {
            return Some(self.epoch);
        }
        self.answers_stalled_since()
    }

    /// Since when the peer has taken less than [`MIN_WRITE_PROGRESS`] of the answers waiting for it (its writes
    /// blocked, or its HTTP/2 answers waiting for a window), if some are: answers that hold their share of the
    /// memory account for nothing. When the account is full, the connection whose answers have waited longest is
    /// cut to make room ([`Activity::cut`]).
    pub(crate) fn answers_stalled_since(&self) -> Option<Instant> {
        let blocked = self.instant(self.blocked_since.load(Relaxed));
        let waiting = if self.answers.load(Relaxed) > 0 { self.instant(self.answer_since.load(Relaxed)) } else { None };
        blocked.into_iter().chain(waiting).min()
    }

    /// Asks the connection to close at once if it is still stalled when its driver looks (at once).
    pub(crate) fn cut(&self) {
        self.cut.notify_one();
    }

    /// Waits until the connection is asked to close at once ([`Activity::cut`]).
    pub(crate) async fn cut_asked(&self) {
        self.cut.notified().await;
    }

    /// For a connection past its first request: the deadline that has passed, or when to look again. No deadline
    /// can fall due before that: a request in progress has none, and whatever starts after `now` (the end of a
    /// request, the first byte of the next one's headers) has its deadline at least a timeout after `now`.
    fn next_check(&self, now: Instant, timeouts: &Timeouts) -> Check {
        let due = |since: u64, timeout: Duration, expiry: Expiry| {
            let at = self.instant(since)? + timeout;
            Some(if at <= now { Check::Expired(expiry) } else { Check::At(at) })
        };
        let Timeouts { idle: idle_timeout, header: header_timeout, write: write_timeout } = *timeouts;
        let mut soonest_new = idle_timeout.min(write_timeout);
        if self.h1.load(Relaxed) {
            soonest_new = soonest_new.min(header_timeout);
        }
        let later = now + soonest_new;
        // A write blocked, or answers waiting with none sent: the write timeout, whatever else is in progress.
        let blocked = due(self.blocked_since.load(Relaxed), write_timeout, Expiry::Write);
        let waiting = if self.answers.load(Relaxed) > 0 {
            due(self.answer_since.load(Relaxed), write_timeout, Expiry::Write)
        } else {
            None
        };
        let write = match (blocked, waiting) {
            (Some(Check::Expired(e)), _) | (_, Some(Check::Expired(e))) => return Check::Expired(e),
            (Some(Check::At(a)), Some(Check::At(b))) => Some(a.min(b)),
            (Some(Check::At(a)), _) | (_, Some(Check::At(a))) => Some(a),
            (None, None) => None,
        };
        let later = write.map_or(later, |at| at.min(later));
        if self.active.load(Relaxed) > 0 {
            return Check::At(later);
        }
        match due(self.head_since.load(Relaxed), header_timeout, Expiry::Headers) {
            Some(Check::At(at)) => return Check::At(at.min(later)),
            Some(expired) => return expired,
            None => {}
        }
        match due(self.idle_since.load(Relaxed), idle_timeout, Expiry::Idle) {
            Some(Check::At(at)) => Check::At(at.min(later)),
            Some(expired) => expired,
            None => Check::At(later),
        }
    }
}

/// A request in progress on its connection, until dropped (answered, or dropped unanswered by hyper).
pub(crate) struct RequestGuard(Arc<Activity>);

impl RequestGuard {
    /// How long ago the request's connection was accepted.
    pub(crate) fn connection_age(&self) -> Duration {
        self.0.age()
    }

    /// The request's answer, of `bytes`, is handed to hyper: the request stays in progress until the answer is
    /// sent (the returned guard dropped with the answer's body), within the write timeout.
    pub(crate) fn answering(self, bytes: usize) -> Answering {
        let activity = &self.0;
        if activity.answers.fetch_add(1, Relaxed) == 0 {
            activity.answer_progress.store(0, Relaxed);
            activity.answer_since.store(activity.stamp(), Relaxed);
        }
        Answering { request: self, bytes }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let activity = &self.0;
        if activity.active.fetch_sub(1, Relaxed) == 1 {
            activity.idle_since.store(activity.stamp(), Relaxed);
        }
    }
}

/// An answer handed to hyper and not yet sent (its size), and its request, until dropped.
pub(crate) struct Answering {
    request: RequestGuard,
    bytes: usize,
}

impl Drop for Answering {
    fn drop(&mut self) {
        let activity = &self.request.0;
        // Sent while others wait: once the answers sent make [`MIN_WRITE_PROGRESS`], the peer is reading and the
        // others' write timeout starts again (a peer taking a small answer now and then is not reading).
        if activity.answers.fetch_sub(1, Relaxed) > 1
            && activity.answer_progress.fetch_add(self.bytes, Relaxed) + self.bytes >= MIN_WRITE_PROGRESS
        {
            activity.answer_progress.store(0, Relaxed);
            activity.answer_since.store(activity.stamp(), Relaxed);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    Idle,
    Headers,
    Write,
}

/// The timeouts [`Activity::next_check`] keeps after the first request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub idle: Duration,
    pub header: Duration,
    pub write: Duration,
}

/// What [`drive`] does next about a connection's deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// A deadline has passed.
    Expired(Expiry),
    /// Look again then.
    At(Instant),
}

/// The transport under hyper, telling [`Activity`] when bytes arrive and when writes block, and giving the
/// transport back when hyper drops it (for [`linger`]).
pub(crate) struct Watched<T> {
    /// Always `Some` until dropped.
    inner: Option<T>,
    activity: Arc<Activity>,
    give_back: Option<tokio::sync::oneshot::Sender<T>>,
}

impl<T> Watched<T> {
    /// `inner`, watched for `activity`; sent to `give_back` when dropped.
    pub(crate) fn new(inner: T, activity: Arc<Activity>, give_back: tokio::sync::oneshot::Sender<T>) -> Watched<T> {
        Watched { inner: Some(inner), activity, give_back: Some(give_back) }
    }

    fn inner(&mut self) -> Pin<&mut T>
    where
        T: Unpin,
    {
        // Taken only in `drop`.
        Pin::new(self.inner.as_mut().expect("the transport is there until dropped"))
    }

    /// A write's result, noted: pending means the peer's socket is full.
    fn wrote(&self, result: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match &result {
            Poll::Pending => self.activity.write_blocked(),
            Poll::Ready(Ok(bytes)) => self.activity.wrote(*bytes),
            Poll::Ready(Err(_)) => self.activity.flushed(),
        }
        result
    }

    /// A flush's (or shutdown's) result, noted: done, nothing waits to be written.
    fn flushed(&self, result: Poll<io::Result<()>>) -> Poll<io::Result<()>> {
        match &result {
            Poll::Pending => self.activity.write_blocked(),
            Poll::Ready(_) => self.activity.flushed(),
        }
        result
    }
}

impl<T> Drop for Watched<T> {
    fn drop(&mut self) {
        if let (Some(inner), Some(give_back)) = (self.inner.take(), self.give_back.take()) {
            // Nobody waiting for it any more: then it just closes.
            let _ = give_back.send(inner);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = self.inner().poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = self.inner().poll_write(cx, buf);
        self.wrote(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = self.inner().poll_write_vectored(cx, bufs);
        self.wrote(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(|inner| inner.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = self.inner().poll_flush(cx);
        self.flushed(result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = self.inner().poll_shutdown(cx);
        self.flushed(result)
    }
}

/// How [`linger`] may read after the last answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LingerBounds {
    pub bytes: usize,
    pub time: Duration,
}

/// After a connection's last answer: sends TLS `close_notify` and the TCP FIN (if hyper has not), then reads and
/// drops what the peer still sends, from the socket under TLS (nothing decrypted, into the read-ahead buffer the
/// connection already has), until the peer closes its side or `bounds` are reached; the caller then closes the
/// socket. Without it, bytes still arriving (the rest of a body refused early, a request sent before the peer saw
/// `Connection: close` or the GOAWAY) make the kernel answer the close with a reset, which can destroy the answer
/// before the peer has read it. Returns the bytes read.
pub(crate) async fn linger<T>(tls: tokio_rustls::server::TlsStream<T>, bounds: LingerBounds) -> usize
where
    T: tokio::io::AsyncBufRead + AsyncWrite + Unpin,
{
    let until = Instant::now() + bounds.time;
    let mut tls = tls;
    if tokio::time::timeout_at(until, tls.shutdown()).await.is_err() {
        return 0;
    }
    let (mut io, _) = tls.into_inner();
    let mut drained = 0;
    while drained < bounds.bytes {
        match tokio::time::timeout_at(until, io.fill_buf()).await {
            Ok(Ok(read)) if !read.is_empty() => {
                let n = read.len();
                io.consume(n);
                drained += n;
            }
            _ => break,
        }
    }
    drained
}

/// The deadlines of one connection.
pub(crate) struct Limits {
    /// The first request must have arrived by then (the accept plus `--header-read-timeout`).
    pub first_request_by: Instant,
    pub timeouts: Timeouts,
    pub h2: bool,
    /// HTTP/2: ended with a GOAWAY from then on (`--max-connection-age`); its streams in progress finish.
    pub close_by: Option<Instant>,
}

/// How [`drive`] ended a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// hyper finished it (closed after its answers, or an error): what the peer still sends may be drained.
    Finished,
    /// A deadline cut it off (no request in time, slow headers, the peer not reading): closed at once.
    Cut,
}

/// Serves `conn` to its end under `limits` and the server's `stage`; an error ending it is counted and logged at
/// debug level.
pub(crate) async fn drive<C>(
    conn: C,
    activity: &Activity,
    limits: Limits,
    mut stage: watch::Receiver<Stage>,
    metrics: &Metrics,
    peer: std::net::SocketAddr,
) -> Ended
where
    C: GracefulConnection<Error = Box<dyn StdError + Send + Sync>>,
{
    let mut conn = std::pin::pin!(conn);
    let ended = |result: Result<(), C::Error>| {
        if let Err(e) = result {
            let kind = classify(&*e, limits.h2);
            metrics.connection_error(kind);
            tracing::debug!(%peer, kind = kind.as_str(), error = %e, "connection ended with an error");
        }
        Ended::Finished
    };
    // `false` once the server is gone (its run ended): then drain, as at the end of the delay.
    let mut stage_known = true;
    // Asked to make room before the first look.
    let mut evicted = false;
    // Until the first request: whatever the stage, the one deadline from the accept. A change of stage is acted on
    // at once if the first request has come, and so is an idle timeout shorter than the header timeout (the first
    // look is no later than an idle timeout from now).
    let first_look = limits.first_request_by.min(Instant::now() + limits.timeouts.idle.min(limits.timeouts.write));
    let first_look = limits.close_by.map_or(first_look, |at| first_look.min(at));
    let look = tokio::time::sleep_until(first_look);
    let mut look = std::pin::pin!(look);
    loop {
        tokio::select! {
            result = conn.as_mut() => return ended(result),
            changed = stage.changed(), if stage_known => {
                stage_known = changed.is_ok();
                if activity.has_started() {
                    break;
                }
            }
            () = activity.evict.notified() => {
                // Chosen as idle, so past its first request (the look would see it later).
                evicted = true;
                if activity.has_started() {
                    break;
                }
            }
            () = activity.cut.notified() => {
                if cut(activity, metrics, peer) {
                    return Ended::Cut;
                }
            }
            () = look.as_mut() => {
                if activity.has_started() {
                    break;
                }
                if Instant::now() < limits.first_request_by {
                    look.as_mut().reset(limits.first_request_by);
                    continue;
                }
                metrics.connection_error(ConnectionError::Timeout);
                tracing::debug!(%peer, "no request within the header read timeout of the accept; closed");
                return Ended::Cut;
            }
        }
    }
    let mut closing = false;
    loop {
        let now = *stage.borrow_and_update();
        if !closing && (!stage_known || now == Stage::Drain || (limits.h2 && now == Stage::Delay)) {
            conn.as_mut().graceful_shutdown();
            closing = true;
        }
        if evicted && !closing {
            evicted = false;
            closing = evict(conn.as_mut(), activity, peer);
        }
        if !closing && limits.close_by.is_some_and(|at| Instant::now() >= at) {
            tracing::debug!(%peer, "maximum connection age; GOAWAY");
            conn.as_mut().graceful_shutdown();
            closing = true;
        }
        // Closing (gracefully) still has the write timeout: a peer that takes no answer cannot hold it open.
        let look_again = match activity.next_check(Instant::now(), &limits.timeouts) {
            Check::At(at) => at,
            Check::Expired(Expiry::Idle) => {
                if !closing {
                    tracing::debug!(%peer, "idle timeout; closing the connection");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
                // Nothing but a write that blocks from now on can fall due, a write timeout from now at the soonest.
                Instant::now() + limits.timeouts.write
            }
            Check::Expired(Expiry::Headers) => {
                metrics.connection_error(ConnectionError::Timeout);
                tracing::debug!(%peer, "request headers not within the header read timeout; closed");
                return Ended::Cut;
            }
            Check::Expired(Expiry::Write) => {
                metrics.connection_error(ConnectionError::Timeout);
                tracing::debug!(%peer, "the peer took no answer within the write timeout; closed");
                return Ended::Cut;
            }
        };
        let look_again = match limits.close_by {
            Some(at) if !closing => look_again.min(at),
            _ => look_again,
        };
        tokio::select! {
            result = conn.as_mut() => return ended(result),
            changed = stage.changed(), if stage_known && !closing => stage_known = changed.is_ok(),
            () = activity.evict.notified(), if !closing => closing = evict(conn.as_mut(), activity, peer),
            () = activity.cut.notified() => {
                if cut(activity, metrics, peer) {
                    return Ended::Cut;
                }
            }
            () = tokio::time::sleep_until(look_again) => {}
        }
    }
}

/// Closes `conn` gracefully if it is still idle (a request may have started since it was chosen to make room at
/// the connection limit); `true` if it did.
fn evict<C: GracefulConnection>(conn: Pin<&mut C>, activity: &Activity, peer: std::net::SocketAddr) -> bool {
    if activity.idle_since().is_none() {
        return false;
    }
    tracing::debug!(%peer, "the oldest idle connection, closed to make room at the connection limit");
    conn.graceful_shutdown();
    true
}

/// Whether a connection chosen to be cut to make room at the connection limit still makes no progress (it may have
/// since it was chosen); if so it is counted (`kind="evicted"`) and is to be closed at once.
pub(crate) fn cut(activity: &Activity, metrics: &Metrics, peer: std::net::SocketAddr) -> bool {
    if activity.stalled_since().is_none() {
        return false;
    }
    metrics.connection_error(ConnectionError::Evicted);
    tracing::debug!(%peer, "stalled the longest, cut to make room at the connection limit");
    true
}

/// The kind of error that ended a connection.
fn classify(error: &(dyn StdError + 'static), h2: bool) -> ConnectionError {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(e) = e.downcast_ref::<hyper::Error>() {
            if e.is_timeout() {
                return ConnectionError::Timeout;
            }
            if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
                return ConnectionError::Io;
            }
        }
        if e.is::<io::Error>() {
            return ConnectionError::Io;
        }
        source = e.source();
    }
    if h2 { ConnectionError::Http2 } else { ConnectionError::Http1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deadlines_follow_the_requests_and_are_never_looked_at_late() {
        let activity = Activity::new(true);
        let (idle, headers) = (Duration::from_secs(100), Duration::from_secs(5));
        let timeouts = Timeouts { idle, header: headers, write: Duration::from_secs(1000) };
        let check = || activity.next_check(Instant::now(), &timeouts);
        assert!(!activity.has_started());
        let guard = activity.request_started();
        activity.bytes_read(); // the body: no new request
        assert!(activity.has_started());
        assert_eq!(check(), Check::At(Instant::now() + headers), "in progress: no deadline, a look later");
        tokio::time::advance(Duration::from_secs(7)).await;
        drop(guard);
        let ended = Instant::now();
        assert_eq!(check(), Check::At(ended + headers), "idle: the next request's headers may start any moment");
        tokio::time::advance(Duration::from_secs(2)).await;
        activity.bytes_read(); // the next request's first bytes
        let head = Instant::now();
        assert_eq!(check(), Check::At(head + headers), "the headers' deadline, to the tick");
        tokio::time::advance(headers).await;
        assert_eq!(check(), Check::Expired(Expiry::Headers));
        let _guard = activity.request_started();
        assert_eq!(check(), Check::At(Instant::now() + headers));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_expires_at_the_idle_timeout_and_http2_looks_only_then() {
        let (idle, headers) = (Duration::from_secs(100), Duration::from_secs(5));
        let timeouts = Timeouts { idle, header: headers, write: Duration::from_secs(1000) };
        for h1 in [true, false] {
            let activity = Activity::new(h1);
            drop(activity.request_started());
            let ended = Instant::now();
            let mut looks = 0;
            loop {
                match activity.next_check(Instant::now(), &timeouts) {
                    Check::At(at) => {
                        assert!(at <= ended + idle, "h1={h1}: looked past the idle deadline");
                        tokio::time::advance(at - Instant::now()).await;
                        looks += 1;
                    }
                    Check::Expired(expiry) => {
                        assert_eq!(expiry, Expiry::Idle);
                        break;
                    }
                }
            }
            assert_eq!(Instant::now(), ended + idle, "h1={h1}: expired exactly at the idle timeout");
            assert_eq!(looks, if h1 { 20 } else { 1 }, "h1={h1}: HTTP/1.1 looks every header timeout for headers");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn answers_not_taken_and_blocked_writes_expire_at_the_write_timeout_and_only_progress_restarts_it() {
        let write = Duration::from_secs(10);
        let timeouts = Timeouts { idle: Duration::from_secs(100), header: Duration::from_secs(5), write };
        let activity = Activity::new(false);
        let check = || activity.next_check(Instant::now(), &timeouts);
        let first = activity.request_started().answering(MIN_WRITE_PROGRESS);
        let waiting = Instant::now();
        let second = activity.request_started().answering(100);
        let third = activity.request_started().answering(100);
        assert_eq!(check(), Check::At(waiting + write), "the answers' deadline, to the tick");
        tokio::time::advance(Duration::from_secs(6)).await;
        drop(third); // a small one taken: not enough to count as reading
        assert_eq!(check(), Check::At(waiting + write));
        drop(first); // a large one taken: the peer reads, the other's deadline starts again
        let taken = Instant::now();
        assert_eq!(check(), Check::At(taken + write));
        assert_eq!(activity.idle_since(), None, "an answer waiting is work in progress");
        tokio::time::advance(write).await;
        assert_eq!(check(), Check::Expired(Expiry::Write));
        drop(second);
        assert!(activity.idle_since().is_some());
        assert_eq!(check(), Check::At(Instant::now() + write), "idle, a look a write timeout later");
        // A write the socket does not take.
        activity.write_blocked();
        let blocked = Instant::now();
        tokio::time::advance(Duration::from_secs(3)).await;
        activity.write_blocked(); // still blocked: the deadline stays
        assert_eq!(check(), Check::At(blocked + write));
        activity.wrote(MIN_WRITE_PROGRESS - 1); // a few bytes taken: still blocked
        assert_eq!(check(), Check::At(blocked + write));
        activity.wrote(1);
        tokio::time::advance(write).await;
        assert_eq!(check(), Check::At(Instant::now() + write), "unblocked in time");
        activity.write_blocked();
        tokio::time::advance(write).await;
        assert_eq!(check(), Check::Expired(Expiry::Write));
    }

    #[test]
    fn an_io_error_under_hyper_is_io_and_anything_else_is_the_protocols() {
        let io = io::Error::new(io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(classify(&io, true), ConnectionError::Io);
        let other = io::Error::other("x").into_inner().unwrap();
        assert_eq!(classify(&*other, true), ConnectionError::Http2);
        assert_eq!(classify(&*other, false), ConnectionError::Http1);
    }
}
