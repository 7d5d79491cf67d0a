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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, RedisError, Script, Value};

use crate::checks::{Checks, refused};
use crate::error::NodeError;
use crate::queue::{Waiter, waiter_keys, with_queues};
use crate::scripts;

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

/// A lock operation on one node. Every one answers a number: 0 is a "no" vote, anything
/// else a "yes" (for a fencing acquire, the node's token).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op<'a> {
    /// `SET key value NX PX ttl` on one key, or the all-or-nothing script on several;
    /// with fence keys, the fencing script.
    Acquire {
        keys: &'a [String],
        fence_keys: &'a [String],
        value: &'a str,
        ttl_ms: u64,
        /// A queued waiter's attempt: the queue-aware script.
        waiter: Option<&'a Waiter>,
        /// A lock handed over to a waiter (`~<waiter>`) counts as free.
        barge: bool,
    },
    /// Raise the fencing counters to at least `token`.
    RaiseFence {
        fence_keys: &'a [String],
        token: u64,
    },
    /// Compare-and-delete every key, in one of the [`ReleaseMode`]s. `dequeue`: first
    /// remove this waiter from the keys' wait queues. Answers the number of keys
    /// released, plus 65536 times the longest hand-over left pending (ms).
    Release {
        keys: &'a [String],
        value: &'a str,
        mode: ReleaseMode,
        handoff_ms: u64,
        dequeue: Option<&'a str>,
    },
    /// Compare-and-`PEXPIRE` every key, all or nothing.
    Extend {
        keys: &'a [String],
        value: &'a str,
        ttl_ms: u64,
    },
    /// The longest remaining TTL (ms) among the keys; 0 when none exists. Not a vote:
    /// it tells a waiter when the holder's lock ends at the latest.
    Remaining { keys: &'a [String] },
    /// The node's clock (ms since the Unix epoch). Not a vote.
    ServerTime,
    /// A waiter takes (or refreshes) its place in the keys' wait queues; answers the
    /// keys' longest remaining TTL (ms), 0 when all are free. Not a vote.
    JoinQueue {
        keys: &'a [String],
        waiter: &'a Waiter,
    },
}

impl Op<'_> {
    /// Whether the answer is a vote (a node in quarantine may not give one; a release
    /// still runs there, it only deletes).
    fn votes(&self) -> bool {
        !matches!(
            self,
            Op::Release { .. } | Op::Remaining { .. } | Op::JoinQueue { .. } | Op::ServerTime
        )
    }
}

/// How a release treats the keys it frees (see `scripts::RELEASE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseMode {
    /// The cleanup of an attempt that lost: delete, tell nobody.
    Quiet,
    /// A lock's release (or a waiter passing on a hand-over): hand the key over to the
    /// next live waiter, or delete it and wake the waiters.
    HandOver,
    /// After a hand-over: a key whose hand-over expired untaken goes to the next waiter.
    FollowUp,
}

/// Splits a release's answer: keys released, and the longest hand-over left pending.
pub(crate) fn release_answer(answer: u64) -> (u64, Duration) {
    (answer % 65_536, Duration::from_millis(answer / 65_536))
}

/// One operation, ready to send: built once per fan-out and shared by the calls to every
/// node, which then only pack and send it.
pub(crate) struct Command {
    cmd: redis::Cmd,
    /// The script behind an `EVALSHA`: loaded again if a node answers NOSCRIPT.
    script: Option<&'static Script>,
    /// The answer is a vote.
    votes: bool,
}

impl Command {
    pub(crate) fn new(op: Op<'_>) -> Self {
        let (cmd, script) = build(op);
        Self {
            cmd,
            script,
            votes: op.votes(),
        }
    }

    /// Sends the command on `conn` and reads the answer: `SET`'s OK or nil as 1 or 0,
    /// a script's number as it is (a negative or unexpected answer is 0, a no). A node
    /// that lost its scripts (`SCRIPT FLUSH`) gets the script loaded again, then the
    /// command once more.
    async fn execute<C: Send1>(&self, conn: &mut C) -> Result<u64, RedisError> {
        let reply = match conn.send1(&self.cmd).await.and_then(Value::extract_error) {
            Err(err) if is_no_script(&err) => match self.script {
                // Boxed: rare, and it would make every call's future bigger.
                Some(script) => Box::pin(self.reload(script, conn)).await?,
                None => return Err(err),
            },
            reply => reply?,
        };
        Ok(match reply {
            Value::Int(n) => u64::try_from(n).unwrap_or(0),
            Value::Okay => 1,
            _ => 0,
        })
    }
}

impl Command {
    /// Loads `script` on the node, then sends the command again.
    async fn reload<C: Send1>(&self, script: &Script, conn: &mut C) -> Result<Value, RedisError> {
        script.load_async(conn).await?;
        conn.send1(&self.cmd).await?.extract_error()
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The arguments hold the lock's value: not for logs.
        f.debug_struct("Command")
            .field("votes", &self.votes)
            .finish_non_exhaustive()
    }
}

fn is_no_script(err: &RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Sends one command: directly on a multiplexed connection (its `ConnectionLike` method
/// boxes a future per command), through `ConnectionLike` on a pooled one.
trait Send1: ConnectionLike + Send {
    fn send1<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> impl Future<Output = Result<Value, RedisError>> + Send + 'a;
}

impl Send1 for MultiplexedConnection {
    fn send1<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> impl Future<Output = Result<Value, RedisError>> + Send + 'a {
        self.send_packed_command(cmd)
    }
}

impl Send1 for deadpool_redis::Connection {
    fn send1<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> impl Future<Output = Result<Value, RedisError>> + Send + 'a {
        self.req_packed_command(cmd)
    }
}

pub(crate) struct Node {
    name: String,
    backend: Backend,
    /// Restart quarantine; `None` when switched off.
    quarantine: Option<Arc<Quarantine>>,
}

/// The client-side "delayed restart": a node that has been up for less than the longest
/// lock TTL may have forgotten a live lock (restarted without persistence), so its
/// votes do not count until it has been up that long.
struct Quarantine {
    /// The node's address, for the log.
    node: String,
    period: Duration,
    state: Mutex<QuarantineState>,
}

#[derive(Default)]
struct QuarantineState {
    run_id: Option<String>,
    until: Option<Instant>,
}

impl Quarantine {
    /// Learns the node's `run_id` and uptime from an `INFO server` reply, and starts a
    /// quarantine if it has been up for less than the period.
    fn observe(&self, info: &str) {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let run_id = field("run_id").map(str::to_owned);
        // Unknown uptime: assume the worst.
        let uptime = field("uptime_in_seconds")
            .and_then(|s| s.parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_secs);
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let restarted = state.run_id.is_some() && state.run_id != run_id;
        // Uptime is in whole seconds, rounded down: wait one second more to be sure.
        let period = self.period.saturating_add(Duration::from_secs(1));
        if uptime < period {
            let left = period.saturating_sub(uptime);
            let until = Instant::now() + left;
            if state.until.is_none_or(|current| current < until) {
                let quarantine_ms = left.as_millis() as u64;
                let uptime_s = uptime.as_secs();
                if restarted {
                    tracing::warn!(node = %self.node, uptime_s, quarantine_ms,
                        "node restarted: it may have forgotten live locks, so its votes do not count until it has been up for the longest lock TTL");
                } else {
                    tracing::info!(node = %self.node, uptime_s, quarantine_ms,
                        "node up for less than the longest lock TTL: its votes do not count until then");
                }
                state.until = Some(until);
            }
        } else if restarted {
            tracing::info!(node = %self.node, "node restarted long enough ago: no quarantine");
        }
        state.run_id = run_id;
    }
}

enum Backend {
    Direct(Box<Direct>),
    Pool(deadpool_redis::Pool),
}

/// A lazily opened, shared multiplexed connection.
struct Direct {
    client: redis::Client,
    slot: Mutex<Slot>,
    /// Numbers connections, so that a failure on an old one does not drop a new one.
    next_id: AtomicU64,
    /// What every new connection checks (permissions, eviction, persistence).
    checks: Arc<Checks>,
    /// The node's restart quarantine: every new connection reports the node's identity
    /// to it before anyone can send a vote on that connection.
    quarantine: Option<Arc<Quarantine>>,
}

/// An opened connection, or one being opened, or none.
enum Slot {
    Empty,
    /// Being opened by a task of its own: an operation that times out meanwhile does not
    /// abort it, so a link slower than the per-node timeout still gets connected.
    Connecting {
        id: u64,
        opened: Opening,
    },
    Ready {
        id: u64,
        conn: MultiplexedConnection,
    },
    /// The node refused the connection for good (a missing permission, bad
    /// credentials): operations fail with this error at once until `until`, then a new
    /// connection is tried.
    Refused {
        until: Instant,
        error: NodeError,
    },
}

type Opening = Shared<BoxFuture<'static, Result<Opened, NodeError>>>;

/// How long a node that refused a connection for good is not asked again.
const REFUSED_FOR: Duration = Duration::from_secs(10);

/// A new connection, whose node identity the quarantine has checked.
#[derive(Clone)]
struct Opened {
    conn: MultiplexedConnection,
}

/// Commands a connection queues before queuing waits: deep, so that a command is in the
/// queue as soon as it is first polled (the order of commands to a node relies on it).
const PIPELINE_BUFFER: usize = 4096;

/// How long opening a connection may take (TCP, TLS, authentication, `HELLO`) before it
/// is abandoned and tried afresh by the next operation.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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
            name,
            backend: Backend::Direct(Box::new(Direct {
                client,
                slot: Mutex::new(Slot::Empty),
                next_id: AtomicU64::new(1),
                checks,
                quarantine: None,
            })),
            quarantine: None,
        }
    }

    /// A node reached through a connection pool.
    pub(crate) fn pool(name: String, pool: deadpool_redis::Pool) -> Self {
        Self {
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

    /// Learns the node's `run_id` and uptime from an `INFO server` reply (see
    /// [`Quarantine::observe`]).
    fn observe(&self, info: &str) {
        if let Some(quarantine) = &self.quarantine {
            quarantine.observe(info);
        }
    }

    /// The quarantine time left, if the node is in quarantine.
    fn quarantined(&self) -> Option<Duration> {
        let quarantine = self.quarantine.as_ref()?;
        let state = quarantine
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let left = state.until?.checked_duration_since(Instant::now())?;
        (!left.is_zero()).then_some(left)
    }

    /// Runs several operations in one pipeline (one round trip), `timeout` covering it
    /// all. Returns each operation's answer (an operation the node failed counts as 0).
    pub(crate) async fn run_batch(
        &self,
        ops: &[(Arc<crate::quorum::Target>, crate::quorum::OpKind)],
        timeout: Duration,
    ) -> Result<Vec<u64>, NodeError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let votes = ops.iter().any(|(target, kind)| target.op(*kind).votes());
        self.check_quarantine(votes)?;
        for (target, kind) in ops {
            pipe.add_command(build(target.op(*kind)).0);
        }
        let run = async {
            let replies: Vec<redis::RedisResult<redis::Value>> = match &self.backend {
                Backend::Direct(direct) => {
                    let (id, mut conn) = direct.connection().await?;
                    self.check_quarantine(votes)?;
                    let replies = query_batch(&pipe, &mut conn).await;
                    if let Err(err) = &replies
                        && breaks_connection(err)
                    {
                        direct.forget(id);
                    }
                    replies.map_err(redis_error)?
                }
                Backend::Pool(pool) => {
                    let mut conn = self.pooled(pool, self.quarantine.is_some()).await?;
                    self.check_quarantine(votes)?;
                    query_batch(&pipe, &mut conn).await.map_err(redis_error)?
                }
            };
            Ok(replies
                .into_iter()
                .map(|reply| match reply {
                    Ok(redis::Value::Int(n)) => u64::try_from(n).unwrap_or(0),
                    Ok(redis::Value::Okay) => 1,
                    _ => 0,
                })
                .collect())
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(result) => result,
            Err(_) => Err(NodeError::Timeout(timeout)),
        }
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
        }
    }

    /// The node's address, without credentials.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Runs `command` with `timeout` covering everything (connecting included). A
    /// non-zero answer is a yes vote.
    ///
    /// `queued` is set once the command sits in the node's connection queue: from then
    /// on, a command sent later to this node (by anyone) is executed after it. Never set
    /// for a pooled node (its connections do not share a queue).
    pub(crate) async fn run(
        &self,
        command: &Command,
        timeout: Duration,
        queued: &AtomicBool,
    ) -> Result<u64, NodeError> {
        match tokio::time::timeout(timeout, self.run_untimed(command, queued)).await {
            Ok(result) => result,
            Err(_) => Err(NodeError::Timeout(timeout)),
        }
    }

    async fn run_untimed(&self, command: &Command, queued: &AtomicBool) -> Result<u64, NodeError> {
        let direct = match &self.backend {
            Backend::Direct(direct) => direct,
            // Boxed: the pool's future is large, and the direct path is the hot one.
            Backend::Pool(pool) => return Box::pin(self.run_pooled(pool, command)).await,
        };
        let (generation, mut conn) = direct.connection().await?;
        self.check_quarantine(command.votes)?;
        let mut execution = std::pin::pin!(command.execute(&mut conn));
        // The first poll puts the command in the connection's queue (deep enough never
        // to be full; see PIPELINE_BUFFER).
        let first = std::future::poll_fn(|cx| Poll::Ready(execution.as_mut().poll(cx))).await;
        let result = match first {
            Poll::Ready(result) => result,
            Poll::Pending => {
                queued.store(true, Ordering::Release);
                execution.await
            }
        };
        if let Err(err) = &result
            && breaks_connection(err)
        {
            direct.forget(generation);
        }
        result.map_err(redis_error)
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
        command.execute(&mut conn).await.map_err(redis_error)
    }
}

impl Direct {
    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // The slot is always left consistent: a poisoned lock is still usable.
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The shared connection, opening it if needed. A new connection is handed out
    /// only after the node's identity on it went through the quarantine (see
    /// [`open`](Self::open)), so no vote is ever sent on an unchecked connection.
    async fn connection(&self) -> Result<(u64, MultiplexedConnection), NodeError> {
        let (id, opened) = {
            let mut slot = self.slot();
            match &*slot {
                Slot::Ready { id, conn } => return Ok((*id, conn.clone())),
                Slot::Connecting { id, opened } => (*id, opened.clone()),
                Slot::Refused { until, error } if Instant::now() < *until => {
                    return Err(error.clone());
                }
                Slot::Empty | Slot::Refused { .. } => {
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let opened = self.open();
                    *slot = Slot::Connecting {
                        id,
                        opened: opened.clone(),
                    };
                    (id, opened)
                }
            }
        };
        let result = opened.await;
        let mut slot = self.slot();
        let current = matches!(&*slot, Slot::Connecting { id: current, .. } if *current == id);
        match result {
            Ok(Opened { conn }) => {
                if current {
                    *slot = Slot::Ready {
                        id,
                        conn: conn.clone(),
                    };
                }
                Ok((id, conn))
            }
            Err(err) => {
                if current {
                    *slot = if err.is_permanent() {
                        tracing::warn!(node = %self.checks.node(), error = %err, "node refused: not asked again for {REFUSED_FOR:?}");
                        Slot::Refused {
                            until: Instant::now() + REFUSED_FOR,
                            error: err.clone(),
                        }
                    } else {
                        Slot::Empty
                    };
                }
                Err(err)
            }
        }
    }

    /// `PING` on the shared connection (opening it if needed); on failure, the id of the
    /// connection that failed (0 if none could be opened).
    async fn ping(&self) -> Result<(), (u64, NodeError)> {
        let (id, mut conn) = self.connection().await.map_err(|err| (0, err))?;
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|err| (id, redis_error(err)))
    }

    /// Starts opening a connection in a task of its own.
    fn open(&self) -> Opening {
        let client = self.client.clone();
        // Operation timeouts are ours; redis-rs' own would only add a second clock.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(None)
            .set_pipeline_buffer_size(PIPELINE_BUFFER);
        let checks = Arc::clone(&self.checks);
        let quarantine = self.quarantine.clone();
        let connect = async move {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(|err| refused(err, "the connection's handshake (HELLO, AUTH)"))?;
            // Load the scripts now (one round trip), so that operations on this connection
            // do not meet NOSCRIPT: its fallback costs two more round trips, which may not
            // fit in the per-node timeout. A restarted node comes back through a new
            // connection, so it gets them again.
            // `INFO server` in the same round trip: run_id and uptime, for the quarantine.
            let mut load = redis::pipe();
            load_scripts(&mut load);
            load.cmd("INFO").arg("server");
            let (info,): (String,) = load
                .query_async(&mut conn)
                .await
                .map_err(|err| refused(err, "SCRIPT LOAD or INFO"))?;
            // Before the connection is handed to anyone: a node that restarted is in
            // quarantine before its first vote on the new connection is counted.
            if let Some(quarantine) = &quarantine {
                quarantine.observe(&info);
            }
            checks.run(&mut conn).await?;
            Ok(Opened { conn })
        };
        let opening: BoxFuture<'static, _> = match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let task = handle.spawn(connect);
                Box::pin(async move {
                    task.await.unwrap_or_else(|err| {
                        Err(redis_error(RedisError::from(std::io::Error::other(
                            err.to_string(),
                        ))))
                    })
                })
            }
            Err(_) => Box::pin(connect),
        };
        opening.shared()
    }

    /// Drops connection `id` (if still current) so the next call reconnects.
    fn forget(&self, id: u64) {
        let mut slot = self.slot();
        if matches!(&*slot, Slot::Ready { id: current, .. } if *current == id) {
            *slot = Slot::Empty;
        }
    }
}

/// One operation as a command (scripts by `EVALSHA`: the connection loaded them), with
/// the script it runs, if any.
fn build(op: Op<'_>) -> (redis::Cmd, Option<&'static Script>) {
    // Sized up front: one allocation per buffer instead of a few growths.
    let evalsha = |script: &'static Script, keys: &[&String], args: &[String]| {
        let data = keys.iter().map(|k| k.len()).sum::<usize>()
            + args.iter().map(String::len).sum::<usize>()
            + 7 // EVALSHA
            + 40 // the hash
            + 20; // the key count
        let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + args.len(), data);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(key.as_str());
        }
        for arg in args {
            cmd.arg(arg);
        }
        (cmd, Some(script))
    };
    match op {
        Op::Acquire {
            keys: [key],
            fence_keys: [],
            value,
            ttl_ms,
            waiter: None,
            barge: false,
        } => {
            let mut cmd = redis::Cmd::with_capacity(6, key.len() + value.len() + 3 + 2 + 2 + 20);
            cmd.arg("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms);
            (cmd, None)
        }
        Op::Acquire {
            keys,
            fence_keys,
            value,
            ttl_ms,
            waiter: Some(waiter),
            ..
        } => {
            let all = waiter_keys(keys, fence_keys);
            evalsha(
                &scripts::ACQUIRE_QUEUED,
                &all.iter().collect::<Vec<_>>(),
                &waiter_args(value, ttl_ms, waiter, keys.len()),
            )
        }
        Op::Acquire {
            keys,
            fence_keys,
            value,
            ttl_ms,
            barge,
            ..
        } => {
            let script = if fence_keys.is_empty() {
                &*scripts::ACQUIRE_MANY
            } else {
                &*scripts::ACQUIRE_FENCED
            };
            let all: Vec<&String> = keys.iter().chain(fence_keys).collect();
            evalsha(
                script,
                &all,
                &[
                    value.to_owned(),
                    ttl_ms.to_string(),
                    u8::from(barge).to_string(),
                ],
            )
        }
        Op::RaiseFence { fence_keys, token } => evalsha(
            &scripts::RAISE_FENCE,
            &fence_keys.iter().collect::<Vec<_>>(),
            &[token.to_string()],
        ),
        Op::Release {
            keys,
            value,
            mode,
            handoff_ms,
            dequeue,
        } => {
            let all = with_queues(keys);
            evalsha(
                &scripts::RELEASE,
                &all.iter().collect::<Vec<_>>(),
                &release_args(value, mode, handoff_ms, dequeue),
            )
        }
        Op::Extend {
            keys,
            value,
            ttl_ms,
        } => evalsha(
            &scripts::EXTEND,
            &keys.iter().collect::<Vec<_>>(),
            &[value.to_owned(), ttl_ms.to_string()],
        ),
        Op::Remaining { keys } => {
            evalsha(&scripts::REMAINING, &keys.iter().collect::<Vec<_>>(), &[])
        }
        Op::ServerTime => evalsha(&scripts::SERVER_TIME, &[], &[]),
        Op::JoinQueue { keys, waiter } => {
            let all = with_queues(keys);
            evalsha(
                &scripts::JOIN_QUEUE,
                &all.iter().collect::<Vec<_>>(),
                &[
                    waiter.id.clone(),
                    waiter.since_ms.to_string(),
                    waiter.keep_ms.to_string(),
                ],
            )
        }
    }
}

fn release_args(
    value: &str,
    mode: ReleaseMode,
    handoff_ms: u64,
    dequeue: Option<&str>,
) -> [String; 4] {
    [
        value.to_owned(),
        match mode {
            ReleaseMode::Quiet => "0",
            ReleaseMode::HandOver => "1",
            ReleaseMode::FollowUp => "2",
        }
        .to_owned(),
        handoff_ms.to_string(),
        dequeue.unwrap_or_default().to_owned(),
    ]
}

fn waiter_args(value: &str, ttl_ms: u64, waiter: &Waiter, keys: usize) -> [String; 6] {
    [
        value.to_owned(),
        ttl_ms.to_string(),
        waiter.id.clone(),
        waiter.since_ms.to_string(),
        waiter.keep_ms.to_string(),
        keys.to_string(),
    ]
}

/// Adds loading every script to `pipe` (replies ignored).
fn load_scripts(pipe: &mut redis::Pipeline) {
    for source in scripts::ALL_SOURCES {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
}

/// Runs a batch of operations (a pipeline that ignores errors) and returns each reply;
/// a node that lost its scripts (`SCRIPT FLUSH`) gets them loaded again and the batch
/// once more.
async fn query_batch<C: ConnectionLike + Send>(
    pipe: &redis::Pipeline,
    conn: &mut C,
) -> Result<Vec<redis::RedisResult<Value>>, RedisError> {
    let replies: Vec<redis::RedisResult<Value>> = pipe.query_async(conn).await?;
    if !replies
        .iter()
        .any(|reply| reply.as_ref().is_err_and(is_no_script))
    {
        return Ok(replies);
    }
    let mut load = redis::pipe();
    load_scripts(&mut load);
    load.exec_async(conn).await?;
    pipe.query_async(conn).await
}

fn breaks_connection(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error()
}

fn redis_error(err: RedisError) -> NodeError {
    NodeError::Redis(Arc::new(err))
}
