//! One Redis master: its connection and the lock operations sent to it.
//!
//! A node built from a URL keeps one multiplexed connection, opened lazily on first use
//! and re-opened after the connection breaks; all concurrent operations share it as a
//! pipeline. That also keeps the order of commands to one node: a release sent after an
//! acquire that is still in flight is executed after it, so cleaning up after a failed or
//! abandoned acquisition never races the acquisition itself. A node built from a
//! `deadpool_redis::Pool` takes a connection from the pool for each operation.
//!
//! Every operation is bounded by the per-node timeout, connecting included.

use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    /// The open connection with its generation number.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Held while connecting, so that concurrent callers open one connection, not many.
    /// Holds the generation number of the last connection opened.
    connecting: tokio::sync::Mutex<u64>,
}

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
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(0),
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
    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        match self.current.lock() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn store(&self, value: Option<(u64, MultiplexedConnection)>) {
        match self.current.lock() {
            Ok(mut guard) => *guard = value,
            Err(poisoned) => *poisoned.into_inner() = value,
        }
    }

    async fn connection(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let mut generation = self.connecting.lock().await;
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        // Timeouts are ours (per operation); redis-rs' own would only add a second clock.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(None)
            .set_response_timeout(None);
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        *generation += 1;
        self.store(Some((*generation, conn.clone())));
        Ok((*generation, conn))
    }

    /// Drops the connection of `generation` (if still current) so the next call reconnects.
    fn forget(&self, generation: u64) {
        let mut guard = match self.current.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if guard.as_ref().is_some_and(|(g, _)| *g == generation) {
            *guard = None;
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
