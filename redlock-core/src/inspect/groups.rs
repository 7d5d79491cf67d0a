//! Semaphores and read-write locks in a listing: the keys of one of them grouped under
//! its name, and the semaphores' size record.
//!
//! A semaphore `<name>` of `k` permits is `k` slot locks, ordinary locks on the
//! resources `<name>/permit/<i>`; its size `k`, known only to its clients, is recorded
//! by them in `<prefix>{<name>/permit}:size` (best effort, with a TTL of
//! [`SIZE_TTL`]). A read-write lock `<name>` has, for `W = <prefix>{<name>/rw}`:
//!
//! - `W`: the writer's key, an ordinary lock key;
//! - `W:reader:<value>`: one key per read lock, holding `<value>`, with its own TTL;
//! - `W:readers`: the set of the reader keys' names (dead names included: a reader
//!   is live while its key exists);
//! - `W:writer-waiting`: there while a writer waits (readers are refused): a string
//!   with a TTL, or the writers' queue (a sorted set) with their places' deadlines in
//!   `W:writer-waiting:until`, a writer waiting while its deadline is ahead;
//! - `W:fence`: the writer's fencing counter.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use redis::RedisResult;

use super::held::{HeldLock, quorum_validity};
use crate::client::Redlock;
use crate::error::NodeError;
use crate::node::Node;
use crate::shared::Shared;
use crate::value::describe;

/// How long a semaphore's size record lives after its last refresh (its clients
/// rewrite it at most once a day, on an acquisition).
pub const SIZE_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// How often one [`Semaphore`](crate::semaphore::Semaphore) (and its clones) rewrites its size
/// record, at most.
pub(crate) const SIZE_REFRESH: Duration = Duration::from_secs(24 * 3600);

/// The part of a slot's resource between the semaphore's name and the slot's index.
const PERMIT: &str = "/permit/";
/// The suffix of a read-write lock's writer resource.
const RW: &str = "/rw";

/// A semaphore with at least one slot key on a node, as the nodes hold it.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct HeldSemaphore {
    /// The semaphore's name (as given to [`Redlock::semaphore`]).
    pub name: String,
    /// Its number of permits, as its clients recorded it (the highest any node holds);
    /// `None` when no record was found (written by clients older than the record, or
    /// not acquired for [`SIZE_TTL`]).
    pub permits: Option<u32>,
    /// Permits in use: slots held on a majority of the nodes.
    pub used: u32,
    /// Every slot some node holds, by slot index (a slot held only by a minority is a
    /// leftover, not a permit in use: see [`HeldLock::agreement`]).
    pub slots: Vec<HeldSlot>,
}

/// One slot of a semaphore: an ordinary lock on `<name>/permit/<slot>`.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct HeldSlot {
    /// The slot's index (0 to permits - 1).
    pub slot: u32,
    /// The slot's lock: holder, validity, fencing counter, each node's view (in JSON,
    /// its fields sit beside `slot`).
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub lock: HeldLock,
}

impl HeldSlot {
    /// Whether the slot is held (a majority of the nodes holds its value): a permit in
    /// use.
    pub fn is_held(&self, quorum: usize) -> bool {
        self.lock.holding >= quorum
    }
}

/// A read-write lock with a writer key, a live reader or a waiting writer on some
/// node.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct HeldRwLock {
    /// The lock's name (its keys are under the resource `<name>/rw`).
    pub name: String,
    /// The writer's key as an ordinary lock (see [`HeldLock::agreement`]: held only
    /// with a majority); `None` when no node holds one.
    pub writer: Option<HeldLock>,
    /// The read locks live on a majority of the nodes (reader keys that exist), by
    /// holder.
    pub readers: Vec<HeldReader>,
    /// A writer waits (readers are refused meanwhile): its mark is on a majority of the
    /// nodes.
    pub writer_waiting: bool,
    /// The writer's fencing counter: the highest any node holds (`None` without
    /// fencing, or before any writer).
    pub fencing_token: Option<u64>,
}

/// One read lock of a [`HeldRwLock`].
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct HeldReader {
    /// The holder named in the read lock's value; `None` for a value of another form.
    pub holder: Option<String>,
    /// A short id of the acquisition (a hash of its value).
    pub acquisition: String,
    /// Nodes that hold the read lock.
    pub holding: usize,
    /// How long a majority still holds it (the majority's shortest remaining TTL).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "validity_ms", serialize_with = "super::json::opt_ms")
    )]
    pub validity: Option<Duration>,
}

/// `(name, slot)` of a slot resource `<name>/permit/<slot>`.
pub(super) fn slot_of(resource: &str) -> Option<(&str, u32)> {
    let (name, slot) = resource.rsplit_once(PERMIT)?;
    let canonical = !slot.is_empty()
        && slot.bytes().all(|b| b.is_ascii_digit())
        && (slot == "0" || !slot.starts_with('0'));
    if name.is_empty() || !canonical {
        return None;
    }
    Some((name, slot.parse().ok()?))
}

/// The name of a read-write lock's writer resource `<name>/rw`.
pub(super) fn rw_of(resource: &str) -> Option<&str> {
    resource.strip_suffix(RW).filter(|n| !n.is_empty())
}

/// `<prefix>{<name>/permit}:size`: a semaphore's size record.
pub(crate) fn size_key(shared: &Shared, name: &str) -> String {
    let mut key = shared.key(&format!("{name}/permit"));
    key.push_str(":size");
    key
}

/// `<prefix>{<name>/rw}`: a read-write lock's writer key, the stem of its other keys.
pub(super) fn rw_key(shared: &Shared, name: &str) -> String {
    shared.key(&format!("{name}{RW}"))
}

/// Writes a semaphore's size record on every node (best effort: a node that fails is
/// skipped; the record is for operators, nothing depends on it).
pub(crate) async fn record_size(redlock: Redlock, name: String, permits: u32) {
    let shared = redlock.shared();
    let cluster = &shared.cluster;
    let timeout = cluster.node_timeout.max(super::INSPECT_TIMEOUT);
    let mut pipe = redis::pipe();
    pipe.ignore_errors()
        .cmd("SET")
        .arg(size_key(shared, &name))
        .arg(permits)
        .arg("PX")
        .arg(u64::try_from(SIZE_TTL.as_millis()).unwrap_or(u64::MAX));
    let written = futures_util::future::join_all(cluster.nodes.iter().map(|node| async {
        let reply = node
            .pipeline(&pipe, false, "semaphore_size", timeout)
            .await?;
        super::only_reply(reply).map(drop)
    }))
    .await;
    for (node, result) in cluster.nodes.iter().zip(written) {
        if let Err(error) = result {
            tracing::debug!(semaphore = %name, node = node.name(), %error, "the semaphore's size record was not written on a node");
        }
    }
}

/// The listed locks, split into plain locks, semaphore slots (by semaphore name) and
/// read-write writers (by lock name). Slots and writers are taken out of the plain
/// locks only when their semaphore's or lock's name starts with `prefix` (a listing
/// under `orders/permit/` still shows `orders/permit/0` as a lock).
pub(super) struct Split {
    pub(super) locks: Vec<HeldLock>,
    pub(super) slots: BTreeMap<String, Vec<HeldSlot>>,
    pub(super) writers: BTreeMap<String, HeldLock>,
}

pub(super) fn split(all: Vec<HeldLock>, prefix: &str) -> Split {
    let mut split = Split {
        locks: Vec::with_capacity(all.len()),
        slots: BTreeMap::new(),
        writers: BTreeMap::new(),
    };
    for lock in all {
        if let Some((name, slot)) = slot_of(&lock.resource).filter(|(n, _)| n.starts_with(prefix)) {
            let name = name.to_owned();
            split
                .slots
                .entry(name)
                .or_default()
                .push(HeldSlot { slot, lock });
        } else if let Some(name) = rw_of(&lock.resource).filter(|n| n.starts_with(prefix)) {
            split.writers.insert(name.to_owned(), lock);
        } else {
            split.locks.push(lock);
        }
    }
    for slots in split.slots.values_mut() {
        slots.sort_by_key(|s| s.slot);
    }
    split
}

/// The glob of the side keys of the read-write locks whose names start with `prefix`
/// (`SCAN MATCH`), and the name of the lock a matching key belongs to, if it is the
/// readers' set or the waiting writer's mark (reader keys and fences are skipped).
pub(super) fn rw_pattern(key_start: &str, escaped_prefix: &str) -> String {
    format!("{}{escaped_prefix}*{RW}}}:*", super::glob_escape(key_start))
}

/// The read-write lock's name of a readers' set or waiting writer's mark key.
pub(super) fn rw_side_name<'k>(key_start: &str, key: &'k str) -> Option<&'k str> {
    let rest = key.strip_prefix(key_start)?;
    let resource = rest
        .strip_suffix("}:readers")
        .or_else(|| rest.strip_suffix("}:writer-waiting"))?;
    rw_of(resource)
}

/// Reads, on one node, a read-write lock's live readers (`KEYS[1]`: the readers' set)
/// and whether a writer waits (`KEYS[2]`: the waiting writers' mark, a string with a
/// TTL or a sorted set of writers; `KEYS[3]`: the sorted set of their places'
/// deadlines, in ms of the server's clock, if any). Returns `{waiting (0 or 1), value,
/// pttl, value, pttl, ...}`.
const LIVE_READERS: &str = r"
local waiting = 0
local kind = redis.call('TYPE', KEYS[2]).ok
if kind == 'string' then
  waiting = 1
elseif kind == 'zset' then
  if redis.call('EXISTS', KEYS[3]) == 1 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf') > 0 then
      waiting = 1
    end
  else
    waiting = 1
  end
end
local out = {waiting}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local value = redis.call('GET', key)
  if value then
    out[#out + 1] = value
    out[#out + 1] = redis.call('PTTL', key)
  end
end
return out
";

/// What one node holds of the groups: each semaphore's size record, and each
/// read-write lock's live readers (value, remaining TTL), waiting writer and fence.
#[derive(Debug, Default)]
pub(super) struct GroupView {
    sizes: Vec<Option<u32>>,
    rw: Vec<RwSeen>,
}

#[derive(Debug, Default)]
struct RwSeen {
    readers: Vec<(String, Option<Duration>)>,
    waiting: bool,
    fence: Option<u64>,
}

/// Asks `node` about the semaphores `semaphores` and read-write locks `rw` (one
/// pipeline per [`DETAIL_BATCH`](super::DETAIL_BATCH) of each).
pub(super) async fn detail(
    node: &Node,
    shared: &Shared,
    semaphores: &[String],
    rw: &[String],
    timeout: Duration,
) -> Result<GroupView, NodeError> {
    let mut view = GroupView::default();
    for names in semaphores.chunks(super::DETAIL_BATCH) {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for name in names {
            pipe.cmd("GET").arg(size_key(shared, name));
        }
        let replies = node.pipeline(&pipe, false, "inspect", timeout).await?;
        let mut replies = replies.into_iter();
        for _ in names {
            let size = replies
                .next()
                .and_then(RedisResult::ok)
                .and_then(|v| redis::from_redis_value::<Option<u32>>(v).ok().flatten());
            view.sizes.push(size);
        }
    }
    for names in rw.chunks(super::DETAIL_BATCH) {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for name in names {
            let w = rw_key(shared, name);
            pipe.cmd("EVAL")
                .arg(LIVE_READERS)
                .arg(3)
                .arg(format!("{w}:readers"))
                .arg(format!("{w}:writer-waiting"))
                .arg(format!("{w}:writer-waiting:until"));
            pipe.cmd("GET").arg(format!("{w}:fence"));
        }
        let replies = node.pipeline(&pipe, false, "inspect", timeout).await?;
        let mut replies = replies.into_iter();
        for _ in names {
            let mut next = || replies.next().and_then(RedisResult::ok);
            let reply = next()
                .and_then(|v| redis::from_redis_value::<Vec<redis::Value>>(v).ok())
                .unwrap_or_default();
            let waiting = reply
                .first()
                .and_then(|w| redis::from_redis_value::<u64>(w.clone()).ok())
                .unwrap_or(0)
                > 0;
            let readers = reply
                .get(1..)
                .unwrap_or_default()
                .chunks(2)
                .filter_map(|pair| {
                    let value = redis::from_redis_value::<String>(pair.first()?.clone()).ok()?;
                    let pttl = pair
                        .get(1)
                        .and_then(|p| redis::from_redis_value::<i64>(p.clone()).ok())
                        .filter(|ms| *ms >= 0)
                        .map(|ms| Duration::from_millis(ms.unsigned_abs()));
                    Some((value, pttl))
                })
                .collect();
            let fence = next()
                .and_then(|v| redis::from_redis_value::<Option<String>>(v).ok().flatten())
                .and_then(|f| f.parse().ok());
            view.rw.push(RwSeen {
                readers,
                waiting,
                fence,
            });
        }
    }
    Ok(view)
}

/// The semaphores, from their slots and every answering node's view (`views` in the
/// order of `names`).
pub(super) fn semaphores(
    slots: BTreeMap<String, Vec<HeldSlot>>,
    views: &[Option<GroupView>],
    quorum: usize,
) -> Vec<HeldSemaphore> {
    slots
        .into_iter()
        .enumerate()
        .map(|(i, (name, slots))| {
            let permits = views
                .iter()
                .flatten()
                .filter_map(|v| v.sizes.get(i).copied().flatten())
                .max();
            let used = slots.iter().filter(|s| s.is_held(quorum)).count();
            HeldSemaphore {
                name,
                permits,
                used: u32::try_from(used).unwrap_or(u32::MAX),
                slots,
            }
        })
        .collect()
}

/// The read-write locks `names` (sorted), from their writers and every answering
/// node's view; those with nothing live left out.
pub(super) fn rw_locks(
    names: &[String],
    mut writers: BTreeMap<String, HeldLock>,
    views: &[Option<GroupView>],
    quorum: usize,
) -> Vec<HeldRwLock> {
    names
        .iter()
        .enumerate()
        .filter_map(|(i, name)| {
            let seen: Vec<&RwSeen> = views.iter().flatten().filter_map(|v| v.rw.get(i)).collect();
            // Each reader's value, with the remaining TTL of every node holding it.
            let mut by_value: BTreeMap<&str, Vec<Option<Duration>>> = BTreeMap::new();
            for (value, left) in seen.iter().flat_map(|s| &s.readers) {
                by_value.entry(value.as_str()).or_default().push(*left);
            }
            let readers: Vec<HeldReader> = by_value
                .into_iter()
                .filter(|(_, left)| left.len() >= quorum)
                .map(|(value, left)| {
                    let info = describe(value);
                    HeldReader {
                        holder: info.holder,
                        acquisition: info.acquisition,
                        holding: left.len(),
                        validity: quorum_validity(left, quorum),
                    }
                })
                .collect();
            let writer_waiting = seen.iter().filter(|s| s.waiting).count() >= quorum;
            let writer = writers.remove(name);
            let fencing_token = seen
                .iter()
                .filter_map(|s| s.fence)
                .chain(writer.as_ref().and_then(|w| w.fencing_token))
                .max();
            (writer.is_some() || !readers.is_empty() || writer_waiting).then(|| HeldRwLock {
                name: name.clone(),
                writer,
                readers,
                writer_waiting,
                fencing_token,
            })
        })
        .collect()
}

/// Every name of `a` and `b`, sorted, at most `limit`; and whether some were cut.
pub(super) fn names_within(
    a: impl IntoIterator<Item = String>,
    b: impl IntoIterator<Item = String>,
    limit: usize,
) -> (Vec<String>, bool) {
    let all: BTreeSet<String> = a.into_iter().chain(b).collect();
    let truncated = all.len() > limit;
    (all.into_iter().take(limit).collect(), truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_rw_names() {
        assert_eq!(slot_of("api/permit/2"), Some(("api", 2)));
        assert_eq!(slot_of("a/permit/b/permit/10"), Some(("a/permit/b", 10)));
        assert_eq!(slot_of("api/permit/02"), None);
        assert_eq!(slot_of("api/permit/"), None);
        assert_eq!(slot_of("/permit/1"), None);
        assert_eq!(slot_of("api/permit/x"), None);
        assert_eq!(rw_of("doc/rw"), Some("doc"));
        assert_eq!(rw_of("/rw"), None);
        assert_eq!(rw_of("doc"), None);
        assert_eq!(
            rw_side_name("redlock:{", "redlock:{doc/rw}:readers"),
            Some("doc")
        );
        assert_eq!(
            rw_side_name("redlock:{", "redlock:{doc/rw}:writer-waiting"),
            Some("doc")
        );
        assert_eq!(rw_side_name("redlock:{", "redlock:{doc/rw}:fence"), None);
        assert_eq!(
            rw_side_name("redlock:{", "redlock:{doc/rw}:reader:h/00"),
            None
        );
        assert_eq!(rw_pattern("redlock:{", "d"), "redlock:{d*/rw}:*");
    }
}
