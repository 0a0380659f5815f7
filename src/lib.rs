//! # bladbase-ratelimit
//!
//! The rate-decision service Bladbase runs on Cloud Run. Callers (the MCP service,
//! uploads, sign-in) ask `Check(limit, key, cost)` over gRPC; counters are fixed windows
//! shared by every instance through a store (Firebase Realtime Database in production,
//! or Redis / Memorystore; process memory by default); when the store is late or failing the service fails open
//! to a per-instance window and says so (`shared = false`).
//!
//! ## Map of the crate (read in this order)
//!
//! - [`limits`]: named limits from a TOML file, validated at startup.
//! - [`window`], [`clock`]: fixed-window arithmetic and the injectable clock.
//! - [`limiter`]: the decision path, top to bottom; no gRPC in it.
//! - [`coalesce`], [`lease`], [`deny_cache`]: what stands in front of a remote store
//!   (per-key single flight and batching; quota leases for hot keys; exhausted keys
//!   denied without a call).
//! - [`breaker`]: the circuit breaker that stops calling a failing store.
//! - [`fallback`]: what happens when the store cannot answer (per-limit policy).
//! - [`store`]: the [`store::CounterStore`] trait and its backends
//!   ([`store::MemoryStore`], [`store::rtdb`], [`store::redis`]).
//! - [`server`]: the gRPC server (service, health, reflection, admin auth).
//! - [`client`]: the client library callers link (own fallback, breaker, deny-until
//!   cache, HTTP headers, tower layer) and the `ratelimit check` CLI.
//! - [`memory_budget`]: the byte budget every cache and window map is bounded by.
//! - [`config`]: command-line flags and environment variables.
//! - [`logging`], [`metrics`]: text/JSON logs and Prometheus metrics (names live there).
//! - [`pb`]: generated protobuf code.
//!
//! The binary (`src/main.rs`) only parses flags and wires these together.

pub mod breaker;
pub mod client;
pub mod clock;
pub mod coalesce;
pub mod config;
pub mod deny_cache;
pub mod fallback;
pub mod lease;
pub mod limiter;
pub mod limits;
pub mod logging;
pub mod memory_budget;
pub mod metrics;
pub mod pb;
pub mod server;
pub mod store;
pub mod window;

/// Installs the process-wide rustls crypto provider (ring). reqwest is built without a
/// provider of its own (so only one is compiled in) and panics on `Client::new()` unless
/// one is installed; every process and test that builds an HTTP client calls this first.
/// Calling it again is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
