//! Fault injection and request counters, through the library handle and over HTTP.

mod common;

use std::time::{Duration, Instant};

use common::req;
use rtdb_emulator::{Emulator, FaultConfig, Stats};
use serde_json::{Value, json};

async fn emu() -> Emulator {
    Emulator::start().await.expect("emulator starts")
}

#[tokio::test]
async fn latency_delays_every_request() {
    let e = emu().await;
    let a = e.addr();
    e.faults().set_latency(Duration::from_millis(150));
    let t = Instant::now();
    let r = req("GET", "/x.json?ns=n").owner().go(a).await;
    assert_eq!(r.status, 200);
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );
    e.faults().clear();
    let t = Instant::now();
    req("GET", "/x.json?ns=n").owner().go(a).await;
    assert!(
        t.elapsed() < Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn response_latency_comes_after_the_write() {
    let e = emu().await;
    let a = e.addr();
    e.faults().set_response_latency(Duration::from_millis(300));
    let put = tokio::spawn(async move { req("PUT", "/w.json?ns=n").owner().body("1").go(a).await });
    // The write is visible while its response is still held back.
    let t = Instant::now();
    while e.value("n", "w").is_null() {
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "write not applied early"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!put.is_finished());
    let r = put.await.expect("task");
    assert_eq!((r.status, r.body.as_str()), (200, "1"));
    assert!(t.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn injected_errors_are_not_applied_and_are_counted() {
    let e = emu().await;
    let a = e.addr();
    e.faults().set_error(503, 1.0);
    for _ in 0..3 {
        let r = req("PUT", "/x.json?ns=n").owner().body("1").go(a).await;
        assert_eq!(r.status, 503);
        assert_eq!(
            r.header("content-type"),
            Some("application/json; charset=utf-8")
        );
        assert!(r.json()["error"].is_string());
    }
    assert_eq!(e.value("n", "x"), Value::Null);
    e.faults().set_error(500, 1.0);
    assert_eq!(req("GET", "/x.json?ns=n").owner().go(a).await.status, 500);
    let s = e.stats();
    assert_eq!(
        (
            s.total,
            s.writes,
            s.status(503),
            s.status(500),
            s.method("PUT")
        ),
        (4, 0, 3, 1, 3)
    );

    // A fraction: roughly that share of requests fails.
    e.faults().set_error(503, 0.5);
    e.reset_stats();
    let mut failed = 0;
    for _ in 0..200 {
        if req("GET", "/x.json?ns=n").owner().go(a).await.status == 503 {
            failed += 1;
        }
    }
    assert!(
        (50..=150).contains(&failed),
        "{failed} of 200 failed at 0.5"
    );
    assert_eq!(e.stats().status(503), failed);
    e.faults().clear();
    assert_eq!(
        req("PUT", "/x.json?ns=n")
            .owner()
            .body("1")
            .go(a)
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn dropped_connections_get_no_response_and_no_write() {
    let e = emu().await;
    let a = e.addr();
    e.faults().set_drop(1.0);
    // The server closes without writing a byte (a reset is also acceptable).
    let raw = req("PUT", "/x.json?ns=n").owner().body("1").raw(a).await;
    assert!(
        raw.as_ref().map_or(true, Vec::is_empty),
        "expected a closed connection, got {raw:?}"
    );
    assert_eq!(e.value("n", "x"), Value::Null);
    let s = e.stats();
    assert_eq!(
        (s.total, s.dropped, s.writes, s.method("PUT")),
        (1, 1, 0, 1)
    );
    assert!(
        s.by_status.is_empty(),
        "dropped requests have no status: {s:?}"
    );
    e.faults().set_drop(0.0);
    assert_eq!(
        req("PUT", "/x.json?ns=n")
            .owner()
            .body("1")
            .go(a)
            .await
            .status,
        200
    );
    assert_eq!(e.stats().writes, 1);
}

#[tokio::test]
async fn drop_after_apply_writes_but_never_answers() {
    let e = emu().await;
    let a = e.addr();
    e.faults().set_drop_after_apply(1.0);
    let r = req("PUT", "/x.json?ns=n")
        .owner()
        .body(r#"{"count":1}"#)
        .raw(a)
        .await;
    assert!(r.as_ref().map_or(true, Vec::is_empty), "{r:?}");
    assert_eq!(e.value("n", "x"), json!({"count": 1}));
    let s = e.stats();
    assert_eq!((s.total, s.dropped, s.writes), (1, 1, 1));
}

#[tokio::test]
async fn counters_by_method_status_and_writes() {
    let e = emu().await;
    let a = e.addr();
    req("PUT", "/x.json?ns=n").owner().body("1").go(a).await; // 200 write
    req("PUT", "/x.json?ns=n")
        .owner()
        .header("if-match", "stale")
        .body("2")
        .go(a)
        .await; // 412
    req("PATCH", "/.json?ns=n")
        .owner()
        .body(r#"{"y":1}"#)
        .go(a)
        .await; // 200 write
    req("POST", "/l.json?ns=n&print=silent")
        .owner()
        .body("1")
        .go(a)
        .await; // 204 write
    req("DELETE", "/y.json?ns=n").owner().go(a).await; // 200 write
    req("GET", "/x.json?ns=n").owner().go(a).await; // 200
    req("GET", "/x.json?ns=n").go(a).await; // 401
    req("PUT", "/x.json?ns=n").body("3").go(a).await; // 401, not a write
    req("PUT", "/a.b.json?ns=n").owner().body("3").go(a).await; // 400
    req("PUT", "/.settings/rules.json?ns=n")
        .owner()
        .body(r#"{"rules":{}}"#)
        .go(a)
        .await; // 200, not a data write
    let s = e.stats();
    assert_eq!(s.total, 10);
    assert_eq!(s.writes, 4);
    assert_eq!(s.dropped, 0);
    assert_eq!(
        (
            s.method("GET"),
            s.method("PUT"),
            s.method("PATCH"),
            s.method("POST"),
            s.method("DELETE")
        ),
        (2, 5, 1, 1, 1)
    );
    assert_eq!(
        (
            s.status(200),
            s.status(204),
            s.status(400),
            s.status(401),
            s.status(412)
        ),
        (5, 1, 1, 2, 1)
    );
    e.reset_stats();
    assert_eq!(e.stats(), Stats::default());
}

#[tokio::test]
async fn http_control_endpoints() {
    let e = emu().await;
    let a = e.addr();
    req("GET", "/x.json?ns=n").owner().go(a).await;

    let r = req("GET", "/.emulator/stats").go(a).await;
    assert_eq!(r.status, 200);
    let s: Stats = serde_json::from_str(&r.body).expect("stats JSON");
    assert_eq!((s.total, s.status(200), s.method("GET")), (1, 1, 1));
    assert_eq!(r.json()["by_status"], json!({"200": 1}));

    // Set faults over HTTP: the whole configuration is replaced.
    let cfg = json!({"latency_ms": 0, "error_status": 500, "error_fraction": 1.0});
    let r = req("POST", "/.emulator/faults").json(&cfg).go(a).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["error_status"], json!(500));
    assert_eq!(e.faults().config().error_fraction, 1.0);
    assert_eq!(req("GET", "/x.json?ns=n").owner().go(a).await.status, 500);
    // Control endpoints bypass faults and are not counted.
    let cur: FaultConfig =
        serde_json::from_str(&req("GET", "/.emulator/faults").go(a).await.body).expect("config");
    assert_eq!(cur.error_status, 500);
    let r = req("POST", "/.emulator/faults")
        .json(&json!({"drop_fraction": 1.0}))
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        e.faults().config().error_fraction,
        0.0,
        "replaced, not merged"
    );
    assert!(req("GET", "/x.json?ns=n").owner().send(a).await.is_err());
    for bad in [
        json!({"drop_fraction": 2.0}),
        json!({"error_status": 42}),
        json!({"latency": 5}),
    ] {
        req("POST", "/.emulator/faults")
            .json(&bad)
            .go(a)
            .await
            .assert_error(400);
    }
    req("POST", "/.emulator/faults")
        .body("{")
        .go(a)
        .await
        .assert_error(400);
    let r = req("DELETE", "/.emulator/faults").go(a).await;
    assert_eq!(r.status, 200);
    assert_eq!(e.faults().config(), FaultConfig::default());
    let stats = e.stats();
    assert_eq!((stats.total, stats.dropped, stats.status(500)), (3, 1, 1));

    // Read-and-reset.
    let r = req("POST", "/.emulator/stats/reset").go(a).await;
    assert_eq!(
        serde_json::from_str::<Stats>(&r.body).expect("stats").total,
        3
    );
    assert_eq!(e.stats(), Stats::default());
    req("GET", "/.emulator/nope").go(a).await.assert_error(404);
    req("PUT", "/.emulator/stats").go(a).await.assert_error(405);
    assert_eq!(e.stats().total, 0);
}

#[tokio::test]
async fn latency_over_http_and_faults_handle_is_shared() {
    let e = emu().await;
    let a = e.addr();
    let handle = e.faults();
    req("POST", "/.emulator/faults")
        .json(&json!({"latency_ms": 120}))
        .go(a)
        .await;
    assert_eq!(handle.config().latency_ms, 120);
    let t = Instant::now();
    req("GET", "/x.json?ns=n").owner().go(a).await;
    assert!(t.elapsed() >= Duration::from_millis(120));
    handle.clear();
    let cfg: FaultConfig =
        serde_json::from_str(&req("GET", "/.emulator/faults").go(a).await.body).expect("config");
    assert_eq!(cfg, FaultConfig::default());
}

#[tokio::test]
async fn shutdown_and_drop_stop_the_server() {
    let e = emu().await;
    let a = e.addr();
    assert_eq!(req("GET", "/x.json?ns=n").owner().go(a).await.status, 200);
    e.shutdown().await;
    assert!(
        tokio::net::TcpStream::connect(a).await.is_err(),
        "still listening after shutdown"
    );

    let e = emu().await;
    let a = e.addr();
    // An idle keep-alive connection must not keep the server alive either.
    let idle = tokio::net::TcpStream::connect(a).await.expect("connect");
    drop(e);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        tokio::net::TcpStream::connect(a).await.is_err(),
        "still listening after drop"
    );
    let mut buf = [0u8; 1];
    idle.readable().await.expect("readable");
    assert_eq!(
        idle.try_read(&mut buf).unwrap_or(0),
        0,
        "idle connection closed"
    );
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<Emulator>();
    check::<rtdb_emulator::Faults>();
    check::<Stats>();
}

#[tokio::test]
async fn host_is_the_emulator_host_value() {
    let e = emu().await;
    assert_eq!(e.host(), format!("127.0.0.1:{}", e.addr().port()));
    assert_ne!(e.addr().port(), 0);
}
