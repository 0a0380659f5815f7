//! The client library: how Rust callers (the MCP service, uploads, sign-in) ask the
//! rate-limit service, without ever being slowed or broken by it (DESIGN §6).
//!
//! [`Client::check`] sends `Check` with a deadline (1.5 s by default). When the service
//! is unreachable, late or failing, the client applies the limit's `on_store_failure`
//! exactly as the service does, through the same [`LocalWindow::fail_open`](crate::fallback::LocalWindow::fail_open): `local`
//! counts in its **own** per-process window ([`Source::ClientFallback`](crate::decision::Source::ClientFallback)), `allow`
//! admits and `deny` refuses ([`Source::FailurePolicy`](crate::decision::Source::FailurePolicy)); always `shared = false`. A
//! limit it has never heard of is decided with its default limit's numbers under the
//! asked name, policy `local` (`known.rs`), never unlimited. Around that call:
//!
//! - input is validated here with the service's own rules and messages
//!   ([`validate_key`](crate::decision::validate_key), [`resolve_cost`](crate::decision::resolve_cost)), so bad input never costs an RPC; caller bugs
//!   (`INVALID_ARGUMENT`, `NOT_FOUND`) come back as [`ClientError`]s and are never
//!   hidden by a fallback;
//! - a circuit breaker (the service's own [`Breaker`](crate::breaker::Breaker)) stops calling a service that
//!   keeps failing: checks then answer locally at once, and one probe at a time goes out
//!   after a cool-down;
//! - a deny-until cache (`deny.rs`) refuses a key the service refused until its
//!   `retry_after` passes or for a second at most (a Reset elsewhere frees the key), with
//!   no RPC; [`Client::reset`] (`reset.rs`, with an admin token) clears it at once;
//! - the limits come from the service's `ListLimits` once it answers, else from the
//!   fallback limits the client was built with (`known.rs`);
//! - a call that runs into the deadline renews the connection, since a late answer may
//!   mean a dead connection that would otherwise never be replaced.
//!
//! Also here: [`headers`] (the caller's HTTP response headers), [`layer`] (tower
//! middleware) and [`cli`] (`ratelimit check`).
//!
//! ```
//! use ratelimit::client::Client;
//! use ratelimit::clock::ManualClock;
//! use ratelimit::limits::Limits;
//! use std::{sync::Arc, time::Duration};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! # rt.block_on(async {
//! let toml = "[[limit]]\nname = \"signin\"\nrequests = 1\nwindow = \"15m\"\ndefault = true\n";
//! // Nothing listens on port 1: every check is decided by the fallback limits.
//! let client = Client::builder("http://127.0.0.1:1")
//!     .deadline(Duration::from_millis(300))
//!     .fallback_limits(Limits::from_toml("fallback.toml", toml)?)
//!     .clock(Arc::new(ManualClock::new(0))) // the start of a window
//!     .build()?;
//! assert!(client.check("signin", "ip-1", 1).await?.allowed);
//! let second = client.check("signin", "ip-1", 1).await?;
//! assert!(!second.allowed && !second.shared);
//! assert_eq!(client.headers(&second)["retry-after"], "900");
//! # Ok::<(), Box<dyn std::error::Error>>(()) })
//! # }
//! ```

mod admin;
mod builder;
mod calls;
#[cfg(feature = "server")]
pub mod cli;
mod connection;
mod deny;
mod error;
mod handle;
pub mod headers;
#[cfg(feature = "cloud-run-auth")]
pub mod id_token;
mod known;
pub mod layer;
mod reset;

pub use builder::{ClientBuilder, DEFAULT_DEADLINE, DEFAULT_URL, MAX_DEADLINE};
pub use error::ClientError;
pub use handle::Client;
#[cfg(feature = "cloud-run-auth")]
pub use id_token::{IdTokenError, IdTokens};
pub use layer::{RateLimit, RateLimitLayer};
