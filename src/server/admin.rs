//! The plain-HTTP admin listener: `GET /metrics` (Prometheus text), `/healthz` (the process answers) and `/readyz`
//! (TLS material and template loaded, and not shutting down).

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use super::Shared;
use super::limits::{ADMIN_CONNECTION_LIFETIME, ADMIN_HEADER_READ_TIMEOUT, ADMIN_MAX_CONNECTIONS, H1_MAX_BUF_SIZE};

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    serve_from(|| listener.accept(), shared).await;
}

/// Serves each connection `accept` gives; an accept error is followed by the same pause as on the webhook
/// listener, not retried at once (which spun a core while, say, file descriptors were exhausted). At most
/// [`ADMIN_MAX_CONNECTIONS`] are open: with every one taken, the oldest is closed for the new one, so that a probe
/// or a scrape always gets through (an answer here takes microseconds; the oldest connection is the one most likely
/// idle or silent).
async fn serve_from<F>(mut accept: impl FnMut() -> F, shared: Arc<Shared>)
where
    F: Future<Output = std::io::Result<(TcpStream, SocketAddr)>>,
{
    let mut open: VecDeque<tokio::task::AbortHandle> = VecDeque::with_capacity(ADMIN_MAX_CONNECTIONS);
    loop {
        let (tcp, _) = super::accept_next("admin", &mut accept).await;
        open.retain(|task| !task.is_finished());
        if open.len() >= ADMIN_MAX_CONNECTIONS
            && let Some(oldest) = open.pop_front()
        {
            oldest.abort();
        }
        open.push_back(tokio::spawn(connection(tcp, shared.clone())).abort_handle());
    }
}

/// One admin connection, for at most [`ADMIN_CONNECTION_LIFETIME`] and then a grace of
/// [`ADMIN_HEADER_READ_TIMEOUT`] to finish the answer in progress: hyper closes one idle or slow with its headers
/// after the header timeout, and this one that does not read its answers.
async fn connection<T>(io: T, shared: Arc<Shared>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let response = answer(&shared, &req);
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(ADMIN_HEADER_READ_TIMEOUT).max_buf_size(H1_MAX_BUF_SIZE);
    let conn = http.serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = tokio::time::sleep(ADMIN_CONNECTION_LIFETIME) => conn.as_mut().graceful_shutdown(),
    }
    let _ = tokio::time::timeout(ADMIN_HEADER_READ_TIMEOUT, conn).await;
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
                let removed = revision.templates.removed();
                if !removed.is_empty() {
                    let listed = super::reload::Removed::list(&removed);
                    body.push_str(&format!("{which}generation {generation} removed templates: {listed}\n"));
                }
                // Named, not quoted: anyone who reaches this port reads it, and a reason can quote the template.
                if let Some(refused) = revision.templates.refused() {
                    let subject = &refused.subject;
                    body.push_str(&format!(
                        "{which}newest template edit refused: {subject} (the reason is in the log)\n"
                    ));
                }
            }
            text(StatusCode::OK, body)
        }
        _ => text(StatusCode::NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n"),
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = super::plain_text(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    use arc_swap::ArcSwap;

    use super::*;
    use crate::server::{Revision, ServeConfig, reload, telemetry};
    use sidecar_injector_core::{Engine, Settings, TemplateSet};

    fn shared() -> Arc<Shared> {
        let settings = Settings::default();
        let engine = Arc::new(ArcSwap::from_pointee(Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings)));
        let templates = Arc::new(reload::ReloadState::new(&engine.load()));
        let metrics = telemetry::Metrics::new().unwrap();
        let revision = Revision {
            name: settings.revision.clone(),
            engine,
            templates,
            metrics: metrics.revision("default"),
            reloader: None,
            refresh: None,
            tags: Default::default(),
        };
        let body_budget = Arc::new(super::super::budget::BodyBudget::new(1 << 20, metrics.clone()));
        Arc::new(Shared {
            revisions: Box::new([revision]),
            config: ServeConfig::default(),
            metrics,
            shutting_down: AtomicBool::new(false),
            body_budget,
            open: Default::default(),
            events: None,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_does_not_read_its_answers_is_closed_after_the_lifetime_and_grace() {
        use tokio::io::AsyncWriteExt;
        // A pipe far smaller than the answers: the server's writes block as soon as the client stops reading.
        let (mut client, server) = tokio::io::duplex(256);
        let started = tokio::time::Instant::now();
        let connection = tokio::spawn(connection(server, shared()));
        // Requests, never reading an answer; the writes fail once the server closes.
        let _writer = tokio::spawn(async move {
            while client.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.is_ok() {}
            client
        });
        connection.await.unwrap();
        let lived = started.elapsed();
        assert!(lived >= ADMIN_CONNECTION_LIFETIME, "closed after {lived:?}, while it was being answered");
        assert!(lived <= ADMIN_CONNECTION_LIFETIME + ADMIN_HEADER_READ_TIMEOUT, "kept {lived:?}");
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
