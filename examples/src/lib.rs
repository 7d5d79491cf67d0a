//! Shared plumbing of the example programs: where the Redis nodes come from.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Without REDLOCK_NODES: local redis-server processes, stopped when dropped.
//! let nodes = redlock_examples::Nodes::from_env_or_start(1).await;
//! assert!(!nodes.urls().is_empty());
//! # }
//! ```

// The README's and docs/' snippets compile without warnings, as the code does (a
// snippet may define what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

/// Redis nodes for an example: the URLs in `REDLOCK_NODES` (comma-separated), or `n`
/// local `redis-server` processes started for the run (stopped when the value drops).
pub enum Nodes {
    /// Nodes listed in `REDLOCK_NODES`.
    External(Vec<String>),
    /// Nodes started by this program.
    Local(redlock_testkit::Cluster),
}

impl Nodes {
    /// Reads `REDLOCK_NODES`, or starts `n` local nodes.
    pub async fn from_env_or_start(n: usize) -> Self {
        match std::env::var("REDLOCK_NODES") {
            Ok(list) if !list.trim().is_empty() => Self::External(
                list.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            ),
            _ => Self::Local(redlock_testkit::Cluster::start(n).await),
        }
    }

    /// The node URLs.
    pub fn urls(&self) -> Vec<String> {
        match self {
            Self::External(urls) => urls.clone(),
            Self::Local(cluster) => cluster.urls(),
        }
    }

    /// The nodes' socket addresses (for proxies in front of them: plain `redis://`
    /// nodes only).
    pub fn addrs(&self) -> Vec<std::net::SocketAddr> {
        use std::net::ToSocketAddrs;
        match self {
            Self::Local(cluster) => (0..cluster.len()).map(|i| cluster.node(i).addr()).collect(),
            Self::External(urls) => urls
                .iter()
                .filter_map(|url| {
                    let info =
                        redis::IntoConnectionInfo::into_connection_info(url.as_str()).ok()?;
                    match info.addr() {
                        redis::ConnectionAddr::Tcp(host, port) => {
                            (host.as_str(), *port).to_socket_addrs().ok()?.next()
                        }
                        _ => None,
                    }
                })
                .collect(),
        }
    }

    /// Where the nodes come from, for a banner.
    pub fn describe(&self) -> String {
        match self {
            Self::External(urls) => format!("{} nodes from REDLOCK_NODES", urls.len()),
            Self::Local(cluster) => format!("{} local redis-server nodes", cluster.len()),
        }
    }
}

/// Waits until a majority of `redlock`'s nodes vote, or exits the program with status 1
/// and a message naming each node that cannot, as configured (host and port, no
/// credentials). Unreachable or misconfigured nodes are reported within the connect
/// timeout ([`redlock_core::builder::CONNECT_TIMEOUT`]); nodes that only sit in restart quarantine
/// (started less than the max TTL ago, as local nodes started for a run do) are waited
/// for until it ends.
pub async fn wait_until_ready(redlock: &redlock_core::Redlock) {
    let started = std::time::Instant::now();
    let result = match redlock
        .wait_ready(redlock_core::builder::CONNECT_TIMEOUT)
        .await
    {
        Err(redlock_core::Error::NotReady {
            ready,
            needed,
            failures,
            ..
        }) if ready + quarantined(&failures).0 >= needed => {
            let left = quarantined(&failures).1;
            println!(
                "  nodes started moments ago are in restart quarantine (up for less than the max TTL): waiting up to {:.1} s",
                left.as_secs_f64()
            );
            let result = redlock
                .wait_ready(left + redlock_core::builder::CONNECT_TIMEOUT)
                .await;
            if result.is_ok() {
                println!(
                    "  quorum ready after {:.1} s",
                    started.elapsed().as_secs_f64()
                );
            }
            result
        }
        other => other,
    };
    if let Err(err) = result {
        eprintln!("error: the Redis nodes are not usable: {err}");
        std::process::exit(1);
    }
}

/// How many of `failures` are restart quarantines, and the longest left.
fn quarantined(failures: &[redlock_core::error::NodeFailure]) -> (usize, std::time::Duration) {
    failures
        .iter()
        .filter_map(|f| match f.cause {
            redlock_core::error::NodeError::Quarantined(left) => Some(left),
            _ => None,
        })
        .fold((0, std::time::Duration::ZERO), |(n, longest), left| {
            (n + 1, longest.max(left))
        })
}

/// Logs to stderr at `RUST_LOG`'s level (default: warnings).
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
}

/// What the benchmark programs measure with (CPU time of this process and of the Redis
/// servers, the floor and minimal Redlock cycles, interleaved closed loops): the test
/// kit's, shared with its `cost` program.
pub use redlock_testkit::measure;

/// A metrics recorder that can be switched on and off while a program runs, for
/// measuring what recording costs in one run (see the `bench` program).
pub mod metered {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };
    use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};

    /// Passes everything to a Prometheus recorder while on; drops everything while off
    /// (each handle it hands out checks the switch: the cost of "off" is that check).
    pub struct Switch {
        on: Arc<AtomicBool>,
        inner: PrometheusRecorder,
    }

    /// Turns a installed [`Switch`] on and off, and renders what it recorded.
    #[derive(Clone)]
    pub struct SwitchHandle {
        on: Arc<AtomicBool>,
        prometheus: PrometheusHandle,
    }

    impl SwitchHandle {
        /// Records (`true`) or drops (`false`) from now on.
        pub fn set(&self, on: bool) {
            self.on.store(on, Ordering::Relaxed);
        }

        /// The Prometheus text page of what was recorded.
        pub fn render(&self) -> String {
            self.prometheus.render()
        }
    }

    /// Installs a [`Switch`] as the global recorder, off.
    ///
    /// # Errors
    ///
    /// When a global recorder is installed already.
    pub fn install() -> Result<SwitchHandle, metrics::SetRecorderError<Switch>> {
        let inner = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = SwitchHandle {
            on: Arc::new(AtomicBool::new(false)),
            prometheus: inner.handle(),
        };
        metrics::set_global_recorder(Switch {
            on: Arc::clone(&handle.on),
            inner,
        })?;
        Ok(handle)
    }

    /// A handle that records through `inner` only while the switch is on (the library
    /// keeps its handles, so the switch must sit in each one).
    struct Switched<H> {
        on: Arc<AtomicBool>,
        inner: H,
    }

    impl metrics::CounterFn for Switched<Counter> {
        fn increment(&self, value: u64) {
            if self.on.load(Ordering::Relaxed) {
                self.inner.increment(value);
            }
        }

        fn absolute(&self, value: u64) {
            if self.on.load(Ordering::Relaxed) {
                self.inner.absolute(value);
            }
        }
    }

    impl metrics::GaugeFn for Switched<Gauge> {
        fn increment(&self, value: f64) {
            if self.on.load(Ordering::Relaxed) {
                self.inner.increment(value);
            }
        }

        fn decrement(&self, value: f64) {
            if self.on.load(Ordering::Relaxed) {
                self.inner.decrement(value);
            }
        }

        fn set(&self, value: f64) {
            if self.on.load(Ordering::Relaxed) {
                self.inner.set(value);
            }
        }
    }

    impl metrics::HistogramFn for Switched<Histogram> {
        fn record(&self, value: f64) {
            if self.on.load(Ordering::Relaxed) {
                self.inner.record(value);
            }
        }
    }

    impl Recorder for Switch {
        fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
            self.inner.describe_counter(key, unit, description);
        }

        fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
            self.inner.describe_gauge(key, unit, description);
        }

        fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
            self.inner.describe_histogram(key, unit, description);
        }

        fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(Switched {
                on: Arc::clone(&self.on),
                inner: self.inner.register_counter(key, metadata),
            }))
        }

        fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(Arc::new(Switched {
                on: Arc::clone(&self.on),
                inner: self.inner.register_gauge(key, metadata),
            }))
        }

        fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(Arc::new(Switched {
                on: Arc::clone(&self.on),
                inner: self.inner.register_histogram(key, metadata),
            }))
        }
    }
}

/// A write log in a SQLite file shared by an example's replicas, written through a
/// [`SqlFence`](redlock_fence::SqlFence): each write's fence check, its row and the
/// token's raise commit together, or not at all.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use redlock_examples::fenced::WriteLog;
///
/// let dir = tempfile::tempdir()?;
/// let log = WriteLog::create(&dir.path().join("writes.db")).await?;
/// log.record("order:1", 5, "pay", "a").await?;
/// assert!(log.record("order:1", 4, "pay", "b").await.is_err()); // stale: refused
/// assert_eq!(log.rows().await?, 1);
/// assert!(log.not_rising().await?.is_empty());
/// # Ok(())
/// # }
/// ```
pub mod fenced {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use redlock_fence::{FenceError, SqlFence};
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

    /// The log, and what its fenced writes gave.
    pub struct WriteLog {
        pool: SqlitePool,
        fence: SqlFence,
        committed: AtomicUsize,
        refused: Mutex<Vec<String>>,
    }

    impl WriteLog {
        /// A log in the SQLite file `path` (created), with the fence table.
        ///
        /// # Errors
        ///
        /// The database's.
        pub async fn create(path: &std::path::Path) -> Result<Self, FenceError> {
            let options = SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true);
            // One connection: SQLite runs one write transaction at a time anyway.
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await?;
            let fence = SqlFence::new();
            fence.migrate(&pool).await?;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS writes (
                    seq INTEGER PRIMARY KEY AUTOINCREMENT,
                    resource TEXT NOT NULL,
                    what TEXT NOT NULL,
                    replica TEXT NOT NULL,
                    token BIGINT NOT NULL
                )",
            )
            .execute(&pool)
            .await?;
            Ok(Self {
                pool,
                fence,
                committed: AtomicUsize::new(0),
                refused: Mutex::new(Vec::new()),
            })
        }

        /// Records `what` by `replica` under the lock on `resource`, fenced by its
        /// `token`.
        ///
        /// # Errors
        ///
        /// [`FenceError::Stale`] (kept, see [`refused`](Self::refused)) when a newer
        /// holder wrote; the database's.
        pub async fn record(
            &self,
            resource: &str,
            token: u64,
            what: &str,
            replica: &str,
        ) -> Result<(), FenceError> {
            let mut tx = self.pool.begin().await?;
            if let Err(refused) = self.fence.check(&mut *tx, resource, token).await {
                tx.rollback().await?;
                if matches!(refused, FenceError::Stale { .. }) {
                    let mut reasons = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                    reasons.push(refused.to_string());
                }
                return Err(refused);
            }
            sqlx::query(
                "INSERT INTO writes (resource, what, replica, token) VALUES ($1, $2, $3, $4)",
            )
            .bind(resource)
            .bind(what)
            .bind(replica)
            .bind(i64::try_from(token).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            self.committed.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }

        /// How many writes committed.
        pub fn committed(&self) -> usize {
            self.committed.load(Ordering::SeqCst)
        }

        /// Why each refused write was refused.
        pub fn refused(&self) -> Vec<String> {
            self.refused
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        }

        /// Resources whose committed writes do not carry rising tokens, in commit order
        /// (each request holds a lock of its own, so each write has a new token).
        ///
        /// # Errors
        ///
        /// The database's.
        pub async fn not_rising(&self) -> Result<Vec<String>, sqlx::Error> {
            let rows: Vec<(String, i64)> =
                sqlx::query_as("SELECT resource, token FROM writes ORDER BY seq")
                    .fetch_all(&self.pool)
                    .await?;
            let mut last: HashMap<String, i64> = HashMap::new();
            let mut bad = Vec::new();
            for (resource, token) in rows {
                if last.get(&resource).is_some_and(|&before| token <= before)
                    && !bad.contains(&resource)
                {
                    bad.push(resource.clone());
                }
                last.insert(resource, token);
            }
            Ok(bad)
        }

        /// Prints what the fenced writes gave, and checks it against the requests
        /// answered 200 (`answered_ok`): every one is one committed write and one row,
        /// and each resource's writes carry rising tokens. The problem, if any.
        ///
        /// # Errors
        ///
        /// The database's.
        pub async fn report(&self, answered_ok: usize) -> Result<Option<String>, sqlx::Error> {
            let (committed, refused) = (self.committed(), self.refused());
            println!(
                "fenced writes: {committed} committed, {} refused as stale",
                refused.len()
            );
            for reason in &refused {
                println!("  refused: {reason}");
            }
            let rows = self.rows().await?;
            if committed != answered_ok || usize::try_from(rows).ok() != Some(committed) {
                return Ok(Some(format!(
                    "{answered_ok} requests answered 200, {committed} fenced writes committed, {rows} rows in the table: they should all be equal"
                )));
            }
            let not_rising = self.not_rising().await?;
            if !not_rising.is_empty() {
                return Ok(Some(format!(
                    "written without rising tokens: {not_rising:?}"
                )));
            }
            println!(
                "every 200 is one committed write; each resource's writes carry rising tokens"
            );
            Ok(None)
        }

        /// The rows in the log.
        ///
        /// # Errors
        ///
        /// The database's.
        pub async fn rows(&self) -> Result<i64, sqlx::Error> {
            sqlx::query_scalar("SELECT COUNT(*) FROM writes")
                .fetch_one(&self.pool)
                .await
        }
    }
}

/// The Rust snippets of the root README, of the repository's own docs (ARCHITECTURE.md,
/// DEVELOPMENT.md) and of redlock-idempotency's README, compiled (and the ones that need
/// no server run) as doctests: `cargo test -p redlock-examples --doc`. The guides are
/// compiled by the crates that publish them (each crate's `guides/`).
#[cfg(doctest)]
pub mod docs {
    #[doc = include_str!("../../README.md")]
    pub struct Readme;
    #[doc = include_str!("../../docs/ARCHITECTURE.md")]
    pub struct Architecture;
    #[doc = include_str!("../../docs/DEVELOPMENT.md")]
    pub struct Development;
    /// The crate README's example needs the tower layer, which the crate itself cannot
    /// depend on: compiled here.
    #[doc = include_str!("../../redlock-idempotency/README.md")]
    pub struct IdempotencyReadme;
}
