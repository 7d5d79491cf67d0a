//! What the benchmark programs measure with: the cycles they compare, closed loops of
//! them interleaved in slices, CPU time (this process, the Redis servers), and how
//! results are printed.
//!
//! The cycles, each over one multiplexed connection per node:
//! - [`floor_cycle`]: two rounds of `PING` to every node, waiting for all of them,
//!   what any client of a two-round-trip protocol needs at least;
//! - [`minimal_cycle`]: the minimal Redlock, `SET NX PX` with a random 128-bit value on
//!   every node, then a compare-and-delete script on every node (no queue, no checks);
//! - [`lock_cycle`] (feature `redlock-core`): `try_lock` and `release` of the library.
//!
//! [`interleave`] runs workloads in alternating slices, so that machine noise hits all
//! alike, and adds up each one's cycles and the CPU time spent on them by this process
//! and by the servers: a ratio of CPU times per cycle measured in one run holds on any
//! machine, however loaded.
//!
//! ```no_run
//! # #[tokio::main]
//! # async fn main() -> Result<(), redlock_testkit::measure::OpError> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use redlock_testkit::{Cluster, measure};
//!
//! let cluster = Cluster::start(5).await;
//! let conns = Arc::new(measure::connect(&cluster.urls()).await?);
//! let slice = Duration::from_millis(500);
//! let tallies = measure::interleave(&["floor", "minimal"], 3, &conns, async |w| {
//!     let conns = Arc::clone(&conns);
//!     measure::closed_loop(8, slice, move |client, i| {
//!         let conns = Arc::clone(&conns);
//!         async move {
//!             match w {
//!                 "floor" => measure::floor_cycle(&conns).await,
//!                 _ => measure::minimal_cycle(&conns, &format!("k:{client}:{i}")).await,
//!             }
//!         }
//!     })
//!     .await
//! })
//! .await?;
//! println!("{}", measure::header("workload"));
//! for (w, mut tally) in ["floor", "minimal"].into_iter().zip(tallies) {
//!     println!("{}", tally.row(w));
//! }
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use futures_util::future::try_join_all;
use redis::aio::MultiplexedConnection;

/// An operation's error, as the benchmark clients report it.
pub type OpError = Box<dyn std::error::Error + Send + Sync>;

/// CPU time (user + system) of this process so far, from /proc (0 where unavailable).
pub fn process_cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may contain spaces): utime is the 12th.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0 // USER_HZ is 100 on Linux
}

/// CPU time (user + system) of all the Redis servers so far, from `INFO cpu`.
pub async fn servers_cpu_secs(conns: &[MultiplexedConnection]) -> f64 {
    let mut total = 0.0;
    for conn in conns {
        let mut conn = conn.clone();
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        for line in info.lines() {
            if let Some((name, value)) = line.split_once(':')
                && (name == "used_cpu_user" || name == "used_cpu_sys")
            {
                total += value.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    total
}

/// Sorts `samples` and returns their `q` quantiles (0.5 for the median), in order.
pub fn quantiles<const N: usize>(samples: &mut [Duration], q: [f64; N]) -> [Duration; N] {
    samples.sort_unstable();
    q.map(|q| {
        let idx = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(idx).copied().unwrap_or_default()
    })
}

/// A closed loop: `clients` tasks, each running `op(client, i)` for i = 0, 1, ...
/// back to back until `run` is over. Returns every operation's duration and the
/// time it all took; the first error ends the measurement.
pub async fn closed_loop<F, Fut>(
    clients: usize,
    run: Duration,
    op: F,
) -> Result<(Vec<Duration>, Duration), OpError>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), OpError>> + Send + 'static,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let deadline = started + run;
    let mut tasks = Vec::with_capacity(clients);
    for client in 0..clients {
        let op = Arc::clone(&op);
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut i: u64 = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                op(client, i).await?;
                samples.push(t.elapsed());
                i += 1;
            }
            Ok::<_, OpError>(samples)
        }));
    }
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await??);
    }
    Ok((samples, started.elapsed()))
}

/// One multiplexed connection to each node at `urls`, in order: what the floor and the
/// minimal Redlock run over (the library keeps the same kind), and what
/// [`servers_cpu_secs`] asks.
///
/// # Errors
///
/// A URL that does not parse, or a node that does not answer.
pub async fn connect(urls: &[String]) -> redis::RedisResult<Vec<MultiplexedConnection>> {
    let mut conns = Vec::with_capacity(urls.len());
    for url in urls {
        conns.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    Ok(conns)
}

/// The floor's cycle: two rounds of `PING` to every node, each round waiting for every
/// node.
///
/// # Errors
///
/// The first node's error.
pub async fn floor_cycle(conns: &[MultiplexedConnection]) -> Result<(), OpError> {
    for _ in 0..2 {
        try_join_all(conns.iter().map(|c| {
            let mut c = c.clone();
            async move { redis::cmd("PING").query_async::<String>(&mut c).await }
        }))
        .await?;
    }
    Ok(())
}

/// The TTL of the minimal Redlock's keys (each is deleted in the same cycle).
pub const MINIMAL_TTL: Duration = Duration::from_secs(10);

/// The minimal Redlock's release: compare-and-delete, nothing else.
static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

/// The minimal Redlock's cycle on `key`: `SET key value NX PX` ([`MINIMAL_TTL`]) with a
/// [`random_value`] on every node, waiting for all, then the compare-and-delete script
/// on every node, waiting for all. What the algorithm itself costs: no validity
/// arithmetic, no queue, no wake-up, no checks of the answers.
///
/// # Errors
///
/// The first node's error.
pub async fn minimal_cycle(conns: &[MultiplexedConnection], key: &str) -> Result<(), OpError> {
    let value = random_value();
    let ttl_ms = MINIMAL_TTL.as_millis() as u64;
    try_join_all(conns.iter().map(|c| {
        let mut c = c.clone();
        let value = &value;
        async move {
            redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query_async::<Option<String>>(&mut c)
                .await
        }
    }))
    .await?;
    try_join_all(conns.iter().map(|c| {
        let mut c = c.clone();
        let value = &value;
        async move {
            RELEASE
                .key(key)
                .arg(value)
                .invoke_async::<i64>(&mut c)
                .await
        }
    }))
    .await?;
    Ok(())
}

/// A lock value as a minimal Redlock makes one: 128 random bits in hex.
pub fn random_value() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The library's cycle on `resource`: `try_lock`, then `release`.
///
/// # Errors
///
/// The lock's: refused (the resource is held, or no quorum) or a release that failed.
#[cfg(feature = "redlock-core")]
#[cfg_attr(docsrs, doc(cfg(feature = "redlock-core")))]
pub async fn lock_cycle(redlock: &redlock_core::Redlock, resource: String) -> Result<(), OpError> {
    let lock = redlock.try_lock(resource).await?;
    lock.release().await?;
    Ok(())
}

/// A client over `urls` with the library's defaults, restart quarantine included, and
/// `ttl` as its TTL and max TTL (so the quarantine of fresh nodes lasts that long),
/// returned once a majority of its nodes can vote.
///
/// # Errors
///
/// An invalid configuration; [`redlock_core::Error::NotReady`] when no majority can
/// vote within the max TTL and a connect timeout.
#[cfg(feature = "redlock-core")]
#[cfg_attr(docsrs, doc(cfg(feature = "redlock-core")))]
pub async fn ready_client(
    urls: Vec<String>,
    ttl: Duration,
) -> Result<redlock_core::Redlock, OpError> {
    let redlock = redlock_core::Redlock::builder()
        .nodes(urls)
        .ttl(ttl)
        .max_ttl(ttl)
        .build()?;
    redlock
        .wait_ready(redlock.max_ttl() + redlock_core::builder::CONNECT_TIMEOUT)
        .await?;
    Ok(redlock)
}

/// What a workload's slices added up to in [`interleave`].
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Every cycle's duration.
    pub samples: Vec<Duration>,
    /// The wall time of the slices.
    pub spent: Duration,
    /// This process's CPU time during the slices, in seconds.
    pub client_cpu: f64,
    /// All the servers' CPU time during the slices, in seconds.
    pub server_cpu: f64,
}

impl Tally {
    /// How many cycles ran.
    pub fn cycles(&self) -> usize {
        self.samples.len()
    }

    /// Cycles per second of wall time.
    pub fn cycles_per_sec(&self) -> f64 {
        self.cycles() as f64 / self.spent.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// This process's CPU time per cycle, in microseconds.
    pub fn client_us(&self) -> f64 {
        self.client_cpu / self.cycles().max(1) as f64 * 1e6
    }

    /// The servers' CPU time per cycle, in microseconds.
    pub fn server_us(&self) -> f64 {
        self.server_cpu / self.cycles().max(1) as f64 * 1e6
    }

    /// The cycles' median and 99th percentile (sorts the samples).
    pub fn p50_p99(&mut self) -> (Duration, Duration) {
        let [p50, p99] = quantiles(&mut self.samples, [0.50, 0.99]);
        (p50, p99)
    }

    /// A line of the table under [`header`]: `label`, cycles/s, p50, p99, and the CPU
    /// time per cycle of this process and of the servers.
    pub fn row(&mut self, label: &str) -> String {
        let (p50, p99) = self.p50_p99();
        format!(
            "{label:<46} {:>10.0} {:>10} {:>10} {:>8.1} {:>8.1}",
            self.cycles_per_sec(),
            fmt_us(p50),
            fmt_us(p99),
            self.client_us(),
            self.server_us()
        )
    }
}

/// The heading of a table of [`Tally::row`]s, `first` over the labels, and a line that
/// says what the CPU columns are.
pub fn header(first: &str) -> String {
    format!(
        "{first:<46} {:>10} {:>10} {:>10} {:>8} {:>8}\n(cli us / srv us: CPU time per cycle of this process / of all the Redis servers)",
        "cycles/s", "p50", "p99", "cli us", "srv us"
    )
}

/// Runs `run(workload)` (one slice of it, a [`closed_loop`] as a rule) for each of
/// `workloads` in turn, `rounds` times over, so that machine noise hits all alike; each
/// slice's CPU time is read before and after it, from this process and from the
/// servers behind `conns`. Returns one [`Tally`] per workload, in order.
///
/// # Errors
///
/// The first slice's error.
pub async fn interleave<W: Copy>(
    workloads: &[W],
    rounds: u32,
    conns: &[MultiplexedConnection],
    mut run: impl AsyncFnMut(W) -> Result<(Vec<Duration>, Duration), OpError>,
) -> Result<Vec<Tally>, OpError> {
    let mut tallies = vec![Tally::default(); workloads.len()];
    for _ in 0..rounds {
        for (tally, workload) in tallies.iter_mut().zip(workloads) {
            let (c0, s0) = (process_cpu_secs(), servers_cpu_secs(conns).await);
            let (samples, elapsed) = run(*workload).await?;
            tally.client_cpu += process_cpu_secs() - c0;
            tally.server_cpu += servers_cpu_secs(conns).await - s0;
            tally.samples.extend(samples);
            tally.spent += elapsed;
        }
    }
    Ok(tallies)
}

/// "met" or "MISSED", for a target.
pub fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// A duration in microseconds.
pub fn fmt_us(d: Duration) -> String {
    format!("{} us", d.as_micros())
}
