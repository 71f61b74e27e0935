//! The real server on 127.0.0.1 (random ports), spoken to over real TLS, HTTP/1.1 and HTTP/2.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::server::*;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use sidecar_injector::pki::Authority;
use sidecar_injector::server::TlsSource;
use sidecar_injector::server::tls::DevCertificates;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const REVIEW: &[u8] = include_bytes!("../data/pod-create.json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_and_http2_give_byte_identical_answers_and_h2_multiplexes() {
    let server = start(|_, _| {}).await;
    let mut h1 = Conn::open(server.addr, &server.ca_pem, false).await;
    let mut h2 = Conn::open(server.addr, &server.ca_pem, true).await;
    let (s1, b1) = h1.review(REVIEW).await;
    let (s2, b2) = h2.review(REVIEW).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert_eq!(b1, b2);
    let answer: serde_json::Value = serde_json::from_slice(&b1).unwrap();
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    // Keep-alive: the same h1 connection answers again, identically.
    assert_eq!(h1.review(REVIEW).await.1, b1);

    let Conn::H2(sender) = h2 else { unreachable!() };
    let requests = (0..64).map(|_| {
        let mut sender = sender.clone();
        tokio::spawn(async move { sender.send_request(post("/mutate", "application/json", REVIEW)).await })
    });
    for request in requests.collect::<Vec<_>>() {
        let response = request.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), b1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_class_gets_its_status_and_a_one_line_reason() {
    let server = start(|_, _| {}).await;
    let cases: Vec<(Request<Full<Bytes>>, StatusCode, &str)> = vec![
        (post("/mutate", "application/json", b"{\"kind\":"), StatusCode::BAD_REQUEST, "not valid JSON"),
        (post("/mutate", "application/json", b"{\"kind\":\"Pod\"}"), StatusCode::BAD_REQUEST, "not an AdmissionReview"),
        (post("/mutate", "application/json", b""), StatusCode::BAD_REQUEST, "empty"),
        (post("/other", "application/json", REVIEW), StatusCode::NOT_FOUND, "POST /mutate"),
        (post("/mutate", "text/plain", REVIEW), StatusCode::UNSUPPORTED_MEDIA_TYPE, "application/json"),
        (
            Request::get("https://localhost/mutate").body(Full::new(Bytes::new())).unwrap(),
            StatusCode::METHOD_NOT_ALLOWED,
            "use POST",
        ),
    ];
    for h2 in [false, true] {
        for (request, status, reason) in &cases {
            let mut conn = Conn::open(server.addr, &server.ca_pem, h2).await;
            let mut request_copy = Request::builder().method(request.method()).uri(request.uri());
            for (name, value) in request.headers() {
                request_copy = request_copy.header(name, value);
            }
            let body = request.body().clone();
            let (got, text) = conn.send(request_copy.body(body).unwrap()).await.unwrap();
            let text = String::from_utf8(text.to_vec()).unwrap();
            assert_eq!(got, *status, "h2={h2} {text}");
            assert!(text.contains(reason) && text.trim_end().lines().count() == 1, "h2={h2} {text:?}");
            // The connection and the server go on serving.
            assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK, "h2={h2} after {status}");
        }
    }
    let (_, metrics) = admin_get(server.metrics, "/metrics").await;
    assert!(counter(&metrics, r#"sidecar_injector_requests_total{result="error",reason="bad-request"}"#) >= 6.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_gets_413() {
    let server = start(|c, _| c.max_body_bytes = 1024).await;
    let big = vec![b' '; 4096];
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    let (status, text) = conn.send(post("/mutate", "application/json", &big)).await.unwrap();
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(String::from_utf8_lossy(&text).contains("1024 bytes"));
    // Without a Content-Length (chunked), the limit is enforced while reading.
    let mut tls = tls_connect(server.addr, client_config(&server.ca_pem, b"http/1.1", None)).await.unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", 2048, " ".repeat(2048));
    let head =
        "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    tls.write_all(format!("{head}{chunk}{chunk}0\r\n\r\n").as_bytes()).await.unwrap();
    let mut answer = vec![0; 512];
    let n = tls.read(&mut answer).await.unwrap();
    assert!(
        String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 413"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_headers_slowly_is_cut_off() {
    let server = start(|c, _| c.header_read_timeout = Duration::from_millis(300)).await;
    let mut tls = tls_connect(server.addr, client_config(&server.ca_pem, b"http/1.1", None)).await.unwrap();
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let started = Instant::now();
    let mut buf = vec![0; 256];
    // The server answers 408 or just closes; either way the connection ends well before our 5 s patience.
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the connection was not closed");
    assert!(started.elapsed() < Duration::from_secs(3));
    // A TLS handshake that never starts is cut off by the same timeout.
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "an idle TCP connection was kept");
}

fn write_pair(dir: &Path, certs: &DevCertificates) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    // Written aside and renamed, as the kubelet swaps a Secret volume's files.
    std::fs::write(dir.join("tls.crt.new"), &certs.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key.new"), &certs.key_pem).unwrap();
    std::fs::rename(dir.join("tls.key.new"), &key).unwrap();
    std::fs::rename(dir.join("tls.crt.new"), &cert).unwrap();
    (cert, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_are_served_without_failing_a_request() {
    let first = DevCertificates::generate().unwrap();
    let second = DevCertificates::generate().unwrap();
    let files = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(files.path(), &first);
    std::fs::write(files.path().join("ca.pem"), &first.ca_pem).unwrap();
    let server = start(|c, dir| {
        c.tls = TlsSource::Files { cert: cert.clone(), key: key.clone() };
        c.tls_reload_interval = Duration::from_millis(100);
        std::fs::write(dir.join("ca.pem"), &first.ca_pem).unwrap();
    })
    .await;
    let mut conn = Conn::open(server.addr, first.ca_pem.as_bytes(), false).await;
    let sender = tokio::spawn(async move {
        let mut sent = 0;
        let until = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < until {
            assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK, "request {sent} failed during rotation");
            sent += 1;
        }
        sent
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_pair(files.path(), &second);
    // New handshakes present the new certificate: a client trusting only the new CA gets through...
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Conn::open_with(server.addr, client_config(second.ca_pem.as_bytes(), b"http/1.1", None)).await {
            Ok(mut fresh) => {
                assert_eq!(fresh.review(REVIEW).await.0, StatusCode::OK);
                break;
            }
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("the new certificate was never served: {e}"),
        }
    }
    // ...and one trusting only the old CA no longer does.
    assert!(Conn::open_with(server.addr, client_config(first.ca_pem.as_bytes(), b"http/1.1", None)).await.is_err());
    let sent = sender.await.unwrap();
    assert!(sent > 10, "only {sent} requests were sent during the rotation");
    let (_, metrics) = admin_get(server.metrics, "/metrics").await;
    assert!(counter(&metrics, r#"sidecar_injector_certificate_reloads_total{result="ok"}"#) >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_clients_with_a_certificate_are_served() {
    let client_ca = Authority::generate("API server clients", Duration::from_secs(3600)).unwrap();
    let client_identity = client_ca.issue_client("kube-apiserver", Duration::from_secs(3600)).unwrap();
    let server = start(|c, dir| {
        std::fs::write(dir.join("client-ca.pem"), client_ca.cert_pem()).unwrap();
        c.client_ca = Some(dir.join("client-ca.pem"));
    })
    .await;
    let anonymous = client_config(&server.ca_pem, b"http/1.1", None);
    let refused = match Conn::open_with(server.addr, anonymous).await {
        Err(_) => true,
        // TLS 1.3 reports the refusal on the first read, not in the handshake.
        Ok(mut conn) => conn.send(post("/mutate", "application/json", REVIEW)).await.is_err(),
    };
    assert!(refused, "a client without a certificate was served");
    // A serving certificate of the same CA is not a client certificate.
    let server_identity =
        client_ca.issue_server("impostor", &["localhost".to_owned()], Duration::from_secs(3600)).unwrap();
    let identity = Some((server_identity.cert_pem.as_str(), server_identity.key_pem.as_str()));
    let refused = match Conn::open_with(server.addr, client_config(&server.ca_pem, b"http/1.1", identity)).await {
        Err(_) => true,
        Ok(mut conn) => conn.send(post("/mutate", "application/json", REVIEW)).await.is_err(),
    };
    assert!(refused, "a serving certificate was accepted as a client certificate");
    let identity = Some((client_identity.cert_pem.as_str(), client_identity.key_pem.as_str()));
    let mut conn = Conn::open_with(server.addr, client_config(&server.ca_pem, b"http/1.1", identity)).await.unwrap();
    assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_every_accepted_request_and_exits_in_time() {
    let mut server = start(|c, _| {
        c.shutdown_delay = Duration::from_millis(500);
        c.shutdown_timeout = Duration::from_secs(3);
    })
    .await;
    assert_eq!(admin_get(server.metrics, "/readyz").await.0, 200);
    // Requests whose bodies are still arriving when the signal comes.
    let mut in_flight = Vec::new();
    for _ in 0..8 {
        let mut tls = tls_connect(server.addr, client_config(&server.ca_pem, b"http/1.1", None)).await.unwrap();
        let head = format!(
            "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            REVIEW.len()
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(&REVIEW[..100]).await.unwrap();
        in_flight.push(tls);
    }
    let idle = Conn::open(server.addr, &server.ca_pem, false).await;
    let signalled = Instant::now();
    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(admin_get(server.metrics, "/readyz").await, (503, "shutting down\n".to_owned()));
    for tls in &mut in_flight {
        tls.write_all(&REVIEW[100..]).await.unwrap();
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("\"patchType\":\"JSONPatch\""));
    }
    tokio::time::timeout(Duration::from_secs(4), &mut server.done)
        .await
        .expect("run() did not return in time")
        .unwrap();
    assert!(signalled.elapsed() < Duration::from_secs(4));
    drop(idle);
    assert!(TcpStream::connect(server.addr).await.is_err(), "the listener is still open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_after_requests() {
    let server = start(|_, _| {}).await;
    let injected = r#"sidecar_injector_requests_total{revision="default",result="injected",reason=""}"#;
    let before = counter(&admin_get(server.metrics, "/metrics").await.1, injected);
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    for _ in 0..3 {
        conn.review(REVIEW).await;
    }
    let (status, metrics) = admin_get(server.metrics, "/metrics").await;
    assert_eq!(status, 200);
    assert!(counter(&metrics, injected) >= before + 3.0, "{metrics}");
    // Each request timed under the webhook its path names: three reviews of /mutate, none of /validate.
    let timed = |webhook: &str| {
        counter(&metrics, &format!("sidecar_injector_request_duration_seconds_count{{webhook=\"{webhook}\"}}"))
    };
    assert!(timed("mutate") >= 3.0 && timed("validate") == 0.0, "{metrics}");
    assert!(metrics.contains(r#"sidecar_injector_request_duration_seconds_bucket{webhook="mutate",le="0.00001"}"#));
    assert!(counter(&metrics, r#"sidecar_injector_tls_handshakes_total{result="ok"}"#) >= 1.0);
    assert_eq!(admin_get(server.metrics, "/healthz").await, (200, "ok\n".to_owned()));
}

/// `sidecar-injector certs`: the serving certificate verifies against the CA for the Service's DNS names only,
/// a server started with it is reachable by a client trusting only that CA (at the name the API server uses),
/// and a second run keeps the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certs_writes_a_certificate_the_api_server_will_accept_and_renewal_keeps_the_ca() {
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

    let out = tempfile::tempdir().unwrap();
    let certs = |extra: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["certs", "--service", "hook", "--namespace", "infra", "--out"])
            .arg(out.path())
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(output.status.success(), "{stderr}");
        stderr
    };
    let stderr = certs(&[]);
    assert!(
        stderr.contains("the base deploys Service sidecar-injector"),
        "non-default names are pointed out: {stderr}"
    );
    let read = |file: &str| std::fs::read(out.path().join(file)).unwrap();
    #[cfg(unix)]
    for key in ["ca.key", "tls.key"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(out.path().join(key)).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{key} is private: {mode:o}");
    }
    assert!(String::from_utf8(read(".gitignore")).unwrap().lines().any(|l| l == "*.key"), "keys stay out of git");
    let patch = String::from_utf8(read("webhook-ca-patch.yaml")).unwrap();
    use base64::Engine as _;
    assert!(patch.contains(&base64::engine::general_purpose::STANDARD.encode(read("ca.crt"))), "{patch}");
    let kustomization = String::from_utf8(read("kustomization.yaml")).unwrap();
    assert!(kustomization.contains("manifests/base"), "the overlay builds on the base: {kustomization}");

    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(&read("ca.crt")).unwrap()).unwrap();
    let verifier = WebPkiServerVerifier::builder_with_provider(roots.into(), provider).build().unwrap();
    let verify = |cert: &[u8], name: &str| {
        let cert = CertificateDer::from_pem_slice(cert).unwrap();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        verifier.verify_server_cert(&cert, &[], &name, &[], UnixTime::now()).map(drop)
    };
    let first = read("tls.crt");
    for name in ["hook.infra.svc", "hook.infra.svc.cluster.local"] {
        verify(&first, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(verify(&first, "hook.default.svc").is_err());
    assert!(verify(&first, "localhost").is_err());

    let (cert, key) = (out.path().join("tls.crt"), out.path().join("tls.key"));
    let server = start(|c, dir| {
        c.tls = TlsSource::Files { cert: cert.clone(), key: key.clone() };
        std::fs::write(dir.join("ca.pem"), read("ca.crt")).unwrap();
    })
    .await;
    let trusting = client_config(&read("ca.crt"), b"http/1.1", None);
    let mut conn = Conn::open_as(server.addr, trusting, "hook.infra.svc").await.unwrap();
    assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK);
    let stranger = DevCertificates::generate().unwrap();
    let distrusting = client_config(stranger.ca_pem.as_bytes(), b"http/1.1", None);
    assert!(Conn::open_as(server.addr, distrusting, "hook.infra.svc").await.is_err());

    // Renewal: the same CA, a new certificate it verifies.
    let ca = read("ca.crt");
    let stderr = certs(&["--days", "30"]);
    assert!(stderr.contains("keeping the CA"), "{stderr}");
    assert_eq!(read("ca.crt"), ca);
    assert_ne!(read("tls.crt"), first);
    verify(&read("tls.crt"), "hook.infra.svc").unwrap();
    certs(&["--new-ca"]);
    assert_ne!(read("ca.crt"), ca, "--new-ca replaces it");
}

/// `POST /preview`: a workload review is admitted, with the engine's warnings for its pods, and counted; a
/// broken body is a 400 as on the other paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_admits_workloads_with_warnings_and_counts_them() {
    let server = start(|_, _| {}).await;
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    let deployment = |template: &str| {
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                "namespace": "shop", "operation": "CREATE",
                "object": {
                    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                    "spec": {"template": {
                        "metadata": {"annotations": {"sidecar-injector.io/template": template}},
                        "spec": {"containers": [{"name": "app", "image": "web:1"}]}
                    }}
                }
            }
        })
    };
    let preview = |review: serde_json::Value| {
        post("/preview?timeout=5s", "application/json", &serde_json::to_vec(&review).unwrap())
    };
    let (status, body) = conn.send(preview(deployment("nope"))).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (&answer["response"]["uid"], &answer["response"]["allowed"]),
        (&serde_json::json!("u-1"), &serde_json::json!(true))
    );
    let warnings = answer["response"]["warnings"].as_array().unwrap();
    assert!(warnings.len() == 1 && warnings[0].as_str().unwrap().starts_with("Deployment shop/web: "), "{answer}");
    let (_, body) = conn.send(preview(deployment("default"))).await.unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(answer["response"].get("warnings").is_none(), "{answer}");
    let (status, _) = conn.send(post("/preview", "application/json", b"{\"kind\":")).await.unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let metrics = admin_get(server.metrics, "/metrics").await.1;
    for (result, count) in [("warned", 1.0), ("clean", 1.0), ("not-previewed", 0.0)] {
        let series = format!(r#"sidecar_injector_previews_total{{revision="default",result="{result}"}}"#);
        assert_eq!(counter(&metrics, &series), count, "{series}");
    }
}

/// A pod asking for a combination of templates first: the server assembles it (off its async workers, as every
/// set the server serves is served) and answers with both templates injected on that first review, on `/mutate`
/// and in a workload's preview alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_combination_first_asked_for_is_assembled_and_answered_at_once() {
    let settings = sidecar_injector_core::Settings::default();
    let extra = "pod:\n  spec:\n    containers:\n      - name: extra\n        image: extra:1\n";
    let sources = sidecar_injector_core::SetSources {
        origin: "test".into(),
        templates: vec![
            ("default".into(), "default.yaml".into(), sidecar_injector_core::template::BUILTIN_SOURCE.into()),
            ("extra".into(), "extra.yaml".into(), extra.into()),
        ],
        values: None,
        ignored: Vec::new(),
    };
    let set = sidecar_injector_core::TemplateSet::compile(sources, "default", &settings).unwrap();
    let served = Arc::new(sidecar_injector::server::serving::Served::default());
    let engine = sidecar_injector_core::Engine::new(set, &settings).with_serving(served);
    let engine = Arc::new(arc_swap::ArcSwap::from_pointee(engine));
    let server = start_with(engine, |_, _| {}).await;
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    let pod = serde_json::json!({
        "metadata": {"name": "web", "annotations": {"sidecar-injector.io/template": "default,extra"}},
        "spec": {"containers": [{"name": "app", "image": "web:1"}]}
    });
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-2", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "shop",
                    "operation": "CREATE", "object": pod}
    });
    for round in 0..2 {
        let (status, body) = conn.review(&serde_json::to_vec(&review).unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let patch = answer["response"]["patch"].as_str().unwrap_or_else(|| panic!("round {round}: {answer}"));
        let patch =
            String::from_utf8(base64::Engine::decode(&base64::prelude::BASE64_STANDARD, patch).unwrap()).unwrap();
        assert!(patch.contains(r#""name":"extra""#) && patch.contains("sidecar"), "round {round}: {patch}");
    }
    let deployment = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-3", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"}, "namespace": "shop",
            "operation": "CREATE",
            "object": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                       "spec": {"template": {"metadata": {"annotations": {"sidecar-injector.io/template": "extra,default"}},
                                             "spec": {"containers": [{"name": "app", "image": "web:1"}]}}}}
        }
    });
    let request = post("/preview?timeout=5s", "application/json", &serde_json::to_vec(&deployment).unwrap());
    let (status, body) = conn.send(request).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"].get("warnings").is_none(), "a clean preview of a new combination: {answer}");
}

/// `POST /validate` beside `/mutate`: the mutated pod passes, the raw one is refused with the reason, and the
/// validations are counted by result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_refuses_what_mutate_would_still_add_and_counts_it() {
    use base64::Engine as _;
    let server = start(|_, _| {}).await;
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    let validate = |body: Vec<u8>| post("/validate?timeout=5s", "application/json", &body);

    let (status, body) = conn.send(validate(REVIEW.to_vec())).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["code"], 403);
    assert!(answer["response"]["status"]["message"].as_str().unwrap().contains("container proxy"), "{answer}");

    // The pod as /mutate leaves it passes /validate.
    let (_, mutated) = conn.review(REVIEW).await;
    let mutated: serde_json::Value = serde_json::from_slice(&mutated).unwrap();
    let patch =
        base64::engine::general_purpose::STANDARD.decode(mutated["response"]["patch"].as_str().unwrap()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut review: serde_json::Value = serde_json::from_slice(REVIEW).unwrap();
    json_patch::patch(&mut review["request"]["object"], &patch).unwrap();
    let (status, body) = conn.send(validate(serde_json::to_vec(&review).unwrap())).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");

    let (status, body) = conn.send(post("/nope", "application/json", b"{}")).await.unwrap();
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        "not found: the webhooks are at POST /mutate, POST /validate and POST /preview, each also through a revision \
         tag as PATH/tag/TAG\n"
    );

    let metrics = admin_get(server.metrics, "/metrics").await.1;
    assert_eq!(
        counter(&metrics, r#"sidecar_injector_validations_total{revision="default",result="missing",reason="denied"}"#),
        1.0
    );
    assert_eq!(
        counter(&metrics, r#"sidecar_injector_validations_total{revision="default",result="ok",reason=""}"#),
        1.0
    );
    assert_eq!(
        counter(&metrics, r#"sidecar_injector_requests_total{revision="default",result="injected",reason=""}"#),
        1.0,
        "validations are not injections"
    );
}

/// Waits up to 5 s for `check` to hold, polling.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(Instant::now() < until, "{what}: not within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that sends the headers of a large body and most of it, waits until the request is in flight, then
/// sends the rest and goes away at once: hyper reads the whole body, finds the connection closed before the
/// handler has read the end of it, and drops the request's future unanswered. The in-flight gauge must still come
/// back down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_request_leaves_no_request_in_flight() {
    let server = start(|_, _| {}).await;
    let in_flight =
        async || counter(&admin_get(server.metrics, "/metrics").await.1, "sidecar_injector_requests_in_flight");
    assert_eq!(in_flight().await, 0.0);
    let body = vec![b' '; 256 * 1024];
    let (most, rest) = body.split_at(body.len() - 64 * 1024);
    for round in 0..5 {
        let mut tls = tls_connect(server.addr, client_config(&server.ca_pem, b"http/1.1", None)).await.unwrap();
        let head = format!(
            "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(most).await.unwrap();
        tls.flush().await.unwrap();
        eventually("the request is in flight", async || in_flight().await == 1.0).await;
        tls.write_all(rest).await.unwrap();
        tls.flush().await.unwrap();
        drop(tls);
        eventually(&format!("round {round}: the gauge back at 0 after the disconnect"), async || {
            in_flight().await == 0.0
        })
        .await;
    }
}

/// With every connection permit held when shutdown begins, a connection made during the shutdown delay is not
/// dropped: it waits for a permit and, once one frees within the delay, is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_made_during_the_shutdown_delay_waits_for_a_permit_and_is_answered() {
    let mut server = start(|c, _| {
        c.max_connections = 1;
        c.shutdown_delay = Duration::from_secs(2);
        c.shutdown_timeout = Duration::from_secs(5);
    })
    .await;
    // The only permit: an open keep-alive connection.
    let mut holder = Conn::open(server.addr, &server.ca_pem, false).await;
    assert_eq!(holder.review(REVIEW).await.0, StatusCode::OK);
    server.stop.take().unwrap().send(()).unwrap();
    eventually("readiness turns 503", async || admin_get(server.metrics, "/readyz").await.0 == 503).await;
    let (addr, ca) = (server.addr, server.ca_pem.clone());
    let late = tokio::spawn(async move {
        let mut conn = Conn::open_with(addr, client_config(&ca, b"http/1.1", None)).await?;
        conn.send(post("/mutate?timeout=10s", "application/json", REVIEW)).await.map(|(status, _)| status)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(holder); // its permit frees within the delay
    let answered = tokio::time::timeout(Duration::from_secs(4), late).await.expect("the late connection hung");
    assert_eq!(answered.unwrap(), Ok(StatusCode::OK));
    tokio::time::timeout(Duration::from_secs(6), &mut server.done).await.expect("run() did not return").unwrap();
}

/// A client that completes TLS with ALPN h2 and then says nothing (or only the preface and SETTINGS) held its
/// connection slot for ever: hyper waits for the preface, and then for requests, without a deadline. Now the
/// first request must arrive within the header read timeout of the accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_h2_connection_is_closed_within_the_header_read_timeout() {
    let timeout = Duration::from_millis(500);
    let server = start(|c, _| c.header_read_timeout = timeout).await;
    let mut silent = tls_connect(server.addr, client_config(&server.ca_pem, b"h2", None)).await.unwrap();
    assert_eq!(silent.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let took = closed_within(&mut silent, Duration::from_secs(5)).await.expect("a silent h2 connection was kept");
    assert!(took < timeout + Duration::from_millis(1500), "closed after {took:?}");
    // The preface and SETTINGS are not a request either.
    let mut settled = tls_connect(server.addr, client_config(&server.ca_pem, b"h2", None)).await.unwrap();
    settled.write_all(H2_PREFACE_AND_SETTINGS).await.unwrap();
    let took = closed_within(&mut settled, Duration::from_secs(5)).await.expect("an h2 connection without requests");
    assert!(took < timeout + Duration::from_millis(1500), "closed after {took:?}");
    let metrics = admin_get(server.metrics, "/metrics").await.1;
    assert!(counter(&metrics, r#"sidecar_injector_connection_errors_total{kind="timeout"}"#) >= 2.0, "{metrics}");
    // An h2 client that does send its request is served.
    let mut conn = Conn::open(server.addr, &server.ca_pem, true).await;
    assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK);
}

/// `--max-connections` silent connections (TLS done, ALPN h2, nothing more) do not lock out the API server: they
/// are closed at the header read timeout, and a real review waiting in the backlog is then answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_filling_every_slot_delay_a_review_by_the_header_read_timeout_only() {
    let timeout = Duration::from_secs(1);
    let server = start(|c, _| {
        c.max_connections = 4;
        c.header_read_timeout = timeout;
    })
    .await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(tls_connect(server.addr, client_config(&server.ca_pem, b"h2", None)).await.unwrap());
    }
    let started = Instant::now();
    let review = async {
        let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
        conn.review(REVIEW).await.0
    };
    let status = tokio::time::timeout(Duration::from_secs(5), review).await.expect("the review waited for ever");
    assert_eq!(status, StatusCode::OK);
    assert!(started.elapsed() < timeout + Duration::from_secs(2), "answered after {:?}", started.elapsed());
    drop(silent);
}

/// A keep-alive connection is kept while idle for longer than the header read timeout (hyper's header timer, which
/// also ran while a connection was idle, closed it then), and closed after the idle timeout: HTTP/1.1 and HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_outlive_the_header_timeout_and_close_at_the_idle_timeout() {
    let server = start(|c, _| {
        c.header_read_timeout = Duration::from_millis(300);
        c.idle_timeout = Duration::from_millis(1500);
    })
    .await;
    for h2 in [false, true] {
        let mut conn = Conn::open(server.addr, &server.ca_pem, h2).await;
        assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK, "h2={h2}: idle 800 ms, past the header timeout");
        let idle = conn.closed_within(Duration::from_secs(5)).await;
        let idle = idle.unwrap_or_else(|| panic!("h2={h2}: an idle connection was kept"));
        assert!(idle >= Duration::from_millis(1300), "h2={h2}: closed after {idle:?} idle, before the idle timeout");
    }
    // The headers of a later request still have the header read timeout, from their first byte.
    let mut tls = tls_connect(server.addr, client_config(&server.ca_pem, b"http/1.1", None)).await.unwrap();
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        REVIEW.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(REVIEW).await.unwrap();
    let mut answer = vec![0; 64];
    tls.read_exact(&mut answer).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let took = closed_within(&mut tls, Duration::from_secs(3)).await.expect("slow headers were waited for");
    assert!(took < Duration::from_millis(1200), "slow headers cut after {took:?}, not the header timeout");
}

/// An idle timeout shorter than the header read timeout is kept from the first request on: the connection's driver
/// does not wait for the first request's deadline to pass before it looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_timeout_shorter_than_the_header_timeout_closes_at_the_idle_timeout() {
    let server = start(|c, _| {
        c.header_read_timeout = Duration::from_secs(4);
        c.idle_timeout = Duration::from_millis(400);
    })
    .await;
    for h2 in [false, true] {
        let mut conn = Conn::open(server.addr, &server.ca_pem, h2).await;
        assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK);
        let idle = conn.closed_within(Duration::from_secs(3)).await;
        let idle = idle.unwrap_or_else(|| panic!("h2={h2}: kept past the idle timeout"));
        assert!(idle >= Duration::from_millis(300), "h2={h2}: closed after {idle:?}, before the idle timeout");
    }
}

/// Large bodies that stall halfway cannot take more memory than the in-flight body budget: each holds what has
/// arrived, as long as the budget has room; those it cannot hold wait and get 503 with `Retry-After`, and a small
/// review is answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_large_bodies_stay_within_the_body_budget_while_small_reviews_are_answered() {
    // Each body is held twice (the buffer parsed and the copy kept for a second review): six halves of 400 KiB
    // bodies do not all fit.
    const BUDGET: usize = 2 * 1024 * 1024;
    let server = start(|c, _| {
        c.max_body_bytes = 512 * 1024;
        c.max_inflight_body_bytes = BUDGET;
    })
    .await;
    let gauge =
        async || counter(&admin_get(server.metrics, "/metrics").await.1, "sidecar_injector_inflight_body_bytes");
    assert_eq!(gauge().await, 0.0);
    let large = 400 * 1024;
    let mut stalled = Vec::new();
    for _ in 0..6 {
        let mut tls = tls_connect(server.addr, client_config(&server.ca_pem, b"http/1.1", None)).await.unwrap();
        let head = format!(
            "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {large}\r\n\r\n"
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(&vec![b' '; 200 * 1024]).await.unwrap();
        tls.flush().await.unwrap();
        stalled.push(tls);
    }
    let mut highest = 0.0f64;
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let now = gauge().await;
        assert!(now <= BUDGET as f64, "{now} body bytes in flight, over the budget of {BUDGET}");
        highest = highest.max(now);
        let started = Instant::now();
        assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK, "a small review beside the stalled bodies");
        assert!(started.elapsed() < Duration::from_millis(500), "a small review waited {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(highest >= BUDGET as f64 / 2.0, "the bodies that fit hold their bytes: at most {highest}");
    // The bodies that did not fit were refused; those that did are still waiting for their bytes.
    let mut refused = 0;
    for tls in &mut stalled {
        let mut answer = vec![0; 1024];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(200), tls.read(&mut answer)).await {
            let answer = String::from_utf8_lossy(&answer[..n]).to_lowercase();
            assert!(answer.starts_with("http/1.1 503") && answer.contains("retry-after: 1"), "{answer}");
            refused += 1;
        }
    }
    assert!((1..6).contains(&refused), "some were refused, some fit: {refused} refused");
    let metrics = admin_get(server.metrics, "/metrics").await.1;
    let overloaded = counter(&metrics, r#"sidecar_injector_requests_total{result="error",reason="overloaded"}"#);
    assert_eq!(overloaded, refused as f64);
    drop(stalled);
    eventually("the budget is released when the clients go", async || gauge().await == 0.0).await;
}

/// What a client loop saw: requests written and requests answered, and how it saw the shutdown.
#[derive(Debug, Default)]
struct Tally {
    written: u64,
    answered: u64,
    connections: u64,
    /// HTTP/1.1 answers received after the signal that did not say `Connection: close`.
    kept_open_after_signal: u64,
    errors: Vec<String>,
}

/// Posts reviews in a keep-alive loop until a connection is refused (or 10 s pass). A request the connection
/// gives back unwritten (closed before it) or that a GOAWAY refused (never processed) is sent again on a new
/// connection; any other failure of a written request is a lost request.
async fn review_loop(
    addr: std::net::SocketAddr,
    ca: Vec<u8>,
    h2: bool,
    signalled: Arc<std::sync::OnceLock<Instant>>,
) -> Tally {
    use hyper::client::conn::{http1, http2};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let mut tally = Tally::default();
    let until = Instant::now() + Duration::from_secs(10);
    let request = || post("/mutate?timeout=10s", "application/json", REVIEW);
    'connections: while Instant::now() < until {
        let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
        let Ok(tls) = tls_connect(addr, client_config(&ca, alpn, None)).await else { break };
        tally.connections += 1;
        let io = TokioIo::new(tls);
        enum Sender {
            H1(http1::SendRequest<Full<Bytes>>),
            H2(http2::SendRequest<Full<Bytes>>),
        }
        let mut sender = if h2 {
            let Ok((send, conn)) = http2::handshake(TokioExecutor::new(), io).await else { break };
            tokio::spawn(conn);
            Sender::H2(send)
        } else {
            let Ok((send, conn)) = http1::handshake(io).await else { break };
            tokio::spawn(conn);
            Sender::H1(send)
        };
        while Instant::now() < until {
            let sent = match &mut sender {
                Sender::H1(s) => match s.ready().await {
                    Ok(()) => s.try_send_request(request()).await,
                    Err(_) => continue 'connections,
                },
                Sender::H2(s) => match s.ready().await {
                    Ok(()) => s.try_send_request(request()).await,
                    Err(_) => continue 'connections,
                },
            };
            let response = match sent {
                Ok(response) => response,
                Err(mut e) => {
                    if e.take_message().is_some() || refused_by_goaway(e.error()) {
                        continue 'connections;
                    }
                    tally.written += 1;
                    tally.errors.push(format!("h2={h2}: {:?}", e.error()));
                    continue 'connections;
                }
            };
            tally.written += 1;
            let close = response.headers().get("connection").is_some_and(|v| v == "close");
            let status = response.status();
            match response.into_body().collect().await {
                Ok(_) if status == StatusCode::OK => tally.answered += 1,
                Ok(_) => tally.errors.push(format!("h2={h2}: status {status}")),
                Err(e) => tally.errors.push(format!("h2={h2}: body: {e}")),
            }
            if !h2 && !close && signalled.get().is_some_and(|at| at.elapsed() > Duration::from_millis(50)) {
                tally.kept_open_after_signal += 1;
            }
            if close {
                continue 'connections;
            }
        }
    }
    tally
}

/// Posts reviews on one stream after another of a shared HTTP/2 connection until it ends: what was written and
/// what answered (a stream refused unprocessed is neither).
async fn streams_loop(mut send: hyper::client::conn::http2::SendRequest<Full<Bytes>>) -> Tally {
    let mut tally = Tally { connections: 1, ..Tally::default() };
    while send.ready().await.is_ok() {
        let response = match send.try_send_request(post("/mutate?timeout=10s", "application/json", REVIEW)).await {
            Ok(response) => response,
            Err(mut e) => {
                if e.take_message().is_some() || refused_by_goaway(e.error()) || never_sent(e.error()) {
                    break;
                }
                tally.written += 1;
                tally.errors.push(format!("{:?}", e.error()));
                break;
            }
        };
        tally.written += 1;
        let status = response.status();
        match response.into_body().collect().await {
            Ok(_) if status == StatusCode::OK => tally.answered += 1,
            Ok(_) => tally.errors.push(format!("status {status}")),
            Err(e) => tally.errors.push(format!("body: {e}")),
        }
    }
    tally
}

/// A request the client's connection task never sent: the task ended (the server's GOAWAY answered, the
/// connection closed) while the request waited for h2 to open its stream, and hyper dropped it unsent
/// (`DispatchGone`, "runtime dropped the dispatch task"; a request h2 had sent would fail with h2's error instead).
/// Seen on a busy machine (the whole suite at once, 2 runs in 8): never written, never processed, safe to send
/// again, like a refusal.
fn never_sent(error: &hyper::Error) -> bool {
    error.is_user() && error.to_string().contains("dispatch task")
}

/// A stream the server refused by GOAWAY (above its last stream id) or REFUSED_STREAM: never processed, safe
/// to send again.
fn refused_by_goaway(error: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(e) = e.downcast_ref::<h2::Error>() {
            return e.reason() == Some(h2::Reason::REFUSED_STREAM)
                || (e.is_go_away() && e.is_remote() && e.reason() == Some(h2::Reason::NO_ERROR));
        }
        source = e.source();
    }
    false
}

/// Clients posting reviews in keep-alive loops, over HTTP/1.1 and HTTP/2, while the server shuts down: every
/// request written is answered. During the delay each HTTP/1.1 answer says `Connection: close` (the client opens
/// a new connection, no request is ever written on a connection that is being closed) and each HTTP/2 connection
/// gets a GOAWAY (the client moves to a new connection); when the listener closes, connections finish their
/// requests and the clients' next connections are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_under_keep_alive_load_loses_no_request() {
    let mut server = start(|c, _| {
        c.shutdown_delay = Duration::from_secs(1);
        c.shutdown_timeout = Duration::from_secs(5);
    })
    .await;
    let signalled = Arc::new(std::sync::OnceLock::new());
    let clients: Vec<_> = [false, false, false, false, true]
        .into_iter()
        .map(|h2| tokio::spawn(review_loop(server.addr, server.ca_pem.clone(), h2, signalled.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    signalled.set(Instant::now()).unwrap();
    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(6), &mut server.done).await.expect("run() did not return").unwrap();
    let mut total = (0, 0);
    for (i, client) in clients.into_iter().enumerate() {
        let tally = tokio::time::timeout(Duration::from_secs(5), client).await.expect("a client hung").unwrap();
        eprintln!("client {i}: {tally:?}");
        assert!(tally.errors.is_empty(), "client {i}: {:?}", tally.errors);
        assert_eq!(tally.written, tally.answered, "client {i}: requests written and not answered");
        assert_eq!(
            tally.kept_open_after_signal, 0,
            "client {i}: HTTP/1.1 answers during the delay kept the connection"
        );
        assert!(tally.connections >= 2, "client {i}: the shutdown moved it to a new connection: {tally:?}");
        total = (total.0 + tally.written, total.1 + tally.answered);
    }
    assert!(total.0 > 50, "{total:?}");
}

/// Issue 51, item 6: the same over HTTP/2 on a busy machine (threads spinning on every core beside the server, and
/// many concurrent clients each with its own connection): the drain must not depend on the load. Every request
/// written is answered, or refused unprocessed (a GOAWAY's or REFUSED_STREAM, which a client sends again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_under_http2_load_on_a_busy_machine_loses_no_request() {
    let mut server = start(|c, _| {
        c.shutdown_delay = Duration::from_secs(1);
        c.shutdown_timeout = Duration::from_secs(8);
    })
    .await;
    let spinning = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let spinners: Vec<_> = (0..std::thread::available_parallelism().map_or(2, |n| n.get()))
        .map(|_| {
            let spinning = spinning.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while spinning.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            })
        })
        .collect();
    let signalled = Arc::new(std::sync::OnceLock::new());
    let mut clients: Vec<_> = (0..8)
        .map(|_| tokio::spawn(review_loop(server.addr, server.ca_pem.clone(), true, signalled.clone())))
        .collect();
    // And connections with eight streams at once each, when the GOAWAY comes.
    for _ in 0..4 {
        let tls = tls_connect(server.addr, client_config(&server.ca_pem, b"h2", None)).await.unwrap();
        let (send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        for _ in 0..8 {
            clients.push(tokio::spawn(streams_loop(send.clone())));
        }
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    signalled.set(Instant::now()).unwrap();
    server.stop.take().unwrap().send(()).unwrap();
    let done = tokio::time::timeout(Duration::from_secs(12), &mut server.done).await;
    spinning.store(false, std::sync::atomic::Ordering::Relaxed);
    spinners.into_iter().for_each(|s| s.join().unwrap());
    done.expect("run() did not return").unwrap();
    let mut total = (0, 0);
    for (i, client) in clients.into_iter().enumerate() {
        let tally = tokio::time::timeout(Duration::from_secs(5), client).await.expect("a client hung").unwrap();
        assert!(tally.errors.is_empty(), "client {i}: {:?}", tally.errors);
        assert_eq!(tally.written, tally.answered, "client {i}: requests written and not answered");
        total = (total.0 + tally.written, total.1 + tally.answered);
    }
    eprintln!("HTTP/2 clients on a busy machine: {} written, {} answered", total.0, total.1);
    assert!(total.0 > 50, "{total:?}");
}

/// Clients that fail the TLS handshake and HTTP/2 connections that flood resets (CVE-2023-44487) are counted by
/// kind, and the log shows one summary line, not a warning per connection (h2 and rustls log one of their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_errors_are_counted_by_kind_and_summarised_not_logged_per_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Process::spawn(dir.path());
    let (addr, metrics, ca) = (server.addr, server.metrics, server.ca.clone());
    for _ in 0..10 {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        closed_within(&mut tcp, Duration::from_secs(5)).await.expect("plain HTTP on the TLS port was kept");
    }
    for _ in 0..3 {
        let mut tls = tls_connect(addr, client_config(&ca, b"h2", None)).await.unwrap();
        let mut flood = H2_PREFACE_AND_SETTINGS.to_vec();
        for i in 0..200u32 {
            let stream = 2 * i + 1;
            // HEADERS (END_HEADERS): POST, https, / from the static table; then RST_STREAM (CANCEL).
            flood.extend(h2_frame(0x1, 0x4, stream, &[0x83, 0x87, 0x84]));
            flood.extend(h2_frame(0x3, 0x0, stream, &8u32.to_be_bytes()));
        }
        let _ = tls.write_all(&flood).await;
        closed_within(&mut tls, Duration::from_secs(5)).await.expect("a reset flood was served");
    }
    let kinds = async || {
        let text = admin_get(metrics, "/metrics").await.1;
        let kind = |k: &str| counter(&text, &format!("sidecar_injector_connection_errors_total{{kind=\"{k}\"}}"));
        (kind("tls-handshake"), kind("http2"))
    };
    eventually("the errors are counted", async || kinds().await == (10.0, 3.0)).await;
    // The first error is reported at once; the others wait for the end of the interval (10 s), after the kill.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = server.kill();
    let warnings: Vec<&String> = log.iter().filter(|l| l.contains("WARN")).collect();
    let per_connection: Vec<&&String> =
        warnings.iter().filter(|l| l.contains("h2::") || l.contains("rustls::") || l.contains("peer")).collect();
    assert!(per_connection.is_empty(), "warnings per connection: {per_connection:#?}");
    let summaries = warnings.iter().filter(|l| l.contains("connections ended by errors")).count();
    assert_eq!(summaries, 1, "one summary line in the interval: {warnings:#?}");
}

/// `--max-connection-age`: a connection older than it is ended after an answer, never mid-request: over HTTP/1.1
/// the first answer past the age says `Connection: close` and the server then closes; over HTTP/2 a GOAWAY ends the
/// connection once its streams are answered. Before the age, keep-alive as usual; with the setting off (the
/// default), a connection is kept past that age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_older_than_the_maximum_age_end_after_an_answer() {
    let server = start(|c, _| c.max_connection_age = Duration::from_millis(600)).await;
    // HTTP/1.1, by hand, to see the answer's headers.
    let mut tls = tls_connect(server.addr, client_config(&server.ca_pem, b"http/1.1", None)).await.unwrap();
    assert!(!h1_review_says_close(&mut tls).await);
    assert!(!h1_review_says_close(&mut tls).await);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(h1_review_says_close(&mut tls).await, "the first answer past the age closes");
    assert!(closed_within(&mut tls, Duration::from_secs(3)).await.is_some(), "closed after the Connection: close");

    // HTTP/2: answered, then a GOAWAY at the age.
    let mut conn = Conn::open(server.addr, &server.ca_pem, true).await;
    assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK);
    assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK);
    let ended = conn.closed_within(Duration::from_secs(3)).await.expect("an HTTP/2 connection past its age ends");
    assert!(ended >= Duration::from_millis(300), "ended after {ended:?}, before its age");

    // Off (the default): kept past that age.
    let server = start(|_, _| {}).await;
    for h2 in [false, true] {
        let mut conn = Conn::open(server.addr, &server.ca_pem, h2).await;
        assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK, "h2={h2}");
        assert!(conn.closed_within(Duration::from_millis(300)).await.is_none(), "h2={h2}: closed without an age");
    }
}

/// Sends one review over a raw HTTP/1.1 connection and reads its answer (200): whether it says `Connection: close`.
async fn h1_review_says_close(tls: &mut (impl AsyncReadExt + AsyncWriteExt + Unpin)) -> bool {
    let request = format!(
        "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        REVIEW.len()
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    tls.write_all(REVIEW).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tls.read_u8().await.unwrap());
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    let length = head.split("content-length: ").nth(1).unwrap().split("\r\n").next().unwrap();
    let mut body = vec![0; length.parse().unwrap()];
    tls.read_exact(&mut body).await.unwrap();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    head.contains("connection: close")
}

/// Issue 51, 2: the budget holds what has arrived, not what `Content-Length` announces. Connections announcing
/// bodies that would fill the budget and sending nothing used to take all of it until their deadline, and every
/// review beside them got 503 (`/validate` fails closed: pod creation refused in every injected namespace). Now
/// each holds one step, and a review is answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_announced_and_never_sent_do_not_hold_the_budget() {
    const BUDGET: usize = 4 * 1024 * 1024;
    let server = start(|c, _| {
        c.max_body_bytes = 1024 * 1024;
        c.max_inflight_body_bytes = BUDGET;
    })
    .await;
    let mut silent = Vec::new();
    for _ in 0..8 {
        let mut tls = tls_connect(server.addr, client_config(&server.ca_pem, b"http/1.1", None)).await.unwrap();
        let head =
            "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n";
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.flush().await.unwrap();
        silent.push(tls);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held = counter(&admin_get(server.metrics, "/metrics").await.1, "sidecar_injector_inflight_body_bytes");
    assert!(held <= (8 * 2 * 64 * 1024 + 8 * 64) as f64, "{held} bytes held for bodies not sent");
    let mut conn = Conn::open(server.addr, &server.ca_pem, false).await;
    for _ in 0..5 {
        let started = Instant::now();
        assert_eq!(conn.review(REVIEW).await.0, StatusCode::OK, "a review beside the silent bodies");
        assert!(started.elapsed() < Duration::from_millis(500), "a review waited {:?}", started.elapsed());
    }
    drop(silent);
}
