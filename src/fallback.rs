//! Failing open: how a decision is made when the shared store cannot make it.
//!
//! ADR-0006 says a store that is late or failing must not slow or break callers. Each
//! limit's `on_store_failure` policy picks the answer:
//! - `local` (default): this instance's own fixed window (a [`MemoryStore`]), so during
//!   an outage each instance still admits at most `limit` per window and the real limit
//!   is at most `limit × instances`;
//! - `allow`: admit everything;
//! - `deny`: refuse everything (for limits where admitting too much is worse than
//!   admitting nothing, such as sign-in attempts).
//!
//! Every such decision says `shared = false`. The logging is aggregated (see
//! [`FallbackLog`]): an outage at 1,000 checks/s must not write 1,000 lines a second.
//! A line names a caller key only by its keyed hash (`logging::key_tag`).
//!
//! ```
//! use ratelimit::clock::ManualClock;
//! use ratelimit::decision::Source;
//! use ratelimit::fallback::LocalWindow;
//! use ratelimit::limits::Limit;
//! use std::{sync::Arc, time::Duration};
//!
//! let clock = Arc::new(ManualClock::new(0));
//! let local = LocalWindow::new(clock.clone());
//! let signin = Limit::new("signin", 2, Duration::from_secs(60)); // policy `local`
//! let a = local.fail_open(&signin, "ip-1", 1, Source::ClientFallback);
//! let b = local.fail_open(&signin, "ip-1", 1, Source::ClientFallback);
//! let c = local.fail_open(&signin, "ip-1", 1, Source::ClientFallback);
//! assert!(a.allowed && b.allowed && !c.allowed);
//! assert!(!c.shared); // this process decided alone
//! clock.advance(60_000); // next window
//! assert!(local.fail_open(&signin, "ip-1", 1, Source::ClientFallback).allowed);
//! ```

use crate::clock::SharedClock;
use crate::decision::{Decision, Source};
use crate::limits::{FailurePolicy, Limit};
use crate::memory_budget::MemoryBudget;
use crate::store::{MemoryStore, Outcome, StoreError};
use crate::window;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the aggregated fallback summary is written while fallbacks continue.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// This process's own fixed windows, as decisions: the service's fallback and the
/// client library's both decide through this, so they cannot disagree on window math.
#[derive(Clone)]
pub struct LocalWindow {
    store: MemoryStore,
    clock: SharedClock,
}

impl LocalWindow {
    /// Empty windows, numbered by `clock`, within the default budget's fallback share.
    pub fn new(clock: SharedClock) -> Self {
        let bytes = MemoryBudget::default().service(true).fallback_window;
        Self::with_budget(clock, bytes, "fallback_window")
    }

    /// Empty windows of at most `bytes`, evictions counted under `cache`.
    pub fn with_budget(clock: SharedClock, bytes: u64, cache: &'static str) -> Self {
        Self {
            store: MemoryStore::with_budget(bytes, cache),
            clock,
        }
    }

    /// Counts `cost` hits for `key` under `limit` in the current window; the decision
    /// says `source` (never shared).
    pub fn decide(&self, limit: &Limit, key: &str, cost: u32, source: Source) -> Decision {
        let now = self.clock.now_ms();
        let window = window::number(now, limit.window_ms);
        let admission = self.store.admit_now(limit, key, window, &[cost]);
        let outcome = admission.outcomes.first().copied().unwrap_or(Outcome {
            allowed: false,
            count: limit.requests,
        });
        Decision::from_outcome(limit, now, admission.window, outcome, source)
    }

    /// Decides `cost` hits for `key` by `limit`'s `on_store_failure` policy, for when the
    /// shared answer cannot be had: `local` counts in this window (the decision says
    /// `local`), `allow` admits and `deny` refuses, counted nowhere
    /// ([`Source::FailurePolicy`]). The service's fallback and the client library's
    /// both decide through this, so they apply a policy identically.
    pub fn fail_open(&self, limit: &Limit, key: &str, cost: u32, local: Source) -> Decision {
        self.by_policy(limit, cost)
            .unwrap_or_else(|| self.decide(limit, key, cost, local))
    }

    /// `key`'s window by `limit`'s `on_store_failure` policy, counting nothing, for when
    /// the shared count cannot be read: what a Check would meet now. `local` reports this
    /// window; `allow` reports every hit left and `deny` none (so sign-in's "attempts
    /// left" never says 2 while every attempt is refused).
    pub fn peek_open(&self, limit: &Limit, key: &str, local: Source) -> Decision {
        self.by_policy(limit, 0)
            .unwrap_or_else(|| self.peek(limit, key, local))
    }

    /// The `allow` or `deny` policy's decision for `cost` hits (a peek passes 0), counted
    /// nowhere; `None` under `local`, which decides in this window.
    fn by_policy(&self, limit: &Limit, cost: u32) -> Option<Decision> {
        let outcome = match limit.on_store_failure {
            FailurePolicy::Local => return None,
            FailurePolicy::Allow => Outcome {
                allowed: true,
                count: cost,
            },
            FailurePolicy::Deny => Outcome {
                allowed: false,
                count: limit.requests,
            },
        };
        let now = self.clock.now_ms();
        let window = window::number(now, limit.window_ms);
        Some(Decision::from_outcome(
            limit,
            now,
            window,
            outcome,
            Source::FailurePolicy,
        ))
    }

    /// `key`'s current window under `limit`, counting nothing.
    pub fn peek(&self, limit: &Limit, key: &str, source: Source) -> Decision {
        let now = self.clock.now_ms();
        let window = window::number(now, limit.window_ms);
        Decision::from_state(limit, now, self.store.peek_now(limit, key, window), source)
    }

    /// Forgets `key`'s counter under `limit`: it starts again from 0.
    pub fn reset(&self, limit: &Limit, key: &str) {
        self.store.reset_now(limit, key);
    }
}

/// Per-instance decisions for when the store fails.
pub struct Fallback {
    local: LocalWindow,
    log: FallbackLog,
}

impl Fallback {
    /// A fallback with an empty local window.
    pub fn new(clock: SharedClock) -> Self {
        Self::with_local(LocalWindow::new(clock))
    }

    /// A fallback deciding locally in `local`.
    pub fn with_local(local: LocalWindow) -> Self {
        Self {
            local,
            log: FallbackLog::default(),
        }
    }

    /// Decides `cost` hits for `key` under `limit` without the store, after `error`.
    pub fn decide(&self, limit: &Limit, key: &str, cost: u32, error: &StoreError) -> Decision {
        let decision = self
            .local
            .fail_open(limit, key, cost, Source::LocalFallback);
        self.log.record(limit, key, error, decision.allowed);
        crate::metrics::fallback(&limit.name, error.kind());
        decision
    }

    /// Reports `key`'s window by the limit's failure policy without counting, after `error`.
    pub fn peek(&self, limit: &Limit, key: &str, error: &StoreError) -> Decision {
        tracing::debug!(limit = %limit.name, key = %crate::logging::key_tag(key), reason = error.kind(), "peek answered by the failure policy");
        self.local.peek_open(limit, key, Source::LocalFallback)
    }

    /// Clears `key`'s local window.
    pub fn reset(&self, limit: &Limit, key: &str) {
        self.local.reset(limit, key);
    }

    /// The aggregated log, for tests.
    pub fn log(&self) -> &FallbackLog {
        &self.log
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    fallbacks: u64,
    admitted: u64,
    denied: u64,
}

#[derive(Default)]
struct LogState {
    since: Option<Instant>,
    tallies: HashMap<(String, &'static str), Tally>,
    lines: u64,
}

/// Aggregates fallback events into a few log lines.
///
/// The first fallback for a `(limit, reason)` pair is logged at once (operators need to
/// know an outage started); after that, counts are summed and written as one line per
/// pair every [`LOG_INTERVAL`], by the next fallback or by [`FallbackLog::flush_due`]
/// (which the server calls every second), so the last line of an outage is written
/// about an interval after its end, not at the next outage. A pair that had no fallback for
/// a whole interval is forgotten: its next fallback starts a new outage and is logged at
/// once again.
#[derive(Default)]
pub struct FallbackLog {
    state: Mutex<LogState>,
}

impl FallbackLog {
    fn record(&self, limit: &Limit, caller_key: &str, error: &StoreError, allowed: bool) {
        self.record_at(Instant::now(), limit, caller_key, error, allowed);
    }

    fn record_at(
        &self,
        now: Instant,
        limit: &Limit,
        caller_key: &str,
        error: &StoreError,
        allowed: bool,
    ) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let since = *state.since.get_or_insert(now);
        let key = (limit.name.to_string(), error.kind());
        let first = !state.tallies.contains_key(&key);
        let tally = state.tallies.entry(key).or_default();
        tally.fallbacks += 1;
        if allowed {
            tally.admitted += 1;
        } else {
            tally.denied += 1;
        }
        if first {
            state.lines += 1;
            // The key only as its keyed hash: keys are personal data (`logging::key_tag`).
            tracing::warn!(
                limit = %limit.name,
                key = %crate::logging::key_tag(caller_key),
                reason = error.kind(),
                error = %error,
                policy = %limit.on_store_failure,
                "store failed; deciding without it (shared=false)"
            );
        }
        if now.duration_since(since) >= LOG_INTERVAL {
            write_summaries(&mut state, since, now);
        }
    }

    /// Writes the summary lines that are due (an interval has passed since the last).
    pub fn flush_due(&self) {
        self.flush_due_at(Instant::now());
    }

    fn flush_due_at(&self, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(since) = state.since
            && now.duration_since(since) >= LOG_INTERVAL
        {
            write_summaries(&mut state, since, now);
        }
    }

    /// Lines written so far.
    pub fn lines(&self) -> u64 {
        self.state.lock().map(|s| s.lines).unwrap_or(0)
    }
}

/// One line per pair with fallbacks since `since`; pairs without any are forgotten.
fn write_summaries(state: &mut LogState, since: Instant, now: Instant) {
    let elapsed = now.duration_since(since);
    let tallies = std::mem::take(&mut state.tallies);
    for ((limit, reason), t) in tallies.into_iter().filter(|(_, t)| t.fallbacks > 0) {
        state.lines += 1;
        tracing::warn!(
            limit = %limit,
            reason,
            fallbacks = t.fallbacks,
            admitted = t.admitted,
            denied = t.denied,
            seconds = elapsed.as_secs(),
            "fallback decisions (shared=false) since the last report"
        );
        // Still failing: stays known, so its next event is not logged as a "first".
        state.tallies.insert((limit, reason), Tally::default());
    }
    state.since = (!state.tallies.is_empty()).then_some(now);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::Arc;

    fn fb() -> Fallback {
        Fallback::new(Arc::new(ManualClock::new(60_000)))
    }

    fn err() -> StoreError {
        StoreError::Connect("refused".into())
    }

    #[test]
    fn local_policy_counts_a_per_instance_window() {
        let f = fb();
        let l = Limit::new("t", 2, Duration::from_secs(60));
        let got: Vec<bool> = (0..3)
            .map(|_| f.decide(&l, "k", 1, &err()).allowed)
            .collect();
        assert_eq!(got, [true, true, false]);
        let d = f.decide(&l, "k", 1, &err());
        assert!(!d.shared);
        assert_eq!(d.source, Source::LocalFallback);
        assert_eq!(d.retry_after, Some(Duration::from_secs(60)));
    }

    #[test]
    fn allow_and_deny_policies_do_what_they_say() {
        let f = fb();
        let allow = Limit::new("a", 1, Duration::from_secs(60)).with_policy(FailurePolicy::Allow);
        let deny = Limit::new("d", 1, Duration::from_secs(60)).with_policy(FailurePolicy::Deny);
        for _ in 0..5 {
            let a = f.decide(&allow, "k", 1, &err());
            assert!(a.allowed && !a.shared);
            assert_eq!(a.source, Source::FailurePolicy);
            let d = f.decide(&deny, "k", 1, &err());
            assert!(!d.allowed && !d.shared);
            assert_eq!((d.remaining, d.source), (0, Source::FailurePolicy));
        }
    }

    #[test]
    fn a_peek_meets_the_policy_a_check_would() {
        let f = fb();
        let local = Limit::new("l", 3, Duration::from_secs(60));
        let allow = Limit::new("a", 3, Duration::from_secs(60)).with_policy(FailurePolicy::Allow);
        let deny = Limit::new("d", 3, Duration::from_secs(60)).with_policy(FailurePolicy::Deny);
        for l in [&local, &allow, &deny] {
            f.decide(l, "k", 1, &err());
        }
        let p = f.peek(&local, "k", &err());
        assert_eq!(
            (p.allowed, p.remaining, p.source),
            (true, 2, Source::LocalFallback),
            "local: this instance's window"
        );
        let p = f.peek(&allow, "k", &err());
        assert_eq!(
            (p.allowed, p.remaining, p.source),
            (true, 3, Source::FailurePolicy),
            "allow: every hit left, nothing counted"
        );
        let p = f.peek(&deny, "k", &err());
        assert_eq!(
            (p.allowed, p.remaining, p.source, p.shared),
            (false, 0, Source::FailurePolicy, false),
            "deny: none left, as a Check would be refused"
        );
        assert_eq!(p.retry_after, Some(Duration::from_secs(60)));
    }

    #[test]
    fn an_outage_writes_one_line_per_limit_and_reason_not_one_per_check() {
        let f = fb();
        let l = Limit::new("t", 100, Duration::from_secs(60));
        for _ in 0..1_000 {
            f.decide(&l, "k", 1, &err());
            f.decide(
                &l,
                "k",
                1,
                &StoreError::Timeout(Duration::from_millis(1_500)),
            );
        }
        assert_eq!(f.log().lines(), 2);
    }

    #[test]
    fn an_outage_is_summed_up_within_an_interval_of_its_end_and_a_new_one_is_logged_at_once() {
        let log = FallbackLog::default();
        let l = Limit::new("t", 100, Duration::from_secs(60));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        for s in 0..3 {
            log.record_at(at(s), &l, "k", &err(), true);
        }
        assert_eq!(log.lines(), 1, "the first fallback, at once");
        log.flush_due_at(at(9));
        assert_eq!(log.lines(), 1, "no summary before an interval has passed");
        log.flush_due_at(at(10));
        assert_eq!(
            log.lines(),
            2,
            "the outage's summary, with no further fallback"
        );
        log.flush_due_at(at(20));
        log.flush_due_at(at(60));
        assert_eq!(
            log.lines(),
            2,
            "a quiet interval writes nothing (no zero lines)"
        );
        log.record_at(at(3_600), &l, "k", &err(), true);
        assert_eq!(log.lines(), 3, "a later outage is logged at once");
        log.record_at(at(3_605), &l, "k", &err(), false);
        log.flush_due_at(at(3_610));
        assert_eq!(log.lines(), 4);
    }
}
