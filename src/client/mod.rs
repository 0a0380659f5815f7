//! The client library: how Rust callers (the MCP service, uploads, sign-in) ask the
//! rate-limit service, without ever being slowed or broken by it (DESIGN §6).
//!
//! [`Client::check`] sends `Check` with a deadline (1.5 s by default). When the service
//! is unreachable, late or failing, the client decides from its **own** per-process
//! window — the same [`LocalWindow`] code the service falls back to — and says so
//! (`shared = false`, [`Source::ClientFallback`]). Around that call:
//!
//! - input is validated here with the service's own rules and messages
//!   ([`validate_key`], [`resolve_cost`]), so bad input never costs an RPC; caller bugs
//!   (`INVALID_ARGUMENT`, `NOT_FOUND`) come back as [`ClientError`]s and are never
//!   hidden by a fallback;
//! - a circuit breaker (the service's own [`Breaker`]) stops calling a service that
//!   keeps failing: checks then answer locally at once, and one probe at a time goes out
//!   after a cool-down;
//! - a deny-until cache (`deny.rs`) refuses a key the service refused until its
//!   `retry_after` passes or for a second at most (a Reset elsewhere frees the key), with
//!   no RPC; [`Client::reset`] (`reset.rs`, with an admin token) clears it at once;
//! - the limits come from the service's `ListLimits` once it answers, else from the
//!   fallback limits the client was built with (`known.rs`);
//! - a call that runs into the deadline renews the connection, since a late answer may
//!   mean a dead connection that would otherwise never be replaced.
//!
//! Also here: [`headers`] (the caller's HTTP response headers), [`layer`] (tower
//! middleware) and [`cli`] (`ratelimit check`).
//!
//! ```no_run
//! # async fn run() -> Result<(), ratelimit::client::ClientError> {
//! use ratelimit::client::Client;
//! let client = Client::builder("http://127.0.0.1:50051").build()?;
//! let decision = client.check("mcp", "token-123", 1).await?;
//! if !decision.allowed {
//!     // answer 429 with client.headers(&decision)
//! }
//! # Ok(()) }
//! ```

pub mod cli;
mod deny;
pub mod headers;
pub mod id_token;
mod known;
pub mod layer;
mod reset;

pub use id_token::{IdTokenError, IdTokens};
pub use layer::{RateLimit, RateLimitLayer};

use crate::breaker::{Breaker, BreakerConfig, State};
use crate::clock::{self, SharedClock};
use crate::fallback::LocalWindow;
use crate::limiter::{CheckError, Decision, Source, resolve_cost, validate_key};
use crate::limits::{Limit, Limits, LimitsError};
use crate::pb;
use crate::pb::rate_limiter_client::RateLimiterClient;
use deny::DenyUntil;
use http::HeaderMap;
use known::KnownLimits;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// Where the client looks for the service unless told otherwise.
pub const DEFAULT_URL: &str = "http://127.0.0.1:50051";
/// How long a check waits for the service before deciding locally (ADR-0006: 1.5 s).
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(1_500);
/// Longest accepted deadline: a rate check that may take longer is not a rate check.
pub const MAX_DEADLINE: Duration = Duration::from_secs(3_600);

/// Why the client refused a call or could not be built. A service that is unreachable,
/// late or failing is never one of these: checks then decide locally.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClientError {
    /// Bad input, found before any RPC; the message is the service's own.
    #[error(transparent)]
    Invalid(#[from] CheckError),
    /// The service refused the input (`INVALID_ARGUMENT`), e.g. a cost above a limit the
    /// client did not know yet.
    #[error("{0}")]
    InvalidArgument(String),
    /// The service has no limit by that name (`NOT_FOUND`); the message lists the known ones.
    #[error("{0}")]
    NotFound(String),
    /// The service could not be asked and the client has no numbers for this limit.
    #[error(
        "limit {name:?} is not among the limits this client knows ({known}) and the service could not be asked ({reason}); include it in the client's fallback limits (ClientBuilder::fallback_limits, `ratelimit check --limits FILE`)"
    )]
    NoFallbackLimit {
        /// The limit asked for.
        name: String,
        /// The limits the client knows.
        known: String,
        /// Why the service could not be asked.
        reason: String,
    },
    /// The service could not be asked (only for calls with no local answer, such as
    /// [`Client::refresh_limits`]).
    #[error("the rate-limit service could not be asked: {0}")]
    Unavailable(String),
    /// A set of limits breaks the limits rules: the service's `ListLimits` answer, or
    /// a fallback limits file.
    #[error(transparent)]
    BadLimits(#[from] LimitsError),
    /// The service URL is not usable.
    #[error("service URL {url:?}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A builder setting is out of range.
    #[error("{0}")]
    Config(String),
    /// The service refused an admin call ([`Client::reset`]): no or a wrong admin token,
    /// or admin calls disabled there. The message is the service's.
    #[error("the service refused the call: {0}")]
    Refused(String),
    /// [`ClientBuilder::build`] ran outside a Tokio runtime, which the connection needs.
    #[error("the rate-limit client must be built inside a Tokio runtime")]
    NoRuntime,
}

impl ClientError {
    /// True when the key itself is bad (empty or too long): the request being limited
    /// is at fault, not the caller's configuration.
    pub fn is_bad_key(&self) -> bool {
        matches!(
            self,
            ClientError::Invalid(CheckError::EmptyKey | CheckError::KeyTooLong(_))
        )
    }
}

/// Settings of a [`Client`]; start from [`Client::builder`].
#[derive(Clone)]
pub struct ClientBuilder {
    url: String,
    deadline: Duration,
    connect_timeout: Option<Duration>,
    fallback: Limits,
    breaker: BreakerConfig,
    clock: SharedClock,
    learn_limits: bool,
    auth: Auth,
    deny_trust: Duration,
    admin: Option<reset::AdminHeader>,
}

/// How the client proves who it is to the service's front door.
#[derive(Clone, Debug)]
enum Auth {
    /// Nothing (loopback, private networks, unauthenticated Cloud Run services).
    None,
    /// A Google ID token for the service's URL from the metadata server (Cloud Run IAM).
    CloudRun,
    /// Given ID tokens (another audience or metadata host).
    Tokens(Arc<IdTokens>),
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &self.url)
            .field("deadline", &self.deadline)
            .field("connect_timeout", &self.connect_timeout)
            .field("fallback", &self.fallback.summary())
            .field("breaker", &self.breaker)
            .field("learn_limits", &self.learn_limits)
            .field("auth", &self.auth)
            .field("deny_trust", &self.deny_trust)
            .field("admin", &self.admin)
            .finish()
    }
}

impl ClientBuilder {
    /// How long a call waits for the service before deciding locally (default 1.5 s).
    /// Sent as the gRPC deadline too, so the service answers within it.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// How long opening a connection may take (default: the deadline).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The limits used until the service's own are learned, and for limits the service
    /// did not list (default: `mcp` = 120 per 60 s, the service's built-in set).
    pub fn fallback_limits(mut self, limits: Limits) -> Self {
        self.fallback = limits;
        self
    }

    /// When to stop calling a failing service (default: 5 consecutive failures, then
    /// one probe every 2 s).
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// The clock of the local window and the deny-until cache (default: the system clock).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// How long a refusal by the service is repeated here without asking it again, at
    /// most (default 1 s; never longer than the service's `retry_after`).
    pub fn deny_trust(mut self, trust: Duration) -> Self {
        self.deny_trust = trust;
        self
    }

    /// The service's admin token (its `RATELIMIT_ADMIN_TOKEN`), for [`Client::reset`].
    /// Sent only on Reset calls, and never formatted.
    pub fn admin_token(mut self, token: &str) -> Self {
        self.admin = reset::AdminHeader::new(token);
        self
    }

    /// Whether to learn the limits from the service's `ListLimits` in the background
    /// after it first answers, and every 5 minutes after that (default: true). A
    /// one-shot caller such as the CLI turns it off to save the call.
    pub fn learn_limits(mut self, learn: bool) -> Self {
        self.learn_limits = learn;
        self
    }

    /// Authenticates to a Cloud Run service deployed with IAM
    /// (`--no-allow-unauthenticated`): each call carries a Google ID token for the
    /// service's URL, from the metadata server of the Google Cloud runtime the caller
    /// runs on, as `x-serverless-authorization`. The caller's service account needs
    /// `roles/run.invoker` on the rate-limit service.
    pub fn cloud_run_auth(mut self) -> Self {
        self.auth = Auth::CloudRun;
        self
    }

    /// Sends these ID tokens as `x-serverless-authorization` (e.g. another audience).
    pub fn id_tokens(mut self, tokens: IdTokens) -> Self {
        self.auth = Auth::Tokens(Arc::new(tokens));
        self
    }

    /// The client. Connects lazily: nothing is dialled until the first call, so this
    /// works while the service is down. Must run inside a Tokio runtime.
    pub fn build(self) -> Result<Client, ClientError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ClientError::NoRuntime)?;
        for (what, d) in [
            ("deadline", Some(self.deadline)),
            ("connect timeout", self.connect_timeout),
        ] {
            if let Some(d) = d
                && (d.is_zero() || d > MAX_DEADLINE)
            {
                return Err(ClientError::Config(format!(
                    "{what}: must be longer than zero and at most {}, got {d:?}",
                    humantime::format_duration(MAX_DEADLINE)
                )));
            }
        }
        let endpoint =
            endpoint(&self.url)?.connect_timeout(self.connect_timeout.unwrap_or(self.deadline));
        let id_tokens = match &self.auth {
            Auth::None => None,
            Auth::CloudRun => Some(Arc::new(
                IdTokens::from_metadata_server(&audience(&self.url))
                    .map_err(|e| ClientError::Config(e.to_string()))?,
            )),
            Auth::Tokens(t) => Some(t.clone()),
        };
        let rpc = {
            let _entered = runtime.enter();
            RateLimiterClient::new(endpoint.connect_lazy())
        };
        Ok(Client {
            inner: Arc::new(Inner {
                url: self.url,
                endpoint,
                conn: RwLock::new(Conn { generation: 0, rpc }),
                runtime,
                deadline: self.deadline,
                breaker: Breaker::new(self.breaker).subject("service"),
                known: KnownLimits::new(self.fallback),
                deny: DenyUntil::new(self.deny_trust),
                admin: self.admin,
                local: LocalWindow::new(self.clock.clone()),
                clock: self.clock,
                learn_limits: self.learn_limits,
                id_tokens,
                learning: AtomicBool::new(false),
                degraded: AtomicBool::new(false),
            }),
        })
    }
}

/// Checks the URL before tonic sees it: tonic would accept a URL without a scheme and
/// only fail on every call. `https` gets TLS with the webpki (Mozilla) roots, as Cloud
/// Run's `*.run.app` endpoints need.
fn endpoint(url: &str) -> Result<Endpoint, ClientError> {
    let bad = |reason: &str| ClientError::Url {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(bad("expected http://HOST:PORT or https://HOST")),
    };
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("expected http://HOST:PORT or https://HOST"));
    }
    let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|e| bad(&e.to_string()))?;
    if !tls {
        return Ok(endpoint);
    }
    crate::install_crypto_provider();
    endpoint
        .tls_config(tonic::transport::ClientTlsConfig::new().with_webpki_roots())
        .map_err(|e| bad(&format!("TLS: {e}")))
}

/// The ID-token audience Cloud Run expects: the service URL without a path.
fn audience(url: &str) -> String {
    url.parse::<http::Uri>()
        .ok()
        .and_then(|u| Some(format!("{}://{}", u.scheme_str()?, u.authority()?)))
        .unwrap_or_else(|| url.to_owned())
}

/// A rate-limit client. Cheap to clone; clones share one connection, breaker, deny-until
/// cache and local window, so make one per process and share it across tasks.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Conn {
    /// Bumped each time the connection is renewed, so that many calls that ran into the
    /// deadline on one connection renew it once.
    generation: u64,
    rpc: RateLimiterClient<Channel>,
}

struct Inner {
    url: String,
    endpoint: Endpoint,
    conn: RwLock<Conn>,
    runtime: tokio::runtime::Handle,
    deadline: Duration,
    breaker: Breaker,
    known: KnownLimits,
    deny: DenyUntil,
    admin: Option<reset::AdminHeader>,
    /// The client's own window, for when the service cannot answer.
    local: LocalWindow,
    clock: SharedClock,
    learn_limits: bool,
    /// Cloud Run IAM: ID tokens sent as `x-serverless-authorization`.
    id_tokens: Option<Arc<IdTokens>>,
    learning: AtomicBool,
    /// True between the first local decision of an outage and the service's next
    /// answer; logging only the transitions keeps an outage to two log lines.
    degraded: AtomicBool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.inner.url)
            .field("deadline", &self.inner.deadline)
            .field("breaker", &self.inner.breaker.state())
            .finish()
    }
}

/// Why the service's answer could not be had; the call is then decided locally.
#[derive(Debug)]
enum Unavailable {
    /// The breaker is open: the service was not called.
    BreakerOpen,
    /// No answer within the deadline.
    Late(Duration),
    /// The call failed (connection refused or broken, or a failing status).
    Failed { code: Code, message: String },
}

impl Unavailable {
    fn kind(&self) -> &'static str {
        match self {
            Unavailable::BreakerOpen => "breaker_open",
            Unavailable::Late(_) => "late",
            Unavailable::Failed { code, .. } => match code {
                Code::Unavailable => "unavailable",
                Code::Internal => "internal",
                Code::DeadlineExceeded => "deadline_exceeded",
                Code::ResourceExhausted => "resource_exhausted",
                Code::Unknown => "unknown",
                _ => "failed",
            },
        }
    }
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::BreakerOpen => f.write_str("circuit breaker open"),
            Unavailable::Late(d) => write!(f, "no answer within {d:?}"),
            Unavailable::Failed { code, message } => write!(f, "{code:?}: {message}"),
        }
    }
}

enum CallError {
    /// The service could not answer: decide locally.
    Down(Unavailable),
    /// The service answered that the call itself is wrong.
    Caller(ClientError),
}

impl Client {
    /// Settings for a client of the service at `url` (`http://HOST:PORT`).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            deadline: DEFAULT_DEADLINE,
            connect_timeout: None,
            fallback: Limits::builtin(),
            breaker: BreakerConfig::default(),
            clock: clock::system(),
            learn_limits: true,
            auth: Auth::None,
            deny_trust: crate::deny_cache::DEFAULT_TRUST,
            admin: None,
        }
    }

    /// A client of the service at `url` with the default settings.
    pub fn new(url: impl Into<String>) -> Result<Self, ClientError> {
        Self::builder(url).build()
    }

    /// The service URL.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The breaker's state (for health endpoints and tests).
    pub fn breaker_state(&self) -> State {
        self.inner.breaker.state()
    }

    /// The limits the client decides with when it must: the service's once learned,
    /// else the fallback limits.
    pub fn limits(&self) -> Limits {
        self.inner.known.current()
    }

    /// The window length of the limit called `name` (empty: the default), if known.
    pub fn window_of(&self, name: &str) -> Option<Duration> {
        self.inner.known.get(name).map(|l| l.window())
    }

    /// The caller's response headers for `decision` (see [`headers`]), with
    /// `RateLimit-Policy` when the client knows the limit's window.
    pub fn headers(&self, decision: &Decision) -> HeaderMap {
        let mut headers = HeaderMap::new();
        decision.write_headers(self.window_of(&decision.limit_name), &mut headers);
        headers
    }

    /// Counts `cost` hits (0 means 1) for `key` under the limit `limit` (empty: the
    /// service's default) and says whether to admit them.
    ///
    /// Answers within the deadline whatever the service does: unreachable, late or
    /// failing, the decision comes from this process's own window with `shared =
    /// false`. Errors are only ever the caller's: bad input, an unknown limit.
    pub async fn check(&self, limit: &str, key: &str, cost: u32) -> Result<Decision, ClientError> {
        validate_key(key)?;
        let known = self.inner.known.get(limit);
        let cost = match &known {
            Some(l) => resolve_cost(l, cost)?,
            // The service alone knows this limit; it checks the cost.
            None => cost.max(1),
        };
        let cache_name = known.as_ref().map_or(limit, |l| &*l.name);
        if let Some(refused) =
            self.inner
                .deny
                .check(cache_name, key, cost, self.inner.clock.now_ms())
        {
            return Ok(refused);
        }
        let request = pb::CheckRequest {
            key: key.to_owned(),
            limit: limit.to_owned(),
            cost,
        };
        match self
            .call(request, |mut rpc, req| async move { rpc.check(req).await })
            .await
        {
            Ok(response) => {
                let decision = decision_from_pb(response);
                self.inner
                    .deny
                    .record(cache_name, key, &decision, self.inner.clock.now_ms());
                Ok(decision)
            }
            Err(CallError::Caller(e)) => Err(e),
            Err(CallError::Down(why)) => {
                let limit = self.fallback_limit(known, limit, &why)?;
                Ok(self
                    .inner
                    .local
                    .decide(&limit, key, cost, Source::ClientFallback))
            }
        }
    }

    /// The key's current window under `limit` (empty: the default), counting nothing.
    /// When the service cannot answer: this process's own window, `shared = false`.
    pub async fn peek(&self, limit: &str, key: &str) -> Result<Decision, ClientError> {
        validate_key(key)?;
        let known = self.inner.known.get(limit);
        let request = pb::PeekRequest {
            key: key.to_owned(),
            limit: limit.to_owned(),
        };
        match self
            .call(request, |mut rpc, req| async move { rpc.peek(req).await })
            .await
        {
            Ok(response) => Ok(decision_from_pb(response)),
            Err(CallError::Caller(e)) => Err(e),
            Err(CallError::Down(why)) => {
                let limit = self.fallback_limit(known, limit, &why)?;
                Ok(self.inner.local.peek(&limit, key, Source::ClientFallback))
            }
        }
    }

    /// Fetches the service's limits now and decides with them from then on.
    pub async fn refresh_limits(&self) -> Result<Limits, ClientError> {
        match self
            .call(pb::ListLimitsRequest {}, |mut rpc, req| async move {
                rpc.list_limits(req).await
            })
            .await
        {
            Ok(response) => {
                let limits = known::from_pb(response)?;
                self.inner.known.learn(limits.clone());
                tracing::debug!(service = %self.inner.url, limits = %limits.summary(), "learned the service's limits");
                Ok(limits)
            }
            Err(CallError::Caller(e)) => Err(e),
            Err(CallError::Down(why)) => Err(ClientError::Unavailable(why.to_string())),
        }
    }

    /// The limit to decide with locally, and the log line for the outage's start.
    fn fallback_limit(
        &self,
        known: Option<Arc<Limit>>,
        name: &str,
        why: &Unavailable,
    ) -> Result<Arc<Limit>, ClientError> {
        let Some(limit) = known else {
            return Err(ClientError::NoFallbackLimit {
                name: name.to_owned(),
                known: self.inner.known.names(),
                reason: why.to_string(),
            });
        };
        if !self.inner.degraded.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                service = %self.inner.url,
                limit = %limit.name,
                reason = why.kind(),
                error = %why,
                "rate-limit service unavailable; deciding locally (shared=false)"
            );
        } else {
            tracing::debug!(limit = %limit.name, reason = why.kind(), "deciding locally (shared=false)");
        }
        Ok(limit)
    }

    /// One RPC through the breaker, within the deadline.
    async fn call<M, T, F, Fut>(&self, message: M, rpc: F) -> Result<T, CallError>
    where
        F: FnOnce(RateLimiterClient<Channel>, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let inner = &self.inner;
        let Some(attempt) = inner.breaker.attempt() else {
            return Err(CallError::Down(Unavailable::BreakerOpen));
        };
        let (generation, client) = {
            let conn = inner.conn.read().unwrap_or_else(|p| p.into_inner());
            (conn.generation, conn.rpc.clone())
        };
        let mut request = tonic::Request::new(message);
        let started = std::time::Instant::now();
        if let Some(tokens) = &inner.id_tokens {
            let token = tokio::time::timeout(inner.deadline, tokens.token()).await;
            let header = match token {
                Ok(Ok(t)) => format!("Bearer {t}").parse().ok(),
                _ => None,
            };
            let Some(header) = header else {
                // Without a token the front door would refuse the call: decide locally.
                let failure = Unavailable::Failed {
                    code: Code::Unauthenticated,
                    message: "no ID token for the service (metadata server unreachable?)".into(),
                };
                attempt.finish(false, failure.kind());
                return Err(CallError::Down(failure));
            };
            request
                .metadata_mut()
                .insert("x-serverless-authorization", header);
        }
        let left = inner.deadline.saturating_sub(started.elapsed());
        // The service reads this as its own budget, so it answers (from its fallback if
        // need be) before this deadline rather than let the call time out.
        request.set_timeout(left);
        let result = tokio::time::timeout(left, rpc(client, request)).await;
        let failure = match result {
            Ok(Ok(response)) => {
                attempt.finish(true, "ok");
                self.answered();
                return Ok(response.into_inner());
            }
            Ok(Err(status)) => match status.code() {
                // The service answered: it is healthy, the call is wrong.
                Code::InvalidArgument | Code::NotFound => {
                    attempt.finish(true, "ok");
                    self.answered();
                    let message = status.message().to_owned();
                    return Err(CallError::Caller(if status.code() == Code::NotFound {
                        ClientError::NotFound(message)
                    } else {
                        ClientError::InvalidArgument(message)
                    }));
                }
                // tonic's own deadline timer (from the grpc-timeout above) fired first.
                Code::Cancelled => Unavailable::Late(inner.deadline),
                code => Unavailable::Failed {
                    code,
                    message: status.message().to_owned(),
                },
            },
            Err(_elapsed) => Unavailable::Late(inner.deadline),
        };
        if matches!(failure, Unavailable::Late(_)) {
            self.renew_connection(generation);
        }
        attempt.finish(false, failure.kind());
        Err(CallError::Down(failure))
    }

    /// The service answered: log the end of an outage, and learn its limits if due.
    fn answered(&self) {
        let inner = &self.inner;
        if inner.degraded.load(Ordering::Relaxed) && inner.degraded.swap(false, Ordering::AcqRel) {
            tracing::info!(service = %inner.url, "rate-limit service answering again; decisions are shared");
        }
        if !inner.learn_limits
            || inner.learning.load(Ordering::Relaxed)
            || !inner.known.claim_refresh()
            || inner.learning.swap(true, Ordering::AcqRel)
        {
            return;
        }
        // Clears the flag however the task ends, even if it never runs (runtime gone).
        struct Learning(Client);
        impl Drop for Learning {
            fn drop(&mut self) {
                self.0.inner.learning.store(false, Ordering::Release);
            }
        }
        let learning = Learning(self.clone());
        inner.runtime.spawn(async move {
            let client = &learning.0;
            if let Err(e) = client.refresh_limits().await {
                tracing::debug!(service = %client.inner.url, error = %e, "could not learn the service's limits; using the fallback limits");
            }
        });
    }

    /// Replaces the connection after a call on it ran into the deadline: the next call
    /// dials afresh, so a dead connection (a peer gone without a reset) cannot keep
    /// every call late. Once per connection, however many calls timed out on it.
    fn renew_connection(&self, generation: u64) {
        let inner = &self.inner;
        let mut conn = inner.conn.write().unwrap_or_else(|p| p.into_inner());
        if conn.generation != generation {
            return;
        }
        let _entered = inner.runtime.enter();
        *conn = Conn {
            generation: generation.wrapping_add(1),
            rpc: RateLimiterClient::new(inner.endpoint.connect_lazy()),
        };
    }
}

/// The service's answer as a [`Decision`].
fn decision_from_pb(r: pb::CheckResponse) -> Decision {
    let source = match pb::Source::try_from(r.source) {
        Ok(pb::Source::Store) => Source::Store,
        Ok(pb::Source::DenyCache) => Source::DenyCache,
        Ok(pb::Source::LocalFallback) => Source::LocalFallback,
        Ok(pb::Source::FailurePolicy) => Source::FailurePolicy,
        Ok(pb::Source::Lease) => Source::Lease,
        // A newer service may add sources; `shared` still says what matters.
        Ok(pb::Source::Unspecified) | Err(_) if r.shared => Source::Store,
        Ok(pb::Source::Unspecified) | Err(_) => Source::LocalFallback,
    };
    let reset_after = duration(r.reset_after);
    Decision {
        allowed: r.allowed,
        limit: r.limit,
        remaining: r.remaining,
        reset_after,
        retry_after: (!r.allowed).then(|| r.retry_after.map_or(reset_after, |d| duration(Some(d)))),
        shared: r.shared,
        source,
        limit_name: Arc::from(r.limit_name),
        window: r.window,
    }
}

/// A protobuf duration from the wire; negative or missing is zero, and nothing overflows.
fn duration(d: Option<prost_types::Duration>) -> Duration {
    let Some(d) = d else {
        return Duration::ZERO;
    };
    let secs = u64::try_from(d.seconds).unwrap_or(0);
    let nanos = u64::try_from(d.nanos).unwrap_or(0);
    Duration::from_secs(secs).saturating_add(Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn urls_are_checked_before_any_call() {
        for (url, want) in [
            ("127.0.0.1:50051", "expected http://HOST:PORT"),
            ("http://", "empty string"),
            ("http://exa mple", "invalid"),
            ("ftp://ratelimit.example:21", "expected http://HOST:PORT"),
        ] {
            let err = Client::new(url).expect_err(url);
            assert!(matches!(err, ClientError::Url { .. }), "{url}: {err:?}");
            assert!(err.to_string().contains(want), "{url}: {err}");
        }
        assert!(Client::new("http://127.0.0.1:1").is_ok());
        assert!(
            Client::new("https://ratelimit-abc123-ew.a.run.app").is_ok(),
            "https gets TLS"
        );
        assert_eq!(
            audience("https://ratelimit-abc.a.run.app/some/path"),
            "https://ratelimit-abc.a.run.app"
        );
    }

    #[tokio::test]
    async fn deadlines_must_be_sane() {
        let b = Client::builder(DEFAULT_URL);
        assert!(matches!(
            b.clone().deadline(Duration::ZERO).build(),
            Err(ClientError::Config(_))
        ));
        assert!(matches!(
            b.clone()
                .connect_timeout(Duration::from_secs(86_400))
                .build(),
            Err(ClientError::Config(_))
        ));
        assert!(b.deadline(Duration::from_millis(200)).build().is_ok());
    }

    #[test]
    fn building_outside_a_runtime_is_an_error_not_a_panic() {
        assert_eq!(Client::new(DEFAULT_URL).err(), Some(ClientError::NoRuntime));
    }

    #[test]
    fn answers_map_to_decisions_whatever_the_wire_holds() {
        let d = decision_from_pb(pb::CheckResponse {
            allowed: false,
            limit: 5,
            remaining: 0,
            reset_after: Some(prost_types::Duration {
                seconds: 42,
                nanos: 0,
            }),
            retry_after: None,
            shared: true,
            source: 99,
            limit_name: "signin".into(),
            window: 7,
        });
        assert_eq!(d.retry_after, Some(Duration::from_secs(42)));
        assert_eq!(d.source, Source::Store);
        let huge = duration(Some(prost_types::Duration {
            seconds: i64::MAX,
            nanos: i32::MAX,
        }));
        assert!(
            huge > Duration::from_secs(i64::MAX as u64),
            "no overflow panic"
        );
        assert_eq!(
            duration(Some(prost_types::Duration {
                seconds: -3,
                nanos: -1
            })),
            Duration::ZERO
        );
    }
}
