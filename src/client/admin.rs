//! The admin token as the client holds it: a sensitive `authorization` header value
//! whose `Debug` is redacted, sent only on Reset calls (`reset.rs`).

use tonic::metadata::AsciiMetadataValue;

/// `authorization: Bearer <admin token>`, marked sensitive; its `Debug` is redacted.
#[derive(Clone)]
pub(super) struct AdminHeader(pub(super) AsciiMetadataValue);

impl AdminHeader {
    /// `None` for an empty token or one that cannot be a header value.
    pub(super) fn new(token: &str) -> Option<Self> {
        let token = token.trim();
        if token.is_empty() {
            return None;
        }
        let mut value: AsciiMetadataValue = format!("Bearer {token}").parse().ok()?;
        value.set_sensitive(true);
        Some(Self(value))
    }
}

impl std::fmt::Debug for AdminHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminHeader(<redacted>)")
    }
}
