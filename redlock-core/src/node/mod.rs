//! One Redis master: its connection and the lock operations sent to it.
//!
//! A node built from a URL keeps one multiplexed connection, opened lazily on first use
//! and re-opened after the connection breaks; all concurrent operations share it as a
//! pipeline. That also keeps the order of commands to one node: a release sent after an
//! acquire that is still in flight is executed after it, so cleaning up after a failed or
//! abandoned acquisition never races the acquisition itself. A node built from a
//! `deadpool_redis::Pool` takes a connection from the pool for each operation.
//!
//! Every operation is bounded by the per-node timeout, connecting included. Opening a
//! connection runs in a task of its own (bounded by `CONNECT_TIMEOUT`), so that a link
//! whose handshake is slower than the per-node timeout still ends up connected.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use self::checks::Checks;
pub use self::connection::CONNECT_TIMEOUT;
use self::connection::{Backend, Direct, Slot};
pub(crate) use self::identity::{IDENTITY_WAIT, Identities};
use self::quarantine::{Quarantine, QuarantineState};
pub(crate) use self::queued::Queued;
use crate::clock::Instant;
use crate::error::NodeError;
use crate::protocol::{Command, Extensions, Step, breaks_connection, query_batch, redis_error};

/// What [`Redlock::node_status`](crate::Redlock::node_status) found out about one node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeStatus {
    /// The node's address (no credentials).
    pub node: String,
    /// Whether it answered, or why not.
    pub reachable: Result<(), NodeError>,
    /// The restart quarantine left, if the node is in quarantine.
    pub quarantined: Option<Duration>,
}

impl NodeStatus {
    /// The node answers and is not in quarantine: its votes count.
    pub fn votes(&self) -> bool {
        self.reachable.is_ok() && self.quarantined.is_none()
    }
}

mod checks;
mod connection;
#[cfg(any(test, feature = "sim"))]
pub(crate) mod fake;
mod identity;
mod quarantine;
mod queued;
#[cfg(feature = "tls")]
mod tls;

pub(crate) struct Node {
    name: String,
    /// The node's metric handles.
    metrics: crate::telemetry::NodeMetrics,
    backend: Backend,
    /// Restart quarantine; `None` when switched off.
    quarantine: Option<Arc<Quarantine>>,
    /// The quarantine state last reported to the metrics: 0 out, 1 in, 2 not yet.
    reported_quarantine: AtomicU8,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish()
    }
}

impl Node {
    /// A node reached through its own multiplexed connection.
    pub(crate) fn direct(name: String, client: redis::Client) -> Self {
        let checks = Arc::new(Checks::new(name.clone(), false));
        Self {
            metrics: crate::telemetry::NodeMetrics::new(&name),
            reported_quarantine: AtomicU8::new(2),
            name,
            backend: Backend::Direct(Box::new(Direct {
                client,
                slot: Mutex::new(Slot::Empty),
                next_id: AtomicU64::new(1),
                checks,
                quarantine: None,
                identity: None,
            })),
            quarantine: None,
        }
    }

    /// A node answered by an in-memory server (unit tests).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn fake(name: String, server: fake::FakeServer) -> Self {
        Self {
            metrics: crate::telemetry::NodeMetrics::new(&name),
            reported_quarantine: AtomicU8::new(2),
            name,
            backend: Backend::Fake(server),
            quarantine: None,
        }
    }

    /// A node reached through a connection pool.
    pub(crate) fn pool(name: String, pool: deadpool_redis::Pool) -> Self {
        Self {
            metrics: crate::telemetry::NodeMetrics::new(&name),
            reported_quarantine: AtomicU8::new(2),
            name,
            backend: Backend::Pool(pool),
            quarantine: None,
        }
    }

    /// Switches the restart quarantine on, for nodes up for less than `period`; or off
    /// (`None`), in which case the node's persistence is checked on first contact and a
    /// warning logged if it cannot keep locks across a crash.
    pub(crate) fn with_quarantine(mut self, period: Option<Duration>) -> Self {
        self.quarantine = period.map(|period| {
            Arc::new(Quarantine {
                node: self.name.clone(),
                period,
                state: Mutex::new(QuarantineState::default()),
            })
        });
        if let Backend::Direct(direct) = &mut self.backend {
            direct.checks = Arc::new(Checks::new(self.name.clone(), period.is_none()));
            direct.quarantine = self.quarantine.clone();
        }
        self
    }

    /// Registers the node as number `index` of the client's servers: a connection to a
    /// server that another node reaches too is refused (pooled nodes are not checked).
    pub(crate) fn with_identity(mut self, index: usize, identities: &Arc<Identities>) -> Self {
        if let Backend::Direct(direct) = &mut self.backend {
            direct.identity = Some((index, Arc::clone(identities)));
        }
        self
    }

    /// A connection to the node is being opened, and the server's identity on it may
    /// yet show that another node is the same server: until when a majority counting
    /// another node's yes waits for it, at `now` (see [`IDENTITY_WAIT`]): until the
    /// connection has been opening for `short` while the server has not answered, for
    /// `long` once it answered the handshake. `None` for a node with nothing to wait
    /// for, a connection whose wait is over (the node counts as unreachable), and pooled
    /// nodes (not checked).
    pub(crate) fn identifying(
        &self,
        short: Duration,
        long: Duration,
        now: Instant,
    ) -> Option<Instant> {
        match &self.backend {
            Backend::Direct(direct) => direct.identifying(short, long, now),
            _ => None,
        }
    }

    /// Learns the node's `run_id` and uptime from an `INFO server` reply (see
    /// [`Quarantine::observe`]).
    fn observe(&self, info: &str) {
        if let Some(quarantine) = &self.quarantine {
            quarantine.observe(info);
        }
    }

    /// A fake server's connection: after a restart, the new connection's `INFO
    /// server` goes through the quarantine, as on a real node.
    #[cfg(any(test, feature = "sim"))]
    fn fake_connected(&self, server: &fake::FakeServer) {
        if self.quarantine.is_some()
            && let Some(info) = server.reconnected()
        {
            self.observe(&info);
        }
    }

    /// The quarantine time left, if the node is in quarantine.
    fn quarantined(&self) -> Option<Duration> {
        let quarantine = self.quarantine.as_ref()?;
        let state = quarantine
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let left = state
            .until
            .and_then(|until| until.checked_duration_since(Instant::now()))
            .filter(|left| !left.is_zero());
        let now_in = u8::from(left.is_some());
        if self.reported_quarantine.swap(now_in, Ordering::Relaxed) != now_in {
            crate::telemetry::quarantined(self.metrics.node(), left.is_some());
        }
        left
    }

    /// Extends the locks of `extensions` (a watchdog round), `timeout` covering it all.
    /// Returns each lock's answer in order: `Some(false)` a no, `None` where the node
    /// failed (an error reply). On a node's own connection the commands go out back to
    /// back, a few at a time (see `Extensions::send_all`); on a pooled one, as one
    /// pipeline.
    pub(crate) async fn extend_all(
        &self,
        extensions: &Extensions,
        timeout: Duration,
    ) -> Result<Vec<Option<bool>>, NodeError> {
        let direct = match &self.backend {
            Backend::Direct(direct) => direct,
            _ => {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for cmd in extensions.commands() {
                    pipe.add_command(cmd.clone());
                }
                let replies = self.pipeline(&pipe, true, "batch", timeout).await?;
                return Ok(extensions.answers(replies));
            }
        };
        self.check_quarantine(true)?;
        let run = async {
            let (generation, conn) = direct.connection().await?;
            self.check_quarantine(true)?;
            let (answers, broken) = extensions.send_all(&conn).await;
            if broken {
                direct.forget(generation);
            }
            Ok(answers)
        };
        let started = Instant::now();
        let result = match tokio::time::timeout(timeout, run).await {
            Ok(result) => result,
            Err(_) => Err(NodeError::Timeout(timeout)),
        };
        self.metrics.command("batch", started.elapsed(), &result);
        result
    }

    /// Sends `pipe` (built with `ignore_errors`, so each reply comes back on its own) in
    /// one round trip, `timeout` covering it all, connecting included; `votes`: it
    /// carries a vote, which a node in quarantine may not give. `name` labels the
    /// metrics.
    pub(crate) async fn pipeline(
        &self,
        pipe: &redis::Pipeline,
        votes: bool,
        name: &'static str,
        timeout: Duration,
    ) -> Result<Vec<redis::RedisResult<redis::Value>>, NodeError> {
        self.check_quarantine(votes)?;
        let run = async {
            match &self.backend {
                Backend::Direct(direct) => {
                    let (id, mut conn) = direct.connection().await?;
                    self.check_quarantine(votes)?;
                    let replies = query_batch(pipe, &mut conn).await;
                    if let Err(err) = &replies
                        && breaks_connection(err)
                    {
                        direct.forget(id);
                    }
                    replies.map_err(redis_error)
                }
                Backend::Pool(pool) => {
                    let mut conn = self
                        .pooled(pool, votes && self.quarantine.is_some())
                        .await?;
                    self.check_quarantine(votes)?;
                    query_batch(pipe, &mut conn).await.map_err(redis_error)
                }
                #[cfg(any(test, feature = "sim"))]
                Backend::Fake(server) => {
                    self.fake_connected(server);
                    self.check_quarantine(votes)?;
                    query_batch(pipe, &mut server.clone())
                        .await
                        .map_err(redis_error)
                }
            }
        };
        let started = Instant::now();
        let result = match tokio::time::timeout(timeout, run).await {
            Ok(result) => result,
            Err(_) => Err(NodeError::Timeout(timeout)),
        };
        self.metrics.command(name, started.elapsed(), &result);
        result
    }

    /// A connection from `pool`. With `ask`, first learns the node's `run_id` and uptime
    /// (a pooled connection may be new, and the node behind it restarted).
    async fn pooled(
        &self,
        pool: &deadpool_redis::Pool,
        ask: bool,
    ) -> Result<deadpool_redis::Connection, NodeError> {
        let mut conn = pool
            .get()
            .await
            .map_err(|err| NodeError::Pool(err.to_string()))?;
        if ask {
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await
                .map_err(redis_error)?;
            self.observe(&info);
        }
        Ok(conn)
    }

    /// Connects (if needed) and reports whether the node answers and its quarantine.
    ///
    /// A connection found broken is dropped and the node asked once more on a new one,
    /// within the same `timeout`: a node that came back reports healthy at once (and,
    /// if it restarted, enters quarantine), instead of a dead connection answering for
    /// it forever.
    pub(crate) async fn status(&self, timeout: Duration) -> NodeStatus {
        let probe = async {
            match &self.backend {
                Backend::Direct(direct) => match direct.ping().await {
                    Err((id, NodeError::Redis(err))) if breaks_connection(&err) => {
                        direct.forget(id);
                        direct.ping().await.map_err(|(id, err)| {
                            if matches!(&err, NodeError::Redis(e) if breaks_connection(e)) {
                                direct.forget(id);
                            }
                            err
                        })
                    }
                    other => other.map_err(|(_, err)| err),
                },
                Backend::Pool(pool) => self.pooled(pool, true).await.map(drop),
                #[cfg(any(test, feature = "sim"))]
                Backend::Fake(server) => redis::cmd("PING")
                    .query_async::<()>(&mut server.clone())
                    .await
                    .map_err(redis_error),
            }
        };
        let reachable = match tokio::time::timeout(timeout, probe).await {
            Ok(result) => result,
            Err(_) => Err(NodeError::Timeout(timeout)),
        };
        NodeStatus {
            node: self.name.clone(),
            reachable,
            quarantined: self.quarantined(),
        }
    }

    /// Fails a vote from a node in quarantine (release still runs: it only deletes).
    fn check_quarantine(&self, votes: bool) -> Result<(), NodeError> {
        if !votes {
            return Ok(());
        }
        match self.quarantined() {
            Some(left) => Err(NodeError::Quarantined(left)),
            None => Ok(()),
        }
    }

    /// The node's client, for a node with its own connection (a pooled node has none).
    pub(crate) fn client(&self) -> Option<redis::Client> {
        match &self.backend {
            Backend::Direct(direct) => Some(direct.client.clone()),
            Backend::Pool(_) => None,
            #[cfg(any(test, feature = "sim"))]
            Backend::Fake(_) => None,
        }
    }

    /// The node's address, without credentials.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Runs `command` with `timeout` covering everything (connecting included). A
    /// non-zero answer is a yes vote.
    ///
    /// `queued` is marked once the command sits in the node's connection queue: from
    /// then on, a command sent later to this node (by anyone) is executed after it. Never
    /// marked for a pooled node (its connections do not share a queue).
    pub(crate) async fn run(
        &self,
        command: &Command,
        timeout: Duration,
        queued: &Queued,
    ) -> Result<u64, NodeError> {
        let started = Instant::now();
        let result = match tokio::time::timeout(timeout, self.run_untimed(command, queued)).await {
            Ok(result) => result,
            Err(_) => Err(NodeError::Timeout(timeout)),
        };
        self.metrics
            .command(command.name, started.elapsed(), &result);
        result
    }

    /// [`run`](Self::run), its timeout kept by the caller: once `expired` is set, the
    /// command answers a timeout (`timeout`) the next time it is polled while still
    /// waiting. One timer then serves every node of a fan-out.
    pub(crate) async fn run_until(
        &self,
        command: &Command,
        timeout: Duration,
        expired: &AtomicBool,
        queued: &Queued,
    ) -> Result<u64, NodeError> {
        let started = Instant::now();
        let mut call = std::pin::pin!(self.run_untimed(command, queued));
        let result = std::future::poll_fn(|cx| match call.as_mut().poll(cx) {
            Poll::Pending if expired.load(Ordering::Acquire) => {
                Poll::Ready(Err(NodeError::Timeout(timeout)))
            }
            poll => poll,
        })
        .await;
        self.metrics
            .command(command.name, started.elapsed(), &result);
        result
    }

    async fn run_untimed(&self, command: &Command, queued: &Queued) -> Result<u64, NodeError> {
        let direct = match &self.backend {
            Backend::Direct(direct) => direct,
            // Boxed: the pool's future is large, and the direct path is the hot one.
            Backend::Pool(pool) => return Box::pin(self.run_pooled(pool, command)).await,
            #[cfg(any(test, feature = "sim"))]
            Backend::Fake(server) => {
                self.fake_connected(server);
                self.check_quarantine(command.votes)?;
                return command
                    .execute(&mut server.clone())
                    .await
                    .map_err(|err| command.error(err));
            }
        };
        let (generation, mut conn) = direct.connection().await?;
        self.check_quarantine(command.votes)?;
        let step = {
            let mut execution = std::pin::pin!(command.first_step(&mut conn));
            // The first poll puts the command in the connection's queue (deep enough
            // never to be full; see PIPELINE_BUFFER).
            let first = std::future::poll_fn(|cx| Poll::Ready(execution.as_mut().poll(cx))).await;
            match first {
                Poll::Ready(step) => step,
                Poll::Pending => {
                    queued.mark();
                    execution.await
                }
            }
        };
        // A second step may go only if nobody counted on the first being the last.
        let result = match step {
            Ok(Step::Answer(answer)) => Ok(answer),
            Ok(Step::Fallback(_)) if !queued.unmark() => Ok(0),
            Ok(Step::Fallback(fallback)) => fallback.execute(&mut conn).await,
            Err(err) => Err(err),
        };
        if let Err(err) = &result
            && breaks_connection(err)
        {
            direct.forget(generation);
        }
        result.map_err(|err| command.error(err))
    }

    async fn run_pooled(
        &self,
        pool: &deadpool_redis::Pool,
        command: &Command,
    ) -> Result<u64, NodeError> {
        let mut conn = self
            .pooled(pool, command.votes && self.quarantine.is_some())
            .await?;
        self.check_quarantine(command.votes)?;
        command
            .execute(&mut conn)
            .await
            .map_err(|err| command.error(err))
    }
}
