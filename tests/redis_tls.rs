//! `rediss://`: the Redis store over TLS (rustls) to a `redis-server` with a throwaway CA,
//! trusted through `--redis-ca-file` (`RedisOptions::ca_file`) as on Memorystore; without
//! that CA the server is not trusted and checks fail open.

mod common;

use common::redis::RedisServer;
use common::{T0, start_with};
use ratelimit::clock::ManualClock;
use ratelimit::limiter::LimiterOptions;
use ratelimit::limits::Limits;
use ratelimit::pb::Source;
use ratelimit::store::redis::{RedisOptions, RedisStore};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Writes `ca.pem`, `server.pem`, `server.key` for `localhost` / `127.0.0.1` to a fresh
/// directory and returns it.
fn certificates() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ratelimit-redis-tls-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("ca key")).expect("ca");
    let server_key = KeyPair::generate().expect("server key");
    let server = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("server params")
        .signed_by(&server_key, &ca)
        .expect("server cert");
    std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write");
    std::fs::write(dir.join("server.pem"), server.pem()).expect("write");
    std::fs::write(dir.join("server.key"), server_key.serialize_pem()).expect("write");
    dir
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn opts() -> LimiterOptions {
    LimiterOptions {
        store_timeout: Duration::from_secs(5),
        ..LimiterOptions::default()
    }
}

#[tokio::test]
async fn rediss_with_the_servers_ca_is_shared_and_without_it_falls_back() {
    let dir = certificates();
    let tls_port = free_port();
    let path = |f: &str| dir.join(f).display().to_string();
    let (cert, key, ca) = (path("server.pem"), path("server.key"), path("ca.pem"));
    let redis = RedisServer::start(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
        "--requirepass",
        "tls-secret",
    ])
    .await;
    let url = format!("rediss://:tls-secret@localhost:{tls_port}/0");
    let clock = ManualClock::new(T0);
    let trusted = RedisOptions {
        ca_file: Some(dir.join("ca.pem")),
        ..RedisOptions::default()
    };
    let store = RedisStore::new(&url, trusted, Arc::new(clock.clone())).expect("store");
    assert!(
        store.describe().starts_with("rediss://localhost:"),
        "{}",
        store.describe()
    );
    let mut h = start_with(
        Limits::builtin(),
        Arc::new(store),
        clock.clone(),
        None,
        opts(),
    )
    .await;
    for i in 0..3 {
        let r = h.check("", "over-tls").await;
        assert!(r.allowed && r.shared, "check {i}: {r:?}");
        assert_eq!((r.remaining, r.source()), (119 - i, Source::Store));
    }
    let v: String = redis.cmd(&["GET", "rl:{mcp:over-tls}"]).await;
    assert_eq!(v, format!("{}:3", T0 / 60_000));
    let calls = redis.command_calls().await;
    assert!(
        calls.get("evalsha").is_some_and(|&n| n >= 3),
        "over TLS: {calls:?}"
    );

    // The webpki roots do not know this CA: TLS fails, the check falls back.
    let untrusted =
        RedisStore::new(&url, RedisOptions::default(), Arc::new(clock.clone())).expect("store");
    let mut h = start_with(Limits::builtin(), Arc::new(untrusted), clock, None, opts()).await;
    let r = h.check("", "over-tls").await;
    assert!(r.allowed && !r.shared, "{r:?}");
    assert_eq!(r.source(), Source::LocalFallback);
    let _ = std::fs::remove_dir_all(&dir);
}
