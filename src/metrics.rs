//! Prometheus metrics: every metric name and label lives here, and so does the optional
//! `/metrics` HTTP endpoint (`--metrics-listen`).
//!
//! The `metrics` facade costs next to nothing while no recorder is installed (tests,
//! the client library), so instrumented code calls these helpers unconditionally.
//! With the endpoint on, every metric has a `# HELP` line, and the series an alert takes
//! a `rate()` of (`ratelimit_shed_total`, contention per configured limit) exist at 0
//! from startup instead of appearing at their first event.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `ratelimit_decisions_total` | counter | `limit`, `outcome` (allowed/denied), `source` |
//! | `ratelimit_fallbacks_total` | counter | `limit`, `reason` (a store error kind) |
//! | `ratelimit_contention_denials_total` | counter | `limit`: checks denied because every write they had time for lost a race (the store was answering) |
//! | `ratelimit_store_request_duration_seconds` | histogram | `op` (HTTP method), `status` |
//! | `ratelimit_store_errors_total` | counter | `kind` |
//! | `ratelimit_breaker_state` | gauge | 0 closed, 1 half-open, 2 open |
//! | `ratelimit_breaker_transitions_total` | counter | `to` |
//! | `ratelimit_checks_in_flight` | gauge | |
//! | `ratelimit_shed_total` | counter | refused at the concurrency limit |
//! | `ratelimit_cache_evictions_total` | counter | `cache`: entries evicted for the memory budget (`store`, `fallback_window`, `deny`, `rtdb_nodes`, `client_window`, `client_deny`; see `memory_budget.rs`) |

use crate::breaker::State;
use crate::decision::{Decision, Source};
use metrics::{Counter, counter, gauge, histogram};
#[cfg(feature = "server")]
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::collections::HashMap;
#[cfg(feature = "server")]
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

const DECISIONS: &str = "ratelimit_decisions_total";
const FALLBACKS: &str = "ratelimit_fallbacks_total";
const CONTENTION_DENIALS: &str = "ratelimit_contention_denials_total";
const STORE_DURATION: &str = "ratelimit_store_request_duration_seconds";
const STORE_ERRORS: &str = "ratelimit_store_errors_total";
const BREAKER_STATE: &str = "ratelimit_breaker_state";
const BREAKER_TRANSITIONS: &str = "ratelimit_breaker_transitions_total";
#[cfg(feature = "server")]
const IN_FLIGHT: &str = "ratelimit_checks_in_flight";
const SHED: &str = "ratelimit_shed_total";
const EVICTIONS: &str = "ratelimit_cache_evictions_total";

#[cfg(feature = "server")]
/// Store latency buckets (seconds): RTDB round trips are ~10–100 ms; the budget is 1.5 s.
const STORE_BUCKETS: &[f64] = &[
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0,
];

// Hot-path handles (decision counter, in-flight gauge), registered once, then only
// incremented. `counter!(name, labels…)` *registers* on every call: it allocates the label
// strings, builds and hashes a key and looks it up in the recorder's registry. Per check
// that was ~2,600 instructions with the Prometheus recorder installed (~900 with none),
// plus ~1,200 for the in-flight gauge: the largest avoidable cost of our own code on the
// check path (callgrind, BENCHMARKS.md §7). A handle refers to the registered metric, so
// caching it changes no name, label or value. Handles taken before `serve` installs the
// recorder are no-ops, so installing it clears the cache. Decision counters are keyed by
// limit name, and only configured limits ever decide (an unknown one is an error), so the
// cache is bounded by the limits file.
#[derive(Default)]
struct Handles {
    /// Per limit: one counter per (outcome, source), at [`decision_slot`].
    /// A short list, not a map: limits are a handful, and comparing the decision's
    /// `Arc` by address first finds the row without hashing its name.
    decisions: Vec<(Arc<str>, [Option<Counter>; 2 * SOURCES])>,
    /// Per cache (a handful of fixed names): evictions, one per insert under a flood.
    evictions: HashMap<&'static str, Counter>,
}

static HANDLES: LazyLock<RwLock<Handles>> = LazyLock::new(RwLock::default);

const SOURCES: usize = 6;

fn decision_slot(allowed: bool, source: Source) -> usize {
    let source = match source {
        Source::Store => 0,
        Source::DenyCache => 1,
        Source::LocalFallback => 2,
        Source::FailurePolicy => 3,
        Source::ClientFallback => 4,
        Source::Lease => 5,
    };
    usize::from(allowed) * SOURCES + source
}

// Every critical section is one lookup or one assignment, so a poisoned lock still holds
// consistent handles.
fn handles() -> RwLockReadGuard<'static, Handles> {
    HANDLES.read().unwrap_or_else(PoisonError::into_inner)
}

fn handles_mut() -> RwLockWriteGuard<'static, Handles> {
    HANDLES.write().unwrap_or_else(PoisonError::into_inner)
}

/// Counts one decision.
pub fn decision(d: &Decision) {
    let slot = decision_slot(d.allowed, d.source);
    let row_of = |rows: &[(Arc<str>, _)]| {
        rows.iter()
            .position(|(name, _)| Arc::ptr_eq(name, &d.limit_name) || *name == d.limit_name)
    };
    {
        let handles = handles();
        if let Some(c) =
            row_of(&handles.decisions).and_then(|i| handles.decisions[i].1[slot].as_ref())
        {
            c.increment(1);
            return;
        }
    }
    let outcome = if d.allowed { "allowed" } else { "denied" };
    let c = counter!(DECISIONS, "limit" => d.limit_name.to_string(), "outcome" => outcome, "source" => d.source.as_str());
    c.increment(1);
    let mut handles = handles_mut();
    let i = row_of(&handles.decisions).unwrap_or_else(|| {
        handles
            .decisions
            .push((d.limit_name.clone(), Default::default()));
        handles.decisions.len() - 1
    });
    handles.decisions[i].1[slot] = Some(c);
}

/// Counts one fallback decision.
pub fn fallback(limit: &str, reason: &'static str) {
    counter!(FALLBACKS, "limit" => limit.to_owned(), "reason" => reason).increment(1);
}

/// The `# HELP` lines: what each metric counts, as the table above says.
#[cfg(feature = "server")]
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        DECISIONS,
        "Decisions by limit, outcome and where they came from (source)."
    );
    describe_counter!(
        FALLBACKS,
        "Decisions made without the shared store (shared=false), by limit and store error kind."
    );
    describe_counter!(
        CONTENTION_DENIALS,
        "Checks denied because every write they had time for lost a race; the store was answering."
    );
    describe_histogram!(
        STORE_DURATION,
        Unit::Seconds,
        "Store requests by operation and status."
    );
    describe_counter!(STORE_ERRORS, "Failed store calls by kind.");
    describe_gauge!(
        BREAKER_STATE,
        "The store circuit breaker: 0 closed, 1 half-open, 2 open."
    );
    describe_counter!(
        BREAKER_TRANSITIONS,
        "Circuit breaker transitions by the state entered."
    );
    describe_gauge!(IN_FLIGHT, "RateLimiter calls in flight.");
    describe_counter!(
        SHED,
        "Calls refused at the concurrency limit (RESOURCE_EXHAUSTED)."
    );
    describe_counter!(
        EVICTIONS,
        "Entries evicted for the memory budget, by cache."
    );
}

/// Starts the per-limit series at 0 (see `serve`); a no-op without a recorder.
pub fn register_limits<'a>(names: impl IntoIterator<Item = &'a str>) {
    for name in names {
        counter!(CONTENTION_DENIALS, "limit" => name.to_owned()).absolute(0);
    }
}

/// Counts one check denied for contention (not a fallback: the store was answering).
pub fn contention_denied(limit: &str) {
    counter!(CONTENTION_DENIALS, "limit" => limit.to_owned()).increment(1);
}

/// Records one store HTTP request's duration.
pub fn store_request(op: &str, status: u16, took: Duration) {
    histogram!(STORE_DURATION, "op" => op.to_owned(), "status" => status.to_string())
        .record(took.as_secs_f64());
}

/// Counts one failed store call.
pub fn store_error(kind: &'static str) {
    counter!(STORE_ERRORS, "kind" => kind).increment(1);
}

/// Reports the breaker's state.
pub fn breaker(state: State, transition: bool) {
    let value = match state {
        State::Closed => 0.0,
        State::HalfOpen => 1.0,
        State::Open => 2.0,
    };
    gauge!(BREAKER_STATE).set(value);
    if transition {
        counter!(BREAKER_TRANSITIONS, "to" => state.as_str()).increment(1);
    }
}

/// Counts one cache entry evicted for the memory budget.
pub fn eviction(cache: &'static str) {
    if let Some(c) = handles().evictions.get(cache) {
        c.increment(1);
        return;
    }
    let c = counter!(EVICTIONS, "cache" => cache);
    c.increment(1);
    handles_mut().evictions.insert(cache, c);
}

/// Counts one call refused at the concurrency limit.
pub fn shed() {
    counter!(SHED).increment(1);
}

/// The in-flight gauge, for the server's load shedding, which holds it and updates it.
#[cfg(feature = "server")]
pub(crate) fn in_flight_gauge() -> metrics::Gauge {
    gauge!(IN_FLIGHT)
}

#[cfg(feature = "server")]
/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The recorder could not be installed.
    #[error("cannot install the metrics recorder: {0}")]
    Install(String),
    /// The address could not be bound.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

#[cfg(feature = "server")]
/// Installs the process-wide Prometheus recorder and serves `GET /metrics` on `addr`
/// in the background. Returns the bound address.
pub async fn serve(addr: SocketAddr) -> Result<SocketAddr, MetricsError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(STORE_DURATION.into()), STORE_BUCKETS)
        .map_err(|e| MetricsError::Install(e.to_string()))?
        .install_recorder()
        .map_err(|e| MetricsError::Install(e.to_string()))?;
    // Handles cached before the recorder existed are no-ops: register them anew.
    *handles_mut() = Handles::default();
    describe();
    // Series exist from the start, so a dashboard or a `rate()` alert sees 0 rather than
    // "no data" (per-limit series: `register_limits`).
    gauge!(IN_FLIGHT).set(0.0);
    counter!(SHED).absolute(0);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let upkeep = handle.clone();
    // The exporter's docs require periodic upkeep (it drains histogram buffers).
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || render(handle.clone())),
        );
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics endpoint stopped: {e}");
        }
    });
    Ok(bound)
}

#[cfg(feature = "server")]
async fn render(handle: PrometheusHandle) -> String {
    handle.render()
}
