//! The engine's allocations per review, counted by dhat's heap profiler (its own test binary: the profiler and the
//! allocator are global). A review whose per-pod values are cached (a Deployment's pods, or pods that differ only in
//! what the template does not read, such as their names) allocates nothing; one that renders them allocates only
//! for the render. Both held by mistake once: a `Vec::iter` under simd-json's
//! prelude resolved to its `Array` trait's boxed iterator, five allocations a review in the merge.

use sidecar_injector_core::{Engine, Settings, TemplateSet, Verdict};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// The recorded API server review with the pod named `name` and labelled `app: {app}`, ready to parse in place.
fn review(name: &str, app: &str) -> Vec<u8> {
    let recorded = include_str!("corpus/reviews/apiserver-1.20-pod-create.json");
    let (named, labelled) = (r#""name":"demo","creationTimestamp""#, r#""labels":{"app":"demo"}"#);
    assert!(recorded.contains(named) && recorded.contains(labelled), "the recorded pod is named and labelled demo");
    let renamed = recorded.replacen(named, &format!(r#""name":"{name}","creationTimestamp""#), 1);
    let renamed = renamed.replacen(labelled, &format!(r#""labels":{{"app":"{app}"}}"#), 1);
    let mut body = Vec::with_capacity(renamed.len() + sidecar_injector_core::PARSE_PADDING);
    body.extend_from_slice(renamed.as_bytes());
    body
}

#[test]
fn a_review_allocates_nothing_when_its_render_is_cached_and_only_to_render_otherwise() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let settings = Settings::default();
    let engine = Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings);
    let mut out = Vec::with_capacity(16 * 1024);
    let mut answer = |body: &mut Vec<u8>| {
        out.clear();
        let before = dhat::HeapStats::get().total_blocks;
        let outcome = engine.review(body, &mut out).unwrap();
        assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{:?}", outcome.verdict);
        dhat::HeapStats::get().total_blocks - before
    };
    // Warm up the thread's scratch (tape, buffers, leaf cache) on pods of both kinds. The built-in template names
    // the service by the `app` label, so a new label value is a new render.
    let mut bodies: Vec<Vec<u8>> = (0..40).map(|i| review("demo", &format!("demo-{i}"))).collect();
    let mut same: Vec<Vec<u8>> = (0..4).map(|_| review("demo", "demo")).collect();
    for body in bodies.iter_mut().take(20).chain(same.iter_mut().take(2)) {
        answer(body);
    }
    for body in &mut same[2..] {
        assert_eq!(answer(body), 0, "a pod whose per-pod values are cached");
    }
    // The template reads the name only without an app label: pods that differ in name alone hit the cache.
    for i in 0..4 {
        assert_eq!(answer(&mut review(&format!("demo-{i}"), "demo")), 0, "a pod that differs in its name alone");
    }
    for body in &mut bodies[20..] {
        let allocations = answer(body);
        assert!(allocations <= 20, "a pod rendered anew allocated {allocations} times");
    }
}
