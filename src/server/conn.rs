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
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

use super::telemetry::{ConnectionError, Metrics};

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
    /// HTTP/1.1: bytes read while no request is in progress start the next request's header deadline.
    h1: bool,
}

impl Activity {
    pub(crate) fn new(h1: bool) -> Arc<Activity> {
        Arc::new(Activity {
            epoch: Instant::now(),
            active: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            h1,
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
        if self.h1 && self.active.load(Relaxed) == 0 && self.head_since.load(Relaxed) == 0 {
            self.head_since.store(self.stamp(), Relaxed);
        }
    }

    fn has_started(&self) -> bool {
        self.started.load(Relaxed)
    }

    /// For a connection past its first request: the deadline that has passed, or when to look again. No deadline
    /// can fall due before that: a request in progress has none, and whatever starts after `now` (the end of a
    /// request, the first byte of the next one's headers) has its deadline at least a timeout after `now`.
    fn next_check(&self, now: Instant, idle_timeout: Duration, header_timeout: Duration) -> Check {
        let due = |since: u64, timeout: Duration, expiry: Expiry| {
            let at = self.instant(since)? + timeout;
            Some(if at <= now { Check::Expired(expiry) } else { Check::At(at) })
        };
        let soonest_new = if self.h1 { header_timeout.min(idle_timeout) } else { idle_timeout };
        let later = now + soonest_new;
        if self.active.load(Relaxed) > 0 {
            return Check::At(later);
        }
        if let Some(check) = due(self.head_since.load(Relaxed), header_timeout, Expiry::Headers) {
            return check;
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

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let activity = &self.0;
        if activity.active.fetch_sub(1, Relaxed) == 1 {
            activity.idle_since.store(activity.stamp(), Relaxed);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    Idle,
    Headers,
}

/// What [`drive`] does next about a connection's deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// A deadline has passed.
    Expired(Expiry),
    /// Look again then.
    At(Instant),
}

/// The transport under hyper, telling [`Activity`] when bytes arrive.
pub(crate) struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> Watched<T> {
    pub(crate) fn new(inner: T, activity: Arc<Activity>) -> Watched<T> {
        Watched { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The deadlines of one connection.
pub(crate) struct Limits {
    /// The first request must have arrived by then (the accept plus `--header-read-timeout`).
    pub first_request_by: Instant,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub h2: bool,
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
) where
    C: GracefulConnection<Error = Box<dyn StdError + Send + Sync>>,
{
    let mut conn = std::pin::pin!(conn);
    let ended = |result: Result<(), C::Error>| {
        if let Err(e) = result {
            let kind = classify(&*e, limits.h2);
            metrics.connection_error(kind);
            tracing::debug!(%peer, kind = kind.as_str(), error = %e, "connection ended with an error");
        }
    };
    // `false` once the server is gone (its run ended): then drain, as at the end of the delay.
    let mut stage_known = true;
    // Until the first request: whatever the stage, the one deadline from the accept. A change of stage is acted on
    // at once if the first request has come, and so is an idle timeout shorter than the header timeout (the first
    // look is no later than an idle timeout from now).
    let first_look = limits.first_request_by.min(Instant::now() + limits.idle_timeout);
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
                return;
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
        let mut look_again = None;
        if !closing {
            match activity.next_check(Instant::now(), limits.idle_timeout, limits.header_timeout) {
                Check::At(at) => look_again = Some(at),
                Check::Expired(Expiry::Idle) => {
                    tracing::debug!(%peer, "idle timeout; closing the connection");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
                Check::Expired(Expiry::Headers) => {
                    metrics.connection_error(ConnectionError::Timeout);
                    tracing::debug!(%peer, "request headers not within the header read timeout; closed");
                    return;
                }
            }
        }
        tokio::select! {
            result = conn.as_mut() => return ended(result),
            changed = stage.changed(), if stage_known && !closing => stage_known = changed.is_ok(),
            () = tokio::time::sleep_until(look_again.unwrap_or_else(Instant::now)), if look_again.is_some() => {}
        }
    }
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
        let check = || activity.next_check(Instant::now(), idle, headers);
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
        for h1 in [true, false] {
            let activity = Activity::new(h1);
            drop(activity.request_started());
            let ended = Instant::now();
            let mut looks = 0;
            loop {
                match activity.next_check(Instant::now(), idle, headers) {
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

    #[test]
    fn an_io_error_under_hyper_is_io_and_anything_else_is_the_protocols() {
        let io = io::Error::new(io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(classify(&io, true), ConnectionError::Io);
        let other = io::Error::other("x").into_inner().unwrap();
        assert_eq!(classify(&*other, true), ConnectionError::Http2);
        assert_eq!(classify(&*other, false), ConnectionError::Http1);
    }
}
