//! Log output (feature `server`): human text on a terminal, or JSON lines that Cloud Logging understands
//! (`severity`, `message`, `time`, fields) on Cloud Run, where `K_SERVICE` is set.
//!
//! Secrets stay out of logs by construction: the admin token's `Debug` is redacted, RTDB
//! bearer tokens go only into request headers, and the HTTP/2 and HTTP client crates are
//! capped at `info` so their trace output (which can include header blocks) never turns on
//! with the service's own verbosity.
//!
//! Caller keys are personal data (e-mails, IPs): a line at `info` or above names a key
//! only by [`key_tag`], a keyed hash that groups the lines about one key within this
//! process and means nothing outside it. Store errors carry no URLs (reqwest errors are
//! stripped of theirs) and name RTDB nodes by the limit and the key's tag.

#[cfg(feature = "server")]
use clap::ValueEnum;
use ring::hmac;
use std::sync::OnceLock;
#[cfg(feature = "server")]
use tracing_subscriber::EnvFilter;
#[cfg(feature = "server")]
use tracing_subscriber::layer::SubscriberExt;
#[cfg(feature = "server")]
use tracing_subscriber::util::SubscriberInitExt;

#[cfg(feature = "server")]
/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line in Cloud Logging's shape.
    Json,
}

/// Whether this process runs on Cloud Run, which sets `K_SERVICE`.
#[cfg(feature = "server")]
pub fn on_cloud_run() -> bool {
    std::env::var_os("K_SERVICE").is_some()
}

#[cfg(feature = "server")]
impl LogFormat {
    /// JSON on Cloud Run, text elsewhere.
    pub fn detect() -> Self {
        if on_cloud_run() {
            LogFormat::Json
        } else {
            LogFormat::Text
        }
    }
}

#[cfg(feature = "server")]
/// Dependencies whose verbose levels may print request headers.
const QUIET: &[&str] = &[
    "h2=info",
    "hyper=info",
    "hyper_util=info",
    "reqwest=info",
    "tower=info",
    "tonic=info",
    "rustls=info",
];

#[cfg(feature = "server")]
fn filter(spec: &str) -> EnvFilter {
    let mut f = EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new("info"));
    for d in QUIET {
        if let Ok(d) = d.parse() {
            f = f.add_directive(d);
        }
    }
    f
}

#[cfg(feature = "server")]
/// Installs the global subscriber. `spec` is an `EnvFilter` directive such as `info`.
pub fn init(format: LogFormat, spec: &str) {
    let registry = tracing_subscriber::registry().with(filter(spec));
    let result = match format {
        LogFormat::Json => registry.with(tracing_stackdriver::layer()).try_init(),
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    // Colour codes only for a terminal, not for a file or a pipe.
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init(),
    };
    if let Err(e) = result {
        eprintln!("warning: logging already initialised: {e}");
    }
}

/// Hex digits of a [`key_tag`]: 48 bits, enough to tell a process's keys apart in logs.
const TAG_HEX: usize = 12;

/// A short keyed hash of a caller key for log lines: HMAC-SHA256 under a random key
/// drawn once per process, truncated. Stable within the process (lines about one key
/// can be grouped), unlinkable across processes and not reversible by guessing keys
/// (an e-mail's plain hash would be).
pub fn key_tag(key: &str) -> String {
    static SECRET: OnceLock<hmac::Key> = OnceLock::new();
    let secret = SECRET.get_or_init(|| {
        hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new()).unwrap_or_else(
            |_| {
                // No OS randomness (never seen): fastrand's seed is still per process.
                let bytes: Vec<u8> = std::iter::repeat_with(|| fastrand::u8(..))
                    .take(32)
                    .collect();
                hmac::Key::new(hmac::HMAC_SHA256, &bytes)
            },
        )
    });
    let tag = hmac::sign(secret, key.as_bytes());
    tag.as_ref()
        .iter()
        .take(TAG_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_tags_are_short_stable_and_distinct() {
        let a = key_tag("alice@example.com");
        assert_eq!(a.len(), TAG_HEX);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, key_tag("alice@example.com"));
        assert_ne!(a, key_tag("bob@example.com"));
        assert!(!a.contains("alice"));
    }
}
