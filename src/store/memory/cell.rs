//! One key's counter in the memory store: the window it counts in and the count, packed
//! in one `AtomicU64`, so a check reads, rolls over and counts it with one
//! compare-and-swap and no lock.
//!
//! A cell lives as long as its key is checked and is reused from window to window, the
//! way the Redis store keeps one string per key: a busy key costs no new entry at each
//! window's start and no removal after its end. That is what keeps the window boundary
//! off the tail (BENCHMARKS.md §13).
//!
//! The window is kept as its low 32 bits and compared by wrapping difference. That is
//! exact while the two windows compared are less than 2^31 windows apart. A live cell is
//! never more than its expiry behind the windows checked against it (at most one window
//! plus some seconds, `memory.rs`), and a cell is keyed by its window length, so windows
//! of one cell are always numbered alike.
//!
//! Windows only move forward, as in the shared stores: if the wall clock steps back, a
//! cell stays in the newer window it holds (a full key stays denied) until the clock
//! catches up with it, rather than handing out a second count for windows it has seen.

use super::super::counter::{WindowCount, visible_count};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub(super) struct Cell(AtomicU64);

/// What a check in `window` sees in a cell holding `state`: the shared rule
/// (`visible_count`: the held window if it is `window` or newer, else `window` at 0)
/// applied to the held window, rebuilt from its low 32 bits next to `window`.
fn visible(state: u64, window: i64) -> WindowCount {
    let ahead = ((state >> 32) as u32).wrapping_sub(window as u32) as i32;
    let held = WindowCount {
        window: window.saturating_add(i64::from(ahead)),
        count: state as u32,
    };
    visible_count(Some(held), window)
}

fn pack(w: WindowCount) -> u64 {
    (u64::from(w.window as u32) << 32) | u64::from(w.count)
}

impl Cell {
    /// A cell counting nothing yet in `window`.
    pub(super) fn new(window: i64) -> Self {
        Self(AtomicU64::new(pack(WindowCount { window, count: 0 })))
    }

    /// The count a check in `window` sees.
    pub(super) fn peek(&self, window: i64) -> WindowCount {
        visible(self.0.load(Ordering::Acquire), window)
    }

    /// Applies `rule` atomically to what a check in `window` sees: `rule(seen)` gives the
    /// new count (kept in `seen.window`), or `None` to write nothing, and what to return.
    /// It is re-run on the newer state if another check got there first.
    pub(super) fn update<T>(
        &self,
        window: i64,
        mut rule: impl FnMut(WindowCount) -> (Option<u32>, T),
    ) -> T {
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            let seen = visible(current, window);
            let (count, out) = rule(seen);
            let Some(count) = count else {
                return out;
            };
            let next = pack(WindowCount {
                window: seen.window,
                count,
            });
            if next == current {
                return out;
            }
            match self
                .0
                .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return out,
                Err(actual) => current = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_rolls_over_to_a_newer_window_and_keeps_counting_in_it() {
        let c = Cell::new(7);
        assert_eq!(
            c.update(7, |s| (Some(s.count + 3), s)),
            WindowCount {
                window: 7,
                count: 0
            }
        );
        assert_eq!(
            c.peek(7),
            WindowCount {
                window: 7,
                count: 3
            }
        );
        // A newer window starts from zero...
        assert_eq!(
            c.peek(8),
            WindowCount {
                window: 8,
                count: 0
            }
        );
        c.update(8, |s| (Some(s.count + 1), ()));
        // ...and a check still in the older one counts in it.
        assert_eq!(
            c.peek(7),
            WindowCount {
                window: 8,
                count: 1
            }
        );
        c.update(7, |s| (Some(s.count + 1), ()));
        assert_eq!(
            c.peek(8),
            WindowCount {
                window: 8,
                count: 2
            }
        );
    }

    #[test]
    fn windows_compare_across_the_32_bit_wrap_and_far_from_zero() {
        for base in [
            0_i64,
            (1 << 32) - 2,
            29_935_545,
            1_764_460_810,
            i64::from(u32::MAX),
        ] {
            let c = Cell::new(base);
            c.update(base, |s| (Some(s.count + 5), ()));
            assert_eq!(
                c.peek(base),
                WindowCount {
                    window: base,
                    count: 5
                }
            );
            assert_eq!(
                c.peek(base + 1),
                WindowCount {
                    window: base + 1,
                    count: 0
                }
            );
            c.update(base + 2, |s| (Some(s.count + 1), ()));
            assert_eq!(
                c.peek(base + 1),
                WindowCount {
                    window: base + 2,
                    count: 1
                },
                "{base}"
            );
        }
    }

    #[test]
    fn the_full_count_range_survives_packing() {
        let c = Cell::new(3);
        c.update(3, |_| (Some(u32::MAX), ()));
        assert_eq!(c.peek(3).count, u32::MAX);
        assert_eq!(c.peek(4).count, 0);
    }

    #[test]
    fn a_rule_that_writes_nothing_leaves_an_older_window_in_place() {
        let c = Cell::new(3);
        c.update(3, |s| (Some(s.count + 2), ()));
        assert!(!c.update(4, |s| (None, s.count > 0)));
        // Still window 3: a late check of window 3 counts there, not in an empty 4.
        assert_eq!(
            c.peek(3),
            WindowCount {
                window: 3,
                count: 2
            }
        );
    }
}
