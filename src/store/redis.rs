//! `RedisStore`: counters in Redis (or Valkey, Memorystore), one server-side script per batch.
//!
//! The ADR's "one-file change" (DESIGN §11): this module, with its connection in
//! `redis/link.rs`. What it owns, and why:
//!
//! - **One round trip per batch.** [`ADMIT`] is a Lua script run by `EVALSHA`: it reads the
//!   counter, admits the batch's costs in order against the limit, writes the new value
//!   with its expiry, and answers with the state it started from. Redis runs a script
//!   atomically, so writers never race and this store never reports lost races
//!   (`lost_race_since` keeps its default). The script is loaded once per server; a
//!   `NOSCRIPT` (restart, `SCRIPT FLUSH`, failover) loads it again and re-sends, which is
//!   safe because `NOSCRIPT` means nothing ran (redis' `Script` type does this).
//! - **The arithmetic is `apply_batch`'s.** The script's answer carries the value it read;
//!   the outcomes are computed from it by [`apply_batch`], and the script's own result
//!   must agree with it or the call is [`StoreError::Malformed`]. Windows only move
//!   forward: a counter already in a newer window is counted there (up to
//!   [`MAX_WINDOWS_AHEAD`]; one further ahead is replaced, `within_reach`).
//! - **Layout.** One string per `(limit, key)`: `{prefix}{{limit}:{encoded key}}` holding
//!   `"<window>:<count>"`. The braces are a Redis Cluster hash tag, so a key's counter
//!   always lives on one slot; [`encode`] percent-escapes `%`, `{`, `}`, `:`, control and
//!   non-ASCII bytes, so no caller key can close the tag, forge the separator or collide
//!   with another key.
//! - **Expiry.** Every write sets `PX` to the end of the counter's window plus [`GRACE`],
//!   measured from the service's clock, so no counter outlives its window by more.
//! - **Unknown outcomes.** A write whose connection broke or timed out after it was sent
//!   may have run: it is [`StoreError::UnknownOutcome`] and is never re-sent. Only a
//!   failure to connect, where nothing was sent, is [`StoreError::Connect`].
//! - **One multiplexed connection** (`redis/link.rs`), opened lazily (the service starts
//!   and fails open while Redis is down), replaced after an error or an abandoned call,
//!   and probed with `PING` after a silence, so a write never goes out on a connection
//!   Redis closed while it was idle; concurrent calls share it and a reconnect.
//!
//! Batching, single flight, the breaker, the budget and the deny-until cache stay in the
//! limiter, as for RTDB.

use crate::clock::SharedClock;
use crate::limits::Limit;
use crate::store::counter::{
    Admission, CounterStore, MAX_WINDOWS_AHEAD, StoreError, WindowCount, apply_batch,
    visible_count, within_reach,
};
use async_trait::async_trait;
use link::{Link, is_auth};
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisError, Script};
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod link;

/// How long a counter outlives its window: a check computed just before the boundary may
/// arrive a little after it, and instance clocks differ slightly.
pub const GRACE: Duration = Duration::from_secs(5);

/// The admission script. `KEYS[1]`: the counter. ARGV: window, limit, now_ms, window_ms,
/// grace_ms, [`MAX_WINDOWS_AHEAD`], then the costs in order. Answers `{had, stored_window, stored_count,
/// window, count}`; writes only when something was admitted.
pub const ADMIT: &str = r#"
local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' and raw.err then return redis.error_reply('MALFORMED ' .. raw.err) end
local window, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, len, grace = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local had, sw, sc = 0, 0, 0
if raw then
  local w, c = string.match(raw, '^(%d+):(%d+)$')
  if not w then return redis.error_reply('MALFORMED not a window:count value') end
  had, sw, sc = 1, tonumber(w), tonumber(c)
end
local w, c = window, 0
if had == 1 and sw >= window and sw - window <= tonumber(ARGV[6]) then w, c = sw, sc end
local admitted = false
for i = 7, #ARGV do
  local cost = tonumber(ARGV[i])
  if c + cost <= limit then c = c + cost; admitted = true end
end
if admitted then
  local ttl = math.max((w + 1) * len - now + grace, 1)
  redis.call('SET', KEYS[1], string.format('%d:%d', w, c), 'PX', string.format('%d', ttl))
end
return {had, sw, sc, w, c}
"#;

/// The give-back script (unspent quota leases). `KEYS[1]`: the counter. ARGV: window, hits,
/// now_ms, window_ms, grace_ms, keep. Lowers the count by at most `hits`, never below
/// `keep`, only while the counter holds `window`. Answers 1 if it gave anything back.
pub const RELEASE: &str = r#"
local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' and raw.err then return redis.error_reply('MALFORMED ' .. raw.err) end
if not raw then return 0 end
local w, c = string.match(raw, '^(%d+):(%d+)$')
if not w then return redis.error_reply('MALFORMED not a window:count value') end
local window, hits = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, len, grace = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local keep = tonumber(ARGV[6])
w, c = tonumber(w), tonumber(c)
if w ~= window or c <= keep or hits == 0 then return 0 end
local ttl = math.max((w + 1) * len - now + grace, 1)
redis.call('SET', KEYS[1], string.format('%d:%d', w, c - math.min(hits, c - keep)), 'PX', string.format('%d', ttl))
return 1
"#;

/// The error code the scripts answer with when a counter is not one this service wrote.
const MALFORMED_CODE: &str = "MALFORMED";

/// Escaped in caller keys: the hash-tag braces, the separator, `%` itself, and control
/// bytes; `percent-encoding` also escapes every non-ASCII byte.
const ESCAPED: &AsciiSet = &CONTROLS.add(b'%').add(b'{').add(b'}').add(b':');

/// Encodes a caller key for the Redis key (`%XX`, uppercase hex). Injective, because `%`
/// is itself escaped; the output never holds `{`, `}` or `:`. [`decode`] inverts it.
#[doc(hidden)]
pub fn encode(key: &str) -> String {
    utf8_percent_encode(key, ESCAPED).to_string()
}

/// Decodes what [`encode`] produced; `None` for anything it never produces.
#[doc(hidden)]
pub fn decode(encoded: &str) -> Option<String> {
    let key = percent_decode_str(encoded).decode_utf8().ok()?.into_owned();
    (encode(&key) == encoded).then_some(key)
}

/// Parses a stored `"<window>:<count>"`.
fn parse_value(raw: &str) -> Option<WindowCount> {
    let (w, c) = raw.split_once(':')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (window, count) = (w.parse().ok()?, c.parse().ok()?);
    (digits(w) && digits(c)).then_some(WindowCount { window, count })
}

/// Settings of a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Prepended to every key (no braces: they would move the hash tag).
    pub prefix: String,
    /// PEM CA certificates to trust for `rediss://` instead of the webpki roots
    /// (Memorystore signs with its own CA).
    pub ca_file: Option<PathBuf>,
    /// TCP + TLS + AUTH/SELECT.
    pub connect_timeout: Duration,
    /// A backstop per command; the limiter's budget is usually shorter.
    pub response_timeout: Duration,
    /// A connection that has not answered for this long is sent a `PING` before the
    /// next command, and replaced if it is dead (`redis/link.rs`: a write sent on a
    /// connection closed while idle would be an unknown outcome).
    pub probe_after: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: "rl:".into(),
            ca_file: None,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            probe_after: Duration::from_secs(1),
        }
    }
}

/// Why a `RedisStore` could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    /// The URL is not a `redis://` or `rediss://` URL the client accepts. The URL itself
    /// is never quoted: it may hold a password.
    #[error("--redis-url: {0}")]
    Url(String),
    /// The key prefix would break the hash tag.
    #[error("--redis-prefix {0:?}: must not contain '{{' or '}}'")]
    Prefix(String),
    /// The CA file could not be read.
    #[error("--redis-ca-file {path}: {error}")]
    CaFile { path: String, error: String },
}

/// Counters in Redis.
pub struct RedisStore {
    link: Link,
    admit: Script,
    release: Script,
    prefix: String,
    clock: SharedClock,
    endpoint: String,
}

impl RedisStore {
    /// A store for `url` (`redis://[user:password@]host[:port][/db]` or `rediss://…`).
    /// Nothing is connected yet: the first call connects.
    pub fn new(
        url: &str,
        options: RedisOptions,
        clock: SharedClock,
    ) -> Result<Self, RedisSetupError> {
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err(RedisSetupError::Url(
                "must start with redis:// or rediss://".into(),
            ));
        }
        if options.prefix.contains(['{', '}']) {
            return Err(RedisSetupError::Prefix(options.prefix));
        }
        crate::install_crypto_provider();
        let info = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(|e| RedisSetupError::Url(e.to_string()))?;
        let endpoint = describe(&info);
        let client = match &options.ca_file {
            None => redis::Client::open(info),
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| RedisSetupError::CaFile {
                    path: path.display().to_string(),
                    error: e.to_string(),
                })?;
                let certs = redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                };
                redis::Client::build_with_tls(info, certs)
            }
        }
        .map_err(|e| RedisSetupError::Url(e.to_string()))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout));
        Ok(Self {
            link: Link::new(client, config, options.probe_after),
            admit: Script::new(ADMIT),
            release: Script::new(RELEASE),
            prefix: options.prefix,
            clock,
            endpoint,
        })
    }

    /// The endpoint, for the startup log (never the password).
    pub fn describe(&self) -> &str {
        &self.endpoint
    }

    /// The Redis key of `(limit, key)`: `{prefix}{limit:encoded}`.
    pub fn redis_key(&self, limit: &Limit, key: &str) -> String {
        format!("{}{{{}:{}}}", self.prefix, limit.name, encode(key))
    }

    /// Runs one command on the shared connection. `write`: whether a lost answer leaves
    /// the outcome unknown. `op` names it in metrics.
    async fn call<T, F, Fut>(&self, op: &str, key: &str, write: bool, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let (generation, conn) = self.link.get().await?;
        let started = Instant::now();
        let result = self.link.unless_abandoned(generation, f(conn)).await;
        // Answers only (200 or an error reply); a broken call has no duration worth keeping.
        match &result {
            Ok(_) => {
                self.link.answered();
                crate::metrics::store_request(op, 200, started.elapsed());
            }
            Err(e) if matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension) => {
                self.link.answered();
                crate::metrics::store_request(op, 500, started.elapsed());
            }
            Err(_) => {}
        }
        result.map_err(|e| {
            let err = call_error(&e, key, write);
            if !matches!(err, StoreError::Malformed { .. }) {
                // Broken, timed out, refused or demoted: the next call connects afresh.
                self.link.discard(generation);
            }
            err
        })
    }

    /// `name rkey`, through [`Self::call`].
    async fn command<T: redis::FromRedisValue>(
        &self,
        name: &'static str,
        rkey: &str,
        write: bool,
    ) -> Result<T, StoreError> {
        let cmd = redis::cmd(name).arg(rkey).clone();
        self.call(name, rkey, write, |mut c| async move {
            cmd.query_async(&mut c).await
        })
        .await
    }

    fn ttl_args(&self, limit: &Limit) -> [u64; 3] {
        let grace = u64::try_from(GRACE.as_millis()).unwrap_or(u64::MAX);
        [self.clock.now_ms(), limit.window_ms, grace]
    }
}

fn describe(info: &redis::ConnectionInfo) -> String {
    let settings = info.redis_settings();
    let user = settings.username().map(|u| format!(" user={u}"));
    let auth = settings.password().map(|_| " auth=password");
    let (scheme, host, port) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => ("redis", host, port),
        ConnectionAddr::TcpTls { host, port, .. } => ("rediss", host, port),
        other => return other.to_string(),
    };
    let (db, user, auth) = (settings.db(), user.unwrap_or_default(), auth.unwrap_or(""));
    format!("{scheme}://{host}:{port}/{db}{user}{auth}")
}

/// A failed command on an open connection.
fn call_error(e: &RedisError, key: &str, write: bool) -> StoreError {
    let message = e.to_string();
    match e.kind() {
        _ if is_auth(e) => StoreError::Auth(message),
        // The server answered, and says the counter is not ours: data, not health.
        ErrorKind::Extension if matches!(e.code(), Some(MALFORMED_CODE | "WRONGTYPE")) => {
            StoreError::Malformed {
                path: key.to_owned(),
                detail: message,
            }
        }
        ErrorKind::UnexpectedReturnType => StoreError::Malformed {
            path: key.to_owned(),
            detail: message,
        },
        // Answered with an error (LOADING, READONLY, OOM, BUSY, MOVED, …): a server fault.
        ErrorKind::Server(_) | ErrorKind::Extension => StoreError::Status {
            status: 503,
            message: format!("redis: {message}"),
        },
        // Broken connection, response timeout, unparseable reply: a write may have run.
        _ if write => StoreError::UnknownOutcome(message),
        _ => StoreError::Connect(message),
    }
}

#[async_trait]
impl CounterStore for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
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
        let rkey = self.redis_key(limit, key);
        let mut invocation = self.admit.key(&rkey);
        invocation
            .arg(window)
            .arg(limit.requests)
            .arg(&self.ttl_args(limit)[..])
            .arg(MAX_WINDOWS_AHEAD)
            .arg(costs);
        let reply: Vec<i64> = self
            .call("EVALSHA", &rkey, true, |mut c| async move {
                invocation.invoke_async(&mut c).await
            })
            .await?;
        let malformed = |detail: String| StoreError::Malformed {
            path: rkey.clone(),
            detail,
        };
        let [had, sw, sc, w, c] = reply[..] else {
            return Err(malformed(format!("admit script answered {reply:?}")));
        };
        let count = u32::try_from(sc).map_err(|_| malformed(format!("count {sc}")))?;
        let stored = (had == 1).then_some(WindowCount { window: sw, count });
        let stored = within_reach(stored, window, &rkey, true);
        let (next, outcomes) = apply_batch(stored, window, limit.requests, costs);
        if (i64::from(next.count), next.window) != (c, w) {
            return Err(malformed(format!(
                "script counted {w}:{c}, the admission rule {}:{}",
                next.window, next.count
            )));
        }
        Ok(Admission {
            window: next.window,
            outcomes,
        })
    }

    async fn peek(&self, limit: &Limit, key: &str, window: i64) -> Result<WindowCount, StoreError> {
        let rkey = self.redis_key(limit, key);
        let raw: Option<String> = self.command("GET", &rkey, false).await?;
        let stored = match raw {
            None => None,
            Some(v) => Some(parse_value(&v).ok_or_else(|| StoreError::Malformed {
                path: rkey.clone(),
                detail: "not a window:count value".into(),
            })?),
        };
        Ok(visible_count(
            within_reach(stored, window, &rkey, false),
            window,
        ))
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        let rkey = self.redis_key(limit, key);
        let _: i64 = self.command("DEL", &rkey, true).await?;
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
        let rkey = self.redis_key(limit, key);
        let mut invocation = self.release.key(&rkey);
        invocation
            .arg(window)
            .arg(hits)
            .arg(&self.ttl_args(limit)[..])
            .arg(keep);
        let released: i64 = self
            .call("EVALSHA", &rkey, true, |mut c| async move {
                invocation.invoke_async(&mut c).await
            })
            .await?;
        Ok(released == 1)
    }
}
