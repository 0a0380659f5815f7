//! Google-signed ID tokens, so the client can call the service on Cloud Run when it is
//! deployed with IAM authentication (`--no-allow-unauthenticated`).
//!
//! A caller running on Google Cloud (Cloud Run, GKE, GCE) asks the metadata server for an
//! ID token whose audience is the service's URL. The client sends it as
//! `x-serverless-authorization: Bearer <token>`: Cloud Run checks that header for IAM
//! and strips its signature, and it leaves `authorization` free for the service's own
//! admin token.
//!
//! Tokens live an hour; one is reused until five minutes before its `exp`, so a check
//! normally costs no metadata round trip. Fetching is bounded by the check's deadline
//! and a failure makes that check decide locally, like any other unavailability.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The metadata server's host unless `GCE_METADATA_HOST` names another (the variable
/// Google's own client libraries honour).
pub const METADATA_HOST: &str = "metadata.google.internal";
/// Tokens are renewed this long before they expire.
const RENEW_BEFORE: Duration = Duration::from_secs(300);
/// How long a token whose expiry cannot be read is reused.
const UNKNOWN_EXPIRY_TTL: Duration = Duration::from_secs(600);

/// Why no ID token could be had.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum IdTokenError {
    /// The metadata server could not be reached or answered with an error.
    #[error("cannot get an ID token from the metadata server: {0}")]
    Fetch(String),
    /// The HTTP client could not be built.
    #[error("cannot build the metadata HTTP client: {0}")]
    Http(String),
}

/// ID tokens for one audience, from the metadata server, cached until near expiry.
pub struct IdTokens {
    http: reqwest::Client,
    url: String,
    cached: Mutex<Option<(Arc<str>, SystemTime)>>,
}

impl std::fmt::Debug for IdTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        f.debug_struct("IdTokens")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl IdTokens {
    /// Tokens for `audience` (the service's URL) from the metadata server at
    /// `$GCE_METADATA_HOST`, else `metadata.google.internal`.
    pub fn from_metadata_server(audience: &str) -> Result<Self, IdTokenError> {
        let host = std::env::var("GCE_METADATA_HOST").unwrap_or_else(|_| METADATA_HOST.to_owned());
        Self::with_metadata_host(&host, audience)
    }

    /// Tokens for `audience` from the metadata server at `host` (`host[:port]`).
    pub fn with_metadata_host(host: &str, audience: &str) -> Result<Self, IdTokenError> {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| IdTokenError::Http(e.to_string()))?;
        let mut url = reqwest::Url::parse(&format!(
            "http://{host}/computeMetadata/v1/instance/service-accounts/default/identity"
        ))
        .map_err(|e| IdTokenError::Http(format!("metadata host {host:?}: {e}")))?;
        url.query_pairs_mut().append_pair("audience", audience);
        Ok(Self {
            http,
            url: url.to_string(),
            cached: Mutex::new(None),
        })
    }

    /// A token valid for at least a few more minutes.
    pub async fn token(&self) -> Result<Arc<str>, IdTokenError> {
        let now = SystemTime::now();
        if let Some((token, renew_at)) = &*self.cached.lock().unwrap_or_else(|p| p.into_inner())
            && now < *renew_at
        {
            return Ok(token.clone());
        }
        let response = self
            .http
            .get(&self.url)
            .header("Metadata-Flavor", "Google")
            .send()
            .await
            .map_err(|e| IdTokenError::Fetch(e.to_string()))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| IdTokenError::Fetch(e.to_string()))?;
        if !status.is_success() {
            return Err(IdTokenError::Fetch(format!(
                "HTTP {}: {}",
                status.as_u16(),
                body.chars().take(120).collect::<String>()
            )));
        }
        let token: Arc<str> = Arc::from(body.trim());
        let renew_at = expiry(&token)
            .and_then(|exp| exp.checked_sub(RENEW_BEFORE))
            .unwrap_or(now + UNKNOWN_EXPIRY_TTL);
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) = Some((token.clone(), renew_at));
        Ok(token)
    }
}

/// The `exp` claim of a JWT, without verifying it (the service's front door does that).
fn expiry(jwt: &str) -> Option<SystemTime> {
    let payload = jwt.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(exp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(exp: u64) -> String {
        let payload = URL_SAFE_NO_PAD.encode(format!(r#"{{"aud":"x","exp":{exp}}}"#));
        format!("eyJhbGciOiJSUzI1NiJ9.{payload}.c2ln")
    }

    #[test]
    fn expiry_is_read_from_the_payload() {
        assert_eq!(
            expiry(&jwt(1_900_000_000)),
            UNIX_EPOCH.checked_add(Duration::from_secs(1_900_000_000))
        );
        assert_eq!(expiry("not-a-jwt"), None);
        assert_eq!(expiry("a.!!!.c"), None);
    }

    #[test]
    fn debug_hides_tokens() {
        let t = IdTokens::with_metadata_host("127.0.0.1:1", "https://svc").expect("builds");
        assert!(!format!("{t:?}").contains("Bearer"));
    }
}
