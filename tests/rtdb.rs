//! The RTDB store against the RTDB REST emulator: round trips (counted by the emulator,
//! not timed), node layout and key encoding, exactness across instances, windows, auth,
//! security rules, and the unknown-outcome rule.

mod common;

use common::rtdb::{self, NS};
use common::{T0, admin_reset, req};
use ratelimit::clock::ManualClock;
use ratelimit::limiter::{Limiter, LimiterOptions};
use ratelimit::limits::Limits;
use ratelimit::pb::{PeekRequest, Source};
use ratelimit::store::rtdb::RtdbOptions;
use ratelimit::store::rtdb::auth::{GoogleTokens, SCOPES, TokenSource};
use ratelimit::store::rtdb::keys;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const W: i64 = (T0 / 60_000) as i64;

fn opts() -> LimiterOptions {
    // Generous: these tests are about the store path, and a debug build on a loaded
    // 2-core machine must not fall back and blur the counts.
    LimiterOptions {
        store_timeout: Duration::from_secs(10),
        ..LimiterOptions::default()
    }
}

#[tokio::test]
async fn one_hundred_sequential_checks_cost_at_most_102_requests() {
    let emu = rtdb::emulator().await;
    let mut h = rtdb::instance(&emu, Limits::builtin(), ManualClock::new(T0), opts()).await;
    for i in 0..100 {
        let r = h.check("", "token-seq").await;
        assert!(r.allowed && r.shared, "check {i}: {r:?}");
        assert_eq!(r.source(), Source::Store);
        assert_eq!(r.remaining, 119 - i);
    }
    let s = emu.stats();
    eprintln!(
        "measured: 100 sequential checks -> {} emulator requests ({s:?})",
        s.total
    );
    assert!(s.total <= 102, "{s:?}");
    assert_eq!(
        (s.method("GET"), s.method("PUT")),
        (1, 100),
        "one read, then one PUT per check: {s:?}"
    );
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/token-seq"),
        json!({ W.to_string(): 100 })
    );
}

#[tokio::test]
async fn sixty_four_concurrent_checks_of_a_fresh_key_cost_at_most_8_writes() {
    let emu = rtdb::emulator().await;
    let h = rtdb::instance(&emu, Limits::builtin(), ManualClock::new(T0), opts()).await;
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
    let s = emu.stats();
    eprintln!(
        "measured: 64 concurrent checks of a fresh key -> {} PUTs, {} requests",
        s.method("PUT"),
        s.total
    );
    assert!(s.method("PUT") <= 8, "batched writes: {s:?}");
    assert_eq!(
        s.status(412),
        0,
        "single flight: no self-inflicted conflicts: {s:?}"
    );
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/hot"),
        json!({ W.to_string(): 64 })
    );
}

#[tokio::test]
async fn an_exhausted_key_costs_no_requests_for_the_rest_of_its_window() {
    let emu = rtdb::emulator().await;
    let mut h = rtdb::instance(&emu, Limits::builtin(), ManualClock::new(T0), opts()).await;
    for _ in 0..120 {
        assert!(h.check("", "greedy").await.allowed);
    }
    emu.reset_stats();
    for _ in 0..1_000 {
        let r = h.check("", "greedy").await;
        assert!(!r.allowed && r.shared);
        assert_eq!(r.source(), Source::DenyCache);
        assert_eq!(r.retry_after.map(|d| d.seconds), Some(50));
    }
    assert_eq!(emu.stats().total, 0, "{:?}", emu.stats());
    // The next window goes back to the store and starts from zero.
    h.clock.advance(50_000);
    let r = h.check("", "greedy").await;
    assert!(r.allowed);
    assert_eq!((r.remaining, r.source()), (119, Source::Store));
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/greedy"),
        json!({ (W + 1).to_string(): 1 }),
        "old window gone"
    );
}

#[tokio::test]
async fn awkward_keys_each_land_as_exactly_one_node_under_the_limit() {
    let emu = rtdb::emulator().await;
    let mut h = rtdb::instance(&emu, Limits::builtin(), ManualClock::new(T0), opts()).await;
    let long = "ü".repeat(250); // 500 bytes of non-ASCII: too long for base64, hashed
    let medium = ".".repeat(300); // escapes to 900 bytes: base64
    let keys_in = [
        "alice@example.com",
        "alice+1@example.com",
        "10.0.0.1",
        "a/b",
        "../x",
        "$#[]",
        "%2F",
        "~b",
        medium.as_str(),
        long.as_str(),
    ];
    for k in keys_in {
        let r = h.check("", k).await;
        assert!(r.allowed && r.shared, "{k}: {r:?}");
    }
    let tree = emu.value(NS, "rateLimits/mcp");
    let children = tree.as_object().expect("an object of nodes");
    assert_eq!(children.len(), keys_in.len(), "{tree}");
    // Each node is named by keys::encode: [A-Za-z0-9_~-] only, so the URL path the
    // emulator decoded is the name as written; every node but the hashed one decodes.
    let mut names: Vec<&String> = children.keys().collect();
    names.sort();
    let mut expected: Vec<String> = keys_in.iter().map(|k| keys::encode(k)).collect();
    expected.sort();
    assert_eq!(names, expected.iter().collect::<Vec<_>>());
    for k in keys_in {
        let e = keys::encode(k);
        assert!(
            e.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-~".contains(&b)),
            "{e}"
        );
        let want = (k != long).then(|| k.to_owned());
        assert_eq!(keys::decode(&e), want, "{k:?}");
    }
    for node in children.values() {
        assert_eq!(
            node,
            &json!({ W.to_string(): 1 }),
            "each node is one counter, not a subtree"
        );
    }
    assert_eq!(
        emu.value(NS, "rateLimits").as_object().map(|m| m.len()),
        Some(1),
        "nothing escaped mcp/"
    );
}

#[tokio::test]
async fn three_instances_on_one_emulator_admit_exactly_120_of_600() {
    let emu = rtdb::emulator().await;
    let clock = ManualClock::new(T0);
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(rtdb::instance(&emu, Limits::builtin(), clock.clone(), opts()).await);
    }
    let mut tasks = Vec::new();
    for i in 0..600 {
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
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/shared-key"),
        json!({ W.to_string(): 120 })
    );
}

#[tokio::test]
async fn a_node_holding_a_newer_window_is_counted_in_that_window() {
    let emu = rtdb::emulator().await;
    emu.set_value(
        NS,
        "rateLimits/mcp/skewed",
        json!({ (W + 1).to_string(): 5 }),
    );
    let mut h = rtdb::instance(&emu, Limits::builtin(), ManualClock::new(T0), opts()).await;
    let r = h.check("", "skewed").await;
    assert!(r.allowed);
    assert_eq!((r.window, r.remaining), (W + 1, 114));
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/skewed"),
        json!({ (W + 1).to_string(): 6 })
    );
}

#[tokio::test]
async fn a_foreign_node_is_never_overwritten_and_the_check_falls_back() {
    let emu = rtdb::emulator().await;
    let foreign = json!({"hello": "world"});
    emu.set_value(NS, "rateLimits/mcp/foreign", foreign.clone());
    let mut h = rtdb::instance(&emu, Limits::builtin(), ManualClock::new(T0), opts()).await;
    let r = h.check("", "foreign").await;
    assert!(r.allowed && !r.shared);
    assert_eq!(r.source(), Source::LocalFallback);
    assert_eq!(emu.value(NS, "rateLimits/mcp/foreign"), foreign);
    assert_eq!(emu.stats().method("PUT"), 0);
}

#[tokio::test]
async fn peek_reads_and_reset_deletes_the_node() {
    let emu = rtdb::emulator().await;
    let mut h = rtdb::instance(&emu, Limits::builtin(), ManualClock::new(T0), opts()).await;
    for _ in 0..120 {
        h.check("", "signin-user").await;
    }
    assert_eq!(h.check("", "signin-user").await.source(), Source::DenyCache);
    let p = h
        .client
        .peek(PeekRequest {
            key: "signin-user".into(),
            limit: String::new(),
        })
        .await
        .expect("peek")
        .into_inner();
    assert_eq!((p.allowed, p.remaining, p.shared), (false, 0, true));
    let reset = admin_reset("", "signin-user");
    let r = h.client.reset(reset).await.expect("reset").into_inner();
    assert!(r.shared);
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/signin-user"),
        serde_json::Value::Null
    );
    let r = h.check("", "signin-user").await;
    assert_eq!(
        (r.allowed, r.remaining, r.source()),
        (true, 119, Source::Store),
        "deny cache cleared too"
    );
}

#[tokio::test]
async fn a_lost_write_answer_is_never_reapplied() {
    let emu = rtdb::emulator().await;
    let clock = ManualClock::new(T0);
    let store = rtdb::store_with(
        &emu,
        Arc::new(ratelimit::store::rtdb::auth::EmulatorOwner),
        RtdbOptions {
            request_timeout: Duration::from_millis(300),
            ..RtdbOptions::default()
        },
    );
    let limiter = Limiter::new(Limits::builtin(), store, Arc::new(clock), opts());
    assert!(
        limiter.check("", "k", 1, None).await.expect("ok").shared,
        "warm the ETag cache"
    );
    // The next write is applied, then its answer is held past the request timeout.
    emu.faults().set_response_latency(Duration::from_secs(1));
    let d = limiter.check("", "k", 1, None).await.expect("ok");
    assert!(d.allowed && !d.shared, "unknown outcome falls back: {d:?}");
    emu.faults().clear();
    tokio::time::sleep(Duration::from_millis(800)).await; // let the held response finish
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/k"),
        json!({ W.to_string(): 2 }),
        "applied once, not re-sent"
    );
    let d = limiter.check("", "k", 1, None).await.expect("ok");
    assert_eq!(
        (d.shared, d.remaining),
        (true, 117),
        "next check sees the landed write"
    );
}

/// A gcp_auth provider that hands out given tokens in turn and records the scopes asked.
struct ScriptedProvider {
    tokens: Mutex<Vec<&'static str>>,
    scopes: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl gcp_auth::TokenProvider for ScriptedProvider {
    async fn token(&self, scopes: &[&str]) -> Result<Arc<gcp_auth::Token>, gcp_auth::Error> {
        self.scopes
            .lock()
            .expect("lock")
            .extend(scopes.iter().map(|s| s.to_string()));
        let mut tokens = self.tokens.lock().expect("lock");
        let t = if tokens.len() > 1 {
            tokens.remove(0)
        } else {
            tokens[0]
        };
        let token: gcp_auth::Token =
            serde_json::from_value(json!({"access_token": t, "expires_in": 3600}))
                .expect("token json");
        Ok(Arc::new(token))
    }
    async fn project_id(&self) -> Result<Arc<str>, gcp_auth::Error> {
        Ok(Arc::from("bladbase-test"))
    }
}

#[tokio::test]
async fn a_401_refreshes_the_token_once_and_retries() {
    let emu = rtdb::emulator().await;
    let provider = Arc::new(ScriptedProvider {
        tokens: Mutex::new(vec!["expired-token", "owner"]),
        scopes: Mutex::default(),
    });
    let tokens: Arc<dyn TokenSource> = Arc::new(GoogleTokens::new(provider.clone()));
    let store = rtdb::store_with(&emu, tokens, RtdbOptions::default());
    let limiter = Limiter::new(
        Limits::builtin(),
        store,
        Arc::new(ManualClock::new(T0)),
        opts(),
    );
    let d = limiter.check("", "k", 1, None).await.expect("ok");
    assert!(d.allowed && d.shared, "{d:?}");
    let s = emu.stats();
    assert_eq!(
        (s.status(401), s.method("GET"), s.method("PUT")),
        (1, 2, 1),
        "{s:?}"
    );
    let scopes = provider.scopes.lock().expect("lock").clone();
    assert!(
        scopes.iter().all(|s| SCOPES.contains(&s.as_str())) && scopes.len() >= 2,
        "{scopes:?}"
    );
}

#[tokio::test]
async fn rules_deny_clients_and_a_non_admin_token_falls_back() {
    let emu = rtdb::emulator().await;
    // A client (no admin token) can neither read nor write rateLimits.
    ratelimit::install_crypto_provider();
    let http = reqwest::Client::new();
    let url = format!("http://{}/rateLimits/mcp/k.json?ns={NS}", emu.host());
    let r = http.get(&url).send().await.expect("get");
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(
        r.json::<serde_json::Value>().await.expect("json"),
        json!({"error": "Permission denied"})
    );
    let r = http
        .put(&url)
        .body(r#"{"1": 0}"#)
        .send()
        .await
        .expect("put");
    assert_eq!(r.status().as_u16(), 401);
    let r = http
        .get(format!("http://{}/.json?ns={NS}", emu.host()))
        .send()
        .await
        .expect("get root");
    assert_eq!(
        r.status().as_u16(),
        401,
        "nothing above rateLimits grants access"
    );

    // A service whose token is not admin gets 401 twice and fails open.
    let provider = Arc::new(ScriptedProvider {
        tokens: Mutex::new(vec!["user-token"]),
        scopes: Mutex::default(),
    });
    let store = rtdb::store_with(
        &emu,
        Arc::new(GoogleTokens::new(provider)),
        RtdbOptions::default(),
    );
    let limiter = Limiter::new(
        Limits::builtin(),
        store,
        Arc::new(ManualClock::new(T0)),
        opts(),
    );
    let d = limiter.check("", "k", 1, None).await.expect("ok");
    assert!(d.allowed && !d.shared, "{d:?}");
    assert_eq!(emu.value(NS, "rateLimits/mcp/k"), serde_json::Value::Null);
}

/// A store whose cached ETag has gone stale because another writer changed the node.
async fn stale_tag_limiter(emu: &rtdb_emulator::Emulator, max_attempts: u32) -> Limiter {
    let store = rtdb::store_with(
        emu,
        Arc::new(ratelimit::store::rtdb::auth::EmulatorOwner),
        RtdbOptions {
            max_attempts,
            ..RtdbOptions::default()
        },
    );
    let limiter = Limiter::new(
        Limits::builtin(),
        store,
        Arc::new(ManualClock::new(T0)),
        opts(),
    );
    assert!(
        limiter
            .check("", "raced", 1, None)
            .await
            .expect("ok")
            .shared,
        "warm the cache"
    );
    // Another instance writes: the cached tag no longer matches.
    emu.set_value(NS, "rateLimits/mcp/raced", json!({ W.to_string(): 10 }));
    emu.reset_stats();
    limiter
}

#[tokio::test]
async fn a_412_is_retried_from_its_body_and_tag_without_a_read() {
    let emu = rtdb::emulator().await;
    let limiter = stale_tag_limiter(&emu, 3).await;
    let d = limiter.check("", "raced", 1, None).await.expect("ok");
    assert!(d.shared && d.allowed, "{d:?}");
    assert_eq!(
        d.remaining,
        120 - 11,
        "counted on top of the other writer's 10"
    );
    let s = emu.stats();
    assert_eq!(
        (s.method("GET"), s.method("PUT"), s.status(412)),
        (0, 2, 1),
        "{s:?}"
    );
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/raced"),
        json!({ W.to_string(): 11 })
    );
}

#[tokio::test]
async fn running_out_of_attempts_is_contention_and_is_retried_not_fallen_back() {
    // Contention is not an outage (DESIGN §9): a store call that ran out of attempts is
    // retried from the last 412's value and tag while the check's budget allows, and never
    // sent to the local window.
    let emu = rtdb::emulator().await;
    let limiter = stale_tag_limiter(&emu, 1).await;
    let d = limiter.check("", "raced", 1, None).await.expect("ok");
    assert!(d.allowed && d.shared, "{d:?}");
    assert_eq!(d.source, ratelimit::decision::Source::Store);
    assert_eq!(
        d.remaining,
        120 - 11,
        "counted on top of the other writer's 10"
    );
    let s = emu.stats();
    assert_eq!(
        (s.method("GET"), s.method("PUT"), s.status(412)),
        (0, 2, 1),
        "the retry starts from the 412's body and tag: {s:?}"
    );
    assert_eq!(
        emu.value(NS, "rateLimits/mcp/raced"),
        json!({ W.to_string(): 11 })
    );
    assert_eq!(
        limiter.breaker_state(),
        Some(ratelimit::breaker::State::Closed)
    );
}
