//! Who may call the admin RPCs (`Reset`).
//!
//! The token comes from `RATELIMIT_ADMIN_TOKEN` only (a flag would show up in process
//! listings). It is compared in constant time, and never formatted: [`AdminToken`]'s
//! `Debug` prints a placeholder so it cannot leak into a log line by accident.

use subtle::ConstantTimeEq;
use tonic::Status;
use tonic::metadata::MetadataMap;

/// The configured admin token.
#[derive(Clone)]
pub struct AdminToken(Box<[u8]>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// A token; `None` when `token` is empty (an empty token would let anyone in).
    pub fn new(token: &str) -> Option<Self> {
        let token = token.trim();
        (!token.is_empty()).then(|| Self(token.as_bytes().into()))
    }
}

/// Checks a call's `authorization: Bearer <token>` against `configured`.
pub fn authorize(configured: Option<&AdminToken>, metadata: &MetadataMap) -> Result<(), Status> {
    let Some(expected) = configured else {
        return Err(Status::failed_precondition(
            "admin RPCs are disabled: set RATELIMIT_ADMIN_TOKEN on the server to enable Reset",
        ));
    };
    let presented = metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match presented {
        Some(token) if bool::from(token.as_bytes().ct_eq(&expected.0)) => Ok(()),
        Some(_) => Err(Status::unauthenticated("admin token is not valid")),
        None => Err(Status::unauthenticated(
            "admin RPCs need `authorization: Bearer <admin token>` metadata",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(value: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(Ok(v)) = value.map(str::parse) {
            m.insert("authorization", v);
        }
        m
    }

    #[test]
    fn disabled_without_a_token() {
        let e = authorize(None, &md(Some("Bearer x"))).expect_err("disabled");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().starts_with("admin RPCs are disabled"));
        assert!(AdminToken::new("  ").is_none());
    }

    #[test]
    fn right_token_passes_wrong_or_missing_token_does_not() {
        let t = AdminToken::new("s3cret");
        assert!(authorize(t.as_ref(), &md(Some("Bearer s3cret"))).is_ok());
        for bad in [
            Some("Bearer s3cre"),
            Some("Bearer s3cretx"),
            Some("s3cret"),
            None,
        ] {
            let e = authorize(t.as_ref(), &md(bad)).expect_err("refused");
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
            assert!(!e.message().contains("s3cret"));
        }
    }

    #[test]
    fn debug_never_shows_the_token() {
        let t = AdminToken::new("s3cret");
        assert_eq!(format!("{t:?}"), "Some(AdminToken(<redacted>))");
    }
}
