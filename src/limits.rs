//! Named limits: what "120 requests a minute" means for each caller, and where it comes from.
//!
//! Limits are read once at startup from a TOML file (or the built-in default, `mcp` =
//! 120 per 60 s) and validated completely before the server listens: a bad file stops
//! startup with a message that names the file, the limit and the problem, because a
//! limiter silently running on the wrong numbers is worse than one that does not start.
//!
//! ```toml
//! [[limit]]
//! name = "mcp"
//! requests = 120
//! window = "60s"
//! default = true
//!
//! [[limit]]
//! name = "signin"
//! requests = 5
//! window = "15m"
//! on_store_failure = "deny"
//! ```
//!
//! In code (the client's fallback limits, tests):
//!
//! ```
//! use ratelimit::limits::{FailurePolicy, Limits};
//! let toml = "[[limit]]\nname = \"mcp\"\nrequests = 120\nwindow = \"60s\"\ndefault = true\n";
//! let limits = Limits::from_toml("limits.toml", toml)?;
//! let mcp = limits.get("")?; // empty: the default limit
//! assert_eq!((&*mcp.name, mcp.requests, mcp.window().as_secs()), ("mcp", 120, 60));
//! assert_eq!(mcp.on_store_failure, FailurePolicy::Local);
//! let bad = Limits::from_toml("limits.toml", "[[limit]]\nname = \"x\"\nrequests = 0\nwindow = \"1s\"\n");
//! assert!(bad.is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use serde::Deserialize;
use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Longest accepted limit name. Names become RTDB path segments (as they are: only
/// `[A-Za-z0-9_-]`, which needs no escape in an RTDB key or a URL path) and metric
/// labels; the RTDB key budget (`store::rtdb::keys`) assumes this bound.
pub const MAX_NAME_LEN: usize = 64;
/// Shortest window: below a second the 1.5 s store budget is longer than the window itself.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// Longest window: 31 days. Anything longer is a quota, not a rate limit.
pub const MAX_WINDOW: Duration = Duration::from_secs(31 * 24 * 3600);
/// Largest `requests` value; keeps `count + cost` far from overflow everywhere.
pub const MAX_REQUESTS: u32 = 1_000_000_000;

/// What the limiter does when the shared store cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Decide from this instance's own window (the ADR's fail-open rule).
    #[default]
    Local,
    /// Admit everything while the store is failing.
    Allow,
    /// Refuse everything while the store is failing (for paranoid limits such as sign-in).
    Deny,
}

impl FailurePolicy {
    /// The policy's name as written in the limits file.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Local => "local",
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
        }
    }

    /// The policy named `name` (as [`FailurePolicy::as_str`] writes it), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            FailurePolicy::Local,
            FailurePolicy::Allow,
            FailurePolicy::Deny,
        ]
        .into_iter()
        .find(|p| p.as_str() == name)
    }
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One named limit: `requests` hits per `window` for each key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// The name callers use (`CheckRequest.limit`) and the RTDB path segment.
    pub name: Arc<str>,
    /// Hits admitted per window for one key.
    pub requests: u32,
    /// The window length in milliseconds (never zero).
    pub window_ms: u64,
    /// What to do when the store fails.
    pub on_store_failure: FailurePolicy,
}

impl Limit {
    /// A limit with the default failure policy. Panics never; validation happens in [`Limits::new`].
    pub fn new(name: &str, requests: u32, window: Duration) -> Self {
        Self {
            name: Arc::from(name),
            requests,
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            on_store_failure: FailurePolicy::Local,
        }
    }

    /// The same limit with another failure policy.
    pub fn with_policy(mut self, policy: FailurePolicy) -> Self {
        self.on_store_failure = policy;
        self
    }

    /// The window as a [`Duration`].
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }
}

/// Why a set of limits was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitsError {
    /// The file could not be read.
    #[error("{origin}: cannot read the limits file: {reason}")]
    Read { origin: String, reason: String },
    /// The file is not valid TOML or has unknown or mistyped fields.
    #[error("{origin}: {reason}")]
    Parse { origin: String, reason: String },
    /// One limit breaks a rule.
    #[error("{origin}: limit {limit:?}: {problem}")]
    Invalid {
        origin: String,
        limit: String,
        problem: String,
    },
    /// The set as a whole breaks a rule (no limits, no default, several defaults).
    #[error("{origin}: {problem}")]
    Set { origin: String, problem: String },
}

/// The limits file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    limit: Vec<LimitSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitSpec {
    name: String,
    requests: i64,
    window: String,
    #[serde(default)]
    default: bool,
    #[serde(default)]
    on_store_failure: FailurePolicy,
}

/// The validated, immutable set of limits the service runs with.
#[derive(Debug, Clone)]
pub struct Limits {
    limits: Vec<Arc<Limit>>,
    default: usize,
}

/// The name asked for is not configured. The message quotes at most [`MAX_NAME_LEN`]
/// characters of it: the name is the caller's, and a status message travels in an HTTP/2
/// trailer that proxies bound.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("unknown limit {}; known limits: {known}", quoted(name))]
pub struct UnknownLimit {
    /// The name that was asked for.
    pub name: String,
    /// The configured names, comma separated.
    pub known: String,
}

/// `name` quoted, cut after [`MAX_NAME_LEN`] characters (no configured name is longer).
fn quoted(name: &str) -> String {
    match name.char_indices().nth(MAX_NAME_LEN) {
        None => format!("{name:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &name[..cut], name.len()),
    }
}

impl Limits {
    /// The built-in set: `mcp` = 120 per 60 s, the default.
    pub fn builtin() -> Self {
        Self {
            limits: vec![Arc::new(Limit::new("mcp", 120, Duration::from_secs(60)))],
            default: 0,
        }
    }

    /// Validates `limits`; `default` names the default limit. `origin` names the source in errors.
    pub fn new(origin: &str, limits: Vec<Limit>, default: &str) -> Result<Self, LimitsError> {
        for l in &limits {
            validate(origin, l)?;
        }
        if let Some(name) = duplicate(limits.iter().map(|l| &*l.name)) {
            return Err(invalid(origin, name, DUPLICATE));
        }
        let default = limits
            .iter()
            .position(|l| &*l.name == default)
            .ok_or_else(|| LimitsError::Set {
                origin: origin.to_owned(),
                problem: format!("the default limit {default:?} is not defined"),
            })?;
        Ok(Self {
            limits: limits.into_iter().map(Arc::new).collect(),
            default,
        })
    }

    /// Parses and validates a limits file's text. `origin` names the file in errors.
    pub fn from_toml(origin: &str, text: &str) -> Result<Self, LimitsError> {
        let spec: FileSpec = toml::from_str(text).map_err(|e| {
            let mut reason = e.to_string().trim_end().to_owned();
            // `[limit]` is one table where the file needs an array of them.
            if reason.contains("expected a sequence") {
                reason.push_str("\n(write each limit as a [[limit]] table, with double brackets)");
            }
            LimitsError::Parse {
                origin: origin.to_owned(),
                reason,
            }
        })?;
        if spec.limit.is_empty() {
            return Err(LimitsError::Set {
                origin: origin.to_owned(),
                problem: "no limits defined; add at least one [[limit]] table".into(),
            });
        }
        // Before the default: two limits of one name and no default is a duplicate name,
        // not a missing default.
        if let Some(name) = duplicate(spec.limit.iter().map(|l| l.name.as_str())) {
            return Err(invalid(origin, name, DUPLICATE));
        }
        let defaults: Vec<&str> = spec
            .limit
            .iter()
            .filter(|l| l.default)
            .map(|l| l.name.as_str())
            .collect();
        let default = match (defaults.as_slice(), spec.limit.as_slice()) {
            ([one], _) => (*one).to_owned(),
            ([], [only]) => only.name.clone(),
            ([], _) => {
                return Err(LimitsError::Set {
                    origin: origin.to_owned(),
                    problem: "no default limit; mark exactly one limit with `default = true`"
                        .into(),
                });
            }
            (many, _) => {
                return Err(LimitsError::Set {
                    origin: origin.to_owned(),
                    problem: format!(
                        "several default limits ({}); mark exactly one with `default = true`",
                        many.join(", ")
                    ),
                });
            }
        };
        let mut limits = Vec::with_capacity(spec.limit.len());
        for s in spec.limit {
            let requests = u32::try_from(s.requests)
                .map_err(|_| invalid(origin, &s.name, &requests_rule(s.requests)))?;
            let window = parse_window(&s.window).map_err(|e| invalid(origin, &s.name, &e))?;
            limits.push(Limit::new(&s.name, requests, window).with_policy(s.on_store_failure));
        }
        Self::new(origin, limits, &default)
    }

    /// Reads, parses and validates the limits file at `path`.
    pub fn load(path: &Path) -> Result<Self, LimitsError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| LimitsError::Read {
            origin: origin.clone(),
            reason: e.to_string(),
        })?;
        Self::from_toml(&origin, &text)
    }

    /// The limit called `name`; the default limit when `name` is empty.
    pub fn get(&self, name: &str) -> Result<&Arc<Limit>, UnknownLimit> {
        self.find(name).ok_or_else(|| UnknownLimit {
            name: name.to_owned(),
            known: self.names().join(", "),
        })
    }

    /// [`Limits::get`] without the error: a caller that has somewhere else to look (the
    /// client's learned and fallback sets) builds no error message per check.
    pub fn find(&self, name: &str) -> Option<&Arc<Limit>> {
        if name.is_empty() {
            return Some(self.default_limit());
        }
        self.limits.iter().find(|l| &*l.name == name)
    }

    /// The limit used when a request names none.
    pub fn default_limit(&self) -> &Arc<Limit> {
        &self.limits[self.default]
    }

    /// Every limit, in file order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Limit>> {
        self.limits.iter()
    }

    /// Every limit's name, in file order.
    pub fn names(&self) -> Vec<&str> {
        self.limits.iter().map(|l| &*l.name).collect()
    }

    /// One line for the startup log: `mcp=120/60s (default), signin=5/900s`.
    pub fn summary(&self) -> String {
        self.limits
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let mark = if i == self.default { " (default)" } else { "" };
                format!(
                    "{}={}/{}{} on_store_failure={}",
                    l.name,
                    l.requests,
                    format_window(l.window()),
                    mark,
                    l.on_store_failure
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

const DUPLICATE: &str = "duplicate name; each limit needs its own";

/// The first name that occurs twice.
fn duplicate<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = HashSet::new();
    names.into_iter().find(|n| !seen.insert(*n))
}

fn requests_rule(got: i64) -> String {
    format!("requests must be between 1 and {MAX_REQUESTS}, got {got}")
}

fn invalid(origin: &str, limit: &str, problem: &str) -> LimitsError {
    LimitsError::Invalid {
        origin: origin.to_owned(),
        limit: limit.to_owned(),
        problem: problem.to_owned(),
    }
}

fn validate(origin: &str, l: &Limit) -> Result<(), LimitsError> {
    let name_ok = !l.name.is_empty()
        && l.name.len() <= MAX_NAME_LEN
        && l.name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !name_ok {
        return Err(invalid(
            origin,
            &l.name,
            &format!("name must be 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 _ -"),
        ));
    }
    if l.requests == 0 || l.requests > MAX_REQUESTS {
        return Err(invalid(
            origin,
            &l.name,
            &requests_rule(i64::from(l.requests)),
        ));
    }
    let window = l.window();
    if window < MIN_WINDOW || window > MAX_WINDOW || !l.window_ms.is_multiple_of(1_000) {
        return Err(invalid(
            origin,
            &l.name,
            &format!(
                "window must be whole seconds between 1s and 31 days, got {}",
                format_window(window)
            ),
        ));
    }
    Ok(())
}

/// A limit's window from the file. humantime's units, except months and years: they are
/// not fixed lengths (humantime takes a month as 30.44 days), and `"1M"` is a month where
/// an operator may well have meant a minute.
fn parse_window(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let calendar = text
        .split(|c: char| !c.is_ascii_alphabetic())
        .find(|unit| matches!(*unit, "M" | "month" | "months" | "y" | "year" | "years"));
    if let Some(unit) = calendar {
        return Err(format!(
            "window {text:?} uses {unit:?} (months or years, not fixed lengths); write days, e.g. \"30d\" (minutes are \"m\")"
        ));
    }
    humantime::parse_duration(text).map_err(|e| {
        format!("window {text:?} is not a duration like \"60s\", \"15m\" or \"1h\" ({e})")
    })
}

/// A window as days, hours, minutes and seconds (`1d 2h`, `90s` as `1m 30s`): humantime
/// shows 31 days as "1month 13h 26m 24s".
pub fn format_window(window: Duration) -> String {
    let secs = window.as_secs();
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3_600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
        (u64::from(window.subsec_millis()), "ms"),
    ];
    let text: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    if text.is_empty() {
        "0s".to_owned()
    } else {
        text.join(" ")
    }
}

#[cfg(test)]
mod tests;
