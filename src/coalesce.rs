//! Per-key single flight, batching and quota leases in front of a remote store.
//!
//! Without this, N concurrent checks of one hot key on one instance would race N
//! conditional PUTs against each other: one wins, N−1 get `412` and retry, N² round trips
//! in all. Instead each `(limit, key)` has at most one store call in flight per instance;
//! checks that arrive meanwhile queue up and go together in the next call, admitted in
//! arrival order in a single write. N concurrent checks cost about two round trips.
//!
//! A key that stays hot also gets a **quota lease** (`lease.rs`, DESIGN §9): the write
//! carries a reserve of extra hits, and later checks are admitted from it here, with no
//! store call, until it runs low and the next write refills it. A reserve nobody asks for
//! is given back once the key has been quiet for the lease's `idle` time.
//!
//! **Contention is not an outage.** When a write loses races (`412`) for so long that a
//! check's budget would run out, the check is answered [`StoreError::Contention`] (the
//! limiter denies it, shared) rather than left to time out into the local fallback. The
//! store is told each batch's deadline (`store::with_deadline`), so it stops retrying
//! before the deadline instead of being cut off mid-write, which would leave a write that
//! may still land for checks already answered.
//!
//! The store calls run in a spawned task per hot key, not in any caller's future: a
//! caller whose gRPC deadline passes is dropped by tonic, and that must not strand the
//! others that joined its batch. If that task ends abnormally (a panic), a guard removes
//! its key, so the waiting checks fall back and the next check starts afresh.

use crate::lease::{Demand, Lease, LeaseOptions};
use crate::limits::Limit;
use crate::store::{CounterStore, Outcome, StoreError};
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

type Answer = Result<Served, StoreError>;

struct Waiter {
    window: i64,
    cost: u32,
    deadline: Instant,
    reply: oneshot::Sender<Answer>,
}

/// What a key's runner and its checks share.
struct KeyState {
    /// Checks waiting for the next store write, in arrival order.
    pending: Vec<Waiter>,
    /// Hits this instance holds for the key.
    lease: Option<Lease>,
    demand: Demand,
    last_arrival: Instant,
    /// Wakes the runner when it waits for work.
    wake: Arc<Notify>,
}

impl KeyState {
    fn new(now: Instant) -> Self {
        Self {
            pending: Vec::new(),
            lease: None,
            demand: Demand::new(),
            last_arrival: now,
            wake: Arc::new(Notify::new()),
        }
    }
}

type QueueKey = (Arc<str>, Arc<str>);
type Queues = Arc<Mutex<HashMap<QueueKey, KeyState>>>;

/// Longest pause between two batches of one key (see the fairness note in `run`).
const MAX_LINGER: Duration = Duration::from_millis(25);
/// How long a contended check whose budget ran out still listens for the write it is in
/// (within the limiter's margin before a caller's own deadline).
const CONTENTION_GRACE: Duration = Duration::from_millis(40);
/// A batch's deadline as given to the store: the earliest of its checks', less this, so
/// the answer still reaches them in time.
const ANSWER_MARGIN: Duration = Duration::from_millis(5);

/// Batches concurrent checks per `(limit, key)` and serves hot keys from leases.
pub struct Coalescer {
    store: Arc<dyn CounterStore>,
    /// Keys with a runner task; a key is present exactly while its runner runs.
    queues: Queues,
    /// Bound on each store call made by a runner.
    call_timeout: Duration,
    lease: LeaseOptions,
}

impl Coalescer {
    /// Batches calls to `store`, each bounded by `call_timeout`, leasing per `lease`.
    pub fn new(store: Arc<dyn CounterStore>, call_timeout: Duration, lease: LeaseOptions) -> Self {
        Self {
            store,
            queues: Arc::default(),
            call_timeout,
            lease,
        }
    }

    /// Admits `cost` for `key` under `limit` in `window`, from this instance's lease if it
    /// holds one, otherwise sharing a store write with any concurrent checks of the key.
    pub async fn admit(
        &self,
        limit: &Arc<Limit>,
        key: &str,
        window: i64,
        cost: u32,
        budget: Duration,
    ) -> Answer {
        let now = Instant::now();
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter {
            window,
            cost,
            deadline: now + budget,
            reply: tx,
        };
        let qkey: QueueKey = (limit.name.clone(), Arc::from(key));
        let start_runner = {
            let mut queues = lock(&self.queues);
            match queues.get_mut(&qkey) {
                Some(state) => {
                    state.demand.ask(cost);
                    state.last_arrival = now;
                    if let Some(served) = take_from_lease(state, limit, window, cost) {
                        return Ok(served);
                    }
                    state.pending.push(waiter);
                    state.wake.notify_one();
                    false
                }
                None => {
                    let mut state = KeyState::new(now);
                    state.demand.ask(cost);
                    state.pending.push(waiter);
                    queues.insert(qkey.clone(), state);
                    true
                }
            }
        };
        if start_runner {
            let runner = Runner {
                store: self.store.clone(),
                queues: self.queues.clone(),
                limit: limit.clone(),
                qkey: qkey.clone(),
                call_timeout: self.call_timeout,
                lease: self.lease,
            };
            tokio::spawn(runner.run());
        }
        let mut rx = rx;
        if let Ok(answer) = tokio::time::timeout(budget, &mut rx).await {
            return answer.unwrap_or_else(|_| Err(runner_stopped()));
        }
        let contended = self.store.lost_race_since(limit, key, now);
        if contended {
            // The store answered this key while the check waited, but every write lost a
            // race: contention, not an outage. The runner stops retrying before this
            // check's deadline, but its last attempt may run a little over: hear it out.
            if let Ok(answer) = tokio::time::timeout(CONTENTION_GRACE, &mut rx).await {
                return answer.unwrap_or_else(|_| Err(runner_stopped()));
            }
        }
        // Stop listening, then take an answer sent just before: from here on the runner
        // knows this check was not told, and keeps any hit its write counted for it.
        rx.close();
        if let Ok(answer) = rx.try_recv() {
            return answer;
        }
        if contended {
            Err(StoreError::Contention { attempts: 0 })
        } else {
            Err(StoreError::Timeout(budget))
        }
    }

    /// Drops this instance's lease for `key` (after a reset: its hits were in the counter
    /// that was cleared).
    pub fn forget(&self, limit: &Limit, key: &str) {
        let qkey: QueueKey = (limit.name.clone(), Arc::from(key));
        if let Some(state) = lock(&self.queues).get_mut(&qkey) {
            state.lease = None;
        }
    }
}

/// Admits `cost` from the key's lease, if it holds enough for `window` and no earlier
/// check is still waiting (arrival order is kept).
fn take_from_lease(state: &mut KeyState, limit: &Limit, window: i64, cost: u32) -> Option<Served> {
    if !state.pending.is_empty() {
        return None;
    }
    let lease = state.lease.as_mut()?;
    if lease.window < window {
        // Its hits were counted in a window that has ended: they are gone with it.
        state.lease = None;
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
    if state.demand.needs_refill(lease.left) {
        state.wake.notify_one();
    }
    Some(served)
}

fn runner_stopped() -> StoreError {
    StoreError::Connect("batch runner stopped".into())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the map inconsistent (every critical
    // section leaves each entry whole), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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
struct Runner {
    store: Arc<dyn CounterStore>,
    queues: Queues,
    limit: Arc<Limit>,
    qkey: QueueKey,
    call_timeout: Duration,
    lease: LeaseOptions,
}

/// Removes the runner's key when the runner ends, however it ends: the checks still
/// queued then get an error (and fall back) instead of waiting on a task that is gone.
struct Cleanup {
    queues: Queues,
    qkey: QueueKey,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        lock(&self.queues).remove(&self.qkey);
    }
}

impl Runner {
    /// Works the key's queue and lease until the key is quiet, then removes it.
    async fn run(self) {
        let _cleanup = Cleanup {
            queues: self.queues.clone(),
            qkey: self.qkey.clone(),
        };
        // How long the previous store write of this key took, if it succeeded.
        let mut last_write: Option<Duration> = None;
        loop {
            let Some(job) = self.next_job() else {
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
            let quiet = now.saturating_duration_since(state.last_arrival);
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
        let result = crate::store::within(
            self.call_timeout,
            crate::store::with_deadline(deadline, call),
        )
        .await;
        let took = started.elapsed();
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
                let raced = self
                    .store
                    .lost_race_since(&self.limit, &self.qkey.1, started);
                let lease = self.record(admission.window, count, reserved, took, raced);
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
                    path: format!("{}/{}", self.limit.name, self.qkey.1),
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

    /// Records a successful write's result in the key's lease; returns the lease.
    fn record(
        &self,
        window: i64,
        count: u32,
        reserved: u32,
        took: Duration,
        raced: bool,
    ) -> Option<Lease> {
        let mut queues = lock(&self.queues);
        let state = queues.get_mut(&self.qkey)?;
        state.demand.write_took(took, raced);
        let held = state
            .lease
            .filter(|l| l.window == window)
            .map_or(0, |l| l.left);
        // Even with no reserve, the lease remembers the count seen (it sizes the next one).
        state.lease = Some(Lease {
            window,
            left: held + reserved,
            count_seen: count,
        });
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
        let call = self
            .store
            .release(&self.limit, &self.qkey.1, lease.window, lease.left);
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

fn answer_all(batch: Vec<Waiter>, e: &StoreError) {
    for w in batch {
        let _ = w.reply.send(Err(e.clone()));
    }
}
