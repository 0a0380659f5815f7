//! Scenario `ceiling`: how close `Check` comes to what the server stack itself allows.
//!
//! The same clients, over the same HTTP/2 connections to one in-process instance (memory
//! store), alternate between `RateLimiter/Check` and the same server's
//! `grpc.health.v1.Health/Check` in interleaved rounds (Check first in odd rounds, Health
//! first in even ones, so a drift in the machine's load hits both alike). `Health/Check`
//! runs tonic's routing, HTTP/2 and protobuf but no decision: its rate is the ceiling of
//! the stack, and the ratio of the two rates is the share of it a decision leaves.
//! Both legs' clients use the same codec (`ratelimit::codec`), so what differs between
//! them is the server's work alone.
//! With `--target` the server is a separate `ratelimit serve` (the release build as
//! deployed, e.g. `scripts/release-build`'s) and only the clients run here (so "calls
//! per CPU-second" counts the clients' CPU, and "other procs" is mostly the server).
//! Ratios, not absolute rates, are what this compares: the VM's noise moves both. Each
//! leg also reports calls per CPU-second of this process (client and server together),
//! which other processes on a shared machine disturb far less than the wall-clock rate.

use crate::engine::{Env, EnvSpec, percentile, unique_prefix};
use crate::report::{self, CpuSampler};
use clap::Args;
use ratelimit::codec::SliceCodec;
use ratelimit::config::parse_duration;
use ratelimit::pb::CheckRequest;
use ratelimit::pb::rate_limiter_client::RateLimiterClient;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

#[derive(Debug, Clone, Args)]
pub struct CeilingArgs {
    /// Concurrent clients (each has one call in flight at a time).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// HTTP/2 connections shared by the clients (0: min(concurrency, 4)).
    #[arg(long, default_value_t = 0)]
    connections: usize,
    /// Distinct keys of the Check calls (call n uses key n mod keys).
    #[arg(long, default_value_t = 1)]
    keys: usize,
    /// Measured time of each leg (one RPC, one round).
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    duration: Duration,
    /// Rounds; each runs one Check leg and one Health/Check leg.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Warm-up of both RPCs before the first round (not counted).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    warmup: Duration,
    /// Run only this RPC's legs (no ratio): for counting one RPC's instructions per call
    /// under callgrind, where the two legs of a round cannot be told apart.
    #[arg(long, value_enum)]
    only: Option<Rpc>,
    /// Drive a running `ratelimit serve` at this URL (`http://host:port`, started with
    /// `--limits benches/limits.toml` for the `bench` limit) instead of an in-process
    /// instance: the release build as deployed, in its own process.
    #[arg(long)]
    target: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Rpc {
    Check,
    Health,
}

impl Rpc {
    fn name(self) -> &'static str {
        match self {
            Rpc::Check => "RateLimiter/Check",
            Rpc::Health => "Health/Check",
        }
    }
}

/// One leg: one RPC driven by every client for `duration`.
struct Leg {
    round: usize,
    rpc: Rpc,
    elapsed: Duration,
    sorted_ns: Vec<u64>,
    errors: u64,
    /// CPU seconds this process used during the leg.
    own_cpu: Option<f64>,
    load: (f64, f64),
    foreign_cores: Option<f64>,
}

impl Leg {
    fn rate(&self) -> f64 {
        self.sorted_ns.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    fn calls(&self) -> f64 {
        self.sorted_ns.len() as f64
    }
}

fn own_cpu_secs() -> Option<f64> {
    report::cpu_ticks().map(|(_, own)| own as f64 / report::TICKS_PER_SEC)
}

/// Runs the scenario and prints its tables.
pub async fn ceiling(a: CeilingArgs) -> Result<(), String> {
    let env = Env::start(&EnvSpec {
        targets: a.target.iter().cloned().collect(),
        ..EnvSpec::default()
    })
    .await?;
    println!("system: {}", env.description);
    let url = env.urls.first().cloned().ok_or("no instance started")?;
    let concurrency = a.concurrency.max(1);
    let connections = match a.connections {
        0 => concurrency.min(4),
        n => n,
    };
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        let channel = Endpoint::from_shared(url.clone())
            .map_err(|e| format!("{url}: {e}"))?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("connect {url}: {e}"))?;
        channels.push(channel);
    }
    let keys: Arc<Vec<String>> = Arc::new({
        let prefix = unique_prefix();
        (0..a.keys.max(1))
            .map(|i| format!("{prefix}-{i}"))
            .collect()
    });
    let duration = a.duration.min(crate::engine::MAX_DURATION);
    let wanted = |rpc: &Rpc| a.only.is_none_or(|only| only == *rpc);
    for rpc in [Rpc::Check, Rpc::Health].iter().filter(|r| wanted(r)) {
        leg(&channels, concurrency, a.warmup, *rpc, &keys, 0).await;
    }
    let mut legs = Vec::new();
    for round in 1..=a.rounds.max(1) {
        let order = if round % 2 == 1 {
            [Rpc::Check, Rpc::Health]
        } else {
            [Rpc::Health, Rpc::Check]
        };
        for rpc in order.into_iter().filter(|r| wanted(r)) {
            eprintln!("  running: round {round}, {}", rpc.name());
            legs.push(leg(&channels, concurrency, duration, rpc, &keys, round).await);
        }
    }
    println!(
        "\n### ceiling: {concurrency} clients, {connections} connections, {} key(s), {} s per leg\n",
        keys.len(),
        duration.as_secs_f64()
    );
    print!("{}", legs_table(&legs, concurrency, connections));
    if a.only.is_none() {
        println!();
        // A target's own CPU is "other procs" here, so the disturbance warning means
        // nothing with one.
        print!("{}", ratio_lines(&legs, a.target.is_none()));
    }
    env.stop().await;
    Ok(())
}

/// `concurrency` closed-loop clients calling `rpc` until `duration` has passed.
async fn leg(
    channels: &[Channel],
    concurrency: usize,
    duration: Duration,
    rpc: Rpc,
    keys: &Arc<Vec<String>>,
    round: usize,
) -> Leg {
    let load_before = report::load1();
    let cpu = CpuSampler::start();
    let own_before = own_cpu_secs();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        let channel = channels[i % channels.len()].clone();
        let keys = keys.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(16_384);
            let mut errors = 0u64;
            let mut n = i;
            match rpc {
                Rpc::Check => {
                    let mut client = RateLimiterClient::new(channel);
                    while started.elapsed() < duration {
                        let req = CheckRequest {
                            key: keys[n % keys.len()].clone(),
                            limit: "bench".into(),
                            cost: 1,
                        };
                        n += concurrency;
                        let sent = Instant::now();
                        match client.check(req).await {
                            Ok(_) => lat.push(elapsed_ns(sent)),
                            Err(_) => errors += 1,
                        }
                    }
                }
                Rpc::Health => {
                    let mut client = tonic::client::Grpc::new(channel);
                    while started.elapsed() < duration {
                        let sent = Instant::now();
                        match health_check(&mut client).await {
                            Ok(_) => lat.push(elapsed_ns(sent)),
                            Err(_) => errors += 1,
                        }
                    }
                }
            }
            (lat, errors)
        }));
    }
    let mut sorted_ns = Vec::new();
    let mut errors = 0;
    for t in tasks {
        match t.await {
            Ok((lat, e)) => {
                sorted_ns.extend(lat);
                errors += e;
            }
            Err(_) => errors += 1,
        }
    }
    let elapsed = started.elapsed();
    let own_cpu = own_before.zip(own_cpu_secs()).map(|(a, b)| b - a);
    sorted_ns.sort_unstable();
    Leg {
        round,
        rpc,
        elapsed,
        sorted_ns,
        errors,
        own_cpu,
        load: (load_before, report::load1()),
        foreign_cores: cpu.foreign_cores(),
    }
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

fn pct(sorted: &[u64], p: f64) -> String {
    percentile(sorted, p).map_or_else(|| "–".into(), report::fmt_ns)
}

fn legs_table(legs: &[Leg], clients: usize, conns: usize) -> String {
    let mut t = String::from(
        "| round | rpc | clients | conns | calls | secs | calls/s | own CPU s | calls per CPU-s | p50 | p99 | p99.9 | max | errors | load 1m start→end / other procs (cores) |\n\
         |--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n",
    );
    for l in legs {
        let foreign = l
            .foreign_cores
            .map_or_else(|| "?".into(), |c| format!("{c:.2}"));
        let _ = writeln!(
            t,
            "| {} | {} | {clients} | {conns} | {} | {:.2} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {:.2}→{:.2} / {foreign} |",
            l.round,
            l.rpc.name(),
            l.sorted_ns.len(),
            l.elapsed.as_secs_f64(),
            l.rate(),
            l.own_cpu.map_or_else(|| "?".into(), |c| format!("{c:.2}")),
            l.own_cpu
                .filter(|c| *c > 0.0)
                .map_or_else(|| "?".into(), |c| format!("{:.0}", l.calls() / c)),
            pct(&l.sorted_ns, 50.0),
            pct(&l.sorted_ns, 99.0),
            pct(&l.sorted_ns, 99.9),
            pct(&l.sorted_ns, 100.0),
            l.errors,
            l.load.0,
            l.load.1,
        );
    }
    t
}

/// Check's rate over Health/Check's, per round and over all rounds: by wall clock
/// (calls over elapsed time) and by CPU (calls over this process's CPU time).
fn ratio_lines(legs: &[Leg], warn_foreign: bool) -> String {
    let mut t = String::new();
    let rounds = legs.iter().map(|l| l.round).max().unwrap_or(0);
    // (calls, elapsed seconds, own CPU seconds) of `rpc`'s legs accepted by `pick`.
    let sums = |rpc: Rpc, pick: &dyn Fn(&Leg) -> bool| -> (f64, f64, f64) {
        legs.iter()
            .filter(|l| l.rpc == rpc && pick(l))
            .fold((0.0, 0.0, 0.0), |(n, s, c), l| {
                (
                    n + l.calls(),
                    s + l.elapsed.as_secs_f64(),
                    c + l.own_cpu.unwrap_or(f64::NAN),
                )
            })
    };
    let ratio = |pick: &dyn Fn(&Leg) -> bool| -> (f64, f64) {
        let (cn, cs, cc) = sums(Rpc::Check, pick);
        let (hn, hs, hc) = sums(Rpc::Health, pick);
        ((cn / cs) / (hn / hs), (cn / cc) / (hn / hc))
    };
    let per_round: Vec<String> = (1..=rounds)
        .map(|r| {
            let (wall, cpu) = ratio(&|l| l.round == r);
            format!("{wall:.3} / {cpu:.3}")
        })
        .collect();
    let (wall, cpu) = ratio(&|_| true);
    let _ = writeln!(
        t,
        "- Check / Health/Check over all rounds: **{wall:.3}** by calls per second, **{cpu:.3}** by calls per CPU-second; per round (wall / CPU): {}",
        per_round.join(", ")
    );
    let disturbed: Vec<String> = legs
        .iter()
        .filter(|l| {
            l.foreign_cores
                .is_some_and(|c| c > report::FOREIGN_CPU_WARN)
        })
        .map(|l| format!("round {} {}", l.round, l.rpc.name()))
        .collect();
    if warn_foreign && !disturbed.is_empty() {
        let _ = writeln!(
            t,
            "\nWARNING: other processes used more than {} cores during: {}; re-run these.",
            report::FOREIGN_CPU_WARN,
            disturbed.join(", ")
        );
    }
    t
}

/// `Health/Check` as tonic-health's generated client sends it, but through the codec the
/// `RateLimiter` client uses (`ratelimit::codec`), so the clients of the two legs do the
/// same work and only the servers' differ. (tonic-health's own client would encode and
/// decode through `ProstCodec`, costing this process more per Health call than per Check.)
async fn health_check(
    client: &mut tonic::client::Grpc<Channel>,
) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("not ready: {e}")))?;
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    req.extensions_mut()
        .insert(tonic::GrpcMethod::new("grpc.health.v1.Health", "Check"));
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check");
    let codec: SliceCodec<HealthCheckRequest, HealthCheckResponse> = SliceCodec::default();
    client.unary(req, path, codec).await
}
