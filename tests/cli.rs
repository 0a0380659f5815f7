//! The `ratelimit` binary as an operator runs it: startup validation and its messages.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn ratelimit(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ratelimit"));
    cmd.args(args)
        .env_remove("RATELIMIT_DATABASE_URL")
        .env_remove("FIREBASE_DATABASE_EMULATOR_HOST")
        .env_remove("RATELIMIT_LIMITS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ratelimit-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

#[test]
fn limits_check_prints_limits_or_the_exact_problem() {
    let good = temp_file(
        "good.toml",
        "[[limit]]\nname = \"mcp\"\nrequests = 120\nwindow = \"60s\"\ndefault = true\n\
         [[limit]]\nname = \"signin\"\nrequests = 5\nwindow = \"15m\"\non_store_failure = \"deny\"\n",
    );
    let o = ratelimit(&["limits", "check", &good.to_string_lossy()], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "mcp\t120 per 1m\ton_store_failure=local\t(default)\nsignin\t5 per 15m\ton_store_failure=deny\n"
    );
    let bad = temp_file(
        "bad.toml",
        "[[limit]]\nname = \"mcp\"\nrequests = 120\nwindow = \"0s\"\n",
    );
    let o = ratelimit(&["limits", "check", &bad.to_string_lossy()], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "error: {}: limit \"mcp\": window must be whole seconds between 1s and 31 days, got 0s\n",
            bad.display()
        )
    );
}

#[test]
fn serve_refuses_a_bad_limits_file_before_listening() {
    let bad = temp_file(
        "dup.toml",
        "[[limit]]\nname = \"a\"\nrequests = 1\nwindow = \"1s\"\ndefault = true\n[[limit]]\nname = \"a\"\nrequests = 1\nwindow = \"1s\"\n",
    );
    let o = ratelimit(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--limits",
            &bad.to_string_lossy(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("limit \"a\": duplicate name"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn serve_refuses_a_database_url_that_is_not_rtdb() {
    let o = ratelimit(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "https://example.com",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not a Realtime Database host"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn missing_credentials_stop_startup_quickly_with_a_fix() {
    let home = std::env::temp_dir().join(format!("ratelimit-nohome-{}", std::process::id()));
    let started = Instant::now();
    let o = ratelimit(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "https://bladbase-prod.firebaseio.com",
            "--credentials-timeout",
            "5s",
        ],
        &[
            ("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json"),
            ("HOME", &home.to_string_lossy()),
        ],
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "bounded by the timeout"
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("no Google credentials for RTDB"), "{err}");
    assert!(
        err.contains("FIREBASE_DATABASE_EMULATOR_HOST") && err.contains("--service-account"),
        "{err}"
    );
}

#[test]
fn serve_help_documents_every_flag_with_its_env_and_default() {
    let o = ratelimit(&["serve", "--help"], &[]);
    let help = String::from_utf8_lossy(&o.stdout);
    for want in [
        "[env: RATELIMIT_PORT=]",
        "$PORT (Cloud Run sets it), else 50051",
        "[env: RATELIMIT_METRICS_LISTEN=]",
        "[env: RATELIMIT_LOG_FORMAT=]",
        "[env: RATELIMIT_MAX_IN_FLIGHT=]",
        "[env: RATELIMIT_DRAIN_TIMEOUT=]",
        "[default: 8s]",
        "[env: RATELIMIT_MAX_CONNECTION_AGE=]",
        "[env: RATELIMIT_BREAKER_FAILURES=]",
        "[env: RATELIMIT_BREAKER_COOLDOWN=]",
        "[env: RATELIMIT_LIMITS=]",
        "[env: RATELIMIT_STORE_TIMEOUT=]",
        "[default: 1.5s]",
        "[env: RATELIMIT_DATABASE_URL=]",
        "[env: RATELIMIT_RTDB_ROOT=]",
        "[default: rateLimits]",
        "RATELIMIT_ADMIN_TOKEN",
    ] {
        assert!(help.contains(want), "missing {want:?} in:\n{help}");
    }
}
