//! The results: one object for `--json`, a table for people, and a latency-by-percentile plot (SVG, alone or in
//! an HTML page) for `--html`.

use std::fmt::Write as _;

use serde::Serialize;

use crate::plot::{Line, LogLog};
use crate::stats::Tally;

/// The results of one run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `open` (fixed rate), `closed` (as fast as answers come) or `sweep`.
    pub mode: &'static str,
    /// `http/1.1` or `h2`.
    pub protocol: &'static str,
    /// The open-loop rate asked for (the first step of a sweep).
    pub rate: Option<f64>,
    /// Connections per target.
    pub connections: usize,
    /// Concurrent requests per connection (HTTP/2 streams; 1 on HTTP/1.1).
    pub streams: usize,
    /// What was sent: `corpus` or a size.
    pub bodies: String,
    /// How many distinct bodies.
    pub body_count: usize,
    /// Their mean size.
    pub mean_body_bytes: usize,
    /// The first target's figures, at the top level.
    #[serde(flatten)]
    pub primary: TargetReport,
    /// The `--compare` target's figures.
    pub compare: Option<TargetReport>,
    /// compare ÷ first, per figure (a server CPU ratio of 8 means the compare target spends 8 times the CPU).
    pub ratios: Option<Ratios>,
    /// The stack floor's figures (`--start-floor`).
    pub floor: Option<TargetReport>,
    /// The stack floor held busy per request as long as our engine computes (`--start --start-floor`, closed
    /// loop): it answers at our pace.
    pub paced_floor: Option<TargetReport>,
    /// Each target ÷ the stack floor, per figure.
    pub over_floor: Option<OverFloor>,
    /// The injector's server CPU per request taken apart (`--start` with `--start-floor`).
    pub accounting: Option<Accounting>,
}

/// Where the injector's server CPU per request goes, µs: the stack floor (hyper + rustls carrying the same
/// requests and answers), the engine in process on the same bodies, and the remainder, the server's own.
#[derive(Debug, Serialize)]
pub struct Accounting {
    /// The injector's server CPU per request.
    pub ours_us: f64,
    /// The stack floor's.
    pub floor_us: f64,
    /// The engine's, in process ([`crate::engine_cost`]).
    pub engine_us: f64,
    /// One review's wall-clock time in process, median, µs.
    pub engine_p50_us: f64,
    /// Its 99th percentile.
    pub engine_p99_us: f64,
    /// ours − floor − engine.
    pub remainder_us: f64,
    /// The target for the remainder (issue 40): 2 µs + 3% of the engine.
    pub remainder_target_us: f64,
    /// In a closed loop: the stack's CPU per request at our pace, the floor held busy as long as the engine
    /// computes (its CPU per request less that time). A server answering more slowly leaves its client idle
    /// between answers, and waking an idle client is paid inside the server's send (docs/performance.md).
    pub stack_at_our_pace_us: Option<f64>,
    /// ours − the stack at our pace − engine: the server's own overhead beside the same stack at the same pace.
    pub remainder_at_our_pace_us: Option<f64>,
}

impl Accounting {
    /// The accounting of `ours` and `floor` (server CPU per request) with the engine's cost in process, and
    /// `paced`, the CPU per request of the floor held busy per request for the engine's CPU time.
    pub fn of(ours: f64, floor: f64, engine: crate::engine_cost::EngineCost, paced: Option<f64>) -> Accounting {
        let stack_at_our_pace = paced.map(|cpu| cpu - engine.cpu_us);
        Accounting {
            ours_us: ours,
            floor_us: floor,
            engine_us: engine.cpu_us,
            engine_p50_us: engine.p50_us,
            engine_p99_us: engine.p99_us,
            remainder_us: ours - floor - engine.cpu_us,
            remainder_target_us: 2.0 + 0.03 * engine.cpu_us,
            stack_at_our_pace_us: stack_at_our_pace,
            remainder_at_our_pace_us: stack_at_our_pace.map(|stack| ours - stack - engine.cpu_us),
        }
    }
}

/// Each target ÷ the stack floor: a server CPU ratio of 3 means the target spends 3 times what hyper + rustls
/// alone spend to carry the same requests and answers.
#[derive(Debug, Serialize)]
pub struct OverFloor {
    /// The first target ÷ the floor (A/F).
    pub first: Ratios,
    /// The compare target ÷ the floor (B/F).
    pub compare: Option<Ratios>,
}

/// The figures of one target.
#[derive(Debug, Serialize)]
pub struct TargetReport {
    /// `sidecar-injector`, `baseline`, `stack-floor`, or the URL.
    pub target: String,
    /// The URL driven.
    pub url: String,
    /// Requests sent in the measured phases.
    pub requests: u64,
    /// Of which answered correctly.
    pub ok: u64,
    /// Of which with a patch.
    pub patched: u64,
    /// Correct answers per second of measured time.
    pub rps: f64,
    /// Latency percentiles of correct answers, µs (open loop: from the time each request was due).
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// The slowest answer.
    pub max_us: u64,
    /// Mean latency.
    pub mean_us: f64,
    /// The mean size of a correct answer's body, bytes (the stack floor's equals the injector's).
    pub mean_answer_bytes: f64,
    /// Open loop: how late the harness's pacer issued requests after their due time, p99.9 and max, µs. The
    /// machine's scheduling noise, not the server's: every latency above carries it too.
    pub send_late_p999_us: Option<u64>,
    /// The latest send.
    pub send_late_max_us: Option<u64>,
    /// Wrong answers plus transport errors.
    pub errors: u64,
    /// Answers that were wrong.
    pub wrong_answers: u64,
    /// Requests without an answer.
    pub transport_errors: u64,
    /// Server CPU time (user + system) per answered request, µs: `--start`, `--server-pid`.
    pub server_cpu_us_per_req: Option<f64>,
    /// The server's resident memory before the load, MiB.
    pub server_rss_idle_mib: Option<f64>,
    /// Its peak resident memory at the end, MiB.
    pub server_rss_peak_mib: Option<f64>,
    /// A sweep's steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<Vec<SweepStep>>,
    /// The highest rate of a sweep that met the bounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sustainable_rate: Option<f64>,
    /// The first few distinct errors.
    pub error_examples: Vec<String>,
    /// The latency distribution, for the plot: (percentile, µs).
    #[serde(skip)]
    pub distribution: Vec<(f64, u64)>,
}

/// One step of a sweep.
#[derive(Debug, Clone, Serialize)]
pub struct SweepStep {
    /// Rate asked for.
    pub rate: f64,
    /// Rate answered.
    pub rps: f64,
    /// 99th percentile latency, µs.
    pub p99_us: u64,
    /// Errors in the step.
    pub errors: u64,
    /// Server CPU per request in the step, µs.
    pub server_cpu_us_per_req: Option<f64>,
    /// Whether the step met the bounds.
    pub sustained: bool,
}

/// One target's figures ÷ another's: compare ÷ first (`ratios`, B/A), or a target ÷ the floor (`over_floor`).
#[derive(Debug, Serialize)]
pub struct Ratios {
    /// Server CPU per request.
    pub server_cpu_us_per_req: Option<f64>,
    /// Throughput (below 1: the dividend answered fewer requests per second).
    pub rps: f64,
    /// Median latency.
    pub p50_us: f64,
    /// p99 latency.
    pub p99_us: f64,
    /// p99.9 latency.
    pub p999_us: f64,
    /// Highest sustainable rate of a sweep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sustainable_rate: Option<f64>,
}

/// What the server probe measured for a target.
#[derive(Debug, Clone, Copy)]
pub struct ServerFigures {
    /// CPU per answered request, µs.
    pub cpu_us_per_req: Option<f64>,
    /// Resident memory before the load and at its peak, bytes.
    pub rss: Option<(u64, u64)>,
}

const MIB: f64 = 1024.0 * 1024.0;

impl TargetReport {
    /// The report of `tally`.
    pub fn new(target: &str, url: &str, tally: &Tally, server: ServerFigures) -> TargetReport {
        let paced = !tally.send_lateness.is_empty();
        let distribution = tally
            .latency
            .iter_quantiles(2)
            .map(|v| (v.quantile_iterated_to() * 100.0, v.value_iterated_to()))
            .collect();
        TargetReport {
            target: target.to_owned(),
            url: url.to_owned(),
            requests: tally.requests(),
            ok: tally.ok,
            patched: tally.patched,
            rps: tally.rps(),
            p50_us: tally.quantile_us(0.5),
            p90_us: tally.quantile_us(0.9),
            p99_us: tally.quantile_us(0.99),
            p999_us: tally.quantile_us(0.999),
            max_us: tally.latency.max(),
            mean_us: tally.latency.mean(),
            mean_answer_bytes: tally.mean_answer_bytes(),
            send_late_p999_us: paced.then(|| tally.send_lateness_us(0.999)),
            send_late_max_us: paced.then(|| tally.send_lateness.max()),
            errors: tally.errors(),
            wrong_answers: tally.wrong,
            transport_errors: tally.transport,
            server_cpu_us_per_req: server.cpu_us_per_req,
            server_rss_idle_mib: server.rss.map(|(idle, _)| idle as f64 / MIB),
            server_rss_peak_mib: server.rss.map(|(_, peak)| peak as f64 / MIB),
            sweep: None,
            max_sustainable_rate: None,
            error_examples: tally.examples.clone(),
            distribution,
        }
    }
}

impl Ratios {
    /// `compare` ÷ `first`, figure by figure.
    pub fn of(first: &TargetReport, compare: &TargetReport) -> Ratios {
        let ratio = |a: f64, b: f64| if a > 0.0 { b / a } else { f64::NAN };
        Ratios {
            server_cpu_us_per_req: first
                .server_cpu_us_per_req
                .zip(compare.server_cpu_us_per_req)
                .map(|(a, b)| ratio(a, b)),
            rps: ratio(first.rps, compare.rps),
            p50_us: ratio(first.p50_us as f64, compare.p50_us as f64),
            p99_us: ratio(first.p99_us as f64, compare.p99_us as f64),
            p999_us: ratio(first.p999_us as f64, compare.p999_us as f64),
            max_sustainable_rate: first
                .max_sustainable_rate
                .zip(compare.max_sustainable_rate)
                .map(|(a, b)| ratio(a, b)),
        }
    }
}

impl Report {
    /// The targets: first, compare, floor, the floor at our pace.
    pub fn targets(&self) -> impl Iterator<Item = &TargetReport> {
        std::iter::once(&self.primary)
            .chain(self.compare.as_ref())
            .chain(self.floor.as_ref())
            .chain(self.paced_floor.as_ref())
    }

    /// Errors over all targets.
    pub fn errors(&self) -> u64 {
        self.targets().map(|t| t.errors).sum()
    }

    /// The table for people: a column per target, then the ratios (B/A, and with the floor A/F and B/F).
    pub fn table(&self) -> String {
        let targets: Vec<&TargetReport> = self.targets().collect();
        let over = self.over_floor.as_ref();
        let columns: Vec<(&str, &Ratios)> = [
            ("B/A", self.ratios.as_ref()),
            ("A/F", over.map(|o| &o.first)),
            ("B/F", over.and_then(|o| o.compare.as_ref())),
        ]
        .into_iter()
        .filter_map(|(name, ratios)| ratios.map(|r| (name, r)))
        .collect();
        let mut rows: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
        let mut row = |name: &str, cells: Vec<String>, pick: Option<fn(&Ratios) -> Option<f64>>| {
            let ratios = columns
                .iter()
                .map(|(_, r)| {
                    pick.and_then(|pick| pick(r))
                        .filter(|r| r.is_finite())
                        .map_or_else(String::new, |r| format!("{r:.2}x"))
                })
                .collect();
            rows.push((name.to_owned(), cells, ratios));
        };
        let each = |f: &dyn Fn(&TargetReport) -> String| targets.iter().map(|t| f(t)).collect::<Vec<_>>();
        let us = |v: u64| format!("{v} µs");
        row("requests", each(&|t| t.requests.to_string()), None);
        row("patched", each(&|t| t.patched.to_string()), None);
        row("throughput", each(&|t| format!("{:.0} req/s", t.rps)), Some(|r| Some(r.rps)));
        row("p50", each(&|t| us(t.p50_us)), Some(|r| Some(r.p50_us)));
        row("p90", each(&|t| us(t.p90_us)), None);
        row("p99", each(&|t| us(t.p99_us)), Some(|r| Some(r.p99_us)));
        row("p99.9", each(&|t| us(t.p999_us)), Some(|r| Some(r.p999_us)));
        row("max", each(&|t| us(t.max_us)), None);
        if targets.iter().any(|t| t.send_late_max_us.is_some()) {
            row(
                "send lateness p99.9 / max",
                each(&|t| match (t.send_late_p999_us, t.send_late_max_us) {
                    (Some(p999), Some(max)) => format!("{p999} / {max} µs"),
                    _ => "-".into(),
                }),
                None,
            );
        }
        row(
            "errors",
            each(&|t| format!("{} ({} wrong, {} transport)", t.errors, t.wrong_answers, t.transport_errors)),
            None,
        );
        row("answer size (mean)", each(&|t| format!("{:.0} bytes", t.mean_answer_bytes)), None);
        row(
            "server CPU / request",
            each(&|t| t.server_cpu_us_per_req.map_or_else(|| "-".into(), |v| format!("{v:.1} µs"))),
            Some(|r| r.server_cpu_us_per_req),
        );
        row(
            "server RSS idle / peak",
            each(&|t| match (t.server_rss_idle_mib, t.server_rss_peak_mib) {
                (Some(idle), Some(peak)) => format!("{idle:.1} / {peak:.1} MiB"),
                _ => "-".into(),
            }),
            None,
        );
        if targets.iter().any(|t| t.max_sustainable_rate.is_some()) {
            row(
                "max sustainable rate",
                each(&|t| t.max_sustainable_rate.map_or_else(|| "none".into(), |r| format!("{r:.0} req/s"))),
                Some(|r| r.max_sustainable_rate),
            );
        }

        let mut out = String::new();
        let rate = self.rate.map_or_else(|| "closed loop".to_owned(), |r| format!("{} at {r:.0} req/s", self.mode));
        let _ = writeln!(
            out,
            "{rate}, {} x {} over {}, {} bodies ({}, mean {} bytes)",
            self.connections, self.streams, self.protocol, self.body_count, self.bodies, self.mean_body_bytes
        );
        let header: Vec<String> = targets.iter().map(|t| t.target.clone()).collect();
        let widths: Vec<usize> = (0..targets.len())
            .map(|i| rows.iter().map(|r| r.1[i].chars().count()).chain([header[i].chars().count()]).max().unwrap_or(0))
            .collect();
        let _ = write!(out, "{:24}", "");
        for (h, w) in header.iter().zip(&widths) {
            let _ = write!(out, "  {h:>w$}");
        }
        for (name, _) in &columns {
            let _ = write!(out, "  {name:>8}");
        }
        out.push('\n');
        for (name, cells, ratios) in &rows {
            let _ = write!(out, "{name:24}");
            for (c, w) in cells.iter().zip(&widths) {
                let _ = write!(out, "  {c:>w$}");
            }
            for r in ratios {
                let _ = write!(out, "  {r:>8}");
            }
            out.push('\n');
        }
        if let Some(floor) = &self.floor {
            // Two letters per ratio column need a key once the floor's columns are there.
            let b = self.compare.as_ref().map_or("", |t| t.target.as_str());
            let (a, f) = (self.primary.target.as_str(), floor.target.as_str());
            let key: Vec<String> = columns
                .iter()
                .map(|(column, _)| match *column {
                    "B/A" => format!("B/A = {b} ÷ {a}"),
                    "A/F" => format!("A/F = {a} ÷ {f}"),
                    _ => format!("B/F = {b} ÷ {f}"),
                })
                .collect();
            let _ = writeln!(out, "ratios: {}", key.join(", "));
        }
        if let Some(a) = &self.accounting {
            let _ = writeln!(
                out,
                "server CPU per request, {}: {:.1} µs = stack floor {:.1} + engine in process {:.1} + remainder {:.1} \
                 (target <= {:.1}); one review in process: p50 {:.1} µs, p99 {:.1} µs",
                self.primary.target,
                a.ours_us,
                a.floor_us,
                a.engine_us,
                a.remainder_us,
                a.remainder_target_us,
                a.engine_p50_us,
                a.engine_p99_us
            );
            if let (Some(stack), Some(remainder)) = (a.stack_at_our_pace_us, a.remainder_at_our_pace_us) {
                let _ = writeln!(
                    out,
                    "at our pace (the floor held busy {:.1} µs per request): {:.1} µs = stack at our pace {stack:.1} \
                     + engine in process {:.1} + remainder {remainder:.1}",
                    a.engine_us, a.ours_us, a.engine_us
                );
            }
        }
        for t in &targets {
            if let Some(steps) = &t.sweep {
                let _ = writeln!(out, "\nsweep, {}:", t.target);
                for s in steps {
                    let cpu = s.server_cpu_us_per_req.map_or_else(String::new, |c| format!(", server {c:.1} µs/req"));
                    let verdict = if s.sustained { "ok" } else { "over the bound" };
                    let _ = writeln!(
                        out,
                        "  {:>8.0} req/s asked, {:>8.0} answered, p99 {:>7} µs, {} errors{cpu}: {verdict}",
                        s.rate, s.rps, s.p99_us, s.errors
                    );
                }
            }
            for e in &t.error_examples {
                let _ = writeln!(out, "{}: {e}", t.target);
            }
        }
        out
    }

    /// The latency-by-percentile plot, SVG.
    pub fn svg(&self) -> Result<String, String> {
        let max = self.targets().map(|t| t.max_us).max().unwrap_or(1).max(10) as f64;
        let min = self.targets().filter_map(|t| t.distribution.first().map(|d| d.1)).min().unwrap_or(1).max(1) as f64;
        let caption = match self.rate {
            Some(rate) => format!("Latency by percentile, {rate:.0} req/s, {}", self.protocol),
            None => format!("Latency by percentile, closed loop, {}", self.protocol),
        };
        // x is 1 / (1 - percentile): 10 is p90, 100 p99, 1000 p99.9, so the tail gets the room it needs.
        let lines: Vec<Line> = self
            .targets()
            .map(|t| Line {
                label: format!("{} (p99 {} µs)", t.target, t.p99_us),
                points: t
                    .distribution
                    .iter()
                    .filter(|(p, _)| *p < 99.999)
                    .map(|(p, v)| (100.0 / (100.0 - p), (*v).max(1) as f64))
                    .collect(),
            })
            .collect();
        LogLog {
            caption: &caption,
            x: 1.0..100_000.0,
            y: min * 0.8..max * 1.25,
            x_desc: "percentile",
            y_desc: "latency (µs)",
            x_label: &|x| format!("{}%", 100.0 - 100.0 / x),
            dots: false,
        }
        .svg(&lines)
    }

    /// An HTML page: the table, the plot and the command that produced them.
    pub fn html(&self, command: &str) -> Result<String, String> {
        let escape = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        Ok(format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>sidecar-injector load test</title></head>\n\
             <body style=\"font-family: sans-serif\">\n<h1>Load test</h1>\n<pre>$ {}</pre>\n<pre>{}</pre>\n{}\n</body></html>\n",
            escape(command),
            escape(&self.table()),
            self.svg()?
        ))
    }
}
