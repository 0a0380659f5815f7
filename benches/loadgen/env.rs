//! The system under load ([`Env`]): service instances started in this process (memory
//! store, RTDB store over an in-process emulator with injected latency, or Redis), or
//! remote `--target` addresses (optionally with a remote emulator's control URL to read
//! its request counters). `engine.rs` drives runs against it.

use ratelimit::breaker::{BreakerConfig, State};
use ratelimit::clock;
use ratelimit::limiter::LeaseOptions;
use ratelimit::limiter::{Limiter, LimiterOptions};
use ratelimit::limits::Limits;
use ratelimit::server::{self, ServeOptions};
use ratelimit::store::rtdb::auth::EmulatorOwner;
use ratelimit::store::rtdb::target::Target;
use ratelimit::store::rtdb::{RtdbOptions, RtdbStore};
use ratelimit::store::{CounterStore, MemoryStore};
use rtdb_emulator::{Emulator, Stats};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::server::TcpIncoming;

/// The limits every in-process instance runs (and a targeted `ratelimit serve` should).
pub const LIMITS_TOML: &str = include_str!("../limits.toml");
/// Database URL for the emulator; its first label is the namespace (`?ns=`).
const DB_URL: &str = "https://bladbase-bench-default-rtdb.europe-west1.firebasedatabase.app";

/// Which store in-process instances use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// `MemoryStore`: one process, no database.
    Memory,
    /// `RtdbStore` over an in-process RTDB emulator.
    Emulator,
    /// `RedisStore` on `EnvSpec::redis_url` (a redis-server started by `redis_bench.rs`
    /// or given with `--redis-url`).
    Redis,
}

/// What to put under load.
#[derive(Debug, Clone)]
pub struct EnvSpec {
    /// Remote service URLs (`http://host:port`); empty: start instances in-process.
    pub targets: Vec<String>,
    /// Base URL of a remote emulator (`http://host:port`) whose counters to read.
    pub emulator_control: Option<String>,
    pub store: StoreKind,
    pub instances: usize,
    pub emulator_latency: Duration,
    /// With `StoreKind::Redis`: the server every instance shares.
    pub redis_url: Option<String>,
    pub store_timeout: Duration,
    pub breaker: BreakerConfig,
    /// Quota leases of the in-process instances (`LeaseOptions::OFF` to compare).
    pub lease: LeaseOptions,
    /// Accept connections with Nagle's algorithm on (TCP_NODELAY off), as the service
    /// did before BENCHMARKS.md §7: reproduces the "before" numbers.
    pub server_nagle: bool,
}

impl Default for EnvSpec {
    fn default() -> Self {
        Self {
            targets: Vec::new(),
            emulator_control: None,
            store: StoreKind::Memory,
            instances: 1,
            emulator_latency: Duration::ZERO,
            redis_url: None,
            store_timeout: LimiterOptions::default().store_timeout,
            breaker: BreakerConfig::default(),
            lease: LeaseOptions::default(),
            server_nagle: false,
        }
    }
}

enum EmulatorHandle {
    Local(Emulator),
    Remote { http: reqwest::Client, base: String },
}

impl EmulatorHandle {
    async fn stats(&self) -> Result<Stats, String> {
        match self {
            EmulatorHandle::Local(emu) => Ok(emu.stats()),
            EmulatorHandle::Remote { http, base } => {
                let url = format!("{base}/.emulator/stats");
                let resp = http
                    .get(&url)
                    .send()
                    .await
                    .map_err(|e| format!("GET {url}: {e}"))?;
                resp.json::<Stats>()
                    .await
                    .map_err(|e| format!("GET {url}: {e}"))
            }
        }
    }
}

/// An in-process service instance: `server::serve` on its own task.
struct Instance {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), server::ServeError>>,
}

/// The system under load.
pub struct Env {
    /// Service URLs; client channel `j` connects to `urls[j % urls.len()]`.
    pub urls: Vec<String>,
    /// One line saying what this is, for the report.
    pub description: String,
    limiters: Vec<Arc<Limiter>>,
    // Field order is drop order: servers stop before the emulator they talk to.
    servers: Vec<Instance>,
    emulator: Option<EmulatorHandle>,
}

impl Env {
    /// Starts (or connects to) what `spec` describes.
    pub async fn start(spec: &EnvSpec) -> Result<Env, String> {
        ratelimit::install_crypto_provider();
        if !spec.targets.is_empty() {
            let emulator = match &spec.emulator_control {
                Some(base) => Some(EmulatorHandle::Remote {
                    http: reqwest::Client::builder()
                        .timeout(Duration::from_secs(5))
                        .build()
                        .map_err(|e| format!("HTTP client: {e}"))?,
                    base: base.trim_end_matches('/').to_owned(),
                }),
                None => None,
            };
            return Ok(Env {
                description: format!("remote target(s) {}", spec.targets.join(", ")),
                urls: spec.targets.clone(),
                limiters: Vec::new(),
                servers: Vec::new(),
                emulator,
            });
        }
        let limits = Limits::from_toml("benches/limits.toml", LIMITS_TOML)
            .map_err(|e| format!("limits: {e}"))?;
        let emulator = match spec.store {
            StoreKind::Memory | StoreKind::Redis => None,
            StoreKind::Emulator => {
                let rules: serde_json::Value =
                    serde_json::from_str(include_str!("../../database.rules.json"))
                        .map_err(|e| format!("database.rules.json: {e}"))?;
                let emu = Emulator::start_with(rtdb_emulator::Options {
                    rules: Some(rules),
                    addr: None,
                })
                .await
                .map_err(|e| format!("emulator: {e}"))?;
                emu.faults().set_latency(spec.emulator_latency);
                Some(emu)
            }
        };
        let instances = spec.instances.max(1);
        let (mut servers, mut limiters, mut urls) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..instances {
            let clock = clock::system();
            let store: Arc<dyn CounterStore> = match &emulator {
                None if spec.store == StoreKind::Redis => crate::redis_bench::store(
                    spec.redis_url.as_deref(),
                    spec.store_timeout,
                    &clock,
                )?,
                None => Arc::new(MemoryStore::new()),
                Some(emu) => {
                    let target = Target::new(DB_URL, Some(&emu.host()), "rateLimits")
                        .map_err(|e| format!("target: {e}"))?;
                    // As `config::build_store` does: the limiter's budget bounds each
                    // decision; this only stops a stuck request holding a connection.
                    let options = RtdbOptions {
                        request_timeout: spec.store_timeout.max(Duration::from_secs(1)) * 2,
                        ..RtdbOptions::default()
                    };
                    // Each instance has its own store (ETag cache, HTTP pool), as separate
                    // processes would.
                    Arc::new(
                        RtdbStore::new(target, Arc::new(EmulatorOwner), options)
                            .map_err(|e| format!("store: {e}"))?,
                    )
                }
            };
            let limiter = Arc::new(Limiter::new(
                limits.clone(),
                store,
                clock,
                LimiterOptions {
                    store_timeout: spec.store_timeout,
                    breaker: spec.breaker,
                    lease: spec.lease,
                    ..LimiterOptions::default()
                },
            ));
            let addr = "127.0.0.1:0".parse().map_err(|e| format!("addr: {e}"))?;
            // `server::bind` is what the binary uses; the raw bind keeps Nagle on.
            let incoming = if spec.server_nagle {
                TcpIncoming::bind(addr).map_err(|e| format!("bind: {e}"))?
            } else {
                server::bind(addr).map_err(|e| format!("bind: {e}"))?
            };
            let bound = incoming.local_addr().map_err(|e| format!("bind: {e}"))?;
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(server::serve(
                limiter.clone(),
                ServeOptions::default(),
                incoming,
                async move {
                    let _ = stopped.await;
                },
            ));
            urls.push(format!("http://{bound}"));
            servers.push(Instance { stop, task });
            limiters.push(limiter);
        }
        let store = match (&emulator, spec.store) {
            (Some(emu), _) => format!(
                "RTDB store over an in-process emulator ({}, +{} ms per request)",
                emu.host(),
                spec.emulator_latency.as_millis()
            ),
            (None, StoreKind::Redis) => "Redis store on one local redis-server".to_owned(),
            (None, _) => "memory store".to_owned(),
        };
        Ok(Env {
            description: format!(
                "{instances} in-process instance(s) on loopback, {store}; store timeout {:?}, breaker {} failures / {:?}{}",
                spec.store_timeout,
                spec.breaker.failures,
                spec.breaker.cooldown,
                if spec.server_nagle {
                    "; server sockets WITH Nagle (TCP_NODELAY off)"
                } else {
                    ""
                }
            ),
            urls,
            limiters,
            servers,
            emulator: emulator.map(EmulatorHandle::Local),
        })
    }

    /// True when emulator counters are available.
    pub fn has_emulator(&self) -> bool {
        self.emulator.is_some()
    }

    pub(crate) async fn emulator_stats(&self) -> Result<Option<Stats>, String> {
        match &self.emulator {
            Some(e) => e.stats().await.map(Some),
            None => Ok(None),
        }
    }

    /// Changes the in-process emulator's added latency (no-op for a remote one).
    pub fn set_emulator_latency(&self, d: Duration) {
        if let Some(EmulatorHandle::Local(emu)) = &self.emulator {
            emu.faults().set_latency(d);
        }
    }

    /// The first in-process instance's breaker state.
    pub(crate) fn breaker(&self) -> Option<State> {
        self.limiters.first().and_then(|l| l.breaker_state())
    }

    /// Stops the in-process servers (each drains, bounded by its drain timeout).
    pub async fn stop(self) {
        for s in self.servers {
            let _ = s.stop.send(());
            let _ = s.task.await;
        }
    }
}
