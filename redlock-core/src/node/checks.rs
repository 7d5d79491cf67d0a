//! What a new connection to a node checks before anyone uses it, once per connection in
//! one round trip, and what it says about it, once per node.
//!
//! - Permissions: the lock runs its scripts with `EVALSHA` (releasing, extending,
//!   queueing). A user allowed `SET` but not `EVALSHA` could take locks it can never
//!   release; such a node is refused with [`NodeError::Permission`], naming what is
//!   missing, and not asked again for a while (no reconnect loop).
//! - Eviction: with a memory limit and a `maxmemory-policy` other than `noeviction`,
//!   Redis may evict lock keys (they have a TTL, so `volatile-*` policies take them too)
//!   and fencing counters (no TTL: `allkeys-*`): warned, with the fix.
//! - Persistence (restart quarantine off): a node that does not persist every write can
//!   forget a live lock in a crash: warned.
//!
//! A node whose configuration cannot be read (`CONFIG` not allowed) is not warned about
//! eviction; for persistence it is, since the quarantine being off relies on it.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::MultiplexedConnection;
use redis::{RedisError, RedisResult, Value};

use crate::error::NodeError;
use crate::protocol::scripts;

/// One node's checks and the warnings already given.
#[derive(Debug)]
pub(crate) struct Checks {
    /// The node's address, for the log.
    node: String,
    /// The restart quarantine is off: check persistence.
    persistence: bool,
    warned_eviction: AtomicBool,
    warned_persistence: AtomicBool,
}

impl Checks {
    pub(crate) fn new(node: String, persistence: bool) -> Self {
        Self {
            node,
            persistence,
            warned_eviction: AtomicBool::new(false),
            warned_persistence: AtomicBool::new(false),
        }
    }

    /// The node's address.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// Runs the checks on a new connection; `Err` if the node lacks a permission the
    /// lock needs.
    pub(crate) async fn run(&self, conn: &mut MultiplexedConnection) -> Result<(), NodeError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("EVALSHA")
            .arg(scripts::SERVER_TIME.get_hash())
            .arg(0);
        for parameter in ["maxmemory", "maxmemory-policy", "appendonly", "appendfsync"] {
            pipe.cmd("CONFIG").arg("GET").arg(parameter);
        }
        let replies: Vec<RedisResult<Value>> = pipe
            .query_async(conn)
            .await
            .map_err(|err| refused(err, "EVALSHA"))?;
        let mut replies = replies.into_iter();
        if let Some(Err(err)) = replies.next() {
            return Err(refused(err, "EVALSHA"));
        }
        let mut config = replies.map(|reply| match reply {
            Ok(value) => redis::from_redis_value::<Vec<String>>(value)
                .ok()
                .and_then(|pair| pair.into_iter().nth(1)),
            Err(_) => None,
        });
        let (maxmemory, policy, aof, fsync) = (
            config.next().flatten(),
            config.next().flatten(),
            config.next().flatten(),
            config.next().flatten(),
        );
        self.check_eviction(maxmemory.as_deref(), policy.as_deref());
        if self.persistence {
            self.check_persistence(aof.as_deref(), fsync.as_deref());
        }
        Ok(())
    }

    fn check_eviction(&self, maxmemory: Option<&str>, policy: Option<&str>) {
        let (Some(maxmemory), Some(policy)) = (maxmemory, policy) else {
            return;
        };
        let limited = maxmemory.parse::<u64>().map_or(true, |bytes| bytes > 0);
        if limited && policy != "noeviction" && !self.warned_eviction.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                node = %self.node,
                maxmemory,
                policy,
                "this node may evict lock keys and fencing counters when its memory is full, which can let two clients hold a lock: set `maxmemory-policy noeviction` on it (CONFIG SET maxmemory-policy noeviction)"
            );
        }
    }

    fn check_persistence(&self, aof: Option<&str>, fsync: Option<&str>) {
        let durable = aof == Some("yes") && fsync == Some("always");
        if !durable && !self.warned_persistence.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                node = %self.node,
                "restart quarantine is off but this node does not persist every write (appendonly yes + appendfsync always): a crash and restart can forget a live lock and let two clients hold it"
            );
        }
    }
}

/// A connection's setup failed: a permission the lock needs (`NOPERM`) or bad
/// credentials become their own errors, anything else a plain Redis error.
pub(crate) fn refused(err: RedisError, command: &str) -> NodeError {
    if err.code() == Some("NOPERM") {
        return NodeError::Permission(format!(
            "the user may not run {command} ({}); grant it +@scripting, or at least +evalsha +script|load (and +publish +subscribe for wake on release)",
            err.detail().unwrap_or("NOPERM")
        ));
    }
    if err.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(err.code(), Some("WRONGPASS" | "NOAUTH"))
    {
        return NodeError::Authentication(err.to_string());
    }
    NodeError::Redis(std::sync::Arc::new(err))
}
