//! Each node's health: reachable, latency, restart quarantine, and the settings locks
//! depend on (persistence, eviction).

use std::time::{Duration, Instant};

use redis::{RedisResult, Value};

use super::INSPECT_TIMEOUT;
use crate::client::Redlock;
use crate::error::NodeError;
use crate::node::Node;
use crate::protocol::info_field;

/// One node's health, as [`Redlock::node_health`] found it.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct NodeHealth {
    /// The node's address (no credentials).
    pub node: String,
    /// Why the node could not be asked (`None`: it answered).
    #[cfg_attr(feature = "serde", serde(serialize_with = "super::json::opt_error"))]
    pub error: Option<NodeError>,
    /// One `PING` round trip.
    #[cfg_attr(feature = "serde", serde(rename = "latency_us", serialize_with = "us"))]
    pub latency: Option<Duration>,
    /// The restart quarantine left, if the node is in quarantine.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "quarantined_ms", serialize_with = "super::json::opt_ms")
    )]
    pub quarantined: Option<Duration>,
    /// The node's votes count: it answers and is not in quarantine.
    pub votes: bool,
    /// The server's version (`redis_version`).
    pub version: Option<String>,
    /// The server process's id (`run_id`): it changes when the server restarts.
    pub run_id: Option<String>,
    /// How long the server has been up.
    #[cfg_attr(feature = "serde", serde(rename = "uptime_s", serialize_with = "secs"))]
    pub uptime: Option<Duration>,
    /// `master` or `slave` (a replica cannot take writes: no locks there).
    pub role: Option<String>,
    /// Memory in use, in bytes.
    pub used_memory: Option<u64>,
    /// The memory limit in bytes (`0`: none); `None` when `CONFIG` is not allowed.
    pub maxmemory: Option<u64>,
    /// What the server evicts when the limit is reached.
    pub maxmemory_policy: Option<String>,
    /// The append-only file is on.
    pub appendonly: Option<bool>,
    /// When the append-only file is flushed (`always` keeps every lock across a crash).
    pub appendfsync: Option<String>,
    /// The snapshot schedule (`save`).
    pub save: Option<String>,
    /// What may let two clients hold one lock on this node, and the fix.
    pub warnings: Vec<String>,
}

impl NodeHealth {
    /// The node answered.
    pub fn reachable(&self) -> bool {
        self.error.is_none()
    }

    /// Every write reaches the disk before it is acknowledged (`appendonly yes` +
    /// `appendfsync always`): a crash forgets no lock. `None` when unknown.
    pub fn durable(&self) -> Option<bool> {
        Some(self.appendonly? && self.appendfsync.as_deref()? == "always")
    }

    /// The node cannot evict keys (no memory limit, or `noeviction`). `None` when
    /// unknown.
    pub fn eviction_safe(&self) -> Option<bool> {
        Some(self.maxmemory? == 0 || self.maxmemory_policy.as_deref()? == "noeviction")
    }
}

#[cfg(feature = "serde")]
#[allow(clippy::ref_option)] // serde's `serialize_with` passes a reference
fn us<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_u64(u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        None => s.serialize_none(),
    }
}

#[cfg(feature = "serde")]
#[allow(clippy::ref_option)]
fn secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_u64(d.as_secs()),
        None => s.serialize_none(),
    }
}

impl Redlock {
    /// Asks every node (at once) whether it answers and how fast, whether it is in
    /// restart quarantine, and how it is set up: version, uptime, role, memory limit and
    /// eviction policy, persistence. Settings that put locks at risk (eviction of lock
    /// keys, no persistence while the quarantine is off, a replica) come with a warning
    /// that says what to change. Never fails: a node that cannot be asked says why.
    pub async fn node_health(&self) -> Vec<NodeHealth> {
        let shared = self.shared();
        let quarantine_on = shared.max_ttl.is_some();
        let timeout = shared.cluster.node_timeout.max(INSPECT_TIMEOUT);
        futures_util::future::join_all(
            shared
                .cluster
                .nodes
                .iter()
                .map(|node| health(node, timeout, quarantine_on)),
        )
        .await
    }
}

async fn health(node: &Node, timeout: Duration, quarantine_on: bool) -> NodeHealth {
    let status = node.status(timeout).await;
    let mut health = NodeHealth {
        node: status.node.clone(),
        error: status.reachable.as_ref().err().cloned(),
        latency: None,
        quarantined: status.quarantined,
        votes: status.votes(),
        version: None,
        run_id: None,
        uptime: None,
        role: None,
        used_memory: None,
        maxmemory: None,
        maxmemory_policy: None,
        appendonly: None,
        appendfsync: None,
        save: None,
        warnings: Vec::new(),
    };
    if health.error.is_some() {
        return health;
    }
    let mut ping = redis::pipe();
    ping.ignore_errors().cmd("PING");
    let started = Instant::now();
    if let Err(err) = node.pipeline(&ping, false, "health", timeout).await {
        health.error = Some(err);
        return health;
    }
    health.latency = Some(started.elapsed());

    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("INFO").arg("server");
    pipe.cmd("INFO").arg("memory");
    pipe.cmd("INFO").arg("replication");
    for parameter in [
        "maxmemory",
        "maxmemory-policy",
        "appendonly",
        "appendfsync",
        "save",
    ] {
        pipe.cmd("CONFIG").arg("GET").arg(parameter);
    }
    let replies = match node.pipeline(&pipe, false, "health", timeout).await {
        Ok(replies) => replies,
        Err(err) => {
            health.error = Some(err);
            return health;
        }
    };
    let mut replies = replies.into_iter();
    let mut info = || text(replies.next());
    let (server, memory, replication) = (info(), info(), info());
    let field = |info: &Option<String>, name: &str| {
        info.as_deref()
            .and_then(|i| info_field(i, name))
            .map(str::to_owned)
    };
    health.version = field(&server, "redis_version");
    health.run_id = field(&server, "run_id");
    health.uptime = field(&server, "uptime_in_seconds")
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs);
    health.role = field(&replication, "role");
    health.used_memory = field(&memory, "used_memory").and_then(|s| s.parse().ok());
    let mut config = replies.map(|reply| {
        reply
            .ok()
            .and_then(|v| redis::from_redis_value::<Vec<String>>(v).ok())
            .and_then(|pair| pair.into_iter().nth(1))
    });
    let mut next = || config.next().flatten();
    health.maxmemory = next().and_then(|s| s.parse().ok());
    health.maxmemory_policy = next();
    health.appendonly = next().map(|s| s == "yes");
    health.appendfsync = next();
    health.save = next();
    health.warnings = warnings(&health, quarantine_on);
    health
}

/// What in `health` puts locks at risk.
fn warnings(health: &NodeHealth, quarantine_on: bool) -> Vec<String> {
    let mut warnings = Vec::new();
    if health.role.as_deref().is_some_and(|r| r != "master") {
        warnings.push(
            "this node is a replica: list the masters (each an independent server), not replicas"
                .to_owned(),
        );
    }
    match health.eviction_safe() {
        Some(false) => warnings.push(format!(
            "maxmemory-policy {} may evict lock keys and fencing counters when memory is full: set `maxmemory-policy noeviction`",
            health.maxmemory_policy.as_deref().unwrap_or("?")
        )),
        None => warnings.push(
            "its settings cannot be read (CONFIG GET not allowed): eviction and persistence are unknown".to_owned(),
        ),
        Some(true) => {}
    }
    if !quarantine_on && health.durable() == Some(false) {
        warnings.push(
            "restart quarantine is off but this node does not persist every write: set `appendonly yes` and `appendfsync always`, or turn the quarantine on".to_owned(),
        );
    }
    warnings
}

/// A text reply (`INFO`), if it is one.
fn text(reply: Option<RedisResult<Value>>) -> Option<String> {
    redis::from_redis_value(reply?.ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank() -> NodeHealth {
        NodeHealth {
            node: "n".into(),
            error: None,
            latency: None,
            quarantined: None,
            votes: true,
            version: None,
            run_id: None,
            uptime: None,
            role: Some("master".into()),
            used_memory: None,
            maxmemory: Some(0),
            maxmemory_policy: Some("allkeys-lru".into()),
            appendonly: Some(false),
            appendfsync: Some("everysec".into()),
            save: None,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn risky_settings_are_warned() {
        let mut h = blank();
        assert!(
            warnings(&h, true).is_empty(),
            "no memory limit: nothing is evicted"
        );
        h.maxmemory = Some(1 << 30);
        assert!(warnings(&h, true)[0].contains("noeviction"));
        assert_eq!(
            warnings(&h, false).len(),
            2,
            "not durable with the quarantine off"
        );
        h.maxmemory_policy = Some("noeviction".into());
        h.appendonly = Some(true);
        h.appendfsync = Some("always".into());
        assert!(warnings(&h, false).is_empty());
        h.maxmemory = None;
        assert!(warnings(&h, true)[0].contains("cannot be read"));
        h.role = Some("slave".into());
        assert!(warnings(&h, true)[0].contains("replica"));
    }
}
