//! The REST protocol over real sockets, one test per "Emulator MUST" item of
//! `reference/rtdb-rest.md` (the item numbers are in the test names).

mod common;

use common::req;
use rtdb_emulator::{Emulator, IF_MATCH_NOT_SUPPORTED, NULL_ETAG, Options};
use serde_json::{Value, json};

const JSON_CT: &str = "application/json; charset=utf-8";

async fn emu() -> Emulator {
    Emulator::start().await.expect("emulator starts")
}

async fn open_emu() -> Emulator {
    Emulator::start_with(Options {
        rules: Some(json!({"rules": {".read": true, ".write": true}})),
        addr: None,
    })
    .await
    .expect("emulator starts")
}

#[tokio::test]
async fn must01_all_methods_and_namespaces_are_separate() {
    let e = emu().await;
    let a = e.addr();
    let r = req("PUT", "/x.json?ns=one").owner().body("1").go(a).await;
    assert_eq!((r.status, r.body.as_str()), (200, "1"));
    let r = req("PUT", "/x.json?ns=two").owner().body("2").go(a).await;
    assert_eq!(r.status, 200);
    assert_eq!(req("GET", "/x.json?ns=one").owner().go(a).await.body, "1");
    assert_eq!(req("GET", "/x.json?ns=two").owner().go(a).await.body, "2");
    assert_eq!(e.value("one", "x"), json!(1));
    // No ns: the "default" namespace.
    req("PUT", "/x.json").owner().body("3").go(a).await;
    assert_eq!(e.value("default", "x"), json!(3));
    let r = req("PATCH", "/p.json?ns=one")
        .owner()
        .body(r#"{"a":1}"#)
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    let r = req("POST", "/q.json?ns=one")
        .owner()
        .body("true")
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    let r = req("DELETE", "/x.json?ns=one").owner().go(a).await;
    assert_eq!((r.status, r.body.as_str()), (200, "null"));
    assert_eq!(e.value("one", "x"), Value::Null);
    assert_eq!(e.value("two", "x"), json!(2));
    // The root is addressable as /.json.
    let root = req("GET", "/.json?ns=one").owner().go(a).await.json();
    assert_eq!(root["p"], json!({"a": 1}));
    assert_eq!(root["q"].as_object().map(|o| o.len()), Some(1));
    // Not a REST path.
    req("GET", "/x?ns=one")
        .owner()
        .go(a)
        .await
        .assert_error(404);
}

#[tokio::test]
async fn must02_missing_path_is_200_null_with_json_content_type() {
    let e = emu().await;
    let r = req("GET", "/nothing/here.json?ns=n")
        .owner()
        .go(e.addr())
        .await;
    assert_eq!((r.status, r.body.as_str()), (200, "null"));
    assert_eq!(r.header("content-type"), Some(JSON_CT));
    assert_eq!(r.header("etag"), None);
}

#[tokio::test]
async fn must03_etag_only_when_asked() {
    let e = emu().await;
    let a = e.addr();
    e.set_value("n", "k", json!({"v": 1}));
    let plain = req("GET", "/k.json?ns=n").owner().go(a).await;
    assert_eq!(plain.header("etag"), None);
    let tagged = req("GET", "/k.json?ns=n").owner().etag().go(a).await;
    assert_eq!(tagged.json(), json!({"v": 1}));
    let tag = tagged.header("etag").expect("etag");
    assert_eq!(tag.len(), 28, "base64 of a SHA-1: {tag}");
    // Any value other than "true" does not ask for one.
    let r = req("GET", "/k.json?ns=n")
        .owner()
        .header("X-Firebase-ETag", "false")
        .go(a)
        .await;
    assert_eq!(r.header("etag"), None);
    // A PUT without the header returns no ETag either.
    let r = req("PUT", "/k.json?ns=n").owner().body("2").go(a).await;
    assert_eq!(r.header("etag"), None);
}

#[tokio::test]
async fn must04_etags_null_deterministic_and_content_based() {
    let e = emu().await;
    let a = e.addr();
    let tag = |path: &'static str| async move {
        req("GET", path)
            .owner()
            .etag()
            .go(a)
            .await
            .header("etag")
            .map(str::to_owned)
    };
    assert_eq!(tag("/empty.json?ns=n").await.as_deref(), Some(NULL_ETAG));
    req("PUT", "/a.json?ns=n")
        .owner()
        .body(r#"{"x":1,"y":"z"}"#)
        .go(a)
        .await;
    req("PUT", "/b.json?ns=n")
        .owner()
        .body(r#"{"y":"z","x":1}"#)
        .go(a)
        .await;
    let ta = tag("/a.json?ns=n").await;
    assert_eq!(ta, tag("/a.json?ns=n").await, "stable");
    assert_eq!(ta, tag("/b.json?ns=n").await, "same content, same tag");
    req("PUT", "/a/x.json?ns=n").owner().body("2").go(a).await;
    let changed = tag("/a.json?ns=n").await;
    assert_ne!(ta, changed);
    req("PUT", "/a/x.json?ns=n").owner().body("1").go(a).await;
    assert_eq!(
        ta,
        tag("/a.json?ns=n").await,
        "A->B->A gives the old tag back"
    );
}

async fn etag_of(a: std::net::SocketAddr, path: &str) -> String {
    req("GET", path)
        .owner()
        .etag()
        .go(a)
        .await
        .header("etag")
        .expect("etag")
        .to_owned()
}

#[tokio::test]
async fn must05_put_with_matching_if_match_writes() {
    let e = emu().await;
    let a = e.addr();
    e.set_value("n", "c", json!(10));
    let tag = etag_of(a, "/c.json?ns=n").await;
    let r = req("PUT", "/c.json?ns=n")
        .owner()
        .header("if-match", &tag)
        .body("11")
        .go(a)
        .await;
    assert_eq!((r.status, r.body.as_str()), (200, "11"));
    assert_eq!(r.header("etag"), None, "no ETag without X-Firebase-ETag");
    assert_eq!(e.value("n", "c"), json!(11));
    // The header name is case-insensitive.
    let tag = etag_of(a, "/c.json?ns=n").await;
    let r = req("PUT", "/c.json?ns=n")
        .owner()
        .header("If-Match", &tag)
        .body(r#"{"w":{"count":1}}"#)
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"w": {"count": 1}}));
}

#[tokio::test]
async fn must06_stale_or_garbage_if_match_is_412_with_current_value() {
    let e = emu().await;
    let a = e.addr();
    e.set_value("n", "c", json!({"count": 1}));
    let stale = etag_of(a, "/c.json?ns=n").await;
    e.set_value("n", "c", json!({"count": 2}));
    let current = etag_of(a, "/c.json?ns=n").await;
    for (method, tag) in [
        ("PUT", stale.as_str()),
        ("PUT", "garbage"),
        ("DELETE", stale.as_str()),
        ("DELETE", "\"quoted\""),
    ] {
        let mut r = req(method, "/c.json?ns=n").owner().header("if-match", tag);
        if method == "PUT" {
            r = r.body(r#"{"count":99}"#);
        }
        let r = r.go(a).await;
        assert_eq!(r.status, 412, "{method} {tag}");
        assert_eq!(r.json(), json!({"count": 2}));
        assert_eq!(r.header("etag"), Some(current.as_str()));
        assert_eq!(r.header("content-type"), Some(JSON_CT));
        assert_eq!(e.value("n", "c"), json!({"count": 2}), "unchanged");
    }
    // Absent location: body null, ETag null_etag.
    let r = req("PUT", "/absent.json?ns=n")
        .owner()
        .header("if-match", &current)
        .body("1")
        .go(a)
        .await;
    assert_eq!((r.status, r.body.as_str()), (412, "null"));
    assert_eq!(r.header("etag"), Some(NULL_ETAG));
    assert_eq!(e.value("n", "absent"), Value::Null);
    // DELETE with the current tag succeeds.
    let r = req("DELETE", "/c.json?ns=n")
        .owner()
        .header("if-match", &current)
        .go(a)
        .await;
    assert_eq!((r.status, r.body.as_str()), (200, "null"));
    assert_eq!(e.value("n", "c"), Value::Null);
}

#[tokio::test]
async fn must07_null_etag_only_while_empty() {
    let e = emu().await;
    let a = e.addr();
    let put = || {
        req("PUT", "/new.json?ns=n")
            .owner()
            .header("if-match", NULL_ETAG)
            .body("1")
    };
    let r = put().go(a).await;
    assert_eq!((r.status, r.body.as_str()), (200, "1"));
    let r = put().go(a).await;
    assert_eq!((r.status, r.body.as_str()), (412, "1"));
    assert_eq!(r.header("etag").map(str::len), Some(28));
    // PUT {} on an empty location keeps it empty and its ETag is null_etag.
    let r = req("PUT", "/void.json?ns=n")
        .owner()
        .etag()
        .body("{}")
        .go(a)
        .await;
    assert_eq!((r.status, r.body.as_str()), (200, "null"));
    assert_eq!(r.header("etag"), Some(NULL_ETAG));
}

#[tokio::test]
async fn must08_if_match_on_get_patch_post_is_400() {
    let e = emu().await;
    let a = e.addr();
    e.set_value("n", "c", json!(1));
    let tag = etag_of(a, "/c.json?ns=n").await;
    for method in ["GET", "PATCH", "POST"] {
        let mut r = req(method, "/c.json?ns=n").owner().header("if-match", &tag);
        if method != "GET" {
            r = r.body(r#"{"x":2}"#);
        }
        let r = r.go(a).await;
        assert_eq!(r.status, 400, "{method}");
        assert_eq!(
            r.body,
            json!({ "error": IF_MATCH_NOT_SUPPORTED }).to_string(),
            "{method}"
        );
        assert_eq!(
            IF_MATCH_NOT_SUPPORTED,
            "The 'if-match' header is not supported with GET, PATCH or POST requests"
        );
    }
    assert_eq!(e.value("n", "c"), json!(1));
}

#[tokio::test]
async fn must09_put_returns_the_etag_of_the_new_value() {
    let e = emu().await;
    let a = e.addr();
    let r = req("PUT", "/c.json?ns=n")
        .owner()
        .etag()
        .header("if-match", NULL_ETAG)
        .body(r#"{"w":{"count":1}}"#)
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    let put_tag = r.header("etag").expect("etag").to_owned();
    assert_eq!(put_tag, etag_of(a, "/c.json?ns=n").await);
    // The returned tag is immediately usable for the next conditional PUT.
    let r = req("PUT", "/c.json?ns=n")
        .owner()
        .etag()
        .header("if-match", &put_tag)
        .body(r#"{"w":{"count":2}}"#)
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    assert_ne!(r.header("etag"), Some(put_tag.as_str()));
    // DELETE and POST also answer with the tag of what they wrote.
    let r = req("DELETE", "/c.json?ns=n").owner().etag().go(a).await;
    assert_eq!(r.header("etag"), Some(NULL_ETAG));
    let r = req("POST", "/list.json?ns=n")
        .owner()
        .etag()
        .body("7")
        .go(a)
        .await;
    let name = r.json()["name"].as_str().expect("name").to_owned();
    assert_eq!(
        r.header("etag").map(str::to_owned),
        Some(etag_of(a, &format!("/list/{name}.json?ns=n")).await)
    );
    // PATCH never returns one.
    let r = req("PATCH", "/c.json?ns=n")
        .owner()
        .etag()
        .body(r#"{"a":1}"#)
        .go(a)
        .await;
    assert_eq!((r.status, r.header("etag")), (200, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn must10_conditional_put_is_atomic() {
    let e = emu().await;
    let a = e.addr();
    for round in 0..5 {
        e.set_value("n", "hot", json!({"count": round}));
        let tag = etag_of(a, "/hot.json?ns=n").await;
        let mut tasks = Vec::new();
        for i in 0..16 {
            let r = req("PUT", "/hot.json?ns=n")
                .owner()
                .header("if-match", &tag)
                .body(&format!(r#"{{"count":{},"by":{i}}}"#, round + 1));
            tasks.push(tokio::spawn(async move { r.go(a).await.status }));
        }
        let mut statuses = Vec::new();
        for t in tasks {
            statuses.push(t.await.expect("task"));
        }
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            1,
            "{statuses:?}"
        );
        assert_eq!(
            statuses.iter().filter(|s| **s == 412).count(),
            15,
            "{statuses:?}"
        );
        assert_eq!(e.value("n", "hot")["count"], json!(round + 1));
    }
}

#[tokio::test]
async fn must11_if_none_match() {
    let e = emu().await;
    let a = e.addr();
    e.set_value("n", "c", json!({"v": 1}));
    let tag = etag_of(a, "/c.json?ns=n").await;
    let r = req("GET", "/c.json?ns=n")
        .owner()
        .header("If-None-Match", &tag)
        .go(a)
        .await;
    assert_eq!((r.status, r.body.as_str()), (304, ""));
    e.set_value("n", "c", json!({"v": 2}));
    let r = req("GET", "/c.json?ns=n")
        .owner()
        .header("If-None-Match", &tag)
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"v": 2}));
    assert_eq!(
        r.header("etag").map(str::to_owned),
        Some(etag_of(a, "/c.json?ns=n").await)
    );
}

#[tokio::test]
async fn must12_print_silent_is_204_and_still_writes() {
    let e = emu().await;
    let a = e.addr();
    for (method, path, body) in [
        ("PUT", "/s/put.json?ns=n&print=silent", Some("1")),
        ("PATCH", "/s.json?ns=n&print=silent", Some(r#"{"patch":2}"#)),
        ("POST", "/s/list.json?ns=n&print=silent", Some("3")),
        ("GET", "/s.json?ns=n&print=silent", None),
    ] {
        let mut r = req(method, path).owner();
        if let Some(b) = body {
            r = r.body(b);
        }
        let r = r.go(a).await;
        assert_eq!((r.status, r.body.as_str()), (204, ""), "{method}");
        assert_eq!(r.header("content-type"), None);
    }
    let s = e.value("n", "s");
    assert_eq!(s["put"], json!(1));
    assert_eq!(s["patch"], json!(2));
    assert_eq!(
        s["list"]
            .as_object()
            .map(|o| o.values().cloned().collect::<Vec<_>>()),
        Some(vec![json!(3)])
    );
}

#[tokio::test]
async fn must13_delete_post_patch_semantics() {
    let e = emu().await;
    let a = e.addr();
    e.set_value(
        "n",
        "u",
        json!({"a": 1, "b": {"c": 2, "d": 3}, "keep": true}),
    );
    // PATCH merges only the named children; `/` keys are multi-path; null deletes.
    let r = req("PATCH", "/u.json?ns=n")
        .owner()
        .body(r#"{"a": 10, "b/c": 20, "keep": null, "new/deep": {"x": 1}}"#)
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        json!({"a": 10, "b/c": 20, "keep": null, "new/deep": {"x": 1}})
    );
    assert_eq!(
        e.value("n", "u"),
        json!({"a": 10, "b": {"c": 20, "d": 3}, "new": {"deep": {"x": 1}}})
    );
    // Invalid multi-path keys and overlapping paths are refused as a whole.
    for bad in [
        r#"{"a": 1, "b/.x": 2}"#,
        r#"{"a": 1, "a/b": 2}"#,
        r#"{"": 1}"#,
        "[1,2]",
        "3",
    ] {
        req("PATCH", "/u.json?ns=n")
            .owner()
            .body(bad)
            .go(a)
            .await
            .assert_error(400);
    }
    assert_eq!(e.value("n", "u")["a"], json!(10));
    // POST creates a new child with a push id.
    let r1 = req("POST", "/u/list.json?ns=n")
        .owner()
        .body(r#"{"m":1}"#)
        .go(a)
        .await;
    let r2 = req("POST", "/u/list.json?ns=n")
        .owner()
        .body(r#"{"m":2}"#)
        .go(a)
        .await;
    assert_eq!(r1.status, 200);
    let (n1, n2) = (
        r1.json()["name"].as_str().map(str::to_owned),
        r2.json()["name"].as_str().map(str::to_owned),
    );
    let (n1, n2) = (n1.expect("name"), n2.expect("name"));
    assert_eq!(r1.json().as_object().map(|o| o.len()), Some(1));
    assert_eq!(n1.len(), 20);
    assert!(n2 > n1, "push ids are ordered");
    assert_eq!(e.value("n", &format!("u/list/{n1}")), json!({"m": 1}));
    assert_eq!(e.value("n", &format!("u/list/{n2}")), json!({"m": 2}));
    // DELETE returns 200 null, also for a missing path.
    for path in ["/u/list.json?ns=n", "/nope.json?ns=n"] {
        let r = req("DELETE", path).owner().go(a).await;
        assert_eq!((r.status, r.body.as_str()), (200, "null"));
    }
    assert_eq!(e.value("n", "u/list"), Value::Null);
}

#[tokio::test]
async fn must14_null_and_empty_writes_remove_and_prune() {
    let e = emu().await;
    let a = e.addr();
    e.set_value("n", "p/q/r", json!(1));
    e.set_value("n", "p/keep", json!(2));
    let r = req("PUT", "/p/q/r.json?ns=n")
        .owner()
        .body("null")
        .go(a)
        .await;
    assert_eq!((r.status, r.body.as_str()), (200, "null"));
    assert_eq!(
        e.value("n", "p"),
        json!({"keep": 2}),
        "the emptied parent q disappeared"
    );
    req("PUT", "/p/keep.json?ns=n")
        .owner()
        .body("{}")
        .go(a)
        .await;
    assert_eq!(e.value("n", ""), Value::Null, "the whole tree is gone");
    let r = req("PUT", "/t.json?ns=n")
        .owner()
        .body(r#"{"a": {}, "b": [], "c": {"d": {}}, "e": [1, null, 3], "f": 10.0, "g": 1.5}"#)
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    let expected = json!({"e": [1, null, 3], "f": 10, "g": 1.5});
    assert_eq!(r.json(), expected);
    assert_eq!(
        r.body, r#"{"e":[1,null,3],"f":10,"g":1.5}"#,
        "integers without .0"
    );
    assert_eq!(
        req("GET", "/t.json?ns=n").owner().go(a).await.json(),
        expected
    );
    // A sparse array reads back as an object.
    req("PUT", "/sparse.json?ns=n")
        .owner()
        .body(r#"{"0": "a", "9": "b"}"#)
        .go(a)
        .await;
    assert_eq!(e.value("n", "sparse"), json!({"0": "a", "9": "b"}));
}

#[tokio::test]
async fn must15_server_values() {
    let e = emu().await;
    let a = e.addr();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let r = req("PUT", "/ts.json?ns=n")
        .owner()
        .body(r#"{".sv": "timestamp"}"#)
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    let ts = e.value("n", "ts").as_i64().expect("integer timestamp");
    assert!(ts >= before && ts < before + 60_000, "{ts} vs {before}");
    for expected in [5, 10] {
        req("PATCH", "/.json?ns=n")
            .owner()
            .body(r#"{"ctr": {".sv": {"increment": 5}}}"#)
            .go(a)
            .await;
        assert_eq!(e.value("n", "ctr"), json!(expected));
    }
    req("PUT", "/bad.json?ns=n")
        .owner()
        .body(r#"{".sv": "nope"}"#)
        .go(a)
        .await
        .assert_error(400);
}

#[tokio::test]
async fn must16_rules_via_settings_endpoint() {
    let e = emu().await;
    let a = e.addr();
    e.set_value("n", "public/x", json!(1));
    e.set_value("n", "rateLimits/k", json!({"w": 1}));
    // Locked mode by default: clients are denied.
    let denied = req("GET", "/public/x.json?ns=n").go(a).await;
    assert_eq!(denied.assert_error(401), "Permission denied");
    assert_eq!(denied.body, r#"{"error":"Permission denied"}"#);
    let rules = r#"{
        // database.rules.json may contain comments
        "rules": {
            "public": {".read": true, ".write": "auth != null", "locked": {".read": false}},
            "rateLimits": {".read": false, ".write": false},
            "users": {"$uid": {".read": "auth == null", ".write": true, "v": {".validate": false}}}
        }
    }"#;
    // Non-owners cannot change (or read) the rules.
    let r = req("PUT", "/.settings/rules.json?ns=n")
        .body(rules)
        .go(a)
        .await;
    r.assert_error(403);
    let r = req("PUT", "/.settings/rules.json?ns=n")
        .header("Authorization", "Bearer user")
        .body(rules)
        .go(a)
        .await;
    r.assert_error(403);
    req("GET", "/.settings/rules.json?ns=n")
        .go(a)
        .await
        .assert_error(403);
    let r = req("PUT", "/.settings/rules.json?ns=n")
        .owner()
        .body(rules)
        .go(a)
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = req("GET", "/.settings/rules.json?ns=n").owner().go(a).await;
    assert_eq!(
        r.json()["rules"]["rateLimits"],
        json!({".read": false, ".write": false})
    );
    // Unsupported rules are refused and the previous rules stay.
    let r = req("PUT", "/.settings/rules.json?ns=n")
        .owner()
        .body(r#"{"rules": {".read": "data.exists()"}}"#)
        .go(a)
        .await;
    r.assert_error(400);
    req("PUT", "/.settings/rules.json?ns=n")
        .owner()
        .body("{not json")
        .go(a)
        .await
        .assert_error(400);

    // Reads: granted, cascading (a deeper false cannot revoke), denied by default.
    assert_eq!(req("GET", "/public/x.json?ns=n").go(a).await.body, "1");
    assert_eq!(
        req("GET", "/public/locked/y.json?ns=n").go(a).await.status,
        200
    );
    assert_eq!(req("GET", "/.json?ns=n").go(a).await.status, 401);
    let r = req("GET", "/rateLimits/k.json?ns=n")
        .header("Authorization", "Bearer user")
        .go(a)
        .await;
    assert_eq!(r.assert_error(401), "Permission denied");
    // Writes: denied leaves data unchanged; auth != null needs a token.
    let r = req("PUT", "/rateLimits/k.json?ns=n")
        .body(r#"{"w":99}"#)
        .go(a)
        .await;
    assert_eq!(r.assert_error(401), "Permission denied");
    assert_eq!(e.value("n", "rateLimits/k"), json!({"w": 1}));
    assert_eq!(
        req("PUT", "/public/x.json?ns=n")
            .body("2")
            .go(a)
            .await
            .status,
        401
    );
    let r = req("PUT", "/public/x.json?ns=n")
        .header("Authorization", "Bearer user")
        .body("2")
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    // Wildcards, and .validate at every level of a non-null write.
    assert_eq!(
        req("PUT", "/users/bob/name.json?ns=n")
            .body(r#""Bob""#)
            .go(a)
            .await
            .status,
        200
    );
    assert_eq!(
        req("PUT", "/users/bob/v.json?ns=n")
            .body("1")
            .go(a)
            .await
            .status,
        401
    );
    assert_eq!(
        req("PUT", "/users/bob.json?ns=n")
            .body(r#"{"v":1}"#)
            .go(a)
            .await
            .status,
        401
    );
    assert_eq!(
        req("DELETE", "/users/bob/v.json?ns=n").go(a).await.status,
        200
    );
    // A multi-path PATCH with one denied path writes nothing.
    let r = req("PATCH", "/.json?ns=n")
        .header("Authorization", "Bearer user")
        .body(r#"{"public/y": 1, "rateLimits/k": {"w": 5}}"#)
        .go(a)
        .await;
    r.assert_error(401);
    assert_eq!(e.value("n", "public/y"), Value::Null);
    // POST is checked at the new child.
    assert_eq!(
        req("POST", "/users/bob/list.json?ns=n")
            .body("1")
            .go(a)
            .await
            .status,
        200
    );
    assert_eq!(
        req("POST", "/rateLimits.json?ns=n")
            .body("1")
            .go(a)
            .await
            .status,
        401
    );
    // A stale if-match: 412 where readable, 401 where not (no data leak).
    let r = req("PUT", "/public/x.json?ns=n")
        .header("if-match", "stale")
        .body("3")
        .go(a)
        .await;
    assert_eq!((r.status, r.body.as_str()), (412, "2"));
    let r = req("PUT", "/rateLimits/k.json?ns=n")
        .header("if-match", "stale")
        .body("3")
        .go(a)
        .await;
    r.assert_error(401);
    assert_eq!(r.header("etag"), None);
    // Rules are per namespace: another namespace is still locked.
    assert_eq!(
        req("GET", "/public/x.json?ns=other").go(a).await.status,
        401
    );
}

#[tokio::test]
async fn must16_rules_from_options_and_library() {
    let e = Emulator::start_with(Options {
        rules: Some(json!({"rules": {"open": {".read": true, ".write": true}}})),
        addr: None,
    })
    .await
    .expect("start");
    let a = e.addr();
    assert_eq!(
        req("PUT", "/open/x.json?ns=any")
            .body("1")
            .go(a)
            .await
            .status,
        200
    );
    assert_eq!(
        req("PUT", "/closed.json?ns=any")
            .body("1")
            .go(a)
            .await
            .status,
        401
    );
    e.set_rules("any", json!({"rules": {".read": true}}))
        .expect("valid rules");
    assert_eq!(
        req("PUT", "/open/x.json?ns=any")
            .body("2")
            .go(a)
            .await
            .status,
        401
    );
    assert_eq!(req("GET", "/open/x.json?ns=any").go(a).await.body, "1");
    assert!(
        e.set_rules("any", json!({"rules": {".write": "now > 0"}}))
            .is_err()
    );
    let bad = Emulator::start_with(Options {
        rules: Some(json!({"rules": {".read": 1}})),
        addr: None,
    })
    .await;
    assert_eq!(
        bad.err().map(|e| e.kind()),
        Some(std::io::ErrorKind::InvalidInput)
    );
}

#[tokio::test]
async fn must17_owner_bypasses_rules_and_auth_override() {
    let e = emu().await;
    let a = e.addr();
    assert_eq!(
        req("PUT", "/r/x.json?ns=n")
            .owner()
            .body("1")
            .go(a)
            .await
            .status,
        200
    );
    assert_eq!(req("GET", "/r/x.json?ns=n").owner().go(a).await.body, "1");
    assert_eq!(
        req("GET", "/r/x.json?ns=n&access_token=owner")
            .go(a)
            .await
            .status,
        200
    );
    assert_eq!(req("GET", "/r/x.json?ns=n").go(a).await.status, 401);
    assert_eq!(
        req("GET", "/r/x.json?ns=n")
            .header("Authorization", "Bearer not-owner")
            .go(a)
            .await
            .status,
        401
    );
    e.set_rules(
        "n",
        json!({"rules": {"anon": {".read": "auth == null"}, "users": {".read": "auth != null"}}}),
    )
    .expect("rules");
    // The owner with auth_variable_override is evaluated as that auth.
    let r = req("GET", "/r/x.json?ns=n&auth_variable_override=null")
        .owner()
        .go(a)
        .await;
    assert_eq!(r.assert_error(401), "Permission denied");
    assert_eq!(
        req("GET", "/anon.json?ns=n&auth_variable_override=null")
            .owner()
            .go(a)
            .await
            .status,
        200
    );
    assert_eq!(
        req("GET", "/users.json?ns=n&auth_variable_override=null")
            .owner()
            .go(a)
            .await
            .status,
        401
    );
    let uid = "/users.json?ns=n&auth_variable_override=%7B%22uid%22%3A%22u1%22%7D";
    assert_eq!(req("GET", uid).owner().go(a).await.status, 200);
    assert_eq!(req("GET", "/anon.json?ns=n").go(a).await.status, 200);
    assert_eq!(req("GET", "/users.json?ns=n").go(a).await.status, 401);
    assert_eq!(
        req("GET", "/users.json?ns=n")
            .header("Authorization", "Bearer u1")
            .go(a)
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn must18_invalid_keys_depth_and_bodies_are_400() {
    let e = emu().await;
    let a = e.addr();
    let long = "k".repeat(769);
    let deep = "/d".repeat(32);
    let bad_paths = [
        "/a.b.json",
        "/a$b.json",
        "/a%23b.json",
        "/a%5Bb.json",
        "/a%5Db.json",
        "/a%2Fb.json",
        "/a%00b.json",
        "/a%0Ab.json",
        "/a%7Fb.json",
        "/a%FF.json",
    ];
    for path in bad_paths
        .iter()
        .map(|p| p.to_string())
        .chain([format!("/{long}.json"), format!("{deep}.json")])
    {
        for method in ["GET", "PUT"] {
            let r = req(method, &format!("{path}?ns=n"))
                .owner()
                .body("1")
                .go(a)
                .await;
            r.assert_error(400);
        }
    }
    // Percent-encoded characters that are allowed, and UTF-8 keys.
    let r = req("PUT", "/a%25b/%C3%A9t%C3%A9%20x.json?ns=n")
        .owner()
        .body("1")
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(e.value("n", "a%b/été x"), json!(1));
    let ok768 = "k".repeat(768);
    assert_eq!(
        req("PUT", &format!("/{ok768}.json?ns=n"))
            .owner()
            .body("1")
            .go(a)
            .await
            .status,
        200
    );
    assert_eq!(
        req("PUT", &format!("{}.json?ns=n", "/d".repeat(31)))
            .owner()
            .body("1")
            .go(a)
            .await
            .status,
        200
    );
    // Keys inside bodies.
    for body in [
        r#"{"a.b":1}"#,
        r#"{"x":{"$y":1}}"#,
        r#"{"a/b":1}"#,
        r#"{"":1}"#,
        "{\"a\\u0001\":1}",
        &format!(r#"{{"{long}":1}}"#),
    ] {
        req("PUT", "/body.json?ns=n")
            .owner()
            .body(body)
            .go(a)
            .await
            .assert_error(400);
        req("POST", "/body.json?ns=n")
            .owner()
            .body(body)
            .go(a)
            .await
            .assert_error(400);
    }
    // Depth counted from the root through the body.
    let nested = format!("{}1{}", r#"{"k":"#.repeat(2), "}".repeat(2));
    let base = "/d".repeat(29);
    assert_eq!(
        req("PUT", &format!("{base}.json?ns=n"))
            .owner()
            .body(&nested)
            .go(a)
            .await
            .status,
        200
    );
    let base = "/d".repeat(30);
    req("PUT", &format!("{base}.json?ns=n"))
        .owner()
        .body(&nested)
        .go(a)
        .await
        .assert_error(400);
    // Invalid JSON and missing bodies.
    for body in ["{", "nope", "{'a':1}", "", "   "] {
        for method in ["PUT", "POST", "PATCH"] {
            req(method, "/j.json?ns=n")
                .owner()
                .body(body)
                .go(a)
                .await
                .assert_error(400);
        }
    }
    assert_eq!(e.value("n", "j"), Value::Null);
    assert_eq!(e.value("n", "body"), Value::Null);
}

#[tokio::test]
async fn must19_to_21_query_parameters() {
    let e = emu().await;
    let a = e.addr();
    e.set_value("n", "s", json!({"a": {"deep": 1}, "b": 2}));
    let r = req("GET", "/s.json?ns=n&shallow=true").owner().go(a).await;
    assert_eq!(r.json(), json!({"a": true, "b": true}));
    assert_eq!(
        req("GET", "/s/b.json?ns=n&shallow=true")
            .owner()
            .go(a)
            .await
            .body,
        "2"
    );
    req("GET", "/s.json?ns=n&shallow=true&orderBy=%22%24key%22")
        .owner()
        .go(a)
        .await
        .assert_error(400);
    for bad in [
        "timeout=0ms",
        "timeout=16min",
        "timeout=5",
        "cachebust=123",
        "print=loud",
    ] {
        req("GET", &format!("/s.json?ns=n&{bad}"))
            .owner()
            .go(a)
            .await
            .assert_error(400);
    }
    assert_eq!(
        req("GET", "/s.json?ns=n&timeout=15min&format=export")
            .owner()
            .go(a)
            .await
            .status,
        200
    );
    let r = req("GET", "/s/b.json?ns=n&print=pretty")
        .owner()
        .go(a)
        .await;
    assert_eq!((r.status, r.body.as_str()), (200, "2"));
    // X-HTTP-Method-Override on POST.
    let r = req("POST", "/s/b.json?ns=n&x-http-method-override=PUT")
        .owner()
        .body("3")
        .go(a)
        .await;
    assert_eq!((r.status, r.body.as_str()), (200, "3"));
    let r = req("POST", "/s/b.json?ns=n")
        .owner()
        .header("X-HTTP-Method-Override", "DELETE")
        .go(a)
        .await;
    assert_eq!((r.status, r.body.as_str()), (200, "null"));
    assert_eq!(e.value("n", "s/b"), Value::Null);
}

#[tokio::test]
async fn must22_error_bodies_are_json_objects() {
    let e = emu().await;
    let a = e.addr();
    for r in [
        req("GET", "/a.b.json?ns=n").owner(),
        req("GET", "/x.json?ns=n"),
        req("PUT", "/x.json?ns=n").owner().body("{"),
        req("GET", "/x.json?ns=n&bogus=1").owner(),
        req("TRACE", "/x.json?ns=n").owner(),
        req("GET", "/not-json-suffix?ns=n").owner(),
        req("PUT", "/.settings/rules.json?ns=n").body("{}"),
    ] {
        let resp = r.go(a).await;
        assert!(resp.status >= 400, "{r:?}");
        resp.assert_error(resp.status);
    }
}

#[tokio::test]
async fn must23_cors() {
    let e = emu().await;
    let a = e.addr();
    let r = req("GET", "/x.json?ns=n").owner().go(a).await;
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-expose-headers"), Some("ETag"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let r = req("OPTIONS", "/x.json?ns=n")
        .header("Origin", "http://localhost")
        .go(a)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET, POST, PUT, DELETE, PATCH")
    );
    let allowed = r
        .header("access-control-allow-headers")
        .unwrap_or_default()
        .to_owned();
    for h in ["content-type", "if-match", "x-firebase-etag"] {
        assert!(allowed.contains(h), "{allowed}");
    }
}

#[tokio::test]
async fn library_value_and_set_value() {
    let e = open_emu().await;
    let a = e.addr();
    // Seeding bypasses validation, so tests can plant data a client could not write.
    e.set_value(
        "n",
        "rateLimits/mcp/abc",
        json!({"w1": "not-a-number", "arr": ["x", "y"]}),
    );
    assert_eq!(
        e.value("n", "rateLimits/mcp/abc"),
        json!({"w1": "not-a-number", "arr": ["x", "y"]})
    );
    assert_eq!(
        e.value("n", "/rateLimits/mcp/abc/w1"),
        json!("not-a-number")
    );
    assert_eq!(
        req("GET", "/rateLimits/mcp/abc/arr/1.json?ns=n")
            .go(a)
            .await
            .body,
        r#""y""#
    );
    e.set_value("n", "rateLimits/mcp/abc", Value::Null);
    assert_eq!(e.value("n", "rateLimits"), Value::Null);
    assert_eq!(e.value("other", "rateLimits"), Value::Null);
    assert_eq!(e.stats().total, 1, "library accessors are not counted");
}

#[tokio::test]
async fn keep_alive_serves_several_requests_per_connection() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let e = emu().await;
    let a = e.addr();
    let mut stream = tokio::net::TcpStream::connect(a).await.expect("connect");
    let mut buf = Vec::new();
    for i in 0..3 {
        let put = req("PUT", "/ka.json?ns=n")
            .owner()
            .body(&i.to_string())
            .encode(a, false);
        stream.write_all(&put).await.expect("write");
        let resp = loop {
            if let Ok((resp, used)) = common::Resp::parse(&buf) {
                buf.drain(..used);
                break resp;
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.expect("read");
            assert!(n > 0, "connection closed early");
            buf.extend_from_slice(&chunk[..n]);
        };
        assert_eq!((resp.status, resp.body), (200, i.to_string()));
    }
}
