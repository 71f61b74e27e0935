//! The engine over arbitrary bytes, as `/mutate` and `/preview` read them. It never panics; on a review that
//! serde_json reads (canonical JSON, one reading), an injected patch is add-only, applies with `json-patch`, and
//! injecting the result adds nothing; a preview always admits.
#![no_main]

use std::sync::LazyLock;

use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sidecar_injector_core::{Engine, Settings, TemplateSet, Verdict};

static ENGINE: LazyLock<Engine> = LazyLock::new(|| {
    let settings = Settings::default();
    // The built-in template always compiles (a unit test says so).
    Engine::new(TemplateSet::builtin(&settings).expect("the built-in template compiles"), &settings)
});

fuzz_target!(|data: &[u8]| {
    let mut out = Vec::new();
    // The apply-time preview reads the same bytes as a workload's review: it never panics, and whatever it reads
    // it admits, with a JSON answer.
    if ENGINE.preview(&mut data.to_vec(), &mut out).is_ok() {
        let answer: Value = serde_json::from_slice(&out).expect("every preview answer is JSON");
        assert_eq!(answer["response"]["allowed"], true, "a preview never refuses");
    }
    let mut body = data.to_vec();
    let Ok(outcome) = ENGINE.review(&mut body, &mut out) else { return };
    let response: Value = serde_json::from_slice(&out).expect("every response is JSON");
    let Verdict::Injected { .. } = outcome.verdict else { return };
    let Ok(mut review) = serde_json::from_slice::<Value>(data) else { return };
    let encoded = response["response"]["patch"].as_str().expect("an injected response carries a patch");
    let patch = base64::engine::general_purpose::STANDARD.decode(encoded).expect("the patch is base64");
    let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("the patch is a JSON Patch");
    assert!(patch.0.iter().all(|op| matches!(op, json_patch::PatchOperation::Add(_))), "add-only");
    let object = &mut review["request"]["object"];
    json_patch::patch(object, &patch).expect("the patch applies to the pod it was computed for");
    let mut again = serde_json::to_vec(&review).expect("a Value serialises");
    let second = ENGINE.review(&mut again, &mut out).expect("the injected review is still a review");
    assert!(!matches!(second.verdict, Verdict::Injected { .. }), "a second pass adds nothing: {:?}", second.verdict);
});
