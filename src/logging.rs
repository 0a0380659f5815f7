//! Log output: human text on a terminal, or JSON lines that Cloud Logging understands
//! (`severity`, `message`, `time`, fields) on Cloud Run, where `K_SERVICE` is set.
//!
//! Secrets stay out of logs by construction: the admin token's `Debug` is redacted, RTDB
//! bearer tokens go only into request headers, and the HTTP/2 and HTTP client crates are
//! capped at `info` so their trace output (which can include header blocks) never turns on
//! with the service's own verbosity.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line in Cloud Logging's shape.
    Json,
}

impl LogFormat {
    /// JSON on Cloud Run (`K_SERVICE` is set there), text elsewhere.
    pub fn detect() -> Self {
        if std::env::var_os("K_SERVICE").is_some() {
            LogFormat::Json
        } else {
            LogFormat::Text
        }
    }
}

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

fn filter(spec: &str) -> EnvFilter {
    let mut f = EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new("info"));
    for d in QUIET {
        if let Ok(d) = d.parse() {
            f = f.add_directive(d);
        }
    }
    f
}

/// Installs the global subscriber. `spec` is an `EnvFilter` directive such as `info`.
pub fn init(format: LogFormat, spec: &str) {
    let registry = tracing_subscriber::registry().with(filter(spec));
    let result = match format {
        LogFormat::Json => registry.with(tracing_stackdriver::layer()).try_init(),
        LogFormat::Text => registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init(),
    };
    if let Err(e) = result {
        eprintln!("warning: logging already initialised: {e}");
    }
}
