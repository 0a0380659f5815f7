//! The circuit breaker in front of a remote store.
//!
//! Without it, every check pays the full store budget (1.5 s) for as long as RTDB is
//! down; Envoy's ratelimit makes each request wait out its Redis timeout this way. With
//! it, after `failures` consecutive store failures the breaker **opens**: calls fail at
//! once (the limiter answers from its local window) for `cooldown`. Then it lets **one
//! probe** through (half-open) while everything else still answers locally; a probe
//! that succeeds closes the breaker and decisions are shared again, one that fails
//! re-opens it for another cool-down.
//!
//! It is a [`CounterStore`] decorator ([`Guarded`]) so it sees each real store call
//! exactly once, whatever batching happens above it, and it applies the store timeout
//! itself so that a call abandoned by its callers still reports a result.
//!
//! The client library (`client`) reuses [`Breaker`] in front of its calls to the service,
//! through [`Breaker::attempt`] (the same leave-and-report API [`Guarded`] uses).
//!
//! What counts as a failure: the store not answering or answering with an error
//! (timeouts, connection errors, 5xx, auth, unknown outcomes). What does not: a node of
//! the wrong shape or lost transaction races, which say nothing about the store's health.

use crate::limits::Limit;
use crate::store::{Admission, CounterStore, StoreError, WindowCount};
use async_trait::async_trait;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Breaker thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failures: u32,
    /// How long it stays open before a probe is tried.
    pub cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: 5,
            cooldown: Duration::from_secs(2),
        }
    }
}

/// The breaker's state, as reported in logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Calls go to the store.
    Closed,
    /// Calls fail at once.
    Open,
    /// One probe is in flight; other calls fail at once.
    HalfOpen,
}

impl State {
    /// A stable name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug)]
enum Inner {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen,
}

/// A circuit breaker. Cheap to share.
pub struct Breaker {
    config: BreakerConfig,
    inner: Mutex<Inner>,
    on_change: Option<Box<dyn Fn(State) + Send + Sync>>,
    /// What it guards, for its log lines: `store` here, `service` in the client library.
    subject: &'static str,
}

/// Whether a call may go to the store.
#[derive(Debug, PartialEq, Eq)]
enum Permit {
    Call,
    Probe,
    Reject,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("config", &self.config)
            .field("state", &self.state())
            .finish()
    }
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config: BreakerConfig {
                failures: config.failures.max(1),
                ..config
            },
            inner: Mutex::new(Inner::Closed { failures: 0 }),
            on_change: None,
            subject: "store",
        }
    }

    /// Names what the breaker guards in its log lines (default `store`), so the client
    /// library's breaker does not log as if a store were failing.
    pub fn subject(mut self, subject: &'static str) -> Self {
        self.subject = subject;
        self
    }

    /// Leave to make one call, or `None` while the breaker is open or a probe is already
    /// in flight (then answer without calling). Report the call's result on the returned
    /// [`Attempt`].
    pub fn attempt(&self) -> Option<Attempt<'_>> {
        match self.acquire() {
            Permit::Reject => None,
            permit => Some(Attempt {
                breaker: self,
                permit,
                done: false,
            }),
        }
    }

    /// Calls `f` with the new state on every transition (for metrics).
    pub fn on_change(mut self, f: impl Fn(State) + Send + Sync + 'static) -> Self {
        self.on_change = Some(Box::new(f));
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current state.
    pub fn state(&self) -> State {
        match &*self.lock() {
            Inner::Closed { .. } => State::Closed,
            Inner::Open { .. } => State::Open,
            Inner::HalfOpen => State::HalfOpen,
        }
    }

    fn transition(&self, inner: &mut Inner, next: Inner, reason: &str) {
        *inner = next;
        let state = match inner {
            Inner::Closed { .. } => State::Closed,
            Inner::Open { .. } => State::Open,
            Inner::HalfOpen => State::HalfOpen,
        };
        match state {
            State::Open => tracing::warn!(
                state = state.as_str(),
                cooldown = ?self.config.cooldown,
                reason,
                "{0} circuit breaker open: answering locally (shared=false) without calling the {0}",
                self.subject
            ),
            State::HalfOpen => tracing::info!(
                state = state.as_str(),
                "{0} circuit breaker probing the {0}",
                self.subject
            ),
            State::Closed => tracing::warn!(
                state = state.as_str(),
                reason,
                "{} circuit breaker closed: decisions are shared again",
                self.subject
            ),
        }
        if let Some(f) = &self.on_change {
            f(state);
        }
    }

    fn acquire(&self) -> Permit {
        let mut inner = self.lock();
        match &*inner {
            Inner::Closed { .. } => Permit::Call,
            Inner::HalfOpen => Permit::Reject,
            Inner::Open { until } if Instant::now() < *until => Permit::Reject,
            Inner::Open { .. } => {
                self.transition(&mut inner, Inner::HalfOpen, "cool-down over");
                Permit::Probe
            }
        }
    }

    fn record(&self, permit: &Permit, healthy: bool, reason: &str) {
        let mut inner = self.lock();
        let open = Inner::Open {
            until: Instant::now() + self.config.cooldown,
        };
        match (permit, healthy, &*inner) {
            (Permit::Probe, true, _) => {
                self.transition(&mut inner, Inner::Closed { failures: 0 }, "probe succeeded")
            }
            (Permit::Probe, false, _) => self.transition(&mut inner, open, reason),
            (Permit::Call, true, Inner::Closed { .. }) => *inner = Inner::Closed { failures: 0 },
            (Permit::Call, false, Inner::Closed { failures }) => {
                let failures = failures + 1;
                if failures >= self.config.failures {
                    self.transition(&mut inner, open, reason);
                } else {
                    *inner = Inner::Closed { failures };
                }
            }
            // A call that started before the breaker opened finished late: its result
            // says nothing the probe will not say better.
            _ => {}
        }
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

    /// Makes one store call through the breaker. `writes` names the counter a
    /// conditional write goes to, so that a call that ran out of time while losing races
    /// on it is told apart from a store that did not answer.
    async fn call<T>(
        &self,
        writes: Option<(&Limit, &str)>,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let Some(attempt) = self.breaker.attempt() else {
            return Err(StoreError::CircuitOpen);
        };
        let started = Instant::now();
        let mut result = crate::store::within(self.timeout, fut).await;
        if let (Err(StoreError::Timeout(_)), Some((limit, key))) = (&result, writes)
            && self.inner.lost_race_since(limit, key, started)
        {
            // The store kept answering (412) but other writers kept winning: contention,
            // which says nothing bad about the store's health.
            result = Err(StoreError::Contention { attempts: 0 });
        }
        let healthy = match &result {
            Ok(_) => true,
            Err(StoreError::Malformed { .. } | StoreError::Contention { .. }) => true,
            Err(_) => false,
        };
        let reason = result.as_ref().err().map_or("ok", StoreError::kind);
        if result.is_err() {
            crate::metrics::store_error(reason);
        }
        attempt.finish(healthy, reason);
        result
    }
}

/// Leave to make one call through a [`Breaker`] (from [`Breaker::attempt`]).
///
/// Report the call's result with [`Attempt::finish`]. Dropping it unreported (the
/// caller's future was cancelled mid-call) counts as a failure, so a probe can never be
/// lost and leave the breaker half-open for ever.
#[must_use = "report the call's result with Attempt::finish"]
pub struct Attempt<'a> {
    breaker: &'a Breaker,
    permit: Permit,
    done: bool,
}

impl Attempt<'_> {
    /// True when this call is the one probe let through after a cool-down.
    pub fn is_probe(&self) -> bool {
        self.permit == Permit::Probe
    }

    /// Reports the call's result: `healthy` when the guarded side answered (even with an
    /// error that says nothing about its health); `reason` names a failure in logs.
    pub fn finish(mut self, healthy: bool, reason: &str) {
        self.done = true;
        self.breaker.record(&self.permit, healthy, reason);
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.breaker.record(&self.permit, false, "abandoned");
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
        self.call(
            Some((limit, key)),
            self.inner.admit(limit, key, window, costs),
        )
        .await
    }

    async fn peek(&self, limit: &Limit, key: &str, window: i64) -> Result<WindowCount, StoreError> {
        self.call(None, self.inner.peek(limit, key, window)).await
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        self.call(None, self.inner.reset(limit, key)).await
    }

    async fn release(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        hits: u32,
    ) -> Result<bool, StoreError> {
        self.call(
            Some((limit, key)),
            self.inner.release(limit, key, window, hits),
        )
        .await
    }

    fn lost_race_since(&self, limit: &Limit, key: &str, since: Instant) -> bool {
        self.inner.lost_race_since(limit, key, since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(cooldown_ms: u64) -> Breaker {
        Breaker::new(BreakerConfig {
            failures: 3,
            cooldown: Duration::from_millis(cooldown_ms),
        })
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = breaker(60_000);
        for _ in 0..2 {
            assert_eq!(b.acquire(), Permit::Call);
            b.record(&Permit::Call, false, "timeout");
        }
        b.record(&Permit::Call, true, "ok"); // a success resets the streak
        for _ in 0..2 {
            b.record(&Permit::Call, false, "timeout");
        }
        assert_eq!(b.state(), State::Closed);
        b.record(&Permit::Call, false, "timeout");
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.acquire(), Permit::Reject);
    }

    #[test]
    fn one_probe_at_a_time_after_the_cooldown() {
        let b = breaker(0);
        for _ in 0..3 {
            b.record(&Permit::Call, false, "timeout");
        }
        assert_eq!(b.acquire(), Permit::Probe);
        assert_eq!(b.state(), State::HalfOpen);
        assert_eq!(b.acquire(), Permit::Reject, "only one probe in flight");
        b.record(&Permit::Probe, false, "timeout");
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.acquire(), Permit::Probe);
        b.record(&Permit::Probe, true, "ok");
        assert_eq!(b.state(), State::Closed);
        assert_eq!(b.acquire(), Permit::Call);
    }

    #[test]
    fn transitions_are_reported() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let b = breaker(0).on_change(move |st| s.lock().map(|mut v| v.push(st)).unwrap_or(()));
        for _ in 0..3 {
            b.record(&Permit::Call, false, "timeout");
        }
        let p = b.acquire();
        b.record(&p, true, "ok");
        let seen = seen.lock().map(|v| v.clone()).unwrap_or_default();
        assert_eq!(seen, [State::Open, State::HalfOpen, State::Closed]);
    }

    #[test]
    fn an_abandoned_attempt_counts_as_a_failure_and_frees_the_probe() {
        let b = breaker(0);
        for _ in 0..3 {
            b.record(&Permit::Call, false, "timeout");
        }
        let probe = b.attempt().expect("the cool-down is over");
        assert!(probe.is_probe());
        assert!(b.attempt().is_none(), "one probe at a time");
        drop(probe); // the caller gave up mid-call
        assert_eq!(b.state(), State::Open);
        let probe = b.attempt().expect("a new probe after the cool-down");
        probe.finish(true, "ok");
        assert_eq!(b.state(), State::Closed);
        assert!(b.attempt().is_some_and(|a| !a.is_probe()));
    }
}
