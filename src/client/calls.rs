//! The calls a caller makes ([`Client::check`], [`Client::peek`],
//! [`Client::refresh_limits`]) and what happens when the service cannot answer: the
//! limit's failure policy through the client's own window, and the wire-to-[`Decision`]
//! mapping.

use super::error::{CallError, ClientError, Unavailable};
use super::handle::Client;
use super::known;
use crate::decision::{Decision, Source, resolve_cost, validate_key};
use crate::limits::{Limit, Limits};
use crate::pb;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Client {
    /// Counts `cost` hits (0 means 1) for `key` under the limit `limit` (empty: the
    /// service's default) and says whether to admit them.
    ///
    /// Answers within the deadline whatever the service does: unreachable, late or
    /// failing, the decision comes from this process's own window with `shared =
    /// false`. Errors are only ever the caller's: bad input, an unknown limit.
    pub async fn check(&self, limit: &str, key: &str, cost: u32) -> Result<Decision, ClientError> {
        validate_key(key)?;
        let known = self.inner.known.get(limit);
        let cost = match &known {
            Some(l) => resolve_cost(l, cost)?,
            // The service alone knows this limit; it checks the cost.
            None => cost.max(1),
        };
        let cache_name = known.as_ref().map_or(limit, |l| &*l.name);
        let sent_ms = self.inner.clock.now_ms();
        if let Some(refused) = self.inner.deny.check(cache_name, key, cost, sent_ms) {
            return Ok(refused);
        }
        let request = pb::CheckRequest {
            key: key.to_owned(),
            limit: limit.to_owned(),
            cost,
        };
        match self
            .call(request, |mut rpc, req| async move { rpc.check(req).await })
            .await
        {
            Ok(response) => {
                let decision = decision_from_pb(response);
                self.inner.deny.record(cache_name, key, &decision, sent_ms);
                Ok(decision)
            }
            Err(CallError::Caller(e)) => Err(e),
            Err(CallError::Down(why)) => {
                let limit = self.fallback_limit(known, limit, &why);
                Ok(self
                    .inner
                    .local
                    .fail_open(&limit, key, cost, Source::ClientFallback))
            }
        }
    }

    /// The key's current window under `limit` (empty: the default), counting nothing.
    /// When the service cannot answer: this process's own window, `shared = false`.
    pub async fn peek(&self, limit: &str, key: &str) -> Result<Decision, ClientError> {
        validate_key(key)?;
        let known = self.inner.known.get(limit);
        let request = pb::PeekRequest {
            key: key.to_owned(),
            limit: limit.to_owned(),
        };
        match self
            .call(request, |mut rpc, req| async move { rpc.peek(req).await })
            .await
        {
            Ok(response) => Ok(decision_from_pb(response)),
            Err(CallError::Caller(e)) => Err(e),
            Err(CallError::Down(why)) => {
                let limit = self.fallback_limit(known, limit, &why);
                Ok(self
                    .inner
                    .local
                    .peek_open(&limit, key, Source::ClientFallback))
            }
        }
    }

    /// Fetches the service's limits now and decides with them from then on.
    pub async fn refresh_limits(&self) -> Result<Limits, ClientError> {
        match self
            .call(pb::ListLimitsRequest {}, |mut rpc, req| async move {
                rpc.list_limits(req).await
            })
            .await
        {
            Ok(response) => {
                let limits = known::from_pb(response)?;
                self.inner.known.learn(limits.clone());
                tracing::debug!(service = %self.inner.url, limits = %limits.summary(), "learned the service's limits");
                Ok(limits)
            }
            Err(CallError::Caller(e)) => Err(e),
            Err(CallError::Down(why)) => Err(ClientError::Unavailable(why.to_string())),
        }
    }

    /// The limit to decide with locally (a stand-in for an unknown one, see `known.rs`),
    /// and the log line for the outage's start.
    fn fallback_limit(
        &self,
        known: Option<Arc<Limit>>,
        name: &str,
        why: &Unavailable,
    ) -> Arc<Limit> {
        let limit = self.inner.known.for_local_decision(known, name);
        if !self.inner.degraded.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                service = %self.inner.url,
                limit = %limit.name,
                reason = why.kind(),
                error = %why,
                "rate-limit service unavailable; deciding locally (shared=false)"
            );
        } else {
            tracing::debug!(limit = %limit.name, reason = why.kind(), "deciding locally (shared=false)");
        }
        limit
    }
}

/// The service's answer as a [`Decision`].
pub(super) fn decision_from_pb(r: pb::CheckResponse) -> Decision {
    let source = match pb::Source::try_from(r.source) {
        Ok(pb::Source::Store) => Source::Store,
        Ok(pb::Source::DenyCache) => Source::DenyCache,
        Ok(pb::Source::LocalFallback) => Source::LocalFallback,
        Ok(pb::Source::FailurePolicy) => Source::FailurePolicy,
        Ok(pb::Source::Lease) => Source::Lease,
        // A newer service may add sources; `shared` still says what matters.
        Ok(pb::Source::Unspecified) | Err(_) if r.shared => Source::Store,
        Ok(pb::Source::Unspecified) | Err(_) => Source::LocalFallback,
    };
    let reset_after = duration(r.reset_after);
    Decision {
        allowed: r.allowed,
        limit: r.limit,
        remaining: r.remaining,
        reset_after,
        retry_after: (!r.allowed).then(|| r.retry_after.map_or(reset_after, |d| duration(Some(d)))),
        shared: r.shared,
        source,
        limit_name: Arc::from(r.limit_name),
        window: r.window,
    }
}

/// A protobuf duration from the wire; negative or missing is zero, and nothing overflows.
pub(super) fn duration(d: Option<prost_types::Duration>) -> Duration {
    let Some(d) = d else {
        return Duration::ZERO;
    };
    let secs = u64::try_from(d.seconds).unwrap_or(0);
    let nanos = u64::try_from(d.nanos).unwrap_or(0);
    Duration::from_secs(secs).saturating_add(Duration::from_nanos(nanos))
}
