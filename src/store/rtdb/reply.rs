//! RTDB's HTTP answers turned into what a transaction needs: counter nodes parsed (and
//! foreign ones refused), error statuses and transport failures as [`StoreError`]s.
//!
//! Nothing here lets a caller key or a URL into an error message (errors reach log lines
//! at `warn`): nodes are named by [`Node::shown`] (limit and the key's keyed hash,
//! `logging::key_tag`), reqwest errors are stripped of their URL, and an error body that
//! echoes the node's path has it replaced.

use crate::store::counter::{StoreError, WindowCount};
use reqwest::StatusCode;
use std::sync::Arc;

/// One HTTP answer, reduced to what a transaction needs.
pub(super) struct Reply {
    pub(super) status: StatusCode,
    pub(super) etag: Option<Arc<str>>,
    /// Kept as bytes so that a malformed body can be quoted in errors.
    pub(super) body: Vec<u8>,
}

/// One counter node, named three ways: its cache key, its URL, and how logs may show it.
pub(super) struct Node {
    pub(super) cache_key: (Arc<str>, String),
    pub(super) url: reqwest::Url,
    /// `{limit}/key:{tag}`: what error messages and logs at `info` and above say.
    pub(super) shown: String,
    /// The full RTDB path, for `debug` lines only.
    pub(super) path: String,
}

impl Node {
    /// `text` with any mention of this node's key (as stored or as sent in the URL)
    /// replaced by its shown name.
    fn scrub(&self, text: &str) -> String {
        let encoded = &self.cache_key.1;
        let in_url = self
            .url
            .path_segments()
            .and_then(|mut s| s.next_back())
            .map(|s| s.trim_end_matches(".json").to_owned())
            .unwrap_or_default();
        let mut out = text.to_owned();
        for k in [encoded.as_str(), in_url.as_str()] {
            if !k.is_empty() {
                out = out.replace(k, &self.shown);
            }
        }
        out
    }
}

/// A request that got no (complete) answer. The URL is stripped: it holds the key.
pub(super) fn transport_error(e: reqwest::Error, is_write: bool) -> StoreError {
    // A connect error means the request never left: always safe. Anything later on a
    // write (timeout, reset, truncated body) leaves its outcome unknown.
    let connect = e.is_connect();
    let msg = error_chain(&e.without_url());
    if connect {
        StoreError::Connect(msg)
    } else if is_write {
        StoreError::UnknownOutcome(msg)
    } else {
        StoreError::Connect(msg)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// An answer with an error status.
pub(super) fn status_error(reply: &Reply, node: &Node) -> StoreError {
    // RTDB errors are JSON `{"error": "..."}`, sometimes pretty-printed: parse, don't compare.
    let message = serde_json::from_slice::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_else(|| {
            String::from_utf8_lossy(&reply.body)
                .chars()
                .take(200)
                .collect()
        });
    let message = node.scrub(&message);
    match reply.status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            StoreError::Auth(format!("HTTP {}: {message}", reply.status.as_u16()))
        }
        s => StoreError::Status {
            status: s.as_u16(),
            message,
        },
    }
}

/// Parses a counter node: `null`, or an object of `"<window>": count` (normally one entry;
/// the newest window wins if there are several). Anything else was not written by this
/// service and is reported, never overwritten.
pub(super) fn parse_node(path: &str, body: &[u8]) -> Result<Option<WindowCount>, StoreError> {
    let malformed = |detail: String| {
        let err = StoreError::Malformed {
            path: path.to_owned(),
            detail,
        };
        tracing::error!(node = path, error = %err, "RTDB node is not a rate-limit counter; leaving it untouched");
        err
    };
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        malformed(format!(
            "not JSON ({e}): {}",
            String::from_utf8_lossy(body)
                .chars()
                .take(80)
                .collect::<String>()
        ))
    })?;
    let map = match value {
        serde_json::Value::Null => return Ok(None),
        serde_json::Value::Object(map) => map,
        other => {
            return Err(malformed(format!(
                "expected {{\"<window>\": count}}, found {other}"
            )));
        }
    };
    let mut newest: Option<WindowCount> = None;
    for (k, v) in &map {
        let window: i64 = k
            .parse()
            .map_err(|_| malformed(format!("child {k:?} is not a window number")))?;
        let count = v
            .as_u64()
            .and_then(|c| u32::try_from(c).ok())
            .ok_or_else(|| malformed(format!("window {k} holds {v}, not a count")))?;
        if newest.is_none_or(|n| window > n.window) {
            newest = Some(WindowCount { window, count });
        }
    }
    Ok(newest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_parse_null_one_window_or_the_newest_of_several() {
        assert_eq!(parse_node("p", b"null"), Ok(None));
        assert_eq!(
            parse_node("p", br#"{"29408640": 7}"#),
            Ok(Some(WindowCount {
                window: 29_408_640,
                count: 7
            }))
        );
        assert_eq!(
            parse_node("p", br#"{"5": 1, "6": 2}"#),
            Ok(Some(WindowCount {
                window: 6,
                count: 2
            }))
        );
    }

    #[test]
    fn foreign_nodes_are_malformed_with_their_path() {
        for body in [
            &br#"{"hello": 1}"#[..],
            br#"{"5": "x"}"#,
            br#"{"5": -1}"#,
            br#"{"5": 1.5}"#,
            b"17",
            b"[1,2]",
            b"{",
        ] {
            match parse_node("rateLimits/mcp/k", body) {
                Err(StoreError::Malformed { path, .. }) => assert_eq!(path, "rateLimits/mcp/k"),
                other => panic!("{}: {other:?}", String::from_utf8_lossy(body)),
            }
        }
    }
}
