//! Revision tags (issue 55, item 4): a call through a tag's webhooks (`<path>[/REVISION]/tag/TAG`) injects what
//! the revision injects, with the tag in the status annotation; the same pod is then complete and idempotent
//! whichever way it is called; the server counts each tag's calls, within a bound.

use std::sync::Arc;

use arc_swap::ArcSwap;
use base64::Engine as _;
use hyper::StatusCode;
use serde_json::{Value, json};
use sidecar_injector_core::{Call, Engine, Mode, Outcome, Settings, SkipReason, Stamp, Tag, TemplateSet, Verdict};

use crate::common::server::*;
use crate::common::{self, apply};

const STATUS: &str = "sidecar-injector.io/status";

/// The engine's answer to `pod` in `mode`, through `tag`: the outcome and the decoded patch.
fn call(engine: &Engine, pod: &Value, mode: Mode, tag: Option<&Tag>) -> (Outcome, Option<Value>) {
    let mut body = serde_json::to_vec(&common::review(pod)).unwrap();
    let mut out = Vec::new();
    let outcome = engine.answer_call(&mut body, &mut out, mode, Call { tag, subject: false }).unwrap();
    let response: Value = serde_json::from_slice(&out).expect("the response is JSON");
    let patch = response["response"].get("patch").map(|p| {
        let bytes = base64::engine::general_purpose::STANDARD.decode(p.as_str().unwrap()).unwrap();
        serde_json::from_slice(&bytes).expect("the patch is JSON")
    });
    (outcome, patch)
}

fn stamp_of(pod: &Value) -> Stamp {
    Stamp::parse(pod["metadata"]["annotations"][STATUS].as_str().expect("stamped")).expect("a stamp")
}

/// A template whose annotations also render per pod: the stamp sits between a static and a rendered value.
const PER_POD: &str = "\
pod:
  metadata:
    annotations:
      example.com/owner: \"{{ pod.namespace }}/{{ pod.name }}\"
      example.com/static: fixed
  spec:
    containers:
      - name: helper
        image: busybox:1.36
";

#[test]
fn a_pod_through_a_tag_is_stamped_with_it_and_is_complete_whichever_way_it_is_called() {
    let prod = Tag::new("prod").unwrap();
    let bare = json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "app", "image": "shop:1"}]}});
    let mut annotated = bare.clone();
    annotated["metadata"]["annotations"] = json!({"team": "shop"});
    for (engine, what) in [(common::builtin(), "built-in"), (common::engine_from(PER_POD), "per-pod annotations")] {
        for pod in [&bare, &annotated] {
            let (_, untagged) = call(&engine, pod, Mode::Mutate, None);
            let (outcome, tagged) = call(&engine, pod, Mode::Mutate, Some(&prod));
            assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{what}: {:?}", outcome.verdict);
            let (untagged, tagged) = (apply(pod, &untagged.unwrap()), apply(pod, &tagged.unwrap()));
            let (plain, through_tag) = (stamp_of(&untagged), stamp_of(&tagged));
            assert_eq!(plain.tag, None, "{what}: a call through no tag names none");
            assert_eq!(through_tag.tag.as_deref(), Some("prod"), "{what}");
            assert_eq!(Stamp { tag: None, ..through_tag }, plain, "{what}: the tag is all that differs");
            let mut without_stamp = tagged.clone();
            without_stamp["metadata"]["annotations"][STATUS] = untagged["metadata"]["annotations"][STATUS].clone();
            assert_eq!(without_stamp, untagged, "{what}: the pods differ in the stamp alone");
            if what == "per-pod annotations" {
                assert_eq!(tagged["metadata"]["annotations"]["example.com/owner"], "shop/web");
            }

            // Idempotent, and complete, through the tag or not (a namespace relabelled, a reinvocation).
            for tag in [Some(&prod), None, Some(&Tag::new("canary").unwrap())] {
                let (outcome, patch) = call(&engine, &tagged, Mode::Mutate, tag);
                assert_eq!(patch, None, "{what}: {tag:?}");
                assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::AlreadyInjected), "{what}: {tag:?}");
                let (outcome, _) = call(&engine, &tagged, Mode::Validate, tag);
                assert_eq!(outcome.verdict, Verdict::Complete, "{what}: {tag:?}");
            }
        }
    }
}

#[test]
fn a_tag_is_a_dns_label() {
    for good in ["prod", "canary", "v1-2", "a", &"x".repeat(63)] {
        assert_eq!(Tag::new(good).unwrap().as_str(), good);
    }
    for bad in ["", "Prod", "a_b", "-a", "a-", "a.b", "a/b", &"x".repeat(64)] {
        let error = Tag::new(bad).unwrap_err();
        assert!(error.starts_with(&format!("tag {bad:?}: ")), "{error}");
    }
}

const REVIEW: &[u8] = include_bytes!("../data/pod-create.json");

fn engine_of(revision: &str) -> Arc<ArcSwap<Engine>> {
    let settings = Settings { revision: revision.to_owned(), ..Settings::default() };
    Arc::new(ArcSwap::from_pointee(Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings)))
}

/// The stamp a review's answer writes.
fn stamped(body: &[u8]) -> Stamp {
    let answer: Value = serde_json::from_slice(body).unwrap();
    let patch = answer["response"]["patch"].as_str().unwrap_or_else(|| panic!("no patch: {answer}"));
    let patch: Value =
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(patch).unwrap()).unwrap();
    let op = patch.as_array().unwrap().iter().find(|op| op["path"] == "/metadata/annotations").unwrap();
    Stamp::parse(op["value"][STATUS].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn the_server_takes_the_tag_from_the_path_and_counts_its_calls() {
    let server = start_revisions(vec![engine_of("default"), engine_of("canary")], |_, _| {}).await;
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    for (path, revision, tag) in [
        ("/mutate", "default", None),
        ("/mutate/tag/prod", "default", Some("prod")),
        ("/mutate/canary", "canary", None),
        ("/mutate/canary/tag/prod", "canary", Some("prod")),
        ("/mutate/canary/tag/prod", "canary", Some("prod")),
        ("/mutate/canary/tag/stable", "canary", Some("stable")),
    ] {
        let (status, body) = conn.send(post(path, "application/json", REVIEW)).await.unwrap();
        assert_eq!(status, StatusCode::OK, "{path}");
        let stamp = stamped(&body);
        assert_eq!((stamp.revision(), stamp.tag.as_deref()), (revision, tag), "{path}");
    }
    let (status, body) = conn.send(post("/validate/canary/tag/prod", "application/json", REVIEW)).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["response"]["allowed"], false, "not injected");

    for (path, reason) in [
        ("/mutate/canary/tag/Prod", "tag \"Prod\": a lowercase RFC 1123 label"),
        ("/mutate/tag/a_b", "tag \"a_b\""),
        ("/mutate/canary/tag", "the webhooks are at"),
        ("/mutate/canary/tags/prod", "the webhooks are at"),
        ("/mutate/blue/tag/prod", "the webhooks are at"),
        ("/mutate/canary/tag/prod/more", "the webhooks are at"),
    ] {
        let (status, body) = conn.send(post(path, "application/json", REVIEW)).await.unwrap();
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        let body = String::from_utf8_lossy(&body);
        assert!(body.starts_with("not found: ") && body.contains(reason), "{path}: {body}");
    }

    let metrics = admin_get(server.metrics, "/metrics").await.1;
    let tag_calls = |revision: &str, tag: &str| {
        counter(&metrics, &format!("sidecar_injector_tag_requests_total{{revision=\"{revision}\",tag=\"{tag}\"}}"))
    };
    assert_eq!(tag_calls("canary", "prod"), 3.0, "{metrics}");
    assert_eq!(tag_calls("canary", "stable"), 1.0);
    assert_eq!(tag_calls("default", "prod"), 1.0);
    assert!(!metrics.contains("tag=\"Prod\""), "a refused name makes no series");
}

#[tokio::test]
async fn a_revision_counts_a_bounded_number_of_tags_and_serves_the_rest() {
    let server = start_with(engine(), |_, _| {}).await;
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    let many = 64 + 3;
    for i in 0..many {
        let (status, body) = conn.send(post(&format!("/mutate/tag/t{i}"), "application/json", REVIEW)).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(stamped(&body).tag, Some(format!("t{i}")), "served and stamped beyond the bound too");
    }
    let metrics = admin_get(server.metrics, "/metrics").await.1;
    let series = metrics.lines().filter(|l| l.starts_with("sidecar_injector_tag_requests_total{")).count();
    assert_eq!(series, 64 + 1, "64 tags and `other`: {metrics}");
    assert_eq!(counter(&metrics, r#"sidecar_injector_tag_requests_total{revision="default",tag="other"}"#), 3.0);
}

/// The tag is in the stamp from the first merge on: a pod whose annotations the untagged stamp brings to exactly the
/// API server's total (256 KiB, keys and values) is injected, and through a tag, whose stamp is 13 bytes longer,
/// it is not, as the API server would refuse it.
#[test]
fn the_annotation_budget_is_judged_with_the_tags_stamp() {
    const TOTAL: usize = 256 * 1024;
    let engine = common::builtin();
    let pod = |filler: usize| {
        json!({"metadata": {"name": "web", "annotations": {"filler": "x".repeat(filler)}},
               "spec": {"containers": [{"name": "app", "image": "shop:1"}]}})
    };
    let annotation_bytes = |pod: &Value| -> usize {
        let annotations = pod["metadata"]["annotations"].as_object().unwrap();
        annotations.iter().map(|(k, v)| k.len() + v.as_str().unwrap().len()).sum()
    };
    let probe = pod(200_000);
    let injected = apply(&probe, &call(&engine, &probe, Mode::Mutate, None).1.unwrap());
    let at_the_limit = pod(200_000 + TOTAL - annotation_bytes(&injected));

    let (outcome, patch) = call(&engine, &at_the_limit, Mode::Mutate, None);
    assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{:?}", outcome.verdict);
    assert_eq!(annotation_bytes(&apply(&at_the_limit, &patch.unwrap())), TOTAL);
    let (outcome, patch) = call(&engine, &at_the_limit, Mode::Mutate, Some(&Tag::new("prod").unwrap()));
    assert_eq!(patch, None, "{:?}", outcome.verdict);
    assert_eq!(outcome.verdict, Verdict::Skipped(SkipReason::PodConflict), "{:?}", outcome.message);
}
