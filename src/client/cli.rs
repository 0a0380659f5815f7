//! `ratelimit check`: one decision from the command line, through the client library,
//! so it behaves exactly as a caller does (deadline, local fallback, same messages).
//!
//! Output is one JSON object on stdout; the exit code says the verdict so scripts need
//! no JSON parser: 0 allowed, 1 denied, 2 usage or input error (clap's own usage
//! errors exit 2 as well). With no service reachable it still answers, from its own
//! window (`"shared": false`).

use super::error::ClientError;
use super::handle::Client;
use crate::config::CheckArgs;
use crate::decision::Decision;
use std::process::ExitCode;

/// Exit code of an allowed check.
pub const EXIT_ALLOWED: u8 = 0;
/// Exit code of a denied check.
pub const EXIT_DENIED: u8 = 1;
/// Exit code of a usage or input error (no decision).
pub const EXIT_USAGE: u8 = 2;

/// Runs `ratelimit check` and returns the process's exit code.
pub fn run(args: &CheckArgs) -> ExitCode {
    // Warnings (the service unreachable, say) go to stderr; stdout stays pure JSON.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match runtime.block_on(check(args)) {
        Ok(decision) => {
            println!("{}", decision_json(&decision));
            ExitCode::from(if decision.allowed {
                EXIT_ALLOWED
            } else {
                EXIT_DENIED
            })
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

async fn check(args: &CheckArgs) -> Result<Decision, ClientError> {
    let fallback = crate::config::load_limits(args.limits.as_deref())?;
    let mut builder = Client::builder(args.server.as_str())
        .deadline(args.deadline)
        .fallback_limits(fallback)
        // One check per process: learning the limits would be a wasted call.
        .learn_limits(false);
    if args.cloud_run_auth {
        builder = builder.cloud_run_auth();
    }
    let client = builder.build()?;
    client.check(&args.limit, &args.key, args.cost).await
}

/// The decision as the CLI prints it: the `CheckResponse` fields, durations in whole
/// seconds, `retry_after_s` null when allowed.
pub fn decision_json(d: &Decision) -> serde_json::Value {
    serde_json::json!({
        "allowed": d.allowed,
        "limit": d.limit,
        "remaining": d.remaining,
        "reset_after_s": d.reset_secs(),
        "retry_after_s": d.retry_after_secs(),
        "shared": d.shared,
        "source": d.source.as_str(),
        "limit_name": &*d.limit_name,
        "window": d.window,
    })
}
