//! A leader-election cron scheduler: every replica declares the same jobs, and each tick
//! runs on exactly one of them.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_scheduler::{BoxError, History, Job, JobContext, Redlock, Scheduler};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), BoxError> {
//!     let redlock = Redlock::builder()
//!         .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!         .build()?;
//!     // Every replica runs this same code; each tick runs on one of them.
//!     let scheduler = Scheduler::builder(redlock)
//!         .name("billing")
//!         .history(History::connect("sqlite://history.db").await?)
//!         .job(Job::new("invoices", "0 */5 * * * *", |ctx: JobContext| async move {
//!             println!("invoices due at {} (token {})", ctx.tick(), ctx.fencing_token());
//!             Ok::<_, BoxError>(())
//!         }))
//!         .build()?;
//!     scheduler.wait_ready(Duration::from_secs(15)).await?; // a quorum out of quarantine
//!     scheduler.start();
//!     tokio::time::sleep(Duration::from_secs(3600)).await; // ... serve ...
//!     scheduler.shutdown(Duration::from_secs(30)).await; // hands over, lets runs finish
//!     Ok(())
//! }
//! ```
//!
//! # Feature flags
//!
//! None: the crate has no Cargo features. SQLite and PostgreSQL are both always built in
//! (through sqlx); the history URL picks one.
//!
//! # How it works
//!
//! - [`LeaderElector`] (usable on its own): one replica leads, with a fencing epoch; a
//!   follower takes over when the leader dies (within the leadership TTL plus one retry
//!   interval) or at once when it shuts down.
//! - [`Scheduler`]: the leader fires each [`Job`] at its ticks ([`Schedule`]: cron with
//!   optional seconds, in a time zone, with documented DST behaviour). Before running, it
//!   **claims** the tick under the job's name and the tick's scheduled time: a lock that
//!   outlives the run, and with a [`History`] a row under
//!   `UNIQUE (scheduler, job, tick_ms)`. A tick claimed once never runs again, even if
//!   leadership changes hands mid-tick or two replicas briefly both think they lead.
//! - Per job: a [`Misfire`] policy for ticks missed while no one led, a timeout, and no
//!   overlap (a tick is skipped while the previous run goes on). Handlers get a
//!   [`JobContext`]: the scheduled tick, the fencing token, the instance, and a
//!   cancellation token that fires on lost leadership, a lost claim, timeout or shutdown.
//! - [`History`]: the run history through sqlx, SQLite (no server) or PostgreSQL.
//! - [`Scheduler::status`], [`Scheduler::trigger`], [`Scheduler::pause`] /
//!   [`Scheduler::resume`], [`Scheduler::cancel`], [`Scheduler::step_down`], and
//!   [`Scheduler::shutdown`] with a deadline.
//!
//! It never talks to Redis itself: every lock goes through [`redlock_core::Redlock`].
//!
//! # Admin API
//!
//! Operators' tools (an admin web service, a command line) need no job definitions and
//! run no scheduler: [`SchedulerAdmin::new`]`(history, name)` works from the history
//! database alone. Every replica publishes its job definitions there when it starts,
//! and the leader records itself when elected (renewing the record while it leads, and
//! marking it ended when it steps down or shuts down), so the admin can list the jobs
//! with their next ticks (in each job's time zone), pause state, last run and the run going
//! ([`SchedulerAdmin::jobs`]), show the leader and its epoch
//! ([`SchedulerAdmin::leader`]), read runs through a [`RunFilter`], and pause or resume
//! a job. What only a live replica can do is a *request*, a row with a random id:
//! [`SchedulerAdmin::trigger`], [`SchedulerAdmin::cancel`] (the run ends as
//! [`Outcome::Cancelled`], `cancelled by an operator`) and [`SchedulerAdmin::step_down`]
//! (the leader hands over and keeps out of the election for a while). The leader
//! takes pending requests about twice a second (a cancel: the replica running the job),
//! each atomically so only one replica acts on it, and writes the result;
//! [`SchedulerAdmin::wait`] follows one. A running [`Scheduler`] offers the same:
//! [`Scheduler::cancel`], [`Scheduler::step_down`] (done directly where possible, else
//! through a request) and [`Scheduler::admin`].
//!
//! ```no_run
//! # async fn admin() -> Result<(), redlock_scheduler::Error> {
//! use std::time::Duration;
//! use redlock_scheduler::{History, Outcome, RunFilter, SchedulerAdmin};
//!
//! let history = History::connect("postgres://ops@db.internal/app").await?;
//! let admin = SchedulerAdmin::new(history, "billing").operator("alice");
//! let failed = admin
//!     .runs(&RunFilter::new().job("invoices").outcome(Outcome::Failed).limit(20))
//!     .await?;
//! println!("{} recent failures", failed.len());
//! let id = admin.trigger("invoices").await?;
//! let done = admin.wait(&id, Duration::from_secs(10)).await?;
//! println!("{:?}: {}", done.state, done.result.unwrap_or_default()); // ok: tick ...
//! # Ok(())
//! # }
//! ```
//!
//! # Three replicas in one process, against real nodes
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let cluster = redlock_testkit::Cluster::start(3).await;
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::time::Duration;
//! use redlock_scheduler::{History, Job, JobContext, Redlock, Scheduler};
//!
//! let redlock = Redlock::builder()
//!     .nodes(cluster.urls())
//! #   .restart_quarantine(false) // the kit's nodes are seconds old
//!     .build()?;
//! let history = History::connect("sqlite:file:doc?mode=memory&cache=shared").await?;
//! let runs = Arc::new(AtomicUsize::new(0));
//! // Three replicas (in a real service: three processes) declare the same job.
//! let mut replicas = Vec::new();
//! for name in ["a", "b", "c"] {
//!     let runs = runs.clone();
//!     let scheduler = Scheduler::builder(redlock.clone())
//!         .instance(name)
//!         .history(history.clone())
//!         .job(Job::new("every-second", "* * * * * *", move |_ctx: JobContext| {
//!             let runs = runs.clone();
//!             async move {
//!                 runs.fetch_add(1, Ordering::SeqCst);
//!                 Ok::<_, std::convert::Infallible>(())
//!             }
//!         }))
//!         .build()?;
//!     scheduler.start();
//!     replicas.push(scheduler);
//! }
//! tokio::time::sleep(Duration::from_millis(3500)).await;
//! for replica in &replicas {
//!     replica.shutdown(Duration::from_secs(5)).await;
//! }
//! // Each tick ran once, on one replica, however many replicas there are.
//! let rows = history.runs("scheduler", "every-second", 100).await?;
//! assert_eq!(rows.len(), runs.load(Ordering::SeqCst));
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod admin;
mod clock;
mod error;
mod health;
mod job;
mod leader;
mod plan;
mod record;
mod schedule;
mod scheduler;
mod status;
mod store;
pub mod telemetry;
pub mod transaction;

pub use admin::{DEFAULT_NEXT_TICKS, JobInfo, LeaderInfo, SchedulerAdmin};
pub use clock::{BoxFuture, Clock, ManualClock, SystemClock};
pub use error::{BuildError, Error};
pub use health::{ComponentHealth, Health};
pub use job::{DEFAULT_GRACE, Job, JobContext, Misfire};
pub use leader::{
    DEFAULT_RETRY_INTERVAL, DEFAULT_TERM, LeaderElector, LeaderElectorBuilder, LeaderEvent,
    Leadership,
};
pub use redlock_core::{BoxError, CancellationToken, Redlock};
pub use schedule::Schedule;
pub use scheduler::{DEFAULT_SCHEDULER_NAME, Dispatched, Scheduler, SchedulerBuilder};
pub use status::{JobStatus, LastRun, SchedulerStatus};
pub use store::{
    DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_RUN_LIMIT, DEFAULT_STATEMENT_TIMEOUT,
    DEFAULT_TABLE_PREFIX, History, HistoryBuilder, MAX_HISTORY_TIMEOUT, MAX_RUN_LIMIT, Outcome,
    Request, RequestAction, RequestState, Run, RunFilter,
};
pub use transaction::RunTransaction;

/// Re-exported for time zones and tick times.
pub use chrono;
pub use chrono_tz;
