//! Lock clients over the kit's clusters (feature `redlock-core`).

use std::time::Duration;

use redlock_core::{Redlock, RetryPolicy};

use crate::Cluster;

/// A client over `cluster` with a per-node timeout, a 5 s TTL and a patient retry
/// policy (20 s, retries 1–5 ms apart). The restart quarantine is off: the kit's nodes
/// are seconds old, so with it none would vote for the first TTL.
pub fn client(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    client_for(cluster.urls(), node_timeout)
}

/// [`client`] over the nodes at `urls`.
pub fn client_for(urls: Vec<String>, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .restart_quarantine(false)
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
pub async fn cycle(redlock: &Redlock, resource: &str) {
    let lock = redlock.try_lock(resource).await.expect("lock");
    assert!(lock.release().await.expect("release").was_held());
}
