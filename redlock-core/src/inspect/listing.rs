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
use super::{INSPECT_TIMEOUT, only_reply};
use crate::client::Redlock;
use crate::error::{Error, NodeError, NodeFailure};
use crate::node::Node;
use crate::protocol::redis_error;
use crate::shared::Shared;
use crate::value::{describe, unmarked};

/// Keys asked for in one `SCAN` page.
const SCAN_COUNT: usize = 2000;
/// Keys asked about in one pipeline (four commands each).
pub(super) const DETAIL_BATCH: usize = 1000;
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

/// One lock, as the nodes hold it.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct HeldLock {
    /// The resource.
    pub resource: String,
    /// The holder named in the value most nodes hold
    /// ([`RedlockBuilder::holder`](crate::RedlockBuilder::holder)); `None` for a lock
    /// being handed over to a queued waiter, or a value of another form.
    pub holder: Option<String>,
    /// A short id of that acquisition (a hash of its value), telling two acquisitions
    /// by the same holder apart.
    pub acquisition: String,
    /// A release reserved the lock for the next queued waiter, who has not taken it yet.
    pub handed_over: bool,
    /// Whether the nodes agree.
    pub agreement: Agreement,
    /// Nodes that hold the value most nodes hold.
    pub holding: usize,
    /// How long a majority still holds that value (the majority's shortest remaining
    /// TTL); `None` unless a majority holds it. The holder's own validity is a little
    /// shorter (the clock-drift allowance).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "validity_ms", serialize_with = "super::json::opt_ms")
    )]
    pub validity: Option<Duration>,
    /// The resource's fencing counter: the highest any node holds. At least the
    /// holder's token (a node may also have counted an attempt that lost, or a forced
    /// release raised it); the next holder's token is above it. `None` without fencing.
    pub fencing_token: Option<u64>,
    /// Waiters in the resource's wait queue (the longest queue among the nodes).
    pub waiters: u64,
    /// Each node's view, in configuration order.
    pub nodes: Vec<NodeLock>,
}

/// Whether the nodes agree on a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Agreement {
    /// A majority holds one value and no node holds another: the lock is held.
    Majority,
    /// Only a minority holds the value: the leftover of an attempt that lost (it is
    /// cleaned up at once, or expires), or of a lock that expired or was forgotten on
    /// the other nodes. Nobody holds the lock.
    Minority,
    /// Nodes hold different values: an attempt racing the holder, or a leftover beside
    /// a lock. Whoever holds a majority (see [`HeldLock::holding`]) holds the lock.
    Conflicting,
}

/// One node's view of one lock.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct NodeLock {
    /// The node's address.
    pub node: String,
    /// The node answered (`false`: it is in [`LockListing::failures`]).
    pub answered: bool,
    /// The node holds a value for the key.
    pub held: bool,
    /// The holder named in that value.
    pub holder: Option<String>,
    /// The short id of that value's acquisition.
    pub acquisition: Option<String>,
    /// That value is a hand-over placeholder.
    pub handed_over: bool,
    /// The key's remaining TTL on this node; `None` if it has none (not written by this
    /// library) or is not held.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "remaining_ms", serialize_with = "super::json::opt_ms")
    )]
    pub remaining: Option<Duration>,
    /// The fencing counter on this node.
    pub fencing_token: Option<u64>,
}

/// What one node said about one key.
#[derive(Debug, Clone, Default)]
struct Seen {
    value: Option<String>,
    remaining: Option<Duration>,
    fence: Option<u64>,
    waiters: u64,
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

/// One lock from every node's view of its key; `None` if no node holds it any more.
fn summarize(
    resource: &str,
    names: &[&str],
    seen: &[Option<&Seen>],
    quorum: usize,
) -> Option<HeldLock> {
    // Values by the number of nodes holding them (first seen wins a tie).
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for value in seen.iter().flatten().filter_map(|s| s.value.as_deref()) {
        match counts.iter_mut().find(|(v, _)| *v == value) {
            Some((_, n)) => *n += 1,
            None => counts.push((value, 1)),
        }
    }
    let (leading, holding) =
        counts
            .iter()
            .copied()
            .fold(None, |best: Option<(&str, usize)>, (v, n)| match best {
                Some((_, m)) if m >= n => best,
                _ => Some((v, n)),
            })?;
    let agreement = if counts.len() > 1 {
        Agreement::Conflicting
    } else if holding >= quorum {
        Agreement::Majority
    } else {
        Agreement::Minority
    };
    let validity = quorum_validity(
        seen.iter()
            .flatten()
            .filter(|s| s.value.as_deref() == Some(leading))
            .map(|s| s.remaining),
        quorum,
    );
    let info = describe(leading);
    let nodes = names
        .iter()
        .zip(seen)
        .map(|(name, seen)| {
            let described = seen.and_then(|s| s.value.as_deref()).map(describe);
            NodeLock {
                node: (*name).to_owned(),
                answered: seen.is_some(),
                held: described.is_some(),
                handed_over: described.as_ref().is_some_and(|d| d.handed_over),
                holder: described.as_ref().and_then(|d| d.holder.clone()),
                acquisition: described.map(|d| d.acquisition),
                remaining: seen.and_then(|s| s.remaining),
                fencing_token: seen.and_then(|s| s.fence),
            }
        })
        .collect();
    Some(HeldLock {
        resource: resource.to_owned(),
        holder: info.holder,
        acquisition: info.acquisition,
        handed_over: info.handed_over,
        agreement,
        holding,
        validity,
        fencing_token: seen.iter().flatten().filter_map(|s| s.fence).max(),
        waiters: seen.iter().flatten().map(|s| s.waiters).max().unwrap_or(0),
        nodes,
    })
}

/// How long a majority still holds a value, from the remaining TTL of each node holding
/// it (`None`: no TTL): the quorum-th longest; `None` unless a majority holds it (or
/// when that many have no TTL).
pub(super) fn quorum_validity(
    remaining: impl IntoIterator<Item = Option<Duration>>,
    quorum: usize,
) -> Option<Duration> {
    let mut left: Vec<Duration> = remaining
        .into_iter()
        .map(|r| r.unwrap_or(Duration::MAX))
        .collect();
    // The quorum-th longest: until then a majority still holds the value.
    left.sort_unstable_by(|a, b| b.cmp(a));
    left.get(quorum.checked_sub(1)?)
        .copied()
        .filter(|d| *d != Duration::MAX)
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

/// `s` with Redis glob's special characters escaped.
pub(super) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Counts per value, for the tests.
#[cfg(test)]
fn agreement_of(values: &[Option<&str>], quorum: usize) -> Option<(Agreement, usize)> {
    let seen: Vec<Seen> = values
        .iter()
        .map(|v| Seen {
            value: v.map(str::to_owned),
            remaining: Some(Duration::from_secs(1)),
            ..Seen::default()
        })
        .collect();
    let refs: Vec<Option<&Seen>> = seen.iter().map(Some).collect();
    let names = vec!["n"; values.len()];
    summarize("r", &names, &refs, quorum).map(|l| (l.agreement, l.holding))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement() {
        assert_eq!(
            agreement_of(&[Some("a"), Some("a"), None], 2),
            Some((Agreement::Majority, 2))
        );
        assert_eq!(
            agreement_of(&[Some("a"), None, None], 2),
            Some((Agreement::Minority, 1))
        );
        assert_eq!(
            agreement_of(&[Some("a"), Some("b"), Some("a")], 2),
            Some((Agreement::Conflicting, 2))
        );
        assert_eq!(agreement_of(&[None, None, None], 2), None);
    }

    #[test]
    fn validity_is_the_majoritys_shortest() {
        let seen: Vec<Seen> = [5, 1, 3]
            .iter()
            .map(|s| Seen {
                value: Some("h/x".into()),
                remaining: Some(Duration::from_secs(*s)),
                fence: Some(*s),
                waiters: 0,
            })
            .collect();
        let refs: Vec<Option<&Seen>> = seen.iter().map(Some).collect();
        let lock = summarize("r", &["a", "b", "c"], &refs, 2).unwrap();
        assert_eq!(lock.validity, Some(Duration::from_secs(3)));
        assert_eq!(lock.fencing_token, Some(5));
        assert_eq!(lock.holder.as_deref(), Some("h"));
    }

    #[test]
    fn glob_escaping() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("orders:{x}"), "orders:{x}");
    }
}
