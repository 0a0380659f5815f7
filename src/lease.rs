//! Quota leases: how many hits a hot key's instance reserves in one store write (DESIGN §9).
//!
//! Conditional PUTs on one RTDB node let the whole fleet commit one write per round trip,
//! so a key that is hot on many instances cannot be decided one write per check. Instead
//! an instance that sees sustained demand for a key adds a *reserve* to its batch: extra
//! hits counted in the store in the same write, which it then admits locally with no store
//! call (`Source::Lease`, still shared: the hits were counted). This module owns the
//! sizing rule and the per-key state; `coalesce.rs` owns the queue and the store calls.
//!
//! The rule, and why:
//! - **Demand, not guesswork.** The reserve covers what this instance expects to be asked
//!   during the next few writes: the key's arrival rate here × the key's write latency
//!   here (which includes time lost to races) × [`SPAN`], and is refilled once it is down
//!   to [`REFILL_AT`] writes' worth, so the refill lands before the reserve runs dry and
//!   each instance writes a hot key only every few latencies (the node commits one write
//!   per round trip for the whole fleet). A key is *hot* only when that expectation is
//!   well above one check for two store writes in a row: one sequential caller (or a
//!   one-off burst) never leases, so cold keys keep the exact one-write-per-check path.
//! - **Never more than a share of what is left.** A lease takes at most `1/share` of what
//!   the store last said was left, and none at all when that share is under 2 hits, so the
//!   last hits of a window are always decided one by one (the exact path), and many
//!   instances racing for a nearly full key cannot strand its last hits in reserves. The
//!   store admits a reserve only if it fits (all or nothing), so a lease never exceeds
//!   what is left even when this instance's view is stale.
//! - **Given back when quiet.** A reserve nobody asks for within `idle` is returned
//!   (`CounterStore::release`); at the latest it is gone with its window. What a lease can
//!   withhold from other instances is therefore bounded by one share of what was left, for
//!   at most `idle` after this instance's demand stops.
//! - **A Reset elsewhere is noticed, never undone.** The counter always holds this
//!   instance's hits (`Lease::ours`) on top of everyone else's, so a give-back leaves at
//!   least the hits it admitted (`Lease::keep`): after a Reset through another instance
//!   it cannot erase the hits counted since. And a write that finds the counter below
//!   `ours` knows it was emptied, and drops the old reserve (`Lease::after_write`).

use std::time::{Duration, Instant};

/// How leasing behaves. `max_hits == 0` switches it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Largest reserve taken in one write; 0 disables leases.
    pub max_hits: u32,
    /// A lease takes at most `1 / share` of what the store had left.
    pub share: u32,
    /// An unspent reserve nobody asked for within this long is given back.
    pub idle: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            max_hits: 100_000,
            share: 8,
            idle: Duration::from_millis(250),
        }
    }
}

impl LeaseOptions {
    /// Leasing switched off: every check goes to the store.
    pub const OFF: LeaseOptions = LeaseOptions {
        max_hits: 0,
        share: 8,
        idle: Duration::from_millis(250),
    };

    /// Whether leases are taken at all.
    pub fn enabled(&self) -> bool {
        self.max_hits > 0
    }
}

/// Hits this instance holds for a key, already counted in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The window the hits were counted in; they are worth nothing in any other.
    pub window: i64,
    /// Hits not yet admitted.
    pub left: u32,
    /// The store's count right after this instance's last write (reserve included), so a
    /// decision from the reserve reports `remaining = limit − count_seen` as of that
    /// write.
    pub count_seen: u32,
    /// Hits this instance's writes counted in `window`, reserves included. The counter
    /// holds at least `ours − left` hits this instance admitted, unless a Reset emptied it
    /// since, so a give-back never lowers it below that ([`Lease::keep`]).
    pub ours: u32,
}

impl Lease {
    /// The lease after a write that counted `written` hits in `window` (`reserved` of them
    /// a reserve) and left the counter at `count`. Even with no reserve the lease
    /// remembers the count seen (it sizes the next one).
    pub fn after_write(
        before: Option<Lease>,
        window: i64,
        count: u32,
        reserved: u32,
        written: u32,
    ) -> Lease {
        let (held, ours) = before
            .filter(|l| l.window == window)
            .map_or((0, 0), |l| (l.left, l.ours));
        let ours = ours.saturating_add(written);
        // The counter holds every hit this instance's writes counted in the window (and
        // has not given back) on top of everyone else's. Holding fewer, it was emptied by
        // a Reset through another instance since, taking this instance's earlier hits and
        // unspent reserve with it: of ours it now holds this write's alone.
        let (left, ours) = if count < ours {
            (reserved, written)
        } else {
            (held.saturating_add(reserved), ours)
        };
        Lease {
            window,
            left,
            count_seen: count,
            ours,
        }
    }

    /// What a give-back must leave in the counter: the hits this instance admitted in the
    /// window. Every other instance's hits and reserves are in the counter on top of them,
    /// so a give-back without a Reset since always returns the whole unspent reserve; after
    /// a Reset through another instance (the counter restarted from 0), it returns only
    /// what the fresh count holds beyond them, instead of erasing that instance's hits.
    pub fn keep(&self) -> u32 {
        self.ours.saturating_sub(self.left)
    }
}

/// A key's local demand, measured between store writes.
#[derive(Debug, Clone, Default)]
pub struct Demand {
    /// Hits asked for since the last write started.
    asked: u64,
    /// When the last write started (none yet: the first interval has no start).
    since: Option<Instant>,
    /// Hits per second, smoothed over writes.
    rate: f64,
    /// How long a write of this key takes here, smoothed (races included).
    latency: Option<Duration>,
    /// Consecutive writes that found the key hot.
    hot_streak: u8,
}

/// A reserve covers this many writes' worth of local demand...
const SPAN: f64 = 8.0;
/// ...and is refilled once it is down to this many, so a refill lands before it runs dry
/// and each instance writes a hot key only every few write latencies: the node takes one
/// write per round trip from the whole fleet, so each instance's share of it must be small.
const REFILL_AT: f64 = 2.0;
/// Expected checks per write above which a key is hot. One sequential caller asks a
/// little under once per write, so it stays cold.
const HOT: f64 = 1.5;
/// Weight of the newest sample in the smoothed latency.
const ALPHA: f64 = 0.5;
/// Weight of a lower newest sample in the smoothed rate (a higher one is taken at once).
const FALL: f64 = 0.25;

impl Demand {
    /// No demand seen yet.
    pub fn new() -> Self {
        Self {
            asked: 0,
            since: None,
            rate: 0.0,
            latency: None,
            hot_streak: 0,
        }
    }

    /// Counts `hits` asked for.
    pub fn ask(&mut self, hits: u32) {
        self.asked = self.asked.saturating_add(u64::from(hits));
    }

    /// A write starts: folds the hits asked since the last one into the rate.
    pub fn write_started(&mut self, now: Instant) {
        // Rates are measured from one write's start to the next: what arrived before the
        // first write came in an instant and would read as an absurd rate.
        let elapsed = self
            .since
            .map_or(0.0, |s| now.saturating_duration_since(s).as_secs_f64());
        // A write retried at once after losing its races (or a refill right after a
        // write) is not a new interval: sampling it would read as no demand. Samples span
        // at least half a write.
        if let (Some(_), Some(latency)) = (self.since, self.latency)
            && elapsed < latency.as_secs_f64() / 2.0
        {
            return;
        }
        if elapsed > 0.0 {
            // Rises at once, falls slowly: while a reserve is empty its checks wait for
            // the refill, so an interval's arrivals understate the demand; sizing the next
            // reserve on them would keep it too small to outlast the next write. Unspent
            // hits go back once the key is quiet, so erring high costs little.
            let sample = self.asked as f64 / elapsed;
            self.rate = if sample >= self.rate {
                sample
            } else {
                FALL * sample + (1.0 - FALL) * self.rate
            };
        }
        self.asked = 0;
        self.since = Some(now);
        if self.expected_per_write() >= HOT {
            self.hot_streak = self.hot_streak.saturating_add(1);
        } else {
            self.hot_streak = 0;
        }
    }

    /// A write answered after `took`; `raced` when it lost races on the way (other
    /// instances write the key too). A raced key that is busy here is hot at once: every
    /// write it saves is a round trip the whole fleet waits less.
    pub fn write_took(&mut self, took: Duration, raced: bool) {
        self.latency = Some(match self.latency {
            None => took,
            Some(l) => l.mul_f64(1.0 - ALPHA) + took.mul_f64(ALPHA),
        });
        if raced && self.expected_per_write() >= HOT {
            self.hot_streak = self.hot_streak.max(2);
        }
    }

    /// How long a write of this key takes here (smoothed), once one has succeeded.
    pub fn latency(&self) -> Option<Duration> {
        self.latency
    }

    /// Hits this instance expects to be asked for during one write.
    pub fn expected_per_write(&self) -> f64 {
        self.latency.map_or(0.0, |l| self.rate * l.as_secs_f64())
    }

    /// Hot for two writes in a row.
    pub fn is_hot(&self) -> bool {
        self.hot_streak >= 2
    }

    /// The reserve to add to the next write, given what is still held (`held`) and what
    /// the store last said was left after this batch (`left_in_store`).
    pub fn reserve(&self, options: &LeaseOptions, held: u32, left_in_store: u32) -> u32 {
        if !options.enabled() || !self.is_hot() {
            return 0;
        }
        let want = (SPAN * self.expected_per_write())
            .ceil()
            .min(f64::from(u32::MAX)) as u32;
        let share = left_in_store / options.share.max(1);
        if share < 2 {
            return 0;
        }
        let reserve = want.saturating_sub(held).min(options.max_hits).min(share);
        if reserve < 2 { 0 } else { reserve }
    }

    /// Whether a held reserve of `left` will likely run dry before a write could refill it.
    pub fn needs_refill(&self, left: u32) -> bool {
        self.is_hot() && f64::from(left) <= REFILL_AT * self.expected_per_write()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_keeps_what_it_admitted_and_forgets_what_a_reset_elsewhere_took() {
        // Two writes: 10 checks + a reserve of 20, then 5 checks + a refill of 10; 12 of
        // the reserve spent in between. Others' hits make up the rest of the count.
        let first = Lease::after_write(None, 7, 50, 20, 30);
        assert_eq!((first.left, first.ours, first.keep()), (20, 30, 10));
        let spent = Lease { left: 8, ..first };
        let second = Lease::after_write(Some(spent), 7, 90, 10, 15);
        assert_eq!((second.left, second.ours, second.keep()), (18, 45, 27));
        // The next write finds the counter below what this instance alone put in it: a
        // Reset elsewhere emptied it. Only this write's hits are ours now.
        let after_reset = Lease::after_write(Some(second), 7, 20, 6, 8);
        assert_eq!(
            (after_reset.left, after_reset.ours, after_reset.keep()),
            (6, 8, 2)
        );
        // A new window starts afresh.
        let next = Lease::after_write(Some(after_reset), 8, 3, 0, 3);
        assert_eq!((next.left, next.ours, next.keep()), (0, 3, 3));
    }

    /// Demand of `per_write` checks per write of `latency`, seen over `writes` writes.
    fn demand(per_write: u64, latency_ms: u64, writes: u32) -> Demand {
        let mut now = Instant::now();
        let mut d = Demand::new();
        d.write_started(now);
        for _ in 0..writes {
            d.asked = per_write;
            now += Duration::from_millis(latency_ms);
            d.write_started(now);
            d.write_took(Duration::from_millis(latency_ms), false);
        }
        d
    }

    #[test]
    fn one_sequential_caller_never_leases() {
        let d = demand(1, 60, 20);
        assert!(!d.is_hot());
        assert_eq!(d.reserve(&LeaseOptions::default(), 0, 1_000), 0);
    }

    #[test]
    fn a_burst_alone_does_not_lease_but_sustained_demand_does() {
        let opts = LeaseOptions::default();
        let burst = demand(63, 5, 1);
        assert_eq!(
            burst.reserve(&opts, 0, 1_000),
            0,
            "one hot write is not a trend"
        );
        let hot = demand(8, 60, 3);
        assert!(hot.is_hot());
        assert_eq!(
            hot.reserve(&opts, 0, 10_000),
            64,
            "eight writes' worth of demand"
        );
        assert_eq!(
            hot.reserve(&opts, 10, 10_000),
            54,
            "less what is still held"
        );
    }

    #[test]
    fn a_retry_right_after_a_write_is_not_a_sample_of_no_demand() {
        let mut d = demand(8, 60, 3);
        assert!(d.is_hot());
        let last = d.since.unwrap_or_else(Instant::now);
        for ms in [1, 2, 5, 10] {
            d.write_started(last + Duration::from_millis(ms));
        }
        assert!(
            d.is_hot(),
            "retries within half a write leave the demand as it was"
        );
        assert!(d.expected_per_write() >= 7.9, "{}", d.expected_per_write());
    }

    #[test]
    fn a_busy_key_that_loses_races_is_hot_at_once() {
        let mut d = demand(8, 60, 1);
        assert!(!d.is_hot());
        d.write_took(Duration::from_millis(60), true);
        assert!(d.is_hot());
        let mut seq = demand(1, 60, 1);
        seq.write_took(Duration::from_millis(60), true);
        assert!(
            !seq.is_hot(),
            "one sequential caller stays cold even when raced"
        );
    }

    #[test]
    fn a_lease_takes_at_most_a_share_of_what_is_left_and_none_near_the_end() {
        let opts = LeaseOptions::default();
        let hot = demand(100, 60, 3);
        assert_eq!(hot.reserve(&opts, 0, 120), 15, "120 left / 8");
        assert_eq!(hot.reserve(&opts, 0, 16), 2);
        assert_eq!(hot.reserve(&opts, 0, 15), 0, "the last hits go one by one");
        assert_eq!(hot.reserve(&opts, 0, 0), 0);
        let capped = LeaseOptions {
            max_hits: 50,
            ..opts
        };
        assert_eq!(hot.reserve(&capped, 0, 1_000_000_000), 50);
        assert_eq!(hot.reserve(&LeaseOptions::OFF, 0, 1_000_000_000), 0);
    }

    #[test]
    fn refill_is_due_when_the_reserve_would_not_outlast_a_write() {
        let hot = demand(8, 60, 3);
        assert!(hot.needs_refill(16));
        assert!(!hot.needs_refill(17));
        let cold = demand(1, 60, 3);
        assert!(!cold.needs_refill(0));
    }
}
