//! `loadtest`: drives an admission webhook over HTTPS and reports latency percentiles (coordinated-omission
//! corrected), throughput, errors, and the server's own CPU time per request, optionally beside a second webhook
//! and beside the stack floor (hyper + rustls answering a fixed answer: what the stack alone costs).
//!
//! ```text
//! cargo run -p loadtest --release -- --start --rate 5000 --duration 10s
//! cargo run -p loadtest --release -- --start --start-baseline --bodies 6k            # closed loop, side by side
//! cargo run -p loadtest --release -- --start --start-baseline --start-floor --bodies 2k --rate 1000
//! cargo run -p loadtest --release -- --url https://10.0.0.5:8443/mutate --ca ca.pem --rate 200 --duration 30s
//! cargo run -p loadtest --release -- plot-bench --out cost-by-size.svg   # after cargo bench --bench engine
//! cargo run -p loadtest --release -- floor --rate 5000                   # the machine's own latency floor
//! ```
//!
//! Exit codes: 0 every answer was correct; 1 errors (wrong answers or transport errors) or a failed setup; 2 usage.

#![forbid(unsafe_code)]

mod baseline;
mod benchplot;
mod bodies;
mod check;
mod client;
mod cpu;
mod drive;
mod engine_cost;
mod floor;
mod plot;
mod report;
/// The reviews the benches send: the pathological pods (`--bodies env-1500`, ...).
#[path = "../../benches/support/reviews.rs"]
#[allow(dead_code)]
mod reviews;
mod run;
mod server;
mod stack_floor;
mod stats;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

// The allocator the injector binary uses, so that `--start` measures the server as it ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "loadtest", version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    internal: Option<Internal>,
    #[command(flatten)]
    run: RunArgs,
}

/// Other commands, and the servers `--start`, `--start-baseline` and `--start-floor` run in a child process of
/// this binary.
#[derive(Debug, Subcommand)]
enum Internal {
    /// Print the engine's cost by review size per stage (criterion's `stages` estimates) and plot it as SVG.
    PlotBench(benchplot::PlotArgs),
    /// The machine's latency floor: plain TCP echo over loopback, paced as the open loop, no webhook at all.
    Floor(floor::FloorArgs),
    /// `sidecar-injector` itself (`loadtest __injector serve ...` is `sidecar-injector serve ...`).
    #[command(name = "__injector", hide = true)]
    Injector {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// The baseline webhook (src/baseline.rs).
    #[command(name = "__baseline", hide = true)]
    Baseline(baseline::BaselineArgs),
    /// The stack floor (src/stack_floor.rs).
    #[command(name = "__floor-server", hide = true)]
    FloorServer(stack_floor::FloorServerArgs),
}

/// What to drive, how hard, for how long, and what to report.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The webhook to drive (https only), such as https://127.0.0.1:8443/mutate?timeout=10s.
    #[arg(long, value_name = "URL", required_unless_present = "start", conflicts_with = "start")]
    pub url: Option<String>,

    /// Start `sidecar-injector serve` on 127.0.0.1 with a generated certificate, drive it, and stop it at the end.
    #[arg(long)]
    pub start: bool,

    /// With --start: run this sidecar-injector binary instead of the copy built into the harness.
    #[arg(long, value_name = "PATH", requires = "start")]
    pub server_bin: Option<PathBuf>,

    /// With --start: one more flag for `serve` (repeat it), such as --server-arg=--template-dir=templates.
    #[arg(long, value_name = "ARG", requires = "start", allow_hyphen_values = true)]
    pub server_arg: Vec<String>,

    /// The CA certificate (PEM) that signed the --url and --compare webhooks' certificates.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,

    /// A second webhook driven alternately with the first, with the same bodies; reported side by side.
    #[arg(long, value_name = "URL", conflicts_with = "start_baseline")]
    pub compare: Option<String>,

    /// Start the baseline webhook (axum + serde_json + typed k8s-openapi + json-patch) as the --compare target.
    #[arg(long)]
    pub start_baseline: bool,

    /// Also drive the stack floor, started like --start-baseline: hyper + rustls set up as `serve` sets them up,
    /// reading each body and answering the injector's answer to it (the built-in template's) as fixed bytes.
    /// The report adds each target ÷ the floor: what the webhook costs above the stack it is built on.
    #[arg(long)]
    pub start_floor: bool,

    /// With --start-floor: one more flag for the floor (repeat it), such as --floor-arg=--path=/elsewhere; it
    /// overrides the harness's own (--floor-arg=--answers=FILE answers FILE's lines instead of ours).
    #[arg(long, value_name = "ARG", requires = "start_floor", allow_hyphen_values = true)]
    pub floor_arg: Vec<String>,

    /// The --url server's process id, to report its CPU time per request and its memory.
    #[arg(long, value_name = "PID", conflicts_with = "start")]
    pub server_pid: Option<u32>,

    /// The --compare server's process id.
    #[arg(long, value_name = "PID", conflicts_with = "start_baseline")]
    pub compare_pid: Option<u32>,

    /// Open loop: this many requests per second, each timed from when it was due. Without it: closed loop.
    #[arg(long, value_name = "N", value_parser = positive_rate)]
    pub rate: Option<f64>,

    /// Step the rate up from --rate by --sweep-step (each step lasting --duration) until p99 exceeds --max-p99
    /// or a request fails; report the highest rate that held.
    #[arg(long, requires = "rate")]
    pub sweep: bool,

    /// The sweep's increment, requests per second [default: --rate].
    #[arg(long, value_name = "N", requires = "sweep", value_parser = positive_rate)]
    pub sweep_step: Option<f64>,

    /// The sweep's latency bound.
    #[arg(long, value_name = "DURATION", default_value = "1ms", value_parser = humantime::parse_duration)]
    pub max_p99: Duration,

    /// The most steps a sweep takes.
    #[arg(long, value_name = "N", default_value_t = 30)]
    pub max_steps: u32,

    /// How long each target is driven (each sweep step, too).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,

    /// Stop after this many requests per target (and after --duration, whichever comes first).
    #[arg(long, value_name = "N")]
    pub requests: Option<u64>,

    /// Load before measuring, per target, at the same rate (not reported).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,

    /// With two or three targets: drive each for this long in turn, so all see the same machine over the run.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub slice: Duration,

    /// Connections per target (the API server keeps up to 25 idle ones per webhook host).
    #[arg(long, short = 'c', value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub connections: u16,

    /// HTTP/2 instead of HTTP/1.1 (the API server uses HTTP/1.1).
    #[arg(long)]
    pub http2: bool,

    /// With --http2: concurrent streams per connection.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub streams: u16,

    /// What to send: `corpus` (every pod of --pods, round robin) or a size (2k, 6k, 8k, 60k, 1m: the real API
    /// server request grown to it, with a new pod name on every request unless --generate-name).
    #[arg(long, value_name = "SPEC", default_value = "corpus")]
    pub bodies: bodies::BodySpec,

    /// Which of the injector's webhooks to drive: mutate, or validate (each body's pod injected first, as the
    /// validating webhook receives it; with --start, our server at /validate; the floor answers the validating
    /// answer).
    #[arg(long, value_enum, default_value_t = bodies::Webhook::Mutate)]
    pub webhook: bodies::Webhook,

    /// With a size for --bodies: send the pod as a ReplicaSet creates it (`generateName`, no name yet, the same
    /// in every request), the usual case in a cluster, instead of a new pod name per request (pods created one by
    /// one; a template that reads the name renders its per-pod values every time, the built-in one reads it only
    /// for pods without an `app` label). `--bodies corpus` sends distinct pods, rendered anew.
    #[arg(long)]
    pub generate_name: bool,

    /// The directory of pods (JSON) for --bodies corpus [default: tests/corpus/pods of the repository].
    #[arg(long, value_name = "DIR")]
    pub pods: Option<PathBuf>,

    /// The corpus directory holding reviews/apiserver-1.20-pod-create.json, the base of generated bodies
    /// [default: tests/corpus of the repository].
    #[arg(long, value_name = "DIR")]
    pub corpus: Option<PathBuf>,

    /// CPUs for the servers the harness starts (a taskset list) [default: CPU 0 when there are two or more].
    #[arg(long, value_name = "LIST")]
    pub server_cpus: Option<String>,

    /// CPUs for the harness itself [default: the others].
    #[arg(long, value_name = "LIST")]
    pub client_cpus: Option<String>,

    /// Do not pin the servers or the harness to CPUs.
    #[arg(long, conflicts_with_all = ["server_cpus", "client_cpus"])]
    pub no_pin: bool,

    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Also write the results with a latency-by-percentile plot: an HTML page, or the plot alone if FILE ends
    /// in .svg.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

fn positive_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!("{s:?}: expected a positive number of requests per second")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.internal {
        Some(Internal::Injector { args }) => {
            sidecar_injector::cli::main(std::iter::once(OsString::from("sidecar-injector")).chain(args))
        }
        Some(Internal::Baseline(args)) => match baseline::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("baseline: {e}");
                ExitCode::from(1)
            }
        },
        Some(Internal::FloorServer(args)) => match stack_floor::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("stack floor: {e}");
                ExitCode::from(1)
            }
        },
        Some(Internal::PlotBench(args)) => benchplot::run(&args).map_or_else(|e| run::fail(&e), |()| ExitCode::SUCCESS),
        Some(Internal::Floor(args)) => floor::run(&args).map_or_else(|e| run::fail(&e), |()| ExitCode::SUCCESS),
        None => run::main(&cli.run),
    }
}
