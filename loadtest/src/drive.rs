//! Driving one target for one phase: open loop (a pacer thread issues send times at a fixed rate; each latency is
//! measured from the time the request was *due*, so a stall delays every request behind it and shows in the tail:
//! no coordinated omission) or closed loop (each worker sends its next request as soon as it has an answer).
//!
//! A worker is one in-flight request at a time: on HTTP/1.1 one connection, on HTTP/2 one stream of a connection
//! shared with `streams - 1` other workers. Connections are opened before the first phase and kept across phases.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::bodies::{Body, UID_LEN};
use crate::check;
use crate::client::{Connection, Target, TransportError};
use crate::stats::Tally;

/// How long one request may take before it counts as a transport error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What every worker of a run shares.
pub struct Shared {
    /// The bodies, sent round robin.
    pub bodies: Vec<Body>,
    /// Distinguishes this run's uids from another run's.
    pub run_id: u32,
    /// The next request's sequence number: its uid, and which body it sends.
    seq: AtomicU64,
    /// Requests answered (correctly or not), for the progress line.
    pub done: AtomicU64,
    /// Errors so far, for the progress line.
    pub errors: AtomicU64,
}

impl Shared {
    /// State for a run sending `bodies`.
    pub fn new(bodies: Vec<Body>) -> Shared {
        let run_id =
            std::process::id() ^ (std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap_or_default().as_secs() as u32);
        Shared { bodies, run_id, seq: AtomicU64::new(0), done: AtomicU64::new(0), errors: AtomicU64::new(0) }
    }
}

/// How long a phase runs and at what rate.
#[derive(Debug, Clone, Copy)]
pub struct Phase {
    /// Requests per second (open loop), or as fast as answers come (closed loop).
    pub rate: Option<f64>,
    /// Stop issuing requests after this long.
    pub duration: Option<Duration>,
    /// Stop after this many requests.
    pub requests: Option<u64>,
}

/// The workers of one target, with their connections.
pub struct Pool {
    target: Arc<Target>,
    workers: Vec<Worker>,
}

struct Worker {
    target: Arc<Target>,
    connection: Option<Connection>,
    /// Per body: whether an answer to it was already applied to the pod (done once per body and target).
    applied: Arc<Vec<AtomicBool>>,
}

impl Pool {
    /// Opens `connections` connections to `target`, each carrying `streams` workers (1 on HTTP/1.1).
    pub async fn connect(
        target: Target,
        connections: usize,
        streams: usize,
        bodies: usize,
    ) -> Result<Pool, TransportError> {
        let target = Arc::new(target);
        let applied: Arc<Vec<AtomicBool>> = Arc::new((0..bodies).map(|_| AtomicBool::new(false)).collect());
        let mut workers = Vec::with_capacity(connections * streams);
        for _ in 0..connections {
            let connection = target.connect().await?;
            // HTTP/1.1 cannot share a connection: one worker each, whatever `streams` says.
            let shared = (1..streams).filter_map(|_| connection.share()).collect::<Vec<_>>();
            for connection in std::iter::once(connection).chain(shared) {
                workers.push(Worker { target: target.clone(), connection: Some(connection), applied: applied.clone() });
            }
        }
        Ok(Pool { target, workers })
    }

    /// The target these workers drive.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Runs `phase` and returns what it measured.
    pub async fn run(&mut self, shared: &Arc<Shared>, phase: Phase) -> Tally {
        let started = Instant::now();
        let deadline = phase.duration.map(|d| started + d);
        let (schedule, pacer) = match phase.rate {
            Some(rate) => {
                let (due, pacer) = pace(rate, started, deadline, phase.requests);
                (Schedule::Open(due), Some(pacer))
            }
            None => {
                let tickets = Arc::new(AtomicU64::new(phase.requests.unwrap_or(u64::MAX)));
                (Schedule::Closed { deadline, tickets }, None)
            }
        };
        let tasks: Vec<_> = std::mem::take(&mut self.workers)
            .into_iter()
            .map(|worker| tokio::spawn(worker.run(shared.clone(), schedule.clone())))
            .collect();
        drop(schedule);
        let mut tally = Tally::default();
        for task in tasks {
            match task.await {
                Ok((worker, worker_tally)) => {
                    tally.merge(&worker_tally);
                    self.workers.push(worker);
                }
                // A worker only panics on a bug of ours; keep the other workers' numbers and fail the run.
                Err(e) => tally.transport(format!("a worker failed: {e}")),
            }
        }
        tally.elapsed = started.elapsed();
        if let Some(pacer) = pacer {
            // The pacer has closed the channel, so it is ending; joining it does not hold the runtime up.
            match pacer.join() {
                Ok(lateness) => tally.send_lateness = lateness,
                Err(_) => tally.transport("the pacer thread failed".to_owned()),
            }
        }
        tally
    }
}

/// When workers send.
#[derive(Clone)]
enum Schedule {
    /// Each message is the time a request is due; the pacer closes the channel at the end of the phase.
    Open(async_channel::Receiver<Instant>),
    /// As fast as possible until the deadline or until the tickets run out.
    Closed { deadline: Option<Instant>, tickets: Arc<AtomicU64> },
}

/// Starts the pacer: a thread that puts the due time of request `i`, `start + i / rate`, on the channel at that
/// time. Not a runtime timer: those have a resolution of 1 ms, and the delay would count as latency. The thread
/// sleeps (with a timer slack of 1 µs instead of the default 50 µs) until shortly before each due time, then
/// yields the CPU until it comes, so that it is on time without taking the CPU from the harness's own workers
/// when they share one. It returns how late it was for each request (µs), the machine's scheduling noise.
pub(crate) fn pace(
    rate: f64,
    start: Instant,
    deadline: Option<Instant>,
    requests: Option<u64>,
) -> (async_channel::Receiver<Instant>, std::thread::JoinHandle<Histogram<u64>>) {
    let (sender, receiver) = async_channel::unbounded();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let pacer = std::thread::spawn(move || {
        // Best effort: without it, wake-ups are up to 50 µs late, which the report would show as latency.
        let _ = nix::sys::prctl::set_timerslack(1_000);
        // A VM's timer interrupts can be late by tens of microseconds.
        const EARLY: Duration = Duration::from_micros(100);
        let mut lateness = crate::stats::histogram();
        for i in 0..requests.unwrap_or(u64::MAX) {
            let due = start + interval.mul_f64(i as f64);
            if deadline.is_some_and(|d| due >= d) {
                break;
            }
            let now = Instant::now();
            if due > now + EARLY {
                std::thread::sleep(due - now - EARLY);
            }
            while Instant::now() < due {
                std::thread::yield_now();
            }
            lateness.saturating_record(due.elapsed().as_micros() as u64);
            if sender.send_blocking(due).is_err() {
                break;
            }
        }
        lateness
    });
    (receiver, pacer)
}

impl Worker {
    async fn run(mut self, shared: Arc<Shared>, schedule: Schedule) -> (Worker, Tally) {
        let mut tally = Tally::default();
        loop {
            let due = match &schedule {
                Schedule::Open(due) => match due.recv().await {
                    Ok(due) => due,
                    Err(_) => break,
                },
                Schedule::Closed { deadline, tickets } => {
                    let now = Instant::now();
                    let ticket = tickets.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
                    if deadline.is_some_and(|d| now >= d) || ticket.is_err() {
                        break;
                    }
                    now
                }
            };
            let failed_before = tally.errors();
            self.one(&shared, due, &mut tally).await;
            shared.done.fetch_add(1, Ordering::Relaxed);
            if tally.errors() > failed_before {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                if matches!(schedule, Schedule::Closed { .. }) && self.connection.is_none() {
                    // A server that refuses connections would otherwise be hammered in a tight loop.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        (self, tally)
    }

    /// Sends one request due at `due` and records its answer.
    async fn one(&mut self, shared: &Shared, due: Instant, tally: &mut Tally) {
        let seq = shared.seq.fetch_add(1, Ordering::Relaxed);
        let index = (seq % shared.bodies.len() as u64) as usize;
        let body = &shared.bodies[index];
        let mut uid = [0u8; UID_LEN];
        let request = body.stamp(shared.run_id, seq, &mut uid);
        let mut connection = match self.connection.take().filter(Connection::is_open) {
            Some(connection) => connection,
            None => match self.target.connect().await {
                Ok(connection) => connection,
                Err(e) => return tally.transport(e.to_string()),
            },
        };
        let reply = match tokio::time::timeout(REQUEST_TIMEOUT, connection.send(&self.target, request, index)).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => return tally.transport(e.to_string()),
            Err(_) => return tally.transport(TransportError::Timeout(REQUEST_TIMEOUT).to_string()),
        };
        let latency = due.elapsed();
        self.connection = Some(connection);
        let status = reply.status.as_u16();
        let checked = match &self.target.fixed {
            // The stack floor: its fixed answer to this body was checked at start; this one must be that one.
            Some(fixed) => fixed.check(index, status, reply.content_type.as_ref().map(|v| v.as_bytes()), &reply.body),
            None => {
                // The first answer for each body is also applied to its pod (costly, so once per body and target).
                let apply =
                    !self.applied[index].load(Ordering::Relaxed) && !self.applied[index].swap(true, Ordering::Relaxed);
                // The uid was written by `stamp` from hex digits and dashes only.
                let uid = std::str::from_utf8(&uid).unwrap();
                check::check(status, &reply.body, uid, apply).and_then(|(answer, patch)| match patch {
                    Some(patch) => check::applies(&body.pod, &patch).map(|()| answer),
                    None => Ok(answer),
                })
            }
        };
        match checked {
            Ok(answer) => tally.answer(latency, answer.ops > 0, reply.body.len()),
            Err(wrong) => tally.wrong(format!("{} ({})", wrong, body.name)),
        }
    }
}
