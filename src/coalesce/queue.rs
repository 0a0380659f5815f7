//! What a key's checks and its runner share: the queue of waiting checks, the lease, the
//! demand measure, and the answer a check gets. See the parent module for the story.

use crate::lease::{Demand, Lease};
use crate::limits::Limit;
use crate::store::{Outcome, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, oneshot};

/// A check's answer from the store or from this instance's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// The window counted in.
    pub window: i64,
    /// The check's outcome; `count` is the store's count as last seen.
    pub outcome: Outcome,
    /// Admitted from this instance's reserve, with no store call.
    pub from_lease: bool,
    /// No hit is left for the key in this window, here or in the store: later checks in
    /// the window may be denied without asking (the deny-until cache).
    pub exhausted: bool,
}

pub(crate) type Answer = Result<Served, StoreError>;

pub(crate) struct Waiter {
    pub(crate) window: i64,
    pub(crate) cost: u32,
    pub(crate) deadline: Instant,
    pub(crate) reply: oneshot::Sender<Answer>,
}

/// What a key's runner and its checks share.
pub(crate) struct KeyState {
    /// Checks waiting for the next store write, in arrival order.
    pub(crate) pending: Vec<Waiter>,
    /// Hits this instance holds for the key.
    pub(crate) lease: Option<Lease>,
    pub(crate) demand: Demand,
    /// The last check's arrival or store write's answer: the key is quiet (its unspent
    /// lease given back) only once neither has happened for the lease's `idle` time, so
    /// checks blocked on a long write do not make a busy key look quiet.
    pub(crate) last_activity: Instant,
    /// Wakes the runner when it waits for work.
    pub(crate) wake: Arc<Notify>,
}

impl KeyState {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            pending: Vec::new(),
            lease: None,
            demand: Demand::new(),
            last_activity: now,
            wake: Arc::new(Notify::new()),
        }
    }
}

pub(crate) type QueueKey = (Arc<str>, Arc<str>);
pub(crate) type Queues = Arc<Mutex<HashMap<QueueKey, KeyState>>>;

/// Longest pause between two batches of one key (see the fairness note in `run`).
pub(crate) const MAX_LINGER: Duration = Duration::from_millis(25);
/// How long a contended check whose budget ran out still listens for the write it is in
/// (within the limiter's margin before a caller's own deadline).
pub(crate) const CONTENTION_GRACE: Duration = Duration::from_millis(40);
/// A batch's deadline as given to the store: the earliest of its checks', less this, so
/// the answer still reaches them in time.
pub(crate) const ANSWER_MARGIN: Duration = Duration::from_millis(5);

impl KeyState {
    /// Admits `cost` from the lease if it holds enough for `window`. Wakes the runner
    /// when what is left calls for a refill.
    pub(crate) fn spend_lease(&mut self, limit: &Limit, window: i64, cost: u32) -> Option<Served> {
        let lease = self.lease.as_mut()?;
        if lease.window < window {
            // Its hits were counted in a window that has ended: they are gone with it.
            self.lease = None;
            return None;
        }
        if lease.window != window || lease.left < cost {
            return None;
        }
        lease.left -= cost;
        let served = Served {
            window,
            outcome: Outcome {
                allowed: true,
                count: lease.count_seen,
            },
            from_lease: true,
            exhausted: lease.left == 0 && lease.count_seen >= limit.requests,
        };
        if self.demand.needs_refill(lease.left) {
            self.wake.notify_one();
        }
        Some(served)
    }

    /// Answers, from the lease, the waiting checks at the head of the queue that it
    /// covers: they queued while it was empty, and a write has refilled it since.
    pub(crate) fn serve_queued_from_lease(&mut self, limit: &Limit) {
        let mut answers = Vec::new();
        while let Some(w) = self.pending.get(answers.len()) {
            let (window, cost) = (w.window, w.cost);
            match self.spend_lease(limit, window, cost) {
                Some(answer) => answers.push(answer),
                None => break,
            }
        }
        let served = answers.len();
        for (w, answer) in self.pending.drain(..served).zip(answers) {
            if w.reply.send(Ok(answer)).is_err() {
                // Its caller gave up: the hits stay in the lease.
                if let Some(l) = self.lease.as_mut() {
                    l.left += w.cost;
                }
            }
        }
    }
}

pub(crate) fn runner_stopped() -> StoreError {
    StoreError::Connect("batch runner stopped".into())
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the map inconsistent (every critical
    // section leaves each entry whole), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn answer_all(batch: Vec<Waiter>, e: &StoreError) {
    for w in batch {
        let _ = w.reply.send(Err(e.clone()));
    }
}
