//! Failing open against emulator faults: the store budget, fallback decisions, the
//! circuit breaker, failure policies and caller deadlines. Counts are asserted from the
//! emulator's counters; time bounds appear only where time is the point, and are generous.

mod common;

use common::rtdb::{self};
use common::{Harness, T0, limits, req};
use ratelimit::breaker::{BreakerConfig, State};
use ratelimit::clock::ManualClock;
use ratelimit::limiter::LimiterOptions;
use ratelimit::limits::Limits;
use ratelimit::pb::{CheckResponse, Source};
use std::time::{Duration, Instant};

fn opts(failures: u32, cooldown_ms: u64) -> LimiterOptions {
    LimiterOptions {
        store_timeout: Duration::from_millis(1_500),
        breaker: BreakerConfig {
            failures,
            cooldown: Duration::from_millis(cooldown_ms),
        },
        ..LimiterOptions::default()
    }
}

async fn timed_check(h: &Harness, limit: &str, key: &str) -> (CheckResponse, Duration) {
    let mut c = h.client.clone();
    let started = Instant::now();
    let r = c
        .check(req(limit, key, 1))
        .await
        .expect("a check never errors on store failure");
    (r.into_inner(), started.elapsed())
}

#[tokio::test]
async fn slow_store_answers_within_budget_then_the_breaker_stops_calling_then_recovers() {
    let emu = rtdb::emulator().await;
    emu.faults().set_latency(Duration::from_secs(3));
    let h = rtdb::instance(
        &emu,
        Limits::builtin(),
        ManualClock::new(T0),
        opts(5, 2_000),
    )
    .await;

    // 1. Every check returns within the 1.5 s budget + 0.3 s, decided locally.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let mut c = h.client.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let r = c
                .check(req("", &format!("slow-{i}"), 1))
                .await
                .map(|r| r.into_inner());
            (r, started.elapsed())
        }));
    }
    for t in tasks {
        let (r, took) = t.await.expect("join");
        let r = r.expect("no gRPC error");
        assert!(took < Duration::from_millis(1_800), "took {took:?}");
        assert!(r.allowed && !r.shared, "{r:?}");
        assert_eq!(r.source(), Source::LocalFallback);
    }
    // The store calls time out on their own timer (the store's, not the callers'), which
    // started a moment after the callers' equal budgets: the breaker opens a moment later.
    let answered = Instant::now();
    while h.limiter.breaker_state() != Some(State::Open) {
        assert!(
            answered.elapsed() < Duration::from_secs(1),
            "breaker still closed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // 2. Open breaker: 200 more checks answer at once and barely reach the store.
    let before = emu.stats().received;
    let started = Instant::now();
    for i in 0..200 {
        let (r, took) = timed_check(&h, "", &format!("k{}", i % 7)).await;
        assert!(
            !r.shared && took < Duration::from_millis(500),
            "{r:?} {took:?}"
        );
    }
    let reached = emu.stats().received - before;
    assert!(
        reached <= 2,
        "open breaker still called the store {reached} times"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );

    // 3. Fault cleared: decisions are shared again within the cool-down (+ one probe).
    emu.faults().clear();
    let cleared = Instant::now();
    loop {
        let (r, _) = timed_check(&h, "", "recovery").await;
        if r.shared {
            assert_eq!(r.source(), Source::Store);
            break;
        }
        assert!(
            cleared.elapsed() < Duration::from_millis(2_000 + 1_500 + 1_000),
            "still not shared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(h.limiter.breaker_state(), Some(State::Closed));
}

#[tokio::test]
async fn a_503_storm_falls_back_at_once_and_the_instance_admits_at_most_the_limit() {
    let emu = rtdb::emulator().await;
    emu.faults().set_error(503, 1.0);
    // A breaker that never opens: every check must still fall back without waiting.
    let h = rtdb::instance(
        &emu,
        Limits::builtin(),
        ManualClock::new(T0),
        opts(u32::MAX, 60_000),
    )
    .await;
    let mut admitted = 0;
    for _ in 0..300 {
        let (r, took) = timed_check(&h, "", "storm-key").await;
        assert!(
            took < Duration::from_millis(500),
            "waited {took:?} on a 503"
        );
        assert!(!r.shared);
        assert_eq!(r.source(), Source::LocalFallback);
        admitted += u32::from(r.allowed);
    }
    assert_eq!(
        admitted, 120,
        "local window: at most `limit` per window per instance"
    );
    // Without an open breaker each check tried the store once (its read failed) and
    // never retried: one request per check.
    assert_eq!(emu.stats().status(503), 300);
}

#[tokio::test]
async fn dropped_connections_fall_back() {
    let emu = rtdb::emulator().await;
    let h = rtdb::instance(
        &emu,
        Limits::builtin(),
        ManualClock::new(T0),
        opts(u32::MAX, 60_000),
    )
    .await;
    let (r, _) = timed_check(&h, "", "warm").await;
    assert!(r.shared, "healthy before the fault");
    emu.faults().set_drop(1.0);
    for i in 0..20 {
        let (r, took) = timed_check(&h, "", &format!("drop-{}", i % 2)).await;
        assert!(r.allowed && !r.shared, "{r:?}");
        assert!(took < Duration::from_millis(1_000), "{took:?}");
    }
    assert!(emu.stats().dropped >= 20, "{:?}", emu.stats());
    emu.faults().clear();
    let (r, _) = timed_check(&h, "", "drop-0").await;
    assert!(r.shared);
}

#[tokio::test]
async fn each_failure_policy_does_what_it_says() {
    let emu = rtdb::emulator().await;
    emu.faults().set_error(500, 1.0);
    let l = limits(
        "[[limit]]\nname = \"mcp\"\nrequests = 3\nwindow = \"60s\"\ndefault = true\n\
         [[limit]]\nname = \"uploads\"\nrequests = 3\nwindow = \"60s\"\non_store_failure = \"allow\"\n\
         [[limit]]\nname = \"signin\"\nrequests = 3\nwindow = \"60s\"\non_store_failure = \"deny\"\n",
    );
    let h = rtdb::instance(&emu, l, ManualClock::new(T0), opts(u32::MAX, 60_000)).await;
    let mut got = std::collections::BTreeMap::new();
    for limit in ["mcp", "uploads", "signin"] {
        let mut allowed = Vec::new();
        for _ in 0..5 {
            let (r, _) = timed_check(&h, limit, "user").await;
            assert!(!r.shared, "{limit}: {r:?}");
            let want = if limit == "mcp" {
                Source::LocalFallback
            } else {
                Source::FailurePolicy
            };
            assert_eq!(r.source(), want, "{limit}");
            allowed.push(r.allowed);
        }
        got.insert(limit, allowed);
    }
    assert_eq!(got["mcp"], [true, true, true, false, false], "local window");
    assert_eq!(got["uploads"], [true; 5], "allow");
    assert_eq!(got["signin"], [false; 5], "deny");
}

#[tokio::test]
async fn a_caller_with_a_300ms_deadline_gets_a_fallback_decision_before_it() {
    let emu = rtdb::emulator().await;
    emu.faults().set_latency(Duration::from_secs(3));
    let h = rtdb::instance(
        &emu,
        Limits::builtin(),
        ManualClock::new(T0),
        opts(5, 2_000),
    )
    .await;
    let mut c = h.client.clone();
    for i in 0..3 {
        let mut request = tonic::Request::new(req("", &format!("deadline-{i}"), 1));
        request.set_timeout(Duration::from_millis(300));
        let started = Instant::now();
        let r = c
            .check(request)
            .await
            .expect("a decision, not DEADLINE_EXCEEDED")
            .into_inner();
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
        assert!(r.allowed && !r.shared);
        assert_eq!(r.source(), Source::LocalFallback);
    }
}

#[tokio::test]
async fn connection_refused_falls_back_at_once() {
    let emu = rtdb::emulator().await;
    let store = rtdb::store(&emu);
    emu.shutdown().await; // the port now refuses connections
    let h = common::start_with(
        Limits::builtin(),
        store,
        ManualClock::new(T0),
        None,
        opts(u32::MAX, 60_000),
    )
    .await;
    for i in 0..10 {
        let (r, took) = timed_check(&h, "", &format!("refused-{}", i % 3)).await;
        assert!(r.allowed && !r.shared, "{r:?}");
        assert_eq!(r.source(), Source::LocalFallback);
        assert!(
            took < Duration::from_millis(500),
            "no waiting on a refused connection: {took:?}"
        );
    }
}

/// `message` with a gRPC deadline of `ms`.
fn with_deadline<T>(message: T, ms: u64) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.set_timeout(Duration::from_millis(ms));
    r
}

/// The answer's `shared`, or `None` when the caller's own deadline passed first (on a
/// loaded machine 10 ms can run out on the way); any other error fails the test.
fn shared_or_late<T>(
    r: Result<tonic::Response<T>, tonic::Status>,
    shared: fn(&T) -> bool,
) -> Option<bool> {
    match r {
        Ok(r) => Some(shared(r.get_ref())),
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ) =>
        {
            None
        }
        Err(s) => panic!("{s:?}"),
    }
}

#[tokio::test]
async fn callers_with_short_deadlines_cannot_open_the_breaker() {
    use ratelimit::pb::{PeekRequest, ResetRequest};
    let emu = rtdb::emulator().await;
    emu.faults().set_latency(Duration::from_millis(5));
    let h = rtdb::instance(
        &emu,
        Limits::builtin(),
        ManualClock::new(T0),
        opts(5, 60_000),
    )
    .await;
    let mut c = h.client.clone();
    // 10 ms leaves no store budget (50 ms margin); 52 ms leaves 2 ms, less than one round
    // trip, so those calls are in flight when their callers stop waiting.
    for ms in [10, 52] {
        for i in 0..100 {
            let key = format!("short-{}", i % 10);
            let peek = PeekRequest {
                key: key.clone(),
                limit: String::new(),
            };
            let p = c.peek(with_deadline(peek, ms)).await;
            assert_ne!(shared_or_late(p, |p| p.shared), Some(true));
            let r = c.check(with_deadline(req("", &key, 1), ms)).await;
            // Shared only from this instance's lease (hits an abandoned write counted,
            // kept rather than lost; no store call); never refused.
            assert_ne!(
                shared_or_late(r, |r| (r.shared && r.source() != Source::Lease)
                    || !r.allowed),
                Some(true),
                "{ms} ms"
            );
        }
        for i in 0..20 {
            let mut reset = with_deadline(
                ResetRequest {
                    key: format!("short-{i}"),
                    limit: String::new(),
                },
                ms,
            );
            reset.metadata_mut().insert(
                "authorization",
                "Bearer admin-token".parse().expect("ascii"),
            );
            let r = c.reset(reset).await;
            assert_ne!(shared_or_late(r, |r| r.shared), Some(true));
        }
        assert_eq!(h.limiter.breaker_state(), Some(State::Closed), "{ms} ms");
    }
    // Let the abandoned calls land, then a caller with no deadline is shared at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = c
        .check(req("", "patient", 1))
        .await
        .expect("check")
        .into_inner();
    assert!(r.shared, "{r:?}");
    assert_eq!(r.source(), Source::Store);
    assert_eq!(h.limiter.breaker_state(), Some(State::Closed));
    let s = emu.stats();
    eprintln!("measured: 440 short-deadline calls + 1 -> {s:?}");
    assert_eq!(s.status(503) + s.dropped, 0, "{s:?}");
}

#[tokio::test]
async fn a_key_the_store_refuses_with_400_fails_open_alone() {
    let emu = rtdb::emulator().await;
    emu.faults().set_path_error("/rateLimits/mcp/poison", 400);
    let h = rtdb::instance(
        &emu,
        Limits::builtin(),
        ManualClock::new(T0),
        opts(5, 60_000),
    )
    .await;
    for i in 0..50 {
        let (r, _) = timed_check(&h, "", "poison").await;
        assert!(r.allowed && !r.shared, "check {i}: {r:?}");
        assert_eq!(r.source(), Source::LocalFallback);
    }
    assert_eq!(emu.stats().status(400), 50, "every check asked the store");
    assert_eq!(h.limiter.breaker_state(), Some(State::Closed));
    let (r, _) = timed_check(&h, "", "healthy").await;
    assert!(r.allowed && r.shared, "{r:?}");
    assert_eq!(r.source(), Source::Store);
}
