//! Scenarios (a)–(d) of BENCHMARKS.md §1–§4: the memory store, RTDB requests per check,
//! an outage, and several instances on one emulator. One subcommand each (`main.rs`).

use crate::engine::{Env, EnvSpec, RunSpec, StoreKind};
use crate::{parse_duration_or_zero, print_runs, report, run_all};
use clap::Args;
use ratelimit::config::parse_duration;
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub(crate) struct MemoryArgs {
    /// Measured time per run.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub(crate) duration: Duration,
    /// Warm-up per run (other keys, not counted).
    #[arg(long, value_parser = parse_duration_or_zero, default_value = "1s")]
    pub(crate) warmup: Duration,
    /// Cap on checks per run.
    #[arg(long, default_value_t = 2_000_000)]
    pub(crate) requests: u64,
    /// Servers accept with Nagle on (TCP_NODELAY off), as before BENCHMARKS.md §7.
    #[arg(long)]
    pub(crate) server_nagle: bool,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct LatencyArgs {
    /// Latency the emulator adds to every request.
    #[arg(long, value_parser = parse_duration_or_zero, default_value = "5ms")]
    pub(crate) emulator_latency: Duration,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct OutageArgs {
    /// Latency the emulator adds to every request during the outage.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    pub(crate) emulator_latency: Duration,
    /// Length of the outage run.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub(crate) duration: Duration,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    pub(crate) concurrency: usize,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct InstancesArgs {
    /// Latency the emulator adds to every request.
    #[arg(long, value_parser = parse_duration_or_zero, default_value = "5ms")]
    pub(crate) emulator_latency: Duration,
    /// Service instances on the one emulator.
    #[arg(long, default_value_t = 3)]
    pub(crate) instances: usize,
    /// Measured time of the throughput runs.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub(crate) duration: Duration,
}

/// (a) The memory store: pure service throughput and latency (nothing is denied).
pub(crate) async fn memory(a: MemoryArgs) -> Result<(), String> {
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
pub(crate) async fn store_trips(a: LatencyArgs) -> Result<(), String> {
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
    let exhausted_prefix = crate::engine::unique_prefix();
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
pub(crate) async fn outage(a: OutageArgs) -> Result<(), String> {
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
pub(crate) async fn instances(a: InstancesArgs) -> Result<(), String> {
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
