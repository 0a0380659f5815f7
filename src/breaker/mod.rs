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
//! `Guarded` (`guarded.rs`) puts it in front of a store as a `CounterStore` decorator,
//! so it sees each real store call exactly once, whatever batching happens above it.
//! Each guarded call runs in its own task, bounded by the store timeout and reporting its
//! own result, so a caller whose deadline runs out can leave without the call being cut
//! short: **no caller can open the breaker** (DESIGN §10). A short deadline then costs
//! that caller a local answer, never everyone a cool-down.
//!
//! The client library (`client`) reuses [`Breaker`] in front of its calls to the service,
//! through [`Breaker::attempt`] (the same leave-and-report API `Guarded` uses).
//!
//! What counts as a failure (`counts_against_store`): the store not answering within
//! its own timeout or answering with an error that is its own (connection errors, 5xx,
//! 401/403 auth, 429, unknown outcomes). What does not: a `4xx` caused by the request
//! (that check fails open alone), a node of the wrong shape, lost transaction races, and
//! a call abandoned by its caller; none of them says anything about the store's health.
//!
//! ```
//! use ratelimit::breaker::{Breaker, BreakerConfig, State};
//! use std::time::Duration;
//!
//! let breaker = Breaker::new(BreakerConfig { failures: 2, cooldown: Duration::from_secs(2) });
//! for _ in 0..2 {
//!     let attempt = breaker.attempt().expect("closed: calls go out");
//!     attempt.finish(false, "unavailable"); // the call failed
//! }
//! assert_eq!(breaker.state(), State::Open);
//! assert!(breaker.attempt().is_none()); // answer locally at once
//! ```

#[cfg(feature = "server")]
pub(crate) mod guarded;

use std::sync::Mutex;
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

    /// A call left without a result (its task was cancelled): neutral for an ordinary
    /// call; an abandoned probe gives its slot back at once, so the breaker can never
    /// stay half-open for want of a probe's answer.
    fn abandon(&self, permit: &Permit) {
        if *permit != Permit::Probe {
            return;
        }
        let mut inner = self.lock();
        if matches!(*inner, Inner::HalfOpen) {
            let now = Inner::Open {
                until: Instant::now(),
            };
            self.transition(&mut inner, now, "probe abandoned");
        }
    }
}

/// Leave to make one call through a [`Breaker`] (from [`Breaker::attempt`]).
///
/// Report the call's result with [`Attempt::finish`]. Dropping it unreported (the
/// caller's future was cancelled mid-call) is neutral: a cancelled caller says nothing
/// about the guarded side. A dropped probe gives its slot back, so the breaker can never
/// be left half-open for ever.
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
            self.breaker.abandon(&self.permit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::guarded::counts_against_store;
    use super::*;
    use crate::store::StoreError;
    use std::sync::Arc;

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
    fn an_abandoned_attempt_is_neutral_and_an_abandoned_probe_frees_its_slot() {
        let b = breaker(0);
        for _ in 0..2 {
            b.record(&Permit::Call, false, "timeout");
        }
        for _ in 0..10 {
            drop(b.attempt().expect("closed")); // callers that gave up mid-call
        }
        assert_eq!(
            b.state(),
            State::Closed,
            "abandoned calls count for nothing"
        );
        b.record(&Permit::Call, false, "timeout");
        assert_eq!(b.state(), State::Open);
        let probe = b.attempt().expect("the cool-down is over");
        assert!(probe.is_probe());
        assert!(b.attempt().is_none(), "one probe at a time");
        drop(probe); // the caller gave up mid-probe
        assert_eq!(b.state(), State::Open);
        let probe = b.attempt().expect("the slot is free again at once");
        assert!(probe.is_probe());
        probe.finish(true, "ok");
        assert_eq!(b.state(), State::Closed);
        assert!(b.attempt().is_some_and(|a| !a.is_probe()));
    }

    #[test]
    fn only_the_stores_own_errors_count() {
        let status = |status| StoreError::Status {
            status,
            message: String::new(),
        };
        for s in [400, 404, 412, 413] {
            assert!(!counts_against_store(&status(s)), "{s}");
        }
        for s in [401, 403, 429, 500, 503] {
            assert!(counts_against_store(&status(s)), "{s}");
        }
        assert!(counts_against_store(&StoreError::Timeout(Duration::ZERO)));
        assert!(counts_against_store(&StoreError::Connect(String::new())));
        assert!(!counts_against_store(&StoreError::Contention {
            attempts: 1
        }));
    }
}
