//! # bladbase-ratelimit
//!
//! The rate-decision service Bladbase runs on Cloud Run. Callers (the MCP service,
//! uploads, sign-in) ask `Check(limit, key, cost)` over gRPC; counters are fixed windows
//! shared by every instance through a store (Firebase Realtime Database in production,
//! or Redis / Memorystore; process memory by default); when the store is late or failing the service fails open
//! to a per-instance window and says so (`shared = false`).
//!
//! This crate is both the service and the Rust client callers link, split by cargo
//! features (ARCHITECTURE.md, "Library layout"):
//!
//! - no feature: the core the service and the client share ([`decision`], [`limits`],
//!   [`window`], [`clock`], [`fallback`], [`breaker`], [`store`], [`memory_budget`],
//!   [`metrics`], the [`pb`] messages).
//! - `client`: the core and the client ([`client`], the gRPC client stub in [`pb`]): what
//!   a Rust caller needs, and nothing of the server. Depend on it with
//!   `bladbase-ratelimit = { default-features = false, features = ["client"] }`.
//! - `cloud-run-auth`: the client's Google ID tokens for a Cloud Run service behind IAM
//!   ([`client::IdTokens`], [`client::ClientBuilder::cloud_run_auth`]); adds reqwest.
//! - `server` (default): the whole service and the `ratelimit` binary.
//!
//! A caller asks the service and always gets an answer, even when the service is down
//! (here nothing listens on port 1, so the client decides in its own window):
//!
//! ```
//! use ratelimit::client::Client;
//! use ratelimit::decision::Source;
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! # rt.block_on(async {
//! let client = Client::builder("http://127.0.0.1:1")
//!     .deadline(Duration::from_millis(300))
//!     .build()?;
//! let decision = client.check("mcp", "user@example.com", 1).await?;
//! assert!(decision.allowed);
//! assert!(!decision.shared); // decided by this process alone
//! assert_eq!(decision.source, Source::ClientFallback);
//! let headers = client.headers(&decision); // on the caller's HTTP response
//! assert_eq!(headers["x-ratelimit-limit"], "120");
//! // Bad input is the caller's error, found before any RPC:
//! assert!(client.check("mcp", "", 1).await.unwrap_err().is_bad_key());
//! # Ok::<(), Box<dyn std::error::Error>>(()) })
//! # }
//! ```
//!
//! ## Map of the crate (read in this order)
//!
//! What a caller uses (the core, and [`client`] with feature `client`):
//!
//! - [`decision`]: [`decision::Decision`] and [`decision::Source`], outcome → decision,
//!   and the input rules every check passes (key, cost).
//! - [`limits`]: named limits from a TOML file, validated.
//! - [`window`], [`clock`]: fixed-window arithmetic and the injectable clock.
//! - [`client`]: the client (own fallback window, breaker, deny-until cache), its HTTP
//!   headers ([`client::headers`]) and tower layer ([`client::layer`]).
//! - [`fallback`]: fail-open decisions per policy in a process's own window
//!   ([`fallback::LocalWindow`], shared by the service and the client).
//! - [`breaker`]: the circuit breaker state machine (the service's and the client's).
//! - [`store`]: the [`store::CounterStore`] trait, its types and [`store::MemoryStore`].
//! - [`memory_budget`]: the byte budget every cache and window map is bounded by.
//!   Every per-key cache is keyed by the crate-internal `cache_key` (`(limit, key,
//!   window length)`, looked up by borrowed parts, so a check allocates no key).
//! - [`metrics`]: every Prometheus metric name (recorded by service and client alike).
//! - [`pb`]: generated protobuf code and the gRPC client stub; [`codec`]: the gRPC codec
//!   they use (prost messages decoded from and encoded into slices).
//!
//! The service (feature `server`):
//!
//! - [`limiter`]: the decision path, top to bottom; no gRPC in it. In front of a remote
//!   store it uses crate-internal modules: `coalesce` (per-key single flight and
//!   batching), `lease` (quota leases for hot keys; [`limiter::LeaseOptions`] is public)
//!   and `deny_cache` (exhausted keys denied without a call).
//! - [`store::rtdb`], [`store::redis`]: the shared stores.
//! - [`server`]: the gRPC server (service, health, reflection, admin auth).
//! - [`logging`]: text/JSON logs; caller keys only as keyed hashes.
//!
//! Hidden from these docs, public only for the `ratelimit` binary, the tests and the
//! benchmarks: `config` (flags, environment variables, the store switch) and the store
//! internals `store::rtdb::keys`, `store::redis::{encode, decode}` and
//! `store::{deadline, within}` (the batch deadline as the backends read it).
//! They may change without notice.
//!
//! The binary (`src/main.rs`) only parses flags and wires these together.

#[cfg(test)]
mod alloc_count;
pub mod breaker;
pub(crate) mod cache_key;
#[cfg(feature = "client")]
pub mod client;
pub mod clock;
pub mod codec;
pub mod decision;
pub mod fallback;
pub mod limits;
pub mod memory_budget;
pub mod metrics;
pub mod pb;
pub mod store;
pub mod window;

#[cfg(feature = "server")]
pub(crate) mod coalesce;
#[doc(hidden)]
#[cfg(feature = "server")]
pub mod config;
#[cfg(feature = "server")]
pub(crate) mod deny_cache;
#[cfg(feature = "server")]
pub(crate) mod lease;
#[cfg(feature = "server")]
pub mod limiter;
pub mod logging;
#[cfg(feature = "server")]
pub mod server;

/// Installs the process-wide rustls crypto provider (ring). reqwest is built without a
/// provider of its own (so only one is compiled in) and panics on `Client::new()` unless
/// one is installed; every process and test that builds an HTTP client calls this first.
/// Calling it again is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
