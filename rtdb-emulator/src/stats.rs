//! Request counters, so tests and benchmarks can assert how many store round trips a
//! piece of client code really made.
//!
//! Every request to the database (data paths and `/.settings/...`) is counted once, when
//! its fate is known, including requests answered by an injected error and requests whose
//! connection was dropped. The emulator's own control endpoints (`/.emulator/...`) are not
//! counted, so polling the counters does not change them.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

/// A snapshot of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Requests that have arrived, counted on arrival (before any injected latency), so
    /// a test can tell whether a client is still calling while earlier requests are held.
    pub received: u64,
    /// All counted requests, dropped ones included (counted when their fate is known).
    pub total: u64,
    /// Successful (2xx) data writes: PUT, PATCH, POST and DELETE on data paths, including
    /// writes that were applied and then had their connection dropped.
    pub writes: u64,
    /// Requests whose connection was closed without a response (they have no status and
    /// appear only here, in `total` and in `by_method`).
    pub dropped: u64,
    /// Requests per HTTP method (`"GET"`, `"PUT"`, ...).
    pub by_method: BTreeMap<String, u64>,
    /// Requests per response status.
    pub by_status: BTreeMap<u16, u64>,
}

impl Stats {
    /// Requests made with method `m` (case-insensitive).
    pub fn method(&self, m: &str) -> u64 {
        self.by_method
            .get(&m.to_ascii_uppercase())
            .copied()
            .unwrap_or(0)
    }

    /// Requests answered with status `s`.
    pub fn status(&self, s: u16) -> u64 {
        self.by_status.get(&s).copied().unwrap_or(0)
    }
}

/// How one counted request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Answered { status: u16, wrote: bool },
    Dropped { wrote: bool },
}

/// The live counters behind [`Stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    inner: Mutex<Stats>,
}

impl Counters {
    fn lock(&self) -> MutexGuard<'_, Stats> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a request as it arrives.
    pub fn arrived(&self) {
        self.lock().received += 1;
    }

    pub fn record(&self, method: &str, outcome: Outcome) {
        let mut s = self.lock();
        s.total += 1;
        *s.by_method.entry(method.to_owned()).or_insert(0) += 1;
        let wrote = match outcome {
            Outcome::Answered { status, wrote } => {
                *s.by_status.entry(status).or_insert(0) += 1;
                wrote
            }
            Outcome::Dropped { wrote } => {
                s.dropped += 1;
                wrote
            }
        };
        if wrote {
            s.writes += 1;
        }
    }

    pub fn snapshot(&self) -> Stats {
        self.lock().clone()
    }

    /// Zeroes the counters and returns what they held.
    pub fn reset(&self) -> Stats {
        std::mem::take(&mut *self.lock())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_resets() {
        let c = Counters::default();
        c.record(
            "GET",
            Outcome::Answered {
                status: 200,
                wrote: false,
            },
        );
        c.record(
            "PUT",
            Outcome::Answered {
                status: 200,
                wrote: true,
            },
        );
        c.record(
            "PUT",
            Outcome::Answered {
                status: 412,
                wrote: false,
            },
        );
        c.record("PUT", Outcome::Dropped { wrote: true });
        c.record("DELETE", Outcome::Dropped { wrote: false });
        let s = c.snapshot();
        assert_eq!((s.total, s.writes, s.dropped), (5, 2, 2));
        assert_eq!(
            (s.method("put"), s.method("GET"), s.method("PATCH")),
            (3, 1, 0)
        );
        assert_eq!((s.status(200), s.status(412), s.status(0)), (2, 1, 0));
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Stats>(&json).unwrap(), s);
        assert_eq!(c.reset(), s);
        assert_eq!(c.snapshot(), Stats::default());
    }
}
