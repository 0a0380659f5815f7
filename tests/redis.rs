//! The Redis store against a real `redis-server` (one per test): exactness in one and
//! across three instances, windows with the manual clock, expiry, the layout and key
//! encoding, Peek/Reset/release, Redis commands per check (`INFO commandstats`), and the
//! unknown-outcome rule. Fault cases: `tests/redis_faults.rs`; TLS: `tests/redis_tls.rs`;
//! URL, switch and key encoding: `tests/redis_setup.rs`.

mod common;

use common::redis::RedisServer;
use common::{T0, admin_reset, req};
use ratelimit::clock::ManualClock;
use ratelimit::limiter::{Limiter, LimiterOptions};
use ratelimit::limits::{Limit, Limits};
use ratelimit::pb::{PeekRequest, Source};
use ratelimit::store::CounterStore;
use ratelimit::store::redis::{self, GRACE, RedisOptions};
use std::time::Duration;

const W: i64 = (T0 / 60_000) as i64;

fn opts() -> LimiterOptions {
    // Generous: these tests are about the store path; a debug build on a loaded 2-core
    // machine must not fall back and blur the counts.
    LimiterOptions {
        store_timeout: Duration::from_secs(10),
        ..LimiterOptions::default()
    }
}

fn mcp() -> Limit {
    Limit::new("mcp", 120, Duration::from_secs(60))
}

#[tokio::test]
async fn one_hundred_thirty_checks_admit_120_all_shared() {
    let redis = RedisServer::start(&[]).await;
    let mut h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    let (mut admitted, mut from_store) = (0, 0);
    for i in 0..130 {
        let r = h.check("", "token-130").await;
        assert!(r.shared, "check {i}: {r:?}");
        admitted += u32::from(r.allowed);
        from_store += u32::from(r.source() == Source::Store);
        if i < 120 {
            assert_eq!((r.allowed, r.remaining), (true, 119 - i), "check {i}");
        }
    }
    assert_eq!(admitted, 120);
    assert_eq!(
        from_store, 120,
        "the 120th filled the window; the rest: the deny cache"
    );
    let v: String = redis.cmd(&["GET", "rl:{mcp:token-130}"]).await;
    assert_eq!(v, format!("{W}:120"));
}

#[tokio::test]
async fn three_instances_times_600_concurrent_checks_of_one_key_admit_exactly_120() {
    let redis = RedisServer::start(&[]).await;
    let clock = ManualClock::new(T0);
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(
            redis
                .instance(Limits::builtin(), clock.clone(), opts())
                .await,
        );
    }
    let mut tasks = Vec::new();
    for i in 0..1_800 {
        let mut c = instances[i % 3].client.clone();
        tasks.push(tokio::spawn(async move {
            c.check(req("", "shared-key", 1))
                .await
                .map(|r| r.into_inner())
        }));
    }
    let (mut admitted, mut not_shared) = (0, 0);
    for t in tasks {
        let r = t.await.expect("join").expect("check");
        admitted += u32::from(r.allowed);
        not_shared += u32::from(!r.shared);
    }
    assert_eq!(not_shared, 0, "every decision came from the store");
    assert_eq!(admitted, 120);
    let v: String = redis.cmd(&["GET", "rl:{mcp:shared-key}"]).await;
    assert_eq!(v, format!("{W}:120"));
}

#[tokio::test]
async fn the_window_rolls_over_with_the_manual_clock() {
    let redis = RedisServer::start(&[]).await;
    let mut h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    for _ in 0..120 {
        assert!(h.check("", "roll").await.allowed);
    }
    let r = h.check("", "roll").await;
    assert!(!r.allowed && r.shared);
    assert_eq!(r.retry_after.map(|d| d.seconds), Some(50));
    h.clock.advance(50_000);
    let r = h.check("", "roll").await;
    assert_eq!((r.allowed, r.remaining, r.window), (true, 119, W + 1));
    assert_eq!(r.source(), Source::Store);
    let v: String = redis.cmd(&["GET", "rl:{mcp:roll}"]).await;
    assert_eq!(v, format!("{}:1", W + 1), "the old window is replaced");
}

#[tokio::test]
async fn keys_expire_at_the_window_end_plus_grace() {
    let redis = RedisServer::start(&[]).await;
    let clock = ManualClock::new(T0);
    let mut h = redis
        .instance(Limits::builtin(), clock.clone(), opts())
        .await;
    let grace = GRACE.as_millis() as i64;
    h.check("", "ttl").await;
    let pttl: i64 = redis.cmd(&["PTTL", "rl:{mcp:ttl}"]).await;
    // T0 is 50 s before its window ends.
    assert!(pttl > 0 && pttl <= 50_000 + grace, "PTTL {pttl}");
    assert!(
        pttl > 50_000 + grace - 5_000,
        "set from the window end: PTTL {pttl}"
    );
    clock.advance(49_000);
    h.check("", "ttl").await;
    let pttl: i64 = redis.cmd(&["PTTL", "rl:{mcp:ttl}"]).await;
    assert!(pttl > 0 && pttl <= 1_000 + grace, "PTTL {pttl}");
}

#[tokio::test]
async fn a_counter_in_a_newer_window_is_counted_there() {
    let redis = RedisServer::start(&[]).await;
    let _: () = redis
        .cmd(&["SET", "rl:{mcp:skewed}", &format!("{}:5", W + 1)])
        .await;
    let mut h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    let r = h.check("", "skewed").await;
    assert!(r.allowed && r.shared);
    assert_eq!((r.window, r.remaining), (W + 1, 114));
    let v: String = redis.cmd(&["GET", "rl:{mcp:skewed}"]).await;
    assert_eq!(v, format!("{}:6", W + 1));
}

#[tokio::test]
async fn a_foreign_value_is_never_overwritten_and_the_breaker_stays_closed() {
    let redis = RedisServer::start(&[]).await;
    let _: () = redis.cmd(&["SET", "rl:{mcp:foreign}", "hello"]).await;
    let _: i64 = redis.cmd(&["HSET", "rl:{mcp:hash}", "a", "1"]).await;
    let h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    for key in ["foreign", "hash", "foreign", "hash", "foreign", "hash"] {
        let mut c = h.client.clone();
        let r = c.check(req("", key, 1)).await.expect("check").into_inner();
        assert!(r.allowed && !r.shared, "{key}: {r:?}");
        assert_eq!(r.source(), Source::LocalFallback);
    }
    let v: String = redis.cmd(&["GET", "rl:{mcp:foreign}"]).await;
    assert_eq!(v, "hello");
    assert_eq!(
        h.limiter.breaker_state(),
        Some(ratelimit::breaker::State::Closed),
        "a value of the wrong shape says nothing about Redis' health"
    );
}

#[tokio::test]
async fn awkward_keys_each_land_as_one_hash_tagged_key() {
    let redis = RedisServer::start(&[]).await;
    let mut h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    let keys_in = [
        "alice@example.com",
        "a}b{c",
        "x:y",
        "%7B",
        "{mcp:other}",
        "ключ",
        "a b\n",
    ];
    for k in keys_in {
        let r = h.check("", k).await;
        assert!(r.allowed && r.shared, "{k}: {r:?}");
    }
    let stored: Vec<String> = redis.cmd(&["KEYS", "*"]).await;
    assert_eq!(stored.len(), keys_in.len(), "{stored:?}");
    let mut decoded: Vec<String> = stored
        .iter()
        .map(|k| {
            let tag = k.strip_prefix("rl:{mcp:").and_then(|t| t.strip_suffix('}'));
            let tag = tag.unwrap_or_else(|| panic!("not rl:{{mcp:…}}: {k}"));
            assert!(!tag.contains(['{', '}', ':']), "{k}");
            redis::decode(tag).expect("decodes")
        })
        .collect();
    decoded.sort();
    let mut expected: Vec<String> = keys_in.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(decoded, expected);
}

#[tokio::test]
async fn peek_reads_and_reset_deletes_the_key() {
    let redis = RedisServer::start(&[]).await;
    let mut h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    for _ in 0..120 {
        h.check("", "signin-user").await;
    }
    assert_eq!(h.check("", "signin-user").await.source(), Source::DenyCache);
    let peek = PeekRequest {
        key: "signin-user".into(),
        limit: String::new(),
    };
    let p = h
        .client
        .peek(peek.clone())
        .await
        .expect("peek")
        .into_inner();
    assert_eq!((p.allowed, p.remaining, p.shared), (false, 0, true));
    let reset = admin_reset("", "signin-user");
    assert!(
        h.client
            .reset(reset)
            .await
            .expect("reset")
            .into_inner()
            .shared
    );
    let exists: i64 = redis.cmd(&["EXISTS", "rl:{mcp:signin-user}"]).await;
    assert_eq!(exists, 0);
    let p = h.client.peek(peek).await.expect("peek").into_inner();
    assert_eq!((p.allowed, p.remaining, p.shared), (true, 120, true));
    let r = h.check("", "signin-user").await;
    assert_eq!(
        (r.allowed, r.remaining, r.source()),
        (true, 119, Source::Store)
    );
}

#[tokio::test]
async fn release_gives_back_at_most_the_count_and_only_in_its_window() {
    let redis = RedisServer::start(&[]).await;
    let clock = ManualClock::new(T0);
    let store = redis.store(&clock);
    let limit = mcp();
    let a = store.admit(&limit, "lease", W, &[10]).await.expect("admit");
    assert_eq!((a.window, a.outcomes[0].count), (W, 10));
    assert!(
        store
            .release(&limit, "lease", W, 4, 0)
            .await
            .expect("release")
    );
    assert_eq!(store.peek(&limit, "lease", W).await.expect("peek").count, 6);
    assert!(
        !store
            .release(&limit, "lease", W - 1, 4, 0)
            .await
            .expect("old window")
    );
    assert!(
        !store
            .release(&limit, "absent", W, 4, 0)
            .await
            .expect("no counter")
    );
    assert!(
        store
            .release(&limit, "lease", W, 100, 0)
            .await
            .expect("more than counted")
    );
    assert_eq!(store.peek(&limit, "lease", W).await.expect("peek").count, 0);
    assert!(
        !store
            .release(&limit, "lease", W, 1, 0)
            .await
            .expect("nothing left")
    );
    let pttl: i64 = redis.cmd(&["PTTL", "rl:{mcp:lease}"]).await;
    assert!(
        pttl > 0 && pttl <= 50_000 + GRACE.as_millis() as i64,
        "PTTL {pttl}"
    );
    // Never below `keep`: what the lease holder admitted itself stays counted.
    store.admit(&limit, "kept", W, &[30]).await.expect("admit");
    assert!(
        store
            .release(&limit, "kept", W, 25, 10)
            .await
            .expect("release")
    );
    assert_eq!(store.peek(&limit, "kept", W).await.expect("peek").count, 10);
    assert!(
        !store
            .release(&limit, "kept", W, 5, 10)
            .await
            .expect("at keep")
    );
    assert_eq!(store.peek(&limit, "kept", W).await.expect("peek").count, 10);
}

#[tokio::test]
async fn a_batch_is_admitted_in_order_all_or_nothing_each() {
    let redis = RedisServer::start(&[]).await;
    let store = redis.store(&ManualClock::new(T0));
    let limit = Limit::new("mcp", 5, Duration::from_secs(60));
    let a = store
        .admit(&limit, "b", W, &[2, 2, 2, 1])
        .await
        .expect("admit");
    let got: Vec<(bool, u32)> = a.outcomes.iter().map(|o| (o.allowed, o.count)).collect();
    assert_eq!(got, [(true, 2), (true, 4), (false, 4), (true, 5)]);
    let v: String = redis.cmd(&["GET", "rl:{mcp:b}"]).await;
    assert_eq!(v, format!("{W}:5"));
}

#[tokio::test]
async fn sequential_checks_cost_exactly_one_evalsha_each() {
    let redis = RedisServer::start(&[]).await;
    let mut h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    h.check("", "warm").await; // connect, NOSCRIPT, SCRIPT LOAD
    let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]).await;
    for i in 0..100 {
        let r = h.check("", "seq").await;
        assert!(r.allowed && r.shared, "check {i}: {r:?}");
    }
    let calls = redis.command_calls().await;
    eprintln!("measured: 100 sequential checks -> {calls:?}");
    assert_eq!(calls.get("evalsha"), Some(&100), "{calls:?}");
    // Inside the script: one GET and one SET per batch; nothing else was sent (the PING
    // is the harness' admin connection).
    assert_eq!(
        (calls.get("get"), calls.get("set")),
        (Some(&100), Some(&100))
    );
    let others: Vec<_> = calls
        .keys()
        .filter(|k| !["evalsha", "get", "set", "config|resetstat", "ping"].contains(&k.as_str()))
        .collect();
    assert!(others.is_empty(), "{calls:?}");
}

#[tokio::test]
async fn sixty_four_concurrent_checks_share_a_few_script_calls() {
    let redis = RedisServer::start(&[]).await;
    let h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    let mut c = h.client.clone();
    c.check(req("", "warm", 1)).await.expect("warm");
    let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]).await;
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let mut c = h.client.clone();
        tasks.push(tokio::spawn(async move {
            c.check(req("", "hot", 1)).await.map(|r| r.into_inner())
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        let r = t.await.expect("join").expect("check");
        assert!(r.shared, "{r:?}");
        admitted += u32::from(r.allowed);
    }
    assert_eq!(admitted, 64);
    let calls = redis.command_calls().await;
    eprintln!("measured: 64 concurrent checks of one key -> {calls:?}");
    let evalsha = calls.get("evalsha").copied().unwrap_or(0);
    assert!((1..=8).contains(&evalsha), "batched: {calls:?}");
    let v: String = redis.cmd(&["GET", "rl:{mcp:hot}"]).await;
    assert_eq!(v, format!("{W}:64"));
}

#[tokio::test]
async fn a_flushed_script_is_loaded_again_once() {
    let redis = RedisServer::start(&[]).await;
    let mut h = redis
        .instance(Limits::builtin(), ManualClock::new(T0), opts())
        .await;
    h.check("", "k").await;
    let _: () = redis.cmd(&["SCRIPT", "FLUSH"]).await;
    let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]).await;
    for _ in 0..3 {
        assert!(h.check("", "k").await.shared);
    }
    let calls = redis.command_calls().await;
    assert_eq!(calls.get("script|load"), Some(&1), "{calls:?}");
    assert_eq!(
        calls.get("set"),
        Some(&3),
        "each check applied once: {calls:?}"
    );
    let v: String = redis.cmd(&["GET", "rl:{mcp:k}"]).await;
    assert_eq!(v, format!("{W}:4"));
}

#[tokio::test]
async fn a_lost_write_answer_is_never_resent() {
    let redis = RedisServer::start(&[]).await;
    let clock = ManualClock::new(T0);
    let store = redis.store_with(
        &clock,
        None,
        RedisOptions {
            response_timeout: Duration::from_millis(300),
            ..RedisOptions::default()
        },
    );
    let limiter = Limiter::new(Limits::builtin(), store, std::sync::Arc::new(clock), opts());
    assert!(
        limiter.check("", "k", 1, None).await.expect("ok").shared,
        "warm"
    );
    let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]).await;
    // The server stalls for 1 s: the script is sent, its answer comes too late.
    let stall = {
        let port = redis.port;
        tokio::spawn(async move {
            let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
            let mut c = client
                .get_multiplexed_async_connection()
                .await
                .expect("conn");
            let _: Result<(), _> = ::redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("1")
                .query_async(&mut c)
                .await;
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let d = limiter.check("", "k", 1, None).await.expect("ok");
    assert!(d.allowed && !d.shared, "unknown outcome falls back: {d:?}");
    stall.await.expect("stall");
    let v: String = redis.cmd(&["GET", "rl:{mcp:k}"]).await;
    assert_eq!(v, format!("{W}:2"), "applied once, not re-sent");
    assert_eq!(redis.command_calls().await.get("evalsha"), Some(&1));
    let d = limiter.check("", "k", 1, None).await.expect("ok");
    assert_eq!(
        (d.shared, d.remaining),
        (true, 117),
        "the landed write counts"
    );
}

#[tokio::test]
async fn a_reset_through_one_instance_frees_the_key_on_another_after_the_deny_trust() {
    let redis = RedisServer::start(&[]).await;
    let clock = ManualClock::new(T0);
    let signin = common::limits(
        "[[limit]]\nname = \"signin\"\nrequests = 5\nwindow = \"15m\"\ndefault = true\n",
    );
    let mut a = redis.instance(signin.clone(), clock.clone(), opts()).await;
    let mut b = redis.instance(signin, clock.clone(), opts()).await;
    let user = "alice@example.com";
    for i in 0..5 {
        let r = b.check("signin", user).await;
        assert!(r.allowed && r.shared, "attempt {i}: {r:?}");
    }
    let r = b.check("signin", user).await;
    assert_eq!((r.allowed, r.source()), (false, Source::DenyCache));
    let reset = admin_reset("signin", user);
    assert!(
        a.client
            .reset(reset)
            .await
            .expect("reset")
            .into_inner()
            .shared
    );
    // B trusted its cached denial for --deny-trust (1 s); then it asks Redis again.
    clock.advance(1_100);
    let r = b.check("signin", user).await;
    assert_eq!(
        (r.allowed, r.shared, r.source(), r.remaining),
        (true, true, Source::Store, 4),
        "{r:?}"
    );
    let r = a.check("signin", user).await;
    assert_eq!((r.allowed, r.remaining), (true, 3), "{r:?}");
}
