//! Reading an HTTP request for the REST protocol: query parameters, the headers the
//! protocol looks at, and who the caller is (owner, signed-in client or anonymous).
//!
//! Kept apart from `rest` so that the operations there see a parsed, validated request
//! and never touch raw strings from the wire.

use http::{HeaderMap, Method, Uri};
use serde_json::Value;

use crate::db::DEFAULT_NAMESPACE;
use crate::rest::{RestError, RestRequest};
use crate::rules::Caller;

/// The token the emulator treats as the admin (the Firebase emulator convention).
pub const OWNER_TOKEN: &str = "owner";

/// The request headers the protocol reads.
pub(crate) struct Headers {
    /// `X-Firebase-ETag: true`.
    pub(crate) want_etag: bool,
    pub(crate) if_match: Option<String>,
    pub(crate) if_none_match: Option<String>,
}

impl Headers {
    pub(crate) fn read(headers: &HeaderMap) -> Headers {
        Headers {
            want_etag: header(headers, "x-firebase-etag")
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true")),
            if_match: header(headers, "if-match"),
            if_none_match: header(headers, "if-none-match"),
        }
    }
}

/// A header value as text; a non-UTF-8 value is kept lossily (it can then only mismatch).
pub(crate) fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// Who the request is from. `Bearer owner` (or `access_token=owner` / `auth=owner`) is
/// the admin, unless it also sends `auth_variable_override`, which makes rules see that
/// `auth` (as production does for the Admin SDKs' `databaseAuthVariableOverride`). Any
/// other token counts as an authenticated client (`auth != null`); no token at all is
/// `auth == null`. Tokens are not verified.
pub(crate) fn caller(headers: &HeaderMap, params: &Params) -> Caller {
    let bearer = header(headers, "authorization").map(|v| {
        let v = v.trim();
        match v.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
                token.trim().to_owned()
            }
            _ => v.to_owned(),
        }
    });
    let token = bearer
        .or_else(|| params.token.clone())
        .filter(|t| !t.is_empty());
    match token.as_deref() {
        Some(OWNER_TOKEN) => match &params.auth_override {
            Some(auth) => Caller::Client {
                authenticated: !auth.is_null(),
            },
            None => Caller::Owner,
        },
        Some(_) => Caller::Client {
            authenticated: true,
        },
        None => Caller::Client {
            authenticated: false,
        },
    }
}

/// `X-HTTP-Method-Override` (header or query parameter) is honoured on POST.
pub(crate) fn effective_method(
    req: &RestRequest<'_>,
    params: &Params,
) -> Result<Method, RestError> {
    if req.method != Method::POST {
        return Ok(req.method.clone());
    }
    let Some(name) =
        header(req.headers, "x-http-method-override").or(params.method_override.clone())
    else {
        return Ok(Method::POST);
    };
    match name.trim().to_ascii_uppercase().as_str() {
        "GET" => Ok(Method::GET),
        "PUT" => Ok(Method::PUT),
        "PATCH" => Ok(Method::PATCH),
        "POST" => Ok(Method::POST),
        "DELETE" => Ok(Method::DELETE),
        _ => Err(RestError::BadRequest(format!(
            "Invalid X-HTTP-Method-Override {name:?}"
        ))),
    }
}

/// The query parameters the emulator understands.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Params {
    pub(crate) ns: String,
    pub(crate) silent: bool,
    pub(crate) shallow: bool,
    pub(crate) token: Option<String>,
    pub(crate) auth_override: Option<Value>,
    pub(crate) method_override: Option<String>,
}

impl Params {
    /// Parses the query. Unknown parameters are refused with 400 (production refuses
    /// unsupported ones; refusing unknown ones too catches client bugs early), and the
    /// query parameters of filtered reads are refused because queries are not emulated.
    pub(crate) fn parse(uri: &Uri) -> Result<Params, RestError> {
        let mut p = Params {
            ns: DEFAULT_NAMESPACE.to_owned(),
            silent: false,
            shallow: false,
            token: None,
            auth_override: None,
            method_override: None,
        };
        let bad = |msg: String| Err(RestError::BadRequest(msg));
        for (key, value) in query_pairs(uri)? {
            match key.as_str() {
                "ns" if value.is_empty() => {
                    return bad("Invalid namespace: ns must not be empty".into());
                }
                "ns" => p.ns = value,
                "print" => match value.as_str() {
                    "silent" => p.silent = true,
                    "pretty" => {}
                    _ => return bad(format!("Invalid print argument {value:?}")),
                },
                "shallow" => match value.as_str() {
                    "true" => p.shallow = true,
                    "false" => {}
                    _ => return bad(format!("Invalid shallow argument {value:?}")),
                },
                "format" if value == "export" => {}
                "format" => return bad(format!("Invalid format argument {value:?}")),
                "timeout" => check_timeout(&value)?,
                "writeSizeLimit" => {
                    if !matches!(
                        value.as_str(),
                        "tiny" | "small" | "medium" | "large" | "unlimited"
                    ) {
                        return bad(format!("Invalid writeSizeLimit {value:?}"));
                    }
                }
                "disableTriggers" => {}
                "auth" | "access_token" => p.token = Some(value),
                "auth_variable_override" => {
                    let auth = serde_json::from_str(&value).map_err(|_| {
                        RestError::BadRequest("auth_variable_override must be JSON".into())
                    })?;
                    p.auth_override = Some(auth);
                }
                "x-http-method-override" => p.method_override = Some(value),
                "orderBy" | "limitToFirst" | "limitToLast" | "startAt" | "startAfter" | "endAt"
                | "endBefore" | "equalTo" | "callback" | "download" => {
                    return bad(format!(
                        "The query parameter {key:?} is not supported by this emulator"
                    ));
                }
                _ => {
                    return bad(format!(
                        "The request does not support the query parameter {key:?}"
                    ));
                }
            }
        }
        Ok(p)
    }
}

/// Decodes the query string: `&`-separated `key=value` pairs, `+` meaning space.
pub(crate) fn query_pairs(uri: &Uri) -> Result<Vec<(String, String)>, RestError> {
    let Some(query) = uri.query() else {
        return Ok(Vec::new());
    };
    let decode = |s: &str| {
        let spaced = s.replace('+', " ");
        percent_encoding::percent_decode_str(&spaced)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| RestError::BadRequest("the query string is not valid UTF-8".into()))
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

/// `timeout=<n>ms|s|min`, positive, at most 15 minutes.
fn check_timeout(value: &str) -> Result<(), RestError> {
    let invalid = || {
        Err(RestError::BadRequest(format!(
            "Invalid timeout {value:?}: use <n>ms, <n>s or <n>min, positive and at most 15min"
        )))
    };
    let digits = value.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &value[digits.len()..];
    let Ok(n) = digits.parse::<u64>() else {
        return invalid();
    };
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "min" => n.checked_mul(60_000),
        _ => None,
    };
    match ms {
        Some(ms) if ms > 0 && ms <= 15 * 60_000 => Ok(()),
        _ => invalid(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn query_parameters() {
        let p = Params::parse(&uri(
            "/a.json?ns=x&print=silent&auth_variable_override=%7B%22uid%22%3A+%22u%22%7D",
        ))
        .unwrap();
        assert_eq!(p.ns, "x");
        assert!(p.silent);
        assert_eq!(p.auth_override, Some(json!({"uid": "u"})));
        assert_eq!(
            Params::parse(&uri("/a.json")).unwrap().ns,
            DEFAULT_NAMESPACE
        );
        for bad in [
            "ns=",
            "print=loud",
            "cachebust=1",
            "orderBy=%22%24key%22",
            "timeout=0s",
            "timeout=16min",
            "timeout=5h",
            "shallow=yes",
        ] {
            assert!(
                Params::parse(&uri(&format!("/a.json?{bad}"))).is_err(),
                "{bad}"
            );
        }
        for good in [
            "timeout=15min",
            "timeout=10ms",
            "writeSizeLimit=tiny",
            "format=export",
            "disableTriggers=true",
        ] {
            assert!(
                Params::parse(&uri(&format!("/a.json?{good}"))).is_ok(),
                "{good}"
            );
        }
    }

    #[test]
    fn callers() {
        let mut h = HeaderMap::new();
        let p = Params::parse(&uri("/a.json")).unwrap();
        assert_eq!(
            caller(&h, &p),
            Caller::Client {
                authenticated: false
            }
        );
        h.insert("authorization", "Bearer owner".parse().unwrap());
        assert_eq!(caller(&h, &p), Caller::Owner);
        let over = Params::parse(&uri("/a.json?auth_variable_override=null")).unwrap();
        assert_eq!(
            caller(&h, &over),
            Caller::Client {
                authenticated: false
            }
        );
        h.insert("authorization", "bearer someone".parse().unwrap());
        assert_eq!(
            caller(&h, &p),
            Caller::Client {
                authenticated: true
            }
        );
        let q = Params::parse(&uri("/a.json?access_token=owner")).unwrap();
        assert_eq!(caller(&HeaderMap::new(), &q), Caller::Owner);
    }
}
