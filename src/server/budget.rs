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
//!
//! Bodies grow their share in steps as they arrive, so large bodies arriving together can fill the budget with
//! steps, each waiting for room another holds: none would finish, all would be refused after the wait. The oldest
//! waiting request goes first: once it has waited [`YIELD_AFTER`], the other waiting requests leave the bytes
//! released to it, and the youngest request that holds a share gives it up (503), one every [`YIELD_AFTER`], until
//! the oldest fits, rather than every one of them waiting out the second.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst, fence};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use super::telemetry::Metrics;

/// How long a body that does not fit in the budget waits for bytes to be released before it is refused (503 with
/// `Retry-After`): long enough to ride out a burst of large bodies, short next to the API server's 3 s to 10 s
/// webhook timeout, so that it can still call another replica.
pub(crate) const BODY_BUDGET_WAIT: Duration = Duration::from_secs(1);

/// How long the oldest waiting request waits before younger ones waiting to grow give their shares up to it.
const YIELD_AFTER: Duration = super::ROOM_RETRY;

/// What the budget holds for a body of `bytes`: the buffer the review parses in place (with the parser's padding)
/// and the copy of the body kept for a second review (the parse changes the buffer).
pub(crate) fn held_for(bytes: usize) -> usize {
    bytes.saturating_mul(2).saturating_add(sidecar_injector_core::PARSE_PADDING)
}

/// The budget shared by every connection.
pub(crate) struct BodyBudget {
    bytes: Semaphore,
    released: Notify,
    /// Requests waiting for bytes: a release wakes them only if there are any (the wake takes a lock).
    waiting: AtomicUsize,
    /// The requests waiting, in their order of arrival. Touched only by a request that must wait, never by one
    /// the budget has room for.
    queue: Mutex<Queue>,
    /// The place in the order of arrival of the next reservation.
    next_arrival: AtomicU64,
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
            queue: Mutex::new(Queue { waiting: BTreeMap::new(), gave_way: None }),
            next_arrival: AtomicU64::new(0),
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
        let arrival = self.next_arrival.fetch_add(1, Relaxed);
        let taken = self.take(bytes, wait, Holder { arrival, holds: 0 }).await;
        taken.then(|| Reserved { budget: Arc::clone(self), bytes, arrival })
    }

    /// Takes `bytes` of the budget (the permits are forgotten: [`BodyBudget::release`] adds them back) for
    /// `holder`, waiting up to `wait`; `false` if they were not free in time, or if `holder` gave its share up to
    /// an older request.
    async fn take(&self, bytes: usize, wait: Duration, holder: Holder) -> bool {
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
        let _waiting = Waiting::register(self, &holder);
        let deadline = tokio::time::Instant::now() + wait;
        let mut ask_for_room = tokio::time::Instant::now();
        loop {
            // Registered before trying, so that a release between the try and the wait is not missed.
            let released = self.released.notified();
            let mut released = std::pin::pin!(released);
            released.as_mut().enable();
            if self.may_take(holder.arrival) && try_take() {
                return true;
            }
            if self.gives_way(holder.arrival) {
                return false;
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

    /// The waiting requests; a panic while the queue was held left it whole (each use is one map operation).
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// May the waiting request that arrived at `arrival` take bytes released? Unless an older one has waited
    /// [`YIELD_AFTER`]: then they are its.
    fn may_take(&self, arrival: u64) -> bool {
        self.queue().overdue().is_none_or(|oldest| oldest == arrival)
    }

    /// Does the waiting request that arrived at `arrival` give its share up? When it is the youngest waiting
    /// request that holds one, an older one has waited [`YIELD_AFTER`], and no other request gave way within it.
    fn gives_way(&self, arrival: u64) -> bool {
        let mut queue = self.queue();
        let youngest_holding = queue.waiting.iter().rev().find(|(_, waiter)| waiter.holds).map(|(&a, _)| a);
        let gives_way = youngest_holding == Some(arrival)
            && queue.overdue().is_some_and(|oldest| oldest < arrival)
            && queue.gave_way.is_none_or(|at| at.elapsed() >= YIELD_AFTER);
        if gives_way {
            queue.gave_way = Some(tokio::time::Instant::now());
        }
        gives_way
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

/// Who asks for bytes: its place in the order of arrival, and how many bytes it holds already.
struct Holder {
    arrival: u64,
    holds: usize,
}

/// The requests waiting for bytes, and when one last gave its share up.
struct Queue {
    waiting: BTreeMap<u64, Waiter>,
    gave_way: Option<tokio::time::Instant>,
}

impl Queue {
    /// The oldest waiting request, if it has waited [`YIELD_AFTER`] or more.
    fn overdue(&self) -> Option<u64> {
        let (&oldest, waiter) = self.waiting.first_key_value()?;
        (waiter.since.elapsed() >= YIELD_AFTER).then_some(oldest)
    }
}

/// A waiting request: since when, and whether it holds a share of the budget it could give up.
struct Waiter {
    since: tokio::time::Instant,
    holds: bool,
}

/// A request counted in [`BodyBudget::waiting`] and listed in [`BodyBudget::queue`] until dropped.
struct Waiting<'a> {
    budget: &'a BodyBudget,
    arrival: u64,
}

impl<'a> Waiting<'a> {
    fn register(budget: &'a BodyBudget, holder: &Holder) -> Waiting<'a> {
        let waiter = Waiter { since: tokio::time::Instant::now(), holds: holder.holds > 0 };
        budget.queue().waiting.insert(holder.arrival, waiter);
        budget.waiting.fetch_add(1, SeqCst);
        fence(SeqCst);
        Waiting { budget, arrival: holder.arrival }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.budget.waiting.fetch_sub(1, SeqCst);
        self.budget.queue().waiting.remove(&self.arrival);
    }
}

/// Bytes of the budget held by one request (its body's buffers, then its answer), released when dropped.
#[must_use = "the bytes are released when this is dropped"]
pub(crate) struct Reserved {
    budget: Arc<BodyBudget>,
    bytes: usize,
    /// Its place in the order of arrival: the oldest waiting request goes first.
    arrival: u64,
}

impl Reserved {
    /// The bytes held.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `more` bytes besides, waiting up to `wait`; `false` if they were not free in time or an older
    /// request waits for them (what is held stays held, for the caller to drop).
    async fn grow(&mut self, more: usize, wait: Duration) -> bool {
        let holder = Holder { arrival: self.arrival, holds: self.bytes };
        if !self.budget.take(more, wait, holder).await {
            return false;
        }
        self.bytes += more;
        true
    }

    /// Holds exactly `bytes`: gives back what is held beyond them, or waits up to `wait` for the rest; `false` if
    /// the rest was not free in time or an older request waits for it (what is held stays held).
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

    #[tokio::test]
    async fn requests_growing_into_a_full_budget_give_their_shares_up_to_the_oldest() {
        let budget = Arc::new(BodyBudget::new(1000, Metrics::new().unwrap()));
        let mut older = budget.reserve(400, Duration::ZERO).await.unwrap();
        let mut younger = budget.reserve(400, Duration::ZERO).await.unwrap();
        let started = tokio::time::Instant::now();
        let wait = Duration::from_secs(5);
        // Each needs 400 more, and only 200 are free: neither fits unless one gives up what it holds.
        let (older_grew, younger_grew) = tokio::join!(older.resize(800, wait), async {
            let grew = younger.resize(800, wait).await;
            assert!(!grew, "the younger request does not take its 400 more");
            drop(younger);
            grew
        });
        assert!(older_grew && !younger_grew);
        assert_eq!(older.bytes(), 800);
        let waited = started.elapsed();
        assert!(waited >= YIELD_AFTER && waited < wait / 2, "the older request waited {waited:?}");
        // A request that holds nothing yet waits: it has no share to give up.
        let newcomer = tokio::spawn({
            let budget = Arc::clone(&budget);
            async move { budget.reserve(300, 2 * YIELD_AFTER).await }
        });
        tokio::time::sleep(YIELD_AFTER / 2).await;
        assert!(older.resize(900, Duration::ZERO).await, "100 were free");
        drop(older);
        assert!(newcomer.await.unwrap().is_some(), "the newcomer got room once it was freed");
    }

    /// Polls a future once.
    fn futures_poll<F: Future>(future: std::pin::Pin<&mut F>) -> Option<F::Output> {
        match future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        }
    }
}
