//! The limits the client knows: the service's own (learned from `ListLimits`), else the
//! fallback limits the client was built with (default: the built-in `mcp` = 120 / 60 s).
//!
//! The client needs a limit's numbers for two things the service would otherwise do:
//! checking `cost` before any RPC (bad input must never cost a call, and must get the
//! service's own message), and deciding from its own window when the service cannot
//! answer. The service's limits win as soon as they are known, because the fallback
//! limits are only the caller's guess of them.
//!
//! **A limit the client has never heard of** (neither learned nor in its fallback
//! limits) is, when the service cannot be asked, decided by a stand-in ([`stand_in`]):
//! the default limit's `requests` and window, under the asked name (its own windows,
//! never shared with the default limit's keys), with `on_store_failure = local`. Never
//! unlimited, and never "refuse everyone" for a limit nothing is known about. It is
//! reported in aggregate ([`UnknownLog`]): one warning for the first, then one summary
//! line per [`LOG_INTERVAL`] while it goes on.

use crate::fallback::LOG_INTERVAL;
use crate::limits::{FailurePolicy, Limit, Limits, LimitsError};
use crate::pb;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long learned limits are trusted before they are fetched again (limits change
/// only with a deploy of the service).
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(300);
/// Least time between two attempts to learn, so a service whose `ListLimits` keeps
/// failing costs at most one extra call per this interval.
const RETRY_EVERY: Duration = Duration::from_secs(30);

/// Most unknown names listed in one summary line (the count covers all of them).
const NAMES_LISTED: usize = 8;

struct Learned {
    limits: Limits,
    at: Instant,
}

/// Learned limits over fallback limits.
pub(crate) struct KnownLimits {
    fallback: Limits,
    learned: RwLock<Option<Learned>>,
    last_attempt: Mutex<Option<Instant>>,
    unknown: UnknownLog,
}

impl KnownLimits {
    pub(crate) fn new(fallback: Limits) -> Self {
        Self {
            fallback,
            learned: RwLock::new(None),
            last_attempt: Mutex::new(None),
            unknown: UnknownLog::default(),
        }
    }

    /// The limit to decide `name` with locally: the known one, else the [`stand_in`]
    /// (recorded in the aggregated log).
    pub(crate) fn for_local_decision(&self, known: Option<Arc<Limit>>, name: &str) -> Arc<Limit> {
        if let Some(limit) = known {
            return limit;
        }
        let limit = Arc::new(stand_in(&self.current(), name));
        self.unknown.record(&limit);
        limit
    }

    /// The aggregated log of decisions for unknown limits, for tests.
    #[cfg(test)]
    pub(crate) fn unknown_log(&self) -> &UnknownLog {
        &self.unknown
    }

    /// The limit called `name` (empty: the default): the service's if it has one by
    /// that name, else the fallback's. `None` when neither knows it; the service is then
    /// the only one that can decide.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Limit>> {
        let learned = self.learned.read().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = learned.as_ref().and_then(|l| l.limits.find(name)) {
            return Some(found.clone());
        }
        self.fallback.find(name).cloned()
    }

    /// The set in use: the service's once learned, else the fallback.
    pub(crate) fn current(&self) -> Limits {
        let learned = self.learned.read().unwrap_or_else(|p| p.into_inner());
        learned
            .as_ref()
            .map_or_else(|| self.fallback.clone(), |l| l.limits.clone())
    }

    /// Replaces the learned limits.
    pub(crate) fn learn(&self, limits: Limits) {
        let mut learned = self.learned.write().unwrap_or_else(|p| p.into_inner());
        *learned = Some(Learned {
            limits,
            at: Instant::now(),
        });
    }

    /// True when the limits should be (re)learned now, and records the attempt: never
    /// learned or learned too long ago, and no attempt in the last [`RETRY_EVERY`].
    pub(crate) fn claim_refresh(&self) -> bool {
        let fresh = {
            let learned = self.learned.read().unwrap_or_else(|p| p.into_inner());
            learned
                .as_ref()
                .is_some_and(|l| l.at.elapsed() < REFRESH_EVERY)
        };
        if fresh {
            return false;
        }
        let mut last = self.last_attempt.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < RETRY_EVERY) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }
}

/// The stand-in for a limit called `name` that `limits` does not hold: the default
/// limit's `requests` and window under `name`, failure policy `local`.
pub(crate) fn stand_in(limits: &Limits, name: &str) -> Limit {
    let default = limits.default_limit();
    Limit::new(name, default.requests, default.window()).with_policy(FailurePolicy::Local)
}

#[derive(Default)]
struct UnknownState {
    since: Option<Instant>,
    decisions: u64,
    names: BTreeSet<String>,
    lines: u64,
}

/// Aggregates local decisions for unknown limits into a few warnings.
#[derive(Default)]
pub(crate) struct UnknownLog {
    state: Mutex<UnknownState>,
}

impl UnknownLog {
    fn record(&self, stand_in: &Limit) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        state.decisions += 1;
        if state.names.len() < NAMES_LISTED {
            state.names.insert(stand_in.name.to_string());
        }
        let Some(since) = state.since else {
            state.since = Some(now);
            state.lines += 1;
            tracing::warn!(
                limit = %stand_in.name,
                requests = stand_in.requests,
                window = %humantime::format_duration(stand_in.window()),
                "limit unknown to this client and the service cannot be asked; deciding locally with the default limit's numbers under this name (add it to the client's fallback limits)"
            );
            state.decisions = 0;
            state.names.clear();
            return;
        };
        if now.duration_since(since) >= LOG_INTERVAL {
            state.lines += 1;
            let names: Vec<&str> = state.names.iter().map(String::as_str).collect();
            tracing::warn!(
                decisions = state.decisions,
                limits = %names.join(", "),
                seconds = now.duration_since(since).as_secs(),
                "local decisions for limits unknown to this client since the last report (default limit's numbers)"
            );
            state.since = Some(now);
            state.decisions = 0;
            state.names.clear();
        }
    }

    /// Warning lines written so far.
    #[cfg(test)]
    pub(crate) fn lines(&self) -> u64 {
        self.state.lock().map(|s| s.lines).unwrap_or(0)
    }
}

/// The service's `ListLimits` answer as validated [`Limits`] (the same rules a limits
/// file obeys, so a broken answer cannot make the client decide on nonsense).
pub(crate) fn from_pb(response: pb::ListLimitsResponse) -> Result<Limits, LimitsError> {
    let origin = "the service's ListLimits";
    let mut default = None;
    let mut limits = Vec::with_capacity(response.limits.len());
    for l in response.limits {
        let window = l
            .window
            .and_then(|d| u64::try_from(d.seconds).ok())
            .map(Duration::from_secs)
            .ok_or_else(|| LimitsError::Invalid {
                origin: origin.to_owned(),
                limit: l.name.clone(),
                problem: "window missing or negative".into(),
            })?;
        // An unknown name (a newer service) means the default, the ADR's `local`.
        let policy = FailurePolicy::from_name(&l.on_store_failure).unwrap_or_default();
        if l.is_default && default.is_none() {
            default = Some(l.name.clone());
        }
        limits.push(Limit::new(&l.name, l.requests, window).with_policy(policy));
    }
    // A service always marks one default; if an answer does not, the first one is the
    // best guess (a single-limit file needs no mark).
    let default = default
        .or_else(|| limits.first().map(|l| l.name.to_string()))
        .ok_or_else(|| LimitsError::Set {
            origin: origin.to_owned(),
            problem: "no limits".into(),
        })?;
    Limits::new(origin, limits, &default)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pb_limit(name: &str, requests: u32, secs: i64, default: bool) -> pb::Limit {
        pb::Limit {
            name: name.into(),
            requests,
            window: Some(prost_types::Duration {
                seconds: secs,
                nanos: 0,
            }),
            is_default: default,
            on_store_failure: "deny".into(),
        }
    }

    #[test]
    fn learned_limits_win_over_the_fallback_which_still_fills_gaps() {
        let known = KnownLimits::new(Limits::builtin());
        assert_eq!(known.get("").map(|l| l.requests), Some(120));
        assert!(known.get("signin").is_none());
        let learned = from_pb(pb::ListLimitsResponse {
            limits: vec![
                pb_limit("signin", 5, 900, false),
                pb_limit("uploads", 20, 3600, true),
            ],
        })
        .expect("valid");
        known.learn(learned);
        let default = known.get("").expect("default");
        assert_eq!((&*default.name, default.requests), ("uploads", 20));
        let signin = known.get("signin").expect("learned");
        assert_eq!(signin.window_ms, 900_000);
        assert_eq!(signin.on_store_failure, FailurePolicy::Deny);
        assert_eq!(known.get("mcp").map(|l| l.requests), Some(120));
    }

    #[test]
    fn looking_up_a_limit_neither_set_knows_allocates_nothing() {
        let known = KnownLimits::new(Limits::builtin());
        let (n, found) = crate::alloc_count::allocations(|| known.get("uploads"));
        assert!(found.is_none());
        assert_eq!(n, 0, "no error message is built per check");
    }

    #[test]
    fn a_broken_answer_is_refused() {
        for bad in [
            vec![],
            vec![pb_limit("a", 0, 60, true)],
            vec![pb_limit("a", 1, -5, true)],
            vec![pb_limit("a b", 1, 60, true)],
        ] {
            assert!(from_pb(pb::ListLimitsResponse { limits: bad }).is_err());
        }
    }

    #[test]
    fn an_unknown_limit_gets_the_default_limits_numbers_under_its_own_name() {
        let fallback = Limits::from_toml(
            "test",
            "[[limit]]\nname = \"signin\"\nrequests = 5\nwindow = \"15m\"\non_store_failure = \"allow\"\n",
        )
        .expect("valid");
        let known = KnownLimits::new(fallback);
        let got = known.for_local_decision(None, "uploads");
        assert_eq!(
            (
                &*got.name,
                got.requests,
                got.window_ms,
                got.on_store_failure
            ),
            ("uploads", 5, 900_000, FailurePolicy::Local),
            "never the default's `allow`: an unknown limit is never unlimited"
        );
        let signin = known.get("signin");
        assert_eq!(
            known.for_local_decision(signin.clone(), "signin"),
            signin.expect("known")
        );
        for _ in 0..1_000 {
            known.for_local_decision(None, "uploads");
            known.for_local_decision(None, "other");
        }
        assert_eq!(
            known.unknown_log().lines(),
            1,
            "one warning, not one per check"
        );
    }

    #[test]
    fn refresh_is_claimed_once_until_it_is_due_again() {
        let known = KnownLimits::new(Limits::builtin());
        assert!(known.claim_refresh());
        assert!(
            !known.claim_refresh(),
            "a recent attempt holds further ones back"
        );
        known.learn(Limits::builtin());
        assert!(!known.claim_refresh(), "fresh limits need no refresh");
    }
}
