//! A local Firebase Realtime Database REST emulator with fault injection and request
//! counters, for tests and benchmarks (the official emulator cannot be downloaded here).
//!
//! It speaks the documented RTDB REST protocol over plain HTTP, like the official emulator
//! (see `/work/shared/reference/rtdb-rest.md`, "Emulator MUST"): `GET|PUT|PATCH|POST|DELETE
//! /<path>.json?ns=<namespace>`, ETags and conditional requests (`X-Firebase-ETag`,
//! `if-match`, `If-None-Match`, `null_etag`), `print=silent`, key and depth validation,
//! security rules (`PUT /.settings/rules.json`), and `Authorization: Bearer owner` as the
//! admin that bypasses rules.
//!
//! Choices where production behaviour is unknown or irrelevant for tests:
//! - A request without `?ns=` uses the namespace `"default"` ([`DEFAULT_NAMESPACE`]).
//! - Tokens are never verified. `owner` (as `Authorization: Bearer owner`, `access_token=`
//!   or `auth=`) is the admin; any other token is a signed-in client (`auth != null`); no
//!   token is `auth == null`. The owner plus `auth_variable_override=<json>` is evaluated as
//!   that `auth` (`null` → `auth == null`), as production does for the Admin SDKs'
//!   `databaseAuthVariableOverride`.
//! - Rules given at start apply to every namespace until replaced for one namespace
//!   (`PUT /.settings/rules.json?ns=`, [`Emulator::set_rules`]); without any, locked mode.
//! - Unknown query parameters and the query parameters of filtered reads (`orderBy`, ...)
//!   are refused with 400 rather than ignored, so a client bug cannot pass silently.
//! - Priorities are not modelled (`.priority` is dropped, `.value` unwrapped).
//!
//! Faults (latency, error statuses, dropped connections for a fraction of requests; an
//! error status for every request to matching paths, [`PathError`]) and counters:
//! [`Emulator::faults`] / [`Emulator::stats`] in-process, or over
//! HTTP for the standalone binary (`GET /.emulator/stats`, `POST /.emulator/stats/reset`,
//! `GET|POST|PUT|DELETE /.emulator/faults` with a [`FaultConfig`] JSON body; see the
//! `control` module). Control requests are neither faulted nor counted.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let emu = rtdb_emulator::Emulator::start().await?;
//! // Point the client at it: FIREBASE_DATABASE_EMULATOR_HOST=<emu.host()>
//! emu.faults().set_error(503, 0.5);
//! assert_eq!(emu.value("my-ns", "rateLimits/x"), serde_json::Value::Null);
//! println!("{} requests", emu.stats().total);
//! # Ok(()) }
//! ```
//!
//! Modules: `tree` (data model, keys, ETags), `rules` (security rules), `request` (query,
//! headers, caller), `rest` (the REST operations), `db` (the locked state), `server`
//! (HTTP, faults, counting), `control` (the `/.emulator/` endpoints), `faults`, `stats`,
//! `pushid`.

mod control;
mod db;
mod faults;
mod pushid;
mod request;
mod rest;
mod rules;
mod server;
mod stats;
mod tree;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use db::DEFAULT_NAMESPACE;
pub use faults::{FaultConfig, FaultError, Faults, PathError};
pub use request::OWNER_TOKEN;
pub use rest::IF_MATCH_NOT_SUPPORTED;
pub use rules::{RulesError, parse_rules_text};
pub use stats::Stats;
pub use tree::NULL_ETAG;

use crate::db::Database;
use crate::rules::Rules;
use crate::server::App;
use crate::stats::Counters;
use crate::tree::Path;

/// Errors of the library API.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("invalid rules: {0}")]
    Rules(#[from] RulesError),
}

/// How to start an emulator.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A `database.rules.json` document (`{"rules": {...}}`) every namespace starts with.
    /// `None` means locked mode: every non-owner request is denied.
    pub rules: Option<Value>,
    /// Where to listen; `None` means `127.0.0.1:0` (a free port).
    pub addr: Option<SocketAddr>,
}

/// A running emulator. Dropping it (or calling [`Emulator::shutdown`]) stops the server
/// and closes every open connection.
#[derive(Debug)]
pub struct Emulator {
    addr: SocketAddr,
    app: Arc<App>,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Emulator {
    /// Starts on `127.0.0.1:0` with deny-all rules.
    pub async fn start() -> std::io::Result<Emulator> {
        Emulator::start_with(Options::default()).await
    }

    /// Starts with the given options. Invalid rules give an `InvalidInput` error.
    pub async fn start_with(opts: Options) -> std::io::Result<Emulator> {
        let rules = match &opts.rules {
            Some(doc) => Rules::parse(doc)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
            None => Rules::deny_all(),
        };
        let addr = opts
            .addr
            .unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app = Arc::new(App {
            db: Database::new(rules),
            faults: Faults::default(),
            counters: Counters::default(),
        });
        let (shutdown, rx) = watch::channel(false);
        let task = tokio::spawn(server::serve(listener, Arc::clone(&app), rx));
        Ok(Emulator {
            addr,
            app,
            shutdown,
            task: Some(task),
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `host:port`, the value for `FIREBASE_DATABASE_EMULATOR_HOST`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// A handle on the live fault configuration.
    pub fn faults(&self) -> Faults {
        self.app.faults.clone()
    }

    /// A snapshot of the request counters.
    pub fn stats(&self) -> Stats {
        self.app.counters.snapshot()
    }

    /// Zeroes the request counters.
    pub fn reset_stats(&self) {
        self.app.counters.reset();
    }

    /// The value at `path` (raw keys separated by `/`, not percent-encoded) as a GET by the
    /// owner would return it; `Null` when absent. No rules, not counted.
    pub fn value(&self, ns: &str, path: &str) -> Value {
        let path = Path::unchecked(path);
        self.app.db.with(|st| {
            tree::get(&st.namespace(ns).data, &path)
                .map(tree::render)
                .unwrap_or(Value::Null)
        })
    }

    /// Stores `v` at `path` directly: no rules, no key validation (so a test can seed data
    /// a client could not write), not counted. Null deletes; empty objects are pruned.
    pub fn set_value(&self, ns: &str, path: &str, v: Value) {
        let path = Path::unchecked(path);
        let v = tree::normalize_trusted(v);
        self.app
            .db
            .with(|st| tree::set(&mut st.namespace(ns).data, &path, v));
    }

    /// Replaces the rules of namespace `ns` (a `{"rules": {...}}` document).
    pub fn set_rules(&self, ns: &str, rules: Value) -> Result<(), EmulatorError> {
        let rules = Rules::parse(&rules)?;
        self.app.db.with(|st| st.namespace(ns).rules = rules);
        Ok(())
    }

    /// Stops accepting, closes open connections and waits for the server task to end.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            // The task ends on its own after the signal; an abort error is irrelevant here.
            let _ = task.await;
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
