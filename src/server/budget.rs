//! The memory account of requests: the bytes that every request's body buffers and every answer not yet sent hold
//! at once, over all connections and streams, are at most `--max-inflight-body-bytes`. A request reserves its
//! body's bytes as they arrive, turns the reservation into its answer's once reviewed, and gives it back when the
//! answer's bytes are freed (sent, or dropped with the connection).
//!
//! The bytes are a [`Semaphore`]'s permits, taken only with `try_acquire_many`: a request that does not fit waits
//! for a release (at most [`BODY_BUDGET_WAIT`]) beside the others rather than in the semaphore's queue. The queue is
//! first-come first-served, so a large body waiting at its head would hold back every small review behind it
//! (and collect the permits they free); here a small review takes what is free at once, while large ones wait and,
//! if the budget stays full, are refused with 503.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst, fence};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use super::telemetry::Metrics;

/// How long a body that does not fit in the budget waits for bytes to be released before it is refused (503 with
/// `Retry-After`): long enough to ride out a burst of large bodies, short next to the API server's 3 s to 10 s
/// webhook timeout, so that it can still call another replica.
pub(crate) const BODY_BUDGET_WAIT: Duration = Duration::from_secs(1);

/// What the budget holds for a body of `bytes`: the buffer the review parses in place (with the parser's padding)
/// and the copy of the body kept for a second review (the parse changes the buffer).
pub(crate) fn held_for(bytes: usize) -> usize {
    bytes.saturating_mul(2).saturating_add(crate::PARSE_PADDING)
}

/// The budget shared by every connection.
pub(crate) struct BodyBudget {
    bytes: Semaphore,
    released: Notify,
    /// Requests waiting for bytes: a release wakes them only if there are any (the wake takes a lock).
    waiting: AtomicUsize,
    total: usize,
    metrics: Metrics,
    /// Asked for room when a request must wait (the server cuts a connection whose answers its peer does not take);
    /// nothing unless [`BodyBudget::making_room`] says.
    make_room: Box<dyn Fn() + Send + Sync>,
}

impl BodyBudget {
    pub(crate) fn new(total: usize, metrics: Metrics) -> BodyBudget {
        let total = total.min(Semaphore::MAX_PERMITS);
        BodyBudget {
            bytes: Semaphore::new(total),
            released: Notify::new(),
            waiting: AtomicUsize::new(0),
            total,
            metrics,
            make_room: Box::new(|| {}),
        }
    }

    /// With `make_room` called when a request must wait for bytes, and every [`super::ROOM_RETRY`] while it waits.
    pub(crate) fn making_room(self, make_room: impl Fn() + Send + Sync + 'static) -> BodyBudget {
        BodyBudget { make_room: Box::new(make_room), ..self }
    }

    /// The budget, in bytes.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// Reserves `bytes`, waiting up to `wait` for them to be free; `None` if they were not (or can never be).
    pub(crate) async fn reserve(self: &Arc<Self>, bytes: usize, wait: Duration) -> Option<Reserved> {
        self.take(bytes, wait).await.then(|| Reserved { budget: Arc::clone(self), bytes })
    }

    /// Takes `bytes` of the budget (the permits are forgotten: [`BodyBudget::release`] adds them back), waiting up
    /// to `wait`; `false` if they were not free in time.
    async fn take(&self, bytes: usize, wait: Duration) -> bool {
        let Some(n) = u32::try_from(bytes).ok().filter(|_| bytes <= self.total) else { return false };
        let try_take = || {
            let Ok(permit) = self.bytes.try_acquire_many(n) else { return false };
            permit.forget();
            self.metrics.inflight_body_bytes(bytes as f64);
            true
        };
        // The common case, when the bytes are free: no timer, no waiter list (its lock), one atomic operation.
        if try_take() {
            return true;
        }
        let _waiting = Waiting::register(&self.waiting);
        let deadline = tokio::time::Instant::now() + wait;
        let mut ask_for_room = tokio::time::Instant::now();
        loop {
            // Registered before trying, so that a release between the try and the wait is not missed.
            let released = self.released.notified();
            let mut released = std::pin::pin!(released);
            released.as_mut().enable();
            if try_take() {
                return true;
            }
            if tokio::time::Instant::now() >= ask_for_room {
                (self.make_room)();
                ask_for_room = tokio::time::Instant::now() + super::ROOM_RETRY;
            }
            let until = deadline.min(ask_for_room);
            if tokio::time::timeout_at(until, released).await.is_err() && until == deadline {
                return false;
            }
        }
    }

    /// Gives back `bytes` taken, waking the requests waiting for room.
    fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.bytes.add_permits(bytes);
        self.metrics.inflight_body_bytes(-(bytes as f64));
        // Against the waiter's `register`: either it sees these bytes free when it tries after registering, or this
        // sees it registered and wakes it.
        fence(SeqCst);
        if self.waiting.load(SeqCst) > 0 {
            self.released.notify_waiters();
        }
    }
}

/// A request counted in [`BodyBudget::waiting`] until dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn register(waiting: &'a AtomicUsize) -> Waiting<'a> {
        waiting.fetch_add(1, SeqCst);
        fence(SeqCst);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// Bytes of the budget held by one request (its body's buffers, then its answer), released when dropped.
#[must_use = "the bytes are released when this is dropped"]
pub(crate) struct Reserved {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Reserved {
    /// The bytes held.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `more` bytes besides, waiting up to `wait`; `false` if they were not free in time (what is held
    /// stays held).
    async fn grow(&mut self, more: usize, wait: Duration) -> bool {
        if !self.budget.take(more, wait).await {
            return false;
        }
        self.bytes += more;
        true
    }

    /// Holds exactly `bytes`: gives back what is held beyond them, or waits up to `wait` for the rest; `false` if
    /// the rest was not free in time (what is held stays held).
    pub(crate) async fn resize(&mut self, bytes: usize, wait: Duration) -> bool {
        if bytes > self.bytes {
            return self.grow(bytes - self.bytes, wait).await;
        }
        self.budget.release(self.bytes - bytes);
        self.bytes = bytes;
        true
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_small_reservation_passes_a_large_one_that_waits_and_the_large_one_gets_the_bytes_once_free() {
        let budget = Arc::new(BodyBudget::new(1000, Metrics::new().unwrap()));
        let held = budget.reserve(600, Duration::ZERO).await.unwrap();
        let large = budget.reserve(900, Duration::from_secs(5));
        let mut large = std::pin::pin!(large);
        assert!(futures_poll(large.as_mut()).is_none(), "900 bytes do not fit beside 600");
        // A small one is not queued behind the large one.
        let small = budget.reserve(300, Duration::ZERO).await.expect("300 bytes fit beside 600");
        drop(small);
        drop(held);
        let large = large.await.expect("the bytes were released");
        assert_eq!(large.bytes(), 900);
        assert!(budget.reserve(200, Duration::from_millis(10)).await.is_none(), "refused after the wait");
        assert!(budget.reserve(1001, Duration::ZERO).await.is_none(), "more than the budget never fits");
    }

    #[tokio::test]
    async fn growing_takes_more_and_dropping_releases_it_all() {
        let budget = Arc::new(BodyBudget::new(1000, Metrics::new().unwrap()));
        let mut held = budget.reserve(100, Duration::ZERO).await.unwrap();
        assert!(held.grow(400, Duration::ZERO).await);
        assert_eq!(held.bytes(), 500);
        assert!(!held.grow(600, Duration::from_millis(10)).await);
        assert_eq!(held.bytes(), 500, "a failed growth keeps what was held");
        assert!(held.resize(200, Duration::ZERO).await);
        assert_eq!((held.bytes(), budget.bytes.available_permits()), (200, 800), "the excess is given back");
        assert!(held.resize(900, Duration::ZERO).await);
        assert_eq!(budget.bytes.available_permits(), 100);
        drop(held);
        assert_eq!(budget.bytes.available_permits(), 1000);
    }

    /// Polls a future once.
    fn futures_poll<F: Future>(future: std::pin::Pin<&mut F>) -> Option<F::Output> {
        match future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        }
    }
}
