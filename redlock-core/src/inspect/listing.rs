//! Listing the locks held under a prefix.
//!
//! Each node is scanned for lock keys (`SCAN MATCH <prefix>{<resource prefix>*} TYPE
//! string`, a page per round trip); then every node is asked about every key found
//! anywhere (value, remaining TTL, fencing counter, wait queue: one pipeline per
//! [`DETAIL_BATCH`] keys), so that each lock is reported as every node sees it.

use std::collections::BTreeSet;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use redis::RedisResult;

use super::groups::{self, HeldRwLock, HeldSemaphore};
use super::held::{HeldLock, Seen, summarize};
use super::{DETAIL_BATCH, INSPECT_TIMEOUT, glob_escape, only_reply};
use crate::client::Redlock;
use crate::error::{Error, NodeError, NodeFailure};
use crate::node::Node;
use crate::protocol::redis_error;
use crate::shared::Shared;
use crate::value::unmarked;

/// Keys asked for in one `SCAN` page.
const SCAN_COUNT: usize = 2000;
/// The most locks one listing returns by default.
pub const DEFAULT_LIST_LIMIT: usize = 10_000;

/// A listing of the locks held under a prefix: `.await` it, after setting a
/// [`limit`](Self::limit) or a [`timeout`](Self::timeout) if needed. Made by
/// [`Redlock::locks`].
#[must_use = "a listing does nothing until `.await`ed"]
#[derive(Debug)]
pub struct ListLocks<'a> {
    redlock: &'a Redlock,
    prefix: String,
    limit: usize,
    timeout: Duration,
}

impl Redlock {
    /// Lists the locks held on resources whose name starts with `prefix` (`""` for all
    /// of this client's key prefix): per lock its holder, how each node sees it, the
    /// remaining validity, the fencing counter and whether the nodes agree. Sorted by
    /// resource name; at most [`DEFAULT_LIST_LIMIT`] locks unless
    /// [`limit`](ListLocks::limit) says otherwise. Semaphores and read-write locks
    /// whose names start with `prefix` are grouped: their slot and writer keys are
    /// listed in [`LockListing::semaphores`] and [`LockListing::rw_locks`], not as
    /// locks.
    ///
    /// A read-only operator's tool: the listing is a snapshot taken over a few round
    /// trips, not an atomic view (a lock may be taken or released meanwhile).
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when fewer than a majority of nodes answered (a listing
    /// from a minority could miss locks that are held); nodes that failed while a
    /// majority answered are named in [`LockListing::failures`].
    pub fn locks(&self, prefix: impl Into<String>) -> ListLocks<'_> {
        ListLocks {
            redlock: self,
            prefix: prefix.into(),
            limit: DEFAULT_LIST_LIMIT,
            timeout: INSPECT_TIMEOUT,
        }
    }
}

impl ListLocks<'_> {
    /// Returns at most `limit` locks (the first by resource name); the listing says
    /// whether more were found ([`LockListing::truncated`]).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit.max(1);
        self
    }

    /// Bounds each round trip to a node (default [`INSPECT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl<'a> IntoFuture for ListLocks<'a> {
    type Output = Result<LockListing, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(list(self))
    }
}

/// The locks found, and the nodes that could not be asked.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LockListing {
    /// The resource-name prefix listed.
    pub prefix: String,
    /// The locks, sorted by resource name: every lock key found, except the slots of
    /// the semaphores and the writers of the read-write locks whose names start with
    /// the prefix, which are listed in [`semaphores`](Self::semaphores) and
    /// [`rw_locks`](Self::rw_locks) instead (each key is listed once).
    pub locks: Vec<HeldLock>,
    /// The semaphores ([`Redlock::semaphore`]) whose names start with the prefix and
    /// with a slot held on some node, sorted by name: permits in use and in all, and
    /// each slot's lock.
    pub semaphores: Vec<HeldSemaphore>,
    /// The read-write locks whose names start with the prefix and with a writer, a
    /// live reader or a waiting writer, sorted by name.
    pub rw_locks: Vec<HeldRwLock>,
    /// More locks (lock keys, slots and writers included) or more read-write locks
    /// were found than the limit let through.
    pub truncated: bool,
    /// Nodes that did not answer (their view is missing from every lock).
    #[cfg_attr(feature = "serde", serde(serialize_with = "super::json::failures"))]
    pub failures: Vec<NodeFailure>,
    /// Nodes asked.
    pub nodes: usize,
    /// Nodes needed for a majority.
    pub quorum: usize,
}

async fn list(request: ListLocks<'_>) -> Result<LockListing, Error> {
    let shared: &Shared = request.redlock.shared();
    let cluster = &shared.cluster;
    let timeout = request.timeout;
    let key_start = format!("{}{{", shared.key_prefix);
    let escaped_prefix = glob_escape(&request.prefix);
    let pattern = format!("{}{escaped_prefix}*}}", glob_escape(&key_start));
    // The read-write locks' readers' sets and waiting writers' marks: a lock with only
    // readers has no writer key for the first scan to find.
    let rw_pattern = groups::rw_pattern(&key_start, &escaped_prefix);
    let side = |key: &str| groups::rw_side_name(&key_start, key).is_some();
    let scans = futures_util::future::join_all(cluster.nodes.iter().map(|node| async {
        let (keys, rw) = futures_util::future::join(
            scan(
                node,
                &pattern,
                Some("string"),
                request.limit,
                timeout,
                |_| true,
            ),
            scan(node, &rw_pattern, None, request.limit, timeout, side),
        )
        .await;
        Ok::<_, NodeError>((keys?, rw?))
    }))
    .await;
    let mut failures = Vec::new();
    let mut found = BTreeSet::new();
    let mut rw_found = BTreeSet::new();
    let mut scanned = Vec::with_capacity(scans.len());
    for (node, scan) in cluster.nodes.iter().zip(scans) {
        match scan {
            Ok((keys, rw)) => {
                found.extend(keys);
                rw_found.extend(
                    rw.iter()
                        .filter_map(|k| groups::rw_side_name(&key_start, k))
                        .map(str::to_owned),
                );
                scanned.push(true);
            }
            Err(cause) => {
                failures.push(NodeFailure {
                    node: node.name().to_owned(),
                    cause,
                });
                scanned.push(false);
            }
        }
    }
    let quorum = cluster.quorum();
    let no_quorum = |failures: Vec<NodeFailure>| Error::NoQuorum {
        resource: format!("{}*", request.prefix),
        needed: quorum,
        total: cluster.nodes.len(),
        failures,
    };
    if failures.len() > cluster.nodes.len() - quorum {
        return Err(no_quorum(failures));
    }
    // Keys are sorted by the BTreeSet; so are resources (same prefix and braces).
    let mut truncated = found.len() > request.limit;
    let keys: Vec<String> = found.into_iter().take(request.limit).collect();
    let fence_keys: Vec<String> = keys.iter().map(|k| format!("{k}:fence")).collect();
    let (keys_ref, fences_ref) = (&keys, &fence_keys);
    let details = futures_util::future::join_all(cluster.nodes.iter().zip(&scanned).map(
        |(node, scanned)| async move {
            if *scanned {
                Some(detail(node, keys_ref, fences_ref, timeout).await)
            } else {
                None
            }
        },
    ))
    .await;
    let mut views: Vec<Option<Vec<Seen>>> = Vec::with_capacity(details.len());
    for (node, detail) in cluster.nodes.iter().zip(details) {
        match detail {
            Some(Ok(seen)) => views.push(Some(seen)),
            Some(Err(cause)) => {
                failures.push(NodeFailure {
                    node: node.name().to_owned(),
                    cause,
                });
                views.push(None);
            }
            None => views.push(None),
        }
    }
    if failures.len() > cluster.nodes.len() - quorum {
        return Err(no_quorum(failures));
    }
    let names: Vec<&str> = cluster.nodes.iter().map(Node::name).collect();
    let all = keys
        .iter()
        .enumerate()
        .filter_map(|(i, key)| {
            let resource = key.strip_prefix(&key_start)?.strip_suffix('}')?;
            let seen: Vec<Option<&Seen>> = views
                .iter()
                .map(|view| view.as_ref().and_then(|v| v.get(i)))
                .collect();
            summarize(resource, &names, &seen, quorum)
        })
        .collect();

    // Semaphores and read-write locks: their slots and writers out of the locks, then
    // what the nodes hold of the rest of their keys.
    let split = groups::split(all, &request.prefix);
    let semaphore_names: Vec<String> = split.slots.keys().cloned().collect();
    let (rw_names, rw_truncated) = groups::names_within(
        split.writers.keys().cloned(),
        rw_found
            .into_iter()
            .filter(|n| n.starts_with(&request.prefix)),
        request.limit,
    );
    truncated |= rw_truncated;
    let (semaphores_ref, rw_ref) = (&semaphore_names, &rw_names);
    let group_details = futures_util::future::join_all(cluster.nodes.iter().zip(&views).map(
        |(node, view)| async move {
            if view.is_some() && !(semaphores_ref.is_empty() && rw_ref.is_empty()) {
                Some(groups::detail(node, shared, semaphores_ref, rw_ref, timeout).await)
            } else {
                None
            }
        },
    ))
    .await;
    let mut group_views = Vec::with_capacity(group_details.len());
    for (node, detail) in cluster.nodes.iter().zip(group_details) {
        match detail {
            Some(Ok(view)) => group_views.push(Some(view)),
            Some(Err(cause)) => {
                failures.push(NodeFailure {
                    node: node.name().to_owned(),
                    cause,
                });
                group_views.push(None);
            }
            None => group_views.push(None),
        }
    }
    if failures.len() > cluster.nodes.len() - quorum {
        return Err(no_quorum(failures));
    }
    Ok(LockListing {
        prefix: request.prefix,
        locks: split.locks,
        semaphores: groups::semaphores(split.slots, &group_views, quorum),
        rw_locks: groups::rw_locks(&rw_names, split.writers, &group_views, quorum),
        truncated,
        failures,
        nodes: cluster.nodes.len(),
        quorum,
    })
}

/// Scans `node` for keys matching `pattern` (of type `kind`, if given) to the end;
/// keeps the first `limit + 1` by name (one more than the limit tells that there are
/// more) among those `keep` accepts.
pub(super) async fn scan(
    node: &Node,
    pattern: &str,
    kind: Option<&str>,
    limit: usize,
    timeout: Duration,
    keep: impl Fn(&str) -> bool,
) -> Result<BTreeSet<String>, NodeError> {
    let mut keys = BTreeSet::new();
    let mut cursor: u64 = 0;
    loop {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        if let Some(kind) = kind {
            pipe.arg("TYPE").arg(kind);
        }
        let reply = only_reply(node.pipeline(&pipe, false, "scan", timeout).await?)?;
        let (next, page): (u64, Vec<Vec<u8>>) =
            redis::from_redis_value(reply).map_err(|e| redis_error(e.into()))?;
        // Keys that are not UTF-8 were not written by this library.
        keys.extend(
            page.into_iter()
                .filter_map(|k| String::from_utf8(k).ok())
                .filter(|k| keep(k)),
        );
        while keys.len() > limit.saturating_add(1) {
            keys.pop_last();
        }
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Asks `node` about every key: its value, remaining TTL, fencing counter and queue
/// length.
async fn detail(
    node: &Node,
    keys: &[String],
    fence_keys: &[String],
    timeout: Duration,
) -> Result<Vec<Seen>, NodeError> {
    let mut seen = Vec::with_capacity(keys.len());
    for (keys, fence_keys) in keys
        .chunks(DETAIL_BATCH)
        .zip(fence_keys.chunks(DETAIL_BATCH))
    {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (key, fence) in keys.iter().zip(fence_keys) {
            pipe.cmd("GET").arg(key);
            pipe.cmd("PTTL").arg(key);
            pipe.cmd("GET").arg(fence);
            pipe.cmd("ZCARD").arg(format!("{key}:queue"));
        }
        let replies = node.pipeline(&pipe, false, "inspect", timeout).await?;
        let mut replies = replies.into_iter();
        for _ in keys {
            let mut next = || replies.next().and_then(RedisResult::ok);
            // The holder's value, without the waiters' mark: one acquisition whether
            // a node's key has waiters or not.
            let value = next()
                .and_then(|v| redis::from_redis_value::<Option<String>>(v).ok().flatten())
                .map(|v| unmarked(&v).to_owned());
            let pttl = next().and_then(|v| redis::from_redis_value::<i64>(v).ok());
            let fence =
                next().and_then(|v| redis::from_redis_value::<Option<String>>(v).ok().flatten());
            let waiters = next()
                .and_then(|v| redis::from_redis_value::<u64>(v).ok())
                .unwrap_or(0);
            seen.push(Seen {
                remaining: match pttl {
                    Some(ms) if ms >= 0 && value.is_some() => {
                        Some(Duration::from_millis(ms.unsigned_abs()))
                    }
                    _ => None,
                },
                value,
                fence: fence.and_then(|f| f.parse().ok()),
                waiters,
            });
        }
    }
    Ok(seen)
}
