//! The client's errors: [`ClientError`] (caller bugs and build problems, the only errors
//! a caller ever sees) and, inside the crate, why the service could not answer
//! (`Unavailable`, which becomes a local decision, never an error).

use crate::decision::CheckError;
use crate::limits::LimitsError;
use std::time::Duration;
use tonic::Code;

/// Why the client refused a call or could not be built. A service that is unreachable,
/// late or failing is never one of these: checks then decide locally.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClientError {
    /// Bad input, found before any RPC; the message is the service's own.
    #[error(transparent)]
    Invalid(#[from] CheckError),
    /// The service refused the input (`INVALID_ARGUMENT`), e.g. a cost above a limit the
    /// client did not know yet.
    #[error("{0}")]
    InvalidArgument(String),
    /// The service has no limit by that name (`NOT_FOUND`); the message lists the known ones.
    #[error("{0}")]
    NotFound(String),
    /// The service could not be asked (only for calls with no local answer, such as
    /// [`Client::refresh_limits`](super::Client::refresh_limits)).
    #[error("the rate-limit service could not be asked: {0}")]
    Unavailable(String),
    /// A set of limits breaks the limits rules: the service's `ListLimits` answer, or
    /// a fallback limits file.
    #[error(transparent)]
    BadLimits(#[from] LimitsError),
    /// The service URL is not usable.
    #[error("service URL {url:?}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A builder setting is out of range.
    #[error("{0}")]
    Config(String),
    /// The service refused an admin call ([`Client::reset`](super::Client::reset)): no or a wrong admin token,
    /// or admin calls disabled there. The message is the service's.
    #[error("the service refused the call: {0}")]
    Refused(String),
    /// [`ClientBuilder::build`](super::ClientBuilder::build) ran outside a Tokio runtime, which the connection needs.
    #[error("the rate-limit client must be built inside a Tokio runtime")]
    NoRuntime,
}

impl ClientError {
    /// True when the key itself is bad (empty or too long): the request being limited
    /// is at fault, not the caller's configuration.
    pub fn is_bad_key(&self) -> bool {
        matches!(
            self,
            ClientError::Invalid(CheckError::EmptyKey | CheckError::KeyTooLong(_))
        )
    }
}

/// Why the service's answer could not be had; the call is then decided locally.
#[derive(Debug)]
pub(super) enum Unavailable {
    /// The breaker is open: the service was not called.
    BreakerOpen,
    /// No answer within the deadline.
    Late(Duration),
    /// The call failed (connection refused or broken, or a failing status).
    Failed { code: Code, message: String },
}

impl Unavailable {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Unavailable::BreakerOpen => "breaker_open",
            Unavailable::Late(_) => "late",
            Unavailable::Failed { code, .. } => match code {
                Code::Unavailable => "unavailable",
                Code::Internal => "internal",
                Code::DeadlineExceeded => "deadline_exceeded",
                Code::ResourceExhausted => "resource_exhausted",
                Code::Unknown => "unknown",
                _ => "failed",
            },
        }
    }
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::BreakerOpen => f.write_str("circuit breaker open"),
            Unavailable::Late(d) => write!(f, "no answer within {d:?}"),
            Unavailable::Failed { code, message } => write!(f, "{code:?}: {message}"),
        }
    }
}

pub(super) enum CallError {
    /// The service could not answer: decide locally.
    Down(Unavailable),
    /// The service answered that the call itself is wrong.
    Caller(ClientError),
}
