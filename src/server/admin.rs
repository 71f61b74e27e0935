//! The plain-HTTP admin listener: `GET /metrics` (Prometheus text), `/healthz` (the process answers) and `/readyz`
//! (TLS material and template loaded, and not shutting down).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::Shared;

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else { continue };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let response = answer(&shared, &req);
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(std::time::Duration::from_secs(5));
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
            let engine = shared.engine.load();
            let set = engine.set();
            let mut body = format!(
                "ready\ntemplates: generation {}, set {} ({})\n",
                shared.templates.generation(),
                set.hash(),
                set.names()
            );
            if let Some(refused) = shared.templates.refused() {
                body.push_str(&format!("newest template edit refused: {}\n", refused.replace('\n', "\n  ")));
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
