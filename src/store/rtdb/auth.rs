//! Access tokens for RTDB REST requests.
//!
//! Production: an OAuth2 access token from `gcp_auth` for the scopes RTDB REST wants,
//! sent as `Authorization: Bearer` (a header, not `access_token=`, so tokens stay out of
//! URLs and logs). gcp_auth caches the token and fetches a new one when it is within
//! 20 s of expiry, so tokens are refreshed before they expire.
//!
//! **A 401 with a token that has not expired** (revoked, rotated key): gcp_auth 0.12's
//! `TokenProvider` has only `token()`, which answers from its cache, and no way to drop
//! it. So [`GoogleTokens::refresh`] first asks the provider again (another task may have
//! refreshed it meanwhile), and when it still hands out the refused token, builds a
//! **new provider** (credential discovery again, bounded by the startup timeout): a
//! fresh provider has an empty cache, so a service-account key or refresh token mints a
//! new token. What bounds the damage when that does not help (the metadata server
//! caches its own token; a role was removed): a rebuild at most every
//! [`REDISCOVER_INTERVAL`] (single flight; other 401s in between fail at once), each
//! such failure is an `Auth` store error that counts against the circuit breaker, so
//! after a few the breaker opens and checks decide locally without calling RTDB, and the
//! cached token is replaced anyway within 20 s of its expiry (an hour at most).
//!
//! Emulator: the Firebase convention `Authorization: Bearer owner` (admin, bypasses the
//! rules); gcp_auth is never called, so no Google credentials are needed.
//!
//! Credential discovery does network I/O with no timeout of its own and may spawn
//! `gcloud`, so [`discover`] bounds it and turns failure into a message that says how
//! to fix it.

use crate::store::counter::StoreError;
use async_trait::async_trait;
use futures::future::BoxFuture;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Least time between two provider rebuilds after 401s (see the module doc).
pub const REDISCOVER_INTERVAL: Duration = Duration::from_secs(30);

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

/// Builds a new gcp_auth provider (credential discovery), for a forced refresh.
pub type Rediscover = Box<
    dyn Fn() -> BoxFuture<'static, Result<Arc<dyn gcp_auth::TokenProvider>, String>> + Send + Sync,
>;

/// Tokens from a gcp_auth provider.
pub struct GoogleTokens {
    provider: RwLock<Arc<dyn gcp_auth::TokenProvider>>,
    rediscover: Option<Rediscover>,
    /// Single flight for rebuilds, and when the last one happened.
    rebuilt: tokio::sync::Mutex<Option<Instant>>,
    interval: Duration,
}

impl GoogleTokens {
    /// Wraps a provider (discovered, or a fake in tests) that is never rebuilt: a 401
    /// with the token it keeps handing out is then an error.
    pub fn new(provider: Arc<dyn gcp_auth::TokenProvider>) -> Self {
        Self {
            provider: RwLock::new(provider),
            rediscover: None,
            rebuilt: tokio::sync::Mutex::new(None),
            interval: REDISCOVER_INTERVAL,
        }
    }

    /// Wraps a provider that `rediscover` replaces, at most once per `interval`, when
    /// RTDB refuses the token it keeps handing out.
    pub fn with_rediscovery(
        provider: Arc<dyn gcp_auth::TokenProvider>,
        rediscover: Rediscover,
        interval: Duration,
    ) -> Self {
        Self {
            rediscover: Some(rediscover),
            interval,
            ..Self::new(provider)
        }
    }

    fn provider(&self) -> Arc<dyn gcp_auth::TokenProvider> {
        self.provider
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A token other than `refused` from a new provider, which then replaces the old.
    async fn rebuild(&self, refused: &str) -> Result<Arc<str>, StoreError> {
        let Some(rediscover) = &self.rediscover else {
            return Err(no_newer_token());
        };
        let mut last = self.rebuilt.lock().await;
        // Another 401 may have rebuilt it while this one waited.
        let current = self.token().await?;
        if &*current != refused {
            return Ok(current);
        }
        if last.is_some_and(|at| at.elapsed() < self.interval) {
            return Err(no_newer_token());
        }
        *last = Some(Instant::now());
        let provider = rediscover().await.map_err(|e| {
            StoreError::Auth(format!("re-discovering credentials after a 401: {e}"))
        })?;
        *self.provider.write().unwrap_or_else(|p| p.into_inner()) = provider;
        let fresh = self.token().await?;
        if &*fresh == refused {
            return Err(no_newer_token());
        }
        tracing::info!("RTDB refused the access token; new credentials provider, new token");
        Ok(fresh)
    }
}

fn no_newer_token() -> StoreError {
    StoreError::Auth(
        "RTDB answered 401 and the credential provider has no newer token; check the service account's role"
            .into(),
    )
}

#[async_trait]
impl TokenSource for GoogleTokens {
    async fn token(&self) -> Result<Arc<str>, StoreError> {
        let t = self
            .provider()
            .token(SCOPES)
            .await
            .map_err(|e| StoreError::Auth(e.to_string()))?;
        Ok(Arc::from(t.as_str()))
    }

    async fn refresh(&self, refused: &str) -> Result<Arc<str>, StoreError> {
        let fresh = self.token().await?;
        if &*fresh != refused {
            return Ok(fresh);
        }
        self.rebuild(refused).await
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

/// Finds Google credentials and proves they yield a token, within `timeout`. The
/// tokens rebuild their provider the same way after a 401 (see the module doc).
pub async fn discover(timeout: Duration) -> Result<GoogleTokens, CredentialsError> {
    match find(timeout).await {
        Ok(provider) => {
            let rediscover: Rediscover = Box::new(move || {
                Box::pin(async move { find(timeout).await.map_err(|e| e.to_string()) })
            });
            Ok(GoogleTokens::with_rediscovery(
                provider,
                rediscover,
                REDISCOVER_INTERVAL,
            ))
        }
        Err(e) => Err(e),
    }
}

async fn find(timeout: Duration) -> Result<Arc<dyn gcp_auth::TokenProvider>, CredentialsError> {
    let found = tokio::time::timeout(timeout, async {
        let provider = gcp_auth::provider().await.map_err(|e| e.to_string())?;
        provider.token(SCOPES).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(provider)
    })
    .await;
    match found {
        Ok(Ok(provider)) => Ok(provider),
        Ok(Err(e)) => Err(CredentialsError::NotFound(e)),
        Err(_) => Err(CredentialsError::Timeout(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Always hands out the same token, as gcp_auth does until it nears expiry.
    struct Fixed(&'static str);

    #[async_trait]
    impl gcp_auth::TokenProvider for Fixed {
        async fn token(&self, _: &[&str]) -> Result<Arc<gcp_auth::Token>, gcp_auth::Error> {
            let json = serde_json::json!({"access_token": self.0, "expires_in": 3600});
            serde_json::from_value(json)
                .map(Arc::new)
                .map_err(|_| gcp_auth::Error::Str("bad token json"))
        }
        async fn project_id(&self) -> Result<Arc<str>, gcp_auth::Error> {
            Ok(Arc::from("p"))
        }
    }

    fn tokens(next: &'static [&'static str], calls: Arc<AtomicUsize>) -> GoogleTokens {
        let rediscover: Rediscover = Box::new(move || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let t = next.get(n).copied().unwrap_or("last");
            Box::pin(async move { Ok(Arc::new(Fixed(t)) as Arc<dyn gcp_auth::TokenProvider>) })
        });
        GoogleTokens::with_rediscovery(
            Arc::new(Fixed("revoked")),
            rediscover,
            Duration::from_secs(3_600),
        )
    }

    #[tokio::test]
    async fn a_refused_token_that_is_still_cached_gets_a_new_provider_once_per_interval() {
        let calls = Arc::new(AtomicUsize::new(0));
        let t = tokens(&["fresh", "newer"], calls.clone());
        assert_eq!(&*t.refresh("revoked").await.expect("a new token"), "fresh");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            &*t.token().await.expect("token"),
            "fresh",
            "the new provider stays"
        );
        // Refused again within the interval: no second rebuild, an Auth error.
        assert!(matches!(t.refresh("fresh").await, Err(StoreError::Auth(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // A token refused after another task already replaced it: that newer one.
        assert_eq!(&*t.refresh("revoked").await.expect("current"), "fresh");
    }

    #[tokio::test]
    async fn a_new_provider_with_the_same_token_is_an_auth_error() {
        let calls = Arc::new(AtomicUsize::new(0));
        let t = tokens(&["revoked"], calls.clone());
        assert!(matches!(
            t.refresh("revoked").await,
            Err(StoreError::Auth(_))
        ));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let plain = GoogleTokens::new(Arc::new(Fixed("revoked")));
        assert!(matches!(
            plain.refresh("revoked").await,
            Err(StoreError::Auth(_))
        ));
    }
}
