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

use std::error::Error as StdError;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, watch};
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

/// What the requests of one connection tell its driver: shared by the service (each request's start and end),
/// the transport (bytes read) and [`drive`].
pub(crate) struct Activity {
    state: Mutex<ActivityState>,
    changed: Notify,
    /// HTTP/1.1: bytes read while no request is in progress start the next request's header deadline.
    h1: bool,
}

#[derive(Default)]
struct ActivityState {
    /// Requests in progress (HTTP/2: several at once).
    active: usize,
    /// Requests started since the connection opened.
    started: u64,
    /// Since when no request has been in progress (`None` while one is, and before the first).
    idle_since: Option<Instant>,
    /// HTTP/1.1: when the first byte of the next request arrived, while none is in progress.
    head_since: Option<Instant>,
}

impl Activity {
    pub(crate) fn new(h1: bool) -> Arc<Activity> {
        Arc::new(Activity { state: Mutex::default(), changed: Notify::new(), h1 })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request's headers arrived (the service was called): in progress until the guard is dropped.
    pub(crate) fn request_started(self: &Arc<Self>) -> RequestGuard {
        {
            let mut state = self.state();
            state.active += 1;
            state.started += 1;
            state.idle_since = None;
            state.head_since = None;
        }
        self.changed.notify_one();
        RequestGuard(self.clone())
    }

    fn bytes_read(&self) {
        if !self.h1 {
            return;
        }
        let mut state = self.state();
        if state.active == 0 && state.head_since.is_none() {
            state.head_since = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    fn has_started(&self) -> bool {
        self.state().started > 0
    }

    /// The next deadline of a connection past its first request, and what happens then.
    fn next_deadline(&self, idle_timeout: Duration, header_timeout: Duration) -> Option<(Instant, Expiry)> {
        let state = self.state();
        if state.active > 0 {
            None
        } else if let Some(since) = state.head_since {
            Some((since + header_timeout, Expiry::Headers))
        } else {
            state.idle_since.map(|since| (since + idle_timeout, Expiry::Idle))
        }
    }
}

/// A request in progress on its connection, until dropped (answered, or dropped unanswered by hyper).
pub(crate) struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        {
            let mut state = self.0.state();
            state.active -= 1;
            if state.active == 0 {
                state.idle_since = Some(Instant::now());
            }
        }
        self.0.changed.notify_one();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    Idle,
    Headers,
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
    // Until the first request: whatever the stage, the one deadline from the accept.
    while !activity.has_started() {
        tokio::select! {
            result = conn.as_mut() => return ended(result),
            () = activity.changed.notified() => {}
            () = tokio::time::sleep_until(limits.first_request_by) => {
                if activity.has_started() {
                    break;
                }
                metrics.connection_error(ConnectionError::Timeout);
                tracing::debug!(%peer, "no request within the header read timeout of the accept; closed");
                return;
            }
        }
    }
    let mut closing = false;
    let mut stage_known = true;
    loop {
        let now = *stage.borrow_and_update();
        if !closing && (now == Stage::Drain || (limits.h2 && now == Stage::Delay)) {
            conn.as_mut().graceful_shutdown();
            closing = true;
        }
        let deadline = if closing { None } else { activity.next_deadline(limits.idle_timeout, limits.header_timeout) };
        let (at, expiry) = deadline.unwrap_or((Instant::now(), Expiry::Idle));
        tokio::select! {
            result = conn.as_mut() => return ended(result),
            () = activity.changed.notified() => {}
            changed = stage.changed(), if stage_known && !closing => {
                // The server is gone (its run ended): drain as at the end of the delay.
                if changed.is_err() {
                    stage_known = false;
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            () = tokio::time::sleep_until(at), if deadline.is_some() => {
                // A request may have started meanwhile: act only on a deadline that still holds.
                let still = activity.next_deadline(limits.idle_timeout, limits.header_timeout);
                if still.is_some_and(|(at, e)| e == expiry && at <= Instant::now()) {
                    match expiry {
                        Expiry::Idle => {
                            tracing::debug!(%peer, "idle timeout; closing the connection");
                            conn.as_mut().graceful_shutdown();
                            closing = true;
                        }
                        Expiry::Headers => {
                            metrics.connection_error(ConnectionError::Timeout);
                            tracing::debug!(%peer, "request headers not within the header read timeout; closed");
                            return;
                        }
                    }
                }
            }
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

    #[tokio::test]
    async fn deadlines_follow_the_requests() {
        let activity = Activity::new(true);
        let (idle, headers) = (Duration::from_secs(100), Duration::from_secs(5));
        assert!(!activity.has_started());
        assert_eq!(activity.next_deadline(idle, headers), None, "before the first request: the first deadline");
        let guard = activity.request_started();
        activity.bytes_read(); // the body: no new request
        assert_eq!(activity.next_deadline(idle, headers), None, "a request in progress has no deadline");
        drop(guard);
        let (at, expiry) = activity.next_deadline(idle, headers).unwrap();
        assert_eq!(expiry, Expiry::Idle);
        assert!(at > Instant::now() + Duration::from_secs(90));
        activity.bytes_read(); // the next request's first bytes
        let (at, expiry) = activity.next_deadline(idle, headers).unwrap();
        assert_eq!(expiry, Expiry::Headers);
        assert!(at <= Instant::now() + headers);
        let _guard = activity.request_started();
        assert!(activity.has_started() && activity.next_deadline(idle, headers).is_none());
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
