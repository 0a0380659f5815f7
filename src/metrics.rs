//! Prometheus metrics: every metric name and label lives here, and so does the optional
//! `/metrics` HTTP endpoint (`--metrics-listen`).
//!
//! The `metrics` facade costs next to nothing while no recorder is installed (tests,
//! the client library), so instrumented code calls these helpers unconditionally.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `ratelimit_decisions_total` | counter | `limit`, `outcome` (allowed/denied), `source` |
//! | `ratelimit_fallbacks_total` | counter | `limit`, `reason` (a store error kind) |
//! | `ratelimit_store_request_duration_seconds` | histogram | `op` (HTTP method), `status` |
//! | `ratelimit_store_errors_total` | counter | `kind` |
//! | `ratelimit_breaker_state` | gauge | 0 closed, 1 half-open, 2 open |
//! | `ratelimit_breaker_transitions_total` | counter | `to` |
//! | `ratelimit_checks_in_flight` | gauge | |
//! | `ratelimit_shed_total` | counter | refused at the concurrency limit |

use crate::breaker::State;
use crate::limiter::Decision;
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;
use std::time::Duration;

const DECISIONS: &str = "ratelimit_decisions_total";
const FALLBACKS: &str = "ratelimit_fallbacks_total";
const STORE_DURATION: &str = "ratelimit_store_request_duration_seconds";
const STORE_ERRORS: &str = "ratelimit_store_errors_total";
const BREAKER_STATE: &str = "ratelimit_breaker_state";
const BREAKER_TRANSITIONS: &str = "ratelimit_breaker_transitions_total";
const IN_FLIGHT: &str = "ratelimit_checks_in_flight";
const SHED: &str = "ratelimit_shed_total";

/// Store latency buckets (seconds): RTDB round trips are ~10–100 ms; the budget is 1.5 s.
const STORE_BUCKETS: &[f64] = &[
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0,
];

/// Counts one decision.
pub fn decision(d: &Decision) {
    let outcome = if d.allowed { "allowed" } else { "denied" };
    counter!(DECISIONS, "limit" => d.limit_name.to_string(), "outcome" => outcome, "source" => d.source.as_str())
        .increment(1);
}

/// Counts one fallback decision.
pub fn fallback(limit: &str, reason: &'static str) {
    counter!(FALLBACKS, "limit" => limit.to_owned(), "reason" => reason).increment(1);
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

/// Counts one call refused at the concurrency limit.
pub fn shed() {
    counter!(SHED).increment(1);
}

/// Marks a check in flight until dropped.
pub struct InFlight(());

impl InFlight {
    /// Increments the in-flight gauge; the returned guard decrements it.
    pub fn start() -> Self {
        gauge!(IN_FLIGHT).increment(1.0);
        Self(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        gauge!(IN_FLIGHT).decrement(1.0);
    }
}

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

/// Installs the process-wide Prometheus recorder and serves `GET /metrics` on `addr`
/// in the background. Returns the bound address.
pub async fn serve(addr: SocketAddr) -> Result<SocketAddr, MetricsError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(STORE_DURATION.into()), STORE_BUCKETS)
        .map_err(|e| MetricsError::Install(e.to_string()))?
        .install_recorder()
        .map_err(|e| MetricsError::Install(e.to_string()))?;
    // Gauges exist from the start, so a dashboard sees 0 rather than "no data".
    gauge!(IN_FLIGHT).set(0.0);
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

async fn render(handle: PrometheusHandle) -> String {
    handle.render()
}
