//! The plain-HTTP admin listener: `GET /metrics` (Prometheus text), `/healthz` (the process answers) and `/readyz`
//! (TLS material and template loaded, and not shutting down).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use super::Shared;

/// Time allowed for a request's headers on the admin listener: a scraper or a kubelet probe sends them at once,
/// and a client that trickles them (slowloris) must not hold a connection for long. Not a flag: nothing slow
/// legitimately talks to this listener.
const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    serve_from(|| listener.accept(), shared).await;
}

/// Serves each connection `accept` gives; an accept error is followed by the same pause as on the webhook
/// listener, not retried at once (which spun a core while, say, file descriptors were exhausted).
async fn serve_from<F>(mut accept: impl FnMut() -> F, shared: Arc<Shared>)
where
    F: Future<Output = std::io::Result<(TcpStream, SocketAddr)>>,
{
    loop {
        let (tcp, _) = super::accept_next("admin", &mut accept).await;
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let response = answer(&shared, &req);
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(ADMIN_HEADER_READ_TIMEOUT);
            let _ = http.serve_connection(TokioIo::new(tcp), service).await;
        });
    }
}

fn answer<B>(shared: &Shared, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let mut response = Response::new(Full::new(Bytes::from(shared.metrics.render())));
            let content_type = hyper::header::HeaderValue::from_static("text/plain; version=0.0.4");
            response.headers_mut().insert("content-type", content_type);
            response
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        // The server only exists once its certificate and templates are loaded, so ready means not shutting down.
        // A refused template edit leaves the pod ready (the last good set serves) but is shown in the body.
        "/readyz" if shared.shutting_down.load(Ordering::SeqCst) => {
            text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
        }
        "/readyz" => {
            let mut body = "ready\n".to_owned();
            for revision in &shared.revisions {
                let engine = revision.engine.load();
                let set = engine.set();
                let which =
                    if shared.revisions.len() > 1 { format!("revision {}: ", revision.name) } else { String::new() };
                let generation = revision.templates.generation();
                body.push_str(&format!(
                    "{which}templates: generation {generation}, set {} ({})\n",
                    set.hash(),
                    set.names()
                ));
                if let Some(refused) = revision.templates.refused() {
                    let refused = refused.replace('\n', "\n  ");
                    body.push_str(&format!("{which}newest template edit refused: {refused}\n"));
                }
            }
            let mut response = text(StatusCode::OK, "");
            *response.body_mut() = Full::new(Bytes::from(body));
            response
        }
        _ => text(StatusCode::NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("text/plain"));
    response
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    use arc_swap::ArcSwap;

    use super::*;
    use crate::server::{Revision, ServeConfig, reload, telemetry};
    use crate::{Engine, Settings, TemplateSet};

    fn shared() -> Arc<Shared> {
        let settings = Settings::default();
        let engine = Arc::new(ArcSwap::from_pointee(Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings)));
        let templates = Arc::new(reload::ReloadState::new(&engine.load()));
        let metrics = telemetry::Metrics::new().unwrap();
        let revision =
            Revision { name: settings.revision.clone(), engine, templates, metrics: metrics.revision("default") };
        let body_budget = super::super::budget::BodyBudget::new(1 << 20, metrics.clone());
        Arc::new(Shared {
            revisions: Box::new([revision]),
            config: ServeConfig::default(),
            metrics,
            shutting_down: AtomicBool::new(false),
            body_budget,
        })
    }

    #[tokio::test]
    async fn a_failing_accept_is_retried_after_a_pause_not_in_a_hot_loop() {
        let calls = AtomicUsize::new(0);
        let failing = || {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                // Yields, so that a hot loop still lets the timeout below fire (and the test end).
                tokio::task::yield_now().await;
                Err::<(TcpStream, SocketAddr), _>(std::io::Error::other("too many open files"))
            }
        };
        let window = 6 * super::super::ACCEPT_ERROR_BACKOFF;
        let _ = tokio::time::timeout(window, serve_from(failing, shared())).await;
        let calls = calls.load(Ordering::SeqCst);
        assert!((1..=8).contains(&calls), "{calls} accepts in {window:?}: one per backoff expected");
    }
}
