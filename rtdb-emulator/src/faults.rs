//! Fault injection: the switchable misbehaviour the server applies to each request.
//!
//! A [`Faults`] handle is shared by the server and by whoever drives the test (library
//! callers directly, the standalone binary through `POST /.emulator/faults`), so a test can
//! change faults while requests are in flight. Each request takes one snapshot of the
//! configuration when it arrives ([`Faults::plan`]), so a change never splits a request.
//!
//! Most faults hit a random fraction of all requests (an unhealthy store); a
//! [`PathError`] hits every request to matching paths and nothing else (one key's data
//! the store refuses, such as a `400`), so a test can tell "the store is failing" from
//! "this request is bad".

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The fault configuration, also the JSON body of `POST /.emulator/faults` (all fields
/// optional; a missing field means "off").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Delay before each request is handled.
    pub latency_ms: u64,
    /// Delay after the request was applied (a write is already stored) and before the
    /// response is sent: "the write happened, the response is late".
    pub response_latency_ms: u64,
    /// The status answered to the `error_fraction` of requests, which are not applied.
    pub error_status: u16,
    pub error_fraction: f64,
    /// Fraction of requests whose connection is closed without any response, not applied.
    pub drop_fraction: f64,
    /// Fraction of requests that are applied and whose connection is then closed without
    /// any response: "the write happened, the response was lost".
    pub drop_after_apply_fraction: f64,
    /// Every request whose URL path contains a rule's `contains` is answered with that
    /// rule's status (the first rule that matches), without being applied.
    pub path_errors: Vec<PathError>,
}

/// A status answered to every request for some paths (see [`FaultConfig::path_errors`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathError {
    /// Matched against the request's URL path as sent (percent-encoded, with `.json`).
    pub contains: String,
    /// The status to answer, 100–599.
    pub status: u16,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            latency_ms: 0,
            response_latency_ms: 0,
            error_status: 503,
            error_fraction: 0.0,
            drop_fraction: 0.0,
            drop_after_apply_fraction: 0.0,
            path_errors: Vec::new(),
        }
    }
}

/// Why a [`FaultConfig`] was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultError {
    #[error("error_status must be an HTTP status between 100 and 599, got {0}")]
    Status(u16),
    #[error("{0} must be a fraction between 0.0 and 1.0")]
    Fraction(&'static str),
}

impl FaultConfig {
    /// Rejects values the server could not honour, so a typo fails loudly over HTTP.
    pub fn validate(&self) -> Result<(), FaultError> {
        let statuses =
            std::iter::once(self.error_status).chain(self.path_errors.iter().map(|p| p.status));
        for status in statuses {
            if !(100..=599).contains(&status) {
                return Err(FaultError::Status(status));
            }
        }
        for (name, f) in [
            ("error_fraction", self.error_fraction),
            ("drop_fraction", self.drop_fraction),
            ("drop_after_apply_fraction", self.drop_after_apply_fraction),
        ] {
            if !(0.0..=1.0).contains(&f) {
                return Err(FaultError::Fraction(name));
            }
        }
        Ok(())
    }
}

/// What to do with one request, decided when it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Proceed,
    /// Answer with this status and a JSON error body, without applying the request.
    Error(u16),
    /// Close the connection without a response, without applying the request.
    Drop,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub latency: Duration,
    pub action: Action,
    pub response_latency: Duration,
    pub drop_after_apply: bool,
}

/// A cheap clonable handle on the live fault configuration.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    inner: Arc<Mutex<FaultConfig>>,
}

/// Out-of-range fractions are clamped (NaN counts as 0) instead of panicking.
fn fraction(f: f64) -> f64 {
    if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, FaultConfig> {
        // The lock is never held across a panic point; recover the data if it ever is.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Delay before each request is handled (millisecond resolution).
    pub fn set_latency(&self, d: Duration) {
        self.lock().latency_ms = millis(d);
    }

    /// Delay after a request was applied, before its response is sent.
    pub fn set_response_latency(&self, d: Duration) {
        self.lock().response_latency_ms = millis(d);
    }

    /// Answer `fraction` (0.0–1.0) of requests with `status` and a JSON error body, without
    /// applying them. A status outside 100–599 is replaced by 500.
    pub fn set_error(&self, status: u16, fraction: f64) {
        let mut cfg = self.lock();
        cfg.error_status = if (100..=599).contains(&status) {
            status
        } else {
            500
        };
        cfg.error_fraction = self::fraction(fraction);
    }

    /// Close the connection without a response for `fraction` of requests (not applied).
    pub fn set_drop(&self, fraction: f64) {
        self.lock().drop_fraction = self::fraction(fraction);
    }

    /// Apply `fraction` of requests, then close the connection without a response.
    pub fn set_drop_after_apply(&self, fraction: f64) {
        self.lock().drop_after_apply_fraction = self::fraction(fraction);
    }

    /// Answers every request whose URL path contains `contains` with `status` (added to
    /// any earlier rules). A status outside 100–599 is replaced by 500.
    pub fn set_path_error(&self, contains: &str, status: u16) {
        let status = if (100..=599).contains(&status) {
            status
        } else {
            500
        };
        self.lock().path_errors.push(PathError {
            contains: contains.to_owned(),
            status,
        });
    }

    /// Turns every fault off.
    pub fn clear(&self) {
        *self.lock() = FaultConfig::default();
    }

    /// The current configuration.
    pub fn config(&self) -> FaultConfig {
        self.lock().clone()
    }

    /// Replaces the whole configuration.
    pub fn set_config(&self, cfg: FaultConfig) -> Result<(), FaultError> {
        cfg.validate()?;
        *self.lock() = cfg;
        Ok(())
    }

    /// What to do with a request for `path` (the URL path as sent).
    pub(crate) fn plan(&self, path: &str) -> Plan {
        let cfg = self.config();
        let roll = |f: f64| f > 0.0 && fastrand::f64() < f;
        let for_path = cfg
            .path_errors
            .iter()
            .find(|p| path.contains(&p.contains))
            .map(|p| p.status);
        let action = if roll(cfg.drop_fraction) {
            Action::Drop
        } else if let Some(status) = for_path {
            Action::Error(status)
        } else if roll(cfg.error_fraction) {
            Action::Error(cfg.error_status)
        } else {
            Action::Proceed
        };
        Plan {
            latency: Duration::from_millis(cfg.latency_ms),
            action,
            response_latency: Duration::from_millis(cfg.response_latency_ms),
            drop_after_apply: roll(cfg.drop_after_apply_fraction),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setters_clamp_and_plan_follows() {
        let f = Faults::default();
        assert_eq!(f.plan("/k.json").action, Action::Proceed);
        f.set_error(503, 1.0);
        assert_eq!(f.plan("/k.json").action, Action::Error(503));
        f.set_drop(7.0);
        assert_eq!(f.config().drop_fraction, 1.0);
        assert_eq!(f.plan("/k.json").action, Action::Drop);
        f.set_drop(f64::NAN);
        f.set_error(42, 1.0);
        assert_eq!(f.plan("/k.json").action, Action::Error(500));
        f.set_latency(Duration::from_millis(15));
        f.set_response_latency(Duration::from_millis(5));
        f.set_drop_after_apply(1.0);
        let plan = f.plan("/k.json");
        assert_eq!(plan.latency, Duration::from_millis(15));
        assert_eq!(plan.response_latency, Duration::from_millis(5));
        assert!(plan.drop_after_apply);
        f.clear();
        assert_eq!(f.config(), FaultConfig::default());
    }

    #[test]
    fn a_path_error_hits_matching_paths_only() {
        let f = Faults::default();
        f.set_path_error("/rateLimits/mcp/poison", 400);
        f.set_path_error("/other", 1_000);
        assert_eq!(
            f.plan("/rateLimits/mcp/poison.json").action,
            Action::Error(400)
        );
        assert_eq!(f.plan("/rateLimits/mcp/fine.json").action, Action::Proceed);
        assert_eq!(f.plan("/other.json").action, Action::Error(500));
        let json: FaultConfig =
            serde_json::from_str(r#"{"path_errors": [{"contains": "/x", "status": 99}]}"#).unwrap();
        assert_eq!(json.validate(), Err(FaultError::Status(99)));
        f.clear();
        assert_eq!(
            f.plan("/rateLimits/mcp/poison.json").action,
            Action::Proceed
        );
    }

    #[test]
    fn config_validation() {
        let ok: FaultConfig = serde_json::from_str(r#"{"error_fraction": 0.5}"#).unwrap();
        assert_eq!(ok.error_status, 503);
        assert!(ok.validate().is_ok());
        assert!(serde_json::from_str::<FaultConfig>(r#"{"latency": 5}"#).is_err());
        let bad = FaultConfig {
            drop_fraction: 1.5,
            ..FaultConfig::default()
        };
        assert_eq!(bad.validate(), Err(FaultError::Fraction("drop_fraction")));
        let bad = FaultConfig {
            error_status: 99,
            ..FaultConfig::default()
        };
        assert_eq!(bad.validate(), Err(FaultError::Status(99)));
    }
}
