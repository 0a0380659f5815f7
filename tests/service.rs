//! The service over real gRPC on loopback: decisions, limits, concurrency, bad input,
//! admin RPCs, health and reflection.

mod common;

use common::{Harness, T0, limits, req, start};
use ratelimit::limits::Limits;
use ratelimit::pb::{ListLimitsRequest, PeekRequest, ResetRequest, Source};
use std::time::Duration;
use tonic::Code;

fn secs(d: Option<prost_types::Duration>) -> Option<i64> {
    d.map(|d| {
        assert_eq!(d.nanos, 0, "durations are whole seconds");
        d.seconds
    })
}

#[tokio::test]
async fn admits_120_then_denies_with_retry_after_and_headers_data() {
    let mut h = start(Limits::builtin(), None).await;
    for i in 0..120u32 {
        let r = h.check("", "token-1").await;
        assert!(r.allowed, "hit {i} must be admitted");
        assert_eq!((r.limit, r.remaining), (120, 119 - i));
        assert_eq!(secs(r.reset_after), Some(50));
        assert_eq!(r.retry_after, None, "retry_after only when denied");
        assert!(r.shared);
        assert_eq!(r.source(), Source::Store);
        assert_eq!(r.limit_name, "mcp");
        assert_eq!(r.window, (T0 / 60_000) as i64);
    }
    for _ in 0..5 {
        let r = h.check("mcp", "token-1").await;
        assert!(!r.allowed);
        assert_eq!(r.remaining, 0);
        let retry = secs(r.retry_after).expect("retry_after when denied");
        assert!(retry > 0 && retry <= 60, "retry_after {retry}");
        assert_eq!(retry, 50);
    }
}

#[tokio::test]
async fn the_next_window_admits_again_without_sleeping() {
    let mut h = start(Limits::builtin(), None).await;
    for _ in 0..120 {
        assert!(h.check("", "k").await.allowed);
    }
    assert!(!h.check("", "k").await.allowed);
    h.clock.advance(49_999);
    let r = h.check("", "k").await;
    assert!(!r.allowed);
    assert_eq!(secs(r.retry_after), Some(1), "1 ms left rounds up to 1 s");
    h.clock.advance(1);
    let r = h.check("", "k").await;
    assert!(r.allowed);
    assert_eq!((r.remaining, secs(r.reset_after)), (119, Some(60)));
    assert_eq!(r.window, (T0 / 60_000) as i64 + 1);
}

#[tokio::test]
async fn two_limits_and_two_keys_are_independent() {
    let l = limits(
        "[[limit]]\nname = \"mcp\"\nrequests = 3\nwindow = \"60s\"\ndefault = true\n\
         [[limit]]\nname = \"uploads\"\nrequests = 2\nwindow = \"1h\"\n",
    );
    let mut h = start(l, None).await;
    let mut admitted = std::collections::BTreeMap::new();
    for limit in ["mcp", "uploads"] {
        for key in ["alice", "bob"] {
            let n = {
                let mut n = 0;
                for _ in 0..5 {
                    if h.check(limit, key).await.allowed {
                        n += 1;
                    }
                }
                n
            };
            admitted.insert((limit, key), n);
        }
    }
    assert_eq!(admitted[&("mcp", "alice")], 3);
    assert_eq!(admitted[&("mcp", "bob")], 3);
    assert_eq!(admitted[&("uploads", "alice")], 2);
    assert_eq!(admitted[&("uploads", "bob")], 2);
    let r = h.check("uploads", "carol").await;
    assert_eq!((r.limit, r.limit_name.as_str()), (2, "uploads"));
    assert_eq!(
        secs(r.reset_after),
        Some(3_600 - (T0 % 3_600_000) as i64 / 1_000)
    );
}

#[tokio::test]
async fn sixty_four_concurrent_tasks_admit_exactly_120() {
    let h = start(Limits::builtin(), None).await;
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let mut client = h.client.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u32;
            for _ in 0..10 {
                let r = client
                    .check(req("", "hot", 1))
                    .await
                    .expect("check")
                    .into_inner();
                admitted += u32::from(r.allowed);
            }
            admitted
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    assert_eq!(total, 120);
}

#[tokio::test]
async fn cost_counts_all_or_nothing_and_zero_means_one() {
    let mut h = start(Limits::builtin(), None).await;
    let r = h
        .client
        .check(req("", "k", 0))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!((r.allowed, r.remaining), (true, 119));
    let r = h
        .client
        .check(req("", "k", 100))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!((r.allowed, r.remaining), (true, 19));
    let r = h
        .client
        .check(req("", "k", 20))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(
        (r.allowed, r.remaining),
        (false, 19),
        "denied cost counts nothing"
    );
    let r = h
        .client
        .check(req("", "k", 19))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!((r.allowed, r.remaining), (true, 0));
}

async fn status_of(h: &mut Harness, limit: &str, key: &str, cost: u32) -> tonic::Status {
    h.client
        .check(req(limit, key, cost))
        .await
        .expect_err("must be refused")
}

#[tokio::test]
async fn bad_input_gets_invalid_argument_naming_field_and_rule() {
    let mut h = start(Limits::builtin(), None).await;
    let s = status_of(&mut h, "", "", 1).await;
    assert_eq!(
        (s.code(), s.message()),
        (Code::InvalidArgument, "key: must not be empty")
    );
    let s = status_of(&mut h, "", &"k".repeat(513), 1).await;
    assert_eq!(s.code(), Code::InvalidArgument);
    assert_eq!(
        s.message(),
        "key: must be at most 512 bytes of UTF-8, got 513 bytes"
    );
    let ok = h.client.check(req("", &"é".repeat(256), 1)).await;
    assert!(ok.is_ok(), "512 bytes is allowed");
    let s = status_of(&mut h, "", "k", 121).await;
    assert_eq!(s.code(), Code::InvalidArgument);
    assert_eq!(
        s.message(),
        "cost: must not exceed the 120 requests of limit \"mcp\", got 121"
    );
    let s = status_of(&mut h, "uploads", "k", 1).await;
    assert_eq!(s.code(), Code::NotFound);
    assert_eq!(s.message(), "unknown limit \"uploads\"; known limits: mcp");
    // Nothing was counted by any refused request.
    let p = h
        .client
        .peek(PeekRequest {
            key: "k".into(),
            limit: String::new(),
        })
        .await
        .expect("peek")
        .into_inner();
    assert_eq!(p.remaining, 120);
}

/// A `CheckRequest` on the wire with its strings as raw bytes, so a test can send what no
/// conforming client would: a key that is not UTF-8, a field of the wrong wire type.
#[derive(Clone, PartialEq, prost::Message)]
struct RawCheck {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    limit: Vec<u8>,
    #[prost(uint32, tag = "3")]
    cost: u32,
}

/// `key` as a varint: a field of the wrong wire type.
#[derive(Clone, PartialEq, prost::Message)]
struct WrongWireType {
    #[prost(uint64, tag = "1")]
    key: u64,
}

async fn raw_check<M: prost::Message + 'static>(h: &Harness, message: M) -> tonic::Status {
    let channel = tonic::transport::Endpoint::from_shared(h.server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/bladbase.ratelimit.v1.RateLimiter/Check",
    );
    let codec = ratelimit::codec::SliceCodec::<M, ratelimit::pb::CheckResponse>::default();
    grpc.unary(tonic::Request::new(message), path, codec)
        .await
        .expect_err("must be refused")
}

#[tokio::test]
async fn a_request_that_does_not_decode_is_the_callers_invalid_argument() {
    let mut h = start(Limits::builtin(), None).await;
    let raw = |key: &[u8], limit: &[u8]| RawCheck {
        key: key.to_vec(),
        limit: limit.to_vec(),
        cost: 1,
    };
    for (message, field) in [
        (raw(b"bad\xff", b""), "CheckRequest.key"),
        (raw(b"\xed\xa0\x80", b""), "CheckRequest.key"),
        (raw(b"bad", b"mc\xff"), "CheckRequest.limit"),
    ] {
        let s = raw_check(&h, message).await;
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(
            s.message().contains(field) && s.message().contains("UTF-8"),
            "names the field and the rule: {}",
            s.message()
        );
    }
    let s = raw_check(&h, WrongWireType { key: 7 }).await;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("CheckRequest.key"), "{}", s.message());
    // Nothing was counted, and the server still answers.
    let r = h.check("", "bad").await;
    assert_eq!((r.allowed, r.remaining), (true, 119));
}

#[tokio::test]
async fn oversized_requests_are_refused() {
    let mut h = start(Limits::builtin(), None).await;
    let s = status_of(&mut h, "", &"k".repeat(100 * 1024), 1).await;
    assert_eq!(s.code(), Code::OutOfRange, "{s:?}");
    // The server is still healthy afterwards.
    assert!(h.check("", "k").await.allowed);
}

#[tokio::test]
async fn peek_counts_nothing() {
    let mut h = start(Limits::builtin(), None).await;
    for _ in 0..3 {
        h.check("", "k").await;
    }
    for _ in 0..3 {
        let p = h
            .client
            .peek(PeekRequest {
                key: "k".into(),
                limit: "mcp".into(),
            })
            .await
            .expect("peek")
            .into_inner();
        assert_eq!((p.allowed, p.remaining, p.retry_after), (true, 117, None));
        assert_eq!(p.source(), Source::Store);
    }
    let s = h
        .client
        .peek(PeekRequest::default())
        .await
        .expect_err("empty key");
    assert_eq!(s.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn list_limits_returns_the_configuration() {
    let l = limits(
        "[[limit]]\nname = \"mcp\"\nrequests = 120\nwindow = \"60s\"\ndefault = true\n\
         [[limit]]\nname = \"signin\"\nrequests = 5\nwindow = \"15m\"\non_store_failure = \"deny\"\n",
    );
    let mut h = start(l, None).await;
    let r = h
        .client
        .list_limits(ListLimitsRequest {})
        .await
        .expect("list")
        .into_inner();
    let got: Vec<_> = r
        .limits
        .iter()
        .map(|l| {
            (
                l.name.as_str(),
                l.requests,
                secs(l.window),
                l.is_default,
                l.on_store_failure.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("mcp", 120, Some(60), true, "local"),
            ("signin", 5, Some(900), false, "deny")
        ]
    );
}

#[tokio::test]
async fn an_answer_larger_than_the_codecs_stack_buffer_arrives_whole() {
    // Twenty limits with 64-character names: a ListLimits answer of over 1,500 bytes,
    // past the 256 bytes `codec.rs` encodes on the stack, so it is encoded in place.
    let toml: String = (0..20)
        .map(|i| {
            format!(
                "[[limit]]\nname = \"{i:0>64}\"\nrequests = {}\nwindow = \"60s\"\ndefault = {}\n",
                i + 1,
                i == 0
            )
        })
        .collect();
    let mut h = start(limits(&toml), None).await;
    let r = h
        .client
        .list_limits(ListLimitsRequest {})
        .await
        .expect("list")
        .into_inner();
    let got: Vec<(String, u32)> = r.limits.into_iter().map(|l| (l.name, l.requests)).collect();
    let want: Vec<(String, u32)> = (0..20).map(|i| (format!("{i:0>64}"), i + 1)).collect();
    assert_eq!(got, want);
    // And a Check naming one of them answers with its 64-byte name on the stack path.
    let d = h
        .client
        .check(req(&format!("{:0>64}", 19), "k", 1))
        .await
        .expect("check")
        .into_inner();
    assert_eq!((d.limit_name.len(), d.limit, d.remaining), (64, 20, 19));
}

fn reset_req(key: &str, token: Option<&str>) -> tonic::Request<ResetRequest> {
    let mut r = tonic::Request::new(ResetRequest {
        key: key.into(),
        limit: String::new(),
    });
    if let Some(t) = token {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii"),
        );
    }
    r
}

#[tokio::test]
async fn reset_needs_the_admin_token() {
    let mut h = start(Limits::builtin(), Some("s3cret-admin")).await;
    for _ in 0..120 {
        h.check("", "victim").await;
    }
    assert!(!h.check("", "victim").await.allowed);
    let s = h
        .client
        .reset(reset_req("victim", None))
        .await
        .expect_err("no token");
    assert_eq!(s.code(), Code::Unauthenticated);
    let s = h
        .client
        .reset(reset_req("victim", Some("wrong")))
        .await
        .expect_err("wrong token");
    assert_eq!(s.code(), Code::Unauthenticated);
    assert!(
        !h.check("", "victim").await.allowed,
        "a refused reset changes nothing"
    );
    let r = h
        .client
        .reset(reset_req("victim", Some("s3cret-admin")))
        .await
        .expect("reset")
        .into_inner();
    assert_eq!((r.limit_name.as_str(), r.shared), ("mcp", true));
    let after = h.check("", "victim").await;
    assert_eq!((after.allowed, after.remaining), (true, 119));
    let s = h
        .client
        .reset(reset_req("", Some("s3cret-admin")))
        .await
        .expect_err("empty key");
    assert_eq!(s.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn reset_is_disabled_without_a_configured_token() {
    let mut h = start(Limits::builtin(), None).await;
    let s = h
        .client
        .reset(reset_req("k", Some("anything")))
        .await
        .expect_err("disabled");
    assert_eq!(s.code(), Code::FailedPrecondition);
    assert!(
        s.message().starts_with("admin RPCs are disabled"),
        "{}",
        s.message()
    );
}

#[tokio::test]
async fn health_serves_overall_and_named_service() {
    let h = start(Limits::builtin(), None).await;
    let channel = tonic::transport::Channel::from_shared(h.server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "bladbase.ratelimit.v1.RateLimiter"] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health")
            .into_inner();
        assert_eq!(
            r.status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            "{service:?}"
        );
    }
    let s = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .expect_err("unknown service");
    assert_eq!(s.code(), Code::NotFound);
}

#[tokio::test]
async fn stopping_drains_and_refuses_new_calls() {
    let mut h = start(Limits::builtin(), None).await;
    assert!(h.check("", "k").await.allowed);
    let Harness {
        server, mut client, ..
    } = h;
    server.stop().await.expect("clean stop");
    let r = tokio::time::timeout(Duration::from_secs(5), client.check(req("", "k", 1))).await;
    assert!(matches!(r, Ok(Err(_))), "after stop, calls fail: {r:?}");
}
