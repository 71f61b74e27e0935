//! Pods at the API server's limits (issue 54): 1,500 env vars in a container, 250 containers, 10,000 annotations,
//! a `last-applied-configuration` of the whole annotation budget, 1,000 volumes and mounts. Each is answered with
//! every property an ordinary pod's answer has (`check_properties`: the patch applies, adds only, validates, and a
//! second run adds nothing); one beyond the limits is refused unread. What they cost is the gate's
//! (`core/benches/gate.rs`), and the real API server's verdict on them is in `tests/e2e.rs`.

use crate::common::{answer, apply, builtin, check_properties, review};
use crate::reviews;
use serde_json::{Value, json};
use sidecar_injector_core::validation::{KubeVersion, validate_pod};
use sidecar_injector_core::{ReviewError, SkipReason, Verdict};

/// The pod of a review of `reviews`.
fn pod_of(body: &[u8]) -> Value {
    let review: Value = serde_json::from_slice(body).unwrap();
    review["request"]["object"].clone()
}

#[test]
fn pods_at_the_api_servers_limits_are_injected_with_every_property_of_an_ordinary_answer() {
    let engine = builtin();
    for (name, body) in reviews::pathological() {
        if name == reviews::BEYOND_API_LIMITS {
            continue;
        }
        let pod = pod_of(&body);
        let (outcome, _, patch) = answer(&engine, &review(&pod));
        assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{name}: {:?}", outcome.verdict);
        assert!(patch.is_some(), "{name}: no patch");
        check_properties(&engine, &pod);
    }
}

#[test]
fn a_pod_beyond_the_api_servers_annotation_limit_is_refused_unread() {
    let engine = builtin();
    let mut body = reviews::pathological_review(reviews::BEYOND_API_LIMITS).unwrap();
    let error = engine.review(&mut body, &mut Vec::new()).expect_err("refused");
    assert!(matches!(error, ReviewError::BeyondApiLimit { .. }), "{error}");
    assert!(error.to_string().contains("metadata.annotations"), "{error}");
}

/// A pod whose annotations come within the template's of the API server's total is refused by the API server once
/// injected, by exactly one byte more or less: the engine counts the pod's bytes and the patch's rather than
/// judging the pod whole, and must draw the line where the API server's rule (our validator) draws it.
#[test]
fn annotations_near_the_total_are_refused_exactly_where_the_injected_pod_would_be() {
    const LIMIT: usize = 256 * 1024;
    let engine = builtin();
    let base = pod_of(&reviews::review_of_size(2_000));
    // What the template adds to a pod's annotations (keys and values), read off its patch.
    let patch = answer(&engine, &review(&base)).2.expect("injected");
    let added: usize = apply(&base, &patch)["metadata"]["annotations"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(key, _)| base["metadata"]["annotations"].get(key.as_str()).is_none())
        .map(|(key, value)| key.len() + value.as_str().unwrap().len())
        .sum();
    assert!(added > 0, "the template adds annotations");
    let own: usize = base["metadata"]["annotations"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(key, value)| key.len() + value.as_str().unwrap().len())
        .sum();
    const PADDING: &str = "example.com/padding";
    for over in -2i64..=2 {
        let total = (LIMIT - added) as i64 + over;
        let mut pod = base.clone();
        let value = "x".repeat(total as usize - own - PADDING.len());
        pod["metadata"]["annotations"][PADDING] = json!(value);
        let (outcome, _, patch) = answer(&engine, &review(&pod));
        let injected = patch.map(|patch| apply(&pod, &patch));
        let refused_by_api_server = over > 0;
        match &outcome.verdict {
            Verdict::Injected { .. } => {
                assert!(!refused_by_api_server, "{over:+}: injected over the limit");
                let problems = validate_pod(&injected.unwrap(), KubeVersion::DEFAULT);
                assert!(problems.is_empty(), "{over:+}: {problems:?}");
            }
            Verdict::Skipped(SkipReason::PodConflict) | Verdict::Denied(SkipReason::PodConflict) => {
                assert!(refused_by_api_server, "{over:+}: refused within the limit: {:?}", outcome.message);
                // Refused (`onError: deny`) with the message, or admitted without the sidecar with a warning.
                let told = format!("{:?} {:?}", outcome.message, outcome.warnings);
                assert!(told.contains("metadata.annotations") && told.contains("262144"), "{told}");
            }
            other => panic!("{over:+}: {other:?}"),
        }
    }
}
