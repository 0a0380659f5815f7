//! Per-key single flight and batching in front of a remote store.
//!
//! Without this, N concurrent checks of one hot key on one instance would race N
//! conditional PUTs against each other: one wins, N−1 get `412` and retry, N² round trips
//! in all. Instead each `(limit, key)` has at most one store call in flight per instance;
//! checks that arrive meanwhile queue up and go together in the next call, admitted in
//! arrival order in a single write. N concurrent checks cost about two round trips.
//!
//! The store call runs in a spawned task, not in any caller's future: a caller whose
//! gRPC deadline passes is dropped by tonic, and that must not strand the others that
//! joined its batch. Each caller waits on its own answer only as long as its budget.

use crate::limits::Limit;
use crate::store::{CounterStore, Outcome, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

type Answer = Result<(i64, Outcome), StoreError>;

struct Waiter {
    window: i64,
    cost: u32,
    reply: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    pending: Vec<Waiter>,
}

type QueueKey = (Arc<str>, Arc<str>);

/// Longest pause between two batches of one key (see the fairness note in `run`).
const MAX_LINGER: Duration = Duration::from_millis(25);

/// Batches concurrent checks per `(limit, key)`.
pub struct Coalescer {
    store: Arc<dyn CounterStore>,
    /// Keys with a runner task; a key is present exactly while its runner runs.
    queues: Arc<Mutex<HashMap<QueueKey, Queue>>>,
    /// Bound on each store call made by a runner.
    call_timeout: Duration,
}

impl Coalescer {
    /// Batches calls to `store`, each bounded by `call_timeout`.
    pub fn new(store: Arc<dyn CounterStore>, call_timeout: Duration) -> Self {
        Self {
            store,
            queues: Arc::default(),
            call_timeout,
        }
    }

    /// Admits `cost` for `key` under `limit` in `window`, sharing a store write with any
    /// concurrent checks of the same key. Returns the window counted in and the outcome.
    pub async fn admit(
        &self,
        limit: &Arc<Limit>,
        key: &str,
        window: i64,
        cost: u32,
        budget: Duration,
    ) -> Answer {
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter {
            window,
            cost,
            reply: tx,
        };
        let qkey: QueueKey = (limit.name.clone(), Arc::from(key));
        let start_runner = {
            let mut queues = lock(&self.queues);
            match queues.get_mut(&qkey) {
                Some(q) => {
                    q.pending.push(waiter);
                    false
                }
                None => {
                    queues.insert(
                        qkey.clone(),
                        Queue {
                            pending: vec![waiter],
                        },
                    );
                    true
                }
            }
        };
        if start_runner {
            tokio::spawn(run(
                self.store.clone(),
                self.queues.clone(),
                limit.clone(),
                qkey,
                self.call_timeout,
            ));
        }
        match tokio::time::timeout(budget, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(StoreError::Connect("batch runner stopped".into())),
            Err(_) => Err(StoreError::Timeout(budget)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the map inconsistent (every critical
    // section is a single insert/remove/take), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drains `qkey`'s queue batch by batch until it is empty, then removes it.
async fn run(
    store: Arc<dyn CounterStore>,
    queues: Arc<Mutex<HashMap<QueueKey, Queue>>>,
    limit: Arc<Limit>,
    qkey: QueueKey,
    call_timeout: Duration,
) {
    // How long the previous store call of this key took, if it succeeded.
    let mut last_write: Option<Duration> = None;
    loop {
        {
            // Nothing waiting: done (so the linger below only ever delays a hot key).
            // Decided under the lock `admit` joins under: a check arriving after this
            // finds no runner and starts one.
            let mut map = lock(&queues);
            if map.get(&qkey).is_none_or(|q| q.pending.is_empty()) {
                map.remove(&qkey);
                return;
            }
        }
        if let Some(took) = last_write.take() {
            // Fairness across instances: the instance whose write was applied first gets
            // its answer first, and on a hot key it would send its next batch first every
            // time, so the others' immediate retries after a 412 keep losing until they
            // run out of attempts and fall back locally, over-admitting (BENCHMARKS.md
            // §4). Waiting a random part of one round trip before the next batch lets
            // their retries in. It only happens while this key has queued checks, costs
            // those at most one round trip (capped), and lets more checks share a write.
            let linger = took.min(MAX_LINGER).mul_f64(fastrand::f64());
            tokio::time::sleep(linger).await;
        }
        let batch = {
            let mut map = lock(&queues);
            let taken = map.get_mut(&qkey).map(|q| std::mem::take(&mut q.pending));
            match taken {
                Some(b) if !b.is_empty() => b,
                _ => {
                    map.remove(&qkey);
                    return;
                }
            }
        };
        // Callers whose budget ran out are gone; counting their hits would only over-count.
        let batch: Vec<Waiter> = batch.into_iter().filter(|w| !w.reply.is_closed()).collect();
        if batch.is_empty() {
            continue;
        }
        // A batch that straddles a window boundary is counted in the newest window:
        // windows only move forward.
        let window = batch.iter().map(|w| w.window).max().unwrap_or_default();
        let costs: Vec<u32> = batch.iter().map(|w| w.cost).collect();
        let started = tokio::time::Instant::now();
        let result =
            crate::store::within(call_timeout, store.admit(&limit, &qkey.1, window, &costs)).await;
        match result {
            Ok(admission) if admission.outcomes.len() == batch.len() => {
                last_write = Some(started.elapsed());
                for (w, outcome) in batch.into_iter().zip(admission.outcomes) {
                    let _ = w.reply.send(Ok((admission.window, outcome)));
                }
            }
            Ok(admission) => {
                let e = StoreError::Malformed {
                    path: format!("{}/{}", limit.name, qkey.1),
                    detail: format!(
                        "store answered {} outcomes for {} costs",
                        admission.outcomes.len(),
                        batch.len()
                    ),
                };
                for w in batch {
                    let _ = w.reply.send(Err(e.clone()));
                }
            }
            Err(e) => {
                for w in batch {
                    let _ = w.reply.send(Err(e.clone()));
                }
            }
        }
    }
}
