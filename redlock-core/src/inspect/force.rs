//! Releasing a lock that its holder cannot release (stuck, paused, gone), and making the
//! holder's fencing token stale.

use std::time::Duration;

use redis::Value;

use super::{INSPECT_TIMEOUT, only_reply};
use crate::client::Redlock;
use crate::error::{Error, NodeError, NodeFailure};
use crate::node::Node;
use crate::protocol::redis_error;

/// On one node: deletes the lock key `KEYS[1]` whatever it holds (waking its waiters,
/// as a release does), and raises the fencing counter `KEYS[2]` to `ARGV[1]`, or one
/// past its own value if that is higher. Returns `{deleted (0 or 1), counter}`.
const FORCE_RELEASE: &str = r"
local token = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current >= token then
  token = current + 1
end
redis.call('SET', KEYS[2], string.format('%d', token))
local deleted = redis.call('DEL', KEYS[1])
if deleted == 1 then
  redis.call('PUBLISH', KEYS[1], '')
end
return {deleted, token}
";

/// What [`Redlock::force_release`] did.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ForceReleased {
    /// The resource.
    pub resource: String,
    /// Nodes whose key was deleted (0: nobody held the lock there).
    pub deleted: usize,
    /// The resource's fencing counter now: above every token handed out before, so the
    /// next holder's token is above it too and the forced-out holder's token is stale.
    pub fencing_token: u64,
    /// Nodes that could not be reached (their key expires by its TTL; their counter is
    /// below the others', which the next acquisition's majority makes up for).
    #[cfg_attr(feature = "serde", serde(serialize_with = "super::json::failures"))]
    pub failures: Vec<NodeFailure>,
}

impl Redlock {
    /// Releases `resource` whoever holds it: deletes its lock key on every node (waking
    /// its waiters) and raises its fencing counter above every token handed out, so that
    /// storage that checks tokens rejects the old holder's writes once the next
    /// holder's (higher) token, or this one, has reached it.
    ///
    /// An operator's tool for a holder that is stuck or gone while its lock is kept
    /// alive: the holder is **not** told; its next extension fails and it learns it has
    /// lost the lock then ([`Lock::lost`](crate::Lock::lost)). Anything it writes in
    /// between is only stopped by fencing.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an invalid resource name; [`Error::NoQuorum`] when fewer
    /// than a majority of nodes could be read first (the new counter must be above the
    /// last token, which only a majority is sure to know) or released; in the second
    /// case the nodes reached were released.
    pub async fn force_release(&self, resource: &str) -> Result<ForceReleased, Error> {
        let shared = self.shared();
        shared.check_resources(&[resource.to_owned()])?;
        let cluster = &shared.cluster;
        let timeout = cluster.node_timeout.max(INSPECT_TIMEOUT);
        let key = shared.key(resource);
        let fence_key = shared.fence_key(resource);
        let no_quorum = |failures: Vec<NodeFailure>| Error::NoQuorum {
            resource: resource.to_owned(),
            needed: cluster.quorum(),
            total: cluster.nodes.len(),
            failures,
        };

        let mut read = redis::pipe();
        read.ignore_errors().cmd("GET").arg(&fence_key);
        let counters = fan_out(&cluster.nodes, &read, timeout, |reply| {
            Ok(redis::from_redis_value::<Option<u64>>(reply)
                .map_err(|e| redis_error(e.into()))?
                .unwrap_or(0))
        })
        .await;
        let (counters, failures) = split(&cluster.nodes, counters);
        if counters.len() < cluster.quorum() {
            return Err(no_quorum(failures));
        }
        let floor = counters.into_iter().max().unwrap_or(0).saturating_add(1);

        let mut force = redis::pipe();
        force
            .ignore_errors()
            .cmd("EVAL")
            .arg(FORCE_RELEASE)
            .arg(2)
            .arg(&key)
            .arg(&fence_key)
            .arg(floor);
        let forced = fan_out(&cluster.nodes, &force, timeout, |reply| {
            let (deleted, token): (u64, u64) =
                redis::from_redis_value(reply).map_err(|e| redis_error(e.into()))?;
            Ok((deleted, token))
        })
        .await;
        let (forced, failures) = split(&cluster.nodes, forced);
        let deleted = forced.iter().filter(|(d, _)| *d == 1).count();
        let fencing_token = forced.iter().map(|(_, t)| *t).max().unwrap_or(floor);
        tracing::warn!(
            resource,
            deleted,
            fencing_token,
            failed = failures.len(),
            "lock released by force"
        );
        if forced.len() < cluster.quorum() {
            return Err(no_quorum(failures));
        }
        Ok(ForceReleased {
            resource: resource.to_owned(),
            deleted,
            fencing_token,
            failures,
        })
    }
}

/// Sends the one-command `pipe` to every node at once; `parse` reads each reply.
async fn fan_out<T>(
    nodes: &[Node],
    pipe: &redis::Pipeline,
    timeout: Duration,
    parse: impl Fn(Value) -> Result<T, NodeError> + Copy,
) -> Vec<Result<T, NodeError>> {
    futures_util::future::join_all(nodes.iter().map(|node| async move {
        let reply = only_reply(node.pipeline(pipe, false, "force_release", timeout).await?)?;
        parse(reply)
    }))
    .await
}

/// The answers, and the nodes that failed.
fn split<T>(nodes: &[Node], results: Vec<Result<T, NodeError>>) -> (Vec<T>, Vec<NodeFailure>) {
    let mut ok = Vec::new();
    let mut failures = Vec::new();
    for (node, result) in nodes.iter().zip(results) {
        match result {
            Ok(t) => ok.push(t),
            Err(cause) => failures.push(NodeFailure {
                node: node.name().to_owned(),
                cause,
            }),
        }
    }
    (ok, failures)
}
