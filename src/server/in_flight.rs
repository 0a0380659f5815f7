//! Load shedding: how many calls may be in flight at once, and the gauge that shows it.
//!
//! A call that finds every slot taken fails fast with `RESOURCE_EXHAUSTED` instead of
//! queueing without bound; the client library then decides locally. Nothing ever waits
//! for a slot, so this is one atomic counter rather than a semaphore: a semaphore's
//! release takes its waiters' lock on every call, for waiters that never exist here.

use std::sync::atomic::{AtomicUsize, Ordering};

/// At most `max` calls in flight.
pub struct InFlight {
    count: AtomicUsize,
    max: usize,
    gauge: metrics::Gauge,
}

/// One call's slot; dropping it frees the slot.
pub struct Slot<'a>(&'a InFlight);

impl InFlight {
    /// Room for `max` (at least 1) calls at once.
    pub fn new(max: usize) -> Self {
        Self {
            count: AtomicUsize::new(0),
            max: max.max(1),
            gauge: crate::metrics::in_flight_gauge(),
        }
    }

    /// The most calls in flight at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot, or `None` when all `max` are taken.
    pub fn try_enter(&self) -> Option<Slot<'_>> {
        if self.count.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        self.gauge.increment(1.0);
        Some(Slot(self))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.gauge.decrement(1.0);
        self.0.count.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_after_the_last_is_refused_until_one_is_freed() {
        let slots = InFlight::new(2);
        let a = slots.try_enter();
        let b = slots.try_enter();
        assert!(a.is_some() && b.is_some());
        assert!(slots.try_enter().is_none());
        assert!(slots.try_enter().is_none(), "a refusal takes no slot");
        drop(a);
        assert!(slots.try_enter().is_some());
        assert_eq!(InFlight::new(0).max(), 1);
    }
}
