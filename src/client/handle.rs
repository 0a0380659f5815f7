//! The [`Client`] handle and the state its clones share: the connection, breaker,
//! known limits, deny-until cache and the client's own fallback window.

use super::admin::AdminHeader;
use super::deny::DenyUntil;
#[cfg(feature = "cloud-run-auth")]
use super::id_token::IdTokens;
use super::known::KnownLimits;
use crate::breaker::{Breaker, State};
use crate::clock::SharedClock;
use crate::decision::Decision;
use crate::fallback::LocalWindow;
use crate::limits::Limits;
use crate::pb::rate_limiter_client::RateLimiterClient;
use http::HeaderMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// A rate-limit client. Cheap to clone; clones share one connection, breaker, deny-until
/// cache and local window, so make one per process and share it across tasks.
#[derive(Clone)]
pub struct Client {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Conn {
    /// Bumped each time the connection is renewed, so that many calls that ran into the
    /// deadline on one connection renew it once.
    pub(super) generation: u64,
    pub(super) rpc: RateLimiterClient<Channel>,
}

pub(super) struct Inner {
    pub(super) url: String,
    pub(super) endpoint: Endpoint,
    pub(super) conn: RwLock<Conn>,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) deadline: Duration,
    pub(super) breaker: Breaker,
    pub(super) known: KnownLimits,
    pub(super) deny: DenyUntil,
    pub(super) admin: Option<AdminHeader>,
    /// The client's own window, for when the service cannot answer.
    pub(super) local: LocalWindow,
    pub(super) clock: SharedClock,
    pub(super) learn_limits: bool,
    /// Cloud Run IAM: ID tokens sent as `x-serverless-authorization`.
    #[cfg(feature = "cloud-run-auth")]
    pub(super) id_tokens: Option<Arc<IdTokens>>,
    pub(super) learning: AtomicBool,
    /// True between the first local decision of an outage and the service's next
    /// answer; logging only the transitions keeps an outage to two log lines.
    pub(super) degraded: AtomicBool,
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

impl Client {
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

    /// The caller's response headers for `decision` (see [`headers`](super::headers)), with
    /// `RateLimit-Policy` when the client knows the limit's window.
    pub fn headers(&self, decision: &Decision) -> HeaderMap {
        let mut headers = HeaderMap::new();
        decision.write_headers(self.window_of(&decision.limit_name), &mut headers);
        headers
    }
}
