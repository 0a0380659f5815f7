//! The deny-until cache: once a key is known to be exhausted for window `w`, further
//! checks in `w` are denied on this instance with no store call.
//!
//! Counts only grow within a window, so "exhausted in `w`" stays true until `w` ends
//! (short of an admin `Reset`, which clears this instance's entry; other instances keep
//! denying until the window ends, which errs on the safe side). This is what keeps an
//! abusive caller from costing RTDB writes: 1,000 extra checks cost 0 requests.

use crate::limits::Limit;
use crate::memory_budget::{self, MemoryBudget};
use moka::sync::Cache;
use std::sync::Arc;

/// `(limit, key)` → the window in which the key is exhausted.
pub struct DenyCache {
    exhausted: Cache<(Arc<str>, Arc<str>), i64>,
}

impl Default for DenyCache {
    fn default() -> Self {
        Self::with_budget(MemoryBudget::default().service(true).deny)
    }
}

impl DenyCache {
    /// A cache of at most `bytes` (keys included); evicting an entry only costs one
    /// store call later.
    pub fn with_budget(bytes: u64) -> Self {
        const FIXED: usize = 2 * size_of::<Arc<str>>() + 2 * 16 + size_of::<i64>();
        Self {
            // Correctness comes from comparing windows; expiry only frees memory, so a
            // coarse idle timeout is enough (no per-entry deadline on moka's real clock).
            exhausted: memory_budget::bounded(bytes, "deny", |k: &(Arc<str>, Arc<str>), _| {
                FIXED + k.0.len() + k.1.len()
            })
            .time_to_idle(std::time::Duration::from_secs(3_600))
            .build(),
        }
    }

    /// True when `key` is known exhausted in `window` (or a later one).
    pub fn is_exhausted(&self, limit: &Limit, key: &str, window: i64) -> bool {
        self.exhausted
            .get(&(limit.name.clone(), Arc::from(key)))
            .is_some_and(|w| w >= window)
    }

    /// Records that `key` has no hits left in `window`.
    pub fn mark(&self, limit: &Limit, key: &str, window: i64) {
        self.exhausted
            .insert((limit.name.clone(), Arc::from(key)), window);
    }

    /// Forgets `key` (after a reset).
    pub fn clear(&self, limit: &Limit, key: &str) {
        self.exhausted
            .invalidate(&(limit.name.clone(), Arc::from(key)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn exhaustion_holds_for_its_window_only() {
        let c = DenyCache::default();
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
}
