//! Lock clients over the kit's clusters (feature `redlock-core`).

use std::time::Duration;

use redlock_core::{Redlock, RedlockBuilder, RetryPolicy};

use crate::Cluster;

/// A [`RedlockBuilder`] for the nodes of `cluster` (its [`urls`](Cluster::urls):
/// the proxies' when it is proxied), with the restart quarantine off: the kit's nodes
/// are seconds old, so with it none would vote for the first TTL (up to 10 minutes).
/// Everything else is the library's default, so that a test states what it depends on
/// on top of it (a TTL, a node timeout, a retry policy, fencing, a holder name).
///
/// For a client that waits patiently for contended locks, see [`client`].
///
/// ```
/// use std::time::Duration;
/// use redlock_testkit::Cluster;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cluster = Cluster::start(3).await;
/// let redlock = redlock_testkit::builder(&cluster)
///     .fencing(true)
///     .ttl(Duration::from_secs(5))
///     .build()
///     .unwrap();
/// let lock = redlock.try_lock("order:42").await.unwrap();
/// assert!(lock.fencing_token().is_some());
/// assert!(lock.release().await.unwrap().was_held());
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "redlock-core")))]
pub fn builder(cluster: &Cluster) -> RedlockBuilder {
    builder_for(cluster.urls())
}

/// [`builder`] over the nodes at `urls` (a subset of a cluster's nodes, the nodes of
/// two clusters, an unreachable address among them).
#[cfg_attr(docsrs, doc(cfg(feature = "redlock-core")))]
pub fn builder_for<I, S>(urls: I) -> RedlockBuilder
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    Redlock::builder().nodes(urls).restart_quarantine(false)
}

/// A client over `cluster` ([`builder`]) with a per-node timeout, a 5 s TTL and a
/// patient retry policy (20 s, retries 1–5 ms apart).
#[cfg_attr(docsrs, doc(cfg(feature = "redlock-core")))]
pub fn client(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    client_for(cluster.urls(), node_timeout)
}

/// [`client`] over the nodes at `urls`.
#[cfg_attr(docsrs, doc(cfg(feature = "redlock-core")))]
pub fn client_for(urls: Vec<String>, node_timeout: Duration) -> Redlock {
    builder_for(urls)
        .node_timeout(node_timeout)
        .ttl(Duration::from_secs(5))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(20))
                .with_delay(Duration::from_millis(1), Duration::from_millis(5)),
        )
        .build()
        .expect("valid configuration")
}

/// One uncontended lock and release of `resource`, which must both succeed.
#[cfg_attr(docsrs, doc(cfg(feature = "redlock-core")))]
pub async fn cycle(redlock: &Redlock, resource: &str) {
    let lock = redlock.try_lock(resource).await.expect("lock");
    assert!(lock.release().await.expect("release").was_held());
}
