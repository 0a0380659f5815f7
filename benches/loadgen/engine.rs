//! The load engine: sets up what a run needs and drives it.
//!
//! [`Env`] is the system under load: service instances started in this process (memory
//! store, or RTDB store over an in-process emulator with injected latency), or remote
//! `--target` addresses (optionally with a remote emulator's control URL to read its
//! request counters). [`drive`] runs `concurrency` client tasks over a few shared gRPC
//! channels against it, bounded by a request count *and* a duration, and returns every
//! check's latency and answer plus the emulator's request counters for the run.
//!
//! Kept apart from the CLI (`main.rs`) and the tables (`report.rs`) so that each
//! scenario is only a list of [`RunSpec`]s.

pub use crate::env::{Env, EnvSpec, StoreKind};
use crate::report::CpuSampler;
use ratelimit::breaker::State;
use ratelimit::pb::rate_limiter_client::RateLimiterClient;
use ratelimit::pb::{CheckRequest, Source};
use rtdb_emulator::Stats;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::transport::{Channel, Endpoint};

/// Window length of both benchmark limits (`benches/limits.toml`).
pub const WINDOW_MS: u64 = 60_000;
/// Longest a single check may take before the client gives up on it (never sent to the
/// server, so it does not change the server's store budget).
const CLIENT_CALL_BOUND: Duration = Duration::from_secs(30);
/// Hard caps so no run is unbounded, whatever the flags say.
pub const MAX_REQUESTS: u64 = 5_000_000;
pub const MAX_DURATION: Duration = Duration::from_secs(600);

/// One run's parameters.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub label: String,
    pub concurrency: usize,
    /// HTTP/2 connections (tonic channels) shared by the client tasks; 0: the default,
    /// `min(concurrency, 4 × service URLs)`.
    pub connections: usize,
    pub keys: usize,
    /// Keys are `{key_prefix}-{i}`. Runs that must start from fresh counters get a unique
    /// prefix; a run that must see an earlier run's counter reuses its prefix.
    pub key_prefix: String,
    /// Limit name sent (`""`: the server's default).
    pub limit: String,
    pub cost: u32,
    /// Stop issuing after this many checks...
    pub requests: u64,
    /// ...or after this long, whichever comes first.
    pub duration: Duration,
    /// Checks on separate keys before measuring (not counted, emulator counters excluded).
    pub warmup: Duration,
    /// Sent as the gRPC deadline (`grpc-timeout`) when set.
    pub grpc_timeout: Option<Duration>,
    /// Wait until at least this much of the current 60 s window is left before starting,
    /// so a 120/min run cannot straddle a window boundary.
    pub fresh_window: Option<Duration>,
    /// Report latency per slice of this length (send time since the start).
    pub slice: Option<Duration>,
}

impl RunSpec {
    /// A run with everything but the essentials at its default.
    pub fn new(label: &str, concurrency: usize, keys: usize, limit: &str) -> Self {
        Self {
            label: label.to_owned(),
            concurrency,
            connections: 0,
            keys,
            key_prefix: unique_prefix(),
            limit: limit.to_owned(),
            cost: 1,
            requests: 1_000_000,
            duration: Duration::from_secs(10),
            warmup: Duration::ZERO,
            grpc_timeout: None,
            fresh_window: None,
            slice: None,
        }
    }
}

/// A key prefix no earlier run used (time + random), so counters start empty.
pub fn unique_prefix() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("lg{:x}{:04x}", ms % 0xffff_ffff, fastrand::u16(..))
}

/// One check as the client saw it.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Send time, µs since the measured phase started.
    pub at_us: u32,
    /// Latency in ns.
    pub latency_ns: u64,
    /// `Source` as i32, or -1 for a gRPC error.
    pub source: i32,
    pub allowed: bool,
    pub shared: bool,
}

/// What the emulator counted during the measured phase.
#[derive(Debug, Clone, Default)]
pub struct StoreCounts {
    /// Requests answered or dropped (`Stats::total`).
    pub requests: u64,
    pub gets: u64,
    pub puts: u64,
    /// Successful writes.
    pub writes: u64,
    /// `412 Precondition Failed` answers (lost ETag races).
    pub conflicts: u64,
}

fn diff(after: &Stats, before: &Stats) -> StoreCounts {
    StoreCounts {
        requests: after.total - before.total,
        gets: after.method("GET") - before.method("GET"),
        puts: after.method("PUT") - before.method("PUT"),
        writes: after.writes - before.writes,
        conflicts: after.status(412) - before.status(412),
    }
}

/// A slice boundary: emulator requests arrived so far and the breaker state then.
/// `slices[0]` is the start; `slices[k + 1]` the end of slice `k`.
#[derive(Debug, Clone)]
pub struct SliceMark {
    pub received: Option<u64>,
    pub breaker: Option<State>,
}

/// Everything a run produced.
pub struct RunResult {
    pub spec: RunSpec,
    pub connections: usize,
    pub elapsed: Duration,
    /// In send order per task, concatenated.
    pub samples: Vec<Sample>,
    /// Latencies of successful checks, sorted (ns).
    pub sorted_ns: Vec<u64>,
    pub errors: BTreeMap<String, u64>,
    /// Admitted checks per window number.
    pub admitted_by_window: BTreeMap<i64, u64>,
    pub store: Option<StoreCounts>,
    pub slices: Vec<SliceMark>,
    /// 1-minute load average when the run started and ended.
    pub load: (f64, f64),
    /// CPU used by other processes during the run, in cores.
    pub foreign_cores: Option<f64>,
}

impl RunResult {
    pub fn checks(&self) -> u64 {
        self.samples.len() as u64
    }
    pub fn ok(&self) -> u64 {
        self.sorted_ns.len() as u64
    }
    pub fn allowed(&self) -> u64 {
        self.samples.iter().filter(|s| s.allowed).count() as u64
    }
    pub fn denied(&self) -> u64 {
        self.samples
            .iter()
            .filter(|s| s.source >= 0 && !s.allowed)
            .count() as u64
    }
    pub fn shared(&self) -> u64 {
        self.samples.iter().filter(|s| s.shared).count() as u64
    }
    pub fn unshared(&self) -> u64 {
        self.samples
            .iter()
            .filter(|s| s.source >= 0 && !s.shared)
            .count() as u64
    }
    pub fn by_source(&self, source: Source) -> u64 {
        self.samples
            .iter()
            .filter(|s| s.source == source as i32)
            .count() as u64
    }
    pub fn throughput(&self) -> f64 {
        self.ok() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Nearest-rank percentile of sorted values (`p` in 0..=100).
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

struct TaskOut {
    samples: Vec<Sample>,
    errors: BTreeMap<String, u64>,
    admitted: BTreeMap<i64, u64>,
}

/// Runs `spec` against `env`.
pub async fn drive(env: &Env, spec: &RunSpec) -> Result<RunResult, String> {
    let concurrency = spec.concurrency.max(1);
    let connections = match spec.connections {
        0 => concurrency.min(4 * env.urls.len()).max(1),
        n => n,
    };
    let mut channels = Vec::with_capacity(connections);
    for j in 0..connections {
        let url = &env.urls[j % env.urls.len()];
        let channel = Endpoint::from_shared(url.clone())
            .map_err(|e| format!("{url}: {e}"))?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("connect {url}: {e}"))?;
        channels.push(channel);
    }
    let requests = spec.requests.clamp(1, MAX_REQUESTS);
    let duration = spec.duration.min(MAX_DURATION);

    if !spec.warmup.is_zero() {
        let warm = RunSpec {
            key_prefix: format!("{}-warm", spec.key_prefix),
            requests: MAX_REQUESTS,
            duration: spec.warmup,
            ..spec.clone()
        };
        phase(&channels, &warm, concurrency, requests_keys(&warm)).await;
    }
    if let Some(need) = spec.fresh_window {
        let left = WINDOW_MS - now_ms() % WINDOW_MS;
        let need = u64::try_from(need.as_millis()).unwrap_or(u64::MAX);
        if left < need {
            eprintln!(
                "  [{}] waiting {} ms for a fresh 60 s window",
                spec.label, left
            );
            tokio::time::sleep(Duration::from_millis(left + 50)).await;
        }
    }

    let before = env.emulator_stats().await?;
    let load_before = crate::report::load1();
    let cpu = CpuSampler::start();
    let keys = requests_keys(spec);
    let run = RunSpec {
        requests,
        duration,
        ..spec.clone()
    };
    let started = Instant::now();
    let measured = phase(&channels, &run, concurrency, keys);
    let mut slices = Vec::new();
    let outs = match spec.slice {
        None => measured.await,
        Some(every) => {
            // Mark each slice's end while the checks run: the emulator's arrival count
            // and the breaker state then.
            tokio::pin!(measured);
            slices.push(SliceMark {
                received: before.as_ref().map(|s| s.received),
                breaker: env.breaker(),
            });
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tokio::select! {
                    outs = &mut measured => break outs,
                    _ = tick.tick() => {
                        let received = env.emulator_stats().await.ok().flatten().map(|s| s.received);
                        slices.push(SliceMark { received, breaker: env.breaker() });
                    }
                }
            }
        }
    };
    let elapsed = started.elapsed();
    let foreign_cores = cpu.foreign_cores();
    let load_after = crate::report::load1();
    let after = env.emulator_stats().await?;

    let mut samples = Vec::new();
    let mut errors = BTreeMap::new();
    let mut admitted_by_window = BTreeMap::new();
    for out in outs {
        samples.extend(out.samples);
        for (k, v) in out.errors {
            *errors.entry(k).or_insert(0) += v;
        }
        for (k, v) in out.admitted {
            *admitted_by_window.entry(k).or_insert(0) += v;
        }
    }
    let mut sorted_ns: Vec<u64> = samples
        .iter()
        .filter(|s| s.source >= 0)
        .map(|s| s.latency_ns)
        .collect();
    sorted_ns.sort_unstable();
    // Counted only once every check has been answered, so no request is in flight.
    let store = match (before, after) {
        (Some(b), Some(a)) => Some(diff(&a, &b)),
        _ => None,
    };
    Ok(RunResult {
        spec: spec.clone(),
        connections,
        elapsed,
        samples,
        sorted_ns,
        errors,
        admitted_by_window,
        store,
        slices,
        load: (load_before, load_after),
        foreign_cores,
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(0))
        .unwrap_or(0)
}

fn requests_keys(spec: &RunSpec) -> Arc<Vec<String>> {
    Arc::new(
        (0..spec.keys.max(1))
            .map(|i| format!("{}-{i}", spec.key_prefix))
            .collect(),
    )
}

/// `concurrency` tasks issuing checks until `spec.requests` were issued or
/// `spec.duration` passed. Check `n` (global issue order) uses key `n % keys`.
async fn phase(
    channels: &[Channel],
    spec: &RunSpec,
    concurrency: usize,
    keys: Arc<Vec<String>>,
) -> Vec<TaskOut> {
    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        let mut client = RateLimiterClient::new(channels[i % channels.len()].clone());
        let issued = issued.clone();
        let keys = keys.clone();
        let (limit, cost, grpc_timeout) = (spec.limit.clone(), spec.cost, spec.grpc_timeout);
        let (requests, duration) = (spec.requests, spec.duration);
        tasks.push(tokio::spawn(async move {
            let mut out = TaskOut {
                samples: Vec::with_capacity(1_024),
                errors: BTreeMap::new(),
                admitted: BTreeMap::new(),
            };
            loop {
                let n = issued.fetch_add(1, Ordering::Relaxed);
                if n >= requests || started.elapsed() >= duration {
                    break;
                }
                let key = &keys[(n % keys.len() as u64) as usize];
                let mut req = tonic::Request::new(CheckRequest {
                    key: key.clone(),
                    limit: limit.clone(),
                    cost,
                });
                if let Some(t) = grpc_timeout {
                    req.set_timeout(t);
                }
                let sent = Instant::now();
                let answer = tokio::time::timeout(CLIENT_CALL_BOUND, client.check(req)).await;
                let latency_ns = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
                let at_us =
                    u32::try_from(sent.duration_since(started).as_micros()).unwrap_or(u32::MAX);
                let sample = match answer {
                    Ok(Ok(resp)) => {
                        let r = resp.into_inner();
                        if r.allowed {
                            *out.admitted.entry(r.window).or_insert(0) += 1;
                        }
                        Sample {
                            at_us,
                            latency_ns,
                            source: r.source,
                            allowed: r.allowed,
                            shared: r.shared,
                        }
                    }
                    Ok(Err(status)) => {
                        *out.errors
                            .entry(format!("{:?}", status.code()))
                            .or_insert(0) += 1;
                        error_sample(at_us, latency_ns)
                    }
                    Err(_) => {
                        *out.errors.entry("client timeout".into()).or_insert(0) += 1;
                        error_sample(at_us, latency_ns)
                    }
                };
                out.samples.push(sample);
            }
            out
        }));
    }
    let mut outs = Vec::with_capacity(concurrency);
    for t in tasks {
        if let Ok(out) = t.await {
            outs.push(out);
        }
    }
    outs
}

fn error_sample(at_us: u32, latency_ns: u64) -> Sample {
    Sample {
        at_us,
        latency_ns,
        source: -1,
        allowed: false,
        shared: false,
    }
}
