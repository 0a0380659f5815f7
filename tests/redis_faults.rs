//! The Redis store failing: stopped (killed), paused (`CLIENT PAUSE`), refusing auth, and
//! answering with errors (OOM). Each check answers within the 1.5 s budget + ε with
//! `shared = false`, and decisions are shared again once Redis is back. Time bounds are
//! the point here, and generous.

mod common;

use common::redis::RedisServer;
use common::{Harness, T0, req, start_with};
use ratelimit::breaker::BreakerConfig;
use ratelimit::clock::ManualClock;
use ratelimit::limiter::LimiterOptions;
use ratelimit::limits::Limits;
use ratelimit::pb::{CheckResponse, Source};
use ratelimit::store::redis::RedisOptions;
use std::time::{Duration, Instant};

const BUDGET: Duration = Duration::from_millis(1_500);
const EPSILON: Duration = Duration::from_millis(300);

fn opts() -> LimiterOptions {
    LimiterOptions {
        store_timeout: BUDGET,
        breaker: BreakerConfig {
            failures: 5,
            cooldown: Duration::from_millis(1_000),
        },
        ..LimiterOptions::default()
    }
}

async fn timed_check(h: &Harness, key: &str) -> (CheckResponse, Duration) {
    let mut c = h.client.clone();
    let started = Instant::now();
    let r = c
        .check(req("", key, 1))
        .await
        .expect("a check never errors on store failure");
    (r.into_inner(), started.elapsed())
}

/// `n` concurrent checks of distinct keys: each falls back within budget + ε.
async fn all_fall_back_in_time(h: &Harness, n: usize, tag: &str) {
    let mut tasks = Vec::new();
    for i in 0..n {
        let mut c = h.client.clone();
        let key = format!("{tag}-{i}");
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let r = c.check(req("", &key, 1)).await.map(|r| r.into_inner());
            (r, started.elapsed())
        }));
    }
    for t in tasks {
        let (r, took) = t.await.expect("join");
        let r = r.expect("no gRPC error");
        assert!(took < BUDGET + EPSILON, "{tag}: took {took:?}");
        assert!(r.allowed && !r.shared, "{tag}: {r:?}");
        assert_eq!(r.source(), Source::LocalFallback);
    }
    // Breaker open or not, later checks are no slower.
    for i in 0..20 {
        let (r, took) = timed_check(h, &format!("{tag}-later-{i}")).await;
        assert!(
            !r.shared && took < BUDGET + EPSILON,
            "{tag}: {r:?} {took:?}"
        );
    }
}

/// Checks until one is shared again; fails after `within`.
async fn shared_again_within(h: &Harness, within: Duration) {
    let started = Instant::now();
    loop {
        let (r, took) = timed_check(h, "recovery").await;
        assert!(took < BUDGET + EPSILON, "took {took:?}");
        if r.shared {
            assert_eq!(r.source(), Source::Store);
            return;
        }
        assert!(
            started.elapsed() < within,
            "still not shared after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_killed_redis_falls_back_in_time_and_shares_again_when_restarted() {
    let mut redis = RedisServer::start(&[]).await;
    let h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    assert!(timed_check(&h, "warm").await.0.shared, "healthy first");
    redis.kill();
    all_fall_back_in_time(&h, 20, "killed").await;
    redis.restart().await; // empty, and without the script: NOSCRIPT reloads it
    shared_again_within(&h, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_paused_redis_falls_back_in_time_and_shares_again_after_the_pause() {
    let redis = RedisServer::start(&[]).await;
    let h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    assert!(timed_check(&h, "warm").await.0.shared, "healthy first");
    let _: () = redis.cmd(&["CLIENT", "PAUSE", "3000"]).await;
    let paused = Instant::now();
    all_fall_back_in_time(&h, 20, "paused").await;
    assert!(
        paused.elapsed() < Duration::from_secs(3),
        "the pause outlasted the checks"
    );
    shared_again_within(&h, Duration::from_secs(3 + 5)).await;
}

#[tokio::test]
async fn a_redis_refusing_our_password_falls_back_and_shares_once_it_accepts() {
    let redis = RedisServer::start(&["--requirepass", "rotated"]).await;
    let clock = ManualClock::new(T0);
    let store = redis.store_with(&clock, Some("ours"), RedisOptions::default());
    let h = start_with(Limits::builtin(), store, clock, None, opts()).await;
    all_fall_back_in_time(&h, 10, "wrong-password").await;
    let _: () = redis.cmd(&["CONFIG", "SET", "requirepass", "ours"]).await;
    shared_again_within(&h, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_redis_that_wants_a_password_we_lack_falls_back() {
    let redis = RedisServer::start(&["--requirepass", "secret"]).await;
    let clock = ManualClock::new(T0);
    let store = redis.store_with(&clock, None, RedisOptions::default());
    let h = start_with(Limits::builtin(), store, clock, None, opts()).await;
    all_fall_back_in_time(&h, 10, "no-password").await;
    let _: () = redis.cmd(&["CONFIG", "SET", "requirepass", ""]).await;
    shared_again_within(&h, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_redis_answering_with_errors_falls_back_and_opens_the_breaker() {
    let redis = RedisServer::start(&[]).await;
    let h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    assert!(timed_check(&h, "warm").await.0.shared, "healthy first");
    // Out of memory: every write is refused with an error reply (OOM), fast.
    let _: () = redis
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .await;
    let _: () = redis.cmd(&["CONFIG", "SET", "maxmemory", "1"]).await;
    for i in 0..8 {
        let (r, took) = timed_check(&h, &format!("oom-{i}")).await;
        assert!(r.allowed && !r.shared, "{r:?}");
        assert!(
            took < Duration::from_millis(500),
            "an error reply is not a wait: {took:?}"
        );
    }
    assert_eq!(
        h.limiter.breaker_state(),
        Some(ratelimit::breaker::State::Open),
        "server errors are store failures"
    );
    let _: () = redis.cmd(&["CONFIG", "SET", "maxmemory", "0"]).await;
    shared_again_within(&h, Duration::from_secs(5)).await;
}

/// Redis restarted while the store's connection sat idle: the old connection is dead, and
/// a write sent on it fails in a way redis-rs cannot tell from a lost answer (an unknown
/// outcome, decided locally). A store that probes a silent connection first sends the
/// write on a new one instead, so the first check after the restart is counted in Redis.
#[tokio::test]
async fn a_connection_closed_while_idle_is_replaced_before_a_write_goes_out_on_it() {
    use ratelimit::limits::Limit;
    use ratelimit::store::{CounterStore, StoreError};
    let mut redis = RedisServer::start(&[]).await;
    let clock = ManualClock::new(T0);
    let with_probe = |probe_after| RedisOptions {
        probe_after,
        ..RedisOptions::default()
    };
    let probing = redis.store_with(&clock, None, with_probe(Duration::from_millis(50)));
    let never = redis.store_with(&clock, None, with_probe(Duration::from_secs(3_600)));
    let limit = Limit::new("t", 3, Duration::from_secs(60));
    let w = (T0 / 60_000) as i64;
    for store in [&probing, &never] {
        let a = store.admit(&limit, "k", w, &[1]).await.expect("healthy");
        assert!(a.outcomes[0].allowed);
    }
    redis.restart().await;
    // Real time, not a window: the connection's silence the probe is for.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let a = probing
        .admit(&limit, "k", w, &[1])
        .await
        .expect("sent on a new connection, so answered");
    assert_eq!(
        (a.outcomes[0].allowed, a.outcomes[0].count),
        (true, 1),
        "counted on the restarted (empty) server"
    );
    let stored: String = redis.cmd(&["GET", "rl:{t:k}"]).await;
    assert_eq!(stored, format!("{w}:1"));
    // Without the probe the same write goes out on the dead connection.
    match never.admit(&limit, "other", w, &[1]).await {
        Err(StoreError::UnknownOutcome(_)) => {}
        other => panic!("expected an unknown outcome without the probe, got {other:?}"),
    }
}
