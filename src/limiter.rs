//! The decision path: from "(limit, key, cost)" to a [`Decision`], knowing nothing of gRPC.
//!
//! Read top to bottom, [`Limiter::check`] is the whole story:
//! 1. resolve the limit and validate the input (typed [`CheckError`]s, mapped to gRPC
//!    status codes by `server.rs`);
//! 2. compute the window from the injected clock;
//! 3. for a remote store: deny at once if the key is known exhausted for this window
//!    (`deny_cache.rs`), otherwise join the key's next batch (`coalesce.rs`);
//! 4. ask the store, within a budget of `min(store_timeout, caller's deadline − margin)`;
//! 5. if the store is late or failing, fail open according to the limit's policy
//!    (`fallback.rs`): the answer then says `shared = false`.
//!
//! A store failure is never an error here; only bad input is.

use crate::breaker::guarded::Guarded;
use crate::breaker::{self, Breaker, BreakerConfig};
use crate::clock::SharedClock;
use crate::coalesce::{Coalescer, Served};
use crate::decision::{CheckError, Decision, ResetOutcome, Source, resolve_cost, validate_key};
use crate::deny_cache::DenyCache;
use crate::fallback::{Fallback, LocalWindow};
pub use crate::lease::LeaseOptions;
use crate::limits::{Limit, Limits};
use crate::memory_budget::MemoryBudget;
use crate::metrics;
use crate::store::{self, CounterStore, Outcome, StoreError};
use crate::window;
use std::sync::Arc;
use std::time::Duration;

/// Default store budget per decision (ADR-0006: 1.5 s).
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(1_500);

/// Tunables of the decision path.
#[derive(Debug, Clone)]
pub struct LimiterOptions {
    /// The longest a decision waits for the store.
    pub store_timeout: Duration,
    /// When to stop calling a failing remote store.
    pub breaker: BreakerConfig,
    /// The byte budget; the limiter's own maps (deny-until cache, fallback windows) take
    /// their shares of it (`memory_budget.rs`).
    pub memory: MemoryBudget,
    /// Quota leases for hot keys of a remote store.
    pub lease: LeaseOptions,
    /// How long a key known exhausted is denied without asking the store again
    /// (`deny_cache.rs`): the bound on how late a Reset elsewhere is seen here.
    pub deny_trust: Duration,
}

impl Default for LimiterOptions {
    fn default() -> Self {
        Self {
            store_timeout: DEFAULT_STORE_TIMEOUT,
            breaker: BreakerConfig::default(),
            memory: MemoryBudget::default(),
            lease: LeaseOptions::default(),
            deny_trust: crate::deny_cache::DEFAULT_TRUST,
        }
    }
}

/// What only a remote store needs in front of it.
struct Remote {
    coalescer: Coalescer,
    deny: DenyCache,
    breaker: Arc<Breaker>,
}

/// Makes rate decisions for the configured limits against one store.
pub struct Limiter {
    limits: Limits,
    store: Arc<dyn CounterStore>,
    remote: Option<Remote>,
    fallback: Fallback,
    clock: SharedClock,
    options: LimiterOptions,
}

impl Limiter {
    /// A limiter over `store`, deciding by `clock`. A remote store is put behind a
    /// circuit breaker, per-key batching and a deny-until cache.
    pub fn new(
        limits: Limits,
        store: Arc<dyn CounterStore>,
        clock: SharedClock,
        options: LimiterOptions,
    ) -> Self {
        let shares = options.memory.service(store.is_remote());
        let local =
            LocalWindow::with_budget(clock.clone(), shares.fallback_window, "fallback_window");
        let (store, remote) = if store.is_remote() {
            let breaker = Arc::new(
                Breaker::new(options.breaker).on_change(|state| metrics::breaker(state, true)),
            );
            metrics::breaker(breaker.state(), false);
            let guarded: Arc<dyn CounterStore> =
                Arc::new(Guarded::new(store, breaker.clone(), options.store_timeout));
            let remote = Remote {
                coalescer: Coalescer::new(guarded.clone(), options.store_timeout, options.lease),
                deny: DenyCache::with_budget(clock.clone(), options.deny_trust, shares.deny),
                breaker,
            };
            (guarded, Some(remote))
        } else {
            (store, None)
        };
        Self {
            fallback: Fallback::with_local(local),
            remote,
            limits,
            store,
            clock,
            options,
        }
    }

    /// The configured limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The store's name, for logs.
    pub fn store_name(&self) -> &'static str {
        self.store.name()
    }

    /// The circuit breaker's state; `None` for an in-process store, which has none.
    pub fn breaker_state(&self) -> Option<breaker::State> {
        self.remote.as_ref().map(|r| r.breaker.state())
    }

    /// The store budget for a call whose caller allows `deadline` (if it set one).
    fn budget(&self, deadline: Option<Duration>) -> Duration {
        // Keep a margin for the fallback decision and the response's trip back, so a
        // caller with a short deadline gets a fallback answer rather than DEADLINE_EXCEEDED.
        const MARGIN: Duration = Duration::from_millis(50);
        match deadline {
            Some(d) => self.options.store_timeout.min(d.saturating_sub(MARGIN)),
            None => self.options.store_timeout,
        }
    }

    /// Writes the fallback log's summary lines that are due, so an outage's last line
    /// does not wait for the next fallback (the server calls this every second).
    pub fn flush_fallback_log(&self) {
        self.fallback.log().flush_due();
    }

    /// Counts `cost` hits (0 means 1) for `key` under the limit `limit_name` (empty: the default).
    /// `deadline` is the time the caller will still wait, if known.
    pub async fn check(
        &self,
        limit_name: &str,
        key: &str,
        cost: u32,
        deadline: Option<Duration>,
    ) -> Result<Decision, CheckError> {
        let decision = self.decide(limit_name, key, cost, deadline).await?;
        metrics::decision(&decision);
        Ok(decision)
    }

    async fn decide(
        &self,
        limit_name: &str,
        key: &str,
        cost: u32,
        deadline: Option<Duration>,
    ) -> Result<Decision, CheckError> {
        let limit = self.limits.get(limit_name)?;
        validate_key(key)?;
        let cost = resolve_cost(limit, cost)?;
        let now = self.clock.now_ms();
        let window = window::number(now, limit.window_ms);

        let budget = self.budget(deadline);
        let result = match &self.remote {
            Some(remote) => {
                if remote.deny.is_exhausted(limit, key, window) {
                    let exhausted = Outcome {
                        allowed: false,
                        count: limit.requests,
                    };
                    return Ok(Decision::from_outcome(
                        limit,
                        now,
                        window,
                        exhausted,
                        Source::DenyCache,
                    ));
                }
                remote
                    .coalescer
                    .admit(limit, key, window, cost, budget)
                    .await
            }
            None => self.admit_direct(limit, key, window, cost, budget).await,
        };
        match result {
            Ok(served) => {
                if let Some(remote) = &self.remote
                    && served.exhausted
                {
                    remote.deny.mark(limit, key, served.window);
                }
                let source = if served.from_lease {
                    Source::Lease
                } else {
                    Source::Store
                };
                Ok(Decision::from_outcome(
                    limit,
                    now,
                    served.window,
                    served.outcome,
                    source,
                ))
            }
            // Contention is not an outage: the store answers, this check lost every race
            // it had time for. Admitting it locally would over-admit across the fleet, so
            // it is denied, shared, with a short retry.
            Err(StoreError::Contention { .. }) => {
                metrics::contention_denied(&limit.name);
                Ok(Decision::contended(limit, now, window))
            }
            Err(e) => Ok(self.fallback.decide(limit, key, cost, &e)),
        }
    }

    /// One store call for one check (in-process stores: no batching to gain).
    async fn admit_direct(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        cost: u32,
        budget: Duration,
    ) -> Result<Served, StoreError> {
        // An in-process store answers at once: no future to box, no timer to arm.
        if let Some((window, outcome)) = self.store.admit_at_once(limit, key, window, cost) {
            return Ok(Served {
                window,
                outcome,
                from_lease: false,
                exhausted: false,
            });
        }
        let admission =
            store::within(budget, self.store.admit(limit, key, window, &[cost])).await?;
        let outcome = admission
            .outcomes
            .first()
            .copied()
            .ok_or_else(|| StoreError::Malformed {
                path: format!("{}/{}", limit.name, crate::logging::key_tag(key)),
                detail: "store returned no outcome".into(),
            })?;
        Ok(Served {
            window: admission.window,
            outcome,
            from_lease: false,
            exhausted: false,
        })
    }

    /// A Peek's or Reset's store call within the caller's `budget`, with the discipline
    /// of a Check: a caller with no time left costs the store nothing, and one that stops
    /// waiting leaves the call to finish and report to the breaker (`breaker::Guarded`),
    /// so a short deadline never counts as a store failure.
    async fn bounded<T>(
        &self,
        budget: Duration,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if budget.is_zero() {
            return Err(StoreError::Timeout(budget));
        }
        store::within(budget, call).await
    }

    /// The key's current window without counting a hit.
    pub async fn peek(
        &self,
        limit_name: &str,
        key: &str,
        deadline: Option<Duration>,
    ) -> Result<Decision, CheckError> {
        let limit = self.limits.get(limit_name)?;
        validate_key(key)?;
        let now = self.clock.now_ms();
        let window = window::number(now, limit.window_ms);
        let budget = self.budget(deadline);
        match self
            .bounded(budget, self.store.peek(limit, key, window))
            .await
        {
            Ok(state) => {
                // A fresh count with room in it contradicts a cached refusal (a Reset
                // through another instance): drop the refusal, so the next Check asks
                // the store instead of refusing what this Peek just reported as left.
                if let Some(remote) = &self.remote
                    && state.count < limit.requests
                {
                    remote.deny.clear(limit, key);
                }
                Ok(Decision::from_state(limit, now, state, Source::Store))
            }
            Err(e) => Ok(self.fallback.peek(limit, key, &e)),
        }
    }

    /// Clears the key's window, in the store and in this instance's fallback window.
    pub async fn reset(
        &self,
        limit_name: &str,
        key: &str,
        deadline: Option<Duration>,
    ) -> Result<ResetOutcome, CheckError> {
        let limit = self.limits.get(limit_name)?;
        validate_key(key)?;
        let window = window::number(self.clock.now_ms(), limit.window_ms);
        self.fallback.reset(limit, key);
        if let Some(remote) = &self.remote {
            remote.deny.clear(limit, key);
            remote.coalescer.forget(limit, key);
        }
        let budget = self.budget(deadline);
        let shared = match self.bounded(budget, self.store.reset(limit, key)).await {
            Ok(()) => true,
            Err(e) => {
                let key = crate::logging::key_tag(key);
                tracing::warn!(limit = %limit.name, %key, error = %e, "reset reached only this instance: store failed");
                false
            }
        };
        Ok(ResetOutcome {
            limit_name: limit.name.clone(),
            window,
            shared,
        })
    }
}
