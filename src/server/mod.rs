//! The gRPC server: one port carrying the `RateLimiter` service, gRPC health
//! (`grpc.health.v1`) and reflection (v1 and v1alpha, since grpcurl 1.8 only speaks
//! v1alpha), so ops can `grpcurl list`, `describe` and call it with no proto file.
//!
//! - `rpc.rs`: the `RateLimiter` service (validation and mapping to gRPC);
//! - `admin.rs`: the admin token check for `Reset`;
//! - `in_flight.rs`: load shedding, the bound on calls in flight.

pub mod admin;
mod in_flight;
pub mod rpc;

use crate::limiter::Limiter;
use crate::pb;
use crate::pb::rate_limiter_server::RateLimiterServer;
use admin::AdminToken;
use rpc::RateLimitService;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// Largest request or response message accepted, in bytes. A `CheckRequest` is well under
/// 1 KiB; anything near this is abuse or a bug, and refusing it early bounds memory.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Reflection could not be built from the descriptor set.
    #[error("cannot build gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Binds `addr` (port 0 picks a free port).
pub fn bind(addr: SocketAddr) -> Result<TcpIncoming, ServeError> {
    TcpIncoming::bind(addr)
        // TCP_NODELAY, as tonic's own `Server::serve` sets it (it ignores its
        // `tcp_nodelay` for a caller-supplied incoming). Without it Nagle holds back a
        // small HTTP/2 write until the peer's delayed ACK: the load generator saw a
        // ~40 ms stall in more than 1 of 1,000 checks (p99.9 ≈ 42 ms; BENCHMARKS.md §7).
        .map(|incoming| incoming.with_nodelay(Some(true)))
        .map_err(|source| ServeError::Bind {
            addr,
            source: source.into(),
        })
}

/// The runtime `ratelimit serve` runs on, with `workers` threads deciding (`--workers`):
/// 1 is a current-thread runtime, more a multi-thread one, 0 one worker per core the
/// process may use (`available_parallelism`, which follows a container's CPU quota).
///
/// One thread is the default, as in Limitador's gRPC server. It serves every connection
/// in FIFO order: no work stealing, no LIFO slot that lets a just-woken task overtake the
/// queue, no wake-ups across threads. It measured the tighter tail, fewer instructions
/// per call and, on 2 cores shared with the load, more calls per second than two workers
/// (BENCHMARKS.md §12). One thread decides far more checks per second than an instance
/// is sent; capacity comes from more instances, and a larger one can opt into workers.
pub fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let workers = match workers {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    if workers > 1 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
}

/// How the server treats connections and load.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Enables `Reset` for callers presenting this token.
    pub admin: Option<AdminToken>,
    /// RateLimiter calls in flight at once; past it calls fail fast with RESOURCE_EXHAUSTED.
    pub max_in_flight: usize,
    /// After SIGTERM, how long in-flight calls may take before the server exits anyway
    /// (below Cloud Run's 10 s so the process exits 0 before SIGKILL).
    pub drain_timeout: Duration,
    /// Connections are closed (GOAWAY) after this age, so long-lived gRPC clients spread
    /// over instances that Cloud Run starts later.
    pub max_connection_age: Duration,
    /// HTTP/2 PING interval that detects dead connections.
    pub keepalive_interval: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            admin: None,
            max_in_flight: 2_048,
            drain_timeout: Duration::from_secs(8),
            max_connection_age: Duration::from_secs(300),
            keepalive_interval: Duration::from_secs(30),
        }
    }
}

/// Serves `limiter` on `incoming` until `shutdown` completes, then drains.
///
/// Health reports `SERVING` for `""` and `bladbase.ratelimit.v1.RateLimiter` while up,
/// and `NOT_SERVING` as soon as shutdown starts, so load balancers stop sending traffic
/// while in-flight calls finish. Draining is bounded by `drain_timeout`: tonic waits for
/// every open stream, and a client's `Health/Watch` stream never ends by itself.
pub async fn serve(
    limiter: Arc<Limiter>,
    options: ServeOptions,
    incoming: TcpIncoming,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimiterServer<RateLimitService>>()
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let summaries = write_fallback_summaries(limiter.clone());
    let service = RateLimiterServer::new(RateLimitService::new(
        limiter,
        options.admin.clone(),
        options.max_in_flight,
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);

    let mut reporter = health.clone();
    let (draining, drain_started) = tokio::sync::oneshot::channel::<()>();
    let server = Server::builder()
        .http2_keepalive_interval(Some(options.keepalive_interval))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_connection_age(options.max_connection_age)
        .max_connection_age_grace(options.drain_timeout)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            mark_not_serving(&mut reporter).await;
            let _ = draining.send(());
        });
    tokio::pin!(server);
    let drain_timeout = options.drain_timeout;
    tokio::select! {
        r = &mut server => r?,
        () = async {
            if drain_started.await.is_ok() {
                tokio::time::sleep(drain_timeout).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!(?drain_timeout, "drain deadline reached; closing the remaining streams");
        }
        // Never ends; stops with the server.
        () = summaries => {}
    }
    Ok(())
}

/// How often the server asks the fallback log for its due summary lines. A summary is due
/// `fallback::LOG_INTERVAL` after the last; asked only that often, out of step with it,
/// it could wait nearly a second interval. Asking costs one uncontended lock.
const SUMMARY_POLL: Duration = Duration::from_secs(1);

/// Writes the fallback log's summary lines as they fall due, whether or not more
/// fallbacks come (`fallback::FallbackLog`).
async fn write_fallback_summaries(limiter: Arc<Limiter>) {
    let mut every = tokio::time::interval(SUMMARY_POLL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        limiter.flush_fallback_log();
    }
}

async fn mark_not_serving(health: &mut HealthReporter) {
    health
        .set_not_serving::<RateLimiterServer<RateLimitService>>()
        .await;
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    // Then end the `Health/Watch` streams (each still delivers the NOT_SERVING just
    // sent): an open stream never ends by itself and would hold the drain open for the
    // whole --drain-timeout after the last call has finished.
    let rpc = <RateLimiterServer<RateLimitService> as tonic::server::NamedService>::NAME;
    for service in [rpc, ""] {
        health.clear_service_status(service).await;
    }
}

/// A server running in the background; for tests, benchmarks and embedding.
pub struct Running {
    /// The address it listens on.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl Running {
    /// Starts serving `limiter` on `addr` (port 0 picks one) with default options.
    pub fn start(
        limiter: Arc<Limiter>,
        admin: Option<AdminToken>,
        addr: SocketAddr,
    ) -> Result<Self, ServeError> {
        Self::start_with(
            limiter,
            ServeOptions {
                admin,
                ..ServeOptions::default()
            },
            addr,
        )
    }

    /// Starts serving `limiter` on `addr` with `options`.
    pub fn start_with(
        limiter: Arc<Limiter>,
        options: ServeOptions,
        addr: SocketAddr,
    ) -> Result<Self, ServeError> {
        let incoming = bind(addr)?;
        let addr = incoming.local_addr().map_err(|source| ServeError::Bind {
            addr,
            source: source.into(),
        })?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(limiter, options, incoming, async move {
            let _ = stopped.await;
        }));
        Ok(Self {
            addr,
            stop: Some(stop),
            task,
        })
    }

    /// `http://ADDR`, for a client to connect to.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, drains, and waits for the server to finish.
    pub async fn stop(mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(r) => r,
            Err(_) => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}
