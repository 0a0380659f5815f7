//! The limits the client knows: the service's own (learned from `ListLimits`), else the
//! fallback limits the client was built with (default: the built-in `mcp` = 120 / 60 s).
//!
//! The client needs a limit's numbers for two things the service would otherwise do:
//! checking `cost` before any RPC (bad input must never cost a call, and must get the
//! service's own message), and deciding from its own window when the service cannot
//! answer. The service's limits win as soon as they are known, because the fallback
//! limits are only the caller's guess of them.

use crate::limits::{FailurePolicy, Limit, Limits, LimitsError};
use crate::pb;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long learned limits are trusted before they are fetched again (limits change
/// only with a deploy of the service).
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(300);
/// Least time between two attempts to learn, so a service whose `ListLimits` keeps
/// failing costs at most one extra call per this interval.
const RETRY_EVERY: Duration = Duration::from_secs(30);

struct Learned {
    limits: Limits,
    at: Instant,
}

/// Learned limits over fallback limits.
pub(crate) struct KnownLimits {
    fallback: Limits,
    learned: RwLock<Option<Learned>>,
    last_attempt: Mutex<Option<Instant>>,
}

impl KnownLimits {
    pub(crate) fn new(fallback: Limits) -> Self {
        Self {
            fallback,
            learned: RwLock::new(None),
            last_attempt: Mutex::new(None),
        }
    }

    /// The limit called `name` (empty: the default): the service's if it has one by
    /// that name, else the fallback's. `None` when neither knows it; the service is then
    /// the only one that can decide.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Limit>> {
        let learned = self.learned.read().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = learned.as_ref().and_then(|l| l.limits.get(name).ok()) {
            return Some(found.clone());
        }
        self.fallback.get(name).ok().cloned()
    }

    /// The set in use: the service's once learned, else the fallback.
    pub(crate) fn current(&self) -> Limits {
        let learned = self.learned.read().unwrap_or_else(|p| p.into_inner());
        learned
            .as_ref()
            .map_or_else(|| self.fallback.clone(), |l| l.limits.clone())
    }

    /// Every name the client could decide for, for error messages.
    pub(crate) fn names(&self) -> String {
        let mut names: Vec<String> = self
            .current()
            .names()
            .iter()
            .map(|n| n.to_string())
            .collect();
        for n in self.fallback.names() {
            if !names.iter().any(|m| m == n) {
                names.push(n.to_owned());
            }
        }
        names.join(", ")
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
        assert_eq!(known.names(), "signin, uploads, mcp");
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
