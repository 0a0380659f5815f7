//! The client library (`ratelimit::client`) against a real service on loopback, a
//! stopped one and a black hole; its tower layer; and the `ratelimit check` CLI.
//!
//! Calls are counted, not assumed: the service's store counts `admit` calls (one per
//! `Check` RPC, since the memory store has no deny cache of its own), and the black hole
//! parses the HTTP/2 frames it receives and counts `HEADERS` frames (one per RPC).

use async_trait::async_trait;
use ratelimit::breaker::{BreakerConfig, State};
use ratelimit::client::{Client, ClientError, RateLimitLayer};
use ratelimit::clock::ManualClock;
use ratelimit::decision::{CheckError, Source};
use ratelimit::limiter::{Limiter, LimiterOptions};
use ratelimit::limits::{Limit, Limits};
use ratelimit::pb::rate_limiter_client::RateLimiterClient;
use ratelimit::pb::rate_limiter_server::{RateLimiter, RateLimiterServer};
use ratelimit::pb::{self, CheckRequest};
use ratelimit::server::Running;
use ratelimit::store::{Admission, CounterStore, MemoryStore, StoreError, WindowCount};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tower::{Layer, ServiceExt};

/// 2026-11-30T00:00:10Z: inside a minute window, 50 s before it ends.
const T0: u64 = 1_764_460_810_000;
const WINDOW: i64 = (T0 / 60_000) as i64;

/// A memory store that counts the service's store calls.
struct Counting {
    inner: MemoryStore,
    admits: AtomicUsize,
}

#[async_trait]
impl CounterStore for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn is_remote(&self) -> bool {
        false
    }

    async fn admit(
        &self,
        limit: &Limit,
        key: &str,
        window: i64,
        costs: &[u32],
    ) -> Result<Admission, StoreError> {
        self.admits.fetch_add(1, Ordering::SeqCst);
        self.inner.admit(limit, key, window, costs).await
    }

    async fn peek(&self, limit: &Limit, key: &str, window: i64) -> Result<WindowCount, StoreError> {
        self.inner.peek(limit, key, window).await
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        self.inner.reset(limit, key).await
    }
}

struct Service {
    server: Running,
    clock: ManualClock,
    store: Arc<Counting>,
}

impl Service {
    fn admits(&self) -> usize {
        self.store.admits.load(Ordering::SeqCst)
    }

    /// A client of this service on the same clock.
    fn client(&self) -> ratelimit::client::ClientBuilder {
        Client::builder(self.server.url()).clock(Arc::new(self.clock.clone()))
    }
}

fn limits(toml: &str) -> Limits {
    Limits::from_toml("test", toml).expect("valid test limits")
}

const T3: &str = "[[limit]]\nname = \"t\"\nrequests = 3\nwindow = \"60s\"\ndefault = true\n\
                  [[limit]]\nname = \"u\"\nrequests = 2\nwindow = \"1h\"\n";

fn start_on(limits: Limits, clock: &ManualClock, addr: SocketAddr) -> Service {
    let store = Arc::new(Counting {
        inner: MemoryStore::new(),
        admits: AtomicUsize::new(0),
    });
    let limiter = Arc::new(Limiter::new(
        limits,
        store.clone(),
        Arc::new(clock.clone()),
        LimiterOptions::default(),
    ));
    let admin = ratelimit::server::admin::AdminToken::new("admin-token");
    let server = Running::start(limiter, admin, addr).expect("server starts");
    Service {
        server,
        clock: clock.clone(),
        store,
    }
}

fn start(limits: Limits) -> Service {
    start_on(
        limits,
        &ManualClock::new(T0),
        "127.0.0.1:0".parse().expect("addr"),
    )
}

/// A listener that accepts connections and never answers; it counts what arrives.
#[derive(Default)]
struct BlackHole {
    connections: AtomicUsize,
    bytes: AtomicUsize,
    /// HTTP/2 HEADERS frames received: one per RPC sent.
    headers: AtomicUsize,
}

impl BlackHole {
    async fn start() -> (Arc<Self>, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let hole = Arc::new(Self::default());
        let h = hole.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                h.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(h.clone().swallow(socket));
            }
        });
        (hole, url)
    }

    /// Reads and parses the connection's frames, answering nothing.
    async fn swallow(self: Arc<Self>, mut socket: tokio::net::TcpStream) {
        const PREFACE: usize = 24;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        let mut preface_seen = false;
        loop {
            let n = match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            self.bytes.fetch_add(n, Ordering::SeqCst);
            buf.extend_from_slice(&chunk[..n]);
            if !preface_seen {
                if buf.len() < PREFACE {
                    continue;
                }
                buf.drain(..PREFACE);
                preface_seen = true;
            }
            // Frame: 24-bit length, 8-bit type, 8-bit flags, 32-bit stream id, payload.
            while buf.len() >= 9 {
                let len =
                    usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
                if buf.len() < 9 + len {
                    break;
                }
                if buf[3] == 0x1 {
                    self.headers.fetch_add(1, Ordering::SeqCst);
                }
                buf.drain(..9 + len);
            }
        }
    }

    fn snapshot(&self) -> (usize, usize, usize) {
        (
            self.connections.load(Ordering::SeqCst),
            self.bytes.load(Ordering::SeqCst),
            self.headers.load(Ordering::SeqCst),
        )
    }
}

#[tokio::test]
async fn decisions_match_the_service_and_caller_bugs_are_errors() {
    let svc = start(limits(T3));
    let client = svc.client().learn_limits(false).build().expect("client");
    let mut raw = RateLimiterClient::connect(svc.server.url())
        .await
        .expect("raw client connects");

    for step in 0..4 {
        let want = raw
            .check(CheckRequest {
                key: "raw".into(),
                limit: "t".into(),
                cost: 1,
            })
            .await
            .expect("raw check")
            .into_inner();
        let got = client.check("t", "lib", 1).await.expect("check");
        assert_eq!(
            (
                got.allowed,
                got.limit,
                got.remaining,
                got.shared,
                &*got.limit_name,
                got.window
            ),
            (
                want.allowed,
                want.limit,
                want.remaining,
                want.shared,
                want.limit_name.as_str(),
                want.window
            ),
            "step {step}"
        );
        assert_eq!(
            got.reset_after.as_secs(),
            want.reset_after.map_or(0, |d| d.seconds as u64)
        );
        assert_eq!(
            got.retry_after.map(|d| d.as_secs()),
            want.retry_after.map(|d| d.seconds as u64)
        );
        assert_eq!(got.source, Source::Store);
        assert_eq!(got.window, WINDOW);
        assert_eq!(got.reset_after, Duration::from_secs(50));
    }
    let last = client.check("t", "fresh", 1).await.expect("check");
    assert_eq!((last.allowed, last.remaining), (true, 2));

    let peek = client.peek("t", "lib").await.expect("peek");
    assert_eq!(
        (peek.allowed, peek.remaining, peek.shared, peek.source),
        (false, 0, true, Source::Store)
    );
    let default = client.check("", "other", 1).await.expect("default limit");
    assert_eq!((&*default.limit_name, default.limit), ("t", 3));

    // Caller bugs are errors with the service's own message, never a fallback.
    let raw_message = |key: String, limit: &str, cost: u32| {
        let mut raw = raw.clone();
        let limit = limit.to_owned();
        async move {
            raw.check(CheckRequest { key, limit, cost })
                .await
                .expect_err("the service refuses it")
                .message()
                .to_owned()
        }
    };
    let long = "k".repeat(513);
    for (key, err) in [
        ("", CheckError::EmptyKey),
        (long.as_str(), CheckError::KeyTooLong(513)),
    ] {
        let got = client.check("t", key, 1).await.expect_err("bad key");
        assert_eq!(got, ClientError::Invalid(err));
        assert_eq!(got.to_string(), raw_message(key.to_owned(), "t", 1).await);
    }
    let unknown = client.check("nope", "k", 1).await.expect_err("unknown");
    assert!(matches!(unknown, ClientError::NotFound(_)), "{unknown:?}");
    assert_eq!(
        unknown.to_string(),
        raw_message("k".into(), "nope", 1).await
    );
    // "t" is not among this client's limits (fallback = built-in mcp), so the service
    // checks the cost; a client that knows "t" refuses it itself, with the same words.
    let too_big = client.check("t", "k", 4).await.expect_err("cost");
    assert!(matches!(too_big, ClientError::InvalidArgument(_)));
    let knows = svc
        .client()
        .fallback_limits(limits(T3))
        .build()
        .expect("client");
    let admits = svc.admits();
    let local = knows.check("t", "k", 4).await.expect_err("cost");
    assert!(matches!(
        local,
        ClientError::Invalid(CheckError::CostTooLarge { .. })
    ));
    assert_eq!(local.to_string(), too_big.to_string());
    assert_eq!(local.to_string(), raw_message("k".into(), "t", 4).await);
    assert_eq!(svc.admits(), admits);
    assert_eq!(
        client.breaker_state(),
        State::Closed,
        "errors are not failures"
    );
}

#[tokio::test]
async fn the_client_learns_the_services_limits_and_falls_back_with_them() {
    let svc = start(limits(T3));
    let client = svc.client().build().expect("client");
    assert_eq!(client.limits().names(), ["mcp"], "the built-in fallback");
    assert!(client.check("u", "k", 1).await.expect("check").shared);
    // Learning happens in the background after the service first answers.
    let started = Instant::now();
    while client.limits().names() != ["t", "u"] {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "limits not learned"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(client.window_of("u"), Some(Duration::from_secs(3_600)));
    assert_eq!(client.window_of(""), Some(Duration::from_secs(60)));

    svc.server.stop().await.expect("server stops");
    let got: Vec<(bool, u32, bool, Source)> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            let d = client.check("u", "k2", 1).await.expect("fallback");
            v.push((d.allowed, d.limit, d.shared, d.source));
        }
        v
    };
    assert_eq!(
        got,
        [
            (true, 2, false, Source::ClientFallback),
            (true, 2, false, Source::ClientFallback),
            (false, 2, false, Source::ClientFallback),
        ],
        "the learned limit u = 2/h decides locally"
    );
    let default = client.check("", "k3", 1).await.expect("fallback");
    assert_eq!((&*default.limit_name, default.limit), ("t", 3));
    // A limit nobody told the client about is not unlimited (this pinned an error,
    // `NoFallbackLimit`, before issue 10): the default limit's numbers, its own name.
    let unknown = client.check("uploads", "k", 1).await.expect("decided");
    assert_eq!(
        (
            &*unknown.limit_name,
            unknown.limit,
            unknown.remaining,
            unknown.source
        ),
        ("uploads", 3, 2, Source::ClientFallback)
    );
}

const POLICIES: &str = "[[limit]]\nname = \"t\"\nrequests = 3\nwindow = \"60s\"\ndefault = true\n\
    [[limit]]\nname = \"signin\"\nrequests = 2\nwindow = \"15m\"\non_store_failure = \"deny\"\n\
    [[limit]]\nname = \"uploads\"\nrequests = 2\nwindow = \"1h\"\non_store_failure = \"allow\"\n";

/// Four checks of key `k` under `limit`: (allowed, source, remaining, retry_after in s).
async fn four(client: &Client, limit: &str) -> Vec<(bool, Source, u32, Option<u64>)> {
    let mut got = Vec::new();
    for _ in 0..4 {
        let d = client.check(limit, "k", 1).await.expect("decided locally");
        assert!(!d.shared, "{d:?}");
        assert_eq!(&*d.limit_name, limit);
        got.push((
            d.allowed,
            d.source,
            d.remaining,
            d.retry_after.map(|r| r.as_secs()),
        ));
    }
    got
}

#[tokio::test]
async fn with_the_service_down_the_client_applies_each_limits_failure_policy() {
    let svc = start(limits(POLICIES));
    // One client learns the limits from ListLimits (its own fallback is the built-in
    // `mcp`); the other never reaches the service and has them as fallback limits.
    let learned = svc.client().build().expect("client");
    assert!(
        learned
            .check("t", "warm-up", 1)
            .await
            .expect("check")
            .shared
    );
    let started = Instant::now();
    while learned.limits().names() != ["t", "signin", "uploads"] {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "limits not learned"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let from_file = svc
        .client()
        .fallback_limits(limits(POLICIES))
        .build()
        .expect("client");
    let store = svc.store.clone();
    let admits = svc.admits();
    svc.server.stop().await.expect("server stops");
    // T0 is 10 s into a 60 s window and a 15 min one.
    let (fp, cf) = (Source::FailurePolicy, Source::ClientFallback);
    for client in [learned, from_file] {
        assert_eq!(
            four(&client, "signin").await,
            vec![(false, fp, 0, Some(890)); 4],
            "deny refuses even the first attempt"
        );
        assert_eq!(
            four(&client, "uploads").await,
            vec![(true, fp, 1, None); 4],
            "allow admits past the limit (2), counting nothing"
        );
        assert_eq!(
            four(&client, "t").await,
            [
                (true, cf, 2, None),
                (true, cf, 1, None),
                (true, cf, 0, None),
                (false, cf, 0, Some(50))
            ],
            "local counts in the client's own window"
        );
        assert_eq!(
            four(&client, "never-heard-of").await,
            [
                (true, cf, 2, None),
                (true, cf, 1, None),
                (true, cf, 0, None),
                (false, cf, 0, Some(50))
            ],
            "an unknown limit: the default's 3 per 60 s, in its own window, not t's"
        );
    }
    assert_eq!(
        store.admits.load(Ordering::SeqCst),
        admits,
        "the service was down: no store call"
    );
}

#[tokio::test]
async fn a_stopped_service_means_local_decisions_then_shared_ones_when_it_returns() {
    let clock = ManualClock::new(T0);
    let svc = start_on(limits(T3), &clock, "127.0.0.1:0".parse().expect("addr"));
    let addr = svc.server.addr;
    let client = svc
        .client()
        .fallback_limits(limits(T3))
        .breaker(BreakerConfig {
            failures: 2,
            cooldown: Duration::from_millis(300),
        })
        .build()
        .expect("client");
    for _ in 0..2 {
        assert!(client.check("t", "k", 1).await.expect("check").shared);
    }

    svc.server.stop().await.expect("server stops");
    let mut slowest = Duration::ZERO;
    let mut decisions = Vec::new();
    for _ in 0..4 {
        let started = Instant::now();
        let d = client.check("t", "k", 1).await.expect("fallback");
        slowest = slowest.max(started.elapsed());
        decisions.push((d.allowed, d.shared, d.source));
    }
    println!("stopped service: slowest fallback check took {slowest:?}");
    assert!(slowest < Duration::from_millis(1_500), "{slowest:?}");
    // The client's own window starts empty: 3 admitted, then refused.
    assert_eq!(
        decisions,
        [
            (true, false, Source::ClientFallback),
            (true, false, Source::ClientFallback),
            (true, false, Source::ClientFallback),
            (false, false, Source::ClientFallback),
        ]
    );
    assert_eq!(client.breaker_state(), State::Open);

    // The service comes back on the same address; the client reconnects by itself
    // once a probe gets through after the cool-down.
    let back = start_on(limits(T3), &clock, addr);
    let started = Instant::now();
    loop {
        let d = client.check("t", "again", 1).await.expect("check");
        if d.shared {
            assert_eq!((d.source, d.remaining), (Source::Store, 2));
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "client never reconnected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("reconnected {:?} after the restart", started.elapsed());
    assert_eq!(client.breaker_state(), State::Closed);
    assert!(back.admits() >= 1);
}

#[tokio::test]
async fn a_black_hole_costs_one_deadline_per_check_until_the_breaker_opens() {
    let (hole, url) = BlackHole::start().await;
    let client = Client::builder(url)
        .deadline(Duration::from_millis(200))
        .breaker(BreakerConfig {
            failures: 3,
            cooldown: Duration::from_secs(60),
        })
        .build()
        .expect("client");

    // Bad input never costs an RPC.
    let started = Instant::now();
    assert!(client.check("mcp", "", 1).await.is_err());
    assert!(client.check("mcp", "k", 121).await.is_err());
    assert!(started.elapsed() < Duration::from_millis(50));
    assert_eq!(hole.snapshot(), (0, 0, 0), "nothing sent for bad input");

    for i in 0..3 {
        let started = Instant::now();
        let d = client.check("mcp", "k", 1).await.expect("fallback");
        let took = started.elapsed();
        println!("black hole check {i}: {took:?}");
        assert!(
            took >= Duration::from_millis(180) && took < Duration::from_millis(1_000),
            "check {i} took {took:?}"
        );
        assert!(d.allowed && !d.shared);
        assert_eq!(d.source, Source::ClientFallback);
    }
    assert_eq!(client.breaker_state(), State::Open);
    // Let the last call's cancellation reach the listener before counting.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = hole.snapshot();
    println!("black hole before the open breaker: (connections, bytes, HEADERS) = {before:?}");
    assert_eq!(before.2, 3, "one HEADERS frame per check");

    let started = Instant::now();
    for _ in 0..50 {
        let d = client.check("mcp", "k", 1).await.expect("local");
        assert!(!d.shared);
        assert_eq!(d.source, Source::ClientFallback);
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = hole.snapshot();
    println!("50 checks with the breaker open: {took:?}; black hole after = {after:?}");
    // Waiting out the deadline, the 50 would take at least 50 × 180 ms = 9 s; the bound
    // only has to tell that apart, with room for a loaded machine.
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(after, before, "no connection, byte or RPC while open");
    let remaining = client.peek("mcp", "k").await.expect("peek").remaining;
    assert_eq!(
        remaining,
        120 - 53,
        "every check counted in the local window"
    );
}

#[tokio::test]
async fn after_the_cooldown_exactly_one_probe_goes_out() {
    let (hole, url) = BlackHole::start().await;
    let client = Client::builder(url)
        .deadline(Duration::from_millis(200))
        .breaker(BreakerConfig {
            failures: 2,
            cooldown: Duration::from_millis(300),
        })
        .build()
        .expect("client");
    for _ in 0..2 {
        client.check("mcp", "k", 1).await.expect("fallback");
    }
    assert_eq!(client.breaker_state(), State::Open);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let before = hole.snapshot().2;

    let checks: Vec<_> = (0..20)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let d = c.check("mcp", "k", 1).await.expect("decision");
                (started.elapsed(), d.shared)
            })
        })
        .collect();
    let mut slow = 0;
    for c in checks {
        let (took, shared) = c.await.expect("task");
        assert!(!shared);
        if took >= Duration::from_millis(150) {
            slow += 1;
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let probes = hole.snapshot().2 - before;
    println!("20 concurrent checks after the cool-down: {slow} waited, {probes} RPC(s) sent");
    assert_eq!((slow, probes), (1, 1), "one probe, everyone else at once");
    assert_eq!(
        client.breaker_state(),
        State::Open,
        "the failed probe re-opens"
    );
    for _ in 0..10 {
        client.check("mcp", "k", 1).await.expect("local");
    }
    assert_eq!(hole.snapshot().2 - before, 1);
}

#[tokio::test]
async fn a_refused_key_is_refused_locally_until_retry_after_with_no_rpc() {
    let svc = start(limits(T3));
    let client = svc.client().learn_limits(false).build().expect("client");
    let allowed: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(client.check("t", "k", 1).await.expect("check").allowed);
        }
        v
    };
    assert_eq!(allowed, [true, true, true, false]);
    assert_eq!(svc.admits(), 4);

    for _ in 0..20 {
        let d = client.check("t", "k", 1).await.expect("check");
        assert_eq!(
            (d.allowed, d.shared, d.source, d.remaining),
            (false, true, Source::DenyCache, 0)
        );
        assert_eq!(d.retry_after, Some(Duration::from_secs(50)));
        assert_eq!(d.reset_after, Duration::from_secs(50));
    }
    assert_eq!(svc.admits(), 4, "20 refusals cost no RPC");
    assert!(client.check("t", "other", 1).await.expect("check").allowed);
    assert_eq!(svc.admits(), 5, "other keys still ask");

    // A refusal is believed for a second at most (a Reset elsewhere may have freed the
    // key): then one RPC asks again, and the service's answer is believed again.
    svc.clock.advance(999);
    assert_eq!(
        client.check("t", "k", 1).await.expect("check").source,
        Source::DenyCache
    );
    assert_eq!(svc.admits(), 5);
    svc.clock.advance(1);
    let d = client.check("t", "k", 1).await.expect("check");
    assert_eq!((d.allowed, d.source), (false, Source::Store));
    assert_eq!(svc.admits(), 6, "one RPC after the trust period");
    for _ in 0..20 {
        assert_eq!(
            client.check("t", "k", 1).await.expect("check").source,
            Source::DenyCache
        );
    }
    assert_eq!(svc.admits(), 6);

    svc.clock.advance(49_000); // retry_after has passed: a new window
    let d = client.check("t", "k", 1).await.expect("check");
    assert_eq!((d.allowed, d.source, d.remaining), (true, Source::Store, 2));
    assert_eq!(svc.admits(), 7);
}

#[tokio::test]
async fn a_reset_through_the_client_clears_its_refusal_at_once() {
    let svc = start(limits(T3));
    let client = svc
        .client()
        .learn_limits(false)
        .admin_token("admin-token")
        .build()
        .expect("client");
    for _ in 0..4 {
        client.check("t", "k", 1).await.expect("check");
    }
    let d = client.check("t", "k", 1).await.expect("check");
    assert_eq!((d.allowed, d.source), (false, Source::DenyCache));
    let out = client.reset("t", "k").await.expect("reset");
    assert!(out.shared, "{out:?}");
    assert_eq!(&*out.limit_name, "t");
    let d = client.check("t", "k", 1).await.expect("check");
    assert_eq!((d.allowed, d.source, d.remaining), (true, Source::Store, 2));
    assert_eq!(svc.admits(), 5, "four checks, then one after the reset");

    let wrong = svc
        .client()
        .learn_limits(false)
        .admin_token("not-the-token")
        .build()
        .expect("client");
    match wrong.reset("t", "k").await {
        Err(ClientError::Refused(m)) => {
            assert!(m.contains("admin token"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    let none = svc.client().learn_limits(false).build().expect("client");
    assert!(matches!(
        none.reset("t", "k").await,
        Err(ClientError::Config(_))
    ));
}

#[tokio::test]
async fn the_tower_layer_answers_429_and_adds_headers() {
    let svc = start(limits(
        "[[limit]]\nname = \"t\"\nrequests = 2\nwindow = \"60s\"\n",
    ));
    let client = svc
        .client()
        .fallback_limits(limits(
            "[[limit]]\nname = \"t\"\nrequests = 2\nwindow = \"60s\"\n",
        ))
        .build()
        .expect("client");
    let layer = RateLimitLayer::new(client, "t", |req: &http::Request<String>| {
        req.headers()
            .get("x-api-token")?
            .to_str()
            .ok()
            .map(str::to_owned)
    });
    let app = layer.layer(tower::service_fn(|_req: http::Request<String>| async {
        Ok::<_, Infallible>(http::Response::new(String::from("hello\n")))
    }));
    let call = |token: Option<&str>| {
        let app = app.clone();
        let mut req = http::Request::new(String::new());
        if let Some(t) = token {
            req.headers_mut()
                .insert("x-api-token", t.parse().expect("header value"));
        }
        async move { app.oneshot(req).await.expect("infallible") }
    };
    let headers = |r: &http::Response<String>| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = r
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_owned()))
            .collect();
        v.sort();
        v
    };
    let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        v.sort();
        v
    };

    let first = call(Some("alice")).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.body(), "hello\n");
    assert_eq!(
        headers(&first),
        owned(&[
            ("x-ratelimit-limit", "2"),
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset", "50"),
            ("ratelimit-policy", "\"t\";q=2;w=60"),
            ("ratelimit", "\"t\";r=1;t=50"),
        ])
    );
    assert_eq!(call(Some("alice")).await.status(), 200);
    let refused = call(Some("alice")).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.body(), "rate limit exceeded\n");
    assert_eq!(
        headers(&refused),
        owned(&[
            ("content-type", "text/plain; charset=utf-8"),
            ("x-ratelimit-limit", "2"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "50"),
            ("retry-after", "50"),
            ("ratelimit-policy", "\"t\";q=2;w=60"),
            ("ratelimit", "\"t\";r=0;t=50"),
        ])
    );
    assert_eq!(call(Some("bob")).await.status(), 200, "keys are separate");
    let anonymous = call(None).await;
    assert_eq!(anonymous.status(), 200);
    assert!(anonymous.headers().get("x-ratelimit-limit").is_none());
    let long = "x".repeat(600);
    assert_eq!(call(Some(&long)).await.status(), 400);
    assert_eq!(svc.admits(), 4, "alice ×3 (the third refused), bob ×1");
}

/// A service that answers every call with one status; it counts the calls.
struct Failing {
    code: tonic::Code,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl RateLimiter for Failing {
    async fn check(
        &self,
        _: tonic::Request<CheckRequest>,
    ) -> Result<tonic::Response<pb::CheckResponse>, tonic::Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(tonic::Status::new(
            self.code,
            format!("scripted {:?}", self.code),
        ))
    }

    async fn peek(
        &self,
        _: tonic::Request<pb::PeekRequest>,
    ) -> Result<tonic::Response<pb::CheckResponse>, tonic::Status> {
        Err(tonic::Status::new(self.code, "scripted"))
    }

    async fn reset(
        &self,
        _: tonic::Request<pb::ResetRequest>,
    ) -> Result<tonic::Response<pb::ResetResponse>, tonic::Status> {
        Err(tonic::Status::new(self.code, "scripted"))
    }

    async fn list_limits(
        &self,
        _: tonic::Request<pb::ListLimitsRequest>,
    ) -> Result<tonic::Response<pb::ListLimitsResponse>, tonic::Status> {
        Err(tonic::Status::new(self.code, "scripted"))
    }
}

async fn failing(code: tonic::Code) -> (String, Arc<AtomicUsize>) {
    let incoming = ratelimit::server::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let url = format!("http://{}", incoming.local_addr().expect("addr"));
    let calls = Arc::new(AtomicUsize::new(0));
    let service = RateLimiterServer::new(Failing {
        code,
        calls: calls.clone(),
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    (url, calls)
}

#[tokio::test]
async fn failing_statuses_fall_back_and_caller_bugs_are_errors() {
    use tonic::Code;
    for code in [
        Code::Unavailable,
        Code::Internal,
        Code::DeadlineExceeded,
        Code::ResourceExhausted,
        Code::Unknown,
        Code::Unimplemented,
        Code::PermissionDenied,
        Code::FailedPrecondition,
    ] {
        let (url, calls) = failing(code).await;
        let client = Client::new(url).expect("client");
        let d = client.check("mcp", "k", 1).await.expect("a local decision");
        assert_eq!(
            (d.allowed, d.shared, d.source, d.remaining),
            (true, false, Source::ClientFallback, 119),
            "{code:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{code:?}");
        let p = client.peek("mcp", "k").await.expect("a local peek");
        assert_eq!((p.shared, p.remaining), (false, 119), "{code:?}");
    }
    for code in [Code::InvalidArgument, Code::NotFound] {
        let (url, calls) = failing(code).await;
        let client = Client::new(url).expect("client");
        let err = client.check("mcp", "k", 1).await.expect_err("caller bug");
        let message = format!("scripted {code:?}");
        assert_eq!(
            err,
            if code == Code::NotFound {
                ClientError::NotFound(message)
            } else {
                ClientError::InvalidArgument(message)
            }
        );
        for _ in 0..10 {
            let _ = client.check("mcp", "k", 1).await;
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            11,
            "caller bugs never open the breaker"
        );
        assert_eq!(client.breaker_state(), State::Closed);
    }

    // Failing statuses do open it: 5 calls (the default), then none.
    let (url, calls) = failing(Code::Internal).await;
    let client = Client::new(url).expect("client");
    for _ in 0..20 {
        assert!(!client.check("mcp", "k", 1).await.expect("local").shared);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(client.breaker_state(), State::Open);
}

// ---- the CLI ----

fn ratelimit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ratelimit"))
        .args(args)
        .env_remove("RATELIMIT_URL")
        .env_remove("RATELIMIT_CHECK_LIMIT")
        .env_remove("RATELIMIT_CHECK_COST")
        .env_remove("RATELIMIT_CHECK_DEADLINE")
        .env_remove("RATELIMIT_LIMITS")
        .output()
        .expect("binary runs")
}

async fn cli(args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        ratelimit(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .expect("cli task");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = if stdout.trim().is_empty() {
        serde_json::Value::Null
    } else {
        assert_eq!(stdout.lines().count(), 1, "one line of JSON: {stdout}");
        serde_json::from_str(&stdout).expect("stdout is JSON")
    };
    (
        out.status.code(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_one_json_decision_and_exits_by_verdict() {
    let svc = start(limits(
        "[[limit]]\nname = \"t\"\nrequests = 2\nwindow = \"60s\"\n",
    ));
    let url = svc.server.url();
    for remaining in [1, 0] {
        let (code, json, stderr) =
            cli(&["check", "--server", &url, "--limit", "t", "cli-key"]).await;
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(
            json,
            serde_json::json!({
                "allowed": true, "limit": 2, "remaining": remaining, "reset_after_s": 50,
                "retry_after_s": null, "shared": true, "source": "store",
                "limit_name": "t", "window": WINDOW,
            })
        );
    }
    let (code, json, _) = cli(&["check", "--server", &url, "cli-key"]).await;
    assert_eq!(code, Some(1));
    assert_eq!(
        json,
        serde_json::json!({
            "allowed": false, "limit": 2, "remaining": 0, "reset_after_s": 50,
            "retry_after_s": 50, "shared": true, "source": "store",
            "limit_name": "t", "window": WINDOW,
        })
    );
    let (code, json, stderr) = cli(&["check", "--server", &url, "--cost", "3", "k"]).await;
    assert_eq!((code, json), (Some(2), serde_json::Value::Null));
    assert_eq!(
        stderr,
        "error: cost: must not exceed the 2 requests of limit \"t\", got 3\n"
    );
    assert_eq!(svc.admits(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_answers_alone_without_a_service_and_refuses_bad_input() {
    // A port nobody listens on.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let url = format!("http://{addr}");
    let started = Instant::now();
    let (code, json, stderr) = cli(&["check", "--server", &url, "lonely"]).await;
    println!("CLI with no service: {:?}", started.elapsed());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(json["shared"], false);
    assert_eq!(json["source"], "client_fallback");
    assert_eq!(
        (json["limit"].clone(), json["remaining"].clone()),
        (120.into(), 119.into())
    );
    assert_eq!(json["limit_name"], "mcp");
    assert!(stderr.contains("deciding locally"), "{stderr}");

    let url = url.as_str();
    let dir = std::env::temp_dir().join(format!("ratelimit-client-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("limits.toml");
    std::fs::write(
        &file,
        "[[limit]]\nname = \"signin\"\nrequests = 5\nwindow = \"15m\"\n",
    )
    .expect("write limits");
    let file = file.to_string_lossy().into_owned();
    let (code, json, stderr) = cli(&[
        "check", "--server", url, "--limits", &file, "--limit", "signin", "--cost", "2", "a@b.c",
    ])
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        (
            json["limit"].clone(),
            json["remaining"].clone(),
            json["shared"].clone()
        ),
        (5.into(), 3.into(), false.into())
    );
    // A limit the CLI knows nothing of: decided with the default's numbers (this was an
    // error, exit 2, before issue 10), and said so on stderr.
    let (code, json, stderr) = cli(&["check", "--server", url, "--limit", "signin", "k"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        (
            json["limit_name"].clone(),
            json["limit"].clone(),
            json["remaining"].clone()
        ),
        ("signin".into(), 120.into(), 119.into())
    );
    assert!(stderr.contains("limit unknown to this client"), "{stderr}");
    for (args, want) in [
        (
            vec!["check", "--server", url, ""],
            "error: key: must not be empty\n",
        ),
        (
            vec!["check", "--server", url, "--cost", "500", "k"],
            "error: cost: must not exceed the 120 requests of limit \"mcp\", got 500\n",
        ),
        (
            vec!["check", "--server", "ftp://ratelimit.example", "k"],
            "expected http://HOST:PORT or https://HOST",
        ),
        (
            vec!["check", "--server", url, "--cost", "abc", "k"],
            "invalid value 'abc'",
        ),
        (
            vec!["check", "--server", url, "--cost", "0", "k"],
            "invalid value '0'",
        ),
        (vec!["check", "--server", url], "KEY"),
        (
            vec![
                "check",
                "--server",
                url,
                "--limits",
                "/nonexistent.toml",
                "k",
            ],
            "/nonexistent.toml: cannot read the limits file",
        ),
    ] {
        let (code, json, stderr) = cli(&args).await;
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(json, serde_json::Value::Null, "{args:?}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
