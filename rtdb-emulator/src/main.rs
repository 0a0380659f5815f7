//! The standalone emulator: `rtdb-emulator --port 9000 [--host 127.0.0.1] [--rules FILE]`.
//!
//! Logs one line with its address, serves until SIGTERM or Ctrl-C. Faults and counters are
//! driven over HTTP (`/.emulator/faults`, `/.emulator/stats`; see the library docs).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rtdb_emulator::{Emulator, Options};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Firebase Realtime Database REST emulator with fault injection"
)]
struct Args {
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 9000, env = "RTDB_EMULATOR_PORT")]
    port: u16,
    /// Host or IP address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "RTDB_EMULATOR_HOST")]
    host: String,
    /// A database.rules.json file every namespace starts with (default: deny all).
    #[arg(long, env = "RTDB_EMULATOR_RULES")]
    rules: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // No colour codes in log files (run.sh captures the output).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rtdb-emulator: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let rules = match &args.rules {
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let doc = rtdb_emulator::parse_rules_text(&text)
                .map_err(|e| format!("{}: {e}", file.display()))?;
            Some(doc)
        }
        None => None,
    };
    let addr = tokio::net::lookup_host((args.host.as_str(), args.port))
        .await?
        .next()
        .ok_or_else(|| format!("{} does not resolve to an address", args.host))?;
    let emulator = Emulator::start_with(Options {
        rules,
        addr: Some(addr),
    })
    .await?;
    tracing::info!("rtdb-emulator listening on http://{}", emulator.host());
    wait_for_signal().await?;
    tracing::info!("rtdb-emulator shutting down");
    emulator.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}
