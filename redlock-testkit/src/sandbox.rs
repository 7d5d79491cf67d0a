//! A replica in a box, to crash it like a process.
//!
//! A [`Sandbox`] has its own tokio runtime (its own worker thread) and its own proxies to
//! the cluster's servers. Whatever runs in it (a client, a scheduler) reaches Redis only
//! through those proxies and only lives on that runtime, so [`crash`](Sandbox::crash)
//! can do what `kill -9` does to a process: its links are cut first, then its runtime is
//! dropped with every task on it. Nothing gets a chance to release a lock.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use redlock_testkit::{Cluster, Sandbox};
//!
//! let cluster = Cluster::start(3).await;
//! let mut replica = Sandbox::start(&cluster).await;
//! let urls = replica.urls();
//! let answer = replica.run(async move { urls.len() }).await;
//! assert_eq!(answer, 3);
//! replica.crash();
//! assert!(replica.is_crashed());
//! # }
//! ```

use std::future::Future;
use std::net::SocketAddr;

use crate::{Cluster, Proxy};

/// A runtime and proxies of its own; see the module docs.
pub struct Sandbox {
    runtime: Option<tokio::runtime::Runtime>,
    proxies: Vec<Proxy>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("proxies", &self.proxies)
            .field("crashed", &self.is_crashed())
            .finish()
    }
}

impl Sandbox {
    /// A sandbox with one proxy per server of `cluster` (the proxies run on the caller's
    /// runtime, so they outlive a crash).
    pub async fn start(cluster: &Cluster) -> Self {
        let addrs: Vec<SocketAddr> = (0..cluster.len()).map(|i| cluster.node(i).addr()).collect();
        Self::start_with(&addrs).await
    }

    /// A sandbox with one proxy per server address.
    pub async fn start_with(servers: &[SocketAddr]) -> Self {
        let mut proxies = Vec::with_capacity(servers.len());
        for addr in servers {
            proxies.push(Proxy::start(*addr).await);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sandbox")
            .enable_all()
            .build()
            .expect("build the sandbox's runtime");
        Self {
            runtime: Some(runtime),
            proxies,
        }
    }

    /// The URLs to reach the servers from inside the sandbox.
    pub fn urls(&self) -> Vec<String> {
        self.proxies.iter().map(Proxy::url).collect()
    }

    /// The sandbox's proxy to server `i`.
    pub fn proxy(&self, i: usize) -> &Proxy {
        &self.proxies[i]
    }

    /// Runs `work` on the sandbox's runtime and waits for its output.
    ///
    /// # Panics
    ///
    /// If the sandbox has crashed, or `work` panicked or was dropped by a crash.
    pub async fn run<F, T>(&self, work: F) -> T
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let runtime = self.runtime.as_ref().expect("the sandbox has crashed");
        runtime
            .spawn(work)
            .await
            .expect("the sandboxed work completed")
    }

    /// Cuts every link, then drops the runtime and every task on it.
    pub fn crash(&mut self) {
        for proxy in &self.proxies {
            proxy.cut();
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// [`crash`](Self::crash) was called.
    pub fn is_crashed(&self) -> bool {
        self.runtime.is_none()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
