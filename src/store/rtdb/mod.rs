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
//!   (`apply_batch`): windows only move forward.
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
//! Batching, single flight and the deny-until cache live in the limiter (`coalesce.rs`,
//! `deny_cache.rs`); this store sees one batch per key at a time from each instance.

pub mod auth;
pub mod keys;
pub mod target;

use super::{Admission, CounterStore, StoreError, WindowCount, apply_batch, visible_count};
use crate::limits::Limit;
use async_trait::async_trait;
use auth::TokenSource;
use moka::sync::Cache;
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
}

/// One HTTP answer, reduced to what a transaction needs.
struct Reply {
    status: StatusCode,
    etag: Option<Arc<str>>,
    /// Kept as bytes so that a malformed body can be quoted in errors.
    body: Vec<u8>,
}

/// Counters in RTDB.
pub struct RtdbStore {
    http: reqwest::Client,
    target: Target,
    tokens: Arc<dyn TokenSource>,
    nodes: Cache<(Arc<str>, String), CachedNode>,
    max_attempts: u32,
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
        })
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
            let resp = req
                .send()
                .await
                .map_err(|e| transport_error(&e, is_write))?;
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
                .map_err(|e| transport_error(&e, is_write))?
                .to_vec();
            return Ok(Reply { status, etag, body });
        }
    }

    /// Reads a node with its ETag and caches both.
    async fn read(&self, limit: &Limit, encoded: &str) -> Result<CachedNode, StoreError> {
        let url = self.target.node_url(&limit.name, encoded);
        let reply = self.send(Method::GET, &url, None, None).await?;
        if reply.status != StatusCode::OK {
            return Err(status_error(&reply));
        }
        let path = self.target.node_path(&limit.name, encoded);
        let value = parse_node(&path, &reply.body)?;
        let etag = reply.etag.ok_or_else(|| StoreError::Malformed {
            path,
            detail: "GET with X-Firebase-ETag returned no ETag header".into(),
        })?;
        let node = CachedNode {
            etag,
            value,
            lost_race_at: None,
        };
        self.nodes
            .insert((limit.name.clone(), encoded.to_owned()), node.clone());
        Ok(node)
    }

    /// One transaction on a node: `update` maps the node's current value to the value to
    /// write (`None`: nothing to write) and a result. Runs on the cached `(value, etag)`
    /// when there is one; a `412` refreshes both from its body and tag and `update` runs
    /// again, without a read.
    async fn transaction<T>(
        &self,
        limit: &Limit,
        encoded: &str,
        mut update: impl FnMut(Option<WindowCount>) -> (Option<WindowCount>, T),
    ) -> Result<T, StoreError> {
        let cache_key = (limit.name.clone(), encoded.to_owned());
        let url = self.target.node_url(&limit.name, encoded);
        let path = self.target.node_path(&limit.name, encoded);
        let mut node = match self.nodes.get(&cache_key) {
            Some(n) => n,
            None => self.read(limit, encoded).await?,
        };
        for _ in 0..self.max_attempts {
            let (next, result) = update(node.value);
            let Some(next) = next else {
                // Nothing to write. A denial from a cached count stands: counts only grow
                // within a window, so the cache can only be lower than the truth.
                return Ok(result);
            };
            let body = format!("{{\"{}\":{}}}", next.window, next.count);
            let reply = match self
                .send(Method::PUT, &url, Some(&node.etag), Some(body))
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    self.nodes.invalidate(&cache_key);
                    return Err(e);
                }
            };
            match reply.status {
                StatusCode::OK => {
                    match reply.etag {
                        Some(etag) => self.nodes.insert(
                            cache_key,
                            CachedNode {
                                etag,
                                value: Some(next),
                                lost_race_at: node.lost_race_at,
                            },
                        ),
                        None => self.nodes.invalidate(&cache_key),
                    }
                    return Ok(result);
                }
                StatusCode::PRECONDITION_FAILED => {
                    let value = parse_node(&path, &reply.body)?;
                    node = match reply.etag {
                        Some(etag) => CachedNode {
                            etag,
                            value,
                            lost_race_at: None,
                        },
                        None => self.read(limit, encoded).await?,
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
                    self.nodes.invalidate(&cache_key);
                    return Err(status_error(&reply));
                }
            }
        }
        self.nodes.invalidate(&cache_key);
        Err(StoreError::Contention {
            attempts: self.max_attempts,
        })
    }

    async fn transact(
        &self,
        limit: &Limit,
        encoded: &str,
        window: i64,
        costs: &[u32],
    ) -> Result<Admission, StoreError> {
        self.transaction(limit, encoded, |stored| {
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

    /// Gives back up to `hits` of `window` (an unspent lease), in one transaction.
    async fn give_back(
        &self,
        limit: &Limit,
        encoded: &str,
        window: i64,
        hits: u32,
    ) -> Result<bool, StoreError> {
        self.transaction(limit, encoded, |stored| match stored {
            Some(v) if v.window == window && v.count > 0 && hits > 0 => {
                let next = WindowCount {
                    window,
                    count: v.count - hits.min(v.count),
                };
                (Some(next), true)
            }
            // The window moved on, or nothing is counted: nothing to give back.
            _ => (None, false),
        })
        .await
    }
}

fn transport_error(e: &reqwest::Error, is_write: bool) -> StoreError {
    // A connect error means the request never left: always safe. Anything later on a
    // write (timeout, reset, truncated body) leaves its outcome unknown.
    let msg = error_chain(e);
    if e.is_connect() {
        StoreError::Connect(msg)
    } else if is_write {
        StoreError::UnknownOutcome(msg)
    } else {
        StoreError::Connect(msg)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

fn status_error(reply: &Reply) -> StoreError {
    // RTDB errors are JSON `{"error": "..."}`, sometimes pretty-printed: parse, don't compare.
    let message = serde_json::from_slice::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_else(|| {
            String::from_utf8_lossy(&reply.body)
                .chars()
                .take(200)
                .collect()
        });
    match reply.status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            StoreError::Auth(format!("HTTP {}: {message}", reply.status.as_u16()))
        }
        s => StoreError::Status {
            status: s.as_u16(),
            message,
        },
    }
}

/// Parses a counter node: `null`, or an object of `"<window>": count` (normally one entry;
/// the newest window wins if there are several). Anything else was not written by this
/// service and is reported, never overwritten.
fn parse_node(path: &str, body: &[u8]) -> Result<Option<WindowCount>, StoreError> {
    let malformed = |detail: String| {
        let err = StoreError::Malformed {
            path: path.to_owned(),
            detail,
        };
        tracing::error!(path, error = %err, "RTDB node is not a rate-limit counter; leaving it untouched");
        err
    };
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        malformed(format!(
            "not JSON ({e}): {}",
            String::from_utf8_lossy(body)
                .chars()
                .take(80)
                .collect::<String>()
        ))
    })?;
    let map = match value {
        serde_json::Value::Null => return Ok(None),
        serde_json::Value::Object(map) => map,
        other => {
            return Err(malformed(format!(
                "expected {{\"<window>\": count}}, found {other}"
            )));
        }
    };
    let mut newest: Option<WindowCount> = None;
    for (k, v) in &map {
        let window: i64 = k
            .parse()
            .map_err(|_| malformed(format!("child {k:?} is not a window number")))?;
        let count = v
            .as_u64()
            .and_then(|c| u32::try_from(c).ok())
            .ok_or_else(|| malformed(format!("window {k} holds {v}, not a count")))?;
        if newest.is_none_or(|n| window > n.window) {
            newest = Some(WindowCount { window, count });
        }
    }
    Ok(newest)
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
        self.transact(limit, &keys::encode(key), window, costs)
            .await
    }

    async fn peek(&self, limit: &Limit, key: &str, window: i64) -> Result<WindowCount, StoreError> {
        let node = self.read(limit, &keys::encode(key)).await?;
        Ok(visible_count(node.value, window))
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        let encoded = keys::encode(key);
        let url = self.target.node_url(&limit.name, &encoded);
        self.nodes.invalidate(&(limit.name.clone(), encoded));
        let reply = self.send(Method::DELETE, &url, None, None).await?;
        if reply.status != StatusCode::OK {
            return Err(status_error(&reply));
        }
        Ok(())
    }

    async fn release(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        hits: u32,
    ) -> Result<bool, StoreError> {
        self.give_back(limit, &keys::encode(key), window, hits)
            .await
    }
    fn lost_race_since(&self, limit: &Limit, key: &str, since: std::time::Instant) -> bool {
        self.nodes
            .get(&(limit.name.clone(), keys::encode(key)))
            .and_then(|n| n.lost_race_at)
            .is_some_and(|at| at >= since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_parse_null_one_window_or_the_newest_of_several() {
        assert_eq!(parse_node("p", b"null"), Ok(None));
        assert_eq!(
            parse_node("p", br#"{"29408640": 7}"#),
            Ok(Some(WindowCount {
                window: 29_408_640,
                count: 7
            }))
        );
        assert_eq!(
            parse_node("p", br#"{"5": 1, "6": 2}"#),
            Ok(Some(WindowCount {
                window: 6,
                count: 2
            }))
        );
    }

    #[test]
    fn foreign_nodes_are_malformed_with_their_path() {
        for body in [
            &br#"{"hello": 1}"#[..],
            br#"{"5": "x"}"#,
            br#"{"5": -1}"#,
            br#"{"5": 1.5}"#,
            b"17",
            b"[1,2]",
            b"{",
        ] {
            match parse_node("rateLimits/mcp/k", body) {
                Err(StoreError::Malformed { path, .. }) => assert_eq!(path, "rateLimits/mcp/k"),
                other => panic!("{}: {other:?}", String::from_utf8_lossy(body)),
            }
        }
    }
}
