//! One run: pin the CPUs, start the servers asked for, open the connections, warm up, then drive the targets
//! (one phase, slices in turn, or a sweep), read the servers' CPU time around every measured phase, report.
//! The targets are ours (`--url`, `--start`), the compare target (`--compare`, `--start-baseline`) and the stack
//! floor (`--start-floor`), each driven with the same bodies.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::RunArgs;
use crate::bodies::{self, human_bytes};
use crate::check::FixedAnswers;
use crate::client::{self, Target};
use crate::cpu;
use crate::drive::{Phase, Pool, Shared};
use crate::report::{Accounting, OverFloor, Ratios, Report, ServerFigures, SweepStep, TargetReport};
use crate::server::{Kind, Launched, Probe};
use crate::stats::Tally;

/// Runs the load test of `args`; prints the report; exit code 1 on any error.
pub fn main(args: &RunArgs) -> ExitCode {
    let (server_cpus, client_cpus) = match pinning(args) {
        Ok(pinning) => pinning,
        Err(e) => return fail(&e),
    };
    let workers =
        client_cpus.as_ref().map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), |c| c.len());
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let report = match runtime.block_on(run(args, server_cpus.as_deref())) {
        Ok(report) => report,
        Err(e) => return fail(&e),
    };
    if args.json {
        // A Report is numbers and strings only.
        println!("{}", serde_json::to_string_pretty(&report).unwrap());
    } else {
        print!("{}", report.table());
    }
    if let Some(path) = &args.html {
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let page = if path.extension().is_some_and(|e| e == "svg") { report.svg() } else { report.html(&command) };
        match page.and_then(|page| std::fs::write(path, page).map_err(|e| e.to_string())) {
            Ok(()) => eprintln!("loadtest: wrote {}", path.display()),
            Err(e) => return fail(&format!("{}: {e}", path.display())),
        }
    }
    match report.errors() {
        0 => ExitCode::SUCCESS,
        n => fail(&format!("{n} requests failed (wrong answers or transport errors); see above")),
    }
}

/// Exit code 1, with the reason on stderr.
pub fn fail(message: &str) -> ExitCode {
    eprintln!("loadtest: {message}");
    ExitCode::from(1)
}

/// Where the servers and the harness run: `--server-cpus`/`--client-cpus`, or, when the harness starts a server
/// on a machine with two or more CPUs, the server on the first and the harness on the rest, so that neither
/// steals the other's CPU. Pins the harness itself; returns the servers' list for `taskset`.
fn pinning(args: &RunArgs) -> Result<(Option<String>, Option<Vec<usize>>), String> {
    let starts = args.start || args.start_baseline || args.start_floor;
    if args.no_pin || (!starts && args.client_cpus.is_none()) {
        return Ok((None, None));
    }
    let allowed = cpu::allowed_cpus()?;
    let (server, client) = match (&args.server_cpus, &args.client_cpus) {
        (None, None) if allowed.len() < 2 => return Ok((None, None)),
        (None, None) => (Some(allowed[0].to_string()), allowed[1..].to_vec()),
        (server, Some(client)) => (server.clone(), cpu::cpu_list(client)?),
        (Some(server), None) => {
            let taken = cpu::cpu_list(server)?;
            (Some(server.clone()), allowed.iter().copied().filter(|c| !taken.contains(c)).collect())
        }
    };
    if client.is_empty() {
        return Err("no CPU is left for the harness; give --client-cpus".into());
    }
    // Pinning the main thread before the runtime starts pins every thread the harness creates.
    cpu::pin_to(&client)?;
    Ok((server, Some(client)))
}

/// Which target a target is, in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// `--url` or `--start` (A).
    First,
    /// `--compare` or `--start-baseline` (B).
    Compare,
    /// `--start-floor` (F).
    Floor,
    /// With `--start --start-floor`, closed loop: the floor held busy per request for as long as our engine
    /// computes, so that it answers at our pace (P).
    PacedFloor,
}

/// One target as driven: its connections, the probe of its server, and what it measured.
struct Driven {
    role: Role,
    pool: Pool,
    probe: Option<Probe>,
    rss_idle: Option<u64>,
    tally: Tally,
    cpu: Duration,
    answered: u64,
    sweep: Vec<SweepStep>,
    /// A sweep's highest sustained step: its rate, what it measured, and the server's CPU per request in it.
    best: Option<(f64, Tally, Option<f64>)>,
    finished: bool,
}

impl Driven {
    /// Runs one measured phase, with the server's CPU time read around it.
    async fn measure(&mut self, shared: &Arc<Shared>, phase: Phase, progress: &ProgressBar) -> (Tally, Option<f64>) {
        progress.set_prefix(format!("{} {}", self.pool.target().label, phase_label(&phase)));
        let before = self.probe.as_ref().and_then(|p| p.cpu_time().ok());
        let tally = self.pool.run(shared, phase).await;
        let after = self.probe.as_ref().and_then(|p| p.cpu_time().ok());
        let answered = tally.ok + tally.wrong;
        let cpu = before.zip(after).map(|(b, a)| a.saturating_sub(b));
        if let Some(cpu) = cpu {
            self.cpu += cpu;
            self.answered += answered;
        }
        let per_request = cpu.filter(|_| answered > 0).map(|c| c.as_secs_f64() * 1e6 / answered as f64);
        (tally, per_request)
    }

    /// The report: of every measured phase, or for a sweep that held at some rate, of its highest such step
    /// with the errors of the whole sweep (a sustained step has none of its own).
    fn report(&self) -> TargetReport {
        let target = self.pool.target();
        // `answered` only grows when the probe read the CPU time around a phase.
        let cpu_us_per_req = (self.answered > 0).then(|| self.cpu.as_secs_f64() * 1e6 / self.answered as f64);
        let peak = self.probe.as_ref().and_then(|p| p.memory().ok()).map(|(_, peak)| peak);
        let server = ServerFigures { cpu_us_per_req, rss: self.rss_idle.zip(peak) };
        let mut report = match &self.best {
            Some((rate, step, cpu)) => {
                let mut figures = step.clone();
                figures.merge_errors(&self.tally);
                let server = ServerFigures { cpu_us_per_req: *cpu, ..server };
                let mut report = TargetReport::new(&target.label, &target.url, &figures, server);
                report.max_sustainable_rate = Some(*rate);
                report
            }
            None => TargetReport::new(&target.label, &target.url, &self.tally, server),
        };
        if !self.sweep.is_empty() {
            report.sweep = Some(self.sweep.clone());
        }
        report
    }
}

fn phase_label(phase: &Phase) -> String {
    phase.rate.map_or_else(|| "closed loop".to_owned(), |r| format!("{r:.0} req/s"))
}

/// A target before it is driven.
struct Spec {
    role: Role,
    label: String,
    url: String,
    ca_pem: Vec<u8>,
    ca_name: String,
    pid: Option<u32>,
    /// The stack floor's answers.
    fixed: Option<Arc<FixedAnswers>>,
}

/// How long the engine runs in process for the accounting ([`crate::engine_cost`]).
const ENGINE_COST_DURATION: Duration = Duration::from_secs(2);

async fn run(args: &RunArgs, server_cpus: Option<&str>) -> Result<Report, String> {
    let corpus = args.corpus.clone().unwrap_or_else(bodies::default_corpus);
    let pods = args.pods.clone().unwrap_or_else(|| corpus.join("pods"));
    if args.generate_name && !matches!(args.bodies, bodies::BodySpec::Size(_)) {
        return Err("--generate-name names generated pods (--bodies 6k, ...); corpus and pathological pods keep \
                    their own"
            .into());
    }
    let naming = if args.generate_name { bodies::Naming::Controller } else { bodies::Naming::Unique };
    let (bodies, skipped) = bodies::load(&args.bodies, naming, &pods, &corpus).map_err(|e| e.to_string())?;
    let bodies = match args.webhook {
        bodies::Webhook::Mutate => bodies,
        bodies::Webhook::Validate => {
            let engine = crate::stack_floor::answering_engine()?;
            bodies.iter().map(|body| body.injected(&engine)).collect::<Result<Vec<_>, _>>()?
        }
    };
    for pod in &skipped {
        eprintln!("loadtest: left out {pod}");
    }
    let body_count = bodies.len();
    let mean_body_bytes = bodies.iter().map(|b| b.len()).sum::<usize>() / body_count;
    // The floor's answers are the injector's to these bodies, computed and checked before anything starts.
    let fixed = match args.start_floor {
        true => Some(Arc::new(crate::stack_floor::fixed_answers(&bodies, args.webhook)?)),
        false => None,
    };
    let shared = Arc::new(Shared::new(bodies));
    // Our server's CPU per request is taken apart when the run has both it and the floor: the engine run in
    // process on the same bodies, on the servers' CPUs, before anything is driven; in a closed loop, also the
    // floor held busy that long per request, which answers at our pace.
    let accounts = args.start && fixed.is_some();
    let engine = match accounts {
        true => {
            let cpus = server_cpus.map(cpu::cpu_list).transpose()?;
            Some(crate::engine_cost::per_review(&shared.bodies, ENGINE_COST_DURATION, cpus, args.webhook)?)
        }
        false => None,
    };
    let paced_busy = engine.filter(|_| args.rate.is_none() && !args.sweep).map(|e| e.cpu_us);

    let injector = match args.start {
        true => {
            let kind = Kind::Injector { binary: args.server_bin.as_deref(), extra: &args.server_arg };
            Some(Launched::start(kind, server_cpus).await.map_err(|e| e.to_string())?)
        }
        false => None,
    };
    let baseline = match args.start_baseline {
        true => Some(Launched::start(Kind::Baseline, server_cpus).await.map_err(|e| e.to_string())?),
        false => None,
    };
    let floor = match &fixed {
        Some(fixed) => {
            let kind = Kind::Floor { answers: fixed.answers(), extra: &args.floor_arg };
            Some(Launched::start(kind, server_cpus).await.map_err(|e| e.to_string())?)
        }
        None => None,
    };
    let paced_floor = match (&fixed, paced_busy) {
        (Some(fixed), Some(busy_us)) => {
            let mut extra = args.floor_arg.clone();
            extra.push(format!("--busy-ns={}", (busy_us * 1e3).round() as u64));
            let kind = Kind::Floor { answers: fixed.answers(), extra: &extra };
            Some(Launched::start(kind, server_cpus).await.map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    let file_ca = match &args.ca {
        Some(path) => {
            Some((std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?, path.display().to_string()))
        }
        None => None,
    };
    let external = |role: Role, label: &str, url: &String, pid: Option<u32>| -> Result<Spec, String> {
        let (ca_pem, ca_name) = file_ca.clone().ok_or_else(|| {
            format!("{url}: give --ca FILE, the CA certificate that signed this webhook's certificate")
        })?;
        Ok(Spec { role, label: label.to_owned(), url: url.clone(), ca_pem, ca_name, pid, fixed: None })
    };
    let launched = |role: Role, label: &str, l: &Launched| Spec {
        role,
        label: label.to_owned(),
        url: l.url.clone(),
        ca_pem: l.ca_pem.clone(),
        ca_name: "<generated CA>".to_owned(),
        pid: Some(l.pid()),
        fixed: None,
    };
    let mut specs = vec![match (&injector, &args.url) {
        (Some(l), _) => Spec { url: args.webhook.url(&l.url), ..launched(Role::First, "sidecar-injector", l) },
        (None, Some(url)) => external(Role::First, "target", url, args.server_pid)?,
        // clap requires --url unless --start.
        (None, None) => return Err("give --url URL or --start".into()),
    }];
    match (&baseline, &args.compare) {
        (Some(l), _) => specs.push(launched(Role::Compare, "baseline", l)),
        (None, Some(url)) => specs.push(external(Role::Compare, "compare", url, args.compare_pid)?),
        (None, None) => {}
    }
    if let Some(l) = &floor {
        specs.push(Spec { fixed: fixed.clone(), ..launched(Role::Floor, "stack-floor", l) });
    }
    if let Some(l) = &paced_floor {
        specs.push(Spec { fixed: fixed.clone(), ..launched(Role::PacedFloor, "floor-at-our-pace", l) });
    }

    let streams = if args.http2 { usize::from(args.streams) } else { 1 };
    let mut driven = Vec::new();
    for spec in specs {
        let tls = client::tls_config(&spec.ca_pem, Path::new(&spec.ca_name), args.http2).map_err(|e| e.to_string())?;
        let mut target = Target::new(&spec.label, &spec.url, tls, args.http2).await.map_err(|e| e.to_string())?;
        if let Some(fixed) = spec.fixed {
            target = target.with_fixed_answers(fixed);
        }
        let pool = Pool::connect(target, usize::from(args.connections), streams, body_count)
            .await
            .map_err(|e| format!("{}: {e}", spec.url))?;
        let probe = spec.pid.map(Probe::new).transpose()?;
        let rss_idle = probe.as_ref().and_then(|p| p.memory().ok()).map(|(rss, _)| rss);
        driven.push(Driven {
            role: spec.role,
            pool,
            probe,
            rss_idle,
            tally: Tally::default(),
            cpu: Duration::ZERO,
            answered: 0,
            sweep: Vec::new(),
            best: None,
            finished: false,
        });
    }

    let progress = progress_line(&shared);
    if !args.warmup.is_zero() {
        for d in &mut driven {
            progress.set_prefix(format!("{} warm-up", d.pool.target().label));
            let warmup =
                d.pool.run(&shared, Phase { rate: args.rate, duration: Some(args.warmup), requests: None }).await;
            d.tally.merge_errors(&warmup);
        }
    }
    if args.sweep {
        sweep(args, &shared, &mut driven, &progress).await;
    } else {
        alternate(args, &shared, &mut driven, &progress).await;
    }
    progress.finish_and_clear();

    let report_of = |role: Role| driven.iter().find(|d| d.role == role).map(Driven::report);
    // The first target is always there: clap requires --url or --start.
    let primary = report_of(Role::First).ok_or("no first target")?;
    let (compare, floor, paced_floor) = (report_of(Role::Compare), report_of(Role::Floor), report_of(Role::PacedFloor));
    let ratios = compare.as_ref().map(|c| Ratios::of(&primary, c));
    let over_floor = floor
        .as_ref()
        .map(|f| OverFloor { first: Ratios::of(f, &primary), compare: compare.as_ref().map(|c| Ratios::of(f, c)) });
    let accounting = match (engine, primary.server_cpu_us_per_req, floor.as_ref().and_then(|f| f.server_cpu_us_per_req))
    {
        (Some(engine), Some(ours), Some(floor_us)) => {
            let paced = paced_floor.as_ref().and_then(|p| p.server_cpu_us_per_req);
            Some(Accounting::of(ours, floor_us, engine, paced))
        }
        _ => None,
    };
    Ok(Report {
        mode: if args.sweep {
            "sweep"
        } else if args.rate.is_some() {
            "open"
        } else {
            "closed"
        },
        protocol: if args.http2 { "h2" } else { "http/1.1" },
        rate: args.rate,
        connections: usize::from(args.connections),
        streams,
        bodies: match &args.bodies {
            bodies::BodySpec::Corpus => format!("corpus {}", pods.display()),
            bodies::BodySpec::Size(n) if args.generate_name => {
                format!("generated ~{}, one ReplicaSet's pods", human_bytes(*n))
            }
            bodies::BodySpec::Size(n) => format!("generated ~{}, a new pod name per request", human_bytes(*n)),
            bodies::BodySpec::Pathological(name) => format!("pathological {name}, a new pod name per request"),
        },
        body_count,
        mean_body_bytes,
        primary,
        compare,
        ratios,
        floor,
        paced_floor,
        over_floor,
        accounting,
    })
}

/// Drives every target for --duration (or --requests), in turns of --slice when there are two or more.
async fn alternate(args: &RunArgs, shared: &Arc<Shared>, driven: &mut [Driven], progress: &ProgressBar) {
    let slice = if driven.len() > 1 { args.slice.max(Duration::from_millis(100)) } else { args.duration };
    let mut left: Vec<(Duration, Option<u64>)> = driven.iter().map(|_| (args.duration, args.requests)).collect();
    while left.iter().any(|(time, requests)| !time.is_zero() && requests != &Some(0)) {
        for (d, (time, requests)) in driven.iter_mut().zip(left.iter_mut()) {
            if time.is_zero() || requests == &Some(0) {
                continue;
            }
            let phase = Phase { rate: args.rate, duration: Some(slice.min(*time)), requests: *requests };
            let (tally, _) = d.measure(shared, phase, progress).await;
            *time = time.saturating_sub(tally.elapsed.max(slice.min(*time)));
            *requests = requests.map(|r| r.saturating_sub(tally.requests()));
            d.tally.merge(&tally);
        }
    }
}

/// Steps the rate up until a target's p99 exceeds --max-p99, a request fails, or it answers less than 95% of
/// the rate; each target stops at its own limit.
async fn sweep(args: &RunArgs, shared: &Arc<Shared>, driven: &mut [Driven], progress: &ProgressBar) {
    // clap requires --rate with --sweep.
    let start = args.rate.unwrap_or(1000.0);
    let step = args.sweep_step.unwrap_or(start);
    let bound = args.max_p99.as_micros() as u64;
    for i in 0..args.max_steps {
        let rate = start + step * f64::from(i);
        for d in driven.iter_mut().filter(|d| !d.finished) {
            let phase = Phase { rate: Some(rate), duration: Some(args.duration), requests: args.requests };
            let (tally, cpu) = d.measure(shared, phase, progress).await;
            let sustained = tally.errors() == 0 && tally.quantile_us(0.99) <= bound && tally.rps() >= 0.95 * rate;
            d.sweep.push(SweepStep {
                rate,
                rps: tally.rps(),
                p99_us: tally.quantile_us(0.99),
                errors: tally.errors(),
                server_cpu_us_per_req: cpu,
                sustained,
            });
            // Every step's errors count against the run. Latencies are reported at the best step, or, if the
            // first step already failed, from it (the only step in `tally` then).
            d.tally.merge(&tally);
            if sustained {
                d.best = Some((rate, tally, cpu));
            } else {
                d.finished = true;
            }
        }
        if driven.iter().all(|d| d.finished) {
            break;
        }
    }
}

/// The live line on stderr (hidden when stderr is not a terminal): answers, rate and errors, every 250 ms.
fn progress_line(shared: &Arc<Shared>) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    // A fixed, valid template.
    bar.set_style(ProgressStyle::with_template("{spinner} {elapsed:>4} {prefix}: {msg}").unwrap());
    let (line, shared) = (bar.clone(), shared.clone());
    tokio::spawn(async move {
        let mut last = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        while !line.is_finished() {
            tick.tick().await;
            let done = shared.done.load(Ordering::Relaxed);
            let errors = shared.errors.load(Ordering::Relaxed);
            line.set_message(format!("{done} answered, {} req/s, {errors} errors", (done - last) * 4));
            last = done;
            line.tick();
        }
    });
    bar
}
