//! The binary as Cloud Run runs it: real process, real signals, real scrapes. Metrics
//! counts, JSON log shape, no secrets in logs at any level, SIGTERM draining with an
//! open `Health/Watch` stream, and load shedding.

mod common;

use common::rtdb::{DB_URL, emulator};
use common::{admin_reset, req};
use ratelimit::pb::rate_limiter_client::RateLimiterClient;
use ratelimit::pb::{ResetRequest, Source};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A `ratelimit serve` process whose stdout and stderr are captured.
struct Proc {
    child: Child,
    port: u16,
    output: Arc<Mutex<String>>,
}

impl Proc {
    async fn start(args: &[&str], env: &[(&str, &str)]) -> Proc {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ratelimit"));
        cmd.args(["serve", "--listen", &listen])
            .args(args)
            .env_remove("RATELIMIT_DATABASE_URL")
            .env_remove("FIREBASE_DATABASE_EMULATOR_HOST")
            .env_remove("K_SERVICE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn ratelimit");
        let output = Arc::new(Mutex::new(String::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let out = output.clone();
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut o) = out.lock() {
                        o.push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }
            });
        }
        let p = Proc {
            child,
            port,
            output,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut h) = p.health().await
                && h.check(HealthCheckRequest::default()).await.is_ok()
            {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "server did not come up: {}",
                p.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn client(&self) -> RateLimiterClient<tonic::transport::Channel> {
        RateLimiterClient::connect(self.url())
            .await
            .expect("connect")
    }

    async fn health(
        &self,
    ) -> Result<HealthClient<tonic::transport::Channel>, tonic::transport::Error> {
        let ch = tonic::transport::Channel::from_shared(self.url())
            .expect("url")
            .connect()
            .await?;
        Ok(HealthClient::new(ch))
    }

    fn output(&self) -> String {
        self.output.lock().map(|o| o.clone()).unwrap_or_default()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill {sig}");
    }

    /// Waits for the process to exit, at most `limit`; returns its exit code.
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn scrape(port: u16) -> String {
    ratelimit::install_crypto_provider();
    reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body")
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn metrics_count_decisions_store_latency_errors_fallbacks_and_breaker() {
    let emu = emulator().await;
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let p = Proc::start(
        &[
            "--metrics-listen",
            &maddr,
            "--database-url",
            DB_URL,
            "--breaker-failures",
            "3",
            "--breaker-cooldown",
            "60s",
        ],
        &[("FIREBASE_DATABASE_EMULATOR_HOST", &emu.host())],
    )
    .await;
    let before = scrape(mport).await;
    assert_eq!(
        metric(&before, "ratelimit_breaker_state"),
        Some(0.0),
        "closed, from the start:\n{before}"
    );
    // Series an alert takes a rate() of exist at 0 before anything happened, with HELP.
    assert_eq!(
        metric(&before, "ratelimit_shed_total"),
        Some(0.0),
        "{before}"
    );
    assert_eq!(
        metric(&before, "ratelimit_contention_denials_total{limit=\"mcp\"}"),
        Some(0.0),
        "{before}"
    );
    assert!(before.contains("# HELP ratelimit_shed_total"), "{before}");
    let mut c = p.client().await;
    for _ in 0..3 {
        assert!(
            c.check(req("", "m", 1))
                .await
                .expect("check")
                .into_inner()
                .shared
        );
    }
    emu.faults().set_error(503, 1.0);
    for i in 0..5 {
        let r = c
            .check(req("", &format!("f{i}"), 1))
            .await
            .expect("check")
            .into_inner();
        assert!(!r.shared);
    }
    let text = scrape(mport).await;
    let m = |s: &str| metric(&text, s);
    assert_eq!(
        m(r#"ratelimit_decisions_total{limit="mcp",outcome="allowed",source="store"}"#),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        m(r#"ratelimit_decisions_total{limit="mcp",outcome="allowed",source="local_fallback"}"#),
        Some(5.0)
    );
    assert_eq!(
        m(r#"ratelimit_fallbacks_total{limit="mcp",reason="server_error"}"#),
        Some(3.0)
    );
    assert_eq!(
        m(r#"ratelimit_fallbacks_total{limit="mcp",reason="circuit_open"}"#),
        Some(2.0)
    );
    assert_eq!(
        m(r#"ratelimit_store_errors_total{kind="server_error"}"#),
        Some(3.0)
    );
    assert_eq!(m("ratelimit_breaker_state"), Some(2.0), "open");
    assert_eq!(
        m(r#"ratelimit_breaker_transitions_total{to="open"}"#),
        Some(1.0)
    );
    assert_eq!(
        m(r#"ratelimit_store_request_duration_seconds_count{op="GET",status="200"}"#),
        Some(1.0)
    );
    assert_eq!(
        m(r#"ratelimit_store_request_duration_seconds_count{op="PUT",status="200"}"#),
        Some(3.0)
    );
    assert_eq!(
        m(r#"ratelimit_store_request_duration_seconds_count{op="GET",status="503"}"#),
        Some(3.0)
    );
    assert_eq!(m("ratelimit_checks_in_flight"), Some(0.0));
}

#[tokio::test]
async fn json_logs_have_cloud_logging_fields_and_no_secret_appears_at_trace_level() {
    let emu = emulator().await;
    let p = Proc::start(
        &[
            "--log-format",
            "json",
            "--log",
            "trace",
            "--database-url",
            DB_URL,
        ],
        &[
            ("RATELIMIT_ADMIN_TOKEN", "S3cr3t-Adm1n-T0ken"),
            ("FIREBASE_DATABASE_EMULATOR_HOST", &emu.host()),
        ],
    )
    .await;
    let mut c = p.client().await;
    for token in ["S3cr3t-Adm1n-T0ken", "Wr0ng-Pr3sented-T0ken"] {
        let mut r = tonic::Request::new(ResetRequest {
            key: "k".into(),
            limit: String::new(),
        });
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
        let _ = c.reset(r).await;
    }
    c.check(req("", "k", 1)).await.expect("check");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let out = p.output();
    assert!(
        !out.contains("S3cr3t-Adm1n-T0ken"),
        "admin token leaked:\n{out}"
    );
    assert!(
        !out.contains("Wr0ng-Pr3sented-T0ken"),
        "presented token leaked:\n{out}"
    );
    assert!(
        !out.to_ascii_lowercase().contains("bearer owner"),
        "RTDB bearer token leaked:\n{out}"
    );
    assert!(
        emu.stats().method("PUT") >= 1,
        "the check went through the RTDB store"
    );
    let lines: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("every JSON line parses"))
        .collect();
    let serving = lines
        .iter()
        .find(|l| l["message"] == "ratelimit serving")
        .unwrap_or_else(|| panic!("startup line missing:\n{out}"));
    assert_eq!(serving["severity"], "INFO");
    assert!(
        serving["time"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{serving}"
    );
    assert_eq!(serving["store"], "rtdb");
    assert!(
        lines.iter().any(|l| l["message"] == "key reset by admin"),
        "{out}"
    );
}

#[tokio::test]
async fn sigterm_drains_in_flight_calls_refuses_new_ones_ends_watch_streams_and_exits_zero() {
    let emu = emulator().await;
    // A cold key costs a read and a write: ~1 s in all, inside the 1.5 s budget, and
    // still in flight when SIGTERM arrives 300 ms in.
    emu.faults().set_latency(Duration::from_millis(500));
    let mut p = Proc::start(
        &["--database-url", DB_URL, "--drain-timeout", "5s"],
        &[("FIREBASE_DATABASE_EMULATOR_HOST", &emu.host())],
    )
    .await;
    let mut health = p.health().await.expect("health");
    let mut watch = health
        .watch(HealthCheckRequest {
            service: "bladbase.ratelimit.v1.RateLimiter".into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = watch
        .message()
        .await
        .expect("stream")
        .expect("first status");
    assert_eq!(first.status(), ServingStatus::Serving);

    let mut c = p.client().await;
    let in_flight = tokio::spawn(async move { c.check(req("", "drain", 1)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = Instant::now();
    p.signal("-TERM");

    let next = tokio::time::timeout(Duration::from_secs(2), watch.message())
        .await
        .expect("watch sees the change")
        .expect("stream")
        .expect("status");
    assert_eq!(next.status(), ServingStatus::NotServing);
    let end = tokio::time::timeout(Duration::from_secs(2), watch.message())
        .await
        .expect("the watch stream ends after NOT_SERVING");
    assert!(matches!(end, Ok(None)), "{end:?}");

    let r = in_flight
        .await
        .expect("join")
        .expect("the in-flight call finishes")
        .into_inner();
    assert!(r.allowed && r.shared, "{r:?}");
    assert_eq!(r.source(), Source::Store);

    let fresh = RateLimiterClient::connect(p.url()).await;
    if let Ok(mut fresh) = fresh {
        assert!(
            fresh.check(req("", "late", 1)).await.is_err(),
            "new calls are refused"
        );
    }

    let code = tokio::task::spawn_blocking(move || {
        let c = p.wait(Duration::from_secs(6));
        (c, p.output())
    })
    .await
    .expect("join");
    let took = signalled.elapsed();
    assert_eq!(code.0, Some(0), "exit code; output:\n{}", code.1);
    // The in-flight call ends about 0.7 s after SIGTERM; nothing else holds the drain.
    assert!(
        took < Duration::from_secs(4),
        "exited {took:?} after SIGTERM (drain 5 s)"
    );
    assert!(!code.1.contains("drain deadline reached"), "{}", code.1);
}

#[tokio::test]
async fn past_the_concurrency_limit_calls_fail_fast_with_resource_exhausted() {
    let emu = emulator().await;
    emu.faults().set_latency(Duration::from_millis(800));
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let p = Proc::start(
        &[
            "--database-url",
            DB_URL,
            "--max-in-flight",
            "2",
            "--metrics-listen",
            &maddr,
        ],
        &[("FIREBASE_DATABASE_EMULATOR_HOST", &emu.host())],
    )
    .await;
    let c = p.client().await;
    let mut tasks = Vec::new();
    for i in 0..10 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let r = c.check(req("", &format!("shed-{i}"), 1)).await;
            (r, started.elapsed())
        }));
    }
    let (mut ok, mut shed) = (0, 0);
    for t in tasks {
        let (r, took) = t.await.expect("join");
        match r {
            Ok(_) => ok += 1,
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                assert!(
                    took < Duration::from_millis(500),
                    "shed calls fail fast: {took:?}"
                );
                shed += 1;
            }
        }
    }
    assert_eq!((ok, shed), (2, 8));
    assert_eq!(
        metric(&scrape(mport).await, "ratelimit_shed_total"),
        Some(8.0)
    );
}

#[tokio::test]
async fn no_caller_key_appears_in_the_log_at_info_while_the_store_fails() {
    let emu = emulator().await;
    let p = Proc::start(
        &[
            "--log-format",
            "json",
            "--log",
            "info",
            "--database-url",
            DB_URL,
            "--store-timeout",
            "300ms",
            // Never open: every check below reaches the failing store.
            "--breaker-failures",
            "1000000",
        ],
        &[
            ("RATELIMIT_ADMIN_TOKEN", common::ADMIN_TOKEN),
            ("FIREBASE_DATABASE_EMULATOR_HOST", &emu.host()),
        ],
    )
    .await;
    let mut c = p.client().await;
    let email = "wonderland.alice@example.com";
    let check = |key: &str| req("", key, 1);
    assert!(
        c.check(check(email))
            .await
            .expect("check")
            .into_inner()
            .shared
    );
    let node = emu
        .value(common::rtdb::NS, "rateLimits/mcp")
        .as_object()
        .and_then(|o| o.keys().next().cloned())
        .expect("the key's node");

    // Every way the store can fail, each with e-mail keys: 503s, dropped connections
    // (reqwest errors carry the URL), a 400 for the key's path, a timeout, a node this
    // service did not write; then a Reset and a Peek while it fails.
    let faults = emu.faults();
    faults.set_error(503, 1.0);
    assert!(
        !c.check(check(email))
            .await
            .expect("check")
            .into_inner()
            .shared
    );
    faults.clear();
    faults.set_drop(1.0);
    assert!(
        !c.check(check(email))
            .await
            .expect("check")
            .into_inner()
            .shared
    );
    faults.clear();
    faults.set_path_error("wonderland", 400);
    assert!(
        !c.check(check(email))
            .await
            .expect("check")
            .into_inner()
            .shared
    );
    faults.clear();
    faults.set_latency(Duration::from_millis(600));
    assert!(
        !c.check(check("queen.of.hearts@example.com"))
            .await
            .expect("check")
            .into_inner()
            .shared
    );
    faults.clear();
    emu.set_value(
        common::rtdb::NS,
        &format!("rateLimits/mcp/{node}"),
        serde_json::json!("not a counter"),
    );
    assert!(
        !c.check(check(email))
            .await
            .expect("check")
            .into_inner()
            .shared
    );
    faults.set_drop(1.0);
    let reset = admin_reset("", email);
    assert!(!c.reset(reset).await.expect("reset").into_inner().shared);
    let peek = ratelimit::pb::PeekRequest {
        key: email.into(),
        limit: String::new(),
    };
    assert!(!c.peek(peek).await.expect("peek").into_inner().shared);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let out = p.output();
    let warnings = out
        .lines()
        .filter(|l| l.contains("\"WARNING\"") || l.contains("\"ERROR\""))
        .count();
    assert!(warnings >= 5, "the failures were logged:\n{out}");
    // The key as written, and as keys::encode writes it (`~2E`; `%2E` before issue 10).
    for needle in [
        "wonderland",
        "queen",
        "example.com",
        "example~2E",
        "example%2E",
        "hearts",
    ] {
        let leaks: Vec<&str> = out.lines().filter(|l| l.contains(needle)).collect();
        assert!(
            leaks.is_empty(),
            "{needle:?} in the log:\n{}",
            leaks.join("\n")
        );
    }
    assert!(
        out.contains("key:"),
        "nodes are named by the key's tag:\n{out}"
    );
}
