//! What a run measured for one target: an HDR histogram of latencies (µs) and the counts of answers and errors.
//! Each worker keeps its own `Tally`; they are merged when a phase ends.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Latencies from 1 µs to 60 s, 3 significant figures (1 µs resolution below 1 ms).
pub fn histogram() -> Histogram<u64> {
    // Fixed, valid bounds: 1 <= low, high >= 2 * low, 3 significant figures.
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

/// How many distinct error messages are kept to show.
const EXAMPLES: usize = 5;

/// Counts and latencies of requests to one target.
#[derive(Clone)]
pub struct Tally {
    /// Latency of every correct answer, in µs.
    pub latency: Histogram<u64>,
    /// Open loop: how late the pacer issued each request after its due time, in µs. A thread that does nothing
    /// but wait for a time, so its lateness is the machine's scheduling noise (not the server's), which every
    /// latency above also carries.
    pub send_lateness: Histogram<u64>,
    /// Correct answers.
    pub ok: u64,
    /// Correct answers that carried a patch.
    pub patched: u64,
    /// Bytes of the correct answers' bodies, together.
    pub answer_bytes: u64,
    /// Answers that came back wrong (status, uid, allowed, patch).
    pub wrong: u64,
    /// Requests that got no answer (connect, TLS, HTTP, timeout).
    pub transport: u64,
    /// The first few distinct error messages.
    pub examples: Vec<String>,
    /// Wall time of the phases measured.
    pub elapsed: Duration,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            latency: histogram(),
            send_lateness: histogram(),
            ok: 0,
            patched: 0,
            answer_bytes: 0,
            wrong: 0,
            transport: 0,
            examples: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }
}

impl Tally {
    /// A correct answer of `bytes` bytes after `latency`.
    pub fn answer(&mut self, latency: Duration, patched: bool, bytes: usize) {
        self.ok += 1;
        self.patched += u64::from(patched);
        self.answer_bytes += bytes as u64;
        self.latency.saturating_record(latency.as_micros().max(1) as u64);
    }

    /// A wrong answer.
    pub fn wrong(&mut self, reason: String) {
        self.wrong += 1;
        self.example(format!("wrong answer: {reason}"));
    }

    /// A request without an answer.
    pub fn transport(&mut self, reason: String) {
        self.transport += 1;
        self.example(format!("transport: {reason}"));
    }

    fn example(&mut self, message: String) {
        if self.examples.len() < EXAMPLES && !self.examples.contains(&message) {
            self.examples.push(message);
        }
    }

    /// Wrong answers and transport errors.
    pub fn errors(&self) -> u64 {
        self.wrong + self.transport
    }

    /// All requests, answered or not.
    pub fn requests(&self) -> u64 {
        self.ok + self.errors()
    }

    /// The mean size of a correct answer's body, bytes (0 without one).
    pub fn mean_answer_bytes(&self) -> f64 {
        if self.ok == 0 { 0.0 } else { self.answer_bytes as f64 / self.ok as f64 }
    }

    /// Correct answers per second of measured time.
    pub fn rps(&self) -> f64 {
        if self.elapsed.is_zero() { 0.0 } else { self.ok as f64 / self.elapsed.as_secs_f64() }
    }

    /// How late requests were issued at `quantile`, in µs (open loop; 0 when nothing was paced).
    pub fn send_lateness_us(&self, quantile: f64) -> u64 {
        self.send_lateness.value_at_quantile(quantile)
    }

    /// The latency at `quantile` (0.99 for p99), in µs.
    pub fn quantile_us(&self, quantile: f64) -> u64 {
        self.latency.value_at_quantile(quantile)
    }

    /// Adds another tally's counts, latencies and measured time.
    pub fn merge(&mut self, other: &Tally) {
        // All these histograms have the same bounds, so adding cannot fail.
        self.latency.add(&other.latency).unwrap();
        self.send_lateness.add(&other.send_lateness).unwrap();
        self.ok += other.ok;
        self.patched += other.patched;
        self.answer_bytes += other.answer_bytes;
        self.elapsed += other.elapsed;
        self.merge_errors(other);
    }

    /// Adds another tally's errors only: those of a warm-up, or of a sweep's steps, count against the run
    /// without their latencies being reported.
    pub fn merge_errors(&mut self, other: &Tally) {
        self.wrong += other.wrong;
        self.transport += other.transport;
        for message in &other.examples {
            self.example(message.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_keeps_every_count_and_sample() {
        let mut a = Tally::default();
        for us in 1..=99 {
            a.answer(Duration::from_micros(us), us % 2 == 0, 100);
        }
        let mut b = Tally::default();
        b.answer(Duration::from_millis(250), true, 1_100);
        b.send_lateness.record(2_000).unwrap();
        b.wrong("uid".into());
        b.transport("reset".into());
        b.transport("reset".into());
        (a.elapsed, b.elapsed) = (Duration::from_millis(1500), Duration::from_millis(500));
        a.merge(&b);
        assert_eq!((a.ok, a.patched, a.wrong, a.transport, a.errors(), a.requests()), (100, 50, 1, 2, 3, 103));
        assert_eq!(a.quantile_us(0.5), 50);
        assert!(a.quantile_us(1.0) >= 249_900, "the slow answer is the max: {}", a.quantile_us(1.0));
        assert_eq!(a.rps(), 50.0);
        assert_eq!(a.mean_answer_bytes(), 110.0);
        assert_eq!(a.examples, ["wrong answer: uid", "transport: reset"]);
        assert!((1_999..=2_001).contains(&a.send_lateness_us(1.0)), "{}", a.send_lateness_us(1.0));

        let mut errors_only = Tally::default();
        errors_only.merge_errors(&a);
        assert_eq!((errors_only.ok, errors_only.errors(), errors_only.latency.len()), (0, 3, 0));
        assert_eq!(errors_only.elapsed, Duration::ZERO);
    }
}
