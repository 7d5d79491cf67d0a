//! Releasing a lock that its holder cannot release (stuck, paused, gone), and making the
//! holder's fencing token stale; and the same for every permit of a semaphore and for
//! a read-write lock (its writer and every reader).

use std::collections::BTreeSet;
use std::time::Duration;

use redis::Value;

use super::groups::{rw_key, size_key, slot_of};
use super::listing::scan;
use super::{INSPECT_TIMEOUT, glob_escape, only_reply};
use crate::client::Redlock;
use crate::error::{ArgumentError, Error, NodeError, NodeFailure};
use crate::node::Node;
use crate::protocol::MAX_PERMITS;
use crate::protocol::redis_error;

/// Slots of a semaphore released by force in one round trip per node (two commands
/// each: the counter read, then the release).
const FORCE_BATCH: usize = 512;

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
    /// [`Error::Argument`] for an invalid resource name; [`Error::NoQuorum`] when fewer
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

/// What [`Redlock::force_release_semaphore`] did.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct SemaphoreReleased {
    /// The semaphore's name.
    pub name: String,
    /// Its number of permits, from its size record (`None`: no record found, or one
    /// above [`MAX_PERMITS`](crate::semaphore::MAX_PERMITS), which no semaphore wrote; the slots
    /// released are those a scan found held).
    pub permits: Option<u32>,
    /// Each slot released, by index: every slot below `permits`, and every other slot
    /// some node held.
    pub slots: Vec<SlotReleased>,
    /// Nodes that could not be reached (their slot keys expire by their TTL).
    #[cfg_attr(feature = "serde", serde(serialize_with = "super::json::failures"))]
    pub failures: Vec<NodeFailure>,
}

impl SemaphoreReleased {
    /// Slots that some node held (and no longer holds).
    pub fn released(&self) -> usize {
        self.slots.iter().filter(|s| s.deleted > 0).count()
    }
}

/// One slot of a semaphore released by force.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct SlotReleased {
    /// The slot's index.
    pub slot: u32,
    /// Nodes whose slot key was deleted (0: nobody held the slot there).
    pub deleted: usize,
    /// The slot's fencing counter now, above every token handed out for the slot.
    pub fencing_token: u64,
}

/// What [`Redlock::force_release_rw`] did.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RwReleased {
    /// The read-write lock's name.
    pub name: String,
    /// Nodes whose writer key was deleted (0: no writer there).
    pub writer_deleted: usize,
    /// Read locks deleted: distinct reader keys deleted on some node.
    pub readers_deleted: usize,
    /// Nodes whose waiting writers' mark (their queue) was deleted: they take a new
    /// place when they next try.
    pub writer_waiting_deleted: usize,
    /// The writer's fencing counter now, above every token handed out to a writer.
    pub fencing_token: u64,
    /// Nodes that could not be reached (their keys expire by their TTLs).
    #[cfg_attr(feature = "serde", serde(serialize_with = "super::json::failures"))]
    pub failures: Vec<NodeFailure>,
}

/// On one node, a read-write lock `W`: deletes the writer key `KEYS[1]`, every reader
/// key named in the readers' set `KEYS[3]` or in `KEYS[6..]` (those a scan found), the
/// set, the waiting writers' mark `KEYS[4]` and its deadlines `KEYS[5]`; raises the
/// writer's fencing counter `KEYS[2]` as [`FORCE_RELEASE`] does; and, if anything was
/// deleted, wakes the lock's waiters (a message on the writer key's channel, as a
/// release sends). Returns `{writer deleted (0 or 1), counter, mark deleted (0 or 1),
/// {reader keys deleted}}`.
const FORCE_RELEASE_RW: &str = r"
local token = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current >= token then
  token = current + 1
end
redis.call('SET', KEYS[2], string.format('%d', token))
local readers = {}
local seen = {}
local function drop(key)
  if not seen[key] then
    seen[key] = true
    if redis.call('DEL', key) == 1 then
      readers[#readers + 1] = key
    end
  end
end
for _, key in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  drop(key)
end
for i = 6, #KEYS do
  drop(KEYS[i])
end
redis.call('DEL', KEYS[3])
local waiting = redis.call('DEL', KEYS[4])
redis.call('DEL', KEYS[5])
local deleted = redis.call('DEL', KEYS[1])
if deleted == 1 or waiting == 1 or #readers > 0 then
  redis.call('PUBLISH', KEYS[1], '')
end
return {deleted, token, waiting, readers}
";

impl Redlock {
    /// Releases every permit of the semaphore `name` ([`Redlock::semaphore`]) whoever
    /// holds them: each slot is released as [`force_release`](Self::force_release)
    /// releases a lock (its key deleted on every node, its fencing counter raised
    /// above every token handed out for it). The slots are those below the size its
    /// clients recorded, and any other slot a scan of the nodes finds held.
    ///
    /// The holders are not told: each learns it at its next extension.
    ///
    /// # Errors
    ///
    /// As [`force_release`](Self::force_release): [`Error::Argument`] for an invalid
    /// name, [`Error::NoQuorum`] when fewer than a majority of nodes could be read or
    /// released.
    pub async fn force_release_semaphore(&self, name: &str) -> Result<SemaphoreReleased, Error> {
        let shared = self.shared();
        if name.is_empty() {
            return Err(Error::Argument(ArgumentError::EmptyResource));
        }
        shared.check_resources(&[format!("{name}/permit/0")])?;
        let cluster = &shared.cluster;
        let timeout = cluster.node_timeout.max(INSPECT_TIMEOUT);
        let no_quorum = |failures| no_quorum(self, name, failures);

        // The size record, and the slot keys held, on every node.
        let mut read = redis::pipe();
        read.ignore_errors().cmd("GET").arg(size_key(shared, name));
        let key_start = format!("{}{{", shared.key_prefix);
        let pattern = format!(
            "{}{}*}}",
            glob_escape(&key_start),
            glob_escape(&format!("{name}/permit/"))
        );
        let found = futures_util::future::join_all(cluster.nodes.iter().map(|node| async {
            let size = only_reply(
                node.pipeline(&read, false, "force_release", timeout)
                    .await?,
            )?;
            let size = redis::from_redis_value::<Option<u32>>(size).ok().flatten();
            let keys = scan(node, &pattern, Some("string"), usize::MAX, timeout, |_| {
                true
            })
            .await?;
            Ok::<_, NodeError>((size, keys))
        }))
        .await;
        let (found, failures) = split(&cluster.nodes, found);
        if found.len() < cluster.quorum() {
            return Err(no_quorum(failures));
        }
        // A record above the bound was not written by a semaphore (none is that big):
        // only the slots found held are released then.
        let permits = found
            .iter()
            .filter_map(|(size, _)| *size)
            .filter(|&size| size <= MAX_PERMITS)
            .max();
        let mut slots: BTreeSet<u32> = (0..permits.unwrap_or(0)).collect();
        for (_, keys) in &found {
            slots.extend(keys.iter().filter_map(|key| {
                let resource = key.strip_prefix(&key_start)?.strip_suffix('}')?;
                slot_of(resource)
                    .filter(|(n, _)| *n == name)
                    .map(|(_, slot)| slot)
            }));
        }
        let slots: Vec<u32> = slots.into_iter().collect();
        // A batch of slots per round trip, so that a large semaphore's release never
        // builds every key (nor one pipeline of them all) at once.
        let mut released = Vec::with_capacity(slots.len());
        let mut failures: Vec<NodeFailure> = Vec::new();
        for batch in slots.chunks(FORCE_BATCH) {
            let resources: Vec<String> =
                batch.iter().map(|s| format!("{name}/permit/{s}")).collect();
            let (forced, failed) = self.force_all(&resources, name).await?;
            released.extend(
                batch
                    .iter()
                    .zip(forced)
                    .map(|(&slot, (deleted, fencing_token))| SlotReleased {
                        slot,
                        deleted,
                        fencing_token,
                    }),
            );
            for failure in failed {
                if !failures.iter().any(|f| f.node == failure.node) {
                    failures.push(failure);
                }
            }
        }
        tracing::warn!(
            semaphore = name,
            slots = released.len(),
            deleted = released.iter().filter(|s| s.deleted > 0).count(),
            failed = failures.len(),
            "semaphore released by force"
        );
        Ok(SemaphoreReleased {
            name: name.to_owned(),
            permits,
            slots: released,
            failures,
        })
    }

    /// Releases the read-write lock `name` ([`Redlock::rw_lock`]) whoever holds it: on
    /// every node, deletes its writer key, every read lock, the readers' set and the
    /// waiting writers' queue, wakes its waiters, and raises the writer's fencing counter above every
    /// token handed out to a writer (as [`force_release`](Self::force_release) does).
    ///
    /// The holders are not told: each learns it at its next extension.
    ///
    /// # Errors
    ///
    /// As [`force_release`](Self::force_release): [`Error::Argument`] for an invalid
    /// name, [`Error::NoQuorum`] when fewer than a majority of nodes could be read or
    /// released.
    pub async fn force_release_rw(&self, name: &str) -> Result<RwReleased, Error> {
        let shared = self.shared();
        if name.is_empty() {
            return Err(Error::Argument(ArgumentError::EmptyResource));
        }
        let resource = format!("{name}/rw");
        shared.check_resources(std::slice::from_ref(&resource))?;
        let cluster = &shared.cluster;
        let timeout = cluster.node_timeout.max(INSPECT_TIMEOUT);
        let no_quorum = |failures| no_quorum(self, name, failures);
        let key = rw_key(shared, name);
        let fence_key = shared.fence_key(&resource);

        // The fencing counters, and the reader keys (also those the set lost).
        let mut read = redis::pipe();
        read.ignore_errors().cmd("GET").arg(&fence_key);
        let pattern = format!("{}:reader:*", glob_escape(&key));
        let found = futures_util::future::join_all(cluster.nodes.iter().map(|node| async {
            let counter = only_reply(
                node.pipeline(&read, false, "force_release", timeout)
                    .await?,
            )?;
            let counter = redis::from_redis_value::<Option<u64>>(counter)
                .map_err(|e| redis_error(e.into()))?
                .unwrap_or(0);
            let readers = scan(node, &pattern, None, usize::MAX, timeout, |_| true).await?;
            Ok::<_, NodeError>((counter, readers))
        }))
        .await;
        let (found, failures) = split(&cluster.nodes, found);
        if found.len() < cluster.quorum() {
            return Err(no_quorum(failures));
        }
        let floor = found
            .iter()
            .map(|(c, _)| *c)
            .max()
            .unwrap_or(0)
            .saturating_add(1);
        let readers: BTreeSet<&String> = found.iter().flat_map(|(_, r)| r).collect();

        let mut force = redis::pipe();
        force
            .ignore_errors()
            .cmd("EVAL")
            .arg(FORCE_RELEASE_RW)
            .arg(5 + readers.len())
            .arg(&key)
            .arg(&fence_key)
            .arg(format!("{key}:readers"))
            .arg(format!("{key}:writer-waiting"))
            .arg(format!("{key}:writer-waiting:until"));
        for reader in &readers {
            force.arg(*reader);
        }
        force.arg(floor);
        let forced = fan_out(&cluster.nodes, &force, timeout, |reply| {
            let (deleted, token, waiting, readers): (u64, u64, u64, Vec<String>) =
                redis::from_redis_value(reply).map_err(|e| redis_error(e.into()))?;
            Ok((deleted, token, waiting, readers))
        })
        .await;
        let (forced, failures) = split(&cluster.nodes, forced);
        let released = RwReleased {
            name: name.to_owned(),
            writer_deleted: forced.iter().filter(|f| f.0 == 1).count(),
            readers_deleted: forced
                .iter()
                .flat_map(|f| &f.3)
                .collect::<BTreeSet<_>>()
                .len(),
            writer_waiting_deleted: forced.iter().filter(|f| f.2 == 1).count(),
            fencing_token: forced.iter().map(|f| f.1).max().unwrap_or(floor),
            failures,
        };
        tracing::warn!(
            rw_lock = name,
            writer_deleted = released.writer_deleted,
            readers_deleted = released.readers_deleted,
            fencing_token = released.fencing_token,
            failed = released.failures.len(),
            "read-write lock released by force"
        );
        if forced.len() < cluster.quorum() {
            return Err(no_quorum(released.failures));
        }
        Ok(released)
    }

    /// Releases every resource of `resources` by force (as
    /// [`force_release`](Self::force_release)), each node in one pipeline per round
    /// trip: per resource, the nodes whose key was deleted and the counter now.
    async fn force_all(
        &self,
        resources: &[String],
        name: &str,
    ) -> Result<(Vec<(usize, u64)>, Vec<NodeFailure>), Error> {
        let shared = self.shared();
        let cluster = &shared.cluster;
        let timeout = cluster.node_timeout.max(INSPECT_TIMEOUT);
        if resources.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut read = redis::pipe();
        read.ignore_errors();
        for resource in resources {
            read.cmd("GET").arg(shared.fence_key(resource));
        }
        let counters = futures_util::future::join_all(cluster.nodes.iter().map(|node| async {
            let replies = node
                .pipeline(&read, false, "force_release", timeout)
                .await?;
            replies
                .into_iter()
                .map(|reply| {
                    Ok(
                        redis::from_redis_value::<Option<u64>>(reply.map_err(redis_error)?)
                            .map_err(|e| redis_error(e.into()))?
                            .unwrap_or(0),
                    )
                })
                .collect::<Result<Vec<u64>, NodeError>>()
        }))
        .await;
        let (counters, failures) = split(&cluster.nodes, counters);
        if counters.len() < cluster.quorum() {
            return Err(no_quorum(self, name, failures));
        }
        let floors: Vec<u64> = (0..resources.len())
            .map(|i| {
                counters
                    .iter()
                    .filter_map(|c| c.get(i).copied())
                    .max()
                    .unwrap_or(0)
                    .saturating_add(1)
            })
            .collect();
        let mut force = redis::pipe();
        force.ignore_errors();
        for (resource, floor) in resources.iter().zip(&floors) {
            force
                .cmd("EVAL")
                .arg(FORCE_RELEASE)
                .arg(2)
                .arg(shared.key(resource))
                .arg(shared.fence_key(resource))
                .arg(*floor);
        }
        let forced = futures_util::future::join_all(cluster.nodes.iter().map(|node| async {
            let replies = node
                .pipeline(&force, false, "force_release", timeout)
                .await?;
            replies
                .into_iter()
                .map(|reply| {
                    redis::from_redis_value::<(u64, u64)>(reply.map_err(redis_error)?)
                        .map_err(|e| redis_error(e.into()))
                })
                .collect::<Result<Vec<(u64, u64)>, NodeError>>()
        }))
        .await;
        let (forced, failures) = split(&cluster.nodes, forced);
        let results = floors
            .iter()
            .enumerate()
            .map(|(i, floor)| {
                let per_node = forced.iter().filter_map(|f| f.get(i));
                let deleted = per_node.clone().filter(|(d, _)| *d == 1).count();
                let token = per_node.map(|(_, t)| *t).max().unwrap_or(*floor);
                (deleted, token)
            })
            .collect();
        if forced.len() < cluster.quorum() {
            return Err(no_quorum(self, name, failures));
        }
        Ok((results, failures))
    }
}

/// The error of a forced release of `name` that reached too few nodes.
fn no_quorum(redlock: &Redlock, name: &str, failures: Vec<NodeFailure>) -> Error {
    Error::NoQuorum {
        resource: name.to_owned(),
        needed: redlock.quorum(),
        total: redlock.node_count(),
        failures,
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
