//! Building a [`Client`]: its settings ([`ClientBuilder`]), their checks, the service
//! URL's endpoint (TLS for `https`) and how the client authenticates to Cloud Run.

use super::admin::AdminHeader;
use super::deny::DenyUntil;
use super::error::ClientError;
use super::handle::{Client, Conn, Inner};
#[cfg(feature = "cloud-run-auth")]
use super::id_token::IdTokens;
use super::known::KnownLimits;
use crate::breaker::{Breaker, BreakerConfig};
use crate::clock::{self, SharedClock};
use crate::fallback::LocalWindow;
use crate::limits::Limits;
use crate::memory_budget::{self, MemoryBudget};
use crate::pb::rate_limiter_client::RateLimiterClient;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tonic::transport::Endpoint;

/// Where the client looks for the service unless told otherwise.
pub const DEFAULT_URL: &str = "http://127.0.0.1:50051";
/// How long a check waits for the service before deciding locally (ADR-0006: 1.5 s).
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(1_500);
/// Longest accepted deadline: a rate check that may take longer is not a rate check.
pub const MAX_DEADLINE: Duration = Duration::from_secs(3_600);

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
    memory_limit: u64,
    deny_trust: Duration,
    admin: Option<AdminHeader>,
}

/// How the client proves who it is to the service's front door.
#[derive(Clone, Debug)]
enum Auth {
    /// Nothing (loopback, private networks, unauthenticated Cloud Run services).
    None,
    /// A Google ID token for the service's URL from the metadata server (Cloud Run IAM).
    #[cfg(feature = "cloud-run-auth")]
    CloudRun,
    /// Given ID tokens (another audience or metadata host).
    #[cfg(feature = "cloud-run-auth")]
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
            .field("memory_limit", &self.memory_limit)
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
        self.admin = AdminHeader::new(token);
        self
    }

    /// Whether to learn the limits from the service's `ListLimits` in the background
    /// after it first answers, and every 5 minutes after that (default: true). A
    /// one-shot caller such as the CLI turns it off to save the call.
    pub fn learn_limits(mut self, learn: bool) -> Self {
        self.learn_limits = learn;
        self
    }

    /// Bytes the client's own window and deny-until cache may hold, keys included
    /// (default 32 MiB, at least 4 MiB): 3/4 window, 1/4 deny-until. Past it the least
    /// used entries are evicted; an evicted window entry restarts that key's local
    /// count (see `memory_budget.rs`).
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// Authenticates to a Cloud Run service deployed with IAM (feature `cloud-run-auth`)
    /// (`--no-allow-unauthenticated`): each call carries a Google ID token for the
    /// service's URL, from the metadata server of the Google Cloud runtime the caller
    /// runs on, as `x-serverless-authorization`. The caller's service account needs
    /// `roles/run.invoker` on the rate-limit service.
    #[cfg(feature = "cloud-run-auth")]
    pub fn cloud_run_auth(mut self) -> Self {
        self.auth = Auth::CloudRun;
        self
    }

    /// Sends these ID tokens as `x-serverless-authorization` (e.g. another audience;
    /// feature `cloud-run-auth`).
    #[cfg(feature = "cloud-run-auth")]
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
        if !(memory_budget::MIN_MEMORY_LIMIT..=memory_budget::MAX_MEMORY_LIMIT)
            .contains(&self.memory_limit)
        {
            return Err(ClientError::Config(format!(
                "memory limit: must be between 4 MiB and 1 TiB, got {} bytes",
                self.memory_limit
            )));
        }
        let shares = MemoryBudget::new(self.memory_limit).client();
        let endpoint =
            endpoint(&self.url)?.connect_timeout(self.connect_timeout.unwrap_or(self.deadline));
        #[cfg(feature = "cloud-run-auth")]
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
                deny: DenyUntil::with_budget(self.deny_trust, shares.deny),
                admin: self.admin,
                local: LocalWindow::with_budget(self.clock.clone(), shares.window, "client_window"),
                clock: self.clock,
                learn_limits: self.learn_limits,
                #[cfg(feature = "cloud-run-auth")]
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

#[cfg(feature = "cloud-run-auth")]
/// The ID-token audience Cloud Run expects: the service URL without a path.
fn audience(url: &str) -> String {
    url.parse::<http::Uri>()
        .ok()
        .and_then(|u| Some(format!("{}://{}", u.scheme_str()?, u.authority()?)))
        .unwrap_or_else(|| url.to_owned())
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
            memory_limit: memory_budget::DEFAULT_CLIENT_MEMORY_LIMIT,
            deny_trust: crate::decision::DEFAULT_DENY_TRUST,
            admin: None,
        }
    }

    /// A client of the service at `url` with the default settings.
    pub fn new(url: impl Into<String>) -> Result<Self, ClientError> {
        Self::builder(url).build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::calls::{decision_from_pb, duration};
    use crate::decision::Source;
    use crate::pb;

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
        assert!(matches!(
            b.clone().memory_limit(1024).build(),
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
