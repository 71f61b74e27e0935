//! `loadtest floor`: the machine's own latency floor, with no webhook at all. A thread echoes fixed-size answers
//! to fixed-size requests over plain loopback TCP (no TLS, no HTTP, no JSON), and a paced client measures each
//! round trip from its due time, as the open loop does. What this shows in the tail (a vCPU descheduled, a late
//! wake-up) every webhook measured on the same machine carries too, so no server can do better here.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;

/// Arguments of `loadtest floor`.
#[derive(Debug, Args)]
pub struct FloorArgs {
    /// Requests per second.
    #[arg(long, value_name = "N", default_value_t = 5000.0, value_parser = crate::positive_rate)]
    pub rate: f64,
    /// How long to measure.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Bytes per request (a ~6 KB review by default).
    #[arg(long, value_name = "BYTES", default_value_t = 6_000)]
    pub request_bytes: usize,
    /// Bytes per answer (about what the injector answers to it).
    #[arg(long, value_name = "BYTES", default_value_t = 3_000)]
    pub answer_bytes: usize,
}

/// Round-trip latencies (µs, from each request's due time) of `args.rate` requests a second for `args.duration`,
/// the echo thread on `server_cpu` and the caller's thread on `client_cpu` when given.
pub fn measure(
    args: &FloorArgs,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
) -> std::io::Result<Histogram<u64>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let (request_bytes, answer_bytes) = (args.request_bytes.max(1), args.answer_bytes.max(1));
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        pin(server_cpu);
        let (mut socket, _) = listener.accept()?;
        socket.set_nodelay(true)?;
        let (mut request, answer) = (vec![0; request_bytes], vec![b'a'; answer_bytes]);
        // Ends when the client hangs up.
        while socket.read_exact(&mut request).is_ok() {
            socket.write_all(&answer)?;
        }
        Ok(())
    });
    pin(client_cpu);
    let mut socket = TcpStream::connect(address)?;
    socket.set_nodelay(true)?;
    let (request, mut answer) = (vec![b'r'; request_bytes], vec![0; answer_bytes]);
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let mut latencies = crate::stats::histogram();
    let start = Instant::now();
    for i in 0.. {
        let due = start + interval.mul_f64(i as f64);
        if due >= start + args.duration {
            break;
        }
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        socket.write_all(&request)?;
        socket.read_exact(&mut answer)?;
        latencies.saturating_record(due.elapsed().as_micros() as u64);
    }
    drop(socket);
    echo.join().map_err(|_| std::io::Error::other("the echo thread panicked"))??;
    Ok(latencies)
}

/// Pins the calling thread to `cpu`, best effort: unpinned, the figures are noisier but still a floor.
fn pin(cpu: Option<usize>) {
    let Some(cpu) = cpu else { return };
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// Runs `loadtest floor` and prints its percentiles.
pub fn run(args: &FloorArgs) -> Result<(), String> {
    // As the harness pins: the server on CPU 0, the client on CPU 1, when there are two.
    let two = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    let (server, client) = if two { (Some(0), Some(1)) } else { (None, None) };
    let latencies = measure(args, server, client).map_err(|e| format!("floor: {e}"))?;
    let q = |quantile: f64| latencies.value_at_quantile(quantile);
    println!(
        "plain TCP echo over loopback, {} B requests, {} B answers, {} req/s for {}{}",
        args.request_bytes,
        args.answer_bytes,
        args.rate,
        humantime::format_duration(args.duration),
        if two { ", echo on CPU 0, client on CPU 1" } else { "" }
    );
    println!(
        "requests {}  p50 {} µs  p90 {} µs  p99 {} µs  p99.9 {} µs  max {} µs",
        latencies.len(),
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        latencies.max()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_paced_request_is_timed_and_the_percentiles_are_ordered() {
        let args = FloorArgs {
            rate: 2_000.0,
            duration: Duration::from_millis(250),
            request_bytes: 6_000,
            answer_bytes: 3_000,
        };
        let latencies = measure(&args, None, None).unwrap();
        assert_eq!(latencies.len(), 500);
        let (p50, p99) = (latencies.value_at_quantile(0.5), latencies.value_at_quantile(0.99));
        assert!(0 < p50 && p50 <= p99 && p99 <= latencies.max(), "{p50} {p99} {}", latencies.max());
    }
}
