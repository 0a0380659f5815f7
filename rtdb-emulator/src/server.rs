//! The HTTP server: accept loop, per-request fault injection and counting, and the
//! translation of protocol replies into HTTP responses.
//!
//! The accept loop is hand-written on hyper (no framework) because a dropped-connection
//! fault must close the socket without writing a single byte: the service returns an
//! error, hyper then abandons the connection, and the socket is closed as it is dropped.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::control;
use crate::db::Database;
use crate::faults::{Action, Faults};
use crate::rest::{self, Body, Reply, RestRequest};
use crate::stats::{Counters, Outcome};

/// Largest request body accepted (RTDB's REST maximum is in this range).
const MAX_BODY_BYTES: usize = 256 * 1024 * 1024;

/// Everything a request handler needs, shared by all connections.
#[derive(Debug)]
pub(crate) struct App {
    pub db: Database,
    pub faults: Faults,
    pub counters: Counters,
}

/// The error a handler returns to make hyper close the connection without a response.
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by fault injection")]
pub(crate) struct DropConnection;

pub(crate) type HttpResponse = Response<Full<Bytes>>;

/// Accepts connections until `shutdown` changes (or its sender is dropped). Connection
/// tasks live in a `JoinSet`, so they are aborted when this future ends or is aborted.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    connections.spawn(serve_connection(stream, Arc::clone(&app)));
                }
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
}

async fn serve_connection(stream: TcpStream, app: Arc<App>) {
    // Small request/response pairs: without NODELAY, Nagle adds latency to every exchange.
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "set_nodelay failed");
    }
    let service = service_fn(move |req| handle(Arc::clone(&app), req));
    if let Err(e) = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(error = %e, "connection ended");
    }
}

async fn handle(app: Arc<App>, req: Request<Incoming>) -> Result<HttpResponse, DropConnection> {
    if control::is_control_path(req.uri().path()) {
        return Ok(control::handle(&app, req).await);
    }
    let method = req.method().as_str().to_owned();
    app.counters.arrived();
    let plan = app.faults.plan(req.uri().path());
    if !plan.latency.is_zero() {
        tokio::time::sleep(plan.latency).await;
    }
    match plan.action {
        Action::Proceed => {}
        Action::Drop => {
            app.counters
                .record(&method, Outcome::Dropped { wrote: false });
            return Err(DropConnection);
        }
        Action::Error(status) => {
            let message = format!("Injected fault: HTTP {status}");
            let reply = Reply::error(status, &message);
            app.counters.record(
                &method,
                Outcome::Answered {
                    status,
                    wrote: false,
                },
            );
            return Ok(to_response(reply));
        }
    }

    let (parts, body) = req.into_parts();
    let reply = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => {
            let body = collected.to_bytes();
            let request = RestRequest {
                method: &parts.method,
                uri: &parts.uri,
                headers: &parts.headers,
                body: &body,
            };
            rest::handle(&app.db, &request)
        }
        Err(e) => Reply::error(400, &format!("The request body could not be read: {e}")),
    };

    if plan.drop_after_apply {
        app.counters
            .record(&method, Outcome::Dropped { wrote: reply.wrote });
        return Err(DropConnection);
    }
    if !plan.response_latency.is_zero() {
        tokio::time::sleep(plan.response_latency).await;
    }
    app.counters.record(
        &method,
        Outcome::Answered {
            status: reply.status,
            wrote: reply.wrote && (200..300).contains(&reply.status),
        },
    );
    Ok(to_response(reply))
}

/// Builds the HTTP response for a reply. Every response carries the headers the official
/// emulator sends (CORS, `Cache-Control: no-cache`); JSON bodies are
/// `application/json; charset=utf-8`.
pub(crate) fn to_response(reply: Reply) -> HttpResponse {
    let body = match &reply.body {
        Body::Empty => Bytes::new(),
        Body::Json(v) => {
            let text = if reply.pretty {
                serde_json::to_vec_pretty(v)
            } else {
                serde_json::to_vec(v)
            };
            // Serialising a `Value` cannot fail; keep a valid JSON body if it ever did.
            Bytes::from(text.unwrap_or_else(|_| b"null".to_vec()))
        }
    };
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = resp.headers_mut();
    if matches!(reply.body, Body::Json(_)) {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
    }
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("ETag"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if reply.preflight {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, PUT, DELETE, PATCH"),
        );
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(
                "content-type, if-match, if-none-match, x-firebase-etag, authorization",
            ),
        );
    }
    if let Some(etag) = reply.etag.and_then(|e| HeaderValue::from_str(&e).ok()) {
        headers.insert(header::ETAG, etag);
    }
    resp
}
