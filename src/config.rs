//! Command-line flags and environment variables, and turning them into a running
//! configuration. Every flag has an environment variable (Cloud Run passes config as
//! env); the store switch lives here, so adding a backend is one arm in [`build_store`].

// The doc comments below are clap's `--help` text, written for a terminal (`<db>`,
// `[user:password@]`), not rustdoc markup.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use crate::breaker::BreakerConfig;
use crate::clock::SharedClock;
use crate::lease::LeaseOptions;
use crate::limiter::{Limiter, LimiterOptions};
use crate::limits::{Limits, LimitsError};
use crate::logging::LogFormat;
use crate::memory_budget::MemoryBudget;
use crate::server::{ServeOptions, admin::AdminToken};
use crate::store::redis::{RedisOptions, RedisSetupError, RedisStore};
use crate::store::rtdb::auth::{self, EmulatorOwner, TokenSource};
use crate::store::rtdb::target::Target;
use crate::store::rtdb::{RtdbError, RtdbOptions, RtdbStore};
use crate::store::{CounterStore, MemoryStore};
use clap::{Args, Parser, Subcommand};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Environment variable holding the admin token for `Reset` (never a flag: flags show
/// up in process listings).
pub const ADMIN_TOKEN_ENV: &str = "RATELIMIT_ADMIN_TOKEN";

/// `ratelimit`: Bladbase's rate-decision service and its command-line client.
#[derive(Debug, Parser)]
#[command(name = "ratelimit", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC rate-decision service.
    #[command(
        after_help = "Environment:\n  RATELIMIT_ADMIN_TOKEN            enables the Reset RPC for callers presenting `authorization: Bearer <token>` (unset: Reset answers FAILED_PRECONDITION); never logged\n  PORT                             port when --port/RATELIMIT_PORT is unset (Cloud Run sets it)\n  FIREBASE_DATABASE_EMULATOR_HOST  host:port of an RTDB emulator: with --database-url, requests go there (no Google credentials)\n  K_SERVICE                        set by Cloud Run; makes json the default log format"
    )]
    Serve(Box<ServeArgs>),
    /// Validate limits files.
    Limits {
        /// What to do with limits.
        #[command(subcommand)]
        command: LimitsCommand,
    },
    /// Ask the service for one decision (through the client library) and print it as JSON.
    ///
    /// Exit 0 allowed, 1 denied, 2 usage or input error. With no service reachable it
    /// still answers, from its own window ("shared": false).
    Check(CheckArgs),
}

/// Flags of `ratelimit check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The rate-limit service's URL.
    #[arg(long, env = "RATELIMIT_URL", default_value = crate::client::DEFAULT_URL)]
    pub server: String,

    /// The limit's name; empty means the service's default limit.
    #[arg(long, env = "RATELIMIT_CHECK_LIMIT", default_value = "")]
    pub limit: String,

    /// Hits this request counts for.
    #[arg(long, env = "RATELIMIT_CHECK_COST", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub cost: u32,

    /// Longest to wait for the service before deciding locally (e.g. 1.5s, 200ms).
    #[arg(long, env = "RATELIMIT_CHECK_DEADLINE", default_value = "1.5s", value_parser = parse_duration)]
    pub deadline: Duration,

    /// Limits file (TOML) to decide with when the service cannot be asked. Without it:
    /// `mcp` = 120 requests per 60 s.
    #[arg(long, env = "RATELIMIT_LIMITS")]
    pub limits: Option<PathBuf>,

    /// Send a Google ID token for the service's URL (from the metadata server) as
    /// `x-serverless-authorization`, for a Cloud Run service deployed with IAM.
    #[arg(long, env = "RATELIMIT_CLOUD_RUN_AUTH")]
    pub cloud_run_auth: bool,

    /// What is limited: an API token id, a user id, an e-mail, an IP...
    pub key: String,
}

/// `ratelimit limits ...`
#[derive(Debug, Subcommand)]
pub enum LimitsCommand {
    /// Validate a limits file: print the limits (exit 0) or the exact problem (exit 1).
    Check {
        /// The limits file (TOML).
        file: PathBuf,
    },
}

/// Flags of `ratelimit serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Port to listen on (all interfaces). Without it: $PORT (Cloud Run sets it), else 50051.
    #[arg(long, env = "RATELIMIT_PORT")]
    pub port: Option<u16>,

    /// Full listen address; overrides --port (e.g. 127.0.0.1:50051).
    #[arg(long, env = "RATELIMIT_LISTEN")]
    pub listen: Option<SocketAddr>,

    /// Limits file (TOML). Without it: `mcp` = 120 requests per 60 s, the default limit.
    #[arg(long, env = "RATELIMIT_LIMITS")]
    pub limits: Option<PathBuf>,

    /// Longest a decision waits for the store before failing open (e.g. 1.5s, 800ms).
    #[arg(long, env = "RATELIMIT_STORE_TIMEOUT", default_value = "1.5s", value_parser = parse_duration)]
    pub store_timeout: Duration,

    /// Firebase Realtime Database URL (https://<db>.firebaseio.com or
    /// https://<db>.<region>.firebasedatabase.app). Selects the RTDB store; without it
    /// counters live in this process's memory. With FIREBASE_DATABASE_EMULATOR_HOST set,
    /// requests go to that emulator instead (ns = the URL's first host label).
    #[arg(long, env = "RATELIMIT_DATABASE_URL")]
    pub database_url: Option<String>,

    /// Redis, Valkey or Memorystore URL: redis://[user:password@]host[:port][/db], or
    /// rediss://… for TLS. Selects the Redis store (not together with --database-url).
    /// Prefer the environment variable: it holds the password.
    #[arg(long, env = "RATELIMIT_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// Prefix of every Redis key: {prefix}{{limit}:{encodedKey}} (braces: a Cluster hash tag).
    #[arg(long, env = "RATELIMIT_REDIS_PREFIX", default_value = "rl:")]
    pub redis_prefix: String,

    /// PEM file of the CA certificates to trust for rediss:// (Memorystore's server CA);
    /// without it, the public webpki roots.
    #[arg(long, env = "RATELIMIT_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,

    /// RTDB path under which counters live: {root}/{limit}/{encodedKey}.
    #[arg(long, env = "RATELIMIT_RTDB_ROOT", default_value = "rateLimits")]
    pub rtdb_root: String,

    /// Consecutive store failures that open the circuit breaker (then checks answer
    /// locally at once, and one probe at a time tests the store).
    #[arg(long, env = "RATELIMIT_BREAKER_FAILURES", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub breaker_failures: u32,

    /// How long the open breaker waits before probing the store again.
    #[arg(long, env = "RATELIMIT_BREAKER_COOLDOWN", default_value = "2s", value_parser = parse_duration)]
    pub breaker_cooldown: Duration,

    /// Quota leases (remote stores): the most hits one instance reserves for a hot key in
    /// one store write, then admits with no store call (source LEASE). 0 switches leases
    /// off: every check then costs a store write.
    #[arg(long, env = "RATELIMIT_LEASE_MAX_HITS", default_value_t = LeaseOptions::default().max_hits)]
    pub lease_max_hits: u32,

    /// A lease takes at most 1/N of what the store has left for the key (and none once
    /// that is under 2 hits, so the last hits of a window are decided one by one).
    #[arg(long, env = "RATELIMIT_LEASE_SHARE", default_value_t = LeaseOptions::default().share, value_parser = clap::value_parser!(u32).range(1..))]
    pub lease_share: u32,

    /// An unspent lease is given back to the store after the key has been quiet this long.
    #[arg(long, env = "RATELIMIT_LEASE_IDLE", default_value = "250ms", value_parser = parse_duration)]
    pub lease_idle: Duration,
    /// How long a key known exhausted (and the store's cached count that denies it) is
    /// believed without asking the store again; a Reset through another instance frees
    /// the key here within about this long. Costs at most one store request per
    /// exhausted key per instance per period.
    #[arg(long, env = "RATELIMIT_DENY_TRUST", default_value = "1s", value_parser = parse_duration)]
    pub deny_trust: Duration,

    /// Threads deciding. 1 (the default): one current-thread runtime, the steadiest tail
    /// and the lowest cost per call measured (BENCHMARKS.md §12). N > 1: a multi-thread
    /// runtime of N workers; 0: one worker per core the process may use.
    #[arg(long, env = "RATELIMIT_WORKERS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(0..=MAX_WORKERS))]
    pub workers: u16,

    /// Calls served at once; past it calls fail fast with RESOURCE_EXHAUSTED (load shedding).
    #[arg(long, env = "RATELIMIT_MAX_IN_FLIGHT", default_value_t = 2_048, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight: u32,

    /// After SIGTERM, how long in-flight calls may take before the process exits anyway
    /// (keep it below Cloud Run's 10 s).
    #[arg(long, env = "RATELIMIT_DRAIN_TIMEOUT", default_value = "8s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// Close client connections after this age (GOAWAY) so clients spread over new instances.
    #[arg(long, env = "RATELIMIT_MAX_CONNECTION_AGE", default_value = "5m", value_parser = parse_duration)]
    pub max_connection_age: Duration,

    /// Serve Prometheus metrics at http://ADDR/metrics (off when unset), e.g. 0.0.0.0:9090.
    #[arg(long, env = "RATELIMIT_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Log format: text or json (Cloud Logging). Default: json when K_SERVICE is set (Cloud Run), else text.
    #[arg(long, env = "RATELIMIT_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,

    /// Log filter, e.g. `info`, `debug`, `ratelimit=debug,info`.
    #[arg(long, env = "RATELIMIT_LOG", default_value = "info", value_parser = parse_log_filter)]
    pub log: String,

    /// Memory for every cache and window map (counters in memory mode, fallback windows,
    /// deny-until cache, RTDB node cache), keys included, e.g. 256MiB, 1GiB. Past it
    /// the least used entries are evicted (counted in ratelimit_cache_evictions_total).
    /// Leave room for the rest of the process: about half the instance's memory.
    #[arg(long, env = "RATELIMIT_MEMORY_LIMIT", default_value = "256MiB", value_parser = crate::memory_budget::parse_memory_limit)]
    pub memory_limit: u64,

    /// Longest startup may spend finding Google credentials before giving up.
    #[arg(long, env = "RATELIMIT_CREDENTIALS_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub credentials_timeout: Duration,
}

impl ServeArgs {
    /// The address to listen on: `--listen`, else `0.0.0.0` with `--port`, `$PORT` or 50051.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        if let Some(addr) = self.listen {
            return Ok(addr);
        }
        let port = match (self.port, std::env::var("PORT")) {
            (Some(p), _) => p,
            (None, Ok(v)) => v.trim().parse().map_err(|_| ConfigError::Port(v))?,
            (None, Err(_)) => DEFAULT_PORT,
        };
        Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))
    }

    /// The server options these flags describe.
    pub fn serve_options(&self, admin: Option<AdminToken>) -> ServeOptions {
        ServeOptions {
            admin,
            max_in_flight: usize::try_from(self.max_in_flight).unwrap_or(usize::MAX),
            drain_timeout: self.drain_timeout,
            max_connection_age: self.max_connection_age,
            keepalive_interval: ServeOptions::default().keepalive_interval,
        }
    }

    /// The log format: `--log-format`, else JSON on Cloud Run and text elsewhere.
    pub fn log_format(&self) -> LogFormat {
        self.log_format.unwrap_or_else(LogFormat::detect)
    }
}

/// Parses a human duration such as `1.5s`, `800ms`, `2m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    // humantime has no fractional units; accept "1.5s" as operators naturally write it.
    if let Some(secs) = s.strip_suffix('s').filter(|n| n.contains('.')) {
        let v: f64 = secs
            .parse()
            .map_err(|_| format!("{s:?} is not a duration like 1.5s or 800ms"))?;
        if !(v.is_finite() && v > 0.0 && v < 86_400.0) {
            return Err(format!("{s:?} must be a positive duration under a day"));
        }
        return Ok(Duration::from_secs_f64(v));
    }
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 1.5s or 800ms: {e}"))?;
    if d.is_zero() {
        return Err(format!("{s:?} must be longer than zero"));
    }
    Ok(d)
}

/// Warns of timeouts that work against each other: a check still waiting for the store
/// when the drain ends gets no answer at all (the connection closes), and Cloud Run kills
/// the process 10 s after SIGTERM whatever the drain timeout says.
pub fn warn_about_timeouts(args: &ServeArgs) {
    if args.store_timeout >= args.drain_timeout {
        tracing::warn!(
            store_timeout = ?args.store_timeout,
            drain_timeout = ?args.drain_timeout,
            "--store-timeout is not below --drain-timeout: checks waiting on a slow store at shutdown get no answer"
        );
    }
    if crate::logging::on_cloud_run() && args.drain_timeout >= Duration::from_secs(10) {
        tracing::warn!(
            drain_timeout = ?args.drain_timeout,
            "--drain-timeout is not below Cloud Run's 10 s between SIGTERM and SIGKILL"
        );
    }
}

/// The most `--workers` accepted: far more threads than any instance has cores, and few
/// enough that the OS can always start them (the runtime aborts when it cannot).
pub const MAX_WORKERS: i64 = 1_024;

/// A `--log` filter, refused at startup when it would silence the service: bad syntax,
/// nothing at all, or a bare word that is not a level (`debugg` is a *target* to
/// `EnvFilter`, which then logs nothing else).
pub fn parse_log_filter(s: &str) -> Result<String, String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let spec = s.trim();
    if spec.is_empty() {
        return Err("is empty; use a level such as info, or e.g. ratelimit=debug,info".into());
    }
    for directive in spec.split(',').map(str::trim) {
        if !directive.contains(['=', '[', ':'])
            && !LEVELS.contains(&directive.to_ascii_lowercase().as_str())
        {
            return Err(format!(
                "{directive:?} is not a level ({}); to name a target, write target=level",
                LEVELS.join(", ")
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(spec)
        .map(|_| spec.to_owned())
        .map_err(|e| format!("{spec:?} is not a log filter: {e}"))
}

/// The Firebase convention for pointing clients at a database emulator (`host:port`).
pub const EMULATOR_HOST_ENV: &str = "FIREBASE_DATABASE_EMULATOR_HOST";

/// Why the service could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The limits file is bad.
    #[error(transparent)]
    Limits(#[from] LimitsError),
    /// The RTDB store could not be set up.
    #[error(transparent)]
    Rtdb(#[from] RtdbError),
    /// The Redis store could not be set up.
    #[error(transparent)]
    Redis(#[from] RedisSetupError),
    /// Two stores were selected.
    #[error(
        "--database-url (RATELIMIT_DATABASE_URL) and --redis-url (RATELIMIT_REDIS_URL) each select a store; give only one"
    )]
    TwoStores,
    /// `$PORT` is not a port number.
    #[error("PORT={0:?} is not a port number")]
    Port(String),
}

/// The port used when neither `--port` nor `$PORT` is given.
pub const DEFAULT_PORT: u16 = 50051;

/// Loads the limits named by `path`, or the built-in set.
pub fn load_limits(path: Option<&std::path::Path>) -> Result<Limits, LimitsError> {
    match path {
        Some(p) => Limits::load(p),
        None => Ok(Limits::builtin()),
    }
}

/// The store the flags select. Adding a backend is one arm here.
pub async fn build_store(
    args: &ServeArgs,
    clock: SharedClock,
) -> Result<Arc<dyn CounterStore>, ConfigError> {
    let budget = MemoryBudget::new(args.memory_limit);
    if let Some(url) = args.redis_url.as_deref() {
        if args.database_url.is_some() {
            return Err(ConfigError::TwoStores);
        }
        let options = RedisOptions {
            prefix: args.redis_prefix.clone(),
            ca_file: args.redis_ca_file.clone(),
            // As for RTDB: the limiter's budget bounds each decision; this is a backstop.
            response_timeout: args.store_timeout.max(Duration::from_secs(1)) * 2,
            ..RedisOptions::default()
        };
        let store = RedisStore::new(url, options, clock)?;
        tracing::info!(endpoint = %store.describe(), prefix = %args.redis_prefix, "using the Redis store");
        return Ok(Arc::new(store));
    }
    let Some(url) = args.database_url.as_deref() else {
        let bytes = budget.service(false).store;
        return Ok(Arc::new(MemoryStore::with_budget(bytes, "store")));
    };
    let emulator = std::env::var(EMULATOR_HOST_ENV).ok();
    let target = Target::new(url, emulator.as_deref(), &args.rtdb_root).map_err(RtdbError::from)?;
    // Emulator mode never touches Google credentials (none exist on a dev machine or in CI).
    let tokens: Arc<dyn TokenSource> = if target.is_emulator() {
        Arc::new(EmulatorOwner)
    } else {
        Arc::new(
            auth::discover(args.credentials_timeout)
                .await
                .map_err(RtdbError::from)?,
        )
    };
    let options = RtdbOptions {
        // The limiter's budget bounds each decision; this only stops a stuck request
        // from holding a connection for ever.
        request_timeout: args.store_timeout.max(Duration::from_secs(1)) * 2,
        node_cache_bytes: budget.service(true).rtdb_nodes,
        deny_trust: args.deny_trust,
        ..RtdbOptions::default()
    };
    let store = RtdbStore::new(target, tokens, options)?.with_clock(clock);
    tracing::info!(endpoint = %store.describe(), root = %args.rtdb_root, "using the RTDB store");
    Ok(Arc::new(store))
}

/// The limiter the flags describe.
pub async fn build_limiter(args: &ServeArgs, clock: SharedClock) -> Result<Limiter, ConfigError> {
    let limits = load_limits(args.limits.as_deref())?;
    let store = build_store(args, clock.clone()).await?;
    let shares = MemoryBudget::new(args.memory_limit).service(store.is_remote());
    tracing::info!(
        memory_limit_bytes = args.memory_limit,
        shares = ?shares,
        "memory budget for caches and windows"
    );
    Ok(Limiter::new(
        limits,
        store,
        clock,
        LimiterOptions {
            store_timeout: args.store_timeout,
            breaker: BreakerConfig {
                failures: args.breaker_failures,
                cooldown: args.breaker_cooldown,
            },
            memory: MemoryBudget::new(args.memory_limit),
            lease: LeaseOptions {
                max_hits: args.lease_max_hits,
                share: args.lease_share,
                idle: args.lease_idle,
            },
            deny_trust: args.deny_trust,
        },
    ))
}

#[cfg(test)]
mod tests;
