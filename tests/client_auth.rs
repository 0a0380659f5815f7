//! The client against a Cloud Run-style front door: a Google ID token from the metadata
//! server rides on every call as `x-serverless-authorization`, is fetched once and
//! reused, and when none can be had the client decides locally without calling.

use ratelimit::client::{Client, IdTokens};
use ratelimit::decision::Source;
use ratelimit::pb;
use ratelimit::pb::rate_limiter_server::{RateLimiter, RateLimiterServer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Records the `x-serverless-authorization` of every Check and admits it.
#[derive(Default)]
struct Recording {
    seen: Mutex<Vec<Option<String>>>,
}

/// The service half of a [`Recording`].
struct Recorder(Arc<Recording>);

#[tonic::async_trait]
impl RateLimiter for Recorder {
    async fn check(
        &self,
        r: tonic::Request<pb::CheckRequest>,
    ) -> Result<tonic::Response<pb::CheckResponse>, tonic::Status> {
        let header = r
            .metadata()
            .get("x-serverless-authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.0.seen.lock().expect("lock").push(header);
        Ok(tonic::Response::new(pb::CheckResponse {
            allowed: true,
            limit: 120,
            remaining: 100,
            shared: true,
            source: pb::Source::Store.into(),
            limit_name: "mcp".into(),
            ..Default::default()
        }))
    }
    async fn peek(
        &self,
        _: tonic::Request<pb::PeekRequest>,
    ) -> Result<tonic::Response<pb::CheckResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }
    async fn reset(
        &self,
        _: tonic::Request<pb::ResetRequest>,
    ) -> Result<tonic::Response<pb::ResetResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }
    async fn list_limits(
        &self,
        _: tonic::Request<pb::ListLimitsRequest>,
    ) -> Result<tonic::Response<pb::ListLimitsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not here"))
    }
}

async fn recording_server() -> (String, Arc<Recording>) {
    let incoming = ratelimit::server::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let url = format!("http://{}", incoming.local_addr().expect("addr"));
    let rec = Arc::new(Recording::default());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimiterServer::new(Recorder(rec.clone())))
            .serve_with_incoming(incoming),
    );
    (url, rec)
}

/// A fake metadata server: answers the identity endpoint with `token` (or `status`),
/// counting requests and recording the audience asked for.
async fn metadata_server(
    token: &'static str,
    status: u16,
) -> (String, Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let host = listener.local_addr().expect("addr").to_string();
    let hits = Arc::new(AtomicUsize::new(0));
    let audiences = Arc::new(Mutex::new(Vec::new()));
    let (h, a) = (hits.clone(), audiences.clone());
    let app = axum::Router::new().route(
        "/computeMetadata/v1/instance/service-accounts/default/identity",
        axum::routing::get(move |headers: http::HeaderMap, uri: http::Uri| {
            let (h, a) = (h.clone(), a.clone());
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                a.lock()
                    .expect("lock")
                    .push(uri.query().unwrap_or_default().to_owned());
                let flavored = headers
                    .get("metadata-flavor")
                    .is_some_and(|v| v == "Google");
                let code = if flavored { status } else { 403 };
                (
                    http::StatusCode::from_u16(code)
                        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR),
                    token,
                )
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (host, hits, audiences)
}

// A JWT whose payload says exp = 4102444800 (2100-01-01): valid for the whole test.
const TOKEN: &str =
    "eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJodHRwOi8vc3ZjIiwiZXhwIjo0MTAyNDQ0ODAwfQ.c2lnbmF0dXJl";

#[tokio::test]
async fn every_call_carries_the_id_token_fetched_once() {
    let (url, rec) = recording_server().await;
    let (meta, hits, audiences) = metadata_server(TOKEN, 200).await;
    let tokens = IdTokens::with_metadata_host(&meta, &url).expect("tokens");
    let client = Client::builder(url.clone())
        .learn_limits(false)
        .id_tokens(tokens)
        .build()
        .expect("client");
    for _ in 0..3 {
        let d = client.check("mcp", "k", 1).await.expect("decision");
        assert!(d.shared && d.allowed, "{d:?}");
    }
    let seen = rec.seen.lock().expect("lock").clone();
    assert_eq!(seen, vec![Some(format!("Bearer {TOKEN}")); 3]);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "token reused until near expiry"
    );
    let aud = audiences.lock().expect("lock").clone();
    assert_eq!(aud.len(), 1);
    assert!(
        aud[0].starts_with("audience=http%3A%2F%2F127.0.0.1%3A"),
        "{aud:?}"
    );
}

#[tokio::test]
async fn without_a_token_the_client_decides_locally_and_sends_nothing() {
    let (url, rec) = recording_server().await;
    let (meta, hits, _) = metadata_server("nope", 500).await;
    let tokens = IdTokens::with_metadata_host(&meta, &url).expect("tokens");
    let client = Client::builder(url)
        .learn_limits(false)
        .id_tokens(tokens)
        .build()
        .expect("client");
    let d = client.check("mcp", "k", 1).await.expect("decision");
    assert!(d.allowed && !d.shared, "{d:?}");
    assert_eq!(d.source, Source::ClientFallback);
    assert!(
        rec.seen.lock().expect("lock").is_empty(),
        "no RPC without a token"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}
