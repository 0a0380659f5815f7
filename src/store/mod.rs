//! The storage seam: where counters live, behind one trait.
//!
//! A store knows nothing of gRPC, limits files or failure policy. It offers one write,
//! [`CounterStore::admit`], which atomically applies a batch of costs to one
//! `(limit, key)` counter in arrival order, each admitted only if it fits, and moves the
//! counter to the caller's window (dropping older ones) in the same write. Batching is part
//! of the contract because a remote store pays a round trip per write: the limiter folds
//! concurrent checks of one hot key into one call.
//!
//! The admission rule itself is [`apply_batch`], shared by every store so that the memory
//! store, the RTDB store and the client's fallback can never disagree on arithmetic.
//!
//! Adding a backend (Redis, say) is one new file here implementing [`CounterStore`], plus
//! a switch in `config.rs`.
//!
//! ```
//! use ratelimit::limits::Limit;
//! use ratelimit::store::MemoryStore;
//! use std::time::Duration;
//!
//! // The caller numbers windows (here window 0); the store only counts in them.
//! let store = MemoryStore::new();
//! let limit = Limit::new("mcp", 3, Duration::from_secs(60));
//! // One batch of three checks costing 2, 1 and 1: the last does not fit.
//! let admission = store.admit_now(&limit, "k", 0, &[2, 1, 1]);
//! let allowed: Vec<bool> = admission.outcomes.iter().map(|o| o.allowed).collect();
//! assert_eq!(allowed, [true, true, false]);
//! assert_eq!(store.peek_now(&limit, "k", 0).count, 3);
//! ```

pub mod counter;
pub mod memory;
#[cfg(feature = "server")]
pub mod redis;
#[cfg(feature = "server")]
pub mod rtdb;

pub use counter::{
    Admission, CounterStore, Outcome, StoreError, WindowCount, apply_batch, deadline,
    visible_count, with_deadline, within, within_reach,
};
pub use memory::MemoryStore;
