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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, RedisError, Script};

use crate::error::NodeError;
use crate::scripts;

/// A lock operation on one node. Every one answers a yes/no vote.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op<'a> {
    /// `SET key value NX PX ttl` on one key, or the all-or-nothing script on several.
    Acquire {
        keys: &'a [String],
        value: &'a str,
        ttl_ms: u64,
    },
    /// Compare-and-delete every key.
    Release { keys: &'a [String], value: &'a str },
    /// Compare-and-`PEXPIRE` every key, all or nothing.
    Extend {
        keys: &'a [String],
        value: &'a str,
        ttl_ms: u64,
    },
}

pub(crate) struct Node {
    name: String,
    backend: Backend,
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
}

type Opening = Shared<BoxFuture<'static, Result<MultiplexedConnection, RedisError>>>;

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
        Self {
            name,
            backend: Backend::Direct(Box::new(Direct {
                client,
                slot: Mutex::new(Slot::Empty),
                next_id: AtomicU64::new(1),
            })),
        }
    }

    /// A node reached through a connection pool.
    pub(crate) fn pool(name: String, pool: deadpool_redis::Pool) -> Self {
        Self {
            name,
            backend: Backend::Pool(pool),
        }
    }

    /// The node's address, without credentials.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Runs `op` with `timeout` covering everything (connecting included). `Ok(true)` is a
    /// yes vote.
    pub(crate) async fn run(&self, op: Op<'_>, timeout: Duration) -> Result<bool, NodeError> {
        match tokio::time::timeout(timeout, self.run_untimed(op)).await {
            Ok(result) => result,
            Err(_) => Err(NodeError::Timeout(timeout)),
        }
    }

    async fn run_untimed(&self, op: Op<'_>) -> Result<bool, NodeError> {
        match &self.backend {
            Backend::Direct(direct) => {
                let (generation, mut conn) = direct.connection().await.map_err(redis_error)?;
                let result = execute(&mut conn, op).await;
                if let Err(err) = &result
                    && breaks_connection(err)
                {
                    direct.forget(generation);
                }
                result.map_err(redis_error)
            }
            Backend::Pool(pool) => {
                let mut conn = pool
                    .get()
                    .await
                    .map_err(|err| NodeError::Pool(err.to_string()))?;
                execute(&mut conn, op).await.map_err(redis_error)
            }
        }
    }
}

impl Direct {
    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // The slot is always left consistent: a poisoned lock is still usable.
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The shared connection, opening it if needed.
    async fn connection(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        let (id, opened) = {
            let mut slot = self.slot();
            match &*slot {
                Slot::Ready { id, conn } => return Ok((*id, conn.clone())),
                Slot::Connecting { id, opened } => (*id, opened.clone()),
                Slot::Empty => {
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
            Ok(conn) => {
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
                    *slot = Slot::Empty;
                }
                Err(err)
            }
        }
    }

    /// Starts opening a connection in a task of its own.
    fn open(&self) -> Opening {
        let client = self.client.clone();
        // Operation timeouts are ours; redis-rs' own would only add a second clock.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(None);
        let connect = async move {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            // Load the scripts now (one round trip), so that operations on this connection
            // do not meet NOSCRIPT: its fallback costs two more round trips, which may not
            // fit in the per-node timeout. A restarted node comes back through a new
            // connection, so it gets them again.
            let mut load = redis::pipe();
            for source in scripts::ALL_SOURCES {
                load.cmd("SCRIPT").arg("LOAD").arg(source);
            }
            load.query_async::<()>(&mut conn).await?;
            Ok(conn)
        };
        let opening: BoxFuture<'static, _> = match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let task = handle.spawn(connect);
                Box::pin(async move {
                    task.await.unwrap_or_else(|err| {
                        Err(RedisError::from(std::io::Error::other(err.to_string())))
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

fn breaks_connection(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error()
}

fn redis_error(err: RedisError) -> NodeError {
    NodeError::Redis(Arc::new(err))
}

async fn execute<C: ConnectionLike + Send>(conn: &mut C, op: Op<'_>) -> Result<bool, RedisError> {
    match op {
        Op::Acquire {
            keys: [key],
            value,
            ttl_ms,
        } => {
            let reply: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query_async(conn)
                .await?;
            Ok(reply.is_some())
        }
        Op::Acquire {
            keys,
            value,
            ttl_ms,
        } => run_script(&scripts::ACQUIRE_MANY, conn, keys, value, Some(ttl_ms)).await,
        Op::Release { keys, value } => run_script(&scripts::RELEASE, conn, keys, value, None).await,
        Op::Extend {
            keys,
            value,
            ttl_ms,
        } => run_script(&scripts::EXTEND, conn, keys, value, Some(ttl_ms)).await,
    }
}

async fn run_script<C: ConnectionLike + Send>(
    script: &Script,
    conn: &mut C,
    keys: &[String],
    value: &str,
    ttl_ms: Option<u64>,
) -> Result<bool, RedisError> {
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(key);
    }
    invocation.arg(value);
    if let Some(ttl_ms) = ttl_ms {
        invocation.arg(ttl_ms);
    }
    let n: i64 = invocation.invoke_async(conn).await?;
    Ok(n > 0)
}
