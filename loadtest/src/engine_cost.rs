//! The engine in process, on the bodies the run sent: what one review costs the injector's engine alone, in this
//! run, on the CPU the servers ran on. With the server's CPU per request and the stack floor's, it accounts for
//! every microsecond: ours = floor + engine + remainder, the remainder being the server's own overhead (the body
//! gathered into one buffer, the deadline and budget, metrics, the answer's framing) beside hyper + rustls.
//!
//! The engine is the one the stack floor's answers come from ([`crate::stack_floor::answering_engine`]), each review a stamped body as the drivers stamp them (its own uid and, for generated pods, its own
//! name), copied into a buffer with the parse padding as the server's body buffer is. The bodies are stamped
//! before the clock starts; the thread's own CPU time ([`thread_cpu`]) is what is counted.

use std::time::{Duration, Instant};

use sidecar_injector_core::PARSE_PADDING;

use crate::bodies::{Body, UID_LEN};

/// Stamped bodies kept at once: more distinct pods than the engine's per-thread render cache holds (16), so that
/// a pod named per request is rendered anew each time, as in the server; and few enough bytes to stay in the
/// CPU's caches, as a body the server has just decrypted is (a pool larger than the caches would charge the
/// engine for memory traffic the server does not have: 84 µs instead of 52 µs at 60 KB, here). Every body of
/// the corpus is kept, whatever its size: the mix is the run's.
const STAMPED_BYTES: usize = 4 * 1024 * 1024;
const STAMPED_MIN: usize = 32;

/// What the engine costs in process, per review.
#[derive(Debug, Clone, Copy)]
pub struct EngineCost {
    /// CPU time, µs (the mean).
    pub cpu_us: f64,
    /// Wall-clock time of one review, median and 99th percentile, µs (with 0.1 µs resolution).
    pub p50_us: f64,
    /// The 99th percentile.
    pub p99_us: f64,
}

/// The engine's cost per review of `bodies` (in the drivers' order), run for about `duration` on a thread pinned to
/// `cpus` (the servers' CPUs) when given.
pub fn per_review(
    bodies: &[Body],
    duration: Duration,
    cpus: Option<Vec<usize>>,
    webhook: crate::bodies::Webhook,
) -> Result<EngineCost, String> {
    let bodies: Vec<Vec<u8>> = {
        let mean = bodies.iter().map(Body::len).sum::<usize>() / bodies.len().max(1);
        let count = (STAMPED_BYTES / mean.max(1)).max(STAMPED_MIN).max(bodies.len());
        let mut uid = [0u8; UID_LEN];
        // Another run id than the drivers': the uids differ from every request sent.
        (0..count as u64)
            .map(|seq| bodies[seq as usize % bodies.len()].stamp(u32::MAX, seq, &mut uid).to_vec())
            .collect()
    };
    let thread = std::thread::spawn(move || -> Result<EngineCost, String> {
        if let Some(cpus) = cpus {
            crate::cpu::pin_to(&cpus)?;
        }
        let engine = crate::stack_floor::answering_engine()?;
        let longest = bodies.iter().map(Vec::len).max().unwrap_or(0);
        let (mut buf, mut out) = (Vec::with_capacity(longest + PARSE_PADDING), Vec::with_capacity(64 * 1024));
        let mut review = |body: &[u8]| -> Result<(), String> {
            buf.clear();
            buf.extend_from_slice(body);
            webhook.answer(&engine, &mut buf, &mut out).map(drop).map_err(|e| format!("the engine refused a body: {e}"))
        };
        // One pass unmeasured: the parser's buffers and the render cache as a running server has them.
        for body in &bodies {
            review(body)?;
        }
        // Each review timed on its own too, in tenths of a microsecond, for the percentiles; reading the clock
        // twice costs tens of nanoseconds, inside the CPU time measured.
        let mut times = crate::stats::histogram();
        let (started, cpu_before) = (Instant::now(), crate::cpu::thread_cpu()?);
        let mut reviews = 0u64;
        while started.elapsed() < duration {
            for body in &bodies {
                let start = Instant::now();
                review(body)?;
                times.saturating_record((start.elapsed().as_nanos() / 100).max(1) as u64);
            }
            reviews += bodies.len() as u64;
        }
        let cpu = crate::cpu::thread_cpu()? - cpu_before;
        let percentile = |q: f64| times.value_at_quantile(q) as f64 / 10.0;
        Ok(EngineCost {
            cpu_us: cpu.as_secs_f64() * 1e6 / reviews.max(1) as f64,
            p50_us: percentile(0.50),
            p99_us: percentile(0.99),
        })
    });
    thread.join().map_err(|_| "the engine's thread panicked".to_owned())?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bodies::Webhook;

    #[test]
    fn the_engine_costs_something_and_less_on_small_bodies_than_on_large_ones() {
        let corpus = crate::bodies::default_corpus();
        let load = |size| {
            let spec = crate::bodies::BodySpec::Size(size);
            crate::bodies::load(&spec, crate::bodies::Naming::Unique, &corpus.join("pods"), &corpus).unwrap().0
        };
        let small = per_review(&load(2_000), Duration::from_millis(200), None, Webhook::Mutate).unwrap();
        let large = per_review(&load(60_000), Duration::from_millis(200), None, Webhook::Mutate).unwrap();
        for cost in [small, large] {
            assert!(cost.cpu_us > 0.0 && cost.p50_us > 0.0 && cost.p99_us >= cost.p50_us, "{cost:?}");
        }
        let (small, large) = (small.cpu_us, large.cpu_us);
        // 30 times the bytes: far more than twice the time on any machine, however noisy.
        assert!(large > 2.0 * small, "2 KB: {small:.1} µs, 60 KB: {large:.1} µs");
    }
}
