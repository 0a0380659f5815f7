//! The load generator (`cargo bench --bench loadgen -- <command> [flags]`): N concurrent
//! gRPC clients over M keys against the rate-decision service, bounded by a request
//! count and a duration, reporting throughput, latency percentiles, allowed / denied /
//! unshared counts and, against an RTDB emulator, emulator requests per check.
//!
//! It owns the benchmark *scenarios* of BENCHMARKS.md (one subcommand each, so each is a
//! single reproducible command) and the generic `run` for anything else. The engine is
//! `engine.rs`, the tables `report.rs`. It is a bench target with `harness = false`, not a
//! test: it measures, it asserts nothing.
//!
//! Clients: `RateLimiterClient`s over a few shared tonic channels, one HTTP/2 connection
//! each (default `min(clients, 4 × instances)`), the calls multiplexed as streams.

mod ceiling;
mod engine;
mod env;
mod leases;
mod redis_bench;
mod report;
mod scenarios;

use clap::{Args, Parser, Subcommand};
use engine::{Env, EnvSpec, RunResult, RunSpec, StoreKind};
use ratelimit::breaker::BreakerConfig;
use ratelimit::config::parse_duration;
use ratelimit::limiter::LeaseOptions;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    about = "Load generator for the rate-decision service (see BENCHMARKS.md)",
    after_help = "Run through cargo: cargo bench --bench loadgen -- <command> [flags]"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log the in-process service to stderr with this filter (e.g. `warn`: fallback
    /// reasons, breaker transitions). Off by default: logging is not what is measured.
    #[arg(long, global = true)]
    log: Option<String>,
    /// Install the Prometheus recorder (as `ratelimit serve --metrics-listen` does) on
    /// this loopback address, e.g. 127.0.0.1:0, so in-process instances pay for their
    /// metrics as a production instance with metrics on does.
    #[arg(long, global = true)]
    metrics: Option<std::net::SocketAddr>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One run with the given parameters.
    Run(Box<RunArgs>),
    /// Scenario (a): memory store; 1 key and 10,000 keys × 1, 16 and 64 clients.
    Memory(scenarios::MemoryArgs),
    /// Scenario (b): emulator with added latency; store requests per check (sequential,
    /// 64-way hot key, cold keys, exhausting and exhausted keys) against a read + write per check.
    StoreTrips(scenarios::LatencyArgs),
    /// Scenario (c): emulator answering after 3 s; latency of the first checks, with the
    /// breaker open, and after the store comes back.
    Outage(scenarios::OutageArgs),
    /// Scenario (d): 3 instances on one emulator; throughput and the exact admitted count.
    Instances(scenarios::InstancesArgs),
    /// Scenario (e): quota leases on and off: a hot key on 16 instances at +60 ms, and
    /// 1,000 keys on 3 instances; writes per admitted check, latency, exactness.
    Leases(leases::LeaseArgs),
    /// Scenario (f): memory, RTDB (emulator) and Redis side by side, 1 and 3 instances;
    /// Redis commands per check from INFO commandstats.
    Redis(redis_bench::RedisArgs),
    /// Check against the same server's grpc.health.v1 Health/Check, same clients,
    /// interleaved rounds: the share of the stack's own ceiling a decision leaves.
    Ceiling(ceiling::CeilingArgs),
}

#[derive(Debug, Clone, Args)]
struct RunArgs {
    /// Service URL(s) to load (`http://host:port`, repeatable); without it, instances are
    /// started in this process.
    #[arg(long = "target")]
    targets: Vec<String>,
    /// With --target: base URL of the RTDB emulator the service uses (`http://host:port`),
    /// to report its requests per check.
    #[arg(long)]
    emulator_control: Option<String>,
    /// In-process store.
    #[arg(long, value_enum, default_value = "memory")]
    store: StoreKind,
    /// With --store redis: the server's URL (redis://127.0.0.1:6379).
    #[arg(long)]
    redis_url: Option<String>,
    /// In-process service instances (all on one emulator with --store emulator).
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Latency the in-process emulator adds to every request.
    #[arg(long, value_parser = parse_duration_or_zero, default_value = "0ms")]
    emulator_latency: Duration,
    /// In-process limiter: store budget per decision.
    #[arg(long, value_parser = parse_duration, default_value = "1.5s")]
    store_timeout: Duration,
    /// In-process limiter: consecutive store failures that open the breaker.
    #[arg(long, default_value_t = 5)]
    breaker_failures: u32,
    /// In-process limiter: breaker cool-down.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    breaker_cooldown: Duration,
    /// In-process limiter: most hits one quota lease reserves (0: leases off).
    #[arg(long, default_value_t = LeaseOptions::default().max_hits)]
    lease_max_hits: u32,
    /// Concurrent client tasks (each has one check in flight at a time).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// HTTP/2 connections shared by the clients (0: min(concurrency, 4 × instances)).
    #[arg(long, default_value_t = 0)]
    connections: usize,
    /// Distinct keys; check n uses key n mod keys.
    #[arg(long, default_value_t = 1)]
    keys: usize,
    /// Key prefix (keys are PREFIX-i); default: unique per run, so counters start empty.
    #[arg(long)]
    key_prefix: Option<String>,
    /// Limit name; in-process `bench` (10^9/min, nothing denied) or `mcp` (120/min).
    /// Default: `bench` in-process, the server's default limit with --target.
    #[arg(long)]
    limit: Option<String>,
    /// Cost of each check.
    #[arg(long, default_value_t = 1)]
    cost: u32,
    /// Stop after this many checks (at most 5,000,000)...
    #[arg(long, default_value_t = 1_000_000)]
    requests: u64,
    /// ...or after this long (at most 10 min), whichever comes first.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
    /// Warm-up on other keys before measuring (not counted).
    #[arg(long, value_parser = parse_duration_or_zero, default_value = "0s")]
    warmup: Duration,
    /// gRPC deadline sent with each check (grpc-timeout); default none.
    #[arg(long, value_parser = parse_duration)]
    grpc_timeout: Option<Duration>,
    /// Wait until at least this much of the current 60 s window is left.
    #[arg(long, value_parser = parse_duration)]
    fresh_window: Option<Duration>,
    /// Also report latency per slice of this length.
    #[arg(long, value_parser = parse_duration)]
    slice: Option<Duration>,
    /// Name of the run in the tables.
    #[arg(long, default_value = "run")]
    label: String,
    /// In-process servers accept with Nagle on (TCP_NODELAY off), as before
    /// BENCHMARKS.md §7.
    #[arg(long)]
    server_nagle: bool,
}

pub(crate) fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    match s.trim() {
        "0" | "0s" | "0ms" => Ok(Duration::ZERO),
        other => parse_duration(other),
    }
}

fn main() -> std::process::ExitCode {
    // `cargo bench` appends `--bench`; `cargo test --benches` passes nothing. Without a
    // command there is nothing to measure: print the usage and succeed, so neither
    // `cargo bench` (all benches) nor `cargo test --all-targets` runs a long load.
    let args: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    if args.len() <= 1 {
        println!("loadgen: no command given; nothing to measure.");
        println!(
            "usage: cargo bench --bench loadgen -- <run|memory|store-trips|outage|instances|leases|redis|ceiling> [flags]"
        );
        println!("       cargo bench --bench loadgen -- help");
        return std::process::ExitCode::SUCCESS;
    }
    let cli = Cli::parse_from(&args);
    if let Some(filter) = &cli.log {
        ratelimit::logging::init(ratelimit::logging::LogFormat::Text, filter);
    }
    let command_line = format!("cargo bench --bench loadgen -- {}", args[1..].join(" "));
    // In-process instances run as the binary does: `--workers`' default of one thread,
    // here shared with the clients. RATELIMIT_WORKERS=0 gives one worker per core (the
    // harness of BENCHMARKS.md §1–§11), N a multi-thread runtime of N workers.
    let workers = std::env::var("RATELIMIT_WORKERS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1);
    let runtime = match ratelimit::server::runtime(workers) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadgen: cannot start the tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(cli.command, cli.metrics, &command_line)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn execute(
    command: Command,
    metrics: Option<std::net::SocketAddr>,
    command_line: &str,
) -> Result<(), String> {
    println!("$ {command_line}");
    println!("{}", report::machine());
    if let Some(addr) = metrics {
        let bound = ratelimit::metrics::serve(addr)
            .await
            .map_err(|e| format!("metrics: {e}"))?;
        println!("metrics: Prometheus recorder installed, http://{bound}/metrics");
    }
    match command {
        Command::Run(a) => run(*a).await,
        Command::Memory(a) => scenarios::memory(a).await,
        Command::StoreTrips(a) => scenarios::store_trips(a).await,
        Command::Outage(a) => scenarios::outage(a).await,
        Command::Instances(a) => scenarios::instances(a).await,
        Command::Leases(a) => leases::leases(a).await,
        Command::Redis(a) => redis_bench::run(a).await,
        Command::Ceiling(a) => ceiling::ceiling(a).await,
    }
}

/// Prints what every scenario prints: the tables, then any disturbance warning.
pub(crate) fn print_runs(title: &str, runs: &[RunResult], with_store: bool) {
    println!("\n### {title}\n");
    print!("{}", report::throughput_table(runs));
    if with_store {
        println!();
        print!("{}", report::store_table(runs));
    }
    println!();
    print!("{}", report::admitted_lines(runs));
    if let Some(w) = report::disturbance(runs) {
        println!("\n{w}");
    }
}

pub(crate) async fn run_all(env: &Env, specs: Vec<RunSpec>) -> Result<Vec<RunResult>, String> {
    let mut out = Vec::with_capacity(specs.len());
    for spec in specs {
        eprintln!("  running: {}", spec.label);
        out.push(engine::drive(env, &spec).await?);
    }
    Ok(out)
}

async fn run(a: RunArgs) -> Result<(), String> {
    let env = Env::start(&EnvSpec {
        targets: a.targets.clone(),
        emulator_control: a.emulator_control.clone(),
        store: a.store,
        redis_url: a.redis_url.clone(),
        instances: a.instances,
        emulator_latency: a.emulator_latency,
        store_timeout: a.store_timeout,
        breaker: BreakerConfig {
            failures: a.breaker_failures.max(1),
            cooldown: a.breaker_cooldown,
        },
        lease: LeaseOptions {
            max_hits: a.lease_max_hits,
            ..LeaseOptions::default()
        },
        server_nagle: a.server_nagle,
    })
    .await?;
    println!("system: {}", env.description);
    let default_limit = if a.targets.is_empty() { "bench" } else { "" };
    let mut spec = RunSpec::new(
        &a.label,
        a.concurrency,
        a.keys,
        a.limit.as_deref().unwrap_or(default_limit),
    );
    spec.connections = a.connections;
    if let Some(p) = a.key_prefix {
        spec.key_prefix = p;
    }
    spec.cost = a.cost;
    spec.requests = a.requests;
    spec.duration = a.duration;
    spec.warmup = a.warmup;
    spec.grpc_timeout = a.grpc_timeout;
    spec.fresh_window = a.fresh_window;
    spec.slice = a.slice;
    let runs = run_all(&env, vec![spec]).await?;
    print_runs("run", &runs, env.has_emulator());
    if let Some(r) = runs.first().filter(|r| r.spec.slice.is_some()) {
        println!();
        print!("{}", report::slice_table(r));
        println!("{}", report::first_checks_line(r, r.spec.concurrency));
    }
    env.stop().await;
    Ok(())
}
