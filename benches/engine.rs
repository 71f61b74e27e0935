//! The whole engine call (bytes in, response bytes out) next to a bare simd-json parse of the same bytes, for
//! ~2 KB, ~8 KB and ~60 KB Pod reviews. Both include the copy of the request into a mutable buffer, which
//! simd-json needs because it parses in place, and both parse it there (`fill_tape_padded`).
//!
//! `engine` sends the same pod again and again, as a controller scaling up does (its pods give the same answers to
//! what the template reads, so the rendered leaves come from the thread's cache); `engine-named-pod` changes the
//! pod's name on every call, which the built-in template does not read when an `app` label names the service (a
//! cache hit too); `engine-unique-pod` changes that label on every call, so every call renders its leaves.
//!
//! The `snapshot` group measures what template reload adds to a request: loading the engine from its `ArcSwap`
//! (`arc-swap-load`), and the 2 KB review called on the engine directly (`engine-direct`) next to the same review
//! through the snapshot while another thread publishes a new template set every millisecond (`engine-reloading`).
//!
//! The `stages` group runs each size class (2 KB, 8 KB, 60 KB, 1 MB) through the engine up to each stage
//! (`Engine::review_until`: tape, parse (the tape and the duplicate-key check), read, decide, render, merge,
//! respond); the stages stream into each other, so a stage's own cost is the difference between two of these.
//! `0-copy` is what every stage includes before the engine runs: the body copied into the parse buffer. The
//! parameter is the review's size in bytes, so `cargo run -p loadtest --release -- plot-bench` can draw cost
//! against size from criterion's estimates.
//!
//! The `pathological` group times the pods at the API server's limits (`benches/support/reviews.rs`) whose
//! instruction counts the gate holds (`core/benches/gate.rs`).
//!
//! Run: `cargo bench --bench engine` (`-- stages` for that group alone). Compare ratios within one run: the
//! machine is shared.

#[path = "support/reviews.rs"]
#[allow(dead_code)] // each user takes what it needs of the shared reviews
mod reviews;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use reviews::{UNIQUE_APP, UNIQUE_NAME, digits_of, review_of_size, stamp};
use serde_json::{Value, json};
use sidecar_injector_core::{Engine, Settings, Stage, TemplateSet, Verdict};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

// The allocator the binary uses, so the numbers are the server's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Benchmarks `engine` reviewing `body`, copied into the parse buffer and rewritten by `vary(buffer, call number)`
/// before each call (which may leave it as it is).
fn bench_review(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: BenchmarkId,
    engine: &Engine,
    body: &[u8],
    out: &mut Vec<u8>,
    vary: impl Fn(&mut [u8], u32),
) {
    group.bench_with_input(id, body, |b, body| {
        let mut buf = Vec::with_capacity(body.len());
        let mut n = 0u32;
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(body);
            n = n.wrapping_add(1);
            vary(&mut buf, n);
            black_box(engine.review(&mut buf, out).unwrap());
        })
    });
}

/// The CPU request the judged-values benchmarks read from an annotation: 8 digits they may rewrite, in nanocores
/// (10m to 100m, below the template's limit).
const JUDGED_CPU: &str = "10000000n";

/// Writes a number of 8 digits made from `n` (10,000,000 to 99,999,998) over the 8 digits at `at`.
fn stamp_decimal(buf: &mut [u8], at: usize, n: u32) {
    let n = n % 89_999_999 + 10_000_000;
    buf[at..at + 8].copy_from_slice(format!("{n:08}").as_bytes());
}

/// The built-in template, its sidecar's CPU request read from the pod's `example.com/cpu` annotation.
fn judged_values_engine() -> Engine {
    let settings = Settings::default();
    let source = sidecar_injector_core::template::BUILTIN_SOURCE;
    let edited = source.replace(
        r#"requests: { cpu: "{{ values.proxyCPU }}""#,
        r#"requests: { cpu: "{{ pod.annotations['example.com/cpu'] | default(values.proxyCPU) }}""#,
    );
    assert_ne!(edited, source, "the built-in template's CPU request is where this expects it");
    Engine::new(TemplateSet::from_source("default", "default.yaml", &edited, &settings).unwrap(), &settings)
}

fn engine() -> Engine {
    let settings = Settings::default();
    Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings)
}

fn bench(c: &mut Criterion) {
    let engine = engine();
    let mut group = c.benchmark_group("review");
    for (label, target) in [("2KB", 2_000), ("8KB", 8_000), ("60KB", 60_000)] {
        let body = review_of_size(target);
        let mut buf = body.clone();
        let mut out = Vec::with_capacity(16 * 1024);
        let outcome = engine.review(&mut buf, &mut out).unwrap();
        assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "the benchmark must measure an injection");
        group.throughput(Throughput::Bytes(body.len() as u64));

        let unchanged = |_: &mut [u8], _: u32| {};
        bench_review(&mut group, BenchmarkId::new("engine", label), &engine, &body, &mut out, unchanged);
        for (id, placeholder) in [("engine-named-pod", UNIQUE_NAME), ("engine-unique-pod", UNIQUE_APP)] {
            let digits = digits_of(&body, placeholder);
            let vary = |buf: &mut [u8], n: u32| stamp(buf, digits, n);
            bench_review(&mut group, BenchmarkId::new(id, label), &engine, &body, &mut out, vary);
        }

        if label == "2KB" {
            // A pod that overrides a template value: the override is checked against the API server's rules
            // (`Template::vet_overrides`), a cost only such pods pay.
            let mut review: Value = serde_json::from_slice(&body).unwrap();
            review["request"]["object"]["metadata"]["annotations"]["sidecar-injector.io/proxy-cpu"] = json!("100m");
            let overridden = serde_json::to_vec(&review).unwrap();
            let id = BenchmarkId::new("engine-override", label);
            bench_review(&mut group, id, &engine, &overridden, &mut out, unchanged);

            // Issue 35: a template whose pod-dependent leaf renders a quantity (a CPU request read from an
            // annotation) has its part judged whole with each pod's values. The same value on every call is judged
            // once per thread (cached by the rendered values); a new value on every call is judged every time. The
            // shipped templates render strings only from the pod and never pay this (`engine` above).
            let judged = judged_values_engine();
            let mut review: Value = serde_json::from_slice(&body).unwrap();
            review["request"]["object"]["metadata"]["annotations"]["example.com/cpu"] = json!(JUDGED_CPU);
            let body = serde_json::to_vec(&review).unwrap();
            let outcome = judged.review(&mut body.clone(), &mut out).unwrap();
            assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{outcome:?}");
            let id = BenchmarkId::new("engine-judged-same-values", label);
            bench_review(&mut group, id, &judged, &body, &mut out, unchanged);
            let digits = digits_of(&body, JUDGED_CPU.trim_end_matches('n'));
            let vary = |buf: &mut [u8], n: u32| stamp_decimal(buf, digits, n);
            bench_review(
                &mut group,
                BenchmarkId::new("engine-judged-new-values", label),
                &judged,
                &body,
                &mut out,
                vary,
            );

            // Issue 41: the apply-time preview of a Deployment whose pod template is this pod (off the pod path:
            // one call per workload created or changed). Its cost beside `engine-unique-pod`: the workload read
            // into JSON, the pod template wrapped as a Pod review, and one engine review of it.
            let review: Value = serde_json::from_slice(&body).unwrap();
            let pod = &review["request"]["object"];
            let deployment = json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                "spec": {"template": {"metadata": pod["metadata"], "spec": pod["spec"]}}
            });
            let mut workload_review = review.clone();
            workload_review["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
            workload_review["request"]["object"] = deployment;
            let workload_review = serde_json::to_vec(&workload_review).unwrap();
            let outcome = engine.preview(&mut workload_review.clone(), &mut out).unwrap();
            assert!(matches!(outcome.verdict, Verdict::Previewed { templates: 1, .. }), "{outcome:?}");
            group.bench_with_input(BenchmarkId::new("preview-deployment", label), &workload_review, |b, body| {
                let mut buf = Vec::with_capacity(body.len());
                b.iter(|| {
                    buf.clear();
                    buf.extend_from_slice(body);
                    black_box(engine.preview(&mut buf, &mut out).unwrap());
                })
            });
        }

        group.bench_with_input(BenchmarkId::new("simd-json-parse", label), &body, |b, body| {
            let mut buf = Vec::with_capacity(body.len() + simd_json::INPUT_PADDING);
            let mut buffers = simd_json::Buffers::new(body.len());
            let mut tape = Some(simd_json::Tape::null());
            b.iter(|| {
                buf.clear();
                buf.extend_from_slice(body);
                buf.resize(body.len() + simd_json::INPUT_PADDING, b' ');
                let mut t = tape.take().unwrap().reset();
                // In place, as the engine parses: no second copy into a padded buffer of simd-json's own.
                simd_json::fill_tape_padded(&mut buf, body.len(), &mut buffers, &mut t).unwrap();
                black_box(t.0.len());
                tape = Some(t.reset());
            })
        });
    }
    group.finish();
}

fn snapshot(c: &mut Criterion) {
    let engines = [Arc::new(engine()), Arc::new(engine())];
    let snapshot = Arc::new(arc_swap::ArcSwap::new(engines[0].clone()));
    let body = review_of_size(2_000);
    let mut out = Vec::with_capacity(16 * 1024);
    let mut buf = Vec::with_capacity(body.len());
    let mut group = c.benchmark_group("snapshot");

    group.bench_function("arc-swap-load", |b| b.iter(|| black_box(snapshot.load().set().hash().len())));

    group.bench_function("engine-direct", |b| {
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(&body);
            black_box(engines[0].review(&mut buf, &mut out).unwrap());
        })
    });

    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (snapshot, engines, stop) = (snapshot.clone(), engines.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                snapshot.store(engines[i % 2].clone());
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            i
        })
    };
    let mut measured = false;
    group.bench_function("engine-reloading", |b| {
        measured = true;
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(&body);
            let engine = snapshot.load();
            black_box(engine.review(&mut buf, &mut out).unwrap());
        })
    });
    stop.store(true, Ordering::Relaxed);
    let published = publisher.join().unwrap();
    // A filter (`cargo bench -- review/`) may skip the measurement, and then nothing needed publishing.
    assert!(!measured || published > 0, "sets were published during the measurement");
    group.finish();
}

/// Each size class up to each stage, on a new `app` label every call (so the per-pod leaves are rendered).
fn stages(c: &mut Criterion) {
    let engine = engine();
    let mut group = c.benchmark_group("stages");
    let stages = [
        ("0-tape", Stage::Tape),
        ("1-parse", Stage::Parse),
        ("2-read", Stage::Read),
        ("3-decide", Stage::Decide),
        ("4-render", Stage::Render),
        ("5-merge", Stage::Merge),
        ("6-respond", Stage::Respond),
    ];
    for target in [2_000, 8_000, 60_000, 1_000_000] {
        let body = review_of_size(target);
        let digits = digits_of(&body, UNIQUE_APP);
        group.throughput(Throughput::Bytes(body.len() as u64));
        // What every stage below pays before the engine runs: the body copied into the parse buffer, stamped and
        // padded as the engine pads it. The parse itself is in place, so this is the one copy.
        let mut buf = Vec::with_capacity(body.len() + sidecar_injector_core::PARSE_PADDING);
        let mut n = 0u32;
        group.bench_with_input(BenchmarkId::new("0-copy", body.len()), &body, |b, body| {
            b.iter(|| {
                buf.clear();
                buf.extend_from_slice(body);
                n = n.wrapping_add(1);
                stamp(&mut buf, digits, n);
                buf.resize(body.len() + sidecar_injector_core::PARSE_PADDING, b' ');
                black_box(&mut buf);
            })
        });
        for (name, stage) in stages {
            let mut buf = Vec::with_capacity(body.len());
            let mut out = Vec::with_capacity(16 * 1024);
            let mut n = 0u32;
            group.bench_with_input(BenchmarkId::new(name, body.len()), &body, |b, body| {
                b.iter(|| {
                    buf.clear();
                    buf.extend_from_slice(body);
                    n = n.wrapping_add(1);
                    stamp(&mut buf, digits, n);
                    out.clear();
                    engine.review_until(&mut buf, &mut out, stage).unwrap();
                    black_box(out.len());
                })
            });
        }
    }
    group.finish();
}

/// The pathological pods (`reviews::pathological`): pods at the API server's limits, each a new pod on every call.
/// Their instruction counts are the gate's; this is their time.
fn pathological(c: &mut Criterion) {
    let engine = engine();
    let mut group = c.benchmark_group("pathological");
    let mut out = Vec::with_capacity(64 * 1024);
    for (name, body) in reviews::pathological() {
        group.throughput(Throughput::Bytes(body.len() as u64));
        let digits = digits_of(&body, UNIQUE_APP);
        let mut buf = Vec::with_capacity(body.len());
        let mut n = 0u32;
        group.bench_function(name, |b| {
            b.iter(|| {
                buf.clear();
                buf.extend_from_slice(&body);
                n = n.wrapping_add(1);
                stamp(&mut buf, digits, n);
                // The pod beyond the API server's limits is refused unread: an error, by design.
                let answered = engine.review(&mut buf, &mut out);
                black_box(answered.is_ok() || name == reviews::BEYOND_API_LIMITS);
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(std::time::Duration::from_secs(1)).measurement_time(std::time::Duration::from_secs(3));
    targets = bench, snapshot, stages, pathological
}
criterion_main!(benches);
