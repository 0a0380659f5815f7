//! The shared table of header cases (`tests/cases/headers.json`): the Rust client's
//! header rendering (`src/client/headers.rs`) must give exactly the headers each case
//! expects. The Node package's `headers()` is checked against the same file
//! (`clients/node/tests/headers.test.mjs`), so both clients render a decision alike.

use ratelimit::decision::{Decision, Source};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(Deserialize)]
struct Table {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    decision: Fields,
    policy_window_seconds: Option<u64>,
    headers: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Fields {
    allowed: bool,
    limit: u32,
    remaining: u32,
    reset_after_ms: u64,
    retry_after_ms: Option<u64>,
    shared: bool,
    source: String,
    limit_name: String,
    window: i64,
}

fn source(name: &str) -> Source {
    [
        Source::Store,
        Source::DenyCache,
        Source::LocalFallback,
        Source::FailurePolicy,
        Source::ClientFallback,
        Source::Lease,
    ]
    .into_iter()
    .find(|s| s.as_str() == name)
    .unwrap_or_else(|| panic!("unknown source {name:?} in the cases table"))
}

#[test]
fn the_shared_header_cases_render_exactly() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cases/headers.json");
    let text = std::fs::read_to_string(path).expect("tests/cases/headers.json is readable");
    let table: Table = serde_json::from_str(&text).expect("the cases table parses");
    assert!(table.cases.len() >= 10, "the table lost its cases");
    for case in table.cases {
        let f = case.decision;
        let decision = Decision {
            allowed: f.allowed,
            limit: f.limit,
            remaining: f.remaining,
            reset_after: Duration::from_millis(f.reset_after_ms),
            retry_after: f.retry_after_ms.map(Duration::from_millis),
            shared: f.shared,
            source: source(&f.source),
            limit_name: Arc::from(f.limit_name),
            window: f.window,
        };
        let rendered = match case.policy_window_seconds {
            Some(w) => decision.headers_with_policy(Duration::from_secs(w)),
            None => decision.headers(),
        };
        let got: BTreeMap<String, String> = rendered
            .iter()
            .map(|(k, v)| {
                let value = v.to_str().expect("header values are ASCII");
                (k.as_str().to_owned(), value.to_owned())
            })
            .collect();
        assert_eq!(got, case.headers, "case {:?}", case.name);
        assert_eq!(
            rendered.len(),
            got.len(),
            "case {:?}: one value per header",
            case.name
        );
    }
}
