//! The deny-until cache: once a key is known to be exhausted for window `w`, further
//! checks in `w` are denied on this instance with no store call.
//!
//! Counts only grow within a window, so "exhausted in `w`" would stay true until `w`
//! ends, were it not for `Reset`: a Reset through another instance frees the key in the
//! store, and this instance cannot hear of it. So an entry is **trusted for `trust`**
//! (default [`DEFAULT_TRUST`], 1 s) after the store last said "exhausted"; then the next
//! check asks the store again (for RTDB: one read, as the store's cached count is
//! trusted no longer either), and a denial renews the entry. A Reset anywhere therefore
//! frees the key everywhere within about `trust`, and an exhausted key costs at most one
//! store request per `trust` per instance instead of one per check: 1,000 extra checks
//! in a second cost 1 request. Time is the limiter's injected clock.

use crate::cache_key::{CacheKey, KeyRef};
use crate::clock::SharedClock;
use crate::limits::Limit;
use crate::memory_budget::{self, MemoryBudget};
use moka::sync::Cache;
use std::time::Duration;

/// How long "exhausted" is believed without asking the store again, by default.
pub(crate) use crate::decision::DEFAULT_DENY_TRUST as DEFAULT_TRUST;

/// When the store said a key was exhausted, and for which window.
#[derive(Debug, Clone, Copy)]
struct Exhausted {
    window: i64,
    /// Clock time (Unix ms) of the store's answer.
    seen_ms: u64,
}

/// `(limit, key)` → the window in which the key is exhausted.
pub struct DenyCache {
    /// Keyed with the window length, so a limit reloaded with another length never
    /// compares window numbers of two scales (`cache_key.rs`).
    exhausted: Cache<CacheKey, Exhausted>,
    clock: SharedClock,
    trust_ms: u64,
}

impl Default for DenyCache {
    fn default() -> Self {
        Self::new(crate::clock::system(), DEFAULT_TRUST)
    }
}

impl DenyCache {
    /// An empty cache whose entries are trusted for `trust` of `clock`'s time, within
    /// the default budget's `deny` share.
    pub fn new(clock: SharedClock, trust: Duration) -> Self {
        Self::with_budget(clock, trust, MemoryBudget::default().service(true).deny)
    }

    /// An empty cache of at most `bytes` (keys included); evicting an entry only costs
    /// one store call later.
    pub fn with_budget(clock: SharedClock, trust: Duration, bytes: u64) -> Self {
        const FIXED: usize = size_of::<CacheKey>() + 2 * 16 + size_of::<Exhausted>();
        Self {
            // Correctness comes from comparing windows; expiry only frees memory, so a
            // coarse idle timeout is enough (no per-entry deadline on moka's real clock).
            exhausted: memory_budget::bounded(bytes, "deny", |k: &CacheKey, _| {
                FIXED + k.heap_len()
            })
            .time_to_idle(std::time::Duration::from_secs(3_600))
            .build(),
            clock,
            trust_ms: u64::try_from(trust.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// True when `key` is known exhausted in `window` (or a later one), as the store said
    /// less than the trust period ago.
    pub fn is_exhausted(&self, limit: &Limit, key: &str, window: i64) -> bool {
        let now = self.clock.now_ms();
        self.exhausted
            .get(KeyRef::of(limit, key).dyn_ref())
            .is_some_and(|e| e.window >= window && now.saturating_sub(e.seen_ms) < self.trust_ms)
    }

    /// Records that `key` has no hits left in `window`, as the store just said.
    pub fn mark(&self, limit: &Limit, key: &str, window: i64) {
        let seen_ms = self.clock.now_ms();
        self.exhausted
            .insert(CacheKey::of(limit, key), Exhausted { window, seen_ms });
    }

    /// Forgets `key` (after a reset).
    pub fn clear(&self, limit: &Limit, key: &str) {
        self.exhausted.invalidate(KeyRef::of(limit, key).dyn_ref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::Arc;

    #[test]
    fn exhaustion_holds_for_its_window_only() {
        let c = DenyCache::new(Arc::new(ManualClock::new(0)), DEFAULT_TRUST);
        let l = Limit::new("mcp", 1, Duration::from_secs(60));
        assert!(!c.is_exhausted(&l, "k", 5));
        c.mark(&l, "k", 5);
        assert!(c.is_exhausted(&l, "k", 5));
        assert!(c.is_exhausted(&l, "k", 4));
        assert!(!c.is_exhausted(&l, "k", 6));
        assert!(!c.is_exhausted(&l, "other", 5));
        c.clear(&l, "k");
        assert!(!c.is_exhausted(&l, "k", 5));
    }

    #[test]
    fn exhaustion_is_believed_for_the_trust_period_then_asked_again() {
        let clock = ManualClock::new(0);
        let c = DenyCache::new(Arc::new(clock.clone()), Duration::from_millis(1_000));
        let l = Limit::new("signin", 5, Duration::from_secs(900));
        c.mark(&l, "k", 5);
        clock.advance(999);
        assert!(c.is_exhausted(&l, "k", 5));
        clock.advance(1);
        assert!(!c.is_exhausted(&l, "k", 5), "the store is asked again");
        c.mark(&l, "k", 5); // and still says exhausted
        assert!(c.is_exhausted(&l, "k", 5));
    }

    #[test]
    fn a_check_allocates_nothing_to_look_its_key_up() {
        let c = DenyCache::new(Arc::new(ManualClock::new(0)), DEFAULT_TRUST);
        let l = Limit::new("mcp", 1, Duration::from_secs(60));
        c.mark(&l, "k", 5);
        c.exhausted.run_pending_tasks();
        let (n, hit) = crate::alloc_count::allocations(|| c.is_exhausted(&l, "k", 5));
        assert!(hit);
        assert_eq!(n, 0, "an exhausted key");
        // moka's map has 64 segments, each allocated on its first use; a few thousand
        // keys touch them all, and after that a miss allocates nothing either.
        for i in 0..4_096 {
            assert!(!c.is_exhausted(&l, &format!("warm-{i}"), 5));
        }
        let (n, miss) = crate::alloc_count::allocations(|| c.is_exhausted(&l, "another", 5));
        assert!(!miss);
        assert_eq!(n, 0, "a key not exhausted");
    }

    #[test]
    fn a_limit_reloaded_with_another_window_length_is_not_held_exhausted() {
        let c = DenyCache::new(Arc::new(ManualClock::new(0)), DEFAULT_TRUST);
        c.mark(&Limit::new("mcp", 1, Duration::from_secs(60)), "k", 5);
        // Window 5 of a 60 s limit is not window 5 of a 1 s one.
        assert!(!c.is_exhausted(&Limit::new("mcp", 1, Duration::from_secs(1)), "k", 5));
    }
}
