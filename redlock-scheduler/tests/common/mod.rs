//! Scheduler replicas for the integration tests: each in a sandbox of its own, so that
//! "killing" one is a crash (links cut, tasks dropped, nothing released).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redlock_scheduler::admin::Dispatched;
use redlock_scheduler::history::{HistoryBuilder, Outcome, Run};
use redlock_scheduler::{History, Job, JobContext, Scheduler, SchedulerBuilder};
use redlock_testkit::{Cluster, Sandbox};

pub const LEADER_TTL: Duration = Duration::from_secs(2);
pub const RETRY: Duration = Duration::from_millis(100);

/// The independent record: which replicas ran each tick (by the handler itself).
#[derive(Default)]
pub struct Ticks(pub Mutex<HashMap<i64, Vec<String>>>);

impl Ticks {
    pub fn record(&self, ctx: &JobContext) {
        self.0
            .lock()
            .unwrap()
            .entry(ctx.tick().timestamp_millis())
            .or_default()
            .push(ctx.instance().to_owned());
    }

    pub fn snapshot(&self) -> HashMap<i64, Vec<String>> {
        self.0.lock().unwrap().clone()
    }
}

/// A job that records its tick, then works for `work`.
pub fn counting_job(name: &str, expression: &str, ticks: &Arc<Ticks>, work: Duration) -> Job {
    let ticks = Arc::clone(ticks);
    Job::new(name, expression, move |ctx: JobContext| {
        let ticks = Arc::clone(&ticks);
        async move {
            ticks.record(&ctx);
            tokio::select! {
                () = tokio::time::sleep(work) => Ok(()),
                () = ctx.cancelled() => Err("cancelled".to_owned()),
            }
        }
    })
}

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        rand::random::<u32>() & 0xffff
    )
}

/// A history at `url` in tables of its own (a unique prefix from `tag`), with a table
/// `<prefix>effects` of `columns` beside it for the jobs' writes: (history, prefix,
/// effects table).
pub async fn own_history(url: &str, tag: &str, columns: &str) -> (History, String, String) {
    let prefix = format!("{}_", unique(tag).replace('-', "_"));
    let effects = format!("{prefix}effects");
    let history = History::builder(url)
        .table_prefix(&prefix)
        .connect()
        .await
        .unwrap();
    sqlx::query(&format!("CREATE TABLE {effects} ({columns})"))
        .execute(history.pool())
        .await
        .unwrap();
    (history, prefix, effects)
}

/// A SQLite file in a temporary directory (kept alive by the returned guard).
pub fn sqlite_url() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("history.db").display());
    (dir, url)
}

pub struct Replica {
    pub sandbox: Sandbox,
    pub scheduler: Scheduler,
}

impl Replica {
    /// Starts a scheduler replica in a sandbox of its own.
    pub async fn start(
        cluster: &Cluster,
        instance: &str,
        history: Option<String>,
        jobs: Vec<Job>,
        tweak: impl FnOnce(SchedulerBuilder) -> SchedulerBuilder + Send + 'static,
    ) -> Self {
        Self::start_with(
            cluster,
            instance,
            history.map(History::builder),
            jobs,
            tweak,
        )
        .await
    }

    /// [`start`](Self::start) with history options of its own.
    pub async fn start_with(
        cluster: &Cluster,
        instance: &str,
        history: Option<HistoryBuilder>,
        jobs: Vec<Job>,
        tweak: impl FnOnce(SchedulerBuilder) -> SchedulerBuilder + Send + 'static,
    ) -> Self {
        let sandbox = Sandbox::start(cluster).await;
        let urls = sandbox.urls();
        let instance = instance.to_owned();
        let scheduler = sandbox
            .run(async move {
                let redlock = redlock_testkit::builder_for(urls)
                    .ttl(LEADER_TTL)
                    .node_timeout(Duration::from_millis(100))
                    .build()
                    .unwrap();
                let mut builder = Scheduler::builder(redlock)
                    .instance(instance)
                    .leader_ttl(LEADER_TTL)
                    .retry_interval(RETRY);
                if let Some(history) = history {
                    builder = builder.history(history.connect().await.unwrap());
                }
                for job in jobs {
                    builder = builder.job(job);
                }
                let scheduler = tweak(builder).build().unwrap();
                scheduler.start();
                scheduler
            })
            .await;
        Self { sandbox, scheduler }
    }

    pub fn leads(&self) -> bool {
        !self.sandbox.is_crashed() && self.scheduler.leadership().is_some()
    }

    pub async fn shutdown(&self) {
        let scheduler = self.scheduler.clone();
        self.sandbox
            .run(async move { scheduler.shutdown(Duration::from_secs(5)).await })
            .await;
    }
}

/// Waits until one of `replicas` leads; returns its index.
pub async fn leader_of(replicas: &[Replica], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        if let Some(i) = replicas.iter().position(Replica::leads) {
            return i;
        }
        assert!(Instant::now() < deadline, "no leader within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The rows of `job` with a tick in `[from, to]`.
pub async fn rows(
    history: &History,
    job: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Vec<Run> {
    history
        .runs_between("scheduler", from, to)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.job == job)
        .collect()
}

/// Every whole second in `[from, to]`, as Unix ms.
pub fn seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<i64> {
    let first = (from.timestamp_millis() + 999) / 1000 * 1000;
    (first..=to.timestamp_millis()).step_by(1000).collect()
}

/// No tick ran twice (handler record and history), and each row agrees with the record.
pub fn assert_no_double_run(ticks: &HashMap<i64, Vec<String>>, rows: &[Run]) {
    for (tick, instances) in ticks {
        assert_eq!(instances.len(), 1, "tick {tick} ran on {instances:?}");
    }
    let mut seen = std::collections::HashSet::new();
    for row in rows {
        let tick = row.tick.timestamp_millis();
        assert!(seen.insert(tick), "two rows for tick {tick}");
        if row.outcome != Outcome::Skipped {
            assert_eq!(
                ticks.get(&tick).map(|i| i[0].as_str()),
                Some(row.instance.as_str()),
                "row {row:?} and the handler's record disagree"
            );
        }
    }
}

/// The tick a trigger done on the leader ran (its result says it too).
pub fn tick_run(dispatched: Dispatched) -> DateTime<Utc> {
    match dispatched {
        Dispatched::Done {
            tick: Some(tick),
            result,
        } => {
            assert_eq!(result, format!("ok: tick {}", tick.to_rfc3339()));
            tick
        }
        other => panic!("expected a trigger done on the leader, got {other:?}"),
    }
}
