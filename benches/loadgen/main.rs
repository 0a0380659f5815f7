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
mod leases;
mod redis_bench;
mod report;

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
    Memory(MemoryArgs),
    /// Scenario (b): emulator with added latency; store requests per check (sequential,
    /// 64-way hot key, cold keys, exhausting and exhausted keys) against a read + write per check.
    StoreTrips(LatencyArgs),
    /// Scenario (c): emulator answering after 3 s; latency of the first checks, with the
    /// breaker open, and after the store comes back.
    Outage(OutageArgs),
    /// Scenario (d): 3 instances on one emulator; throughput and the exact admitted count.
    Instances(InstancesArgs),
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

#[derive(Debug, Clone, Args)]
struct MemoryArgs {
    /// Measured time per run.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    duration: Duration,
    /// Warm-up per run (other keys, not counted).
    #[arg(long, value_parser = parse_duration_or_zero, default_value = "1s")]
    warmup: Duration,
    /// Cap on checks per run.
    #[arg(long, default_value_t = 2_000_000)]
    requests: u64,
    /// Servers accept with Nagle on (TCP_NODELAY off), as before BENCHMARKS.md §7.
    #[arg(long)]
    server_nagle: bool,
}

#[derive(Debug, Clone, Args)]
struct LatencyArgs {
    /// Latency the emulator adds to every request.
    #[arg(long, value_parser = parse_duration_or_zero, default_value = "5ms")]
    emulator_latency: Duration,
}

#[derive(Debug, Clone, Args)]
struct OutageArgs {
    /// Latency the emulator adds to every request during the outage.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    emulator_latency: Duration,
    /// Length of the outage run.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

#[derive(Debug, Clone, Args)]
struct InstancesArgs {
    /// Latency the emulator adds to every request.
    #[arg(long, value_parser = parse_duration_or_zero, default_value = "5ms")]
    emulator_latency: Duration,
    /// Service instances on the one emulator.
    #[arg(long, default_value_t = 3)]
    instances: usize,
    /// Measured time of the throughput runs.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
}

fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
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
    let runtime = match ratelimit::server::runtime() {
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
        Command::Memory(a) => memory(a).await,
        Command::StoreTrips(a) => store_trips(a).await,
        Command::Outage(a) => outage(a).await,
        Command::Instances(a) => instances(a).await,
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

async fn run_all(env: &Env, specs: Vec<RunSpec>) -> Result<Vec<RunResult>, String> {
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

/// (a) The memory store: pure service throughput and latency (nothing is denied).
async fn memory(a: MemoryArgs) -> Result<(), String> {
    let env = Env::start(&EnvSpec {
        server_nagle: a.server_nagle,
        ..EnvSpec::default()
    })
    .await?;
    println!("system: {}", env.description);
    let mut specs = Vec::new();
    for keys in [1, 10_000] {
        for clients in [1, 16, 64] {
            let label = format!(
                "{} key{}, {clients} client{}",
                if keys == 1 {
                    "1".into()
                } else {
                    "10,000".to_owned()
                },
                if keys == 1 { "" } else { "s" },
                if clients == 1 { "" } else { "s" }
            );
            let mut s = RunSpec::new(&label, clients, keys, "bench");
            s.duration = a.duration;
            s.warmup = a.warmup;
            s.requests = a.requests;
            specs.push(s);
        }
    }
    let runs = run_all(&env, specs).await?;
    print_runs("(a) memory store", &runs, false);
    env.stop().await;
    Ok(())
}

/// (b) Store requests per check against the emulator.
async fn store_trips(a: LatencyArgs) -> Result<(), String> {
    let env = Env::start(&EnvSpec {
        store: StoreKind::Emulator,
        emulator_latency: a.emulator_latency,
        ..EnvSpec::default()
    })
    .await?;
    println!("system: {}", env.description);
    let bounded = |mut s: RunSpec, requests: u64| {
        s.requests = requests;
        s.duration = Duration::from_secs(60);
        s
    };
    let exhausted_prefix = engine::unique_prefix();
    let mut exhausting = bounded(
        RunSpec::new(
            "exhausting one key: 1,000 sequential (mcp 120/min)",
            1,
            1,
            "mcp",
        ),
        1_000,
    );
    exhausting.key_prefix = exhausted_prefix.clone();
    // Room for this run and the next in the same window.
    exhausting.fresh_window = Some(Duration::from_secs(30));
    let mut exhausted = bounded(
        RunSpec::new(
            "the same exhausted key: 10,000 more, 64 clients",
            64,
            1,
            "mcp",
        ),
        10_000,
    );
    exhausted.key_prefix = exhausted_prefix;
    let specs = vec![
        bounded(
            RunSpec::new("one key, 500 sequential checks", 1, 1, "bench"),
            500,
        ),
        bounded(
            RunSpec::new("one hot key, 64 clients, 5,000 checks", 64, 1, "bench"),
            5_000,
        ),
        bounded(
            RunSpec::new(
                "1,000 cold keys, each checked twice, 16 clients",
                16,
                1_000,
                "bench",
            ),
            2_000,
        ),
        exhausting,
        exhausted,
    ];
    let runs = run_all(&env, specs).await?;
    print_runs(
        &format!(
            "(b) store round trips, emulator +{} ms per request",
            a.emulator_latency.as_millis()
        ),
        &runs,
        true,
    );
    env.stop().await;
    Ok(())
}

/// (c) The store answers after 3 s: budget, breaker, recovery.
async fn outage(a: OutageArgs) -> Result<(), String> {
    let env = Env::start(&EnvSpec {
        store: StoreKind::Emulator,
        emulator_latency: a.emulator_latency,
        ..EnvSpec::default()
    })
    .await?;
    println!("system: {}", env.description);
    let mut down = RunSpec::new(
        &format!(
            "store answering after {:?}, {} clients, 1,000 keys",
            a.emulator_latency, a.concurrency
        ),
        a.concurrency,
        1_000,
        "bench",
    );
    down.duration = a.duration;
    down.requests = 2_000_000;
    down.slice = Some(Duration::from_secs(1));
    let runs = run_all(&env, vec![down]).await?;
    print_runs("(c) outage", &runs, true);
    if let Some(r) = runs.first() {
        println!();
        print!("{}", report::slice_table(r));
        println!();
        println!("{}", report::first_checks_line(r, a.concurrency));
    }

    // The store comes back (+5 ms): how soon decisions are shared again.
    env.set_emulator_latency(Duration::from_millis(5));
    let mut back = RunSpec::new(
        &format!("store back (+5 ms), {} clients, 1,000 keys", a.concurrency),
        a.concurrency,
        1_000,
        "bench",
    );
    back.duration = Duration::from_secs(5);
    back.requests = 2_000_000;
    back.slice = Some(Duration::from_millis(500));
    let runs = run_all(&env, vec![back]).await?;
    print_runs("(c) recovery", &runs, true);
    if let Some(r) = runs.first() {
        println!();
        print!("{}", report::slice_table(r));
    }
    env.stop().await;
    Ok(())
}

/// (d) Several instances on one emulator.
async fn instances(a: InstancesArgs) -> Result<(), String> {
    let n = a.instances.max(1);
    let env = Env::start(&EnvSpec {
        store: StoreKind::Emulator,
        emulator_latency: a.emulator_latency,
        instances: n,
        ..EnvSpec::default()
    })
    .await?;
    println!("system: {}", env.description);
    let clients = 16 * n;
    let mut many = RunSpec::new(
        &format!("{n} instances, 1,000 keys, {clients} clients"),
        clients,
        1_000,
        "bench",
    );
    many.duration = a.duration;
    let mut hot = RunSpec::new(
        &format!("{n} instances, one hot key, {clients} clients"),
        clients,
        1,
        "bench",
    );
    hot.duration = a.duration;
    let mut specs = vec![many, hot];
    // Exactness: 900 checks of one fresh key at 120/min, from many and from few clients
    // (few clients race harder per check: see BENCHMARKS.md).
    for c in [clients, n] {
        let mut exact = RunSpec::new(
            &format!("{n} instances, one key, 120/min, 900 checks, {c} clients"),
            c,
            1,
            "mcp",
        );
        exact.requests = 900;
        exact.duration = Duration::from_secs(30);
        exact.fresh_window = Some(Duration::from_secs(20));
        specs.push(exact);
    }
    let runs = run_all(&env, specs).await?;
    print_runs(
        &format!(
            "(d) {n} instances on one emulator (+{} ms per request)",
            a.emulator_latency.as_millis()
        ),
        &runs,
        true,
    );
    env.stop().await;
    Ok(())
}
