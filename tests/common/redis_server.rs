//! A real `redis-server` per test, on a free loopback port, with no persistence
//! (`--save '' --appendonly no`), killed when dropped; plus service instances on it and
//! the admin commands the tests inspect it with (`INFO commandstats`, `PTTL`, `GET`).

use super::*;
use ratelimit::store::redis::{RedisOptions, RedisStore};
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    extra: Vec<String>,
    /// The password the admin connection authenticates with, if the server wants one.
    pub admin_password: Option<String>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

impl RedisServer {
    /// A fresh server; `extra` are more `redis-server` flags (e.g. `--requirepass x`).
    pub async fn start(extra: &[&str]) -> RedisServer {
        let admin_password = extra
            .iter()
            .position(|a| *a == "--requirepass")
            .and_then(|i| extra.get(i + 1))
            .map(|p| p.to_string());
        let mut server = RedisServer {
            child: None,
            port: free_port(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            admin_password,
        };
        server.spawn().await;
        server
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
            .args(["--enable-debug-command", "local"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (.ci/run installs the Debian package)");
        self.child = Some(child);
        for _ in 0..100 {
            if self.admin_conn().await.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server on port {} did not come up", self.port);
    }

    /// `redis://127.0.0.1:PORT`, with `password` if given.
    pub fn url(&self, password: Option<&str>) -> String {
        match password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Kills the server (SIGKILL): connections drop, the port refuses.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty (no persistence), scripts gone.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    async fn admin_conn(&self) -> Option<::redis::aio::MultiplexedConnection> {
        let client = ::redis::Client::open(self.url(self.admin_password.as_deref())).ok()?;
        let mut c = client.get_multiplexed_async_connection().await.ok()?;
        let pong: String = ::redis::cmd("PING").query_async(&mut c).await.ok()?;
        (pong == "PONG").then_some(c)
    }

    /// Runs one admin command and returns its reply.
    pub async fn cmd<T: ::redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = self.admin_conn().await.expect("admin connection");
        let mut cmd = ::redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut c).await.expect("admin command")
    }

    /// `calls` per command from `INFO commandstats` (`evalsha`, `get`, `script|load`, …).
    pub async fn command_calls(&self) -> HashMap<String, u64> {
        let info: String = self.cmd(&["INFO", "commandstats"]).await;
        info.lines()
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
            .collect()
    }

    /// A store on this server with default options.
    pub fn store(&self, clock: &ManualClock) -> Arc<RedisStore> {
        self.store_with(clock, None, RedisOptions::default())
    }

    pub fn store_with(
        &self,
        clock: &ManualClock,
        password: Option<&str>,
        options: RedisOptions,
    ) -> Arc<RedisStore> {
        Arc::new(
            RedisStore::new(&self.url(password), options, Arc::new(clock.clone()))
                .expect("redis store"),
        )
    }

    /// A service instance on its own port, sharing this server with any others.
    pub async fn instance(
        &self,
        limits: Limits,
        clock: ManualClock,
        options: LimiterOptions,
    ) -> Harness {
        let store = self.store(&clock);
        start_with(limits, store, clock, Some(super::ADMIN_TOKEN), options).await
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
