//! An axum HTTP service rate limited by the Bladbase rate-limit service, with the client
//! library's tower layer: the whole integration is the `.layer(...)` line.
//!
//! ```sh
//! cargo run -- serve --listen 127.0.0.1:50051 &                 # the rate-limit service
//! RATELIMIT_URL=http://127.0.0.1:50051 cargo run --example axum_service -- 8080
//! curl -i -H 'x-api-token: alice' http://127.0.0.1:8080/       # 200 + x-ratelimit-* headers
//! ```
//!
//! Requests are keyed by their API token (`x-api-token`, or `authorization: Bearer …`)
//! under the limit `mcp` (120 per minute unless the service says otherwise); the 121st
//! in a minute gets `429` with `retry-after`. Requests without a token pass unlimited:
//! rejecting them is the authentication layer's job. With the service down, decisions
//! come from this process's own window and the service keeps answering.
//!
//! The port comes from the first argument, else `PORT`, else 8080.

use axum::Router;
use axum::routing::get;
use ratelimit::client::{Client, RateLimitLayer};

/// The caller's key: the API token, from `x-api-token` or a bearer `authorization`.
/// Generic over the body so it fits any HTTP stack.
fn api_token<B>(request: &http::Request<B>) -> Option<String> {
    let headers = request.headers();
    if let Some(token) = headers.get("x-api-token").and_then(|v| v.to_str().ok()) {
        return Some(token.to_owned());
    }
    let auth = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    auth.strip_prefix("Bearer ").map(str::to_owned)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let url = std::env::var("RATELIMIT_URL")
        .unwrap_or_else(|_| ratelimit::client::DEFAULT_URL.to_owned());
    let port: u16 = match std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PORT").ok())
    {
        Some(p) => p
            .parse()
            .map_err(|e| format!("port {p:?} is not a port number: {e}"))?,
        None => 8080,
    };

    let client = Client::builder(url.as_str()).build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello from a rate-limited service\n" }))
        .layer(RateLimitLayer::new(
            client,
            "mcp",
            api_token::<axum::body::Body>,
        ));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    tracing::info!(addr = %listener.local_addr()?, ratelimit = %url, "serving");
    axum::serve(listener, app).await?;
    Ok(())
}
