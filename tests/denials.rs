//! Cached denials against the RTDB emulator: how long they are trusted, what they cost
//! (requests counted by the emulator) and how a Reset through one instance frees a key on
//! another (DESIGN §10).

mod common;

use common::rtdb::{self, NS};
use common::{T0, admin_reset, limits, req};
use ratelimit::clock::{Clock, ManualClock, SharedClock};
use ratelimit::limiter::{Limiter, LimiterOptions};
use ratelimit::limits::Limits;
use ratelimit::pb::Source;
use ratelimit::pb::rate_limiter_client::RateLimiterClient;
use ratelimit::server::Running;
use ratelimit::server::admin::AdminToken;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const W: i64 = (T0 / 60_000) as i64;

fn opts() -> LimiterOptions {
    // Generous: a debug build on a loaded machine must not fall back and blur the counts.
    LimiterOptions {
        store_timeout: Duration::from_secs(10),
        ..LimiterOptions::default()
    }
}

#[tokio::test]
async fn an_exhausted_key_costs_at_most_one_read_per_second_per_instance() {
    let emu = rtdb::emulator().await;
    let mut h = rtdb::instance(&emu, Limits::builtin(), ManualClock::new(T0), opts()).await;
    for _ in 0..120 {
        assert!(h.check("", "greedy").await.allowed);
    }
    emu.reset_stats();
    // 1,000 checks over 10 s of clock time (one every 10 ms), all denied and shared.
    let mut from_store = 0;
    for _ in 0..1_000 {
        h.clock.advance(10);
        let r = h.check("", "greedy").await;
        assert!(!r.allowed && r.shared, "{r:?}");
        from_store += u32::from(r.source() == Source::Store);
    }
    let s = emu.stats();
    eprintln!("measured: 1,000 checks of an exhausted key over 10 s -> {s:?}");
    assert_eq!(
        (s.total, s.method("GET"), s.method("PUT")),
        (10, 10, 0),
        "one re-read per second, no writes: {s:?}"
    );
    assert_eq!(from_store, 10, "each re-read decided one check");
}

#[tokio::test]
async fn a_key_denied_on_cost_pays_the_412_of_its_refresh_once() {
    let emu = rtdb::emulator().await;
    let mut h = rtdb::instance(&emu, Limits::builtin(), ManualClock::new(T0), opts()).await;
    assert!(h.check("", "costly").await.allowed, "warm the cache");
    // Another instance counted 118 more: the cached tag is stale.
    emu.set_value(NS, "rateLimits/mcp/costly", json!({ W.to_string(): 119 }));
    emu.reset_stats();
    for i in 0..20 {
        let r = h
            .client
            .check(req("", "costly", 2))
            .await
            .expect("check")
            .into_inner();
        assert!(!r.allowed && r.shared, "check {i}: {r:?}");
        assert_eq!((r.remaining, r.source()), (1, Source::Store));
    }
    let s = emu.stats();
    assert_eq!(
        (s.total, s.status(412)),
        (1, 1),
        "the 412's value and tag are cached: the next 19 checks cost nothing: {s:?}"
    );
    // One hit still fits and is admitted on the refreshed tag, without another 412.
    let r = h.check("", "costly").await;
    assert!(r.allowed && r.shared, "{r:?}");
    assert_eq!(emu.stats().status(412), 1);
}

/// Wall time, starting at `T0`: the story below is about real seconds, and starting at a
/// fixed point keeps it clear of window boundaries.
struct FromT0(Instant);

impl Clock for FromT0 {
    fn now_ms(&self) -> u64 {
        T0 + u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

struct Instance {
    _server: Running,
    client: RateLimiterClient<Channel>,
}

async fn instance(emu: &rtdb_emulator::Emulator, limits: Limits, clock: SharedClock) -> Instance {
    let options = LimiterOptions::default();
    let store = rtdb::store_on(emu, clock.clone(), &options);
    let limiter = Arc::new(Limiter::new(limits, store, clock, options));
    let server = Running::start(
        limiter,
        AdminToken::new(common::ADMIN_TOKEN),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .expect("server starts");
    let client = RateLimiterClient::connect(server.url())
        .await
        .expect("connects");
    Instance {
        _server: server,
        client,
    }
}

#[tokio::test]
async fn a_reset_through_one_instance_frees_the_key_on_another_within_two_seconds() {
    let emu = rtdb::emulator().await;
    let clock: SharedClock = Arc::new(FromT0(Instant::now()));
    let signin = limits(
        "[[limit]]\nname = \"signin\"\nrequests = 5\nwindow = \"15m\"\non_store_failure = \"deny\"\ndefault = true\n",
    );
    let mut a = instance(&emu, signin.clone(), clock.clone()).await;
    let mut b = instance(&emu, signin, clock).await;
    let user = "alice@example.com";

    // Five failed sign-ins through B use up the limit; B then refuses.
    for i in 0..5 {
        let r = b.client.check(req("signin", user, 1)).await.expect("check");
        let r = r.into_inner();
        assert!(r.allowed && r.shared, "attempt {i}: {r:?}");
    }
    for _ in 0..5 {
        let r = b.client.check(req("signin", user, 1)).await.expect("check");
        let r = r.into_inner();
        assert!(!r.allowed && r.shared, "{r:?}");
        assert_eq!(r.source(), Source::DenyCache);
    }

    // The user signs in; the sign-in service resets the key through A.
    let reset = admin_reset("signin", user);
    let out = a.client.reset(reset).await.expect("reset").into_inner();
    assert!(out.shared, "{out:?}");
    let reset_at = Instant::now();

    // B admits again within 2 s.
    loop {
        let r = b.client.check(req("signin", user, 1)).await.expect("check");
        let r = r.into_inner();
        if r.allowed {
            assert!(r.shared, "{r:?}");
            assert_eq!((r.source(), r.remaining), (Source::Store, 4));
            break;
        }
        assert!(
            reset_at.elapsed() < Duration::from_secs(2),
            "B still refuses {:?} after the reset: {r:?}",
            reset_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = reset_at.elapsed();
    eprintln!("measured: B admitted again {took:?} after the reset through A");
}

/// After a Reset through A, a Peek on B reads the fresh count and reports the attempts
/// left; B's next Check must then agree with it instead of refusing from its cache.
#[tokio::test]
async fn a_peek_that_finds_room_after_a_reset_lifts_the_cached_refusal() {
    let emu = rtdb::emulator().await;
    let clock: SharedClock = Arc::new(FromT0(Instant::now()));
    let signin =
        limits("[[limit]]\nname = \"signin\"\nrequests = 5\nwindow = \"15m\"\ndefault = true\n");
    let mut a = instance(&emu, signin.clone(), clock.clone()).await;
    let mut b = instance(&emu, signin, clock).await;
    let user = "bob@example.com";
    for _ in 0..6 {
        b.client.check(req("signin", user, 1)).await.expect("check");
    }
    let r = b.client.check(req("signin", user, 1)).await.expect("check");
    assert_eq!(
        r.into_inner().source(),
        Source::DenyCache,
        "B refuses from its cache"
    );

    let reset = admin_reset("signin", user);
    assert!(
        a.client
            .reset(reset)
            .await
            .expect("reset")
            .into_inner()
            .shared
    );

    let peek = ratelimit::pb::PeekRequest {
        key: user.into(),
        limit: "signin".into(),
    };
    let p = b.client.peek(peek).await.expect("peek").into_inner();
    assert_eq!(
        (p.allowed, p.remaining, p.source()),
        (true, 5, Source::Store)
    );
    let r = b
        .client
        .check(req("signin", user, 1))
        .await
        .expect("check")
        .into_inner();
    assert_eq!(
        (r.allowed, r.remaining, r.source()),
        (true, 4, Source::Store),
        "the Check right after the Peek agrees with it: {r:?}"
    );
}
