//! One RPC to the service: through the breaker, within the deadline, with the Cloud Run
//! ID token when configured; the connection renewed after a late call, and the
//! service's limits learned in the background once it answers.

use super::error::{CallError, ClientError, Unavailable};
use super::handle::{Client, Conn};
use crate::pb::rate_limiter_client::RateLimiterClient;
use std::future::Future;
use std::sync::atomic::Ordering;
use tonic::transport::Channel;
use tonic::{Code, Status};

impl Client {
    /// One RPC through the breaker, within the deadline.
    pub(super) async fn call<M, T, F, Fut>(&self, message: M, rpc: F) -> Result<T, CallError>
    where
        F: FnOnce(RateLimiterClient<Channel>, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let inner = &self.inner;
        let Some(attempt) = inner.breaker.attempt() else {
            return Err(CallError::Down(Unavailable::BreakerOpen));
        };
        let (generation, client) = {
            let conn = inner.conn.read().unwrap_or_else(|p| p.into_inner());
            (conn.generation, conn.rpc.clone())
        };
        let mut request = tonic::Request::new(message);
        let started = std::time::Instant::now();
        #[cfg(feature = "cloud-run-auth")]
        if let Some(tokens) = &inner.id_tokens {
            let token = tokio::time::timeout(inner.deadline, tokens.token()).await;
            let header = match token {
                Ok(Ok(t)) => format!("Bearer {t}").parse().ok(),
                _ => None,
            };
            let Some(header) = header else {
                // Without a token the front door would refuse the call: decide locally.
                let failure = Unavailable::Failed {
                    code: Code::Unauthenticated,
                    message: "no ID token for the service (metadata server unreachable?)".into(),
                };
                attempt.finish(false, failure.kind());
                return Err(CallError::Down(failure));
            };
            request
                .metadata_mut()
                .insert("x-serverless-authorization", header);
        }
        let left = inner.deadline.saturating_sub(started.elapsed());
        // The service reads this as its own budget, so it answers (from its fallback if
        // need be) before this deadline rather than let the call time out.
        request.set_timeout(left);
        let result = tokio::time::timeout(left, rpc(client, request)).await;
        let failure = match result {
            Ok(Ok(response)) => {
                attempt.finish(true, "ok");
                self.answered();
                return Ok(response.into_inner());
            }
            Ok(Err(status)) => match status.code() {
                // The service answered: it is healthy, the call is wrong.
                Code::InvalidArgument | Code::NotFound => {
                    attempt.finish(true, "ok");
                    self.answered();
                    let message = status.message().to_owned();
                    return Err(CallError::Caller(if status.code() == Code::NotFound {
                        ClientError::NotFound(message)
                    } else {
                        ClientError::InvalidArgument(message)
                    }));
                }
                // tonic's own deadline timer (from the grpc-timeout above) fired first.
                Code::Cancelled => Unavailable::Late(inner.deadline),
                code => Unavailable::Failed {
                    code,
                    message: status.message().to_owned(),
                },
            },
            Err(_elapsed) => Unavailable::Late(inner.deadline),
        };
        if matches!(failure, Unavailable::Late(_)) {
            self.renew_connection(generation);
        }
        attempt.finish(false, failure.kind());
        Err(CallError::Down(failure))
    }

    /// The service answered: log the end of an outage, and learn its limits if due.
    pub(super) fn answered(&self) {
        let inner = &self.inner;
        if inner.degraded.load(Ordering::Relaxed) && inner.degraded.swap(false, Ordering::AcqRel) {
            tracing::info!(service = %inner.url, "rate-limit service answering again; decisions are shared");
        }
        if !inner.learn_limits
            || inner.learning.load(Ordering::Relaxed)
            || !inner.known.claim_refresh()
            || inner.learning.swap(true, Ordering::AcqRel)
        {
            return;
        }
        // Clears the flag however the task ends, even if it never runs (runtime gone).
        struct Learning(Client);
        impl Drop for Learning {
            fn drop(&mut self) {
                self.0.inner.learning.store(false, Ordering::Release);
            }
        }
        let learning = Learning(self.clone());
        inner.runtime.spawn(async move {
            let client = &learning.0;
            if let Err(e) = client.refresh_limits().await {
                tracing::debug!(service = %client.inner.url, error = %e, "could not learn the service's limits; using the fallback limits");
            }
        });
    }

    /// Replaces the connection after a call on it ran into the deadline: the next call
    /// dials afresh, so a dead connection (a peer gone without a reset) cannot keep
    /// every call late. Once per connection, however many calls timed out on it.
    pub(super) fn renew_connection(&self, generation: u64) {
        let inner = &self.inner;
        let mut conn = inner.conn.write().unwrap_or_else(|p| p.into_inner());
        if conn.generation != generation {
            return;
        }
        let _entered = inner.runtime.enter();
        *conn = Conn {
            generation: generation.wrapping_add(1),
            rpc: RateLimiterClient::new(inner.endpoint.connect_lazy()),
        };
    }
}
