//! Scenario (f): the Redis store beside the memory and RTDB stores, in one run.
//!
//! One and three in-process instances, the same clients and keys as the memory (§1) and
//! three-instance RTDB (§4) rows, each store in turn; the RTDB store over the in-process
//! emulator with no added latency, Redis on one local `redis-server` (started here on a
//! free loopback port with `--save '' --appendonly no`, or `--redis-url`). Redis commands
//! per check come from `INFO commandstats` around each measured run: `EVALSHA` calls
//! (round trips) and the commands the scripts ran (`GET`, `SET`).

use crate::engine::{self, Env, EnvSpec, RunResult, RunSpec, StoreKind};
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct RedisArgs {
    /// Load this server instead of starting a redis-server on a free loopback port.
    #[arg(long)]
    redis_url: Option<String>,
    /// Measured time per throughput run (each after a 1 s warm-up on other keys).
    #[arg(long, value_parser = ratelimit::config::parse_duration, default_value = "4s")]
    duration: Duration,
}

/// An instance's Redis store, as `config::build_store` makes it (one connection each, as
/// separate processes would have).
pub fn store(
    url: Option<&str>,
    store_timeout: Duration,
    clock: &ratelimit::clock::SharedClock,
) -> Result<std::sync::Arc<dyn ratelimit::store::CounterStore>, String> {
    let url = url.ok_or("--store redis needs --redis-url")?;
    let options = ratelimit::store::redis::RedisOptions {
        response_timeout: store_timeout.max(Duration::from_secs(1)) * 2,
        ..Default::default()
    };
    let store = ratelimit::store::redis::RedisStore::new(url, options, clock.clone())
        .map_err(|e| format!("redis store: {e}"))?;
    Ok(std::sync::Arc::new(store))
}

/// A `redis-server` this run started; killed when dropped.
struct LocalRedis(Child);

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_local() -> Result<(LocalRedis, String), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("free port: {e}"))?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("redis-server: {e} (apt-get install redis-server)"))?;
    let server = LocalRedis(child);
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..100 {
        if info(&url, "server").await.is_ok() {
            return Ok((server, url));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("redis-server on port {port} did not come up"))
}

async fn info(url: &str, section: &str) -> Result<String, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut c)
        .await
        .map_err(|e| e.to_string())
}

/// `calls` per command from `INFO commandstats`.
async fn command_calls(url: &str) -> Result<HashMap<String, u64>, String> {
    let text = info(url, "commandstats").await?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect())
}

struct Counted {
    label: String,
    checks: u64,
    calls: HashMap<String, u64>,
}

pub async fn run(a: RedisArgs) -> Result<(), String> {
    let (_server, url) = match a.redis_url.clone() {
        Some(u) => (None, u),
        None => {
            let (s, u) = start_local().await?;
            (Some(s), u)
        }
    };
    let version = info(&url, "server")
        .await?
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:").map(str::to_owned))
        .unwrap_or_default();
    println!(
        "system: redis-server {version} on loopback; RTDB emulator +0 ms; in-process instances"
    );
    let shapes_1: &[(usize, usize)] = &[(1, 16), (10_000, 64)];
    let shapes_3: &[(usize, usize)] = &[(1_000, 48), (1, 48)];
    let mut runs: Vec<RunResult> = Vec::new();
    let mut counted = Vec::new();
    for (instances, shapes) in [(1, shapes_1), (3, shapes_3)] {
        for store in [StoreKind::Memory, StoreKind::Emulator, StoreKind::Redis] {
            if instances > 1 && store == StoreKind::Memory {
                continue; // not shared: three memory stores are three limits
            }
            let env = Env::start(&EnvSpec {
                store,
                instances,
                redis_url: Some(url.clone()),
                ..EnvSpec::default()
            })
            .await?;
            let name = match store {
                StoreKind::Memory => "memory",
                StoreKind::Emulator => "rtdb (emulator +0 ms)",
                StoreKind::Redis => "redis",
            };
            let mut specs = Vec::new();
            for &(keys, clients) in shapes {
                let mut s = RunSpec::new(
                    &format!("{name}, {instances} inst., {keys} key(s), {clients} clients"),
                    clients,
                    keys,
                    "bench",
                );
                s.duration = a.duration;
                specs.push(s);
            }
            if instances > 1 && store == StoreKind::Redis {
                let mut exact = RunSpec::new(
                    &format!("{name}, {instances} inst., one key, 120/min, 900 checks, 48 clients"),
                    48,
                    1,
                    "mcp",
                );
                exact.requests = 900;
                exact.duration = Duration::from_secs(30);
                exact.fresh_window = Some(Duration::from_secs(20));
                specs.push(exact);
            }
            for spec in specs {
                // Warm-up (connections, script load) outside the counted commands.
                let mut warm = RunSpec::new("warm-up", spec.concurrency, 100, "bench");
                warm.duration = Duration::from_secs(1);
                engine::drive(&env, &warm).await?;
                eprintln!("  running: {}", spec.label);
                let before = command_calls(&url).await?;
                let r = engine::drive(&env, &spec).await?;
                let after = command_calls(&url).await?;
                if store == StoreKind::Redis {
                    let calls = after
                        .iter()
                        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
                        .filter(|(_, v)| *v > 0)
                        .collect();
                    counted.push(Counted {
                        label: r.spec.label.clone(),
                        checks: r.checks(),
                        calls,
                    });
                }
                runs.push(r);
            }
            env.stop().await;
        }
    }
    crate::print_runs("(f) memory, RTDB and Redis side by side", &runs, false);
    println!("\n### (f) Redis commands per check (INFO commandstats, measured phase only)\n");
    println!(
        "| run | checks | EVALSHA | EVALSHA per check | GET / SET inside the script | other commands |"
    );
    println!("|---|--:|--:|--:|---|---|");
    for c in counted {
        let n = |k: &str| c.calls.get(k).copied().unwrap_or(0);
        let mut other: Vec<String> = c
            .calls
            .iter()
            .filter(|(k, _)| !["evalsha", "get", "set", "info"].contains(&k.as_str()))
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        other.sort();
        println!(
            "| {} | {} | {} | {:.3} | {} / {} | {} |",
            c.label,
            c.checks,
            n("evalsha"),
            n("evalsha") as f64 / c.checks.max(1) as f64,
            n("get"),
            n("set"),
            if other.is_empty() {
                "none".to_owned()
            } else {
                other.join(", ")
            }
        );
    }
    Ok(())
}
