//! Time may not break the shared count (DESIGN §3, §10): a counter one window ahead of
//! an instance's clock is counted in (a check computed just before a boundary), but one
//! further ahead, written by a wrong clock or by hand, is replaced by the next admitted
//! check instead of publishing a reset days away and refusing the key until then. On
//! the RTDB emulator and on a real `redis-server`; the fake clock moves nothing here.

mod common;

use common::T0;
use common::redis::RedisServer;
use common::rtdb::{self, NS};
use ratelimit::clock::ManualClock;
use ratelimit::limiter::LimiterOptions;
use ratelimit::limits::{Limit, Limits};
use ratelimit::pb::{CheckResponse, PeekRequest};
use ratelimit::store::CounterStore;
use serde_json::json;
use std::time::Duration;

const W: i64 = (T0 / 60_000) as i64;
/// Seconds from T0 to the end of its window, as `reset_after` rounds them.
const RESET_S: i64 = 60 - ((T0 % 60_000) / 1_000) as i64;

fn opts() -> LimiterOptions {
    LimiterOptions {
        store_timeout: Duration::from_secs(10),
        ..LimiterOptions::default()
    }
}

/// What a caller is told, as (allowed, remaining, reset_after s, window).
fn told(r: &CheckResponse) -> (bool, u32, i64, i64) {
    let reset = r.reset_after.as_ref().map_or(-1, |d| d.seconds);
    (r.allowed, r.remaining, reset, r.window)
}

#[tokio::test]
async fn rtdb_a_counter_far_ahead_of_the_clock_is_replaced_and_one_ahead_is_counted_in() {
    let emu = rtdb::emulator().await;
    let mut h = rtdb::instance(&emu, Limits::builtin(), ManualClock::new(T0), opts()).await;

    // Written by a clock 10 windows fast: replaced, the figures are this window's.
    emu.set_value(
        NS,
        "rateLimits/mcp/far",
        json!({ (W + 10).to_string(): 120 }),
    );
    let r = h.check("mcp", "far").await;
    assert_eq!(told(&r), (true, 119, RESET_S, W), "{r:?}");
    assert!(r.shared);
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/far"),
        json!({ W.to_string(): 1 })
    );

    // Peek sees it the same way, without writing.
    emu.set_value(
        NS,
        "rateLimits/mcp/peeked",
        json!({ (W + 5).to_string(): 120 }),
    );
    let peek = PeekRequest {
        key: "peeked".into(),
        limit: "mcp".into(),
    };
    let p = h.client.peek(peek).await.expect("peek").into_inner();
    assert_eq!((p.allowed, p.remaining, p.window), (true, 120, W), "{p:?}");
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/peeked"),
        json!({ (W + 5).to_string(): 120 }),
        "a Peek writes nothing"
    );

    // One window ahead (another instance crossed the boundary first): counted there.
    emu.set_value(NS, "rateLimits/mcp/next", json!({ (W + 1).to_string(): 5 }));
    let r = h.check("mcp", "next").await;
    assert_eq!(
        (r.allowed, r.remaining, r.window),
        (true, 114, W + 1),
        "{r:?}"
    );
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/next"),
        json!({ (W + 1).to_string(): 6 })
    );
}

#[tokio::test]
async fn redis_a_counter_far_ahead_of_the_clock_is_replaced_and_one_ahead_is_counted_in() {
    let redis = RedisServer::start(&[]).await;
    let clock = ManualClock::new(T0);
    let store = redis.store(&clock);
    let limit = Limit::new("mcp", 120, Duration::from_secs(60));
    let far = store.redis_key(&limit, "far");
    let next = store.redis_key(&limit, "next");
    let _: () = redis.cmd(&["SET", &far, &format!("{}:120", W + 10)]).await;
    let _: () = redis.cmd(&["SET", &next, &format!("{}:5", W + 1)]).await;

    assert_eq!(store.peek(&limit, "far", W).await.expect("peek").count, 0);
    let a = store.admit(&limit, "far", W, &[1]).await.expect("admit");
    assert_eq!(
        (a.window, a.outcomes[0].allowed, a.outcomes[0].count),
        (W, true, 1)
    );
    let stored: String = redis.cmd(&["GET", &far]).await;
    assert_eq!(stored, format!("{W}:1"));

    let a = store.admit(&limit, "next", W, &[1]).await.expect("admit");
    assert_eq!((a.window, a.outcomes[0].count), (W + 1, 6));

    // Through the service too: the figures a caller gets are this window's.
    let _: () = redis
        .cmd(&["SET", &far, &format!("{}:120", W + 1_000)])
        .await;
    let mut h = redis.instance(Limits::builtin(), clock, opts()).await;
    let r = h.check("mcp", "far").await;
    assert_eq!(told(&r), (true, 119, RESET_S, W), "{r:?}");
}
