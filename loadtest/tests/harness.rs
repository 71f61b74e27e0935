//! The harness as a user runs it: the binary against servers it starts (the injector, the baseline and the stack
//! floor, side by side) and against a webhook of the test's own that stalls once, to show that open-loop
//! latencies count the requests queued behind a stall.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use serde_json::Value;
use sidecar_injector::server::tls::DevCertificates;
use sidecar_injector_core::{Engine, Settings, TemplateSet};

/// Runs `loadtest ARGS --json`; returns its exit code, its report and its stderr.
fn loadtest(args: &[&str]) -> (i32, Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_loadtest")).args(args).arg("--json").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let report = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (output.status.code().unwrap_or(-1), report, stderr)
}

#[test]
fn a_started_injector_answers_every_request_correctly() {
    let (code, report, stderr) =
        loadtest(&["--start", "--rate", "400", "--requests", "300", "-c", "4", "--warmup", "0s", "--bodies", "2k"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["mode"], "open");
    assert_eq!((report["requests"].as_u64(), report["ok"].as_u64()), (Some(300), Some(300)), "{report}");
    assert_eq!(report["patched"], 300, "every generated pod is injected");
    assert_eq!(report["errors"], 0);
    let (p50, p99, max) =
        (report["p50_us"].as_u64().unwrap(), report["p99_us"].as_u64().unwrap(), report["max_us"].as_u64().unwrap());
    assert!(0 < p50 && p50 <= p99 && p99 <= max, "{report}");
    assert!(report["send_late_p999_us"].as_u64().is_some(), "an open loop reports its pacer: {report}");
    assert!(report["server_cpu_us_per_req"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["server_rss_peak_mib"].as_f64().unwrap() >= report["server_rss_idle_mib"].as_f64().unwrap());
}

#[test]
fn the_injector_and_the_baseline_side_by_side_over_the_corpus() {
    let (code, report, stderr) = loadtest(&[
        "--start",
        "--start-baseline",
        "--requests",
        "400",
        "--slice",
        "200ms",
        "-c",
        "2",
        "--warmup",
        "0s",
        "--html",
        &std::env::temp_dir().join(format!("loadtest-{}.html", std::process::id())).display().to_string(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["mode"], "closed");
    assert!(report["send_late_max_us"].is_null(), "nothing is paced in a closed loop: {report}");
    assert!(report["body_count"].as_u64().unwrap() > 300, "the corpus pods: {report}");
    assert_eq!(report["target"], "sidecar-injector");
    assert_eq!(report["compare"]["target"], "baseline");
    for target in [&report, &report["compare"]] {
        assert_eq!(target["ok"], 400, "{target}");
        assert_eq!(target["errors"], 0, "{target}");
    }
    let ratio = report["ratios"]["server_cpu_us_per_req"].as_f64().unwrap();
    let expected = report["compare"]["server_cpu_us_per_req"].as_f64().unwrap()
        / report["server_cpu_us_per_req"].as_f64().unwrap();
    assert!((ratio - expected).abs() < 1e-9, "{report}");
}

/// `report[a]["server_cpu_us_per_req"]` ÷ `report[b][...]`, where `""` is the top level (the first target).
fn cpu_ratio(report: &Value, a: &str, b: &str) -> f64 {
    let cpu = |key: &str| {
        let target = if key.is_empty() { report } else { &report[key] };
        target["server_cpu_us_per_req"].as_f64().unwrap()
    };
    cpu(a) / cpu(b)
}

#[test]
fn the_injector_the_baseline_and_the_stack_floor_side_by_side_over_the_corpus() {
    let html = std::env::temp_dir().join(format!("loadtest-floor-{}.html", std::process::id()));
    let (code, report, stderr) = loadtest(&[
        "--start",
        "--start-baseline",
        "--start-floor",
        "--requests",
        "400",
        "--slice",
        "200ms",
        "-c",
        "2",
        "--warmup",
        "0s",
        "--html",
        &html.display().to_string(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(report["body_count"].as_u64().unwrap() > 300, "the corpus pods, each named to the floor: {report}");
    assert_eq!(
        (&report["target"], &report["compare"]["target"], &report["floor"]["target"]),
        (&"sidecar-injector".into(), &"baseline".into(), &"stack-floor".into())
    );
    // Every answer of every target was checked: the floor's against the injector's own answer to the same body.
    for target in [&report, &report["compare"], &report["floor"]] {
        assert_eq!((target["ok"].as_u64(), target["errors"].as_u64()), (Some(400), Some(0)), "{target}");
        assert!(target["server_cpu_us_per_req"].as_f64().unwrap() > 0.0, "{target}");
        assert!(target["patched"].as_u64().unwrap() > 350, "most corpus pods are injected: {target}");
    }
    // The ratios, side by side: B/A as before, and each target over the floor (A/F, B/F).
    assert!(
        (report["ratios"]["server_cpu_us_per_req"].as_f64().unwrap() - cpu_ratio(&report, "compare", "")).abs() < 1e-9
    );
    let over = &report["over_floor"];
    assert!((over["first"]["server_cpu_us_per_req"].as_f64().unwrap() - cpu_ratio(&report, "", "floor")).abs() < 1e-9);
    assert!(
        (over["compare"]["server_cpu_us_per_req"].as_f64().unwrap() - cpu_ratio(&report, "compare", "floor")).abs()
            < 1e-9,
        "{over}"
    );
    let p99 = report["p99_us"].as_f64().unwrap() / report["floor"]["p99_us"].as_f64().unwrap();
    assert!((over["first"]["p99_us"].as_f64().unwrap() - p99).abs() < 1e-9, "{over}");
    let page = std::fs::read_to_string(&html).unwrap();
    let _ = std::fs::remove_file(&html);
    for column in ["sidecar-injector", "baseline", "stack-floor", "B/A", "A/F", "B/F"] {
        assert!(page.contains(column), "the HTML report has {column}");
    }
}

#[test]
fn the_stack_floor_answers_as_many_bytes_as_the_injector_in_an_open_loop() {
    let (code, report, stderr) = loadtest(&[
        "--start",
        "--start-floor",
        "--rate",
        "400",
        "--requests",
        "200",
        "-c",
        "4",
        "--warmup",
        "0s",
        "--bodies",
        "2k",
        "--slice",
        "200ms",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(report["compare"].is_null() && report["ratios"].is_null(), "no baseline was asked for: {report}");
    let floor = &report["floor"];
    assert_eq!(
        (floor["ok"].as_u64(), floor["patched"].as_u64(), floor["errors"].as_u64()),
        (Some(200), Some(200), Some(0))
    );
    // One generated body, named anew per request: ours answers every request with as many bytes as the fixed
    // answer, so TLS, hyper and the kernel carry the same traffic for both.
    assert!(report["mean_answer_bytes"].as_f64().unwrap() > 2_000.0, "{report}");
    assert_eq!(report["mean_answer_bytes"], floor["mean_answer_bytes"], "{report}");
    assert!(floor["send_late_p999_us"].as_u64().is_some(), "the floor is paced as the others: {floor}");
    assert!(report["over_floor"]["first"]["server_cpu_us_per_req"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["over_floor"]["compare"].is_null(), "{report}");
    // Ours taken apart: the floor's and ours as measured, the engine in process, the remainder what is left.
    let accounting = &report["accounting"];
    let figure = |key: &str| accounting[key].as_f64().unwrap_or_else(|| panic!("{key}: {accounting}"));
    assert_eq!(figure("ours_us"), report["server_cpu_us_per_req"].as_f64().unwrap());
    assert_eq!(figure("floor_us"), floor["server_cpu_us_per_req"].as_f64().unwrap());
    assert!(figure("engine_us") > 0.0, "{accounting}");
    assert!(figure("engine_p99_us") >= figure("engine_p50_us") && figure("engine_p50_us") > 0.0, "{accounting}");
    let sum = figure("floor_us") + figure("engine_us") + figure("remainder_us");
    assert!((sum - figure("ours_us")).abs() < 1e-9, "{accounting}");
    assert!((figure("remainder_target_us") - (2.0 + 0.03 * figure("engine_us"))).abs() < 1e-9, "{accounting}");
    // Open loop: the rate sets every server's pace, so no floor is held to ours.
    assert!(report["paced_floor"].is_null() && accounting["stack_at_our_pace_us"].is_null(), "{report}");
}

#[test]
fn in_a_closed_loop_the_floor_held_busy_as_long_as_the_engine_gives_the_stack_at_our_pace() {
    let (code, report, stderr) = loadtest(&[
        "--start",
        "--start-floor",
        "--requests",
        "300",
        "-c",
        "4",
        "--warmup",
        "0s",
        "--bodies",
        "2k",
        "--slice",
        "200ms",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let paced = &report["paced_floor"];
    assert_eq!(paced["target"], "floor-at-our-pace", "{report}");
    assert_eq!((paced["ok"].as_u64(), paced["errors"].as_u64()), (Some(300), Some(0)), "{paced}");
    assert_eq!(paced["mean_answer_bytes"], report["mean_answer_bytes"], "{report}");
    let accounting = &report["accounting"];
    let figure = |key: &str| accounting[key].as_f64().unwrap_or_else(|| panic!("{key}: {accounting}"));
    // The paced floor spends the engine's time per request on top of the stack: the stack is what is left, and
    // it cannot be nothing (it decrypts and answers every request).
    let paced_cpu = paced["server_cpu_us_per_req"].as_f64().unwrap();
    assert!(paced_cpu > figure("engine_us"), "{report}");
    assert!((figure("stack_at_our_pace_us") - (paced_cpu - figure("engine_us"))).abs() < 1e-9, "{accounting}");
    let sum = figure("stack_at_our_pace_us") + figure("engine_us") + figure("remainder_at_our_pace_us");
    assert!((sum - figure("ours_us")).abs() < 1e-9, "{accounting}");
}

#[test]
fn a_stack_floor_answering_wrongly_is_counted_and_fails_the_run() {
    // The floor serves another path, so every POST /mutate gets a 404; the injector beside it answers correctly.
    // The floor at our pace takes the same --floor-arg, so it fails as the floor does.
    let (code, report, stderr) = loadtest(&[
        "--start",
        "--start-floor",
        "--floor-arg=--path=/elsewhere",
        "--requests",
        "50",
        "-c",
        "2",
        "--warmup",
        "0s",
        "--bodies",
        "2k",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!((report["ok"].as_u64(), report["errors"].as_u64()), (Some(50), Some(0)), "{report}");
    let floor = &report["floor"];
    assert_eq!((floor["wrong_answers"].as_u64(), floor["ok"].as_u64()), (Some(50), Some(0)), "{floor}");
    assert!(floor["error_examples"][0].as_str().unwrap().contains("HTTP 404"), "{floor}");
    let paced = &report["paced_floor"];
    assert_eq!((paced["wrong_answers"].as_u64(), paced["ok"].as_u64()), (Some(50), Some(0)), "{paced}");
    assert!(stderr.contains("100 requests failed"), "{stderr}");
}

#[test]
fn a_stack_floor_answering_another_correct_looking_answer_is_counted_wrong() {
    // A well-formed answer with the bodies' uid, allowed, no patch: a correct answer in form, but not the
    // injector's answer to the body, so not the one every answer of the floor must be byte for byte.
    let answers = tempfile::NamedTempFile::new().unwrap();
    let other = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"00000000-0000-4000-8000-000000000000","allowed":true}}"#;
    std::fs::write(answers.path(), format!("{other}\n")).unwrap();
    let answers_arg = format!("--floor-arg=--answers={}", answers.path().display());
    let (code, report, stderr) = loadtest(&[
        "--start",
        "--start-floor",
        &answers_arg,
        "--requests",
        "20",
        "-c",
        "1",
        "--warmup",
        "0s",
        "--bodies",
        "2k",
    ]);
    assert_eq!(code, 1, "{stderr}");
    let floor = &report["floor"];
    assert_eq!((floor["wrong_answers"].as_u64(), floor["ok"].as_u64()), (Some(20), Some(0)), "{floor}");
    let example = floor["error_examples"][0].as_str().unwrap();
    assert!(example.contains(&format!("not the fixed answer: {} bytes", other.len())), "{example}");
}

#[test]
fn wrong_answers_are_counted_and_fail_the_run() {
    // The injector serves another path, so every POST /mutate gets a 404.
    let (code, report, stderr) =
        loadtest(&["--start", "--server-arg=--path=/elsewhere", "--requests", "50", "-c", "2", "--warmup", "0s"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!((report["wrong_answers"].as_u64(), report["ok"].as_u64()), (Some(50), Some(0)), "{report}");
    assert!(report["error_examples"][0].as_str().unwrap().contains("HTTP 404"), "{report}");
    assert!(stderr.contains("50 requests failed"), "{stderr}");
}

#[test]
fn a_webhook_that_cannot_be_reached_is_an_error_not_a_result() {
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), DevCertificates::generate().unwrap().ca_pem).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("https://127.0.0.1:{port}/mutate");
    let (code, _, stderr) = loadtest(&["--url", &url, "--ca", &ca.path().display().to_string(), "--requests", "5"]);
    assert_eq!(code, 1);
    assert!(stderr.contains(&url) && stderr.contains("connect"), "{stderr}");
    let (code, _, stderr) = loadtest(&["--url", &url, "--requests", "5"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("give --ca FILE"), "{stderr}");
}

/// The request the stalling webhook holds: the 51st, a second into a run at 50 requests a second.
const STALLED_REQUEST: u64 = 50;

/// A webhook (the real engine) that stalls for `stall` on request number [`STALLED_REQUEST`] (from 0).
async fn stalling_webhook(stall: Duration) -> (String, tempfile::NamedTempFile) {
    let certs = DevCertificates::generate().unwrap();
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), &certs.ca_pem).unwrap();
    let cert = rustls::pki_types::CertificateDer::from_pem_slice(certs.cert_pem.as_bytes()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(certs.key_pem.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/mutate", listener.local_addr().unwrap());
    let settings = Settings::default();
    let engine = Arc::new(Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings));
    let count = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, engine, count) = (acceptor.clone(), engine.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (engine, count) = (engine.clone(), count.clone());
                    async move {
                        let mut body = request.into_body().collect().await?.to_bytes().to_vec();
                        if count.fetch_add(1, Ordering::Relaxed) == STALLED_REQUEST {
                            tokio::time::sleep(stall).await;
                        }
                        let mut out = Vec::new();
                        engine.review(&mut body, &mut out).unwrap();
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(out))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
            });
        }
    });
    (url, ca)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_latency_counts_the_requests_queued_behind_a_stall() {
    let (url, ca) = stalling_webhook(Duration::from_secs(1)).await;
    let args = ["--url", &url, "--ca", &ca.path().display().to_string(), "--rate", "50", "--duration", "5s", "-c", "1"];
    let args: Vec<String> = args.iter().map(|s| s.to_string()).chain(["--warmup".into(), "0s".into()]).collect();
    let (code, report, stderr) =
        tokio::task::spawn_blocking(move || loadtest(&args.iter().map(String::as_str).collect::<Vec<_>>()))
            .await
            .unwrap();
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["ok"], 250, "{report}");
    // One request was held for a second, and the ~50 due during the stall queued behind it on the one connection.
    // Timed from when each was due, they all show it: those due in its first 900 ms waited over 100 ms, about 18%
    // of the samples, so p90 did. The rate is low enough that a debug build on a busy machine (which has served
    // fewer than 200 requests a second here) drains the queue soon after the stall, so most samples (p50) do not.
    // Timed from when each was sent (coordinated omission), only the stalled one would.
    assert!(report["p90_us"].as_u64().unwrap() > 100_000, "{report}");
    assert!(report["p50_us"].as_u64().unwrap() < 100_000, "{report}");
    assert!(report["max_us"].as_u64().unwrap() >= 1_000_000, "{report}");
    // The pacer kept issuing requests on time through the stall: its lateness is the machine's, not the server's.
    assert!(report["send_late_max_us"].as_u64().unwrap() < 100_000, "{report}");
}

/// Every flag and subcommand loadtest/README.md shows is one the binary has (issue 38: the harness's own README).
#[test]
fn the_readmes_flags_are_the_binarys() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let help = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_loadtest")).args(args).arg("--help").output().unwrap();
        String::from_utf8(output.stdout).unwrap()
    };
    // The stack floor's server is the harness's own subcommand, not one for people, but its flags are documented.
    let (main, floor, plot, floor_server) =
        (help(&[]), help(&["floor"]), help(&["plot-bench"]), help(&["__floor-server"]));
    let mut flags: Vec<&str> = readme
        .split(|c: char| c.is_whitespace() || "`(),".contains(c))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(|word| word.split('=').next().unwrap_or(word))
        .collect();
    flags.sort_unstable();
    flags.dedup();
    assert!(flags.len() >= 10, "{flags:?}");
    for flag in flags {
        if ["--release", "--profile", "--help", "--bench"].contains(&flag) {
            continue; // cargo's
        }
        let known = [&main, &floor, &plot, &floor_server]
            .iter()
            .any(|h| h.contains(&format!("{flag} ")) || h.contains(&format!("{flag}\n")));
        assert!(known, "loadtest/README.md shows {flag}, which loadtest --help does not list");
    }
}
