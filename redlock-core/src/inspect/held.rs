//! One lock as the nodes hold it: each node's view of its key, and what they make
//! together (the value most nodes hold, whether they agree, how long a majority still
//! holds it).

use std::time::Duration;

use crate::value::describe;

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
    /// The node answered (`false`: it is in [`LockListing::failures`](super::LockListing::failures)).
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
pub(super) struct Seen {
    pub(super) value: Option<String>,
    pub(super) remaining: Option<Duration>,
    pub(super) fence: Option<u64>,
    pub(super) waiters: u64,
}

/// One lock from every node's view of its key; `None` if no node holds it any more.
pub(super) fn summarize(
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
}
