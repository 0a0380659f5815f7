//! A key's runner: the task that makes the key's store calls (batch writes, lease
//! refills, give-backs) and answers the checks waiting on them. See the parent module.

use super::queue::{
    ANSWER_MARGIN, KeyState, MAX_LINGER, QueueKey, Queues, Served, Waiter, answer_all, lock,
};
use crate::lease::{Lease, LeaseOptions};
use crate::limits::Limit;
use crate::store::{CounterStore, Outcome, StoreError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How much later than the store's own timeout a runner gives up on a call.
const BACKSTOP_SLACK: Duration = Duration::from_millis(100);

/// The next thing a key's runner does.
enum Job {
    /// A store write: the batch's costs, then `reserve` extra hits for the lease.
    Write {
        batch: Vec<Waiter>,
        window: i64,
        reserve: u32,
    },
    /// Give an unspent lease back.
    GiveBack(Lease),
    /// Nothing to do until woken or until `Duration` passes (then the lease may be idle).
    Wait(Duration, Arc<Notify>),
}

/// The task that makes a key's store calls.
pub(crate) struct Runner {
    pub(crate) store: Arc<dyn CounterStore>,
    pub(crate) queues: Queues,
    pub(crate) limit: Arc<Limit>,
    pub(crate) qkey: QueueKey,
    pub(crate) call_timeout: Duration,
    pub(crate) lease: LeaseOptions,
}

/// Removes the runner's key when the runner ends, however it ends: the checks still
/// queued then get an error (and fall back) instead of waiting on a task that is gone.
struct Cleanup {
    queues: Queues,
    qkey: QueueKey,
    /// Cleared when the runner removed its key itself: by then a new check may have
    /// started the key afresh with a runner of its own, which must be left alone.
    armed: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.queues).remove(&self.qkey);
        }
    }
}

impl Runner {
    /// Works the key's queue and lease until the key is quiet, then removes it.
    pub(crate) async fn run(self) {
        let mut cleanup = Cleanup {
            queues: self.queues.clone(),
            qkey: self.qkey.clone(),
            armed: true,
        };
        // How long the previous store write of this key took, if it succeeded.
        let mut last_write: Option<Duration> = None;
        loop {
            let Some(job) = self.next_job() else {
                cleanup.armed = false;
                return;
            };
            match job {
                Job::Wait(d, wake) => {
                    let _ = tokio::time::timeout(d, wake.notified()).await;
                }
                Job::GiveBack(lease) => self.give_back(lease).await,
                Job::Write {
                    batch,
                    window,
                    reserve,
                } => {
                    if let Some(took) = last_write.take() {
                        // Fairness across instances: the instance whose write was applied
                        // first would otherwise send its next batch first every time, and
                        // the others' immediate retries after a 412 keep losing
                        // (BENCHMARKS.md §4). Waiting a random part of one round trip
                        // before the next batch lets their retries in; it only delays a
                        // key with queued checks, by at most one round trip (capped).
                        let linger = took.min(MAX_LINGER).mul_f64(fastrand::f64());
                        tokio::time::sleep(linger).await;
                    }
                    last_write = self.write(batch, window, reserve).await;
                }
            }
        }
    }

    /// Decides the next job under the lock; `None` (the key removed) when there is none.
    fn next_job(&self) -> Option<Job> {
        let mut queues = lock(&self.queues);
        let state = queues.get_mut(&self.qkey)?;
        // Checks whose callers gave up are gone; counting their hits would over-count.
        state.pending.retain(|w| !w.reply.is_closed());
        state.serve_queued_from_lease(&self.limit);
        let now = Instant::now();
        if !state.pending.is_empty() {
            let batch = std::mem::take(&mut state.pending);
            let window = batch.iter().map(|w| w.window).max().unwrap_or_default();
            if state.lease.is_some_and(|l| l.window < window) {
                state.lease = None;
            }
            state.demand.write_started(now);
            let reserve = self.reserve(state, &batch, window);
            return Some(Job::Write {
                batch,
                window,
                reserve,
            });
        }
        if let Some(lease) = state.lease {
            if lease.left > 0 && state.demand.needs_refill(lease.left) {
                state.demand.write_started(now);
                let reserve = self.reserve(state, &[], lease.window);
                if reserve > 0 {
                    return Some(Job::Write {
                        batch: Vec::new(),
                        window: lease.window,
                        reserve,
                    });
                }
            }
            let quiet = now.saturating_duration_since(state.last_activity);
            if quiet < self.lease.idle {
                return Some(Job::Wait(self.lease.idle - quiet, state.wake.clone()));
            }
            state.lease = None;
            if lease.left > 0 {
                return Some(Job::GiveBack(lease));
            }
        }
        // Nothing waiting: done, decided under the lock `admit` joins under, so a check
        // arriving after this finds no runner and starts one.
        queues.remove(&self.qkey);
        None
    }

    /// The reserve to add to a write of `batch` in `window`.
    fn reserve(&self, state: &KeyState, batch: &[Waiter], window: i64) -> u32 {
        let held = state
            .lease
            .filter(|l| l.window == window)
            .map_or(0, |l| l.left);
        let Some(seen) = state.lease.map(|l| l.count_seen) else {
            // No count seen from this key's writes yet: the next write tells.
            return 0;
        };
        let asked: u32 = batch.iter().map(|w| w.cost).sum();
        let left = self
            .limit
            .requests
            .saturating_sub(seen)
            .saturating_sub(asked);
        state.demand.reserve(&self.lease, held, left)
    }

    /// One store write for `batch` plus `reserve`; answers the batch. Returns how long the
    /// write took when it succeeded.
    async fn write(&self, batch: Vec<Waiter>, window: i64, reserve: u32) -> Option<Duration> {
        let mut costs: Vec<u32> = batch.iter().map(|w| w.cost).collect();
        if reserve > 0 {
            costs.push(reserve);
        }
        let deadline = batch
            .iter()
            .map(|w| w.deadline)
            .min()
            // A reserve-only refill has no caller waiting; it stops retrying well inside
            // the call's own timeout.
            .map_or(Instant::now() + self.call_timeout / 2, |d| {
                d.checked_sub(ANSWER_MARGIN).unwrap_or(d)
            });
        let started = Instant::now();
        let call = self.store.admit(&self.limit, &self.qkey.1, window, &costs);
        // A backstop only: the store (behind `breaker::Guarded`) bounds the call itself and
        // classifies its own timeouts, so this fires a little after it would.
        let mut result = crate::store::within(
            self.call_timeout + BACKSTOP_SLACK,
            crate::store::with_deadline(deadline, call),
        )
        .await;
        let took = started.elapsed();
        if matches!(result, Err(StoreError::Timeout(_)))
            && self
                .store
                .lost_race_since(&self.limit, &self.qkey.1, started)
        {
            // It kept losing races until time ran out: contention, not an outage.
            result = Err(StoreError::Contention { attempts: 0 });
        }
        match result {
            Ok(admission) if admission.outcomes.len() == costs.len() => {
                let mut outcomes = admission.outcomes;
                // The store's count after the whole write, reserve included.
                let count = outcomes.last().map_or(0, |o| o.count);
                let reserved = if reserve > 0 {
                    outcomes.pop().filter(|o| o.allowed).map_or(0, |_| reserve)
                } else {
                    0
                };
                let written = batch
                    .iter()
                    .zip(&outcomes)
                    .filter(|(_, o)| o.allowed)
                    .fold(reserved, |sum, (w, _)| sum.saturating_add(w.cost));
                let raced = self
                    .store
                    .lost_race_since(&self.limit, &self.qkey.1, started);
                let lease = self.record(admission.window, count, reserved, written, took, raced);
                let exhausted = count >= self.limit.requests && lease.is_none_or(|l| l.left == 0);
                let mut unclaimed = 0;
                for (w, o) in batch.into_iter().zip(outcomes) {
                    let outcome = Outcome {
                        allowed: o.allowed,
                        // With a reserve taken, the store has less left than each check's
                        // own count says; report what it has left.
                        count: if reserved > 0 { count } else { o.count },
                    };
                    let sent = w.reply.send(Ok(Served {
                        window: admission.window,
                        outcome,
                        from_lease: false,
                        exhausted,
                    }));
                    if sent.is_err() && o.allowed {
                        unclaimed += w.cost;
                    }
                }
                if unclaimed > 0 {
                    self.reclaim(admission.window, unclaimed);
                }
                Some(took)
            }
            Ok(admission) => {
                let e = StoreError::Malformed {
                    path: format!(
                        "{}/{}",
                        self.limit.name,
                        crate::logging::key_tag(&self.qkey.1)
                    ),
                    detail: format!(
                        "store answered {} outcomes for {} costs",
                        admission.outcomes.len(),
                        costs.len()
                    ),
                };
                answer_all(batch, &e);
                None
            }
            Err(StoreError::Contention { .. }) => {
                self.requeue_contended(batch, took);
                None
            }
            Err(e) => {
                answer_all(batch, &e);
                None
            }
        }
    }

    /// After a write that lost every race it had time for: checks that cannot wait for
    /// another attempt are answered `Contention`; the others go back to the head of the
    /// queue (their order kept) for an immediate retry, the `412` having refreshed the
    /// store's view.
    fn requeue_contended(&self, batch: Vec<Waiter>, took: Duration) {
        let mut queues = lock(&self.queues);
        let Some(state) = queues.get_mut(&self.qkey) else {
            answer_all(batch, &StoreError::Contention { attempts: 0 });
            return;
        };
        // One more attempt takes about one successful write of this key (a write that
        // lost races for its whole call says nothing shorter).
        let attempt = state.demand.latency().unwrap_or(took).min(took);
        let now = Instant::now();
        let (retry, give_up): (Vec<Waiter>, Vec<Waiter>) = batch
            .into_iter()
            .partition(|w| now + attempt + ANSWER_MARGIN < w.deadline);
        answer_all(give_up, &StoreError::Contention { attempts: 0 });
        let later = std::mem::replace(&mut state.pending, retry);
        state.pending.extend(later);
    }

    /// Records a successful write's result in the key's lease (`written`: the hits it
    /// counted, reserve included); returns the lease.
    fn record(
        &self,
        window: i64,
        count: u32,
        reserved: u32,
        written: u32,
        took: Duration,
        raced: bool,
    ) -> Option<Lease> {
        let mut queues = lock(&self.queues);
        let state = queues.get_mut(&self.qkey)?;
        state.demand.write_took(took, raced);
        state.last_activity = Instant::now();
        state.lease = Some(Lease::after_write(
            state.lease,
            window,
            count,
            reserved,
            written,
        ));
        state.lease
    }

    /// Hits the write counted for checks that had stopped waiting (their budget ran out
    /// while it was in flight): nobody was admitted with them, so they join the lease and
    /// the next checks use them (or they are given back), instead of being lost.
    fn reclaim(&self, window: i64, hits: u32) {
        let mut queues = lock(&self.queues);
        if let Some(lease) = queues
            .get_mut(&self.qkey)
            .and_then(|s| s.lease.as_mut())
            .filter(|l| l.window == window)
        {
            lease.left += hits;
        }
    }

    /// Returns an unspent reserve to the store. A failure only leaves the hits counted
    /// until the window ends (under-admission, never over-admission).
    async fn give_back(&self, lease: Lease) {
        let call = self.store.release(
            &self.limit,
            &self.qkey.1,
            lease.window,
            lease.left,
            lease.keep(),
        );
        match crate::store::within(self.call_timeout, call).await {
            Ok(_) => {}
            Err(e) => tracing::debug!(
                limit = %self.limit.name,
                hits = lease.left,
                reason = e.kind(),
                "unspent lease not given back; it lapses with its window"
            ),
        }
    }
}
