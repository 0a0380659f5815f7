//! What a caller's HTTP response says about a decision (DESIGN §1, §6).
//!
//! Every response carries `x-ratelimit-limit`, `x-ratelimit-remaining` and
//! `x-ratelimit-reset` (seconds until the window ends); a refusal is `429 Too Many
//! Requests` with `retry-after` in seconds. Alongside, the IETF draft-10 structured
//! fields (draft-ietf-httpapi-ratelimit-headers-10):
//!
//! ```text
//! RateLimit-Policy: "mcp";q=120;w=60     quota q per window of w seconds
//! RateLimit: "mcp";r=119;t=42            r left, more quota in t seconds
//! ```
//!
//! The draft's fields are delta-seconds, like `x-ratelimit-reset`, so neither depends on
//! the caller's clock. `retry-after` is never earlier than the reset (the draft says
//! `Retry-After` should not point before `t`). `RateLimit-Policy` needs the window's
//! length, which a [`Decision`] does not carry; [`super::Client::headers`] adds it from
//! the limits the client knows, or it is passed to [`Decision::headers_with_policy`].
//!
//! ```
//! use ratelimit::decision::{Decision, Source};
//! use ratelimit::limits::Limit;
//! use ratelimit::store::Outcome;
//! use std::time::Duration;
//!
//! let mcp = Limit::new("mcp", 120, Duration::from_secs(60));
//! let outcome = Outcome { allowed: false, count: 120 };
//! let denied = Decision::from_outcome(&mcp, 18_000, 0, outcome, Source::Store);
//! assert_eq!(denied.refusal_status().map(|s| s.as_u16()), Some(429));
//! let h = denied.headers_with_policy(mcp.window());
//! assert_eq!(h["x-ratelimit-remaining"], "0");
//! assert_eq!(h["retry-after"], "42");
//! assert_eq!(h["ratelimit-policy"], "\"mcp\";q=120;w=60");
//! ```

use crate::decision::Decision;
use crate::window;
use http::StatusCode;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use std::time::Duration;

/// `x-ratelimit-limit`: requests per window.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `x-ratelimit-remaining`: requests left in this window.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `x-ratelimit-reset`: seconds until the window ends.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit-Policy` (IETF draft-10): `"<name>";q=<limit>;w=<window seconds>`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft-10): `"<name>";r=<remaining>;t=<seconds until reset>`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

impl Decision {
    /// `Some(429 Too Many Requests)` for a refusal; `None` when allowed (the response
    /// keeps its own status).
    pub fn refusal_status(&self) -> Option<StatusCode> {
        (!self.allowed).then_some(StatusCode::TOO_MANY_REQUESTS)
    }

    /// Seconds until the window ends (`x-ratelimit-reset`, the draft's `t`).
    pub fn reset_secs(&self) -> u64 {
        window::ceil_secs(self.reset_after)
    }

    /// Seconds to wait before retrying (`retry-after`): for a refusal, never less than
    /// [`Decision::reset_secs`]; `None` when allowed.
    pub fn retry_after_secs(&self) -> Option<u64> {
        if self.allowed {
            return None;
        }
        let retry = window::ceil_secs(self.retry_after.unwrap_or(self.reset_after));
        Some(retry.max(self.reset_secs()))
    }

    /// The response headers for this decision: `x-ratelimit-*`, `retry-after` when
    /// refused, and the draft's `RateLimit` field. See [`Decision::headers_with_policy`]
    /// for `RateLimit-Policy` too.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        self.write_headers(None, &mut headers);
        headers
    }

    /// [`Decision::headers`] plus `RateLimit-Policy` for a limit whose window lasts `window`.
    pub fn headers_with_policy(&self, window: Duration) -> HeaderMap {
        let mut headers = HeaderMap::new();
        self.write_headers(Some(window), &mut headers);
        headers
    }

    /// Writes the headers into `headers`, replacing any of the same names (a response
    /// must carry one value of each); `RateLimit-Policy` only when `window` is given.
    pub fn write_headers(&self, window: Option<Duration>, headers: &mut HeaderMap) {
        let reset = self.reset_secs();
        headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(self.limit));
        headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(self.remaining));
        headers.insert(X_RATELIMIT_RESET, HeaderValue::from(reset));
        match self.retry_after_secs() {
            Some(retry) => {
                headers.insert(RETRY_AFTER, HeaderValue::from(retry));
            }
            None => {
                headers.remove(RETRY_AFTER);
            }
        }
        // A limit name that is not a valid structured-field string (limits files only
        // allow A-Z a-z 0-9 _ -, so only a foreign service could send one) drops the
        // draft fields rather than send a malformed one; the x-ratelimit-* ones stand.
        let Some(name) = sf_string(&self.limit_name) else {
            return;
        };
        let fields = [
            window.map(|w| {
                (
                    RATELIMIT_POLICY,
                    format!("{name};q={};w={}", self.limit, window::ceil_secs(w)),
                )
            }),
            Some((RATELIMIT, format!("{name};r={};t={reset}", self.remaining))),
        ];
        for (header, value) in fields.into_iter().flatten() {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(header, value);
            }
        }
    }
}

/// `s` as a structured-field string (RFC 9651 §3.3.3): printable ASCII in quotes, with
/// `"` and `\` escaped. `None` if `s` has anything else.
fn sf_string(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => return None,
        }
    }
    out.push('"');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Source;
    use std::sync::Arc;

    fn decision(allowed: bool, remaining: u32, reset_ms: u64, retry_ms: Option<u64>) -> Decision {
        Decision {
            allowed,
            limit: 120,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: retry_ms.map(Duration::from_millis),
            shared: true,
            source: Source::Store,
            limit_name: Arc::from("mcp"),
            window: 29_408_640,
        }
    }

    fn render(h: &HeaderMap) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = h
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("<binary>").to_owned()))
            .collect();
        v.sort();
        v
    }

    fn pairs(want: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = want
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn an_admitted_request_gets_the_counters_and_no_retry_after() {
        let d = decision(true, 119, 42_000, None);
        assert_eq!(d.refusal_status(), None);
        assert_eq!(
            render(&d.headers_with_policy(Duration::from_secs(60))),
            pairs(&[
                ("x-ratelimit-limit", "120"),
                ("x-ratelimit-remaining", "119"),
                ("x-ratelimit-reset", "42"),
                ("ratelimit-policy", "\"mcp\";q=120;w=60"),
                ("ratelimit", "\"mcp\";r=119;t=42"),
            ])
        );
    }

    #[test]
    fn a_refusal_is_429_with_retry_after() {
        let d = decision(false, 0, 42_000, Some(42_000));
        assert_eq!(d.refusal_status(), Some(StatusCode::TOO_MANY_REQUESTS));
        assert_eq!(
            render(&d.headers_with_policy(Duration::from_secs(900))),
            pairs(&[
                ("x-ratelimit-limit", "120"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "42"),
                ("retry-after", "42"),
                ("ratelimit-policy", "\"mcp\";q=120;w=900"),
                ("ratelimit", "\"mcp\";r=0;t=42"),
            ])
        );
    }

    #[test]
    fn seconds_round_up_and_retry_after_is_never_before_the_reset() {
        let d = decision(false, 0, 1_500, Some(900));
        assert_eq!((d.reset_secs(), d.retry_after_secs()), (2, Some(2)));
        let d = decision(false, 0, 42_000, Some(10_000));
        assert_eq!(d.retry_after_secs(), Some(42));
        let d = decision(false, 0, 42_000, Some(90_000));
        assert_eq!(d.retry_after_secs(), Some(90), "a longer wait is kept");
        let d = decision(false, 3, 5_000, None);
        assert_eq!(
            d.retry_after_secs(),
            Some(5),
            "missing retry_after: the reset"
        );
    }

    #[test]
    fn without_a_window_there_is_no_policy_field() {
        let h = decision(true, 1, 1_000, None).headers();
        assert!(h.get(RATELIMIT_POLICY).is_none());
        assert_eq!(
            h.get(RATELIMIT).and_then(|v| v.to_str().ok()),
            Some("\"mcp\";r=1;t=1")
        );
    }

    #[test]
    fn writing_replaces_earlier_values_and_a_later_allow_drops_retry_after() {
        let mut h = HeaderMap::new();
        h.append(X_RATELIMIT_REMAINING, HeaderValue::from_static("99"));
        decision(false, 0, 3_000, Some(3_000)).write_headers(None, &mut h);
        decision(true, 7, 3_000, None).write_headers(None, &mut h);
        assert_eq!(h.get_all(X_RATELIMIT_REMAINING).iter().count(), 1);
        assert_eq!(h.get(X_RATELIMIT_REMAINING), Some(&HeaderValue::from(7u32)));
        assert!(h.get(RETRY_AFTER).is_none());
    }

    #[test]
    fn names_are_escaped_as_structured_field_strings_or_left_out() {
        assert_eq!(sf_string("a\"b\\c").as_deref(), Some("\"a\\\"b\\\\c\""));
        let mut d = decision(true, 1, 1_000, None);
        d.limit_name = Arc::from("déjà");
        let h = d.headers_with_policy(Duration::from_secs(60));
        assert!(h.get(RATELIMIT).is_none() && h.get(RATELIMIT_POLICY).is_none());
        assert_eq!(h.get(X_RATELIMIT_LIMIT), Some(&HeaderValue::from(120u32)));
    }
}
