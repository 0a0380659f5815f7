//! Shared harness for the integration tests: a real gRPC server on an ephemeral loopback
//! port, driven by a manual clock so no test sleeps across a window.
#![allow(dead_code)]

use ratelimit::clock::{ManualClock, SharedClock};
use ratelimit::limiter::{Limiter, LimiterOptions};
use ratelimit::limits::Limits;
use ratelimit::pb::rate_limiter_client::RateLimiterClient;
use ratelimit::pb::{CheckRequest, CheckResponse, ResetRequest};
use ratelimit::server::Running;
use ratelimit::server::admin::AdminToken;
use ratelimit::store::{CounterStore, MemoryStore};
use std::sync::Arc;
use tonic::transport::Channel;

/// 2026-11-30T00:00:00Z plus 10 s: inside a minute window, 50 s before it ends.
pub const T0: u64 = 1_764_460_810_000;

pub struct Harness {
    pub limiter: Arc<Limiter>,
    pub server: Running,
    pub clock: ManualClock,
    pub client: RateLimiterClient<Channel>,
}

pub fn limits(toml: &str) -> Limits {
    Limits::from_toml("test", toml).expect("valid test limits")
}

pub async fn start(limits: Limits, admin: Option<&str>) -> Harness {
    let clock = ManualClock::new(T0);
    let store: Arc<dyn CounterStore> = Arc::new(MemoryStore::new());
    start_with(limits, store, clock, admin, LimiterOptions::default()).await
}

pub async fn start_with(
    limits: Limits,
    store: Arc<dyn CounterStore>,
    clock: ManualClock,
    admin: Option<&str>,
    options: LimiterOptions,
) -> Harness {
    let limiter = Arc::new(Limiter::new(
        limits,
        store,
        Arc::new(clock.clone()),
        options,
    ));
    let admin = admin.and_then(AdminToken::new);
    let server = Running::start(limiter.clone(), admin, "127.0.0.1:0".parse().expect("addr"))
        .expect("server starts");
    let client = RateLimiterClient::connect(server.url())
        .await
        .expect("client connects");
    Harness {
        limiter,
        server,
        clock,
        client,
    }
}

pub fn req(limit: &str, key: &str, cost: u32) -> CheckRequest {
    CheckRequest {
        key: key.into(),
        limit: limit.into(),
        cost,
    }
}

/// The token the harness's instances (and `tests/ops.rs`'s processes) take for `Reset`.
pub const ADMIN_TOKEN: &str = "admin-token";

/// A `Reset` of `key` under `limit` (empty: the default) carrying [`ADMIN_TOKEN`].
pub fn admin_reset(limit: &str, key: &str) -> tonic::Request<ResetRequest> {
    let mut reset = tonic::Request::new(ResetRequest {
        key: key.into(),
        limit: limit.into(),
    });
    reset.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_TOKEN}").parse().expect("ascii"),
    );
    reset
}

impl Harness {
    pub async fn check(&mut self, limit: &str, key: &str) -> CheckResponse {
        self.client
            .check(req(limit, key, 1))
            .await
            .expect("check succeeds")
            .into_inner()
    }
}

/// The RTDB side of the harness: an emulator with the repo's `database.rules.json`.
pub mod rtdb {
    use super::*;
    use ratelimit::store::rtdb::auth::{EmulatorOwner, TokenSource};
    use ratelimit::store::rtdb::target::Target;
    use ratelimit::store::rtdb::{RtdbOptions, RtdbStore};
    use rtdb_emulator::{Emulator, Options};

    /// The database URL the tests use; in emulator mode its first label is the namespace.
    pub const DB_URL: &str = "https://bladbase-test-default-rtdb.europe-west1.firebasedatabase.app";
    pub const NS: &str = "bladbase-test-default-rtdb";

    pub async fn emulator() -> Emulator {
        let rules: serde_json::Value =
            serde_json::from_str(include_str!("../../database.rules.json"))
                .expect("rules are JSON");
        Emulator::start_with(Options {
            rules: Some(rules),
            addr: None,
        })
        .await
        .expect("emulator starts")
    }

    pub fn store_with(
        emu: &Emulator,
        tokens: Arc<dyn TokenSource>,
        options: RtdbOptions,
    ) -> Arc<RtdbStore> {
        ratelimit::install_crypto_provider();
        let target = Target::new(DB_URL, Some(&emu.host()), "rateLimits").expect("target");
        Arc::new(RtdbStore::new(target, tokens, options).expect("store"))
    }

    pub fn store(emu: &Emulator) -> Arc<RtdbStore> {
        store_with(emu, Arc::new(EmulatorOwner), RtdbOptions::default())
    }

    /// A store whose cached counts are trusted for `options.deny_trust` of `clock`'s time.
    pub fn store_on(
        emu: &Emulator,
        clock: SharedClock,
        options: &LimiterOptions,
    ) -> Arc<RtdbStore> {
        ratelimit::install_crypto_provider();
        let target = Target::new(DB_URL, Some(&emu.host()), "rateLimits").expect("target");
        let options = RtdbOptions {
            deny_trust: options.deny_trust,
            ..RtdbOptions::default()
        };
        let store = RtdbStore::new(target, Arc::new(EmulatorOwner), options).expect("store");
        Arc::new(store.with_clock(clock))
    }

    /// A service instance on its own port, sharing `emu` with any others; its store and
    /// limiter both read `clock`.
    pub async fn instance(
        emu: &Emulator,
        limits: Limits,
        clock: ManualClock,
        options: LimiterOptions,
    ) -> Harness {
        let store = store_on(emu, Arc::new(clock.clone()), &options);
        start_with(limits, store, clock, Some(ADMIN_TOKEN), options).await
    }
}

/// The Redis side of the harness: a real `redis-server` per test (`redis_server.rs`).
#[path = "redis_server.rs"]
pub mod redis;
