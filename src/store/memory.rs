//! `MemoryStore`: counters in this process's memory.
//!
//! It is three things at once: the embedded default store (one instance, no database),
//! the service's per-instance fallback window when the shared store fails, and the client
//! library's own fallback. One implementation keeps all three on the same arithmetic.
//!
//! Hot-path choices, made here:
//! - One moka entry per `(limit, key)` (and window length), holding the window it counts
//!   in and the count (`memory/cell.rs`), as the Redis store keeps one string per key. A
//!   busy key keeps its entry from window to window, so a window's start inserts nothing
//!   and its end removes nothing: with per-window entries, every busy key was inserted
//!   anew each window and removed after it, and moka removes whatever expires within one
//!   timer tick in one maintenance run, inline in the call that triggers it (the tail at
//!   10,000 keys, BENCHMARKS.md §13).
//! - Bounded twice. By time: an entry lives while its key is checked and expires between
//!   a window plus 5 s and a window plus 10 s and its spread after the last check
//!   (`Slot::life_after_read`), the spread making keys that go quiet together expire
//!   apart rather than in one maintenance run. And by bytes: the
//!   cache has a weighted `max_capacity` (its share of `--memory-limit`,
//!   `memory_budget.rs`), each entry weighed with its key. A flood of distinct keys
//!   within one window therefore **can evict a live counter**: that key's count
//!   restarts at 0, so the limit is soft for it (it can admit again). moka's TinyLFU
//!   keeps the entries of keys checked often, so a flood of one-off keys mostly evicts
//!   one-off keys. Evictions are counted (`ratelimit_cache_evictions_total{cache}`).
//! - Expiry does not decide counts: an entry lives a whole window plus grace from its
//!   creation and from every read that finds less left, so it is dropped only after
//!   every window a check can have counted in is over, and a check in a newer window
//!   starts the count at 0 itself. (One race remains, as moka has it: a read that finds
//!   an entry at the very instant its old expiry passes can count on it while a
//!   concurrent maintenance run removes it; that entry was idle for a window or more.)
//! - The count is updated by compare-and-swap of the whole batch, so a batch is applied
//!   atomically without a lock.

mod cell;

use super::counter::{
    Admission, CounterStore, Outcome, StoreError, WindowCount, admit_cost, apply_batch,
};
use crate::cache_key::{CacheKey, KeyRef};
use crate::limits::Limit;
use crate::memory_budget::{self, MemoryBudget};
use async_trait::async_trait;
use cell::Cell;
use moka::Expiry;
use moka::sync::Cache;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long an entry outlives the window it counts in. A check that computed its window
/// just before the boundary may arrive a little after it; it must still find the same
/// counter.
const GRACE: Duration = Duration::from_secs(5);

/// The most an entry's expiry is spread past [`GRACE`] (see [`expiry_spread`]).
const SPREAD_CAP: Duration = Duration::from_secs(30);

/// A new slot's extra time to live: spread evenly over half its window (at most
/// [`SPREAD_CAP`]) by the order slots are created in. moka removes all the entries that
/// expire within one timer tick in the one maintenance run that finds them, inline in
/// whichever call triggers it, so keys that go quiet together must not expire together
/// (an 84 ms stall at 10,000 keys, BENCHMARKS.md §12). By creation order rather than by
/// key, so no caller can line its keys up on one instant.
fn expiry_spread(created: u64, window_ms: u64) -> Duration {
    let range_ms = (window_ms / 2).min(SPREAD_CAP.as_millis() as u64);
    // The fractional parts of n·φ (Fibonacci hashing) fill [0, 1) evenly for any run of n.
    let fraction = created.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    Duration::from_millis(((u128::from(fraction) * u128::from(range_ms)) >> 64) as u64)
}

#[derive(Debug)]
struct Slot {
    cell: Cell,
    /// The limit's window length.
    window: Duration,
    /// This slot's share of the expiry spread ([`expiry_spread`]).
    spread: Duration,
}

impl Slot {
    /// Time to live from creation: a whole window plus [`GRACE`] and the spread. Not
    /// "until the creating check's window ends": a check that waited on the creation
    /// (moka's `get_with` hands it the new slot without a read, so without
    /// [`Slot::life_after_read`]) may already be in the next window and count there.
    fn first_life(&self) -> Duration {
        self.window + GRACE + self.spread
    }

    /// The slot's time to live after a read that found `left` of it. A read may be a
    /// check in a window that ends up to a whole window from now, so the slot must live
    /// at least that plus [`GRACE`]; when less is left it is extended by a further
    /// `GRACE` and its spread, so a busy key is rescheduled at most once every `GRACE`,
    /// not on every read. Unchanged, moka does no work for the read.
    fn life_after_read(&self, left: Option<Duration>) -> Option<Duration> {
        match left {
            Some(left) if left >= self.window + GRACE => Some(left),
            _ => Some(self.window + GRACE + GRACE + self.spread),
        }
    }
}

struct Lifetime;

impl Expiry<CacheKey, Arc<Slot>> for Lifetime {
    fn expire_after_create(&self, _: &CacheKey, slot: &Arc<Slot>, _: Instant) -> Option<Duration> {
        Some(slot.first_life())
    }

    fn expire_after_read(
        &self,
        _: &CacheKey,
        slot: &Arc<Slot>,
        _: Instant,
        left: Option<Duration>,
        _: Instant,
    ) -> Option<Duration> {
        slot.life_after_read(left)
    }
}

/// Fixed-window counters in process memory.
#[derive(Clone)]
pub struct MemoryStore {
    slots: Cache<CacheKey, Arc<Slot>>,
    /// Slots created so far (by every clone): the sequence [`expiry_spread`] spreads by.
    created: Arc<AtomicU64>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("entries", &self.slots.entry_count())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store, bounded by the default budget's `store` share. It reads no clock:
    /// callers pass the window each call counts in (numbered by their clock), and moka's
    /// own clock only frees memory.
    pub fn new() -> Self {
        Self::with_budget(MemoryBudget::default().service(false).store, "store")
    }

    /// An empty store of at most `bytes` (keys included); evictions are counted under
    /// `cache` (`memory_budget.rs` lists the names).
    pub fn with_budget(bytes: u64, cache: &'static str) -> Self {
        const FIXED: usize = size_of::<CacheKey>() + size_of::<Slot>() + 2 * size_of::<usize>();
        // The limit name is usually shared (one `Arc` per limit) but counted anyway: a
        // client's stand-in for an unknown limit holds its own.
        let slots = memory_budget::bounded(bytes, cache, |k: &CacheKey, _: &Arc<Slot>| {
            FIXED + k.heap_len()
        })
        .expire_after(Lifetime)
        .build();
        Self {
            slots,
            created: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The slot of `(limit, key)`, if it exists (no key is allocated).
    fn find(&self, limit: &Limit, key: &str) -> Option<Arc<Slot>> {
        self.slots.get(KeyRef::of(limit, key).dyn_ref())
    }

    fn slot(&self, limit: &Limit, key: &str, window: i64) -> Arc<Slot> {
        if let Some(slot) = self.find(limit, key) {
            return slot;
        }
        // A new slot: `get_with` settles a race with a concurrent first hit (one wins,
        // both count on it).
        self.slots.get_with(CacheKey::of(limit, key), || {
            let created = self.created.fetch_add(1, Ordering::Relaxed);
            Arc::new(Slot {
                cell: Cell::new(window),
                window: Duration::from_millis(limit.window_ms),
                spread: expiry_spread(created, limit.window_ms),
            })
        })
    }

    /// One cost applied to `(limit, key)` in `window` (or the newer window its counter is
    /// already in), by the same rule as [`MemoryStore::admit_now`] without building a
    /// batch. Returns the window counted in.
    pub fn admit_one_now(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        cost: u32,
    ) -> (i64, Outcome) {
        self.slot(limit, key, window).cell.update(window, |seen| {
            let mut count = seen.count;
            let outcome = admit_cost(&mut count, limit.requests, cost);
            (outcome.allowed.then_some(count), (seen.window, outcome))
        })
    }

    /// Applies `costs` to `(limit, key)` in `window` (or the newer window its counter is
    /// already in); the synchronous core of [`CounterStore::admit`].
    pub fn admit_now(&self, limit: &Limit, key: &str, window: i64, costs: &[u32]) -> Admission {
        self.slot(limit, key, window).cell.update(window, |seen| {
            let (next, outcomes) = apply_batch(Some(seen), seen.window, limit.requests, costs);
            (
                Some(next.count),
                Admission {
                    window: next.window,
                    outcomes,
                },
            )
        })
    }

    /// Lowers the count of `(limit, key)` in `window` by at most `hits`, never below
    /// `keep`, if its counter is in that window; the synchronous core of
    /// [`CounterStore::release`].
    pub fn release_now(&self, limit: &Limit, key: &str, window: i64, hits: u32, keep: u32) -> bool {
        let Some(slot) = self.find(limit, key) else {
            return false;
        };
        slot.cell.update(window, |seen| {
            if seen.window == window && seen.count > keep && hits > 0 {
                (Some(seen.count - hits.min(seen.count - keep)), true)
            } else {
                (None, false)
            }
        })
    }

    /// The count of `(limit, key)` that a check in `window` sees, without changing it.
    pub fn peek_now(&self, limit: &Limit, key: &str, window: i64) -> WindowCount {
        self.find(limit, key)
            .map_or(WindowCount { window, count: 0 }, |s| s.cell.peek(window))
    }

    /// Forgets `(limit, key)`: its counter starts again from 0, whatever window it is in
    /// (one counter holds every window of a key).
    pub fn reset_now(&self, limit: &Limit, key: &str) {
        self.slots.invalidate(KeyRef::of(limit, key).dyn_ref());
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
        Some(self.admit_one_now(limit, key, window, cost))
    }

    async fn peek(&self, limit: &Limit, key: &str, window: i64) -> Result<WindowCount, StoreError> {
        Ok(self.peek_now(limit, key, window))
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        self.reset_now(limit, key);
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
        Ok(self.release_now(limit, key, window, hits, keep))
    }
}

#[cfg(test)]
mod tests;
