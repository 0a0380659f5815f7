//! The Redis store failing: stopped (killed), paused (`CLIENT PAUSE`), refusing auth,
//! answering with errors (OOM), restarted under an idle connection, and black-holed
//! behind a proxy that stops forwarding. Each check answers within the 1.5 s budget + ε with
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

/// A TCP proxy to a local port whose connections can be frozen: a frozen connection stays
/// open and forwards nothing (a black hole), while new connections are forwarded as usual.
struct FreezingProxy {
    port: u16,
    frozen_before: std::sync::Arc<std::sync::atomic::AtomicU64>,
    next: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl FreezingProxy {
    async fn start(upstream: u16) -> FreezingProxy {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let frozen_before = Arc::new(AtomicU64::new(0));
        let next = Arc::new(AtomicU64::new(0));
        let (frozen, ids) = (frozen_before.clone(), next.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                let id = ids.fetch_add(1, Ordering::SeqCst);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, id, frozen.clone()));
                tokio::spawn(pump(sr, cw, id, frozen.clone()));
            }
        });
        FreezingProxy {
            port,
            frozen_before,
            next,
        }
    }

    /// Every connection open now forwards nothing from here on.
    fn freeze(&self) {
        use std::sync::atomic::Ordering;
        self.frozen_before
            .store(self.next.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    id: u64,
    frozen_before: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = [0u8; 4096];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if id < frozen_before.load(std::sync::atomic::Ordering::SeqCst) {
            // Hold both halves open and forward nothing, ever.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A probe that the caller's budget cuts short on a black-holed connection discards that
/// connection, as any abandoned call does: the next call connects afresh instead of
/// probing the same black hole until its budget runs out again.
#[tokio::test]
async fn a_probe_cut_short_on_a_black_holed_connection_discards_it() {
    use ratelimit::limits::Limit;
    use ratelimit::store::CounterStore;
    use ratelimit::store::redis::RedisStore;
    let redis = RedisServer::start(&[]).await;
    let proxy = FreezingProxy::start(redis.port).await;
    let clock = ManualClock::new(T0);
    let store = RedisStore::new(
        &format!("redis://127.0.0.1:{}", proxy.port),
        RedisOptions {
            probe_after: Duration::from_millis(50),
            ..RedisOptions::default()
        },
        std::sync::Arc::new(clock.clone()),
    )
    .expect("store");
    let limit = Limit::new("t", 3, Duration::from_secs(60));
    let w = (T0 / 60_000) as i64;
    assert!(
        store
            .admit(&limit, "k", w, &[1])
            .await
            .expect("healthy")
            .outcomes[0]
            .allowed
    );
    proxy.freeze();
    tokio::time::sleep(Duration::from_millis(200)).await; // silent: the next call probes
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        store.admit(&limit, "k", w, &[1]),
    );
    assert!(
        cut.await.is_err(),
        "the probe gets no answer through the black hole"
    );
    let a = tokio::time::timeout(Duration::from_secs(3), store.admit(&limit, "k", w, &[1]))
        .await
        .expect("not stuck probing the black-holed connection again")
        .expect("answered on a new connection");
    assert_eq!((a.outcomes[0].allowed, a.outcomes[0].count), (true, 2));
}
