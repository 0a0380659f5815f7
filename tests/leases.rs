//! Exactness at fleet scale (DESIGN §9): many service instances on one RTDB emulator,
//! racing on one hot key, admit exactly the limit; contention is denied, never admitted
//! locally; quota leases serve hot keys from reserves and give unspent hits back.
//!
//! Counts are asserted, not times: the emulator's latency knob gives the round trip, and
//! the fake clock moves windows.

mod common;

use common::rtdb::{self, NS};
use common::{Harness, T0, req};
use ratelimit::clock::ManualClock;
use ratelimit::decision::Source;
use ratelimit::limiter::LeaseOptions;
use ratelimit::limiter::LimiterOptions;
use ratelimit::limits::Limits;
use ratelimit::pb::CheckResponse;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const WINDOW_MS: u64 = 60_000;

/// `n` instances on `emu`, sharing `clock`, with the default options (1.5 s budget).
async fn fleet(
    emu: &rtdb_emulator::Emulator,
    n: usize,
    limits: &Limits,
    clock: &ManualClock,
) -> Vec<Harness> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            rtdb::instance(
                emu,
                limits.clone(),
                clock.clone(),
                LimiterOptions::default(),
            )
            .await,
        );
    }
    out
}

/// What a run saw.
#[derive(Debug, Default)]
struct Tally {
    admitted: u32,
    not_shared: u32,
    from_lease: u32,
    contended: u32,
}

impl Tally {
    fn add(&mut self, r: &CheckResponse) {
        self.admitted += u32::from(r.allowed);
        self.not_shared += u32::from(!r.shared);
        self.from_lease += u32::from(r.source() == ratelimit::pb::Source::Lease);
        // A contention denial: shared, and told to come back within a second or two
        // although the window has longer to run.
        self.contended += u32::from(
            !r.allowed
                && r.retry_after.as_ref().is_some_and(|d| d.seconds <= 1)
                && r.reset_after.as_ref().is_some_and(|d| d.seconds > 2),
        );
    }
}

/// `callers` concurrent callers, caller `i` on instance `i % n`, drawing `total` checks of
/// `key` from one shared pool, each caller one check at a time.
async fn hammer(
    instances: &[Harness],
    callers: usize,
    total: u64,
    limit: &str,
    key: &str,
) -> Tally {
    let pool = Arc::new(AtomicU64::new(total));
    let mut tasks = Vec::new();
    for i in 0..callers {
        let mut client = instances[i % instances.len()].client.clone();
        let pool = pool.clone();
        let (limit, key) = (limit.to_owned(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            while pool
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let r = client
                    .check(req(&limit, &key, 1))
                    .await
                    .expect("check")
                    .into_inner();
                tally.add(&r);
            }
            tally
        }));
    }
    let mut all = Tally::default();
    for t in tasks {
        let t = t.await.expect("join");
        all.admitted += t.admitted;
        all.not_shared += t.not_shared;
        all.from_lease += t.from_lease;
        all.contended += t.contended;
    }
    all
}

/// Waits (bounded) until the node holds `want` for window `w`: unspent leases are given
/// back once their key goes quiet.
async fn node_settles(
    emu: &rtdb_emulator::Emulator,
    path: &str,
    w: i64,
    want: u32,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = emu.value(NS, path);
        if v == json!({ w.to_string(): want }) || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn hot_key_over_a_fleet(instances: usize, latency_ms: u64, checks: u64) {
    let emu = rtdb::emulator().await;
    let clock = ManualClock::new(T0);
    let fleet = fleet(&emu, instances, &Limits::builtin(), &clock).await;
    emu.faults().set_latency(Duration::from_millis(latency_ms));
    let tally = hammer(&fleet, 64, checks, "", "hot-token").await;
    let s = emu.stats();
    eprintln!(
        "measured: {instances} instances, +{latency_ms} ms, {checks} checks -> {tally:?}; emulator: {} PUT, {} x412, {} GET",
        s.method("PUT"),
        s.status(412),
        s.method("GET")
    );
    let w = (T0 / WINDOW_MS) as i64;
    let node = node_settles(&emu, "rateLimits/mcp/hot-token", w, 120).await;
    assert_eq!(
        tally.not_shared, 0,
        "contention is not an outage: {tally:?}"
    );
    assert_eq!(tally.admitted, 120, "{tally:?}, node {node}");
    assert_eq!(node, json!({ w.to_string(): 120 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_instances_at_60ms_admit_exactly_120_of_1600() {
    hot_key_over_a_fleet(16, 60, 1_600).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_instances_at_100ms_admit_exactly_120_of_3200() {
    hot_key_over_a_fleet(32, 100, 3_200).await;
}

#[tokio::test]
async fn demand_equal_to_the_limit_spread_round_robin_is_all_admitted() {
    let emu = rtdb::emulator().await;
    let clock = ManualClock::new(T0);
    let mut fleet = fleet(&emu, 8, &Limits::builtin(), &clock).await;
    emu.faults().set_latency(Duration::from_millis(5));
    let mut tally = Tally::default();
    for i in 0..120 {
        let r = fleet[i % 8].check("", "spread").await;
        assert!(r.allowed && r.shared, "check {i}: {r:?}");
        tally.add(&r);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    assert_eq!(tally.admitted, 120);
    let r = fleet[0].check("", "spread").await;
    assert!(!r.allowed && r.shared, "the 121st is refused: {r:?}");
}

#[tokio::test]
async fn demand_at_twice_the_limit_over_a_whole_window_admits_120() {
    let emu = rtdb::emulator().await;
    let start = (T0 / WINDOW_MS) * WINDOW_MS;
    let clock = ManualClock::new(start);
    let mut fleet = fleet(&emu, 4, &Limits::builtin(), &clock).await;
    emu.faults().set_latency(Duration::from_millis(2));
    let mut tally = Tally::default();
    // 240 checks, one every 250 ms of the fake clock: the whole window, no more.
    for i in 0..240u64 {
        clock.set(start + i * 250);
        let r = fleet[(i % 4) as usize].check("", "steady").await;
        assert!(r.shared, "check {i}: {r:?}");
        assert_eq!(r.window, (start / WINDOW_MS) as i64);
        tally.add(&r);
    }
    assert_eq!(tally.admitted, 120, "{tally:?}");
}

/// A limit large enough that nothing is denied for want of hits.
fn big_limit() -> Limits {
    common::limits(
        r#"
        [[limit]]
        name = "big"
        requests = 100000
        window = "60s"
        "#,
    )
}

/// One instance, a key hot enough to lease: decisions from the reserve are shared, say
/// `SOURCE_LEASE` and cost no store write; the unspent reserve goes back once the key is
/// quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_is_served_from_a_lease_and_the_unspent_reserve_is_given_back() {
    let limits = big_limit();
    let emu = rtdb::emulator().await;
    let clock = ManualClock::new(T0);
    let fleet = fleet(&emu, 1, &limits, &clock).await;
    emu.faults().set_latency(Duration::from_millis(20));
    let tally = hammer(&fleet, 16, 2_000, "big", "leased").await;
    let puts = emu.stats().method("PUT");
    eprintln!("measured: 1 instance, 16 callers, 2,000 checks -> {tally:?}, {puts} PUTs");
    assert_eq!((tally.admitted, tally.not_shared), (2_000, 0), "{tally:?}");
    assert!(
        tally.from_lease >= 1_000,
        "most checks come from the reserve: {tally:?}"
    );
    assert!(
        puts * 5 <= 2_000,
        "at most one write per 5 checks: {puts} PUTs"
    );
    let w = (T0 / WINDOW_MS) as i64;
    assert_eq!(
        node_settles(&emu, "rateLimits/big/leased", w, 2_000).await,
        json!({ w.to_string(): 2_000 }),
        "the unspent reserve was given back"
    );
}

/// Leases switched off: the same load costs a write per batch and nothing says LEASE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_leases_off_every_decision_comes_from_a_store_write() {
    let limits = big_limit();
    let emu = rtdb::emulator().await;
    let clock = ManualClock::new(T0);
    let options = LimiterOptions {
        lease: LeaseOptions::OFF,
        ..LimiterOptions::default()
    };
    let h = rtdb::instance(&emu, limits, clock, options).await;
    emu.faults().set_latency(Duration::from_millis(20));
    let tally = hammer(std::slice::from_ref(&h), 16, 400, "big", "unleased").await;
    assert_eq!((tally.admitted, tally.from_lease), (400, 0), "{tally:?}");
    let w = (T0 / WINDOW_MS) as i64;
    assert_eq!(
        emu.value(NS, "rateLimits/big/unleased"),
        json!({ w.to_string(): 400 })
    );
}

/// A store that answers but where another writer always wins: the check is denied,
/// shared, with a short retry; nothing is admitted locally and the breaker stays closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_only_loses_races_is_denied_not_admitted_locally() {
    let emu = Arc::new(rtdb::emulator().await);
    let clock = ManualClock::new(T0);
    let mut h = rtdb::instance(&emu, Limits::builtin(), clock, LimiterOptions::default()).await;
    let w = (T0 / WINDOW_MS) as i64;
    assert!(h.check("", "raced").await.allowed, "warm the ETag cache");
    emu.faults().set_latency(Duration::from_millis(20));
    // Another writer changes the node every millisecond: every conditional PUT fails.
    let writer = {
        let emu = emu.clone();
        tokio::spawn(async move {
            for n in 2..100_000u32 {
                emu.set_value(
                    NS,
                    "rateLimits/mcp/raced",
                    json!({ w.to_string(): n % 50 + 2 }),
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let started = Instant::now();
    let r = h.check("", "raced").await;
    let took = started.elapsed();
    writer.abort();
    eprintln!(
        "measured: contended check answered in {took:?}: {r:?}; {:?}",
        emu.stats()
    );
    assert!(!r.allowed && r.shared, "{r:?}");
    assert_eq!(r.source(), ratelimit::pb::Source::Store);
    assert_eq!(r.remaining, 0);
    assert_eq!(r.retry_after.as_ref().map(|d| d.seconds), Some(1));
    assert!(took < Duration::from_millis(1_500 + 300), "{took:?}");
    assert!(
        emu.stats().status(412) >= 2,
        "it did try: {:?}",
        emu.stats()
    );
    assert_eq!(
        h.limiter.breaker_state(),
        Some(ratelimit::breaker::State::Closed),
        "losing races says nothing bad about the store"
    );
    // Lease decisions are reported with their own source name.
    assert_eq!(Source::Lease.as_str(), "lease");
}

/// A Reset through B empties the counter while A still holds an unspent reserve. When A's
/// key goes quiet it gives the reserve back; that must not erase the hits B counted since
/// the Reset (the counter no longer holds A's reserve at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_given_back_after_a_reset_elsewhere_does_not_erase_the_hits_counted_since() {
    let limits = big_limit();
    let emu = rtdb::emulator().await;
    let clock = ManualClock::new(T0);
    // A long idle, so the reserve is still out when the Reset comes.
    let options = LimiterOptions {
        lease: LeaseOptions {
            idle: Duration::from_secs(1),
            ..LeaseOptions::default()
        },
        ..LimiterOptions::default()
    };
    let a = rtdb::instance(&emu, limits.clone(), clock.clone(), options.clone()).await;
    let mut b = rtdb::instance(&emu, limits, clock, options).await;
    emu.faults().set_latency(Duration::from_millis(20));
    let tally = hammer(std::slice::from_ref(&a), 16, 300, "big", "reset-lease").await;
    assert_eq!(tally.admitted, 300, "{tally:?}");
    let w = (T0 / WINDOW_MS) as i64;
    let path = "rateLimits/big/reset-lease";
    // Let a refill still in flight land (well inside the 1 s idle), so that A writes
    // nothing more before its give-back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = emu.value(NS, path)[w.to_string()].as_u64().unwrap_or(0);
    assert!(held > 300, "A holds a reserve: the node counts {held}");

    b.limiter
        .reset("big", "reset-lease", None)
        .await
        .expect("reset");
    let puts = emu.stats().method("PUT");
    for _ in 0..20 {
        assert!(b.check("big", "reset-lease").await.allowed);
    }

    // A's key goes quiet: within its idle time (1 s) it gives back what it holds. (Had a
    // refill of A's crossed the Reset, the node would also hold that new reserve until
    // then; A then gives back exactly that one.)
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        emu.stats().method("PUT") > puts + 20,
        "A tried to give its reserve back"
    );
    assert_eq!(
        emu.value(NS, path),
        json!({ w.to_string(): 20 }),
        "B's 20 hits since the Reset are still counted"
    );
}
