//! Tower middleware: rate limiting for an HTTP service (axum, hyper, tonic's HTTP side)
//! in one line, with the headers DESIGN §1 asks of every response.
//!
//! ```no_run
//! # async fn run() -> Result<(), ratelimit::client::ClientError> {
//! use ratelimit::client::{Client, RateLimitLayer};
//! let client = Client::new("http://127.0.0.1:50051")?;
//! // The key: whatever identifies the caller; here an API token header.
//! let layer = RateLimitLayer::new(client, "mcp", |req: &http::Request<String>| {
//!     req.headers().get("x-api-token")?.to_str().ok().map(str::to_owned)
//! });
//! # let _ = layer; Ok(()) }
//! ```
//!
//! For each request the key function picks the key; the client checks one hit of the
//! limit. Allowed: the inner service answers and its response gets the rate-limit
//! headers. Refused: `429 Too Many Requests` with the same headers and `retry-after`,
//! and the inner service is not called.
//!
//! What the layer does when there is no decision to apply:
//! - the key function returns `None`: the request passes unlimited (deciding who is
//!   anonymous, and rejecting them, is the authentication layer's job);
//! - the key is unusable (empty, over 512 bytes): `400 Bad Request`, since the request
//!   itself carries it;
//! - the service is down and the client has no numbers for the limit: the request
//!   passes, as the fail-open rule says (ADR-0006), and the client logs why;
//! - any other error (an unknown limit name, a cost the limit can never admit) is a
//!   configuration bug: `500`, logged, so that it is found at once rather than in an
//!   outage.

use super::handle::Client;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response, StatusCode};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// A [`Layer`] that rate limits requests by a key taken from each request.
#[derive(Clone)]
pub struct RateLimitLayer<K> {
    client: Client,
    limit: Arc<str>,
    key: K,
}

impl<K> RateLimitLayer<K> {
    /// Limits requests under `limit` (empty: the service's default), keyed by `key`:
    /// a function from the request to its key, or `None` to let it pass unlimited.
    pub fn new(client: Client, limit: impl Into<Arc<str>>, key: K) -> Self {
        Self {
            client,
            limit: limit.into(),
            key,
        }
    }
}

impl<S, K: Clone> Layer<S> for RateLimitLayer<K> {
    type Service = RateLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            client: self.client.clone(),
            limit: self.limit.clone(),
            key: self.key.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around an inner service.
#[derive(Clone)]
pub struct RateLimit<S, K> {
    inner: S,
    client: Client,
    limit: Arc<str>,
    key: K,
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    K: Fn(&Request<ReqBody>) -> Option<String>,
    ReqBody: Send + 'static,
    ResBody: From<&'static str> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let key = (self.key)(&request);
        // Take the service that poll_ready readied and leave a clone in its place (the
        // tower idiom for calling the inner service from a 'static future).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let client = self.client.clone();
        let limit = self.limit.clone();
        Box::pin(async move {
            let Some(key) = key else {
                return inner.call(request).await;
            };
            match client.check(&limit, &key, 1).await {
                Ok(decision) if decision.allowed => {
                    let mut response = inner.call(request).await?;
                    let window = client.window_of(&decision.limit_name);
                    decision.write_headers(window, response.headers_mut());
                    Ok(response)
                }
                Ok(decision) => {
                    let mut response =
                        plain(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded\n");
                    let window = client.window_of(&decision.limit_name);
                    decision.write_headers(window, response.headers_mut());
                    Ok(response)
                }
                Err(e) if e.is_bad_key() => {
                    tracing::debug!(limit = %limit, error = %e, "request refused: unusable rate-limit key");
                    Ok(plain(StatusCode::BAD_REQUEST, "invalid rate-limit key\n"))
                }
                Err(e) => {
                    tracing::error!(limit = %limit, error = %e, "rate limiting misconfigured; answering 500");
                    Ok(plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "rate limiting misconfigured\n",
                    ))
                }
            }
        })
    }
}

fn plain<B: From<&'static str>>(status: StatusCode, body: &'static str) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
