//! Setting up the Redis store: the URL (AUTH, database number, no password in what is
//! logged), the store switch (`--redis-url` with `--database-url` is a startup error
//! naming both; bad URLs and prefixes are refused), and the key encoding's properties.

mod common;

use common::T0;
use common::redis::RedisServer;
use ratelimit::clock::ManualClock;
use ratelimit::limits::Limit;
use ratelimit::store::CounterStore;
use ratelimit::store::redis::RedisOptions;
use std::time::Duration;

const W: i64 = (T0 / 60_000) as i64;

fn mcp() -> Limit {
    Limit::new("mcp", 120, Duration::from_secs(60))
}

#[tokio::test]
async fn auth_and_database_number_come_from_the_url() {
    let redis = RedisServer::start(&["--requirepass", "s3cret"]).await;
    let clock = ManualClock::new(T0);
    let url = format!("redis://default:s3cret@127.0.0.1:{}/3", redis.port);
    let store = ratelimit::store::redis::RedisStore::new(
        &url,
        RedisOptions::default(),
        std::sync::Arc::new(clock.clone()),
    )
    .expect("store");
    assert!(!store.describe().contains("s3cret"), "{}", store.describe());
    assert!(
        store.describe().ends_with("/3 user=default auth=password"),
        "{}",
        store.describe()
    );
    store.admit(&mcp(), "db3", W, &[1]).await.expect("admit");
    let in_db3: i64 = redis
        .cmd(&[
            "EVAL",
            "redis.call('SELECT', 3) return redis.call('EXISTS', KEYS[1])",
            "1",
            "rl:{mcp:db3}",
        ])
        .await;
    let in_db0: i64 = redis.cmd(&["EXISTS", "rl:{mcp:db3}"]).await;
    assert_eq!((in_db3, in_db0), (1, 0));
}

#[tokio::test]
async fn a_database_url_and_a_redis_url_together_are_a_startup_error_naming_both() {
    use clap::Parser as _;
    use ratelimit::config::{Cli, Command, build_store};
    let cli = Cli::try_parse_from([
        "ratelimit",
        "serve",
        "--database-url",
        "https://x.firebaseio.com",
        "--redis-url",
        "redis://127.0.0.1:1",
    ])
    .expect("parses");
    let Command::Serve(args) = cli.command else {
        panic!("serve expected");
    };
    let clock: ratelimit::clock::SharedClock = std::sync::Arc::new(ManualClock::new(T0));
    let msg = match build_store(&args, clock.clone()).await {
        Err(e) => e.to_string(),
        Ok(s) => panic!("built {}", s.name()),
    };
    assert!(
        msg.contains("--database-url") && msg.contains("--redis-url"),
        "{msg}"
    );
    // Alone, the Redis URL selects the Redis store (connecting lazily: nothing listens).
    let cli = Cli::try_parse_from(["ratelimit", "serve", "--redis-url", "redis://127.0.0.1:1"])
        .expect("parses");
    let Command::Serve(args) = cli.command else {
        panic!("serve expected");
    };
    let store = build_store(&args, clock.clone())
        .await
        .expect("redis store");
    assert_eq!((store.name(), store.is_remote()), ("redis", true));
    for (url, prefix) in [
        ("http://127.0.0.1:1", "rl:"),
        ("redis://127.0.0.1:1", "r{l"),
    ] {
        let cli = Cli::try_parse_from([
            "ratelimit",
            "serve",
            "--redis-url",
            url,
            "--redis-prefix",
            prefix,
        ])
        .expect("parses");
        let Command::Serve(args) = cli.command else {
            panic!("serve expected");
        };
        assert!(
            build_store(&args, clock.clone()).await.is_err(),
            "{url} {prefix}"
        );
    }
}

mod keys {
    use proptest::prelude::*;
    use ratelimit::store::redis::{decode, encode};

    #[test]
    fn readable_keys_stay_readable_and_structure_is_escaped() {
        assert_eq!(encode("alice@example.com"), "alice@example.com");
        assert_eq!(encode("10.0.0.1"), "10.0.0.1");
        assert_eq!(encode("a:b"), "a%3Ab");
        assert_eq!(encode("{x}"), "%7Bx%7D");
        assert_eq!(encode("%3A"), "%253A");
        assert_eq!(encode("a\nb"), "a%0Ab");
    }

    #[test]
    fn decode_refuses_what_encode_never_produces() {
        for bad in ["a:b", "{", "}", "%3a", "%41", "%", "%2", "a\n"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn encoding_never_holds_braces_or_the_separator_and_reverses(key in any::<String>()) {
            prop_assume!(!key.is_empty() && key.len() <= 512);
            let e = encode(&key);
            prop_assert!(!e.contains(['{', '}', ':']), "{e:?}");
            prop_assert!(!e.bytes().any(|b| b < 0x20 || b == 0x7f), "{e:?}");
            prop_assert_eq!(decode(&e), Some(key));
        }

        #[test]
        fn structural_characters_reverse(key in "[{}:%a\\x00-\\x1f]{1,64}") {
            prop_assert_eq!(decode(&encode(&key)), Some(key));
        }

        #[test]
        fn distinct_keys_never_collide(a in any::<String>(), b in any::<String>()) {
            prop_assume!(a != b);
            prop_assert_ne!(encode(&a), encode(&b));
        }
    }
}
