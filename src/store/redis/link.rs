//! The Redis store's connection: one multiplexed connection, opened on first use,
//! replaced after an error or an abandoned call, and **probed before use after a
//! silence**.
//!
//! Why the probe: Redis (a restart, a failover, its `timeout` setting) or anything
//! between may close a connection while it is idle, and the client notices only when a
//! command is sent on it. redis-rs then reports the same broken pipe whether the command
//! never left or its answer was lost, so a write sent on a dead connection would be an
//! unknown outcome, decided locally (`shared = false`) while Redis is healthy again: one
//! extra admission per instance after every restart. A connection that has not answered
//! for [`RedisOptions::probe_after`](super::RedisOptions) is therefore sent a `PING`
//! first (a read: it may fail safely) and replaced if that fails, so the write goes out on
//! a connection known to be open. A busy connection is never probed: what breaks under
//! load is in flight, and stays an unknown outcome.

use crate::store::counter::StoreError;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The connection, opened on first use and replaced after an error. The generation tells
/// a failed connection from the one that has replaced it meanwhile.
pub(super) struct Link {
    client: redis::Client,
    config: AsyncConnectionConfig,
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    connecting: tokio::sync::Mutex<u64>,
    /// A connection silent for this long is probed before use.
    probe_after: Duration,
    /// When the connection last answered, in ms since `epoch`.
    answered_ms: AtomicU64,
    epoch: Instant,
}

impl Link {
    pub(super) fn new(
        client: redis::Client,
        config: AsyncConnectionConfig,
        probe_after: Duration,
    ) -> Self {
        Self {
            client,
            config,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(0),
            probe_after,
            answered_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Notes that the connection answered (any reply, even an error reply).
    pub(super) fn answered(&self) {
        self.answered_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// The connection to send on: the open one, probed first if it has been silent for
    /// `probe_after`, or a new one.
    pub(super) async fn get(&self) -> Result<(u64, MultiplexedConnection), StoreError> {
        let silent = self
            .now_ms()
            .saturating_sub(self.answered_ms.load(Ordering::Relaxed));
        match self.cached() {
            Some(c) if Duration::from_millis(silent) < self.probe_after => Ok(c),
            Some((generation, conn)) => self.probed(generation, conn).await,
            None => self.connect().await,
        }
    }

    /// `conn` if it answers a `PING`, else a new connection.
    async fn probed(
        &self,
        generation: u64,
        mut conn: MultiplexedConnection,
    ) -> Result<(u64, MultiplexedConnection), StoreError> {
        // Dropped mid-probe (the caller's budget ran out on a black-holed connection), the
        // connection is discarded as for any abandoned call, or every later call would
        // probe the same dead connection until the budget again.
        let ping = redis::cmd("PING");
        let pong = ping.query_async::<()>(&mut conn);
        match self.unless_abandoned(generation, pong).await {
            Ok(()) => {
                self.answered();
                Ok((generation, conn))
            }
            Err(e) if e.is_connection_dropped() || e.is_io_error() || e.is_timeout() => {
                self.discard(generation);
                self.connect().await
            }
            Err(e) if is_auth(&e) => Err(StoreError::Auth(e.to_string())),
            // The server answered, so the connection is open: let the command meet
            // whatever it is (LOADING, say) as it would without a probe.
            Err(_) => Ok((generation, conn)),
        }
    }

    async fn connect(&self) -> Result<(u64, MultiplexedConnection), StoreError> {
        // One connect at a time; whoever waited behind it uses its result.
        let mut generation = self.connecting.lock().await;
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| connect_error(&e))?;
        *generation += 1;
        let c = (*generation, conn);
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
        // A new connection has just answered the handshake.
        self.answered();
        Ok(c)
    }

    /// Runs `work` on connection `generation`. A call dropped before it finished (its
    /// budget ran out) leaves the connection's state unknown, e.g. black-holed: the
    /// connection is discarded, so the next call connects afresh rather than queueing
    /// behind it until TCP gives up.
    pub(super) async fn unless_abandoned<T>(
        &self,
        generation: u64,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        let mut abandoned = Abandoned {
            link: self,
            generation: Some(generation),
        };
        let out = work.await;
        abandoned.generation = None;
        out
    }

    pub(super) fn discard(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }
}

/// Discards the connection of a call dropped before it finished ([`Link::unless_abandoned`]).
struct Abandoned<'a> {
    link: &'a Link,
    generation: Option<u64>,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let Some(g) = self.generation {
            self.link.discard(g);
        }
    }
}

/// Whether `e` is Redis refusing our credentials (or their rights).
pub(super) fn is_auth(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::AuthenticationFailed | ErrorKind::Server(redis::ServerErrorKind::NoPerm)
    ) || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

/// A failure to connect: nothing was sent.
fn connect_error(e: &RedisError) -> StoreError {
    if is_auth(e) {
        StoreError::Auth(e.to_string())
    } else {
        StoreError::Connect(e.to_string())
    }
}
