//! The `ratelimit` binary: parses flags and wires the library together. All behaviour
//! lives in the library (`src/lib.rs` has the map).

use clap::Parser;
use ratelimit::config::{self, Cli, Command, LimitsCommand, ServeArgs};
use ratelimit::server::{self, admin::AdminToken};
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => ratelimit::client::cli::run(&args),
        Command::Limits {
            command: LimitsCommand::Check { file },
        } => match ratelimit::limits::Limits::load(&file) {
            Ok(limits) => {
                for l in limits.iter() {
                    println!(
                        "{}\t{} per {}\ton_store_failure={}{}",
                        l.name,
                        l.requests,
                        ratelimit::limits::format_window(l.window()),
                        l.on_store_failure,
                        if l.name == limits.default_limit().name {
                            "\t(default)"
                        } else {
                            ""
                        }
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Command::Serve(args) => {
            ratelimit::logging::init(args.log_format(), &args.log);
            let runtime = match server::runtime(usize::from(args.workers)) {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            match runtime.block_on(serve(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    ratelimit::install_crypto_provider();
    // The recorder goes in first: the limiter reports its breaker state when built.
    let metrics_addr = match args.metrics_listen {
        Some(m) => Some(ratelimit::metrics::serve(m).await?),
        None => None,
    };
    let clock = ratelimit::clock::system();
    let limiter = Arc::new(config::build_limiter(&args, clock).await?);
    ratelimit::metrics::register_limits(limiter.limits().iter().map(|l| &*l.name));
    let admin_env = std::env::var(config::ADMIN_TOKEN_ENV).ok();
    let admin = admin_env.as_deref().and_then(AdminToken::new);
    if admin_env.is_some() && admin.is_none() {
        tracing::warn!(
            "{} is set but blank: admin RPCs (Reset) stay disabled",
            config::ADMIN_TOKEN_ENV
        );
    }
    let addr = args.listen_addr()?;
    let incoming = server::bind(addr)?;
    config::warn_about_timeouts(&args);
    tracing::info!(
        listen = %addr,
        store = limiter.store_name(),
        limits = %limiter.limits().summary(),
        store_timeout = ?args.store_timeout,
        admin_rpcs = admin.is_some(),
        metrics = %metrics_addr.map_or_else(|| "off".to_owned(), |a| format!("http://{a}/metrics")),
        "ratelimit serving"
    );
    server::serve(
        limiter,
        args.serve_options(admin),
        incoming,
        shutdown_signal(),
    )
    .await?;
    tracing::info!("ratelimit stopped");
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("cannot listen for SIGTERM: {e}");
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown signal received; draining");
}
