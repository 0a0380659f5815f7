//! The `RateLimiter` gRPC service: request validation and mapping to and from the
//! [`Limiter`]. No decision logic lives here.

use super::admin::{self, AdminToken};
use super::in_flight::{InFlight, Slot};
use crate::decision::{CheckError, Decision, Source};
use crate::limiter::Limiter;
use crate::metrics;
use crate::pb;
use crate::pb::rate_limiter_server::RateLimiter;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tonic::metadata::{Ascii, MetadataKey, MetadataMap};
use tonic::{Request, Response, Status};

/// The gRPC face of a [`Limiter`].
pub struct RateLimitService {
    limiter: Arc<Limiter>,
    admin: Option<AdminToken>,
    in_flight: InFlight,
}

impl RateLimitService {
    /// Serves `limiter`; `admin` enables `Reset`; at most `max_in_flight` calls at once.
    pub fn new(limiter: Arc<Limiter>, admin: Option<AdminToken>, max_in_flight: usize) -> Self {
        Self {
            limiter,
            admin,
            in_flight: InFlight::new(max_in_flight),
        }
    }

    fn admit_call(&self) -> Result<Slot<'_>, Status> {
        self.in_flight.try_enter().ok_or_else(|| {
            metrics::shed();
            Status::resource_exhausted(format!(
                "server busy: {} calls in flight; decide locally or retry later",
                self.in_flight.max()
            ))
        })
    }
}

/// The time the caller will still wait, from the `grpc-timeout` header (gRPC over HTTP/2
/// spec: up to 8 digits and a unit `H M S m u n`). Unparseable values are ignored.
pub fn caller_deadline(metadata: &MetadataMap) -> Option<Duration> {
    // A parsed name: a `&str` would be parsed and validated again on every call.
    static GRPC_TIMEOUT: LazyLock<MetadataKey<Ascii>> =
        LazyLock::new(|| MetadataKey::from_static("grpc-timeout"));
    let raw = metadata.get(&*GRPC_TIMEOUT)?.to_str().ok()?;
    let (digits, unit) = raw.split_at(raw.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3_600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn to_status(e: CheckError) -> Status {
    match e {
        CheckError::UnknownLimit(u) => Status::not_found(u.to_string()),
        other => Status::invalid_argument(other.to_string()),
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

impl From<Source> for pb::Source {
    fn from(s: Source) -> Self {
        match s {
            Source::Store => pb::Source::Store,
            Source::DenyCache => pb::Source::DenyCache,
            Source::LocalFallback | Source::ClientFallback => pb::Source::LocalFallback,
            Source::FailurePolicy => pb::Source::FailurePolicy,
            Source::Lease => pb::Source::Lease,
        }
    }
}

impl From<Decision> for pb::CheckResponse {
    fn from(d: Decision) -> Self {
        Self {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            reset_after: Some(duration(d.reset_after)),
            retry_after: d.retry_after.map(duration),
            shared: d.shared,
            source: pb::Source::from(d.source).into(),
            // Not `to_string()`: on an `Arc<str>` that formats through `Display`.
            limit_name: String::from(&*d.limit_name),
            window: d.window,
        }
    }
}

#[tonic::async_trait]
impl RateLimiter for RateLimitService {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let _slot = self.admit_call()?;
        let deadline = caller_deadline(request.metadata());
        let r = request.into_inner();
        let d = self
            .limiter
            .check(&r.limit, &r.key, r.cost, deadline)
            .await
            .map_err(to_status)?;
        Ok(Response::new(d.into()))
    }

    async fn peek(
        &self,
        request: Request<pb::PeekRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let _slot = self.admit_call()?;
        let deadline = caller_deadline(request.metadata());
        let r = request.into_inner();
        let d = self
            .limiter
            .peek(&r.limit, &r.key, deadline)
            .await
            .map_err(to_status)?;
        Ok(Response::new(d.into()))
    }

    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        admin::authorize(self.admin.as_ref(), request.metadata())?;
        let _slot = self.admit_call()?;
        let deadline = caller_deadline(request.metadata());
        let r = request.into_inner();
        let out = self
            .limiter
            .reset(&r.limit, &r.key, deadline)
            .await
            .map_err(to_status)?;
        tracing::info!(
            limit = %out.limit_name,
            key = %crate::logging::key_tag(&r.key),
            shared = out.shared,
            "key reset by admin"
        );
        Ok(Response::new(pb::ResetResponse {
            limit_name: out.limit_name.to_string(),
            window: out.window,
            shared: out.shared,
        }))
    }

    async fn list_limits(
        &self,
        _request: Request<pb::ListLimitsRequest>,
    ) -> Result<Response<pb::ListLimitsResponse>, Status> {
        let limits = self.limiter.limits();
        let default = limits.default_limit().name.clone();
        Ok(Response::new(pb::ListLimitsResponse {
            limits: limits
                .iter()
                .map(|l| pb::Limit {
                    name: l.name.to_string(),
                    requests: l.requests,
                    window: Some(duration(l.window())),
                    is_default: l.name == default,
                    on_store_failure: l.on_store_failure.as_str().to_owned(),
                })
                .collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(v: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Ok(v) = v.parse() {
            m.insert("grpc-timeout", v);
        }
        m
    }

    #[test]
    fn grpc_timeout_header_is_parsed() {
        assert_eq!(
            caller_deadline(&md("300m")),
            Some(Duration::from_millis(300))
        );
        assert_eq!(caller_deadline(&md("2S")), Some(Duration::from_secs(2)));
        assert_eq!(caller_deadline(&md("1H")), Some(Duration::from_secs(3_600)));
        assert_eq!(
            caller_deadline(&md("99999999n")),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "m", "123456789m", "12x", "-1S", "1.5S"] {
            assert_eq!(caller_deadline(&md(bad)), None, "{bad}");
        }
        assert_eq!(caller_deadline(&MetadataMap::new()), None);
    }
}
