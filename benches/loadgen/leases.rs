//! Scenario (e): quota leases (DESIGN §9), measured with leasing on and off side by side
//! in one command, so the gain is a ratio from one run on one (noisy) machine.
//!
//! - a hot key on 16 instances sharing one emulator at +60 ms, limit `bench` (nothing
//!   denied): store writes per admitted check and decision latency;
//! - 1,000 keys on 3 instances: what leasing does (and does not do) for spread load;
//! - exactness: 900 checks of one `mcp` key (120/min) on the 16 instances.

use crate::engine::{Env, EnvSpec, RunResult, RunSpec, StoreKind};
use crate::print_runs;
use clap::Args;
use ratelimit::config::parse_duration;
use ratelimit::limiter::LeaseOptions;
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub struct LeaseArgs {
    /// Latency the emulator adds to every request.
    #[arg(long, value_parser = parse_duration, default_value = "60ms")]
    emulator_latency: Duration,
    /// Instances racing on the hot key.
    #[arg(long, default_value_t = 16)]
    instances: usize,
    /// Clients per instance.
    #[arg(long, default_value_t = 4)]
    clients_per_instance: usize,
    /// Measured time of each throughput run.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
}

/// Runs every part with leases on, then off, and prints them side by side.
pub async fn leases(a: LeaseArgs) -> Result<(), String> {
    let n = a.instances.max(1);
    let modes = [
        ("leases on", LeaseOptions::default()),
        ("leases off", LeaseOptions::OFF),
    ];
    let mut hot = Vec::new();
    let mut spread = Vec::new();
    for (mode, lease) in modes {
        let env = start(n, a.emulator_latency, lease).await?;
        println!("system ({mode}): {}", env.description);
        let clients = a.clients_per_instance * n;
        let mut run = RunSpec::new(
            &format!("{mode}: {n} instances, one hot key, {clients} clients"),
            clients,
            1,
            "bench",
        );
        run.duration = a.duration;
        let mut exact = RunSpec::new(
            &format!("{mode}: {n} instances, one key, 120/min, 900 checks, {clients} clients"),
            clients,
            1,
            "mcp",
        );
        exact.requests = 900;
        exact.duration = Duration::from_secs(30);
        exact.fresh_window = Some(Duration::from_secs(20));
        hot.extend(drive(&env, vec![run, exact]).await?);
        env.stop().await;

        let env = start(3, a.emulator_latency, lease).await?;
        let mut many = RunSpec::new(
            &format!("{mode}: 3 instances, 1,000 keys, 48 clients"),
            48,
            1_000,
            "bench",
        );
        many.duration = a.duration;
        spread.extend(drive(&env, vec![many]).await?);
        env.stop().await;
    }
    print_runs(
        &format!(
            "(e) quota leases: {n} instances on one emulator (+{} ms per request)",
            a.emulator_latency.as_millis()
        ),
        &hot,
        true,
    );
    print_runs("(e) quota leases: 1,000 keys on 3 instances", &spread, true);
    Ok(())
}

async fn start(instances: usize, latency: Duration, lease: LeaseOptions) -> Result<Env, String> {
    Env::start(&EnvSpec {
        store: StoreKind::Emulator,
        emulator_latency: latency,
        instances,
        lease,
        ..EnvSpec::default()
    })
    .await
}

async fn drive(env: &Env, specs: Vec<RunSpec>) -> Result<Vec<RunResult>, String> {
    let mut out = Vec::new();
    for spec in specs {
        eprintln!("  running: {}", spec.label);
        out.push(crate::engine::drive(env, &spec).await?);
    }
    Ok(out)
}
