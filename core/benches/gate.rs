//! The instruction-count gate (issue 54): the instructions one engine call executes, counted by valgrind's
//! callgrind, for fixed reviews, against a committed baseline (`core/benches/gate.baseline`). Wall-clock and CPU
//! time move 20-30% between runs on a shared VM; an instruction count is the same for the same binary and input
//! whatever else the machine does, so a growth of more than `MARGIN_PERCENT` in any case fails, and nothing else.
//!
//! ```text
//! cargo bench -p sidecar-injector-core --bench gate              # compare with the baseline; exit 1 on a regression
//! cargo bench -p sidecar-injector-core --bench gate -- --bless   # write the measured counts as the new baseline
//! cargo bench -p sidecar-injector-core --bench gate -- env-1500  # the cases whose names contain an argument
//! cargo bench -p sidecar-injector-core --bench gate -- --self-test  # shows a 5% slowdown of one case is caught
//! cargo bench -p sidecar-injector-core --bench gate -- --parse   # also counts a bare simd-json parse of each body
//! ```
//!
//! Each case runs in its own process under `valgrind --tool=callgrind`, counting nothing until `measured` is
//! entered: the process builds its engine and review, answers the review once to warm the thread's buffers and
//! caches (as a running server's are), then `measured` answers it again (after rewriting its `app` label, for a
//! case that is a new pod on every call). The counts are those of the bench profile (fat LTO, one codegen unit,
//! the shipped binary's code generation) with the shipped allocator. A change of compiler or of a dependency moves
//! them too: bless with the reason in the commit (docs/performance.md, "The gate").

#[path = "../../benches/support/reviews.rs"]
#[allow(dead_code)] // each user takes what it needs of the shared reviews
mod reviews;

use serde_json::{Value, json};
use sidecar_injector_core::offline::{inject_document, pod_create_review};
use sidecar_injector_core::{Call, Engine, Mode, Outcome, ReviewError, Settings, Stage, Tag, TemplateSet, Verdict};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

// The allocator the binary uses, so the counts are the server's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A case fails when it executes more than this much above its baseline. The counts repeat to within 0.1% (the
/// std hash maps' random seeds), so a 5% regression in one case cannot pass and noise cannot fail.
const MARGIN_PERCENT: f64 = 2.0;

/// The committed baseline: one line per case, `name instructions bytes`.
const BASELINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/gate.baseline");

/// The function callgrind counts (`--toggle-collect`): its own frame and everything it calls.
const MEASURED: &str = "*gate::measured*";

/// What a case answers: the engine, the review, and what must come of it.
struct Case {
    engine: Engine,
    /// The reviews one call answers, one after another (one, but for the corpus).
    bodies: Vec<Vec<u8>>,
    /// Where the 8 digits of the pod's `app` label are, for a case that is a new pod on every call.
    new_pod_at: Option<usize>,
    /// Validation (`/validate`) rather than injection.
    validate: bool,
    /// Injection as a server publishing Events answers it (`Engine::answer_call` with `Call::subject`).
    with_subject: bool,
    /// Through a revision tag's webhook (`Engine::answer_call`): the tag written into the stamp.
    tag: Option<Tag>,
    expect: fn(&Answer) -> bool,
}

type Answer = Result<Outcome, ReviewError>;

fn injected(answer: &Answer) -> bool {
    matches!(answer, Ok(Outcome { verdict: Verdict::Injected { .. }, .. }))
}

fn complete(answer: &Answer) -> bool {
    matches!(answer, Ok(Outcome { verdict: Verdict::Complete, .. }))
}

/// A review refused unread: the pod is beyond the API server's limits, which it would refuse after our answer.
fn beyond_api_limit(answer: &Answer) -> bool {
    matches!(answer, Err(ReviewError::BeyondApiLimit { .. }))
}

fn engine() -> Engine {
    let settings = Settings::default();
    Engine::new(TemplateSet::builtin(&settings).expect("the built-in template compiles"), &settings)
}

fn case(body: Vec<u8>, new_pod: bool) -> Case {
    let new_pod_at = new_pod.then(|| reviews::digits_of(&body, reviews::UNIQUE_APP));
    Case {
        engine: engine(),
        bodies: vec![body],
        new_pod_at,
        validate: false,
        with_subject: false,
        tag: None,
        expect: injected,
    }
}

fn injected_with_subject(answer: &Answer) -> bool {
    injected(answer) && matches!(answer, Ok(Outcome { subject: Some(_), .. }))
}

/// Every case by name, built only when run (the 1 MiB ones take a while under valgrind).
fn cases() -> Vec<(String, Box<dyn Fn() -> Case>)> {
    let mut cases: Vec<(String, Box<dyn Fn() -> Case>)> = Vec::new();
    for (label, size) in [("2KB", 2_000), ("8KB", 8_000), ("60KB", 60_000)] {
        // The same pod again, as a controller scaling up sends it (its leaves come from the render cache) ...
        cases.push((format!("review-{label}"), Box::new(move || case(reviews::review_of_size(size), false))));
        // ... and a new `app` label on every call, so the per-pod leaves are rendered.
        cases.push((format!("review-{label}-new-pod"), Box::new(move || case(reviews::review_of_size(size), true))));
    }
    // The same, as a server publishing Events answers it (`--events`): the outcome's subject copied out.
    cases.push((
        "review-8KB-new-pod-events".into(),
        Box::new(|| Case {
            with_subject: true,
            expect: injected_with_subject,
            ..case(reviews::review_of_size(8_000), true)
        }),
    ));
    // Through a revision tag: the stamp written with the tag (what it says is the suite's to judge, tests/suite/tags.rs).
    cases.push((
        "review-8KB-new-pod-tagged".into(),
        Box::new(|| Case { tag: Some(Tag::new("prod").expect("a tag")), ..case(reviews::review_of_size(8_000), true) }),
    ));
    cases.push((
        "review-2KB-override".into(),
        Box::new(|| {
            // An override is vetted against the API server's rules, a cost only such pods pay.
            let mut review: Value = serde_json::from_slice(&reviews::review_of_size(2_000)).unwrap();
            review["request"]["object"]["metadata"]["annotations"]["sidecar-injector.io/proxy-cpu"] = json!("100m");
            case(serde_json::to_vec(&review).unwrap(), false)
        }),
    ));
    cases.push(("validate-8KB-injected".into(), Box::new(validate_injected)));
    cases.push(("corpus".into(), Box::new(corpus)));
    for (name, _) in reviews::PATHOLOGICAL {
        let build = move || {
            let body = reviews::pathological_review(name).expect("a name of the table");
            let expect = if name == reviews::BEYOND_API_LIMITS { beyond_api_limit } else { injected };
            Case { expect, ..case(body, true) }
        };
        cases.push((format!("pathological-{name}"), Box::new(build)));
    }
    cases
}

/// `/validate` of the 8 KB pod as injected: the validating webhook's every call for an injected pod.
fn validate_injected() -> Case {
    let review: Value = serde_json::from_slice(&reviews::review_of_size(8_000)).unwrap();
    let engine = engine();
    let mut pod = review["request"]["object"].clone();
    inject_document(&engine, &mut pod, "default").expect("the 8 KB pod is injected");
    let body = serde_json::to_vec(&pod_create_review("gate", "default", pod)).unwrap();
    Case {
        engine,
        bodies: vec![body],
        new_pod_at: None,
        validate: true,
        with_subject: false,
        tag: None,
        expect: complete,
    }
}

/// Every pod of `tests/corpus/pods`, each in a review: one call that answers them all, one after another.
fn corpus() -> Case {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus/pods");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let mut bodies = Vec::new();
    for file in files.iter().filter(|f| f.extension().is_some_and(|e| e == "json")) {
        let pod: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        if pod["kind"] != "Pod" {
            continue;
        }
        let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default").to_owned();
        bodies.push(serde_json::to_vec(&pod_create_review("gate", &namespace, pod)).unwrap());
    }
    assert!(bodies.len() > 100, "the corpus has its pods: {}", bodies.len());
    // Injected, skipped or refused as each pod asks: the suite judges those answers, the gate their cost.
    Case {
        engine: engine(),
        bodies,
        new_pod_at: None,
        validate: false,
        with_subject: false,
        tag: None,
        expect: |answer| answer.is_ok(),
    }
}

/// The counted call. Its name is what `MEASURED` matches, and callgrind counts every call of it: only the call to
/// count goes through it (the warm-up calls [`answer_all`] itself; until 2026-11-29 it came through here too, and
/// every count was of two calls, the first a cold one). `pad` iterations of a loop are added to it by `--self-test`
/// only, to show that a slowdown trips the gate.
#[inline(never)]
fn measured(case: &Case, bodies: &mut [Vec<u8>], out: &mut Vec<u8>, pad: u64, parse_only: bool) -> Vec<Answer> {
    MEASURED_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut sum = 0u64;
    for i in 0..pad {
        sum = black_box(sum.wrapping_add(i));
    }
    answer_all(case, bodies, out, parse_only)
}

/// How many times the child entered [`measured`]: it says, and the parent refuses a count of any but one call.
static MEASURED_CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Answers each body of the case, one after another. With `parse_only`, each body is only parsed by simd-json into
/// a tape, in place in the thread's buffers as the engine parses it (`--parse`: what the parser alone costs on the
/// same bytes), and no answer is made.
fn answer_all(case: &Case, bodies: &mut [Vec<u8>], out: &mut Vec<u8>, parse_only: bool) -> Vec<Answer> {
    let mut answers = Vec::with_capacity(bodies.len());
    for body in bodies {
        if parse_only {
            out.clear();
            case.engine.review_until(body, out, Stage::Tape).expect("the case's body parses");
            continue;
        }
        out.clear();
        answers.push(match (case.validate, case.with_subject, &case.tag) {
            (true, _, _) => case.engine.validate(body, out),
            (false, false, None) => case.engine.review(body, out),
            (false, subject, tag) => {
                let call = Call { tag: tag.as_ref(), subject };
                case.engine.answer_call(body, out, Mode::Mutate, call)
            }
        });
    }
    answers
}

/// The child: builds the case, warms up, and runs `measured` once (under callgrind, the one counted call).
fn run_case(name: &str, pad: u64, parse_only: bool) -> ExitCode {
    let Some((_, build)) = cases().into_iter().find(|(n, _)| n == name) else {
        eprintln!("gate: no case named {name}");
        return ExitCode::from(2);
    };
    let case = build();
    let mut out = Vec::with_capacity(64 * 1024);
    let warm = |case: &Case, out: &mut Vec<u8>| {
        let mut bodies = as_received(&case.bodies);
        if let Some(at) = case.new_pod_at {
            bodies.iter_mut().for_each(|b| reviews::stamp(b, at, 1));
        }
        answer_all(case, &mut bodies, out, parse_only)
    };
    // The corpus is counted on its first pass (each pod new to the thread); the others warmed by one call.
    if name != "corpus" {
        for answer in warm(&case, &mut out) {
            assert!((case.expect)(&answer), "{name}: {answer:?}");
        }
    }
    let mut bodies = as_received(&case.bodies);
    if let Some(at) = case.new_pod_at {
        bodies.iter_mut().for_each(|b| reviews::stamp(b, at, 2));
    }
    let answers = black_box(measured(&case, &mut bodies, &mut out, pad, parse_only));
    for answer in &answers {
        assert!((case.expect)(answer), "{name}: {answer:?}");
    }
    println!("bytes {}", case.bodies.iter().map(Vec::len).sum::<usize>());
    println!("measured-calls {}", MEASURED_CALLS.load(std::sync::atomic::Ordering::Relaxed));
    ExitCode::SUCCESS
}

/// The bodies as the server receives them: each in a buffer with room for the parser's padding past it
/// (`PARSE_PADDING`), as the handler allocates it, so that the engine parses it where it is (a body without that
/// room is copied into a larger buffer first, a cost the server never pays).
fn as_received(bodies: &[Vec<u8>]) -> Vec<Vec<u8>> {
    bodies
        .iter()
        .map(|body| {
            let mut received = Vec::with_capacity(body.len() + sidecar_injector_core::PARSE_PADDING);
            received.extend_from_slice(body);
            received
        })
        .collect()
}

/// A case's count, and the bytes it answered.
struct Count {
    instructions: u64,
    bytes: u64,
}

/// Runs `name` in a child under callgrind (with `pad` added, see [`measured`]) and reads its count from
/// callgrind's output.
fn count(exe: &Path, name: &str, pad: u64, dir: &Path) -> Result<Count, String> {
    count_of(exe, name, pad, dir, false)
}

/// [`count`], or with `parse_only` the count of a bare parse of the case's bodies.
fn count_of(exe: &Path, name: &str, pad: u64, dir: &Path, parse_only: bool) -> Result<Count, String> {
    let out_file = dir.join(format!("{name}.callgrind"));
    let output = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--collect-atstart=no")
        .arg(format!("--toggle-collect={MEASURED}"))
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(exe)
        .args(["--case", name, "--pad", &pad.to_string()])
        .args(parse_only.then_some("--parse-only"))
        .output()
        .map_err(|e| format!("valgrind could not be run ({e}): install it (Debian: apt-get install valgrind)"))?;
    if !output.status.success() {
        return Err(format!(
            "{name}: the case failed under valgrind ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let calls = stdout.lines().find_map(|l| l.strip_prefix("measured-calls ")).map(str::trim);
    if calls != Some("1") {
        return Err(format!("{name}: `{MEASURED}` was entered {calls:?} times; the count must be of one call"));
    }
    let bytes = stdout.lines().find_map(|l| l.strip_prefix("bytes ")).and_then(|b| b.trim().parse().ok());
    let text = std::fs::read_to_string(&out_file).map_err(|e| format!("{}: {e}", out_file.display()))?;
    let instructions = text.lines().find_map(|l| l.strip_prefix("summary: ")).and_then(|s| s.trim().parse().ok());
    match (instructions, bytes) {
        (Some(0), _) => Err(format!("{name}: callgrind counted nothing: `{MEASURED}` matched no function")),
        (Some(instructions), Some(bytes)) => Ok(Count { instructions, bytes }),
        _ => Err(format!("{name}: no count in {} or no size on stdout", out_file.display())),
    }
}

/// How much `now` is above `before`, in percent.
fn change_percent(before: u64, now: u64) -> f64 {
    (now as f64 / before as f64 - 1.0) * 100.0
}

/// Shows that the gate catches a 5% slowdown of one case: the 2 KB review counted as it is, then with a loop
/// added to the counted call worth 5% of it (its cost per iteration measured first). Passes when the padded count
/// is 4.5 to 5.5% above and that is over the margin, and when two plain counts are within 0.1% of each other.
fn self_test(exe: &Path, dir: &Path) -> ExitCode {
    const CASE: &str = "review-2KB";
    const PROBE: u64 = 10_000;
    let run = |pad| count(exe, CASE, pad, dir).map(|c| c.instructions);
    let result = (|| -> Result<(), String> {
        let (plain, again, probe) = (run(0)?, run(0)?, run(PROBE)?);
        let repeat = change_percent(plain, again).abs();
        println!("{CASE}: {plain} then {again} instructions ({repeat:.3}% apart)");
        if repeat > 0.1 {
            return Err(format!("two counts of {CASE} are {repeat:.3}% apart: the gate would be noisy"));
        }
        let per_iteration = (probe - plain) as f64 / PROBE as f64;
        let pad = (plain as f64 * 0.05 / per_iteration).round() as u64;
        let slowed = run(pad)?;
        let change = change_percent(plain, slowed);
        println!(
            "{CASE} made 5% slower ({pad} iterations of {per_iteration:.1} instructions): {slowed} ({change:+.2}%)"
        );
        if !(4.5..=5.5).contains(&change) || change <= MARGIN_PERCENT {
            return Err(format!("a 5% slowdown counted {change:+.2}%, margin {MARGIN_PERCENT}%: not caught"));
        }
        println!("caught: {change:+.2}% is over the {MARGIN_PERCENT}% margin");
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gate self-test: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The compiler the counts are of: `rustc -V`, as cargo runs it here.
fn rustc_version() -> String {
    let output = Command::new("rustc").arg("-V").output();
    output.map_or_else(|e| format!("unknown ({e})"), |o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

/// The line of the baseline that names the compiler it was counted with.
const RUSTC_LINE: &str = "# counted with ";

/// The compiler the committed baseline was counted with, if it says.
fn baseline_rustc() -> Option<String> {
    let text = std::fs::read_to_string(BASELINE).ok()?;
    text.lines().find_map(|l| l.strip_prefix(RUSTC_LINE)).map(str::to_owned)
}

/// The committed baseline: case name to instructions.
fn read_baseline() -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(BASELINE).unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            Some((fields.next()?.to_owned(), fields.next()?.parse().ok()?))
        })
        .collect()
}

fn write_baseline(counts: &[(String, Count)]) -> std::io::Result<()> {
    let mut text = String::from(
        "# The instruction-count gate's baseline (core/benches/gate.rs): instructions of one engine call per case, and\n\
         # the bytes it answered. Written by `cargo bench -p sidecar-injector-core --bench gate -- --bless`; say why\n\
         # in the commit.\n",
    );
    text += &format!("{RUSTC_LINE}{}\n", rustc_version());
    for (name, count) in counts {
        text += &format!("{name} {} {}\n", count.instructions, count.bytes);
    }
    std::fs::write(BASELINE, text)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value_of = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
    if let Some(name) = value_of("--case") {
        let pad = value_of("--pad").and_then(|p| p.parse().ok()).unwrap_or(0);
        return run_case(name, pad, args.iter().any(|a| a == "--parse-only"));
    }
    let bless = args.iter().any(|a| a == "--bless");
    let parse = args.iter().any(|a| a == "--parse");
    // `cargo bench` passes `--bench`; other flags are criterion's and mean nothing here.
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let exe = std::env::current_exe().expect("the running executable has a path");
    let dir = std::env::temp_dir().join(format!("sidecar-injector-gate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    if args.iter().any(|a| a == "--self-test") {
        let passed = self_test(&exe, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        return passed;
    }
    let baseline = read_baseline();
    // Another compiler generates other code, so other counts: a failure to bless, not a regression to chase.
    let (counted_with, running) = (baseline_rustc(), rustc_version());
    if !bless && counted_with.as_ref().is_some_and(|c| *c != running) {
        eprintln!(
            "gate: the baseline was counted with {}, and this is {running}; another compiler's code has other counts.\n\
             Count with the baseline's compiler, or bless with this one: \
             `cargo bench -p sidecar-injector-core --bench gate -- --bless` (say why in the commit)",
            counted_with.unwrap_or_default()
        );
        return ExitCode::FAILURE;
    }

    let mut counts = Vec::new();
    let mut failures = Vec::new();
    println!("{:<34} {:>14} {:>14} {:>8} {:>9}", "case", "baseline", "now", "change", "per byte");
    for (name, _) in cases() {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let count = match count(&exe, &name, 0, &dir) {
            Ok(count) => count,
            Err(error) => {
                eprintln!("{error}");
                failures.push(name.clone());
                continue;
            }
        };
        let per_byte = count.instructions as f64 / count.bytes as f64;
        if parse {
            match count_of(&exe, &name, 0, &dir, true) {
                Ok(parsed) => println!(
                    "{name:<34} a bare parse: {} instructions, {:.1} per byte; the rest {:.1} per byte",
                    parsed.instructions,
                    parsed.instructions as f64 / parsed.bytes as f64,
                    count.instructions.saturating_sub(parsed.instructions) as f64 / count.bytes as f64
                ),
                Err(error) => eprintln!("{error}"),
            }
        }
        match baseline.get(&name) {
            Some(&before) => {
                let change = change_percent(before, count.instructions);
                let verdict = if change > MARGIN_PERCENT { "  REGRESSION" } else { "" };
                println!("{name:<34} {before:>14} {:>14} {change:>+7.2}% {per_byte:>9.1}{verdict}", count.instructions);
                if change > MARGIN_PERCENT && !bless {
                    failures.push(format!("{name}: {before} -> {} instructions ({change:+.2}%)", count.instructions));
                }
            }
            None => {
                println!("{name:<34} {:>14} {:>14} {:>8} {per_byte:>9.1}", "-", count.instructions, "new");
                if !bless {
                    failures.push(format!("{name}: no baseline ({} instructions)", count.instructions));
                }
            }
        }
        counts.push((name, count));
    }
    let _ = std::fs::remove_dir_all(&dir);
    if bless {
        if !filters.is_empty() {
            eprintln!("gate: --bless writes every case; run it without a filter");
            return ExitCode::from(2);
        }
        write_baseline(&counts).expect("the baseline is writable");
        println!("wrote {BASELINE}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("\ngate: more than {MARGIN_PERCENT}% above the baseline, or failed:");
        for failure in &failures {
            eprintln!("  {failure}");
        }
        eprintln!(
            "a deliberate change: `cargo bench -p sidecar-injector-core --bench gate -- --bless`, why in the commit"
        );
        ExitCode::FAILURE
    }
}
