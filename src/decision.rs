//! What a rate decision is, shared by everything that makes or reads one: the service's
//! limiter, its fallback, its metrics and gRPC mapping, and the client library (which
//! decides alone when the service cannot answer, with the same types and rules).
//!
//! It owns [`Decision`] and [`Source`], the turning of a counter's outcome into a
//! decision ([`Decision::from_outcome`], [`Decision::contended`], [`Decision::from_state`]),
//! and the input rules every check passes before any counter is touched
//! ([`validate_key`], [`resolve_cost`], [`CheckError`]). Nothing here does I/O.
//!
//! ```
//! use ratelimit::decision::{Decision, Source, resolve_cost};
//! use ratelimit::limits::Limits;
//! use ratelimit::store::Outcome;
//!
//! let toml = "[[limit]]\nname = \"mcp\"\nrequests = 120\nwindow = \"60s\"\ndefault = true\n";
//! let limits = Limits::from_toml("limits.toml", toml)?;
//! let mcp = limits.get("mcp")?;
//! assert_eq!(resolve_cost(mcp, 0)?, 1); // a cost of 0 means 1
//! // 30 s into window 7: 119 counted, one more admitted.
//! let now_ms = 7 * 60_000 + 30_000;
//! let outcome = Outcome { allowed: true, count: 120 };
//! let d = Decision::from_outcome(mcp, now_ms, 7, outcome, Source::Store);
//! assert!(d.allowed && d.shared);
//! assert_eq!((d.limit, d.remaining, d.reset_after.as_secs()), (120, 0, 30));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::limits::{Limit, UnknownLimit};
use crate::store::counter::{Outcome, WindowCount};
use crate::window;
use std::sync::Arc;
use std::time::Duration;

/// Longest accepted key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 512;
/// How long a denial may be repeated without asking again (the service's deny-until
/// cache, the RTDB store's cached count, the client's deny-until cache): the bound on
/// how late a Reset elsewhere is seen.
pub const DEFAULT_DENY_TRUST: Duration = Duration::from_secs(1);
/// How long a check denied for contention is told to wait.
const CONTENDED_RETRY: Duration = Duration::from_secs(1);

/// Where a decision came from (mirrors the proto's `Source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The shared store decided.
    Store,
    /// The key was known to be exhausted for this window; no store call was made.
    DenyCache,
    /// The store failed; this instance's own window decided.
    LocalFallback,
    /// The store failed; the limit's `allow`/`deny` policy decided.
    FailurePolicy,
    /// The client library could not reach the service and decided alone.
    ClientFallback,
    /// Admitted from this instance's quota lease: hits already counted in the store.
    Lease,
}

impl Source {
    /// A short, stable name for logs, metrics and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Store => "store",
            Source::DenyCache => "deny_cache",
            Source::LocalFallback => "local_fallback",
            Source::FailurePolicy => "failure_policy",
            Source::ClientFallback => "client_fallback",
            Source::Lease => "lease",
        }
    }
}

/// A rate decision, with everything a caller needs for its response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is admitted (its cost has been counted).
    pub allowed: bool,
    /// Requests per window (`x-ratelimit-limit`).
    pub limit: u32,
    /// Requests left in this window after this decision (`x-ratelimit-remaining`).
    pub remaining: u32,
    /// Time until the window ends, whole seconds rounded up (`x-ratelimit-reset`).
    pub reset_after: Duration,
    /// When denied: time to wait, whole seconds rounded up (`retry-after`).
    pub retry_after: Option<Duration>,
    /// False when this instance decided alone.
    pub shared: bool,
    /// Where the decision came from.
    pub source: Source,
    /// The limit that decided.
    pub limit_name: Arc<str>,
    /// The window number.
    pub window: i64,
}

impl Decision {
    /// A decision for `limit` at `now_ms` from a counter `outcome` in `window`.
    pub fn from_outcome(
        limit: &Limit,
        now_ms: u64,
        window: i64,
        outcome: Outcome,
        source: Source,
    ) -> Self {
        let reset_after = whole_secs(window::until_end(now_ms, window, limit.window_ms));
        Self {
            allowed: outcome.allowed,
            limit: limit.requests,
            remaining: limit.requests.saturating_sub(outcome.count),
            reset_after,
            retry_after: (!outcome.allowed).then_some(reset_after),
            shared: matches!(source, Source::Store | Source::DenyCache | Source::Lease),
            source,
            limit_name: limit.name.clone(),
            window,
        }
    }

    /// A check denied because every write it had time for lost a race on the store (it
    /// is busy, not failing): shared, nothing counted, retry after a second (or when the
    /// window ends, if sooner). `remaining` is 0: no hit can be promised right now.
    pub fn contended(limit: &Limit, now_ms: u64, window: i64) -> Self {
        let outcome = Outcome {
            allowed: false,
            count: limit.requests,
        };
        let mut d = Self::from_outcome(limit, now_ms, window, outcome, Source::Store);
        d.retry_after = Some(
            CONTENDED_RETRY
                .min(d.reset_after)
                .max(Duration::from_secs(1)),
        );
        d
    }

    /// A decision that only reports `state` (a peek): allowed iff one more hit would fit.
    pub fn from_state(limit: &Limit, now_ms: u64, state: WindowCount, source: Source) -> Self {
        let outcome = Outcome {
            allowed: state.count < limit.requests,
            count: state.count,
        };
        Self::from_outcome(limit, now_ms, state.window, outcome, source)
    }
}

fn whole_secs(d: Duration) -> Duration {
    Duration::from_secs(window::ceil_secs(d))
}

/// Bad input. Each message names the field and the rule.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CheckError {
    /// `key` is empty.
    #[error("key: must not be empty")]
    EmptyKey,
    /// `key` is longer than [`MAX_KEY_BYTES`].
    #[error("key: must be at most {MAX_KEY_BYTES} bytes of UTF-8, got {0} bytes")]
    KeyTooLong(usize),
    /// `cost` exceeds the limit's requests, so it could never be admitted.
    #[error("cost: must not exceed the {requests} requests of limit {limit:?}, got {cost}")]
    CostTooLarge {
        cost: u32,
        requests: u32,
        limit: String,
    },
    /// The limit name is not configured.
    #[error(transparent)]
    UnknownLimit(#[from] UnknownLimit),
}

/// Checks a key against the key rules (DESIGN §3).
pub fn validate_key(key: &str) -> Result<(), CheckError> {
    match key.len() {
        0 => Err(CheckError::EmptyKey),
        n if n > MAX_KEY_BYTES => Err(CheckError::KeyTooLong(n)),
        _ => Ok(()),
    }
}

/// Resolves `cost` (0 means 1) and checks that it can ever fit in `limit`.
pub fn resolve_cost(limit: &Limit, cost: u32) -> Result<u32, CheckError> {
    let cost = cost.max(1);
    if cost > limit.requests {
        return Err(CheckError::CostTooLarge {
            cost,
            requests: limit.requests,
            limit: limit.name.to_string(),
        });
    }
    Ok(cost)
}

/// What a reset did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetOutcome {
    /// The limit whose window was cleared.
    pub limit_name: Arc<str>,
    /// The window number at the time of the reset.
    pub window: i64,
    /// False when the store failed and only this instance's window was cleared.
    pub shared: bool,
}
