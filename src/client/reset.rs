//! [`Client::reset`]: clear a key's window through the service (the admin `Reset`), and
//! at once in this process: its deny-until entry and its own fallback window.
//!
//! Sign-in resets a key after a successful login; without clearing the client's own
//! deny-until cache, this process would go on refusing the user for up to a second.

use super::admin::AdminHeader;
use super::error::{CallError, ClientError, Unavailable};
use super::handle::Client;
use crate::decision::{ResetOutcome, validate_key};
use crate::pb;
use tonic::Code;

impl Client {
    /// Clears `key`'s window under `limit` (empty: the default) through the service, and
    /// this process's deny-until entry and local window for it, at once.
    ///
    /// Needs [`ClientBuilder::admin_token`](super::ClientBuilder::admin_token). When the
    /// service cannot be asked, only this process is cleared and the outcome says
    /// `shared = false`; a refusal by the service ([`ClientError::Refused`]) and bad
    /// input are errors.
    pub async fn reset(&self, limit: &str, key: &str) -> Result<ResetOutcome, ClientError> {
        validate_key(key)?;
        let Some(AdminHeader(header)) = self.inner.admin.clone() else {
            return Err(ClientError::Config(
                "Client::reset needs the service's admin token (ClientBuilder::admin_token)".into(),
            ));
        };
        let known = self.inner.known.get(limit);
        let cache_name = known.as_ref().map_or(limit, |l| &*l.name);
        self.inner.deny.clear(cache_name, key);
        if let Some(l) = &known {
            self.inner.local.reset(l, key);
        }
        let request = pb::ResetRequest {
            key: key.to_owned(),
            limit: limit.to_owned(),
        };
        let answer = self
            .call(request, |mut rpc, mut req| async move {
                req.metadata_mut().insert("authorization", header);
                rpc.reset(req).await
            })
            .await;
        match answer {
            Ok(r) => Ok(ResetOutcome {
                limit_name: r.limit_name.into(),
                window: r.window,
                shared: r.shared,
            }),
            Err(CallError::Caller(e)) => Err(e),
            Err(CallError::Down(Unavailable::Failed {
                code: Code::Unauthenticated | Code::PermissionDenied | Code::FailedPrecondition,
                message,
            })) => Err(ClientError::Refused(message)),
            Err(CallError::Down(why)) => {
                tracing::warn!(service = %self.inner.url, reason = why.kind(), error = %why, "reset reached only this process: service unavailable");
                let window = known.as_ref().map_or(0, |l| {
                    crate::window::number(self.inner.clock.now_ms(), l.window_ms)
                });
                Ok(ResetOutcome {
                    limit_name: cache_name.into(),
                    window,
                    shared: false,
                })
            }
        }
    }
}
