//! Access tokens for RTDB REST requests.
//!
//! Production: an OAuth2 access token from `gcp_auth` for the scopes RTDB REST wants,
//! sent as `Authorization: Bearer` (a header, not `access_token=`, so tokens stay out of
//! URLs and logs). gcp_auth caches the token and fetches a new one when it is within
//! 20 s of expiry, so tokens are refreshed before they expire; on a 401 the store asks
//! once more ([`TokenSource::refresh`]).
//!
//! Emulator: the Firebase convention `Authorization: Bearer owner` (admin, bypasses the
//! rules); gcp_auth is never called, so no Google credentials are needed.
//!
//! Credential discovery does network I/O with no timeout of its own and may spawn
//! `gcloud`, so [`discover`] bounds it and turns failure into a message that says how
//! to fix it.

use super::super::StoreError;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// The OAuth2 scopes the RTDB REST API requires.
pub const SCOPES: &[&str] = &[
    "https://www.googleapis.com/auth/firebase.database",
    "https://www.googleapis.com/auth/userinfo.email",
];

/// A source of bearer tokens.
#[async_trait]
pub trait TokenSource: Send + Sync + 'static {
    /// The token to send now.
    async fn token(&self) -> Result<Arc<str>, StoreError>;
    /// A token to retry with after `refused` was answered with 401.
    async fn refresh(&self, refused: &str) -> Result<Arc<str>, StoreError>;
}

/// The emulator's admin token.
#[derive(Debug, Clone, Copy)]
pub struct EmulatorOwner;

#[async_trait]
impl TokenSource for EmulatorOwner {
    async fn token(&self) -> Result<Arc<str>, StoreError> {
        Ok(Arc::from("owner"))
    }
    async fn refresh(&self, _refused: &str) -> Result<Arc<str>, StoreError> {
        Err(StoreError::Auth(
            "the emulator refused the owner token".into(),
        ))
    }
}

/// Tokens from a gcp_auth provider.
pub struct GoogleTokens {
    provider: Arc<dyn gcp_auth::TokenProvider>,
}

impl GoogleTokens {
    /// Wraps a provider (discovered, or a fake in tests).
    pub fn new(provider: Arc<dyn gcp_auth::TokenProvider>) -> Self {
        Self { provider }
    }
}

#[async_trait]
impl TokenSource for GoogleTokens {
    async fn token(&self) -> Result<Arc<str>, StoreError> {
        let t = self
            .provider
            .token(SCOPES)
            .await
            .map_err(|e| StoreError::Auth(e.to_string()))?;
        Ok(Arc::from(t.as_str()))
    }

    async fn refresh(&self, refused: &str) -> Result<Arc<str>, StoreError> {
        let fresh = self.token().await?;
        if &*fresh == refused {
            return Err(StoreError::Auth(
                "RTDB answered 401 and the credential provider has no newer token; check the service account's role"
                    .into(),
            ));
        }
        Ok(fresh)
    }
}

/// Why credentials could not be found at startup.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// Discovery failed.
    #[error(
        "no Google credentials for RTDB: {0}. On Cloud Run, deploy with --service-account (a service account with the \"Firebase Realtime Database Admin\" role); locally, run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file; for an emulator, set FIREBASE_DATABASE_EMULATOR_HOST=host:port"
    )]
    NotFound(String),
    /// Discovery did not finish in time.
    #[error(
        "looking for Google credentials took longer than {0:?} (metadata server unreachable?). On Cloud Run this should be instant; locally set GOOGLE_APPLICATION_CREDENTIALS or FIREBASE_DATABASE_EMULATOR_HOST"
    )]
    Timeout(Duration),
}

/// Finds Google credentials and proves they yield a token, within `timeout`.
pub async fn discover(timeout: Duration) -> Result<GoogleTokens, CredentialsError> {
    let found = tokio::time::timeout(timeout, async {
        let provider = gcp_auth::provider().await.map_err(|e| e.to_string())?;
        provider.token(SCOPES).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(provider)
    })
    .await;
    match found {
        Ok(Ok(provider)) => Ok(GoogleTokens::new(provider)),
        Ok(Err(e)) => Err(CredentialsError::NotFound(e)),
        Err(_) => Err(CredentialsError::Timeout(timeout)),
    }
}
