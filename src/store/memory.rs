//! `MemoryStore`: counters in this process's memory.
//!
//! It is three things at once: the embedded default store (one instance, no database),
//! the service's per-instance fallback window when the shared store fails, and the client
//! library's own fallback. One implementation keeps all three on the same arithmetic.
//!
//! Hot-path choices, made here:
//! - One moka entry per `(limit, key, window)`. Putting the window in the key means a
//!   counter is never reused across windows, so correctness never depends on when moka
//!   evicts; expiry only frees memory.
//! - Bounded twice. By time: each entry expires shortly after its window ends, the
//!   expiries of one window spread out so they are not all removed at once. And by
//!   bytes: the cache has a weighted `max_capacity` (its share of `--memory-limit`,
//!   `memory_budget.rs`), each entry weighed with its key. A flood of distinct keys
//!   within one window therefore **can evict a live counter**: that key's count
//!   restarts at 0, so the limit is soft for it (it can admit again). moka's TinyLFU
//!   keeps the entries of keys checked often, so a flood of one-off keys mostly evicts
//!   one-off keys. Evictions are counted (`ratelimit_cache_evictions_total{cache}`).
//! - The count is an `AtomicU32` updated by compare-and-swap of the whole batch, so a
//!   batch is applied atomically without a lock.

mod slot;

use super::counter::{
    Admission, CounterStore, Outcome, StoreError, WindowCount, admit_cost, apply_batch,
};
use crate::clock::SharedClock;
use crate::limits::Limit;
use crate::memory_budget::{self, MemoryBudget};
use crate::window;
use async_trait::async_trait;
use moka::Expiry;
use moka::sync::Cache;
use slot::{Lookup, SlotKey, SlotRef};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long an entry outlives its window. A check that computed its window just before
/// the boundary may arrive a little after it; it must still find the same counter.
const GRACE: Duration = Duration::from_secs(5);

/// The most an entry's expiry is spread past [`GRACE`] (see [`expiry_spread`]).
const SPREAD_CAP: Duration = Duration::from_secs(30);

/// A new slot's extra time to live: spread evenly over half its window (at most
/// [`SPREAD_CAP`]) by the order slots are created in. Without it every slot of a window
/// expires at the same instant, and moka removes all expired entries in the one
/// maintenance run that finds them, inline in whichever call triggers it: with many keys,
/// one long stall of every call at each window's end (BENCHMARKS.md §12). Spread, each
/// run finds a few. By creation order rather than by key, so no caller can line its keys
/// up on one instant.
fn expiry_spread(created: u64, window_ms: u64) -> Duration {
    let range_ms = (window_ms / 2).min(SPREAD_CAP.as_millis() as u64);
    // The fractional parts of n·φ (Fibonacci hashing) fill [0, 1) evenly for any run of n.
    let fraction = created.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    Duration::from_millis(((u128::from(fraction) * u128::from(range_ms)) >> 64) as u64)
}

#[derive(Debug)]
struct Slot {
    count: AtomicU32,
    /// Time to live from creation: until the window ends, plus [`GRACE`].
    ttl: Duration,
}

struct UntilWindowEnd;

impl Expiry<SlotKey, Arc<Slot>> for UntilWindowEnd {
    fn expire_after_create(&self, _: &SlotKey, slot: &Arc<Slot>, _: Instant) -> Option<Duration> {
        Some(slot.ttl)
    }
}

/// Fixed-window counters in process memory.
#[derive(Clone)]
pub struct MemoryStore {
    slots: Cache<SlotKey, Arc<Slot>>,
    clock: SharedClock,
    /// Slots created so far (by every clone): the sequence [`expiry_spread`] spreads by.
    created: Arc<AtomicU64>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("entries", &self.slots.entry_count())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store whose expiry follows `clock`'s windows, bounded by the default
    /// budget's `store` share.
    pub fn new(clock: SharedClock) -> Self {
        Self::with_budget(clock, MemoryBudget::default().service(false).store, "store")
    }

    /// An empty store of at most `bytes` (keys included); evictions are counted under
    /// `cache` (`memory_budget.rs` lists the names).
    pub fn with_budget(clock: SharedClock, bytes: u64, cache: &'static str) -> Self {
        const FIXED: usize = size_of::<SlotKey>() + size_of::<Slot>() + 2 * size_of::<usize>();
        // The limit name is usually shared (one `Arc` per limit) but counted anyway: a
        // client's stand-in for an unknown limit holds its own.
        let slots = memory_budget::bounded(bytes, cache, |k: &SlotKey, _: &Arc<Slot>| {
            FIXED + k.key.len() + k.limit.len()
        })
        .expire_after(UntilWindowEnd)
        .build();
        Self {
            slots,
            clock,
            created: Arc::new(AtomicU64::new(0)),
        }
    }

    fn slot_key(limit: &Limit, key: &str, window: i64) -> SlotKey {
        SlotKey {
            limit: limit.name.clone(),
            key: key.into(),
            window,
        }
    }

    fn lookup<'a>(limit: &'a Limit, key: &'a str, window: i64) -> Lookup<'a> {
        Lookup {
            limit: &limit.name,
            key,
            window,
        }
    }

    /// The slot of `(limit, key)` in `window`, if it exists (no key is allocated).
    fn find(&self, limit: &Limit, key: &str, window: i64) -> Option<Arc<Slot>> {
        self.slots
            .get(&Self::lookup(limit, key, window) as &dyn SlotRef)
    }

    fn slot(&self, limit: &Limit, key: &str, window: i64) -> Arc<Slot> {
        if let Some(slot) = self.find(limit, key, window) {
            return slot;
        }
        // A new slot: `get_with` settles a race with a concurrent first hit (one wins,
        // both count on it).
        self.slots.get_with(Self::slot_key(limit, key, window), || {
            let now = self.clock.now_ms();
            let created = self.created.fetch_add(1, Ordering::Relaxed);
            Arc::new(Slot {
                count: AtomicU32::new(0),
                ttl: window::until_end(now, window, limit.window_ms)
                    + GRACE
                    + expiry_spread(created, limit.window_ms),
            })
        })
    }

    /// Applies `rule` to the slot's count atomically: `rule(count)` gives the new count
    /// and what to return, and is re-run on the newer count if another check got there
    /// first. A rule that changes nothing writes nothing.
    fn count_on<T>(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        mut rule: impl FnMut(u32) -> (u32, T),
    ) -> T {
        let slot = self.slot(limit, key, window);
        let mut current = slot.count.load(Ordering::Acquire);
        loop {
            let (next, out) = rule(current);
            if next == current {
                return out;
            }
            match slot.count.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return out,
                Err(actual) => current = actual,
            }
        }
    }

    /// One cost applied to `(limit, key)` in `window`, by the same rule as
    /// [`MemoryStore::admit_now`] without building a batch.
    pub fn admit_one_now(&self, limit: &Limit, key: &str, window: i64, cost: u32) -> Outcome {
        self.count_on(limit, key, window, |mut count| {
            let outcome = admit_cost(&mut count, limit.requests, cost);
            (count, outcome)
        })
    }

    /// Applies `costs` to `(limit, key)` in `window`; the synchronous core of [`CounterStore::admit`].
    pub fn admit_now(&self, limit: &Limit, key: &str, window: i64, costs: &[u32]) -> Admission {
        self.count_on(limit, key, window, |count| {
            let stored = Some(WindowCount { window, count });
            let (next, outcomes) = apply_batch(stored, window, limit.requests, costs);
            (next.count, Admission { window, outcomes })
        })
    }

    /// Lowers the count of `(limit, key)` in `window` by at most `hits`; the synchronous
    /// core of [`CounterStore::release`].
    pub fn release_now(&self, limit: &Limit, key: &str, window: i64, hits: u32) -> bool {
        let Some(slot) = self.find(limit, key, window) else {
            return false;
        };
        let updated = slot
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c > 0 && hits > 0).then(|| c - hits.min(c))
            });
        updated.is_ok()
    }

    /// The count of `(limit, key)` in `window`, without changing it.
    pub fn peek_now(&self, limit: &Limit, key: &str, window: i64) -> WindowCount {
        let count = self
            .find(limit, key, window)
            .map_or(0, |s| s.count.load(Ordering::Acquire));
        WindowCount { window, count }
    }

    /// Forgets `(limit, key)` in `window` and the next one.
    pub fn reset_now(&self, limit: &Limit, key: &str, window: i64) {
        for w in [window, window.saturating_add(1)] {
            self.slots
                .invalidate(&Self::lookup(limit, key, w) as &dyn SlotRef);
        }
    }

    /// Entries held, after pending expiry work is done. For tests and metrics.
    pub fn entries(&self) -> u64 {
        self.slots.run_pending_tasks();
        self.slots.entry_count()
    }
}

#[async_trait]
impl CounterStore for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn is_remote(&self) -> bool {
        false
    }

    async fn admit(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        costs: &[u32],
    ) -> Result<Admission, StoreError> {
        Ok(self.admit_now(limit, key, window, costs))
    }

    fn admit_at_once(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        cost: u32,
    ) -> Option<(i64, Outcome)> {
        Some((window, self.admit_one_now(limit, key, window, cost)))
    }

    async fn peek(&self, limit: &Limit, key: &str, window: i64) -> Result<WindowCount, StoreError> {
        Ok(self.peek_now(limit, key, window))
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        let window = window::number(self.clock.now_ms(), limit.window_ms);
        self.reset_now(limit, key, window);
        Ok(())
    }

    async fn release(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        hits: u32,
    ) -> Result<bool, StoreError> {
        Ok(self.release_now(limit, key, window, hits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn store() -> MemoryStore {
        MemoryStore::new(Arc::new(ManualClock::new(1_000_000)))
    }

    #[test]
    fn admits_up_to_the_limit_then_denies() {
        let s = store();
        let l = Limit::new("t", 3, Duration::from_secs(60));
        let got: Vec<bool> = (0..5)
            .map(|_| s.admit_now(&l, "k", 1, &[1]).outcomes[0].allowed)
            .collect();
        assert_eq!(got, [true, true, true, false, false]);
        assert_eq!(s.peek_now(&l, "k", 1).count, 3);
        assert_eq!(
            s.peek_now(&l, "k", 2).count,
            0,
            "a new window starts at zero"
        );
    }

    #[test]
    fn keys_limits_and_windows_are_independent() {
        let s = store();
        let a = Limit::new("a", 1, Duration::from_secs(60));
        let b = Limit::new("b", 1, Duration::from_secs(60));
        assert!(s.admit_now(&a, "k", 1, &[1]).outcomes[0].allowed);
        assert!(s.admit_now(&b, "k", 1, &[1]).outcomes[0].allowed);
        assert!(s.admit_now(&a, "k2", 1, &[1]).outcomes[0].allowed);
        assert!(s.admit_now(&a, "k", 2, &[1]).outcomes[0].allowed);
        assert!(!s.admit_now(&a, "k", 1, &[1]).outcomes[0].allowed);
    }

    #[test]
    fn reset_clears_the_window() {
        let s = store();
        let l = Limit::new("t", 1, Duration::from_secs(60));
        assert!(s.admit_now(&l, "k", 1, &[1]).outcomes[0].allowed);
        s.reset_now(&l, "k", 1);
        assert_eq!(s.peek_now(&l, "k", 1).count, 0);
        assert!(s.admit_now(&l, "k", 1, &[1]).outcomes[0].allowed);
    }

    #[test]
    fn release_gives_back_at_most_what_was_counted_in_that_window() {
        let s = store();
        let l = Limit::new("t", 10, Duration::from_secs(60));
        s.admit_now(&l, "k", 1, &[4]);
        assert!(
            !s.release_now(&l, "k", 2, 1),
            "another window: nothing to give back"
        );
        assert!(s.release_now(&l, "k", 1, 3));
        assert_eq!(s.peek_now(&l, "k", 1).count, 1);
        assert!(s.release_now(&l, "k", 1, 9));
        assert_eq!(s.peek_now(&l, "k", 1).count, 0, "never below zero");
        assert!(!s.release_now(&l, "k", 1, 1));
    }

    #[test]
    fn concurrent_threads_admit_exactly_the_limit() {
        let s = store();
        let l = Limit::new("t", 1_000, Duration::from_secs(60));
        let admitted = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        (0..500)
                            .filter(|_| s.admit_now(&l, "hot", 1, &[1]).outcomes[0].allowed)
                            .count()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .sum::<usize>()
        });
        assert_eq!(admitted, 1_000);
        assert_eq!(s.peek_now(&l, "hot", 1).count, 1_000);
    }

    #[test]
    fn one_cost_at_once_counts_on_the_batch_counter_by_the_same_rule() {
        let s = store();
        let l = Limit::new("t", 5, Duration::from_secs(60));
        assert_eq!(s.admit_one_now(&l, "k", 1, 2).count, 2);
        assert_eq!(s.admit_now(&l, "k", 1, &[2]).outcomes[0].count, 4);
        let denied = s.admit_one_now(&l, "k", 1, 2);
        assert!(!denied.allowed);
        assert_eq!(denied.count, 4, "a denied cost adds nothing");
        assert!(
            s.admit_one_now(&l, "k", 1, 1).allowed,
            "a smaller cost still fits"
        );
        assert_eq!(s.peek_now(&l, "k", 1).count, 5);
        // Borrowed and owned keys meet on one entry for every key shape, so a lookup
        // never misses a slot and starts a second counter.
        for key in ["", "k2", "ü~b%2F", &"x".repeat(512)] {
            assert!(s.admit_one_now(&l, key, 1, 5).allowed);
            assert!(!s.admit_one_now(&l, key, 1, 1).allowed, "{key:?}");
        }
        assert_eq!(s.entries(), 5);
        assert_eq!(
            CounterStore::admit_at_once(&s, &l, "k", 1, 1),
            Some((
                1,
                Outcome {
                    allowed: false,
                    count: 5
                }
            ))
        );
    }

    #[test]
    fn the_byte_budget_bounds_the_entries_keys_included() {
        let s = MemoryStore::with_budget(Arc::new(ManualClock::new(0)), 1 << 20, "test");
        let l = Limit::new("t", 5, Duration::from_secs(60));
        for i in 0..20_000 {
            s.admit_now(&l, &format!("{i:0>500}"), 1, &[1]);
        }
        // A 500-byte key's entry weighs over 900 bytes: at most 1,100 fit in 1 MiB.
        let held = s.entries();
        assert!((100..=1_100).contains(&held), "{held}");
        assert!(s.slots.weighted_size() <= 1 << 20);
    }

    #[test]
    fn entries_live_until_their_window_ends_plus_grace() {
        // Expiry itself runs on moka's real clock (it cannot be mocked), so this checks
        // the deadline each entry is created with rather than sleeping past it.
        let s = MemoryStore::new(Arc::new(ManualClock::new(90_000)));
        let l = Limit::new("t", 5, Duration::from_secs(60));
        s.admit_now(&l, "k", 1, &[1]);
        let slot = s
            .slots
            .get(&MemoryStore::slot_key(&l, "k", 1))
            .map(|s| s.ttl);
        // The first slot created gets no spread.
        assert_eq!(slot, Some(Duration::from_secs(30) + GRACE));
        assert_eq!(s.entries(), 1);
    }

    #[test]
    fn expiry_is_spread_evenly_over_half_a_window_at_most_the_cap() {
        // 1,000 slots of a 60 s window: their extra lives fill [0 s, 30 s) with about
        // 100 in each 3 s tenth, so no maintenance run meets them all at once.
        let mut tenths = [0u32; 10];
        for n in 0..1_000 {
            let d = expiry_spread(n, 60_000);
            assert!(d < Duration::from_secs(30), "{d:?}");
            tenths[(d.as_millis() / 3_000) as usize] += 1;
        }
        assert!(
            tenths.iter().all(|&c| (95..=105).contains(&c)),
            "{tenths:?}"
        );
        // Short windows spread over half of themselves; long ones over the cap.
        assert!((0..100).all(|n| expiry_spread(n, 1_000) < Duration::from_millis(500)));
        assert!((0..100).all(|n| expiry_spread(n, 3_600_000) < SPREAD_CAP));
        assert_eq!(expiry_spread(7, 1), Duration::ZERO);
        // Slots of one store take turns, clones included.
        let s = store();
        let c = s.clone();
        let l = Limit::new("t", 5, Duration::from_secs(60));
        s.admit_now(&l, "a", 1, &[1]);
        c.admit_now(&l, "b", 1, &[1]);
        let ttl = |k: &str| s.slots.get(&MemoryStore::slot_key(&l, k, 1)).map(|s| s.ttl);
        assert_ne!(ttl("a"), ttl("b"));
    }
}
