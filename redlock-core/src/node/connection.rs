//! A node's connection: one multiplexed connection opened lazily in a task of its own
//! (bounded by `CONNECT_TIMEOUT`), checked and quarantined before first use, reopened
//! after it breaks; or a pool.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError};

use super::checks::{Checks, refused};
use super::identity::{Identities, run_id};
use super::quarantine::Quarantine;
use crate::clock::Instant;
use crate::error::NodeError;
use crate::protocol::{load_scripts, redis_error};

pub(super) enum Backend {
    Direct(Box<Direct>),
    Pool(deadpool_redis::Pool),
    /// An in-memory server, for unit tests of the layers above.
    #[cfg(any(test, feature = "sim"))]
    Fake(super::fake::FakeServer),
}

/// A lazily opened, shared multiplexed connection.
pub(super) struct Direct {
    pub(super) client: redis::Client,
    pub(super) slot: Mutex<Slot>,
    /// Numbers connections, so that a failure on an old one does not drop a new one.
    pub(super) next_id: AtomicU64,
    /// What every new connection checks (permissions, eviction, persistence).
    pub(super) checks: Arc<Checks>,
    /// The node's restart quarantine: every new connection reports the node's identity
    /// to it before anyone can send a vote on that connection.
    pub(super) quarantine: Option<Arc<Quarantine>>,
    /// This node's place in the client's registry of servers: every new connection
    /// reports the server's `run_id` there before anyone can use it.
    pub(super) identity: Option<(usize, Arc<Identities>)>,
}

/// An opened connection, or one being opened, or none.
pub(super) enum Slot {
    Empty,
    /// Being opened by a task of its own: an operation that times out meanwhile does not
    /// abort it, so a link slower than the per-node timeout still gets connected.
    Connecting {
        id: u64,
        opened: Opening,
        /// When the opening started.
        since: Instant,
        /// How far it got: see [`Progress`].
        progress: Arc<AtomicU8>,
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

pub(super) type Opening = Shared<BoxFuture<'static, Result<Opened, NodeError>>>;

/// How far the opening of a connection got, for the decisions that wait for its
/// server's identity (see [`Direct::identifying`]).
pub(super) struct Progress;

impl Progress {
    /// Nothing heard from the server yet.
    const STARTED: u8 = 0;
    /// The server answered the handshake: it is alive, its identity a round trip away.
    const ANSWERED: u8 = 1;
    /// Its identity is claimed (or the opening failed): nothing left to wait for.
    const IDENTIFIED: u8 = 2;
}

/// How long a node that refused a connection for good is not asked again.
pub(super) const REFUSED_FOR: Duration = Duration::from_secs(10);

/// A new connection, whose node identity the quarantine has checked.
#[derive(Clone)]
pub(super) struct Opened {
    pub(super) conn: MultiplexedConnection,
}

/// Commands a connection queues before queuing waits: deep, so that a command is in the
/// queue as soon as it is first polled (the order of commands to a node relies on it).
pub(super) const PIPELINE_BUFFER: usize = 4096;

/// How long opening a connection to a node may take (TCP, TLS, authentication, loading
/// the scripts) before it is abandoned and tried afresh by the next operation: an
/// unreachable node is reported by [`Redlock::wait_ready`](crate::Redlock::wait_ready)
/// within this time.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Direct {
    pub(super) fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // The slot is always left consistent: a poisoned lock is still usable.
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The shared connection, opening it if needed. A new connection is handed out
    /// only after the node's identity on it went through the quarantine (see
    /// [`open`](Self::open)), so no vote is ever sent on an unchecked connection.
    pub(super) async fn connection(&self) -> Result<(u64, MultiplexedConnection), NodeError> {
        let (id, opened) = {
            let mut slot = self.slot();
            match &*slot {
                Slot::Ready { id, conn } => return Ok((*id, conn.clone())),
                Slot::Connecting { id, opened, .. } => (*id, opened.clone()),
                Slot::Refused { until, error } if Instant::now() < *until => {
                    return Err(error.clone());
                }
                Slot::Empty | Slot::Refused { .. } => {
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let progress = Arc::new(AtomicU8::new(Progress::STARTED));
                    let opened = self.open(Arc::clone(&progress));
                    *slot = Slot::Connecting {
                        id,
                        opened: opened.clone(),
                        since: Instant::now(),
                        progress,
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

    /// A connection being opened whose server's identity is not known yet: until when a
    /// decision waits for it, at `now`. The server may turn out to be one that another
    /// node reaches too (see [`Identities`]). Waited for until it has been opening for
    /// `short` if the server has not answered yet (it may be down, and must not hold up
    /// every decision), for `long` once it answered the handshake (it is alive, and its
    /// identity one round trip away). `None` where there is nothing to wait for: no
    /// connection being opened, its identity claimed, its wait over (the node counts as
    /// unreachable), a single node.
    pub(super) fn identifying(
        &self,
        short: Duration,
        long: Duration,
        now: Instant,
    ) -> Option<Instant> {
        if !self
            .identity
            .as_ref()
            .is_some_and(|(_, identities)| identities.compared())
        {
            return None;
        }
        let Slot::Connecting {
            since, progress, ..
        } = &*self.slot()
        else {
            return None;
        };
        let wait = match progress.load(Ordering::Acquire) {
            Progress::STARTED => short,
            Progress::ANSWERED => long,
            _ => return None,
        };
        since.checked_add(wait).filter(|&end| end > now)
    }

    /// `PING` on the shared connection (opening it if needed); on failure, the id of the
    /// connection that failed (0 if none could be opened).
    pub(super) async fn ping(&self) -> Result<(), (u64, NodeError)> {
        let (id, mut conn) = self.connection().await.map_err(|err| (0, err))?;
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|err| (id, redis_error(err)))
    }

    /// Starts opening a connection in a task of its own, reporting how far it got to
    /// `progress`.
    pub(super) fn open(&self, progress: Arc<AtomicU8>) -> Opening {
        let client = self.client.clone();
        // Operation timeouts are ours; redis-rs' own would only add a second clock.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(None)
            .set_pipeline_buffer_size(PIPELINE_BUFFER);
        let checks = Arc::clone(&self.checks);
        let quarantine = self.quarantine.clone();
        let identity = self.identity.clone();
        let reached = Arc::clone(&progress);
        let connect = async move {
            let connecting = client.get_multiplexed_async_connection_with_config(&config);
            let handshake = |err| refused(err, "the connection's handshake (HELLO, AUTH)");
            let mut conn = match client.get_connection_info().addr() {
                #[cfg(feature = "tls")]
                redis::ConnectionAddr::TcpTls { host, port, .. } => {
                    super::tls::connect(connecting, host, *port, handshake).await?
                }
                _ => connecting.await.map_err(handshake)?,
            };
            reached.store(Progress::ANSWERED, Ordering::Release);
            // Load the scripts now (one round trip), so that operations on this connection
            // do not meet NOSCRIPT: its fallback costs two more round trips, which may not
            // fit in the per-node timeout. A restarted node comes back through a new
            // connection, so it gets them again.
            // `INFO server` in the same round trip: run_id and uptime, for the quarantine.
            // Each reply on its own, so that a refusal keeps its error code (`NOAUTH`
            // when a password is needed, `NOPERM`) instead of a pipeline's summary.
            let mut load = redis::pipe();
            load.ignore_errors();
            load_scripts(&mut load);
            load.cmd("INFO").arg("server");
            let replies: Vec<redis::RedisResult<redis::Value>> = load
                .query_async(&mut conn)
                .await
                .map_err(|err| refused(err, "SCRIPT LOAD or INFO"))?;
            let mut info = String::new();
            for reply in replies {
                match reply {
                    Err(err) => return Err(refused(err, "SCRIPT LOAD or INFO")),
                    Ok(value) => {
                        if let Ok(text) = redis::from_redis_value::<String>(value) {
                            info = text;
                        }
                    }
                }
            }
            // Before the connection is handed to anyone: a server that another node
            // reaches too never votes twice, and a node that restarted is in quarantine
            // before its first vote on the new connection is counted. A server that
            // does not say who it is cannot be told apart from the others: no vote.
            if let Some((index, identities)) = &identity {
                let run_id = run_id(&info).ok_or_else(|| {
                    redis_error(RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "INFO server gave no run_id: the server cannot be told apart from the other nodes, so it does not vote; use a server that reports its run_id",
                    )))
                })?;
                identities.claim(*index, run_id)?;
                reached.store(Progress::IDENTIFIED, Ordering::Release);
            }
            if let Some(quarantine) = &quarantine {
                quarantine.observe(&info);
            }
            checks.run(&mut conn).await?;
            Ok(Opened { conn })
        };
        // Over, either way: nothing left for a decision to wait for.
        let connect = async move {
            let result = connect.await;
            progress.store(Progress::IDENTIFIED, Ordering::Release);
            result
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
    pub(super) fn forget(&self, id: u64) {
        let mut slot = self.slot();
        if matches!(&*slot, Slot::Ready { id: current, .. } if *current == id) {
            *slot = Slot::Empty;
        }
    }
}
