//! The counter contract every store implements: [`CounterStore`], its values
//! ([`WindowCount`], [`Outcome`], [`Admission`]), its errors ([`StoreError`]), the shared
//! admission rule [`apply_batch`] and the batch deadline ([`with_deadline`]). `store/mod.rs`
//! only re-exports these (so backends import them from here, never through their parent).

use crate::limits::Limit;
use async_trait::async_trait;
use std::time::Duration;

/// A counter's state: `count` admitted hits in window number `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowCount {
    /// The window number (`floor(unix_ms / window_ms)`).
    pub window: i64,
    /// Hits admitted in that window.
    pub count: u32,
}

/// The fate of one cost in a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Whether this cost was admitted (and counted).
    pub allowed: bool,
    /// The window's count right after this item was decided.
    pub count: u32,
}

/// The result of one [`CounterStore::admit`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The window the batch was counted in. Normally the caller's; a newer one if the
    /// store already held a newer window (instance clocks differ by milliseconds and
    /// windows only move forward).
    pub window: i64,
    /// One outcome per cost, in the order given.
    pub outcomes: Vec<Outcome>,
}

/// Why a store call failed. Every variant makes the limiter fail open.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The call did not finish within its budget.
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store could not be reached, or the connection broke before a request was sent.
    #[error("store unreachable: {0}")]
    Connect(String),
    /// A write was sent but its answer was lost (timeout or broken connection afterwards):
    /// it may or may not have been applied, so it is never re-sent blindly.
    #[error("outcome of a sent write is unknown: {0}")]
    UnknownOutcome(String),
    /// The store answered with an error status.
    #[error("store answered HTTP {status}: {message}")]
    Status { status: u16, message: String },
    /// The store's credentials were refused or could not be obtained.
    #[error("store authentication failed: {0}")]
    Auth(String),
    /// A response or a stored node was not what this service writes.
    #[error("malformed data at {path}: {detail}")]
    Malformed { path: String, detail: String },
    /// Every transaction attempt lost a race.
    #[error("transaction gave up after {attempts} conflicting attempts")]
    Contention { attempts: u32 },
    /// The circuit breaker is open: the store was not called.
    #[error("store circuit breaker is open")]
    CircuitOpen,
}

impl StoreError {
    /// A short, stable name for logs and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Connect(_) => "connect",
            StoreError::UnknownOutcome(_) => "unknown_outcome",
            StoreError::Status { status, .. } if *status >= 500 => "server_error",
            StoreError::Status { .. } => "http_error",
            StoreError::Auth(_) => "auth",
            StoreError::Malformed { .. } => "malformed",
            StoreError::Contention { .. } => "contention",
            StoreError::CircuitOpen => "circuit_open",
        }
    }
}

/// Where counters live. Implementations must be safe to call concurrently.
#[async_trait]
pub trait CounterStore: Send + Sync + 'static {
    /// A short name for logs: `memory`, `rtdb`.
    fn name(&self) -> &'static str;

    /// True when this store talks over a network: the limiter then batches concurrent
    /// checks per key and keeps a deny-until cache in front of it. For an in-process
    /// store both would only add work.
    fn is_remote(&self) -> bool;

    /// Atomically applies `costs` (each ≥ 1, in order) to `(limit, key)` in `window`,
    /// following [`apply_batch`]. A counter of an older window is replaced by `window`
    /// in the same write.
    async fn admit(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        costs: &[u32],
    ) -> Result<Admission, StoreError>;

    /// One cost admitted at once, for a store that needs no I/O to answer: the limiter's
    /// direct path then skips the boxed future, the timer and the outcome vector of
    /// [`CounterStore::admit`] (a decision's hot path on the memory store). Same rule and
    /// atomicity as `admit`; returns the window counted in and the outcome. A store that
    /// must wait for anything returns `None` (the default), and `admit` is used.
    fn admit_at_once(
        &self,
        _limit: &Limit,
        _key: &str,
        _window: i64,
        _cost: u32,
    ) -> Option<(i64, Outcome)> {
        None
    }

    /// The counter's current state as seen from `window`, without changing it: the
    /// count of `window` (0 if the store holds an older one), or of a newer window.
    async fn peek(&self, limit: &Limit, key: &str, window: i64) -> Result<WindowCount, StoreError>;

    /// Clears the counter of `(limit, key)`, whatever window it holds.
    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError>;

    /// Gives back `hits` that were counted but never used (an unspent quota lease,
    /// DESIGN §9): lowers the count of `(limit, key)` by at most `hits`, never below
    /// `keep` (the hits the lease holder admitted: a counter holding less was emptied by a
    /// Reset since, and what it holds now is others' hits, `Lease::keep`), and only while
    /// the counter still holds `window`. Returns whether anything was given back. A write
    /// whose outcome is unknown is not re-sent (giving back twice would over-admit).
    ///
    /// The default gives nothing back: the hits then stay counted until the window ends,
    /// which can only under-admit.
    async fn release(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        hits: u32,
        keep: u32,
    ) -> Result<bool, StoreError> {
        let _ = (limit, key, window, hits, keep);
        Ok(false)
    }
    /// Whether a write to `(limit, key)` lost a race at or after `since`: the store
    /// answered, but another writer had changed the counter first. When a check's budget
    /// runs out, this tells contention (the store is healthy; the check is denied, never
    /// admitted locally) from an outage (fail open). Stores whose writes cannot conflict
    /// keep the default, `false`.
    fn lost_race_since(&self, limit: &Limit, key: &str, since: std::time::Instant) -> bool {
        let _ = (limit, key, since);
        false
    }
}

tokio::task_local! {
    static DEADLINE: std::time::Instant;
}

/// Runs a store call that must answer by `deadline`. A store whose transactions retry
/// (RTDB, after `412`) reads it with [`deadline`] and stops retrying, with
/// [`StoreError::Contention`], when another attempt would not be answered in time: a
/// write cut off mid-flight could still land for checks already answered. It is ambient
/// (a task-local) so that the [`CounterStore`] seam stays one call per batch.
pub async fn with_deadline<F: std::future::Future>(
    deadline: std::time::Instant,
    call: F,
) -> F::Output {
    DEADLINE.scope(deadline, call).await
}

/// The deadline of the store call being made, if its caller set one ([`with_deadline`]).
#[doc(hidden)]
pub fn deadline() -> Option<std::time::Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// Runs a store call within `budget`; running out of time is [`StoreError::Timeout`].
/// Every bounded store call goes through here, so a timeout means the same everywhere.
#[doc(hidden)]
pub async fn within<T>(
    budget: Duration,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(budget, call)
        .await
        .unwrap_or(Err(StoreError::Timeout(budget)))
}

/// The admission rule, shared by every store.
///
/// Starting from `stored` (the counter as the store holds it, if at all), counts in
/// `window` unless the store already holds a newer window, in which case that one is
/// used. Each cost is admitted iff `count + cost ≤ limit`; a denied cost adds nothing
/// (the count stays the number of admitted hits), and a later, smaller cost in the same
/// batch may still fit. Returns the new counter and one outcome per cost.
pub fn apply_batch(
    stored: Option<WindowCount>,
    window: i64,
    limit: u32,
    costs: &[u32],
) -> (WindowCount, Vec<Outcome>) {
    let mut state = match stored {
        Some(s) if s.window >= window => s,
        _ => WindowCount { window, count: 0 },
    };
    let outcomes = costs
        .iter()
        .map(|&cost| admit_cost(&mut state.count, limit, cost))
        .collect();
    (state, outcomes)
}

/// [`apply_batch`]'s rule for one cost: admitted iff `count + cost ≤ limit`, and only an
/// admitted cost is added to `count`.
pub fn admit_cost(count: &mut u32, limit: u32, cost: u32) -> Outcome {
    let fits = count.checked_add(cost).is_some_and(|next| next <= limit);
    if fits {
        *count += cost;
    }
    Outcome {
        allowed: fits,
        count: *count,
    }
}

/// How many windows ahead of a caller's a *shared* counter may be and still count for it.
/// Instance clocks differ by milliseconds, so a check computed just before a boundary may
/// meet a counter another instance already moved to the next window (counted there,
/// never overwritten: windows only move forward). A counter further ahead was written by
/// a clock that is wrong, or by hand; adopting it would publish a reset hours or days
/// away and refuse the key until then, so it is treated as absent ([`within_reach`]) and
/// the next admitted check replaces it.
pub const MAX_WINDOWS_AHEAD: i64 = 1;

/// `stored`, a shared store's counter, as a caller in `window` may use it: `None` when it
/// holds a window more than [`MAX_WINDOWS_AHEAD`] ahead (logged as a warning at `path`
/// when `log`: a clock in the fleet is wrong).
pub fn within_reach(
    stored: Option<WindowCount>,
    window: i64,
    path: &str,
    log: bool,
) -> Option<WindowCount> {
    match stored {
        Some(s) if s.window.saturating_sub(window) > MAX_WINDOWS_AHEAD => {
            if log {
                tracing::warn!(
                    node = path,
                    stored_window = s.window,
                    window,
                    "counter holds a window too far ahead of this instance's clock; replacing it (check the clocks of the fleet)"
                );
            }
            None
        }
        other => other,
    }
}

/// The count that `stored` means for a reader in `window`.
pub fn visible_count(stored: Option<WindowCount>, window: i64) -> WindowCount {
    match stored {
        Some(s) if s.window >= window => s,
        _ => WindowCount { window, count: 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(outcomes: &[Outcome]) -> Vec<bool> {
        outcomes.iter().map(|o| o.allowed).collect()
    }

    #[test]
    fn a_shared_counter_one_window_ahead_counts_and_one_further_is_set_aside() {
        let at = |window| Some(WindowCount { window, count: 7 });
        assert_eq!(
            within_reach(at(11), 10, "p", false),
            at(11),
            "a boundary race"
        );
        assert_eq!(within_reach(at(10), 10, "p", false), at(10));
        assert_eq!(
            within_reach(at(3), 10, "p", false),
            at(3),
            "older: apply_batch's"
        );
        assert_eq!(within_reach(at(12), 10, "p", false), None);
        assert_eq!(within_reach(at(i64::MAX), 10, "p", false), None);
        let (next, out) = apply_batch(within_reach(at(10_000), 10, "p", false), 10, 5, &[1]);
        assert_eq!(
            (next, out[0].allowed),
            (
                WindowCount {
                    window: 10,
                    count: 1
                },
                true
            )
        );
    }

    #[test]
    fn batch_admits_in_order_until_full_and_denied_costs_count_nothing() {
        let (state, out) = apply_batch(None, 7, 5, &[2, 2, 2, 1]);
        assert_eq!(
            state,
            WindowCount {
                window: 7,
                count: 5
            }
        );
        assert_eq!(allowed(&out), [true, true, false, true]);
        assert_eq!(
            out.iter().map(|o| o.count).collect::<Vec<_>>(),
            [2, 4, 4, 5]
        );
    }

    #[test]
    fn an_older_window_is_replaced_and_a_newer_one_is_kept() {
        let old = Some(WindowCount {
            window: 6,
            count: 5,
        });
        let (state, out) = apply_batch(old, 7, 5, &[1]);
        assert_eq!(
            state,
            WindowCount {
                window: 7,
                count: 1
            }
        );
        assert!(out[0].allowed);

        let newer = Some(WindowCount {
            window: 8,
            count: 4,
        });
        let (state, out) = apply_batch(newer, 7, 5, &[1, 1]);
        assert_eq!(
            state,
            WindowCount {
                window: 8,
                count: 5
            }
        );
        assert_eq!(allowed(&out), [true, false]);
    }

    #[test]
    fn exact_fit_is_admitted_and_overflow_never_wraps() {
        let (_, out) = apply_batch(
            Some(WindowCount {
                window: 1,
                count: 119,
            }),
            1,
            120,
            &[1, 1],
        );
        assert_eq!(allowed(&out), [true, false]);
        let (state, out) = apply_batch(
            Some(WindowCount {
                window: 1,
                count: u32::MAX - 1,
            }),
            1,
            u32::MAX,
            &[5],
        );
        assert!(!out[0].allowed);
        assert_eq!(state.count, u32::MAX - 1);
    }

    #[test]
    fn visible_count_ignores_older_windows() {
        assert_eq!(
            visible_count(
                Some(WindowCount {
                    window: 3,
                    count: 9
                }),
                4
            )
            .count,
            0
        );
        assert_eq!(
            visible_count(
                Some(WindowCount {
                    window: 4,
                    count: 9
                }),
                4
            )
            .count,
            9
        );
        assert_eq!(
            visible_count(None, 4),
            WindowCount {
                window: 4,
                count: 0
            }
        );
    }
}
