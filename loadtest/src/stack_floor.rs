//! THE STACK FLOOR: the server stack the injector is built on with nothing of the injector in it, to measure in
//! the same run what a request costs hyper + rustls + tokio alone (`--start-floor`; `loadtest __floor-server`).
//! Ours ÷ floor is then the cost of everything we add (reading the body into one buffer, the engine, metrics,
//! deadlines); baseline ÷ floor the same for the baseline. It is part of the harness only, never of the injector.
//!
//! It is set up as `serve` sets up its server (src/server/mod.rs, src/server/tls.rs), and nothing more: rustls
//! with the aws-lc-rs provider (the same crate, so the same features, post-quantum key exchange preference
//! included), TLS 1.3 and 1.2, ALPN `h2` then `http/1.1`; `TCP_NODELAY`, and reads of a whole TLS record at once
//! (the same read-ahead buffer); hyper-util's auto builders, HTTP/1.1 with keep-alive and no header timer, HTTP/2
//! with the same stream limits and pings, chosen by ALPN; a multi-threaded tokio runtime with one worker per
//! CPU it may use (one, pinned as the harness pins). Each POST to the path has its body read to the end, frame
//! by frame, without being gathered anywhere, and is answered `200 OK`, `Content-Type: application/json`, with a
//! fixed answer held in memory (a reference-counted `Bytes`: no copy). Any other path gets 404, as from the
//! injector; that is also how a test makes it answer wrongly.
//!
//! **The answer is ours, to the byte.** At start the harness gives every body it will send, as loaded (the
//! placeholder uid; a generated pod's placeholder name, as long as every stamped one) to the injector's own engine
//! (the built-in template, `serve`'s default settings) and hands the answers to the floor in a file, one per line.
//! So the floor writes exactly as many bytes per request as ours does (the report's `mean_answer_bytes` shows it)
//! and TLS, hyper and the kernel carry the same traffic for both. With several bodies (`--bodies corpus`) the
//! harness names the body in a header ([`BODY_HEADER`], to the floor only) so that the floor can answer it
//! without reading it.
//!
//! **Every answer is checked** without the floor doing review work: it cannot echo each request's uid without
//! finding it in the body, so each fixed answer is checked once at start as a correct answer to its body (uid,
//! `allowed`, a patch of `add` operations that applies to the pod and leaves a valid Pod), and then every answer
//! of the floor must be that answer byte for byte, with status 200 and the JSON content type
//! (`check::FixedAnswers`). A floor that answers anything else is counted as wrong, as any other target.

use std::convert::Infallible;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sidecar_injector_core::{Engine, PARSE_PADDING, Settings, TemplateSet};

use crate::bodies::{Body, UID_PLACEHOLDER};
use crate::check::FixedAnswers;
use crate::client::BODY_HEADER;

/// Bytes read from a connection's socket at once: a full TLS record, as `serve` reads (src/server/mod.rs).
const READ_AHEAD: usize = 16 * 1024 + 512;

/// `serve`'s HTTP/2 limits and pings (src/server/mod.rs), so that both servers speak HTTP/2 alike.
const H2_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// After a failed `accept`, wait this long before the next, as `serve` does.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// `loadtest __floor-server`: where to listen, with which certificate, and what to answer. The last of a flag
/// given twice wins, so that `--floor-arg` can override what the harness passes (`--floor-arg=--answers=FILE`).
#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
pub struct FloorServerArgs {
    /// Where to listen and with which certificate, as the baseline.
    #[command(flatten)]
    pub server: crate::baseline::BaselineArgs,
    /// The answers, one per line: to each body the harness sends, in its order.
    #[arg(long, required_unless_present = "allow_all")]
    pub answers: Option<PathBuf>,
    /// Instead of fixed answers, allow every review with nothing changed: the do-nothing webhook a cluster calls
    /// (its `request.uid` found in the body and echoed, as the API server requires; the review not parsed), the
    /// floor beside our webhooks in the cluster's measurement (tests/cluster.rs, docs/performance.md).
    #[arg(long, conflicts_with = "answers")]
    pub allow_all: bool,
    /// With --allow-all: answer this JSON Patch (a file, as our webhook would answer the pods the cluster's
    /// measurement creates), so that the API server applies the same patch after the floor as after ours.
    #[arg(long, requires = "allow_all")]
    pub patch: Option<PathBuf>,
    /// With --patch: no patch for a review whose body contains this text (the patch's own status annotation key:
    /// the API server's second call, after it mounted the service account token into the added sidecar, and a pod
    /// already injected, get none, as from ours).
    #[arg(long, requires = "patch")]
    pub unless_body_contains: Option<String>,
    /// The path answered; any other gets 404.
    #[arg(long, default_value = "/mutate")]
    pub path: String,
    /// After reading each body, write and read back this many KiB of a per-thread buffer (0: none). The engine's
    /// parse touches about 3.3 bytes per byte of a review (the body, simd-json's structural indexes and tape)
    /// between two requests; this asks whether memory touched there costs the stack more than the touch itself
    /// (`--floor-arg=--touch-kib=200` beside `--bodies 60k`; docs/performance.md).
    #[arg(long, default_value_t = 0)]
    pub touch_kib: usize,
    /// After reading each body, spend this many nanoseconds of the thread's CPU time doing nothing (0: none). The
    /// harness's floor at our pace: held busy as long as our engine computes, the floor answers at our rate, and
    /// its client waits between answers as ours does (docs/performance.md, "The stack at our pace").
    #[arg(long, default_value_t = 0)]
    pub busy_ns: u64,
}

/// The engine whose answers the floor gives: the built-in template, `serve`'s default settings. The accounting's
/// engine in process ([`crate::engine_cost`]) is this one too.
pub fn answering_engine() -> Result<Engine, String> {
    let settings = Settings::default();
    let set = TemplateSet::builtin(&settings).map_err(|e| format!("the built-in template: {e}"))?;
    Ok(Engine::new(set, &settings))
}

/// The injector's answers to `bodies` as loaded, by `webhook`, from its own engine with the built-in template and
/// `serve`'s default settings; each is checked as a correct answer to its body.
pub fn fixed_answers(bodies: &[Body], webhook: crate::bodies::Webhook) -> Result<FixedAnswers, String> {
    let engine = answering_engine()?;
    let mut answers = Vec::with_capacity(bodies.len());
    for body in bodies {
        let review = body.unstamped();
        let mut buf = Vec::with_capacity(review.len() + PARSE_PADDING);
        buf.extend_from_slice(review);
        let mut out = Vec::new();
        webhook.answer(&engine, &mut buf, &mut out).map_err(|e| format!("the engine refused {}: {e}", body.name))?;
        answers.push(Bytes::from(out));
    }
    let pods: Vec<(&str, &serde_json::Value)> = bodies.iter().map(|b| (b.name.as_str(), &b.pod)).collect();
    FixedAnswers::new(answers, UID_PLACEHOLDER, &pods)
}

/// Writes `answers` to `path`, one per line (compact JSON has no line break of its own).
pub fn write_answers(path: &Path, answers: &[Bytes]) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(fail)?);
    for answer in answers {
        if answer.contains(&b'\n') {
            return Err("an answer has a line break; the answers file holds one per line".into());
        }
        file.write_all(answer).and_then(|()| file.write_all(b"\n")).map_err(fail)?;
    }
    file.flush().map_err(fail)
}

fn read_answers(path: &Path) -> Result<Vec<Bytes>, String> {
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let file = std::io::BufReader::new(std::fs::File::open(path).map_err(fail)?);
    let answers = file.lines().map(|line| line.map(Bytes::from)).collect::<Result<Vec<_>, _>>().map_err(fail)?;
    if answers.is_empty() {
        return Err(format!("{}: no answers", path.display()));
    }
    Ok(answers)
}

/// Runs the floor until killed.
pub fn run(args: &FloorServerArgs) -> Result<(), String> {
    let answers = match &args.answers {
        Some(path) => Arc::new(read_answers(path)?),
        None => Arc::new(Vec::new()),
    };
    let allow = match (args.allow_all, &args.patch) {
        (false, _) => None,
        (true, None) => Some(Allow::default()),
        (true, Some(path)) => {
            let patch = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            serde_json::from_slice::<json_patch::Patch>(&patch).map_err(|e| format!("{}: {e}", path.display()))?;
            use base64::Engine as _;
            let patch = base64::engine::general_purpose::STANDARD.encode(patch);
            Some(Allow { patch: Some(patch), unless: args.unless_body_contains.clone() })
        }
    };
    let tls = tls_config(&args.server.tls_cert, &args.server.tls_key)?;
    // As `serve`: one worker per CPU this process may use.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let listen = args.server.listen;
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| format!("{listen}: {e}"))?;
        let answering = Answering {
            answers,
            allow,
            path: Arc::from(args.path.as_str()),
            touch_bytes: args.touch_kib * 1024,
            busy: Duration::from_nanos(args.busy_ns),
        };
        serve(listener, tokio_rustls::TlsAcceptor::from(tls), Arc::new(answering)).await;
        Ok(())
    })
}

/// The TLS configuration `serve` builds (src/server/tls.rs), with the certificate held directly: the injector's
/// reloadable certificate costs one atomic load per handshake, and handshakes are not what this measures.
fn tls_config(cert_file: &Path, key_file: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", cert_file.display()))?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| format!("{}: {e}", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("{} and {}: {e}", cert_file.display(), key_file.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What every request of the floor is answered from.
struct Answering {
    answers: Arc<Vec<Bytes>>,
    /// With `--allow-all`, what is answered beside `allowed` (the answers are then not used).
    allow: Option<Allow>,
    path: Arc<str>,
    /// `--touch-kib`, in bytes.
    touch_bytes: usize,
    /// `--busy-ns`.
    busy: Duration,
}

async fn serve(listener: tokio::net::TcpListener, acceptor: tokio_rustls::TlsAcceptor, answering: Arc<Answering>) {
    let mut h1 = auto::Builder::new(TokioExecutor::new()).http1_only();
    h1.http1().timer(TokioTimer::new()).header_read_timeout(None).keep_alive(true);
    let mut h2 = auto::Builder::new(TokioExecutor::new()).http2_only();
    h2.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(sidecar_injector::server::ServeConfig::default().h2_max_concurrent_streams)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_ACCEPT_RESET_STREAMS)
        .keep_alive_interval(H2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(_) => {
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let tcp = tokio::io::BufReader::with_capacity(READ_AHEAD, tcp);
        let (acceptor, answering, h1, h2) = (acceptor.clone(), answering.clone(), h1.clone(), h2.clone());
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else { return };
            let builder = if stream.get_ref().1.alpn_protocol() == Some(b"h2") { &h2 } else { &h1 };
            let service = hyper::service::service_fn(move |request| answer(request, answering.clone()));
            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// One request: the whole body read, the fixed answer sent.
async fn answer(request: Request<Incoming>, answering: Arc<Answering>) -> Result<Response<Full<Bytes>>, Infallible> {
    let found = request.uri().path() == &*answering.path;
    if let Some(allow) = &answering.allow {
        let body = request.into_body().collect().await;
        if let Some(failed) = spend(&answering) {
            return Ok(failed);
        }
        return Ok(match (found, body) {
            (false, _) => plain(StatusCode::NOT_FOUND, "not found"),
            (true, Err(_)) => plain(StatusCode::BAD_REQUEST, "bad request: could not read the body"),
            (true, Ok(body)) => match allowed(&body.to_bytes(), allow) {
                Some(answer) => json(Bytes::from(answer)),
                None => plain(StatusCode::BAD_REQUEST, "bad request: no request.uid"),
            },
        });
    }
    let chosen = pick(&answering.answers, request.headers());
    let mut body = request.into_body();
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            return Ok(plain(StatusCode::BAD_REQUEST, "bad request: could not read the body"));
        }
    }
    if let Some(failed) = spend(&answering) {
        return Ok(failed);
    }
    Ok(match (found, chosen) {
        (false, _) => plain(StatusCode::NOT_FOUND, "not found"),
        (true, None) => plain(StatusCode::BAD_REQUEST, "bad request: no such body in x-loadtest-body"),
        (true, Some(answer)) => json(answer.clone()),
    })
}

/// What the floor is asked to spend on each request once its body is read: `--touch-kib` of memory, `--busy-ns` of
/// CPU. Returns the answer to send instead when the thread's CPU clock cannot be read.
fn spend(answering: &Answering) -> Option<Response<Full<Bytes>>> {
    if answering.touch_bytes > 0 {
        std::hint::black_box(touch(answering.touch_bytes));
    }
    let failed = !answering.busy.is_zero() && busy(answering.busy).is_err();
    failed.then(|| plain(StatusCode::INTERNAL_SERVER_ERROR, "the thread's CPU clock cannot be read"))
}

/// `--allow-all`'s patch (`--patch`, base64-encoded once), and the text that withholds it (`--unless-body-contains`).
#[derive(Default)]
struct Allow {
    patch: Option<String>,
    unless: Option<String>,
}

/// `--allow-all`'s answer to `review`: allowed, its uid echoed, with `--patch` unless the body holds the
/// `--unless-body-contains` text. The uid is the first `"uid"` of the body: the API server writes `request` first
/// after the review's kind and version, and the request's uid first in it (a pod's own `metadata.uid` comes later,
/// inside `request.object`). Nothing else of the review is read.
fn allowed(review: &[u8], allow: &Allow) -> Option<Vec<u8>> {
    const KEY: &[u8] = br#""uid":""#;
    let start = memchr::memmem::find(review, KEY)? + KEY.len();
    let len = memchr::memchr(b'"', &review[start..])?;
    let uid = &review[start..start + len];
    let withheld = allow.unless.as_ref().is_some_and(|text| memchr::memmem::find(review, text.as_bytes()).is_some());
    let patch = allow.patch.as_deref().filter(|_| !withheld);
    let mut answer = Vec::with_capacity(128 + uid.len() + patch.map_or(0, str::len));
    answer.extend_from_slice(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":""#);
    answer.extend_from_slice(uid);
    answer.extend_from_slice(br#"","allowed":true"#);
    if let Some(patch) = patch {
        answer.extend_from_slice(br#","patchType":"JSONPatch","patch":""#);
        answer.extend_from_slice(patch.as_bytes());
        answer.push(b'"');
    }
    answer.extend_from_slice(b"}}");
    Some(answer)
}

fn json(answer: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(answer));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

thread_local! {
    /// `--touch-kib`'s buffer: one per worker, as the engine's parse buffers are.
    static TOUCHED: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes `bytes` of this thread's buffer in order, then reads them back (as simd-json writes its tape and the
/// engine then walks it); returns their sum, so that neither pass can be left out.
fn touch(bytes: usize) -> u64 {
    TOUCHED.with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        buffer.resize(bytes / 8, 0);
        // A new value each time, so that every word is written again.
        let seed = buffer.first().map_or(1, |first| first.wrapping_add(1));
        for (i, word) in buffer.iter_mut().enumerate() {
            *word = seed.wrapping_add(i as u64);
        }
        buffer.iter().fold(0u64, |sum, word| sum.wrapping_add(*word))
    })
}

/// Spins until this thread has spent `cpu` more of CPU time: CPU time, not wall-clock time, so that what the
/// server's CPU per request counts is `cpu` however often the VM takes the CPU away meanwhile.
fn busy(cpu: Duration) -> Result<(), String> {
    let until = crate::cpu::thread_cpu()? + cpu;
    while crate::cpu::thread_cpu()? < until {
        std::hint::spin_loop();
    }
    Ok(())
}

/// The answer to the body [`BODY_HEADER`] names, or the only one.
fn pick<'a>(answers: &'a [Bytes], headers: &HeaderMap) -> Option<&'a Bytes> {
    match answers {
        [only] => Some(only),
        _ => headers.get(BODY_HEADER)?.to_str().ok()?.parse::<usize>().ok().and_then(|i| answers.get(i)),
    }
}

fn plain(status: StatusCode, message: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(message.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bodies::{BodySpec, Naming, UID_LEN, default_corpus, load};

    fn generated(size: usize, naming: Naming) -> Vec<Body> {
        let corpus = default_corpus();
        load(&BodySpec::Size(size), naming, &corpus.join("pods"), &corpus).unwrap().0
    }

    #[test]
    fn the_fixed_answer_is_as_long_as_the_injectors_answer_to_every_stamped_body() {
        let settings = Settings::default();
        let engine = Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings);
        for naming in [Naming::Unique, Naming::Controller] {
            let bodies = generated(2_000, naming);
            let fixed = fixed_answers(&bodies, crate::bodies::Webhook::Mutate).unwrap();
            let mut uid = [0u8; UID_LEN];
            for seq in [1, 77, 0xfff_ffff] {
                let mut buf = bodies[0].stamp(9, seq, &mut uid).to_vec();
                let mut out = Vec::new();
                engine.review(&mut buf, &mut out).unwrap();
                assert_eq!(out.len(), fixed.answers()[0].len(), "{naming:?}, request {seq}");
            }
        }
    }

    /// A review as the API server writes it (its field order): allowed, its uid echoed; a body without one refused.
    #[test]
    fn allow_all_echoes_the_request_uid_and_allows() {
        let review = serde_json::json!({
            "kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"kind": "Pod"},
                        "object": {"metadata": {"uid": "not-this-one"}}},
        });
        let body = serde_json::to_vec(&review).unwrap();
        let answer =
            |allow: &Allow| -> serde_json::Value { serde_json::from_slice(&allowed(&body, allow).unwrap()).unwrap() };
        let nothing = answer(&Allow::default());
        assert_eq!(nothing["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(nothing["response"]["allowed"], true);
        assert_eq!(nothing["apiVersion"], "admission.k8s.io/v1");
        assert!(nothing["response"].get("patch").is_none());
        assert_eq!(allowed(br#"{"request":{}}"#, &Allow::default()), None);
        let patch = Allow { patch: Some("W10=".into()), unless: Some("not-this-one".into()) };
        assert!(answer(&patch)["response"].get("patch").is_none(), "withheld: the body holds the text");
        let patch = Allow { unless: Some("another text".into()), ..patch };
        assert_eq!(answer(&patch)["response"]["patch"], "W10=");
        assert_eq!(answer(&patch)["response"]["patchType"], "JSONPatch");
    }

    #[test]
    fn answers_survive_the_file_one_per_line() {
        let bodies = generated(8_000, Naming::Unique);
        let fixed = fixed_answers(&bodies, crate::bodies::Webhook::Mutate).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("answers");
        write_answers(&path, fixed.answers()).unwrap();
        assert_eq!(read_answers(&path).unwrap(), fixed.answers());
        assert!(write_answers(&path, &[Bytes::from_static(b"{\n}")]).unwrap_err().contains("line break"));
    }

    #[test]
    fn busy_spends_the_cpu_time_asked_for() {
        let before = crate::cpu::thread_cpu().unwrap();
        busy(Duration::from_millis(20)).unwrap();
        let spent = crate::cpu::thread_cpu().unwrap() - before;
        // At least what was asked (the clock is the thread's own); far less than twice that on any machine.
        assert!(spent >= Duration::from_millis(20) && spent < Duration::from_millis(40), "{spent:?}");
    }

    #[test]
    fn a_touch_writes_every_word_anew() {
        // 4 words: seeds 1, then 2; sums 1+2+3+4, then 2+3+4+5.
        assert_eq!(touch(32), 10);
        assert_eq!(touch(32), 14);
        assert_eq!(TOUCHED.with(|buffer| buffer.borrow().len()), 4);
    }

    #[test]
    fn the_body_header_picks_the_answer() {
        let one = [Bytes::from_static(b"a")];
        let two = [Bytes::from_static(b"a"), Bytes::from_static(b"b")];
        let mut headers = HeaderMap::new();
        assert_eq!(pick(&one, &headers), Some(&one[0]), "one answer needs no header");
        assert_eq!(pick(&two, &headers), None);
        headers.insert(BODY_HEADER, HeaderValue::from(1));
        assert_eq!(pick(&two, &headers), Some(&two[1]));
        headers.insert(BODY_HEADER, HeaderValue::from(2));
        assert_eq!(pick(&two, &headers), None);
    }
}
