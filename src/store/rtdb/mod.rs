//! `RtdbStore`: counters in Firebase Realtime Database, updated by REST transactions.
//!
//! One node per key, `{root}/{limit}/{encodedKey}`, holding `{"<window>": count}`.
//! A transaction is a conditional `PUT` with `if-match: <etag>` (DESIGN §4,
//! reference/rtdb-rest.md):
//!
//! - **One round trip in steady state.** Every PUT asks for the new ETag
//!   (`X-Firebase-ETag: true`) and `(value, etag)` is cached per node, so the next check
//!   PUTs directly. A stale tag costs one `412`, whose body and `ETag` header are the
//!   current value and tag: recompute and retry without a read.
//! - **The write replaces the node**, so writing window `w` removes the previous window in
//!   the same round trip. A node already holding a newer window is counted in that window
//!   (`apply_batch`): windows only move forward, by up to one window (`within_reach`).
//! - **Attempts are capped** ([`DEFAULT_MAX_ATTEMPTS`]); a retry after a `412` goes out at
//!   once, with no jitter (a loser that waits loses again: BENCHMARKS.md §4);
//!   running out is [`StoreError::Contention`].
//! - **A network error after a PUT was sent** is [`StoreError::UnknownOutcome`]: the write
//!   may have landed, so it is never re-applied (re-applying would double-count, and a
//!   `412` body equal to our value might be our own write). The decision falls back
//!   instead; over-counting is the safe side. The cached tag is dropped.
//! - **A node this service did not write** (wrong shape) is an error with its path and is
//!   never overwritten.
//!
//! - **A cached count that denies is trusted for `deny_trust`** (default 1 s) after the
//!   store last confirmed it: a batch that admits nothing is answered from the cache with
//!   no request within that time, and re-read after it, so a Reset through another
//!   instance (a `DELETE` this instance cannot see) is noticed within about a second, at
//!   a cost of at most one read per exhausted key per `deny_trust`.
//! - **No caller key or URL in errors** (`reply.rs`): errors name the node by its limit
//!   and the key's keyed hash, since they reach log lines.
//!
//! Batching, single flight and the deny-until cache live in the limiter (`coalesce.rs`,
//! `deny_cache.rs`); this store sees one batch per key at a time from each instance.

pub mod auth;
// Internal (the key encoding); public for the tests and benchmarks only.
#[doc(hidden)]
pub mod keys;
mod reply;
pub mod target;

use crate::clock::SharedClock;
use crate::limits::Limit;
use crate::store::counter::{
    Admission, CounterStore, StoreError, WindowCount, apply_batch, visible_count, within_reach,
};
use async_trait::async_trait;
use auth::TokenSource;
use moka::sync::Cache;
use reply::{Node, Reply, parse_node, status_error, transport_error};
use reqwest::{Method, StatusCode, Url};
use std::sync::Arc;
use std::time::Duration;
use target::Target;

/// Conditional PUT attempts per transaction (as the Admin SDKs). Running out makes the
/// checks of that batch fall back to the local window, which over-admits, so the cap is
/// generous.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;

/// Settings of an [`RtdbStore`].
#[derive(Debug, Clone)]
pub struct RtdbOptions {
    /// Per-HTTP-request timeout: a backstop; the limiter's budget is usually shorter.
    pub request_timeout: Duration,
    /// TCP/TLS connect timeout.
    pub connect_timeout: Duration,
    /// Conditional PUT attempts per transaction.
    pub max_attempts: u32,
    /// Bytes of cached `(value, etag)` nodes, keys included (`memory_budget.rs`).
    /// Evicting one only costs a read later.
    pub node_cache_bytes: u64,
    /// How long a cached count that denies is believed without reading the node again.
    pub deny_trust: Duration,
}

impl Default for RtdbOptions {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            node_cache_bytes: crate::memory_budget::MemoryBudget::default()
                .service(true)
                .rtdb_nodes,
            deny_trust: crate::deny_cache::DEFAULT_TRUST,
        }
    }
}

#[derive(Debug, Clone)]
struct CachedNode {
    etag: Arc<str>,
    value: Option<WindowCount>,
    /// When a write to this node last lost a race (`412`): the store answered, another
    /// writer got there first. Tells contention from an outage when a budget runs out.
    lost_race_at: Option<std::time::Instant>,
    /// When the store last confirmed `value` (clock time, Unix ms).
    seen_ms: u64,
}

/// Counters in RTDB.
pub struct RtdbStore {
    http: reqwest::Client,
    target: Target,
    tokens: Arc<dyn TokenSource>,
    nodes: Cache<(Arc<str>, String), CachedNode>,
    max_attempts: u32,
    clock: SharedClock,
    deny_trust_ms: u64,
}

/// Why an `RtdbStore` could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RtdbError {
    /// Bad URL, emulator host or root.
    #[error(transparent)]
    Target(#[from] target::TargetError),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Http(String),
    /// No usable credentials.
    #[error(transparent)]
    Credentials(#[from] auth::CredentialsError),
}

impl RtdbStore {
    /// A store for `target`, authenticating with `tokens`.
    pub fn new(
        target: Target,
        tokens: Arc<dyn TokenSource>,
        options: RtdbOptions,
    ) -> Result<Self, RtdbError> {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(options.request_timeout)
            .connect_timeout(options.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| RtdbError::Http(e.to_string()))?;
        Ok(Self {
            http,
            target,
            tokens,
            nodes: crate::memory_budget::bounded(
                options.node_cache_bytes,
                "rtdb_nodes",
                |k: &(Arc<str>, String), v: &CachedNode| {
                    size_of::<(Arc<str>, String)>()
                        + size_of::<CachedNode>()
                        + k.1.len()
                        + v.etag.len()
                        + 16
                },
            )
            .build(),
            max_attempts: options.max_attempts.max(1),
            clock: crate::clock::system(),
            deny_trust_ms: u64::try_from(options.deny_trust.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Times cached counts by `clock` (default: the system clock), the limiter's clock.
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The node of `key` under `limit`.
    fn node(&self, limit: &Limit, key: &str) -> Node {
        let encoded = keys::encode(key);
        Node {
            url: self.target.node_url(&limit.name, &encoded),
            path: self.target.node_path(&limit.name, &encoded),
            shown: format!("{}/key:{}", limit.name, crate::logging::key_tag(key)),
            cache_key: (limit.name.clone(), encoded),
        }
    }

    /// The endpoint, for the startup log.
    pub fn describe(&self) -> String {
        self.target.describe()
    }

    /// Sends one request with the current token; on 401 refreshes the token once and
    /// resends (a 401 means nothing was applied, so resending a write is safe).
    async fn send(
        &self,
        method: Method,
        url: &Url,
        if_match: Option<&str>,
        body: Option<String>,
    ) -> Result<Reply, StoreError> {
        let mut token = self.tokens.token().await?;
        let mut refreshed = false;
        loop {
            let mut req = self
                .http
                .request(method.clone(), url.clone())
                .bearer_auth(&*token)
                .header("X-Firebase-ETag", "true");
            if let Some(tag) = if_match {
                req = req.header("if-match", tag);
            }
            let is_write = body.is_some() || method == Method::DELETE;
            if let Some(b) = &body {
                req = req
                    .header("content-type", "application/json")
                    .body(b.clone());
            }
            let started = std::time::Instant::now();
            let resp = req.send().await.map_err(|e| transport_error(e, is_write))?;
            let status = resp.status();
            crate::metrics::store_request(method.as_str(), status.as_u16(), started.elapsed());
            if status == StatusCode::UNAUTHORIZED && !refreshed {
                refreshed = true;
                token = self.tokens.refresh(&token).await?;
                continue;
            }
            let etag = resp
                .headers()
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .map(Arc::from);
            let body = resp
                .bytes()
                .await
                .map_err(|e| transport_error(e, is_write))?
                .to_vec();
            return Ok(Reply { status, etag, body });
        }
    }

    /// Reads a node with its ETag and caches both.
    async fn read(&self, node: &Node) -> Result<CachedNode, StoreError> {
        let reply = self.send(Method::GET, &node.url, None, None).await?;
        if reply.status != StatusCode::OK {
            return Err(status_error(&reply, node));
        }
        let value = self.parse(node, &reply.body)?;
        let etag = reply.etag.ok_or_else(|| StoreError::Malformed {
            path: node.shown.clone(),
            detail: "GET with X-Firebase-ETag returned no ETag header".into(),
        })?;
        let cached = CachedNode {
            etag,
            value,
            lost_race_at: None,
            seen_ms: self.clock.now_ms(),
        };
        self.nodes.insert(node.cache_key.clone(), cached.clone());
        Ok(cached)
    }

    /// Parses a node's body; a foreign node's real path goes to `debug` only.
    fn parse(&self, node: &Node, body: &[u8]) -> Result<Option<WindowCount>, StoreError> {
        parse_node(&node.shown, body).inspect_err(|_| {
            tracing::debug!(path = %node.path, node = %node.shown, "RTDB path of the foreign node");
        })
    }

    /// One transaction on a node: `update` maps the node's current value to the value to
    /// write (`None`: nothing to write) and a result. Runs on the cached `(value, etag)`
    /// when there is one; a `412` refreshes both from its body and tag and `update` runs
    /// again, without a read.
    async fn transaction<T>(
        &self,
        target: &Node,
        mut update: impl FnMut(Option<WindowCount>) -> (Option<WindowCount>, T),
    ) -> Result<T, StoreError> {
        let cache_key = &target.cache_key;
        let url = &target.url;
        let mut node = match self.nodes.get(cache_key) {
            Some(n) => n,
            None => self.read(target).await?,
        };
        let deadline = crate::store::counter::deadline();
        let mut last_attempt: Option<Duration> = None;
        let mut reread = false;
        for attempt in 0..self.max_attempts {
            // Contention is not an outage: stop retrying while the caller can still be
            // told so, rather than be cut off mid-write (that write could still land).
            // Round trips vary, so the next one is assumed half as slow again as the last.
            if let (Some(deadline), Some(rtt)) = (deadline, last_attempt)
                && std::time::Instant::now() + rtt.mul_f64(1.5) > deadline
            {
                return Err(StoreError::Contention { attempts: attempt });
            }
            let (next, result) = update(node.value);
            let Some(next) = next else {
                // Nothing to write. A denial from a count the store confirmed less than
                // `deny_trust` ago stands: counts only grow within a window, short of a
                // Reset. Older, it is read again (once), so a Reset through another
                // instance is seen within about `deny_trust`.
                let age = self.clock.now_ms().saturating_sub(node.seen_ms);
                if reread || age < self.deny_trust_ms {
                    return Ok(result);
                }
                reread = true;
                node = self.read(target).await?;
                continue;
            };
            let body = format!("{{\"{}\":{}}}", next.window, next.count);
            let sent = std::time::Instant::now();
            let reply = match self
                .send(Method::PUT, url, Some(&node.etag), Some(body))
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    self.nodes.invalidate(cache_key);
                    return Err(e);
                }
            };
            match reply.status {
                StatusCode::OK => {
                    match reply.etag {
                        Some(etag) => self.nodes.insert(
                            cache_key.clone(),
                            CachedNode {
                                etag,
                                value: Some(next),
                                lost_race_at: node.lost_race_at,
                                seen_ms: self.clock.now_ms(),
                            },
                        ),
                        None => self.nodes.invalidate(cache_key),
                    }
                    return Ok(result);
                }
                StatusCode::PRECONDITION_FAILED => {
                    last_attempt = Some(sent.elapsed());
                    let value = self.parse(target, &reply.body)?;
                    node = match reply.etag {
                        Some(etag) => CachedNode {
                            etag,
                            value,
                            lost_race_at: None,
                            seen_ms: self.clock.now_ms(),
                        },
                        None => self.read(target).await?,
                    };
                    node.lost_race_at = Some(std::time::Instant::now());
                    // Cached at once: if the retry finds nothing to write (a denial), the
                    // next check must not pay this 412 again.
                    self.nodes.insert(cache_key.clone(), node.clone());
                    // A 412 already carries the fresh value and tag, so the retry needs no
                    // read, and it goes out at once, without the jitter the REST notes
                    // suggest: the instance that just won sends its next batch with the
                    // tag of its own write, and a loser that sleeps first loses again
                    // (measured in BENCHMARKS.md §4). Racing losers cannot livelock: one
                    // write wins every round.
                }
                _ => {
                    self.nodes.invalidate(cache_key);
                    return Err(status_error(&reply, target));
                }
            }
        }
        // The cache holds the last 412's value and tag: the next attempt starts from them.
        Err(StoreError::Contention {
            attempts: self.max_attempts,
        })
    }

    async fn transact(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        costs: &[u32],
    ) -> Result<Admission, StoreError> {
        let node = self.node(limit, key);
        self.transaction(&node, |stored| {
            let stored = within_reach(stored, window, &node.shown, true);
            let (next, outcomes) = apply_batch(stored, window, limit.requests, costs);
            let write = outcomes.iter().any(|o| o.allowed).then_some(next);
            let admission = Admission {
                window: next.window,
                outcomes,
            };
            (write, admission)
        })
        .await
    }

    /// Gives back up to `hits` of `window` (an unspent lease), never below `keep`, in one
    /// transaction.
    async fn give_back(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        hits: u32,
        keep: u32,
    ) -> Result<bool, StoreError> {
        self.transaction(&self.node(limit, key), |stored| match stored {
            Some(v) if v.window == window && v.count > keep && hits > 0 => {
                let next = WindowCount {
                    window,
                    count: v.count - hits.min(v.count - keep),
                };
                (Some(next), true)
            }
            // The window moved on, or nothing beyond `keep` is counted: nothing to give.
            _ => (None, false),
        })
        .await
    }
}

#[async_trait]
impl CounterStore for RtdbStore {
    fn name(&self) -> &'static str {
        "rtdb"
    }

    fn is_remote(&self) -> bool {
        true
    }

    async fn admit(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        costs: &[u32],
    ) -> Result<Admission, StoreError> {
        self.transact(limit, key, window, costs).await
    }

    async fn peek(&self, limit: &Limit, key: &str, window: i64) -> Result<WindowCount, StoreError> {
        let target = self.node(limit, key);
        let node = self.read(&target).await?;
        let stored = within_reach(node.value, window, &target.shown, false);
        Ok(visible_count(stored, window))
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        let node = self.node(limit, key);
        self.nodes.invalidate(&node.cache_key);
        let reply = self.send(Method::DELETE, &node.url, None, None).await?;
        if reply.status != StatusCode::OK {
            return Err(status_error(&reply, &node));
        }
        Ok(())
    }

    async fn release(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        hits: u32,
        keep: u32,
    ) -> Result<bool, StoreError> {
        self.give_back(limit, key, window, hits, keep).await
    }
    fn lost_race_since(&self, limit: &Limit, key: &str, since: std::time::Instant) -> bool {
        self.nodes
            .get(&(limit.name.clone(), keys::encode(key)))
            .and_then(|n| n.lost_race_at)
            .is_some_and(|at| at >= since)
    }
}
