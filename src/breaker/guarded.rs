//! [`Guarded`]: a store behind the [`Breaker`] and the store timeout.
//!
//! Each call runs in a task of its own, bounded by the store's own timeout and reporting
//! its own result, so a caller whose deadline runs out can leave without cutting the call
//! short (DESIGN §10: no caller can open the breaker). Only what the store's answer says
//! about the store counts ([`counts_against_store`]).

use super::{Breaker, Permit};
use crate::limits::Limit;
use crate::store::{Admission, CounterStore, StoreError, WindowCount};
use async_trait::async_trait;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether `error` says the store is unhealthy. A `4xx` other than 401/403 (auth) and 429
/// (the store shedding load) is the request's own problem, such as one key's data.
pub fn counts_against_store(error: &StoreError) -> bool {
    match error {
        StoreError::Malformed { .. } | StoreError::Contention { .. } => false,
        StoreError::Status { status, .. } => {
            !(400..500).contains(status) || matches!(status, 401 | 403 | 429)
        }
        _ => true,
    }
}

/// A store behind a breaker and a per-call timeout.
pub struct Guarded {
    inner: Arc<dyn CounterStore>,
    breaker: Arc<Breaker>,
    timeout: Duration,
}

impl Guarded {
    /// Guards `inner` with `breaker`, bounding each call by `timeout`.
    pub fn new(inner: Arc<dyn CounterStore>, breaker: Arc<Breaker>, timeout: Duration) -> Self {
        Self {
            inner,
            breaker,
            timeout,
        }
    }

    /// Runs `op` on the guarded store in a task of its own, bounded by the store timeout,
    /// and reports its result to the breaker from that task. The caller may stop waiting
    /// (its deadline ran out) without cutting the call short, so its result still counts
    /// for what it says about the store, and only that. `writes` names the counter a
    /// conditional write goes to: a write that ran out of time while losing races on it
    /// is contention (the store kept answering), not a failure. The batch deadline
    /// (`store::with_deadline`) is carried into the task.
    async fn call<T, F, Fut>(&self, writes: Option<(&Limit, &str)>, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn CounterStore>) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let permit = self.breaker.acquire();
        if permit == Permit::Reject {
            return Err(StoreError::CircuitOpen);
        }
        let attempt = OwnedAttempt {
            breaker: self.breaker.clone(),
            permit,
            done: false,
        };
        let fut = op(self.inner.clone());
        let timeout = self.timeout;
        let deadline = crate::store::deadline();
        let inner = self.inner.clone();
        let writes = writes.map(|(l, k)| (l.clone(), k.to_owned()));
        let task = tokio::spawn(async move {
            let mut attempt = attempt;
            let started = Instant::now();
            let bounded = crate::store::within(timeout, fut);
            let mut result = match deadline {
                Some(d) => crate::store::with_deadline(d, bounded).await,
                None => bounded.await,
            };
            if let (Err(StoreError::Timeout(_)), Some((limit, key))) = (&result, &writes)
                && inner.lost_race_since(limit, key, started)
            {
                result = Err(StoreError::Contention { attempts: 0 });
            }
            let reason = result.as_ref().err().map_or("ok", StoreError::kind);
            if result.is_err() {
                crate::metrics::store_error(reason);
            }
            let healthy = result
                .as_ref()
                .err()
                .is_none_or(|e| !counts_against_store(e));
            attempt.done = true;
            attempt.breaker.record(&attempt.permit, healthy, reason);
            result
        });
        match task.await {
            Ok(result) => result,
            // The task panicked or the runtime is shutting down; its attempt's drop has
            // already given back a probe slot.
            Err(e) => Err(StoreError::Connect(format!("store call task ended: {e}"))),
        }
    }
}

/// [`Attempt`] for a call running in a task of its own.
struct OwnedAttempt {
    breaker: Arc<Breaker>,
    permit: Permit,
    done: bool,
}

impl Drop for OwnedAttempt {
    fn drop(&mut self) {
        if !self.done {
            self.breaker.abandon(&self.permit);
        }
    }
}

#[async_trait]
impl CounterStore for Guarded {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn is_remote(&self) -> bool {
        self.inner.is_remote()
    }

    async fn admit(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        costs: &[u32],
    ) -> Result<Admission, StoreError> {
        let writes = Some((limit, key));
        let (limit, key, costs) = (limit.clone(), key.to_owned(), costs.to_vec());
        self.call(writes, |s| async move {
            s.admit(&limit, &key, window, &costs).await
        })
        .await
    }

    async fn peek(&self, limit: &Limit, key: &str, window: i64) -> Result<WindowCount, StoreError> {
        let (limit, key) = (limit.clone(), key.to_owned());
        self.call(None, |s| async move { s.peek(&limit, &key, window).await })
            .await
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        let (limit, key) = (limit.clone(), key.to_owned());
        self.call(None, |s| async move { s.reset(&limit, &key).await })
            .await
    }

    async fn release(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        hits: u32,
        keep: u32,
    ) -> Result<bool, StoreError> {
        let writes = Some((limit, key));
        let (limit, key) = (limit.clone(), key.to_owned());
        self.call(writes, |s| async move {
            s.release(&limit, &key, window, hits, keep).await
        })
        .await
    }

    fn lost_race_since(&self, limit: &Limit, key: &str, since: Instant) -> bool {
        self.inner.lost_race_since(limit, key, since)
    }
}
