//! The client's deny-until cache: once the service refuses a key, further checks of it
//! are refused here, with no RPC, until the `retry_after` the service gave has passed.
//!
//! This is what keeps an exhausted or abusive key from costing the service (and RTDB)
//! anything: the caller's retries are answered in-process. Two details keep it exact:
//! - it remembers the `remaining` the service reported, and only refuses checks whose
//!   cost exceeds it (counts only grow within a window, so such a check would be refused
//!   anyway); a smaller check still goes to the service, which may admit it;
//! - it follows the client's injectable clock, so tests can step past `retry_after`;
//! - it never outlives the refusal's window: `reset_after` is rounded up to the second,
//!   so a refusal is trusted at most until a second before it ([`DenyUntil::record`]).
//!
//! A refusal is **trusted for `trust`** (default 1 s, [`crate::decision::DEFAULT_DENY_TRUST`])
//! at most, however long `retry_after` is: a Reset made elsewhere (through another
//! client or instance) frees the key, and this process hears of it only by asking. So a
//! refused key costs at most one RPC per `trust` (answered by the service from its own
//! deny-until cache, without a store call), and a Reset made through this client clears
//! its entry at once ([`DenyUntil::clear`]).
//!
//! Only the service's own refusals are cached. A refusal decided by the limit's failure
//! policy (`deny` while the store is down) says nothing about the key's usage, and the
//! client's own fallback refusals are already answered without the service.

use crate::cache_key::{CacheKey, KeyRef};
use crate::decision::{Decision, Source};
use crate::memory_budget;
use crate::window;
use moka::Expiry;
use moka::sync::Cache;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
struct Entry {
    /// The service's refusal holds until this time (client clock, Unix ms).
    until_ms: u64,
    /// Refuse without asking until this time: `until_ms` or the end of the trust period.
    trusted_until_ms: u64,
    /// Time to live on moka's real clock; only frees memory, correctness uses `until_ms`.
    ttl: Duration,
    remaining: u32,
    limit: u32,
    shared: bool,
    limit_name: Arc<str>,
    window: i64,
}

struct UntilRetry;

impl Expiry<CacheKey, Entry> for UntilRetry {
    fn expire_after_create(&self, _: &CacheKey, entry: &Entry, _: Instant) -> Option<Duration> {
        Some(entry.ttl)
    }

    fn expire_after_update(
        &self,
        _: &CacheKey,
        entry: &Entry,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(entry.ttl)
    }
}

/// The window length part of this cache's keys: none, as entries are keyed by the limit
/// name the caller used (the service's limit may be unknown here) and hold no window
/// number to compare, only clock times.
const BY_NAME: u64 = 0;

/// `(limit, key)` → the service's last refusal, while it holds.
pub(crate) struct DenyUntil {
    entries: Cache<CacheKey, Entry>,
    trust_ms: u64,
}

impl DenyUntil {
    /// An empty cache whose refusals are believed for at most `trust`, within the
    /// default client budget's deny share.
    #[cfg(test)]
    pub(crate) fn new(trust: Duration) -> Self {
        let bytes = memory_budget::MemoryBudget::new(memory_budget::DEFAULT_CLIENT_MEMORY_LIMIT)
            .client()
            .deny;
        Self::with_budget(trust, bytes)
    }

    /// An empty cache of at most `bytes` (keys included); an evicted entry only costs
    /// one RPC later.
    pub(crate) fn with_budget(trust: Duration, bytes: u64) -> Self {
        const FIXED: usize = size_of::<CacheKey>() + 2 * 16 + size_of::<Entry>();
        Self {
            entries: memory_budget::bounded(bytes, "client_deny", |k: &CacheKey, _: &Entry| {
                FIXED + k.heap_len()
            })
            .expire_after(UntilRetry)
            .build(),
            trust_ms: u64::try_from(trust.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Remembers `decision` for `(limit, key)` if it is a refusal by the service;
    /// `sent_ms`: when the check that got it was sent.
    ///
    /// A refusal holds only in its own window, and the answer says when that ends only to
    /// the second: `reset_after` is rounded up, so the window ends less than a second
    /// before `decision time + reset_after`, and never before `sent_ms + reset_after − 1 s`.
    /// The refusal is trusted no longer than that, so no check of the next window is ever
    /// refused here (a key refused in its window's last second is not kept at all).
    pub(crate) fn record(&self, limit: &str, key: &str, decision: &Decision, sent_ms: u64) {
        let by_the_service = matches!(
            decision.source,
            Source::Store | Source::DenyCache | Source::LocalFallback | Source::Lease
        );
        if decision.allowed || !by_the_service {
            return;
        }
        let wait = decision.retry_after.unwrap_or(decision.reset_after);
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let window_left_ms = u64::try_from(decision.reset_after.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_sub(1_000);
        let trusted_ms = wait_ms.min(self.trust_ms).min(window_left_ms);
        if trusted_ms == 0 {
            return;
        }
        self.entries.insert(
            CacheKey::new(Arc::from(limit), key, BY_NAME),
            Entry {
                until_ms: sent_ms.saturating_add(wait_ms),
                trusted_until_ms: sent_ms.saturating_add(trusted_ms),
                ttl: Duration::from_millis(trusted_ms),
                remaining: decision.remaining,
                limit: decision.limit,
                shared: decision.shared,
                limit_name: decision.limit_name.clone(),
                window: decision.window,
            },
        );
    }

    /// Forgets the refusal of `(limit, key)` (after a Reset through this client).
    pub(crate) fn clear(&self, limit: &str, key: &str) {
        self.entries
            .invalidate(KeyRef::new(limit, key, BY_NAME).dyn_ref());
    }

    /// A refusal for `cost` hits of `(limit, key)` at `now_ms`, if one is known to hold.
    pub(crate) fn check(&self, limit: &str, key: &str, cost: u32, now_ms: u64) -> Option<Decision> {
        let entry = self
            .entries
            .get(KeyRef::new(limit, key, BY_NAME).dyn_ref())?;
        if now_ms >= entry.trusted_until_ms || cost <= entry.remaining {
            return None;
        }
        let wait = Duration::from_secs(window::ceil_secs(Duration::from_millis(
            entry.until_ms - now_ms,
        )));
        Some(Decision {
            allowed: false,
            limit: entry.limit,
            remaining: entry.remaining,
            reset_after: wait,
            retry_after: Some(wait),
            shared: entry.shared,
            source: Source::DenyCache,
            limit_name: entry.limit_name,
            window: entry.window,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(remaining: u32, source: Source) -> Decision {
        Decision {
            allowed: false,
            limit: 3,
            remaining,
            reset_after: Duration::from_secs(50),
            retry_after: Some(Duration::from_secs(50)),
            shared: true,
            source,
            limit_name: Arc::from("t"),
            window: 7,
        }
    }

    #[test]
    fn a_refusal_holds_until_retry_after_then_lapses() {
        let c = DenyUntil::new(Duration::from_secs(3_600));
        c.record("t", "k", &refusal(0, Source::Store), 1_000);
        let d = c.check("t", "k", 1, 1_000).expect("refused locally");
        assert_eq!(d.source, Source::DenyCache);
        assert_eq!(d.retry_after, Some(Duration::from_secs(50)));
        assert!(d.shared && !d.allowed);
        let later = c.check("t", "k", 1, 49_999).expect("still refused");
        assert_eq!(
            later.retry_after,
            Some(Duration::from_secs(2)),
            "rounded up"
        );
        assert!(
            c.check("t", "k", 1, 50_000).is_none(),
            "lapsed: the window may end within its last second"
        );
        assert!(c.check("t", "other", 1, 1_000).is_none());
        assert!(c.check("u", "k", 1, 1_000).is_none());
    }

    #[test]
    fn a_refusal_is_believed_for_the_trust_period_at_most_and_cleared_by_a_reset() {
        let c = DenyUntil::new(Duration::from_millis(1_000));
        c.record("t", "k", &refusal(0, Source::Store), 1_000);
        let d = c.check("t", "k", 1, 1_999).expect("trusted");
        assert_eq!(
            d.retry_after,
            Some(Duration::from_secs(50)),
            "the service's own wait (49.001 s, rounded up)"
        );
        assert!(
            c.check("t", "k", 1, 2_000).is_none(),
            "ask the service again"
        );
        c.record("t", "k", &refusal(0, Source::Store), 2_000);
        assert!(c.check("t", "k", 1, 2_000).is_some());
        c.clear("t", "k");
        assert!(c.check("t", "k", 1, 2_000).is_none(), "reset: at once");
    }

    #[test]
    fn a_refusal_is_never_trusted_into_the_next_window() {
        // A refusal whose window ends within `secs` (as the service rounds it up).
        let ending_within = |secs| Decision {
            reset_after: Duration::from_secs(secs),
            retry_after: Some(Duration::from_secs(secs)),
            ..refusal(0, Source::Store)
        };
        // Refused 1.7 s into a 2 s window: the service says 1 s (0.3 s, rounded up).
        let c = DenyUntil::new(Duration::from_secs(1));
        c.record("t", "k", &ending_within(1), 1_700);
        assert!(
            c.check("t", "k", 1, 1_701).is_none(),
            "its window ends within the second: not kept"
        );
        // With 2 s (1.1 to 2 s left), trusted for at most 1 s from when it was asked.
        let c = DenyUntil::new(Duration::from_secs(5));
        c.record("t", "k", &ending_within(2), 1_000);
        assert!(c.check("t", "k", 1, 1_999).is_some());
        assert!(c.check("t", "k", 1, 2_000).is_none());
    }

    #[test]
    fn a_refused_large_cost_does_not_block_a_smaller_one_that_fits() {
        let c = DenyUntil::new(Duration::from_secs(3_600));
        c.record("t", "k", &refusal(2, Source::Store), 0);
        assert!(c.check("t", "k", 2, 0).is_none(), "2 may still fit");
        assert!(c.check("t", "k", 3, 0).is_some());
    }

    #[test]
    fn only_the_services_refusals_of_the_key_are_cached() {
        let c = DenyUntil::new(Duration::from_secs(3_600));
        c.record("t", "a", &refusal(0, Source::FailurePolicy), 0);
        c.record("t", "b", &refusal(0, Source::ClientFallback), 0);
        let mut allowed = refusal(0, Source::Store);
        allowed.allowed = true;
        c.record("t", "c", &allowed, 0);
        for k in ["a", "b", "c"] {
            assert!(c.check("t", k, 1, 0).is_none(), "{k}");
        }
    }

    #[test]
    fn a_check_allocates_nothing_to_look_its_key_up() {
        let c = DenyUntil::new(Duration::from_secs(3_600));
        c.record("t", "k", &refusal(0, Source::Store), 0);
        c.entries.run_pending_tasks();
        let (n, hit) = crate::alloc_count::allocations(|| c.check("t", "k", 1, 0));
        assert!(hit.is_some());
        assert_eq!(n, 0, "a refusal answered here");
        // moka's map has 64 segments, each allocated on its first use; a few thousand
        // keys touch them all, and after that a miss allocates nothing either.
        for i in 0..4_096 {
            assert!(c.check("t", &format!("warm-{i}"), 1, 0).is_none());
        }
        let (n, miss) = crate::alloc_count::allocations(|| c.check("t", "another", 1, 0));
        assert!(miss.is_none());
        assert_eq!(n, 0, "a key not refused");
    }
}
