//! The memory budget in bytes (`--memory-limit`, `ClientBuilder::memory_limit`): how it
//! is split between every cache and window map, how their entries are weighed, and how
//! evictions are counted and logged.
//!
//! Every map that grows with the number of distinct keys is a moka cache with a
//! `weigher` (bytes, keys included) and a `max_capacity` of its share, built through
//! [`bounded`]. A flood of unique keys then costs evictions, never the process. What an
//! eviction costs depends on the map:
//!
//! | cache (`cache` label) | an eviction costs |
//! |---|---|
//! | `store`: counters in memory mode (`MemoryStore`) | the key's count restarts at 0: the limit is soft for that key |
//! | `fallback_window`: the service's local windows during an outage | the same, for local decisions |
//! | `deny`: the service's deny-until cache | one store call for that key |
//! | `rtdb_nodes`: cached `(value, ETag)` of RTDB nodes | one read (GET) for that key |
//! | `client_window`: the client library's own windows | as `fallback_window` |
//! | `client_deny`: the client's deny-until cache | one RPC for that key |
//!
//! moka admits and evicts by TinyLFU: a key checked often keeps its entry against a
//! flood of keys seen once, so the counters that matter survive longest.
//!
//! The split (one place: [`MemoryBudget::service`], [`MemoryBudget::client`]):
//! - service, memory store: `store` 15/16, `fallback_window` 1/16 (the in-process store
//!   does not fail, so its fallback is rarely used);
//! - service, RTDB store: `rtdb_nodes` 3/8, `fallback_window` 3/8, `deny` 1/4;
//! - client library: `client_window` 3/4, `client_deny` 1/4.
//!
//! The budget bounds these maps, not the process: the runtime, connections, buffers and
//! the allocator's slack come on top (BENCHMARKS.md, "Memory budget").
//!
//! ```
//! use ratelimit::memory_budget::{MemoryBudget, parse_memory_limit};
//! let bytes = parse_memory_limit("64MiB")?;
//! let shares = MemoryBudget::new(bytes).client();
//! assert_eq!(shares.window + shares.deny, bytes); // 3/4 window, 1/4 deny-until
//! assert!(parse_memory_limit("64 potatoes").is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use moka::notification::RemovalCause;
use moka::sync::{Cache, CacheBuilder};
use std::hash::Hash;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const MIB: u64 = 1024 * 1024;
/// The service's default budget: half of a 512 MiB Cloud Run instance.
pub const DEFAULT_MEMORY_LIMIT: u64 = 256 * MIB;
/// The client library's default budget (it lives inside the caller's process).
pub const DEFAULT_CLIENT_MEMORY_LIMIT: u64 = 32 * MIB;
/// Smallest accepted budget: below it the caches hold too few keys to be useful.
pub const MIN_MEMORY_LIMIT: u64 = 4 * MIB;
/// Largest accepted budget.
pub const MAX_MEMORY_LIMIT: u64 = 1024 * 1024 * MIB;
/// What moka and the allocator spend per entry beyond the weighed bytes: moka's entry,
/// its hash-map and deque nodes, expiry timer, the `Arc` headers and malloc rounding
/// (measured: BENCHMARKS.md, "Memory budget").
pub const ENTRY_OVERHEAD: usize = 384;
/// How often the aggregated eviction line is written while evictions go on.
pub const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Why a memory limit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryLimitError {
    /// Not a size.
    #[error("{given:?} is not a size like 256MiB or 1GiB: {reason}")]
    Parse { given: String, reason: String },
    /// Out of range.
    #[error("{given:?} must be between 4 MiB and 1 TiB")]
    Range { given: String },
}

/// Parses a size such as `256MiB`, `64 MiB`, `1GiB` or `500MB` (`bytesize` syntax;
/// a bare number is bytes).
pub fn parse_memory_limit(s: &str) -> Result<u64, MemoryLimitError> {
    let given = s.trim();
    let size: bytesize::ByteSize = given.parse().map_err(|reason| MemoryLimitError::Parse {
        given: given.to_owned(),
        reason,
    })?;
    let bytes = size.as_u64();
    if !(MIN_MEMORY_LIMIT..=MAX_MEMORY_LIMIT).contains(&bytes) {
        return Err(MemoryLimitError::Range {
            given: given.to_owned(),
        });
    }
    Ok(bytes)
}

/// A budget in bytes, to be split between caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    bytes: u64,
}

impl Default for MemoryBudget {
    fn default() -> Self {
        Self::new(DEFAULT_MEMORY_LIMIT)
    }
}

/// The service's shares, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceShares {
    /// `MemoryStore` in memory mode (0 with a remote store).
    pub store: u64,
    /// The fallback's local windows.
    pub fallback_window: u64,
    /// The deny-until cache (0 in memory mode, which has none).
    pub deny: u64,
    /// The RTDB node cache (0 in memory mode).
    pub rtdb_nodes: u64,
}

/// The client library's shares, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientShares {
    /// The client's own windows.
    pub window: u64,
    /// The client's deny-until cache.
    pub deny: u64,
}

impl MemoryBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> Self {
        Self { bytes }
    }

    /// The whole budget.
    pub fn bytes(self) -> u64 {
        self.bytes
    }

    fn part(self, num: u64, den: u64) -> u64 {
        self.bytes / den * num
    }

    /// The service's split, for a remote store (RTDB) or the in-process one.
    pub fn service(self, remote: bool) -> ServiceShares {
        if remote {
            ServiceShares {
                store: 0,
                fallback_window: self.part(3, 8),
                deny: self.part(1, 4),
                rtdb_nodes: self.part(3, 8),
            }
        } else {
            ServiceShares {
                store: self.part(15, 16),
                fallback_window: self.part(1, 16),
                deny: 0,
                rtdb_nodes: 0,
            }
        }
    }

    /// The client library's split.
    pub fn client(self) -> ClientShares {
        ClientShares {
            window: self.part(3, 4),
            deny: self.part(1, 4),
        }
    }
}

/// A cache builder bounded to `bytes` by weight: `weigh` gives an entry's own bytes
/// (keys included), [`ENTRY_OVERHEAD`] is added; evictions for size are counted in
/// `ratelimit_cache_evictions_total{cache}` and logged in aggregate.
pub fn bounded<K, V>(
    bytes: u64,
    cache: &'static str,
    weigh: impl Fn(&K, &V) -> usize + Send + Sync + 'static,
) -> CacheBuilder<K, V, Cache<K, V>>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let evictions = Evictions::new(cache, bytes);
    Cache::builder()
        .max_capacity(bytes)
        .weigher(move |k, v| u32::try_from(weigh(k, v) + ENTRY_OVERHEAD).unwrap_or(u32::MAX))
        .eviction_listener(move |_, _, cause| {
            if cause == RemovalCause::Size {
                evictions.record();
            }
        })
}

/// Counts one cache's evictions and writes them up every [`LOG_INTERVAL`].
struct Evictions {
    cache: &'static str,
    budget: u64,
    since_report: AtomicU64,
    last_report: Mutex<Option<Instant>>,
}

impl Evictions {
    fn new(cache: &'static str, budget: u64) -> Self {
        Self {
            cache,
            budget,
            since_report: AtomicU64::new(0),
            last_report: Mutex::new(None),
        }
    }

    fn record(&self) {
        crate::metrics::eviction(self.cache);
        let pending = self.since_report.fetch_add(1, Ordering::Relaxed) + 1;
        // Only every 1,024th eviction looks at the clock: a flood evicts once per insert.
        if pending != 1 && !pending.is_multiple_of(1_024) {
            return;
        }
        let Ok(mut last) = self.last_report.try_lock() else {
            return;
        };
        let now = Instant::now();
        match *last {
            None => tracing::warn!(
                cache = self.cache,
                budget_bytes = self.budget,
                "memory budget reached; evicting the least used entries (ratelimit_cache_evictions_total)"
            ),
            Some(at) if now.duration_since(at) >= LOG_INTERVAL => tracing::warn!(
                cache = self.cache,
                budget_bytes = self.budget,
                evictions = self.since_report.load(Ordering::Relaxed),
                seconds = now.duration_since(at).as_secs(),
                "cache entries evicted for the memory budget since the last report"
            ),
            Some(_) => return,
        }
        self.since_report.store(0, Ordering::Relaxed);
        *last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_strictly_with_clear_errors() {
        assert_eq!(parse_memory_limit("256MiB"), Ok(256 * MIB));
        assert_eq!(parse_memory_limit(" 64 MiB "), Ok(64 * MIB));
        assert_eq!(parse_memory_limit("1GiB"), Ok(1024 * MIB));
        assert_eq!(parse_memory_limit("500MB"), Ok(500_000_000));
        let e = parse_memory_limit("lots").expect_err("refused").to_string();
        assert!(e.starts_with("\"lots\" is not a size like 256MiB"), "{e}");
        for small in ["256", "1MiB", "0"] {
            let e = parse_memory_limit(small).expect_err(small).to_string();
            assert!(e.contains("must be between 4 MiB and 1 TiB"), "{e}");
        }
        assert!(parse_memory_limit("2TiB").is_err());
    }

    #[test]
    fn the_shares_never_exceed_the_budget() {
        for bytes in [MIN_MEMORY_LIMIT, 64 * MIB + 7, DEFAULT_MEMORY_LIMIT] {
            let b = MemoryBudget::new(bytes);
            for remote in [false, true] {
                let s = b.service(remote);
                assert!(s.store + s.fallback_window + s.deny + s.rtdb_nodes <= bytes);
            }
            let c = b.client();
            assert!(c.window + c.deny <= bytes);
        }
        let s = MemoryBudget::new(64 * MIB).service(false);
        assert_eq!((s.store, s.fallback_window), (60 * MIB, 4 * MIB));
    }

    #[test]
    fn a_full_cache_evicts_by_weight() {
        let cache: Cache<String, ()> = bounded(64 * 1024, "test", |k: &String, _| k.len()).build();
        for i in 0..1_000 {
            cache.insert(format!("{i:0>500}"), ());
        }
        cache.run_pending_tasks();
        // 500 + 384 bytes per entry: at most 74 fit in 64 KiB.
        assert!(
            cache.weighted_size() <= 64 * 1024,
            "{}",
            cache.weighted_size()
        );
        assert!(cache.entry_count() <= 74, "{}", cache.entry_count());
    }
}
