//! Fixed-window arithmetic: which window a moment falls in, and what to tell the caller.
//!
//! Windows are aligned to the Unix epoch (`w = floor(unix_ms / window_ms)`), so every
//! instance and the client library's fallback agree on the window number without talking
//! to each other. All functions are pure; the clock is read by the caller.
//!
//! ```
//! use ratelimit::window;
//! // A 60 s window: 125 s after the epoch is window 2, which ends at 180 s.
//! assert_eq!(window::number(125_000, 60_000), 2);
//! assert_eq!(window::end_ms(2, 60_000), 180_000);
//! let left = window::until_end(125_000, 2, 60_000);
//! assert_eq!(left.as_millis(), 55_000);
//! assert_eq!(window::ceil_secs(std::time::Duration::from_millis(54_001)), 55);
//! ```

use std::time::Duration;

/// The window number that `now_ms` falls in.
///
/// `window_ms` is never zero: limits are validated at load time.
pub fn number(now_ms: u64, window_ms: u64) -> i64 {
    let w = now_ms / window_ms.max(1);
    i64::try_from(w).unwrap_or(i64::MAX)
}

/// Unix milliseconds at which window `w` ends (the start of `w + 1`).
pub fn end_ms(window: i64, window_ms: u64) -> u64 {
    u64::try_from(window)
        .unwrap_or(0)
        .saturating_add(1)
        .saturating_mul(window_ms)
}

/// Time from `now_ms` until window `w` ends. Zero if it already has.
pub fn until_end(now_ms: u64, window: i64, window_ms: u64) -> Duration {
    Duration::from_millis(end_ms(window, window_ms).saturating_sub(now_ms))
}

/// `d` rounded up to whole seconds, as `x-ratelimit-reset` and `retry-after` want it.
///
/// Rounding up matters: a client told "0 s" while 400 ms remain would retry into a denial.
pub fn ceil_secs(d: Duration) -> u64 {
    let secs = d.as_secs();
    if d.subsec_nanos() > 0 { secs + 1 } else { secs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_number_is_floor_of_unix_ms_over_window() {
        assert_eq!(number(0, 60_000), 0);
        assert_eq!(number(59_999, 60_000), 0);
        assert_eq!(number(60_000, 60_000), 1);
        assert_eq!(number(1_764_518_400_123, 60_000), 29_408_640);
        assert_eq!(number(1_500, 1_000), 1);
    }

    #[test]
    fn window_end_is_start_of_next() {
        assert_eq!(end_ms(0, 60_000), 60_000);
        assert_eq!(end_ms(29_408_640, 60_000), 1_764_518_460_000);
        assert_eq!(end_ms(-1, 60_000), 60_000, "negative windows clamp to 0");
    }

    #[test]
    fn until_end_counts_down_and_saturates() {
        assert_eq!(
            until_end(60_000 + 500, 1, 60_000),
            Duration::from_millis(59_500)
        );
        assert_eq!(until_end(120_000, 1, 60_000), Duration::ZERO);
        assert_eq!(until_end(500_000, 1, 60_000), Duration::ZERO);
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::from_millis(0)), 0);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1_000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(59_001)), 60);
        assert_eq!(ceil_secs(Duration::from_millis(60_000)), 60);
    }

    #[test]
    fn huge_times_do_not_overflow() {
        assert_eq!(number(u64::MAX, 1), i64::MAX);
        assert_eq!(end_ms(i64::MAX, u64::MAX), u64::MAX);
    }
}
