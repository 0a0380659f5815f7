//! Per-key single flight, batching and quota leases in front of a remote store.
//!
//! Without this, N concurrent checks of one hot key on one instance would race N
//! conditional PUTs against each other: one wins, N−1 get `412` and retry, N² round trips
//! in all. Instead each `(limit, key)` has at most one store call in flight per instance;
//! checks that arrive meanwhile queue up and go together in the next call, admitted in
//! arrival order in a single write. N concurrent checks cost about two round trips.
//!
//! A key that stays hot also gets a **quota lease** (`lease.rs`, DESIGN §9): the write
//! carries a reserve of extra hits, and later checks are admitted from it here, with no
//! store call, until it runs low and the next write refills it. A reserve nobody asks for
//! is given back once the key has been quiet for the lease's `idle` time.
//!
//! **Contention is not an outage.** When a write loses races (`412`) for so long that a
//! check's budget would run out, the check is answered [`StoreError::Contention`] (the
//! limiter denies it, shared) rather than left to time out into the local fallback. The
//! store is told each batch's deadline (`store::with_deadline`), so it stops retrying
//! before the deadline instead of being cut off mid-write, which would leave a write that
//! may still land for checks already answered.
//!
//! The store calls run in a spawned task per hot key, not in any caller's future: a
//! caller whose gRPC deadline passes is dropped by tonic, and that must not strand the
//! others that joined its batch. If that task ends abnormally (a panic), a guard removes
//! its key, so the waiting checks fall back and the next check starts afresh.

mod queue;
mod runner;

pub use queue::Served;

use crate::lease::LeaseOptions;
use crate::limits::Limit;
use crate::store::{CounterStore, StoreError};
use queue::{Answer, CONTENTION_GRACE, KeyState, QueueKey, Queues, Waiter, lock, runner_stopped};
use runner::Runner;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Batches concurrent checks per `(limit, key)` and serves hot keys from leases.
pub struct Coalescer {
    store: Arc<dyn CounterStore>,
    /// Keys with a runner task; a key is present exactly while its runner runs.
    queues: Queues,
    /// Bound on each store call made by a runner.
    call_timeout: Duration,
    lease: LeaseOptions,
}

impl Coalescer {
    /// Batches calls to `store`, each bounded by `call_timeout`, leasing per `lease`.
    pub fn new(store: Arc<dyn CounterStore>, call_timeout: Duration, lease: LeaseOptions) -> Self {
        Self {
            store,
            queues: Arc::default(),
            call_timeout,
            lease,
        }
    }

    /// Admits `cost` for `key` under `limit` in `window`, from this instance's lease if it
    /// holds one, otherwise sharing a store write with any concurrent checks of the key.
    pub async fn admit(
        &self,
        limit: &Arc<Limit>,
        key: &str,
        window: i64,
        cost: u32,
        budget: Duration,
    ) -> Answer {
        let now = Instant::now();
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter {
            window,
            cost,
            deadline: now + budget,
            reply: tx,
        };
        let qkey: QueueKey = (limit.name.clone(), Arc::from(key));
        let start_runner = {
            let mut queues = lock(&self.queues);
            match queues.get_mut(&qkey) {
                Some(state) => {
                    state.demand.ask(cost);
                    state.last_activity = now;
                    if let Some(served) = take_from_lease(state, limit, window, cost) {
                        return Ok(served);
                    }
                    if budget.is_zero() {
                        return Err(StoreError::Timeout(budget));
                    }
                    state.pending.push(waiter);
                    state.wake.notify_one();
                    false
                }
                // A caller with no time left costs the store nothing.
                None if budget.is_zero() => return Err(StoreError::Timeout(budget)),
                None => {
                    let mut state = KeyState::new(now);
                    state.demand.ask(cost);
                    state.pending.push(waiter);
                    queues.insert(qkey.clone(), state);
                    true
                }
            }
        };
        if start_runner {
            let runner = Runner {
                store: self.store.clone(),
                queues: self.queues.clone(),
                limit: limit.clone(),
                qkey: qkey.clone(),
                call_timeout: self.call_timeout,
                lease: self.lease,
            };
            tokio::spawn(runner.run());
        }
        let mut rx = rx;
        if let Ok(answer) = tokio::time::timeout(budget, &mut rx).await {
            return answer.unwrap_or_else(|_| Err(runner_stopped()));
        }
        let contended = self.store.lost_race_since(limit, key, now);
        if contended {
            // The store answered this key while the check waited, but every write lost a
            // race: contention, not an outage. The runner stops retrying before this
            // check's deadline, but its last attempt may run a little over: hear it out.
            if let Ok(answer) = tokio::time::timeout(CONTENTION_GRACE, &mut rx).await {
                return answer.unwrap_or_else(|_| Err(runner_stopped()));
            }
        }
        // Stop listening, then take an answer sent just before: from here on the runner
        // knows this check was not told, and keeps any hit its write counted for it.
        rx.close();
        if let Ok(answer) = rx.try_recv() {
            return answer;
        }
        if contended {
            Err(StoreError::Contention { attempts: 0 })
        } else {
            Err(StoreError::Timeout(budget))
        }
    }

    /// Drops this instance's lease for `key` (after a reset: its hits were in the counter
    /// that was cleared).
    pub fn forget(&self, limit: &Limit, key: &str) {
        let qkey: QueueKey = (limit.name.clone(), Arc::from(key));
        if let Some(state) = lock(&self.queues).get_mut(&qkey) {
            state.lease = None;
        }
    }
}

/// Admits `cost` from the key's lease, if it holds enough for `window` and no earlier
/// check is still waiting (arrival order is kept).
fn take_from_lease(state: &mut KeyState, limit: &Limit, window: i64, cost: u32) -> Option<Served> {
    if !state.pending.is_empty() {
        return None;
    }
    state.spend_lease(limit, window, cost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Admission, MemoryStore, WindowCount};
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A memory store whose first `admit` panics, as a bug in a store would.
    struct PanicsOnce {
        inner: MemoryStore,
        panicked: AtomicBool,
    }

    #[async_trait]
    impl CounterStore for PanicsOnce {
        fn name(&self) -> &'static str {
            "panics-once"
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
            if !self.panicked.swap(true, Ordering::SeqCst) {
                panic!("a store bug");
            }
            self.inner.admit(limit, key, window, costs).await
        }
        async fn peek(&self, l: &Limit, k: &str, w: i64) -> Result<WindowCount, StoreError> {
            self.inner.peek(l, k, w).await
        }
        async fn reset(&self, l: &Limit, k: &str) -> Result<(), StoreError> {
            self.inner.reset(l, k).await
        }
    }

    #[tokio::test]
    async fn a_runner_that_panics_never_strands_its_key() {
        let store = Arc::new(PanicsOnce {
            inner: MemoryStore::new(),
            panicked: AtomicBool::new(false),
        });
        let c = Coalescer::new(store, Duration::from_secs(1), LeaseOptions::default());
        let limit = Arc::new(Limit::new("t", 5, Duration::from_secs(60)));
        let first = c.admit(&limit, "k", 1, 1, Duration::from_secs(5)).await;
        assert!(
            matches!(first, Err(StoreError::Connect(_))),
            "the check waiting on the dead runner is answered at once: {first:?}"
        );
        assert!(lock(&c.queues).is_empty(), "the key was removed");
        let second = c.admit(&limit, "k", 1, 1, Duration::from_secs(5)).await;
        assert!(second.is_ok_and(|s| s.outcome.allowed && !s.from_lease));
    }
}
