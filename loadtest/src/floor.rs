//! `loadtest floor`: the machine's own latency floor, with no webhook at all. A thread echoes fixed-size answers
//! to fixed-size requests over plain loopback TCP (no TLS, no HTTP, no JSON), and a paced client measures each
//! round trip from its due time, as the open loop does. What this shows in the tail (a vCPU descheduled, a late
//! wake-up) every webhook measured on the same machine carries too, so no server can do better here. The due
//! times come from the open loop's own pacer (`drive::pace`) and the threads are pinned as the harness pins.

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

/// Where the echo thread and the client run: as the harness places a server it starts and itself.
pub struct Placement {
    pub echo: Vec<usize>,
    pub client: Vec<usize>,
}

/// Round-trip latencies (µs, from each request's due time, which the harness's own pacer issues) of `args.rate`
/// requests a second for `args.duration`, the threads placed as `placement` says, if given.
pub fn measure(args: &FloorArgs, placement: Option<&Placement>) -> Result<Histogram<u64>, String> {
    let io = |e: std::io::Error| format!("floor: {e}");
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let address = listener.local_addr().map_err(io)?;
    let (request_bytes, answer_bytes) = (args.request_bytes.max(1), args.answer_bytes.max(1));
    let echo_cpus = placement.map(|p| p.echo.clone());
    let echo = std::thread::spawn(move || -> Result<(), String> {
        if let Some(cpus) = echo_cpus {
            crate::cpu::pin_to(&cpus)?;
        }
        let (mut socket, _) = listener.accept().map_err(io)?;
        socket.set_nodelay(true).map_err(io)?;
        let (mut request, answer) = (vec![0; request_bytes], vec![b'a'; answer_bytes]);
        // Ends when the client hangs up.
        while socket.read_exact(&mut request).is_ok() {
            socket.write_all(&answer).map_err(io)?;
        }
        Ok(())
    });
    if let Some(placement) = placement {
        // Before the pacer starts, so that it runs beside the client, as in the harness.
        crate::cpu::pin_to(&placement.client)?;
    }
    let mut socket = TcpStream::connect(address).map_err(io)?;
    socket.set_nodelay(true).map_err(io)?;
    let (request, mut answer) = (vec![b'r'; request_bytes], vec![0; answer_bytes]);
    let mut latencies = crate::stats::histogram();
    let start = Instant::now();
    let (due_times, pacer) = crate::drive::pace(args.rate, start, Some(start + args.duration), None);
    while let Ok(due) = due_times.recv_blocking() {
        socket.write_all(&request).map_err(io)?;
        socket.read_exact(&mut answer).map_err(io)?;
        latencies.saturating_record(due.elapsed().as_micros() as u64);
    }
    drop(socket);
    pacer.join().map_err(|_| "floor: the pacer thread panicked".to_owned())?;
    echo.join().map_err(|_| "floor: the echo thread panicked".to_owned())??;
    Ok(latencies)
}

/// Runs `loadtest floor` and prints its percentiles.
pub fn run(args: &FloorArgs) -> Result<(), String> {
    // As the harness pins a server it starts: on the first CPU, the client on the rest, when there are two.
    let allowed = crate::cpu::allowed_cpus()?;
    let placement = (allowed.len() >= 2).then(|| Placement { echo: vec![allowed[0]], client: allowed[1..].to_vec() });
    let latencies = measure(args, placement.as_ref())?;
    let q = |quantile: f64| latencies.value_at_quantile(quantile);
    println!(
        "plain TCP echo over loopback, {} B requests, {} B answers, {} req/s for {}{}",
        args.request_bytes,
        args.answer_bytes,
        args.rate,
        humantime::format_duration(args.duration),
        placement.map_or_else(String::new, |p| format!(", echo on CPUs {:?}, client on CPUs {:?}", p.echo, p.client))
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
        let latencies = measure(&args, None).unwrap();
        assert_eq!(latencies.len(), 500);
        let (p50, p99) = (latencies.value_at_quantile(0.5), latencies.value_at_quantile(0.99));
        assert!(0 < p50 && p50 <= p99 && p99 <= latencies.max(), "{p50} {p99} {}", latencies.max());
    }
}
